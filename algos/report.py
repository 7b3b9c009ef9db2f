"""Training curves as a picture: team EM, searches per workflow and Teacher KL per step."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

PANELS = (
    ("team EM (rollouts) and validation avg@1", ("team/em", "val/avg@1")),
    ("searches per workflow", ("team/searches_per_workflow",)),
    ("Teacher KL (Searcher tokens) / KL loss", ("teacher/kl", "losses/kl_teacher")),
)


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a learner's metrics.jsonl; a bad line names the file and line."""
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not a JSON metrics row: {err}") from err
    return rows


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
