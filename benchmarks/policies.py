"""The benchmarks' own policy kind, ``ckpt:<run dir>`` (a learner's checkpoint), in the one
table of kinds (``agents.registry.POLICY_KINDS``). Light: the learner loads only when a
``ckpt:`` policy is checked or built, so a command line's help can list the kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.registry import register_policy
from agents.sampling import Sampling


def _checkpoint_policy(arg: str, *, seed: int = 0, vocab_size: int | None = None, sampling: Sampling | None = None,
                       **hf_kwargs: Any) -> Any:
    """``ckpt:<dir>``: a learner run (its latest checkpoint) or one checkpoint, as HFPolicy
    (unset sampling settings from the checkpoint's generation config, greedy without one)."""
    from agents.hf import hf_policy
    from algos.engine.checkpoint import resolve_model_path

    return hf_policy(resolve_model_path(arg), sampling=sampling, seed=seed, **hf_kwargs)


TRAIN_HINT = "`python -m algos train --preset micro` writes runs/micro/teacher and runs/micro/team"


def _check_checkpoint(arg: str) -> None:
    """``ckpt:<dir>`` must hold a checkpoint (a learner run's latest, or one saved model)."""
    from algos.engine.checkpoint import resolve_model_path

    if not arg:
        raise ValueError(f"ckpt: needs a learner run directory, e.g. ckpt:runs/micro/team ({TRAIN_HINT})")
    if not Path(arg).exists():
        raise ValueError(f"ckpt:{arg}: no checkpoint there, {arg} does not exist; {TRAIN_HINT}")
    if not (Path(resolve_model_path(arg)) / "config.json").exists():
        raise ValueError(f"ckpt:{arg}: no checkpoint there (neither checkpoints/step_*/ nor config.json); "
                         f"{TRAIN_HINT}")


register_policy("ckpt", _checkpoint_policy, check=_check_checkpoint, samples=True, usage="ckpt:<run dir>")
