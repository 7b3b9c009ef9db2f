"""The positive control's wiring (docs/positive_control.md, algos.recipes.micro.control): a
Teacher planted into an ablation's directory is the Teacher its Stage-II variants take and is
never trained by Stage I; the table labels it and reads its lead; the mixed team routes each
role to its model; the Teacher's SFT data are cut to its roles. No model is built here: the
builds, checks and training are fakes that write what the real ones write."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from algos.recipes.micro import control
from benchmarks.table2.ablate import run_ablation
from benchmarks.table2.render import write_table2

QUESTIONS = [("nq", "n1"), ("nq", "n2"), ("hotpotqa", "h1"), ("hotpotqa", "h2")]
TRAINED: list[str] = []


def _records(correct: list[int], searches: int = 1) -> list[dict]:
    return [{"dataset": d, "id": q, "question": f"who founded {q}?", "golden_answers": ["Krestus Pirnvik"],
             "correct": [c], "searches": [searches], "invalid_turns": [0], "input_tokens": [100],
             "output_tokens": [20]} for (d, q), c in zip(QUESTIONS, correct)]


FINAL = {"opd": [1, 1, 1, 0], "none": [1, 0, 0, 0], "base": [0, 0, 1, 0]}
"""Each Stage-II variant's final validation (one run per question), every seed alike but
seed 1, whose opd answers one question fewer."""


def fake_train(config, *, resume, progress=True, retriever=None, step0_from=()):
    """What the learner writes, without training (a module-level function, as ablate wants)."""
    out = Path(config.out_dir)
    TRAINED.append(f"{out.parent.name}/{out.name}")
    assert config.stage == "team", "a planted seed must never train a Stage-I Teacher"
    assert config.teacher in ("base", str(out.parent / "teacher"))
    final = list(FINAL[out.name])
    if out.name == "opd" and config.seed == 1:
        final[0] = 0
    (out / "validation").mkdir(parents=True, exist_ok=True)
    for step, correct in ((0, [0, 0, 1, 0]), (config.steps, final)):
        (out / "validation" / f"step_{step:06d}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in _records(correct)))
    (out / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/avg@1": 0.25}) + "\n")
    return {"steps": config.steps, "final_validation": f"validation/step_{config.steps:06d}.jsonl",
            "val_avg@1": sum(final) / 4}


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """Seeds 0 and 1 planted by control.plant with fake builds and checks: the base answers
    1 of 4 test questions, the Teacher 3."""
    bases = {s: tmp_path / f"base{s}" for s in (0, 1)}
    for path in bases.values():
        path.mkdir()
        (path / "config.json").write_text("{}")
    monkeypatch.setattr(control, "micro_base", lambda seed, **_: str(bases[seed]))  # plant's base
    monkeypatch.setattr("algos.commands.presets.prepare_model", lambda model, seed=0, **_: str(bases[seed]))  # ablate's

    def build_teacher(base, *, seed, progress=True, **overrides):
        teacher = tmp_path / f"teacher{seed}"
        teacher.mkdir(exist_ok=True)
        (teacher / "config.json").write_text("{}")
        (teacher / "control_teacher.json").write_text(json.dumps(
            {"key": {"threads": 1}, "weight_hash": f"t{seed}", "episodes": 700, "steps": 40,
             "loss_first_100": 1.0, "loss_last_100": 0.5, "seconds": 1.0}))
        return teacher

    def check_teacher(seed, base, teacher, *, splits, retriever=None, progress=True):
        assert splits == ("test",)
        runs = {"base": _records([0, 0, 1, 0], 0), "teacher": _records([1, 1, 1, 0], 2),
                "base_with_teacher_searchers": _records([1, 0, 1, 0], 2)}
        got = {name: control.figures(rows) for name, rows in runs.items()}
        got["lead"] = got["teacher"]["macro_avg@1"] - got["base"]["macro_avg@1"]
        got["searcher_lead"] = got["base_with_teacher_searchers"]["macro_avg@1"] - got["base"]["macro_avg@1"]
        return {"seed": seed, "splits": {"test": got}, "skip_probability": {"base": 0.58, "teacher": 0.02},
                "_records": {"test": runs}}

    monkeypatch.setattr(control, "build_teacher", build_teacher)
    monkeypatch.setattr(control, "check_teacher", check_teacher)
    out = tmp_path / "control"
    checks = control.plant(out, [0, 1], progress=False)
    return out, checks


def test_figures_are_the_macro_by_hand():
    # NQ (1 + 1) / 2 = 1, HotpotQA (1 + 0) / 2 = 0.5: macro 0.75 (the mean over questions would be 0.75 too;
    # with unequal datasets it differs: NQ 1 of 1, HotpotQA 0 of 3 -> macro 0.5, mean 0.25)
    assert control.figures(_records([1, 1, 1, 0]))["macro_avg@1"] == pytest.approx(0.75)
    rows = _records([1, 0, 0, 0])
    rows[1]["dataset"] = "hotpotqa"
    got = control.figures(rows)
    assert (got["macro_avg@1"], got["right"], got["questions"]) == (pytest.approx(0.5), 1, 4)


def test_a_planted_teacher_is_a_finished_run_with_its_lead(planted):
    out, checks = planted
    run = out / "seed0" / "teacher"
    record = json.loads((run / "run.json").read_text())
    assert record["planted"]["teacher_weight_hash"] == "t0" and record["workflow"] == "hierarchical"
    assert record["config"]["model"] == str(out.parent / "base0") and record["base_seed"] == 0
    assert (run / "config.json").is_file()  # the Teacher's weights: the run directory loads as the model
    assert len((run / "validation" / "step_000000.jsonl").read_text().splitlines()) == len(QUESTIONS)
    assert (run / "validation" / "step_000040.jsonl").is_file() and record["final_validation"].endswith("step_000040.jsonl")
    assert checks["0"]["splits"]["test"]["lead"] == pytest.approx(0.5)  # NQ 0 -> 1, HotpotQA 0.5 -> 0.5
    assert json.loads((run / "skip_probability.json").read_text())["final"] == 0.02
    # planted before: read back, not redone
    assert control.plant(out, [0], progress=False)["0"]["splits"]["test"]["lead"] == pytest.approx(0.5)


def test_the_ablation_takes_the_planted_teacher_and_the_table_labels_it(planted):
    out, _ = planted
    TRAINED.clear()
    run_ablation("micro_control", out, [0, 1], ["opd", "base", "none"], {"steps": 2}, base_seeds=4,
                 progress=False, log=lambda _: None, train=fake_train)
    assert sorted(TRAINED) == ["seed0/base", "seed0/none", "seed0/opd", "seed1/base", "seed1/none", "seed1/opd"]
    table = write_table2(out, n_resamples=200)
    assert table["rows"]["opd"]["teacher"] == "planted" and table["rows"]["base"]["teacher"] == "base"
    assert table["teachers"]["0"]["workflow"] == "hierarchical" and table["teacher_lead"]["mean"] == pytest.approx(0.5)
    # the two named comparisons are the table's headline family: Holm over 2
    found = table["multiplicity"]
    assert found["families"]["headline"] == 2
    none = next(c for c in found["comparisons"] if c["comparison"] == "none - opd (all questions)")
    # none - opd per seed: (0.5 - 1) = -0.5 and (0.5 - 0.75) = -0.25 (NQ 1 vs 0.5; HotpotQA 0.5 vs 0)
    assert table["rows"]["none"]["vs_opd"]["per_seed"] == pytest.approx({"0": -0.5, "1": -0.25})
    assert none["holm_headline"]["t"] >= none["t_p"]
    text = (out / "table2.md").read_text()
    assert "Planted Teachers (the base continued by SFT" in text and "(hierarchical, greedy, points)" in text


def test_the_mixed_team_routes_each_role_to_its_model():
    from envs import protocol as P

    class Echo:
        def __init__(self, name):
            self.name, self.seen = name, []

        def act(self, observations):
            self.seen.append(len(observations))
            return [f"{self.name}:{o.i}" for o in observations]

    searcher, team = Echo("s"), Echo("t")
    obs = [SimpleNamespace(role=role, i=i) for i, role in enumerate([P.LEADER, P.SEARCHER, P.SEARCHER, P.ANSWERER])]
    assert control.RoleRouter(searcher, team).act(obs) == ["t:0", "s:1", "s:2", "t:3"]
    assert control.RoleRouter(searcher, team).act(obs[1:3]) == ["s:1", "s:2"] and team.seen == [2]


def test_the_teacher_data_keep_the_right_episodes_cut_to_its_roles(monkeypatch):
    from envs.episode import Episode, Segment

    def seg(role):
        return Segment(agent=f"{role}_0", role=role, wave=0, token_ids=[1, 2], loss_mask=[0, 1])

    def episode(em):
        return Episode(question={"id": "q"}, workflow="hierarchical", team_em=em,
                       segments=[seg("leader"), seg("searcher"), seg("searcher"), seg("answerer")])

    monkeypatch.setattr("algos.recipes.micro.episodes.scripted_episodes", lambda *a, **k: [episode(1), episode(0)])
    kept = control.teacher_episodes(None, seed=0, settings=control.teacher_settings(roles=("searcher",)))
    assert len(kept) == 1 and [s.role for s in kept[0].segments] == ["searcher", "searcher"]
    every = control.teacher_episodes(None, seed=0, settings=control.teacher_settings())  # B: every role
    assert len(every) == 1 and [s.role for s in every[0].segments] == ["leader", "searcher", "searcher", "answerer"]
    with pytest.raises(ValueError, match="unknown Teacher setting"):
        control.teacher_settings(skip=0.1)
