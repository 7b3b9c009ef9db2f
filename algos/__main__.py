"""``python -m algos``: train the team the MultiAgent-OPD way.

    python -m algos train --preset micro                  # Stage I then Stage II, CPU, minutes
    python -m algos train --stage teacher --preset smollm2
    python -m algos train --stage team --preset smollm2 --teacher runs/smollm2/teacher
    python -m algos train --stage team --preset micro --signal outcome --set steps=20
    python -m algos train --preset micro --resume          # continue the same run
    python -m algos sft --episodes scripted.jsonl --model micro --out runs/sft
    python -m algos train-leader-sb3 --algo ppo --out runs/sb3_leader   # SB3 Leader, scripted team

Any TrainConfig field can be set with ``--set name=value`` (tuples: comma separated).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from algos.config import PRESETS, TrainConfig


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["steps=5", "train_datasets=nq,hotpotqa"]`` -> typed TrainConfig overrides."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in fields:
            raise SystemExit(f"--set {pair!r}: expected name=value with name one of {sorted(fields)}")
        default = fields[name].default
        if default is dataclasses.MISSING:
            default = fields[name].default_factory()  # type: ignore[misc]
        if isinstance(default, bool):
            value: Any = raw.lower() in ("1", "true", "yes")
        elif isinstance(default, int):
            value = int(raw)
        elif isinstance(default, float):
            value = float(raw)
        elif isinstance(default, tuple):
            value = tuple(x for x in raw.split(",") if x)
        elif raw.lower() == "none":
            value = None
        elif default is None and str(fields[name].type).startswith("int"):
            value = int(raw)
        else:
            value = raw
        out[name] = value
    return out


def _train(args: argparse.Namespace) -> int:
    from algos.pipeline import run_pipeline

    overrides = parse_overrides(args.set)
    if args.teacher:
        overrides["teacher"] = args.teacher
    if args.signal:
        overrides["searcher_signal"] = args.signal
    if args.steps:
        overrides["steps"] = args.steps
    stages = (args.stage,) if args.stage else ("teacher", "team")
    out = args.out or f"runs/{args.preset}"
    run_pipeline(args.preset, out, stages, overrides, resume=args.resume, progress=not args.no_progress)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sft":
        from algos.sft import main as sft_main

        return sft_main(argv[1:])
    if argv and argv[0] == "train-leader-sb3":
        from algos.sb3_leader import main as sb3_main

        return sb3_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m algos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="Stage I (teacher), Stage II (team), or both in order")
    t.add_argument("--stage", choices=["teacher", "team"], default=None, help="default: both, in order")
    t.add_argument("--preset", choices=sorted(PRESETS), default="micro")
    t.add_argument("--out", default=None, help="run directory (default runs/<preset>)")
    t.add_argument("--teacher", default=None, help="Stage II Teacher: a Stage-I run/checkpoint, or 'base'")
    t.add_argument("--signal", choices=["opd", "outcome", "none", "critic"], default=None,
                   help="Stage II Searcher signal (Table 2 diagnostics)")
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    t.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoints")
    t.add_argument("--no-progress", action="store_true")
    sub.add_parser("sft", help="supervised warm start on recorded episodes (see python -m algos sft --help)")
    sub.add_parser("train-leader-sb3", help="train only the Leader with stable-baselines3 "
                   "(see python -m algos train-leader-sb3 --help)")
    args = parser.parse_args(argv)
    return _train(args)


if __name__ == "__main__":
    sys.exit(main())
