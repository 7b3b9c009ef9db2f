"""The other side of each figure: the bare implementations of the same work (a KV-cache
decode loop, ``model.generate``, a plain forward + ``cross_entropy`` + backward, a no-grad
forward) and the ``before`` sides, the decoding step and the learner's log-probs as this
release replaced them."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from typing import Any
from unittest import mock

import numpy as np
import torch


def _cache_arg(model: Any) -> str:
    """The KV-cache keyword of ``model.forward`` (transformers >= 5.2x renamed it)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def minimal_decode(model: Any, calls: Sequence[tuple[list[np.ndarray], list[int]]], batch_size: int,
                   pad_id: int, temperature: float, top_p: float, seed: int) -> list[list[list[int]]]:
    """The limit of decoding: replay recorded policy calls with a bare KV-cache loop and the
    shared decoding step (``agents.logprobs.next_tokens``): the same prompts in the same
    length-sorted, left-padded batches as ``HFPolicy``, each row stopped at its recorded
    length (so a sampled replay draws the same uniforms and gives the same tokens). No stop
    strings, no per-row bookkeeping beyond that. Returns the tokens per call, per prompt."""
    from agents.logprobs import next_tokens, pad_batch

    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    cache_kw = _cache_arg(model)
    out_tokens: list[list[list[int]]] = []
    with torch.inference_mode():
        for prompts, lengths in calls:
            tokens_of: list[list[int]] = [[] for _ in prompts]
            order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
            for lo in range(0, len(order), batch_size):
                rows = [i for i in order[lo:lo + batch_size] if lengths[i] > 0]
                if not rows:
                    continue
                ids, mask, position = pad_batch([prompts[i] for i in rows], pad_id, "left")
                out = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True,
                            logits_to_keep=1)
                cache, logits, position = getattr(out, cache_kw), out.logits[:, -1], position[:, -1:] + 1
                while True:
                    token, _ = next_tokens(logits, temperature, top_p, generator)
                    for b, i in enumerate(rows):
                        tokens_of[i].append(int(token[b]))
                    keep = [b for b, i in enumerate(rows) if len(tokens_of[i]) < lengths[i]]
                    if not keep:
                        break
                    if len(keep) < len(rows):
                        index = torch.tensor(keep)
                        cache.reorder_cache(index)
                        token, mask, position = token[index], mask[index], position[index]
                        rows = [rows[b] for b in keep]
                    mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=-1)
                    out = model(input_ids=token[:, None], attention_mask=mask, position_ids=position,
                                use_cache=True, **{cache_kw: cache})
                    cache, logits, position = getattr(out, cache_kw), out.logits[:, -1], position + 1
            out_tokens.append(tokens_of)
    return out_tokens


def legacy_policy(policy: Any) -> Any:
    """``policy`` (an HFPolicy) with the decoding step this release replaced: a full
    log-softmax per step, the sampled token drawn from a float64 cumulative sum over the
    whole vocabulary (in place of ``agents.hf.next_tokens`` while it acts), and the generated
    tail decoded for stop strings at every step."""
    import agents.hf
    from agents.hf import HFPolicy
    from agents.logprobs import nucleus_logprobs

    def full_cdf_step(logits: torch.Tensor, temperature: float, top_p: float,
                      generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits.float()
        normaliser = logits.logsumexp(-1)
        if not bool(torch.isfinite(normaliser).all()):
            raise ValueError("non-finite logits")
        if temperature == 0:
            logp = logits.log_softmax(-1)
            tokens = logp.argmax(-1)
        else:
            logp = (logits / temperature if temperature != 1 else logits).log_softmax(-1)
            if top_p < 1:
                logp = nucleus_logprobs(logp, top_p)
            cdf = logp.exp().double().cumsum(-1)
            total = cdf[:, -1:]
            u = torch.rand(total.shape, generator=generator, dtype=torch.float64)
            u = torch.minimum((u * total).clamp_min(torch.finfo(torch.float64).tiny), total)
            tokens = torch.searchsorted(cdf, u).squeeze(-1)
        return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    class LegacyDecoding(HFPolicy):
        def act(self, observations: Sequence[Any]) -> list[Any]:
            with mock.patch.object(agents.hf, "next_tokens", full_cdf_step):
                return super().act(observations)

        def _stopped_by_string(self, generated: list[int], stops: tuple[str, ...], window: int) -> bool:
            tail = self.tokenizer.decode(generated[-window:], skip_special_tokens=False)
            return any(stop in tail for stop in stops)

    legacy = LegacyDecoding.__new__(LegacyDecoding)
    legacy.__dict__.update(policy.__dict__)
    legacy.generator = torch.Generator(device=policy.device)
    return legacy


def bare_generate(model: Any, calls: Sequence[tuple[list[np.ndarray], list[int]]], batch_size: int,
                  pad_id: int, eos_id: int, temperature: float = 0.0, top_p: float = 1.0) -> None:
    """Peer: replay recorded policy calls with ``model.generate`` (greedy, or sampled at
    ``temperature``: other draws, the same lengths): the same prompts, in the same
    length-sorted batches as ``HFPolicy``, each batch to its longest recorded turn."""
    from agents.logprobs import pad_batch

    sampling = ({"do_sample": False} if temperature == 0 else
                {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0})
    with torch.inference_mode():
        for prompts, lengths in calls:
            order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
            for lo in range(0, len(order), batch_size):
                chunk = order[lo:lo + batch_size]
                new = max(lengths[i] for i in chunk)
                if new == 0:
                    continue
                ids, mask, _ = pad_batch([prompts[i] for i in chunk], pad_id, "left")  # as HFPolicy does
                model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                               pad_token_id=pad_id, eos_token_id=eos_id, **sampling)


def plain_fwd_bwd(model: Any, ids: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor) -> None:
    """The plain way to train on these tokens: the model's own logits at the predicting
    positions, ``cross_entropy``, backward."""
    from agents.logprobs import bool_logits_to_keep, position_ids_of

    model.zero_grad(set_to_none=True)
    predictors = torch.zeros_like(targets)
    predictors[:, :-1] = targets[:, 1:]
    position = position_ids_of(mask)
    if bool_logits_to_keep(model):  # transformers >= 5.21 slices with a boolean mask
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position,
                       logits_to_keep=predictors).logits  # (N, V)
    else:
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position).logits[predictors]
    torch.nn.functional.cross_entropy(logits.float(), ids[targets], reduction="sum").backward()


def bare_forward(model: Any, ids: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor) -> None:
    """No-grad forward of one padded batch: the decoder over every token, the output layer
    at the positions that predict a target."""
    predictors = torch.zeros_like(targets)
    predictors[:, :-1] = targets[:, 1:]
    with torch.inference_mode():
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        model.get_output_embeddings()(hidden[predictors])  # (N, V)


@contextlib.contextmanager
def full_vocabulary_logits():
    """The learner's log-probs as before this release: every trained token's logits at once."""
    import agents.logprobs

    saved = agents.logprobs.LOGIT_CHUNK_ELEMENTS
    agents.logprobs.LOGIT_CHUNK_ELEMENTS = 0
    try:
        yield
    finally:
        agents.logprobs.LOGIT_CHUNK_ELEMENTS = saved
