"""From Episodes to training rows, and scoring rows with a frozen or current model.

A row is one Segment: one agent's whole context with its loss mask. Scoring only ever
reads the exact token ids the env recorded (no re-tokenisation), so the Teacher, the
old policy and the trained policy all see the same contexts (PITFALLS 2 and 8).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agents.logprobs import pad_batch, token_logprobs
from envs.episode import Episode, Segment


@dataclass(eq=False)
class Row:
    """One training row: a token sequence and which of its tokens are trained on. The one
    row type of the learner (RL and SFT). Per-token arrays cover the masked tokens only.
    Rows compare by identity (their arrays have no single truth value).

    ``Row(ids, mask)`` is enough for supervised training (lists or arrays); RL rows also
    carry the segment and episode they came from. The first token is never a target
    (nothing predicts it): its mask entry is cleared on construction.
    """

    token_ids: np.ndarray
    """(T,) int64, the whole context, truncated to the learner's maximum length."""
    mask: np.ndarray
    """(T,) bool, the tokens trained on (for RL: the tokens this agent generated)."""
    segment: Segment | None = None
    episode: Episode | None = None
    group: int = 0
    """Index of the question (GRPO group of workflows) this row's episode belongs to."""
    old_logp: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """(N,) log-probs under the policy before the update, N = mask.sum()."""
    teacher_logp: np.ndarray | None = None
    """(N,) log-probs under the Teacher (for the rows the role rules have it score), or None."""
    advantages: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """(N,) per-token advantages."""
    trained: bool = True
    """False for rows whose role rule carries no loss (``algos.roles``; e.g. the ``none``
    Searcher signal)."""
    kl: bool = False
    """The k3 KL toward the Teacher is on this row's tokens (its role rule's ``kl`` with
    ``kl_coef > 0``; then ``teacher_logp`` is set). ``trained`` and ``kl`` are set once, by
    ``algos.roles.assign_advantages``; the update reads them and knows no roles."""

    def __post_init__(self) -> None:
        self.token_ids = np.asarray(self.token_ids, dtype=np.int64).reshape(-1)
        self.mask = np.array(self.mask, dtype=bool).reshape(-1)
        if self.token_ids.shape != self.mask.shape:
            raise ValueError(f"a row has {len(self.token_ids)} token ids but {len(self.mask)} mask values")
        if len(self.mask):
            self.mask[0] = False  # nothing predicts the first token

    @property
    def role(self) -> str:
        """The agent's role (``leader``, ``searcher``, ``answerer``); "" for a bare row."""
        return self.segment.role if self.segment is not None else ""

    @property
    def num_targets(self) -> int:
        """N: how many tokens are trained on."""
        return int(self.mask.sum())


def rows_from_episodes(groups: Sequence[Sequence[Episode]], max_len: int) -> list[Row]:
    """Rows of every segment with at least one generated token, grouped by question.

    A row longer than ``max_len`` keeps its first ``max_len`` tokens (the prompt and the
    early turns; later turns lose their loss rather than their context).
    """
    rows = []
    for g, episodes in enumerate(groups):
        for ep in episodes:
            for seg in ep.segments:
                row = Row(seg.token_ids[:max_len], seg.loss_mask[:max_len], seg, ep, g)
                if row.mask.any():
                    rows.append(row)
    return rows


def pad_rows(rows: Sequence[Row], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The learner's batch of rows: right-padded ``input_ids``, ``attention_mask`` and bool
    ``targets`` (each row's mask; False on padding and in column 0), all (B, T_max)
    (padded by :func:`agents.logprobs.pad_batch`)."""
    input_ids, attention, _ = pad_batch([r.token_ids for r in rows], pad_id)
    targets = pad_batch([r.mask for r in rows], False, dtype=torch.bool)[0]
    return input_ids, attention, targets


def split_flat(flat: torch.Tensor, rows: Sequence[Row]) -> list[torch.Tensor]:
    """Cut a flat (N_total,) tensor of masked-token values back into one piece per row."""
    return list(torch.split(flat, [int(r.mask.sum()) for r in rows]))


def batches_by_tokens(rows: Sequence[Row], max_tokens: int) -> list[list[Row]]:
    """Consecutive rows packed so that ``rows x longest row`` stays under ``max_tokens``."""
    out: list[list[Row]] = []
    current: list[Row] = []
    width = 0
    for r in rows:
        w = max(width, len(r.token_ids))
        if current and w * (len(current) + 1) > max_tokens:
            out.append(current)
            current, w = [], len(r.token_ids)
        current.append(r)
        width = w
    if current:
        out.append(current)
    return out


@torch.no_grad()
def score_rows(model: Any, rows: Sequence[Row], *, max_tokens: int = 16384, pad_id: int = 0,
               temperature: float = 1.0) -> list[np.ndarray]:
    """Log-probs of each row's masked tokens under ``model`` at ``temperature``
    (teacher-forced, no grad; see ``agents.logprobs.token_logprobs``)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].token_ids))
    scored: dict[int, np.ndarray] = {}
    for chunk in batches_by_tokens([rows[i] for i in order], max_tokens):
        ids, att, tgt = (t.to(device) for t in pad_rows(chunk, pad_id))
        flat = token_logprobs(model, ids, att, tgt, temperature).float().cpu()
        for r, piece in zip(chunk, split_flat(flat, chunk)):
            scored[id(r)] = piece.numpy().astype(np.float64)
    out = [scored[id(r)] for r in rows]
    model.train(was_training)
    return out
