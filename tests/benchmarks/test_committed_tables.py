"""The README's and docs/table2.md's tables are the committed JSON rendered
(benchmarks.docs_tables), and the JSON's derived figures are what its own data gives:
nothing in them is typed by hand. After new runs: copy them into docs/ and run
`python -m benchmarks table2 --render-docs`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from algos.recipes.micro.seeds import stage_figures
from benchmarks.docs_tables import BLOCKS, block, render_docs, rendered
from benchmarks.seed_stats import seed_interval
from benchmarks.table2.stats import comparisons_from_records, multiplicity

ROOT = Path(__file__).resolve().parents[2]
SEEDS = json.loads((ROOT / "docs" / "micro_seeds.json").read_text())
SOURCES = sorted({source for blocks in BLOCKS.values() for source, _ in blocks.values()})
TABLES = [source for source in SOURCES if Path(source).name == "table2.json"]
"""Every committed Table 2 a page renders (the finished one, and a running ablation's so far)."""


@pytest.mark.parametrize("page, name", [(page, name) for page, blocks in BLOCKS.items() for name in blocks])
def test_each_committed_block_is_its_json_rendered(page, name):
    text = (ROOT / page).read_text()
    assert block(text, name) == rendered(ROOT)[page][name], (
        f"{page}'s <!-- {name} --> block differs from its JSON: run python -m benchmarks table2 --render-docs")


@pytest.mark.parametrize("source", TABLES)
def test_the_intervals_over_seeds_are_those_of_the_committed_per_seed_differences(source):
    table = json.loads((ROOT / source).read_text())
    compared = [r["vs_opd"] for r in table["rows"].values() if "vs_opd" in r]
    assert len(compared) == len(table["variants"]) - 1
    for ci in compared:
        assert ci["over_seeds"] == seed_interval(ci["per_seed"])
        assert ci["difference"] == pytest.approx(ci["over_seeds"]["mean"], abs=1e-15)
        assert ci["questions_paired"]["covers"] == "questions paired, seeds fixed: these runs on new questions"


@pytest.mark.parametrize("source", TABLES)
def test_the_question_paired_intervals_come_from_the_committed_records_when_there_are_some(source):
    """Tables made before issue 30 kept no records (``records`` is null): their question-paired
    intervals cannot be recomputed, which docs/table2.md says. Newer ones must match theirs."""
    table = json.loads((ROOT / source).read_text())
    if table.get("records") is None:
        assert "no per-question records" in table["unrecorded"]
        return
    ci = table["ci"]
    again = comparisons_from_records((ROOT / source).parent / table["records"], n_resamples=ci["n_resamples"],
                                     seed=ci["seed"])
    assert sorted(again) == sorted(v for v in table["rows"] if "vs_opd" in table["rows"][v])
    for v, got in again.items():
        assert got["vs_opd"] == table["rows"][v]["vs_opd"]
        assert got["without_two_choice"] == table["rows"][v]["without_two_choice"]["vs_opd"]


@pytest.mark.parametrize("source", TABLES)
def test_the_committed_multiplicity_is_that_of_the_committed_comparisons(source):
    """Every committed table counts its comparisons with opd and carries their raw and
    Holm-adjusted p-values over seeds, as :func:`benchmarks.table2.stats.multiplicity` computes them
    from the table's own per-seed differences."""
    table = json.loads((ROOT / source).read_text())
    committed = table.pop("multiplicity")
    assert committed == json.loads(json.dumps(multiplicity(table)))
    made = committed["comparisons"]
    assert committed["families"]["all"] == len(made) == len({c["comparison"] for c in made})
    for c in made:
        assert c["holm_all"]["t"] >= c["t_p"] and c["holm_all"]["sign"] >= c["sign_p"]


def test_the_facts_headline_after_holm_and_over_bases_is_the_audits():
    """shared/reviews/table2_audit.md: micro_facts' outcome - opd, t p 0.049 raw; Holm over the
    table's 4 headline comparisons 0.20; with its 3 bases as the unit [-0.24, +2.05], p 0.076."""
    table = json.loads((ROOT / "docs" / "table2_facts" / "table2.json").read_text())
    found = table["multiplicity"]
    outcome = next(c for c in found["comparisons"] if c["comparison"] == "outcome - opd (all questions)")
    assert (round(outcome["t_p"], 3), round(outcome["holm_headline"]["t"], 2)) == (0.049, 0.2)
    assert (found["families"]["headline"], found["families"]["all"]) == (4, 12)
    bases = found["over_bases"]["outcome"]
    assert bases["bases"] == 3 and round(bases["t_p"], 3) == 0.076
    assert [round(100 * bases["interval"][k], 2) for k in ("low", "high")] == [-0.24, 2.05]


def test_the_micro_seeds_headline_is_that_of_its_per_seed_figures():
    for stage, figures in stage_figures(SEEDS["seeds"]).items():
        committed = SEEDS["stages"][stage]
        assert {k: committed[k] for k in figures} == figures
        assert committed["pooled_paired"]["covers"] == "(seed, question) pairs assumed independent: these runs only"


def test_render_docs_rewrites_a_stale_block_and_only_that(tmp_path):
    for page in BLOCKS:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text((ROOT / page).read_text())
    for source in SOURCES:
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).write_text((ROOT / source).read_text())
    assert render_docs(tmp_path) == []
    readme = (tmp_path / "README.md").read_text()
    table = block(readme, "table2")
    stale = readme.replace(table, table.replace("| `outcome` |", "| `outcome` | 9.99 |", 1))
    assert stale != readme
    (tmp_path / "README.md").write_text(stale)
    assert render_docs(tmp_path) == ["README.md"]
    assert (tmp_path / "README.md").read_text() == (ROOT / "README.md").read_text()
    with pytest.raises(ValueError, match="<!-- table2 -->"):
        block("no markers here", "table2")


def test_the_bases_table_by_hand():
    """A base measured in full and one measured in part (a later machine's build, without the
    sampled groups): each cell by hand, "-" for what was not measured, sorted by CPU then seed."""
    from benchmarks.docs_tables import bases_table

    greedy = {"macro_avg@1": 0.12857, "right": 45, "macro_avg@1_not_two_choice": 0.1055, "searches_per_workflow": 1.571}
    full = {"base_seed": 1, "weight_hash": "aa", "greedy": greedy,
            "greedy_nothing_found": {"macro_avg@1": 0.0371, "right": 13},
            "greedy_search_first": {"macro_avg@1": 0.12857, "right": 45, "searches_per_workflow": 1.5743},
            "sampled": {"searched_share": 0.7714, "team_em": 0.1411, "mixed_group_share": 0.2857,
                        "cov_searches_em": 0.0244, "cov_searches_em_ci95": [0.0109, 0.0391]}}
    part = {"base_seed": 0, "weight_hash": "bb", "greedy": greedy, "environment": {"cpu_vendor": "GenuineIntel"}}
    table = bases_table({"environment": {"cpu_vendor": "AuthenticAMD"},
                         "bases": {"full": full, "part": part, "other preset": {"weight_hash": "cc"}}})
    assert table.splitlines()[2:] == [
        "| 1 (aa, AMD) | 0.129 (45) | 0.105 | 0.037 (13) | 0.129 (45) | 1.57 / 1.57 | 0.77 / 0.14 | 29% "
        "| +0.024 [+0.011, +0.039] |",
        "| 0 (bb, Intel) | 0.129 (45) | 0.105 | - | - | 1.57 / - | - | - | - |",
    ]


def test_the_closed_book_table_by_hand():
    """One row per candidate, its cells by hand: known worlds (all of ``worlds`` when None),
    the skip share with the share on known tasks in brackets when set, the three greedy runs."""
    from benchmarks.docs_tables import closed_book_table

    def fig(avg, right, searches=0.0):
        return {"macro_avg@1": avg, "right": right, "searches_per_workflow": searches}

    def base(known, skip_known):
        return {"model": "micro-sft-k", "weight_hash": "aa", "sft_steps": 2603, "fact_recall": {"all": 0.914},
                "practised_episodes": 215,
                "settings": {"skip_search": 0.25, "skip_known": skip_known, "facts": 30, "known_worlds": known,
                             "worlds": [0, 1]},
                "greedy": fig(0.0714, 25, 1.537), "greedy_nothing_found": fig(0.0343, 12),
                "greedy_closed_book": fig(0.0314, 11)}

    sampled = {**base([0], 0.4), "sampled": {"cov_searches_em": 0.0214, "cov_searches_em_ci95": [0.0113, 0.0324]}}
    table = closed_book_table({"closed_book_candidates": {"all": base(None, None), "one": sampled}})
    assert table.splitlines()[2:] == [
        "| micro-sft-k (aa) | 0, 1 | 30 | 0.25 | 215 | 2,603 | 0.91 | 0.071 (25) | 0.034 (12) | 0.031 (11) | 1.54 | - |",
        "| micro-sft-k (aa) | 0 | 30 | 0.25 (0.4) | 215 | 2,603 | 0.91 | 0.071 (25) | 0.034 (12) | 0.031 (11) | 1.54 "
        "| +0.021 [+0.011, +0.032] |",
    ]
    assert closed_book_table({}).count("\n") == 2  # no candidates: the header alone
