"""The micro recipe's measurement of a base before training (issue 30): greedy avg@1 on the
dev questions with the retriever, with one that finds nothing and with Searchers that never skip
the tool (the ceiling of unlearning the skip habit), the sampled search rate and
the within-group covariance of searching with R_EM on training questions
(:mod:`algos.mechanism`; also on the questions a team can answer from memory alone,
:func:`from_memory`), and the Searchers' skip probability.

    python -m algos.recipes.micro.mechanism --model ~/.cache/mopd/models/micro-sft-<key> --out m.json

With ``--runs DIR`` (a Table-2 ablation of a micro preset) it measures the skip probability of
every finished run's starting and final model instead (:func:`run_skip_probabilities`), the
continuous endpoint ``python -m benchmarks table2`` reads beside greedy accuracy, and marks
the validation questions answerable from memory alone (:func:`mark_from_memory`), which the
table reports apart.
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

from algos.mechanism import (
    QUESTION_SUBSETS_FILE,
    SKIP_FILE,
    NothingFound,
    SearchFirst,
    greedy_figures,
    search_covariance,
    two_choice,
)

PARTS = ("greedy", "greedy_nothing_found", "greedy_search_first", "greedy_closed_book", "sampled",
         "skip_probability", "fact_recall")
"""What :func:`measure` can measure, each a key of its result (module docstring); with
Searchers that always skip (first token ``<summary>``): the team from memory alone; and the
share of world 0's geography the model states (:func:`algos.recipes.micro.measure.fact_recall`)."""


def measure(model: str, *, workflow: str = "hierarchical", per_dataset: int = 50,
            train_per_dataset: int = 20, group_size: int = 8, temperature: float = 0.7,
            seed: int = 0, progress: bool = True, parts: Sequence[str] = PARTS) -> dict[str, Any]:
    """The figures of ``parts`` (:data:`PARTS`) for the micro base at ``model``: greedy on
    ``per_dataset`` dev questions per dataset; ``group_size`` sampled workflows on each of
    ``train_per_dataset`` training questions per dataset (world 0, the one RL trains on)."""
    from agents.collect import collect
    from agents.hf import HFPolicy
    from algos.recipes.micro.episodes import micro_env_fn, questions
    from algos.recipes.micro.measure import fact_recall, searcher_skip_probability
    from envs.retrieval.factory import default_retriever

    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown part(s) {unknown}: choose among {list(PARTS)}")
    greedy = HFPolicy(model, temperature=0.0, max_new_tokens=64, seed=seed, batch_size=64)
    tokenizer = greedy.tokenizer
    dev = questions("dev", per_dataset)
    retriever = default_retriever(progress=progress)
    out: dict[str, Any] = {"model": str(model), "workflow": workflow, "temperature": temperature}
    started = time.perf_counter()
    def opening(tag: str) -> SearchFirst:
        return SearchFirst(greedy, tokenizer.convert_tokens_to_ids(tag))

    greedy_runs = {"greedy": (greedy, retriever), "greedy_nothing_found": (greedy, NothingFound()),
                   "greedy_search_first": (opening("<search>"), retriever),
                   "greedy_closed_book": (opening("<summary>"), NothingFound())}
    for name, (policy, searched) in greedy_runs.items():
        if name in parts:
            groups = collect(micro_env_fn(tokenizer, workflow, searched), policy, dev, seed=seed,
                             max_envs=64, progress=name if progress else False)
            out[name] = greedy_figures([g[0] for g in groups], two_choice(dev))
    if "sampled" in parts:
        sampled = HFPolicy(model, temperature=temperature, max_new_tokens=64, seed=seed, batch_size=64)
        pool, train = questions("train", 10**6), []
        for dataset in dict.fromkeys(q.dataset for q in pool):
            asked = [q for q in pool if q.dataset == dataset]
            train += asked[::max(1, len(asked) // train_per_dataset)][:train_per_dataset]
        groups = collect(micro_env_fn(tokenizer, workflow, retriever), sampled, train, group_size,
                         seed=seed, max_envs=64, progress="sampled" if progress else False)
        out["sampled"] = search_covariance(groups)
        known = [g for g, k in zip(groups, from_memory(train, tokenizer, workflow)) if k]
        if known:  # where skipping the search can pay: the covariance there alone
            out["sampled_from_memory"] = search_covariance(known)
    if "fact_recall" in parts:
        out["fact_recall"] = fact_recall(greedy.model, tokenizer)
    if "skip_probability" in parts:
        skips = searcher_skip_probability(greedy.model, tokenizer, workflow="cascade", split="dev",
                                          per_dataset=per_dataset, retriever=retriever)
        out["skip_probability"] = float(np.mean(skips))
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def from_memory(questions: Sequence[Any], tokenizer: Any, workflow: str = "hierarchical",
                world_seed: int = 0) -> list[bool]:
    """Which of ``questions`` a team can answer from memory alone: the never-searching scripted
    team gets them right stating the world's geography and wrong without it (so a two-choice
    guess does not count)."""
    from agents.collect import collect
    from agents.scripted import ScriptedPolicy
    from algos.recipes.micro.episodes import micro_env_fn
    from algos.recipes.micro.tokenizer import synthetic_world

    env = micro_env_fn(tokenizer, workflow, NothingFound())
    memory = synthetic_world(world_seed).geography()
    right = [[g[0].team_em == 1 for g in collect(env, ScriptedPolicy(skip_search=1.0, memory=m), questions)]
             for m in (memory, None)]
    return [known and not guessed for known, guessed in zip(*right)]


FROM_MEMORY = "from_memory"
"""The name of the question set :func:`mark_from_memory` writes."""


def mark_from_memory(out: str | Path) -> list[list[str]]:
    """Mark, in the ablation directory ``out``'s :data:`algos.mechanism.QUESTION_SUBSETS_FILE`
    (as :data:`FROM_MEMORY`, other sets kept), the first finished run's validation questions
    that :func:`from_memory` finds, so Table 2 reports them apart (where outcome RL could trade
    search for memory, it shows there first); returns them as ``[dataset, id]`` pairs."""
    from transformers import AutoTokenizer

    from algos.engine.checkpoint import resolve_model_path
    from algos.recipes.micro.episodes import questions

    out = Path(out)
    records = sorted(out.glob("seed*/*/run.json"))
    if not records:
        raise ValueError(f"{out}: no finished run (seed*/*/run.json) to take the validation questions from")
    config = json.loads(records[0].read_text(encoding="utf-8"))["config"]
    if config.get("data", "synthetic") != "synthetic":
        raise ValueError(f"{records[0]}: data {config.get('data')!r}: only the synthetic world's questions can be marked")
    asked = [q for q in questions(config["val_split"], config["val_per_dataset"])
             if q.dataset in (config.get("val_datasets") or [q.dataset])]
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(str(config["model"])))
    except OSError as err:
        raise ValueError(f"{records[0]}: cannot load the tokenizer of its model {config['model']} ({err})") from None
    marked = [[q.dataset, str(q.id)] for q, known in zip(asked, from_memory(asked, tokenizer)) if known]
    path = out / QUESTION_SUBSETS_FILE
    try:
        subsets = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except ValueError as err:
        raise ValueError(f"{path}: not JSON ({err}); move it aside to mark the questions again") from None
    subsets[FROM_MEMORY] = {"about": "answerable from memory alone: the scripted team that states the world's "
                                     "geography gets them right, and wrong without it",
                            "questions": marked}
    path.write_text(json.dumps(subsets, indent=1) + "\n", encoding="utf-8")
    return marked


def run_skip_probabilities(out: str | Path, *, per_dataset: int = 20, retriever: Any = None,
                           progress: bool = True) -> dict[str, Any]:
    """The Searchers' skip probability (``measure.searcher_skip_probability``, ``per_dataset``
    dev questions per dataset) of every finished run under ``out``'s starting model and final
    checkpoint, written to each run's :data:`algos.mechanism.SKIP_FILE` and returned by run
    name; a run that has the file is read, not measured; one without a checkpoint left out."""
    from algos.engine.checkpoint import latest_checkpoint, load_model
    from algos.recipes.micro.measure import searcher_skip_probability
    from envs.retrieval.factory import default_retriever

    out = Path(out)
    cached: dict[tuple[str, str], tuple[float, int]] = {}
    figures: dict[str, Any] = {}
    for record in sorted(out.glob("seed*/*/run.json")):
        run = record.parent
        target = run / SKIP_FILE
        if target.exists():
            figures[str(run.relative_to(out))] = json.loads(target.read_text(encoding="utf-8"))
            continue
        config = json.loads(record.read_text(encoding="utf-8"))["config"]
        workflow = "cascade" if config["stage"] == "teacher" else "hierarchical"
        final = latest_checkpoint(run)
        if final is None:  # restored from a table's archives (benchmarks.table2.archive.restore_runs) unmeasured
            if progress:
                print(f"{run.relative_to(out)}: no checkpoint to measure (a restored run): left out", flush=True)
            continue
        retriever = retriever or default_retriever(progress=progress)
        values = {}
        for name, path in (("step0", str(config["model"])), ("final", str(final))):
            if (path, workflow) not in cached:
                model, tokenizer = load_model(path)
                model.eval()
                skips = searcher_skip_probability(model, tokenizer, workflow=workflow, split="dev",
                                                  per_dataset=per_dataset, retriever=retriever)
                cached[path, workflow] = (float(np.mean(skips)), len(skips))
            values[name] = cached[path, workflow][0]
        row = {"per_dataset": per_dataset, "workflow": workflow, "contexts": cached[str(final), workflow][1],
               **values, "final_step": int(final.name.split("_")[-1])}
        target.write_text(json.dumps(row, indent=1) + "\n", encoding="utf-8")
        figures[str(run.relative_to(out))] = row
        if progress:
            print(f"{run.relative_to(out)}: skip probability {row['step0']:.3f} -> {row['final']:.3f}", flush=True)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    from algos.reproducible import run_threads

    parser = argparse.ArgumentParser(prog="python -m algos.recipes.micro.mechanism", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a micro base (a folder built by python -m algos sft --preset micro)")
    which.add_argument("--runs", help="a Table-2 ablation's directory: the skip probability of every finished run's "
                                      "starting and final model, written beside each run, and the validation "
                                      "questions answerable from memory alone")
    parser.add_argument("--workflow", default="hierarchical", choices=("hierarchical", "cascade"))
    parser.add_argument("--per-dataset", type=int, default=None,
                        help="dev questions per dataset (default 50, all 350; with --runs 20)")
    parser.add_argument("--train-per-dataset", type=int, default=20, help="training questions per dataset for the sampled groups")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"with --model, what to measure, comma-separated (default all: {','.join(PARTS)})")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="write the figures as JSON here")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts {args.parts!r}: choose among {','.join(PARTS)}")
    if args.runs:
        with run_threads(args.threads):
            run_skip_probabilities(args.runs, per_dataset=args.per_dataset or 20, progress=not args.no_progress)
            marked = mark_from_memory(args.runs)
        print(f"{Path(args.runs) / QUESTION_SUBSETS_FILE}: {len(marked)} validation questions answerable from memory")
        return 0
    with run_threads(args.threads):
        figures = measure(args.model, workflow=args.workflow, per_dataset=args.per_dataset or 50,
                          train_per_dataset=args.train_per_dataset, group_size=args.group_size,
                          temperature=args.temperature, seed=args.seed, progress=not args.no_progress,
                          parts=parts)
    figures["threads"] = args.threads
    text = json.dumps(figures, indent=2, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
