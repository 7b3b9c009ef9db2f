"""Statistics over seeds: what a comparison of two training recipes says about the recipes,
each seed (each trained run) one unit: the per-seed differences' mean, a Student-t interval
(df = seeds - 1) and the exact sign test over seeds. With three seeds they are wide; that is
the honest width of a claim about the training procedure. docs/table2.md ("Two intervals, two
questions") says what the question-paired bootstrap answers instead.

>>> got = seed_interval({"0": -0.0071, "1": 0.0, "2": -0.0071})
>>> round(got["mean"], 5), got["sign_test"]["better"], got["sign_test"]["worse"]
(-0.00473, 0, 2)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from algos.report import OVER_SEEDS, seeds_improved


def _mean_sd(per_seed: Mapping[str, float]) -> tuple[int, float, float | None]:
    """(n, mean, sample standard deviation; None with one value) of the per-seed values."""
    values = [float(v) for v in per_seed.values()]
    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return n, mean, sd


def seed_interval(per_seed: Mapping[str, float], *, confidence: float = 0.95) -> dict[str, Any]:
    """The seed-level figures of a comparison from its per-seed differences (seed -> A minus
    B, each a macro over the same questions): ``mean``; ``sd``; the two-sided Student-t
    ``confidence`` interval ``low``/``high`` with ``df = seeds - 1`` (None with one seed, and
    ``note`` says so); and ``sign_test`` (:func:`algos.report.seeds_improved`). ``covers``
    names the population the interval speaks of (:data:`algos.report.OVER_SEEDS`)."""
    from scipy.stats import t

    if not per_seed:
        raise ValueError("no per-seed difference: the two variants share no finished seed")
    n, mean, sd = _mean_sd(per_seed)
    out: dict[str, Any] = {"covers": OVER_SEEDS, "confidence": confidence, "seeds": n, "mean": mean,
                           "per_seed": {str(s): float(v) for s, v in per_seed.items()}}
    if sd is None:
        out.update(sd=None, df=0, low=None, high=None, note="one seed: no interval over seeds")
    else:
        half = float(t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
        out.update(sd=sd, df=n - 1, low=mean - half, high=mean + half)
    out["sign_test"] = seeds_improved(out["per_seed"])
    return out


def t_test_p(per_seed: Mapping[str, float]) -> float | None:
    """The two-sided p of the one-sample Student-t test that the per-seed differences' mean is
    zero (df = seeds - 1), the test behind :func:`seed_interval`'s interval (the interval
    excludes zero exactly when p < 1 - confidence). None with fewer than two seeds; with
    every seed alike (sd 0) 0.0 when they differ from zero, else 1.0."""
    from scipy.stats import t

    if len(per_seed) < 2:
        return None
    n, mean, sd = _mean_sd(per_seed)
    if sd == 0:
        return 0.0 if mean != 0 else 1.0
    return float(2 * t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def holm(p_values: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjustment of the p-values of a family of comparisons (name -> raw
    p; None, a test that could not be made, stays None and does not count): with the m raw
    p-values in ascending order p(1) <= ... <= p(m), the adjusted p(i) is
    max over j <= i of min(1, (m - j + 1) * p(j)). It controls the family-wise error rate:
    reject where the adjusted p is below alpha. Ties keep their input order.

    >>> holm({"a": 0.01, "b": 0.04, "c": 0.03})
    {'a': 0.03, 'b': 0.06, 'c': 0.06}
    """
    tested = sorted(((p, i, name) for i, (name, p) in enumerate(p_values.items()) if p is not None))
    m = len(tested)
    adjusted: dict[str, float | None] = dict.fromkeys(p_values)
    running = 0.0
    for rank, (p, _, name) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * float(p)))
        adjusted[name] = running
    return adjusted
