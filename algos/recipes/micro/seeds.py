"""The micro preset's spread over seeds: each seed builds its own base from scratch and
trains both stages on it, and the summaries are pooled into ``docs/micro_seeds.json``: per
stage ``over_seeds`` (the sign test over seeds: a statement about the training procedure) and
``pooled_paired`` (over every seed's questions as if independent: only about these runs).
Collect where the seeds ran: a seed repeats bit for bit only on an equal ``environment``.

    python -m algos.recipes.micro.seeds run --root runs/micro-seeds --seeds 0 1 2
    python -m algos.recipes.micro.seeds collect --root runs/micro-seeds --out docs/micro_seeds.json

``run`` does, per seed ``N``, in ``<root>/seed<N>`` with its own empty cache
(``MOPD_CACHE=<root>/seed<N>/cache``, so nothing is reused from another build), one thread:

    python -m algos sft --preset micro --seed N --out <root>/seed<N>/base
    python -m algos train --preset micro --set model=<root>/seed<N>/base --set seed=N \\
        --out <root>/seed<N>/run --threads 1

Seed 0's base is the one ``python -m algos train --preset micro`` builds (the same settings
and thread count, so the same weights), and its summary is what that command prints.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from algos.roles import STAGES


def seed_commands(seed: int, root: str | Path, threads: int = 1) -> list[list[str]]:
    """The two commands of one seed (module docstring), as argument lists."""
    where = Path(root) / f"seed{seed}"
    return [
        [sys.executable, "-m", "algos", "sft", "--preset", "micro", "--seed", str(seed),
         "--out", str(where / "base"), "--threads", str(threads), "--no-progress"],
        [sys.executable, "-m", "algos", "train", "--preset", "micro", "--set",
         f"model={where / 'base'}", "--set", f"seed={seed}", "--out", str(where / "run"),
         "--threads", str(threads), "--no-progress"],
    ]


def run_seed(seed: int, root: str | Path, threads: int = 1) -> Path:
    """Build seed ``seed``'s base and train both stages on it (minutes to an hour on 2 cores),
    reusing what is already there; returns its run directory."""
    where = Path(root) / f"seed{seed}"
    where.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MOPD_CACHE": str(where / "cache")}
    sft, train = seed_commands(seed, root, threads)
    if not (where / "base" / "micro_build.json").exists():
        subprocess.run(sft, check=True, env=env)
    if not (where / "run" / "summary.json").exists():
        subprocess.run(train, check=True, env=env)
    return where / "run"


def _records(path: Path, seed: int) -> list[dict[str, Any]]:
    """A validation's records, each question named by its seed too (pooling pairs no seeds)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{**r, "dataset": f"seed{seed}/{r['dataset']}"} for r in rows]


def spread(runs: dict[int, str | Path]) -> dict[str, Any]:
    """The per-seed summaries of ``runs`` (seed -> run directory) and, per stage,
    :func:`stage_figures` plus ``pooled_paired``, labelled with what it assumes."""
    from algos.report import PAIRS_INDEPENDENT, paired_sign_test
    from algos.trainer import validation_path

    per_seed: dict[str, Any] = {}
    pooled: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
        s: ([], []) for s in STAGES}
    for seed, run in sorted(runs.items()):
        summary = json.loads((Path(run) / "summary.json").read_text())
        per_seed[str(seed)] = {"threads": summary.get("threads"), "stages": {}}
        for stage, got in summary["stages"].items():
            per_seed[str(seed)]["stages"][stage] = {
                k: got.get(k) for k in ("base", "base_em", "trained_em", "paired", "steps",
                                        "val_questions")}
            stage_dir = Path(run) / stage
            pooled[stage][0].extend(_records(validation_path(stage_dir, 0), seed))
            pooled[stage][1].extend(_records(validation_path(stage_dir, got["steps"]), seed))
    stages = stage_figures(per_seed)
    for stage, figures in stages.items():
        figures["pooled_paired"] = {"covers": PAIRS_INDEPENDENT, **paired_sign_test(*pooled[stage])}
    return {"seeds": per_seed, "stages": stages}


def stage_figures(per_seed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per stage, from the per-seed summaries alone: the seeds, the mean and range of
    ``base_em`` and ``trained_em``, and ``over_seeds`` (:func:`algos.report.seeds_improved`)."""
    from algos.report import seeds_improved

    stages: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        rows = {seed: s["stages"][stage] for seed, s in per_seed.items() if stage in s["stages"]}
        if not rows:
            continue
        stages[stage] = {"seeds": len(rows)}
        for key in ("base_em", "trained_em"):
            values = [r[key] for r in rows.values()]
            stages[stage][key] = {"mean": round(statistics.fmean(values), 4),
                                  "min": min(values), "max": max(values)}
        stages[stage]["over_seeds"] = seeds_improved(
            {seed: r["trained_em"] - r["base_em"] for seed, r in rows.items()})
    return stages


def headline(stages: dict[str, dict[str, Any]]) -> list[str]:
    """One line per stage: the seed-level statement first, then the pooled test."""
    lines = []
    for stage, f in stages.items():
        over, base, trained = f["over_seeds"], f["base_em"], f["trained_em"]
        line = (f"{stage}: {over['better']} of {over['seeds']} seeds improved, {over['worse']} worse "
                f"(exact sign test over seeds p = {over['p_value']:.3g}); avg@1 {base['mean']:.3f} "
                f"[{base['min']:.3f}, {base['max']:.3f}] -> {trained['mean']:.3f} "
                f"[{trained['min']:.3f}, {trained['max']:.3f}]")
        pooled = f.get("pooled_paired")
        if pooled:
            line += (f"; pooled, {pooled['covers']}: {pooled['better']} better, {pooled['worse']} worse "
                     f"of {pooled['questions']}, p = {pooled['p_value']:.3g}")
        lines.append(line)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m algos.recipes.micro.seeds",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "collect"])
    parser.add_argument("--root", type=Path, required=True, help="one folder per seed in it")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("docs/micro_seeds.json"))
    args = parser.parse_args(argv)
    if args.command == "run":
        for seed in args.seeds:
            print(f"seed {seed}: {run_seed(seed, args.root, args.threads)}", flush=True)
        return 0
    runs = {s: args.root / f"seed{s}" / "run" for s in args.seeds}
    missing = [str(r / "summary.json") for r in runs.values() if not (r / "summary.json").exists()]
    if missing:
        print(f"seeds: no summary yet at {', '.join(missing)}", file=sys.stderr)
        return 2
    from algos.reproducible import environment

    result = {**spread(runs), "environment": environment()}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(headline(result["stages"])))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
