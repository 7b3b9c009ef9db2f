"""A vLLM engine as a batched policy: token ids in, token ids and their log-probs out (on a
CUDA GPU with ``pip install -e .[vllm]``; on the CPU with vLLM's CPU build,
``bash scripts/install_vllm.sh``).

Every observation's context goes to the engine as a ``TokensPrompt`` (the env's exact ids,
never re-tokenised text), all live env copies in one ``LLM.generate`` call, each request with
its role's stop strings (kept in the output, as :class:`~agents.hf.HFPolicy` keeps them) and
its own seed, drawn from the policy's seed and a counter (:meth:`VLLMPolicy.reseed`).

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so that
:meth:`VLLMPolicy.load_weights` can hand it the trainer's tensors through vLLM's own loader.
Why, and how the weight push, the sleep levels and the CPU build work: docs/scaleout.md, "vLLM".
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from agents.base import Action, Observation
from agents.extras import require
from agents.sampling import SampledPolicy, Sampling

VLLM_EXTRA = ("pip install -e '.[vllm]' on a CUDA GPU, or on the CPU: bash scripts/install_vllm.sh "
              "(a venv with vLLM's CPU build)")
MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"
"""vLLM's switch between an engine in another process (its default, "1") and one in this
process ("0"); the weight push needs the latter."""


def require_vllm() -> Any:
    """The ``vllm`` module, or ImportError in one line naming the install."""
    return require("vllm", "rollout_backend=vllm", VLLM_EXTRA)


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, Any]]) -> int:
    """Run inside vLLM's worker by ``collective_rpc``: the weights in place through vLLM's
    own reload (vLLM >= 0.11), else the model's loader directly (right only on CUDA).
    ``weights`` must name every parameter, tied ones included (docs/scaleout.md)."""
    reload = getattr(worker, "reload_weights", None)
    if reload is not None:
        reload(weights_iterator=weights)
        return len(weights)
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights=weights)
    return len(weights)


CPU_KV_CACHE_BYTES = 1 << 30
"""The KV cache an engine on the CPU reserves unless ``kv_cache_memory_bytes`` says otherwise."""


def _platform_says(vllm: Any, query: str, default: bool) -> bool:
    """``vllm.platforms.current_platform.<query>()``, e.g. ``is_cpu`` or
    ``is_sleep_mode_available`` (CUDA, ROCm, XPU: not the CPU); ``default`` where that vLLM
    has no such query (a fake, an old release)."""
    platform = getattr(getattr(vllm, "platforms", None), "current_platform", None)
    ask = getattr(platform, query, None)
    return default if ask is None else bool(ask())


def build_engine(vllm: Any, model: str, *, seed: int, **engine_kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """A ``vllm.LLM`` for ``model`` in this process, and what it was built with
    (:attr:`VLLMPolicy.engine_info`). Settings are checked against ``vllm.EngineArgs``'
    fields rather than retried on a TypeError, which would hide an error raised inside the
    build; sleep mode is on where the platform has it (CUDA) unless ``enable_sleep_mode=False``."""
    mode = os.environ.get(MULTIPROCESSING)
    if mode not in (None, "0"):
        raise ValueError(f"{MULTIPROCESSING}={mode}: rollout_backend=vllm runs the engine in the trainer's "
                         "process (the weight push hands it tensors, which cannot cross vLLM's process "
                         f"boundary); unset it or set {MULTIPROCESSING}=0")
    os.environ[MULTIPROCESSING] = "0"
    fields = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    cpu = _platform_says(vllm, "is_cpu", False)
    can_sleep = _platform_says(vllm, "is_sleep_mode_available", True)
    asked = engine_kwargs.pop("enable_sleep_mode", None)
    if asked and not can_sleep:
        raise ValueError(f"enable_sleep_mode=True: vLLM {getattr(vllm, '__version__', '?')} has no sleep mode on "
                         f"this platform ({'cpu' if cpu else 'this device'}); it is CUDA-only")
    sleep = can_sleep if asked is None else bool(asked)
    if not can_sleep:
        print(f"[vllm] sleep mode is CUDA-only: the {'CPU ' if cpu else ''}engine stays awake during the update "
              "(its memory is not released)", file=sys.stderr, flush=True)
    # the learner usually shares the GPU: the engine takes a third of it unless told
    kwargs = {"gpu_memory_utilization": 0.3, **engine_kwargs}
    if sleep:
        kwargs["enable_sleep_mode"] = True
    if cpu and "kv_cache_memory_bytes" in fields:
        kwargs.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
    if cpu and "enable_chunked_prefill" in fields:
        # a seeded CPU generator cannot rewind a prefill cut in two (docs/scaleout.md)
        kwargs.setdefault("enable_chunked_prefill", False)
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise ValueError(f"vllm {getattr(vllm, '__version__', '?')} has no engine setting {unknown} "
                         "(not a field of vllm.EngineArgs)")
    processed = "logprobs_mode" in fields
    if processed:  # log-probs of the distribution sampled from, not the raw ones
        kwargs["logprobs_mode"] = "processed_logprobs"
    engine = vllm.LLM(model=str(model), seed=seed, **kwargs)
    return engine, {"vllm": getattr(vllm, "__version__", "?"), "platform": "cpu" if cpu else "gpu",
                    "sleep_mode": sleep, "processed_logprobs": processed}


def _empty_cache() -> None:
    """Hand torch's cached blocks back to the driver, for ``wake_up``; nothing without CUDA."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class VLLMPolicy(SampledPolicy):
    """``model``: a model directory (or hub id) that ``vllm.LLM`` loads; ``tokenizer``: the
    env's tokenizer (decodes ``Action.text``; its EOS ends a turn). ``engine``: an object with
    vLLM's ``LLM`` interface to use instead of building one (tests pass a fake);
    ``engine_kwargs`` go to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``dtype``,
    ``max_model_len``), each checked against ``vllm.EngineArgs``' fields. ``sampling`` (or its
    keywords, which win) as :class:`agents.hf.HFPolicy`'s. ``batch_size`` is taken and ignored
    (vLLM batches everything it is given), so every backend takes the same settings."""

    can_sleep = True
    """The engine releases its GPU memory while asleep (``enable_sleep_mode``; per engine:
    False on the CPU, where vLLM has no sleep mode)."""

    def __init__(self, model: str, tokenizer: Any, *, sampling: Sampling | None = None,
                 temperature: float | None = None, top_p: float | None = None, max_new_tokens: int | None = None,
                 seed: int = 0, engine: Any = None, batch_size: int | None = None, **engine_kwargs: Any):
        self._set_sampling(sampling, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token_id")
        self.tokenizer = tokenizer
        self.seed = int(seed)
        self._requests = 0
        self._built = engine is None
        self.engine_info: dict[str, Any] = {"vllm": "given", "sleep_mode": True, "processed_logprobs": True}
        """What the engine was built with (:func:`build_engine`): the run record keeps it."""
        if engine is None:
            engine, self.engine_info = build_engine(require_vllm(), model, seed=seed, **engine_kwargs)
        self.processed_logprobs = bool(self.engine_info["processed_logprobs"])
        """The engine returns the log-probs of the distribution it sampled from (vLLM >= 0.10.2);
        without it ``Action.logprobs`` is None rather than the raw (temperature-1) values."""
        self.can_sleep = bool(self.engine_info["sleep_mode"])
        self.engine = engine
        self.sleeping = False
        self._slept_at = 0  # the level of the current sleep (0: awake)
        # waking the weights alone (then loading, then the KV cache) needs wake_up(tags=...);
        # only then may sleep discard the weights (level 2): the loaded ones replace them
        self.wakes_by_tag = "tags" in inspect.signature(engine.wake_up).parameters
        self.sleep_level = 2 if self.wakes_by_tag else 1

    def act(self, observations: Sequence[Observation]) -> list[Action]:
        """One :class:`Action` per observation, in order, from one ``generate`` call. A
        sleeping engine is woken first (level 1); after a level-2 sleep it has no weights
        until :meth:`load_weights`, so that is refused."""
        if self.sleeping:
            if self._slept_at >= 2:
                raise RuntimeError("the vLLM engine slept at level 2 (its weights discarded): load_weights() "
                                   "must wake it before it generates")
            self.wake_up()
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
            logprobs = self._sampled_logprobs(ids, completion.logprobs) if self.processed_logprobs else None
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

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Push ``(name, tensor)`` pairs (Hugging Face names) into the engine through vLLM's
        loader, and wake it: the weights first, the KV cache after the load where it can."""
        weights = [(name, t.detach()) for name, t in named_tensors]
        if self.sleeping and self.wakes_by_tag:
            _empty_cache()
            self.engine.wake_up(tags=["weights"])
            self._load(weights)
            _empty_cache()
            self.engine.wake_up(tags=["kv_cache"])
            self.sleeping, self._slept_at = False, 0
        else:
            if self.sleeping:
                self.wake_up()
            self._load(weights)
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if reset is not None:  # cached prefixes were computed with the old weights
            reset()

    def _load(self, weights: list[tuple[str, Any]]) -> None:
        # in-process: collective_rpc calls the function on the worker with these very tensors
        self.engine.collective_rpc(_load_weights_on_worker, args=(weights,))

    def sleep(self, level: int | None = None) -> None:
        """Release the engine's GPU memory, e.g. while the learner updates on the same GPU.
        Level 2 (the default where ``wake_up`` takes tags) discards the weights too: only
        when :meth:`load_weights` follows (generating before that gives garbage, vLLM #29341)."""
        level = self.sleep_level if level is None else int(level)
        self.engine.sleep(level=level)
        self.sleeping, self._slept_at = True, level
        _empty_cache()  # torch's cached blocks go back too: the update and the next wake find them free

    def wake_up(self) -> None:
        """Retake all the engine's memory (after a level-2 sleep its weights are garbage
        until :meth:`load_weights`)."""
        _empty_cache()
        self.engine.wake_up()
        self.sleeping, self._slept_at = False, 0

    def close(self) -> None:
        """Shut the engine down and free its memory (vLLM allows one sleep-mode engine per
        process: Stage II's needs Stage I's gone). The policy cannot act after it."""
        engine, self.engine = self.engine, None
        if engine is None:
            return
        core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if shutdown is not None:
            shutdown()
        del engine, core, shutdown
        if self._built:  # the in-process engine's own one-process torch.distributed group
            try:
                from vllm.distributed.parallel_state import (
                    destroy_distributed_environment,
                    destroy_model_parallel,
                )
            except ImportError:
                pass
            else:
                destroy_model_parallel()
                destroy_distributed_environment()
        gc.collect()
        _empty_cache()

    def _next_seed(self) -> int:
        self._requests += 1
        return (self.seed * 1_000_003 + self._requests) % (2**31 - 1)

    @staticmethod
    def _sampled_logprobs(ids: list[int], per_position: Any) -> list[float]:
        """The sampled tokens' log-probs out of vLLM's per-position ``{token_id: Logprob}``."""
        if per_position is None or len(per_position) != len(ids):
            raise RuntimeError(f"vLLM returned log-probs for {0 if per_position is None else len(per_position)} "
                               f"of {len(ids)} tokens (was SamplingParams(logprobs=0) honoured?)")
        return [float(getattr(table[token], "logprob", table[token]))
                for token, table in zip(ids, per_position)]

    def _vllm_types(self) -> tuple[Any, Any]:
        """``SamplingParams`` and ``TokensPrompt`` of the engine's vLLM (the fake's in tests)."""
        own = getattr(self.engine, "vllm_types", None)
        if own is not None:
            return own
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        return SamplingParams, TokensPrompt
