"""The plan of the paper's Table 2 (the Searcher-signal ablation): per seed one Stage-I Teacher,
then Stage II once per variant (:data:`VARIANT_SETTINGS`), each run in its own directory
(``seed<S>/<variant>/``). docs/table2.md ("What runs", "What it writes") says what differs
between the variants, what the directory holds and how a killed ablation resumes."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from algos.roles import searcher_signals
from envs.paths import atomic_write

if TYPE_CHECKING:
    from algos.config import TrainConfig

# algos.config and algos.engine.checkpoint (torch) are imported where used: the command line's
# parser and the table read this module without loading torch.

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


def plan_runs(preset: str, out: str | Path, seeds: Sequence[int], variants: Sequence[str] = VARIANTS,
              overrides: dict[str, Any] | None = None, base_seeds: int | None = None) -> list[Run]:
    """Every run of the ablation in a valid order: per seed its Teacher (when a variant needs
    one) then the variants. ``overrides``: TrainConfig settings for every run, not what the
    ablation varies. ``base_seeds``: K, seed ``s`` trains from the base of seed ``s % K``;
    None: each seed from its own. Raises ValueError naming the bad variant, seed or setting."""
    from algos.commands.presets import PRESETS, preset_config

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
            settings = {"teacher": str(teacher_dir), **VARIANT_SETTINGS[variant]}  # (checked above)
            cfg = preset_config(preset, **{**overrides, **base, **settings, "stage": "team", "seed": seed,
                                           "out_dir": str(out / run_name(seed, variant))})
            needs = run_name(seed, TEACHER) if settings["teacher"] == str(teacher_dir) else None
            runs.append(Run(seed, variant, cfg, needs))
    keys = [step0_key(r.config.to_dict()) for r in runs]
    return [dataclasses.replace(r, step0_from=tuple(o.name for o, k in zip(runs, keys) if k == key and o is not r))
            for r, key in zip(runs, keys)]


STEP0_FREE = frozenset({"out_dir", *(key for settings in VARIANT_SETTINGS.values() for key in settings)})
"""The config fields a step-0 validation does not read: the run's directory and what the
variants set (the Searcher signal and the Teacher enter the loss and the sample's per-token
values, which :func:`adopt_step0` recomputes, never the validation's episodes)."""


def step0_key(config: dict[str, Any]) -> str:
    """What a run's step-0 validation depends on: its config (``TrainConfig.to_dict()`` or read
    back from JSON) without :data:`STEP0_FREE`, as canonical JSON."""
    kept = {k: v for k, v in config.items() if k not in STEP0_FREE}
    return json.dumps(kept, sort_keys=True, default=list)


def run_state(run: Run) -> str:
    """``done`` (its ``run.json`` exists), ``resume`` (a checkpoint to continue from),
    ``fresh`` (nothing there) or ``restart`` (killed before its first checkpoint)."""
    from algos.engine.checkpoint import latest_checkpoint

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


def write_atomically(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file: a reader never sees half of it."""
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def validation_steps(config: TrainConfig) -> list[int]:
    """The steps a run validates at: 0 (the base), every ``eval_every`` and the last."""
    return sorted({0, config.steps, *range(config.eval_every, config.steps + 1, config.eval_every)})


def work_estimate(runs: Sequence[Run], *, built: Callable[[str, int], bool] | None = None) -> dict[str, Any]:
    """What is left of an ablation, for :func:`describe_work`: the runs not finished, the
    recipe bases they start from (``to_build``: those ``built`` does not find), the
    validations they run and how many step-0 validations they take from another run."""
    from algos.commands.presets import RECIPES

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


def check_ablation(preset: str, out: str | Path, seeds: Sequence[int], variants: Sequence[str] = VARIANTS,
                   overrides: dict[str, Any] | None = None, *, base_seeds: int | None = None, threads: int = 1,
                   jobs: int = 1) -> tuple[list[Run], dict[str, Any]]:
    """The runs and the plan of an ablation, or a one-line ValueError: a bad variant, seed,
    setting, base-seed, thread or job count, or an ``out`` that holds an ablation run with
    other settings or bases. Writes nothing."""
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

