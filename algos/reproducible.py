"""What makes a run repeat bit for bit: one thread count for torch and faiss, set once per
command, a hash of a model's weights so that two people can tell whether they trained
from the same base, and a record of the environment (CPU, the kernel set torch uses,
library versions) outside which a run's print repeats only in distribution.

Why a fixed thread count: torch splits some reductions over its intra-op threads, and the
split changes the order of the floating-point additions. Measured on 2 cores (torch 2.13,
MKL; ``docs/micro_reproducibility.json``): a sum over 4M floats and a cached decoding step
of the micro model (batch 8 or 64, the step that samples every rollout and validation
token) differ in the last bits between one and two threads (logits by up to 1e-6), while
full forward passes and 50 SFT steps were bit-identical. A sampled token flips when its
draw falls that close to a boundary; after one flip the episode, its reward and every later
update differ. For a given thread count the arithmetic is the same on every run, whatever
else loads the machine (a second process burning a core changed nothing). On a 2-core
machine shared with anything else, one thread is also the faster choice: two threads that
wait on each other made 50 SFT steps take 448 s instead of 56 s.

>>> with run_threads(1):                       # torch and faiss on one thread inside
...     n = current_threads()
>>> n
1
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFAULT_THREADS = 1
"""The thread count of ``python -m algos train`` and the base builds unless ``--threads``
says otherwise: one, so that the default command gives the same numbers on any machine."""

_current: int | None = None


def current_threads() -> int:
    """The thread count a command set with :func:`run_threads` in this process, else
    :data:`DEFAULT_THREADS` (never torch's own default, which is the number of cores)."""
    return DEFAULT_THREADS if _current is None else _current


def _check(threads: int) -> int:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    return threads


@contextlib.contextmanager
def run_threads(threads: int | None = None) -> Iterator[int]:
    """Run the body with torch's and faiss's thread counts (and :func:`current_threads`) set to
    ``threads`` (None: :func:`current_threads`), the previous ones restored after; yields it."""
    import torch

    global _current
    n = _check(current_threads() if threads is None else threads)
    saved = (_current, torch.get_num_threads(), _faiss_threads())
    _current = n
    torch.set_num_threads(n)
    _faiss_threads(n)
    try:
        yield n
    finally:
        _current = saved[0]
        torch.set_num_threads(saved[1])
        if saved[2] is not None:
            _faiss_threads(saved[2])


def _faiss_threads(n: int | None = None) -> int | None:
    """faiss's thread count, set to ``n`` first when given (None: faiss is not installed)."""
    try:
        import faiss
    except ImportError:
        return None
    if n is not None:
        faiss.omp_set_num_threads(n)
    return int(faiss.omp_get_max_threads())


def weight_hash(path: str | Path) -> str | None:
    """A 16-hex-digit fingerprint of the weights a model directory holds: sha256 over every
    tensor of its ``*.safetensors`` files, in name order, each as its name, a NUL, its dtype
    and shape (``torch.float32 [4, 2]``), a NUL, and its raw little-endian bytes. Equal for
    equal weights however they were saved (file names, shards, metadata); unequal if one
    bit of one weight differs. None when ``path`` is not a directory with safetensors files
    (a hub id, a GGUF file): there is nothing local to hash.

    >>> weight_hash("no/such/dir") is None
    True
    """
    import torch
    from safetensors import safe_open

    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        where: dict[str, tuple[str, Any]] = {}
        for file in files:
            handle = stack.enter_context(safe_open(str(file), framework="pt"))
            for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if name in where:
                    raise ValueError(f"{path}: tensor {name!r} is in both {where[name][0]} "
                                     f"and {file.name}")
                where[name] = (file.name, handle)
        for name in sorted(where):
            tensor = where[name][1].get_tensor(name).contiguous()
            digest.update(f"{name}\0{tensor.dtype} {list(tensor.shape)}\0".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def describe_base(model: str | Path) -> dict[str, Any]:
    """Which base a run starts from, for its summary: ``model``, its ``weight_hash``, and the
    ``seed`` and ``threads`` of its recipe's build record (``<recipe>_build.json``; else None)."""
    path = Path(model)
    described: dict[str, Any] = {"model": str(model), "weight_hash": weight_hash(path),
                                 "seed": None, "threads": None}
    records = sorted(path.glob("*_build.json")) if path.is_dir() else []
    if records:
        try:
            settings = json.loads(records[0].read_text()).get("settings", {})
        except (ValueError, UnicodeDecodeError, AttributeError):
            settings = {}  # an unreadable record names nothing; the hash still identifies
        if isinstance(settings, dict):
            described.update({k: settings.get(k) for k in ("seed", "threads")})
    return described


ENVIRONMENT_PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "scipy", "faiss-cpu",
                        "sentence-transformers", "safetensors", "accelerate")
"""The libraries whose versions :func:`environment` records: those that do the arithmetic
of a run (torch's kernels, the tokenizer, the retriever's embeddings and index)."""


def environment() -> dict[str, Any]:
    """What a run's numbers are bit-identical across only when equal (the CPU, the kernel set
    torch dispatches to, the versions of :data:`ENVIRONMENT_PACKAGES`, ...): elsewhere a run
    repeats only in distribution (``docs/micro_seeds.json`` is that distribution)."""
    import os
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    cpu = {"model name": None, "vendor_id": None}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in cpu and cpu[key.strip()] is None:
                cpu[key.strip()] = value.strip()
    versions = {}
    for name in ENVIRONMENT_PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return {"cpu_model": cpu["model name"] or platform.processor() or None,
            "cpu_vendor": cpu["vendor_id"], "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "logical_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "versions": versions}
