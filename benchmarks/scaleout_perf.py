"""Scale-out ratios on this machine (issue 15), measured in one run and printed as JSON:

- ``collect.ray_workers_speedup``: seconds of ``RayRolloutPool(1).collect`` over
  ``RayRolloutPool(2).collect``, same questions and seed; above 1, two workers are faster.
- ``learner.ddp_step_ratio``: seconds of one learner step (``Trainer.learn`` on one fixed
  global batch) on 2 gloo ranks under torchrun over one process; below 1, two are faster.

Each is the median of interleaved pairs (the order alternating), one torch thread per
process; the load average and core count are printed beside them.

    python benchmarks/scaleout_perf.py                      # both ratios, 3 pairs each
    python benchmarks/scaleout_perf.py --only ray --pairs 5 --out scaleout.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def resolve_model(name: str) -> str:
    """The directory of ``tiny`` (built if needed), of an already built ``micro`` base (the
    newest; never built here: that takes minutes), or ``name`` itself (a directory)."""
    from algos.commands.presets import prepare_model

    if name in ("tiny", "micro"):
        try:
            return prepare_model(name, build=name == "tiny")
        except FileNotFoundError as err:
            raise SystemExit(f"scaleout_perf: --model micro: {err}. Or use --model tiny") from None
    if not Path(name, "config.json").is_file():
        raise SystemExit(f"scaleout_perf: --model {name!r}: not tiny, micro or a model directory")
    return name


def _questions(n: int) -> list[Any]:
    from envs.data.synthwiki import default_world

    world = default_world()
    half = max(n // 2, 1)
    return world.questions("nq", "train")[:half] + world.questions("hotpotqa", "train")[:n - half]


def ray_workers_speedup(model_dir: str, pairs: int, questions: int, group_size: int) -> dict[str, Any]:
    """Interleaved 1-worker / 2-worker collects of the same batch: their seconds, median ratio."""
    import torch

    from agents.models import load_causal_lm
    from agents.ray_rollout import RayRolloutPool, require_ray
    from algos.commands.presets import preset_config
    from envs.retrieval.lexical import WordOverlapRetriever

    env_shape = preset_config("tiny", stage="teacher").env_shape()
    ray = require_ray()
    torch.set_num_threads(1)
    if not ray.is_initialized():  # both pools live at once: room for 1 + 2 one-CPU workers
        ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    model, tok = load_causal_lm(model_dir)
    qs = _questions(questions)
    kwargs = dict(model=model, tokenizer=tok, env_kwargs=dict(workflow="cascade", **env_shape),
                  retriever=WordOverlapRetriever(), threads=1,
                  policy_kwargs=dict(temperature=1.0, max_new_tokens=env_shape["max_turn_tokens"], batch_size=64))
    pools = {n: RayRolloutPool(n, **kwargs) for n in (1, 2)}
    try:
        for pool in pools.values():  # warm-up: each worker fetches the weights, imports, allocates
            pool.collect(qs, group_size, seed=0)
        seconds: dict[int, list[float]] = {1: [], 2: []}
        for p in range(pairs):
            for n in ((1, 2) if p % 2 == 0 else (2, 1)):  # alternate which side goes first
                t = time.perf_counter()
                pools[n].collect(qs, group_size, seed=p + 1)
                seconds[n].append(time.perf_counter() - t)
    finally:
        for pool in pools.values():
            pool.shutdown()
        ray.shutdown()
    ratios = [a / b for a, b in zip(seconds[1], seconds[2])]
    return {"collect.ray_workers_speedup": statistics.median(ratios), "collect.pairs": ratios,
            "collect.seconds_1_worker": seconds[1], "collect.seconds_2_workers": seconds[2],
            "collect.workflows": len(qs) * group_size}


def _ddp_worker(model_dir: str, out: str, steps: int) -> int:
    """Run by :func:`ddp_step_ratio`, alone or under torchrun: ``steps`` timed learner steps
    (after one untimed) on one batch; rank 0 writes the seconds to ``out/seconds.json``."""
    import torch

    torch.set_num_threads(1)
    from agents.hf import HFPolicy
    from agents.ray_rollout import collect_groups
    from algos.commands.presets import preset_config
    from algos.trainer import Trainer

    cfg = preset_config("tiny", stage="teacher", teacher=None, model=model_dir, out_dir=str(Path(out) / "run"),
                        sample_every=0, minibatches=1)
    trainer = Trainer(cfg, progress=False)
    sampler = HFPolicy(trainer.model, trainer.tokenizer, temperature=1.0, max_new_tokens=cfg.max_turn_tokens)
    groups = collect_groups(trainer.env_fn(), sampler, trainer.train_questions[:8], cfg.group_size, seed=11)
    trainer.learn(groups)  # untimed: first-call allocations
    seconds = []
    for _ in range(steps):
        trainer.dist.barrier()  # (a no-op in one process)
        t = time.perf_counter()
        trainer.learn(groups)
        trainer.dist.barrier()
        seconds.append(time.perf_counter() - t)
    if trainer.is_main:
        Path(out, "seconds.json").write_text(json.dumps(seconds))
    return 0


def _run_step(model_dir: str, ranks: int, steps: int, timeout: float) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="mopd-ddp-perf-") as out:
        worker = [__file__, "--ddp-worker", model_dir, out, str(steps)]
        launcher = ([] if ranks == 1 else
                    ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)])
        proc = subprocess.run([sys.executable, *launcher, *worker], env=env, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
        if proc.returncode != 0:
            raise RuntimeError(f"the {ranks}-rank learner step failed: {proc.stderr[-2000:]}")
        return statistics.median(json.loads(Path(out, "seconds.json").read_text()))


def ddp_step_ratio(model_dir: str, pairs: int, steps: int, timeout: float = 600) -> dict[str, Any]:
    """Interleaved 1-process / 2-rank runs of the same learner steps: median of median ratios."""
    seconds: dict[int, list[float]] = {1: [], 2: []}
    for p in range(pairs):
        for ranks in ((1, 2) if p % 2 == 0 else (2, 1)):
            seconds[ranks].append(_run_step(model_dir, ranks, steps, timeout))
    ratios = [b / a for a, b in zip(seconds[1], seconds[2])]
    return {"learner.ddp_step_ratio": statistics.median(ratios), "learner.pairs": ratios,
            "learner.step_seconds_1_process": seconds[1], "learner.step_seconds_2_ranks": seconds[2]}


def measure(model: str = "tiny", pairs: int = 3, only: str | None = None, questions: int = 8,
            group_size: int = 3, steps: int = 3) -> dict[str, Any]:
    """Both ratios (or ``only`` one: ``ray`` or ``ddp``) with the load and core count."""
    model_dir = resolve_model(model)
    result: dict[str, Any] = {"model": model, "cores": os.cpu_count(), "load_before": os.getloadavg()[0]}
    if only in (None, "ray"):
        result.update(ray_workers_speedup(model_dir, pairs, questions, group_size))
    if only in (None, "ddp"):
        result.update(ddp_step_ratio(model_dir, pairs, steps))
    result["load_after"] = os.getloadavg()[0]
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--ddp-worker"]:
        from algos.engine.distributed import run_main

        return run_main(lambda: _ddp_worker(argv[1], argv[2], int(argv[3])))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny (default), micro (if built) or a model directory")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs per ratio")
    parser.add_argument("--only", choices=("ray", "ddp"), default=None,
                        help="measure one ratio: ray (two rollout workers) or ddp (two learner ranks); "
                             "default both")
    parser.add_argument("--questions", type=int, default=8, help="questions per collect")
    parser.add_argument("--steps", type=int, default=3, help="timed learner steps per run")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    for name in ("pairs", "questions", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: must be >= 1")
    result = measure(args.model, args.pairs, args.only, args.questions, steps=args.steps)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
