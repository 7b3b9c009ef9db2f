"""Table 2 written out (:mod:`benchmarks.table2.table` builds it): ``table2.md`` (:func:`markdown`),
``curves.png`` (:func:`plot_curves`), and :func:`write_table2`, which writes them with
``table2.json`` and its archives (:mod:`benchmarks.table2.archive`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from algos.report import read_metrics, save_figure
from benchmarks.metrics import summarize
from benchmarks.table2.archive import METRICS_FILE, RECORDS_FILE, RUNS_FILE, write_gzip_jsonl
from benchmarks.table2.runs import TEACHER, write_atomically
from benchmarks.table2.stats import REFERENCE, multiplicity
from benchmarks.table2.table import (
    FIGURES,
    KL_ENDPOINT,
    PLANTED,
    SKIP_ENDPOINT,
    build_table,
    finished_runs,
    metric_series,
)


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
        lines += subset_lines(f"Without the {count['two_choice']} two-choice questions of {count['questions']} "
                              f"({', '.join(f'{d} {n}' for d, n in count['per_dataset'].items()) or 'none'}):",
                              {v: r["without_two_choice"] for v, r in rows.items()}, k)
    for name, subset in table.get("question_subsets", {}).items():
        lines += subset_lines(f"On the {len(subset['questions'])} questions {subset['about']} (`{name}`), "
                              "step 0 -> final:", subset["rows"], k)
    lines += multiplicity_lines(table) + behaviour(table) + teacher_lead(table)
    per_dataset = [(v, {"datasets": {n: {"avg@k": a} for n, a in r["datasets"].items()}, "k": r["k"],
                        **{key: r[key] for key in FIGURES}}) for v, r in rows.items()]
    lines += ["", f"avg@{k} per dataset (mean over seeds):", "", markdown_table(per_dataset)]
    walls = table["runs"]
    if walls:
        lines += ["", "Wall time per run: " + ", ".join(
            f"{name} {w['wall_s']:.0f} s" if w["wall_s"] < 120 else f"{name} {w['wall_s'] / 60:.1f} min"
            for name, w in walls.items())]
    return "\n".join(lines) + "\n"


def subset_lines(title: str, rows: Mapping[str, Mapping[str, Any]], k: int) -> list[str]:
    """Markdown lines: ``title``, then each variant on a set of questions (``rows``: its figures
    there, step 0 -> final when a row has its ``start``), with its comparison with ``opd``."""
    lines = ["", title, "", f"| Variant | avg@{k} | vs opd, questions paired [95% CI] | over seeds [95% t-CI] | "
             "seeds +/-/= (p) | searches |", "|---|---|---|---|---|---|"]
    for v, r in rows.items():
        steps = [f for f in (r.get("start"), r) if f]
        accuracy = " -> ".join(f"{100 * f['macro_avg@k']:.2f}" for f in steps)
        searches = " -> ".join(f"{f['macro_searches_per_workflow']:.2f}" for f in steps)
        lines.append("| " + " | ".join([v, accuracy, *_versus(r.get("vs_opd")), searches]) + " |")
    return lines


def multiplicity_lines(table: Mapping[str, Any]) -> list[str]:
    """Markdown lines of :func:`multiplicity` (computed from the table itself, so a table
    written before it existed renders it too): each comparison's p-values, raw and
    Holm-adjusted, then the bases as the unit; none when the table compares nothing."""
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
        cells = [" -> ".join(f"{np.mean([h[end] for h in got]):.3f}" for end in ("first", "last"))
                 if (got := [e[key] for e in ends if key in e]) else "-" for key, _ in keys]
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
    who = "Stage-I Teachers against the base each started from (cascade"
    if any(PLANTED in t for t in teachers.values()):
        how = sorted({str(t[PLANTED]) for t in teachers.values() if PLANTED in t})
        who = (f"Planted Teachers ({'; '.join(how)}) against the base each was made from "
               f"({', '.join(sorted({t['workflow'] for t in teachers.values()}))}")
    return ["", f"{who}, greedy, points): {seeds}. Mean lead {100 * lead['mean']:+.2f} {interval}: "
            "the accuracy OPD has to pass on."]


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


def plot_curves(out: str | Path, variants: Sequence[str], png: str | Path) -> Path:
    """Validation avg@1 and searches per workflow against the step, a colour per variant."""
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
            series = [metric_series(read_metrics(out / r["run"] / "metrics.jsonl"), key) if key != VAL_SEARCHES
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


def write_table2(out: str | Path, *, n_resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """Write ``table2.json``, ``table2.md``, ``curves.png``, :data:`RECORDS_FILE` and
    :data:`METRICS_FILE` into ``out``; returns the table (as ``table2.json`` holds it)."""
    out = Path(out)
    table = build_table(out, n_resamples=n_resamples, seed=seed)
    for key, name in (("records", RECORDS_FILE), ("metrics", METRICS_FILE), ("run_records", RUNS_FILE)):
        write_gzip_jsonl(out / name, table.pop(f"_{key}"))
        table[key] = name
    table["curves_png"] = str(plot_curves(out, table["variants"], out / "curves.png").name)
    write_atomically(out / "table2.json", json.dumps(table, indent=2) + "\n")
    write_atomically(out / "table2.md", markdown(table))
    return table

