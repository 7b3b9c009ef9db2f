"""The micro recipe's measurement of a base before training (issue 30): greedy avg@1 on the
dev questions with the retriever and with one that finds nothing, the sampled search rate and
the within-group covariance of searching with R_EM on training questions
(:mod:`algos.mechanism`), and the Searchers' skip probability.

    python -m algos.recipes.micro.mechanism --model ~/.cache/mopd/models/micro-sft-<key> --out m.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from algos.mechanism import NothingFound, greedy_figures, search_covariance, two_choice


def measure(model: str, *, workflow: str = "hierarchical", per_dataset: int = 50,
            train_per_dataset: int = 20, group_size: int = 8, temperature: float = 0.7,
            seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """The figures of the module docstring for the micro-recipe model at ``model`` (a base
    built by ``python -m algos sft --preset micro``): greedy on ``per_dataset`` dev questions
    per dataset, with and without search; ``group_size`` sampled workflows on each of
    ``train_per_dataset`` training questions per dataset (world 0, the world RL trains on)."""
    from agents.collect import collect
    from agents.hf import HFPolicy
    from algos.recipes.micro.episodes import micro_env_fn, questions
    from algos.recipes.micro.measure import searcher_skip_probability
    from envs.retrieval.factory import default_retriever

    greedy = HFPolicy(model, temperature=0.0, max_new_tokens=64, seed=seed, batch_size=64)
    tokenizer = greedy.tokenizer
    dev = questions("dev", per_dataset)
    retriever = default_retriever(progress=progress)
    out: dict[str, Any] = {"model": str(model), "workflow": workflow, "temperature": temperature}
    started = time.perf_counter()
    for name, searched in (("greedy", retriever), ("greedy_nothing_found", NothingFound())):
        groups = collect(micro_env_fn(tokenizer, workflow, searched), greedy, dev, seed=seed,
                         max_envs=64, progress=name if progress else False)
        out[name] = greedy_figures([g[0] for g in groups], two_choice(dev))
    sampled = HFPolicy(model, temperature=temperature, max_new_tokens=64, seed=seed, batch_size=64)
    pool, train = questions("train", 10**6), []
    for dataset in dict.fromkeys(q.dataset for q in pool):
        asked = [q for q in pool if q.dataset == dataset]
        train += asked[::max(1, len(asked) // train_per_dataset)][:train_per_dataset]
    groups = collect(micro_env_fn(tokenizer, workflow, retriever), sampled, train, group_size,
                     seed=seed, max_envs=64, progress="sampled" if progress else False)
    out["sampled"] = search_covariance(groups)
    skips = searcher_skip_probability(greedy.model, tokenizer, workflow="cascade", split="dev",
                                      per_dataset=per_dataset, retriever=retriever)
    out["skip_probability"] = float(np.mean(skips))
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from algos.reproducible import run_threads

    parser = argparse.ArgumentParser(prog="python -m algos.recipes.micro.mechanism", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a micro base (a folder built by python -m algos sft --preset micro)")
    parser.add_argument("--workflow", default="hierarchical", choices=("hierarchical", "cascade"))
    parser.add_argument("--per-dataset", type=int, default=50, help="dev questions per dataset (default 50: all 350)")
    parser.add_argument("--train-per-dataset", type=int, default=20, help="training questions per dataset for the sampled groups")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    with run_threads(args.threads):
        figures = measure(args.model, workflow=args.workflow, per_dataset=args.per_dataset,
                          train_per_dataset=args.train_per_dataset, group_size=args.group_size,
                          temperature=args.temperature, seed=args.seed, progress=not args.no_progress)
    figures["threads"] = args.threads
    text = json.dumps(figures, indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
