"""Damaged checkpoints and shared output folders (issue 27.3-4): ``--resume`` falls back from a
cut or random newest checkpoint to the previous complete one, saying which file it skipped;
a checkpoint or Teacher missing a tensor or holding a NaN is refused naming it (never
initialised at random); a second run into a live run's ``--out`` is refused in one line
naming the first, and a dead run's lock is taken over."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import cut_in_half, make_trainer
from safetensors.torch import load_file, save_file

from agents.models import tiny_causal_lm

MLP = "model.layers.0.mlp.down_proj.weight"


def _rewrite(file, change):
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


@pytest.mark.parametrize("name, why", [("model.safetensors", "unreadable safetensors"),
                                       ("config.json", "not JSON, cut or damaged")])
def test_a_cut_newest_checkpoint_falls_back_to_the_previous_one_on_resume(tmp_path, tiny_dirs, two_checkpoints,
                                                                           capsys, name, why):
    """Its weights or its config cut: the resumed run starts from the checkpoint before."""
    older, newest = two_checkpoints
    cut_in_half(newest / name)
    resumed = make_trainer(tmp_path, tiny_dirs, resume=True, steps=4)
    assert resumed.step == 0 and resumed.model_path == str(older)
    err = capsys.readouterr().err
    assert f"skipping checkpoint step_000002: {newest / name}: {why}" in err
    assert f"falling back to the previous complete checkpoint {older}" in err


@pytest.mark.parametrize("damage", ["cut", "random"])
def test_a_damaged_newest_trainer_state_falls_back_to_the_previous_checkpoint(tmp_path, tiny_dirs, two_checkpoints,
                                                                              capsys, damage):
    older, newest = two_checkpoints
    state = newest / "trainer_state.pt"
    if damage == "cut":
        cut_in_half(state)
    else:
        state.write_bytes(os.urandom(4096))
    resumed = make_trainer(tmp_path, tiny_dirs, resume=True, steps=4)
    assert resumed.step == 0 and resumed.model_path == str(older)
    assert f"skipping checkpoint step_000002: {state}: " in capsys.readouterr().err


def test_with_no_complete_checkpoint_resume_is_refused_in_one_line_naming_the_file(tmp_path, tiny_dirs,
                                                                                 two_checkpoints):
    older, newest = two_checkpoints
    cut_in_half(newest / "model.safetensors")
    (older / "trainer_state.pt").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(ValueError, match="no usable checkpoint") as info:
        make_trainer(tmp_path, tiny_dirs, resume=True, steps=4)
    assert "\n" not in str(info.value) and str(newest / "model.safetensors") in str(info.value)


def test_a_checkpoint_missing_a_tensor_is_refused_naming_it(tmp_path, tiny_dirs, torch_one_thread):
    from algos.engine.checkpoint import load_model

    path = make_trainer(tmp_path, tiny_dirs, steps=1).save()
    _rewrite(path / "model.safetensors", lambda t: t.pop(MLP))
    with pytest.raises(ValueError, match=f"{path / 'model.safetensors'}: tensor '{MLP}' is missing"):
        make_trainer(tmp_path, tiny_dirs, resume=True, steps=1)
    # loaded directly, transformers' loading info is checked: never initialised at random
    with pytest.raises(ValueError, match=f"{path}: tensor '{MLP}' is missing"):
        load_model(str(path))


def test_a_checkpoint_holding_a_nan_is_refused_at_load(tmp_path, tiny_dirs, torch_one_thread):
    from algos.engine.checkpoint import load_model

    path = make_trainer(tmp_path, tiny_dirs, steps=1).save()

    def poison(tensors):
        tensors[MLP][0, 0] = float("nan")

    _rewrite(path / "model.safetensors", poison)
    with pytest.raises(ValueError, match=f"tensor '{MLP}' holds non-finite values") as info:
        make_trainer(tmp_path, tiny_dirs, resume=True, steps=1)
    assert str(path / "model.safetensors") in str(info.value)
    with pytest.raises(ValueError, match=f"{path}: tensor '{MLP}' holds non-finite values"):
        load_model(str(path))


def test_a_teacher_missing_a_tensor_is_refused(tmp_path, tiny_dirs, torch_one_thread):
    from algos.teacher import load_teacher

    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_dirs["teacher"], teacher)
    assert load_teacher(str(teacher), tiny_dirs["policy"]) is not None  # whole, it loads
    _rewrite(teacher / "model.safetensors", lambda t: t.pop(MLP))
    with pytest.raises(ValueError, match=f"{teacher}: tensor '{MLP}' is missing"):
        load_teacher(str(teacher), tiny_dirs["policy"])


def test_tied_weights_saved_once_count_as_present(tmp_path, torch_one_thread):
    from algos.engine.checkpoint import load_model, verify_weights

    model = tiny_causal_lm(64, hidden_size=16, num_layers=1, num_heads=2, tie_word_embeddings=True)
    model.save_pretrained(tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")  # written once
    verify_weights(tmp_path)  # no error: the tied head is the embedding
    _rewrite(tmp_path / "model.safetensors", lambda t: t.pop("model.embed_tokens.weight"))
    with pytest.raises(ValueError, match="tensor 'model.embed_tokens.weight' is missing"):
        verify_weights(tmp_path)
    with pytest.raises(ValueError, match="tensor '(model.embed_tokens|lm_head).weight' is missing"):
        load_model(str(tmp_path))


# ---------------------------------------------------------------------- one run per --out

HOLDER = """
import sys
from algos.engine.runlock import run_lock
with run_lock(sys.argv[1], command="the first run"):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_second_run_into_a_live_runs_out_is_refused_in_one_line_naming_it(tmp_path, capsys, monkeypatch):
    from algos.__main__ import main
    from algos.commands import train as pipeline

    ran = []  # the run itself (base build, training) is not this test's business
    monkeypatch.setattr(pipeline, "_run_pipeline", lambda *args: ran.append(args) or {})
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert main(["train", "--stage", "teacher", "--preset", "micro", "--out", str(tmp_path),
                     "--steps", "1", "--no-progress"]) == 2
    finally:
        holder.communicate("")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m algos: error: ")
    assert f"is in use by another run (pid {holder.pid} on host {socket.gethostname()!r}" in err
    assert "command 'the first run'" in err
    assert ran == [] and not (tmp_path / "teacher").exists()  # the refused run never started


def test_the_lock_is_refused_inside_one_process_and_released_after(tmp_path):
    from algos.engine.runlock import RunLockedError, run_lock

    with run_lock(tmp_path, command="first") as record:
        assert record["pid"] == os.getpid()
        assert json.loads((tmp_path / "run.lock").read_text())["command"] == "first"
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()} .*command 'first'"):
            with run_lock(tmp_path, command="second"):
                pass
    assert (tmp_path / "run.lock").read_text() == ""  # released: nothing stale left
    notes = []
    with run_lock(tmp_path, log=notes.append, command="third"):
        pass
    assert notes == []


def test_a_stale_lock_of_a_dead_pid_is_taken_over_with_a_note(tmp_path):
    from algos.engine.runlock import run_lock

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is free now (reaped)
    stale = {"pid": dead.pid, "host": socket.gethostname(), "command": "killed run", "started": "then"}
    (tmp_path / "run.lock").write_text(json.dumps(stale))
    notes = []
    with run_lock(tmp_path, log=notes.append, command="new run"):
        assert json.loads((tmp_path / "run.lock").read_text())["command"] == "new run"
    assert len(notes) == 1
    assert f"taking over the stale lock of pid {dead.pid}" in notes[0] and "no longer running" in notes[0]
    assert "killed run" in notes[0]


def test_the_pipeline_holds_the_lock_of_its_out(tmp_path, tiny_dirs, monkeypatch):
    from algos.commands import train as pipeline
    from algos.engine.runlock import RunLockedError

    seen = []

    def fake_run(preset, out_dir, *args):
        seen.append(json.loads((out_dir / "run.lock").read_text())["pid"])
        with pytest.raises(RunLockedError):
            pipeline.run_pipeline("micro", out_dir, stages=("teacher",), log=seen.append)
        return {}

    monkeypatch.setattr(pipeline, "_run_pipeline", fake_run)
    assert pipeline.run_pipeline("micro", tmp_path, stages=("teacher",)) == {}
    assert seen == [os.getpid()] and (tmp_path / "run.lock").read_text() == ""
