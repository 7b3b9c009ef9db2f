"""``python -m benchmarks perf``: picks a preset, runs the suite (and ``--scaleout``),
prints the figures as a Markdown table and writes them as JSON."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import perf
from benchmarks.perf.runner import add_scaleout, run_perf
from benchmarks.perf.settings import MODELS, PRESETS


def markdown_table(result: dict[str, Any]) -> str:
    """The figures as a Markdown table (ratio, range over the pairs, what A / B is)."""
    lines = ["| figure | ratio | range | A / B |", "|---|---:|---:|---|"]
    for name, f in result["figures"].items():
        lines.append(f"| {name} | {f['ratio']:.3f} | {f['low']:.3f}-{f['high']:.3f} | {f['what']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks perf",
                                     description=perf.__doc__.splitlines()[0])
    parser.add_argument("--model", default="random", choices=MODELS)
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes on 2 cores)")
    parser.add_argument("--tiny-for-tests", action="store_true", help="the smallest sizes (tests)")
    parser.add_argument("--reps", type=int, default=None, help="timed A/B pairs per figure")
    parser.add_argument("--out", default="results/perf.json", help="where the JSON goes (folder made)")
    parser.add_argument("--scaleout", action="store_true",
                        help="also measure collect.ray_workers_speedup (2 Ray workers / 1; skipped without ray) "
                             "and learner.ddp_step_ratio (2 gloo ranks / 1 process), issue 15")
    parser.add_argument("--vllm", action="store_true",
                        help="only the vLLM section: vLLM's engine against HF generate and the minimal loop on the same "
                             "greedy rollouts (needs vLLM: bash scripts/install_vllm.sh; --model micro or smollm2)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch/faiss intra-op threads (default 1: the stablest timings; perf.json records it)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: must be >= 1")
    if args.quick and args.tiny_for_tests:
        parser.error("--quick and --tiny-for-tests are two presets; give one")
    if args.reps is not None and args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    settings = PRESETS["test" if args.tiny_for_tests else "quick" if args.quick else "full"]
    settings = replace(settings, model=args.model, threads=args.threads,
                       reps=args.reps or settings.reps)
    result = run_perf(settings, log=lambda line: print(line, flush=True), vllm=args.vllm)
    if args.scaleout:
        add_scaleout(result, settings, log=lambda line: print(line, flush=True))
    print("\n" + markdown_table(result))
    meta = result["meta"]
    print(f"\nwall time {meta['wall_s']:.0f} s; torch on {settings.threads} thread(s); load "
          f"average {meta['load_average_start']} -> {meta['load_average_end']} on "
          f"{meta['cpu_count']} cores; every timing figure is a ratio of two timings taken in this "
          f"run, interleaved, median of {settings.reps} pairs")
    bad = [k for k, f in result["figures"].items() if not (math.isfinite(f["ratio"]) and f["ratio"] > 0)]
    if bad:
        print(f"warning: non-finite or non-positive figures: {bad}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0
