"""Training and validation samples: a few episodes of a step, each with the per-token values
the learner used (role, loss mask, old and Teacher log-probs, advantage, KL mask; the
per-role rewards are in the Episode), for ``python -m agents view`` and ``agents replay``.

Files: ``<out_dir>/samples/step_NNNNNN.jsonl`` (the rollouts of update N) and
``val_step_NNNNNN.jsonl`` (validation after N updates: the same first questions every time),
one line per episode in ``agents.viewer.records``' sample format.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agents.viewer.records import EpisodeValues, SegmentValues, sample_line, tokenizer_record
from algos.batch import Row, rows_from_episodes, score_rows
from envs.episode import Episode

KINDS = {"train": "step", "validation": "val_step"}
"""Sample kind -> file name prefix."""


def sample_path(out_dir: str | Path, step: int, kind: str = "train") -> Path:
    """Where a run keeps the ``kind`` sample of ``step``."""
    if kind not in KINDS:
        raise ValueError(f"sample kind {kind!r} is not one of {tuple(KINDS)}")
    return Path(out_dir) / "samples" / f"{KINDS[kind]}_{step:06d}.jsonl"


def episode_values(ep: Episode, rows: Sequence[Row], *, kind: str, step: int, group: int, stage: str = "",
                   searcher_signal: str = "", tokenizer: dict[str, Any] | None = None) -> EpisodeValues:
    """The ``values`` block of ``ep`` from its rows (those of ``rows`` cut from ``ep``):
    per row the predicted positions (``row.mask``) and the values aligned with them.
    Validation samples carry no advantages."""
    index = {id(seg): i for i, seg in enumerate(ep.segments)}
    segments = []
    for row in rows:
        if row.episode is not ep:
            continue
        segments.append(SegmentValues(
            segment=index[id(row.segment)], positions=np.flatnonzero(row.mask).tolist(),
            old_logp=np.asarray(row.old_logp, dtype=np.float64).tolist(),
            teacher_logp=None if row.teacher_logp is None else np.asarray(row.teacher_logp, np.float64).tolist(),
            advantages=np.asarray(row.advantages, dtype=np.float64).tolist() if kind == "train" else None,
            kl=bool(row.kl), trained=bool(row.trained)))
    return EpisodeValues(kind=kind, step=step, stage=stage, searcher_signal=searcher_signal, group=group,
                         tokenizer=dict(tokenizer or {}), segments=segments)


def write_sample(path: str | Path, picked: Sequence[tuple[int, Episode]], rows: Sequence[Row], *, kind: str,
                 step: int, stage: str = "", searcher_signal: str = "",
                 tokenizer: dict[str, Any] | None = None) -> Path:
    """Write ``picked`` (question index, Episode) with their values as one sample file,
    atomically (a reader never sees half a file). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [sample_line(ep, episode_values(ep, rows, kind=kind, step=step, group=g, stage=stage,
                                            searcher_signal=searcher_signal, tokenizer=tokenizer))
             for g, ep in picked]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    os.replace(tmp, path)
    return path


def validation_rows(picked: Sequence[tuple[int, Episode]], model: Any, teacher: Any, *, max_row_tokens: int,
                    max_tokens: int, pad_id: int, temperature: float, kl_coef: float,
                    rules: dict[str, Any]) -> list[Row]:
    """Rows of validation episodes scored as a training step would score them: old
    log-probs under ``model``, Teacher log-probs (when there is a Teacher) for the rows the
    role rules have it score; no advantages."""
    from algos.roles import mark_rows
    from algos.teacher import score_with_teacher

    rows = rows_from_episodes([[ep] for _, ep in picked], max_row_tokens)
    for row, logp in zip(rows, score_rows(model, rows, max_tokens=max_tokens, pad_id=pad_id,
                                          temperature=temperature)):
        row.old_logp = logp
    if teacher is not None:
        score_with_teacher(teacher, rows, kl_coef=kl_coef, temperature=temperature, max_tokens=max_tokens,
                           pad_id=pad_id, rules=rules)
    mark_rows(rows, rules, kl_coef if teacher is not None else 0.0)
    return rows


_RECORDS: weakref.WeakKeyDictionary[Any, tuple[int, dict[str, Any]]] = weakref.WeakKeyDictionary()
"""Per tokenizer object, its vocabulary size and :func:`tokenizer_record` (hashing a 49k
vocabulary takes a quarter of a second: once per run, not once per step)."""


def sample_tokenizer_record(tokenizer: Any) -> dict[str, Any]:
    """:func:`agents.viewer.records.tokenizer_record` of ``tokenizer``, computed once per
    tokenizer object (again when its vocabulary grew)."""
    size = len(tokenizer)
    try:
        cached = _RECORDS.get(tokenizer)
    except TypeError:  # an object that cannot be weakly referenced: no cache
        return tokenizer_record(tokenizer)
    if cached is None or cached[0] != size:
        cached = _RECORDS[tokenizer] = (size, tokenizer_record(tokenizer))
    return dict(cached[1])


def keep_sample(kind: str, groups: Sequence[Sequence[Episode]], rows: Sequence[Row] | None = None, *,
                out: str | Path, step: int, config: Any, tokenizer: Any, model: Any = None, teacher: Any = None,
                pad_id: int = 0, rules: dict[str, Any] | None = None) -> Path:
    """A run's sample of its ``step`` under ``out``: ``train`` with the rows its loss used
    (their ``kl`` and ``trained`` flags as the update read them); ``validation`` scores the
    kept episodes first (:func:`validation_rows` with ``model``, ``teacher``, ``pad_id`` and
    ``rules``, at the training temperature: the values the learner would see). ``config``:
    the run's ``TrainConfig``."""
    cfg = config
    # kept, with their question index: validation's first run of each question (the same every
    # time); training's first episodes in question order (a whole GRPO group, whose advantages compare)
    if kind == "validation":
        picked = [(g, eps[0]) for g, eps in enumerate(groups) if eps][:cfg.sample_episodes]
    else:
        picked = [(g, ep) for g, eps in enumerate(groups) for ep in eps][:cfg.sample_episodes]
    if rows is None:
        rows = validation_rows(picked, model, teacher, max_row_tokens=cfg.max_row_tokens,
                               max_tokens=cfg.max_tokens_per_batch, pad_id=pad_id,
                               temperature=cfg.sampling.temperature, kl_coef=cfg.kl_coef, rules=rules or {})
    return write_sample(sample_path(out, step, kind), picked, rows, kind=kind, step=step, stage=cfg.stage,
                        searcher_signal=cfg.searcher_signal if cfg.stage == "team" else "",
                        tokenizer=sample_tokenizer_record(tokenizer))
