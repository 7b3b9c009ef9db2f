"""GPU check of the scale-out path (run by ``benchmarks/gpu_check.sh``; never by a test).

SmolLM2-135M-Instruct from the packaged GGUF (converted once to safetensors by
``agents.models.load_causal_lm``, no download), a few Stage-II steps (Teacher = base) with
``rollout_backend=hf`` and then ``vllm``; prints generated tokens/s, the step-time split
(rollout / scoring / update) and peak GPU memory for each, and writes them as JSON.
Without vLLM (a GPU machine that cannot reach PyPI) it says so in one line and runs the
HF backend alone.

    python benchmarks/gpu_check.py --steps 3 --out runs/gpu_check
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

BACKENDS = ("hf", "vllm")


def run(backend: str, model_dir: str, steps: int, out: Path) -> dict[str, float]:
    import torch

    from algos.presets import preset_config
    from algos.trainer import Trainer

    torch.cuda.reset_peak_memory_stats()
    cfg = preset_config("smollm2", stage="team", teacher="base", model=model_dir, out_dir=str(out / backend),
                        steps=steps, questions_per_step=16, group_size=4, device="cuda", dtype="bfloat16",
                        rollout_backend=backend, max_turn_tokens=128, max_context_tokens=2048,
                        max_waves=1, max_searchers=2, max_searcher_turns=2, num_candidates=3,
                        train_datasets=("nq", "hotpotqa"), eval_every=1000, save_every=1000,
                        generation_batch_size=128, retriever="words")
    started = time.perf_counter()
    trainer = Trainer(cfg, progress=False)
    built = time.perf_counter() - started
    rows = []
    for _ in range(steps):
        rows.append(trainer.train_step())
    keys = ("perf/rollout_s", "perf/score_s", "perf/update_s", "perf/generated_tokens_per_s")
    later = rows[1:] or rows  # the first step pays compilation and warm-up
    result = {k: sum(r[k] for r in later) / len(later) for k in keys}
    free, total = torch.cuda.mem_get_info()
    # torch's peak counts the learner (and an in-process engine's tensors from torch's
    # allocator); vLLM's sleep-mode pool and KV cache show only in the device's used memory
    result.update({"backend": backend, "steps": steps, "setup_s": built,
                   "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30,
                   "device_used_gib": (total - free) / 2**30,
                   "losses/grad_norm": rows[-1]["losses/grad_norm"]})
    print(json.dumps(result), flush=True)
    del trainer
    torch.cuda.empty_cache()
    return result


def _note(text: str) -> None:
    print(f"gpu_check: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3,
                        help="Stage-II steps per backend; the first is warm-up, the rest are averaged (default 3)")
    parser.add_argument("--backends", default="hf,vllm",
                        help="comma list of rollout backends, run in this order (default hf,vllm; "
                             "vllm is left out, with a note, when it is not installed)")
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
    if "vllm" in backends and importlib.util.find_spec("vllm") is None:
        _note("vLLM is not installed (pip install -e '.[vllm]'): HF backend only")
        backends = [b for b in backends if b != "vllm"] or ["hf"]
    from agents.models import local_model_dir

    model_dir = local_model_dir("smollm2")  # the GGUF converted once; vLLM reads the directory
    out = Path(args.out)
    results = []
    for backend in backends:
        try:
            results.append(run(backend, model_dir, args.steps, out))
        except ImportError as err:  # an install that is there but does not import: keep HF's figures
            if backend != "vllm":
                raise
            _note(f"vLLM does not import ({' '.join(str(err).split())}): HF figures only")
    by = {r["backend"]: r for r in results}
    if "hf" in by and "vllm" in by:
        ratio = by["vllm"]["perf/generated_tokens_per_s"] / max(by["hf"]["perf/generated_tokens_per_s"], 1e-9)
        print(f"vllm / hf generated tokens/s: {ratio:.1f}x")
    for r in results:
        print(f"{r['backend']:>5}: {r['perf/generated_tokens_per_s']:.0f} generated tok/s; step split "
              f"rollout {r['perf/rollout_s']:.1f}s / scoring {r['perf/score_s']:.1f}s / update {r['perf/update_s']:.1f}s; "
              f"peak GPU memory {r['peak_gpu_gib']:.1f} GiB (torch), {r['device_used_gib']:.1f} GiB used on "
              "the device at the end")
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
