"""The paper's Table 2 from an ablation's finished runs: :func:`build_table` builds what
``table2.json`` holds (per variant the last validation's figures, mean over seeds, and the
comparisons with ``opd``); docs/table2.md ("What it writes") says what each figure is."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from algos.mechanism import QUESTION_SUBSETS_FILE, SKIP_FILE
from algos.report import read_metrics
from benchmarks.metrics import by_dataset, summarize
from benchmarks.seed_stats import seed_interval
from benchmarks.table2.runs import RUN_FILE, TEACHER, VARIANT_SETTINGS, VARIANTS, read_run, run_name
from benchmarks.table2.stats import (
    REFERENCE,
    comparison,
    comparisons,
    is_two_choice,
    macro_avg,
    multiplicity,
    open_questions,
)
from envs.data import load_qa
from envs.paths import contained

PLANTED = "planted"
"""The key of a Teacher's ``run.json`` that a recipe planted rather than Stage I trained (e.g.
``algos.recipes.micro.control``): how it was made."""

FIGURES = ("macro_avg@k", "macro_pass@k", "macro_all_k", "macro_searches_per_workflow",
           "macro_invalid_turns_per_workflow", "invalid_rate_train", "macro_input_tokens_per_workflow",
           "macro_output_tokens_per_workflow")
"""A variant's figures in ``table2.json`` (each the mean over its seeds)."""

SUBSET_FIGURES = ("macro_avg@k", "macro_pass@k", "macro_all_k", "macro_searches_per_workflow")
"""A variant's figures on the questions that are not two-choice."""

ENDPOINTS = ("team/searches_per_workflow", "team/mixed_em_groups", "team/cov_searches_em")
"""Per-step figures of a run's metrics.jsonl that ``table2.json`` keeps (first and last value)
when the run logged them (:func:`algos.mechanism.outcome_signal`)."""

SKIP_ENDPOINT = "searchers/skip_probability"
"""The Searchers' first-turn probability of reporting without searching, of the starting and
final model (measured after training into :data:`algos.mechanism.SKIP_FILE`)."""

KL_FILE = "searcher_kl.json"
"""The Searchers' KL to the seed's Teacher of the starting and final model, measured after
training (``python -m algos.recipes.micro.control kl``; ``{"step0", "final", "final_step"}``)."""

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
    trained = metric_series(metrics, "team/invalid_rate")
    summary["invalid_rate_train"] = trained[max(trained)] if trained else float("nan")
    return summary


def first_validation(out: str | Path, record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-question records of a finished run's step-0 validation, or [] when it kept none."""
    files = sorted((Path(out) / record["run"] / "validation").glob("step_*.jsonl"))
    return read_metrics(files[0]) if files else []


def question_styles(config: Mapping[str, Any]) -> dict[tuple[str, str], str | None]:
    """(dataset, id) -> the question's style (``metadata["style"]``) for the validation
    questions a run's ``config`` names; {} when its data cannot be read here (a FlashRAG
    directory of another machine): then :func:`is_two_choice` reads the question itself."""
    styles: dict[tuple[str, str], str | None] = {}
    for name in config.get("val_datasets") or ():
        try:
            items = load_qa(name, config.get("val_split", "dev"), root=config.get("data", "synthetic"))
        except (OSError, ValueError):
            return {}
        styles.update({(name, str(q.id)): (q.metadata or {}).get("style") for q in items})
    return styles


def endpoints(metrics: Sequence[Mapping[str, Any]], run_dir: str | Path | None = None) -> dict[str, dict[str, float]]:
    """The first and last logged value of each of :data:`ENDPOINTS` a run's metrics hold, and
    those of :data:`KL_FILE` and :data:`algos.mechanism.SKIP_FILE` when ``run_dir`` has them."""
    out = {}
    for key in ENDPOINTS:
        series = metric_series(metrics, key)
        if series:
            out[key] = {"first_step": min(series), "first": series[min(series)],
                        "last_step": max(series), "last": series[max(series)]}
    for key, name in ((KL_ENDPOINT, KL_FILE), (SKIP_ENDPOINT, SKIP_FILE)):  # measured after training
        if run_dir is not None and (path := Path(run_dir) / name).is_file():
            measured = json.loads(path.read_text(encoding="utf-8"))
            out[key] = {"first_step": 0, "first": float(measured["step0"]),
                        "last_step": int(measured["final_step"]), "last": float(measured["final"])}
    return out


def metric_series(rows: Sequence[Mapping[str, Any]], key: str) -> dict[int, float]:
    """Step -> the value of ``key`` in a run's metrics rows that log it."""
    return {int(r["step"]): float(r[key]) for r in rows if key in r and isinstance(r.get("step"), int)}


def build_table(out: str | Path, *, n_resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Table 2 of the ablation under ``out`` from its finished runs; a comparison uses the seeds
    both variants finished. What it read is in ``table["_records"]``, ``["_metrics"]`` and
    ``["_run_records"]`` (archived by :func:`benchmarks.table2.render.write_table2`)."""
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
    table["_run_records"] = [{"run": r["run"], "record": r, "skip_probability": _read_json(out / r["run"] / SKIP_FILE)}
                      for _, _, r in everything]
    return table


def question_subsets(out: Path, final: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]],
                     start: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]], *,
                     n_resamples: int, seed: int) -> dict[str, Any]:
    """Every variant on each set of questions marked in ``out``'s
    :data:`algos.mechanism.QUESTION_SUBSETS_FILE` ({} without one): its :data:`SUBSET_FIGURES`
    at the end and at step 0, and its comparison with ``opd``. Raises ValueError naming the
    file when it is not such a set, or names questions no run validated."""
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
    """Each seed's base as its finished runs recorded it, over what the plan says (which for
    seeds restored from another machine may be other weights). Raises ValueError when the
    runs of one seed recorded different bases: their comparison would not share a start."""
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
    """How many of the (first seed's) questions are two-choice, in all and per dataset."""
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
    """The ``environment`` the runs recorded: one when they all agree, else ``{"differs":
    [{"environment": ..., "runs": [...]}, ...]}``; None when none recorded one."""
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


def _read_plan(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / "ablation.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
