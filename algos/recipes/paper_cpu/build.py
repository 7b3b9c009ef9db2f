"""The paper_cpu base: ``Qwen3ForCausalLM`` from a shrunk ``Qwen3Config`` over the micro
tokenizer, randomly initialised from a seed, saved once and cached (nothing downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from algos.recipes.cache import cached_base, save_base
from algos.recipes.paper_cpu.settings import ENV, QWEN3

BUILD_VERSION = 1
"""Bumped whenever the build changes (cached bases are then rebuilt)."""


def qwen3_model(tokenizer: Any, seed: int = 0) -> Any:
    """A random ``Qwen3ForCausalLM`` of :data:`~algos.recipes.paper_cpu.settings.QWEN3`'s shape
    over ``tokenizer``'s vocabulary, with its EOS and pad ids; the same weights for a seed."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = Qwen3Config(vocab_size=len(tokenizer), max_position_embeddings=ENV["max_context_tokens"] + 64,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=pad, **QWEN3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(config)


def fresh_paper_cpu_model() -> tuple[Any, Any]:
    """``(model, tokenizer)``: the random Qwen3 and the micro tokenizer."""
    from algos.recipes.micro.tokenizer import micro_tokenizer

    tokenizer = micro_tokenizer()
    return qwen3_model(tokenizer), tokenizer


def build_paper_cpu_base(out_dir: str | Path | None = None, *, seed: int = 0, progress: bool = False,
                         build: bool = True, **options: Any) -> Path:
    """The base's directory (model, tokenizer and ``paper_cpu_build.json``), cached as the
    micro base is (:func:`algos.recipes.micro.build.build_micro_base`). ``options`` (the
    command line's training options) are refused: the base is random, nothing trains."""
    from algos.recipes.micro.tokenizer import micro_tokenizer

    if options:
        raise ValueError(f"the paper_cpu base is random and takes no build options, got {sorted(options)}")
    settings = {"qwen3": QWEN3, "env": ENV, "seed": seed, "version": BUILD_VERSION}
    out_dir, found = cached_base(out_dir, "paper-cpu", settings, "paper_cpu_build.json",
                                 build=build, what="paper_cpu base")
    if found:
        return out_dir
    tokenizer = micro_tokenizer()
    model = qwen3_model(tokenizer, seed)
    record = {"settings": settings, "parameters": sum(p.numel() for p in model.parameters())}
    save_base(model, tokenizer, {"paper_cpu_build.json": record}, out_dir)
    if progress:
        print(f"paper_cpu base: a random Qwen3 of {record['parameters']:,} parameters; saved to {out_dir}")
    return out_dir
