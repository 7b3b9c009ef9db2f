"""The seven-dataset evaluation suite: a policy over the datasets, k runs per question,
per-question JSONL, every episode, a summary JSON (recording all it takes to reproduce it), a
Table-1 style table and plots."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import benchmarks.policies  # noqa: F401  (registers the ckpt: kind)
from agents.collect import collect
from agents.registry import POLICY_KINDS, check_policy, make_policy
from agents.sampling import Sampling, team_settings
from agents.viewer.records import tokenizer_record
from algos.commands.preflight import PreflightError, check_retriever
from benchmarks.metrics import summarize
from envs import protocol as P
from envs.data import DATASETS, load_qa
from envs.episode import question_record, save_episodes
from envs.retrieval.factory import make_retriever

NAMES = {"nq": "NQ", "triviaqa": "TriviaQA", "popqa": "PopQA", "hotpotqa": "HotpotQA",
         "2wikimultihopqa": "2Wiki", "musique": "MuSiQue", "bamboogle": "Bamboogle"}
QUICK = {"limit": 20, "runs": 4}


def build_policy(spec: str, seed: int = 0, sampling: Sampling | None = None) -> Any:
    """``agents.registry.make_policy``, which knows ``ckpt:<dir>`` once this module is imported
    (kept as a name for callers of the suite)."""
    return make_policy(spec, seed=seed, sampling=sampling)


def policy_tokenizer(policy: Any) -> Any:
    """The tokenizer the env must use: the (first) LM policy's own, else the default."""
    for p in [policy, *getattr(policy, "policies", {}).values()]:
        if getattr(p, "tokenizer", None) is not None:
            return p.tokenizer
    from envs.search_team import default_tokenizer

    return default_tokenizer()


def check_prompts(name: str) -> None:
    """PreflightError (one line listing the sets) unless ``name`` is an env prompt set."""
    try:
        P.prompt_set(name)
    except ValueError as err:
        raise PreflightError(f"--prompts: {err}") from None


def check_run(policy: str, *, data: str = "synthetic", corpus: str | None = None,
              retriever_url: str | None = None) -> None:
    """Refuse, in one line (:class:`algos.commands.preflight.PreflightError`), a suite run that
    cannot work, before anything loads: a policy spec that names nothing here, a data folder,
    corpus or retrieval server that is not there (a URL must answer one query)."""
    try:
        check_policy(policy)
    except ValueError as err:  # a kind's check names its spec first; name the option before it
        named = str(err).split(":", 1)[0] in POLICY_KINDS
        raise PreflightError(f"--policy {err}" if named else f"--policy {policy}: {err}") from None
    if data != "synthetic":
        if not Path(data).is_dir():
            raise PreflightError(f"--data {data}: no such directory (give 'synthetic' or a FlashRAG-layout folder)")
        if not (corpus or retriever_url):
            raise PreflightError(f"--data {data}: give --corpus FILE or --retriever-url URL for real data")
    for option, spec in (("--corpus", corpus), ("--retriever-url", retriever_url)):
        if spec:
            try:
                check_retriever(spec)
            except PreflightError as err:
                reason = str(err).replace(f"retriever={spec!r}", "", 1).lstrip(": ")
                raise PreflightError(f"{option} {spec}: {reason}") from None


def check_datasets(data: str, datasets: Sequence[str], split: str) -> None:
    """Read every row of every dataset file a run will play, before the first episode: an
    unknown dataset or a malformed row anywhere raises a one-line PreflightError naming the
    file and line (``envs.data.load_qa``'s message). A missing dataset or split passes."""
    import warnings

    from envs.terminal import terminal_safe

    for name in datasets:
        try:  # the whole file, past any --limit: a run must not end halfway on a bad row
            with warnings.catch_warnings():  # rows left out are reported when the run loads them
                warnings.simplefilter("ignore")
                load_qa(name, split, root=data)
        except FileNotFoundError:
            continue
        except ValueError as err:
            raise PreflightError(f"--data {data}: {terminal_safe(str(err), one_line=True)}") from None


def build_retriever(data: str, corpus: str | None, retriever_url: str | None) -> tuple[Any, str]:
    """The retriever of a suite run (``make_retriever``) and its name in the result files."""
    if data != "synthetic" and not (corpus or retriever_url):
        raise PreflightError(f"--data {data}: give --corpus FILE or --retriever-url URL for real data")
    spec = retriever_url or corpus or "default"
    return make_retriever(spec), spec if spec != "default" else "synthetic world corpus (MiniLM, flat)"


def run_suite(policy: str, *, out_dir: str | Path, workflow: str = "hierarchical", data: str = "synthetic",
              datasets: Sequence[str] = DATASETS, split: str = "test", runs: int = 4, limit: int | None = None,
              corpus: str | None = None, retriever_url: str | None = None, seed: int = 0,
              env_kwargs: dict[str, Any] | None = None, progress: bool = True, log=print,
              threads: int | None = None, keep_episodes: bool = True,
              sampling: Sampling | None = None, checked_line: str | None = None) -> dict[str, Any]:
    """Play ``policy`` over ``datasets``, ``runs`` times per question, and write the result
    files into ``out_dir`` (docs/benchmarks.md, "The synthetic suite"), created only when there
    are results. A run that cannot work raises ``PreflightError`` first, before anything is
    printed (:func:`check_prompts`, :func:`check_run`, a bad row anywhere: :func:`check_datasets`);
    ``checked_line`` then goes to stderr (the command's threads line). ``threads``: intra-op
    threads meanwhile (None: 1). ``sampling``: for the LM policies whose spec sets none;
    ``summary.json``'s ``meta`` records both."""
    from algos.reproducible import run_threads

    check_prompts((env_kwargs or {}).get("prompts", P.DEFAULT_PROMPTS))
    check_run(policy, data=data, corpus=corpus, retriever_url=retriever_url)
    check_datasets(data, datasets, split)
    if checked_line:
        print(checked_line, file=sys.stderr, flush=True)
    with run_threads(threads) as n:
        return _run_suite(policy, out_dir, workflow, data, datasets, split, runs, limit, corpus, retriever_url,
                          seed, env_kwargs, progress, log, n, keep_episodes, sampling)


EPISODES = "episodes.jsonl"
"""The file of a suite run's episodes, in its result folder."""


def _run_suite(policy: str, out_dir: str | Path, workflow: str, data: str, datasets: Sequence[str], split: str,
               runs: int, limit: int | None, corpus: str | None, retriever_url: str | None, seed: int,
               env_kwargs: dict[str, Any] | None, progress: bool, log: Any, threads: int,
               keep_episodes: bool = True, sampling: Sampling | None = None) -> dict[str, Any]:
    from envs import env_fn as make_env_fn

    out = Path(out_dir)
    made = not out.exists()
    # episodes go to a temporary file dataset by dataset (a full run plays thousands), which
    # then replaces episodes.jsonl beside the other result files; a failed run removes it, so
    # it leaves neither a mix of two runs nor a folder of its own
    partial = out / f"{EPISODES}.partial"
    agent = build_policy(policy, seed, sampling)
    tokenizer = policy_tokenizer(agent)
    retriever, retriever_desc = build_retriever(data, corpus, retriever_url)
    env_kwargs = dict(env_kwargs or {})
    records, skipped = [], []
    kept = 0  # episodes written to the partial file so far
    start = time.perf_counter()
    try:
        for name in datasets:
            try:
                questions = load_qa(name, split, root=data, limit=limit)
            except FileNotFoundError as err:
                skipped.append(name)
                log(f"skipping {name}: {err}")
                continue
            env_fn = make_env_fn(workflow=workflow, tokenizer=tokenizer, retriever=retriever,
                                 questions=questions, **env_kwargs)
            groups = collect(env_fn, agent, questions, runs, seed=seed, progress=name if progress else False)
            first = kept
            for eps in groups:
                record = {**question_record(eps), "dataset": name}
                if keep_episodes:
                    record["episode_index"] = list(range(kept, kept + len(eps)))
                    kept += len(eps)
                records.append(record)
            if keep_episodes and groups:
                save_episodes(partial, [ep for eps in groups for ep in eps], append=first > 0)
        if not records:
            raise PreflightError(f"no questions found for {list(datasets)} ({split}) under {data}")
        summary = summarize(records)
        summary["meta"] = {"policy": policy, "workflow": workflow, "data": data, "split": split, "runs": runs,
                           "limit": limit, "retriever": retriever_desc, "top_k": env_kwargs.get("top_k", 3),
                           "seed": seed, "threads": threads, "env_kwargs": env_kwargs, "skipped": skipped,
                           "prompts": env_kwargs.get("prompts", P.DEFAULT_PROMPTS),
                           "sampling": team_settings(agent), "seconds": round(time.perf_counter() - start, 1)}
        if keep_episodes:  # what `python -m agents view` decodes the episodes with
            summary["meta"]["tokenizer"] = tokenizer_record(tokenizer)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "questions.jsonl", "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        if keep_episodes:
            os.replace(partial, out / EPISODES)
        else:  # an earlier run's episodes would not match these questions
            (out / EPISODES).unlink(missing_ok=True)
    except BaseException:
        partial.unlink(missing_ok=True)
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise
    table = markdown_table([(label_of(summary), summary)])
    (out / "table.md").write_text(table + "\n")
    plot_results([(label_of(summary), summary)], out)
    log(table)
    files = f"questions.jsonl, {EPISODES}, " if keep_episodes else "questions.jsonl, "
    log(f"wrote {out}/{files}summary.json, table.md, accuracy_vs_cost.png, per_dataset.png")
    if keep_episodes:
        log(f"see an episode token by token: python -m agents view {out / EPISODES} --index N "
            "(N: a question's episode_index in questions.jsonl)")
    return summary


def label_of(summary: dict[str, Any]) -> str:
    meta = summary.get("meta", {})
    short = {"hierarchical": "H-MAS", "cascade": "C-MAS"}.get(meta.get("workflow"), meta.get("workflow", ""))
    prompts = meta.get("prompts", P.DEFAULT_PROMPTS)
    tail = f" [{prompts} prompts]" if prompts != P.DEFAULT_PROMPTS else ""
    return f"{short} {meta.get('policy', '?')}{tail}".strip()


def markdown_table(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Table 1's layout: avg@k per dataset and macro, then pass@k, all-k and the costs.
    Rows of different k (a k=4 run beside a k=2 run) share the columns ``pass@k`` and
    ``all-k``, and each row's label says its own k."""
    names = [n for n in DATASETS if any(n in s["datasets"] for _, s in rows)]
    ks = {s.get("k", 0) for _, s in rows}
    k = str(ks.pop()) if len(ks) == 1 else "k"
    head = (["Method"] + [NAMES.get(n, n) for n in names] + ["Macro", f"pass@{k}", f"all-{k}", "searches",
                                                            "in tok", "out tok"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, s in rows:
        label = label if k != "k" else f"{label} (k={s.get('k', 0)})"
        cells = [label] + [f"{100 * s['datasets'][n]['avg@k']:.1f}" if n in s["datasets"] else "-" for n in names]
        cells += [f"{100 * s['macro_avg@k']:.2f}", f"{100 * s['macro_pass@k']:.2f}", f"{100 * s['macro_all_k']:.2f}",
                  f"{s['macro_searches_per_workflow']:.2f}", f"{s['macro_input_tokens_per_workflow']:.0f}",
                  f"{s['macro_output_tokens_per_workflow']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_results(rows: Sequence[tuple[str, dict[str, Any]]], out_dir: str | Path) -> None:
    """Accuracy against each cost (the paper's Figure 4) and per-dataset bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(out_dir)
    costs = [("searches_per_workflow", "search actions / workflow"),
             ("input_tokens_per_workflow", "input tokens / workflow"),
             ("output_tokens_per_workflow", "output tokens / workflow")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for label, s in rows:
        for ax, (key, title) in zip(axes, costs):
            ax.scatter([s[f"macro_{key}"]], [100 * s["macro_avg@k"]], s=50, label=label)
            ax.set_xlabel(title)
            ax.set_ylabel("macro avg@k (%)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_cost.png", dpi=110)
    plt.close(fig)
    names = [n for n in DATASETS if any(n in s["datasets"] for _, s in rows)]
    fig, ax = plt.subplots(figsize=(10, 3.8))
    width = 0.8 / max(1, len(rows))
    for i, (label, s) in enumerate(rows):
        ys = [100 * s["datasets"][n]["avg@k"] if n in s["datasets"] else 0 for n in names]
        ax.bar(np.arange(len(names)) + i * width, ys, width, label=label)
    ax.set_xticks(np.arange(len(names)) + width * (len(rows) - 1) / 2, [NAMES.get(n, n) for n in names])
    ax.set_ylabel("avg@k (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "per_dataset.png", dpi=110)
    plt.close(fig)
