"""Checkpoints that resume to the same continuation: model and tokenizer
(``save_pretrained``), optimizer, RNG states, step and config. At most ``keep`` are kept
(PITFALLS 10); ``latest`` names the newest complete one.

Safe to load: ``trainer_state.pt`` holds only tensors, numbers, strings, lists, tuples and
dicts, and is read with ``torch.load(weights_only=True)``, which refuses anything else (a
pickled object could run code on ``--resume``). A model with a non-finite weight is never
written."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch

from envs.quiet import quiet_progress


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def save_checkpoint(out_dir: str | Path, step: int, model: Any, tokenizer: Any, optimizer: Any,
                    state: dict[str, Any], config: dict[str, Any], keep: int = 2) -> Path:
    """Write ``checkpoints/step_NNNNNN`` completely, then point ``latest`` at it.

    ``state`` may hold tensors, numbers, strings, None, and lists, tuples and dicts of them
    (what :func:`load_checkpoint` accepts back). Raises ValueError, writing nothing, when a
    weight of ``model`` is NaN or infinite."""
    bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise ValueError(f"refusing to write checkpoint step {step} under {checkpoint_root(out_dir)}: "
                         f"non-finite weights in {len(bad)} tensors, first {bad[0]!r}")
    root = checkpoint_root(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    with quiet_progress():
        model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "state": state}, tmp / "trainer_state.pt")
    (tmp / "train_config.json").write_text(json.dumps(config, indent=2, default=list))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (root / "latest").write_text(final.name)
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None."""
    root = checkpoint_root(out_dir)
    pointer = root / "latest"
    if pointer.exists():
        path = root / pointer.read_text().strip()
        if (path / "trainer_state.pt").exists():
            return path
    done = sorted(p for p in root.glob("step_*") if (p / "trainer_state.pt").exists())
    return done[-1] if done else None


def resolve_model_path(name: str) -> str:
    """A run directory stands for its latest checkpoint; anything else is returned as is."""
    path = Path(name)
    if path.is_dir() and not (path / "config.json").exists():
        latest = latest_checkpoint(path)
        if latest is not None:
            return str(latest)
    return name


def load_checkpoint(path: str | Path, optimizer: Any | None = None) -> dict[str, Any]:
    """The trainer state saved at ``path``; loads the optimizer state too when given.

    Raises ValueError naming the file when it holds anything but tensors and plain data
    (a pickled object is never unpickled, so never run)."""
    file = Path(path) / "trainer_state.pt"
    try:
        blob = torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{file}: refusing to load a checkpoint that holds more than tensors and plain "
                         f"data (torch.load weights_only=True said: {first})") from None
    if optimizer is not None:
        optimizer.load_state_dict(blob["optimizer"])
    return blob["state"]
