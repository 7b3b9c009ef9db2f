"""The Table 2 ablation: the variants' configs, the table's numbers against hand-computed
ones from a fake trainer's records, the CI's unit, resuming a killed ablation, and one real
run of the learner on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.ablate import VARIANTS, plan_runs, run_ablation, run_state
from benchmarks.metrics import paired_macro_difference
from benchmarks.table2 import (
    METRICS_FILE,
    RECORDS_FILE,
    build_table,
    comparisons_from_records,
    is_two_choice,
    markdown,
    pooled_over_seeds,
    read_records,
    validation_searches,
    write_gzip_jsonl,
    write_table2,
)

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


def fake_train(config, *, resume, progress=True, retriever=None):
    """Writes what the learner writes (metrics.jsonl, per-question validations at steps 0 and
    ``steps``) without training: the final validation is CORRECT's."""
    out = Path(config.out_dir)
    if not resume and (out / "metrics.jsonl").exists():  # as the Trainer refuses to mix two runs
        raise FileExistsError(f"{out} already holds a run")
    run = f"{out.parent.name}/{out.name}"
    TRAINED.append(run + (" (resumed)" if resume else ""))
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
    assert "finished before" not in (tmp_path / "seed0" / "opd.log").read_text()
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
    assert sorted(asked) == [("micro", 0, True), ("micro", 1, True)]
    for name, record in plan["runs"].items():
        assert record["config"]["model"] == f"micro-seed{name[4]}", name
    assert {k: v["model"] for k, v in plan["bases"].items()} == {"seed0": "micro-seed0", "seed1": "micro-seed1"}
    asked.clear()  # seed 2 joins: seeds 0 and 1 are done, their bases looked up only
    plan = run_ablation("micro", tmp_path, [0, 1, 2], ["opd", "none"], SETTINGS, progress=False,
                        log=lambda _: None, train=fake_train)
    assert sorted(asked) == [("micro", 0, False), ("micro", 1, False), ("micro", 2, True)]
    assert set(plan["bases"]) == {"seed0", "seed1", "seed2"}
