"""Log-probs of tokens under a causal LM, the numbers the learner's losses and every
sampler share: teacher-forced scoring (:func:`token_logprobs`, with its gradient, and
:func:`sequence_logprobs`), the decoding step (:func:`next_tokens`: a token drawn with the
log-prob of the distribution it was drawn from) and the padding they take (:func:`pad_batch`).

:func:`token_logprobs` at ``temperature=1`` and :func:`next_tokens` at ``top_p=1`` give the
same log-prob of the same token to float rounding, which is what the learner's importance
ratios assume (PITFALLS 2 and 8). :class:`agents.hf.HFPolicy` samples with these; the
learner (``algos.batch``, ``algos.sft``, ``algos.critic``, ``algos.trainer``) scores with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

_BOOL_LOGITS_TO_KEEP: bool | None = None
""":func:`_slices_boolean_masks`' answer, found on first use (a test may set it)."""


def _slices_boolean_masks() -> bool:
    """transformers' ``modeling_utils.slice_logits_to_keep`` (5.21 on; 5.17-5.20 index the hidden
    states with ``[:, logits_to_keep, :]``, and a boolean (B, T) mask raises IndexError there),
    tried on a (1, 2, 1) tensor: a mask keeping one position must give one row."""
    import importlib

    try:
        fn = getattr(importlib.import_module("transformers.modeling_utils"), "slice_logits_to_keep", None)
        return fn is not None and tuple(fn(torch.zeros(1, 2, 1), torch.tensor([[True, False]])).shape) == (1, 1)
    except Exception:  # noqa: BLE001 (any failure: the full-logits path, which every version has)
        return False


def bool_logits_to_keep(model: Any = None) -> bool:
    """Whether ``model``'s forward can take a boolean ``logits_to_keep``: the installed
    transformers slices with such masks (:func:`_slices_boolean_masks`, or the flag a test set)
    and, for a given model, its class's module uses that slicing (a model whose forward indexes
    the hidden states itself, or a remote one, takes the full logits)."""
    global _BOOL_LOGITS_TO_KEEP
    if _BOOL_LOGITS_TO_KEEP is None:
        _BOOL_LOGITS_TO_KEEP = _slices_boolean_masks()
    if not _BOOL_LOGITS_TO_KEEP or model is None:
        return bool(_BOOL_LOGITS_TO_KEEP)
    import sys

    # FSDP2 wraps the class (FSDP<Name>): the model's own class is further up its MRO
    return any(hasattr(sys.modules.get(cls.__module__), "slice_logits_to_keep") for cls in type(model).__mro__)


def position_ids_of(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding shifts nothing: (B, T) long.
    A left pad is at 0; a right pad repeats its row's last position."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def pad_batch(seqs: Sequence[Sequence[int] | np.ndarray | torch.Tensor], pad_id: int | bool = 0,
              side: str = "right", *, dtype: torch.dtype = torch.long,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The one token padding: 1-D sequences of any lengths as one (B, T) batch, T the
    longest, on the CPU: ``(ids, attention_mask, position_ids)``.

    ``ids`` (``dtype``) holds each sequence flush at its ``side`` ("right": tokens first;
    "left": padding first, so every row's next token is column -1) and ``pad_id``
    elsewhere. ``attention_mask`` (long) is 1 on real tokens, 0 on padding.
    ``position_ids`` (long) are :func:`position_ids_of` the mask. Padding per-token values
    other than ids takes the first tensor alone, e.g. a loss mask:
    ``pad_batch(masks, False, dtype=torch.bool)[0]``.
    """
    if side not in ("right", "left"):
        raise ValueError(f"side must be 'right' or 'left', got {side!r}")
    if not len(seqs):
        raise ValueError("no sequences to pad")
    rows = [torch.as_tensor(s, dtype=dtype).reshape(-1) for s in seqs]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=dtype)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, r in enumerate(rows):
        real = slice(0, len(r)) if side == "right" else slice(width - len(r), width)
        ids[b, real] = r
        attention_mask[b, real] = 1
    return ids, attention_mask, position_ids_of(attention_mask)


# Vocabulary-sized float32 values the log-prob path holds at once (the logits of one chunk of
# positions): 2**22 elements = 16 MB, i.e. 85 positions at a 49k vocabulary, 27 at 151k.
# Read at call time; 0 means no chunking (the model's own full logits, the old path).
LOGIT_CHUNK_ELEMENTS = 1 << 22

# Config fields of models whose logits are not a plain linear map of the last hidden state
# (soft-capping, scaling): those keep the model's own forward (full logits).
_LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling",
                         "output_multiplier_scale", "logit_softcapping")


def _plain_output_layer(model: Any) -> torch.nn.Linear | None:
    """The model's output layer when its logits are exactly ``output_layer(decoder(x))``
    (Llama, Qwen, SmolLM2, ...); None when something else happens to them."""
    get_decoder = getattr(model, "get_decoder", None)
    get_output = getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_output is None:
        return None
    head = get_output()
    if type(head) is not torch.nn.Linear:
        return None
    config = getattr(model, "config", None)
    for name in _LOGIT_POSTPROCESSING:
        value = getattr(config, name, None)
        if value not in (None, 0, 1, 1.0, False):
            return None
    return head


class _ChunkedTokenLogprob(torch.autograd.Function):
    """``log_softmax(linear(hidden) / T)[target]`` for each row of ``hidden`` (N, H), with
    the (N, V) logits never held at once: forward and backward go over chunks of rows and
    recompute each chunk's logits from the saved hidden states. The gradient is the
    analytic one of the unchunked expression, ``grad * (onehot(target) - softmax) / T``
    per row (summation order aside, the same numbers).

    The logits are computed in the output layer's own dtype, also under ``torch.autocast``
    (``algos.precision``): the backward, which autocast does not reach, recomputes them, and
    both must see the same numbers."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                target: torch.Tensor, temperature: float, chunk: int) -> torch.Tensor:
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        normaliser = torch.empty(n, dtype=torch.float32, device=hidden.device)
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            for lo in range(0, n, chunk):
                h = hidden[lo : lo + chunk].to(weight.dtype)
                logits = torch.nn.functional.linear(h, weight, bias).float()
                logits = logits / temperature  # (C, V), as the unchunked path computes them
                lse = logits.logsumexp(-1)
                out[lo : lo + chunk] = logits.gather(-1, target[lo : lo + chunk, None]).squeeze(-1) - lse
                normaliser[lo : lo + chunk] = lse
        ctx.save_for_backward(hidden, weight, bias, target, normaliser)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, bias, target, normaliser = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # accumulate the output layer's gradient in float32 whatever the weight's dtype
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        grad_bias = (torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
                     if need_bias and bias is not None else None)
        grad_out = grad_out.float()
        for lo in range(0, hidden.shape[0], ctx.chunk):
            h = hidden[lo : lo + ctx.chunk].to(weight.dtype)
            g_out = grad_out[lo : lo + ctx.chunk, None]  # (C, 1)
            logits = torch.nn.functional.linear(h, weight, bias).float() / ctx.temperature
            grad = logits.sub_(normaliser[lo : lo + ctx.chunk, None]).exp_()  # softmax (C, V)
            grad.mul_(-g_out).scatter_add_(-1, target[lo : lo + ctx.chunk, None], g_out)
            if ctx.temperature != 1:
                grad.div_(ctx.temperature)
            if grad_bias is not None:
                grad_bias += grad.sum(0)
            if grad_weight is not None:
                grad_weight.addmm_(grad.t(), h.float())
            if grad_hidden is not None:
                grad_hidden[lo : lo + ctx.chunk] = grad.to(weight.dtype) @ weight
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   targets: torch.Tensor, temperature: float = 1.0, *,
                   chunk_elements: int | None = None) -> torch.Tensor:
    """Log-probs of the tokens ``input_ids[targets]``, each under ``model`` given the tokens
    before it in its row: a float32 tensor (N,), N = ``targets.sum()``, in row-major order.

    ``input_ids``, ``attention_mask``: (B, T), padding anywhere the mask is 0 (left or right).
    ``targets``: (B, T) bool, True only where a real token precedes in the row (column 0
    can never be a target: nothing predicts it). ``temperature``: the log-probs of the
    distribution that sampling at that temperature draws from (logits / temperature), so
    that an RL learner's ratios and KLs are taken under the policy that acted. Keeps the
    graph: call it under ``torch.no_grad()`` to score, without to train.

    Memory: the output layer is applied to chunks of at most ``chunk_elements // V``
    predicting positions at a time, forward and backward (default
    :data:`LOGIT_CHUNK_ELEMENTS`; :class:`_ChunkedTokenLogprob`), so the (N, V) logits are
    never held whole. ``chunk_elements=0``, or a model whose logits are not a plain linear
    layer over the decoder, takes the model's own forward; both give the same values and
    gradients (up to float summation order).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if targets[:, 0].any():
        raise ValueError("the first token of a row has no prediction; targets[:, 0] must be False")
    predictors = torch.zeros_like(targets)  # position t-1 predicts token t
    predictors[:, :-1] = targets[:, 1:]
    chunk_elements = LOGIT_CHUNK_ELEMENTS if chunk_elements is None else int(chunk_elements)
    head = _plain_output_layer(model) if chunk_elements > 0 else None
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask,
              "position_ids": position_ids_of(attention_mask), "use_cache": False}
    if head is not None:
        hidden = model.get_decoder()(**inputs).last_hidden_state[predictors]  # (N, H)
        chunk = max(1, chunk_elements // head.out_features)
        return _ChunkedTokenLogprob.apply(hidden, head.weight, head.bias, input_ids[targets],
                                          float(temperature), chunk)
    keep = bool_logits_to_keep(model)
    out = model(**inputs, **({"logits_to_keep": predictors} if keep else {}))
    logits = out.logits if keep else out.logits[predictors]  # (N, V)
    logits = logits.float() / temperature
    chosen = logits.gather(-1, input_ids[targets].unsqueeze(-1)).squeeze(-1)
    return chosen - logits.logsumexp(-1)


def sequence_logprobs(model: Any, input_ids_list: Sequence[Sequence[int] | np.ndarray],
                      start_positions: Sequence[int], *, batch_size: int = 16) -> list[np.ndarray]:
    """Teacher-forced log-probs (plain softmax, temperature 1) of ``seq[start:]`` for each
    sequence: one float32 array of length ``len(seq) - start`` per sequence, in order.

    ``start`` is at least 1 (the first token has no prediction) and at most ``len(seq)``.
    Sequences are scored in right-padded batches of ``batch_size``; no gradient.
    """
    if len(input_ids_list) != len(start_positions):
        raise ValueError(f"{len(input_ids_list)} sequences but {len(start_positions)} start "
                         "positions")
    device = next(model.parameters()).device
    results: list[np.ndarray] = []
    for lo in range(0, len(input_ids_list), batch_size):
        seqs = [np.asarray(s, dtype=np.int64).reshape(-1)
                for s in input_ids_list[lo : lo + batch_size]]
        pairs = list(zip(seqs, start_positions[lo : lo + batch_size], strict=True))
        for i, (seq, start) in enumerate(pairs):
            if not 1 <= start <= len(seq):
                raise ValueError(f"sequence {lo + i} has {len(seq)} tokens; start {start} is not "
                                 f"in [1, {len(seq)}]")
        input_ids, attention_mask, _ = pad_batch(seqs)
        targets = pad_batch([np.arange(len(seq)) >= start for seq, start in pairs], False,
                            dtype=torch.bool)[0]
        with torch.inference_mode():
            flat = token_logprobs(model, input_ids.to(device), attention_mask.to(device),
                                  targets.to(device))
        ends = np.cumsum([len(seq) - start for seq, start in pairs])
        results += [part.copy() for part in np.split(flat.cpu().numpy(), ends[:-1])]
    return results


def nucleus_logprobs(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Restrict log-probs (B, V) to the nucleus and renormalise: the most likely tokens are
    kept while the mass before them is below ``top_p`` (so the top token always stays);
    the rest get ``-inf``."""
    vocab = logp.shape[-1]
    # A full sort of a 49k vocabulary costs more than a small model's decoding step, and
    # the nucleus of a trained LM is usually tiny: sort only the top k, growing k until
    # the top k hold ``top_p`` of every row's mass (tokens beyond them cannot be in it).
    k = min(vocab, 256)
    while True:
        top_logp, top_index = logp.topk(k, dim=-1)  # (B, k), descending
        if k == vocab or bool((top_logp.exp().sum(-1) >= top_p).all()):
            break
        k = min(vocab, k * 8)
    top_p_ = top_logp.exp()
    mass_before = top_p_.cumsum(-1) - top_p_
    top_logp = top_logp.masked_fill(mass_before >= top_p, float("-inf"))
    top_logp = top_logp - top_logp.logsumexp(-1, keepdim=True)
    return torch.full_like(logp, float("-inf")).scatter(-1, top_index, top_logp)


SAMPLE_BLOCK = 256  # vocabulary entries per block of the two-level inverse CDF


def sample_from_weights(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token (B,) per row of non-negative weights (B, V), drawn exactly with probability
    ``weights / weights.sum(-1)`` by inverse CDF from one float64 uniform per row; tokens of
    weight 0 are never drawn.

    A float64 cumulative sum over the whole vocabulary is a sequential scan that cost more
    than a small model's decoding step (38 ms for 16 rows of 49k on one core), so the CDF is
    taken in two levels: over blocks of :data:`SAMPLE_BLOCK` entries (a vectorised sum), then
    inside the one block the draw falls in. ``torch.multinomial`` is slower still."""
    rows, vocab = weights.shape
    blocks = -(-vocab // SAMPLE_BLOCK)
    if blocks * SAMPLE_BLOCK != vocab:  # pad with weight 0 (never drawn)
        weights = torch.nn.functional.pad(weights, (0, blocks * SAMPLE_BLOCK - vocab))
    weights = weights.view(rows, blocks, SAMPLE_BLOCK)
    block_cdf = weights.sum(-1, dtype=torch.float64).cumsum(-1)  # (B, blocks)
    total = block_cdf[:, -1:]
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64, device=weights.device)
    # u in (0, total]: the first block whose cdf reaches u has positive mass
    u = torch.minimum((u * total).clamp_min(torch.finfo(torch.float64).tiny), total)
    block = torch.searchsorted(block_cdf, u).clamp_(max=blocks - 1)  # (B, 1)
    before = torch.where(block > 0, block_cdf.gather(-1, (block - 1).clamp_(min=0)), 0.0)
    inside = weights.gather(1, block[:, :, None].expand(rows, 1, SAMPLE_BLOCK)).squeeze(1)  # (B, blk)
    local_cdf = inside.double().cumsum(-1)
    residual = torch.maximum(u - before, local_cdf.new_full((rows, 1), torch.finfo(torch.float64).tiny))
    local = torch.searchsorted(local_cdf, residual)  # (B, 1)
    # float64 rounding can leave the residual a hair above the block's own sum: take the
    # block's last token of positive weight then
    last_positive = (inside > 0).long().cumsum(-1).argmax(-1, keepdim=True)
    local = torch.where(local >= SAMPLE_BLOCK, last_positive, local)
    return (block * SAMPLE_BLOCK + local).squeeze(-1)


def sample_from_logprobs(logp: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token (B,) per row of log-probs (B, V), drawn exactly from ``exp(logp)``
    (:func:`sample_from_weights`; tokens with probability 0 are never drawn)."""
    return sample_from_weights(logp.exp(), generator)


def next_tokens(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoding step every backend shares: next tokens (B,) and their log-probs (B,)
    under the distribution they were drawn from, from next-token logits (B, V).

    ``temperature == 0``: greedy (argmax), with the plain softmax's log-prob. Otherwise a
    draw from ``softmax(logits / temperature)`` restricted to the ``top_p`` nucleus. The
    log-prob is ``logit - logsumexp`` of the chosen token only: no (B, V) log-softmax is
    written unless a nucleus is cut (``top_p < 1``). The values are those of
    :func:`token_logprobs` on the same tokens. Raises ValueError when a row's logits hold
    NaN or +inf, or are all -inf (a model with non-finite weights): there is no
    distribution to sample from."""
    logits = logits.float()
    scaled = logits / temperature if temperature not in (0, 1) else logits
    normaliser = scaled.logsumexp(-1)  # NaN, +inf or -inf exactly when a row is unusable
    if not bool(torch.isfinite(normaliser).all()):
        bad = int((~torch.isfinite(normaliser)).sum())
        raise ValueError(f"HFPolicy: the model's next-token logits are NaN or infinite in {bad} of "
                         f"{len(normaliser)} rows (are its weights finite?); refusing to sample")
    if temperature == 0:
        tokens = logits.argmax(-1)
    elif top_p < 1:
        logp = nucleus_logprobs(scaled - normaliser[:, None], top_p)
        tokens = sample_from_logprobs(logp, generator)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    else:
        tokens = sample_from_weights((scaled - normaliser[:, None]).exp_(), generator)
    return tokens, scaled.gather(-1, tokens[:, None]).squeeze(-1) - normaliser
