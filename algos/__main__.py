"""``python -m algos``: train the team the MultiAgent-OPD way.

    python -m algos train --preset micro                  # Stage I then Stage II, CPU, minutes
    python -m algos train --stage teacher --preset smollm2
    python -m algos train --stage team --preset smollm2 --teacher runs/smollm2/teacher
    python -m algos train --stage team --preset micro --signal outcome --set steps=20
    python -m algos train --preset micro --resume          # continue the same run
    python -m algos sft --episodes scripted.jsonl --model micro --out runs/sft
    python -m algos train-leader-sb3 --algo ppo --out runs/sb3_leader   # SB3 Leader, scripted team
    python -m algos plan --preset paper --gpus 8 --gpu-memory 80  # memory per GPU; exit 1 if it does not fit

Any TrainConfig field can be set with ``--set name=value`` (tuples: comma separated;
booleans: true/false/1/0/yes/no; ``env_kwargs``: a JSON object). Bad settings, a missing
Teacher, ``--resume`` with no run and a retrieval server that does not answer are refused
before anything loads or builds (``algos.commands.preflight``): one line, exit status 2. So are a
checkpoint or Teacher that does not load whole (``--resume`` first falls back to the newest
complete checkpoint, saying which it skipped and why) and a second run into an ``--out`` that
a live run holds (``algos.engine.runlock``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from agents.models import ModelFileError
from algos.commands.preflight import PreflightError
from algos.commands.presets import PRESETS
from algos.config import parse_overrides as config_overrides
from algos.engine.runlock import RunLockedError
from algos.roles import STAGES, searcher_signals


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """:func:`algos.config.parse_overrides`, its refusal a :class:`PreflightError` (one line,
    exit status 2) for the commands here."""
    try:
        return config_overrides(pairs)
    except ValueError as err:
        raise PreflightError(str(err)) from None


def _train(args: argparse.Namespace) -> int:
    from algos.commands.preflight import check_train_run
    from algos.commands.train import run_pipeline, stage_config

    out = Path(args.out or f"runs/{args.preset}")
    overrides = parse_overrides(args.set)
    for option, name in (("teacher", "teacher"), ("signal", "searcher_signal"), ("steps", "steps")):
        if getattr(args, option) is not None:  # (--steps 0 too, for the config to refuse)
            overrides[name] = getattr(args, option)
    try:  # a bad setting: the config's one-line reason (PreflightError: exit status 2)
        configs = {stage: stage_config(args.preset, stage, out, overrides)
                   for stage in ((args.stage,) if args.stage else ("teacher", "team"))}
    except ValueError as err:
        raise PreflightError(str(err)) from None
    check_train_run(configs, resume=args.resume)  # before the pipeline loads or builds anything
    if args.threads is not None and args.threads < 1:
        raise PreflightError(f"--threads {args.threads}: must be >= 1")
    run_pipeline(args.preset, out, tuple(configs), overrides, resume=args.resume,
                 progress=not args.no_progress, threads=args.threads)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv)
    except (PreflightError, ModelFileError, RunLockedError) as err:
        # one line, no traceback: the run never started (a bad setting, a damaged checkpoint or
        # Teacher with no complete one to fall back to, another live run in --out)
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank finds it; rank 0 says it
            print(f"python -m algos: error: {err}", file=sys.stderr)
        return 2


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "sft":
        from algos.commands.preflight import check_sft
        from algos.commands.sft import _parser
        from algos.commands.sft import main as sft_main

        check_sft(_parser().parse_args(argv[1:]))
        return sft_main(argv[1:])
    if argv and argv[0] == "plan":
        from algos.commands.plan import main as plan_main

        return plan_main(argv[1:])
    if argv and argv[0] == "train-leader-sb3":
        from algos.commands.train_leader_sb3 import main as sb3_main

        return sb3_main(argv[1:])
    if argv and argv[0] == "ablate":  # Table 2 lives on the benchmark floor, above the learner
        raise PreflightError("the ablation (Table 2) is `python -m benchmarks ablate`")
    from envs.__main__ import add_version

    parser = argparse.ArgumentParser(prog="python -m algos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="Stage I (teacher), Stage II (team), or both in order")
    t.add_argument("--stage", choices=STAGES, default=None, help="default: both, in order")
    t.add_argument("--preset", choices=sorted(PRESETS), default="micro",
                   help="settings and model (default micro: a 5M-parameter team trained on CPU)")
    t.add_argument("--out", default=None, help="run directory (default runs/<preset>)")
    t.add_argument("--teacher", default=None, help="Stage II Teacher: a Stage-I run/checkpoint, or 'base'")
    t.add_argument("--signal", choices=searcher_signals(), default=None,
                   help="Stage II Searcher signal (Table 2 diagnostics)")
    t.add_argument("--steps", type=int, default=None, help="training steps of each stage (default: the preset's)")
    t.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="any TrainConfig field, e.g. --set group_size=4 (repeatable)")
    t.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoints")
    t.add_argument("--threads", type=int, default=None,
                   help="torch/faiss threads for the whole run, base build included (default 1: "
                        "the same numbers on any machine; the summary records it)")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    sub.add_parser("sft", help="supervised warm start on recorded episodes (see python -m algos sft --help)")
    sub.add_parser("plan", help="memory per GPU of a preset's run, before anything loads "
                   "(see python -m algos plan --help)")
    sub.add_parser("train-leader-sb3", help="train only the Leader with stable-baselines3 "
                   "(see python -m algos train-leader-sb3 --help)")
    args = parser.parse_args(argv)
    return _train(args)


if __name__ == "__main__":
    from algos.engine.distributed import run_main  # under torchrun a failing rank names itself

    sys.exit(run_main(main))
