"""Issue 44.1: nothing read from a file or a request writes or reads outside its folder.
envs.paths.contained is the one check; the checkpoint pointer (and with it ckpt:RUN,
--teacher RUN and resolve_model_path) goes through it; the run lock never follows a link
and refuses anything but a plain file in one line; the lock record is rewritten whole."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from envs.paths import contained

# ---------------------------------------------------------------------------- the helper


@pytest.mark.parametrize("name, why", [
    ("../x", "climbs out"), ("a/../../x", "climbs out"), ("/etc/passwd", "absolute"), ("a\x00b", "NUL"),
    ("", "non-empty"), (".", "the folder itself"), ("a/..", "climbs out"), (None, "non-empty"), (7, "non-empty"),
])
def test_contained_refuses_names_that_leave_their_folder_in_one_line(tmp_path, name, why):
    with pytest.raises(ValueError, match=why) as info:
        contained(tmp_path, name, source=tmp_path / "table2.json")
    text = str(info.value)
    assert "\n" not in text and "\x00" not in text and text.startswith(f"{tmp_path / 'table2.json'}: ")


def test_contained_follows_links_only_while_they_stay_inside(tmp_path):
    outside, root = tmp_path / "outside", tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "out").symlink_to(outside)
    (root / "in").symlink_to(root / "sub")
    assert contained(root, "seed0/opd") == root / "seed0/opd"  # need not exist yet
    assert contained(root, "in/file") == root / "in/file"
    with pytest.raises(ValueError, match="symbolic link"):
        contained(root, "out/file")
    (root / "loop").symlink_to(root / "loop")
    with pytest.raises(ValueError, match="refusing the name 'loop'"):
        contained(root, "loop")


def test_contained_quotes_escape_codes_in_the_name(tmp_path):
    with pytest.raises(ValueError) as info:
        contained(tmp_path, "/x\x1b]52;c;ZXZpbA==\x07\n")
    assert "\x1b" not in str(info.value) and "\\x1b" in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------ the checkpoint pointer


def _fake_checkpoint(path):
    path.mkdir(parents=True)
    (path / "trainer_state.pt").write_bytes(b"")  # latest_checkpoint looks for this file only
    return path


@pytest.mark.parametrize("pointer", ["../../victim/checkpoints/step_000009", "ABSOLUTE"])
def test_a_latest_pointer_out_of_the_run_is_refused_naming_it(tmp_path, pointer):
    from algos.engine.checkpoint import latest_checkpoint, resolve_model_path

    victim = _fake_checkpoint(tmp_path / "victim" / "checkpoints" / "step_000009")
    (victim / "config.json").write_text("{}")
    run = tmp_path / "run"
    _fake_checkpoint(run / "checkpoints" / "step_000001")
    text = str(victim) if pointer == "ABSOLUTE" else pointer
    (run / "checkpoints" / "latest").write_text(text)
    for call in (latest_checkpoint, resolve_model_path):  # resolve_model_path: ckpt:RUN, --teacher RUN
        with pytest.raises(ValueError, match="refusing the name") as info:
            call(str(run))
        assert str(run / "checkpoints" / "latest") in str(info.value) and "\n" not in str(info.value)


def test_a_latest_pointer_that_is_a_link_out_is_refused(tmp_path):
    from algos.engine.checkpoint import latest_checkpoint

    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("step_000001")
    run = tmp_path / "run"
    _fake_checkpoint(run / "checkpoints" / "step_000001")
    (run / "checkpoints" / "latest").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="symbolic link"):
        latest_checkpoint(run)


def test_a_step_folder_that_links_out_is_never_chosen(tmp_path):
    from algos.engine.checkpoint import latest_checkpoint, usable_checkpoint

    victim = _fake_checkpoint(tmp_path / "victim")
    run = tmp_path / "run"
    mine = _fake_checkpoint(run / "checkpoints" / "step_000001")
    (run / "checkpoints" / "step_000009").symlink_to(victim)
    assert latest_checkpoint(run) == mine
    with pytest.raises(ValueError, match="step_000001"):  # the only candidate left, itself unusable
        usable_checkpoint(run, log=lambda _: None)


def test_a_shard_index_naming_a_file_outside_is_refused(tmp_path):
    from algos.engine.checkpoint import verify_weights

    (tmp_path / "secret.safetensors").write_bytes(b"x")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../secret.safetensors"}}))
    with pytest.raises(ValueError, match="refusing the name '../secret.safetensors'"):
        verify_weights(model)


# ------------------------------------------------------------------------- the run lock


def test_a_planted_lock_symlink_is_refused_and_its_target_left_alone(tmp_path):
    from algos.engine.runlock import RunLockedError, run_lock

    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.lock").symlink_to(target)
    with pytest.raises(RunLockedError, match="symbolic link") as info:
        with run_lock(out, command="x"):
            pass
    assert "\n" not in str(info.value) and str(out / "run.lock") in str(info.value)
    assert target.read_text() == "keep me\n"
    (out / "run.lock").unlink()
    (out / "run.lock").symlink_to(tmp_path / "not_there")  # a dangling link is not created through
    with pytest.raises(RunLockedError, match="symbolic link"):
        with run_lock(out, command="x"):
            pass
    assert not (tmp_path / "not_there").exists()


def test_a_lock_hard_linked_to_another_file_is_refused(tmp_path):
    from algos.engine.runlock import RunLockedError, run_lock

    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    os.link(target, out / "run.lock")
    with pytest.raises(RunLockedError, match="hard link"):
        with run_lock(out, command="x"):
            pass
    assert target.read_text() == "keep me\n"


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_lock_path_that_is_not_a_plain_file_is_refused_in_one_line(tmp_path, kind):
    from algos.engine.runlock import RunLockedError, run_lock

    if kind == "folder":
        (tmp_path / "run.lock").mkdir()
    else:
        os.mkfifo(tmp_path / "run.lock")
    with pytest.raises(RunLockedError, match="refusing the run lock") as info:
        with run_lock(tmp_path, command="x"):
            pass
    assert "\n" not in str(info.value)


def test_the_train_command_refuses_a_folder_lock_in_one_line(tmp_path, capsys, monkeypatch):
    from algos.__main__ import main
    from algos.commands import train as pipeline

    ran = []
    monkeypatch.setattr(pipeline, "_run_pipeline", lambda *args: ran.append(args) or {})
    (tmp_path / "run.lock").mkdir()
    assert main(["train", "--stage", "teacher", "--preset", "micro", "--out", str(tmp_path),
                 "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m algos: error: ") and "a folder" in err
    assert ran == []


def test_the_lock_record_is_rewritten_whole(tmp_path):
    """Item 7: a stale record longer than the new one leaves no byte behind it."""
    from algos.engine.runlock import run_lock

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = {"pid": dead.pid, "host": socket.gethostname(), "command": "x" * 5000, "started": "then"}
    (tmp_path / "run.lock").write_text(json.dumps(stale) + "\n" + "trailing bytes of the old record\n")
    with run_lock(tmp_path, log=lambda _: None, command="new") as record:
        assert (tmp_path / "run.lock").read_text() == json.dumps(record) + "\n"
    assert (tmp_path / "run.lock").read_text() == ""
