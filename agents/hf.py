"""HFPolicy: a transformers causal LM as a batched policy.

:class:`HFPolicy` samples with its own loop (left-padded batch, KV cache) rather than
``model.generate``, so that each returned log-prob is that of the sampled token under the
distribution it was drawn from, as the learner scores it (:mod:`agents.logprobs`).

>>> policy = HFPolicy("smollm2", temperature=0.7, top_p=0.9)   # doctest: +SKIP
>>> [action] = policy.act([observation])                       # doctest: +SKIP
>>> action.token_ids, action.logprobs, action.text             # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from agents.base import Action, Observation
from agents.logprobs import next_tokens, pad_batch
from agents.models import load_causal_lm
from agents.sampling import SampledPolicy, Sampling, generation_defaults


class HFPolicy(SampledPolicy):
    """A transformers causal LM that acts for every observation it is given, in batches.

    ``model``: a name or path for :func:`agents.models.load_causal_lm` (then ``device`` and
    ``dtype`` apply), or a model object (then ``tokenizer`` is required and the model stays
    on its own device and dtype).
    ``sampling`` (an :class:`agents.sampling.Sampling`), or ``temperature``, ``top_p`` and
    ``max_new_tokens`` as keywords (which win; unset: :data:`agents.sampling.POLICY_DEFAULT`);
    greedy turns carry the plain softmax's log-probs (:func:`agents.logprobs.next_tokens`).
    ``seed``: seeds the policy's own ``torch.Generator``; the same seed and the same calls
    give the same tokens. ``batch_size``: observations per forward batch.

    A turn ends at EOS (``tokenizer.eos_token_id``, kept in the returned ids), when the
    generated text comes to contain one of ``obs.stop`` (the completing token is kept), or
    after ``min(obs.max_new_tokens, max_new_tokens)`` tokens. ``Action.text`` is the
    decoding of exactly ``Action.token_ids``, special tokens included.
    """

    def __init__(self, model: Any = "smollm2", tokenizer: Any = None, *,
                 sampling: Sampling | None = None, temperature: float | None = None,
                 top_p: float | None = None, max_new_tokens: int | None = None,
                 device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                 seed: int = 0, batch_size: int = 16) -> None:
        self._set_sampling(sampling, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if isinstance(model, str):
            model, loaded_tokenizer = load_causal_lm(model, dtype=dtype, device=device)
            tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
        elif tokenizer is None:
            raise ValueError(f"a {type(model).__name__} model object needs its tokenizer: "
                             "pass tokenizer=")
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token_id")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self.device = next(model.parameters()).device
        self.eos_token_id = int(tokenizer.eos_token_id)
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_id
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self._token_text: dict[int, str] = {}  # token id -> its text alone (stop-string checks)
        self._stop_ends: dict[tuple[str, ...], str] = {}  # stop strings -> their last characters
        # transformers >= 5.2x renamed the KV-cache argument `past_key_values` to `cache`.
        forward_params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward_params else "past_key_values"
        # prefill projects only the last position onto the vocabulary when the model can
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in forward_params else {}

    def act(self, observations: Sequence[Observation]) -> list[Action]:
        """One :class:`Action` per observation, in order."""
        # Batches of similar prompt lengths waste less compute on padding.
        order = sorted(range(len(observations)), key=lambda i: -len(observations[i].token_ids))
        actions: list[Action | None] = [None] * len(observations)
        for lo in range(0, len(order), self.batch_size):
            chunk = order[lo : lo + self.batch_size]
            actions_ = self._generate([observations[i] for i in chunk])
            for i, action in zip(chunk, actions_, strict=True):
                actions[i] = action
        return actions  # type: ignore[return-value]

    def _stopped_by_string(self, generated: list[int], stops: tuple[str, ...], window: int) -> bool:
        # Only the last few tokens are decoded: a stop string of n UTF-8 bytes spans at most
        # n byte-level tokens, and it can only just have been completed (we check every step).
        # Nor is the tail decoded when the last token cannot complete one: its own text holds
        # no stop string's last character and no partial UTF-8 character (U+FFFD). Decoding is
        # byte-exact concatenation for byte-level tokenizers; where decoding may rewrite text
        # across tokens (``clean_up_tokenization_spaces``) or a stop string ends in whitespace
        # (SentencePiece drops a lone token's leading space), every token may complete one.
        ends = self._stop_ends.get(stops)
        if ends is None:
            cleans = bool(getattr(self.tokenizer, "clean_up_tokenization_spaces", False))
            ends = "" if cleans or any(s[-1].isspace() for s in stops) else "".join({s[-1] for s in stops})
            self._stop_ends[stops] = ends
        if ends:
            token = generated[-1]
            text = self._token_text.get(token)
            if text is None:  # one decode per token id
                text = self.tokenizer.decode([token], skip_special_tokens=False)
                self._token_text[token] = text
            if "\ufffd" not in text and not any(c in text for c in ends):
                return False
        tail = self.tokenizer.decode(generated[-window:], skip_special_tokens=False)
        return any(stop in tail for stop in stops)

    def _cache_of(self, out: Any) -> Any:
        return out.cache if self._cache_arg == "cache" else out.past_key_values

    @torch.inference_mode()
    def _generate(self, observations: Sequence[Observation]) -> list[Action]:
        n = len(observations)
        prompts = [np.asarray(o.token_ids, dtype=np.int64).reshape(-1) for o in observations]
        for o, p in zip(observations, prompts, strict=True):
            if len(p) == 0:
                raise ValueError(f"observation of {o.agent} (env {o.env_index}) has an empty "
                                 "context")
        limits = [min(int(o.max_new_tokens), self.max_new_tokens) for o in observations]
        stops = [tuple(s for s in o.stop if s) for o in observations]
        windows = [max((len(s.encode()) for s in st), default=0) + 2 for st in stops]
        generated: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]

        rows = [i for i in range(n) if limits[i] > 0]  # batch row -> observation index
        if rows:
            was_training = self.model.training
            self.model.eval()
            try:
                self._decode_loop(prompts, rows, limits, stops, windows, generated, logprobs)
            finally:
                self.model.train(was_training)
        return [Action(token_ids=generated[i], logprobs=logprobs[i],
                       text=self.tokenizer.decode(generated[i], skip_special_tokens=False))
                for i in range(n)]

    def _decode_loop(self, prompts: list[np.ndarray], rows: list[int], limits: list[int],
                     stops: list[tuple[str, ...]], windows: list[int], generated: list[list[int]],
                     logprobs: list[list[float]]) -> None:
        """Fill ``generated``/``logprobs`` for the observations in ``rows``. Finished rows are
        dropped from the batch (and the KV cache), so they cost nothing afterwards."""
        # left padding: every row's next token is column -1
        batch = pad_batch([prompts[i] for i in rows], self.pad_token_id, "left")
        input_ids, attention_mask, position_ids = (x.to(self.device) for x in batch)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, use_cache=True, **self._last_logits_only)
        cache = self._cache_of(out)
        logits = out.logits[:, -1, :]  # (B, V)
        next_position = position_ids[:, -1] + 1  # (B,)

        while True:
            # next tokens (B,) and their log-probs (B,) under the distribution sampled from
            tokens, token_lp = next_tokens(logits, self.temperature, self.top_p, self.generator)
            keep: list[int] = []
            for b, (i, token, logprob) in enumerate(zip(rows, tokens.tolist(), token_lp.tolist(),
                                                        strict=True)):
                generated[i].append(token)
                logprobs[i].append(logprob)
                done = (token == self.eos_token_id or len(generated[i]) >= limits[i] or (
                    stops[i] and self._stopped_by_string(generated[i], stops[i], windows[i])))
                if not done:
                    keep.append(b)
            if not keep:
                return
            if len(keep) < len(rows):
                index = torch.tensor(keep, dtype=torch.long, device=self.device)
                cache.reorder_cache(index)
                tokens = tokens[index]
                attention_mask = attention_mask[index]
                next_position = next_position[index]
                rows = [rows[b] for b in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(rows), 1))],
                                       dim=-1)
            out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=attention_mask,
                             position_ids=next_position.unsqueeze(-1), use_cache=True,
                             **{self._cache_arg: cache})
            cache = self._cache_of(out)
            logits = out.logits[:, -1, :]
            next_position = next_position + 1


def hf_policy(model: Any, *, sampling: Sampling | None = None, **kwargs: Any) -> HFPolicy:
    """An :class:`HFPolicy` (``kwargs`` as its own) whose unset settings come from the model's
    generation config (``agents.sampling.generation_defaults``). ``policy.sampling_source``
    says where they came from."""
    policy = HFPolicy(model, sampling=sampling, **kwargs)
    sampling = sampling or Sampling()
    temperature, top_p, source = generation_defaults(policy.model)
    if sampling.temperature is not None and sampling.top_p is not None:
        source = "set"
    elif sampling.temperature is not None or sampling.top_p is not None:
        source = f"set, the rest from {source}"
    policy._set_sampling(sampling.over(Sampling(temperature, top_p)))
    policy.sampling_source = source
    return policy
