"""The micro preset as the preset registry (``algos.presets.PRESETS``, ``RECIPES``) and the
command line see it: its settings (:mod:`algos.recipes.micro.settings`) and the hooks they
call (``python -m algos train --preset micro``, ``python -m algos sft --preset micro``).
Imports nothing heavy: the registry reads this module whenever ``algos.config`` is imported;
the hooks import the build when they run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from algos.recipes.micro.settings import ENV, MODEL, TRAIN

__all__ = ["ENV", "MODEL", "TRAIN", "build_base", "fresh_model", "prepare_model"]


def prepare_model(*, seed: int = 0, progress: bool = True, build: bool = True) -> Path:
    """The directory of the micro base (model and tokenizer, loadable by path), built with
    the build's defaults the first time (about 13 minutes) and reused from the cache after."""
    from algos.recipes.micro.build import build_micro_base

    return build_micro_base(seed=seed, progress=progress, build=build)


def build_base(out_dir: str | Path | None = None, *, seed: int = 0, progress: bool = True,
               **options: Any) -> Path:
    """``python -m algos sft --preset micro``: :func:`build_micro_base` with the command
    line's training options (``epochs``, ``lr``, ``batch_tokens``, ``context_weight``,
    ``skip_search``) over its own defaults; returns where the base is."""
    from algos.recipes.micro.build import build_micro_base

    return build_micro_base(out_dir, seed=seed, progress=progress, **options)


def fresh_model() -> tuple[Any, Any]:
    """``(model, tokenizer)``: a fresh micro model with the micro tokenizer, wired like the
    preset's base (copy circuit and lookup heads as in ``BUILD_DEFAULTS``), for SFT on
    episodes collected with that tokenizer (``python -m algos sft --model micro``)."""
    from algos.recipes.micro.build import BUILD_DEFAULTS
    from algos.recipes.micro.model import micro_model
    from algos.recipes.micro.tokenizer import micro_tokenizer

    tokenizer = micro_tokenizer()
    model = micro_model(tokenizer, induction=BUILD_DEFAULTS["induction"],
                        lookup=BUILD_DEFAULTS["lookup"])
    return model, tokenizer


def tokenizer() -> Any:
    """The base's tokenizer without building the base (the micro tokenizer: trained once in
    seconds, then cached), so that budgets are checked before minutes of building."""
    from algos.recipes.micro.tokenizer import micro_tokenizer

    return micro_tokenizer()
