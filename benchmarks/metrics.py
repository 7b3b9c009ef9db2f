"""The paper's metrics, exactly as defined (PAPER.md section 5).

Inputs are per-question records: ``{"dataset", "id", "correct": [0/1 per run], "searches":
[...], "input_tokens": [...], "output_tokens": [...]}``. Correctness is strict EM of the
team's final answer (SQuAD normalisation, any gold answer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

RECORD_LISTS = ("correct", "searches", "input_tokens", "output_tokens")
"""The per-run lists of a record; ``correct`` is required, the cost lists when present must
have one entry per run too."""


def check_record(record: Any, where: str) -> None:
    """Refuse a per-question record the metrics cannot use, with ``where`` (file and line)
    and what is wrong: not an object, no ``dataset`` or ``id``, an empty ``correct`` (its
    mean would be NaN and silently drop out of a macro), a value that is not a number, or
    cost lists of another length than ``correct``."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    for key in ("dataset", "id", "correct"):
        if key not in record:
            raise ValueError(f"{where}: the record has no {key!r} (keys: {sorted(record)})")
    k = None
    for key in RECORD_LISTS:
        if key not in record:
            continue
        values = record[key]
        if not isinstance(values, list) or not values or not all(
                isinstance(v, (int, float)) and np.isfinite(v) for v in values):
            raise ValueError(f"{where}: {key}={values!r} must be a non-empty list of finite numbers, one per run")
        if k is not None and len(values) != k:
            raise ValueError(f"{where}: {key} has {len(values)} runs, correct has {k}")
        k = len(values) if k is None else k


def avg_at_k(correct_QK: Sequence[Sequence[float]]) -> float:
    """Mean over questions of the mean correctness over the k runs."""
    return float(np.mean([np.mean(c) for c in correct_QK])) if len(correct_QK) else float("nan")


def pass_at_k(correct_QK: Sequence[Sequence[float]]) -> float:
    """Share of questions answered correctly in at least one of the k runs."""
    return float(np.mean([float(np.max(c)) for c in correct_QK])) if len(correct_QK) else float("nan")


def all_k(correct_QK: Sequence[Sequence[float]]) -> float:
    """Share of questions answered correctly in every one of the k runs."""
    return float(np.mean([float(np.min(c)) for c in correct_QK])) if len(correct_QK) else float("nan")


def macro(per_dataset: Mapping[str, float]) -> float:
    """The datasets weighted equally."""
    return float(np.mean(list(per_dataset.values()))) if per_dataset else float("nan")


def by_dataset(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        out.setdefault(r["dataset"], []).append(r)
    return out


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Table-1 numbers: avg@k per dataset and macro, pass@k, all-k-correct, cost per workflow."""
    groups = by_dataset(records)
    table: dict[str, Any] = {"datasets": {}}
    for name, rows in groups.items():
        correct = [r["correct"] for r in rows]
        table["datasets"][name] = {
            "questions": len(rows),
            "avg@k": avg_at_k(correct), "pass@k": pass_at_k(correct), "all_k": all_k(correct),
            **{f"{c}_per_workflow": float(np.mean([np.mean(r[c]) for r in rows]))
               for c in ("searches", "input_tokens", "output_tokens")},
        }
    per = table["datasets"]
    for key in ("avg@k", "pass@k", "all_k", "searches_per_workflow", "input_tokens_per_workflow",
                "output_tokens_per_workflow"):
        table[f"macro_{key}"] = macro({n: d[key] for n, d in per.items()})
    table["k"] = min((len(r["correct"]) for r in records), default=0)
    return table


def paired_macro_difference(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]],
                            *, n_resamples: int = 10000, confidence: float = 0.95, seed: int = 0
                            ) -> dict[str, float]:
    """Macro avg@k of A minus B with a paired bootstrap CI, resampling questions within
    each dataset (scipy's multi-sample bootstrap resamples each sample on its own, which is
    exactly the stratified scheme). Questions are paired by (dataset, id)."""
    from scipy.stats import bootstrap

    b_index = {(r["dataset"], str(r["id"])): r for r in b}
    diffs: dict[str, list[float]] = {}
    for r in a:
        other = b_index.get((r["dataset"], str(r["id"])))
        if other is not None:
            diffs.setdefault(r["dataset"], []).append(float(np.mean(r["correct"]) - np.mean(other["correct"])))
    if not diffs:
        raise ValueError("the two result sets share no (dataset, id) question")
    samples = [np.asarray(v) for _, v in sorted(diffs.items())]
    point = float(np.mean([s.mean() for s in samples]))

    if all(len(s) < 2 or np.ptp(s) == 0 for s in samples):
        return {"difference": point, "low": point, "high": point, "questions": sum(map(len, samples))}
    # a dataset of one question resamples to itself (and scipy refuses a sample of one): a constant
    constants = [float(s[0]) for s in samples if len(s) < 2]

    def statistic(*xs, axis=-1):
        means = [x.mean(axis=axis) for x in xs]
        return np.mean(means + [np.full_like(means[0], c) for c in constants], axis=0)

    res = bootstrap([s for s in samples if len(s) >= 2], statistic, n_resamples=n_resamples, confidence_level=confidence,
                    method="percentile", paired=False, vectorized=True, rng=np.random.default_rng(seed))
    return {"difference": point, "low": float(res.confidence_interval.low),
            "high": float(res.confidence_interval.high), "questions": sum(map(len, samples))}
