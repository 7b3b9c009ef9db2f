"""``python -m algos`` refuses bad settings and paths before anything loads or builds: one
line on stderr naming the setting and the value, exit status 2, no traceback."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from algos.__main__ import main, parse_overrides
from algos.commands.preflight import PreflightError, check_retriever
from algos.config import BOOLEANS


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens once the socket is closed


def refused(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv, named", [
    (["--set", "max_grad_norm=-1"], "max_grad_norm=-1"),
    (["--set", "freeze_embeddings=ture"], "freeze_embeddings=ture"),
    (["--set", "freeze_embeddings=on"], "freeze_embeddings=on"),
    (["--set", "beta=nan"], "beta=nan"),
    (["--set", "kl_coef=inf"], "kl_coef=inf"),
    (["--set", "steps=abc"], "steps=abc"),
    (["--set", "val_per_dataset=-1"], "val_per_dataset=-1"),
    (["--steps", "0"], "steps=0"),
    (["--set", "env_kwargs=[1]"], "env_kwargs=[1]"),
    (["--set", "max_context_tokens=128", "--set", "max_turn_tokens=64"], "max_context_tokens=128 cannot hold"),
])
def test_bad_settings_are_refused_in_one_line_before_anything_builds(argv, named, tmp_path, capsys,
                                                                       nothing_builds):
    line = refused(["train", "--preset", "micro", "--out", str(tmp_path / "run"), *argv], capsys)
    assert named in line.replace("'", "").replace(".0:", ":"), line


def test_resume_without_a_run_is_refused(tmp_path, capsys, nothing_builds):
    line = refused(["train", "--resume", "--out", str(tmp_path / "run")], capsys)
    assert "--resume" in line and str(tmp_path / "run" / "teacher" / "checkpoints") in line


def test_a_fresh_run_over_an_old_one_is_refused_before_stage_one(tmp_path, capsys, nothing_builds):
    team = tmp_path / "run" / "team"
    team.mkdir(parents=True)
    (team / "metrics.jsonl").write_text('{"step": 1}\n')
    line = refused(["train", "--out", str(tmp_path / "run")], capsys)
    assert str(team) in line and "--resume" in line


def test_a_missing_teacher_is_refused(tmp_path, capsys, nothing_builds):
    nowhere = tmp_path / "no-such-teacher"
    line = refused(["train", "--stage", "team", "--teacher", str(nowhere), "--out", str(tmp_path / "run")], capsys)
    assert f"teacher={str(nowhere)!r}" in line
    empty = tmp_path / "empty-teacher"
    empty.mkdir()
    line = refused(["train", "--stage", "team", "--teacher", str(empty), "--out", str(tmp_path / "run")], capsys)
    assert f"teacher={str(empty)!r}" in line and "checkpoint" in line


def test_a_retriever_that_does_not_answer_is_refused(tmp_path, capsys, nothing_builds):
    url = f"http://127.0.0.1:{closed_port()}/retrieve"
    line = refused(["train", "--set", f"retriever={url}", "--out", str(tmp_path / "run")], capsys)
    assert f"retriever={url!r} does not answer" in line
    line = refused(["train", "--set", f"retriever={tmp_path / 'corpus.jsonl'}", "--out", str(tmp_path / "r")],
                   capsys)
    assert "corpus.jsonl" in line and "no such corpus file" in line


class _Answers(BaseHTTPRequestHandler):
    silent = False

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.silent:
            threading.Event().wait(2)  # holds the connection, never answers in time
            return
        hits = [[{"document": {"id": "1", "contents": "T\ntext"}, "score": 1.0}] for _ in body["queries"]]
        data = json.dumps({"result": hits}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("silent", [False, True])
def test_retriever_probe_passes_a_live_server_and_times_out_on_a_silent_one(silent):
    handler = type("Handler", (_Answers,), {"silent": silent})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        if silent:
            with pytest.raises(PreflightError, match="does not answer"):
                check_retriever(url, timeout=0.2)
        else:
            check_retriever(url, timeout=5)
    finally:
        server.shutdown()
        server.server_close()


def test_good_settings_reach_the_pipeline_with_every_stage(tmp_path, monkeypatch):
    import algos.commands.train

    calls = []
    monkeypatch.setattr(algos.commands.train, "run_pipeline", lambda *a, **kw: calls.append((a, kw)))
    checkpoint = tmp_path / "run" / "teacher" / "checkpoints" / "step_000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"")
    assert main(["train", "--out", str(tmp_path / "run"), "--resume", "--steps", "3",
                 "--set", "freeze_embeddings=No", "--set", "beta=0.5"]) == 0
    (preset, out, stages, overrides), kw = calls[0]
    assert (preset, str(out), stages) == ("micro", str(tmp_path / "run"), ("teacher", "team"))
    assert overrides == {"freeze_embeddings": False, "beta": 0.5, "steps": 3} and kw["resume"] is True


def test_booleans_are_parsed_strictly():
    for word, value in BOOLEANS.items():
        assert parse_overrides([f"freeze_embeddings={word.upper()}"]) == {"freeze_embeddings": value}
    assert parse_overrides(["train_per_dataset=none", "env_kwargs={\"top_k\": 5}"]) == {
        "train_per_dataset": None, "env_kwargs": {"top_k": 5}}
    with pytest.raises(PreflightError, match="freeze_embeddings=y"):
        parse_overrides(["freeze_embeddings=y"])


@pytest.mark.parametrize("argv, named", [
    (["--lr", "nan"], "--lr=nan"),
    (["--lr=-1e-4"], "--lr=-0.0001"),
    (["--epochs", "0"], "--epochs=0"),
    (["--skip-search", "1.5"], "--skip-search=1.5"),
])
def test_bad_sft_settings_are_refused_before_the_sft_starts(argv, named, tmp_path, capsys, nothing_builds):
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text("")
    line = refused(["sft", "--episodes", str(episodes), *argv], capsys)
    assert named in line


def test_question_files_that_do_not_load_are_refused_with_file_and_line(tmp_path, capsys, nothing_builds):
    data = tmp_path / "data"
    (data / "nq").mkdir(parents=True)
    good = json.dumps({"id": "1", "question": "Where?", "golden_answers": ["There"]})
    (data / "nq" / "train.jsonl").write_bytes(good.encode() + b"\n" + good.encode()[:-2] + b"\xe9\"}\n")
    (data / "nq" / "dev.jsonl").write_text(good + "\n")
    argv = ["train", "--stage", "teacher", "--out", str(tmp_path / "run"), "--set", f"data={data}",
            "--set", "train_datasets=nq", "--set", "val_datasets=nq", "--set", "train_per_dataset=1"]
    line = refused(argv, capsys)
    assert line.endswith(f"data={str(data)!r}: {data / 'nq' / 'train.jsonl'}, line 2: not UTF-8 text "
                         "(byte 0xe9 at column 61)"), line
    (data / "nq" / "train.jsonl").write_text(good + "\n")
    line = refused([*argv, "--set", "val_split=test"], capsys)
    assert "no split 'test' for 'nq'" in line and "splits in" in line


def _report_missing(monkeypatch, missing: str) -> None:
    """``importlib.util.find_spec`` finds no ``missing`` (every other module as before)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args, **kwargs: None if name == missing else real(name, *args, **kwargs))


@pytest.mark.parametrize("setting, missing, install", [
    ("rollout_workers=2", "ray", "pip install -e '.[distributed]'"),
    ("rollout_backend=vllm", "vllm", "pip install -e '.[vllm]'"),
])
def test_a_missing_extra_is_refused_with_its_install_before_anything_builds(setting, missing, install, tmp_path,
                                                                            monkeypatch, capsys, nothing_builds):
    _report_missing(monkeypatch, missing)
    out = tmp_path / "run"
    line = refused(["train", "--preset", "tiny", "--out", str(out), "--set", setting], capsys)
    assert line.startswith(f"python -m algos: error: {setting} needs {missing}, which is not installed: "), line
    assert install in line, line
    assert not out.exists()  # no run folder, no base: the pipeline never started


@pytest.mark.parametrize("setting, present", [("rollout_workers=2", "ray"), ("rollout_backend=vllm", "vllm")])
def test_an_installed_extra_lets_the_run_start(setting, present, tmp_path, monkeypatch):
    import importlib.util

    import algos.commands.train

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",  # reported present, whether or not it is here
                        lambda name, *args, **kwargs: object() if name == present else real(name, *args, **kwargs))
    calls = []
    monkeypatch.setattr(algos.commands.train, "run_pipeline", lambda *a, **kw: calls.append(a))
    assert main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--set", setting]) == 0
    assert len(calls) == 1
