"""Benchmark metrics against hand-computed values."""

import numpy as np
import pytest

from benchmarks.metrics import all_k, avg_at_k, macro, paired_macro_difference, pass_at_k, summarize


def _rec(ds, i, correct, searches=(1,), tokens=(10,)):
    k = len(correct)
    return {"dataset": ds, "id": str(i), "correct": list(correct), "searches": list(searches) * (k // len(searches)),
            "input_tokens": list(tokens) * k, "output_tokens": [2] * k}


def test_k_metrics_by_hand():
    c = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert avg_at_k(c) == pytest.approx((0.5 + 0 + 1) / 3)
    assert pass_at_k(c) == pytest.approx(2 / 3)
    assert all_k(c) == pytest.approx(1 / 3)
    assert macro({"nq": 0.2, "hotpotqa": 0.6}) == pytest.approx(0.4)


def test_summary_weights_datasets_equally():
    recs = [_rec("nq", i, [1, 1]) for i in range(9)] + [_rec("musique", 0, [0, 1], searches=(2, 4))]
    s = summarize(recs)
    assert s["datasets"]["nq"]["avg@k"] == 1.0 and s["datasets"]["musique"]["avg@k"] == 0.5
    assert s["macro_avg@k"] == pytest.approx(0.75)  # not the micro 0.95
    assert s["datasets"]["musique"]["searches_per_workflow"] == 3.0 and s["k"] == 2


def test_bootstrap_when_the_answer_is_known():
    a = [_rec(ds, i, [1]) for ds in ("nq", "popqa") for i in range(30)]
    b = [_rec(ds, i, [0]) for ds in ("nq", "popqa") for i in range(30)]
    ci = paired_macro_difference(a, b)
    assert ci == {"difference": 1.0, "low": 1.0, "high": 1.0, "questions": 60}


def test_bootstrap_ci_matches_the_normal_approximation():
    rng = np.random.default_rng(0)
    n = 400
    # per question: A right with p=0.6, B right with p=0.4, independent -> diff mean 0.2
    a, b = [], []
    for ds in ("nq", "hotpotqa"):
        for i in range(n):
            a.append(_rec(ds, i, [int(rng.random() < 0.6)]))
            b.append(_rec(ds, i, [int(rng.random() < 0.4)]))
    ci = paired_macro_difference(a, b, n_resamples=4000, seed=1)
    diffs = {ds: np.array([x["correct"][0] - y["correct"][0] for x, y in zip(a, b) if x["dataset"] == ds])
             for ds in ("nq", "hotpotqa")}
    se = np.sqrt(sum(d.var(ddof=1) / len(d) for d in diffs.values())) / 2  # mean of two means
    assert ci["low"] < ci["difference"] < ci["high"]
    assert ci["difference"] == pytest.approx(np.mean([d.mean() for d in diffs.values()]))
    assert ci["high"] - ci["low"] == pytest.approx(2 * 1.96 * se, rel=0.1)
    assert paired_macro_difference(a, b, n_resamples=4000, seed=1) == ci  # seeded


def test_bootstrap_needs_shared_questions():
    with pytest.raises(ValueError, match="share no"):
        paired_macro_difference([_rec("nq", 1, [1])], [_rec("nq", 2, [1])])


def test_sign_test_counts_and_p_value_by_hand():
    from algos.report import paired_sign_test

    before = [_rec("nq", i, c) for i, c in enumerate([(1, 1), (0, 0), (0, 0), (1, 0), (0, 1)])]
    before.append(_rec("popqa", 0, (0, 0)))  # same id, another dataset: its own question
    after = [_rec("nq", i, c) for i, c in enumerate([(1, 1), (1, 0), (1, 1), (0, 0), (0, 1)])]
    after += [_rec("popqa", 0, (1, 1)), _rec("popqa", 9, (1, 1))]  # popqa/9 has no partner
    res = paired_sign_test(before, after)
    # better: nq/1 (0 -> .5), nq/2 (0 -> 1), popqa/0; worse: nq/3 (.5 -> 0); unchanged: nq/0, nq/4
    assert (res["better"], res["worse"], res["questions"]) == (3, 1, 6)
    assert res["p_value"] == pytest.approx(2 * (1 + 4) / 16)  # P(X <= 1), X ~ Bin(4, 1/2), two-sided
    five_up = paired_sign_test([_rec("nq", i, (0,)) for i in range(5)], [_rec("nq", i, (1,)) for i in range(5)])
    assert five_up["p_value"] == pytest.approx(2 / 32)
    assert paired_sign_test(before, before)["p_value"] == 1.0
    with pytest.raises(ValueError, match="share no"):
        paired_sign_test(before, [_rec("hotpotqa", 0, (1,))])
