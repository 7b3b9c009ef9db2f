"""Checks that a training run can start, made before anything loads or builds.

A bad path, a run folder in the wrong state, a retrieval server that does not answer or
an optional engine (Ray, vLLM) that a setting needs but is not installed would otherwise
be found only after minutes of work (the micro preset builds its base model first; Stage
II starts after Stage I). Each check raises :class:`PreflightError` with one line that
names the setting and its value. The value checks that need neither the filesystem nor
the network live in ``TrainConfig.__post_init__``.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from algos.config import TrainConfig
from algos.engine.checkpoint import latest_checkpoint, resolve_model_path

RETRIEVER_TIMEOUT_S = 3.0
"""How long the retriever probe waits for an answer: a live server answers one query in
well under a second; a dead host should not hold the command line for long. A deadline for
the whole exchange (``envs.http.post_json``), so a server that trickles bytes is cut off too."""


class PreflightError(SystemExit):
    """A run that cannot start: ``str(error)`` is the one-line reason.

    A ``SystemExit``, so that a script which does not catch it stops with that line and
    no traceback; ``python -m algos`` catches it, prints it and exits with status 2."""


def check_train_run(configs: Mapping[str, TrainConfig], *, resume: bool,
                    retriever_timeout: float = RETRIEVER_TIMEOUT_S) -> None:
    """Refuse a ``train`` command whose stages (``{"teacher": cfg, "team": cfg}``, in run
    order) cannot run (every check below)."""
    out_dirs = [Path(cfg.out_dir) for cfg in configs.values()]
    if resume and not any(latest_checkpoint(d) is not None for d in out_dirs):
        where = ", ".join(str(d / "checkpoints") for d in out_dirs)
        raise PreflightError(f"--resume: no run to continue (no checkpoint in {where}); "
                             "drop --resume to start a new run")
    if not resume:
        for d in out_dirs:
            if (d / "metrics.jsonl").exists():
                raise PreflightError(f"--out: {d} already holds a run (metrics.jsonl); pass --resume to "
                                     "continue it, or give another --out")
    for cfg in configs.values():
        check_extras(cfg)
        check_env_shape(cfg)
        check_memory(cfg)
    check_disk(configs, resume=resume)
    trained_here = {Path(cfg.out_dir) for stage, cfg in configs.items() if stage == "teacher"}
    probed: set[str] = set()
    for cfg in configs.values():
        if cfg.teacher not in (None, "base") and Path(cfg.teacher) not in trained_here:
            check_teacher(cfg.teacher)
        check_questions(cfg)
        if cfg.retriever not in probed:
            check_retriever(cfg.retriever, timeout=retriever_timeout)
            probed.add(cfg.retriever)


def is_installed(module: str) -> bool:
    """Whether the top-level package ``module`` can be imported, found without importing it
    (``importlib.util.find_spec``: importing Ray or vLLM takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # already imported, by something that left it no __spec__
        return module in sys.modules


def check_extras(cfg: TrainConfig) -> None:
    """The optional engine a setting asks for (Ray, vLLM) must be installed: refused with the
    pip install that brings it."""
    if cfg.rollout_workers and not is_installed("ray"):
        from agents.ray_rollout import DISTRIBUTED_EXTRA

        raise PreflightError(f"rollout_workers={cfg.rollout_workers} needs ray, which is not installed: "
                             f"{DISTRIBUTED_EXTRA}")
    if cfg.rollout_backend == "vllm" and not is_installed("vllm"):
        from agents.vllm_policy import VLLM_EXTRA

        raise PreflightError(f"rollout_backend=vllm needs vllm, which is not installed: {VLLM_EXTRA}")


def check_memory(cfg: TrainConfig) -> None:
    """On CUDA, the run's memory plan (``python -m algos plan``) must fit the GPU this process
    sees, on ``WORLD_SIZE`` GPUs. Skipped off CUDA and for an architecture unknown here."""
    import os

    if not str(cfg.device).startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        return
    from algos.commands.plan import UnknownArch, arch_of, memory_plan

    try:
        arch = arch_of(cfg.model)
    except UnknownArch:
        return
    except ValueError as err:
        raise PreflightError(f"model={cfg.model!r}: {' '.join(str(err).split())}") from None
    index = int(os.environ.get("LOCAL_RANK", 0)) if cfg.device == "cuda" else torch.device(cfg.device).index or 0
    gib = torch.cuda.get_device_properties(index).total_memory / 2**30
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        plan = memory_plan(cfg, world, gib, arch=arch)
    except ValueError as err:
        raise PreflightError(f"{cfg.stage} stage on {cfg.device}: {' '.join(str(err).split())}") from None
    if not plan.fits:
        raise PreflightError(f"{cfg.stage} stage on {cfg.device} ({gib:.0f} GiB): {plan.refusal()} "
                             "(python -m algos plan shows every line)")


def _free_disk(path: Path) -> int:
    """Free bytes on the filesystem ``path`` will be written to (its nearest existing folder)."""
    import shutil

    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk(configs: Mapping[str, TrainConfig], *, resume: bool, free: Any = _free_disk) -> None:
    """The checkpoints the stages write (``keep_checkpoints`` each, one more while the last
    stage writes; a resumed run: one more) must fit the disk under ``--out``. Skipped for a
    model whose shape is not known without building it (a recipe's base: megabytes)."""
    from algos.commands.plan import UnknownArch, arch_of

    need = 0
    stages = list(configs.values())
    for i, cfg in enumerate(stages):
        try:
            arch = arch_of(cfg.model, build=False)
        except UnknownArch:
            return
        except ValueError as err:
            raise PreflightError(f"model={cfg.model!r}: {' '.join(str(err).split())}") from None
        ckpt = 12 * arch.params
        last = i == len(stages) - 1
        if not resume:  # each stage keeps its checkpoints; the last one writes one more before pruning
            need += cfg.keep_checkpoints * ckpt
        if last:
            need += ckpt
    if not stages:
        return
    out = Path(stages[-1].out_dir)
    have = free(out)
    if need > have:
        raise PreflightError(f"--out {out}: the checkpoints need up to {need / 2**30:.1f} GiB of disk, "
                             f"{have / 2**30:.1f} GiB free there (lower keep_checkpoints, or give another --out)")


def check_env_shape(cfg: TrainConfig) -> None:
    """The env's budgets must hold each role's real prompt and a whole turn
    (``envs.team.check_room``); skipped when the tokenizer is not on this machine (a hub id)."""
    from algos.commands.presets import model_tokenizer
    from envs.chat import chat_format
    from envs.team import TeamConfig, check_room

    tokenizer = model_tokenizer(cfg.model)
    if tokenizer is None:
        return
    fields = set(TeamConfig.keywords()) - {"workflow", "rewards"}
    shape = {k: v for k, v in cfg.env_shape().items() if k in fields}
    try:
        check_room(TeamConfig(workflow=cfg.workflow, **shape), chat_format(tokenizer))
    except ValueError as err:
        raise PreflightError(f"{cfg.stage} stage: {err}") from None


def check_questions(cfg: TrainConfig) -> None:
    """Every training and validation split the run reads must load and hold questions (the
    Trainer reads them only after its model is built); ``load_qa``'s message names the line."""
    from envs.data import load_qa

    if cfg.data != "synthetic" and not Path(cfg.data).is_dir():
        raise PreflightError(f"data={cfg.data!r}: no such directory (give 'synthetic' or a "
                             "FlashRAG-layout folder)")
    for names, split in ((cfg.train_datasets, cfg.train_split), (cfg.val_datasets, cfg.val_split)):
        for name in names:
            try:  # the whole file, as the Trainer reads it: a bad row past a limit fails it too
                questions = load_qa(name, split, root=cfg.data)
            except (FileNotFoundError, ValueError) as err:
                raise PreflightError(f"data={cfg.data!r}: {' '.join(str(err).split())}") from None
            if not questions:
                raise PreflightError(f"data={cfg.data!r}: {name}/{split} holds no questions")


def check_teacher(teacher: str) -> None:
    """``teacher`` must be a Stage-I run folder with a checkpoint, or a saved model folder."""
    path = Path(teacher)
    if not path.exists():
        raise PreflightError(f"teacher={teacher!r}: no such file or directory (train it first with --stage "
                             "teacher, or pass --teacher base)")
    if path.is_dir() and not (Path(resolve_model_path(teacher)) / "config.json").exists():
        raise PreflightError(f"teacher={teacher!r}: holds neither a checkpoint nor a saved model "
                             "(config.json)")


def check_retriever(spec: str, *, timeout: float = RETRIEVER_TIMEOUT_S) -> None:
    """``default`` passes; a corpus path must exist; an http(s) URL must answer one query
    in Search-R1's protocol within ``timeout`` seconds (no retries)."""
    from envs.retrieval.factory import make_retriever, spec_kind

    try:
        kind = spec_kind(spec)
    except ValueError as err:
        raise PreflightError(f"retriever={spec!r}: {err}") from None
    if kind == "url":
        from envs.retrieval import RetrievalError

        try:
            make_retriever(spec, timeout=timeout, retries=0).search(["preflight"], top_k=1)
        except (RetrievalError, ValueError) as err:
            reason = " ".join(str(err).split())  # one line, whatever the server said
            raise PreflightError(f"retriever={spec!r} does not answer: {reason}") from None
    elif kind == "corpus" and not Path(spec).is_file():
        raise PreflightError(f"retriever={spec!r}: no such corpus file (give 'default', a corpus JSONL "
                             "or an http(s) URL)")


def check_sft(args: Any) -> None:
    """Refuse ``python -m algos sft`` settings that would fail or train nonsense before the SFT
    loads a model or builds a base. ``args``: ``algos.commands.sft``'s parsed namespace."""
    def bad(option: str, value: Any, why: str) -> PreflightError:
        return PreflightError(f"--{option.replace('_', '-')}={value!r}: {why}")

    for name in ("lr", "context_weight", "skip_search"):
        value = getattr(args, name, None)
        if value is not None and not math.isfinite(value):
            raise bad(name, value, "must be a finite number")
    if args.lr is not None and not args.lr > 0:
        raise bad("lr", args.lr, "must be > 0")
    if args.context_weight is not None and args.context_weight < 0:
        raise bad("context_weight", args.context_weight, "must be >= 0")
    if args.skip_search is not None and not 0 <= args.skip_search <= 1:
        raise bad("skip_search", args.skip_search, "must be in [0, 1]")
    for name in ("epochs", "batch_tokens", "max_len"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise bad(name, value, "must be >= 1")
    if args.preset is None and args.episodes is not None and not Path(args.episodes).is_file():
        raise bad("episodes", str(args.episodes), "no such file")
