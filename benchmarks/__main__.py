"""``python -m benchmarks``: evaluate, compare, plot.

    python -m benchmarks run --policy scripted --quick --out results/scripted
    python -m benchmarks run --policy ckpt:runs/micro/team --workflow hierarchical --out results/opd
    python -m benchmarks run --policy 'hf:smollm2?temperature=0.7&top_p=0.9' --quick --out results/smollm2
    python -m benchmarks run --policy scripted --data ../shared/realdata --datasets hotpotqa,2wikimultihopqa \\
        --split dev --corpus ../shared/realdata/corpora/hotpotqa_2wiki_dev.jsonl --out results/real
    python -m benchmarks compare results/opd results/scripted
    python -m benchmarks curves runs/micro/teacher runs/micro/team   # writes runs/micro/curves.png
    python -m benchmarks ablate --preset micro --seeds 3 --out runs/table2   # Table 2, resumable
    python -m benchmarks table2 runs/table2     # the table of the runs finished so far
    python -m benchmarks table2 --render-docs   # README's and docs' tables from docs/*.json
    python -m benchmarks perf

Policies: ``run --help`` lists the kinds. An LM policy samples with its spec's settings, else
--temperature/--top-p/--max-new-tokens, else the model's generation config (docs/benchmarks.md);
`compare` pairs only runs sampled alike. A run that cannot work stops before anything loads and
before its --out folder exists: one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from envs import protocol as P
from envs.data import DATASETS


def _load(result: str) -> tuple[dict, list[dict]]:
    """A result directory of ``python -m benchmarks run``, or a learner's validation file
    (``<run>/validation/step_*.jsonl``: per-question records, summarised here). A record the
    metrics cannot use stops the command with one line naming the file and the line."""
    from benchmarks.metrics import summarize

    path = Path(result)
    if path.is_file():
        records = _records(path)
        if not records:
            raise SystemExit(f"{path} holds no per-question records")
        summary = summarize(records)
        summary["meta"] = {"policy": f"{path.parent.parent.name}/{path.stem}"}
        return summary, records
    if not (path / "summary.json").exists():
        raise SystemExit(f"{path} has no summary.json: give a directory written by `python -m benchmarks run` "
                         "or a learner's validation/step_*.jsonl")
    try:
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError alike
        raise SystemExit(f"{path / 'summary.json'}: not a JSON summary ({err})") from None
    return summary, _records(path / "questions.jsonl")


def _records(path: Path) -> list[dict]:
    from benchmarks.metrics import check_record
    from envs.data.items import iter_jsonl

    if not path.is_file():
        raise SystemExit(f"{path} does not exist")
    records = []
    try:
        for line, row in iter_jsonl(path):
            check_record(row, f"{path}, line {line}")
            records.append(row)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    return records


def _run(args: argparse.Namespace) -> int:
    from agents.sampling import sampling_of_args
    from algos.commands.preflight import PreflightError
    from algos.commands.sft import threads_line
    from benchmarks.suite import QUICK, run_suite

    if args.threads < 1:
        raise PreflightError(f"--threads {args.threads}: must be >= 1")
    datasets = DATASETS if args.datasets == "all" else tuple(args.datasets.split(","))
    env_kwargs = {}
    for pair in args.env:
        name, sep, value = pair.partition("=")
        if not sep or not value.lstrip("-").isdigit():
            raise PreflightError(f"--env {pair!r}: expected NAME=INTEGER, e.g. max_turn_tokens=96")
        env_kwargs[name] = int(value)
    if args.prompts != P.DEFAULT_PROMPTS:  # the default stays out: paper runs' env_kwargs as before
        env_kwargs["prompts"] = args.prompts
    limit = (args.limit or QUICK["limit"]) if args.quick else args.limit
    runs = args.runs or (QUICK["runs"] if args.quick else 4)
    run_suite(args.policy, out_dir=args.out, workflow=args.workflow, data=args.data, datasets=datasets,
              split=args.split, runs=runs, limit=limit, corpus=args.corpus, retriever_url=args.retriever_url,
              seed=args.seed, env_kwargs=env_kwargs, progress=not args.no_progress,
              threads=args.threads, keep_episodes=not args.no_episodes, sampling=sampling_of_args(args),
              checked_line=threads_line("python -m benchmarks run", args.threads))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from agents.sampling import describe_team, same_settings
    from benchmarks.metrics import paired_macro_difference
    from benchmarks.suite import label_of, markdown_table, plot_results

    loaded = [_load(d) for d in args.results]
    base, base_meta = args.results[-1], loaded[-1][0].get("meta", {})
    for d, (s, _) in zip(args.results[:-1], [] if args.allow_different_settings else loaded[:-1]):
        meta = s.get("meta", {})
        prompts = [m.get("prompts", P.DEFAULT_PROMPTS) for m in (meta, base_meta)]
        if not same_settings(meta.get("sampling"), base_meta.get("sampling")):
            differ = (f"({describe_team(meta.get('sampling'))}) and {base} "
                      f"({describe_team(base_meta.get('sampling'))}) sampled differently")
        elif prompts[0] != prompts[1]:
            differ = (f"({prompts[0]} prompts) and {base} ({prompts[1]} prompts) were prompted "
                      "differently")
        else:
            continue
        print(f"python -m benchmarks compare: error: {d} {differ}; pass --allow-different-settings "
              "to pair them anyway", file=sys.stderr)
        return 2
    rows = [(f"{label_of(s)} ({Path(d).name})", s) for d, (s, _) in zip(args.results, loaded)]
    print(markdown_table(rows))
    status = 0
    for d, (_, records) in zip(args.results[:-1], loaded[:-1]):
        pair = f"\n{Path(d).name} - {Path(base).name}:"
        try:
            ci = paired_macro_difference(records, loaded[-1][1], n_resamples=args.resamples,
                                         seed=args.seed)
        except ValueError as err:  # no shared question: nothing to pair
            print(f"{pair} no paired CI, {err} (compare runs over the same questions)",
                  file=sys.stderr)
            status = 2
            continue
        print(f"{pair} macro avg@k {100 * ci['difference']:+.2f} "
              f"points, paired bootstrap 95% CI [{100 * ci['low']:+.2f}, {100 * ci['high']:+.2f}] "
              f"over {ci['questions']} shared questions")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        plot_results(rows, args.out)
        print(f"plots in {args.out}")
    return status


def _curves(args: argparse.Namespace) -> int:
    from algos.report import plot_training_curves, read_metrics

    paths: list[Path] = []
    for logdir in args.logdirs:
        path = Path(logdir)
        path = path if path.suffix == ".jsonl" else path / "metrics.jsonl"
        if not path.exists():
            raise SystemExit(f"{path} does not exist: give a learner run directory (with metrics.jsonl)")
        paths.append(path)
        points = [(r["step"], r["val/avg@1"]) for r in read_metrics(path) if "val/avg@1" in r]
        print(f"{path.parent}: validation avg@1 " + ", ".join(f"step {s}: {v:.3f}" for s, v in points))
    # by default beside the runs, in the folder that holds them all, never the current folder
    default = Path(os.path.commonpath([p.resolve().parent for p in paths])) / "curves.png"
    print(f"wrote {plot_training_curves(paths, args.out or default)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from algos.commands.preflight import PreflightError

    try:
        return _dispatch(argv)
    except PreflightError as err:  # one line, no traceback: nothing was run or written
        print(f"python -m benchmarks: error: {err}", file=sys.stderr)
        return 2


def _dispatch(argv: list[str] | None) -> int:
    import benchmarks.policies  # noqa: F401  (the ckpt: kind, for --policy's help)
    from agents.registry import policy_usage
    from agents.sampling import add_sampling_arguments
    from benchmarks.table2.cli import add_arguments
    from envs.__main__ import add_version

    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="a policy over the seven datasets, k runs each")
    r.add_argument("--policy", required=True, help=policy_usage())
    r.add_argument("--workflow", default="hierarchical", choices=["hierarchical", "cascade"],
                   help="hierarchical (Leader, Searchers, Answerers; default) or cascade")
    r.add_argument("--data", default="synthetic", help="synthetic, or a FlashRAG-layout directory")
    r.add_argument("--datasets", default="all", help="all, or a comma list such as nq,hotpotqa")
    r.add_argument("--split", default="test", help="the split to evaluate (default test)")
    r.add_argument("--runs", type=int, default=None, help="k runs per question (default 4)")
    r.add_argument("--limit", type=int, default=None, help="questions per dataset")
    r.add_argument("--corpus", default=None, help="passage JSONL for a local dense index")
    r.add_argument("--retriever-url", default=None, help="a Search-R1 retrieval server")
    r.add_argument("--quick", action="store_true", help="small defaults that finish in minutes")
    r.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="SearchTeam setting, e.g. --env max_turn_tokens=96 (integers)")
    r.add_argument("--prompts", default=P.DEFAULT_PROMPTS, metavar="NAME",
                   help=f"the env's prompt set: {', '.join(P.PROMPT_SETS)} (default {P.DEFAULT_PROMPTS}; "
                        "summary.json records it)")
    r.add_argument("--out", required=True, help="result folder (created only when results are written)")
    r.add_argument("--seed", type=int, default=0, help="seeds the policy and the episodes (default 0)")
    r.add_argument("--threads", type=int, default=1,
                   help="torch/faiss intra-op threads (default 1: the same numbers on any machine, and the "
                        "faster choice on a busy one; summary.json records it)")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_sampling_arguments(r)
    r.add_argument("--no-episodes", action="store_true",
                   help="do not keep the episodes (episodes.jsonl, for python -m agents view; ~2,800 in a full run)")
    c = sub.add_parser("compare", help="systems side by side; CI of each against the last")
    c.add_argument("results", nargs="+",
                   help="result folders of `run` (or a learner's validation/step_*.jsonl); the last is the baseline")
    c.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples (default 10000)")
    c.add_argument("--seed", type=int, default=0, help="seeds the bootstrap (default 0)")
    c.add_argument("--out", default=None, help="also write comparison plots here")
    c.add_argument("--allow-different-settings", action="store_true",
                   help="pair runs whose LM policies sampled with different settings (temperature, top-p, "
                        "max new tokens; summary.json's meta.sampling) or used different prompt sets (meta.prompts)")
    v = sub.add_parser("curves", help="validation avg@1 against training step (Figure 3)")
    v.add_argument("logdirs", nargs="+", help="learner run folders (each with metrics.jsonl)")
    v.add_argument("--out", default=None,
                   help="the PNG to write (default: curves.png beside the runs, e.g. runs/micro/curves.png)")
    a = sub.add_parser("ablate", help="Table 2: every Searcher signal, several seeds (trains), then table2.md",
                       description="Table 2 in miniature. Per seed: a Stage-I Teacher, then Stage II from the "
                       "same base once per Searcher signal (opd, outcome, none, base Teacher, critic); then "
                       "table2.md, table2.json and curves.png in --out. Rerun the same command to resume: "
                       "finished runs are kept, a run with a checkpoint continues.")
    add_arguments(a)
    t = sub.add_parser("table2", help="Table 2 of an ablation's finished runs (table2.md/.json, curves.png)")
    t.add_argument("out", nargs="?", help="the ablation's directory")
    t.add_argument("--render-docs", action="store_true",
                   help="instead: rewrite the README's and docs/table2.md's tables from the committed JSON "
                        "(docs/table2.json, after --publish docs; docs/micro_seeds.json)")
    t.add_argument("--restore", metavar="TABLE_JSON",
                   help="first put the finished runs of a written table (a table2.json and its archives, e.g. "
                        "committed ones) back into the directory, without checkpoints: a later ablate with the "
                        "same settings and --out trains only the rest")
    t.add_argument("--publish", metavar="DIR",
                   help="then copy the table, its archives and curves into DIR as docs/ keeps them "
                        "(table2.json, table2_*.jsonl.gz, table2_curves.png), e.g. --publish docs")
    for p in (a, t):
        p.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples of the CIs")
    sub.add_parser("perf", help="performance ratios (python -m benchmarks perf --help)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "perf":
        from benchmarks.perf.cli import main as perf_main

        return perf_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "table2" and args.render_docs:
        from benchmarks.docs_tables import render_docs

        changed = ", ".join(render_docs())  # in this checkout
        print(f"rewrote the tables of {changed}" if changed else "the tables were up to date")
        return 0
    if args.command in ("ablate", "table2"):
        from benchmarks.table2.cli import ablate_command, table_command

        return (ablate_command if args.command == "ablate" else table_command)(args)
    return {"run": _run, "compare": _compare, "curves": _curves}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
