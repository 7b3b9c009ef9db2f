"""Reproducible runs (issue 22): a fixed thread count set once per command and recorded, a
weight hash that names a base, and a cache key for the micro base that changes with every
setting that changes its weights. Nothing here trains for long."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import faiss
import pytest
import torch
from safetensors.torch import load_file

import algos.commands.train
import algos.recipes.micro.build as build
from algos.reproducible import (
    DEFAULT_THREADS,
    current_threads,
    describe_base,
    run_threads,
    weight_hash,
)


class Stop(Exception):
    pass


def _tiny_model(seed: int = 0):
    from agents.models import tiny_causal_lm

    return tiny_causal_lm(32, hidden_size=8, num_layers=1, num_heads=2, seed=seed)


def _by_hand(directory: Path) -> str:
    """The documented recipe, written out independently: every tensor of every safetensors
    file, by name, as name NUL dtype-and-shape NUL raw bytes."""
    tensors = {}
    for file in directory.glob("*.safetensors"):
        tensors.update(load_file(file))
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        digest.update(f"{name}\0{t.dtype} {list(t.shape)}\0".encode())
        digest.update(t.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def test_weight_hash_names_the_weights_whatever_the_files(tmp_path):
    model = _tiny_model()
    model.save_pretrained(tmp_path / "one")
    model.save_pretrained(tmp_path / "shards", max_shard_size="2KB")  # several files, same weights
    assert len(list((tmp_path / "shards").glob("*.safetensors"))) > 1
    got = weight_hash(tmp_path / "one")
    assert got == _by_hand(tmp_path / "one") and len(got) == 16
    assert weight_hash(tmp_path / "shards") == got

    with torch.no_grad():  # one bit of one weight
        p = next(model.parameters())
        p.view(-1)[0] = torch.nextafter(p.view(-1)[0], torch.tensor(float("inf")))
    model.save_pretrained(tmp_path / "nudged")
    assert weight_hash(tmp_path / "nudged") not in (None, got)
    _tiny_model(seed=1).save_pretrained(tmp_path / "other")
    assert weight_hash(tmp_path / "other") != got
    assert weight_hash(tmp_path / "missing") is None and weight_hash("HuggingFaceTB/x") is None


def test_run_threads_sets_torch_and_faiss_and_restores_them():
    before = (torch.get_num_threads(), faiss.omp_get_max_threads())
    assert current_threads() == DEFAULT_THREADS == 1  # never torch's own default
    with run_threads(2) as n:
        assert n == 2 and current_threads() == 2
        assert torch.get_num_threads() == 2 and faiss.omp_get_max_threads() == 2
        with run_threads() as inner:  # None: the enclosing command's choice
            assert inner == 2 and torch.get_num_threads() == 2
    assert (torch.get_num_threads(), faiss.omp_get_max_threads()) == before
    assert current_threads() == 1
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="threads must be an integer >= 1"):
            with run_threads(bad):
                pass


def test_the_base_cache_key_changes_with_what_changes_the_weights(monkeypatch, tmp_path):
    """Every setting that changes the base's weights gives another cache folder, so a base
    built otherwise is never reused as if it were this one; the build runs on the thread
    count its key names."""
    monkeypatch.setenv("MOPD_CACHE", str(tmp_path))
    built = []
    monkeypatch.setattr(build, "_build", lambda out_dir, settings, *_: built.append(
        (out_dir, settings, torch.get_num_threads())))

    def folder(**kwargs):
        build.build_micro_base(progress=False, **kwargs)
        return built[-1][0]

    default = folder()
    assert built[-1][1]["threads"] == 1 and built[-1][2] == 1  # one thread unless told
    assert default.parent == tmp_path / "models" and default.name.startswith("micro-sft-")
    assert folder() == default  # the same settings, the same folder
    others = [folder(threads=2), folder(seed=1), folder(lr=1e-3), folder(skip_search=0.5)]
    assert built[-4][2] == 2
    with run_threads(2):  # the command's thread count is the build's
        others.append(folder())
        assert built[-1][1]["threads"] == 2 and built[-1][2] == 2
    assert others[-1] == others[0]
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    others.append(folder())
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2-elsewhere")
    others.append(folder())
    monkeypatch.setattr(build, "BUILD_VERSION", build.BUILD_VERSION + 1)
    others.append(folder())
    distinct = {default, *others[:4], *others[5:]}
    assert len(distinct) == 8, sorted(p.name for p in distinct)


def test_the_tiny_base_records_its_threads_and_seed_as_the_micro_base_does(monkeypatch, tmp_path):
    """A run of the tiny preset names its base's seed and thread count (summary.json's
    ``base``): the build runs on the command's threads, keys its folder by them and records
    them in ``tiny_build.json``."""
    import algos.recipes.tiny.build as tiny

    monkeypatch.setenv("MOPD_CACHE", str(tmp_path))
    built = []

    def fake_build(out_dir, settings, *_):
        built.append(torch.get_num_threads())
        out_dir.mkdir(parents=True)
        (out_dir / "tiny_build.json").write_text(json.dumps({"settings": settings}))
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(tiny, "_build", fake_build)
    one = tiny.build_tiny_base(seed=3)
    with run_threads(2):
        two = tiny.build_tiny_base(seed=3)
    assert built == [1, 2] and one != two and tiny.build_tiny_base(seed=3) == one  # reused, not rebuilt
    assert {k: describe_base(one)[k] for k in ("seed", "threads")} == {"seed": 3, "threads": 1}
    assert {k: describe_base(two)[k] for k in ("seed", "threads")} == {"seed": 3, "threads": 2}


def test_the_build_record_carries_the_saved_weights_hash(tmp_path):
    from algos.recipes.micro.tokenizer import micro_tokenizer

    tok = micro_tokenizer()
    model = _tiny_model()
    build._save_build(model, tok, {"settings": {"seed": 3, "threads": 1}, "steps": 0},
                      tmp_path / "base")
    record = json.loads((tmp_path / "base" / "micro_build.json").read_text())
    assert record["weight_hash"] == _by_hand(tmp_path / "base")
    assert record["settings"] == {"seed": 3, "threads": 1} and record["steps"] == 0
    assert describe_base(tmp_path / "base") == {"model": str(tmp_path / "base"),
                                               "weight_hash": record["weight_hash"],
                                               "seed": 3, "threads": 1}
    assert describe_base("smollm2") == {"model": "smollm2", "weight_hash": None, "seed": None,
                                        "threads": None}


def test_the_pipeline_runs_on_its_thread_count_and_its_lines_name_the_base(monkeypatch, tmp_path):
    from algos.trainer import validation_path

    base = tmp_path / "base"
    _tiny_model().save_pretrained(base)
    (base / "micro_build.json").write_text(json.dumps({"settings": {"seed": 0, "threads": 2}}))
    seen = []

    class FakeTrainer:
        """Validates 2 questions: the base gets 0 right, the trained model 1."""

        def __init__(self, cfg, **kwargs):
            seen.append(torch.get_num_threads())
            self.cfg, self.step, self.val_questions = cfg, 0, [0, 1]

        def validate(self):
            records = [{"dataset": "nq", "id": i, "correct": [float(self.step > 0 and i == 0)]}
                       for i in self.val_questions]
            path = validation_path(self.cfg.out_dir, self.step)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
            return sum(r["correct"][0] for r in records) / 2

        def log_metrics(self, metrics, step=None):
            pass

        def train(self, validate_first=True):
            self.step = 1
            return {"history": [{"val/avg@1": self.validate()}]}

        def close(self):
            pass

    monkeypatch.setattr(algos.commands.train, "Trainer", FakeTrainer)
    lines = []
    before = torch.get_num_threads()
    summary = algos.commands.train.run_pipeline(
        "micro", tmp_path / "run", ("teacher",), {"model": str(base)}, progress=False,
        log=lines.append, threads=2)
    assert seen == [2] and torch.get_num_threads() == before
    assert summary["threads"] == 2
    stage = summary["stages"]["teacher"]
    assert stage["base"] == {"model": str(base), "weight_hash": weight_hash(base), "seed": 0,
                             "threads": 2} and stage["seed"] == 0
    assert lines[0] == ("[teacher] base model, cascade workflow: validation avg@1 = 0.000 "
                        f"(base weights {weight_hash(base)}, seed 0, 2 threads)")
    assert lines[1].startswith("[teacher] after 1 steps: validation avg@1 = 0.500 (base 0.000")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["threads"] == 2

    algos.commands.train.run_pipeline("micro", tmp_path / "run1", ("teacher",), {"model": str(base)},
                                progress=False, log=lines.append)  # the default: one thread
    assert seen[-1] == 1
    assert [line for line in lines if "base model" in line][-1].endswith(f"(base weights {weight_hash(base)} built from seed 0 on 2 threads; "
                              "run seed 0, 1 thread)")


def test_the_command_line_passes_threads_and_refuses_nonsense(monkeypatch, tmp_path, capsys):
    from algos.__main__ import main

    calls = []
    monkeypatch.setattr(algos.commands.train, "run_pipeline", lambda *a, **kw: calls.append(kw))
    assert main(["train", "--out", str(tmp_path / "a"), "--threads", "2"]) == 0
    assert main(["train", "--out", str(tmp_path / "b")]) == 0
    assert [kw["threads"] for kw in calls] == [2, None]  # None: the pipeline's default, 1
    assert main(["train", "--out", str(tmp_path / "c"), "--threads", "0"]) == 2
    assert "--threads 0: must be >= 1" in capsys.readouterr().err and len(calls) == 2


def test_the_seed_spread_pools_paired_questions_per_seed(tmp_path):
    """Two seeds, one stage: mean and range by hand; the pooled sign test pairs each seed's
    questions with the same seed's (question 1 is better in seed 0 and worse in seed 1:
    pooled, that is one better and one worse, not no change)."""
    from algos.recipes.micro.seeds import headline, seed_commands, spread
    from algos.trainer import validation_path

    def write(seed, base, trained):  # per question id: correct at step 0, at step 12
        run = tmp_path / f"seed{seed}" / "run"
        for step, correct in ((0, base), (12, trained)):
            path = validation_path(run / "teacher", step)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps({"dataset": "nq", "id": i, "correct": [c]}) + "\n"
                                    for i, c in enumerate(correct)))
        summary = {"threads": 1, "stages": {"teacher": {
            "base": {"weight_hash": f"h{seed}"}, "base_em": sum(base) / 4,
            "trained_em": sum(trained) / 4, "steps": 12, "paired": {}, "val_questions": 4}}}
        (run / "summary.json").write_text(json.dumps(summary))
        return run

    runs = {0: write(0, [0, 0, 0, 1], [1, 1, 0, 1]), 1: write(1, [0, 1, 0, 0], [0, 0, 1, 1])}
    got = spread(runs)
    stage = got["stages"]["teacher"]
    assert stage["seeds"] == 2
    assert stage["base_em"] == {"mean": 0.25, "min": 0.25, "max": 0.25}
    assert stage["trained_em"] == {"mean": 0.625, "min": 0.5, "max": 0.75}
    # better: seed 0 q0, q1; seed 1 q2, q3 -> 4; worse: seed 1 q1 -> 1; p = 2 * 6/32
    assert stage["pooled_paired"] == {"covers": "(seed, question) pairs assumed independent: these runs only",
                                      "better": 4, "worse": 1, "questions": 8, "p_value": pytest.approx(0.375)}
    # the headline over seeds: both seeds rose (0.25 -> 0.75, 0.25 -> 0.5): 2 of 2, p = 2 * 1/4
    assert stage["over_seeds"] == {"covers": "over seeds: the training procedure", "seeds": 2, "better": 2,
                                   "worse": 0, "ties": 0, "p_value": 0.5}
    assert headline(got["stages"])[0].startswith("teacher: 2 of 2 seeds improved, 0 worse (exact sign test "
                                                 "over seeds p = 0.5); avg@1 0.250 [0.250, 0.250] -> 0.625")
    assert "pooled, (seed, question) pairs assumed independent: these runs only: 4 better, 1 worse of 8, " \
           "p = 0.375" in headline(got["stages"])[0]
    assert got["seeds"]["1"]["stages"]["teacher"]["base"] == {"weight_hash": "h1"}
    sft, train = seed_commands(2, tmp_path)
    assert sft[-8:] == ["micro", "--seed", "2", "--out", str(tmp_path / "seed2" / "base"), "--threads", "1",
                        "--no-progress"]
    assert f"model={tmp_path / 'seed2' / 'base'}" in train and "seed=2" in train
    assert train[train.index("--threads") + 1] == "1"
    sft, train = seed_commands(2, tmp_path, threads=2)  # the base builds on the runs' thread count
    assert sft[sft.index("--threads") + 1] == train[train.index("--threads") + 1] == "2"


def test_a_cached_base_made_by_other_code_is_reused_with_a_warning(tmp_path, capsys):
    from algos.recipes.micro.tokenizer import micro_tokenizer

    now = build.source_fingerprints()
    assert set(now) == set(build.SOURCES) and "missing" not in now.values()
    tok = micro_tokenizer()
    for name, sources in (("same", now), ("other", {**now, "agents.scripted": "0" * 12})):
        build._save_build(_tiny_model(), tok, {"settings": {}, "sources": sources},
                          tmp_path / name)
        (tmp_path / name / "config.json").write_text("{}")  # no circuit to declare
        assert build.build_micro_base(tmp_path / name, retriever=object(), progress=False) == \
            tmp_path / name
    err = [line for line in capsys.readouterr().err.splitlines() if "micro base" in line]
    assert len(err) == 1 and str(tmp_path / "other") in err[0]
    assert "(agents.scripted changed since)" in err[0] and "remove the folder" in err[0]


def test_the_environment_names_the_cpu_its_kernels_and_the_library_versions():
    import platform

    import torch

    from algos.reproducible import ENVIRONMENT_PACKAGES, environment

    env = environment()
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["versions"]["torch"] == torch.__version__ and env["python"] == platform.python_version()
    assert set(env["versions"]) == set(ENVIRONMENT_PACKAGES)
    assert {"faiss-cpu", "transformers", "tokenizers", "numpy", "sentence-transformers"} <= set(env["versions"])
    assert env["cpu_model"] and env["platform"] and env["logical_cpus"] >= 1
    json.dumps(env)  # written into table2.json and micro_seeds.json as it is
