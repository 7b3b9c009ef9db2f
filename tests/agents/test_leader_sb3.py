"""The Gymnasium single-role view, the Leader's macro-action view, and a Leader trained with
stable-baselines3 that beats a random Leader on held-out questions and plays in benchmarks."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import QUESTION, WORLD, Doc, KeywordRetriever
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from agents.base import Observation
from agents.collect import collect
from agents.router import RoleRouter
from agents.scripted import ScriptedPolicy
from envs import search_team_v0
from envs.leader_view import FEATURES, LeaderMacro, LeaderMacroEnv, LeaderState, Proposal
from envs.observation import observe_awaiting
from envs.wrappers import SingleRoleEnv

torch.set_num_threads(1)


class IndexedKeywordRetriever(KeywordRetriever):
    """conftest's ranking (shared words, ties in corpus order), word sets built once."""

    def __init__(self, docs):
        super().__init__(docs)
        self._words = [set(f"{d.title} {d.text}".lower().split()) for d in self.docs]

    def search(self, queries, top_k=3):
        self.calls += 1
        out = []
        for q in queries:
            words = set(q.lower().split())
            best = sorted(range(len(self.docs)), key=lambda i: (-len(words & self._words[i]), i))[:top_k]
            out.append([Doc(self.docs[i].id, self.docs[i].title, self.docs[i].text,
                            float(len(words & self._words[i]))) for i in best])
        return out


@pytest.fixture(scope="module")
def synth_retriever():
    from envs.data.synthwiki import default_world

    rows = default_world().corpus
    return IndexedKeywordRetriever([Doc(r["id"], *r["contents"].split("\n", 1)) for r in rows])


@pytest.fixture(scope="module")
def splits():
    from algos.commands.train_leader_sb3 import synthetic_questions

    return synthetic_questions("train", 4), synthetic_questions("dev", 3)  # 28 train, 21 held out


def small_env(tokenizer, **kwargs):
    return search_team_v0.raw_env(tokenizer=tokenizer, retriever=KeywordRetriever(WORLD), questions=[QUESTION],
                                  **kwargs)


def checked(env_fn):
    """Both checkers on fresh envs; any SB3 warning fails the test."""
    check_env(env_fn(), skip_close_check=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sb3_check_env(env_fn())


# ---------------------------------------------------------------------------- SingleRoleEnv


@pytest.mark.parametrize("role", ["leader", "searcher", "answerer_1"])
def test_single_role_env_passes_both_checkers(tokenizer, role):
    checked(lambda: SingleRoleEnv(small_env(tokenizer), role, ScriptedPolicy(), render_mode="ansi"))


def test_single_role_leader_with_scripted_turns_reproduces_collect(tokenizer):
    scripted = ScriptedPolicy()
    env = SingleRoleEnv(small_env(tokenizer), "leader", scripted)
    obs, info = env.reset(seed=0)
    assert info["agent"] == "leader_0" and obs["length"][0] == len(env.context()) > 0
    steps, done, reward = 0, False, 0.0
    while not done:
        assert reward == 0.0
        text = scripted.turn("leader", info)
        obs, reward, done, truncated, info = env.step(text)
        steps += 1
        assert truncated is False
    [[expected]] = collect(lambda: small_env(tokenizer), scripted, [QUESTION], 1)
    assert steps == 3  # country <- born_place: two waves, then the selection
    assert reward == pytest.approx(expected.rewards["leader_0"]) == pytest.approx(0.9 + 0.1 * 2 / 6)
    assert [s.token_ids for s in env.episode.segments] == [s.token_ids for s in expected.segments]
    assert info["team_em"] == 1.0 and obs["length"][0] == 0  # no agent left to observe


def test_single_role_searchers_act_one_per_step_and_get_the_mean_searcher_reward(tokenizer):
    scripted = ScriptedPolicy()
    env = SingleRoleEnv(small_env(tokenizer), "searcher", scripted)
    _, info = env.reset(seed=0)
    agents, done = [], False
    while not done:
        agents.append(info["agent"])
        _, reward, done, _, info = env.step(scripted.turn("searcher", info))
    assert set(agents) == {"searcher_0"} and len(agents) >= 2  # search, then summary, per wave
    ep = env.episode
    assert reward == pytest.approx(ep.rewards["searcher_0"])


def test_single_role_env_rejects_what_it_cannot_control(tokenizer):
    with pytest.raises(ValueError, match="'coach'"):
        SingleRoleEnv(small_env(tokenizer), "coach", ScriptedPolicy())
    with pytest.raises(ValueError, match="no 'leader' agent"):
        SingleRoleEnv(small_env(tokenizer, workflow="cascade"), "leader", ScriptedPolicy())
    with pytest.raises(TypeError, match="act"):
        SingleRoleEnv(small_env(tokenizer), "leader", object())


# ---------------------------------------------------------------------------- the macro view


def test_leader_macro_env_passes_both_checkers(tokenizer):
    scripted = ScriptedPolicy()
    checked(lambda: LeaderMacroEnv(small_env(tokenizer), scripted, scripted, search_cost=0.01,
                                   render_mode="ansi"))


def test_macro_actions_dispatch_n_searchers_then_stop(tokenizer):
    scripted = ScriptedPolicy()
    env = LeaderMacroEnv(small_env(tokenizer), scripted, scripted, search_cost=0.05)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and env.action_space.n == 4
    assert obs[FEATURES.index("proposed")] == pytest.approx(1 / 3)  # one chain to follow
    assert obs[FEATURES.index("waves_left")] == 1.0 and obs[FEATURES.index("reports")] == 0.0
    obs, r1, done, _, info = env.step(3)  # three Searchers: the sub-task, the question, the sub-task
    tasks = [s.task for s in env.episode.segments if s.role == "searcher"]
    assert not done and len(tasks) == 3 and tasks[1] == QUESTION.question and tasks[0] == tasks[2] != tasks[1]
    assert r1 == pytest.approx(-0.05 * info["searches"])
    assert obs[FEATURES.index("waves_done")] == pytest.approx(1 / 3)
    assert obs[FEATURES.index("last_wave")] == 1.0 and obs[FEATURES.index("support_mean")] > 0
    obs, r2, done, _, info = env.step(0)  # stop: the Answerers read what the decomposer selects
    ep = env.episode
    assert done and info["team_em"] == ep.team_em
    assert r1 + r2 == pytest.approx(ep.rewards["leader_0"] - 0.05 * ep.num_searches)
    assert ep.num_waves == 1 and ep.invalid_turns == 0


def test_the_last_wave_ends_the_episode_without_a_decision(tokenizer):
    scripted = ScriptedPolicy()
    env = LeaderMacroEnv(small_env(tokenizer, max_waves=2), scripted, scripted)
    env.reset(seed=0)
    _, _, done, _, _ = env.step(1)
    assert not done
    _, reward, done, _, info = env.step(2)
    assert done and info["waves"] == 2 and env.episode.selection  # selected for the Leader
    assert reward == pytest.approx(env.episode.rewards["leader_0"])


def test_leader_state_and_turns_from_the_leaders_info():
    info = {"role": "leader", "question": "Who founded Kessa Mills?", "max_searchers": 2, "max_waves": 4,
            "reports": [(1, "Who founded Kessa Mills?", "Kessa Mills was founded by Ivo Ro.", 0),
                        (2, "Kessa Mills founder", "", 0)], "waves_done": 1, "waves_left": 3}
    state = LeaderState.of_info(info)
    assert state.question == "Who founded Kessa Mills?" and state.max_searchers == 2 and state.max_waves == 4
    assert state.reports == ((1, "Who founded Kessa Mills?", "Kessa Mills was founded by Ivo Ro."),
                             (2, "Kessa Mills founder", "(no report)"))
    assert (state.waves_done, state.waves_left, state.wave_of) == (1, 3, (0, 0))
    macro = LeaderMacro(max_waves=4, max_searchers=2)
    f = dict(zip(FEATURES, macro.features(state, 100, Proposal(subtasks=("x",)))))
    assert f["empty_reports"] == 0.5 and f["support_min"] == 0.0 and f["support_mean"] == pytest.approx(0.5)
    assert f["coverage"] == 1.0 and f["tokens"] == pytest.approx(100 / 4096) and f["proposed"] == 0.5
    assert macro.turn(2, state, Proposal(subtasks=("x",))) == (
        "<subtask>x</subtask><subtask>Who founded Kessa Mills?</subtask>")
    assert macro.turn(0, state, Proposal()) == "<select>1, 2</select>"
    assert macro.turn(0, state, Proposal(selection=(1,))) == "<select>1</select>"
    with pytest.raises(ValueError, match="0..2, got 3"):
        macro.turn(3, state, Proposal())
    with pytest.raises(TypeError, match="not its prompt text"):
        LeaderState.of_info("Question: Who founded Kessa Mills?")


def test_a_callable_decomposer_gives_the_subtasks(tokenizer):
    seen = []

    def decompose(question, wave, reports):
        seen.append((question, wave, len(reports)))
        return ["Where was Velmora Quist born?", "Velmora Quist birthplace"]

    env = LeaderMacroEnv(small_env(tokenizer), ScriptedPolicy(), decompose)
    env.reset(seed=0)
    env.step(2)
    tasks = [s.task for s in env.episode.segments if s.role == "searcher"]
    assert tasks == ["Where was Velmora Quist born?", "Velmora Quist birthplace"]
    assert seen[0] == (QUESTION.question, 0, 0) and seen[-1] == (QUESTION.question, 1, 2)


# ---------------------------------------------------------------------------- SB3 Leader


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer, synth_retriever, splits):
    """A seeded, small PPO run over scripted Searchers and Answerers (one candidate: the
    scripted Answerers all write the same one)."""
    from algos.commands.train_leader_sb3 import train_leader_sb3

    train, held_out = splits
    out = tmp_path_factory.mktemp("sb3_leader")
    meta = train_leader_sb3("ppo", 256, "scripted", out, seed=0, train_questions=train, eval_questions=held_out[:7],
                            retriever=synth_retriever, tokenizer=tokenizer, env_kwargs={"num_candidates": 1},
                            algo_kwargs={"n_steps": 64}, log=lambda _: None)
    return out, meta


def test_ppo_leader_beats_a_random_leader_on_held_out_questions(trained, tokenizer, synth_retriever, splits):
    from agents.sb3_leader import SB3LeaderPolicy
    from algos.commands.train_leader_sb3 import make_leader_env

    out, meta = trained
    _, held_out = splits
    model = SB3LeaderPolicy(out).model
    env = make_leader_env(held_out, retriever=synth_retriever, tokenizer=tokenizer, env_kwargs={"num_candidates": 1})
    rng = np.random.default_rng(0)

    def returns_of(choose):
        returns = []
        for i, q in enumerate(held_out):
            obs, _ = env.reset(seed=i, options={"question": q})
            done, total = False, 0.0
            while not done:
                obs, reward, done, _, _ = env.step(choose(obs))
                total += reward
            returns.append(total)
        return returns

    learned = returns_of(lambda obs: int(model.predict(obs, deterministic=True)[0]))
    random = returns_of(lambda obs: int(rng.integers(env.action_space.n)))
    assert len(held_out) == 21 and not {q.id for q in held_out} & {q.id for q in splits[0]}
    assert np.mean(learned) > np.mean(random) + 0.1, (np.mean(learned), np.mean(random))
    # the trainer's own report, on the first 7 held-out questions
    assert meta["eval"]["trained"]["mean_reward"] == pytest.approx(np.mean(learned[:7]))
    saved = json.loads((out / "leader.json").read_text())
    assert saved["features"] == list(FEATURES) and saved["algo"] == "ppo" and saved["timesteps"] == 256


def test_sb3_leader_plays_benchmark_episodes_as_in_its_env(trained, tokenizer, synth_retriever, splits):
    """``sb3:<path>`` through benchmarks' build_policy gives the episodes the macro env gives."""
    from agents.sb3_leader import SB3LeaderPolicy
    from algos.commands.train_leader_sb3 import make_leader_env
    from benchmarks.suite import build_policy

    out, _ = trained
    questions = splits[1][::3]
    team = build_policy(f"leader=sb3:{out},searcher=scripted,answerer=scripted")
    assert isinstance(team, RoleRouter) and isinstance(team.policies["leader"], SB3LeaderPolicy)
    groups = collect(lambda: search_team_v0.raw_env(tokenizer=tokenizer, retriever=synth_retriever,
                                                   questions=questions, num_candidates=1), team, questions, 1)
    env = make_leader_env(questions, retriever=synth_retriever, tokenizer=tokenizer, env_kwargs={"num_candidates": 1})
    model = team.policies["leader"].model
    for q, [ep] in zip(questions, groups):
        obs, _ = env.reset(seed=0, options={"question": q})
        done = False
        while not done:
            obs, _, done, _, _ = env.step(int(model.predict(obs, deterministic=True)[0]))
        assert ep.invalid_turns == 0
        assert [s.token_ids for s in ep.segments] == [s.token_ids for s in env.episode.segments]
    searcher = Observation("searcher_0", "searcher", np.array([1, 2], dtype=np.int64))
    with pytest.raises(ValueError, match="Leader only"):
        team.policies["leader"].act([*observe_awaiting(env.raw), searcher])


def test_sb3_leader_refuses_a_missing_model(tmp_path):
    from agents.sb3_leader import SB3LeaderPolicy

    with pytest.raises(FileNotFoundError, match="train-leader-sb3"):
        SB3LeaderPolicy(tmp_path)


def test_cli_trains_and_saves_a_leader(tmp_path, monkeypatch, synth_retriever, capsys):
    import envs.retrieval.factory
    from algos.__main__ import main

    monkeypatch.setattr(envs.retrieval.factory, "default_retriever", lambda *a, **k: synth_retriever)
    rc = main(["train-leader-sb3", "--algo", "a2c", "--timesteps", "32", "--out", str(tmp_path),
               "--train-per-dataset", "1", "--eval-per-dataset", "1", "--env", "num_candidates=1",
               "--search-cost", "0.01"])
    assert rc == 0 and (tmp_path / "leader.safetensors").exists() and not (tmp_path / "leader.zip").exists()
    meta = json.loads((tmp_path / "leader.json").read_text())
    assert meta["algo"] == "a2c" and meta["search_cost"] == 0.01 and meta["env_kwargs"] == {"num_candidates": 1}
    assert meta["eval_questions"] == 7 and "held-out (7 questions)" in capsys.readouterr().out


def test_cli_refuses_an_out_folder_another_live_run_holds(tmp_path, capsys):
    from algos.__main__ import main
    from algos.engine.runlock import run_lock

    with run_lock(tmp_path, command="the first Leader run"):
        rc = main(["train-leader-sb3", "--algo", "a2c", "--timesteps", "32", "--out", str(tmp_path)])
    assert rc == 2 and "command 'the first Leader run'" in capsys.readouterr().err
    assert not (tmp_path / "leader.safetensors").exists() and not (tmp_path / "monitor.csv").exists()


# ---------------------------------------------------------------------------- the saved Leader is data


class _WritesMarker:
    """Unpickled, writes ``marker``: the stand-in for code hidden in a pickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "unpickled"))


def tiny_model(tokenizer, algo):
    """An SB3 model of the Leader trained for 32 decisions on the one-question env."""
    from agents.sb3_leader import algo_class

    scripted = ScriptedPolicy()
    env = LeaderMacroEnv(small_env(tokenizer), scripted, scripted)
    extra = {"ppo": {"n_steps": 16, "batch_size": 16, "n_epochs": 2}, "a2c": {"n_steps": 4},
             "dqn": {"learning_starts": 8, "train_freq": 1, "target_update_interval": 8}}[algo]
    model = algo_class(algo)("MlpPolicy", env, seed=0, device="cpu", policy_kwargs={"net_arch": [16, 16]}, **extra)
    model.learn(total_timesteps=32)
    return model


def tiny_leader(tokenizer, algo, out, model=None):
    """``model`` (else a :func:`tiny_model`) saved to ``out``; returns the model."""
    from agents.sb3_leader import save_leader

    model = model or tiny_model(tokenizer, algo)
    cfg = model.get_env().get_attr("raw")[0].config
    save_leader(model, out, {"algo": algo, "max_waves": cfg.max_waves, "max_searchers": cfg.max_searchers,
                             "max_context_tokens": cfg.max_context_tokens, "decompose": "scripted"})
    return model


def outputs(policy, obs):
    """The network's raw outputs on ``obs``: action logits, or a DQN's Q-values."""
    with torch.no_grad():
        t = torch.as_tensor(obs)
        if hasattr(policy, "q_net"):
            return policy.q_net(t)
        return policy.get_distribution(t).distribution.logits


@pytest.fixture(scope="module")
def tiny_ppo(tokenizer):
    return tiny_model(tokenizer, "ppo")


@pytest.fixture(scope="module")
def saved_ppo(tmp_path_factory, tokenizer, tiny_ppo):
    out = tmp_path_factory.mktemp("tiny_ppo")
    return tiny_leader(tokenizer, "ppo", out, tiny_ppo), out


def copy_of(folder, tmp_path):
    import shutil

    return Path(shutil.copytree(folder, tmp_path / "leader"))


@pytest.mark.parametrize("algo", ["ppo", "a2c", "dqn"])
def test_a_saved_leader_is_weights_and_json_and_picks_the_trained_actions(tmp_path, tokenizer, algo):
    from agents.sb3_leader import SB3LeaderPolicy, build_policy

    model = tiny_leader(tokenizer, algo, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leader.json", "leader.safetensors"]
    meta = json.loads((tmp_path / "leader.json").read_text())
    assert meta["algo"] == algo and meta["policy_kwargs"] == {"net_arch": [16, 16]}  # A2C's optimizer dropped
    loaded = SB3LeaderPolicy(tmp_path)
    obs = np.random.default_rng(0).random((256, len(FEATURES)), dtype=np.float32)
    expected, _ = model.predict(obs, deterministic=True)
    got, _ = loaded.model.predict(obs, deterministic=True)
    np.testing.assert_array_equal(got, expected)
    assert torch.equal(outputs(loaded.model, obs), outputs(model.policy, obs))
    torch.manual_seed(1)  # a policy built from the same settings without the weights differs
    fresh = build_policy(algo, loaded.macro, meta["policy_kwargs"])
    assert not torch.equal(outputs(fresh, obs), outputs(model.policy, obs))


def sb3_zip_leader(model, folder, marker):
    """``folder`` as train-leader-sb3 left it before: SB3's zip + leader.json, the zip's
    pickled ``policy_class`` swapped for a payload that writes ``marker``."""
    import base64
    import zipfile

    folder.mkdir()
    model.save(str(folder / "plain.zip"))
    payload = base64.b64encode(pickle.dumps(_WritesMarker(marker))).decode()
    with zipfile.ZipFile(folder / "plain.zip") as src, zipfile.ZipFile(folder / "leader.zip", "w") as dst:
        for name in src.namelist():
            blob = src.read(name)
            if name == "data":
                data = json.loads(blob)
                data["policy_class"] = {":type:": "<class 'abc.ABCMeta'>", ":serialized:": payload}
                blob = json.dumps(data).encode()
            dst.writestr(name, blob)
    (folder / "plain.zip").unlink()
    cfg = {"algo": "ppo", "features": list(FEATURES), "max_waves": 3, "max_searchers": 3,
           "max_context_tokens": 4096, "decompose": "scripted", "hyperparams": {"policy_kwargs": {"net_arch": [16, 16]}}}
    (folder / "leader.json").write_text(json.dumps(cfg))
    return folder / "leader.zip"


def test_an_sb3_zip_leader_is_refused_and_never_unpickled(tmp_path, tiny_ppo):
    from agents.sb3_leader import SB3LeaderPolicy

    live = tmp_path / "live"
    pickle.loads(pickle.dumps(_WritesMarker(live)))
    assert live.read_text() == "unpickled"  # the payload is real: unpickling it runs code
    marker = tmp_path / "marker"
    zip_path = sb3_zip_leader(tiny_ppo, tmp_path / "old", marker)
    for path in (zip_path.parent, zip_path):
        with pytest.raises(ValueError) as err:
            SB3LeaderPolicy(path)
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"{zip_path}: ") and "--resave" in message
    assert not marker.exists()


def test_resave_rewrites_an_sb3_zip_leader_from_its_weights_only(tmp_path, tiny_ppo):
    from agents.sb3_leader import SB3LeaderPolicy
    from algos.commands.train_leader_sb3 import main

    model = tiny_ppo
    marker = tmp_path / "marker"
    zip_path = sb3_zip_leader(model, tmp_path / "old", marker)
    assert main(["--resave", str(zip_path.parent)]) == 0
    assert not marker.exists() and (zip_path.parent / "leader.safetensors").exists()
    obs = np.random.default_rng(1).random((64, len(FEATURES)), dtype=np.float32)
    assert torch.equal(outputs(SB3LeaderPolicy(zip_path.parent).model, obs), outputs(model.policy, obs))
    assert main(["--resave", str(tmp_path / "nothing")]) == 2


@pytest.mark.parametrize("spec", ["python:os:system", "python:agents.scripted:ScriptedPolicy", "hf:./elsewhere"])
def test_a_leader_naming_a_decomposer_outside_the_table_is_refused(tmp_path, saved_ppo, spec):
    from agents.sb3_leader import SB3LeaderPolicy
    from algos.commands.train_leader_sb3 import train_leader_sb3

    folder = copy_of(saved_ppo[1], tmp_path)
    meta = json.loads((folder / "leader.json").read_text())
    (folder / "leader.json").write_text(json.dumps({**meta, "decompose": spec}))
    with pytest.raises(ValueError) as err:
        SB3LeaderPolicy(folder)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{folder / 'leader.json'}: decomposer {spec!r}")
    with pytest.raises(ValueError, match="decompose must be one of scripted"):
        train_leader_sb3("ppo", 8, decompose=spec, out=tmp_path / "never")
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "pickle", "other shapes"])
def test_a_damaged_weights_file_gives_one_line_naming_it(tmp_path, saved_ppo, damage):
    from safetensors.torch import save_file

    from agents.sb3_leader import SB3LeaderPolicy

    folder = copy_of(saved_ppo[1], tmp_path)
    weights = folder / "leader.safetensors"
    marker = tmp_path / "marker"
    if damage == "garbage":
        weights.write_bytes(b"\x00\x01 not safetensors at all")
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "pickle":
        torch.save({"w": _WritesMarker(marker)}, weights)
    else:
        save_file({"action_net.weight": torch.zeros(2, 2)}, str(weights))
    with pytest.raises(ValueError) as err:
        SB3LeaderPolicy(folder)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{weights}: ")
    assert not marker.exists()


# ---------------------------------------------------------------------------- leader.json's network, checked first (issue 44.3)


@pytest.mark.parametrize("algo, network", [
    ("ppo", {}), ("ppo", {"net_arch": [16, 8]}), ("a2c", {"net_arch": []}),
    ("ppo", {"net_arch": {"pi": [5], "vf": []}, "share_features_extractor": False}),
    ("a2c", {"net_arch": {"vf": [7, 3]}, "activation_fn": "relu"}),
    ("dqn", {}), ("dqn", {"net_arch": [16, 8], "normalize_images": False}), ("dqn", {"net_arch": []}),
])
def test_expected_shapes_are_those_sb3_builds(algo, network):
    from agents.sb3_leader import _macro, build_policy, check_network, expected_shapes

    macro = _macro({"max_waves": 3, "max_searchers": 3, "max_context_tokens": 4096})
    check_network(network, algo, "x")
    built = {k: tuple(v.shape) for k, v in build_policy(algo, macro, network).state_dict().items()}
    assert expected_shapes(algo, macro, network) == built


@pytest.mark.parametrize("network, message", [
    ({"net_arch": [100_000, 64]}, "integer widths in [1, 4096], got [100000, 64]"),
    ({"net_arch": [-16, 16]}, "integer widths in [1, 4096], got [-16, 16]"),
    ({"net_arch": [16.5, 16]}, "integer widths in [1, 4096], got [16.5, 16]"),
    ({"net_arch": [0]}, "integer widths in [1, 4096]"),
    ({"net_arch": [True, 16]}, "integer widths in [1, 4096]"),
    ({"net_arch": [16] * 17}, "at most 16 integer widths"),
    ({"net_arch": {"pi": [16], "vf": [1e9]}}, "net_arch.vf must be a list of at most 16 integer widths"),
    ({"net_arch": {"pi": [16], "qf": [16]}}, "keys among pi, vf"),
    ({"net_arch": "64,64"}, "net_arch must be a list of widths"),
    ({"activation_fn": "os.system"}, "activation_fn must be one of tanh, relu"),
    ({"activation_fn": 3}, "activation_fn must be one of"),
    ({"share_features_extractor": "no"}, "share_features_extractor must be true or false"),
    ({"normalize_images": 1}, "normalize_images must be true or false"),
])
def test_out_of_bounds_network_settings_are_one_line_before_anything_is_built(tmp_path, saved_ppo, monkeypatch,
                                                                                network, message):
    import agents.sb3_leader as sb3
    from agents.sb3_leader import SB3LeaderPolicy

    folder = copy_of(saved_ppo[1], tmp_path)
    meta = json.loads((folder / "leader.json").read_text())
    (folder / "leader.json").write_text(json.dumps({**meta, "policy_kwargs": network}))
    monkeypatch.setattr(sb3, "build_policy", lambda *a, **k: pytest.fail("built a network"))
    with pytest.raises(ValueError) as err:  # was: a 40 GB allocation, or a torch traceback
        SB3LeaderPolicy(folder)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{folder / 'leader.json'}: policy_kwargs: ")
    assert message in text


@pytest.mark.parametrize("network", [{"net_arch": [4096, 4096]}, {"net_arch": [16]},
                                     {"net_arch": {"pi": [16, 16], "vf": [16, 8]}}])
def test_settings_that_do_not_fit_the_saved_tensors_are_refused_before_building(tmp_path, saved_ppo, monkeypatch,
                                                                                 network):
    import agents.sb3_leader as sb3
    from agents.sb3_leader import SB3LeaderPolicy

    folder = copy_of(saved_ppo[1], tmp_path)  # saved with net_arch [16, 16]
    meta = json.loads((folder / "leader.json").read_text())
    (folder / "leader.json").write_text(json.dumps({**meta, "policy_kwargs": network}))
    monkeypatch.setattr(sb3, "build_policy", lambda *a, **k: pytest.fail("built a network"))
    with pytest.raises(ValueError) as err:  # was: 4096 x 4096 built and initialised, then compared
        SB3LeaderPolicy(folder)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{folder / 'leader.safetensors'}: its tensors do not fit")


def test_a_weights_header_of_insane_size_is_one_line(tmp_path, saved_ppo):
    from agents.sb3_leader import SB3LeaderPolicy

    folder = copy_of(saved_ppo[1], tmp_path)
    weights = folder / "leader.safetensors"
    weights.write_bytes((1 << 62).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="not a readable safetensors file") as err:
        SB3LeaderPolicy(folder)
    assert str(err.value).startswith(f"{weights}: ")


def test_the_trainer_refuses_an_out_of_bounds_network_before_training():
    from agents.sb3_leader import network_settings

    assert network_settings({"net_arch": [64, 64], "ortho_init": False}) == {"net_arch": [64, 64]}
    with pytest.raises(ValueError, match=r"integer widths in \[1, 4096\], got \[100000\]"):
        network_settings({"net_arch": [100_000]})
