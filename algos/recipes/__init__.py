"""Recipes above the learner: everything one preset needs that the general learner must not
know (how its base model is built, what of it stays frozen, its tokenizer, its settings).

Each recipe package declares one :class:`Recipe` (``algos.recipes.<name>.RECIPE``). The learner
(``algos.trainer``, ``algos.sft``, ``algos.batch``, ...) imports nothing from here; only the
preset registry (``algos.commands.presets.PRESETS``, ``RECIPES``) and the command line do. A recipe
tells the learner what it needs through the model itself: a path to load, and the parameters
its saved config declares frozen (``algos.engine.freeze``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Lazy", "Recipe"]


@dataclass(frozen=True)
class Lazy:
    """The function ``"module:name"``, imported when called: a recipe names its build and its
    model without importing them, so reading the registry imports no model code."""

    target: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)(*args, **kwargs)


@dataclass(frozen=True)
class Recipe:
    """A preset with a model of its own, as the command line and the pipeline use it.

    ``name``: the preset's name, which is also the model name its settings train
    (``train["model"]``). ``env``: its SearchTeam shape; ``train``: its ``TrainConfig``
    settings (the env shape included). ``build``: its base's build,
    ``(out_dir=None, *, seed, progress, build, **options) -> directory``, reusing a cached base,
    and with ``build=False`` only finding one (``FileNotFoundError``). ``fresh_model``:
    ``() -> (model, tokenizer)``, an untrained model wired like the base
    (``python -m algos sft --model NAME``). ``tokenizer``: ``() -> tokenizer``, the base's,
    without building the base (budgets are checked before minutes of building).
    ``build_options``: which of the command line's build options (``epochs``, ``lr``,
    ``batch_tokens``, ``context_weight``, ``skip_search``) its build takes, the others being
    left out; None: all, and the build refuses what it does not know."""

    name: str
    env: dict[str, Any]
    train: dict[str, Any]
    build: Callable[..., Path]
    fresh_model: Callable[[], tuple[Any, Any]]
    tokenizer: Callable[[], Any]
    build_options: tuple[str, ...] | None = None

    def prepare_model(self, *, seed: int = 0, progress: bool = True, build: bool = True) -> Path:
        """The directory of the base with its build's defaults for ``seed`` (a run's seed
        builds its own base), built the first time and reused after; ``build=False`` only
        finds it."""
        return self.build(seed=seed, progress=progress, build=build)

    def build_base(self, out_dir: str | Path | None = None, *, seed: int = 0, progress: bool = True,
                   **options: Any) -> Path:
        """``python -m algos sft --preset NAME``: the build with the command line's options
        (those in ``build_options``) over its own defaults; returns where the base is."""
        if self.build_options is not None:
            options = {key: value for key, value in options.items() if key in self.build_options}
        return self.build(out_dir, seed=seed, progress=progress, **options)
