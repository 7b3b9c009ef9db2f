"""The paper's Table 2 from an ablation's runs (``benchmarks.ablate``): per Searcher-signal
variant the validation figures (macro over the datasets, mean over seeds), the paired
bootstrap 95% CI of each variant's macro difference to ``opd``, and the curves.

    python -m benchmarks ablate --preset micro --seeds 3 --out runs/table2   # train, then this
    python -m benchmarks table2 runs/table2                                  # this alone

Writes into the ablation's directory:

- ``table2.json``: the seeds, the variants, each variant's figures (mean over seeds and per
  seed), its CI against ``opd``, each run's wall time and config (retriever, model, seed);
- ``table2.md``: the table, then avg@k per dataset;
- ``curves.png``: validation avg@1 against the step for every variant (the paper's
  Figure 3) and searches per workflow against the step (the collapse signature).

Figures come from each run's last validation (the same held-out questions for every run),
except the invalid-turn rate, which the validation records do not carry: it is the training
rollouts' rate at the last step (``team/invalid_rate``). A variant's figure is the mean of
its seeds' figures; each seed's figure is a macro over the datasets (Table 1's metrics,
:func:`benchmarks.metrics.summarize`).

The CI (:func:`benchmarks.metrics.paired_macro_difference`, as ``benchmarks compare``):
questions are paired by (dataset, id) and resampled within each dataset; a question's value
is its correctness averaged over the seeds (and the k runs) that both variants finished.
Every seed asks the same questions, so a question is resampled with all its seeds at once:
treating (question, seed) pairs as independent would understate the interval. The point
estimate equals the difference of the two variants' mean macro avg@k.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from algos.report import read_metrics, save_figure
from benchmarks.ablate import RUN_FILE, TEACHER, VARIANT_SETTINGS, VARIANTS, read_run, run_name
from benchmarks.metrics import paired_macro_difference, summarize

REFERENCE = "opd"
"""The variant every other one is compared with."""

FIGURES = ("macro_avg@k", "macro_pass@k", "macro_all_k", "macro_searches_per_workflow",
           "macro_invalid_turns_per_workflow", "invalid_rate_train", "macro_input_tokens_per_workflow",
           "macro_output_tokens_per_workflow")
"""A variant's figures in ``table2.json`` (each the mean over its seeds)."""


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
    """The per-question records of a finished run's last validation."""
    path = Path(out) / record["run"] / record["final_validation"]
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
    for name, rows in _by_dataset(records).items():
        per[name] = float(np.mean([np.mean(r.get("invalid_turns", [0])) for r in rows]))
        summary["datasets"][name]["invalid_turns_per_workflow"] = per[name]
    summary["macro_invalid_turns_per_workflow"] = float(np.mean(list(per.values())))
    trained = [m for m in metrics if "team/invalid_rate" in m and isinstance(m.get("step"), int)]
    last = max(trained, key=lambda m: m["step"]) if trained else None
    summary["invalid_rate_train"] = float(last["team/invalid_rate"]) if last else float("nan")
    return summary


def _by_dataset(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        out.setdefault(r["dataset"], []).append(r)
    return out


def pooled_over_seeds(per_seed: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One record per question whose ``correct`` holds every seed's runs (seeds in order):
    the unit the CI resamples. Raises ValueError when the seeds asked different questions."""
    pooled: dict[tuple[str, str], dict[str, Any]] = {}
    keys = None
    for seed in sorted(per_seed):
        mine = {(r["dataset"], str(r["id"])): r for r in per_seed[seed]}
        if keys is not None and set(mine) != keys:
            raise ValueError(f"seed {seed} validated other questions than the seeds before it")
        keys = set(mine)
        for key, r in mine.items():
            pooled.setdefault(key, {"dataset": key[0], "id": key[1], "correct": []})["correct"] += list(r["correct"])
    return list(pooled.values())


def build_table(out: str | Path, *, n_resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Table 2 of the ablation under ``out`` from its finished runs (see the module's
    docstring); a variant's CI uses the seeds it and ``opd`` both finished."""
    out = Path(out)
    runs = finished_runs(out)
    plan = _read_plan(out)
    variants = [v for v in VARIANTS if v in runs]
    if not variants:
        raise ValueError(f"{out}: no finished Stage-II run (seed*/<variant>/{RUN_FILE}); run the ablation first")
    table: dict[str, Any] = {
        "preset": plan.get("preset"), "overrides": plan.get("overrides", {}),
        "seeds": sorted({s for v in variants for s in runs[v]}), "variants": variants,
        "bases": plan.get("bases", {}),
        "reference": REFERENCE, "ci": {"confidence": 0.95, "n_resamples": n_resamples, "seed": seed,
                                       "unit": "question (its seeds pooled), resampled within each dataset"},
        "rows": {}, "teachers": {}, "runs": {},
    }
    records = {v: {s: validation_records(out, r) for s, r in runs[v].items()} for v in variants}
    for v in variants:
        per_seed = {s: seed_figures(records[v][s], read_metrics(out / r["run"] / "metrics.jsonl"))
                    for s, r in sorted(runs[v].items())}
        row: dict[str, Any] = {"searcher_signal": VARIANT_SETTINGS[v]["searcher_signal"],
                               "teacher": VARIANT_SETTINGS[v].get("teacher", "stage-I"),
                               "seeds": sorted(per_seed), "k": min(f["k"] for f in per_seed.values())}
        for key in FIGURES:
            row[key] = float(np.mean([f[key] for f in per_seed.values()]))
        row["per_seed"] = {str(s): {key: f[key] for key in FIGURES} for s, f in per_seed.items()}
        row["datasets"] = {name: float(np.mean([f["datasets"][name]["avg@k"] for f in per_seed.values()]))
                           for name in per_seed[min(per_seed)]["datasets"]}
        shared = sorted(set(runs[v]) & set(runs.get(REFERENCE, {})))
        if v != REFERENCE and shared:
            ci = paired_macro_difference(pooled_over_seeds({s: records[v][s] for s in shared}),
                                         pooled_over_seeds({s: records[REFERENCE][s] for s in shared}),
                                         n_resamples=n_resamples, seed=seed)
            ci["seeds"] = shared
            ci["per_seed"] = {str(s): per_seed[s]["macro_avg@k"] - _macro_avg(records[REFERENCE][s])
                              for s in shared}
            row["vs_opd"] = ci
        table["rows"][v] = row
    for s, r in sorted(runs.get(TEACHER, {}).items()):
        table["teachers"][str(s)] = {"workflow": "cascade", "val_avg@1": r["val_avg@1"]}
    for v in [TEACHER, *variants]:
        for _, r in sorted(runs.get(v, {}).items()):
            cfg = r.get("config", {})
            table["runs"][r["run"]] = {"wall_s": r["wall_s"], "steps": r["steps"], "threads": r.get("threads"),
                                       "resumed": r.get("resumed"), "val_avg@1": r["val_avg@1"],
                                       **{k: cfg.get(k) for k in ("model", "retriever", "seed", "teacher",
                                                                  "searcher_signal", "val_per_dataset",
                                                                  "val_runs", "val_temperature")}}
    return table


def _macro_avg(records: Sequence[Mapping[str, Any]]) -> float:
    return float(summarize(records)["macro_avg@k"])


def _read_plan(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / "ablation.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def markdown(table: Mapping[str, Any]) -> str:
    """Table 2 as markdown: accuracy in points (x100), costs per workflow; then avg@k per dataset."""
    from benchmarks.suite import markdown_table

    rows = table["rows"]
    k = min(r["k"] for r in rows.values())
    seeds = table["seeds"]
    head = ["Variant", "Searcher signal", "Teacher", f"avg@{k}", f"pass@{k}", f"all-{k}",
            "vs opd [95% CI]", "searches", "invalid turns", "invalid rate (train)", "in tok", "out tok"]
    hashes = sorted({str(b.get("weight_hash")) for b in table.get("bases", {}).values()})
    lines = [f"Validation on the same held-out questions, mean over seeds {seeds} "
             f"(preset {table.get('preset')}, base weights {', '.join(hashes) or 'unrecorded'}); "
             "accuracy in points, costs per workflow.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, r in rows.items():
        ci = r.get("vs_opd")
        versus = "-" if ci is None else (f"{100 * ci['difference']:+.2f} [{100 * ci['low']:+.2f}, "
                                         f"{100 * ci['high']:+.2f}]")
        cells = [v, r["searcher_signal"], r["teacher"], f"{100 * r['macro_avg@k']:.2f}",
                 f"{100 * r['macro_pass@k']:.2f}", f"{100 * r['macro_all_k']:.2f}", versus,
                 f"{r['macro_searches_per_workflow']:.2f}", f"{r['macro_invalid_turns_per_workflow']:.2f}",
                 f"{100 * r['invalid_rate_train']:.1f}%", f"{r['macro_input_tokens_per_workflow']:.0f}",
                 f"{r['macro_output_tokens_per_workflow']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    per_dataset = [(v, {"datasets": {n: {"avg@k": a} for n, a in r["datasets"].items()}, "k": r["k"],
                        **{key: r[key] for key in FIGURES}}) for v, r in rows.items()]
    lines += ["", f"avg@{k} per dataset (mean over seeds):", "", markdown_table(per_dataset)]
    walls = table["runs"]
    if walls:
        lines += ["", "Wall time per run: " + ", ".join(f"{name} {_duration(w['wall_s'])}"
                                                      for name, w in walls.items())]
    return "\n".join(lines) + "\n"


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
    """Write ``table2.json``, ``table2.md`` and ``curves.png`` into ``out``; returns the table."""
    out = Path(out)
    table = build_table(out, n_resamples=n_resamples, seed=seed)
    table["curves_png"] = str(plot_curves(out, table["variants"], out / "curves.png").name)
    for name, text in (("table2.json", json.dumps(table, indent=2)), ("table2.md", markdown(table))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
    return table


# ---------------------------------------------------------------------- command line


def ablate_command(args: Any) -> int:
    """``python -m benchmarks ablate``: run (or finish) the ablation, then write its table."""
    from algos.preflight import PreflightError
    from benchmarks.ablate import check_ablation, overrides_of, run_ablation, seeds_of

    try:  # settings refused before anything loads, builds or trains: one line
        seeds = seeds_of(args)
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        overrides = overrides_of(args)
        check_ablation(args.preset, args.out, seeds, variants, overrides, threads=args.threads, jobs=args.jobs)
    except (ValueError, PreflightError) as err:
        raise SystemExit(f"python -m benchmarks ablate: error: {err}") from None
    run_ablation(args.preset, args.out, seeds, variants, overrides, threads=args.threads, jobs=args.jobs,
                 progress=not args.no_progress)
    return table_command(args)


def table_command(args: Any) -> int:
    """``python -m benchmarks table2 OUT``: (re)write the table of the runs finished so far."""
    try:
        write_table2(args.out, n_resamples=args.resamples)
    except ValueError as err:
        raise SystemExit(f"python -m benchmarks table2: error: {err}") from None
    print((Path(args.out) / "table2.md").read_text(encoding="utf-8"))
    print(f"wrote {Path(args.out) / 'table2.json'}, table2.md and curves.png")
    return 0
