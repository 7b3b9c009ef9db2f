"""The positive control for on-policy distillation (issue 43; ``docs/positive_control.md`` has
the design and its measurements): a Teacher planted to be better than its base *in the
Searchers' behaviour* (:func:`build_teacher`: the ``micro`` base continued by SFT on the
scripted team that never skips the search), measured the way the ablation will beside its
base and beside the base's team with its Searchers (:func:`check_teacher`), and written where
``python -m benchmarks ablate --preset micro_control`` takes a seed's Teacher from
(:func:`plant`).

    python -m algos.recipes.micro.control plant --out ~/mopd-runs/control --seeds 0,1,2,3
    python -m benchmarks ablate --preset micro_control --variants opd,base,none --seeds 4 \\
        --base-seeds 4 --threads 1 --jobs 1 --out ~/mopd-runs/control
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import agents.router
from algos.recipes.micro.settings import CONTROL_TEACHER, CONTROL_TRAIN, ENV
from envs import protocol as P

PLANTED = "planted"
"""The key of a planted Teacher's ``run.json`` that says how it was made."""

RUN_FILE, TEACHER = "run.json", "teacher"
"""What ``benchmarks.table2.runs`` calls a finished run's record and a seed's Teacher run (its
``RUN_FILE`` and ``TEACHER``; the learner's floor does not import the benchmarks')."""

CHECK_FILE = "teacher_check.json"
"""A planted Teacher's measurements (test and dev, base, Teacher, base team with its Searchers)."""


class RoleRouter(agents.router.RoleRouter):
    """A team whose Searchers are one token policy and whose other roles (Leader, Answerer)
    another (``agents.router.RoleRouter``). Both must share the tokenizer."""

    def __init__(self, searcher: Any, team: Any):
        super().__init__({P.SEARCHER: searcher}, default=team)


def teacher_settings(**overrides: Any) -> dict[str, Any]:
    """:data:`CONTROL_TEACHER` with ``overrides`` (refusing a setting it does not have)."""
    unknown = sorted(set(overrides) - set(CONTROL_TEACHER) - {"keep_skipped"})
    if unknown:
        raise ValueError(f"unknown Teacher setting(s) {unknown}: choose among {sorted(CONTROL_TEACHER)}")
    return {**CONTROL_TEACHER, **overrides}


def build_teacher(base: str | Path, *, seed: int, progress: bool = True, build: bool = True,
                  **overrides: Any) -> Path:
    """The Teacher of the base at ``base``: the base continued by :func:`algos.sft.sft` on the
    never-skipping scripted team's right episodes (:func:`teacher_settings`), cached by the
    base's weights' hash, the settings, the seed and the arithmetic (``control_teacher.json``)."""
    from algos.recipes.cache import build_dir
    from algos.recipes.micro.build import arithmetic
    from algos.recipes.micro.tokenizer import Saver, save_atomically
    from algos.reproducible import current_threads, weight_hash

    settings = teacher_settings(**overrides)
    base = Path(base)
    key = {"base_weight_hash": weight_hash(base), "seed": seed, **settings,
           **arithmetic(current_threads())}
    target = build_dir("control-teacher", key)
    if (target / "control_teacher.json").is_file():
        return target
    if not build:
        raise FileNotFoundError(f"no control Teacher built at {target}")
    started = time.perf_counter()
    from agents.models import load_causal_lm
    from algos.sft import sft

    model, tokenizer = load_causal_lm(str(base))
    episodes = teacher_episodes(tokenizer, seed=seed, settings=settings, progress=progress)
    losses = sft(model, episodes, epochs=settings["epochs"], lr=settings["lr"], batch_tokens=settings["batch_tokens"],
                 context_weight=0.0, max_len=ENV["max_context_tokens"], seed=seed, progress=progress)
    record = {"key": key, "base": str(base), "episodes": len(episodes), "steps": len(losses),
              "loss_first_100": float(np.mean(losses[:100])), "loss_last_100": float(np.mean(losses[-100:])),
              "seconds": round(time.perf_counter() - started, 1)}
    hashed = {"control_teacher.json": lambda saved: {**record, "weight_hash": weight_hash(saved)}}
    save_atomically(Saver([model, tokenizer], hashed), target, replace=True)
    return target


def teacher_episodes(tokenizer: Any, *, seed: int, settings: dict[str, Any], progress: bool = True) -> list[Any]:
    """The Teacher's SFT episodes: the scripted team's right ones (team EM 1) with ``settings``'
    ``skip_search``, ``worlds`` and questions, cut to the segments of ``roles`` (None: all)."""
    from algos.recipes.micro.episodes import scripted_episodes

    episodes = scripted_episodes(tokenizer, settings["episodes_per_dataset"], worlds=settings["worlds"], seed=seed,
                                 skip_search=settings["skip_search"], progress=progress)
    if settings.get("keep_skipped"):  # as the base build keeps them: right, or with a skipped search
        from algos.recipes.micro.episodes import imitated

        right = imitated(episodes)
    else:
        right = [ep for ep in episodes if ep.team_em == 1]
    roles = settings["roles"]
    if roles is None:
        return right
    return [dataclasses.replace(ep, segments=[s for s in ep.segments if s.role in roles]) for ep in right]


def build_skipping_base(seed: int, *, skip_search: float = 0.7, progress: bool = True, build: bool = True,
                        **overrides: Any) -> Path:
    """A candidate base for design C (``docs/positive_control.md``; not a preset): the
    ``micro_search`` base of ``seed`` continued by SFT on the Searchers' tokens of the scripted
    team that skips ``skip_search`` of its tasks, so that the micro_search base is a Teacher
    whose lead lives in the Searchers. Cached like :func:`build_teacher`."""
    from algos.recipes.micro.build import build_searching_base

    base = build_searching_base(seed=seed, progress=progress, build=build)
    return build_teacher(base, seed=seed, progress=progress, build=build,
                         **{"skip_search": skip_search, "keep_skipped": True, **overrides})


def micro_base(seed: int, *, progress: bool = True) -> Path:
    """The ``micro`` base of ``seed``: built the first time (minutes), cached after."""
    from algos.recipes.micro import RECIPE

    return RECIPE.prepare_model(seed=seed, progress=progress)


def control_config(seed: int, **overrides: Any) -> Any:
    """The Stage-II config the ablation gives ``seed`` (its validation's questions, sampler
    seeds and env shape are what :func:`validate_team` uses), with ``overrides``."""
    from algos.config import TrainConfig

    return TrainConfig(**{**CONTROL_TRAIN, "stage": "team", "teacher": "base", "seed": seed, "base_seed": seed,
                          **overrides})


def validate_team(config: Any, model: str | Path, searcher: str | Path | None = None, *, retriever: Any = None,
                  progress: bool = True) -> list[dict[str, Any]]:
    """Per-question records of ``Trainer.validate`` for ``config`` with ``model`` (a model
    directory): the same questions, workflow, env shape, sampling and sampler seeds, so the
    base's records equal a Stage-II run's step-0 validation. ``searcher``: another model
    plays the Searchers (:class:`RoleRouter`; the same seeds)."""
    from agents.collect import collect
    from agents.hf import HFPolicy
    from agents.models import load_causal_lm
    from algos.trainer import load_questions
    from envs import env_fn
    from envs.episode import question_record
    from envs.retrieval.factory import make_retriever

    cfg = config
    questions = load_questions(cfg.data, cfg.val_datasets, cfg.val_split, cfg.val_per_dataset)

    def policy(path: str | Path) -> Any:
        net, tok = load_causal_lm(str(path))
        net.eval()
        return HFPolicy(net, tok, sampling=cfg.val_sampling, seed=cfg.seed + 7, batch_size=cfg.generation_batch_size)

    team = policy(model)
    played = team if searcher is None else RoleRouter(policy(searcher), team)
    retriever = retriever or make_retriever(cfg.retriever, index=cfg.retriever_index, progress=progress)
    make = env_fn(workflow=cfg.workflow, tokenizer=team.tokenizer, retriever=retriever, questions=questions,
                  **cfg.env_shape())
    groups = collect(make, played, questions, cfg.val_runs, seed=cfg.seed + 99_991,
                     progress="validate" if progress else False)
    return [question_record(g) for g in groups]


def figures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Macro avg@1 (the mean over datasets of each dataset's mean correctness), questions
    right and macro searches per workflow of validation records (``benchmarks.metrics``'
    definitions, recomputed here: the recipe sits below the benchmarks)."""
    datasets: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        datasets.setdefault(r["dataset"], []).append(r)

    def macro(key: str) -> float:
        return float(np.mean([np.mean([np.mean(r[key]) for r in rows]) for rows in datasets.values()]))

    return {"macro_avg@1": macro("correct"), "right": int(sum(sum(r["correct"]) for r in records)),
            "questions": len(records), "searches_per_workflow": macro("searches")}


def check_teacher(seed: int, base: str | Path, teacher: str | Path, *, splits: Sequence[str] = ("dev", "test"),
                  retriever: Any = None, progress: bool = True) -> dict[str, Any]:
    """The Teacher against its base on each split, as the control preset validates (``dev`` to
    choose on, ``test`` the gate): the base, the Teacher, the base's team with the Teacher's
    Searchers; and both models' Searcher skip probability (20 dev questions per dataset)."""
    from algos.engine.checkpoint import load_model
    from algos.recipes.micro.measure import searcher_skip_probability
    from envs.retrieval.factory import default_retriever

    retriever = retriever or default_retriever(progress=progress)
    out: dict[str, Any] = {"seed": seed, "base": str(base), "teacher": str(teacher), "splits": {}}
    records: dict[str, Any] = {}
    for split in splits:
        cfg = control_config(seed, val_split=split)
        runs = {"base": validate_team(cfg, base, retriever=retriever, progress=progress),
                "teacher": validate_team(cfg, teacher, retriever=retriever, progress=progress),
                "base_with_teacher_searchers": validate_team(cfg, base, teacher, retriever=retriever,
                                                             progress=progress)}
        got = {name: figures(rows) for name, rows in runs.items()}
        got["lead"] = got["teacher"]["macro_avg@1"] - got["base"]["macro_avg@1"]
        got["searcher_lead"] = got["base_with_teacher_searchers"]["macro_avg@1"] - got["base"]["macro_avg@1"]
        out["splits"][split] = got
        records[split] = runs
    for name, path in (("base", base), ("teacher", teacher)):
        model, tokenizer = load_model(str(path))
        model.eval()
        skips = searcher_skip_probability(model, tokenizer, workflow="hierarchical", split="dev", per_dataset=20,
                                          retriever=retriever)
        out.setdefault("skip_probability", {})[name] = float(np.mean(skips))
    out["_records"] = records
    return out


def plant(out: str | Path, seeds: Sequence[int], *, progress: bool = True, **overrides: Any) -> dict[str, Any]:
    """For each seed: build (or find) its base and its Teacher, check it (:func:`check_teacher`)
    and write ``<out>/seed<S>/teacher/`` as a finished run of the ablation (the base's test
    validation as step 0, the Teacher's as the last); a seed with its ``run.json`` is read
    back, not redone. Returns the checks by seed."""
    from algos.mechanism import SKIP_FILE
    from algos.reproducible import environment, weight_hash
    from algos.trainer import validation_path

    out = Path(out)
    settings = teacher_settings(**overrides)
    checks: dict[str, Any] = {}
    for seed in seeds:
        dest = out / f"seed{seed}/{TEACHER}"
        if (dest / RUN_FILE).is_file():
            checks[str(seed)] = json.loads((dest / CHECK_FILE).read_text(encoding="utf-8"))
            _log(progress, f"[seed{seed}/teacher] planted before: {_summary(checks[str(seed)])}")
            continue
        started = time.perf_counter()
        base = micro_base(seed, progress=progress)
        teacher = build_teacher(base, seed=seed, progress=progress, **overrides)
        check = check_teacher(seed, base, teacher, splits=("test",), progress=progress)
        records = check.pop("_records")
        built = json.loads((teacher / "control_teacher.json").read_text(encoding="utf-8"))
        steps = int(built["steps"])
        if dest.exists():  # a seed stopped half-way: start it again
            shutil.rmtree(dest)
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(teacher, tmp)
        for step, rows in ((0, records["test"]["base"]), (steps, records["test"]["teacher"])):
            path = validation_path(tmp, step)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        test = check["splits"]["test"]
        (tmp / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": step, "stage": "teacher", "val/avg@1": value}) + "\n"
                    for step, value in ((0, test["base"]["macro_avg@1"]), (steps, test["teacher"]["macro_avg@1"]))),
            encoding="utf-8")
        (tmp / CHECK_FILE).write_text(json.dumps(check, indent=2) + "\n", encoding="utf-8")
        (tmp / SKIP_FILE).write_text(json.dumps(
            {"per_dataset": 20, "workflow": "hierarchical", "step0": check["skip_probability"]["base"],
             "final": check["skip_probability"]["teacher"], "final_step": steps}, indent=2) + "\n", encoding="utf-8")
        config = control_config(seed, model=str(base), stage="teacher", teacher=None, out_dir=str(dest))
        record = {"run": f"seed{seed}/{TEACHER}", "seed": seed, "variant": TEACHER, "stage": "teacher",
                  "searcher_signal": None, "teacher": None, "threads": built["key"]["threads"], "resumed": False,
                  "wall_s": round(time.perf_counter() - started, 1), "steps": steps,
                  "final_validation": str(validation_path(Path("."), steps)), "val_avg@1": test["teacher"]["macro_avg@1"],
                  "base_seed": seed, "base_weight_hash": weight_hash(base), "step0_validation": "computed",
                  "workflow": "hierarchical", "config": config.to_dict(), "environment": environment(),
                  PLANTED: {"how": "the base continued by SFT on the never-skipping scripted team's right episodes, "
                                   "loss on the roles " + ", ".join(settings["roles"] or ("all",)),
                            "teacher_model": str(teacher), "teacher_weight_hash": built["weight_hash"],
                            "settings": settings, "sft": {k: built[k] for k in ("episodes", "steps", "loss_first_100",
                                                                                 "loss_last_100", "seconds")}}}
        (tmp / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, dest)
        checks[str(seed)] = check
        _log(progress, f"[seed{seed}/teacher] planted: {_summary(check)}")
    return checks


KL_FILE = "searcher_kl.json"
"""A run's Searchers' KL to the seed's Teacher on held-out rollouts (:func:`run_searcher_kl`),
of its starting and final model; ``benchmarks.table2.table`` reads it beside the skip probability."""


def searcher_kl(student: str | Path, teacher: str | Path, *, per_dataset: int = 20, temperature: float = 0.7,
                seed: int = 0, retriever: Any = None, progress: bool = True) -> dict[str, Any]:
    """The student's Searchers' reverse KL to the Teacher on held-out rollouts
    (``docs/positive_control.md``, secondary endpoints): ``kl`` the mean over the Searchers'
    generated tokens of KL(student || Teacher) over the vocabulary at ``temperature``, ``k1``
    its one-sample estimate from the sampled tokens. Lower is closer to the Teacher."""
    import torch

    from agents.collect import collect
    from agents.hf import HFPolicy
    from agents.models import load_causal_lm
    from algos.engine.checkpoint import resolve_model_path
    from algos.recipes.micro.episodes import micro_env_fn, questions
    from envs.retrieval.factory import default_retriever

    student_model, tokenizer = load_causal_lm(resolve_model_path(str(student)))
    teacher_model, _ = load_causal_lm(resolve_model_path(str(teacher)))
    student_model.eval()
    teacher_model.eval()
    asked = questions("dev", per_dataset)
    retriever = retriever or default_retriever(progress=progress)
    sampler = HFPolicy(student_model, tokenizer, temperature=temperature, max_new_tokens=ENV["max_turn_tokens"],
                       seed=seed, batch_size=64)
    groups = collect(micro_env_fn(tokenizer, "hierarchical", retriever), sampler, asked, seed=seed,
                     progress="searcher KL rollouts" if progress else False)
    kl_sum, k1_sum, tokens, segments = 0.0, 0.0, 0, 0
    with torch.no_grad():
        for episode in (g[0] for g in groups):
            for seg in episode.segments_of(P.SEARCHER):
                mask = torch.tensor(seg.loss_mask[1:], dtype=torch.bool)
                if not mask.any():
                    continue
                ids = torch.tensor([seg.token_ids])
                logp_s = torch.log_softmax(student_model(ids).logits[0, :-1].float() / temperature, -1)[mask]
                logp_t = torch.log_softmax(teacher_model(ids).logits[0, :-1].float() / temperature, -1)[mask]
                taken = ids[0, 1:][mask]
                kl_sum += float((logp_s.exp() * (logp_s - logp_t)).sum())
                k1_sum += float((logp_s.gather(1, taken[:, None]) - logp_t.gather(1, taken[:, None])).sum())
                tokens += int(mask.sum())
                segments += 1
    return {"kl": kl_sum / max(1, tokens), "k1": k1_sum / max(1, tokens), "tokens": tokens,
            "segments": segments, "questions": len(asked), "temperature": temperature, "seed": seed}


def run_searcher_kl(out: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """:func:`searcher_kl` to its seed's planted Teacher of every finished Stage-II run under
    the ablation directory ``out``, of its starting model (measured once per seed) and its
    final checkpoint, into the run's :data:`KL_FILE` (a run that has it is read, not measured)."""
    from algos.engine.checkpoint import latest_checkpoint
    from envs.retrieval.factory import default_retriever

    out = Path(out)
    retriever = None
    cached: dict[tuple[str, str], dict[str, Any]] = {}
    found: dict[str, Any] = {}
    for record_path in sorted(out.glob("seed*/*/" + RUN_FILE)):
        run = record_path.parent
        if run.name == TEACHER:
            continue
        target = run / KL_FILE
        if target.is_file():
            found[str(run.relative_to(out))] = json.loads(target.read_text(encoding="utf-8"))
            continue
        final = latest_checkpoint(run)
        if final is None:
            continue
        record = json.loads(record_path.read_text(encoding="utf-8"))
        teacher = run.parent / TEACHER
        retriever = retriever or default_retriever(progress=progress)
        values = {}
        for name, model in (("step0", str(record["config"]["model"])), ("final", str(final))):
            if (model, str(teacher)) not in cached:
                cached[model, str(teacher)] = searcher_kl(model, teacher, seed=int(record["seed"]),
                                                          retriever=retriever, progress=progress)
            values[name] = cached[model, str(teacher)]
        row = {"teacher": str(teacher), "step0": values["step0"]["kl"], "final": values["final"]["kl"],
               "final_step": int(record["steps"]), "detail": values}
        target.write_text(json.dumps(row, indent=2) + "\n", encoding="utf-8")
        found[str(run.relative_to(out))] = row
        _log(progress, f"[{run.relative_to(out)}] Searchers' KL to the Teacher {row['step0']:.4f} -> {row['final']:.4f}")
    return found


def _summary(check: dict[str, Any]) -> str:
    parts = []
    for split, got in check["splits"].items():
        parts.append(f"{split}: base {100 * got['base']['macro_avg@1']:.2f}, Teacher "
                     f"{100 * got['teacher']['macro_avg@1']:.2f} ({100 * got['lead']:+.2f}), base with the "
                     f"Teacher's Searchers {100 * got['base_with_teacher_searchers']['macro_avg@1']:.2f} "
                     f"({100 * got['searcher_lead']:+.2f})")
    skip = check.get("skip_probability", {})
    return "; ".join(parts) + f"; skip probability {skip.get('base', float('nan')):.3f} -> {skip.get('teacher', float('nan')):.3f}"


def _log(show: bool, line: str) -> None:
    if show:
        print(line, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m algos.recipes.micro.control plant|check ...``."""
    from algos.reproducible import run_threads

    parser = argparse.ArgumentParser(prog="python -m algos.recipes.micro.control", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("plant", "check", "kl"),
                        help="plant: build, check and write each seed's Teacher into the ablation's directory; "
                             "check: build and measure only (--splits), printing JSON; kl: the Searchers' KL to "
                             "the Teacher of every finished Stage-II run under --out (searcher_kl.json)")
    parser.add_argument("--out", type=Path, help="plant: the ablation's directory")
    parser.add_argument("--seeds", default="0", help="comma list of seeds (default 0)")
    parser.add_argument("--roles", default=None, help="check: the Teacher's SFT roles, e.g. searcher or all")
    parser.add_argument("--design", choices=("teacher", "skipping"), default="teacher",
                        help="check: teacher (the micro base and a Teacher built from it, the pre-registered "
                             "design) or skipping (design C: the micro_search base as the Teacher of a base "
                             "made from it whose Searchers skip, build_skipping_base)")
    parser.add_argument("--skip", type=float, default=0.7, help="check --design skipping: the base's skip share")
    parser.add_argument("--splits", default="dev",
                        help="check: comma list of the splits measured (default dev: choose on dev, never on test)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    overrides = {} if args.roles is None else {"roles": None if args.roles == "all" else tuple(args.roles.split(","))}
    progress = not args.no_progress
    if args.command in ("kl", "plant") and args.out is None:
        parser.error(f"{args.command} needs --out (the ablation's directory)")
    with run_threads(args.threads):
        if args.command == "kl":
            run_searcher_kl(args.out, progress=progress)
            return 0
        if args.command == "plant":
            from algos.engine.runlock import run_lock

            with run_lock(args.out, log=lambda line: _log(True, line)):  # the ablation holds the same lock
                plant(args.out, seeds, progress=progress, **overrides)
            return 0
        for seed in seeds:
            if args.design == "skipping":
                from algos.recipes.micro.build import build_searching_base

                teacher = build_searching_base(seed=seed, progress=progress)
                base = build_skipping_base(seed, skip_search=args.skip, progress=progress)
            else:
                base = micro_base(seed, progress=progress)
                teacher = build_teacher(base, seed=seed, progress=progress, **overrides)
            check = check_teacher(seed, base, teacher, splits=tuple(args.splits.split(",")),
                                  progress=progress)
            check.pop("_records")
            print(json.dumps({"design": args.design, "settings": teacher_settings(**overrides), **check}), flush=True)
            _log(True, f"[seed{seed}] {_summary(check)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
