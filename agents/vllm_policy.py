"""A vLLM engine as a batched policy: token ids in, token ids and their log-probs out
(``pip install -e .[vllm]``; a GPU).

Every observation's context goes to the engine as a ``TokensPrompt`` (the env's exact ids,
never re-tokenised text), all live env copies in one ``LLM.generate`` call; each request
carries its role's stop strings (kept in the output, as :class:`~agents.hf.HFPolicy` keeps
them), the temperature, top-p, and the turn budget ``min(obs.max_new_tokens,
max_new_tokens)``. The log-prob of each sampled token comes back with it
(``SamplingParams(logprobs=0)``: the sampled token only); the engine is asked for the
log-probs of the distribution it sampled from (``logprobs_mode="processed_logprobs"``,
temperature and top-p applied) where the installed vLLM has that option. The learner does
not trust them anyway: it recomputes the old log-probs with the trained model.

Weights: :meth:`VLLMPolicy.load_weights` pushes the trainer's ``(name, tensor)`` pairs into
the engine's model through vLLM's own loader (``model.load_weights``, run on the engine's
worker with ``collective_rpc``); :meth:`sleep` and :meth:`wake_up` release and retake the
engine's GPU memory around an update when learner and engine share the GPU
(``enable_sleep_mode``).

Sampling: each request gets its own seed, drawn from the policy's seed and a counter, so
the same seed and the same calls give the same tokens; :meth:`reseed` restarts it (a Ray
rollout worker reseeds per question group).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from agents.base import Action, Observation
from agents.extras import require

VLLM_EXTRA = "pip install -e '.[vllm]'  (or: pip install vllm; it needs a CUDA GPU)"


def require_vllm() -> Any:
    """The ``vllm`` module, or ImportError in one line naming the install."""
    return require("vllm", "rollout_backend=vllm", VLLM_EXTRA)


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, Any]]) -> int:
    """Run inside vLLM's worker by ``collective_rpc``: the weights through the model's own
    loader (it maps Hugging Face names onto vLLM's fused layers, e.g. q/k/v onto
    ``qkv_proj``, and skips a tied ``lm_head``). ``get_model()`` where the runner has it
    (vLLM V1's ``GPUModelRunner``), its ``model`` attribute otherwise."""
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights=weights)
    return len(weights)


class VLLMPolicy:
    """``model``: a model directory (or hub id) that ``vllm.LLM`` loads; ``tokenizer``: the
    env's tokenizer (decodes ``Action.text``; its EOS ends a turn). ``engine``: an object with
    vLLM's ``LLM`` interface to use instead of building one (tests pass a fake);
    ``engine_kwargs`` go to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``dtype``).
    ``temperature`` 0 is greedy."""

    def __init__(self, model: str, tokenizer: Any, *, temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, seed: int = 0, engine: Any = None, **engine_kwargs: Any):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token_id")
        self.tokenizer = tokenizer
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.max_new_tokens = int(max_new_tokens)
        self.seed = int(seed)
        self._requests = 0
        if engine is None:
            vllm = require_vllm()
            # collective_rpc sends _load_weights_on_worker, a function of ours, to the engine's
            # worker; vLLM V1 refuses to pickle callables to an engine process without this
            # (an in-process engine, VLLM_ENABLE_V1_MULTIPROCESSING=0, does not need it)
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
            # the learner usually shares the GPU: the engine takes a third of it unless told
            kwargs = dict(seed=seed, enable_sleep_mode=True, **{"gpu_memory_utilization": 0.3, **engine_kwargs})
            try:  # log-probs of the distribution sampled from (vLLM >= 0.10.2)
                engine = vllm.LLM(model=str(model), logprobs_mode="processed_logprobs", **kwargs)
            except TypeError:
                engine = vllm.LLM(model=str(model), **kwargs)
        self.engine = engine
        self.sleeping = False

    # -- the policy interface -------------------------------------------------------------

    def act(self, observations: Sequence[Observation]) -> list[Action]:
        """One :class:`Action` per observation, in order, from one ``generate`` call."""
        sampling, tokens_prompt = self._vllm_types()
        prompts, params, live = [], [], []
        for i, obs in enumerate(observations):
            ids = np.asarray(obs.token_ids, dtype=np.int64).reshape(-1)
            if len(ids) == 0:
                raise ValueError(f"observation of {obs.agent} (env {obs.env_index}) has an empty context")
            budget = min(int(obs.max_new_tokens), self.max_new_tokens)
            if budget <= 0:
                continue
            prompts.append(tokens_prompt(prompt_token_ids=ids.tolist()))
            params.append(sampling(
                temperature=self.temperature, top_p=self.top_p if self.temperature > 0 else 1.0,
                max_tokens=budget, stop=[s for s in obs.stop if s], include_stop_str_in_output=True,
                logprobs=0, seed=self._next_seed(), skip_special_tokens=False, detokenize=True))
            live.append(i)
        actions = [Action(token_ids=[], logprobs=[], text="") for _ in observations]
        if not prompts:
            return actions
        outputs = self.engine.generate(prompts, params, use_tqdm=False)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM answered {len(outputs)} outputs for {len(prompts)} prompts")
        for i, out in zip(live, outputs):
            completion = out.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            logprobs = self._sampled_logprobs(ids, completion.logprobs)
            actions[i] = Action(token_ids=ids, logprobs=logprobs,
                                text=self.tokenizer.decode(ids, skip_special_tokens=False))
        return actions

    def reseed(self, seed: int) -> None:
        """Restart the per-request seeds at ``seed``."""
        self.seed, self._requests = int(seed), 0

    def get_state(self) -> list[int]:
        """Where the per-request seeds stand (a checkpoint keeps it, so a resumed run goes on
        with the seeds an uninterrupted one would draw)."""
        return [self.seed, self._requests]

    def set_state(self, state: Sequence[int]) -> None:
        self.seed, self._requests = int(state[0]), int(state[1])

    # -- weights and memory ---------------------------------------------------------------

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Push ``(name, tensor)`` pairs (Hugging Face names, e.g. ``model.named_parameters()``)
        into the engine through vLLM's loader; wakes the engine first if it sleeps."""
        if self.sleeping:
            self.wake_up()
        weights = [(name, t.detach()) for name, t in named_tensors]
        self.engine.collective_rpc(_load_weights_on_worker, args=(weights,))
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if reset is not None:  # cached prefixes were computed with the old weights
            reset()

    def sleep(self, level: int = 1) -> None:
        """Release the engine's GPU memory (level 1: weights to CPU, KV cache dropped), e.g.
        while the learner updates on the same GPU. Level 2 discards the weights: only call it
        when :meth:`load_weights` follows every :meth:`wake_up` (vLLM then has no weights of
        its own to restore; generating before that gives garbage, vLLM issue #29341)."""
        self.engine.sleep(level=level)
        self.sleeping = True

    def wake_up(self) -> None:
        self.engine.wake_up()
        self.sleeping = False

    # -- helpers ----------------------------------------------------------------------------

    def _next_seed(self) -> int:
        self._requests += 1
        return (self.seed * 1_000_003 + self._requests) % (2**31 - 1)

    @staticmethod
    def _sampled_logprobs(ids: list[int], per_position: Any) -> list[float]:
        """The sampled tokens' log-probs out of vLLM's per-position ``{token_id: Logprob}``."""
        if per_position is None or len(per_position) != len(ids):
            raise RuntimeError(f"vLLM returned log-probs for {0 if per_position is None else len(per_position)} "
                               f"of {len(ids)} tokens (was SamplingParams(logprobs=0) honoured?)")
        out = []
        for token, table in zip(ids, per_position):
            entry = table[token]
            out.append(float(getattr(entry, "logprob", entry)))
        return out

    def _vllm_types(self) -> tuple[Any, Any]:
        """``SamplingParams`` and ``TokensPrompt`` of the engine's vLLM (the fake's in tests)."""
        own = getattr(self.engine, "vllm_types", None)
        if own is not None:
            return own
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        return SamplingParams, TokensPrompt
