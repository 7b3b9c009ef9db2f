"""The tiny recipe: a 1M-parameter team ready in about a minute, for smoke tests, CI and the
scale-out checks (Ray rollout workers, torchrun), whose rollouts give mixed rewards. Its
build takes the command line's SFT options but not ``skip_search``: the tiny base imitates
the whole scripted team.
"""

from __future__ import annotations

from algos.recipes import Lazy, Recipe
from algos.recipes.tiny.settings import ENV, MODEL, TRAIN

RECIPE = Recipe(MODEL, ENV, TRAIN, build=Lazy("algos.recipes.tiny.build:build_tiny_base"),
                fresh_model=Lazy("algos.recipes.tiny.build:fresh_tiny_model"),
                tokenizer=Lazy("algos.recipes.micro.tokenizer:micro_tokenizer"),
                build_options=("epochs", "lr", "batch_tokens", "context_weight"))
