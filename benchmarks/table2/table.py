"""The paper's Table 2 from an ablation's runs (``benchmarks.ablate``): per Searcher-signal
variant the validation figures (macro over the datasets, mean over seeds), each variant's
macro difference to ``opd`` with two intervals that answer two questions, and the curves.

    python -m benchmarks ablate --preset micro --seeds 3 --out runs/table2   # train, then this
    python -m benchmarks table2 runs/table2                                  # this alone

Writes into the ablation's directory:

- ``table2.json``: the seeds, the variants, each variant's figures (mean over seeds and per
  seed), its comparison with ``opd``, the same figures without the two-choice questions,
  each run's wall time (and their sum, ``runs_wall_s``), config, base seed and weights, whether
  its step-0 validation was computed or reused, continuous endpoints, the machine and library
  versions;
- ``table2.md``: the table, then avg@k per dataset;
- ``table2_records.jsonl.gz``: every run's step-0 and final per-question validation records
  (deterministic gzip), from which :func:`benchmarks.table2_stats.comparisons_from_records` recomputes every
  comparison; ``table2_metrics.jsonl.gz``: every run's metrics.jsonl rows, each named by its
  run; ``table2_runs.jsonl.gz``: every run's record; ``table2.json`` names all three
  relative to itself (written, restored and published by :mod:`benchmarks.table2_archive`);
- ``curves.png``: validation avg@1 against the step for every variant (the paper's
  Figure 3) and searches per workflow against the step (the collapse signature).

Figures come from each run's last validation (the same held-out questions for every run),
except the invalid-turn rate, which the validation records do not carry: it is the training
rollouts' rate at the last step (``team/invalid_rate``). A variant's figure is the mean of
its seeds' figures; each seed's figure is a macro over the datasets (Table 1's metrics,
:func:`benchmarks.metrics.summarize`).

A comparison (``vs_opd``) holds the point estimate (the difference of the two variants'
mean macro avg@k), each shared seed's difference, and two intervals, each labelled with
what it covers:

- ``questions_paired`` (:data:`algos.report.QUESTIONS_PAIRED`): ``benchmarks compare``'s
  bootstrap (:func:`benchmarks.metrics.paired_macro_difference`), questions paired by
  (dataset, id) and resampled within each dataset, a question's value its correctness
  averaged over the seeds both variants finished (a question is resampled with all its seeds
  at once). The runs are held fixed: would these runs differ on new questions?
- ``over_seeds`` (:data:`algos.report.OVER_SEEDS`): the per-seed differences as the
  sample, a Student-t interval and the exact sign test over seeds
  (:func:`benchmarks.seed_stats.seed_interval`): does the training recipe differ?

Seeds and bases: each training seed is the unit of the seed-level statistics (the figures'
mean over seeds, ``over_seeds``). When the ablation shares bases (``--base-seeds K``: seed
``s`` trains from the base of seed ``s % K``), the seeds that share a base are not
independent in the base's draw: ``over_seeds`` then covers the training seeds' variation
around K drawn bases, not a new base's. ``table2.json`` keeps each run's ``base_seed`` and
base weights' hash (``bases``: per seed) and ``table2.md`` lists which seeds share a base.

Two-choice questions (:func:`benchmarks.table2_stats.is_two_choice`: the synthetic HotpotQA ``comparison`` and
2Wiki ``comparison``/``bridge_comparison`` styles, whose answer is one of two names in the
question) can be right by guessing; ``without_two_choice`` repeats the figures and the
comparison on the other questions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from algos.mechanism import QUESTION_SUBSETS_FILE, SKIP_FILE
from algos.report import read_metrics, save_figure
from benchmarks.metrics import by_dataset, summarize
from benchmarks.seed_stats import seed_interval
from benchmarks.table2.ablate import (
    RUN_FILE,
    TEACHER,
    VARIANT_SETTINGS,
    VARIANTS,
    read_run,
    run_name,
)
from benchmarks.table2.archive import (
    METRICS_FILE,
    RECORDS_FILE,
    RUNS_FILE,
    publish_table,
    restore_runs,
    write_gzip_jsonl,
)
from benchmarks.table2.stats import (
    REFERENCE,
    comparison,
    comparisons,
    is_two_choice,
    macro_avg,
    multiplicity,
    open_questions,
)
from envs.paths import contained

PLANTED = "planted"
"""The key of a seed's Teacher record (``run.json``) that was planted rather than trained by
Stage I (a recipe's Teacher known to be better, e.g. ``algos.recipes.micro.control``): how it
was made. Its lead is then measured in the workflow its record names (``workflow``)."""

FIGURES = ("macro_avg@k", "macro_pass@k", "macro_all_k", "macro_searches_per_workflow",
           "macro_invalid_turns_per_workflow", "invalid_rate_train", "macro_input_tokens_per_workflow",
           "macro_output_tokens_per_workflow")
"""A variant's figures in ``table2.json`` (each the mean over its seeds)."""

SUBSET_FIGURES = ("macro_avg@k", "macro_pass@k", "macro_all_k", "macro_searches_per_workflow")
"""A variant's figures on the questions that are not two-choice."""

ENDPOINTS = ("team/searches_per_workflow", "team/mixed_em_groups", "team/cov_searches_em")
"""Continuous per-step figures of a run's metrics.jsonl that ``table2.json`` keeps per run
(first and last value), when the run logged them: the sampled training rollouts' searches
per workflow, the share of groups whose R_EM varies and the within-group covariance of
searches with R_EM (:func:`algos.mechanism.outcome_signal`)."""

SKIP_ENDPOINT = "searchers/skip_probability"
"""A run's Searchers' probability of reporting without searching on their first turn, of its
starting (step 0) and final model, measured after training into
:data:`algos.mechanism.SKIP_FILE`."""


KL_FILE = "searcher_kl.json"
"""A run's Searchers' KL to its seed's Teacher on held-out rollouts, of its starting (step 0)
and final model, measured after training (``python -m algos.recipes.micro.control kl --out
DIR``; ``{"step0", "final", "final_step"}``)."""

KL_ENDPOINT = "searchers/kl_to_teacher"
"""The continuous endpoint read from :data:`KL_FILE`."""


def finished_runs(out: str | Path) -> dict[str, dict[int, dict[str, Any]]]:
    """``{variant: {seed: run record}}`` of the finished runs under ``out`` (an ablation's
    directory), the seeds' Teachers under ``teacher``; a run without its ``run.json`` is
    left out (not finished)."""
    out = Path(out)
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted(out.glob(f"seed*/*/{RUN_FILE}")):
        record = read_run(path.parent)
        if path.parent != out / run_name(record["seed"], record["variant"]):
            raise ValueError(f"{path}: the record names run {run_name(record['seed'], record['variant'])}, "
                             f"not {path.parent.relative_to(out)}")
        found.setdefault(record["variant"], {})[int(record["seed"])] = record
    return found


def validation_records(out: str | Path, record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-question records of a finished run's last validation (its ``run.json`` names
    them: the names stay inside the ablation's folder, ``envs.paths.contained``)."""
    run = contained(Path(out), record["run"], source=f"{out}/{record['run']}/{RUN_FILE}")
    path = contained(run, record["final_validation"], source=run / RUN_FILE)
    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"{path}: no per-question records")
    return rows


def seed_figures(records: Sequence[Mapping[str, Any]], metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One run's figures: Table 1's summary of its validation ``records`` plus invalid turns
    per workflow (macro) and the training rollouts' invalid-turn rate at the last step of
    ``metrics`` (its metrics.jsonl rows; NaN when none has it)."""
    summary = summarize(records)
    per = {}
    for name, rows in by_dataset(records).items():
        per[name] = float(np.mean([np.mean(r.get("invalid_turns", [0])) for r in rows]))
        summary["datasets"][name]["invalid_turns_per_workflow"] = per[name]
    summary["macro_invalid_turns_per_workflow"] = float(np.mean(list(per.values())))
    trained = [m for m in metrics if "team/invalid_rate" in m and isinstance(m.get("step"), int)]
    last = max(trained, key=lambda m: m["step"]) if trained else None
    summary["invalid_rate_train"] = float(last["team/invalid_rate"]) if last else float("nan")
    return summary


def first_validation(out: str | Path, record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-question records of a finished run's first validation (step 0: its start),
    or [] when it kept none."""
    files = sorted((Path(out) / record["run"] / "validation").glob("step_*.jsonl"))
    return read_metrics(files[0]) if files else []


def question_styles(config: Mapping[str, Any]) -> dict[tuple[str, str], str | None]:
    """(dataset, id) -> the question's style (``metadata["style"]``) for the validation
    questions a run's ``config`` names; {} when its data cannot be read here (a FlashRAG
    directory of another machine): then :func:`is_two_choice` reads the question itself."""
    from envs.data import load_qa

    styles: dict[tuple[str, str], str | None] = {}
    for name in config.get("val_datasets") or ():
        try:
            items = load_qa(name, config.get("val_split", "dev"), root=config.get("data", "synthetic"))
        except (OSError, ValueError):
            return {}
        styles.update({(name, str(q.id)): (q.metadata or {}).get("style") for q in items})
    return styles


def endpoints(metrics: Sequence[Mapping[str, Any]], run_dir: str | Path | None = None) -> dict[str, dict[str, float]]:
    """The first and last logged value of each of :data:`ENDPOINTS` a run's metrics hold; and
    the Searchers' skip probability of its starting and final model when the run's directory
    holds :data:`algos.mechanism.SKIP_FILE` (a recipe measures it after training, e.g. ``python -m
    algos.recipes.micro.mechanism --runs DIR``)."""
    out = {}
    for key in ENDPOINTS:
        series = _series(metrics, key)
        if series:
            out[key] = {"first_step": min(series), "first": series[min(series)],
                        "last_step": max(series), "last": series[max(series)]}
    kl = Path(run_dir) / KL_FILE if run_dir is not None else None
    if kl is not None and kl.is_file():
        measured = json.loads(kl.read_text(encoding="utf-8"))
        out[KL_ENDPOINT] = {"first_step": 0, "first": float(measured["step0"]),
                            "last_step": int(measured["final_step"]), "last": float(measured["final"])}
    skip = Path(run_dir) / SKIP_FILE if run_dir is not None else None
    if skip is not None and skip.is_file():
        measured = json.loads(skip.read_text(encoding="utf-8"))
        out[SKIP_ENDPOINT] = {"first_step": 0, "first": float(measured["step0"]),
                              "last_step": int(measured["final_step"]), "last": float(measured["final"])}
    return out


def build_table(out: str | Path, *, n_resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Table 2 of the ablation under ``out`` from its finished runs (see the module's
    docstring); a variant's comparison uses the seeds it and ``opd`` both finished. The
    per-question records it used are in ``table["_records"]`` (written by
    :func:`write_table2`, not into the JSON)."""
    out = Path(out)
    runs = finished_runs(out)
    plan = _read_plan(out)
    variants = [v for v in VARIANTS if v in runs]
    if not variants:
        raise ValueError(f"{out}: no finished Stage-II run (seed*/<variant>/{RUN_FILE}); run the ablation first")
    table: dict[str, Any] = {
        "preset": plan.get("preset"), "overrides": plan.get("overrides", {}),
        "seeds": sorted({s for v in variants for s in runs[v]}), "variants": variants,
        "base_seeds": plan.get("base_seeds"), "bases": plan.get("bases", {}),
        "planned_variants": plan.get("variants", variants),
        "reference": REFERENCE, "ci": {"confidence": 0.95, "n_resamples": n_resamples, "seed": seed,
                                       "unit": "question (its seeds pooled), resampled within each dataset"},
        "rows": {}, "teachers": {}, "runs": {},
    }
    styles: dict[str, dict[tuple[str, str], str | None]] = {}

    def styled(rows: list[dict[str, Any]], config: Mapping[str, Any]) -> list[dict[str, Any]]:
        key = json.dumps([config.get(k) for k in ("data", "val_split", "val_datasets")])
        if key not in styles:
            styles[key] = question_styles(config)
        return [{**r, "style": styles[key].get((r["dataset"], str(r["id"])))} for r in rows]

    everything = [(v, s, r) for v in [TEACHER, *variants] for s, r in sorted(runs.get(v, {}).items())]
    final = {(v, s): styled(validation_records(out, r), r.get("config", {})) for v, s, r in everything}
    first = {(v, s): styled(first_validation(out, r), r.get("config", {})) for v, s, r in everything}
    metrics = {r["run"]: read_metrics(out / r["run"] / "metrics.jsonl") for _, _, r in everything}
    records = {v: {s: final[v, s] for s in runs[v]} for v in variants}
    compared = comparisons(records, n_resamples=n_resamples, seed=seed)
    planted = bool(runs.get(TEACHER)) and all(PLANTED in r for r in runs[TEACHER].values())
    for v in variants:
        per_seed = {s: seed_figures(records[v][s], metrics[r["run"]]) for s, r in sorted(runs[v].items())}
        row: dict[str, Any] = {"searcher_signal": VARIANT_SETTINGS[v]["searcher_signal"],
                               "teacher": VARIANT_SETTINGS[v].get("teacher", PLANTED if planted else "stage-I"),
                               "seeds": sorted(per_seed), "k": min(f["k"] for f in per_seed.values())}
        for key in FIGURES:
            row[key] = float(np.mean([f[key] for f in per_seed.values()]))
        row["per_seed"] = {str(s): {key: f[key] for key in FIGURES} for s, f in per_seed.items()}
        row["datasets"] = {name: float(np.mean([f["datasets"][name]["avg@k"] for f in per_seed.values()]))
                           for name in per_seed[min(per_seed)]["datasets"]}
        if v in compared:
            row["vs_opd"] = compared[v]["vs_opd"]
        row["two_choice_questions"] = _two_choice_count(records[v])
        row["without_two_choice"] = _subset_figures(open_questions(records[v]))
        if v in compared:
            row["without_two_choice"]["vs_opd"] = compared[v]["without_two_choice"]
        table["rows"][v] = row
    for s, r in sorted(runs.get(TEACHER, {}).items()):
        table["teachers"][str(s)] = {"workflow": r.get("workflow", "cascade"), "val_avg@1": r["val_avg@1"]}
        if PLANTED in r:
            table["teachers"][str(s)][PLANTED] = r[PLANTED].get("how", True)
        if first[TEACHER, s]:  # the base it started from, on the same questions
            start = macro_avg(first[TEACHER, s])
            table["teachers"][str(s)].update({"base_avg@1": start, "lead": macro_avg(final[TEACHER, s]) - start})
    starts = {v: {s: first[v, s] for s in runs[v]} for v in variants}
    if subsets := question_subsets(out, records, starts, n_resamples=n_resamples, seed=seed):
        table["question_subsets"] = subsets
    leads = {s: t["lead"] for s, t in table["teachers"].items() if "lead" in t}
    if leads:
        table["teacher_lead"] = seed_interval(leads)
    table["bases"] = _bases_trained_from(table["bases"], [r for _, _, r in everything])
    table["multiplicity"] = multiplicity(table)
    for _, _, r in everything:
        cfg = r.get("config", {})
        table["runs"][r["run"]] = {"wall_s": r["wall_s"], "steps": r["steps"], "threads": r.get("threads"),
                                   "resumed": r.get("resumed"), "val_avg@1": r["val_avg@1"],
                                   **{k: cfg.get(k) for k in ("model", "retriever", "seed", "teacher",
                                                              "searcher_signal", "val_per_dataset",
                                                              "val_runs", "val_temperature")},
                                   **{k: r[k] for k in ("base_seed", "base_weight_hash", "step0_validation")
                                      if k in r}}
        if ends := endpoints(metrics[r["run"]], out / r["run"]):
            table["runs"][r["run"]]["endpoints"] = ends
    # how long the table took to train: every run's own wall time, summed (the bases' builds not included)
    table["runs_wall_s"] = round(sum(float(r["wall_s"]) for _, _, r in everything), 1)
    table["environment"] = _environment([r for _, _, r in everything])
    table["_records"] = [
        {"run": r["run"], "variant": v, "seed": s, "final": is_final, **row}
        for v, s, r in everything for is_final, rows in ((False, first[v, s]), (True, final[v, s])) for row in rows]
    table["_metrics"] = [{"run": name, **row} for name, rows in metrics.items() for row in rows]
    table["_runs"] = [{"run": r["run"], "record": r, "skip_probability": _read_json(out / r["run"] / SKIP_FILE)}
                      for _, _, r in everything]
    return table


def question_subsets(out: Path, final: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
                     start: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]], *,
                     n_resamples: int, seed: int) -> dict[str, Any]:
    """Every variant on each named set of validation questions that a recipe marked in
    ``out``'s :data:`algos.mechanism.QUESTION_SUBSETS_FILE` ({} when there is none): its
    :data:`SUBSET_FIGURES` at the end (``final``) and at step 0 (``start``: the base), and
    its comparison with ``opd`` on those questions. Raises ValueError naming the file when
    it is not such a set, or names questions no run validated."""
    path = out / QUESTION_SUBSETS_FILE
    if not path.exists():
        return {}
    try:
        marked = json.loads(path.read_text(encoding="utf-8"))
        keys = {name: {(str(d), str(i)) for d, i in spec["questions"]} for name, spec in marked.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        raise ValueError(f"{path}: not a set of named question lists ({type(err).__name__}: {err})") from None
    asked = {(r["dataset"], str(r["id"])) for rows in next(iter(final.values())).values() for r in rows}
    out_sets: dict[str, Any] = {}
    for name, wanted in keys.items():
        if unknown := sorted(wanted - asked):
            raise ValueError(f"{path}: set {name!r} names questions no run validated, e.g. {unknown[0]}")
        rows = {}
        for v, per_seed in final.items():
            rows[v] = {**_subset_figures(_only(per_seed, wanted)),
                       "start": _subset_figures(_only(start.get(v, {}), wanted))}
            if v != REFERENCE and set(per_seed) & set(final.get(REFERENCE, {})):
                rows[v]["vs_opd"] = comparison(_only(per_seed, wanted), _only(final[REFERENCE], wanted),
                                               n_resamples=n_resamples, seed=seed)
        out_sets[name] = {"about": str(marked[name].get("about", "")),
                          "questions": sorted([d, i] for d, i in wanted), "rows": rows}
    return out_sets


def _only(per_seed: Mapping[int, Sequence[Mapping[str, Any]]], keys: set[tuple[str, str]]
          ) -> dict[int, list[Mapping[str, Any]]]:
    """Each seed's records of the questions ``keys`` names ((dataset, id))."""
    return {s: [r for r in rows if (r["dataset"], str(r["id"])) in keys] for s, rows in per_seed.items()}


def _bases_trained_from(planned: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each seed's base as its finished runs recorded it (``base_seed``, ``base_weight_hash``,
    the config's ``model``) over what the plan says (``ablation.json`` names the base as built
    on the machine that continued the ablation, which for seeds restored from another machine
    may be other weights). Raises ValueError when the runs of one seed recorded different
    bases: their comparison would not share a start."""
    bases = {name: dict(base) for name, base in planned.items()}
    for seed in sorted({r["seed"] for r in records if r.get("base_weight_hash")}):
        found = {(r.get("base_seed"), r["base_weight_hash"], r.get("config", {}).get("model"))
                 for r in records if r["seed"] == seed and r.get("base_weight_hash")}
        if len(found) > 1:
            raise ValueError(f"the runs of seed {seed} recorded different bases (base seed, weights, path): "
                             f"{sorted(map(str, found))}")
        base_seed, weights, model = found.pop()
        bases[f"seed{seed}"] = {**bases.get(f"seed{seed}", {}), "base_seed": base_seed, "weight_hash": weights,
                                "model": model}
    return bases


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _two_choice_count(per_seed: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """How many of the questions (the first seed's; every seed asks the same) are two-choice,
    in all and per dataset."""
    rows = per_seed[min(per_seed)]
    datasets: dict[str, int] = {}
    for r in rows:
        datasets[r["dataset"]] = datasets.get(r["dataset"], 0) + is_two_choice(r)
    return {"questions": len(rows), "two_choice": sum(datasets.values()),
            "per_dataset": {d: n for d, n in datasets.items() if n}}


def _subset_figures(per_seed: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """:data:`SUBSET_FIGURES` (mean over seeds, and each seed's) of the given records."""
    summaries = {s: summarize(rows) for s, rows in sorted(per_seed.items()) if rows}
    if not summaries:
        return {}
    out: dict[str, Any] = {key: float(np.mean([f[key] for f in summaries.values()])) for key in SUBSET_FIGURES}
    out["per_seed"] = {str(s): {key: f[key] for key in SUBSET_FIGURES} for s, f in summaries.items()}
    return out


def _environment(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The environment the runs recorded (``run.json``'s ``environment``): one when they all
    agree, else ``{"differs": [{"environment": ..., "runs": [...]}, ...]}``, the runs grouped
    by the environment they ran in (None for runs that recorded none); None when none
    recorded one."""
    groups: list[dict[str, Any]] = []
    for r in records:
        env = r.get("environment") or None
        group = next((g for g in groups if g["environment"] == env), None)
        if group is None:
            groups.append(group := {"environment": env, "runs": []})
        group["runs"].append(r["run"])
    if all(g["environment"] is None for g in groups):
        return None
    return groups[0]["environment"] if len(groups) == 1 else {"differs": groups}


def machines(table: Mapping[str, Any]) -> str:
    """Which CPU the runs ran on (whole seeds named as seeds) and the library versions when
    they are the same everywhere: a run's figures repeat bit for bit only on the same CPU and
    versions. "" when the table recorded no environment."""
    env = table.get("environment")
    if not env:
        return ""
    groups = env["differs"] if "differs" in env else [{"environment": env, "runs": list(table.get("runs", {}))}]
    by_cpu: dict[str, list[str]] = {}
    for g in groups:
        e = g["environment"] or {}
        cpu = f"{e['cpu_model']} ({e.get('cpu_vendor')}, {e.get('cpu_capability')})" if e else "not recorded"
        by_cpu.setdefault(cpu, []).extend(g["runs"])
    seeds: dict[str, list[str]] = {}
    for run in table.get("runs", {}):
        seeds.setdefault(run.split("/")[0], []).append(run)

    def named(runs: list[str]) -> str:
        whole = [seed for seed, all_runs in seeds.items() if set(all_runs) <= set(runs)]
        rest = [r for r in runs if r.split("/")[0] not in whole]
        return ", ".join(whole + rest)

    text = "Machines: " + "; ".join(f"{cpu}: {named(runs)}" for cpu, runs in by_cpu.items()) + "."
    versions = {json.dumps((g["environment"] or {}).get("versions"), sort_keys=True) for g in groups}
    shown = json.loads(versions.pop()) if len(versions) == 1 else None
    if shown:
        return text + " Library versions in every run: " + ", ".join(f"{k} {v}" for k, v in shown.items()) + "."
    return text + " The library versions differ between runs (table2.json's environment lists them)."


def _read_plan(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / "ablation.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def markdown(table: Mapping[str, Any]) -> str:
    """Table 2 as markdown: accuracy in points (x100), costs per workflow, the comparison
    with ``opd`` by both intervals; the same without the two-choice questions (when the
    table has them); then avg@k per dataset and each run's wall time."""
    from benchmarks.suite import markdown_table

    rows = table["rows"]
    k = min(r["k"] for r in rows.values())
    seeds = table["seeds"]
    head = ["Variant", "Searcher signal", "Teacher", f"avg@{k}", f"pass@{k}", f"all-{k}",
            "vs opd, questions paired [95% CI]", "over seeds [95% t-CI]", "seeds +/-/= (p)", "searches",
            "invalid turns", "invalid rate (train)", "in tok", "out tok"]
    bases = table.get("bases", {})  # each seed's, as its runs recorded it (_bases_trained_from)
    hashes = sorted({str(bases[f"seed{s}"].get("weight_hash")) for s in seeds if f"seed{s}" in bases})
    lines = [f"Validation on the same held-out questions, mean over seeds {seeds} "
             f"(preset {table.get('preset')}, base weights {', '.join(hashes) or 'unrecorded'}); "
             "accuracy in points, costs per workflow.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, r in rows.items():
        cells = [v, r["searcher_signal"], r["teacher"], f"{100 * r['macro_avg@k']:.2f}",
                 f"{100 * r['macro_pass@k']:.2f}", f"{100 * r['macro_all_k']:.2f}", *_versus(r.get("vs_opd")),
                 f"{r['macro_searches_per_workflow']:.2f}", f"{r['macro_invalid_turns_per_workflow']:.2f}",
                 f"{100 * r['invalid_rate_train']:.1f}%", f"{r['macro_input_tokens_per_workflow']:.0f}",
                 f"{r['macro_output_tokens_per_workflow']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", INTERVALS]
    for text in (base_sharing(table), machines(table)):
        if text:
            lines += ["", text]
    if all(r.get("without_two_choice") for r in rows.values()):
        count = next(iter(rows.values()))["two_choice_questions"]
        lines += ["", f"Without the {count['two_choice']} two-choice questions of {count['questions']} "
                  f"({', '.join(f'{d} {n}' for d, n in count['per_dataset'].items()) or 'none'}):", "",
                  f"| Variant | avg@{k} | vs opd, questions paired [95% CI] | over seeds [95% t-CI] | "
                  "seeds +/-/= (p) | searches |", "|---|---|---|---|---|---|"]
        for v, r in rows.items():
            sub = r["without_two_choice"]
            lines.append("| " + " | ".join([v, f"{100 * sub['macro_avg@k']:.2f}", *_versus(sub.get("vs_opd")),
                                             f"{sub['macro_searches_per_workflow']:.2f}"]) + " |")
    lines += subset_lines(table, k) + multiplicity_lines(table) + behaviour(table) + teacher_lead(table)
    per_dataset = [(v, {"datasets": {n: {"avg@k": a} for n, a in r["datasets"].items()}, "k": r["k"],
                        **{key: r[key] for key in FIGURES}}) for v, r in rows.items()]
    lines += ["", f"avg@{k} per dataset (mean over seeds):", "", markdown_table(per_dataset)]
    walls = table["runs"]
    if walls:
        lines += ["", "Wall time per run: " + ", ".join(f"{name} {_duration(w['wall_s'])}"
                                                      for name, w in walls.items())]
    return "\n".join(lines) + "\n"


def subset_lines(table: Mapping[str, Any], k: int) -> list[str]:
    """Markdown lines: each variant on each of the table's ``question_subsets``, step 0 (its
    base) -> final, with its comparison with ``opd`` there."""
    lines: list[str] = []
    for name, subset in table.get("question_subsets", {}).items():
        lines += ["", f"On the {len(subset['questions'])} questions {subset['about']} (`{name}`), "
                  "step 0 -> final:", "",
                  f"| Variant | avg@{k} | vs opd, questions paired [95% CI] | over seeds [95% t-CI] | "
                  "seeds +/-/= (p) | searches |", "|---|---|---|---|---|---|"]
        for v, r in subset["rows"].items():
            steps = [f for f in (r.get("start"), r) if f]
            accuracy = " -> ".join(f"{100 * f['macro_avg@k']:.2f}" for f in steps)
            searches = " -> ".join(f"{f['macro_searches_per_workflow']:.2f}" for f in steps)
            lines.append("| " + " | ".join([v, accuracy, *_versus(r.get("vs_opd")), searches]) + " |")
    return lines


def multiplicity_lines(table: Mapping[str, Any]) -> list[str]:
    """Markdown lines: how many comparisons the table makes, and each one's p-values over
    seeds (t-test, sign test), raw and Holm-adjusted over the headline comparisons and over
    all of them (:func:`multiplicity`, computed from the table itself, so a table written
    before it existed renders it too); then, with fewer bases than seeds, the headline
    comparisons with the bases as the unit. None when the table compares nothing."""
    found = multiplicity(table)
    if not found["comparisons"]:
        return []
    families = found["families"]
    sets = list(dict.fromkeys(c["questions"] for c in found["comparisons"]))

    def p(value: float | None) -> str:
        return "-" if value is None else f"{value:.2g}"

    one = families["headline"] == families["all"]  # every comparison is on all questions
    over = (f"over the {families['all']}" if one else
            f"over the {families['headline']} on all questions and over all {families['all']}")
    lines = ["", f"Multiplicity: this table makes {families['all']} comparisons with {REFERENCE} "
             f"({len(sets)} question set{'s' * (len(sets) > 1)}: {', '.join(sets)}), each tested over seeds "
             f"twice (the t-test of the t-interval, the sign test). p-values raw and Holm-adjusted, {over}:", ""]
    adjusted = [f"Holm, {families['all']}"] if one else [f"Holm, {families['headline']}", f"Holm, {families['all']}"]
    head = ["comparison", "t p", *adjusted, "sign p", *adjusted]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in found["comparisons"]:
        first = c["holm_headline"] or {}
        cells = [c["comparison"], p(c["t_p"]), *([] if one else [p(first.get("t"))]), p(c["holm_all"]["t"]),
                 p(c["sign_p"]), *([] if one else [p(first.get("sign"))]), p(c["holm_all"]["sign"])]
        lines.append("| " + " | ".join(cells) + " |")
    if bases := found.get("over_bases"):
        n = next(iter(bases.values()))["bases"]
        lines += ["", f"With the {n} bases as the unit (each base's seeds averaged; seeds that share a base are "
                  "not independent in its draw), on all questions:", "",
                  f"| comparison | mean | over bases [95% t-CI] | t p | Holm, {len(bases)} |", "|---|---|---|---|---|"]
        for v, b in bases.items():
            ci = b["interval"]
            lines.append(f"| {v} - {REFERENCE} | {100 * ci['mean']:+.2f} | "
                         f"[{100 * ci['low']:+.2f}, {100 * ci['high']:+.2f}] | {p(b['t_p'])} | "
                         f"{p(b['holm_headline_t'])} |")
    return lines


BEHAVIOUR = (("team/searches_per_workflow", "sampled searches"), (SKIP_ENDPOINT, "skip probability"),
             ("team/mixed_em_groups", "mixed-R_EM groups"), ("team/cov_searches_em", "cov(searches, R_EM)"),
             (KL_ENDPOINT, "Searchers' KL to the Teacher"))
"""The continuous endpoints :func:`behaviour` shows, with their column names."""


def behaviour(table: Mapping[str, Any]) -> list[str]:
    """Markdown lines: per variant (the Teachers first), the mean over its seeds of each
    continuous endpoint's first and last value (:func:`endpoints`); none when no run has one."""
    by_variant: dict[str, list[Mapping[str, Any]]] = {}
    for name, run in table.get("runs", {}).items():
        by_variant.setdefault(name.split("/", 1)[1], []).append(run.get("endpoints") or {})
    keys = [(key, label) for key, label in BEHAVIOUR if any(key in e for ends in by_variant.values() for e in ends)]
    if not keys:
        return []
    kl = ("; Searchers' KL to the Teacher: per token they generated, on held-out dev rollouts, starting and "
          "final model" if any(key == KL_ENDPOINT for key, _ in keys) else "")
    lines = ["", "Behaviour, mean over seeds, first -> last value (sampled searches, mixed groups and the "
             "covariance: the training rollouts' first and last step; skip probability: the Searchers' "
             f"first turn on dev contexts, starting and final model{kl}):", "",
             "| Run | " + " | ".join(label for _, label in keys) + " |", "|---|" + "---|" * len(keys)]
    for variant in [TEACHER, *table["rows"]]:
        ends = by_variant.get(variant, [])
        cells = []
        for key, _ in keys:
            have = [e[key] for e in ends if key in e]
            cells.append(f"{np.mean([h['first'] for h in have]):.3f} -> {np.mean([h['last'] for h in have]):.3f}"
                         if have else "-")
        if ends:
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return lines


def teacher_lead(table: Mapping[str, Any]) -> list[str]:
    """Markdown lines: each seed's Stage-I Teacher against the base it started from (greedy,
    cascade, the same questions) and the mean lead with its interval over seeds; none when
    the table has no Teacher's start (tables from before it was kept)."""
    lead = table.get("teacher_lead")
    if not lead:
        return []
    teachers = table["teachers"]
    seeds = "; ".join(f"seed {s} {100 * t['base_avg@1']:.2f} -> {100 * (t['base_avg@1'] + t['lead']):.2f} "
                      f"({100 * t['lead']:+.2f})"
                      for s, t in teachers.items() if "lead" in t)
    interval = (f"[95% t-CI {100 * lead['low']:+.2f}, {100 * lead['high']:+.2f}]" if lead["low"] is not None
                else "(one seed: no interval)")
    if any(PLANTED in t for t in teachers.values()):
        how = sorted({str(t[PLANTED]) for t in teachers.values() if PLANTED in t})
        workflows = sorted({t["workflow"] for t in teachers.values()})
        return ["", f"Planted Teachers ({'; '.join(how)}) against the base each was made from "
                f"({', '.join(workflows)}, greedy, points): {seeds}. Mean lead {100 * lead['mean']:+.2f} {interval}: "
                "the accuracy OPD has to pass on."]
    return ["", f"Stage-I Teachers against the base each started from (cascade, greedy, points): {seeds}. "
            f"Mean lead {100 * lead['mean']:+.2f} {interval}: the accuracy OPD has to pass on."]


def base_sharing(table: Mapping[str, Any]) -> str:
    """Which seeds start from which base (by base seed and weights), and, when a base is
    shared, that those seeds are not independent in its draw; "" when the table's plan
    records no base seeds (a table from before ``--base-seeds``)."""
    seeds = [int(s) for s in table.get("seeds", [])]
    bases = {s: table.get("bases", {}).get(f"seed{s}") or {} for s in seeds}
    if not seeds or any("base_seed" not in b for b in bases.values()):
        return ""
    groups: dict[tuple[Any, Any], list[int]] = {}
    for s in seeds:
        groups.setdefault((bases[s]["base_seed"], bases[s].get("weight_hash")), []).append(s)
    listed = "; ".join(f"base seed {b} (weights {h or 'unhashed'}): seed{'s' if len(ss) > 1 else ''} "
                       f"{', '.join(map(str, ss))}" for (b, h), ss in sorted(groups.items(), key=lambda g: g[1]))
    text = f"Bases: {listed}."
    if any(len(ss) > 1 for ss in groups.values()):
        text += (f" {len(seeds)} training seeds share {len(groups)} bases: the figures and the interval over "
                 "seeds take each training seed as a unit, but seeds that share a base are not independent in "
                 "the base's draw, so the interval over seeds covers the training seeds' variation around these "
                 f"{len(groups)} bases, not a new base's.")
    return text


INTERVALS = ("Questions paired: the bootstrap over questions with the runs fixed (would these runs "
             "differ on new questions?). Over seeds: a Student-t interval over the per-seed differences "
             "and the exact sign test over seeds (seeds better/worse/tied; does the training recipe "
             "differ?).")
"""The legend of the two intervals under every rendered table."""


def _versus(ci: Mapping[str, Any] | None) -> list[str]:
    """The comparison's cells: the difference with the question-paired interval, the
    interval over seeds, and the seeds' signs with the sign test's p (points)."""
    if ci is None:
        return ["-", "-", "-"]
    paired, over = ci["questions_paired"], ci["over_seeds"]
    seeds = (f"[{100 * over['low']:+.2f}, {100 * over['high']:+.2f}]" if over["low"] is not None
             else "one seed: none")
    sign = over["sign_test"]
    return [f"{100 * ci['difference']:+.2f} [{100 * paired['low']:+.2f}, {100 * paired['high']:+.2f}]", seeds,
            f"{sign['better']}/{sign['worse']}/{sign['ties']} (p = {sign['p_value']:.2g})"]


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def plot_curves(out: str | Path, variants: Sequence[str], png: str | Path) -> Path:
    """Validation avg@1 and searches per workflow against the step, one colour per variant
    (mean over its finished seeds, each seed a thin line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    runs = finished_runs(out)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    panels = ((axes[0], "val/avg@1", "validation avg@1", "o", "-"),
              (axes[1], "team/searches_per_workflow", "searches per workflow (line: training rollouts; "
               "dashed, dots: validation)", None, "-"),
              (axes[1], VAL_SEARCHES, "", "o", "--"))
    for i, v in enumerate(variants):
        colour = f"C{i}"
        for ax, key, _, marker, style in panels:
            series = [_series(read_metrics(out / r["run"] / "metrics.jsonl"), key) if key != VAL_SEARCHES
                      else validation_searches(out / r["run"]) for r in runs.get(v, {}).values()]
            series = [s for s in series if s]
            for s in series if len(series) > 1 else ():
                ax.plot(*zip(*sorted(s.items())), color=colour, alpha=0.25, lw=0.8, marker=marker, ms=2)
            steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
            if steps:
                ax.plot(steps, [np.mean([s[t] for s in series]) for t in steps], color=colour, lw=1.8,
                        ls=style, marker=marker, ms=4, label=None if key == VAL_SEARCHES else v)
    for ax, _, title, _, _ in panels[:2]:
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
    return save_figure(fig, [ax for ax, *_ in panels[:2]], png)


VAL_SEARCHES = "validation searches"


def validation_searches(run_dir: Path) -> dict[int, float]:
    """Step -> macro searches per workflow of each validation of a run (the same questions
    every time, so a collapse of search shows without rollout noise)."""
    out = {}
    for path in sorted((run_dir / "validation").glob("step_*.jsonl")):
        rows = read_metrics(path)
        if rows:
            out[int(path.stem.split("_")[1])] = float(summarize(rows)["macro_searches_per_workflow"])
    return out


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> dict[int, float]:
    return {int(r["step"]): float(r[key]) for r in rows if key in r and isinstance(r.get("step"), int)}


def write_table2(out: str | Path, *, n_resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Write ``table2.json``, ``table2.md``, ``curves.png``, :data:`RECORDS_FILE` and
    :data:`METRICS_FILE` into ``out``; returns the table (as ``table2.json`` holds it)."""
    out = Path(out)
    table = build_table(out, n_resamples=n_resamples, seed=seed)
    write_gzip_jsonl(out / RECORDS_FILE, table.pop("_records"))
    write_gzip_jsonl(out / METRICS_FILE, table.pop("_metrics"))
    write_gzip_jsonl(out / RUNS_FILE, table.pop("_runs"))
    table["records"], table["metrics"], table["run_records"] = RECORDS_FILE, METRICS_FILE, RUNS_FILE
    table["curves_png"] = str(plot_curves(out, table["variants"], out / "curves.png").name)
    for name, text in (("table2.json", json.dumps(table, indent=2) + "\n"), ("table2.md", markdown(table))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
    return table


# ---------------------------------------------------------------------- command line


def ablate_command(args: Any) -> int:
    """``python -m benchmarks ablate``: run (or finish) the ablation, then write its table."""
    from algos.preflight import PreflightError
    from algos.runlock import RunLockedError
    from benchmarks.table2.ablate import check_ablation, overrides_of, run_ablation, seeds_of

    try:  # settings refused before anything loads, builds or trains: one line
        seeds = seeds_of(args)
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        overrides = overrides_of(args)
        check_ablation(args.preset, args.out, seeds, variants, overrides, base_seeds=args.base_seeds,
                       threads=args.threads, jobs=args.jobs)
    except (ValueError, PreflightError) as err:
        raise SystemExit(f"python -m benchmarks ablate: error: {err}") from None
    try:
        run_ablation(args.preset, args.out, seeds, variants, overrides, base_seeds=args.base_seeds,
                     threads=args.threads, jobs=args.jobs, progress=not args.no_progress)
    except RunLockedError as err:  # nothing was trained or written
        raise SystemExit(f"python -m benchmarks ablate: error: {err}") from None
    return table_command(args)


def table_command(args: Any) -> int:
    """``python -m benchmarks table2 OUT``: (re)write the table of the runs finished so far;
    with ``--restore TABLE_JSON``, first put that table's runs back into OUT (:func:`restore_runs`)."""
    if args.out is None:
        raise SystemExit("python -m benchmarks table2: error: give the ablation's directory (or --render-docs)")
    if getattr(args, "restore", None):
        try:
            restored = restore_runs(args.restore, args.out)
        except ValueError as err:
            raise SystemExit(f"python -m benchmarks table2: error: {err}") from None
        print(f"restored {len(restored)} finished runs from {args.restore} into {args.out}: {', '.join(restored) or '-'}")
    try:
        write_table2(args.out, n_resamples=args.resamples)
    except ValueError as err:
        raise SystemExit(f"python -m benchmarks table2: error: {err}") from None
    print((Path(args.out) / "table2.md").read_text(encoding="utf-8"))
    print(f"wrote {Path(args.out) / 'table2.json'}, table2.md and curves.png")
    if getattr(args, "publish", None):
        try:
            written = publish_table(args.out, args.publish)
        except ValueError as err:
            raise SystemExit(f"python -m benchmarks table2: error: {err}") from None
        print(f"published {', '.join(p.name for p in written)} into {args.publish}; "
              f"then: python -m benchmarks table2 --render-docs")
    return 0
