"""The preset registry: named settings for :class:`algos.config.TrainConfig` (``micro`` and
``tiny`` for CPUs, ``smollm2``, ``paper`` for GPUs, ``paper_cpu``: the paper's structure as a
CPU dry run) and the recipes behind some of them.

Only the command line, the pipeline and the benchmarks read this module; the learner
(trainer, SFT, losses, ...) imports :mod:`algos.config` and knows no recipe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from algos.config import TrainConfig
from algos.recipes import Recipe
from algos.recipes.micro import FACTS_RECIPE as MICRO_FACTS
from algos.recipes.micro import RECIPE as MICRO
from algos.recipes.micro import SEARCH_RECIPE as MICRO_SEARCH
from algos.recipes.micro.settings import CONTROL_PRESET, CONTROL_TRAIN
from algos.recipes.paper_cpu import RECIPE as PAPER_CPU
from algos.recipes.tiny import RECIPE as TINY

__all__ = ["PRESETS", "RECIPES", "model_tokenizer", "prepare_model", "preset_config"]

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe for recipe in (MICRO, MICRO_SEARCH, MICRO_FACTS, TINY, PAPER_CPU)}
"""The recipe behind a preset (:class:`algos.recipes.Recipe`), by its name (the preset's and
the model's), for the command line and the pipeline, never the learner. A preset without a
recipe trains a model that loads by name or path."""

PRESETS: dict[str, dict[str, Any]] = {
    # The CPU recipe: its settings and env shape live with it (algos/recipes/micro/settings.py).
    "micro": MICRO.train,
    # The same recipe with a base that searches, validated on 350 questions: Table 2's preset.
    "micro_search": MICRO_SEARCH.train,
    # ... whose base also knows world 0's geography and sometimes answers from memory (issue 30).
    "micro_facts": MICRO_FACTS.train,
    # The positive control for OPD (issue 43, docs/positive_control.md): the micro base and settings,
    # validated on the test split, each seed's Teacher planted by algos.recipes.micro.control.
    CONTROL_PRESET: CONTROL_TRAIN,
    # Seconds to build, for smoke tests, CI and the scale-out checks (algos/recipes/tiny/).
    "tiny": TINY.train,
    # SmolLM2-135M-Instruct (offline): a GPU job in practice (DESIGN.md: a 50k-token update
    # takes about 6 minutes on 2 CPU cores).
    "smollm2": dict(model="smollm2", steps=200, questions_per_step=16, group_size=5, learning_rate=1e-6,
                    max_turn_tokens=256, max_context_tokens=4096),
    # The paper's setting (Qwen3-4B-Instruct-2507, one retriever, top-3), for GPUs: bfloat16
    # compute over float32 weights and AdamW state (algos.engine.precision): one H200 fits; 80 GiB
    # cards need fsdp=true (`python -m algos plan --preset paper --gpus 8 --gpu-memory 80` says
    # 79.9 GiB without it, 61.8 with): 16k-token chunks with activation checkpointing, 8
    # sequences of 8,704 tokens' KV cache.
    "paper": dict(model="Qwen/Qwen3-4B-Instruct-2507", steps=300, questions_per_step=64, group_size=5,
                  learning_rate=1e-6, max_turn_tokens=512, max_context_tokens=8192, device="cuda",
                  dtype="bfloat16", generation_batch_size=8, max_tokens_per_batch=16384,
                  gradient_checkpointing=True, max_row_tokens=8192),
    # The paper's structure on CPU (a random Qwen3 of 2.4M parameters, activation checkpointing,
    # both stages, fsdp=True with Ray workers): a dry run of the wiring under `torchrun
    # --nproc-per-node 2` (algos/recipes/paper_cpu/, docs/scaleout.md).
    "paper_cpu": PAPER_CPU.train,
}


def preset_config(preset: str, **overrides: Any) -> TrainConfig:
    """A TrainConfig from a preset and overrides (overrides win)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; presets: {sorted(PRESETS)}")
    return TrainConfig(**{**PRESETS[preset], **overrides})


def prepare_model(model: str, *, seed: int = 0, progress: bool = True, build: bool = True) -> str:
    """``model`` as the learner loads it: a recipe's model name (``micro``) becomes the
    directory of that recipe's base for ``seed`` (a run's ``TrainConfig.build_seed``: its
    ``base_seed``, else its own seed), built the first time (minutes) and reused after; any
    other name or path is returned as is. Called by the command line and
    :func:`algos.commands.train.run_pipeline` after the settings are validated and before a Trainer
    loads anything."""
    recipe = RECIPES.get(model)
    return model if recipe is None else str(recipe.prepare_model(seed=seed, progress=progress, build=build))


def model_tokenizer(model: str) -> Any | None:
    """The tokenizer ``model`` will train with, found without loading or building the
    model: a recipe's (``tokenizer()``), a local model folder's or run's (its latest
    checkpoint's), SmolLM2's for ``smollm2``; None for a hub id (nothing local to read)."""
    from algos.engine.checkpoint import resolve_model_path
    from envs.tokenizer import SMOLLM2_ALIASES, load_tokenizer

    if model in RECIPES:
        return RECIPES[model].tokenizer()
    path = Path(resolve_model_path(model))
    if model.lower() in SMOLLM2_ALIASES or (path / "tokenizer_config.json").is_file():
        return load_tokenizer(model if model.lower() in SMOLLM2_ALIASES else str(path))
    return None
