"""The comparisons a Table 2 makes: each variant minus ``opd`` with the question-paired and
the over-seeds interval, on all questions and without the two-choice ones, and their p-values
raw and Holm-adjusted. docs/table2.md ("Two intervals, two questions") says what each answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from algos.report import QUESTIONS_PAIRED
from benchmarks.metrics import avg_at_k, by_dataset, macro, paired_macro_difference
from benchmarks.seed_stats import holm, seed_interval, t_test_p
from benchmarks.table2.archive import read_records
from benchmarks.table2.runs import TEACHER
from envs.data.synthwiki import COMPARISON_STYLES
from envs.rewards import normalize_answer

REFERENCE = "opd"
"""The variant every other one is compared with."""


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


def is_two_choice(record: Mapping[str, Any]) -> bool:
    """Whether a question offers its answer as one of two choices: by its ``style`` when the
    record has one (:data:`envs.data.synthwiki.COMPARISON_STYLES`), else when a gold answer is written in the
    question (SQuAD-normalised), which is what makes a comparison question guessable."""
    if record.get("style") is not None:
        return record["style"] in COMPARISON_STYLES
    question = f" {normalize_answer(str(record.get('question', '')))} "
    return any(f" {normalize_answer(str(a))} " in question
               for a in record.get("golden_answers") or () if normalize_answer(str(a)))


def comparison(a: Mapping[int, Sequence[Mapping[str, Any]]], b: Mapping[int, Sequence[Mapping[str, Any]]],
               *, n_resamples: int = 10000, seed: int = 0) -> dict[str, Any]:
    """A minus B (each seed -> its final validation records) over the seeds both finished:
    ``difference`` (of the mean macro avg@k), ``per_seed`` differences, and both intervals,
    each with what it covers (module docstring)."""
    shared = sorted(set(a) & set(b))
    if not shared:
        raise ValueError("the two variants share no finished seed")
    boot = paired_macro_difference(pooled_over_seeds({s: a[s] for s in shared}),
                                   pooled_over_seeds({s: b[s] for s in shared}),
                                   n_resamples=n_resamples, seed=seed)
    per_seed = {str(s): macro_avg(a[s]) - macro_avg(b[s]) for s in shared}
    return {"difference": boot["difference"], "seeds": shared, "per_seed": per_seed,
            "questions_paired": {"covers": QUESTIONS_PAIRED, "confidence": 0.95, "low": boot["low"],
                                 "high": boot["high"], "questions": boot["questions"],
                                 "n_resamples": n_resamples, "seed": seed},
            "over_seeds": seed_interval(per_seed, confidence=0.95)}


def comparisons(final: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]], *, n_resamples: int = 10000,
                seed: int = 0) -> dict[str, dict[str, Any]]:
    """Every variant's comparison with :data:`REFERENCE`, on all questions (``vs_opd``) and
    on those that are not two-choice (``without_two_choice``), from each variant's final
    validation records per seed."""
    out: dict[str, dict[str, Any]] = {}
    reference = final.get(REFERENCE, {})
    for v, per_seed in final.items():
        if v == REFERENCE or not set(per_seed) & set(reference):
            continue
        out[v] = {"vs_opd": comparison(per_seed, reference, n_resamples=n_resamples, seed=seed),
                  "without_two_choice": comparison(open_questions(per_seed), open_questions(reference),
                                                   n_resamples=n_resamples, seed=seed)}
    return out


def open_questions(per_seed: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, list[Mapping[str, Any]]]:
    return {s: [r for r in rows if not is_two_choice(r)] for s, rows in per_seed.items()}


def comparisons_from_records(path: str | Path, *, n_resamples: int = 10000, seed: int = 0
                             ) -> dict[str, dict[str, Any]]:
    """:func:`comparisons` recomputed from a ``table2_records.jsonl.gz`` alone (its final
    validations): what ``table2.json``'s ``vs_opd`` and ``without_two_choice.vs_opd`` hold."""
    final: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for r in read_records(path):
        if r["final"] and r["variant"] != TEACHER:
            final.setdefault(r["variant"], {}).setdefault(int(r["seed"]), []).append(r)
    return comparisons(final, n_resamples=n_resamples, seed=seed)


HEADLINE = "all questions"
"""The question set of a table's headline comparisons (``vs_opd``)."""


def comparisons_made(table: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """Every comparison with ``opd`` a table makes, as (variant, question set, comparison):
    on all questions (:data:`HEADLINE`), without the two-choice questions, and on each of its
    ``question_subsets``, in that order."""
    rows = table["rows"]
    made = [(v, HEADLINE, r["vs_opd"]) for v, r in rows.items() if "vs_opd" in r]
    made += [(v, "without two-choice", r["without_two_choice"]["vs_opd"]) for v, r in rows.items()
             if "vs_opd" in (r.get("without_two_choice") or {})]
    made += [(v, name, r["vs_opd"]) for name, subset in table.get("question_subsets", {}).items()
             for v, r in subset["rows"].items() if "vs_opd" in r]
    return made


def multiplicity(table: Mapping[str, Any]) -> dict[str, Any]:
    """The comparisons a table makes (from its JSON alone) and, for each, the t-test's and the
    sign test's p over seeds, Holm-adjusted over the ``headline`` family (all questions) and
    over ``all``. With fewer bases than seeds, ``over_bases`` repeats the headline
    comparisons with the bases as the unit (:func:`over_bases`)."""
    made = comparisons_made(table)
    names = [f"{v} - {REFERENCE} ({questions})" for v, questions, _ in made]
    t_p = {n: t_test_p(ci["per_seed"]) for n, (_, _, ci) in zip(names, made)}
    sign_p = {n: ci["over_seeds"]["sign_test"]["p_value"] for n, (_, _, ci) in zip(names, made)}
    headline = [n for n, (_, questions, _) in zip(names, made) if questions == HEADLINE]
    adjusted = {family: {"t": holm({n: t_p[n] for n in members}), "sign": holm({n: sign_p[n] for n in members})}
                for family, members in (("headline", headline), ("all", names))}
    entries = []
    for n, (v, questions, ci) in zip(names, made):
        entries.append({"comparison": n, "variant": v, "questions": questions, "difference": ci["difference"],
                        "seeds": len(ci["per_seed"]), "t_p": t_p[n], "sign_p": sign_p[n],
                        "holm_headline": ({"t": adjusted["headline"]["t"][n], "sign": adjusted["headline"]["sign"][n]}
                                          if n in headline else None),
                        "holm_all": {"t": adjusted["all"]["t"][n], "sign": adjusted["all"]["sign"][n]}})
    out: dict[str, Any] = {"method": "holm", "tests": "over seeds: the t-test of the t-interval and the exact sign test",
                           "families": {"headline": len(headline), "all": len(names)}, "comparisons": entries}
    by_base = {v: over_bases(table, ci["per_seed"]) for v, questions, ci in made if questions == HEADLINE}
    if by_base and all(b is not None for b in by_base.values()):
        base_p = holm({v: b["t_p"] for v, b in by_base.items()})
        out["over_bases"] = {v: {**b, "holm_headline_t": base_p[v]} for v, b in by_base.items()}
    return out


def over_bases(table: Mapping[str, Any], per_seed: Mapping[str, float]) -> dict[str, Any] | None:
    """A comparison with the bases as the unit: its per-seed differences averaged per base,
    then :func:`benchmarks.seed_stats.seed_interval` and the t-test's p over those means. None
    when the table names no base for a seed, or when every seed has its own base."""
    bases = table.get("bases") or {}
    groups: dict[str, list[float]] = {}
    for s, d in per_seed.items():
        base = bases.get(f"seed{s}") or {}
        if "base_seed" not in base:
            return None
        groups.setdefault(f"base seed {base['base_seed']} ({base.get('weight_hash')})", []).append(float(d))
    if len(groups) == len(per_seed):
        return None
    means = {name: sum(v) / len(v) for name, v in groups.items()}
    return {"bases": len(means), "seeds_per_base": {name: len(v) for name, v in groups.items()},
            "interval": seed_interval(means), "t_p": t_test_p(means)}


def macro_avg(records: Sequence[Mapping[str, Any]]) -> float:
    """Macro avg@k as :func:`benchmarks.metrics.summarize` computes it (the same sums in the
    same order), from ``correct`` alone."""
    return macro({name: avg_at_k([r["correct"] for r in rows]) for name, rows in by_dataset(records).items()})
