"""Benchmark metrics against hand-computed values."""

import json

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


def test_a_dataset_of_one_question_is_a_constant_in_the_bootstrap():
    # nq: one question, A - B = 1 in every resample; popqa: differences 0 and 1, whose resampled
    # mean is 0, 0.5 or 1 -> macro 0.5, 0.75 or 1 (probabilities 1/4, 1/2, 1/4)
    a = [_rec("nq", 0, [1]), _rec("popqa", 0, [0]), _rec("popqa", 1, [1])]
    b = [_rec("nq", 0, [0]), _rec("popqa", 0, [0]), _rec("popqa", 1, [0])]
    ci = paired_macro_difference(a, b, n_resamples=2000)
    assert ci == {"difference": 0.75, "low": 0.5, "high": 1.0, "questions": 3}


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


# ------------------------------------------------------------- a learner's metrics.jsonl

def test_a_bad_metrics_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path):
    from algos.report import plot_training_curves, read_metrics

    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_bytes(b'{"step": 1, "team/em": 0.5}\n{"step": 2, "team/em": 0.\n\n7\n'
                     b'{"step": 3, "team/em": "\xff"}\n{"step": 4, "team/em": 0.75}\n')
    with pytest.warns(UserWarning) as caught:
        rows = read_metrics(path)
    assert rows == [{"step": 1, "team/em": 0.5}, {"step": 4, "team/em": 0.75}]
    assert [str(w.message).split(": ")[0] for w in caught] == [f"{path}:{n}" for n in (2, 4, 5)]
    with pytest.warns(UserWarning):  # the end-of-run summary draws the curves from the good rows
        assert plot_training_curves([path], tmp_path / "curves.png").stat().st_size > 0


def test_truncate_metrics_drops_rows_after_the_checkpoint_and_bad_lines(tmp_path):
    from algos.report import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "val/avg@1": 0.1}, {"step": 1, "team/em": 0.2}, {"step": 2, "team/em": 0.3},
            {"note": "no step"}, {"step": 3, "team/em": 0.4}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "te')  # killed mid-write
    with pytest.warns(UserWarning, match="metrics.jsonl:6"):
        assert truncate_metrics(path, 2) == 2
    assert [json.loads(x) for x in path.read_text().splitlines()] == rows[:4]
    assert truncate_metrics(path, 2) == 0 and truncate_metrics(tmp_path / "none.jsonl", 2) == 0
    assert not (tmp_path / "none.jsonl").exists()


def test_resume_leaves_one_metrics_row_per_step(tmp_path, tiny_dirs, torch_one_thread):
    import dataclasses

    from conftest import WORLD, KeywordRetriever

    from algos.config import TrainConfig
    from algos.trainer import Trainer

    cfg = TrainConfig(stage="team", teacher=tiny_dirs["teacher"], model=tiny_dirs["policy"], steps=2,
                      questions_per_step=1, group_size=2, max_turn_tokens=8, max_context_tokens=512,
                      max_waves=1, max_searchers=1, max_searcher_turns=2, num_candidates=2,
                      val_per_dataset=1, val_datasets=("nq",), eval_every=100, save_every=2,
                      max_row_tokens=512, generation_batch_size=8, out_dir=str(tmp_path / "run"))
    Trainer(cfg, progress=False, retriever=KeywordRetriever(WORLD)).train(validate_first=False)
    metrics = tmp_path / "run" / "metrics.jsonl"
    with metrics.open("a") as f:  # step 3 was logged, then the run died before its checkpoint
        f.write(json.dumps({"step": 3, "stage": "team", "team/em": 0.0}) + "\n")
    resumed = Trainer(dataclasses.replace(cfg, steps=3), progress=False, retriever=KeywordRetriever(WORLD),
                      resume=True)
    assert resumed.step == 2
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [1, 2]
    resumed.train(validate_first=False)
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [1, 2, 3]


@pytest.mark.parametrize("record, message", [
    ([1], "a record must be a JSON object"),
    ({"dataset": "nq", "correct": [1]}, "no 'id'"),
    ({"dataset": "nq", "id": "1", "correct": []}, "correct=[] must be a non-empty list"),
    ({"dataset": "nq", "id": "1", "correct": [1, None]}, "correct=[1, None]"),
    ({"dataset": "nq", "id": "1", "correct": [1, 0], "searches": [2]}, "searches has 1 runs, correct has 2"),
])
def test_a_record_the_metrics_cannot_use_is_refused_with_where(record, message):
    from benchmarks.metrics import check_record

    with pytest.raises(ValueError) as error:
        check_record(record, "r.jsonl, line 3")
    assert str(error.value).startswith("r.jsonl, line 3: ") and message in str(error.value)
    check_record(_rec("nq", 1, [1, 0]), "fine")
