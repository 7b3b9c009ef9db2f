"""The paper_cpu preset as the preset registry (``algos.presets.PRESETS``, ``RECIPES``) and the
command line see it. Imports nothing heavy: the hooks import the build when they run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from algos.recipes.paper_cpu.settings import ENV, MODEL, TRAIN

__all__ = ["ENV", "MODEL", "TRAIN", "build_base", "fresh_model", "prepare_model", "tokenizer"]


def prepare_model(*, seed: int = 0, progress: bool = True, build: bool = True) -> Path:
    """The directory of the random Qwen3 base, built the first time and cached after."""
    from algos.recipes.paper_cpu.build import build_paper_cpu_base

    return build_paper_cpu_base(seed=seed, progress=progress, build=build)


def build_base(out_dir: str | Path | None = None, *, seed: int = 0, progress: bool = True,
               **options: Any) -> Path:
    """``python -m algos sft --preset paper_cpu``: the base has no training to configure (it is
    random), so ``options`` must be empty."""
    from algos.recipes.paper_cpu.build import build_paper_cpu_base

    if options:
        raise ValueError(f"the paper_cpu base is random and takes no build options, got {sorted(options)}")
    return build_paper_cpu_base(out_dir, seed=seed, progress=progress)


def fresh_model() -> tuple[Any, Any]:
    """``(model, tokenizer)``: the random Qwen3 and the micro tokenizer."""
    from algos.recipes.micro.tokenizer import micro_tokenizer
    from algos.recipes.paper_cpu.build import qwen3_model

    tok = micro_tokenizer()
    return qwen3_model(tok), tok


def tokenizer() -> Any:
    """The base's tokenizer without building the base (the micro tokenizer)."""
    from algos.recipes.micro.tokenizer import micro_tokenizer

    return micro_tokenizer()
