"""A copy circuit wired into a freshly initialised Llama, so that a tiny model trained from
scratch can copy names out of its context from its first step.

Why: almost every turn in a search team copies (the question into a sub-task, a passage's
sentence into a summary, a name from the evidence), and transformers copy with *induction
heads*, which never form on the micro preset's budget (NLL 6-10 on a name read a few lines
above, ``docs/micro.md``; 0.6% on repeated random tokens after 600 steps). So the circuit is
written in by hand, and SFT only has to learn *when* to copy.

The circuit (``d`` = hidden size, ``k`` look-back heads of ``head_dim`` each; the last
``k * head_dim`` residual dimensions form the space S, in ``k`` blocks, and the others form
T, where token embeddings live):

1. **Layer 0, look-back heads.** Queries and keys come from biases alone (their weights
   are zero), so the attention score depends on position only. The m-th head's RoPE phases
   put its peak at distance m, so it attends to the token m positions back. Its value is
   ``R x`` (``R``: orthonormal rows on T, the same for every head), and it is written into
   block m of S. Layer 0 writes nothing else. After it, position ``j`` carries its own
   token in T and the ``k`` tokens before it in S.
2. **Layer 1, induction heads.** The query stacks ``R x_i`` and S at ``i`` (the last ``k``
   tokens, ending with the current one). The key stacks S at ``j`` (the ``k`` tokens before
   ``j``). Each part goes through its own random map into the head's rotation-free
   dimensions, so a head attends where the last ``k`` tokens occurred before. Its value
   ``B x_j`` is written back into T as ``B^T B x_j``, which, with tied embeddings, raises
   the logit of the token that followed that earlier occurrence.
3. **Lookup heads (optional, a later layer ``L``).** Their keys read S at ``j`` like an
   induction head's, and their values copy the token at ``j``, but their queries start at
   zero and are learned. An induction head continues a name once its first token is
   written; it cannot say where a name *starts* (an answer's first token is the one
   after ``novel by`` in the evidence, and the question decides which ``by``). A lookup
   head only has to learn that query (what they bought: ``docs/micro.md``).
4. **Everything else starts silent.** Every other residual write (each layer's ``o_proj``
   and ``down_proj``) starts at zero, so at initialisation the model is exactly the
   embeddings plus the circuit. The final norm's weight is ``out_scale``, because
   unit-norm logits over a 4k vocabulary are too flat to express a confident copy.

RoPE has to leave the induction heads' content match alone at every distance: at
:data:`ROPE_THETA` only the two fastest frequency pairs turn, and they place the look-back
heads' peaks (:data:`PREV_AMPLITUDES`); the induction heads use the other pairs.

>>> model = tiny_causal_lm(4096, hidden_size=256, num_layers=4, num_heads=8, tie_word_embeddings=True,
...                        attention_bias=True, rope_theta=ROPE_THETA)   # doctest: +SKIP
>>> wire_induction_heads(model)                                          # doctest: +SKIP

At initialisation, on repeated random tokens, a micro-sized model wired this way predicts
96% of the repeated tokens, and a plain initialisation predicts none. Where a quarter of the
tokens are a few recurring ones (like "the" in text), matching two tokens predicts 93% and
matching one 75% (``tests/algos/test_micro_circuit.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from algos.engine.freeze import declare_frozen

ROPE_THETA = 200.0 ** 16
"""RoPE base at which frequency pair 0 turns 1 rad per position, pair 1 0.005 rad (one turn
in 1,257 positions), and pair 2 and up at most 2.5e-5 rad."""

PREV_AMPLITUDES = (12.0, 380.0)
"""Query/key bias amplitudes on pairs 0 and 1 of a look-back head: for a head that looks
``b`` positions back, the score ``a0^2 cos(d - b) + a1^2 cos(0.005 (d - b))`` peaks at
distance ``d = b`` with a margin of at least 12 (after the 1/sqrt(head_dim) scale) over every
other distance below 1,100."""


def wire_induction_heads(model: Any, *, prev_heads: Sequence[int] = (0, 1),
                         induction_heads: Sequence[int] = (0, 1, 2, 3), prev_write: float = 1.5,
                         match_scale: float = 1.7, copy_write: float = 3.75, out_scale: float = 3.0,
                         embed_std: float = 0.2, lookup_heads: Sequence[int] = (),
                         lookup_layer: int = 2, seed: int = 0) -> Any:
    """Wire the copy circuit (module docstring) into ``model``, a freshly initialised
    ``LlamaForCausalLM`` with tied embeddings, ``attention_bias=True`` and ``rope_theta`` =
    ``ROPE_THETA``, in place; returns it, its layout in ``config.induction`` and what stays
    frozen (:func:`frozen_entries`) declared.

    The k-th of ``prev_heads`` looks k + 1 positions back; ``induction_heads`` match the last
    ``len(prev_heads)`` tokens at once (with two, ``'The`` finds what follows ``'The``, not
    every ``The``). ``prev_write`` and ``copy_write``: a looked-back and a copied token's size,
    in embedding stds; ``match_scale``: the induction heads' query/key scale; ``out_scale``:
    the final norm's weight at an embedding std of 0.02. ``embed_std`` is larger than the
    usual 0.02 so that early steps, which move every embedding alike, leave tokens apart."""
    cfg = model.config
    _check_model(model, prev_heads, induction_heads, lookup_heads, lookup_layer)
    d, n_heads = cfg.hidden_size, cfg.num_attention_heads
    hd = d // n_heads
    half = hd // 2
    t_dims = d - len(prev_heads) * hd
    inv_freq = model.model.rotary_emb.inv_freq.double()
    gen = torch.Generator().manual_seed(seed)

    def orthonormal_rows(rows: int, cols: int) -> torch.Tensor:
        q, _ = torch.linalg.qr(torch.randn(cols, rows, generator=gen, dtype=torch.float64))
        return q.T.float()

    def block(k: int) -> torch.Tensor:
        """(hd, d): reads block k of S, the token k + 1 positions back."""
        out = torch.zeros(hd, d)
        out[:, t_dims + k * hd:t_dims + (k + 1) * hd] = torch.eye(hd)
        return out

    layer0, layer1 = (model.model.layers[i].self_attn for i in (0, 1))
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[:, t_dims:] = 0
        emb[:, :t_dims] *= embed_std / emb[:, :t_dims].std()
        prev_write, copy_write = prev_write * embed_std, copy_write * embed_std
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        read_token = torch.zeros(hd, d)  # one projection R for every block, so blocks compare
        read_token[:, :t_dims] = orthonormal_rows(hd, t_dims)
        for k, head in enumerate(prev_heads):
            rows, back = _head(head, hd), k + 1
            q_bias, k_bias = torch.zeros(hd), torch.zeros(hd)
            for pair, amp in enumerate(PREV_AMPLITUDES):
                q_bias[pair] = amp
                k_bias[pair] = amp * math.cos(back * inv_freq[pair])
                k_bias[pair + half] = amp * math.sin(back * inv_freq[pair])
            layer0.q_proj.weight[rows] = 0
            layer0.k_proj.weight[rows] = 0
            layer0.q_proj.bias[rows] = q_bias
            layer0.k_proj.bias[rows] = k_bias
            layer0.v_proj.weight[rows] = read_token
            layer0.o_proj.weight[:, rows] = prev_write * block(k).T
        content = [i for i in range(hd) if i % half >= len(PREV_AMPLITUDES)]
        parts = [content[m::len(prev_heads)] for m in range(len(prev_heads))]
        copy = orthonormal_rows(len(induction_heads) * hd, t_dims)
        for k, head in enumerate(induction_heads):
            rows, part = _head(head, hd), slice(k * hd, (k + 1) * hd)
            query, key, value = torch.zeros(hd, d), torch.zeros(hd, d), torch.zeros(hd, d)
            for m, dims in enumerate(parts):  # token i - m against token j - 1 - m
                match = match_scale * orthonormal_rows(len(dims), hd)
                query[dims] = match @ (read_token if m == 0 else block(m - 1))
                key[dims] = match @ block(m)
            value[:, :t_dims] = copy[part]
            layer1.q_proj.weight[rows] = query
            layer1.k_proj.weight[rows] = key
            layer1.v_proj.weight[rows] = value
            layer1.o_proj.weight[:t_dims, rows] = copy_write * copy[part].T
        if lookup_heads:
            lookup = model.model.layers[lookup_layer].self_attn
            pointer = orthonormal_rows(len(lookup_heads) * hd, t_dims)
            for k, head in enumerate(lookup_heads):
                rows, part = _head(head, hd), slice(k * hd, (k + 1) * hd)
                key, value = torch.zeros(hd, d), torch.zeros(hd, d)
                for m, dims in enumerate(parts):  # token j - 1 - m
                    key[dims] = match_scale * orthonormal_rows(len(dims), hd) @ block(m)
                value[:, :t_dims] = pointer[part]
                for proj in (lookup.q_proj, lookup.k_proj, lookup.v_proj):
                    proj.bias[rows] = 0
                lookup.q_proj.weight[rows] = 0
                lookup.k_proj.weight[rows] = key
                lookup.v_proj.weight[rows] = value
                lookup.o_proj.weight[:t_dims, rows] = copy_write * pointer[part].T
        model.model.norm.weight.fill_(out_scale * 0.02 / embed_std)
    cfg.induction = {"prev_heads": list(prev_heads), "induction_heads": list(induction_heads)}
    if lookup_heads:
        cfg.induction.update(lookup_heads=list(lookup_heads), lookup_layer=lookup_layer)
    declare_frozen(model, frozen_entries(cfg))
    return model


def frozen_entries(config: Any) -> list[str]:
    """What of a wired model stays frozen (``algos.engine.freeze`` entries, from
    ``config.induction``): where the heads look and what they read. How strongly they write
    trains, so SFT learns *when* to copy without unlearning *how*."""
    layout = getattr(config, "induction", None)
    if not layout:
        raise ValueError("frozen_entries: the model has no wired circuit (config.induction is "
                         "missing; see wire_induction_heads)")
    hd = config.hidden_size // config.num_attention_heads
    t_dims = config.hidden_size - len(layout["prev_heads"]) * hd
    entries = [f"model.embed_tokens.weight[:, {t_dims}:]",
               "model.layers.1.input_layernorm.weight",
               # layer 0 is the look-back heads and nothing else: what layer 1 reads stays
               # exactly the embeddings plus the looked-back tokens
               "model.layers.0.*"]
    for head in layout["induction_heads"]:  # where they look and what they read; how much
        rows = _rows(head, hd)              # they write (o_proj) trains
        entries += [f"model.layers.1.self_attn.{proj}.{kind}[{rows}]"
                    for proj in ("q_proj", "k_proj", "v_proj") for kind in ("weight", "bias")]
    if layout.get("lookup_heads"):
        lookup_layer = layout["lookup_layer"]
        entries.append(f"model.layers.{lookup_layer}.input_layernorm.weight")
        for layer in range(1, lookup_layer):  # nothing else writes into S
            entries += [f"model.layers.{layer}.self_attn.o_proj.weight[{t_dims}:, :]",
                        f"model.layers.{layer}.mlp.down_proj.weight[{t_dims}:, :]"]
        for head in layout["lookup_heads"]:
            rows = _rows(head, hd)
            entries += [f"model.layers.{lookup_layer}.self_attn.{proj}.{kind}[{rows}]"
                        for proj in ("k_proj", "v_proj") for kind in ("weight", "bias")]
    return entries


def _rows(head: int, head_dim: int) -> str:
    return f"{head * head_dim}:{(head + 1) * head_dim}"


def _head(head: int, head_dim: int) -> slice:
    return slice(head * head_dim, (head + 1) * head_dim)


def _check_model(model: Any, prev_heads: Sequence[int], induction_heads: Sequence[int],
                 lookup_heads: Sequence[int] = (), lookup_layer: int = 2) -> None:
    cfg = model.config
    problems = []
    if getattr(cfg, "model_type", None) != "llama":
        problems.append(f"model_type is {getattr(cfg, 'model_type', None)!r}, not 'llama'")
    if not getattr(cfg, "tie_word_embeddings", False):
        problems.append("the copied token reaches the logits through tied embeddings: "
                        "tie_word_embeddings must be True")
    if not getattr(cfg, "attention_bias", False):
        problems.append("look-back heads need query/key biases: attention_bias must be True")
    if getattr(cfg, "num_key_value_heads", cfg.num_attention_heads) != cfg.num_attention_heads:
        problems.append("grouped-query attention is not supported (num_key_value_heads must equal "
                        "num_attention_heads)")
    if cfg.num_hidden_layers < 2:
        problems.append(f"needs 2 layers, the model has {cfg.num_hidden_layers}")
    hd = cfg.hidden_size // cfg.num_attention_heads
    if getattr(cfg, "head_dim", hd) != hd or hd // 2 <= len(PREV_AMPLITUDES):
        problems.append(f"head_dim must be hidden_size / num_attention_heads and > {2 * len(PREV_AMPLITUDES)}")
    heads = range(cfg.num_attention_heads)
    if lookup_heads and not 2 <= lookup_layer < cfg.num_hidden_layers:
        problems.append(f"lookup_layer={lookup_layer} must come after the induction heads' layer "
                        f"1 and be one of the model's {cfg.num_hidden_layers} layers")
    for name, chosen in (("prev_heads", prev_heads), ("induction_heads", induction_heads),
                         ("lookup_heads", lookup_heads)):
        if name == "lookup_heads" and not chosen:
            continue
        if not chosen or any(h not in heads for h in chosen) or len(set(chosen)) != len(chosen):
            problems.append(f"{name}={tuple(chosen)} must be distinct heads in 0..{cfg.num_attention_heads - 1}")
    if len(prev_heads) * hd >= cfg.hidden_size:
        problems.append("the look-back heads would take the whole residual stream")
    if not problems:
        inv_freq = model.model.rotary_emb.inv_freq
        slow = float(inv_freq[len(PREV_AMPLITUDES)]) * cfg.max_position_embeddings
        if abs(float(inv_freq[1]) - 0.005) > 1e-4 or slow > 0.5:
            problems.append(f"RoPE: pair 1 must turn 0.005 rad per position and the rest almost not "
                            f"at all; build the config with rope_theta=ROPE_THETA ({ROPE_THETA:.3g})")
    if problems:
        raise ValueError("wire_induction_heads: " + "; ".join(problems))
