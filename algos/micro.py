"""The micro preset's public names, kept where README and older scripts import them from
(``algos.micro.searcher_skip_probability``, ``algos.micro.build_micro_base``, ...). The recipe
itself lives in :mod:`algos.recipes.micro`; no module of the learner imports this one."""

from __future__ import annotations

from algos.recipes.micro.build import BUILD_DEFAULTS, build_micro_base
from algos.recipes.micro.episodes import (
    WORKFLOWS,
    EosScripted,
    imitated,
    micro_env_fn,
    questions,
    scripted_episodes,
    spaced_tags,
)
from algos.recipes.micro.measure import searcher_skip_probability, team_stats
from algos.recipes.micro.model import micro_model
from algos.recipes.micro.settings import ENV as MICRO_ENV
from algos.recipes.micro.tokenizer import (
    CHATML_TEMPLATE,
    IM_END,
    IM_START,
    PAD,
    PROTOCOL_TOKENS,
    PROTOCOL_WEIGHT,
    SPECIAL_TOKENS,
    TOKENIZER_VERSION,
    micro_tokenizer,
    train_micro_tokenizer,
)

__all__ = [
    "BUILD_DEFAULTS", "CHATML_TEMPLATE", "IM_END", "IM_START", "MICRO_ENV", "PAD", "PROTOCOL_TOKENS",
    "PROTOCOL_WEIGHT", "SPECIAL_TOKENS", "TOKENIZER_VERSION", "WORKFLOWS", "EosScripted",
    "build_micro_base", "imitated", "micro_env_fn", "micro_model", "micro_tokenizer", "questions",
    "scripted_episodes", "searcher_skip_probability", "spaced_tags", "team_stats",
    "train_micro_tokenizer",
]
