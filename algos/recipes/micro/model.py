"""The micro model: a tiny Llama over the micro tokenizer's vocabulary, optionally with the
wired copy circuit and lookup heads (:mod:`algos.recipes.micro.circuit`)."""

from __future__ import annotations

from typing import Any


def micro_model(tokenizer: Any, hidden_size: int = 256, num_layers: int = 4, num_heads: int = 8,
                seed: int = 0, max_position_embeddings: int = 2048,
                tie_word_embeddings: bool = True, induction: bool = False,
                lookup: bool = False) -> Any:
    """A randomly initialised Llama (``agents.models.tiny_causal_lm``) over ``tokenizer``'s
    vocabulary and its EOS and pad ids; the same weights for the same arguments (about 5.2M
    parameters with the defaults and a 4k vocabulary). ``induction`` wires the copy circuit
    into a quarter of layer 0's heads and half of layer 1's, ``lookup`` half of layer 2's as
    lookup heads (:mod:`algos.recipes.micro.circuit`)."""
    from agents.models import tiny_causal_lm
    from algos.recipes.micro.circuit import ROPE_THETA, wire_induction_heads

    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token_id")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model = tiny_causal_lm(len(tokenizer), hidden_size=hidden_size, num_layers=num_layers,
                           num_heads=num_heads, max_position_embeddings=max_position_embeddings,
                           seed=seed, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad,
                           tie_word_embeddings=tie_word_embeddings, attention_bias=induction,
                           rope_theta=ROPE_THETA if induction else 10000.0)
    if lookup and not induction:
        raise ValueError("micro_model: lookup heads read the induction circuit's look-back "
                         "tokens, so lookup=True needs induction=True")
    if induction:
        wire_induction_heads(model, prev_heads=range(max(1, num_heads // 4)),
                             induction_heads=range(max(1, num_heads // 2)),
                             lookup_heads=range(num_heads // 2) if lookup else (), seed=seed)
    return model
