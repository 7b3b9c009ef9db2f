"""The tiny preset's settings, defined once: the model name, env shape and ``TrainConfig``
settings. Plain data: the build and the preset registry read it from here."""

from __future__ import annotations

from typing import Any

MODEL = "tiny"
"""The model name the preset trains: the SFT-warmed tiny base (``RECIPE.prepare_model``)."""

ENV: dict[str, int] = {"max_turn_tokens": 48, "max_context_tokens": 768, "max_waves": 1,
                       "max_searchers": 2, "max_searcher_turns": 2, "num_candidates": 2}
"""SearchTeam arguments of the tiny preset (micro tokenizer): one wave, two Searchers with
one search each, two candidates; the smallest team in which every role acts."""

TRAIN: dict[str, Any] = dict(
    model=MODEL, steps=4, questions_per_step=8, group_size=3, learning_rate=1e-4, beta=1.0,
    temperature=1.0, minibatches=1, **ENV, train_datasets=("nq", "hotpotqa"),
    val_datasets=("nq", "hotpotqa"), val_per_dataset=4, val_temperature=0.0, eval_every=4,
    save_every=2, max_tokens_per_batch=8192, max_row_tokens=768, generation_batch_size=64,
    retriever="words")
"""The preset's ``TrainConfig`` settings: a few small steps, sampled at temperature 1 so
that a group's workflows differ (valid and invalid turns, right and wrong candidates) and
the first step already has non-zero advantages: measured, step 1 had a gradient norm of
0.15 to 0.31 for each of seeds 0-4 in both stages (8 questions per step; with 4, a step
whose groups all had equal rewards, gradient 0, was seen). ``retriever="words"``: the
word-overlap retriever the base was trained on, with nothing to encode (MiniLM would
take a minute per process the first time)."""
