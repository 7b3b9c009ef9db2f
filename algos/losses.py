"""The policy loss: PPO's clipped surrogate over masked tokens, plus a k3 KL toward the
Teacher on the tokens the role rules give a KL (``algos.roles``). The loss mask is applied
and the aggregation decided in one place, :func:`masked_mean` (PITFALLS 9). Shapes: ``B``
rows (segments), ``T`` tokens.

A batch too large for memory is cut into chunks. The objective must not depend on that
cut: pass every chunk the :class:`Totals` of the whole batch, and the chunks' losses (and
gradients) then sum to the loss of the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

AGGREGATIONS = ("token-mean", "sequence-mean")


@dataclass(frozen=True)
class Totals:
    """The denominators of a whole batch, for chunks of it (see the module docstring)."""

    tokens: float
    """Loss tokens of the batch (the ``token-mean`` denominator)."""
    rows: float
    """Rows with at least one loss token (the ``sequence-mean`` denominator)."""
    kl_tokens: float = 0.0
    """Tokens that carry the KL."""
    kl_rows: float = 0.0
    """Rows with at least one KL token."""

    @classmethod
    def of_rows(cls, tokens_per_row: Sequence[int], kl_per_row: Sequence[bool] | None = None) -> Totals:
        """The totals of rows with these loss-token counts, where ``kl_per_row`` says which
        rows' loss tokens also carry the KL (default: none)."""
        kl = list(kl_per_row) if kl_per_row is not None else [False] * len(tokens_per_row)
        return cls(tokens=float(sum(tokens_per_row)), rows=float(sum(n > 0 for n in tokens_per_row)),
                   kl_tokens=float(sum(n for n, k in zip(tokens_per_row, kl, strict=True) if k)),
                   kl_rows=float(sum(n > 0 and k for n, k in zip(tokens_per_row, kl, strict=True))))


def masked_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor, aggregation: str = "token-mean", *,
                tokens: float | None = None, rows: float | None = None) -> torch.Tensor:
    """Mean of ``values`` over the tokens where ``mask`` is 1.

    ``token-mean``: every unmasked token of the batch weighs the same.
    ``sequence-mean``: each row's token mean, then the mean over rows that have tokens.
    ``tokens`` / ``rows``: the denominators when these rows are a chunk of a larger batch
    (default: this chunk's own), so that chunks' results add up to the batch's mean.
    Masked positions contribute exactly nothing, gradients included.
    """
    mask = mask_BT.to(values_BT.dtype)
    values = torch.where(mask > 0, values_BT, torch.zeros_like(values_BT))
    if aggregation == "token-mean":
        if tokens is not None:
            return values.sum() / max(float(tokens), 1.0)
        return values.sum() / mask.sum().clamp(min=1.0)
    if aggregation == "sequence-mean":
        per_row = values.sum(-1) / mask.sum(-1).clamp(min=1.0)
        live = (mask.sum(-1) > 0).to(values.dtype)
        if rows is not None:
            return (per_row * live).sum() / max(float(rows), 1.0)
        return (per_row * live).sum() / live.sum().clamp(min=1.0)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def k3_kl(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: ``exp(d) - d - 1``, ``d = ref - logp``.
    Non-negative, and exactly 0 where the two log-probs agree."""
    d = ref_logp_BT - logp_BT
    return torch.exp(d) - d - 1.0


@dataclass
class LossOutput:
    loss: torch.Tensor
    """Scalar to minimise."""
    policy_loss: float
    """The surrogate part (with ``totals``: this chunk's share of the batch's)."""
    kl: float
    """Mean k3 KL to the Teacher over KL-masked tokens (0 when there are none; with
    ``totals``: this chunk's share of the batch's)."""
    clip_fraction: float
    """Share of loss tokens whose ratio was clipped."""
    approx_kl_old: float
    """Mean ``old - new`` log-prob over loss tokens (how far the update moved)."""


def policy_loss(logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, advantages_BT: torch.Tensor,
                mask_BT: torch.Tensor, *, clip_eps: float = 0.2,
                ref_logp_BT: torch.Tensor | None = None, kl_mask_BT: torch.Tensor | None = None,
                kl_coef: float = 1e-3, aggregation: str = "token-mean",
                totals: Totals | None = None) -> LossOutput:
    """Clipped surrogate ``-min(r A, clip(r, 1-eps, 1+eps) A)`` aggregated over ``mask``
    tokens, plus ``kl_coef * k3`` aggregated over ``kl_mask`` tokens. Old log-probs,
    advantages and the reference log-probs are constants (detached here). ``totals``: the
    batch's :class:`Totals` when these rows are one chunk of it (module docstring); the KL is
    divided by its KL tokens (KL rows)."""
    old = old_logp_BT.detach()
    adv = advantages_BT.detach()
    live = mask_BT > 0
    # zero the log-ratio off the mask first: exp of a masked padding value could be inf,
    # and inf * 0 in the backward pass is NaN, even behind masked_mean's where
    ratio = torch.exp(torch.where(live, logp_BT - old, torch.zeros_like(logp_BT)))
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    chunked = totals is not None
    pg = masked_mean(per_token, mask_BT, aggregation, tokens=totals.tokens if chunked else None,
                     rows=totals.rows if chunked else None)
    loss = pg
    kl_value = 0.0
    if ref_logp_BT is not None and kl_mask_BT is not None and kl_coef != 0.0:
        kl_mask = kl_mask_BT * mask_BT
        ref = torch.where(kl_mask > 0, ref_logp_BT.detach(), logp_BT.detach())
        kl = masked_mean(k3_kl(logp_BT, ref), kl_mask, aggregation,
                         tokens=totals.kl_tokens if chunked else None, rows=totals.kl_rows if chunked else None)
        loss = loss + kl_coef * kl
        kl_value = float(kl.detach())
    with torch.no_grad():
        n = live.sum().clamp(min=1)
        clip_fraction = float(((ratio - clipped).abs() > 1e-8)[live].sum() / n)
        approx_kl_old = float((old - logp_BT)[live].sum() / n)
    return LossOutput(loss, float(pg.detach()), kl_value, clip_fraction, approx_kl_old)
