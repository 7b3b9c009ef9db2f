"""The runs of the paper's Table 2 (the Searcher-signal ablation): for each seed one Stage-I
Teacher, then Stage II once per variant, each run in its own directory; every run of a seed
starts from that seed's base (a recipe builds one per seed, so the spread over seeds
includes the base's).

Variants (Leader and Answerer objectives fixed: GRPO with the KL toward the Teacher; only
the Searchers' signal or the Teacher changes): one per Searcher signal of the table of role
rules (``algos.roles``; ``opd``, the method, first), each taught by the seed's Stage-I run,
and ``base``: on-policy distillation from the base model.

Every run of a seed has the same ``seed``: the same training questions in the same order,
the same rollout and validation sampler seeds, validated on the same held-out questions at
the same steps. Layout under ``out``::

    ablation.json                the plan (preset, seeds, variants, settings) and each run's state
    seed<S>/teacher/             Stage I
    seed<S>/<variant>/           Stage II; run.json when it finished (wall time, steps, files)

Resuming: a finished run (its ``run.json``) is never repeated; a run with a checkpoint
continues from it (the Trainer's ``--resume``); a run killed before its first checkpoint
starts again. So a killed ablation loses at most the runs in progress.

The table (per-variant figures, paired bootstrap CIs against ``opd``, curves) is
``benchmarks.table2``; ``python -m benchmarks ablate`` runs both. The ablation lives on the
benchmark floor, above the learner it trains (``algos``), like the table it feeds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from algos.roles import searcher_signals

if TYPE_CHECKING:
    from algos.config import TrainConfig

# algos.config and algos.checkpoint (torch) are imported where used: the command line's
# parser and the table (benchmarks.table2) read this module without loading torch.

VARIANT_SETTINGS: dict[str, dict[str, str]] = {
    **{signal: {"searcher_signal": signal} for signal in searcher_signals()},
    "base": {"searcher_signal": "opd", "teacher": "base"},
}
"""What each variant sets over the Stage-II config: one per Searcher signal of the table of
role rules (``algos.roles``), and OPD from the base model; ``teacher`` defaults to the
seed's Stage-I run. Nothing else differs between variants."""

VARIANTS: tuple[str, ...] = tuple(VARIANT_SETTINGS)
"""Table 2's rows, the method first."""

TEACHER = "teacher"
"""The name of a seed's Stage-I run (and of its directory)."""

RUN_FILE = "run.json"
"""Written into a run's directory when it finished: the run is never repeated after it."""


@dataclass(frozen=True)
class Run:
    """One training run of the ablation."""

    seed: int
    variant: str
    """``teacher`` (Stage I) or one of :data:`VARIANTS` (Stage II)."""
    config: TrainConfig
    """Its full config; ``config.out_dir`` is the run's directory."""
    needs: str | None
    """The name of the run that must finish first (the seed's Teacher), or None."""

    @property
    def name(self) -> str:
        return run_name(self.seed, self.variant)

    @property
    def out_dir(self) -> Path:
        return Path(self.config.out_dir)


def run_name(seed: int, variant: str) -> str:
    """``seed0/opd``: the run's name, and its directory relative to the ablation's."""
    return f"seed{seed}/{variant}"


def variant_overrides(variant: str, teacher_dir: str | Path) -> dict[str, Any]:
    """The Stage-II settings that make ``variant``: its Searcher signal and its Teacher
    (``teacher_dir``, the seed's Stage-I run, unless the variant names another)."""
    if variant not in VARIANT_SETTINGS:
        raise ValueError(f"variant {variant!r} is not one of {VARIANTS}")
    return {"teacher": str(teacher_dir), **VARIANT_SETTINGS[variant]}


def plan_runs(preset: str, out: str | Path, seeds: Sequence[int], variants: Sequence[str] = VARIANTS,
              overrides: dict[str, Any] | None = None) -> list[Run]:
    """Every run of the ablation in a valid order: per seed its Teacher (when a variant
    needs one) then the variants. ``overrides``: TrainConfig settings for every run (e.g.
    ``steps``); they may not set what the ablation itself varies. Raises ValueError naming
    the bad variant, seed or setting (the configs are validated here, before any run)."""
    from algos.presets import PRESETS, preset_config

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; presets: {sorted(PRESETS)}")
    unknown = [v for v in variants if v not in VARIANT_SETTINGS]
    if unknown or not variants:
        raise ValueError(f"variants {list(variants)}: each must be one of {VARIANTS}")
    if len(set(variants)) != len(variants) or len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError(f"seeds {list(seeds)} and variants {list(variants)} must be non-empty, without repeats")
    if any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds {list(seeds)}: each must be an integer >= 0")
    overrides = dict(overrides or {})
    varied = sorted(set(overrides) & {"stage", "teacher", "searcher_signal", "out_dir", "seed"})
    if varied:
        raise ValueError(f"the ablation sets {varied} itself; remove them from the settings")
    out = Path(out)
    runs: list[Run] = []
    for seed in seeds:
        teacher_dir = out / run_name(seed, TEACHER)
        needs_teacher = any(VARIANT_SETTINGS[v].get("teacher") is None for v in variants)
        if needs_teacher:
            cfg = preset_config(preset, **{**overrides, "stage": "teacher", "teacher": None, "seed": seed,
                                           "out_dir": str(teacher_dir)})
            runs.append(Run(seed, TEACHER, cfg, None))
        for variant in variants:
            settings = variant_overrides(variant, teacher_dir)
            cfg = preset_config(preset, **{**overrides, **settings, "stage": "team", "seed": seed,
                                           "out_dir": str(out / run_name(seed, variant))})
            needs = run_name(seed, TEACHER) if settings["teacher"] == str(teacher_dir) else None
            runs.append(Run(seed, variant, cfg, needs))
    return runs


def run_state(run: Run) -> str:
    """``done`` (its ``run.json`` exists), ``resume`` (a checkpoint to continue from),
    ``fresh`` (nothing there) or ``restart`` (killed before its first checkpoint)."""
    from algos.checkpoint import latest_checkpoint

    if (run.out_dir / RUN_FILE).exists():
        return "done"
    if latest_checkpoint(run.out_dir) is not None:
        return "resume"
    if run.out_dir.exists() and any(run.out_dir.iterdir()):
        return "restart"
    return "fresh"


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """A finished run's ``run.json``."""
    path = Path(run_dir) / RUN_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a finished run's record ({err})") from None


def train_run(config: TrainConfig, *, resume: bool, progress: bool = True, retriever: Any = None) -> dict[str, Any]:
    """Train one run to ``config.steps`` with a validation before the first step, every
    ``eval_every`` steps and after the last; returns what :data:`RUN_FILE` records of it
    besides the wall time: ``steps``, ``final_validation`` (the last validation's
    per-question records, relative to the run's directory) and ``val_avg@1`` (its mean)."""
    from algos.trainer import Trainer, validation_path

    trainer = Trainer(config, resume=resume, progress=progress, retriever=retriever)
    trainer.train(validate_first=True)
    final = validation_path(config.out_dir, trainer.step)
    if not final.exists():  # resumed after the last checkpoint: validate the final weights
        trainer.validate()
    records = [json.loads(line) for line in final.read_text(encoding="utf-8").splitlines() if line.strip()]
    em = sum(sum(r["correct"]) / len(r["correct"]) for r in records) / max(1, len(records))
    return {"steps": trainer.step, "final_validation": str(final.relative_to(config.out_dir)), "val_avg@1": em}


TrainFn = Callable[..., dict[str, Any]]


def execute(run: Run, *, train: TrainFn = train_run, threads: int = 1, progress: bool = True,
            retriever: Any = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Bring ``run`` to its end (continue, restart or start it, by :func:`run_state`), then
    write its :data:`RUN_FILE` (atomically: a run killed while writing it is not done) and
    return its record, which names the machine and library versions it ran on
    (:func:`algos.reproducible.environment`). A finished run is only read back."""
    from algos.reproducible import environment

    state = run_state(run)
    if state == "done":
        log(f"[{run.name}] finished before: not repeated")
        return read_run(run.out_dir)
    if state == "restart":  # nothing to continue from: what it left would mix into the new run
        log(f"[{run.name}] stopped before its first checkpoint; starting it again")
        shutil.rmtree(run.out_dir)
    log(f"[{run.name}] {'resuming' if state == 'resume' else 'starting'} ({threads} thread(s))")
    start = time.perf_counter()
    result = train(run.config, resume=state == "resume", progress=progress, retriever=retriever)
    record = {"run": run.name, "seed": run.seed, "variant": run.variant, "stage": run.config.stage,
              "searcher_signal": run.config.searcher_signal if run.config.stage == "team" else None,
              "teacher": run.config.teacher, "threads": threads, "resumed": state == "resume",
              "wall_s": round(time.perf_counter() - start, 1), **result,
              "config": run.config.to_dict(), "environment": environment()}
    tmp = run.out_dir / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    os.replace(tmp, run.out_dir / RUN_FILE)
    log(f"[{run.name}] done in {record['wall_s']:.0f} s: validation avg@1 = {record['val_avg@1']:.3f}")
    return record


def _execute_in_child(run: Run, train: TrainFn, threads: int) -> dict[str, Any]:
    """A worker process's run on ``threads`` threads: its output goes to
    ``seed<S>/<variant>.log`` (beside the run's directory, which a restart removes), no
    progress bars."""
    from algos.reproducible import run_threads

    run.out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run.out_dir.parent / f"{run.variant}.log", "a", encoding="utf-8") as f, run_threads(threads):
        sys.stdout = sys.stderr = f
        return execute(run, train=train, threads=threads, progress=False,
                       log=lambda line: print(line, flush=True))


def run_ablation(preset: str, out: str | Path, seeds: Sequence[int], variants: Sequence[str] = VARIANTS,
                 overrides: dict[str, Any] | None = None, *, threads: int = 1, jobs: int = 1,
                 progress: bool = True, log: Callable[[str], None] = print, train: TrainFn = train_run,
                 retriever: Any = None) -> dict[str, Any]:
    """Run (or finish) every run of the ablation; returns the plan with each run's record
    and writes it to ``<out>/ablation.json``.

    ``threads``: torch's and faiss's intra-op threads in every process, the base's build
    included (:func:`algos.reproducible.run_threads`: a run repeats bit for bit at the same
    count; on a busy machine one thread per process is also the faster choice, two threads
    on two shared cores wait on each other). ``jobs``: runs at once, each in its own
    process (a seed's variants wait for its Teacher); with 1 every run is in this process.
    ``train``: the per-run trainer (:func:`train_run`; tests give a fake, which must be a
    module-level function when ``jobs > 1``). ``retriever``: used by every run instead of
    the config's (tests; ``jobs=1`` only)."""
    if retriever is not None and jobs > 1:
        raise ValueError("a retriever object cannot be shared with worker processes: use jobs=1")
    from algos.reproducible import run_threads

    out = Path(out)
    runs, plan = check_ablation(preset, out, seeds, variants, overrides, threads=threads, jobs=jobs)
    out.mkdir(parents=True, exist_ok=True)
    with run_threads(threads):
        return _run_all(runs, plan, out, train=train, threads=threads, jobs=jobs, progress=progress,
                        log=log, retriever=retriever)


def _run_all(runs: list[Run], plan: dict[str, Any], out: Path, *, train: TrainFn, threads: int, jobs: int,
             progress: bool, log: Callable[[str], None], retriever: Any) -> dict[str, Any]:
    from algos.presets import prepare_model
    from algos.reproducible import describe_base

    todo = [r for r in runs if run_state(r) != "done"]
    if todo:  # each seed's base (micro: built once per seed, minutes) before any run or worker needs it
        needed = {(r.config.model, r.seed) for r in todo}
        prepared = {(m, s): prepare_model(m, seed=s, progress=progress) for m, s in sorted(needed)}
        for m, s in {(r.config.model, r.seed) for r in runs} - needed:  # finished seeds: found, never rebuilt
            with contextlib.suppress(FileNotFoundError):
                prepared[m, s] = prepare_model(m, seed=s, progress=progress, build=False)
        _check_same_base([r for r in runs if r not in todo], prepared)
        runs = [dataclasses.replace(r, config=dataclasses.replace(r.config, model=prepared[r.config.model, r.seed]))
                if (r.config.model, r.seed) in prepared else r for r in runs]
        # which base each seed's runs start from: its weights' hash
        plan["bases"].update({f"seed{s}": describe_base(p) for (_, s), p in prepared.items()})
    start = time.perf_counter()
    records: dict[str, dict[str, Any]] = {}

    def save() -> None:
        plan["runs"] = {r.name: records.get(r.name, {"state": run_state(r)}) for r in runs}
        plan["wall_s"] = round(time.perf_counter() - start, 1)
        tmp = out / "ablation.json.tmp"
        tmp.write_text(json.dumps(plan, indent=2), encoding="utf-8")
        os.replace(tmp, out / "ablation.json")

    if jobs == 1:
        for run in runs:
            records[run.name] = execute(run, train=train, threads=threads, progress=progress,
                                        retriever=retriever, log=log)
            save()
    else:
        _run_in_processes(runs, records, train, threads, jobs, log, save)
    save()
    return plan


def _check_same_base(finished: list[Run], prepared: dict[tuple[str, int], str]) -> None:
    """Refuse to add runs from another base than the finished runs trained from (a recipe's
    base rebuilt under a new cache key, say): the variants would not share a start."""
    from algos.reproducible import weight_hash

    for run in finished:
        before = read_run(run.out_dir).get("config", {}).get("model")
        now = prepared.get((run.config.model, run.seed))
        if now is None or before is None or before == now:
            continue
        if weight_hash(before) is None or weight_hash(before) != weight_hash(now):
            raise ValueError(f"{run.name} was trained from the base {before}, but {run.config.model!r} is now "
                             f"{now}: the runs would not share a base; give another --out")


def _run_in_processes(runs: list[Run], records: dict[str, dict[str, Any]], train: TrainFn, threads: int,
                      jobs: int, log: Callable[[str], None], save: Callable[[], None]) -> None:
    """Up to ``jobs`` runs at once, a fresh process each (its memory is returned when it
    ends); a run starts once the run it needs finished. A failed run stops the ablation
    after the runs in flight finished (their work is kept)."""
    pending = list(runs)
    running: dict[Future, Run] = {}
    failed: list[str] = []
    fresh = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}  # 3.10: workers are reused
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), **fresh) as pool:
        while pending or running:
            launched = True
            while launched and not failed and len(running) < jobs:  # a run read back may free others
                launched = False
                for run in [r for r in pending if r.needs is None or r.needs in records]:
                    if len(running) >= jobs:
                        break
                    pending.remove(run)
                    launched = True
                    if run_state(run) == "done":
                        records[run.name] = read_run(run.out_dir)
                        continue
                    log(f"[{run.name}] started in a worker process (its log: {run.out_dir.parent / run.variant}.log)")
                    running[pool.submit(_execute_in_child, run, train, threads)] = run
            if not running:
                if pending and not failed:  # their Teacher is not among the runs
                    raise RuntimeError(f"runs {[r.name for r in pending]} wait for runs that are not planned")
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                run = running.pop(future)
                try:
                    records[run.name] = future.result()
                    log(f"[{run.name}] done in {records[run.name]['wall_s']:.0f} s: "
                        f"validation avg@1 = {records[run.name]['val_avg@1']:.3f}")
                except Exception as err:  # noqa: BLE001  (reported with the run's name, then raised)
                    failed.append(f"{run.name}: {type(err).__name__}: {err}")
            save()
    if failed:
        raise RuntimeError("ablation runs failed (finished runs are kept; rerun to continue): " + "; ".join(failed))


def check_ablation(preset: str, out: str | Path, seeds: Sequence[int], variants: Sequence[str] = VARIANTS,
                   overrides: dict[str, Any] | None = None, *, threads: int = 1, jobs: int = 1
                   ) -> tuple[list[Run], dict[str, Any]]:
    """The runs and the plan of an ablation, or ValueError with one line naming what is
    wrong: a bad variant, seed, setting, thread or job count, or an ``out`` that holds an
    ablation run with other settings (its finished runs would be compared with runs trained
    differently). Writes nothing."""
    if threads < 1 or jobs < 1:
        raise ValueError(f"threads={threads} and jobs={jobs} must be >= 1")
    runs = plan_runs(preset, out, seeds, variants, overrides)
    plan = {"preset": preset, "seeds": list(seeds), "variants": list(variants),  # as JSON reads it back
            "overrides": json.loads(json.dumps(overrides or {})), "threads": threads, "jobs": jobs,
            "bases": {}, "runs": {}}
    path = Path(out) / "ablation.json"
    if not path.exists():
        return runs, plan
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return runs, plan  # a plan cut off mid-write: the runs' own records are what counts
    if old.get("preset") != plan["preset"] or old.get("overrides") != plan["overrides"]:
        raise ValueError(f"{path} was run with preset {old.get('preset')!r} and settings {old.get('overrides')}, "
                         f"not {plan['preset']!r} and {plan['overrides']}: give another --out")
    plan["bases"] = dict(old.get("bases") or {})  # the finished runs' base, kept when nothing is left to build
    return runs, plan


# ---------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ablation's options (``python -m benchmarks ablate``)."""
    parser.add_argument("--preset", default="micro", help="a preset of python -m algos train (default micro)")
    parser.add_argument("--out", default="runs/table2", help="the ablation's directory (default runs/table2)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma list of {', '.join(VARIANTS)} (default: all; opd is the reference of the CIs)")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 1)")
    seeds.add_argument("--seed-list", default=None, help="comma list of seeds, e.g. 0,5,7")
    parser.add_argument("--steps", type=int, default=None, help="training steps of every run (default: the preset's)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="any TrainConfig setting for every run, as in python -m algos train")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads per process, the base's build included (default 1: on a busy machine "
                             "one thread per process is faster than two that wait on each other; try 2 on an idle "
                             "2-core machine with --jobs 1; numbers repeat bit for bit at the same count)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def seeds_of(args: argparse.Namespace) -> list[int]:
    """The seeds an ``ablate`` command names; raises ValueError naming the option."""
    if args.seed_list is not None:
        try:
            return [int(s) for s in args.seed_list.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"--seed-list {args.seed_list!r}: expected integers separated by commas") from None
    n = 1 if args.seeds is None else args.seeds
    if n < 1:
        raise ValueError(f"--seeds {n}: must be >= 1")
    return list(range(n))


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig settings an ``ablate`` command gives every run (``--set``, ``--steps``)."""
    from algos.config import parse_overrides

    overrides = parse_overrides(args.set)
    if args.steps is not None:
        overrides["steps"] = args.steps
    return overrides
