"""The models a run loads, by name or path: the policy's starting point, the Teacher, the
Prompted Critic's base. One function, so the trainer and the Teacher load alike."""

from __future__ import annotations

from typing import Any

from algos.checkpoint import resolve_model_path


def load_model(name: str, device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
    """(model, tokenizer) of ``name``: a model directory, a run directory (its latest
    checkpoint), ``smollm2`` or a hub id. A preset's own model name (``algos.presets.RECIPES``)
    is turned into a directory by the command line before the Trainer starts
    (``algos.presets.prepare_model``)."""
    from agents.models import load_causal_lm

    return load_causal_lm(resolve_model_path(name), dtype=dtype, device=device)
