"""The runs of the paper's Table 2 (the Searcher-signal ablation): for each seed one Stage-I
Teacher, then Stage II once per variant, each run in its own directory; every run of a seed
starts from that seed's base. By default a recipe builds one base per seed, so the spread
over seeds includes the base's; ``base_seeds=K`` (``--base-seeds K``) makes training seed
``s`` start from the base built for seed ``s % K`` (``TrainConfig.base_seed``): 6 seeds over
3 bases cost 3 builds, and the seeds that share a base are not independent in its draw
(``benchmarks.table2`` lists which share one).

Variants (Leader and Answerer objectives fixed: GRPO with the KL toward the Teacher; only
the Searchers' signal or the Teacher changes): one per Searcher signal of the table of role
rules (``algos.roles``; ``opd``, the method, first), each taught by the seed's Stage-I run,
and ``base``: on-policy distillation from the base model.

Every run of a seed has the same ``seed``: the same training questions in the same order,
the same rollout and validation sampler seeds, validated on the same held-out questions at
the same steps. Seeds that share a base still differ by their ``seed``.

The step-0 validation (the base, before any update) is the same computation for every
Stage-II variant of a seed: the same base weights, workflow, questions and sampler seeds
(:func:`step0_key`: the configs differ only in what validation does not read). It is
computed once: a variant starts with the step-0 records, metrics row and (its own values
over the same episodes) validation sample of a run of the same key that has them
(:func:`adopt_step0`), byte for byte what it would have computed. Training seeds never
share it: the validation sampler's seed is the training seed's.

Layout under ``out``::

    ablation.json                the plan (preset, seeds, base seeds, variants, settings), each
                                 seed's base and each run's state
    seed<S>/teacher/             Stage I
    seed<S>/<variant>/           Stage II; run.json when it finished (wall time, steps, files,
                                 base seed and weights, whose step-0 validation it reused)

Resuming: a finished run (its ``run.json``) is never repeated; a run with a checkpoint
continues from it (the Trainer's ``--resume``); a run killed before its first checkpoint
starts again. So a killed ablation loses at most the runs in progress (a step-0 validation
is reused only from a run that finished or checkpointed, whose recorded config has the key).

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
from collections.abc import Callable, Iterator, Sequence
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

STARTED_FILE = "started.json"
"""The config a run started with, written before its step-0 validation: what lets a variant
started beside it take that validation (:func:`adopt_step0`) before its first checkpoint."""


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
    step0_from: tuple[str, ...] = ()
    """The runs of the same :func:`step0_key` (the other Stage-II variants of the seed), whose
    step-0 validation this run takes instead of computing it, when one has it."""
    base: dict[str, Any] | None = None
    """Its base as :func:`algos.reproducible.describe_base` describes it, with ``base_seed``
    (set once the base is prepared)."""

    @property
    def name(self) -> str:
        return run_name(self.seed, self.variant)

    @property
    def out_dir(self) -> Path:
        return Path(self.config.out_dir)

    @property
    def root(self) -> Path:
        """The ablation's directory."""
        return self.out_dir.parents[1]


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
              overrides: dict[str, Any] | None = None, base_seeds: int | None = None) -> list[Run]:
    """Every run of the ablation in a valid order: per seed its Teacher (when a variant
    needs one) then the variants. ``overrides``: TrainConfig settings for every run (e.g.
    ``steps``); they may not set what the ablation itself varies. ``base_seeds``: K, seed
    ``s`` trains from the base of seed ``s % K`` (``TrainConfig.base_seed``); None: each
    seed from its own. Each run lists the runs whose step-0 validation it may reuse
    (:attr:`Run.step0_from`). Raises ValueError naming the bad variant, seed or setting
    (the configs are validated here, before any run)."""
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
    if base_seeds is not None and (not isinstance(base_seeds, int) or base_seeds < 1):
        raise ValueError(f"base_seeds={base_seeds!r}: must be an integer >= 1 (or None: a base per seed)")
    overrides = dict(overrides or {})
    varied = sorted(set(overrides) & {"stage", "teacher", "searcher_signal", "out_dir", "seed", "base_seed"})
    if varied:
        raise ValueError(f"the ablation sets {varied} itself; remove them from the settings")
    out = Path(out)
    runs: list[Run] = []
    for seed in seeds:
        teacher_dir = out / run_name(seed, TEACHER)
        needs_teacher = any(VARIANT_SETTINGS[v].get("teacher") is None for v in variants)
        base = {} if base_seeds is None else {"base_seed": seed % base_seeds}
        if needs_teacher:
            cfg = preset_config(preset, **{**overrides, **base, "stage": "teacher", "teacher": None, "seed": seed,
                                           "out_dir": str(teacher_dir)})
            runs.append(Run(seed, TEACHER, cfg, None))
        for variant in variants:
            settings = variant_overrides(variant, teacher_dir)
            cfg = preset_config(preset, **{**overrides, **base, **settings, "stage": "team", "seed": seed,
                                           "out_dir": str(out / run_name(seed, variant))})
            needs = run_name(seed, TEACHER) if settings["teacher"] == str(teacher_dir) else None
            runs.append(Run(seed, variant, cfg, needs))
    keys = [step0_key(r.config.to_dict()) for r in runs]
    return [dataclasses.replace(r, step0_from=tuple(o.name for o, k in zip(runs, keys) if k == key and o is not r))
            for r, key in zip(runs, keys)]


STEP0_FREE = frozenset({"out_dir", *(key for settings in VARIANT_SETTINGS.values() for key in settings)})
"""The config fields a step-0 validation does not read: the run's directory and what the
variants set (the Searcher signal and the Teacher enter the loss, and the validation
sample's per-token values, which :func:`adopt_step0` recomputes, never the validation's
episodes). ``Trainer.validate`` samples the trained model (at step 0 the base's weights,
``model``) with its own seeded sampler (``seed``) on the validation questions in the
workflow of ``stage``, with the env shape, retriever and sampling settings: all in the key."""


def step0_key(config: dict[str, Any]) -> str:
    """What a run's step-0 validation depends on: its config (a ``TrainConfig.to_dict()``,
    or one read back from JSON) without :data:`STEP0_FREE`, as canonical JSON. Two runs of
    one key validate the same model on the same questions with the same sampler seeds."""
    kept = {k: v for k, v in config.items() if k not in STEP0_FREE}
    return json.dumps(kept, sort_keys=True, default=list)


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


def train_run(config: TrainConfig, *, resume: bool, progress: bool = True, retriever: Any = None,
              step0_from: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Train one run to ``config.steps`` with a validation before the first step, every
    ``eval_every`` steps and after the last; returns what :data:`RUN_FILE` records of it
    besides the wall time: ``steps``, ``final_validation`` (the last validation's
    per-question records, relative to the run's directory), ``val_avg@1`` (its mean) and
    ``step0_reused_from`` (the directory whose step-0 validation a fresh run took,
    :func:`adopt_step0`, from the first of ``step0_from`` that has it; None: computed)."""
    from algos.trainer import Trainer, validation_path

    trainer = Trainer(config, resume=resume, progress=progress, retriever=retriever)
    reused = None
    if trainer.step == 0:
        started = Path(config.out_dir) / STARTED_FILE
        tmp = started.with_name(started.name + ".tmp")
        tmp.write_text(json.dumps(config.to_dict(), indent=2, default=list), encoding="utf-8")
        os.replace(tmp, started)
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
    """Give ``trainer`` (an ``algos.trainer.Trainer`` at step 0, nothing validated yet) the
    step-0 validation of the run in ``source`` instead of computing it, when that run has
    one and is of the same :func:`step0_key`; returns whether it did.

    ``source`` qualifies when it finished (its ``run.json``), checkpointed (a checkpoint's
    ``train_config.json``) or started under :func:`train_run` (its :data:`STARTED_FILE`), and
    the config recorded there has ``trainer.config``'s key (the same base weights' path
    included), and its step-0 validation is done (its metrics row): so a variant started
    while another of its seed is still training takes what that one has done. A run that
    recorded no config is not read. Then the trainer gets what its own
    ``Trainer.validate`` at step 0 writes: the per-question records (copied), the sample
    of the same episodes with this run's per-token values (its Teacher's, its role rules',
    ``Trainer.keep_sample``) and the metrics row (``val/avg@1`` and whatever else the
    source logged at step 0); and, with ``pass_rate_filter``, the questions the source's filter
    kept (``train_questions.json``: ``Trainer.filter_by_pass_rate`` reads it instead of sampling)."""
    from agents.viewer.records import ViewError, read_records
    from algos.checkpoint import latest_checkpoint
    from algos.report import read_metrics
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
    tmp = run.out_dir / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    os.replace(tmp, run.out_dir / RUN_FILE)
    log(f"[{run.name}] done in {record['wall_s']:.0f} s: validation avg@1 = {record['val_avg@1']:.3f}")
    return record


LOG_REFRESH_S = 30
"""How often a worker process writes its progress bars into its log file (tqdm's
``mininterval``, set through ``TQDM_MININTERVAL``): a 20-minute build leaves a few dozen
updates, not thousands."""


@contextlib.contextmanager
def _worker_output(log_file: Path, threads: int) -> Iterator[None]:
    """A worker process on ``threads`` threads, its output (progress bars refreshed every
    :data:`LOG_REFRESH_S` seconds) appended to ``log_file``."""
    from algos.reproducible import run_threads

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
    """Run (or finish) every run of the ablation; returns the plan with each run's record
    and writes it to ``<out>/ablation.json``. First logs the work left
    (:func:`describe_work`). ``base_seeds``: see :func:`plan_runs`.

    ``threads``: torch's and faiss's intra-op threads in every process, the base's build
    included (:func:`algos.reproducible.run_threads`: a run repeats bit for bit at the same
    count; on a busy machine one thread per process is also the faster choice, two threads
    on two shared cores wait on each other). ``jobs``: runs at once, each in its own
    process (a seed's variants wait for its Teacher); with 1 every run is in this process.
    ``train``: the per-run trainer (:func:`train_run`; tests give a fake, which must be a
    module-level function when ``jobs > 1``). With ``jobs > 1`` the missing bases are built
    in worker processes too, a seed's runs starting once its base is built (``build``: what a
    worker calls, ``build(model, seed=b, progress=False)``, by default
    :func:`algos.presets.prepare_model`; tests give a module-level fake). ``retriever``: used by
    every run instead of the config's (tests; ``jobs=1`` only). ``out`` is locked for the whole ablation
    (:func:`algos.runlock.run_lock`): a second ablation into it raises
    :class:`algos.runlock.RunLockedError` naming the first."""
    if retriever is not None and jobs > 1:
        raise ValueError("a retriever object cannot be shared with worker processes: use jobs=1")
    from algos.reproducible import run_threads
    from algos.runlock import run_lock

    out = Path(out)
    runs, plan = check_ablation(preset, out, seeds, variants, overrides, base_seeds=base_seeds, threads=threads,
                                jobs=jobs)
    # one ablation per directory (algos.runlock): a second would train the same runs at once
    with run_lock(out, log=log), run_threads(threads):  # (a base's cache key holds the thread count)
        for line in describe_work(work_estimate(runs, built=_base_is_built(progress)), jobs=jobs):
            log(line)
        return _run_all(runs, plan, out, train=train, threads=threads, jobs=jobs, progress=progress,
                        log=log, retriever=retriever, build=build)


def _run_all(runs: list[Run], plan: dict[str, Any], out: Path, *, train: TrainFn, threads: int, jobs: int,
             progress: bool, log: Callable[[str], None], retriever: Any,
             build: Callable[..., str] | None = None) -> dict[str, Any]:
    from algos.presets import prepare_model
    from algos.reproducible import weight_hash

    todo = [r for r in runs if run_state(r) != "done"]
    missing: list[tuple[str, int]] = []
    if todo:  # each base (micro: minutes to build) before any run that trains from it
        needed = sorted({_base_key(r) for r in todo})
        if jobs > 1:  # the workers build the missing ones, beside the runs whose base is ready
            is_built = _base_is_built(False)
            missing = [key for key in needed if not is_built(*key)]
        prepared = {(m, b): prepare_model(m, seed=b, progress=progress) for m, b in needed if (m, b) not in missing}
        for m, b in {_base_key(r) for r in runs} - set(needed):  # finished: found, never rebuilt
            with contextlib.suppress(FileNotFoundError):
                prepared[m, b] = prepare_model(m, seed=b, progress=progress, build=False)
        runs = _attach_bases(runs, prepared, plan)
    start = time.perf_counter()
    records: dict[str, dict[str, Any]] = {}

    def save() -> None:
        plan["runs"] = {r.name: records.get(r.name, {"state": run_state(r)}) for r in runs}
        plan["wall_s"] = round(time.perf_counter() - start, 1)
        tmp = out / "ablation.json.tmp"
        tmp.write_text(json.dumps(plan, indent=2), encoding="utf-8")
        os.replace(tmp, out / "ablation.json")

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
    from algos.reproducible import describe_base

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
    from algos.presets import prepare_model

    with _worker_output(Path(log_file), threads):
        return (build or prepare_model)(model, seed=seed, progress=True)


def _base_is_built(progress: bool) -> Callable[[str, int], bool]:
    """Whether a recipe's base of a seed is built (:func:`algos.presets.prepare_model` finds it)."""
    from algos.presets import prepare_model

    def built(model: str, seed: int) -> bool:
        try:
            prepare_model(model, seed=seed, progress=progress, build=False)
        except FileNotFoundError:
            return False
        return True

    return built


def validation_steps(config: TrainConfig) -> list[int]:
    """The steps a run validates at: 0 (the base), every ``eval_every`` and the last."""
    return sorted({0, config.steps, *range(config.eval_every, config.steps + 1, config.eval_every)})


def work_estimate(runs: Sequence[Run], *, built: Callable[[str, int], bool] | None = None) -> dict[str, Any]:
    """What is left of an ablation: counts of the runs not finished (Stage I, Stage II), the
    recipe bases they start from (``bases``; ``to_build``: those ``built`` does not find;
    ``bases_one_per_seed``: what a base per seed would be), the validations they run and how
    many of them are step-0 validations taken from a run of the same :func:`step0_key`
    (``step0_reused``; with ``jobs > 1`` fewer when variants start together). A resumed run
    counts whole."""
    from algos.presets import RECIPES

    todo = [r for r in runs if run_state(r) != "done"]
    recipe = [r for r in todo if r.config.model in RECIPES]
    bases = sorted({(r.config.model, r.config.build_seed) for r in recipe})
    fresh = [r for r in todo if run_state(r) != "resume"]  # a resumed run validated step 0 before
    available = {step0_key(r.config.to_dict()) for r in runs if r not in fresh}  # finished or checkpointed
    computed = {step0_key(r.config.to_dict()) for r in fresh} - available
    return {"runs": len(todo), "teacher_runs": sum(r.variant == TEACHER for r in todo),
            "finished_runs": len(runs) - len(todo), "bases": len(bases),
            "to_build": sum(not built(m, b) for m, b in bases) if built is not None else None,
            "bases_one_per_seed": len({(r.config.model, r.seed) for r in recipe}),
            "validations": sum(len(validation_steps(r.config)) for r in todo),
            "step0_reused": len(fresh) - len(computed)}


def describe_work(work: dict[str, Any], *, jobs: int = 1) -> list[str]:
    """:func:`work_estimate` as the lines ``python -m benchmarks ablate`` prints first
    (``jobs > 1``: the step-0 validations taken are an upper bound)."""
    builds = "" if work["to_build"] is None else f", {work['to_build']} of them to build"
    saved = (f" (a base per seed: {work['bases_one_per_seed']})"
             if work["bases_one_per_seed"] != work["bases"] else "")
    return [f"ablation: {work['runs']} runs to do ({work['teacher_runs']} Stage I, "
            f"{work['runs'] - work['teacher_runs']} Stage II), {work['finished_runs']} finished before",
            f"  bases: {work['bases']}{saved}{builds}",
            f"  validations: {'at least ' if jobs > 1 else ''}{work['validations'] - work['step0_reused']} "
            f"({'up to ' if jobs > 1 else ''}{work['step0_reused']} step-0 validations taken from a variant "
            "of the same seed and base; "
            f"{work['validations']} without)"]


def _check_same_base(finished: list[Run], prepared: dict[tuple[str, int], str]) -> None:
    """Refuse to add runs from another base than the finished runs of their seed trained from:
    the variants would not share a start. Other weights show as another path (a recipe's base
    rebuilt under a new cache key) or as the same path holding other weights than the run
    recorded (``base_weight_hash``: the base rebuilt on another CPU or library version, whose
    bits differ)."""
    from algos.reproducible import weight_hash

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
        raise ValueError(f"{run.name} was trained from the base {before} (weights {recorded}), but "
                         f"{run.config.model!r} is now {now} (weights {current}): the runs of seed {run.seed} "
                         f"would not share a base. Train them on the machine and versions {run.name} ran on, "
                         f"remove {run.out_dir.parent} to train the whole seed again, or give another --out")


STEP0_POLL_S = 20.0
"""How often (seconds) the scheduler looks whether a run's step 0 is done, while a variant
waits to take it."""


def step0_done(run: Run) -> bool:
    """Whether ``run`` holds what a variant of the same step-0 key takes from it
    (:func:`adopt_step0`): its step-0 validation's metrics row and, with
    ``pass_rate_filter``, the questions its filter kept."""
    from algos.report import read_metrics

    path = run.out_dir / "metrics.jsonl"
    validated = path.is_file() and any(r.get("step") == 0 and "val/avg@1" in r for r in read_metrics(path))
    return validated and (not run.config.pass_rate_filter or (run.out_dir / "train_questions.json").is_file())


def _run_in_processes(runs: list[Run], records: dict[str, dict[str, Any]], train: TrainFn, threads: int,
                      jobs: int, log: Callable[[str], None], save: Callable[[], None], *,
                      bases: Sequence[tuple[str, int]], out: Path,
                      built: Callable[[tuple[str, int], str], list[Run]],
                      build: Callable[..., str] | None = None) -> None:
    """Up to ``jobs`` tasks at once, a fresh process each (its memory is returned when it
    ends): first the missing ``bases`` ((model, base seed), about 20 minutes of one core each
    for micro; output in ``<out>/base-<model>-seed<b>.log``), then the runs, a run starting
    once its base is built and the run it needs finished. So a base left over when the
    others are built (three bases, two jobs) is built beside the first runs, not alone. A
    fresh run whose step-0 validation another run is computing waits until it is done
    (:func:`step0_done`) and takes it, while other tasks go first.
    ``built(key, path)``: the runs with that base attached, once it is built. ``build``: what
    a worker calls to build a base (:func:`_build_base_in_child`). A failure stops the
    ablation after the tasks in flight finished (their work is kept)."""
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
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), **fresh) as pool:
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


def check_ablation(preset: str, out: str | Path, seeds: Sequence[int], variants: Sequence[str] = VARIANTS,
                   overrides: dict[str, Any] | None = None, *, base_seeds: int | None = None, threads: int = 1,
                   jobs: int = 1) -> tuple[list[Run], dict[str, Any]]:
    """The runs and the plan of an ablation, or ValueError with one line naming what is
    wrong: a bad variant, seed, setting, base-seed, thread or job count, or an ``out`` that
    holds an ablation run with other settings or bases (its finished runs would be compared
    with runs trained differently). Writes nothing."""
    if threads < 1 or jobs < 1:
        raise ValueError(f"threads={threads} and jobs={jobs} must be >= 1")
    runs = plan_runs(preset, out, seeds, variants, overrides, base_seeds)
    plan = {"preset": preset, "seeds": list(seeds), "base_seeds": base_seeds,  # as JSON reads it back
            "variants": list(variants), "overrides": json.loads(json.dumps(overrides or {})), "threads": threads,
            "jobs": jobs, "bases": {}, "runs": {}}
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
    if old.get("base_seeds") != base_seeds:  # (a plan from before --base-seeds: None, a base per seed)
        raise ValueError(f"{path} was run with --base-seeds {old.get('base_seeds') or 'unset (a base per seed)'}, "
                         f"not {base_seeds or 'unset (a base per seed)'}: its seeds start from other bases; "
                         "give another --out")
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
    parser.add_argument("--base-seeds", type=int, default=None, metavar="K",
                        help="seed s trains from the base built for seed s %% K (default: a base per seed); "
                             "--seeds 6 --base-seeds 3 builds 3 bases, each shared by 2 training seeds")
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
