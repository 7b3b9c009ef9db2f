"""The micro preset's settings, defined once: the model name it trains, the env shape and the
``TrainConfig`` settings. Plain data: the build, the episodes and the preset registry all
read it from here."""

from __future__ import annotations

from typing import Any

MODEL = "micro"
"""The model name the preset trains: the SFT-warmed micro base (``RECIPE.prepare_model``)."""

ENV: dict[str, int] = {"max_turn_tokens": 64, "max_context_tokens": 1024, "max_waves": 2,
                       "max_searchers": 2, "max_searcher_turns": 3}
"""SearchTeam arguments of the micro preset (with the micro tokenizer): the scripted team's
SFT episodes and the RL trainers use the same env shape. Three Searcher turns = at most
two searches and a summary, the scripted Searcher's budget."""

TRAIN: dict[str, Any] = dict(
    model=MODEL, steps=12, questions_per_step=8, group_size=4, learning_rate=1.5e-4, beta=1.0,
    freeze_embeddings=True, temperature=0.7, minibatches=2, **ENV, num_candidates=5,
    train_datasets=("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"),
    val_per_dataset=20, val_temperature=0.0, eval_every=12, save_every=6,
    max_tokens_per_batch=12288, max_row_tokens=1024, generation_batch_size=64)
"""The preset's ``TrainConfig`` settings. A 5.2M-parameter Llama (tied embeddings, a wired copy
circuit, lookup heads) with a 4k-token vocabulary, warmed up by SFT on a scripted team whose
Searchers skip the search on 60% of their tasks, trained on all seven synthetic styles.
Larger learning rate and smaller budgets than the paper so that both stages finish in
minutes on 2 cores. Rollouts at temperature 0.7: at 1.0 a quarter of this model's turns are
invalid and no rollout is right. Validation is greedy on 140 questions, so the base and the
trained team are compared on the same deterministic runs (at temperature 1, one question of
56 was 1.8 points of noise). Why learning rate 1.5e-4, beta 1 (PAPER: 0.01) and frozen
embeddings: ``docs/micro.md``, "Tuning the preset" and "A base that imitates the whole team"."""


SEARCH_MODEL = "micro_search"
"""The model name of the ``micro_search`` preset: the micro base built from a scripted team
that skips the search on :data:`SEARCH_SKIP` of its Searcher tasks, not 60%."""

SEARCH_SKIP = 0.25
"""The share of Searcher tasks the ``micro_search`` base's imitated team reports on without
searching. Measured on seed 0's base (``docs/table2.md``): it searches 1.57 times per greedy
H-MAS workflow and answers 0.129 of the 350 dev questions, 0.037 with a retriever that finds
nothing (two-choice guesses): most of its accuracy comes from searching, which the preset's
base (skip 0.6: 0.020, never searching) lacks."""

SEARCH_TRAIN: dict[str, Any] = {**TRAIN, "model": SEARCH_MODEL, "val_per_dataset": 50, "learning_rate": 6e-5,
                                "questions_per_step": 4, "group_size": 8, "train_per_dataset": 20,
                                "pass_rate_filter": 8}
"""The ``micro_search`` preset's settings: the micro preset's, validated on all 350 dev
questions (50 per dataset: at 140, one question is 0.7 points), training on the first 20
training questions per dataset that the starting model gets right some but not all of 8
times, 4 questions x 8 workflows a step at learning rate 6e-5. Chosen on those validation
questions, which the Table-2 runs validate on too; the measurements: ``docs/table2.md``."""


FACTS_MODEL = "micro_facts"
"""The model name of the ``micro_facts`` preset: a base that searches, as ``micro_search``'s,
and also knows world 0's geography and sometimes answers from it (:data:`FACTS_BUILD`)."""

FACTS_BUILD: dict[str, Any] = {"skip_search": SEARCH_SKIP, "facts": 80, "recall": True, "known_worlds": (0,),
                               "skip_known": 0.4, "recall_practice": 150}
"""The ``micro_facts`` base's build settings (``build_micro_base``; issue 30's closed-book
path): world 0's 140 geography sentences mixed into the SFT 80 times, the imitated team
stating them from memory on 40% of the one-hop tasks it knows (25% of the others skipped as
``micro_search``'s), and the episodes of 150 further training questions per dataset in
which a recalled fact led to a right answer (without them no build answered from memory).
Measured on seed 0's build: ``docs/table2.md``."""

FACTS_TRAIN: dict[str, Any] = {**SEARCH_TRAIN, "model": FACTS_MODEL}
"""The ``micro_facts`` preset's settings: ``micro_search``'s, on its own base."""


CONTROL_PRESET = "micro_control"
"""The preset of the positive control for on-policy distillation (issue 43,
``docs/positive_control.md``): the ``micro`` base and settings, validated on the test split, each
seed's Teacher planted (:mod:`algos.recipes.micro.control`) instead of trained by Stage I."""

CONTROL_TRAIN: dict[str, Any] = {**TRAIN, "val_split": "test", "val_per_dataset": 50}
"""The ``micro_control`` preset's settings: the ``micro`` preset's (its base, whose Searchers
skip greedily, and the settings under which OPD made them search in 12 steps, ``docs/table2.md``'s
first ablation), validated greedy on the first 50 test questions per dataset (350), which no
setting of the control was chosen on. ``model`` stays ``micro``: each seed trains from the
micro base of its seed (the same cache entry as ``python -m algos sft --preset micro --seed S``)."""

CONTROL_TEACHER: dict[str, Any] = {"skip_search": 0.0, "worlds": (0,), "episodes_per_dataset": 50,
                                   "roles": None, "epochs": 1, "lr": 5e-4, "batch_tokens": 1024}
"""How the control's Teacher is made from its base (:func:`algos.recipes.micro.control.build_teacher`):
SFT continued on the right episodes of the scripted team that never skips the search
(``skip_search`` 0), on the first 50 training questions per dataset of world 0, both
workflows, with the loss on every role's generated tokens (``roles`` None), one pass at
learning rate 5e-4: candidate B of the pre-registration (``docs/positive_control.md``),
chosen by its rule on seed 0's dev split."""
