"""``python -m envs data``: write the synthetic world to disk, or look at a dataset.

    python -m envs data synth --out data/synth [--seed 0] [--train 200 --dev 50 --test 100]
    python -m envs data show hotpotqa --split dev --root data/synth --limit 5
    python -m envs data show nq --root synthetic

(``python -m envs.data.cli ...`` works too.)
"""

from __future__ import annotations

import argparse
import sys

from envs.data.qa import load_qa
from envs.data.synthwiki import SPLITS, build_world, write_flashrag
from envs.terminal import safe_print, terminal_safe


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (2 when the data cannot be read)."""
    parser = argparse.ArgumentParser(prog="python -m envs data", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    synth = commands.add_parser("synth", help="write the synthetic world in the FlashRAG layout "
                                              "(questions + corpus.jsonl)")
    synth.add_argument("--out", required=True, help="output directory")
    synth.add_argument("--seed", type=int, default=0, help="world seed (default 0)")
    for split, default in (("train", 200), ("dev", 50), ("test", 100)):
        synth.add_argument(f"--{split}", type=int, default=default,
                           help=f"{split} questions per dataset (default {default})")

    show = commands.add_parser("show", help="print a few questions of a dataset split")
    show.add_argument("name", help="dataset name, e.g. nq or hotpotqa")
    show.add_argument("--split", default="test", help="split (default test)")
    show.add_argument("--root", default=None,
                      help="FlashRAG-layout directory, or 'synthetic' (default: the hub)")
    show.add_argument("--limit", type=int, default=5, help="rows to print (default 5)")
    args = parser.parse_args(argv)
    try:
        if args.command == "synth":
            return _synth(args)
        return _show(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {terminal_safe(str(e), one_line=True)}", file=sys.stderr)
        return 2


def _synth(args: argparse.Namespace) -> int:
    world = build_world(args.seed, train=args.train, dev=args.dev, test=args.test)
    written = write_flashrag(world, args.out)
    print(f"wrote the synthetic world (seed {args.seed}) to {args.out}")
    print(f"  corpus.jsonl: {written['corpus.jsonl']} passages")
    width = max(len(name) for name in world.question_sets)
    for name in world.question_sets:
        counts = "  ".join(f"{split} {written[f'{name}/{split}.jsonl']:>4}" for split in SPLITS)
        print(f"  {name:<{width}}  {counts}")
    return 0


def _show(args: argparse.Namespace) -> int:
    """A few rows of a split; their text goes through ``envs.terminal.terminal_safe`` (a
    dataset row may hold escape sequences)."""
    items = load_qa(args.name, args.split, root=args.root)
    source = args.root if args.root is not None else "the hub"
    safe_print(f"{args.name}/{args.split} from {source}: {len(items)} questions, "
               f"showing {min(args.limit, len(items))}")
    for item in items[: max(args.limit, 0)]:
        safe_print(f"[{item.id}] {item.question}")
        safe_print(f"    answers: {' | '.join(item.golden_answers)}")
        if item.metadata:
            meta = ", ".join(f"{key}: {value}" for key, value in item.metadata.items())
            safe_print(f"    {meta}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
