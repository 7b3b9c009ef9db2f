"""A learner's metrics.jsonl read back (bad lines skipped, rows of re-run steps dropped on
resume), training curves as a picture (team EM, searches per workflow and Teacher KL per
step), and the paired comparison of two validations of the same questions."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

PANELS = (
    ("team EM (rollouts) and validation avg@1", ("team/em", "val/avg@1")),
    ("searches per workflow", ("team/searches_per_workflow",)),
    ("Teacher KL (Searcher tokens) / KL loss", ("teacher/kl", "losses/kl_teacher")),
)


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a JSON-lines file: a learner's metrics.jsonl, or the per-question records of
    a validation (``algos.trainer.validation_path``).

    A line that is not a JSON object (a run killed mid-write leaves half a row; bytes that
    are not UTF-8) is skipped with a warning naming the file and the line: one bad row
    must not cost the end-of-run summary or the curves of a whole run."""
    return [row for _, row in _rows(Path(path))]


def truncate_metrics(path: str | Path, step: int) -> int:
    """Drop the rows of ``path`` (a metrics.jsonl) logged after ``step``, and any bad line,
    in place; returns how many lines were dropped. A run resumed from the checkpoint of
    ``step`` logs the later steps again: without this, metrics.jsonl would hold two rows
    for each of them. Rows without a step are kept. A missing file is left missing."""
    path = Path(path)
    if not path.exists():
        return 0
    lines = sum(1 for raw in path.read_bytes().splitlines() if raw.strip())
    kept = [row for _, row in _rows(path) if not isinstance(row.get("step"), int) or row["step"] <= step]
    if len(kept) == lines:
        return 0
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in kept), encoding="utf-8")
    os.replace(tmp, path)  # a crash here leaves the old file or the new one, never half of one
    return lines - len(kept)


def _rows(path: Path) -> Iterator[tuple[int, dict]]:
    for n, raw in enumerate(path.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
            if not isinstance(row, dict):
                raise ValueError(f"a row must be a JSON object, not {type(row).__name__}")
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            warnings.warn(f"{path}:{n}: skipped a line that is not a JSON row ({err})", stacklevel=3)
            continue
        yield n, row


def paired_sign_test(before: Sequence[dict], after: Sequence[dict]) -> dict[str, float]:
    """How ``after`` compares with ``before`` question by question (paired by dataset and
    id; a question counts as better when its mean EM over the runs rose): the counts, and
    the exact two-sided sign test's p-value on the questions that changed (the chance of a
    split at least this uneven if training made no difference)."""
    earlier = {(r["dataset"], str(r["id"])): sum(r["correct"]) / len(r["correct"]) for r in before}
    better = worse = shared = 0
    for r in after:
        key = (r["dataset"], str(r["id"]))
        if key in earlier:
            shared += 1
            delta = sum(r["correct"]) / len(r["correct"]) - earlier[key]
            better, worse = better + (delta > 0), worse + (delta < 0)
    if not shared:
        raise ValueError("the two validations share no (dataset, id) question")
    return {"better": better, "worse": worse, "questions": shared, "p_value": sign_test_p(better, worse)}


def sign_test_p(better: int, worse: int) -> float:
    """The exact two-sided sign test's p-value for ``better`` rises against ``worse`` falls
    (ties left out before): ``min(1, 2 P[X <= min(better, worse)])``, X ~ Bin(better + worse,
    1/2). 1 when nothing changed.

    >>> sign_test_p(3, 0), sign_test_p(8, 1)
    (0.25, 0.0390625)
    """
    n = better + worse
    tail = sum(math.comb(n, k) for k in range(min(better, worse) + 1)) / 2**n
    return min(1.0, 2 * tail)


QUESTIONS_PAIRED = "questions paired, seeds fixed: these runs on new questions"
"""What an interval over questions paired across variants covers (the runs held fixed)."""

OVER_SEEDS = "over seeds: the training procedure"
"""What a figure over per-seed differences covers (each trained run one unit)."""

PAIRS_INDEPENDENT = "(seed, question) pairs assumed independent: these runs only"
"""What a test pooled over every seed's questions covers: it treats a question asked in
three seeds as three independent pairs, so it speaks of the runs made, not of training."""

TIE = 1e-12
"""Per-seed differences closer to zero than this are ties: two macros of the same questions
answered alike can differ in the last bits by the order of their sums."""


def seeds_improved(differences: Mapping[str, float]) -> dict[str, Any]:
    """The sign test over seeds, each seed one unit: how many of the per-seed
    ``differences`` (seed -> trained minus base, or A minus B) are above zero, below it, and
    zero (left out of the test), and the exact two-sided p. This is the statement about the
    training procedure; a sign test over (seed, question) pairs assumes the pairs independent
    and speaks only of the runs made."""
    values = list(differences.values())
    better, worse = sum(v > TIE for v in values), sum(v < -TIE for v in values)
    return {"covers": OVER_SEEDS, "seeds": len(values), "better": better, "worse": worse,
            "ties": len(values) - better - worse, "p_value": sign_test_p(better, worse)}


def plot_training_curves(paths: Sequence[str | Path], out_png: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 3.6))
    for path in paths:
        rows = read_metrics(path)
        label = Path(path).parent.name
        for ax, (title, keys) in zip(axes, PANELS):
            for key in keys:
                pts = [(r["step"], r[key]) for r in rows if key in r and "step" in r]
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker="o" if key.startswith("val") else None, ms=3,
                            label=f"{label}: {key}")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
    return save_figure(fig, axes, out_png, legend_size=7)


def save_figure(fig: Any, axes: Any, path: str | Path, legend_size: int = 8) -> Path:
    """Legends on the panels that drew lines, then ``fig`` written to ``path`` (PNG) and closed."""
    import matplotlib.pyplot as plt

    for ax in axes:
        if ax.lines:
            ax.legend(fontsize=legend_size)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
