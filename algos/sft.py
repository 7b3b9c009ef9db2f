"""Supervised fine-tuning on recorded episodes: the warm start before RL.

Each segment of an episode is one training row: its exact token ids (never re-tokenised),
trained where ``loss_mask == 1``, the tokens the agent generated itself: the same mask the
RL learner uses, so prompts, retrieved passages and reports handed over never enter the
loss (PITFALLS 1), unless ``context_weight`` asks for language-model pre-training on them
(for a model that starts from random weights). The loss is the token-mean negative
log-likelihood over the masked tokens of a batch, computed by :func:`agents.logprobs.token_logprobs`,
the function the learner scores with. Parameters the model declares frozen in its config
(``algos.engine.freeze``) stay exactly as they are.

>>> losses = sft(model, load_episodes("scripted.jsonl"), epochs=2, lr=1e-3)  # doctest: +SKIP

The command line (``python -m algos sft``) is :mod:`algos.commands.sft`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from agents.logprobs import token_logprobs
from algos.batch import Row, pad_rows
from algos.engine.freeze import frozen
from envs.episode import Episode

collate = pad_rows  # the learner's one padding helper, kept under its SFT name


def sft_rows(episodes: Iterable[Episode], max_len: int, *, dedupe: bool = True) -> list[Row]:
    """The training rows of ``episodes``: one per segment that has a masked token, cut after
    its last one and, beyond ``max_len``, to its last ``max_len`` tokens (the first is never a
    target). ``dedupe`` trains identical rows once (a deterministic team's Answerers agree)."""
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    rows: list[Row] = []
    seen: set[tuple[int, ...]] = set()
    for ep in episodes:
        for seg in ep.segments:
            if len(seg.loss_mask) != len(seg.token_ids):
                raise ValueError(f"segment {seg.agent} of episode {ep.question.get('id')!r} has "
                                 f"{len(seg.token_ids)} tokens but {len(seg.loss_mask)} mask values")
            masked = [i for i, m in enumerate(seg.loss_mask) if m]
            if not masked:
                continue
            end = masked[-1] + 1
            start = max(0, end - max_len)
            ids = [int(t) for t in seg.token_ids[start:end]]
            row = Row(ids, seg.loss_mask[start:end])  # its first token is never a target
            if not row.mask.any():
                continue
            if dedupe:
                key = (row.token_ids.tobytes(), row.mask.tobytes())
                if key in seen:
                    continue
                seen.add(key)
            rows.append(row)
    return rows


def text_rows(token_ids: Iterable[Sequence[int]]) -> list[Row]:
    """Plain text (such as a recipe's closed-book facts) as training rows: every token a
    target but the first."""
    rows = [Row(list(ids), [True] * len(ids)) for ids in token_ids]
    short = next((len(r.token_ids) for r in rows if len(r.token_ids) < 2), None)
    if short is not None:
        raise ValueError(f"a text row needs at least 2 tokens (the first is never a target), got {short}")
    return rows


def batches(rows: Sequence[Row], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Row indices grouped into batches of at most ``batch_tokens`` padded tokens (rows x
    longest row; a row longer than that is a batch of its own). Rows of similar length go together,
    so padding wastes little; the batch order is shuffled by ``rng``."""
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i].token_ids), rng.random()))
    out: list[list[int]] = []
    current: list[int] = []
    for i in order:  # ascending length: the newest row is the batch's longest
        if current and (len(current) + 1) * len(rows[i].token_ids) > batch_tokens:
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    rng.shuffle(out)
    return out


def sft_loss(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
             targets: torch.Tensor, context_weight: float = 0.0) -> torch.Tensor:
    """Mean negative log-likelihood of the target tokens (token-mean over the batch; 0-d,
    with graph). ``context_weight`` > 0 also scores every other real token at that weight:
    pre-training on the contexts, for a model that starts from random weights."""
    return _losses(model, input_ids, attention_mask, targets, context_weight)[0]


def _losses(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
            targets: torch.Tensor, context_weight: float) -> tuple[torch.Tensor, float]:
    """(the objective, the masked tokens' mean NLL as a float)."""
    if not bool(targets.any()):
        raise ValueError("the batch has no target token")
    if context_weight == 0:
        loss = -token_logprobs(model, input_ids, attention_mask, targets).mean()
        return loss, float(loss.detach())
    scored = attention_mask.bool().clone()
    scored[:, 0] = False
    logp = token_logprobs(model, input_ids, attention_mask, scored)  # (N,) every real token
    is_target = targets[scored]
    weights = torch.where(is_target, 1.0, float(context_weight))
    loss = -(logp * weights).sum() / weights.sum()
    return loss, float(-logp.detach()[is_target].mean())


def sft(model: Any, episodes: Iterable[Episode], *, epochs: int = 1, lr: float = 1e-4,
        batch_tokens: int = 8192, max_len: int | None = None, warmup: float = 0.05,
        weight_decay: float = 0.0, context_weight: float = 0.0, dedupe: bool = True,
        rows: Sequence[Row] = (), seed: int = 0, progress: bool = True) -> list[float]:
    """Train ``model`` in place on the generated tokens of ``episodes`` (and ``rows``, e.g.
    :func:`text_rows`, in the same shuffled batches); the loss of every optimizer step, in order
    (the masked tokens' mean NLL). AdamW, gradient norm clipped to 1.0, linear warm-up over
    ``warmup`` of the steps, then cosine decay to a tenth of ``lr``. ``batch_tokens``: padded
    tokens per step; ``max_len`` (default: the model's positions): :func:`sft_rows`;
    ``context_weight``: :func:`sft_loss`. The model is left in eval mode."""
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    if lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if context_weight < 0:
        raise ValueError(f"context_weight must be >= 0, got {context_weight}")
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    if not 0 <= warmup < 1:
        raise ValueError(f"warmup is a fraction of the steps in [0, 1), got {warmup}")
    if max_len is None:
        max_len = int(getattr(model.config, "max_position_embeddings", 2048))
    rows = sft_rows(episodes, max_len, dedupe=dedupe) + list(rows)
    if not rows:
        raise ValueError("no segment has a token with loss_mask == 1: nothing to train on")
    vocab = int(model.get_input_embeddings().num_embeddings)
    top = max(int(r.token_ids.max()) for r in rows)
    if top >= vocab:
        raise ValueError(f"token id {top} is outside the model's vocabulary of {vocab}: were "
                         "the episodes collected with another tokenizer?")
    pad_id = getattr(model.config, "pad_token_id", None) or 0
    rng = random.Random(seed)
    plan = [batches(rows, batch_tokens, rng) for _ in range(epochs)]
    total = sum(len(p) for p in plan)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    warm = max(1, int(warmup * total))

    def schedule(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        t = (step - warm) / max(1, total - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    device = next(model.parameters()).device
    bar = tqdm(total=total, desc="sft", unit="step", disable=not progress)
    losses: list[float] = []
    model.train()
    try:
        with frozen(model):
            for batch in (b for epoch_batches in plan for b in epoch_batches):
                input_ids, attention_mask, targets = (
                    t.to(device) for t in collate([rows[i] for i in batch], pad_id))
                loss, masked_nll = _losses(model, input_ids, attention_mask, targets,
                                           context_weight)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                scheduler.step()
                losses.append(masked_nll)
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
    finally:
        bar.close()
        model.eval()
    return losses
