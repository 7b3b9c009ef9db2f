"""Recipes above the learner: the micro preset is defined once, and only the command line and
the pipeline (through the preset registry's hooks) turn its model name into a built base."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from algos.commands.presets import PRESETS, RECIPES, prepare_model, preset_config
from algos.recipes.micro import settings


class Stop(Exception):
    pass


@pytest.fixture
def hooks(monkeypatch, tmp_path):
    """The micro recipe with its build replaced by a recorder (nothing is built)."""
    calls: list[tuple[tuple, dict]] = []
    base = tmp_path / "micro-base"

    def build(*args, **kwargs):
        calls.append((args, kwargs))
        return base

    monkeypatch.setitem(RECIPES, "micro", dataclasses.replace(RECIPES["micro"], build=build))
    return calls, base


def test_the_micro_preset_is_defined_once():
    assert PRESETS["micro"] is settings.TRAIN and RECIPES["micro"].train is settings.TRAIN
    assert RECIPES["micro"].env is settings.ENV
    assert {k: settings.TRAIN[k] for k in settings.ENV} == settings.ENV
    shape = preset_config("micro", stage="teacher").env_shape()
    assert {k: shape[k] for k in settings.ENV} == {"max_turn_tokens": 64, "max_context_tokens": 1024,
                                                   "max_waves": 2, "max_searchers": 2,
                                                   "max_searcher_turns": 3}


def test_a_recipe_is_named_as_its_preset_and_the_model_it_trains():
    assert sorted(RECIPES) == ["micro", "micro_facts", "micro_search", "paper_cpu", "tiny"]
    for name, recipe in RECIPES.items():
        assert recipe.name == name == recipe.train["model"] and PRESETS[name] is recipe.train


def test_reading_the_registry_imports_no_recipe_code():
    """A recipe names its build, model and tokenizer (algos.recipes.Lazy): reading the registry
    imports each recipe's settings and nothing that builds or makes a model."""
    import subprocess
    import sys

    code = ("import sys, algos.commands.presets; "
            "print(sorted(m for m in sys.modules if m.startswith('algos.recipes')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(sorted(
        ["algos.recipes"] + [f"algos.recipes.{r}{m}" for r in ("micro", "tiny", "paper_cpu") for m in ("", ".settings")]))


def test_only_a_recipes_model_name_is_prepared(hooks):
    calls, base = hooks
    assert prepare_model("smollm2") == "smollm2" and prepare_model("/some/model") == "/some/model"
    assert calls == []
    assert prepare_model("micro", progress=False) == str(base)
    assert calls == [((), {"seed": 0, "progress": False, "build": True})]


def test_the_pipeline_prepares_the_model_after_validation_and_hands_the_trainer_a_path(
        hooks, monkeypatch, tmp_path):
    import algos.commands.train

    calls, base = hooks
    seen = []

    def trainer(cfg, **kwargs):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr(algos.commands.train, "Trainer", trainer)
    with pytest.raises(ValueError, match="steps"):  # refused before anything is built
        algos.commands.train.run_pipeline("micro", tmp_path / "bad", ("teacher",), {"steps": 0},
                                    progress=False)
    assert calls == []
    with pytest.raises(Stop):
        algos.commands.train.run_pipeline("micro", tmp_path / "run", ("teacher",), progress=False)
    assert calls == [((), {"seed": 0, "progress": False, "build": True})]
    assert seen[0].model == str(base) and seen[0].stage == "teacher"
    assert seen[0].max_waves == settings.ENV["max_waves"]


def test_sft_preset_goes_to_the_recipes_build_with_the_options(hooks, tmp_path, capsys):
    from algos.commands.sft import main

    calls, base = hooks
    out = tmp_path / "out"
    assert main(["--preset", "micro", "--epochs", "2", "--skip-search", "0.3", "--out", str(out),
                 "--seed", "4", "--no-progress"]) == 0
    assert calls == [((out,), {"seed": 4, "progress": False, "epochs": 2, "skip_search": 0.3})]
    assert capsys.readouterr().out.strip() == str(base)


def test_the_tiny_build_gets_the_sft_options_but_not_skip_search(monkeypatch, tmp_path):
    import algos.recipes.tiny.build as build

    asked = []
    monkeypatch.setattr(build, "build_tiny_base", lambda *args, **kw: asked.append((args, kw)) or tmp_path)
    assert RECIPES["tiny"].build_base(tmp_path, seed=3, progress=False, epochs=2, lr=0.5,
                                      skip_search=0.3) == tmp_path
    assert asked == [((tmp_path,), {"seed": 3, "progress": False, "epochs": 2, "lr": 0.5})]


def test_the_paper_cpu_base_refuses_build_options(tmp_path):
    with pytest.raises(ValueError, match="takes no build options, got \\['epochs'\\]"):
        RECIPES["paper_cpu"].build_base(tmp_path / "never", progress=False, epochs=2)
    assert not (tmp_path / "never").exists()


def test_prepare_hook_builds_the_default_base(monkeypatch, tmp_path):
    """The real recipe asks the build for the default (cached) base and nothing else."""
    import algos.recipes.micro.build as build

    asked = []
    monkeypatch.setattr(build, "build_micro_base", lambda **kw: asked.append(kw) or Path(tmp_path))
    assert RECIPES["micro"].prepare_model(progress=False) == tmp_path
    assert asked == [{"seed": 0, "progress": False, "build": True}]


def test_the_micro_search_base_is_the_micro_build_with_its_skip_share(monkeypatch, tmp_path):
    """micro_search builds the micro base with skip_search 0.25 unless told otherwise, so
    ``sft --preset micro --skip-search 0.25`` and the preset share one cached base."""
    import algos.recipes.micro.build as build

    asked = []
    monkeypatch.setattr(build, "build_micro_base", lambda *args, **kw: asked.append((args, kw)) or Path(tmp_path))
    recipe = RECIPES["micro_search"]
    assert recipe.prepare_model(seed=2, progress=False) == tmp_path
    assert recipe.build_base(tmp_path, progress=False, skip_search=0.1, epochs=2) == tmp_path
    assert asked == [((None,), {"skip_search": 0.25, "seed": 2, "progress": False, "build": True}),
                     ((tmp_path,), {"skip_search": 0.1, "seed": 0, "progress": False, "epochs": 2})]
    assert recipe.env is RECIPES["micro"].env and recipe.train["val_per_dataset"] == 50
    different = {k for k in recipe.train if recipe.train[k] != RECIPES["micro"].train.get(k)}
    assert different == {"model", "val_per_dataset", "learning_rate", "pass_rate_filter", "questions_per_step",
                         "group_size", "train_per_dataset"}
    assert recipe.train["questions_per_step"] * recipe.train["group_size"] == 32  # micro's workflows per step


def test_the_micro_facts_base_is_the_micro_build_with_its_closed_book_settings(monkeypatch, tmp_path):
    """micro_facts builds the micro base with FACTS_BUILD unless told otherwise and trains
    with micro_search's settings on it."""
    import algos.recipes.micro.build as build

    asked = []
    monkeypatch.setattr(build, "build_micro_base", lambda *args, **kw: asked.append((args, kw)) or Path(tmp_path))
    recipe = RECIPES["micro_facts"]
    assert recipe.prepare_model(seed=1, progress=False) == tmp_path
    assert recipe.build_base(None, progress=False, facts=10) == tmp_path
    closed_book = {"skip_search": 0.25, "facts": 80, "recall": True, "known_worlds": (0,), "skip_known": 0.4,
                   "recall_practice": 150}
    assert asked == [((None,), {**closed_book, "seed": 1, "progress": False, "build": True}),
                     ((None,), {**closed_book, "facts": 10, "seed": 0, "progress": False})]
    assert recipe.train == {**RECIPES["micro_search"].train, "model": "micro_facts"}


def test_the_micro_tokenizers_copied_env_phrases_are_what_the_protocol_writes():
    """The micro tokenizer's training text copies some env phrases (frozen with its
    TOKENIZER_VERSION and the cached bases' weights); rewording a protocol template must
    show up here rather than silently leave the tokenizer behind."""
    from types import SimpleNamespace

    from algos.recipes.micro.tokenizer import _protocol_texts
    from envs import protocol as P

    texts = set(_protocol_texts())
    docs = [SimpleNamespace(title=t, text=t.lower()) for t in "ABC"]
    written = [
        P.WAVES_LEFT.format(waves_left=1), P.NO_WAVES_LEFT, P.LAST_TURN_NOTE, P.render_passages(docs),
        P.render_reports([(1, "In which city was Ana born?", ""), (2, "x", "y")]),
        *(P.INVALID_TURN.format(reason=r, reminder="") for r in (
            "no <search> or <summary> tag", "no <subtask> or <select> tag", "no <answer> tag", P.NO_WAVES_REASON)),
        P.write_subtasks(["task", "task"]) + P.write_select([1, 2]) + P.write("answer", 1976),
    ]
    assert [w for w in written if w not in texts] == []


def test_a_runs_env_shape_is_its_fields_named_as_team_settings():
    """TrainConfig.env_shape passes every field named as a TeamConfig field (no list of its
    own to keep in step), then env_kwargs; each recipe's ENV sets only team settings."""
    from algos.commands.presets import RECIPES
    from algos.config import TrainConfig
    from envs.team import TeamConfig

    assert TrainConfig(stage="teacher").env_shape() == {"max_turn_tokens": 256, "max_context_tokens": 4096, "max_waves": 3,
                                         "max_searchers": 3, "max_searcher_turns": 4, "num_candidates": 5,
                                         "top_k": 3}
    shape = TrainConfig(stage="teacher", max_waves=2, top_k=5, env_kwargs={"prompts": "short"}).env_shape()
    assert (shape["max_waves"], shape["top_k"], shape["prompts"]) == (2, 5, "short")
    with pytest.raises(TypeError, match="top_k"):  # env_kwargs cannot silently override a run setting
        TrainConfig(stage="teacher", env_kwargs={"top_k": 9}).env_shape()
    for name, recipe in RECIPES.items():
        assert set(recipe.env) <= set(TeamConfig.keywords()), name
