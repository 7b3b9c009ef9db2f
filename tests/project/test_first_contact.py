"""First contact (issue 23, and 19.6): every command a newcomer meets says what to expect,
refuses a bad setting in one line before it writes anything, and explains itself."""

from __future__ import annotations

import argparse
import io
import json
import os
import stat
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from agents.simple import HumanPolicy
from envs.data import load_qa
from envs.observation import Observation

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- 23.1: run refuses


def _run(tmp_path: Path, *extra: str) -> int:
    from benchmarks.__main__ import main

    return main(["run", "--quick", "--no-progress", "--out", str(tmp_path / "results" / "x"), *extra])


@pytest.mark.parametrize("setting, expected", [
    (["--policy", "ckpt:{tmp}/runs/micro/team"],
     r"ckpt:\S+runs/micro/team: no checkpoint there.*python -m algos train --preset micro"),
    (["--policy", "ckpt:{tmp}/empty"], r"ckpt:\S+empty: no checkpoint there \(neither checkpoints"),
    (["--policy", "leader=scripted,searcher=ckpt:{tmp}/empty"], r"--policy ckpt:\S+empty: no checkpoint"),
    (["--policy", "hf:nobody-here/no-such-model-23"],
     r"hf:nobody-here/no-such-model-23: not a local path, and the hub is offline"),
    (["--policy", "hf:{tmp}/no/model/dir"], r"no such model directory"),
    (["--policy", "python:no_module_23:Team"], r"no module 'no_module_23' on the path"),
    (["--policy", "wizard"], r"--policy wizard: unknown policy 'wizard'"),
    (["--policy", "scripted", "--corpus", "{tmp}/passages.jsonl"], r"--corpus \S+passages.jsonl: no such corpus"),
    (["--policy", "scripted", "--retriever-url", "http://127.0.0.1:9/retrieve"],
     r"--retriever-url http://127.0.0.1:9/retrieve: does not answer"),
    (["--policy", "scripted", "--data", "{tmp}/flashrag", "--corpus", "c.jsonl"], r"--data \S+: no such directory"),
])
def test_run_refuses_in_one_line_and_leaves_nothing_behind(tmp_path, monkeypatch, capsys, setting, expected):
    import re

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    status = _run(tmp_path, *[s.format(tmp=tmp_path) for s in setting])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("python -m benchmarks: error: ")
    assert re.search(expected, err), err
    assert not (tmp_path / "results").exists()  # before: an empty results/x was left behind


def test_agents_play_refuses_a_policy_in_one_line(monkeypatch, capsys):
    from agents.__main__ import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["play", "--leader", "scripted", "--searcher", "hf:nobody-here/no-such-model-23"]) == 2
    err = capsys.readouterr().err
    assert err == ("python -m agents: error: --searcher hf:nobody-here/no-such-model-23: not a local path, "
                   "and the hub is offline (HF_HUB_OFFLINE) with no cached copy; give a model directory, "
                   "or hf:smollm2 offline\n")


def test_check_policy_passes_what_can_be_built_here():
    from agents.registry import check_policy

    for spec in ("scripted", "random:tokens", "human", "hf:smollm2", "python:json:JSONDecoder",
                 "openai:m@http://127.0.0.1:9/v1", "leader=scripted,searcher=random,answerer=human"):
        check_policy(spec)  # loads nothing, reaches nothing
    with pytest.raises(ValueError, match="needs a model"):
        check_policy("openai:@http://x")
    with pytest.raises(ValueError, match="bad per-role policy 'critic=scripted'"):
        check_policy("leader=scripted,critic=scripted")


# --------------------------------------------------------------------------- 23.4: envs step


def _step(monkeypatch, capsys, retriever, lines: list[str]) -> tuple[int, str]:
    """``python -m envs step`` on the keyword world (seconds, where MiniLM takes a minute),
    the typed lines fed on stdin."""
    from envs.__main__ import main

    monkeypatch.setattr("envs.retrieval.factory.default_retriever", lambda *a, **k: retriever)
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    status = main(["step", "--workflow", "cascade", "--question", "Where was Velmora Quist born?"])
    return status, capsys.readouterr().out


def test_envs_step_explains_itself_and_takes_the_human_commands(monkeypatch, capsys, retriever):
    status, out = _step(monkeypatch, capsys, retriever, [
        ":help", ":ctx", ":all Nobody",  # none is a turn; :all is for Answerers only
        "<search>Velmora Quist born</search>",
        "<summary>Born in Port Velm.</summary>",
        "<answer>Port Velm</answer>",
        ":all Someone Else",  # answerer_1 to answerer_4
    ])
    assert status == 0
    head = out.split("─" * 72)[0]
    assert "type that agent's whole turn" in head and ":quit or Ctrl-D leaves" in head
    assert "The 5 Answerers each write one candidate" in head
    assert out.count("searcher_0 · turn 1 ·") == 1 and out.count("searcher_0 · turn 2 ·") == 1
    assert ":ctx           the agent's whole context" in out  # :help's list, then no turn taken
    assert ":all is for Answerers; searcher_0 is a searcher" in out
    assert out.count("You are a Searcher.") == 2  # its prompt at its first turn, and :ctx
    assert out.count("You are the Answerer.") == 1  # a later agent's prompt, shown once
    assert "Doc 1(Title: Velmora Quist) Velmora Quist was born in Port Velm" in out  # the search's passages
    assert "(the same context as answerer_0)" in out
    assert out.count("(:all)") == 3  # answerer_2..4 answered without asking
    assert "Candidates: ['Port Velm', 'Someone Else', 'Someone Else', 'Someone Else', 'Someone Else']" in out


def test_envs_step_leaves_on_quit_and_on_end_of_input(monkeypatch, capsys, retriever):
    status, out = _step(monkeypatch, capsys, retriever, [":quit"])
    assert status == 0 and "(left before the end of the episode)" in out and "Candidates" not in out
    status, out = _step(monkeypatch, capsys, retriever, ["<search>x</search>"])
    assert status == 1 and "(end of input before the end of the episode)" in out


def test_envs_step_help_lists_only_its_own_options(capsys):
    from envs.__main__ import main

    with pytest.raises(SystemExit):
        main(["step", "--help"])
    out = capsys.readouterr().out
    assert "--mode" not in out and "--question" in out and "--seed" in out
    with pytest.raises(SystemExit):
        main(["--help"])
    usage = [line for line in capsys.readouterr().out.splitlines() if " step [" in line]
    assert usage and "--mode" not in usage[0]  # the top help listed a --mode that step does not have


# --------------------------------------------------------------------------- 23.6: the human


def _obs(agent: str, ids: list[int], question: str = "Q?", env_index: int = 0) -> Observation:
    role = agent.rsplit("_", 1)[0]
    return Observation(agent=agent, role=role, token_ids=np.asarray(ids, dtype=np.int64), env_index=env_index,
                       decode=lambda t: f"<|im_start|>user\nQuestion: {question} [{len(t)} tokens]<|im_end|>",
                       info={"question": question},
                       messages=({"role": "user", "content": f"Question: {question} [{len(ids)} tokens]"},))


def _human(lines: list[str]) -> tuple[HumanPolicy, list[str], list[str]]:
    asked, shown = [], []
    feed = iter(lines)

    def read(prompt: str) -> str:
        asked.append(prompt)
        return next(feed)

    return HumanPolicy(input_fn=read, output_fn=shown.append), asked, shown


def test_human_answerers_share_one_context_and_one_answer_on_request():
    human, asked, shown = _human([":help", "<answer>A</answer>", ":all B"])
    team = [_obs(f"answerer_{j}", [1, 2, 3]) for j in range(5)]
    assert human.act(team) == ["<answer>A</answer>"] + ["<answer>B</answer>"] * 4
    assert asked == ["answerer_0> "] * 2 + ["answerer_1> "]  # :help is not a turn; 2..4 are not asked
    text = "\n".join(shown)
    assert text.count("Question: Q? [3 tokens]") == 1  # the shared context once
    assert "(the same context as answerer_0)" in text
    assert "Each Answerer writes one candidate" in text and ":all ANSWER" in text
    assert "answerer_4> <answer>B</answer>   (:all)" in text


def test_human_all_stops_at_a_new_question_and_quit_ends_the_session():
    from envs.terminal import Quit

    human, _asked, _shown = _human([":all B", "<search>x</search>", "<answer>C</answer>", ":quit"])
    assert human.act([_obs("answerer_0", [1]), _obs("answerer_1", [1])]) == ["<answer>B</answer>"] * 2
    assert human.act([_obs("searcher_0", [5])]) == ["<search>x</search>"]
    assert human.act([_obs("answerer_0", [1])]) == ["<answer>C</answer>"]  # a new phase: asked again
    with pytest.raises(Quit):
        human.act([_obs("searcher_0", [9])])
    assert issubclass(Quit, EOFError)  # who ends a session on Ctrl-D ends it on :quit


def test_read_turn_answers_commands_and_wraps_all():
    from envs.terminal import read_turn, team_line

    lines = iter([":ctx", ":oops", "", ":all <answer>X</answer>"])
    shown: list[str] = []
    typed = read_turn("answerer_0", "answerer", lambda: "THE CONTEXT", input_fn=lambda _: next(lines),
                      output_fn=shown.append)
    assert (typed.text, typed.for_all) == ("<answer>X</answer>", True)
    assert shown == ["THE CONTEXT", "unknown command :oops; :help lists the commands"]
    assert team_line(["leader_0", "searcher_0", "searcher_1", *[f"answerer_{j}" for j in range(5)]]).startswith(
        "Agents: leader_0, searcher_0..searcher_1, answerer_0..answerer_4. The 5 Answerers")


# --------------------------------------------------------------------------- 23.7: compare, curves


def _result(folder: Path, ids: list[str], k: int) -> str:
    from benchmarks.metrics import summarize

    records = [{"dataset": "nq", "id": i, "correct": [1.0] * k, "searches": [1] * k,
                "input_tokens": [10] * k, "output_tokens": [2] * k} for i in ids]
    folder.mkdir(parents=True)
    summary = summarize(records)
    summary["meta"] = {"policy": folder.name, "workflow": "hierarchical"}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


def test_compare_labels_each_k_and_says_when_nothing_is_shared(tmp_path, capsys):
    from benchmarks.__main__ import main

    four, two = _result(tmp_path / "four", ["a", "b"], 4), _result(tmp_path / "two", ["c"], 2)
    assert main(["compare", four, two, "--resamples", "50"]) == 2
    out, err = capsys.readouterr()
    assert "pass@k" in out and "pass@2" not in out and "pass@4" not in out
    assert "H-MAS four (four) (k=4)" in out and "H-MAS two (two) (k=2)" in out
    assert err.strip() == ("four - two: no paired CI, the two result sets share no (dataset, id) question "
                           "(compare runs over the same questions)")
    same = _result(tmp_path / "same", ["a", "b"], 4)
    assert main(["compare", four, same, "--resamples", "50"]) == 0
    assert "pass@4" in capsys.readouterr().out


def test_curves_are_written_beside_the_runs_not_in_the_current_folder(tmp_path, monkeypatch, capsys):
    from benchmarks.__main__ import main

    monkeypatch.chdir(tmp_path)
    for stage in ("teacher", "team"):
        run = tmp_path / "runs" / "micro" / stage
        run.mkdir(parents=True)
        rows = [{"step": s, "team/em": 0.1 * s, "val/avg@1": 0.05 * s} for s in (0, 1, 2)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["curves", "runs/micro/teacher", "runs/micro/team"]) == 0
    assert (tmp_path / "runs" / "micro" / "curves.png").is_file()
    assert not (tmp_path / "curves.png").exists()
    assert main(["curves", "runs/micro/team"]) == 0
    assert (tmp_path / "runs" / "micro" / "team" / "curves.png").is_file()
    capsys.readouterr()


# --------------------------------------------------------------------------- 19.6: CLI manners


@pytest.mark.parametrize("module, prog", [("envs", "python -m envs"), ("algos", "python -m algos"),
                                          ("benchmarks", "python -m benchmarks"), ("agents", "python -m agents"),
                                          ("envs.retrieval", "python -m envs.retrieval")])
def test_version_flag(module, prog, capsys):
    from importlib import import_module
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        import_module(f"{module}.__main__").main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"{prog} {version('mopd')}"


def test_mopd_names_itself(monkeypatch, capsys):
    from benchmarks.cli import main

    monkeypatch.setattr("sys.argv", ["/usr/local/bin/mopd", "--help"])
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: mopd ") and "python -m envs" not in out
    assert "benchmarks" in out.split("options:")[0]  # the packages it dispatches to are listed
    for package in ("agents", "algos", "benchmarks"):  # ... and it hands over to each
        with pytest.raises(SystemExit) as done:
            main([package, "--version"])
        assert done.value.code == 0 and capsys.readouterr().out.startswith(f"python -m {package} ")


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _parsers(main, argv: list[str], monkeypatch) -> list[argparse.ArgumentParser]:
    """The parser a command builds and every subcommand's, captured at parse time."""
    def capture(self, *args, **kwargs):
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(_Parsed) as parsed:
        main(argv)
    top = parsed.value.parser
    subs = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return [top, *(p for s in subs for p in s.choices.values())]


@pytest.mark.parametrize("module", ["envs.__main__", "envs.retrieval.__main__", "agents.__main__", "algos.__main__",
                                    "algos.commands.sft", "algos.commands.train_leader_sb3", "benchmarks.__main__",
                                    "benchmarks.retrieval_load", "benchmarks.scaleout_perf", "benchmarks.gpu_check"])
def test_every_option_has_help_text(module, monkeypatch):
    from importlib import import_module

    main = import_module(module).main
    silent = [f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
              for p in _parsers(main, ["step"] if module == "envs.__main__" else ["x"], monkeypatch)
              for a in p._actions
              if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not a.help]
    assert silent == []


@pytest.mark.parametrize("module, argv, line", [
    ("benchmarks.retrieval_load", ["--threads", "0"], "--threads 0: must be >= 1"),
    ("benchmarks.retrieval_load", ["--time-limit", "nan"], "--time-limit nan: must be > 0"),
    # the server's options are serve's (envs.retrieval.__main__.add_server_args), checked the same way
    ("benchmarks.retrieval_load", ["--max-batch", "0"],
     "bad server limit: max_batch=0 (must be a positive integer) (set by --max-batch)"),
    ("benchmarks.retrieval_load", ["--keep-alive", "-1"], "bad server setting: keep_alive_s=-1.0 (set by --keep-alive)"),
    ("envs.retrieval.__main__", ["search", "--corpus", "missing.jsonl", "--topk", "0", "q"],
     "--topk 0: must be >= 1"),
])
def test_bad_load_and_search_settings_are_refused_in_one_line(module, argv, line, capsys):
    from importlib import import_module

    assert import_module(module).main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.strip().endswith(f"error: {line}"), err


# --------------------------------------------------------------------------- 15: the GPU check


def _gpu_check_result(backend: str) -> dict:
    return {"backend": backend, "perf/generated_tokens_per_s": 100.0, "perf/rollout_s": 1.0,
            "perf/score_s": 0.5, "perf/update_s": 0.5, "peak_gpu_gib": 1.0, "device_used_gib": 2.0}


@pytest.mark.parametrize("how", ["not installed", "does not import"])
def test_gpu_check_without_vllm_keeps_the_hf_figures(how, tmp_path, monkeypatch, capsys):
    import importlib.util

    import torch

    from benchmarks import gpu_check

    real = importlib.util.find_spec
    if how == "not installed":
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, **k: None if name == "vllm" else real(name, *a, **k))
    else:  # installed, but its import fails when the backend is made
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, **k: object() if name == "vllm" else real(name, *a, **k))
    monkeypatch.setattr(gpu_check, "model_dir", lambda: str(tmp_path / "model"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ran = []

    def run(backend, model_dir, steps, out):  # no GPU here: the trainer is not built
        ran.append(backend)
        if backend == "vllm":
            raise ImportError("rollout_backend=vllm needs vllm, which is not installed:\n pip install vllm")
        return _gpu_check_result(backend)

    monkeypatch.setattr(gpu_check, "run", run)
    assert gpu_check.main(["--steps", "2", "--out", str(tmp_path / "out")]) == 0
    assert ran == (["hf"] if how == "not installed" else ["hf", "vllm"])
    captured = capsys.readouterr()
    notes = captured.err.strip().splitlines()
    assert len(notes) == 1 and notes[0].startswith("gpu_check: vLLM ") and "HF" in notes[0], captured.err
    assert "hf:" in captured.out and "vllm / hf" not in captured.out
    assert [r["backend"] for r in json.loads((tmp_path / "out" / "gpu_check.json").read_text())] == ["hf"]


def test_gpu_check_script_runs_the_module_from_the_checkout(tmp_path):
    """``python -m benchmarks.gpu_check`` (``agents`` imports from the root without an
    install); the module itself finds what is missing, vLLM included."""
    calls = tmp_path / "calls"
    fake = tmp_path / "python"  # stands in for python: the command line is recorded
    fake.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then case "$2" in *vllm*) exit 1;; *) exit 0;; esac; fi\n'
                    f'echo "$@" >> {calls}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "OUT": str(tmp_path / "o")},
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert calls.read_text().split() == ["-m", "benchmarks.gpu_check", "--steps", "3", "--backends", "hf,vllm",
                                         "--out", str(tmp_path / "o")]


# --------------------------------------------------------------------------- 19.6: QA loader


def test_qa_loader_reads_json_splits_and_leaves_unanswerable_rows_out(tmp_path):
    rows = [{"id": "0", "question": "q0?", "golden_answers": ["a"]},
            {"id": "1", "question": "q1?", "golden_answers": []},
            {"id": "2", "question": "q2?", "golden_answers": [""]},
            {"id": "3", "question": "q3?", "golden_answers": "d"}]
    (tmp_path / "nq").mkdir()
    (tmp_path / "nq" / "dev.json").write_text(json.dumps(rows))  # a JSON array
    (tmp_path / "nq" / "test.json").write_text("".join(json.dumps(r) + "\n" for r in rows))  # JSON lines
    for split, where in (("dev", "row 2, 3"), ("test", "line 2, 3")):
        with pytest.warns(UserWarning, match=rf"{split}\.json: left out 2 rows with an empty golden_answers "
                                              rf"\({where}\)"):
            items = load_qa("nq", split, root=tmp_path)
        assert [(q.id, q.golden_answers) for q in items] == [("0", ("a",)), ("3", ("d",))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the limit is met before the unanswerable rows
        assert [q.id for q in load_qa("nq", "dev", root=tmp_path, limit=1)] == ["0"]
    with pytest.warns(UserWarning):
        assert [q.id for q in load_qa("nq", "dev", root=tmp_path, limit=2)] == ["0", "3"]


# --------------------------------------------------------------------------- 23.7: install


def test_install_prints_one_line_per_step(tmp_path):
    calls = tmp_path / "calls"
    fake = tmp_path / "python"  # stands in for python: records pip's arguments, installs nothing
    fake.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo 9.9.9; else echo "$@" >> {calls}; fi\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh")], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(",")[0] for line in lines] == ["[install 1/3", "[install 2/3", "[install 3/3",
                                                      "[install done"]
    assert "torch" in lines[0] and "offline models" in lines[2] and "mopd 9.9.9" in lines[3]
    pip = calls.read_text().splitlines()
    assert len(pip) == 3 and pip[0].endswith("torch==2.13.0") and "--no-deps" in pip[2]


def test_expected_checker_warnings_are_silenced_and_real_ones_kept():
    tomllib = pytest.importorskip("tomllib")
    from _pytest.config import parse_warning_filter

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for line in config["tool"]["pytest"]["ini_options"]["filterwarnings"]:
            warnings.filterwarnings(*parse_warning_filter(line, escape=False))
        for message, module in [
            ("\x1b[33mWARN: No render fps was declared in the environment (env.metadata['render_fps'] is None "
             "or not defined), rendering may occur at inconsistent fps.\x1b[0m", "gymnasium.utils.passive_env_checker"),
            ("Observation is not a NumPy array", "pettingzoo.test.api_test"),
            ("Observation is not a NumPy array", "envs.search_team"),  # kept: only the checker's is expected
            ("a real problem", "envs.search_team"),
        ]:
            warnings.warn_explicit(message, UserWarning, f"{module}.py", 1, module=module)
    assert [str(w.message) for w in caught] == ["Observation is not a NumPy array", "a real problem"]


def test_checkpoints_and_model_loads_print_no_transformers_progress_bars(tmp_path, capfd):
    """A trainer saves checkpoints and loads bases and Teachers: transformers' ``Writing model
    shards`` and ``Loading weights`` bars would land in its log as unexplained noise."""
    import torch
    from transformers.utils import logging as hf_logging

    from agents.models import load_causal_lm, tiny_causal_lm
    from algos.engine.checkpoint import save_checkpoint
    from envs.search_team import default_tokenizer

    tok = default_tokenizer()
    model = tiny_causal_lm(len(tok), hidden_size=32, num_layers=2, num_heads=2, seed=0)
    optimizer = torch.optim.AdamW(model.parameters())
    capfd.readouterr()
    path = save_checkpoint(tmp_path, 1, model, tok, optimizer, {}, {})
    loaded, _ = load_causal_lm(str(path))
    out = capfd.readouterr()
    assert "Writing model shards" not in out.err + out.out and "Loading weights" not in out.err + out.out
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert hf_logging.is_progress_bar_enabled()  # turned back on for the user's own code
