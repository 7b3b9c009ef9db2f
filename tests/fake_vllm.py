"""A fake ``vllm`` module that keeps the boundaries the real one has (tests put it in
``sys.modules["vllm"]``):

- ``LLM(...)`` takes only ``EngineArgs``' fields (a TypeError otherwise, as vLLM's does) and
  records them in :data:`BUILT`;
- with ``VLLM_ENABLE_V1_MULTIPROCESSING`` unset or ``1`` (vLLM's default) the engine core
  lives in another process (``multiprocessing``, spawn), and every call to it crosses a
  msgpack-like encoder that refuses tensors (vLLM's sends them as bytes that arrive as
  lists, or fails on CUDA ones) and callables unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``;
  with ``0`` it lives in this process and gets the very objects;
- ``generate`` is refused while any memory is asleep, and after ``sleep(level=2)`` until
  weights are loaded again; loading into sleeping weights is refused;
- one sleep-mode engine per process (vLLM's CuMemAllocator assertion), freed by
  ``llm_engine.engine_core.shutdown()`` or by the engine's garbage collection.

The engine answers every prompt with the model's EOS (``config.json``'s ``eos_token_id``
in the model directory; 0 without one), log-prob -0.25.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

__version__ = "0.0-fake"

BUILT: list[dict[str, Any]] = []
"""The settings of every ``LLM`` built here, in order."""

_SLEEP_MODE_CORES: weakref.WeakSet = weakref.WeakSet()
_REMOTES: list[RemoteCore] = []


def shutdown_all() -> None:
    """Stop every engine process this module started (a test fixture's teardown)."""
    while _REMOTES:
        _REMOTES.pop().shutdown()
    for core in list(_SLEEP_MODE_CORES):  # what a test left alive holds no allocator into the next
        core.alive = False


@dataclasses.dataclass
class EngineArgs:  # the fields the project may set (vLLM >= 0.10.2: logprobs_mode)
    model: str = ""
    seed: int | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_sleep_mode: bool = False
    enforce_eager: bool = False
    logprobs_mode: str = "raw_logprobs"


EngineArgsBefore0102 = dataclasses.make_dataclass(  # an older vLLM: no logprobs_mode
    "EngineArgsBefore0102", [(f.name, f.type, dataclasses.field(default=f.default))
                             for f in dataclasses.fields(EngineArgs) if f.name != "logprobs_mode"])


@dataclasses.dataclass
class SamplingParams:  # the fields VLLMPolicy sets
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop: list = dataclasses.field(default_factory=list)
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    seed: int | None = None
    skip_special_tokens: bool = True
    detokenize: bool = True


def TokensPrompt(prompt_token_ids):  # noqa: N802 (vLLM's name)
    return {"prompt_token_ids": list(prompt_token_ids)}


# ---------------------------------------------------------------------- the engine core


class FakeModel:
    """The worker's model: ``load_weights`` keeps plain copies of what it is given."""

    def __init__(self, core: EngineCore):
        self.core = core
        self.weights: dict[str, list[float]] = {}

    def load_weights(self, weights):
        if "weights" in self.core.asleep:
            raise RuntimeError("load_weights into sleeping weights (wake_up(tags=['weights']) first)")
        for name, tensor in weights:
            self.weights[name] = [float(x) for x in tensor.reshape(-1).tolist()]
        self.core.weights_valid = True
        self.core.events.append("load")
        return len(weights)


class EngineCore:
    def __init__(self, settings: dict[str, Any]):
        self.settings = dict(settings)
        self.pid = os.getpid()
        self.events: list[Any] = []
        self.asleep: set[str] = set()
        self.weights_valid = True
        self.alive = True
        config = Path(str(settings.get("model", ""))) / "config.json"
        self.eos = int(json.loads(config.read_text()).get("eos_token_id") or 0) if config.exists() else 0
        if settings.get("enable_sleep_mode"):
            if any(c.alive for c in _SLEEP_MODE_CORES):
                raise AssertionError("Sleep mode can only be used for one instance per process.")
            _SLEEP_MODE_CORES.add(self)
        model = FakeModel(self)
        self.worker = SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: model))

    def generate(self, prompts, params, use_tqdm=True):
        if self.asleep:
            raise RuntimeError(f"generate on a sleeping engine ({sorted(self.asleep)} asleep)")
        if not self.weights_valid:
            raise RuntimeError("generate after sleep(level=2) with no weights loaded since: garbage tokens")
        self.events.append(("generate", len(prompts)))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=(self.eos,),
                                                         logprobs=[{self.eos: SimpleNamespace(logprob=-0.25)}])])
                for _ in prompts]

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return [method(self.worker, *args, **(kwargs or {}))]

    def sleep(self, level=1):
        self.events.append(("sleep", level))
        self.asleep = {"weights", "kv_cache"}
        if level >= 2:
            self.weights_valid = False

    def wake_up(self, tags=None):
        self.events.append(("wake_up", None if tags is None else list(tags)))
        self.asleep -= set(tags) if tags is not None else set(self.asleep)

    def reset_prefix_cache(self):
        self.events.append("reset_prefix_cache")

    def state(self):
        return {"pid": self.pid, "events": list(self.events), "asleep": sorted(self.asleep)}

    def shutdown(self):
        self.alive = False


# ---------------------------------------------------------------------- the process boundary


def _encode(value: Any, where: str) -> Any:
    """What vLLM's msgpack encoder lets through to the engine process."""
    import torch

    if isinstance(value, torch.Tensor):
        raise TypeError(f"{where}: a torch.Tensor cannot cross to the engine process (msgpack sends its bytes; "
                        "it arrives as a list, not a tensor)")
    if callable(value) and not isinstance(value, type):
        if os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") != "1":
            raise TypeError(f"{where}: Object of type {type(value).__name__} is not serializable "
                            "(set VLLM_ALLOW_INSECURE_SERIALIZATION=1)")
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_encode(v, where) for v in value)
    if isinstance(value, dict):
        return {k: _encode(v, where) for k, v in value.items()}
    return value


def _serve(conn, settings):
    """The engine process: run each call on the core, send back the result or the error."""
    core = EngineCore(settings)
    while True:
        name, args, kwargs = conn.recv()
        if name == "shutdown":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", getattr(core, name)(*args, **kwargs)))
        except Exception as err:  # noqa: BLE001 (sent back to the caller)
            conn.send(("err", err))


class RemoteCore:
    """The client of an engine core in another process."""

    def __init__(self, settings):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, settings), daemon=True)
        self.process.start()
        _REMOTES.append(self)

    def call(self, name, *args, **kwargs):
        args, kwargs = _encode(args, name), _encode(kwargs, name)
        self.conn.send((name, args, kwargs))
        status, value = self.conn.recv()
        if status == "err":
            raise value
        return value

    def shutdown(self):
        if self.process.is_alive():
            self.conn.send(("shutdown", (), {}))
            self.conn.recv()
            self.process.join(timeout=10)


class InprocCore:
    """An engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""

    def __init__(self, settings):
        self.core = EngineCore(settings)

    def call(self, name, *args, **kwargs):
        return getattr(self.core, name)(*args, **kwargs)

    def shutdown(self):
        self.core.shutdown()


class LLM:
    vllm_types = (SamplingParams, TokensPrompt)

    def __init__(self, model: str, **kwargs: Any):
        fields = {f.name for f in dataclasses.fields(globals()["EngineArgs"])}
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument {unknown[0]!r}")
        settings = {"model": model, **kwargs}
        BUILT.append(settings)
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"
        core = InprocCore(settings) if in_process else RemoteCore(settings)
        self.llm_engine = SimpleNamespace(engine_core=core)

    @property
    def _core(self):
        return self.llm_engine.engine_core

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        return self._core.call("generate", prompts, sampling_params, use_tqdm=use_tqdm)

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return self._core.call("collective_rpc", method, timeout, args, kwargs)

    def sleep(self, level: int = 1) -> None:
        self._core.call("sleep", level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._core.call("wake_up", tags)

    def reset_prefix_cache(self):
        return self._core.call("reset_prefix_cache")

    def engine_state(self) -> dict[str, Any]:
        """The core's pid, events and sleeping tags (a test's window into it)."""
        return self._core.call("state")


class LLMWithoutTags(LLM):
    """A vLLM whose ``wake_up`` takes no tags (it wakes everything at once)."""

    def wake_up(self) -> None:
        self._core.call("wake_up", None)


def loaded_weights(worker) -> dict[str, list[float]]:
    """Run on the engine's worker by ``collective_rpc``: what its model was loaded with."""
    return worker.model_runner.get_model().weights


def worker_pid(worker) -> int:
    return os.getpid()
