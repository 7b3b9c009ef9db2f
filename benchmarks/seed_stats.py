"""Statistics over seeds: what a comparison of two training recipes says about the recipes,
each seed (each trained run) one unit.

A question-paired bootstrap (:func:`benchmarks.metrics.paired_macro_difference`) holds the
runs fixed: it asks whether *these* runs would differ on new questions, and a run that is
better or worse on every question at once (the seed's own luck) never enters it. The figures
here take the per-seed differences as the sample: their mean, a Student-t interval (df =
seeds - 1) and the exact sign test over seeds. With three seeds they are wide; that is the
honest width of a claim about the training procedure.

>>> got = seed_interval({"0": -0.0071, "1": 0.0, "2": -0.0071})
>>> round(got["mean"], 5), got["sign_test"]["better"], got["sign_test"]["worse"]
(-0.00473, 0, 2)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from algos.report import OVER_SEEDS, seeds_improved


def seed_interval(per_seed: Mapping[str, float], *, confidence: float = 0.95) -> dict[str, Any]:
    """The seed-level figures of a comparison from its per-seed differences (seed -> A minus
    B, each a macro over the same questions): ``mean``; ``sd`` (sample standard deviation);
    the two-sided Student-t ``confidence`` interval ``low``/``high`` with ``df = seeds - 1``
    (None with one seed, and ``note`` says so; zero width when every seed differs alike);
    and ``sign_test`` (:func:`algos.report.seeds_improved`: seeds better, worse, tied, exact
    p). ``covers`` names the population the interval speaks of
    (:data:`algos.report.OVER_SEEDS`)."""
    from scipy.stats import t

    if not per_seed:
        raise ValueError("no per-seed difference: the two variants share no finished seed")
    values = [float(v) for v in per_seed.values()]
    n = len(values)
    mean = math.fsum(values) / n
    out: dict[str, Any] = {"covers": OVER_SEEDS, "confidence": confidence, "seeds": n, "mean": mean,
                           "per_seed": {str(s): float(v) for s, v in per_seed.items()}}
    if n < 2:
        out.update(sd=None, df=0, low=None, high=None, note="one seed: no interval over seeds")
    else:
        sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
        half = float(t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
        out.update(sd=sd, df=n - 1, low=mean - half, high=mean + half)
    out["sign_test"] = seeds_improved(out["per_seed"])
    return out
