"""gpu_check where it will run (issue 28.8): missing pieces named one per line, the JSON written
after each backend, the headline ratio paying for the weight sync. On CPU, with fakes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[1]


def _spec(absent):
    return lambda name: None if name in absent else object()


def test_each_missing_piece_is_named_in_one_line():
    missing, notes, backends = gpu_check.missing_pieces(["hf", "vllm"], find_spec=_spec({"faiss", "fastapi", "vllm"}),
                                                        cuda_available=lambda: False)
    assert missing == ["missing: faiss (install the wheel faiss-cpu)", "missing: fastapi (install the wheel fastapi)",
                       "missing: a CUDA GPU (torch.cuda.is_available() is False: a CPU-only torch, or no visible "
                       "device)"]
    assert backends == ["hf"] and len(notes) == 1 and notes[0].startswith("vLLM is not installed")
    assert gpu_check.missing_pieces(["hf"], find_spec=_spec(set()), cuda_available=lambda: True) == ([], [], ["hf"])


def test_main_stops_before_anything_runs_when_a_piece_is_missing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "missing_pieces", lambda backends: (["missing: faiss (install the wheel "
                                                                        "faiss-cpu)"], [], backends))
    monkeypatch.setattr(gpu_check, "model_dir", lambda: pytest.fail("built a model"))
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["gpu_check: missing: faiss (install the wheel faiss-cpu)"]


def _result(backend, rollout, sync, tokens, score=0.5, update=1.0):
    return {"backend": backend, "perf/rollout_s": rollout, "sync_s": sync, "tokens_per_step": tokens,
            "perf/score_s": score, "perf/update_s": update, "step_s": rollout + score + update,
            "peak_gpu_gib": 1.0, "device_used_gib": 2.0}


def test_the_json_is_written_after_the_first_backend_before_a_later_one_fails(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "missing_pieces", lambda backends: ([], [], backends))
    monkeypatch.setattr(gpu_check, "model_dir", lambda: "tiny-dir")
    seen = []

    def fake_run(backend, model_dir, steps, out):
        if backend == "vllm":  # by now HF's figures must be on disk
            seen.append(json.loads((out / "gpu_check.json").read_text()))
            raise RuntimeError("engine\ncrashed")
        return _result("hf", 10.0, 0.0, 1000.0)

    monkeypatch.setattr(gpu_check, "run", fake_run)
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    assert seen == [[_result("hf", 10.0, 0.0, 1000.0)]]
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == seen[0]
    assert capsys.readouterr().err.strip().splitlines() == ["gpu_check: vllm failed: RuntimeError: engine crashed"]


def test_the_ratio_pays_for_the_weight_sync():
    # HF: 1000 tokens in 10 s of rollout, nothing to sync: 100 tok/s. vLLM: 1000 tokens in 1 s,
    # plus 1 s of sleep and weight push: 500 tok/s, a ratio of 5 (10 without the sync)
    hf, vllm = _result("hf", 10.0, 0.0, 1000.0), _result("vllm", 1.0, 1.0, 1000.0)
    assert gpu_check.rate_with_sync(vllm) == 500.0
    lines = gpu_check.headline([hf, vllm])
    assert lines[0].startswith("vllm / hf generated tokens per second of rollout + weight sync (tiny model): 5.00x")
    assert "end-to-end step time hf / vllm: 4.60x" in lines[0]  # 11.5 s / 2.5 s
    assert len(lines) == 3 and "weight sync 1.00s" in lines[2]


def test_it_runs_as_a_module_from_the_checkout_without_the_project_installed(tmp_path):
    """``python -m benchmarks.gpu_check`` from the root finds ``agents`` and ``algos`` with
    site-packages off (-S: nothing installed), and reports torch and the rest as missing."""
    done = subprocess.run([sys.executable, "-S", "-m", "benchmarks.gpu_check", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "gpu_check: missing: torch (install the wheel torch (with CUDA: expected on the GPU image))"
    assert all(line.startswith("gpu_check: missing: ") for line in lines)
