"""Checkpoints that resume to the same continuation: model and tokenizer
(``save_pretrained``), optimizer, RNG states, step and config. At most ``keep`` are kept
(PITFALLS 10); ``latest`` names the newest complete one. :func:`load_model` loads a model by
name, path or run directory (its latest checkpoint).

Safe to load: ``trainer_state.pt`` holds only tensors, numbers, strings, lists, tuples and
dicts, and is read with ``torch.load(weights_only=True)``, which refuses anything else (a
pickled object could run code on ``--resume``). A model with a non-finite weight is never
written.

Checked when chosen: ``--resume`` takes the newest checkpoint that :func:`verify_checkpoint`
passes (every weight file's header readable, every tensor the model's config asks for present,
every weight finite, ``trainer_state.pt`` loadable with ``weights_only=True``); a damaged newer
one is skipped with a logged line naming its file and why (:func:`usable_checkpoint`), and a run
with no usable checkpoint is refused in one line naming the file (:class:`CheckpointError`)."""

from __future__ import annotations

import json
import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agents.models import ModelFileError
from envs.quiet import quiet_progress


class CheckpointError(ModelFileError):
    """A checkpoint that cannot be resumed from: ``str(error)`` is one line naming the file and
    what is wrong with it (a ValueError, like every bad-input error of the loaders)."""


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


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def usable_checkpoint(out_dir: str | Path, log: Callable[[str], None] = _stderr) -> Path | None:
    """The newest checkpoint of a run directory that :func:`verify_checkpoint` passes, or None
    when the run has none at all. A damaged newer one is skipped with one ``log`` line naming
    the bad file and why; when every one is damaged, raises :class:`CheckpointError` naming
    the newest one's bad file (nothing is deleted: the files stay for a look)."""
    candidates = sorted((p for p in checkpoint_root(out_dir).glob("step_*") if p.is_dir()), reverse=True)
    first_error: CheckpointError | None = None
    for path in candidates:
        try:
            verify_checkpoint(path)
        except CheckpointError as err:
            first_error = first_error or err
            log(f"--resume: skipping checkpoint {path.name}: {err}")
            continue
        if first_error is not None:
            log(f"--resume: falling back to the previous complete checkpoint {path}")
        return path
    if first_error is not None:
        raise CheckpointError(f"--resume: no usable checkpoint under {checkpoint_root(out_dir)}; "
                              f"the newest: {first_error}")
    return None


def verify_checkpoint(path: str | Path) -> None:
    """Raise :class:`CheckpointError` naming the file unless the checkpoint at ``path`` holds
    a whole model (:func:`verify_weights`) and a ``trainer_state.pt`` that loads with
    ``weights_only=True`` into the ``{"optimizer", "state"}`` dict :func:`save_checkpoint` writes."""
    verify_weights(path)
    _read_trainer_state(Path(path) / "trainer_state.pt")


def verify_weights(path: str | Path) -> None:
    """Raise :class:`CheckpointError` naming the file unless the model saved at ``path``
    (``save_pretrained``: ``model.safetensors`` or an index with its shards) has readable
    safetensors headers, every tensor its ``config.json``'s model has (tied weights count as
    one: ``save_pretrained`` writes a tied pair once) and only finite values. Reads every
    weight once, one tensor at a time."""
    from safetensors import SafetensorError, safe_open

    root = Path(path)
    files = _weight_files(root)
    present: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(str(file), "pt") as reader:
                for name in reader.keys():
                    present[name] = file
                    tensor = reader.get_tensor(name)
                    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                        raise CheckpointError(f"{file}: tensor {name!r} holds non-finite values (NaN or inf)")
        except (SafetensorError, OSError, RuntimeError) as err:
            raise CheckpointError(f"{file}: unreadable safetensors file ({_first_line(err)})") from None
    for group in _expected_tensors(root):
        if not any(name in present for name in group):
            file = files[0] if len(files) == 1 else root / "model.safetensors.index.json"
            raise CheckpointError(f"{file}: tensor {group[0]!r} is missing (the model in {root / 'config.json'} "
                                  "has it; loading would initialise it at random)")


def _weight_files(root: Path) -> list[Path]:
    single, index = root / "model.safetensors", root / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{index}: unreadable shard index ({_first_line(err)})") from None
        missing = [s for s in shards if not (root / s).exists()]
        if missing:
            raise CheckpointError(f"{root / missing[0]}: shard named in {index.name} does not exist")
        return [root / s for s in shards]
    raise CheckpointError(f"{single}: does not exist (no weights in {root})")


def _expected_tensors(root: Path) -> list[tuple[str, ...]]:
    """Every tensor the model of ``root/config.json`` saves, as groups of names that share one
    tensor (tied weights: any one name of a group in the file is enough), built on the meta
    device (no memory, no init). Empty when transformers cannot build it (then the loading
    info of ``from_pretrained`` is the check, :func:`agents.models.load_causal_lm`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(root)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 (an architecture this transformers does not know: checked at load)
        return []
    by_tensor: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), []).append(name)
    params = {name for names in by_tensor.values() for name in names}
    buffers = [(name,) for name in model.state_dict() if name not in params]  # persistent buffers
    return [tuple(names) for names in by_tensor.values()] + buffers


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _read_trainer_state(file: Path) -> dict[str, Any]:
    """``trainer_state.pt`` read with ``weights_only=True``; CheckpointError naming it otherwise."""
    if not file.exists():
        raise CheckpointError(f"{file}: does not exist (an incomplete checkpoint)")
    try:
        blob = torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        raise CheckpointError(f"{file}: refusing to load a checkpoint that holds more than tensors and plain "
                              f"data (torch.load weights_only=True said: {_first_line(err)})") from None
    except Exception as err:  # noqa: BLE001 (cut or random bytes: zip, EOF, unpickler errors of any kind)
        raise CheckpointError(f"{file}: unreadable ({type(err).__name__}: {_first_line(err)})") from None
    if not isinstance(blob, dict) or not {"optimizer", "state"} <= blob.keys():
        raise CheckpointError(f"{file}: not a trainer state (expected a dict with 'optimizer' and 'state')")
    return blob


def resolve_model_path(name: str) -> str:
    """A run directory stands for its latest checkpoint; anything else is returned as is."""
    path = Path(name)
    if path.is_dir() and not (path / "config.json").exists():
        latest = latest_checkpoint(path)
        if latest is not None:
            return str(latest)
    return name


def load_model(name: str, device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
    """(model, tokenizer) of ``name``: a model directory, a run directory (its latest
    checkpoint, :func:`resolve_model_path`), ``smollm2`` or a hub id. The one way a run loads
    a model (the policy's starting point, the Teacher, the Prompted Critic's base), so the
    trainer and the Teacher load alike. A preset's own model name (``algos.presets.RECIPES``)
    is turned into a directory by the command line before the Trainer starts
    (``algos.presets.prepare_model``)."""
    from agents.models import load_causal_lm

    return load_causal_lm(resolve_model_path(name), dtype=dtype, device=device)


def load_checkpoint(path: str | Path, optimizer: Any | None = None) -> dict[str, Any]:
    """The trainer state saved at ``path``; loads the optimizer state too when given.

    Raises :class:`CheckpointError` (a ValueError) naming the file when it is cut, random or
    holds anything but tensors and plain data (a pickled object is never unpickled, so never run)."""
    blob = _read_trainer_state(Path(path) / "trainer_state.pt")
    if optimizer is not None:
        optimizer.load_state_dict(blob["optimizer"])
    return blob["state"]
