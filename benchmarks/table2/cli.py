"""Table 2's command line, ``python -m benchmarks ablate`` and ``python -m benchmarks table2``: what
they run is imported when they run (the parser reads this module without loading it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.table2.runs import VARIANTS


def ablate_command(args: Any) -> int:
    """``python -m benchmarks ablate``: run (or finish) the ablation, then write its table."""
    from algos.commands.preflight import PreflightError
    from algos.config import parse_overrides
    from algos.engine.runlock import RunLockedError
    from benchmarks.table2.ablate import BaseChangedError, run_ablation
    from benchmarks.table2.runs import check_ablation

    try:  # settings refused before anything loads, builds or trains: one line
        seeds = seeds_of(args)
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        overrides = {**parse_overrides(args.set), **({} if args.steps is None else {"steps": args.steps})}
        check_ablation(args.preset, args.out, seeds, variants, overrides, base_seeds=args.base_seeds,
                       threads=args.threads, jobs=args.jobs)
    except (ValueError, PreflightError) as err:
        raise SystemExit(f"python -m benchmarks ablate: error: {err}") from None
    try:
        run_ablation(args.preset, args.out, seeds, variants, overrides, base_seeds=args.base_seeds,
                     threads=args.threads, jobs=args.jobs, progress=not args.no_progress)
    except (RunLockedError, BaseChangedError) as err:  # refused before anything trained
        raise SystemExit(f"python -m benchmarks ablate: error: {err}") from None
    return table_command(args)


def table_command(args: Any) -> int:
    """``python -m benchmarks table2 OUT``: (re)write the table of the runs finished so far;
    with ``--restore TABLE_JSON``, first put that table's runs back into OUT
    (:func:`benchmarks.table2.archive.restore_runs`); with ``--publish DIR``, then copy it there."""
    from benchmarks.table2.archive import publish_table, restore_runs
    from benchmarks.table2.render import write_table2

    if args.out is None:
        raise SystemExit("python -m benchmarks table2: error: give the ablation's directory (or --render-docs)")
    try:  # a table or archive that cannot be read or written: one line
        if getattr(args, "restore", None):
            restored = restore_runs(args.restore, args.out)
            print(f"restored {len(restored)} finished runs from {args.restore} into {args.out}: "
                  f"{', '.join(restored) or '-'}")
        write_table2(args.out, n_resamples=args.resamples)
        print((Path(args.out) / "table2.md").read_text(encoding="utf-8"))
        print(f"wrote {Path(args.out) / 'table2.json'}, table2.md and curves.png")
        if getattr(args, "publish", None):
            written = publish_table(args.out, args.publish)
            print(f"published {', '.join(p.name for p in written)} into {args.publish}; "
                  f"then: python -m benchmarks table2 --render-docs")
    except ValueError as err:
        raise SystemExit(f"python -m benchmarks table2: error: {err}") from None
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ablation's options (``python -m benchmarks ablate``)."""
    parser.add_argument("--preset", default="micro", help="a preset of python -m algos train (default micro)")
    parser.add_argument("--out", default="runs/table2", help="the ablation's directory (default runs/table2)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma list of {', '.join(VARIANTS)} (default: all; opd is the reference of the CIs)")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 1)")
    seeds.add_argument("--seed-list", default=None, help="comma list of seeds, e.g. 0,5,7")
    parser.add_argument("--base-seeds", type=int, default=None, metavar="K",
                        help="seed s trains from the base built for seed s %% K (default: a base per seed); "
                             "--seeds 6 --base-seeds 3 builds 3 bases, each shared by 2 training seeds")
    parser.add_argument("--steps", type=int, default=None, help="training steps of every run (default: the preset's)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="any TrainConfig setting for every run, as in python -m algos train")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads per process, the base's build included (default 1: on a busy machine "
                             "one thread per process is faster than two that wait on each other; try 2 on an idle "
                             "2-core machine with --jobs 1; numbers repeat bit for bit at the same count)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def seeds_of(args: argparse.Namespace) -> list[int]:
    """The seeds an ``ablate`` command names; raises ValueError naming the option."""
    if args.seed_list is not None:
        try:
            return [int(s) for s in args.seed_list.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"--seed-list {args.seed_list!r}: expected integers separated by commas") from None
    n = 1 if args.seeds is None else args.seeds
    if n < 1:
        raise ValueError(f"--seeds {n}: must be >= 1")
    return list(range(n))
