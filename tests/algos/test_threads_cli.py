"""``--threads`` on every heavy command (issue 19.5) and ``perf --scaleout`` (issue 15): each
command hands its thread count to ``algos.reproducible.run_threads``, says it on its first
line and records it; the heavy work is monkeypatched away (these tests take seconds)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from algos.reproducible import current_threads


class _Saver:
    def save_pretrained(self, path: Path) -> None:
        Path(path, "saved").write_text("x")


def test_sft_runs_on_the_given_threads_and_records_them(tmp_path, monkeypatch, capsys):
    import algos.commands.sft as cli

    seen = {}

    def fake_sft(model, episodes, progress=True, **settings):
        seen["threads"] = current_threads()
        return [2.0, 1.0]

    monkeypatch.setattr(cli, "sft", fake_sft)
    monkeypatch.setattr(cli, "load_episodes", lambda path: ["episode"])
    monkeypatch.setattr(cli, "starting_model", lambda name: (_Saver(), _Saver()))
    episodes = tmp_path / "eps.jsonl"
    episodes.write_text("{}\n")
    assert cli.main(["--episodes", str(episodes), "--out", str(tmp_path / "out"), "--threads", "3",
                     "--no-progress"]) == 0
    assert seen["threads"] == 3
    assert current_threads() == 1  # restored after the command
    assert json.loads((tmp_path / "out" / "sft.json").read_text())["threads"] == 3
    first = capsys.readouterr().err.splitlines()[0]
    assert first == ("python -m algos sft: 3 torch/faiss threads (--threads N to change; "
                     "more helps only on idle cores)")


def test_sft_preset_build_sees_the_threads(monkeypatch):
    import algos.commands.sft as cli

    seen = {}

    def build_base(out, seed=0, progress=True, **options):
        seen["threads"] = current_threads()
        return "built"

    monkeypatch.setitem(cli.RECIPES, "tiny", SimpleNamespace(build_base=build_base))
    assert cli.main(["--preset", "tiny", "--threads", "2"]) == 0
    assert seen == {"threads": 2}


def test_sft_refuses_zero_threads():
    import algos.commands.sft as cli

    with pytest.raises(SystemExit):
        cli.main(["--preset", "tiny", "--threads", "0"])


def test_benchmarks_run_passes_threads_to_the_suite(tmp_path, monkeypatch, capsys):
    import inspect

    import benchmarks.suite as suite
    from benchmarks.__main__ import main

    seen, signature = {}, inspect.signature(suite._run_suite)

    def fake_run_suite(*args, **kwargs):  # the part of run_suite after its checks
        seen["threads"] = signature.bind(*args, **kwargs).arguments["threads"]
        seen["inside"] = current_threads()
        return {}

    monkeypatch.setattr(suite, "check_run", lambda *a, **k: None)
    monkeypatch.setattr(suite, "_run_suite", fake_run_suite)
    assert main(["run", "--policy", "scripted", "--out", str(tmp_path / "r"), "--threads", "2"]) == 0
    assert seen == {"threads": 2, "inside": 2}
    assert capsys.readouterr().err.splitlines()[0].startswith("python -m benchmarks run: 2 torch/faiss threads")
    seen.clear()
    assert main(["run", "--policy", "scripted", "--out", str(tmp_path / "r")]) == 0
    assert seen == {"threads": 1, "inside": 1}  # the default
    assert main(["run", "--policy", "scripted", "--out", str(tmp_path / "r"), "--threads", "0"]) == 2


def _fake_perf(seen):
    def run_perf(settings, log=print, *, vllm=False):
        seen["threads"], seen["vllm"] = settings.threads, vllm
        return {"meta": {"wall_s": 1.0, "load_average_start": 0.0, "load_average_end": 0.0, "cpu_count": 2},
                "figures": {}, "details": {}}
    return run_perf


def test_perf_threads_and_scaleout_wire_through(tmp_path, monkeypatch):
    import benchmarks.perf.cli as perf_cli
    import benchmarks.scaleout_perf as scaleout
    from benchmarks.perf.runner import add_scaleout
    from benchmarks.perf.settings import PRESETS

    seen = {}
    calls = []
    monkeypatch.setattr(perf_cli, "run_perf", _fake_perf(seen))

    def fake_measure(model="tiny", pairs=3, only=None, **kw):
        calls.append((model, pairs, only))
        out = {"model": model}
        if only in (None, "ray"):
            out.update({"collect.ray_workers_speedup": 1.25, "collect.pairs": [1.0, 1.25, 1.5]})
        if only in (None, "ddp"):
            out.update({"learner.ddp_step_ratio": 0.8, "learner.pairs": [0.7, 0.8, 0.9]})
        return out

    monkeypatch.setattr(scaleout, "measure", fake_measure)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "ray" else real_find_spec(name, *a))
    out = tmp_path / "perf.json"
    assert perf_cli.main(["--tiny-for-tests", "--scaleout", "--threads", "2", "--reps", "3", "--out", str(out)]) == 0
    assert seen == {"threads": 2, "vllm": False}
    assert perf_cli.main(["--tiny-for-tests", "--vllm", "--out", str(tmp_path / "v.json")]) == 0
    assert seen == {"threads": 1, "vllm": True}  # the vLLM section alone
    assert calls == [("tiny", 3, None)]
    figures = json.loads(out.read_text())["figures"]
    assert figures["collect.ray_workers_speedup"]["ratio"] == 1.25
    assert (figures["collect.ray_workers_speedup"]["low"], figures["collect.ray_workers_speedup"]["high"]) == (1.0, 1.5)
    assert figures["learner.ddp_step_ratio"]["ratio"] == 0.8
    assert figures["learner.ddp_step_ratio"]["high"] == 0.9

    # without ray: one line, and the learner's ratio alone
    lines = []
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real_find_spec(name, *a))
    result = {"figures": {}, "details": {}}
    add_scaleout(result, PRESETS["test"], log=lines.append)
    assert calls[-1] == ("tiny", 2, "ddp")
    assert sorted(result["figures"]) == ["learner.ddp_step_ratio"]
    assert lines[0].startswith("scaleout: collect.ray_workers_speedup skipped: ray is not installed")

    # without the flag, nothing is measured
    calls.clear()
    assert perf_cli.main(["--tiny-for-tests", "--out", str(out)]) == 0
    assert calls == [] and seen == {"threads": 1, "vllm": False}
