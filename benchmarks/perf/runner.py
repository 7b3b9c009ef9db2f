"""Runs the suite: the model under measurement (``measured_model``), every section in
order into one JSON-ready result (``run_perf``), and the ``--scaleout`` ratios added to it
(``add_scaleout``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from benchmarks.perf.harness import Bench, Figure, load_average
from benchmarks.perf.learner import learner
from benchmarks.perf.retrieval import retrieval
from benchmarks.perf.rollouts import model_rollouts, scripted_rollouts
from benchmarks.perf.scaling import scaling
from benchmarks.perf.settings import MODELS, PerfSettings


def measured_model(name: str) -> tuple[Any, Any]:
    """(model, tokenizer) that the model-bound sections measure, for ``--model``: ``random``
    an untrained ``tiny_causal_lm`` over the env's tokenizer (not the tiny recipe's SFT
    model), ``smollm2`` the hub model, ``micro`` the micro recipe's SFT-warmed base."""
    if name == "random":
        from agents.models import tiny_causal_lm
        from envs.search_team import default_tokenizer

        tokenizer = default_tokenizer()
        return tiny_causal_lm(len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id), tokenizer
    if name == "smollm2":
        from agents.models import load_causal_lm

        return load_causal_lm("smollm2")
    if name == "micro":  # the micro recipe's base: built once, then loaded by path
        from algos.commands.presets import prepare_model
        from algos.engine.checkpoint import load_model

        return load_model(prepare_model("micro"))
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")


def run_perf(settings: PerfSettings, log: Callable[[str], None] = print, *, vllm: bool = False) -> dict[str, Any]:
    """Run every section; returns ``{"meta", "figures", "details"}`` (JSON-ready). torch and
    faiss run on ``settings.threads`` threads meanwhile (restored afterwards). ``vllm``: the
    vLLM section alone (``benchmarks.perf.engines``; in the vLLM venv)."""
    from algos.reproducible import run_threads

    with run_threads(settings.threads):
        return _run_perf(settings, log, vllm)


def _run_perf(settings: PerfSettings, log: Callable[[str], None], vllm: bool = False) -> dict[str, Any]:
    from algos.config import TrainConfig
    from envs.retrieval.factory import default_retriever
    from envs.search_team import default_questions

    start = time.perf_counter()
    load = load_average()
    n = settings.threads
    train = TrainConfig(teacher="base")  # the trainer's sampling settings
    log(f"perf: model={settings.model} reps={settings.reps} torch and faiss threads={n} (--threads N "
        f"to change; one gives the stablest timings), load average {load} on {os.cpu_count()} cores")
    model, tokenizer = measured_model(settings.model)
    model.eval()
    bench = Bench(settings, model, tokenizer, default_retriever(), list(default_questions()), log)
    dim = bench.retriever.encoder.encode(["dimension"]).shape[1]
    pool = [q.question for q in bench.questions]
    queries = [pool[i % len(pool)] for i in range(0, settings.queries * 7, 7)]
    sections = [("decoding, greedy", lambda: model_rollouts(bench, 0.0)),
                (f"decoding, sampled at the trainer's temperature {train.temperature}",
                 lambda: model_rollouts(bench, train.temperature, train.top_p)),
                ("rollouts with the scripted team", lambda: scripted_rollouts(bench)),
                ("learner update, memory and teacher scoring", lambda: learner(bench)),
                ("retrieval", lambda: retrieval(bench, dim, queries)),
                ("scaling", lambda: scaling(bench))]
    if vllm:
        from benchmarks.perf.engines import vllm_rollouts

        sections = [("vLLM's engine against HF, greedy", lambda: vllm_rollouts(bench))]
    seconds = {}
    for title, section in sections:
        log(f"{title} ...")
        t0 = time.perf_counter()
        section()
        seconds[title] = round(time.perf_counter() - t0, 1)
        log(f"  ({seconds[title]:.0f} s)")
    bench.details["section_seconds"] = seconds
    meta = {"model": settings.model, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer), "torch_threads": n, "faiss_threads": n,
            "torch": torch.__version__, "settings": asdict(settings),
            "load_average_start": load, "load_average_end": load_average(), "cpu_count": os.cpu_count(),
            "wall_s": time.perf_counter() - start,
            "method": "A/B interleaved after one warm-up each; median of per-pair ratios"}
    return {"meta": meta, "figures": {k: asdict(v) for k, v in bench.figures.items()},
            "details": bench.details}


def add_scaleout(result: dict[str, Any], settings: PerfSettings, log: Callable[[str], None] = print) -> None:
    """Add :func:`benchmarks.scaleout_perf.measure`'s two ratios to ``result``'s figures (the raw
    measurement under ``details["scaleout"]``), ``settings.reps`` pairs on the tiny preset's
    base (``micro``'s for ``--model micro``); without ray, only the learner's."""
    import importlib.util

    from benchmarks import scaleout_perf

    only = None
    if importlib.util.find_spec("ray") is None:
        log("scaleout: collect.ray_workers_speedup skipped: ray is not installed "
            "(pip install -e '.[distributed]')")
        only = "ddp"
    log("scale-out: Ray rollout workers and torchrun ranks ...")
    t0 = time.perf_counter()
    measured = scaleout_perf.measure("micro" if settings.model == "micro" else "tiny", pairs=settings.reps,
                                     only=only)
    whats = {"collect.ray_workers_speedup": ("collect.pairs", "1 Ray worker's collect / 2 workers' "
                                             "(same questions and seeds; above 1: 2 are faster)"),
             "learner.ddp_step_ratio": ("learner.pairs", "learner step on 2 gloo ranks / in 1 process "
                                        "(same global batch; below 1: 2 are faster)")}
    for name, (pairs_key, what) in whats.items():
        if name in measured:
            pairs = [float(x) for x in measured.get(pairs_key) or [measured[name]]]
            fig = Figure(float(measured[name]), min(pairs), max(pairs), what)
            result["figures"][name] = asdict(fig)
            log(f"  {name:<44} {fig.ratio:8.3f}  [{fig.low:.3f}, {fig.high:.3f}]")
    details = result.setdefault("details", {})
    details["scaleout"] = measured
    details.setdefault("section_seconds", {})["scale-out"] = round(time.perf_counter() - t0, 1)
