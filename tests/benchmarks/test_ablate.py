"""The Table 2 ablation: the variants' configs, the table's numbers against hand-computed
ones from a fake trainer's records, the CI's unit, resuming a killed ablation, and one real
run of the learner on a tiny model."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from benchmarks.metrics import paired_macro_difference
from benchmarks.table2.ablate import run_ablation
from benchmarks.table2.archive import METRICS_FILE, RECORDS_FILE, read_records, write_gzip_jsonl
from benchmarks.table2.render import markdown, validation_searches, write_table2
from benchmarks.table2.runs import STARTED_FILE, VARIANTS, plan_runs, run_state
from benchmarks.table2.stats import comparisons_from_records, is_two_choice, pooled_over_seeds
from benchmarks.table2.table import build_table

# ---------------------------------------------------------------------- the variants' configs


def test_each_variant_differs_from_opd_only_in_the_searcher_signal_or_the_teacher(tmp_path):
    runs = plan_runs("micro", tmp_path, [0, 3], overrides={"steps": 5})
    assert [r.name for r in runs] == [f"seed{s}/{v}" for s in (0, 3) for v in ("teacher", *VARIANTS)]
    for seed in (0, 3):
        mine = {r.variant: r for r in runs if r.seed == seed}
        teacher = mine["teacher"].config
        assert (teacher.stage, teacher.teacher, teacher.seed, teacher.steps) == ("teacher", None, seed, 5)
        assert teacher.out_dir == str(tmp_path / f"seed{seed}" / "teacher")
        opd = mine["opd"].config.to_dict()
        assert (opd["stage"], opd["searcher_signal"], opd["teacher"], opd["seed"], opd["steps"]) == (
            "team", "opd", teacher.out_dir, seed, 5)
        expected = {"outcome": {"searcher_signal": "outcome"}, "none": {"searcher_signal": "none"},
                    "base": {"teacher": "base"}, "critic": {"searcher_signal": "critic"}}
        for variant, changed in expected.items():
            cfg = mine[variant].config.to_dict()
            diff = {k: cfg[k] for k in cfg if cfg[k] != opd[k] and k != "out_dir"}
            assert diff == changed, variant
            assert cfg["out_dir"] == str(tmp_path / f"seed{seed}" / variant)
        # the base-model Teacher needs no Stage-I run; the others wait for the seed's
        assert {v: r.needs for v, r in mine.items()} == {
            "teacher": None, "base": None, **{v: f"seed{seed}/teacher" for v in VARIANTS if v != "base"}}
    from algos.roles import searcher_signals

    assert VARIANTS == (*searcher_signals(), "base")  # one per Searcher signal of the table, then base


def test_a_plan_of_only_the_base_teacher_has_no_stage_one_run(tmp_path):
    assert [r.name for r in plan_runs("micro", tmp_path, [1], ["base"])] == ["seed1/base"]


@pytest.mark.parametrize("kwargs, message", [
    ({"variants": ["opd", "oracle"]}, "oracle"),
    ({"overrides": {"searcher_signal": "none"}}, "searcher_signal"),
    ({"overrides": {"steps": 0}}, "steps=0"),
    ({"seeds": []}, "seeds"),
    ({"preset": "nope"}, "nope"),
])
def test_bad_settings_are_refused_before_any_run(tmp_path, kwargs, message):
    args = {"preset": "micro", "out": tmp_path, "seeds": [0], **kwargs}
    with pytest.raises(ValueError, match=message):
        plan_runs(**args)
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------- a fake trainer

QUESTIONS = [("nq", "n1"), ("nq", "n2"), ("hotpotqa", "h1"), ("hotpotqa", "h2"), ("hotpotqa", "h3"),
             ("hotpotqa", "h4")]
"""Two datasets of unequal size, so a macro differs from a mean over questions."""

CORRECT = {
    ("opd", 0): [[1, 1], [0, 1], [1, 0], [0, 0], [0, 0], [0, 0]],
    ("opd", 1): [[1, 1], [1, 1], [1, 1], [0, 0], [0, 0], [0, 0]],
    ("outcome", 0): [[0, 0]] * 6,
    ("outcome", 1): [[1, 0], [0, 0], [0, 0], [0, 0], [0, 0], [0, 0]],
}
"""Each run's final validation, k = 2 runs per question, in QUESTIONS' order."""

TEXT = {qid: (f"who founded {qid}?", ["Krestus Pirnvik"]) for _, qid in QUESTIONS}
TEXT["h1"] = ("Which city was founded more recently, Port Vrevenz or Stuska?", ["Port Vrevenz"])
"""Question text and gold answers: h1 is a two-choice question (its answer is in it)."""

SEARCHES = {"opd": 2, "outcome": 0}
TRAINED: list[str] = []
"""The runs the fake trained, in order (a module-level log: the fake is a plain function)."""


def fake_train(config, *, resume, progress=True, retriever=None, step0_from=()):
    """Writes what the learner writes (metrics.jsonl, per-question validations at steps 0 and
    ``steps``) without training: the final validation is CORRECT's."""
    out = Path(config.out_dir)
    if not resume and (out / "metrics.jsonl").exists():  # as the Trainer refuses to mix two runs
        raise FileExistsError(f"{out} already holds a run")
    run = f"{out.parent.name}/{out.name}"
    TRAINED.append(run + (" (resumed)" if resume else ""))
    print(f"progress={progress}, bars refreshed every {os.environ.get('TQDM_MININTERVAL')} s")
    variant = out.name
    (out / "validation").mkdir(parents=True, exist_ok=True)
    last = config.steps
    for step in (0, last):
        rows = []
        for i, (dataset, qid) in enumerate(QUESTIONS):
            correct = CORRECT.get((variant, config.seed), [[0, 0]] * 6)[i] if step == last else [0, 0]
            rows.append({"dataset": dataset, "id": qid, "question": TEXT[qid][0], "golden_answers": TEXT[qid][1],
                         "correct": correct,
                         "searches": [SEARCHES.get(variant, 1)] * 2, "invalid_turns": [i % 2, 0],
                         "input_tokens": [100 + 10 * i, 100], "output_tokens": [20, 20 + 2 * i]})
        (out / "validation" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with open(out / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 0, "val/avg@1": 0.0}) + "\n")
        for step in range(1, last + 1):
            f.write(json.dumps({"step": step, "team/searches_per_workflow": SEARCHES.get(variant, 1) + 1 / step,
                                "team/invalid_rate": 1 / (step + 1)}) + "\n")
        f.write(json.dumps({"step": last, "val/avg@1": 0.5}) + "\n")
    return {"steps": last, "final_validation": f"validation/step_{last:06d}.jsonl", "val_avg@1": 0.0}


@pytest.fixture
def fake_ablation(tmp_path, monkeypatch):
    """An ablation of opd and outcome over seeds 0 and 1, trained by the fake."""
    monkeypatch.setattr("algos.presets.prepare_model", lambda model, **_: model)
    TRAINED.clear()
    run_ablation("micro", tmp_path, [0, 1], ["opd", "outcome"], {"steps": 3}, progress=False,
                 log=lambda _: None, train=fake_train)
    return tmp_path


def test_the_table_holds_the_hand_computed_figures(fake_ablation):
    table = write_table2(fake_ablation, n_resamples=2000)
    assert table["seeds"] == [0, 1] and table["variants"] == ["opd", "outcome"]
    opd, outcome = table["rows"]["opd"], table["rows"]["outcome"]
    # opd seed 0: NQ (1 + 0.5) / 2 = 0.75, HotpotQA (0.5 + 0 + 0 + 0) / 4 = 0.125 -> macro 0.4375
    #     seed 1: NQ 1, HotpotQA 1 / 4 -> 0.625;  mean 0.53125
    assert opd["per_seed"]["0"]["macro_avg@k"] == pytest.approx(0.4375)
    assert opd["macro_avg@k"] == pytest.approx((0.4375 + 0.625) / 2)
    # pass@2: seed 0 NQ 1, HotpotQA 1/4 -> 0.625; seed 1 the same. all-2: seed 0 NQ 1/2, HotpotQA 0
    # -> 0.25; seed 1 NQ 1, HotpotQA 1/4 -> 0.625
    assert opd["macro_pass@k"] == pytest.approx(0.625)
    assert opd["macro_all_k"] == pytest.approx((0.25 + 0.625) / 2)
    # outcome: seed 0 all wrong; seed 1 NQ (0.5 + 0) / 2 -> macro 0.125
    assert outcome["macro_avg@k"] == pytest.approx(0.0625)
    assert outcome["datasets"] == pytest.approx({"nq": 0.125, "hotpotqa": 0.0})
    # costs: searches as written; invalid turns per question i: (i % 2 + 0) / 2 -> NQ 0.25, HotpotQA 0.25;
    # input tokens (100 + 10 i + 100) / 2 -> NQ 102.5, HotpotQA 117.5 -> 110; output (20 + 20 + 2 i) / 2
    # -> NQ 20.5, HotpotQA 23.5 -> 22; the training invalid rate at the last step (3): 1 / 4
    assert (opd["macro_searches_per_workflow"], outcome["macro_searches_per_workflow"]) == (2, 0)
    assert opd["macro_invalid_turns_per_workflow"] == pytest.approx(0.25)
    assert opd["macro_input_tokens_per_workflow"] == pytest.approx(110)
    assert opd["macro_output_tokens_per_workflow"] == pytest.approx(22)
    assert opd["invalid_rate_train"] == pytest.approx(0.25)
    # the CI of outcome - opd: its point is the difference of the means, over 6 questions
    ci = outcome["vs_opd"]
    assert ci["difference"] == pytest.approx(0.0625 - 0.53125)
    assert ci["per_seed"] == pytest.approx({"0": -0.4375, "1": 0.125 - 0.625})
    assert ci["seeds"] == [0, 1]
    paired, over = ci["questions_paired"], ci["over_seeds"]
    assert paired["covers"] == "questions paired, seeds fixed: these runs on new questions"
    assert paired["questions"] == 6 and paired["low"] < ci["difference"] < paired["high"] <= 0
    # over seeds: diffs -0.4375, -0.5: mean -0.46875, sd 0.0625 / sqrt(2), t(0.975, df 1) = 12.7062
    assert over["covers"] == "over seeds: the training procedure" and over["df"] == 1
    half = 12.706204736174703 * (0.0625 / 2**0.5) / 2**0.5
    assert (over["mean"], over["low"], over["high"]) == pytest.approx((-0.46875, -0.46875 - half, -0.46875 + half))
    assert over["sign_test"] == {"covers": "over seeds: the training procedure", "seeds": 2, "better": 0,
                                 "worse": 2, "ties": 0, "p_value": 0.5}
    assert "vs_opd" not in opd
    # without the two-choice question h1: opd seed 0 NQ 0.75, HotpotQA 0 -> 0.375; seed 1 NQ 1 -> 0.5;
    # outcome seed 0: 0, seed 1: NQ 0.25 -> 0.125; both seeds -0.375: a zero-width interval over seeds
    assert outcome["two_choice_questions"] == {"questions": 6, "two_choice": 1, "per_dataset": {"hotpotqa": 1}}
    assert opd["without_two_choice"]["macro_avg@k"] == pytest.approx((0.375 + 0.5) / 2)
    sub = outcome["without_two_choice"]
    assert sub["macro_avg@k"] == pytest.approx(0.0625)
    assert sub["vs_opd"]["per_seed"] == pytest.approx({"0": -0.375, "1": -0.375})
    assert sub["vs_opd"]["questions_paired"]["questions"] == 5
    assert (sub["vs_opd"]["over_seeds"]["low"], sub["vs_opd"]["over_seeds"]["high"]) == pytest.approx((-0.375,) * 2)
    saved = json.loads((fake_ablation / "table2.json").read_text())
    assert saved["rows"]["outcome"]["vs_opd"] == ci
    assert set(saved["runs"]) == {f"seed{s}/{v}" for s in (0, 1) for v in ("teacher", "opd", "outcome")}
    # the sampled searches per workflow the fake logged (2 + 1/step for opd), first and last step
    assert saved["runs"]["seed0/opd"]["endpoints"] == {"team/searches_per_workflow": {
        "first_step": 1, "first": 3.0, "last_step": 3, "last": pytest.approx(2 + 1 / 3)}}
    from algos.reproducible import environment

    assert saved["environment"] == environment()
    text = (fake_ablation / "table2.md").read_text()
    assert "| opd | opd | stage-I | 53.12 | 62.50 | 43.75 | - | - | - | 2.00 |" in text
    assert "| outcome | outcome | stage-I | 6.25 |" in text and f"{100 * ci['difference']:+.2f} [" in text
    assert "| 0/2/0 (p = 0.5) |" in text
    assert "Without the 1 two-choice questions of 6 (hotpotqa 1):" in text
    assert "| outcome | 6.25 | -37.50 [" in text and "| [-37.50, -37.50] |" in text
    assert (fake_ablation / "curves.png").stat().st_size > 1000
    # the curves' validation searches: each validation file's macro, by step
    assert validation_searches(fake_ablation / "seed1" / "outcome") == {0: 0.0, 3: 0.0}
    assert validation_searches(fake_ablation / "seed0" / "opd") == {0: 2.0, 3: 2.0}


def test_a_marked_question_set_is_tabled_apart_and_restored_with_the_runs(fake_ablation, tmp_path_factory):
    from algos.mechanism import QUESTION_SUBSETS_FILE
    from benchmarks.table2.archive import publish_table, restore_runs

    marked = {"from_memory": {"about": "a team knows", "questions": [["nq", "n2"], ["hotpotqa", "h1"],
                                                                      ["hotpotqa", "h2"]]}}
    (fake_ablation / QUESTION_SUBSETS_FILE).write_text(json.dumps(marked))
    table = write_table2(fake_ablation, n_resamples=300)
    subset = table["question_subsets"]["from_memory"]
    assert subset["about"] == "a team knows" and len(subset["questions"]) == 3
    opd, outcome = subset["rows"]["opd"], subset["rows"]["outcome"]
    # opd seed 0: NQ n2 0.5, HotpotQA (h1 0.5 + h2 0) / 2 -> macro 0.375; seed 1: NQ 1, HotpotQA 0.5 -> 0.75
    assert opd["per_seed"]["0"]["macro_avg@k"] == pytest.approx(0.375)
    assert opd["macro_avg@k"] == pytest.approx((0.375 + 0.75) / 2)
    assert outcome["macro_avg@k"] == 0 and outcome["vs_opd"]["per_seed"] == pytest.approx({"0": -0.375, "1": -0.75})
    assert outcome["vs_opd"]["questions_paired"]["questions"] == 3 and "vs_opd" not in opd
    # step 0 (the fake's first validation): nothing right; searches as the fake writes them
    assert (opd["start"]["macro_avg@k"], opd["start"]["macro_searches_per_workflow"]) == (0, 2)
    text = (fake_ablation / "table2.md").read_text()
    assert "On the 3 questions a team knows (`from_memory`), step 0 -> final:" in text
    assert "| opd | 0.00 -> 56.25 | - | - | - | 2.00 -> 2.00 |" in text
    assert "| outcome | 0.00 -> 0.00 | -56.25 [" in text
    # the set travels with the published table and comes back with its runs
    committed = tmp_path_factory.mktemp("docs")
    publish_table(fake_ablation, committed)
    out = tmp_path_factory.mktemp("fresh") / "t2"
    restore_runs(committed / "table2.json", out)
    assert json.loads((out / QUESTION_SUBSETS_FILE).read_text()) == {
        "from_memory": {"about": "a team knows", "questions": sorted(marked["from_memory"]["questions"])}}
    assert write_table2(out, n_resamples=300)["question_subsets"] == table["question_subsets"]
    # a set naming a question no run validated is refused, naming the file
    (fake_ablation / QUESTION_SUBSETS_FILE).write_text(json.dumps({"x": {"questions": [["nq", "n9"]]}}))
    with pytest.raises(ValueError, match=f"{QUESTION_SUBSETS_FILE}: set 'x' names questions no run validated"):
        write_table2(fake_ablation, n_resamples=300)


def test_the_records_archive_holds_every_validation_and_recomputes_the_comparisons(fake_ablation):
    table = write_table2(fake_ablation, n_resamples=500)
    assert (table["records"], table["metrics"]) == (RECORDS_FILE, METRICS_FILE)
    rows = read_records(fake_ablation / RECORDS_FILE)
    # 2 seeds x (teacher, opd, outcome) x (step 0, final) x 6 questions, each named by its run
    assert len(rows) == 72
    assert {(r["run"], r["variant"], r["seed"], r["final"]) for r in rows} == {
        (f"seed{s}/{v}", v, s, f) for s in (0, 1) for v in ("teacher", "opd", "outcome") for f in (False, True)}
    final = [r for r in rows if r["run"] == "seed1/outcome" and r["final"]]
    assert [r["correct"] for r in final] == CORRECT["outcome", 1] and final[0]["invalid_turns"] == [0, 0]
    assert all(r["correct"] == [0, 0] for r in rows if not r["final"])  # the fake's step 0
    metrics = read_records(fake_ablation / METRICS_FILE)
    assert len(metrics) == 6 * 5 and {m["run"] for m in metrics} == set(table["runs"])
    again = comparisons_from_records(fake_ablation / RECORDS_FILE, n_resamples=500)
    assert again == {"outcome": {"vs_opd": table["rows"]["outcome"]["vs_opd"],
                                 "without_two_choice": table["rows"]["outcome"]["without_two_choice"]["vs_opd"]}}
    before = (fake_ablation / RECORDS_FILE).read_bytes()
    write_table2(fake_ablation, n_resamples=500)  # the same runs: the same bytes (no time in the gzip)
    assert (fake_ablation / RECORDS_FILE).read_bytes() == before


def test_the_comparisons_recomputed_from_a_small_records_file(tmp_path):
    """Two seeds, one dataset of three questions, k = 1; q3 is two-choice by its style."""
    def row(variant, seed, qid, correct, style=None):
        return {"run": f"seed{seed}/{variant}", "variant": variant, "seed": seed, "final": True,
                "dataset": "nq", "id": qid, "correct": [correct], "style": style}

    rows = [row("opd", 0, "q1", 1), row("opd", 0, "q2", 0), row("opd", 0, "q3", 1, "comparison"),
            row("opd", 1, "q1", 1), row("opd", 1, "q2", 1), row("opd", 1, "q3", 0, "comparison"),
            row("none", 0, "q1", 0), row("none", 0, "q2", 0), row("none", 0, "q3", 1, "comparison"),
            row("none", 1, "q1", 1), row("none", 1, "q2", 0), row("none", 1, "q3", 1, "comparison"),
            {**row("none", 0, "q1", 1), "final": False}, {**row("teacher", 0, "q1", 1)}]
    path = write_gzip_jsonl(tmp_path / RECORDS_FILE, rows)
    got = comparisons_from_records(path, n_resamples=500)["none"]
    # all questions: seed 0 none 1/3 - opd 2/3 = -1/3; seed 1: 2/3 - 2/3 = 0 -> mean -1/6
    assert got["vs_opd"]["per_seed"] == pytest.approx({"0": -1 / 3, "1": 0.0})
    assert got["vs_opd"]["difference"] == pytest.approx(-1 / 6)
    over = got["vs_opd"]["over_seeds"]
    half = 12.706204736174703 * (1 / 3 / 2**0.5) / 2**0.5
    assert (over["low"], over["high"]) == pytest.approx((-1 / 6 - half, -1 / 6 + half))
    assert (over["sign_test"]["worse"], over["sign_test"]["ties"], over["sign_test"]["p_value"]) == (1, 1, 1.0)
    assert got["vs_opd"]["questions_paired"]["questions"] == 3
    # without q3: seed 0 0/2 - 1/2 = -1/2, seed 1 1/2 - 2/2 = -1/2
    assert got["without_two_choice"]["per_seed"] == pytest.approx({"0": -0.5, "1": -0.5})
    assert got["without_two_choice"]["questions_paired"]["questions"] == 2


def test_two_choice_questions_are_the_comparison_styles_of_the_synthetic_world():
    """By style and, without one, by the answer written in the question: both find the same
    22 of the 140 validation questions (HotpotQA 10, 2Wiki 9 comparison + 3 bridge_comparison)."""
    from envs.data import DATASETS, load_qa

    items = [q for name in DATASETS for q in load_qa(name, "dev", root="synthetic")[:20]]
    records = [{"dataset": q.dataset, "id": q.id, "question": q.question, "golden_answers": list(q.golden_answers),
                "style": q.metadata["style"]} for q in items]
    by_style = {(r["dataset"], r["id"]) for r in records if is_two_choice(r)}
    by_text = {(r["dataset"], r["id"]) for r in records if is_two_choice({**r, "style": None})}
    assert by_style == by_text and len(by_style) == 22
    assert sorted({r["style"] for r in records if (r["dataset"], r["id"]) in by_style}) == [
        "bridge_comparison", "comparison"]


def test_the_ci_resamples_questions_with_their_seeds_together():
    seed0 = [{"dataset": "nq", "id": "a", "correct": [1]}, {"dataset": "nq", "id": "b", "correct": [0]}]
    seed1 = [{"dataset": "nq", "id": "b", "correct": [1]}, {"dataset": "nq", "id": "a", "correct": [0]}]
    pooled = pooled_over_seeds({1: seed1, 0: seed0})
    assert sorted((r["id"], r["correct"]) for r in pooled) == [("a", [1, 0]), ("b", [0, 1])]
    with pytest.raises(ValueError, match="seed 1 validated other questions"):
        pooled_over_seeds({0: seed0, 1: seed1[:1]})
    # every question 0.5 better within its dataset: the interval is that point, whatever the resamples
    worse = [{"dataset": d, "id": i, "correct": [0, 0]} for d, i in QUESTIONS]
    better = [{"dataset": d, "id": i, "correct": [1, 0]} for d, i in QUESTIONS]
    ci = paired_macro_difference(better, worse, n_resamples=500)
    assert (ci["difference"], ci["low"], ci["high"], ci["questions"]) == (0.5, 0.5, 0.5, 6)


# ---------------------------------------------------------------------- resuming


SETTINGS = {"steps": 2, "val_datasets": ("nq", "hotpotqa")}
"""A tuple among them: the plan's check reads them back from JSON as a list."""


def test_a_killed_ablation_repeats_no_finished_run(tmp_path, monkeypatch):
    monkeypatch.setattr("algos.presets.prepare_model", lambda model, **_: model)
    TRAINED.clear()
    calls = []

    def killed_in_the_second_run(config, **kw):
        calls.append(config.out_dir)
        if len(calls) == 2:  # the second run dies after writing some of its files
            Path(config.out_dir, "validation").mkdir(parents=True)
            Path(config.out_dir, "metrics.jsonl").write_text('{"step": 0, "val/avg@1": 0.0}\n{"st')
            raise KeyboardInterrupt
        return fake_train(config, **kw)

    with pytest.raises(KeyboardInterrupt):
        run_ablation("micro", tmp_path, [0], ["opd", "none"], SETTINGS, progress=False,
                     log=lambda _: None, train=killed_in_the_second_run)
    runs = {r.name: r for r in plan_runs("micro", tmp_path, [0], ["opd", "none"], SETTINGS)}
    assert [run_state(r) for r in runs.values()] == ["done", "restart", "fresh"]
    # a checkpoint makes a run continue rather than start again
    ckpt = tmp_path / "seed0" / "none" / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.pt").write_bytes(b"")
    assert run_state(runs["seed0/none"]) == "resume"
    TRAINED.clear()
    lines = []
    run_ablation("micro", tmp_path, [0], ["opd", "none"], SETTINGS, progress=False,
                 log=lines.append, train=fake_train)
    assert TRAINED == ["seed0/opd", "seed0/none (resumed)"]  # the teacher was not trained again
    assert "[seed0/teacher] finished before: not repeated" in lines
    assert not (tmp_path / "seed0" / "opd" / "metrics.jsonl").read_text().endswith('{"st')  # started afresh
    assert (tmp_path / "seed0" / "none" / "checkpoints").exists()  # what a resumed run continues is kept
    TRAINED.clear()
    plan = run_ablation("micro", tmp_path, [0], ["opd", "none"], SETTINGS, progress=False,
                        log=lambda _: None, train=fake_train)
    assert TRAINED == [] and set(plan["runs"]) == {"seed0/teacher", "seed0/opd", "seed0/none"}
    with pytest.raises(ValueError, match="give another --out"):  # other settings, same directory
        run_ablation("micro", tmp_path, [0], ["opd"], {"steps": 3}, progress=False, train=fake_train)
    # the preset's base changed since (rebuilt elsewhere): a new variant would start from another base
    monkeypatch.setattr("algos.presets.prepare_model", lambda model, **_: str(tmp_path / "rebuilt"))
    with pytest.raises(ValueError, match="seed0/teacher was trained from the base micro.*would not share a base"):
        run_ablation("micro", tmp_path, [0], ["opd", "none", "base"], SETTINGS, progress=False,
                     log=lambda _: None, train=fake_train)
    assert not (tmp_path / "seed0" / "base").exists()


def test_parallel_jobs_run_each_run_once_after_its_teacher(tmp_path, monkeypatch):
    monkeypatch.setattr("algos.presets.prepare_model", lambda model, **_: model)
    plan = run_ablation("micro", tmp_path, [0], ["opd", "base"], {"steps": 2}, jobs=2, progress=False,
                        log=lambda _: None, train=fake_train)
    records = plan["runs"]
    assert set(records) == {"seed0/teacher", "seed0/opd", "seed0/base"}
    assert all(r["steps"] == 2 and r["threads"] == 1 for r in records.values())
    log = (tmp_path / "seed0" / "opd.log").read_text()
    assert "finished before" not in log
    assert "progress=True, bars refreshed every 30 s" in log  # bars, but not thousands of them
    assert build_table(tmp_path, n_resamples=100)["rows"]["base"]["vs_opd"]["questions_paired"]["questions"] == 6


# ---------------------------------------------------------------------- the real learner, tiny


def test_the_real_learner_runs_the_ablation_on_a_tiny_model(tmp_path, tiny_dirs, torch_one_thread):
    from conftest import WORLD, KeywordRetriever

    settings = dict(model=tiny_dirs["policy"], steps=1, questions_per_step=1, group_size=2, learning_rate=1e-3,
                    max_turn_tokens=8, max_context_tokens=512, max_waves=1, max_searchers=1,
                    max_searcher_turns=2, num_candidates=2, val_per_dataset=2, val_datasets=("nq", "hotpotqa"),
                    train_datasets=("nq",), eval_every=100, save_every=1, max_row_tokens=512,
                    generation_batch_size=8)
    plan = run_ablation("micro", tmp_path, [0], ["opd", "none"], settings, progress=False, log=lambda _: None,
                        retriever=KeywordRetriever(WORLD))
    for name in ("seed0/teacher", "seed0/opd", "seed0/none"):
        record = plan["runs"][name]
        assert record["steps"] == 1 and record["final_validation"] == "validation/step_000001.jsonl"
        assert (tmp_path / name / "validation" / "step_000000.jsonl").exists()
    assert plan["runs"]["seed0/opd"]["config"]["teacher"] == str(tmp_path / "seed0" / "teacher")
    # opd validated the base once; none took its step 0 (the same bytes)
    assert [plan["runs"][f"seed0/{v}"]["step0_validation"] for v in ("teacher", "opd", "none")] == [
        "computed", "computed", "reused from seed0/opd"]
    step0 = [(tmp_path / "seed0" / v / "validation" / "step_000000.jsonl").read_bytes() for v in ("opd", "none")]
    assert step0[0] == step0[1]
    from algos.reproducible import weight_hash

    assert plan["bases"]["seed0"]["weight_hash"] == weight_hash(tiny_dirs["policy"]) is not None
    table = build_table(tmp_path, n_resamples=100)
    assert table["rows"]["none"]["vs_opd"]["questions_paired"]["questions"] == 4
    assert "| none | none | stage-I |" in markdown(table)
    assert f"base weights {weight_hash(tiny_dirs['policy'])}" in markdown(table)
    again = run_ablation("micro", tmp_path, [0], ["opd", "none"], settings, progress=False, log=lambda _: None,
                         retriever=KeywordRetriever(WORLD))  # nothing left to run: the base stays recorded
    assert again["bases"] == plan["bases"]


def test_the_command_refuses_bad_options_in_one_line_before_anything_runs(tmp_path, capsys):
    from benchmarks.__main__ import main

    for argv, message in ((["--set", "steps=abc"], "--set 'steps=abc': expected an integer"),
                          (["--variants", "opd,oracle"], "oracle"),
                          (["--seed-list", "0,a"], "--seed-list '0,a'"),
                          (["--threads", "0"], "threads=0")):
        with pytest.raises(SystemExit) as exit_:
            main(["ablate", "--out", str(tmp_path / "t2"), *argv])
        assert str(exit_.value).startswith("python -m benchmarks ablate: error: ") and message in str(exit_.value)
    assert not (tmp_path / "t2").exists()
    with pytest.raises(SystemExit, match="no finished Stage-II run"):
        main(["table2", str(tmp_path)])


def test_python_m_algos_ablate_points_to_the_one_command(capsys):
    """Table 2 has one command, on the benchmark floor; the learner's CLI names it and stops."""
    from algos.__main__ import main as algos_main

    assert algos_main(["ablate", "--preset", "micro"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m algos: error: the ablation (Table 2) is `python -m benchmarks ablate`")


def test_every_seed_trains_from_its_own_base_and_the_plan_records_each(tmp_path, monkeypatch):
    """Issue 22: the ablation's seeds are the bases' seeds, so its spread includes the base's;
    a finished seed's base is only looked up (build=False), never rebuilt."""
    asked = []

    def prepare(model, *, seed=0, progress=True, build=True):
        asked.append((model, seed, build))
        return f"{model}-seed{seed}"

    monkeypatch.setattr("algos.presets.prepare_model", prepare)
    plan = run_ablation("micro", tmp_path, [0, 1], ["opd", "none"], SETTINGS, progress=False,
                        log=lambda _: None, train=fake_train)
    assert sorted(a for a in asked if a[2]) == [("micro", 0, True), ("micro", 1, True)]  # (build=False: a look-up)
    for name, record in plan["runs"].items():
        assert record["config"]["model"] == f"micro-seed{name[4]}", name
    assert {k: v["model"] for k, v in plan["bases"].items()} == {"seed0": "micro-seed0", "seed1": "micro-seed1"}
    asked.clear()  # seed 2 joins: seeds 0 and 1 are done, their bases looked up only
    plan = run_ablation("micro", tmp_path, [0, 1, 2], ["opd", "none"], SETTINGS, progress=False,
                        log=lambda _: None, train=fake_train)
    assert sorted(a for a in asked if a[2]) == [("micro", 2, True)]
    assert {("micro", 0, False), ("micro", 1, False)} <= set(asked)
    assert set(plan["bases"]) == {"seed0", "seed1", "seed2"}


# ---------------------------------------------------------------------- bases shared by seeds (issue 30)


def test_base_seeds_put_two_training_seeds_on_each_base_and_they_still_differ_by_their_seed(tmp_path):
    runs = plan_runs("micro", tmp_path, list(range(6)), overrides={"steps": 5}, base_seeds=3)
    for r in runs:
        assert (r.config.seed, r.config.base_seed, r.config.build_seed) == (r.seed, r.seed % 3, r.seed % 3), r.name
    zero, three = ({r.variant: r.config.to_dict() for r in runs if r.seed == s} for s in (0, 3))
    for variant in ("teacher", *VARIANTS):  # one base, two training seeds: only the seed (and the dirs) differ
        diff = {k for k in zero[variant] if zero[variant][k] != three[variant][k]}
        assert diff == {"seed", "out_dir"} | ({"teacher"} if variant not in ("teacher", "base") else set()), variant
    # without the option: a base per seed, as before (base_seed unset, the base is the seed's)
    assert all(r.config.base_seed is None and r.config.build_seed == r.seed
               for r in plan_runs("micro", tmp_path, [0, 4], ["opd"]))


@pytest.mark.parametrize("kwargs, message", [
    ({"base_seeds": 0}, "base_seeds=0"),
    ({"overrides": {"base_seed": 1}}, "base_seed"),
])
def test_bad_base_seeds_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_runs(**{"preset": "micro", "out": tmp_path, "seeds": [0], **kwargs})


def test_the_step0_validation_is_shared_by_the_variants_of_a_seed_and_never_across_seeds(tmp_path):
    from benchmarks.table2.runs import STEP0_FREE, step0_key

    runs = {r.name: r for r in plan_runs("micro", tmp_path, [0, 3], overrides={"steps": 5}, base_seeds=3)}
    for seed in (0, 3):
        variants = [f"seed{seed}/{v}" for v in VARIANTS]
        for name in variants:  # every other Stage-II variant of the seed, none of another seed or Stage I
            assert runs[name].step0_from == tuple(v for v in variants if v != name), name
        assert runs[f"seed{seed}/teacher"].step0_from == ()
    assert STEP0_FREE == {"out_dir", "searcher_signal", "teacher"}
    # seeds 0 and 3 share a base but not the validation's sampler seed (TrainConfig.seed): not one key
    assert step0_key(runs["seed0/opd"].config.to_dict()) != step0_key(runs["seed3/opd"].config.to_dict())
    # the key reads a config back from JSON (tuples as lists) as it reads the dataclass's
    cfg = runs["seed0/opd"].config.to_dict()
    assert step0_key(json.loads(json.dumps(cfg))) == step0_key(cfg)


def _fake_bases(tmp_path, asked):
    """A prepare_model whose bases are real weight files (one tensor: the base's seed), so
    each has its own weights' hash; records (seed, build) per call."""
    import torch
    from safetensors.torch import save_file

    def prepare(model, *, seed=0, progress=True, build=True):
        asked.append((seed, build))
        path = tmp_path / "bases" / f"{model}-{seed}"
        if not path.exists():
            if not build:
                raise FileNotFoundError(path)
            path.mkdir(parents=True)
            save_file({"w": torch.tensor([float(seed)])}, str(path / "model.safetensors"))
        return str(path)

    return prepare


def test_a_seed_is_not_continued_on_a_base_rebuilt_to_other_weights(tmp_path, monkeypatch):
    """The same cache path with other weights (the base rebuilt on another CPU): a seed with
    runs left refuses to go on from it, naming the run and both hashes; a finished seed does
    not stand in the way of new seeds, and its table keeps the base its runs recorded."""
    import torch
    from safetensors.torch import save_file

    from algos.reproducible import weight_hash
    from benchmarks.__main__ import main as benchmarks_main

    monkeypatch.setattr("algos.presets.prepare_model", _fake_bases(tmp_path, []))
    run_ablation("micro", tmp_path / "runs", [0], ["base"], {"steps": 2}, progress=False, log=lambda _: None,
                 train=fake_train)
    weights = tmp_path / "bases" / "micro-0" / "model.safetensors"
    first = weight_hash(weights.parent)
    save_file({"w": torch.tensor([7.0])}, str(weights))  # rebuilt elsewhere: same path, other bits
    with pytest.raises(ValueError, match=f"seed0/base was trained from the base .*micro-0 \\(weights {first}\\), "
                                         f"but 'micro' is now .*micro-0 \\(weights {weight_hash(weights.parent)}\\)"):
        run_ablation("micro", tmp_path / "runs", [0], ["base", "opd"], {"steps": 2}, progress=False,
                     log=lambda _: None, train=fake_train)
    assert not (tmp_path / "runs" / "seed0" / "opd").exists()
    with pytest.raises(SystemExit, match="^python -m benchmarks ablate: error: seed0/base was trained from the base"):
        benchmarks_main(["ablate", "--preset", "micro", "--variants", "base,opd", "--seeds", "1", "--steps", "2",
                         "--threads", "1", "--out", str(tmp_path / "runs"), "--no-progress"])  # one line
    assert not (tmp_path / "runs" / "seed0" / "opd").exists()
    plan = run_ablation("micro", tmp_path / "runs", [0, 1], ["base"], {"steps": 2}, progress=False,
                        log=lambda _: None, train=fake_train)
    assert plan["runs"]["seed1/base"]["base_weight_hash"] == weight_hash(tmp_path / "bases" / "micro-1")
    assert build_table(tmp_path / "runs", n_resamples=100)["bases"]["seed0"]["weight_hash"] == first


def test_the_table_names_the_base_each_seed_s_runs_recorded_over_the_plan_s():
    """A plan rewritten on another machine names the base as rebuilt there; the runs' own
    records say what they trained from. Runs of one seed from two bases are refused."""
    from benchmarks.table2.table import _bases_trained_from

    planned = {"seed0": {"base_seed": 0, "weight_hash": "rebuilt", "threads": 1}, "seed1": {"base_seed": 1}}
    records = [{"seed": 0, "base_seed": 0, "base_weight_hash": "amd", "config": {"model": "/m/0"}},
               {"seed": 0, "base_seed": 0, "base_weight_hash": "amd", "config": {"model": "/m/0"}},
               {"seed": 1, "base_seed": 1, "base_weight_hash": None}]
    assert _bases_trained_from(planned, records) == {
        "seed0": {"base_seed": 0, "weight_hash": "amd", "threads": 1, "model": "/m/0"}, "seed1": {"base_seed": 1}}
    with pytest.raises(ValueError, match="the runs of seed 0 recorded different bases"):
        _bases_trained_from(planned, [*records, {**records[0], "base_weight_hash": "intel"}])


def test_six_seeds_over_three_bases_build_three_and_every_record_names_its_base(tmp_path, monkeypatch):
    from algos.reproducible import weight_hash

    asked: list[tuple[int, bool]] = []
    monkeypatch.setattr("algos.presets.prepare_model", _fake_bases(tmp_path, asked))
    out, lines = tmp_path / "t2", []
    plan = run_ablation("micro", out, list(range(6)), ["opd", "none"], SETTINGS, base_seeds=3, progress=False,
                        log=lines.append, train=fake_train)
    assert sorted(a for a in asked if a[1]) == [(0, True), (1, True), (2, True)]  # 3 builds, not 6
    # the estimate printed first: 18 runs, 3 bases (6 with a base per seed), all 3 to build; 2 validations
    # per run (steps 0 and 2: eval_every 10 > 2 steps), each seed's none taking opd's step 0
    assert lines[:3] == ["ablation: 18 runs to do (6 Stage I, 12 Stage II), 0 finished before",
                         "  bases: 3 (a base per seed: 6), 3 of them to build",
                         "  validations: 30 (6 step-0 validations taken from a variant of the same seed and base; "
                         "36 without)"]
    hashes = {b: weight_hash(tmp_path / "bases" / f"micro-{b}") for b in range(3)}
    assert len(set(hashes.values())) == 3 and None not in hashes.values()
    for s in range(6):
        assert plan["bases"][f"seed{s}"]["base_seed"] == s % 3
        assert plan["bases"][f"seed{s}"]["weight_hash"] == hashes[s % 3]
    for name, record in plan["runs"].items():
        seed = int(name.split("/")[0][4:])
        assert (record["seed"], record["base_seed"], record["base_weight_hash"]) == (seed, seed % 3, hashes[seed % 3])
        assert record["config"]["seed"] == seed and record["config"]["base_seed"] == seed % 3
        assert record["step0_validation"] == "computed"  # (the fake computes it always)
    saved = json.loads((out / "ablation.json").read_text())
    assert saved["base_seeds"] == 3 and saved["bases"] == plan["bases"]
    table = write_table2(out, n_resamples=100)
    assert table["base_seeds"] == 3
    assert table["runs"]["seed4/none"]["base_seed"] == 1 and table["runs"]["seed4/none"]["base_weight_hash"] == hashes[1]
    assert table["runs_wall_s"] == pytest.approx(sum(r["wall_s"] for r in plan["runs"].values()), abs=0.1)
    text = (out / "table2.md").read_text()
    assert (f"Bases: base seed 0 (weights {hashes[0]}): seeds 0, 3; base seed 1 (weights {hashes[1]}): seeds 1, 4; "
            f"base seed 2 (weights {hashes[2]}): seeds 2, 5. 6 training seeds share 3 bases:") in text
    assert "not independent in the base's draw" in text
    # the same directory with a base per seed: its seeds 3-5 trained from other bases
    with pytest.raises(ValueError, match="--base-seeds 3, not unset"):
        run_ablation("micro", out, list(range(6)), ["opd", "none"], SETTINGS, progress=False, train=fake_train)
    asked.clear()
    again = run_ablation("micro", out, list(range(6)), ["opd", "none"], SETTINGS, base_seeds=3, progress=False,
                         log=lines.append, train=fake_train)  # all finished: nothing built, the bases kept
    assert not any(build for _, build in asked) and again["bases"] == plan["bases"]


def test_the_table_shows_the_behaviour_endpoints_and_a_measured_skip_probability(fake_ablation):
    """Each run's first and last sampled searches (its metrics), and the skip probability a
    recipe measured after training (skip_probability.json), meaned over seeds per variant."""
    from algos.mechanism import SKIP_FILE

    for seed, (start, end) in ((0, (0.2, 0.1)), (1, (0.3, 0.0))):
        (fake_ablation / f"seed{seed}" / "opd" / SKIP_FILE).write_text(json.dumps(
            {"per_dataset": 20, "workflow": "hierarchical", "contexts": 140, "step0": start, "final": end,
             "final_step": 3}))
    table = write_table2(fake_ablation, n_resamples=200)
    assert table["runs"]["seed1/opd"]["endpoints"]["searchers/skip_probability"] == {
        "first_step": 0, "first": 0.3, "last_step": 3, "last": 0.0}
    assert "searchers/skip_probability" not in table["runs"]["seed1/outcome"]["endpoints"]
    text = (fake_ablation / "table2.md").read_text()
    # opd's sampled searches: 2 + 1/step, steps 1 and 3, both seeds; skip: (0.2 + 0.3) / 2 -> (0.1 + 0) / 2
    assert "| opd | 3.000 -> 2.333 | 0.250 -> 0.050 |" in text
    assert "| outcome | 1.000 -> 0.333 | - |" in text  # 0 + 1 / step
    assert "| teacher | 2.000 -> 1.333 | - |" in text  # 1 + 1 / step


def test_the_table_shows_each_teachers_lead_over_its_base_with_an_interval_over_seeds(fake_ablation):
    def set_correct(seed, step, correct):
        path = fake_ablation / f"seed{seed}" / "teacher" / "validation" / f"step_{step:06d}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows:
            row["correct"] = correct.get(row["id"], [0, 0])
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    set_correct(0, 3, {"n1": [1, 1]})  # from 0 to NQ 0.5, HotpotQA 0: macro 0.25
    set_correct(1, 0, {"h1": [1, 1]})  # from HotpotQA 0.25 (macro 0.125) to NQ 0.25, HotpotQA 0.25
    set_correct(1, 3, {"h1": [1, 1], "n1": [1, 0]})
    table = write_table2(fake_ablation, n_resamples=200)
    assert table["teachers"]["0"]["base_avg@1"] == 0 and table["teachers"]["0"]["lead"] == pytest.approx(0.25)
    assert table["teachers"]["1"]["base_avg@1"] == pytest.approx(0.125)
    assert table["teachers"]["1"]["lead"] == pytest.approx(0.125)
    lead = table["teacher_lead"]
    # leads 0.25 and 0.125: mean 0.1875, sd 0.125 / sqrt(2), t(0.975, df 1) = 12.7062
    half = 12.706204736174703 * (0.125 / 2**0.5) / 2**0.5
    assert (lead["mean"], lead["low"], lead["high"]) == pytest.approx((0.1875, 0.1875 - half, 0.1875 + half))
    text = (fake_ablation / "table2.md").read_text()
    assert ("seed 0 0.00 -> 25.00 (+25.00); seed 1 12.50 -> 25.00 (+12.50). Mean lead +18.75 "
            f"[95% t-CI {100 * (0.1875 - half):+.2f}, {100 * (0.1875 + half):+.2f}]") in text


def test_the_header_names_the_bases_of_the_seeds_in_the_table_only(fake_ablation):
    """A table of the seeds finished so far names their bases, not every base the plan holds."""
    from benchmarks.table2.render import markdown

    table = write_table2(fake_ablation, n_resamples=200)
    table["bases"] = {"seed0": {"weight_hash": "a"}, "seed1": {"weight_hash": "b"}, "seed2": {"weight_hash": "c"}}
    assert table["seeds"] == [0, 1] and "(preset micro, base weights a, b);" in markdown(table)


def test_a_table_without_base_seeds_lists_no_bases():
    """Tables made before --base-seeds (docs/table2_micro/table2.json) render as before."""
    from benchmarks.table2.render import base_sharing

    assert base_sharing({"seeds": [0, 1], "bases": {"seed0": {"weight_hash": "a"}, "seed1": {"weight_hash": "b"}}}) == ""
    own = base_sharing({"seeds": [0, 1], "bases": {"seed0": {"weight_hash": "a", "base_seed": 0},
                                                   "seed1": {"weight_hash": "b", "base_seed": 1}}})
    assert own == "Bases: base seed 0 (weights a): seed 0; base seed 1 (weights b): seed 1."


def test_the_table_names_the_machine_of_each_seed():
    """Runs from two machines (an ablation continued on a new one) are grouped by CPU, whole
    seeds named as seeds; versions are listed once when every run had the same."""
    from benchmarks.table2.render import machines
    from benchmarks.table2.table import _environment

    amd = {"cpu_model": "AMD EPYC", "cpu_vendor": "AuthenticAMD", "cpu_capability": "AVX512",
           "versions": {"torch": "2.13.0+cpu"}}
    intel = {**amd, "cpu_model": "Intel Xeon", "cpu_vendor": "GenuineIntel"}
    runs = {"seed0/teacher": amd, "seed0/opd": amd, "seed1/teacher": intel, "seed1/opd": amd}
    env = _environment([{"run": name, "environment": e} for name, e in runs.items()])
    assert env == {"differs": [{"environment": amd, "runs": ["seed0/teacher", "seed0/opd", "seed1/opd"]},
                               {"environment": intel, "runs": ["seed1/teacher"]}]}
    assert machines({"environment": env, "runs": dict.fromkeys(runs)}) == (
        "Machines: AMD EPYC (AuthenticAMD, AVX512): seed0, seed1/opd; Intel Xeon (GenuineIntel, AVX512): "
        "seed1/teacher. Library versions in every run: torch 2.13.0+cpu.")
    one = _environment([{"run": "seed0/opd", "environment": amd}])
    assert one == amd and machines({"environment": one, "runs": {"seed0/opd": 1}}).startswith(
        "Machines: AMD EPYC (AuthenticAMD, AVX512): seed0. ")
    unrecorded = _environment([{"run": "seed0/opd"}, {"run": "seed1/opd", "environment": amd}])
    assert "not recorded: seed0" in machines({"environment": unrecorded, "runs": {"seed0/opd": 1, "seed1/opd": 1}})
    assert "versions differ" in machines({"environment": unrecorded, "runs": {"seed0/opd": 1, "seed1/opd": 1}})
    assert _environment([{"run": "seed0/opd"}]) is None and machines({"environment": None}) == ""


def test_the_command_line_takes_base_seeds(tmp_path):
    import argparse

    from benchmarks.__main__ import main
    from benchmarks.table2.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--seeds", "6", "--base-seeds", "3"]).base_seeds == 3
    assert parser.parse_args([]).base_seeds is None
    with pytest.raises(SystemExit, match="base_seeds=0"):
        main(["ablate", "--out", str(tmp_path / "t2"), "--base-seeds", "0"])
    assert not (tmp_path / "t2").exists()


def test_base_seed_in_the_config_and_what_python_m_algos_train_builds(tmp_path, monkeypatch):
    """Unset, a run's base is its seed's (as before base_seed existed); set, the base's seed."""
    import algos.pipeline as pipeline
    from algos.config import TrainConfig, parse_overrides
    from algos.pipeline import run_pipeline

    assert TrainConfig(teacher="base").base_seed is None and TrainConfig(teacher="base", seed=4).build_seed == 4
    assert TrainConfig(teacher="base", seed=4, base_seed=1).build_seed == 1
    with pytest.raises(ValueError, match="base_seed=-1"):
        TrainConfig(teacher="base", base_seed=-1)
    assert parse_overrides(["base_seed=none", "seed=2"]) == {"base_seed": None, "seed": 2}
    assert parse_overrides(["base_seed=3"]) == {"base_seed": 3}
    asked = []

    class Stop(Exception):
        pass

    def prepare(model, *, seed=0, progress=True, build=True):
        asked.append((model, seed))
        raise Stop

    monkeypatch.setattr(pipeline, "prepare_model", prepare)
    for overrides, base in (({"seed": 3}, 3), ({}, 0), ({"seed": 3, "base_seed": 1}, 1)):
        asked.clear()
        with pytest.raises(Stop):
            run_pipeline("micro", tmp_path / str(len(overrides)), overrides=overrides, progress=False,
                         log=lambda *_: None)
        assert asked == [("micro", base)], overrides


# ---------------------------------------------------------------------- the step-0 validation, computed once


def _tiny_settings(tiny_dirs, **extra):
    return dict(model=tiny_dirs["policy"], steps=1, questions_per_step=1, group_size=2, learning_rate=1e-3,
                max_turn_tokens=8, max_context_tokens=512, max_waves=1, max_searchers=1, max_searcher_turns=2,
                num_candidates=2, val_per_dataset=2, val_datasets=("nq", "hotpotqa"), train_datasets=("nq",),
                eval_every=100, save_every=1, max_row_tokens=512, generation_batch_size=8, sample_episodes=3,
                stage="team", **extra)


def _files(run_dir):
    """Every file a run wrote that validation or training decides, as bytes (metrics.jsonl
    without its timings), by path."""
    out = {}
    for path in sorted(Path(run_dir).rglob("*.jsonl")):
        text = path.read_bytes()
        if path.name == "metrics.jsonl":
            rows = [json.loads(line) for line in text.splitlines()]
            text = json.dumps([{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]).encode()
        out[str(path.relative_to(run_dir))] = text
    return out


# slow (17 s), the proof behind the reuse: the tiny end-to-end ablation
# (test_the_real_learner_runs_the_ablation_on_a_tiny_model) checks in every run that a variant
# takes another's step-0 records; this one that they are the bytes it would have computed
@pytest.mark.slow
def test_a_reused_step0_validation_is_byte_for_byte_what_the_run_computes(tmp_path, tiny_dirs, torch_one_thread):
    """opd computes its step-0 validation; ``base`` (another Teacher: the sample's values
    differ) run twice, computing it and taking opd's: every file the same, the training
    after it too. The Prompted-Critic variant's step 0 likewise."""
    from conftest import WORLD, KeywordRetriever

    from algos.config import TrainConfig
    from algos.trainer import Trainer
    from benchmarks.table2.ablate import adopt_step0, train_run
    from benchmarks.table2.runs import step0_key

    retriever = KeywordRetriever(WORLD)

    def config(name, **extra):
        return TrainConfig(**_tiny_settings(tiny_dirs, out_dir=str(tmp_path / name), **extra))

    source = config("opd", teacher=tiny_dirs["teacher"])
    assert train_run(source, resume=False, progress=False, retriever=retriever)["step0_reused_from"] is None
    own = train_run(config("base_own", teacher="base"), resume=False, progress=False, retriever=retriever,
                    step0_from=[str(tmp_path / "nothing_there")])
    taken = train_run(config("base_taken", teacher="base"), resume=False, progress=False, retriever=retriever,
                      step0_from=[str(tmp_path / "nothing_there"), str(tmp_path / "opd")])
    assert (own["step0_reused_from"], taken["step0_reused_from"]) == (None, str(tmp_path / "opd"))
    a, b = _files(tmp_path / "base_own"), _files(tmp_path / "base_taken")
    assert set(a) == {"metrics.jsonl", "validation/step_000000.jsonl", "validation/step_000001.jsonl",
                      "samples/val_step_000000.jsonl", "samples/val_step_000001.jsonl", "samples/step_000001.jsonl"}
    assert a == b
    opd = _files(tmp_path / "opd")
    assert opd["validation/step_000000.jsonl"] == a["validation/step_000000.jsonl"]
    assert opd["samples/val_step_000000.jsonl"] != a["samples/val_step_000000.jsonl"]  # the values are each run's
    # the Prompted Critic's variant (a second copy of the base loaded): its step 0 alike
    for name, reuse in (("critic_own", False), ("critic_taken", True)):
        trainer = Trainer(config(name, teacher=tiny_dirs["teacher"], searcher_signal="critic"), progress=False,
                          retriever=retriever)
        if reuse:
            assert adopt_step0(trainer, tmp_path / "opd")
        else:
            trainer.log_metrics({"val/avg@1": trainer.validate()}, step=0)
        trainer.close()
    assert _files(tmp_path / "critic_own") == _files(tmp_path / "critic_taken")
    # not taken: another seed's (its sampler's seed), a run that recorded no config yet
    other = Trainer(config("seed1", teacher="base", seed=1), progress=False, retriever=retriever)
    assert step0_key(other.config.to_dict()) != step0_key(source.to_dict())
    assert not adopt_step0(other, tmp_path / "opd")
    assert not (tmp_path / "opd" / "run.json").exists()  # (execute writes it): taken above by its checkpoint's config
    for checkpoint in (tmp_path / "opd" / "checkpoints").glob("step_*"):
        (checkpoint / "trainer_state.pt").unlink(missing_ok=True)
    running = Trainer(config("running", teacher="base"), progress=False, retriever=retriever)
    assert adopt_step0(running, tmp_path / "opd")  # no checkpoint yet, but its started.json
    assert _files(tmp_path / "running")["validation/step_000000.jsonl"] == a["validation/step_000000.jsonl"]
    (tmp_path / "opd" / STARTED_FILE).unlink()
    same = Trainer(config("unrecorded", teacher="base"), progress=False, retriever=retriever)
    assert not adopt_step0(same, tmp_path / "opd")
    assert [path for name in ("seed1", "unrecorded") for path in (tmp_path / name).rglob("*.jsonl")] == []
    for trainer in (other, running, same):
        trainer.close()


def test_the_ablation_computes_each_seeds_step0_validation_once(tmp_path, monkeypatch):
    """The orchestration: each run is offered its seed's other variants, the first computes,
    the others take it; run.json says which. (The fake adopts what a finished run has.)"""
    def adopting(config, *, resume, progress=True, retriever=None, step0_from=()):
        done = [d for d in step0_from if Path(d, "run.json").exists()]
        return {**fake_train(config, resume=resume), "step0_reused_from": done[0] if done else None}

    monkeypatch.setattr("algos.presets.prepare_model", lambda model, **_: model)
    lines = []
    plan = run_ablation("micro", tmp_path, [0, 1], ["opd", "none", "base"], SETTINGS, progress=False,
                        log=lines.append, train=adopting)
    # 8 runs validating at steps 0 and 2; each seed's none and base take opd's step 0
    assert "  validations: 12 (4 step-0 validations taken from a variant of the same seed and base; 16 without)" \
        in lines
    assert {name: r["step0_validation"] for name, r in plan["runs"].items()} == {
        **{f"seed{s}/teacher": "computed" for s in (0, 1)}, **{f"seed{s}/opd": "computed" for s in (0, 1)},
        **{f"seed{s}/{v}": f"reused from seed{s}/opd" for s in (0, 1) for v in ("none", "base")}}


def test_a_taken_pass_rate_filter_trains_as_the_computed_one(tmp_path, tiny_dirs, torch_one_thread, monkeypatch):
    """A variant that takes another's kept questions (``train_questions.json``) trains on the
    same draws with the same rollout sampler as the run that sampled the filter itself: the
    filter's sampler is its own. (The filter's outcomes are made up: a random tiny model is
    never right.)"""
    from types import SimpleNamespace

    from conftest import WORLD, KeywordRetriever

    import algos.trainer
    from algos.config import TrainConfig
    from benchmarks.table2.ablate import train_run

    real_collect = algos.trainer.collect

    def collect(env_fn, sampler, questions, group_size, seed, progress):
        groups = real_collect(env_fn, sampler, questions, group_size, seed=seed, progress=progress)
        if seed != 999_979:  # validation
            return groups
        return [[SimpleNamespace(team_em=float(k < i % group_size)) for k in range(group_size)]
                for i in range(len(questions))]

    monkeypatch.setattr(algos.trainer, "collect", collect)
    retriever = KeywordRetriever(WORLD)
    settings = {**_tiny_settings(tiny_dirs, teacher="base", pass_rate_filter=3, train_per_dataset=6),
                "steps": 2, "questions_per_step": 2}
    computed = train_run(TrainConfig(**settings, out_dir=str(tmp_path / "computed")), resume=False,
                         progress=False, retriever=retriever)
    taken = train_run(TrainConfig(**settings, out_dir=str(tmp_path / "taken")), resume=False, progress=False,
                      retriever=retriever, step0_from=[str(tmp_path / "computed")])
    assert (computed["step0_reused_from"], taken["step0_reused_from"]) == (None, str(tmp_path / "computed"))
    kept = json.loads((tmp_path / "computed" / "train_questions.json").read_text())
    assert kept["pool"] == 6 and [q["right"] for q in kept["kept"]] == [1, 2, 1, 2]  # 0 and 3 of 3 dropped
    assert (tmp_path / "taken" / "train_questions.json").read_bytes() == (
        tmp_path / "computed" / "train_questions.json").read_bytes()
    a, b = _files(tmp_path / "computed"), _files(tmp_path / "taken")
    assert a == b and "samples/step_000002.jsonl" in a
    assert {"step": 0, "stage": "team", "data/train_questions": 4.0, "data/train_pool": 6.0} in json.loads(
        a["metrics.jsonl"])
    asked = {json.loads(line)["question"]["id"] for name in ("samples/step_000001.jsonl", "samples/step_000002.jsonl")
             for line in a[name].decode().splitlines() if '"question"' in line}
    assert asked and asked <= {q["id"] for q in kept["kept"]}


def test_a_second_ablation_into_a_directory_in_use_is_refused(tmp_path, monkeypatch):
    from algos.runlock import RunLockedError, run_lock

    monkeypatch.setattr("algos.presets.prepare_model", lambda model, **_: model)
    TRAINED.clear()
    with run_lock(tmp_path, log=lambda _: None, command="the first ablation"):
        with pytest.raises(RunLockedError, match="command 'the first ablation'"):
            run_ablation("micro", tmp_path, [0], ["opd"], {"steps": 3}, progress=False, log=lambda _: None,
                         train=fake_train)
    assert TRAINED == [] and not (tmp_path / "seed0").exists()
    run_ablation("micro", tmp_path, [0], ["opd"], {"steps": 3}, progress=False, log=lambda _: None, train=fake_train)
    assert TRAINED == ["seed0/teacher", "seed0/opd"]  # free once the first let go


def fake_base_build(model, *, seed, progress):
    """A worker's base build (``benchmarks.table2.ablate._build_base_in_child``) that proves what ran
    beside it: it leaves its mark, then waits (at most 60 s) for the other base's mark, or,
    for the seed in ``FAKE_LATE_BASE``, for a run's metrics under ``FAKE_RUNS``."""
    import torch

    marks = Path(os.environ["FAKE_BASE_MARKS"])
    marks.mkdir(exist_ok=True)
    (marks / f"{seed}").write_text(json.dumps({"pid": os.getpid(), "threads": torch.get_num_threads(),
                                               "model": model, "progress": progress,
                                               "refresh_s": os.environ.get("TQDM_MININTERVAL")}))
    late = str(seed) == os.environ.get("FAKE_LATE_BASE")
    deadline = time.monotonic() + 60
    while not (any(Path(os.environ["FAKE_RUNS"]).glob("seed*/*/metrics.jsonl")) if late
               else len(list(marks.iterdir())) >= 2):
        if time.monotonic() > deadline:
            raise TimeoutError("nothing ran beside this base's build")
        time.sleep(0.05)
    print(f"built {model} {seed}")
    return str(marks / f"{seed}")


def staged_fake_train(config, *, resume, progress=True, retriever=None, step0_from=()):
    """fake_train with time in it: a run that takes no step 0 from ``step0_from`` spends 1.5 s
    computing it, then writes its step-0 row; then 1.5 s of training. Logs to the file
    ``FAKE_EVENTS`` (the workers are processes) when each run started, which run it took its
    step 0 from, and when its own step 0 was done."""
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{out.parent.name}/{out.name}"

    def event(text):
        with open(os.environ["FAKE_EVENTS"], "a") as f:
            f.write(f"{name} {text}\n")

    took = next((Path(d).name for d in step0_from if '"step": 0' in _text(Path(d) / "metrics.jsonl")), None)
    event(f"started, step 0 taken from {took}")
    if took is None:
        time.sleep(1.5)
        (out / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/avg@1": 0.0}) + "\n")
        event("step 0 done")
    time.sleep(1.5)
    return fake_train(config, resume=True, progress=progress, step0_from=step0_from)


def _text(path):
    return path.read_text() if path.is_file() else ""


def test_a_variant_waits_for_the_step_0_another_variant_is_computing(tmp_path, monkeypatch):
    """Two jobs, two variants ready at once with the same step-0 key: the second starts
    only once the first's step 0 is done and takes it, instead of computing it again."""
    monkeypatch.setattr("algos.presets.prepare_model", lambda model, **_: model)
    monkeypatch.setenv("FAKE_EVENTS", str(tmp_path / "events"))
    monkeypatch.setattr("benchmarks.table2.ablate.STEP0_POLL_S", 0.2)
    run_ablation("micro", tmp_path / "runs", [0], ["opd", "outcome"], {"steps": 2}, jobs=2, progress=False,
                 log=lambda _: None, train=staged_fake_train)
    events = (tmp_path / "events").read_text().splitlines()
    assert events == ["seed0/teacher started, step 0 taken from None", "seed0/teacher step 0 done",
                      "seed0/opd started, step 0 taken from None", "seed0/opd step 0 done",
                      "seed0/outcome started, step 0 taken from opd"]


def test_two_jobs_build_the_missing_bases_in_workers_and_start_a_base_s_runs_beside_the_next_build(
        tmp_path, monkeypatch):
    """Bases 0, 2 and 3 are missing (1 is built): two workers build 0 and 2 at once, then base
    3 is built beside seed 0's run, not alone (base 3 waits for a run's metrics); every run
    trains from its own seed's base."""
    asked = []
    monkeypatch.setattr("algos.presets.prepare_model", _fake_bases(tmp_path, asked))
    # (the workers inherit these)
    monkeypatch.setenv("FAKE_BASE_MARKS", str(tmp_path / "marks"))
    monkeypatch.setenv("FAKE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("FAKE_LATE_BASE", "3")
    _fake_bases(tmp_path, [])("micro", seed=1)
    lines = []
    plan = run_ablation("micro", tmp_path / "runs", [0, 1, 2, 3], ["base"], {"steps": 2}, jobs=2, progress=False,
                        log=lines.append, train=fake_train, build=fake_base_build)
    marks = {int(p.name): json.loads(p.read_text()) for p in (tmp_path / "marks").iterdir()}
    assert sorted(marks) == [0, 2, 3]
    assert all(m["pid"] != os.getpid() and m["threads"] == 1 and m["model"] == "micro"
               and m["progress"] is True and m["refresh_s"] == "30" for m in marks.values())
    assert marks[0]["pid"] != marks[2]["pid"]
    assert (tmp_path / "runs" / "base-micro-seed0.log").read_text() == "built micro 0\n"
    assert [line for line in lines if "built:" in line][-1] == (
        f"base micro of seed 3 built: {tmp_path / 'marks' / '3'} (weights None)")  # (a file of JSON, no weights)
    assert lines.index("[base micro of seed 3] building in a worker process "
                       f"(its log: {tmp_path / 'runs' / 'base-micro-seed3.log'})") > 0
    models = {name: r["config"]["model"] for name, r in plan["runs"].items()}
    assert models == {"seed0/base": str(tmp_path / "marks" / "0"), "seed1/base": str(tmp_path / "bases" / "micro-1"),
                      "seed2/base": str(tmp_path / "marks" / "2"), "seed3/base": str(tmp_path / "marks" / "3")}
    assert [plan["bases"][f"seed{s}"]["model"] for s in range(4)] == list(models.values())
    # one job: the bases are built in this process, with their progress, before each run
    asked.clear()
    run_ablation("micro", tmp_path / "one", [4], ["base"], {"steps": 2}, progress=False, log=lines.append,
                 train=fake_train, build=fake_base_build)
    assert (4, True) in asked and sorted(marks) == [0, 2, 3]


def test_a_table_s_archives_restore_its_runs_and_the_ablation_goes_on_from_them(fake_ablation, tmp_path_factory,
                                                                                  monkeypatch):
    """What a new machine does with committed archives: restore, then the same ablation trains
    only what is missing, and the table of the restored runs is the table they were written in."""
    from benchmarks.table2.archive import PUBLISHED_CURVES, RUNS_FILE, publish_table, restore_runs

    table = write_table2(fake_ablation, n_resamples=300)
    assert table["run_records"] == RUNS_FILE
    committed = tmp_path_factory.mktemp("docs")
    written = publish_table(fake_ablation, committed)
    assert sorted(p.name for p in written) == sorted(["table2.json", RECORDS_FILE, METRICS_FILE, RUNS_FILE,
                                                      PUBLISHED_CURVES])
    for name in (RECORDS_FILE, METRICS_FILE, RUNS_FILE):
        assert (committed / name).read_bytes() == (fake_ablation / name).read_bytes()
    assert (committed / PUBLISHED_CURVES).read_bytes() == (fake_ablation / "curves.png").read_bytes()
    assert json.loads((committed / "table2.json").read_text()) == {**table, "curves_png": PUBLISHED_CURVES}
    with pytest.raises(ValueError, match="no written table"):
        publish_table(committed / "nothing", committed)
    out = tmp_path_factory.mktemp("fresh") / "t2"
    restored = restore_runs(committed / "table2.json", out)
    assert sorted(restored) == sorted(table["runs"])  # both seeds have every variant: their Teachers too
    again = write_table2(out, n_resamples=300)
    assert again["rows"] == table["rows"] and again["teachers"] == table["teachers"]
    assert again["runs"] == table["runs"] and again["seeds"] == [0, 1]
    assert (out / RECORDS_FILE).read_bytes() == (fake_ablation / RECORDS_FILE).read_bytes()
    assert (out / METRICS_FILE).read_bytes() == (fake_ablation / METRICS_FILE).read_bytes()
    assert restore_runs(committed / "table2.json", out) == []  # what is there is kept
    # the same ablation with one seed more trains that seed only; other settings are refused
    TRAINED.clear()
    run_ablation("micro", out, [0, 1, 2], ["opd", "outcome"], {"steps": 3}, progress=False,
                 log=lambda _: None, train=fake_train)
    assert TRAINED == ["seed2/teacher", "seed2/opd", "seed2/outcome"]
    with pytest.raises(ValueError, match="settings"):
        run_ablation("micro", out, [0, 1], ["opd", "outcome"], {"steps": 4}, progress=False, train=fake_train)


def test_a_seed_restored_without_all_its_variants_trains_its_teacher_again(fake_ablation, tmp_path_factory):
    from benchmarks.table2.archive import restore_runs

    (fake_ablation / "seed1" / "outcome" / "run.json").unlink()  # seed 1's outcome did not finish
    write_table2(fake_ablation, n_resamples=100)
    out = tmp_path_factory.mktemp("fresh")
    restored = restore_runs(fake_ablation / "table2.json", out)
    assert sorted(restored) == ["seed0/opd", "seed0/outcome", "seed0/teacher", "seed1/opd"]
    assert not (out / "seed1" / "teacher").exists()  # its checkpoint is what outcome would start from
    # the plan's variants count, not the table's finished ones: with no outcome finished at all,
    # no Teacher comes back (the ablation's outcome runs start from them)
    for seed in (0, 1):
        (fake_ablation / f"seed{seed}" / "outcome" / "run.json").unlink(missing_ok=True)
    table = write_table2(fake_ablation, n_resamples=100)
    assert table["variants"] == ["opd"] and table["planned_variants"] == ["opd", "outcome"]
    assert sorted(restore_runs(fake_ablation / "table2.json", tmp_path_factory.mktemp("again"))) == [
        "seed0/opd", "seed1/opd"]
    TRAINED.clear()
    run_ablation("micro", out, [0, 1], ["opd", "outcome"], {"steps": 3}, progress=False,
                 log=lambda _: None, train=fake_train)
    assert TRAINED == ["seed1/teacher", "seed1/outcome"]


def test_restoring_from_a_table_without_its_archives_names_what_is_missing(fake_ablation, tmp_path):
    from benchmarks.table2.archive import RUNS_FILE, restore_runs

    write_table2(fake_ablation, n_resamples=100)
    (fake_ablation / RUNS_FILE).unlink()
    with pytest.raises(ValueError, match=f"cannot read the archives.*{RUNS_FILE}"):
        restore_runs(fake_ablation / "table2.json", tmp_path / "x")
    old = json.loads((fake_ablation / "table2.json").read_text())
    del old["run_records"]  # a table written before the runs archive
    (fake_ablation / "old.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="old.json: not a table2.json with its archives"):
        restore_runs(fake_ablation / "old.json", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_the_table2_command_restores_then_tables(fake_ablation, tmp_path_factory, capsys):
    from benchmarks.__main__ import main

    write_table2(fake_ablation, n_resamples=100)
    out = tmp_path_factory.mktemp("fresh") / "t2"
    assert main(["table2", "--restore", str(fake_ablation / "table2.json"), str(out), "--resamples", "100"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"restored 6 finished runs from {fake_ablation / 'table2.json'} into {out}: seed0/")
    assert (out / "table2.md").is_file() and f"wrote {out / 'table2.json'}" in printed
    docs = out.parent / "docs"
    assert main(["table2", str(out), "--resamples", "100", "--publish", str(docs)]) == 0
    assert f"published table2.json, table2_records.jsonl.gz, table2_metrics.jsonl.gz, table2_runs.jsonl.gz, " \
           f"table2_curves.png into {docs}" in capsys.readouterr().out
    assert json.loads((docs / "table2.json").read_text())["curves_png"] == "table2_curves.png"
    with pytest.raises(SystemExit, match="error: .*missing.json: not a table2.json"):
        main(["table2", "--restore", str(out / "missing.json"), str(out)])


@pytest.mark.parametrize(("old", "names"), [
    ("benchmarks.table2", "build_table markdown validation_searches write_table2 validation_records base_sharing "
                          "machines _environment _bases_trained_from multiplicity ablate_command table_command"),
    ("benchmarks.ablate", "STARTED_FILE VARIANTS STEP0_FREE STEP0_POLL_S plan_runs run_state step0_key run_ablation "
                          "adopt_step0 train_run add_arguments"),
    ("benchmarks.table2_stats", "comparisons_from_records is_two_choice pooled_over_seeds multiplicity"),
    ("benchmarks.table2_archive", "METRICS_FILE RECORDS_FILE RUNS_FILE MAX_LINE_BYTES PUBLISHED_CURVES read_records "
                                  "write_gzip_jsonl publish_table restore_runs"),
])
def test_the_modules_that_became_the_package_keep_their_names(old, names):
    """What tests, docs and recipes imported from the four modules that became benchmarks/table2/
    still imports from their names, each the very object of the module that holds it now."""
    import importlib

    from benchmarks.table2 import MODULES

    module = importlib.import_module(old)
    for name in names.split():
        home = next(m for m in MODULES if name in vars(importlib.import_module(f"benchmarks.table2.{m}")))
        assert getattr(module, name) is getattr(importlib.import_module(f"benchmarks.table2.{home}"), name), name
    assert not hasattr(module, "nothing_here")


def test_the_parser_loads_no_table_module():
    """``python -m benchmarks`` builds its parser from benchmarks.table2.cli, and the old name
    benchmarks.ablate resolves lazily: neither loads the table (numpy, algos.mechanism) or torch."""
    import subprocess
    import sys

    code = ("import sys, benchmarks.ablate; from benchmarks.table2.cli import add_arguments; "
            "print(sorted(m for m in sys.modules if m.startswith('benchmarks.table2.') or m == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['benchmarks.table2.cli', 'benchmarks.table2.runs']"


def test_a_killed_ablation_takes_its_worker_processes_with_it(tmp_path):
    """A worker's parent killed with SIGKILL (no cleanup runs): the worker ends by itself
    within seconds, instead of training on into run folders the next ablation takes over."""
    import signal
    import subprocess
    import sys

    script = (
        "import os, sys, time\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from multiprocessing import get_context\n"
        "from benchmarks.table2.ablate import die_with_parent\n"
        "if __name__ == '__main__':\n"
        "    pool = ProcessPoolExecutor(1, mp_context=get_context('spawn'), initializer=die_with_parent,\n"
        "                               initargs=(os.getpid(), 0.1))\n"
        "    print(pool.submit(os.getpid).result(), flush=True)\n"
        "    pool.submit(time.sleep, 600)\n"
        "    time.sleep(600)\n")
    (tmp_path / "parent.py").write_text(script)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    worker = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(worker, signal.SIGKILL)
    pytest.fail(f"worker {worker} outlived its killed parent by 30 s")
