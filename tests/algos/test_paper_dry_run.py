"""The paper-shaped dry run on CPU (issue 28.7): the ``paper_cpu`` preset (a random Qwen3 built
from a shrunk Qwen3Config, activation checkpointing, the paper's team shape) through Stage I
then Stage II, two steps each, under ``torchrun --nproc-per-node 2`` with ``fsdp=true`` and two
Ray rollout workers. It checks the wiring (sharding, lock-step chunks, gathered replicas and
checkpoints, the workers' batches, the Stage-I Teacher reaching Stage II), not learning."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_paper_preset_has_the_paper_structure():
    """What the dry run keeps of ``paper``: checkpointing, lr, group size, generation batch, the
    team shape (TrainConfig's defaults), and a Qwen3 decoder with grouped-query attention."""
    from algos.commands.presets import PRESETS, preset_config
    from algos.config import TrainConfig
    from algos.recipes.paper_cpu.build import fresh_paper_cpu_model

    paper, dry = PRESETS["paper"], preset_config("paper_cpu", stage="teacher", teacher=None)
    for key in ("gradient_checkpointing", "learning_rate", "group_size", "generation_batch_size"):
        assert getattr(dry, key) == paper[key], key
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}  # the paper's team shape
    for key in ("max_waves", "max_searchers", "max_searcher_turns", "num_candidates", "top_k"):
        assert getattr(dry, key) == defaults[key], key
    assert (dry.fsdp, dry.rollout_workers, dry.steps) == (True, 2, 2)
    model, tokenizer = fresh_paper_cpu_model()
    assert type(model).__name__ == "Qwen3ForCausalLM" and len(tokenizer) == model.config.vocab_size
    assert model.config.num_attention_heads == 3 * model.config.num_key_value_heads
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 10_000_000


@pytest.mark.slow
def test_paper_dry_run_both_stages_fsdp_ray_workers_two_ranks(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "algos", "train", "--preset", "paper_cpu", "--out", str(out), "--no-progress"]
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the dry run ran past 600 s; its stderr ends: {stderr[-2000:]}")
    assert proc.returncode == 0, stderr[-4000:]
    import torch
    from safetensors.torch import load_file

    from algos.recipes.paper_cpu.build import fresh_paper_cpu_model

    parameters = len(list(fresh_paper_cpu_model()[0].parameters()))
    for stage in ("teacher", "team"):
        rows = [json.loads(line) for line in (out / stage / "metrics.jsonl").read_text().splitlines()]
        assert [row["step"] for row in rows] == [0, 1, 2], stage  # rank 0 alone writes
        trained = rows[1:]
        assert [row["dist/world_size"] for row in trained] == [2.0, 2.0]
        assert all(row["losses/tokens"] > 0 for row in trained)  # rows were trained on both ranks
        assert all(row["rollout/worker_restarts"] == 0 for row in trained)  # the Ray workers rolled out
        checkpoint = out / stage / "checkpoints" / "step_000002"
        config = json.loads((checkpoint / "config.json").read_text())
        assert config["architectures"] == ["Qwen3ForCausalLM"]
        weights = load_file(str(checkpoint / "model.safetensors"))
        assert all(bool(torch.isfinite(w).all()) for w in weights.values())
        optimizer = torch.load(checkpoint / "trainer_state.pt", weights_only=True)["optimizer"]
        assert optimizer["param_groups"][0]["params"] == list(range(parameters))  # one process's layout
        assert stdout.count(f"[{stage}] after 2 steps") == 1
    summary = json.loads((out / "summary.json").read_text())
    assert [summary["stages"][s]["steps"] for s in ("teacher", "team")] == [2, 2]
