"""The tiny base model: a small wired Llama over the micro tokenizer, a few seconds of SFT on
the scripted team's episodes in the tiny env, built once and cached.

Why not a random model: a random tiny model writes only invalid turns, every reward of a
group is equal and every advantage is 0 (PITFALLS), so a step's gradient is 0 and a check
that two runs agree compares 0 with 0. After this SFT the model writes valid turns often
but not always, at temperature 1, so a group of workflows has mixed rewards.

>>> path = build_tiny_base()        # seconds the first time, cached after  # doctest: +SKIP
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from algos.recipes.cache import cached_base, save_base
from algos.recipes.tiny.settings import ENV

BUILD_DEFAULTS: dict[str, Any] = {
    "hidden_size": 128, "num_layers": 2, "num_heads": 4, "questions_per_dataset": 12,
    "datasets": ("nq", "hotpotqa"), "epochs": 24, "lr": 4e-3, "batch_tokens": 4096,
    "context_weight": 0.1,
}
"""The build's defaults: the scripted team on 12 training questions of NQ and HotpotQA in
both workflows, 24 epochs of SFT at 4e-3 (144 steps; about a minute of CPU time on one
core, 200 s on a 2-core machine at load 9). Measured at temperature 1 on 16 other training
questions x 3 workflows with the preset's retriever: 43% of Stage-I turns and 49% of
Stage-II turns invalid, and 5 of 16 (Stage I) and 10 of 16 (Stage II) groups with mixed
rewards; accuracy about 0. Twelve epochs at 3e-3 (version 1) left 86% invalid and 3 of 16
mixed groups, and a preset step could have none (gradient 0); 16 epochs at 6e-3: 40% and
59% invalid, 4 and 4 mixed groups."""

BUILD_VERSION = 2
"""Bumped whenever the build changes (cached bases are then rebuilt)."""


def build_tiny_base(out_dir: str | Path | None = None, *, retriever: Any = None, seed: int = 0,
                    progress: bool = False, build: bool = True, threads: int | None = None,
                    **options: Any) -> Path:
    """The tiny base's directory (model, tokenizer and ``tiny_build.json``), as
    :func:`algos.recipes.micro.build.build_micro_base` makes the micro one (the same cache
    key, ``threads`` and ``build``), over the default synthetic world's
    :class:`~envs.retrieval.lexical.WordOverlapRetriever` unless ``retriever`` is given."""
    from algos.recipes.micro.build import arithmetic
    from algos.reproducible import current_threads, run_threads

    unknown = sorted(set(options) - set(BUILD_DEFAULTS))
    if unknown:
        raise ValueError(f"build_tiny_base: unknown options {unknown}; known: {sorted(BUILD_DEFAULTS)}")
    settings = {**BUILD_DEFAULTS, **options, "seed": seed, "env": ENV, "version": BUILD_VERSION,
                "retriever": None if retriever is None else type(retriever).__name__,
                **arithmetic(current_threads() if threads is None else threads)}
    settings["datasets"] = list(settings["datasets"])
    out_dir, found = cached_base(out_dir, "tiny-sft", settings, "tiny_build.json", build=build,
                                 what="tiny base")
    if not found:
        with run_threads(settings["threads"]):
            _build(out_dir, settings, retriever, progress)
    return out_dir


def fresh_tiny_model() -> tuple[Any, Any]:
    """``(model, tokenizer)``: an untrained tiny model, wired like the base."""
    from algos.recipes.micro.model import micro_model
    from algos.recipes.micro.tokenizer import micro_tokenizer

    tokenizer = micro_tokenizer()
    model = micro_model(tokenizer, BUILD_DEFAULTS["hidden_size"], BUILD_DEFAULTS["num_layers"],
                        BUILD_DEFAULTS["num_heads"], max_position_embeddings=ENV["max_context_tokens"] + 64,
                        induction=True)
    return model, tokenizer


def _build(out_dir: Path, s: dict[str, Any], retriever: Any, progress: bool) -> None:
    import torch

    from agents.collect import collect
    from algos.recipes.micro.episodes import WORKFLOWS, EosScripted, micro_env_fn
    from algos.recipes.micro.model import micro_model
    from algos.recipes.micro.tokenizer import micro_tokenizer
    from algos.sft import sft
    from envs.data.synthwiki import default_world
    from envs.retrieval.lexical import WordOverlapRetriever

    started = time.perf_counter()
    tokenizer = micro_tokenizer()
    world = default_world()
    questions = [q for d in s["datasets"] for q in world.questions(d, "train")[:s["questions_per_dataset"]]]
    searched = retriever if retriever is not None else WordOverlapRetriever(world.corpus)
    episodes = []
    for workflow in WORKFLOWS:
        groups = collect(micro_env_fn(tokenizer, workflow, searched, **ENV), EosScripted(tokenizer, s["seed"]),
                         questions, seed=s["seed"])
        episodes += [ep for g in groups for ep in g]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s["seed"])
        model = micro_model(tokenizer, s["hidden_size"], s["num_layers"], s["num_heads"], seed=s["seed"],
                            max_position_embeddings=ENV["max_context_tokens"] + 64, induction=True)
        losses = sft(model, episodes, epochs=s["epochs"], lr=s["lr"], batch_tokens=s["batch_tokens"],
                     context_weight=s["context_weight"], max_len=ENV["max_context_tokens"],
                     seed=s["seed"], progress=progress)
    record = {"settings": s, "parameters": sum(p.numel() for p in model.parameters()),
              "episodes": len(episodes), "steps": len(losses), "losses": losses,
              "seconds": round(time.perf_counter() - started, 1)}
    save_base(model, tokenizer, {"tiny_build.json": record}, out_dir)
    if progress:
        print(f"tiny base: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {record['seconds']}s; saved to {out_dir}")
