"""Statistics over seeds (benchmarks.seed_stats, algos.report.seeds_improved) against values
computed by hand: docs/table2_micro/table2.json's per-seed differences to opd (questions of 140, so
multiples of 1/140) and the t quantiles of df = 1, 2."""

from __future__ import annotations

import math

import pytest

from algos.report import seeds_improved, sign_test_p
from benchmarks.seed_stats import holm, seed_interval, t_test_p

Q = 1 / 140
"""One question of the 140 dev questions, as a macro difference."""


def test_the_exact_sign_test_by_hand():
    assert sign_test_p(3, 0) == 0.25  # 2 * (1/8)
    assert sign_test_p(0, 3) == 0.25
    assert sign_test_p(8, 1) == 2 * (1 + 9) / 512
    assert sign_test_p(5, 3) == 2 * (1 + 8 + 28 + 56) / 256
    assert sign_test_p(2, 0) == 0.5
    assert sign_test_p(1, 1) == 1.0 and sign_test_p(0, 0) == 1.0


def test_ties_are_dropped_from_the_sign_test_over_seeds():
    got = seeds_improved({"0": 2 * Q, "1": 0.0, "2": Q})
    assert (got["seeds"], got["better"], got["worse"], got["ties"], got["p_value"]) == (3, 2, 0, 1, 0.5)
    # a macro that differs in the last bits only is a tie, not a seed that improved
    assert seeds_improved({"0": 0.021428571428571432 - 0.02142857142857143})["ties"] == 1


@pytest.mark.parametrize("questions, mean, sd, low, high", [
    # the review's table (docs/table2_micro/table2.json, vs opd): per-seed differences in questions of 140
    ((-1, 0, -1), -0.476, 0.41, -1.50, +0.55),    # outcome
    ((-1, 2, 0), +0.238, 1.09, -2.47, +2.95),     # none
    ((1, 1, -1), +0.238, 0.82, -1.81, +2.29),     # base
    ((-1, 1, -1), -0.238, 0.82, -2.29, +1.81),    # critic
])
def test_the_t_interval_over_seeds_is_the_reviews(questions, mean, sd, low, high):
    got = seed_interval({str(s): n * Q for s, n in enumerate(questions)})
    points = {k: round(100 * got[k], 3 if k == "mean" else 2) for k in ("mean", "sd", "low", "high")}
    assert points == {"mean": mean, "sd": sd, "low": low, "high": high}
    assert got["df"] == 2 and got["seeds"] == 3 and got["covers"] == "over seeds: the training procedure"


def test_the_t_interval_from_its_formula():
    # diffs -1, 0, -1 questions: mean -2/3, sd sqrt(1/3), t(0.975, df 2) = 4.302653
    got = seed_interval({"0": -Q, "1": 0.0, "2": -Q})
    half = 4.302652729749464 * math.sqrt(1 / 3) / math.sqrt(3) * Q
    assert got["mean"] == pytest.approx(-2 / 3 * Q)
    assert (got["low"], got["high"]) == pytest.approx((-2 / 3 * Q - half, -2 / 3 * Q + half))
    assert got["sign_test"]["worse"] == 2 and got["sign_test"]["p_value"] == 0.5
    # two seeds: t(0.975, df 1) = 12.706205; 90%: t(0.95, df 2) = 2.919986
    two = seed_interval({"0": 0.0, "1": 2 * Q})
    assert two["high"] - two["mean"] == pytest.approx(12.706204736 * math.sqrt(2) * Q / math.sqrt(2))
    ninety = seed_interval({"0": -Q, "1": 0.0, "2": -Q}, confidence=0.9)
    assert ninety["high"] - ninety["mean"] == pytest.approx(2.919985580 * math.sqrt(1 / 3) / math.sqrt(3) * Q)


def test_one_seed_has_no_interval_and_says_so():
    got = seed_interval({"4": 3 * Q})
    assert (got["mean"], got["low"], got["high"], got["df"]) == (3 * Q, None, None, 0)
    assert "one seed" in got["note"]
    assert got["sign_test"] == {"covers": "over seeds: the training procedure", "seeds": 1, "better": 1,
                                "worse": 0, "ties": 0, "p_value": 1.0}
    with pytest.raises(ValueError, match="no per-seed difference"):
        seed_interval({})


def test_seeds_that_differ_alike_give_a_zero_width_interval():
    got = seed_interval({"0": Q, "1": Q, "2": Q})
    assert got["low"] == got["high"] == pytest.approx(Q)
    assert got["sign_test"]["p_value"] == 0.25  # 3 of 3 improved: the review's seed-level p


def test_holm_by_hand():
    """Four raw p-values, m = 4, in ascending order a 0.01, c 0.03, b 0.04, d 0.20: the
    adjusted are 4 x 0.01 = 0.04; max(0.04, 3 x 0.03) = 0.09; max(0.09, 2 x 0.04 = 0.08) =
    0.09 (the running maximum keeps the order); max(0.09, 1 x 0.20) = 0.20. A test without a
    p (None) is not counted and stays None; an adjusted p never exceeds 1."""
    got = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.20, "x": None})
    assert list(got) == ["a", "b", "c", "d", "x"]
    assert got["x"] is None
    assert {k: round(v, 12) for k, v in got.items() if v is not None} == {"a": 0.04, "b": 0.09, "c": 0.09, "d": 0.2}
    assert holm({"a": 0.3, "b": 0.6}) == {"a": 0.6, "b": 0.6}
    assert holm({"a": 0.5, "b": 0.9, "c": 0.7}) == {"a": 1.0, "b": 1.0, "c": 1.0}
    assert holm({"only": 0.049}) == {"only": 0.049} and holm({}) == {}
    # the audit's family: facts' outcome - opd (t p 0.049) among the 7 headline comparisons of both presets
    assert round(holm({"outcome": 0.049, **{f"o{i}": 0.5 for i in range(6)}})["outcome"], 3) == 0.343


def test_the_t_test_p_by_hand():
    """Differences 1, 2, 3: mean 2, sd 1, t = 2 sqrt(3) with df 2, whose two-sided p is
    1 - t / sqrt(2 + t^2) (the t distribution with 2 degrees of freedom in closed form)."""
    t = 2 * math.sqrt(3)
    assert t_test_p({"0": 1.0, "1": 2.0, "2": 3.0}) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-12)
    assert t_test_p({"0": -1.0, "1": -2.0, "2": -3.0}) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-12)
    assert t_test_p({"0": 1.0}) is None
    assert t_test_p({"0": Q, "1": Q}) == 0.0 and t_test_p({"0": 0.0, "1": 0.0}) == 1.0
    # the interval over seeds excludes zero exactly when p < 0.05
    for diffs in ({"0": 1.0, "1": 2.0, "2": 3.0}, {"0": -1.0, "1": 0.5, "2": 2.0}):
        ci = seed_interval(diffs)
        assert (t_test_p(diffs) < 0.05) == (ci["low"] > 0 or ci["high"] < 0)
