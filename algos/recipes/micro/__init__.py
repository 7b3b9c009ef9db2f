"""The micro recipe: a 5M-parameter team that trains on 2 CPU cores in minutes. Its modules,
notes and measurements: ``README.md`` in this folder.

:data:`RECIPE` (and :data:`SEARCH_RECIPE`, its base searching; :data:`FACTS_RECIPE`, its base
also answering from memory) is the recipe as the preset registry
(``algos.commands.presets.RECIPES``) and the command line see it.
"""

from __future__ import annotations

from algos.recipes import Lazy, Recipe
from algos.recipes.micro.settings import (
    ENV,
    FACTS_MODEL,
    FACTS_TRAIN,
    MODEL,
    SEARCH_MODEL,
    SEARCH_TRAIN,
    TRAIN,
)

RECIPE = Recipe(MODEL, ENV, TRAIN, build=Lazy("algos.recipes.micro.build:build_micro_base"),
                fresh_model=Lazy("algos.recipes.micro.build:fresh_micro_model"),
                tokenizer=Lazy("algos.recipes.micro.tokenizer:micro_tokenizer"))

SEARCH_RECIPE = Recipe(SEARCH_MODEL, ENV, SEARCH_TRAIN, build=Lazy("algos.recipes.micro.build:build_searching_base"),
                       fresh_model=RECIPE.fresh_model, tokenizer=RECIPE.tokenizer)
"""``micro_search``: the same model, env and build with a base that searches
(:data:`~algos.recipes.micro.settings.SEARCH_SKIP`), validated on all 350 dev questions: the
Table-2 miniature's preset (issue 30, ``docs/table2.md``)."""

FACTS_RECIPE = Recipe(FACTS_MODEL, ENV, FACTS_TRAIN, build=Lazy("algos.recipes.micro.build:build_closed_book_base"),
                      fresh_model=RECIPE.fresh_model, tokenizer=RECIPE.tokenizer)
"""``micro_facts``: :data:`SEARCH_RECIPE` with a base that also knows world 0's geography
(:data:`~algos.recipes.micro.settings.FACTS_BUILD`): a no-search path that is sometimes right,
which outcome RL can trade search for (issue 30, ``docs/table2.md``)."""
