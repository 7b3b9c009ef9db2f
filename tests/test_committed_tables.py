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
from benchmarks.table2 import comparisons_from_records

ROOT = Path(__file__).resolve().parents[1]
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
    stale = (tmp_path / "README.md").read_text().replace("| `outcome` | 1.90 |", "| `outcome` | 9.99 |")
    (tmp_path / "README.md").write_text(stale)
    assert render_docs(tmp_path) == ["README.md"]
    assert (tmp_path / "README.md").read_text() == (ROOT / "README.md").read_text()
    with pytest.raises(ValueError, match="<!-- table2 -->"):
        block("no markers here", "table2")
