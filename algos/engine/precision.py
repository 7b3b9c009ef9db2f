"""How the trained model holds its numbers and computes with them (``TrainConfig.dtype``).

``dtype`` names the *compute* dtype. The trained model's parameters, gradients and AdamW
state stay float32 whatever it is: at the paper's learning rate (1e-6) an AdamW step is
about 1e-6 per element, while bfloat16's spacing near a typical weight (0.02) is 1.2e-4,
so a bfloat16 parameter would keep about 2% of its updates (measured: 1.9%) and the
policy would barely move while every loss curve looks normal. With a lower compute dtype the
trained model is loaded in float32 and its forwards run under ``torch.autocast``
(:meth:`Precision.compute`, :meth:`Precision.fsdp_policy`, :meth:`Precision.configure`).

Frozen models (the Teacher, the Prompted Critic's base) load in the compute dtype: they are
only read. ``dtype="float32"`` changes nothing: no autocast, no global setting, the same
numbers as before this module existed.

>>> p = precision_for("cpu", "bfloat16")
>>> p.param_dtype, p.compute_dtype, p.mixed
(torch.float32, torch.bfloat16, True)
>>> precision_for("cpu", "float32").mixed
False
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from agents.models import torch_dtype

__all__ = ["AdamW", "Precision", "adamw", "fused_adamw", "precision_for"]

@dataclass(frozen=True)
class Precision:
    """The trained model's numbers: ``param_dtype`` (parameters, gradients, optimizer state),
    ``compute_dtype`` (what its forwards compute in) on ``device_type`` (``cpu``, ``cuda``)."""

    param_dtype: torch.dtype
    compute_dtype: torch.dtype
    device_type: str

    @property
    def mixed(self) -> bool:
        """Whether forwards compute in a lower dtype than the parameters are kept in."""
        return self.compute_dtype != self.param_dtype

    def compute(self, cache: bool = True) -> contextlib.AbstractContextManager[Any]:
        """The context every forward of the trained model (and of the frozen scorers) runs in:
        ``torch.autocast`` to the compute dtype, or nothing when there is no lower dtype.
        Backwards run outside it (autocast records each op's dtype for its backward).

        ``cache``: keep each weight's cast for the whole context (generation and scoring: one
        cast per rollout, not per token; a compute-dtype copy of the model meanwhile). The
        update's forward passes False: each weight is used once, and with activation
        checkpointing the copies would otherwise all live until the forward ends."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.compute_dtype, cache_enabled=cache)

    def fsdp_policy(self) -> Any:
        """FSDP2's ``MixedPrecisionPolicy``: parameters gathered in the compute dtype, gradients
        reduce-scattered in float32 onto float32 shards; None without a lower compute dtype."""
        if not self.mixed:
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)

    def configure(self) -> None:
        """Process-wide settings for this precision: on CUDA with a lower compute dtype, TF32
        for the float32 matmuls that remain (the output layer's log-softmax). Nothing else."""
        if self.mixed and self.device_type == "cuda":
            torch.set_float32_matmul_precision("high")

    def adamw(self, params: Any, **kwargs: Any) -> Any:
        """The trained model's optimizer: :func:`adamw` on this precision's device (fused on CUDA)."""
        return adamw(params, self.device_type, **kwargs)

    def prepare(self, model: Any) -> Any:
        """``model`` (a trained model given by the caller rather than loaded here) with its
        floating parameters in ``param_dtype``; returned for chaining."""
        if self.mixed and any(p.is_floating_point() and p.dtype != self.param_dtype for p in model.parameters()):
            model.to(self.param_dtype)
        return model


def precision_for(device: str, dtype: str) -> Precision:
    """The :class:`Precision` of a run on ``device`` computing in ``dtype`` over float32
    parameters (float16 has no loss scaling here: prefer bfloat16)."""
    return Precision(param_dtype=torch.float32, compute_dtype=torch_dtype(dtype), device_type=torch.device(device).type)


def fused_adamw(device: str) -> bool:
    """Whether the trained model's AdamW runs fused on ``device``: on CUDA, where PyTorch's
    ``foreach`` default allocates ``sqrt(exp_avg_sq)`` of every parameter at once (15 GiB at
    4B parameters; docs/scaleout.md); elsewhere the default stays (CPU runs keep their numbers)."""
    return str(device).startswith("cuda")


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose ``fused``/``foreach`` choice survives ``load_state_dict``:
    a plain one takes those from the saved param groups, so a CUDA run resumed from a checkpoint
    written without ``fused`` (or on a CPU) would step with ``foreach`` and its temporary."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        chosen = [(g.get("fused"), g.get("foreach")) for g in self.param_groups]
        super().load_state_dict(state_dict)
        for group, (fused, foreach) in zip(self.param_groups, chosen):
            group["fused"], group["foreach"] = fused, foreach


def adamw(params: Any, device: str, **kwargs: Any) -> AdamW:
    """The trained model's optimizer on ``device``: :class:`AdamW`, fused on CUDA
    (:func:`fused_adamw`), PyTorch's default elsewhere."""
    if fused_adamw(device):
        kwargs.setdefault("fused", True)
    return AdamW(params, **kwargs)
