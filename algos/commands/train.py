"""The whole MultiAgent-OPD recipe: Stage I (the Teacher, C-MAS) then Stage II (the team,
H-MAS, from the base model, distilled from the Teacher), and a summary that puts each
trained team's validation EM beside the base model's in the same workflow, with how many
validation questions training made better and worse and an exact sign test on them, and
which base it started from (its weights' hash, seed and thread count)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from algos.commands.presets import prepare_model, preset_config
from algos.config import TrainConfig
from algos.engine.checkpoint import latest_checkpoint
from algos.engine.distributed import this_process
from algos.engine.runlock import run_lock
from algos.report import paired_sign_test, plot_training_curves, read_metrics
from algos.reproducible import describe_base, run_threads
from algos.trainer import Trainer, validation_path


def stage_config(preset: str, stage: str, out_dir: Path, overrides: dict[str, Any]) -> TrainConfig:
    teacher = str(out_dir / "teacher") if stage == "team" else None  # Stage II: Stage I's, unless overridden
    return preset_config(preset, **{"stage": stage, "out_dir": str(out_dir / stage), "teacher": teacher, **overrides})


def run_pipeline(preset: str, out_dir: str | Path, stages: tuple[str, ...] = ("teacher", "team"),
                 overrides: dict[str, Any] | None = None, resume: bool = False, progress: bool = True,
                 log=print, retriever: Any = None, threads: int | None = None) -> dict[str, Any]:
    """Train the stages in order; returns (and writes ``summary.json``) the comparison.
    A preset's own model name (``micro``) is prepared (:func:`algos.commands.presets.prepare_model`)
    once the stage's settings are validated. ``retriever``: used instead of the config's (tests).
    Everything runs on ``threads`` torch and faiss threads (None: one; :mod:`algos.reproducible`
    says why), recorded in the summary with the base's ``describe_base``. ``out_dir`` is locked
    for the whole run. Under ``torchrun`` every rank runs it (what rank 0 alone does:
    ``docs/scaleout.md``, "The data-parallel learner")."""
    import torch.distributed as torch_dist

    owned_group = not torch_dist.is_initialized()  # a group made here is destroyed here
    # one run per --out for the run's life; per run, not per rank: rank 0 holds it (RANK is
    # set by torchrun before any process group exists)
    lock = run_lock(out_dir, log=log) if os.environ.get("RANK", "0") == "0" else contextlib.nullcontext()
    try:
        with lock, run_threads(threads) as n:
            summary = _run_pipeline(preset, out_dir, stages, overrides, resume, progress, log,
                                    retriever, n)
    except BaseException:
        if owned_group and torch_dist.is_initialized():
            torch_dist.destroy_process_group()  # no barrier: the other ranks may never come
        raise
    if owned_group:  # rank 0 may still be writing the summary: every rank waits for it (one process: nothing)
        this_process().close()
    return summary


def _run_pipeline(preset: str, out_dir: str | Path, stages: tuple[str, ...],
                  overrides: dict[str, Any] | None, resume: bool, progress: bool, log: Any,
                  retriever: Any, threads: int) -> dict[str, Any]:
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    overrides = dict(overrides or {})
    summary: dict[str, Any] = {"preset": preset, "threads": threads, "stages": {}}
    bases: dict[str, dict[str, Any]] = {}
    main = True  # rank 0 (one process: the only one)
    trainer: Trainer | None = None
    try:
        for stage in stages:
            if trainer is not None:  # the last stage's engine, models and optimizer go before the next's come
                trainer.close()
                trainer = None
            cfg = stage_config(preset, stage, out, overrides)
            dist = this_process(cfg.device)  # (one process: rank 0 of 1, every collective trivial)
            main = dist.is_main
            if not main:  # rank 0 speaks for the job
                progress, log = False, lambda *args, **kwargs: None
            # the settings are valid: now a preset's own model (micro's base) may be built, by
            # rank 0 alone (two ranks building one cache folder would race); the others take its path
            # (its seed: base_seed when set, so runs of several seeds can share one base)
            model = prepare_model(cfg.model, seed=cfg.build_seed, progress=progress) if main else None
            cfg = dataclasses.replace(cfg, model=dist.broadcast_object(model))
            if stage == "team" and cfg.teacher and cfg.teacher != "base" and not Path(cfg.teacher).exists():
                raise FileNotFoundError(f"Stage II needs the Stage-I Teacher at {cfg.teacher}; run --stage teacher first "
                                        "or pass --set teacher=base")
            has_checkpoint = latest_checkpoint(cfg.out_dir) is not None
            if resume and not has_checkpoint and (Path(cfg.out_dir) / "metrics.jsonl").exists():
                raise FileNotFoundError(f"--resume: {cfg.out_dir} stopped before its first checkpoint (one every "
                                        f"{cfg.save_every} steps), so there is nothing to continue; move it away "
                                        f"to run the {stage} stage again")
            trainer = Trainer(cfg, resume=resume and has_checkpoint, progress=progress, retriever=retriever)
            if main and cfg.model not in bases:  # hashed once: both stages usually start from one base
                bases[cfg.model] = describe_base(cfg.model)
            base = bases.get(cfg.model, {})
            base_em, base_records = _base_em(trainer, cfg)
            if main:
                log(f"[{stage}] base model, {cfg.workflow} workflow: validation avg@1 = {base_em:.3f} "
                    f"({base_line(base, cfg.seed, threads)})")
            history = trainer.train(validate_first=False)["history"]
            dist.barrier()  # rank 0 has written the stage's checkpoint (Stage II's Teacher)
            if not main:  # no validation records here: rank 0 compares
                summary["stages"][stage] = {"workflow": cfg.workflow, "seed": cfg.seed, "steps": trainer.step,
                                            "rank": dist.rank}
                continue
            # nothing trained now (a finished run resumed): its last validation, if logged
            trained_em = history[-1].get("val/avg@1") if history else _logged_validation(cfg, trainer.step)
            if trained_em is None:
                trained_em = trainer.validate()
            paired = paired_sign_test(read_metrics(base_records), read_metrics(validation_path(cfg.out_dir, trainer.step)))
            log(f"[{stage}] after {trainer.step} steps: validation avg@1 = {trained_em:.3f} "
                f"(base {base_em:.3f}, {'+' if trained_em >= base_em else ''}{trained_em - base_em:.3f}; "
                f"{paired['better']} questions better, {paired['worse']} worse, sign test p = {paired['p_value']:.3g})")
            summary["stages"][stage] = {"workflow": cfg.workflow, "seed": cfg.seed, "base_seed": cfg.build_seed,
                                        "base": base, "steps": trainer.step, "base_em": base_em,
                                        "trained_em": trained_em, "paired": paired, "out_dir": cfg.out_dir,
                                        "val_questions": len(trainer.val_questions)}
            engine = getattr(getattr(trainer, "backend", None), "engine_info", None)
            if engine is not None:  # what the rollout engine was built with (sleep mode on or off, its vLLM)
                summary["stages"][stage]["rollout_engine"] = engine
    finally:  # a stage that failed still shuts its engine down (vLLM's state is the process's)
        if trainer is not None:
            trainer.close()
    if not main:
        return summary
    curves = [out / s / "metrics.jsonl" for s in stages if (out / s / "metrics.jsonl").exists()]
    if curves:
        summary["curves_png"] = str(plot_training_curves(curves, out / "curves.png"))
    summary["wall_time_s"] = round(time.perf_counter() - start, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"summary (every figure above, the bases, the paired tests): {out / 'summary.json'}")
    return summary


def base_line(base: dict[str, Any], seed: int, threads: int) -> str:
    """How a stage's base line names its base and run: ``base weights <hash>, seed <s>,
    <t> thread(s)``, with the build's seed and thread count where they differ from the
    run's (a base built elsewhere) or the model name where nothing local was hashed.

    >>> base_line({"weight_hash": "3f2a9c0d1e2b4a5c", "seed": 0, "threads": 1}, 0, 1)
    'base weights 3f2a9c0d1e2b4a5c, seed 0, 1 thread'
    >>> base_line({"weight_hash": "3f2a9c0d1e2b4a5c", "seed": 2, "threads": 2}, 0, 1)
    'base weights 3f2a9c0d1e2b4a5c built from seed 2 on 2 threads; run seed 0, 1 thread'
    """
    def threads_(n: int) -> str:
        return f"{n} thread{'' if n == 1 else 's'}"

    name = (f"base weights {base['weight_hash']}" if base.get("weight_hash")
            else f"base {base.get('model')} (not hashed)")
    built_seed, built_threads = base.get("seed"), base.get("threads")
    if built_seed in (None, seed) and built_threads in (None, threads):
        return f"{name}, seed {seed}, {threads_(threads)}"
    built = ([f"from seed {built_seed}"] if built_seed is not None else []) + (
        [f"on {threads_(built_threads)}"] if built_threads is not None else [])
    return f"{name} built {' '.join(built)}; run seed {seed}, {threads_(threads)}"


def _logged_validation(cfg: TrainConfig, step: int) -> float | None:
    """The validation avg@1 a run logged at ``step`` when its per-question records are there
    too (a resumed run does not validate again), else None."""
    metrics = Path(cfg.out_dir) / "metrics.jsonl"
    if not (metrics.exists() and validation_path(cfg.out_dir, step).exists()):
        return None
    for row in read_metrics(metrics):  # a bad line (a run killed mid-write) is skipped, not fatal
        if row.get("step") == step and "val/avg@1" in row:
            return float(row["val/avg@1"])
    return None


def _base_em(trainer: Trainer, cfg: TrainConfig) -> tuple[float, Path]:
    """The base model's validation avg@1 in this stage's workflow and its per-question
    records: the step-0 validation of a fresh run, recomputed from the base weights when
    resuming a run that has none."""
    records = validation_path(cfg.out_dir, 0)
    logged = _logged_validation(cfg, 0)
    if logged is not None:
        return logged, records
    if trainer.step == 0:
        em = trainer.validate()
        trainer.log_metrics({"val/avg@1": em}, step=0)
        return em, records
    base_dir = Path(cfg.out_dir) / "base_eval"
    # it only validates (with HF, as every validation does): no engine or Ray workers of its own
    base = Trainer(TrainConfig(**{**cfg.to_dict(), "out_dir": str(base_dir), "rollout_backend": "hf",
                                  "rollout_workers": 0}),
                   progress=trainer.progress, retriever=trainer.retriever)  # the bar of its validation
    try:
        return base.validate(), validation_path(base_dir, 0)
    finally:
        base.close()
