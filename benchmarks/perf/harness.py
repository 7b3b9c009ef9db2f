"""The measuring harness: sides timed in turn (``interleaved``), the median ratio of paired
runs (``figure``), peak memory, timing wrappers, and ``Bench``, what every section shares."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.base import Observation
from benchmarks.perf.settings import PerfSettings


@dataclass
class Figure:
    """One ratio: the median over the timed pairs, and their range."""

    ratio: float
    low: float
    high: float
    what: str
    a_median: float | None = None
    """Median of side A (seconds, or a count), for context only: absolute figures on a
    shared machine are noise."""
    b_median: float | None = None


def figure(a: Sequence[float], b: Sequence[float], what: str) -> Figure:
    """The median and range of ``a[i] / b[i]`` over paired runs."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need paired runs, got {len(a)} and {len(b)}")
    ratios = [x / y if y > 0 else float("inf") for x, y in zip(a, b)]
    return Figure(statistics.median(ratios), min(ratios), max(ratios), what,
                  statistics.median(a), statistics.median(b))


Trial = Callable[[], "dict[str, float] | None"]


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Trial:
    """A trial that calls ``fn(*args, **kwargs)`` and reports nothing but its time."""

    def trial() -> None:
        fn(*args, **kwargs)

    return trial


def interleaved(trials: dict[str, Trial], reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run the trials in turn (A, B, C, A, B, C, ...), ``warmup`` untimed rounds then ``reps``
    timed ones. Returns each trial's wall seconds per timed round under its name, and any
    number it returns (``{"policy": 1.2}``) under ``name.key``."""
    out: dict[str, list[float]] = {name: [] for name in trials}
    for r in range(warmup + reps):
        for name, trial in trials.items():
            start = time.perf_counter()
            extra = trial() or {}
            elapsed = time.perf_counter() - start
            if r >= warmup:
                out[name].append(elapsed)
                for key, value in extra.items():
                    out.setdefault(f"{name}.{key}", []).append(float(value))
    return out


def load_average() -> float | None:
    """The 1-minute load average (other jobs on the machine), or None where unknown."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def peak_memory(fn: Callable[[], Any], device: torch.device | None = None) -> float:
    """Bytes by which ``fn()`` raised peak memory above what was in use when it started.

    On CUDA: the allocator's peak. On a Linux CPU: the process's peak resident set
    (``VmHWM``), reset through ``/proc/self/clear_refs`` after returning freed memory to
    the OS (``malloc_trim``), so earlier peaks do not count. Elsewhere NaN."""
    import ctypes
    import gc
    import re

    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return float(torch.cuda.max_memory_allocated(device) - start)

    def status(field_name: str) -> int:
        text = Path("/proc/self/status").read_text()
        return int(re.search(rf"{field_name}:\s+(\d+) kB", text).group(1)) * 1024

    try:
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        start = status("VmRSS")
    except (OSError, AttributeError):
        return float("nan")
    fn()
    return float(status("VmHWM") - start)


class TimedPolicy:
    """Wraps a policy: seconds spent in ``act``, and (when ``record``) every call's prompts,
    the turns returned and their log-probs, for replaying the same generation elsewhere."""

    def __init__(self, policy: Any, record: bool = False):
        self.policy = policy
        self.record = record
        self.seconds = 0.0
        self.calls: list[tuple[list[np.ndarray], list[int]]] = []
        self.outputs: list[list[tuple[list[int], list[float]]]] = []

    def act(self, observations: Sequence[Observation]) -> list[Any]:
        start = time.perf_counter()
        actions = self.policy.act(observations)
        self.seconds += time.perf_counter() - start
        if self.record:
            self.calls.append(([np.asarray(o.token_ids) for o in observations],
                               [len(a.token_ids) for a in actions]))
            self.outputs.append([(list(a.token_ids), list(a.logprobs or [])) for a in actions])
        return actions


class TimedEnvFn:
    """Wraps an ``env_fn``: seconds spent making envs (``collect`` makes them on every call)."""

    def __init__(self, env_fn: Callable[[], Any]):
        self.env_fn = env_fn
        self.seconds = 0.0

    def __call__(self) -> Any:
        start = time.perf_counter()
        env = self.env_fn()
        self.seconds += time.perf_counter() - start
        return env


@dataclass
class Bench:
    """What every section shares: the model, the env's parts, the settings."""

    settings: PerfSettings
    model: Any
    tokenizer: Any
    retriever: Any
    questions: list[Any]
    log: Callable[[str], None]
    figures: dict[str, Figure] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def pick(self, n: int) -> list[Any]:
        """``n`` questions spread over the pool (every style of the synthetic world)."""
        step = max(1, len(self.questions) // n)
        return list(self.questions[::step][:n])

    def env_fn(self, **kwargs: Any) -> Callable[[], Any]:
        from envs import env_fn

        return env_fn(tokenizer=self.tokenizer, retriever=self.retriever, questions=self.questions[:1], **kwargs)

    def add(self, name: str, fig: Figure) -> None:
        self.figures[name] = fig
        self.log(f"  {name:<44} {fig.ratio:8.3f}  [{fig.low:.3f}, {fig.high:.3f}]")
