"""The policy loss: PPO's clipped surrogate over masked tokens, plus a k3 KL toward the
Teacher on Leader and Answerer tokens. The loss mask is applied in one place,
:func:`masked_mean` (PITFALLS 9). Shapes: ``B`` rows (segments), ``T`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AGGREGATIONS = ("token-mean", "sequence-mean")


def masked_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor, aggregation: str = "token-mean") -> torch.Tensor:
    """Mean of ``values`` over the tokens where ``mask`` is 1.

    ``token-mean``: every unmasked token of the batch weighs the same.
    ``sequence-mean``: each row's token mean, then the mean over rows that have tokens.
    Masked positions contribute exactly nothing, gradients included.
    """
    mask = mask_BT.to(values_BT.dtype)
    values = torch.where(mask > 0, values_BT, torch.zeros_like(values_BT))
    if aggregation == "token-mean":
        return values.sum() / mask.sum().clamp(min=1.0)
    if aggregation == "sequence-mean":
        per_row = values.sum(-1) / mask.sum(-1).clamp(min=1.0)
        rows = (mask.sum(-1) > 0).to(values.dtype)
        return (per_row * rows).sum() / rows.sum().clamp(min=1.0)
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
    kl: float
    """Mean k3 KL to the Teacher over KL-masked tokens (0 when there are none)."""
    clip_fraction: float
    """Share of loss tokens whose ratio was clipped."""
    approx_kl_old: float
    """Mean ``old - new`` log-prob over loss tokens (how far the update moved)."""


def policy_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    ref_logp_BT: torch.Tensor | None = None,
    kl_mask_BT: torch.Tensor | None = None,
    kl_coef: float = 1e-3,
    aggregation: str = "token-mean",
) -> LossOutput:
    """Clipped surrogate ``-min(r A, clip(r, 1-eps, 1+eps) A)`` plus ``kl_coef * k3`` on
    ``kl_mask`` tokens, aggregated over ``mask`` tokens. Old log-probs, advantages and the
    reference log-probs are constants (detached here)."""
    old = old_logp_BT.detach()
    adv = advantages_BT.detach()
    live = mask_BT > 0
    # zero the log-ratio off the mask first: exp of a masked padding value could be inf,
    # and inf * 0 in the backward pass is NaN, even behind masked_mean's where
    ratio = torch.exp(torch.where(live, logp_BT - old, torch.zeros_like(logp_BT)))
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    pg = masked_mean(per_token, mask_BT, aggregation)
    loss = pg
    kl_value = 0.0
    if ref_logp_BT is not None and kl_mask_BT is not None and kl_coef != 0.0:
        kl_mask = kl_mask_BT * mask_BT
        ref = torch.where(kl_mask > 0, ref_logp_BT.detach(), logp_BT.detach())
        kl = masked_mean(k3_kl(logp_BT, ref), kl_mask, aggregation)
        loss = loss + kl_coef * kl
        kl_value = float(kl.detach())
    with torch.no_grad():
        n = live.sum().clamp(min=1)
        clip_fraction = float(((ratio - clipped).abs() > 1e-8)[live].sum() / n)
        approx_kl_old = float((old - logp_BT)[live].sum() / n)
    return LossOutput(loss, float(pg.detach()), kl_value, clip_fraction, approx_kl_old)
