"""The ablation's runs (:mod:`benchmarks.table2.runs` plans them) brought to their end, in this
process or in up to ``jobs`` worker processes, each recipe base built before the runs that start
from it; a seed's step-0 validation computed once and taken by its other variants
(:func:`adopt_step0`). docs/table2.md ("What runs") says how an ablation resumes."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from algos.engine.runlock import run_lock
from algos.report import read_metrics
from algos.reproducible import describe_base, environment, run_threads, weight_hash
from benchmarks.table2.runs import (
    RUN_FILE,
    STARTED_FILE,
    VARIANTS,
    Run,
    check_ablation,
    describe_work,
    read_run,
    run_state,
    step0_key,
    work_estimate,
    write_atomically,
)

if TYPE_CHECKING:
    from algos.config import TrainConfig


def train_run(config: TrainConfig, *, resume: bool, progress: bool = True, retriever: Any = None,
              step0_from: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Train one run to ``config.steps``, validating at step 0, every ``eval_every`` and the
    last; returns ``steps``, ``final_validation`` (relative to the run's directory), its mean
    ``val_avg@1`` and ``step0_reused_from`` (the first of ``step0_from`` whose step-0
    validation a fresh run took, :func:`adopt_step0`; None: computed)."""
    from algos.trainer import Trainer, validation_path

    trainer = Trainer(config, resume=resume, progress=progress, retriever=retriever)
    reused = None
    if trainer.step == 0:
        write_atomically(Path(config.out_dir) / STARTED_FILE,
                         json.dumps(config.to_dict(), indent=2, default=list))
        reused = next((str(d) for d in step0_from if adopt_step0(trainer, Path(d))), None)
    trainer.train(validate_first=reused is None)
    final = validation_path(config.out_dir, trainer.step)
    if not final.exists():  # resumed after the last checkpoint: validate the final weights
        trainer.validate()
    records = [json.loads(line) for line in final.read_text(encoding="utf-8").splitlines() if line.strip()]
    em = sum(sum(r["correct"]) / len(r["correct"]) for r in records) / max(1, len(records))
    return {"steps": trainer.step, "final_validation": str(final.relative_to(config.out_dir)), "val_avg@1": em,
            "step0_reused_from": reused}


def adopt_step0(trainer: Any, source: Path) -> bool:
    """Give ``trainer`` (at step 0, nothing validated) the step-0 validation of the run in
    ``source``; returns whether it did. ``source`` qualifies when the config it recorded
    (``run.json``, a checkpoint's ``train_config.json`` or :data:`STARTED_FILE`: a run still
    training counts) has the same :func:`step0_key` and its step-0 metrics row is written. The
    trainer gets what its own step-0 ``validate`` writes: the records, the sample's episodes
    with this run's per-token values, the metrics row and, with ``pass_rate_filter``, the
    kept ``train_questions.json``."""
    from agents.viewer.records import ViewError, read_records
    from algos.engine.checkpoint import latest_checkpoint
    from algos.samples import sample_path
    from algos.trainer import validation_path

    try:
        if (source / RUN_FILE).exists():
            recorded = read_run(source).get("config")
        elif (checkpoint := latest_checkpoint(source)) is not None:
            recorded = json.loads((checkpoint / "train_config.json").read_text(encoding="utf-8"))
        elif (source / STARTED_FILE).exists():
            recorded = json.loads((source / STARTED_FILE).read_text(encoding="utf-8"))
        else:
            return False
        if not isinstance(recorded, dict) or step0_key(recorded) != step0_key(trainer.config.to_dict()):
            return False
        rows = [r for r in read_metrics(source / "metrics.jsonl") if r.get("step") == 0 and "val/avg@1" in r]
        records = validation_path(source, 0).read_bytes()
        groups = None
        if trainer.config.sample_every:  # the sample's episodes; their values are this run's
            kept = read_records(sample_path(source, 0, "validation"))
            if [values.group if values else None for _, values in kept] != list(range(len(kept))):
                return False
            groups = [[episode] for episode, _ in kept]
    except (OSError, ValueError, ViewError):  # nothing usable there (a run being restarted): compute it
        return False
    if len(rows) != 1:
        return False
    target = validation_path(trainer.out, 0)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(records)
    if groups is not None:
        trainer.keep_sample("validation", groups)
    trainer.log_metrics({k: v for k, v in rows[0].items() if k not in ("step", "stage")}, step=0)
    kept = source / "train_questions.json"  # the pass-rate filter, when the runs have one: same key, same file
    if trainer.config.pass_rate_filter and kept.is_file() and not (trainer.out / kept.name).exists():
        (trainer.out / kept.name).write_bytes(kept.read_bytes())
    return True


TrainFn = Callable[..., dict[str, Any]]


def execute(run: Run, *, train: TrainFn = train_run, threads: int = 1, progress: bool = True,
            retriever: Any = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Bring ``run`` to its end (continue, restart or start it, by :func:`run_state`), then
    write its :data:`RUN_FILE` atomically and return it (with the machine and library
    versions it ran on). A finished run is only read back."""
    state = run_state(run)
    if state == "done":
        log(f"[{run.name}] finished before: not repeated")
        return read_run(run.out_dir)
    if state == "restart":  # nothing to continue from: what it left would mix into the new run
        log(f"[{run.name}] stopped before its first checkpoint; starting it again")
        shutil.rmtree(run.out_dir)
    log(f"[{run.name}] {'resuming' if state == 'resume' else 'starting'} ({threads} thread(s))")
    start = time.perf_counter()
    result = train(run.config, resume=state == "resume", progress=progress, retriever=retriever,
                   step0_from=[str(run.root / name) for name in run.step0_from])
    reused = result.pop("step0_reused_from", None)
    base = run.base or {}
    record = {"run": run.name, "seed": run.seed, "variant": run.variant, "stage": run.config.stage,
              "searcher_signal": run.config.searcher_signal if run.config.stage == "team" else None,
              "teacher": run.config.teacher, "threads": threads, "resumed": state == "resume",
              "wall_s": round(time.perf_counter() - start, 1), **result,
              "base_seed": run.config.build_seed, "base_weight_hash": base.get("weight_hash"),
              "step0_validation": (f"reused from {Path(reused).relative_to(run.root)}" if reused is not None
                                   else "before the resume" if state == "resume" else "computed"),
              "config": run.config.to_dict(), "environment": environment()}
    write_atomically(run.out_dir / RUN_FILE, json.dumps(record, indent=2))
    log(f"[{run.name}] done in {record['wall_s']:.0f} s: validation avg@1 = {record['val_avg@1']:.3f}")
    return record


LOG_REFRESH_S = 30
"""Seconds between a worker's progress-bar updates in its log (tqdm's ``TQDM_MININTERVAL``)."""


@contextlib.contextmanager
def _worker_output(log_file: Path, threads: int) -> Iterator[None]:
    """A worker process on ``threads`` threads, its output appended to ``log_file``."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    os.environ["TQDM_MININTERVAL"] = str(LOG_REFRESH_S)
    with open(log_file, "a", encoding="utf-8") as f, run_threads(threads):
        sys.stdout = sys.stderr = f
        yield


def _execute_in_child(run: Run, train: TrainFn, threads: int) -> dict[str, Any]:
    """A worker process's run: its output goes to ``seed<S>/<variant>.log`` (beside the run's
    directory, which a restart removes)."""
    with _worker_output(run.out_dir.parent / f"{run.variant}.log", threads):
        return execute(run, train=train, threads=threads, progress=True,
                       log=lambda line: print(line, flush=True))


def run_ablation(preset: str, out: str | Path, seeds: Sequence[int], variants: Sequence[str] = VARIANTS,
                 overrides: dict[str, Any] | None = None, *, base_seeds: int | None = None, threads: int = 1,
                 jobs: int = 1, progress: bool = True, log: Callable[[str], None] = print,
                 train: TrainFn = train_run, retriever: Any = None,
                 build: Callable[..., str] | None = None) -> dict[str, Any]:
    """Run (or finish) every run of the ablation; returns the plan with each run's record, also
    written to ``<out>/ablation.json``. ``threads``: intra-op threads in every process.
    ``jobs``: runs at once, each in its own process, missing bases built in workers too (by
    ``build``, default :func:`algos.commands.presets.prepare_model`). ``train`` and ``build``
    (module-level when ``jobs > 1``) and ``retriever`` (``jobs=1``) are for tests. ``out`` is
    locked: a second ablation into it raises :class:`algos.engine.runlock.RunLockedError`."""
    if retriever is not None and jobs > 1:
        raise ValueError("a retriever object cannot be shared with worker processes: use jobs=1")
    out = Path(out)
    runs, plan = check_ablation(preset, out, seeds, variants, overrides, base_seeds=base_seeds, threads=threads,
                                jobs=jobs)
    # one ablation per directory (algos.engine.runlock): a second would train the same runs at once
    with run_lock(out, log=log), run_threads(threads):  # (a base's cache key holds the thread count)
        work = work_estimate(runs, built=lambda model, seed: _built_base(model, seed, progress) is not None)
        for line in describe_work(work, jobs=jobs):
            log(line)
        return _run_all(runs, plan, out, train=train, threads=threads, jobs=jobs, progress=progress,
                        log=log, retriever=retriever, build=build)


def _run_all(runs: list[Run], plan: dict[str, Any], out: Path, *, train: TrainFn, threads: int, jobs: int,
             progress: bool, log: Callable[[str], None], retriever: Any,
             build: Callable[..., str] | None = None) -> dict[str, Any]:
    from algos.commands.presets import prepare_model

    todo = [r for r in runs if run_state(r) != "done"]
    missing: list[tuple[str, int]] = []
    if todo:  # each base (micro: minutes to build) before any run that trains from it
        needed = sorted({_base_key(r) for r in todo})
        if jobs > 1:  # the workers build the missing ones, beside the runs whose base is ready
            missing = [key for key in needed if _built_base(*key) is None]
        prepared = {(m, b): prepare_model(m, seed=b, progress=progress) for m, b in needed if (m, b) not in missing}
        for m, b in {_base_key(r) for r in runs} - set(needed):  # finished: found, never rebuilt
            if (path := _built_base(m, b, progress)) is not None:
                prepared[m, b] = path
        runs = _attach_bases(runs, prepared, plan)
    start = time.perf_counter()
    records: dict[str, dict[str, Any]] = {}

    def save() -> None:
        plan["runs"] = {r.name: records.get(r.name, {"state": run_state(r)}) for r in runs}
        plan["wall_s"] = round(time.perf_counter() - start, 1)
        write_atomically(out / "ablation.json", json.dumps(plan, indent=2))

    def built(key: tuple[str, int], path: str) -> list[Run]:
        nonlocal runs
        log(f"base {key[0]} of seed {key[1]} built: {path} (weights {weight_hash(path)})")
        runs = _attach_bases(runs, {key: path}, plan)
        return runs

    if jobs == 1:
        for run in runs:
            records[run.name] = execute(run, train=train, threads=threads, progress=progress,
                                        retriever=retriever, log=log)
            save()
    else:
        if missing:
            log(f"building {len(missing)} base{'s' if len(missing) > 1 else ''} in worker processes, up to {jobs} "
                f"at once, the runs of a base starting as soon as it is built (logs: {out}/base-<model>-seed<b>.log)")
        _run_in_processes(runs, records, train, threads, jobs, log, save,
                          bases=missing, out=out, built=built, build=build)
    save()
    return plan


def _base_key(run: Run) -> tuple[str, int]:
    """The recipe base ``run`` trains from: (its config's model, the base's seed)."""
    return run.config.model, run.config.build_seed


def _attach_bases(runs: list[Run], prepared: dict[tuple[str, int], str], plan: dict[str, Any]) -> list[Run]:
    """``runs`` with each base in ``prepared`` (:func:`_base_key` -> its directory) as their
    model and its description (seed, weights' hash) as their ``base``, recorded in the plan's
    ``bases`` per seed; first refuses when a finished run of such a base trained from other
    weights (:func:`_check_same_base`)."""
    done = {r.name for r in runs if run_state(r) == "done"}
    unfinished = {r.seed for r in runs if r.name not in done}  # a finished seed shares its base with nothing new
    _check_same_base([r for r in runs if _base_key(r) in prepared and r.name in done and r.seed in unfinished],
                     prepared)
    described = {key: {**describe_base(path), "base_seed": key[1]} for key, path in prepared.items()}
    runs = [dataclasses.replace(r, config=dataclasses.replace(r.config, model=prepared[key]), base=described[key])
            if (key := _base_key(r)) in prepared else r for r in runs]
    # which base each seed's runs start from: its seed and its weights' hash (a seed whose runs
    # all finished keeps what it recorded: restored from another machine, its base may differ)
    plan["bases"].update({f"seed{r.seed}": r.base for r in runs if r.base is not None and r.seed in unfinished})
    return runs


def _build_base_in_child(model: str, seed: int, threads: int, log_file: str,
                         build: Callable[..., str] | None = None) -> str:
    """A worker process's build of one recipe base on ``threads`` threads, its output to ``log_file``."""
    from algos.commands.presets import prepare_model

    with _worker_output(Path(log_file), threads):
        return (build or prepare_model)(model, seed=seed, progress=True)


def _built_base(model: str, seed: int, progress: bool = False) -> str | None:
    """The directory of a recipe's base of a seed when it is built
    (:func:`algos.commands.presets.prepare_model` finds it), else None."""
    from algos.commands.presets import prepare_model

    try:
        return prepare_model(model, seed=seed, progress=progress, build=False)
    except FileNotFoundError:
        return None


class BaseChangedError(ValueError):
    """A seed's runs would continue from other base weights than its finished runs trained from."""


def _check_same_base(finished: list[Run], prepared: dict[tuple[str, int], str]) -> None:
    """Refuse to add runs from another base than the finished runs of their seed trained from:
    the variants would not share a start. Other weights show as another path (a recipe's base
    rebuilt under a new cache key) or as the same path holding other weights than the run
    recorded (``base_weight_hash``: the base rebuilt on another CPU or library version, whose
    bits differ)."""
    for run in finished:
        record = read_run(run.out_dir)
        before, now = record.get("config", {}).get("model"), prepared.get(_base_key(run))
        if now is None or before is None:
            continue
        recorded, current = record.get("base_weight_hash") or weight_hash(before), weight_hash(now)
        if recorded is not None and recorded == current:
            continue
        if before == now and (recorded is None or current is None):  # nothing to compare: the same entry
            continue
        raise BaseChangedError(f"{run.name} was trained from the base {before} (weights {recorded}), but "
                         f"{run.config.model!r} is now {now} (weights {current}): the runs of seed {run.seed} "
                         f"would not share a base. Train them on the machine and versions {run.name} ran on, "
                         f"remove {run.out_dir.parent} to train the whole seed again, or give another --out")


STEP0_POLL_S = 20.0
"""Seconds between looks at a run's step 0 while a variant waits to take it."""


def step0_done(run: Run) -> bool:
    """Whether ``run`` holds what a variant of the same step-0 key takes from it
    (:func:`adopt_step0`): its step-0 validation's metrics row and, with
    ``pass_rate_filter``, the questions its filter kept."""
    path = run.out_dir / "metrics.jsonl"
    validated = path.is_file() and any(r.get("step") == 0 and "val/avg@1" in r for r in read_metrics(path))
    return validated and (not run.config.pass_rate_filter or (run.out_dir / "train_questions.json").is_file())


def die_with_parent(parent: int, poll_s: float = 2.0) -> None:
    """A worker's initializer: a thread that ends the worker once ``parent`` (the ablation's
    process) is gone. A killed ablation otherwise leaves its workers training on, writing
    into run folders that the next ablation, taking over the stale lock, writes too."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _run_in_processes(runs: list[Run], records: dict[str, dict[str, Any]], train: TrainFn, threads: int,
                      jobs: int, log: Callable[[str], None], save: Callable[[], None], *,
                      bases: Sequence[tuple[str, int]], out: Path,
                      built: Callable[[tuple[str, int], str], list[Run]],
                      build: Callable[..., str] | None = None) -> None:
    """Up to ``jobs`` tasks at once, a fresh process each: first the missing ``bases``, then
    the runs, each once its base is built (``built(key, path)`` attaches it) and the run it
    needs finished. A fresh run whose step-0 validation another run is computing waits for it
    (:func:`step0_done`). A failure stops the ablation after the tasks in flight."""
    pending: list[Run | tuple[str, int]] = [*bases, *runs]
    unbuilt = set(bases)
    running: dict[Future, Run | tuple[str, int]] = {}
    failed: list[str] = []

    def ready(task: Run | tuple[str, int]) -> bool:
        return not isinstance(task, Run) or (_base_key(task) not in unbuilt
                                              and (task.needs is None or task.needs in records))

    def held(task: Run | tuple[str, int]) -> bool:
        """A fresh run whose step 0 another run now computes: it waits to take it (it would
        compute the same validation and pass-rate filter again, minutes of a core)."""
        busy = {r.name: r for r in running.values() if isinstance(r, Run)}
        return (isinstance(task, Run) and any(name in busy and not step0_done(busy[name]) for name in task.step0_from)
                and run_state(task) in ("fresh", "restart"))

    fresh = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}  # 3.10: workers are reused
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=die_with_parent,
                             initargs=(os.getpid(),), **fresh) as pool:
        while pending or running:
            launched = True
            while launched and not failed and len(running) < jobs:  # a run read back may free others
                launched = False
                for task in [t for t in pending if ready(t)]:
                    if len(running) >= jobs:
                        break
                    if held(task):
                        continue
                    pending.remove(task)
                    launched = True
                    if not isinstance(task, Run):
                        model, seed = task
                        log_file = out / f"base-{model}-seed{seed}.log"
                        log(f"[base {model} of seed {seed}] building in a worker process (its log: {log_file})")
                        running[pool.submit(_build_base_in_child, model, seed, threads, str(log_file), build)] = task
                    elif run_state(task) == "done":
                        records[task.name] = read_run(task.out_dir)
                    else:
                        log(f"[{task.name}] started in a worker process "
                            f"(its log: {task.out_dir.parent / task.variant}.log)")
                        running[pool.submit(_execute_in_child, task, train, threads)] = task
            if not running:
                if pending and not failed:  # their Teacher is not among the runs
                    raise RuntimeError(f"runs {[getattr(r, 'name', r) for r in pending]} wait for runs that "
                                       "are not planned")
                break
            waiting = any(ready(t) and held(t) for t in pending)  # then look again in a while
            done, _ = wait(running, timeout=STEP0_POLL_S if waiting else None, return_when=FIRST_COMPLETED)
            for future in done:
                task = running.pop(future)
                try:
                    if not isinstance(task, Run):
                        path = future.result()
                        unbuilt.discard(task)
                        attached = {r.name: r for r in built(task, path)}
                        pending = [attached.get(t.name, t) if isinstance(t, Run) else t for t in pending]
                        continue
                    records[task.name] = future.result()
                    log(f"[{task.name}] done in {records[task.name]['wall_s']:.0f} s: "
                        f"validation avg@1 = {records[task.name]['val_avg@1']:.3f}")
                except Exception as err:  # noqa: BLE001  (reported with the task's name, then raised)
                    failed.append(f"{getattr(task, 'name', task)}: {type(err).__name__}: {err}")
            save()
    if failed:
        raise RuntimeError("ablation runs failed (finished runs are kept; rerun to continue): " + "; ".join(failed))

