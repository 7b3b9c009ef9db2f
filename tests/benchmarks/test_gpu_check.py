"""gpu_check where it will run (issue 28.8): missing pieces named one per line, the JSON written
after each backend, the headline ratio paying for the weight sync. On CPU, with fakes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[2]


def _spec(absent):
    return lambda name: None if name in absent else object()


def test_each_missing_piece_is_named_in_one_line():
    missing, notes, backends = gpu_check.missing_pieces(["hf", "vllm"], find_spec=_spec({"faiss", "fastapi", "vllm"}),
                                                        cuda_available=lambda: False, requirements=lambda mods: [])
    assert missing == ["missing: faiss (install the wheel faiss-cpu; imported by envs.retrieval.dense)",
                       "missing: fastapi (install the wheel fastapi; imported by envs.retrieval.server)",
                       "missing: a CUDA GPU (torch.cuda.is_available() is False: a CPU-only torch, or no visible "
                       "device)"]
    assert backends == ["hf"] and len(notes) == 1 and notes[0].startswith("vLLM is not installed")
    assert gpu_check.missing_pieces(["hf"], find_spec=_spec(set()), cuda_available=lambda: True,
                                    requirements=lambda mods: []) == ([], [], ["hf"])


def test_the_modules_a_run_needs_are_read_from_the_code():
    """Not a hand list: the review's reproduction (gymnasium and pettingzoo hidden, the preflight
    said nothing, the first train_step raised ModuleNotFoundError) is named now."""
    needed = gpu_check.needed_modules()
    assert {"torch", "transformers", "gymnasium", "pettingzoo", "faiss", "fastapi", "uvicorn", "pydantic",
            "numpy", "tokenizers", "safetensors"} <= set(needed)
    assert needed["gymnasium"] == "envs.search_team" and "ray" not in needed  # Ray only behind rollout_workers
    missing, _, _ = gpu_check.missing_pieces(["hf"], find_spec=_spec({"gymnasium", "pettingzoo"}),
                                             cuda_available=lambda: True, requirements=lambda mods: [])
    assert missing == ["missing: gymnasium (install the wheel gymnasium; imported by envs.search_team)",
                       "missing: pettingzoo (install the wheel pettingzoo; imported by envs.search_team)"]


def test_a_new_import_in_the_run_is_found_without_editing_a_list(tmp_path):
    (tmp_path / "algos").mkdir()
    (tmp_path / "algos" / "__init__.py").write_text("from algos import a\n")
    (tmp_path / "algos" / "a.py").write_text("import os\nimport wonderlib.sub\n\ndef f():\n    import laterlib\n"
                                            "    from algos import b\ntry:\n    import maybelib\nexcept ImportError:\n"
                                            "    maybelib = None\n")
    (tmp_path / "algos" / "b.py").write_text("import onlyinb\n")  # reached only inside a function: not loaded
    assert gpu_check.needed_modules(tmp_path, ("algos",)) == {"laterlib": "algos.a", "wonderlib": "algos.a"}


def test_a_requirement_of_an_installed_package_is_named():
    """fastapi 0.165 requires opentelemetry-api and imports it: its wheel installed --no-deps alone
    fails at import. The walk reads each distribution's Requires-Dist, extras and false markers
    skipped, and names what is not installed."""
    requires = {"fastapi": ["starlette>=1.6", "opentelemetry-api>=1.44.0", "httpx; extra == 'all'",
                            "exceptiongroup; python_version < '3.0'"],
                "starlette": ["anyio<5,>=4"], "anyio": [], "opentelemetry-api": ["importlib-metadata"]}
    installed = {"fastapi", "starlette", "anyio"}

    def version(name):
        import importlib.metadata

        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return "1"

    got = gpu_check.missing_requirements(["fastapi"], version_of=version, requires_of=requires.get,
                                         distributions_of=lambda module: [module])
    assert got == [("opentelemetry-api", "fastapi")]
    missing, _, _ = gpu_check.missing_pieces(["hf"], find_spec=_spec(set()), cuda_available=lambda: True,
                                             requirements=lambda mods: got)
    assert missing == ["missing: opentelemetry-api (install its wheel: fastapi requires it)"]


def test_this_machines_imports_are_all_accounted_for():
    """What the run's modules really import here (a subprocess) is within the modules read from the
    code and the distributions they require: the static reading misses nothing."""
    code = ("import sys, json; before = set(sys.modules)\n"
            f"import {', '.join(gpu_check.ENTRIES)}\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules if m not in before})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    import importlib.metadata

    table = importlib.metadata.packages_distributions()
    needed = set(gpu_check.needed_modules())
    covered = {gpu_check._normal(d) for m in needed for d in table.get(m, [])}
    todo = list(covered)
    while todo:  # the requirement closure, as missing_requirements walks it
        for need in gpu_check._required_by(todo.pop(), importlib.metadata.requires):
            if gpu_check._normal(need) not in covered:
                covered.add(gpu_check._normal(need))
                todo.append(gpu_check._normal(need))
    loaded = [m for m in json.loads(done.stdout) if m not in sys.stdlib_module_names and not m.startswith("_")
              and m not in gpu_check.OWN and table.get(m)]
    unaccounted = [m for m in loaded if m not in needed and not {gpu_check._normal(d) for d in table[m]} & covered]
    # what is left is imported only where present (orjson, watchfiles, dill, ...): hidden, the run's
    # modules still import
    hide = ("import sys, importlib.abc\n"
            "class Hide(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            f"        if name.split('.')[0] in {sorted(unaccounted)!r}: raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Hide())\n")
    again = subprocess.run([sys.executable, "-c", hide + code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert again.returncode == 0, (unaccounted, again.stderr[-2000:])
    loaded_again = set(json.loads(again.stdout))
    assert not loaded_again & set(unaccounted)


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
    assert lines[0] == ("gpu_check: missing: torch (install the wheel torch (with CUDA: expected on the GPU image); "
                        "imported by benchmarks.gpu_check)")
    assert any(line.startswith("gpu_check: missing: gymnasium ") for line in lines)
    assert all(line.startswith("gpu_check: missing: ") for line in lines)


def test_the_gpu_day_script_parses_and_checks_what_it_carries():
    """benchmarks/gpu_day.sh (issue 42.6): valid bash; ``size`` refuses a call over the limit in one
    line (the limit lowered for the test); an unknown step prints the usage."""
    script = ROOT / "benchmarks" / "gpu_day.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    ok = subprocess.run(["bash", str(script), "size"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and " MiB of 64 MiB" in ok.stdout, ok.stderr
    over = subprocess.run(["bash", str(script), "size"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**__import__("os").environ, "GPU_DAY_LIMIT_BYTES": "1000"})
    assert over.returncode == 1 and over.stderr.strip().startswith("gpu_day: too large to carry")
    assert subprocess.run(["bash", str(script), "nope"], capture_output=True).returncode == 2


def test_the_probe_runs_a_tiny_shape_on_cpu(tmp_path):
    """benchmarks/gpu_probe.py's wiring without a GPU: a tiny Qwen3 update, the plan's figures beside."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_probe", "--shape", "tiny", "--tokens", "128",
                           "--device", "cpu", "--steps", "2", "--json", str(tmp_path / "p.json")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads((tmp_path / "p.json").read_text())
    assert len(figures) == 2 and all(f["plan_backward_gib"] > 0 and f["backward_gib"] >= 0 for f in figures)
    assert "step 1: backward peak " in done.stdout and "(plan " in done.stdout
