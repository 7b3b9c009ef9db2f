"""The tiny preset as the preset registry (``algos.presets.PRESETS``, ``RECIPES``) and the
command line see it. Imports nothing heavy: the hooks import the build when they run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from algos.recipes.tiny.settings import ENV, MODEL, TRAIN

__all__ = ["ENV", "MODEL", "TRAIN", "build_base", "fresh_model", "prepare_model"]


def prepare_model(*, seed: int = 0, progress: bool = True, build: bool = True) -> Path:
    """The directory of the tiny base, built the first time (seconds) and cached after."""
    from algos.recipes.tiny.build import build_tiny_base

    return build_tiny_base(seed=seed, progress=progress, build=build)


def build_base(out_dir: str | Path | None = None, *, seed: int = 0, progress: bool = True,
               **options: Any) -> Path:
    """``python -m algos sft --preset tiny``: :func:`build_tiny_base` with the command line's
    options (``epochs``, ``lr``, ``batch_tokens``, ``context_weight``) over its defaults."""
    from algos.recipes.tiny.build import BUILD_DEFAULTS, build_tiny_base

    return build_tiny_base(out_dir, seed=seed, progress=progress,
                           **{k: v for k, v in options.items() if k in BUILD_DEFAULTS})


def fresh_model() -> tuple[Any, Any]:
    """``(model, tokenizer)``: an untrained tiny model (wired like the base) and the micro
    tokenizer (``python -m algos sft --model tiny``)."""
    from algos.recipes.micro.model import micro_model
    from algos.recipes.micro.tokenizer import micro_tokenizer
    from algos.recipes.tiny.build import BUILD_DEFAULTS

    tokenizer = micro_tokenizer()
    model = micro_model(tokenizer, BUILD_DEFAULTS["hidden_size"], BUILD_DEFAULTS["num_layers"],
                        BUILD_DEFAULTS["num_heads"], max_position_embeddings=ENV["max_context_tokens"] + 64,
                        induction=True)
    return model, tokenizer


def tokenizer() -> Any:
    """The base's tokenizer without building the base (the micro tokenizer: trained once in
    seconds, then cached), so that budgets are checked before minutes of building."""
    from algos.recipes.micro.tokenizer import micro_tokenizer

    return micro_tokenizer()
