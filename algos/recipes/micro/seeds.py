"""The micro preset's spread over seeds: each seed builds its own base from scratch and
trains both stages on it, and the summaries are pooled into ``docs/micro_seeds.json`` (mean
and range of the base's and the trained team's avg@1 per stage, and a paired sign test
pooled over every seed's validation questions).

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
    """Build seed ``seed``'s base and train both stages on it (minutes to an hour on 2
    cores); returns its run directory. A base already built there is reused; a finished run
    is not repeated."""
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
    """A validation's per-question records, each question named by its seed too (pooling
    seeds must not pair one seed's question with another's)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{**r, "dataset": f"seed{seed}/{r['dataset']}"} for r in rows]


def spread(runs: dict[int, str | Path]) -> dict[str, Any]:
    """The per-seed summaries of ``runs`` (seed -> run directory with ``summary.json``) and,
    per stage, the mean and range of the base's and the trained team's avg@1, and the exact
    paired sign test pooled over all seeds' validation questions."""
    from algos.report import paired_sign_test
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
    stages: dict[str, Any] = {}
    for stage in STAGES:
        rows = [s["stages"][stage] for s in per_seed.values() if stage in s["stages"]]
        if not rows:
            continue
        stages[stage] = {"seeds": len(rows)}
        for key in ("base_em", "trained_em"):
            values = [r[key] for r in rows]
            stages[stage][key] = {"mean": round(statistics.fmean(values), 4),
                                  "min": min(values), "max": max(values)}
        stages[stage]["pooled_paired"] = paired_sign_test(*pooled[stage])
    return {"seeds": per_seed, "stages": stages}


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
    result = spread(runs)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["stages"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
