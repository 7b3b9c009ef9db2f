"""GPU check of the scale-out path, made for a GPU machine with no package index: the checkout
and a small folder of wheels (tens of MiB; torch with CUDA is expected to be there already).

    python -m benchmarks.gpu_check --steps 3 --out runs/gpu_check

(``python -m`` from the checkout's root, so that ``agents`` and ``algos`` import without an
install; ``benchmarks/gpu_check.sh`` runs exactly this.) First it names each missing piece in
one line (a module and the wheel that brings it, or no visible GPU) and stops; vLLM missing
only drops the vLLM backend, with a note. Then it runs the tiny preset's Stage II end to end
on CUDA (bfloat16 compute over float32 weights, the words retriever, its base built on first
use) with ``rollout_backend=hf`` and then ``vllm`` (the trainer's own engine, as a training
run builds it), and after each backend writes ``gpu_check.json``: a later failure keeps the
earlier figures. For each backend, steps 2..N are averaged: the step split (rollout /
scoring / update), the weight sync (the engine's sleep and the push of new weights, timed
around the trainer's calls), peak memory and the gradient norm. The headline ratio is
generated tokens per second of rollout *plus weight sync*, vLLM over HF, with the end-to-end
step-time ratio beside it: the tiny model's ratio says little about a 4B model's.
Imports nothing outside the standard library until the pieces are found.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BACKENDS = ("hf", "vllm")

REQUIRED = (
    ("torch", "torch (with CUDA: expected on the GPU image)"),
    ("numpy", "numpy"),
    ("transformers", "transformers"),
    ("tokenizers", "tokenizers"),
    ("safetensors", "safetensors"),
    ("huggingface_hub", "huggingface_hub"),
    ("tqdm", "tqdm"),
    ("faiss", "faiss-cpu"),  # envs.retrieval imports the dense retriever eagerly
    ("fastapi", "fastapi"),  # ... and the retrieval server
    ("uvicorn", "uvicorn"),
    ("pydantic", "pydantic"),
)
"""(module, wheel) pairs the tiny preset's run imports (the project's own packages aside)."""


def _note(text: str) -> None:
    print(f"gpu_check: {text}", file=sys.stderr, flush=True)


def missing_pieces(backends: list[str], find_spec: Callable[[str], Any] | None = None,
                   cuda_available: Callable[[], bool] | None = None) -> tuple[list[str], list[str], list[str]]:
    """``(missing, notes, backends)``: one line per missing piece that stops the check (a
    module, with the wheel to install: ``pip install --no-index --find-links WHEELS NAME``; no
    visible GPU), notes for what only narrows it (no vLLM), and the backends left to run."""
    find_spec = find_spec or importlib.util.find_spec
    missing = [f"missing: {module} (install the wheel {wheel})" for module, wheel in REQUIRED
               if find_spec(module) is None]
    notes = []
    if "vllm" in backends and find_spec("vllm") is None:
        notes.append("vLLM is not installed (pip install -e '.[vllm]' where an index is reachable): HF backend only")
        backends = [b for b in backends if b != "vllm"] or ["hf"]
    if find_spec("torch") is not None:
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available
        if not cuda_available():
            missing.append("missing: a CUDA GPU (torch.cuda.is_available() is False: a CPU-only torch, or no "
                           "visible device)")
    return missing, notes, backends


def _timed(calls: list[float], fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            calls.append(time.perf_counter() - start)
    return wrapper


def run(backend: str, model_dir: str, steps: int, out: Path) -> dict[str, Any]:
    """``steps`` Stage-II steps of the tiny preset with ``backend`` on CUDA; the averages of
    steps 2..N (the first pays compilation and warm-up)."""
    import torch

    from algos.presets import preset_config
    from algos.trainer import Trainer

    torch.cuda.reset_peak_memory_stats()
    cfg = preset_config("tiny", stage="team", teacher="base", model=model_dir, out_dir=str(out / backend),
                        steps=steps, device="cuda", dtype="bfloat16", rollout_backend=backend,
                        eval_every=1000, save_every=1000)
    started = time.perf_counter()
    trainer = Trainer(cfg, progress=False)
    built = time.perf_counter() - started
    sync: list[float] = []  # the engine's sleep and the push of new weights, per call
    trainer._push_weights = _timed(sync, trainer._push_weights)
    backend_obj = getattr(trainer, "backend", None) or trainer.policy
    if hasattr(backend_obj, "sleep"):
        try:
            backend_obj.sleep = _timed(sync, backend_obj.sleep)
        except AttributeError:  # a backend without instance attributes: its sleep is in score_s
            pass
    rows = []
    for _ in range(steps):
        sync.clear()
        metrics = trainer.train_step()
        metrics["sync_s"] = sum(sync)
        rows.append(metrics)
    later = rows[1:] or rows
    result: dict[str, Any] = {k: sum(r[k] for r in later) / len(later)
                              for k in ("perf/rollout_s", "perf/score_s", "perf/update_s", "sync_s")}
    result["tokens_per_step"] = sum(r["perf/generated_tokens_per_s"] * r["perf/rollout_s"] for r in later) / len(later)
    result["step_s"] = result["perf/rollout_s"] + result["perf/score_s"] + result["perf/update_s"]
    free, total = torch.cuda.mem_get_info()
    # torch's peak counts the learner (and an in-process engine's tensors from torch's
    # allocator); vLLM's sleep-mode pool and KV cache show only in the device's used memory
    result.update({"backend": backend, "steps": steps, "setup_s": built,
                   "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30,
                   "device_used_gib": (total - free) / 2**30,
                   "losses/grad_norm": rows[-1]["losses/grad_norm"]})
    print(json.dumps(result), flush=True)
    if hasattr(trainer, "close"):
        trainer.close()
    del trainer
    torch.cuda.empty_cache()
    return result


def rate_with_sync(result: dict[str, Any]) -> float:
    """Generated tokens per second of rollout plus weight sync (what keeping the engine's
    copy of the weights current costs is part of the price of its speed)."""
    tokens = result.get("tokens_per_step", result.get("perf/generated_tokens_per_s", 0.0) * result["perf/rollout_s"])
    return tokens / max(result["perf/rollout_s"] + result.get("sync_s", 0.0), 1e-9)


def _step_s(result: dict[str, Any]) -> float:
    return result.get("step_s", result["perf/rollout_s"] + result["perf/score_s"] + result["perf/update_s"])


def headline(results: list[dict[str, Any]]) -> list[str]:
    """The summary lines: the vLLM / HF ratio (weight sync included) and the end-to-end
    step-time ratio when both ran, then one line per backend."""
    by = {r["backend"]: r for r in results}
    lines = []
    if "hf" in by and "vllm" in by:
        ratio = rate_with_sync(by["vllm"]) / max(rate_with_sync(by["hf"]), 1e-9)
        steps = _step_s(by["hf"]) / max(_step_s(by["vllm"]), 1e-9)
        lines.append(f"vllm / hf generated tokens per second of rollout + weight sync (tiny model): {ratio:.2f}x; "
                     f"end-to-end step time hf / vllm: {steps:.2f}x")
    for r in results:
        lines.append(f"{r['backend']:>5}: {rate_with_sync(r):.0f} generated tok/s with sync; step "
                     f"{_step_s(r):.2f}s = rollout {r['perf/rollout_s']:.2f}s / scoring {r['perf/score_s']:.2f}s / "
                     f"update {r['perf/update_s']:.2f}s (weight sync {r.get('sync_s', 0.0):.2f}s of scoring + update); "
                     f"peak GPU memory {r['peak_gpu_gib']:.2f} GiB (torch), {r['device_used_gib']:.2f} GiB used at the end")
    return lines


def model_dir() -> str:
    """The tiny preset's base (built on first use, cached after)."""
    from algos.presets import prepare_model

    return prepare_model("tiny", progress=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3,
                        help="Stage-II steps per backend; the first is warm-up, the rest are averaged (default 3)")
    parser.add_argument("--backends", default="hf,vllm",
                        help="comma list of rollout backends, run in this order (default hf,vllm; vllm is left "
                             "out, with a note, when it is not installed)")
    parser.add_argument("--out", default="runs/gpu_check",
                        help="folder for each backend's run and gpu_check.json (default runs/gpu_check)")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.steps < 1:
        _note(f"error: --steps {args.steps}: must be >= 1")
        return 2
    if not backends or any(b not in BACKENDS for b in backends):
        _note(f"error: --backends {args.backends!r}: a comma list of {', '.join(BACKENDS)}")
        return 2
    missing, notes, backends = missing_pieces(backends)
    for line in missing:
        _note(line)
    if missing:
        return 2
    for line in notes:
        _note(line)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_check.json"
    base = model_dir()
    results: list[dict[str, Any]] = []
    failed = False
    for backend in backends:
        try:
            results.append(run(backend, base, args.steps, out))
        except ImportError as err:  # an install that is there but does not import: keep HF's figures
            if backend != "vllm":
                raise
            _note(f"vLLM does not import ({' '.join(str(err).split())}): HF figures only")
        except Exception as err:  # noqa: BLE001 (the figures so far are kept; the failure is named)
            _note(f"{backend} failed: {type(err).__name__}: {' '.join(str(err).split())}")
            failed = True
        path.write_text(json.dumps(results, indent=1))  # after each backend: a later crash keeps these
        if failed:
            break
    for line in headline(results):
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
