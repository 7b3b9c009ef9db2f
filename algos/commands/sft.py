"""``python -m algos sft``: supervised fine-tuning (:func:`algos.sft.sft`) from the command line,
or a preset's base model build.

    python -m algos sft --episodes FILE.jsonl [--model smollm2|micro|PATH] [--epochs N] [--out DIR]
    python -m algos sft --preset micro [--out DIR]    # the micro recipe's base (cached)
    python -m algos sft ... --threads 2               # torch/faiss threads (default 1)

The command line, not the learner, knows the recipes: ``--preset`` and a recipe's model name
given to ``--model`` go to the recipe's hooks (``algos.commands.presets.RECIPES``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from algos.commands.presets import RECIPES
from algos.engine.runlock import run_lock
from algos.reproducible import DEFAULT_THREADS, run_threads
from algos.sft import sft
from envs.episode import load_episodes
from envs.quiet import quiet_progress


def starting_model(name: str) -> tuple[Any, Any]:
    """``(model, tokenizer)`` that fine-tuning starts from: a recipe's model name (``micro``)
    is a fresh, untrained model of that recipe with its tokenizer (the micro one is wired
    like the preset's base); anything else is loaded by :func:`agents.models.load_causal_lm`.
    (:func:`algos.engine.checkpoint.load_model` is the trainer's: a name, a path or a run directory.)"""
    if name in RECIPES:
        return RECIPES[name].fresh_model()
    from agents.models import load_causal_lm

    return load_causal_lm(name)


def _parser() -> argparse.ArgumentParser:
    recipes = ", ".join(sorted(RECIPES))
    models = "|".join(RECIPES)
    parser = argparse.ArgumentParser(
        prog="python -m algos sft",
        description="Supervised fine-tuning on the generated tokens (loss_mask == 1) of "
                    f"recorded episodes, or --preset ({recipes}) to build a preset's base model.")
    parser.add_argument("--episodes", type=Path, help="episodes JSONL (envs.episode.save_episodes)")
    parser.add_argument("--preset", choices=sorted(RECIPES),
                        help="build the preset's base model (micro: scripted-team episodes, "
                             "micro tokenizer and model; algos.recipes.micro.build.build_micro_base); the "
                             "training options below override its own defaults")
    parser.add_argument("--model", default="smollm2",
                        help=f"smollm2 (default), {models} (a fresh model of that recipe, wired "
                             "like the preset's base; the episodes must use its tokenizer), or "
                             "a model directory / hub id")
    parser.add_argument("--epochs", type=int, help="passes over the data (default 1)")
    parser.add_argument("--lr", type=float, help="peak learning rate (default 1e-4)")
    parser.add_argument("--batch-tokens", type=int, help="padded tokens per step (default 8192)")
    parser.add_argument("--context-weight", type=float,
                        help="weight of the context tokens' NLL (default 0: generated tokens only)")
    parser.add_argument("--max-len", type=int, help="longest row in tokens (default: the model's)")
    parser.add_argument("--skip-search", type=float,
                        help="--preset micro: share of Searcher tasks the imitated scripted team "
                             "reports on without searching (default 0.6; 0: a team that always searches)")
    parser.add_argument("--facts", type=int,
                        help="--preset micro: passes over each world's geography sentences mixed into "
                             "the SFT (closed-book facts; default 0)")
    parser.add_argument("--recall", action="store_true",
                        help="--preset micro: the imitated team's skipping Searchers state the "
                             "geography fact they know on a one-hop task instead of 'Nothing found.'")
    parser.add_argument("--known-worlds", type=_worlds,
                        help="--preset micro: the worlds whose geography the base learns and recalls, "
                             "e.g. 0 or 0,1 (default: all six)")
    parser.add_argument("--skip-known", type=float,
                        help="--preset micro: share of the tasks the base knows the answer to that the "
                             "imitated team reports on from memory (default: --skip-search's)")
    parser.add_argument("--recall-practice", type=int,
                        help="--preset micro --recall: further training questions per dataset played "
                             "recalling every known task, whose right episodes join the SFT (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the shuffling and the model (default 0)")
    parser.add_argument("--out", type=Path, help="where to save model and tokenizer")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help=f"torch/faiss intra-op threads (default {DEFAULT_THREADS}: the same numbers "
                             "on any machine, and on a busy machine the faster choice; sft.json records it)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def _worlds(text: str) -> tuple[int, ...]:
    """``--known-worlds 0,1`` -> ``(0, 1)``."""
    try:
        return tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected world seeds like 0 or 0,1, got {text!r}") from None


def threads_line(command: str, threads: int) -> str:
    """The first line of a long command: which thread count it runs on and how to change it.

    >>> threads_line("python -m algos sft", 1)
    'python -m algos sft: 1 torch/faiss thread (--threads N to change; more helps only on idle cores)'
    """
    plural = "thread" if threads == 1 else "threads"
    return f"{command}: {threads} torch/faiss {plural} (--threads N to change; more helps only on idle cores)"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m algos sft ...``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: must be >= 1")
    print(threads_line("python -m algos sft", args.threads), file=sys.stderr, flush=True)
    with run_threads(args.threads):  # the preset builds read it too (current_threads)
        return _main(parser, args)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    progress = not args.no_progress
    given = {key: value for key, value in (
        ("epochs", args.epochs), ("lr", args.lr), ("batch_tokens", args.batch_tokens),
        ("context_weight", args.context_weight)) if value is not None}
    if args.preset is not None:
        given.update((key, getattr(args, key)) for key in ("skip_search", "facts", "known_worlds", "skip_known",
                                                            "recall_practice") if getattr(args, key) is not None)
        if args.recall:
            given["recall"] = True
        # (not locked here: the build saves atomically into a new folder and refuses a non-empty one)
        print(RECIPES[args.preset].build_base(args.out, seed=args.seed, progress=progress, **given))
        return 0
    if args.episodes is None:
        parser.error(f"give --episodes FILE.jsonl (or --preset {'|'.join(sorted(RECIPES))})")
    if not args.episodes.exists():
        parser.error(f"--episodes {args.episodes} does not exist")
    episodes = load_episodes(args.episodes)
    out = args.out or Path(f"{args.episodes.with_suffix('')}-sft-{Path(args.model).name}")
    with run_lock(out):  # one run per --out: a second is refused naming the first (algos.engine.runlock)
        model, tokenizer = starting_model(args.model)
        settings = {"epochs": 1, "lr": 1e-4, "batch_tokens": 8192, "context_weight": 0.0, **given,
                    "max_len": args.max_len, "seed": args.seed}
        started = time.perf_counter()
        losses = sft(model, episodes, progress=progress, **settings)
        with quiet_progress():
            model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        record = {"episodes": str(args.episodes), "model": args.model, **settings,
                  "threads": args.threads, "steps": len(losses), "losses": losses,
                  "seconds": round(time.perf_counter() - started, 1)}
        (out / "sft.json").write_text(json.dumps(record, indent=1) + "\n")
        first, last = (losses[0], losses[-1]) if losses else (float("nan"), float("nan"))
        print(f"{len(losses)} steps, loss {first:.3f} -> {last:.3f}; saved to {out}")
    return 0
