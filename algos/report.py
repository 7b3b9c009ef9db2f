"""Training curves as a picture (team EM, searches per workflow and Teacher KL per step),
and the paired comparison of two validations of the same questions."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

PANELS = (
    ("team EM (rollouts) and validation avg@1", ("team/em", "val/avg@1")),
    ("searches per workflow", ("team/searches_per_workflow",)),
    ("Teacher KL (Searcher tokens) / KL loss", ("teacher/kl", "losses/kl_teacher")),
)


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a JSON-lines file: a learner's metrics.jsonl, or the per-question records of
    a validation (``algos.trainer.validation_path``); a bad line names the file and line."""
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not a JSON row: {err}") from err
    return rows


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
    n = better + worse
    tail = sum(math.comb(n, k) for k in range(min(better, worse) + 1)) / 2**n
    return {"better": better, "worse": worse, "questions": shared, "p_value": min(1.0, 2 * tail)}


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
                pts = [(r["step"], r[key]) for r in rows if key in r]
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker="o" if key.startswith("val") else None, ms=3,
                            label=f"{label}: {key}")
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
    for ax in axes:
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(out_png)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
