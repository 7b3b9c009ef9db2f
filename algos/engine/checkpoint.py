"""Checkpoints that resume to the same continuation: model and tokenizer
(``save_pretrained``), optimizer, RNG states, step and config. At most ``keep`` are kept
(PITFALLS 10); ``latest`` names the newest complete one. :func:`load_model` loads a model by
name, path or run directory (its latest checkpoint).

Safe to load: ``trainer_state.pt`` holds plain data and tensors only, read with
``torch.load(weights_only=True)`` (a pickled object could run code on ``--resume``); a model
with a non-finite weight is never written. ``--resume`` takes the newest checkpoint verified
whole (:func:`usable_checkpoint`), and every name read from a file goes through
:func:`envs.paths.contained`: ``docs/reliability.md``, "Round 4", lists what each refuses."""

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
from envs.paths import contained, read_capped
from envs.quiet import quiet_progress
from envs.terminal import first_line


class CheckpointError(ModelFileError):
    """A checkpoint that cannot be resumed from: ``str(error)`` is one line naming the file and
    what is wrong with it (a ValueError, like every bad-input error of the loaders)."""


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def save_checkpoint(out_dir: str | Path, step: int, model: Any, tokenizer: Any, optimizer: Any,
                    state: dict[str, Any], config: dict[str, Any], keep: int = 2) -> Path:
    """Write ``checkpoints/step_NNNNNN`` completely, then point ``latest`` at it. ``state``:
    plain data and tensors only (module docstring). A non-finite weight is a ValueError."""
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
    for old in _step_dirs(root)[:-max(keep, 1)]:  # the newest `keep`, by step number
        shutil.rmtree(old, ignore_errors=True)
    return final


POINTER_BYTES = 4096
"""The most of ``checkpoints/latest`` read: it holds one folder name."""


def _step_dirs(root: Path) -> list[Path]:
    """The ``step_N`` folders under the checkpoint root ``root``, oldest first by step number;
    any other name, or one that leads outside ``root``, is left out."""
    found = []
    for path in root.glob("step_*"):
        number = path.name[len("step_"):]
        if not number.isdigit() or not number.isascii():
            continue
        try:
            contained(root, path.name)
        except ValueError:
            continue
        if path.is_dir():
            found.append((int(number), path.name, path))
    return [path for *_, path in sorted(found)]


def _pointed(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` names, or None without a pointer; :class:`CheckpointError`
    naming the pointer when it leads outside ``root`` or is not one line of text."""
    pointer = root / "latest"
    if not pointer.exists() and not pointer.is_symlink():
        return None
    try:
        contained(root, pointer.name)  # the pointer file itself may be a link out
        with open(pointer, "rb") as f:
            raw = f.read(POINTER_BYTES + 1)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    except OSError as err:
        raise CheckpointError(f"{pointer}: unreadable checkpoint pointer ({err.strerror or type(err).__name__})") from None
    if len(raw) > POINTER_BYTES:
        raise CheckpointError(f"{pointer}: not a checkpoint pointer (more than {POINTER_BYTES} bytes)")
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointError(f"{pointer}: not a checkpoint pointer (not UTF-8 text)") from None
    try:
        return contained(root, name, source=pointer)
    except ValueError as err:
        raise CheckpointError(str(err)) from None


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None: the one ``latest`` names when
    it is complete (:func:`_pointed`), else the complete ``step_N`` with the largest N."""
    root = checkpoint_root(out_dir)
    path = _pointed(root)
    if path is not None and (path / "trainer_state.pt").exists():
        return path
    done = [p for p in _step_dirs(root) if (p / "trainer_state.pt").exists()]
    return done[-1] if done else None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def usable_checkpoint(out_dir: str | Path, log: Callable[[str], None] = _stderr) -> Path | None:
    """The newest checkpoint of a run directory that :func:`verify_checkpoint` passes (a damaged
    newer one skipped with a ``log`` line), None when there is none; all damaged:
    :class:`CheckpointError` naming the newest one's bad file (nothing is deleted)."""
    candidates = _step_dirs(checkpoint_root(out_dir))[::-1]
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
    """Raise :class:`CheckpointError` naming the file unless the checkpoint at ``path`` is whole:
    weights, tokenizer, trainer state and training config."""
    root = Path(path)
    config = verify_weights(root)
    verify_tokenizer(root, config)
    _read_trainer_state(root / "trainer_state.pt")
    _read_json_object(root / "train_config.json", "training config")


MODEL_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "head_dim", "max_position_embeddings")
"""The sizes of ``config.json`` that must be positive integers when present."""
JSON_BYTES = 64 << 20
"""The most of a checkpoint's JSON file (config, tokenizer, index) read."""
TOKENIZER_JSON = ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.json")
"""The tokenizer files that are JSON: each one present must parse to an object."""


def verify_weights(path: str | Path) -> dict[str, Any]:
    """Raise :class:`CheckpointError` naming the file unless the model saved at ``path`` is
    whole: a sane ``config.json``, readable shards inside ``path`` holding what the index
    places there, every tensor the config's model has (a tied pair once) with its shape and no
    other, only finite values (one tensor at a time). Returns the parsed config."""
    from safetensors import SafetensorError, safe_open

    root = Path(path)
    config = _read_config(root)
    files, weight_map = _weight_files(root)
    present: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for file in files:
        try:
            with safe_open(str(file), "pt") as reader:
                for name in reader.keys():
                    tensor = reader.get_tensor(name)
                    present[name] = (file, tuple(tensor.shape))
                    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                        raise CheckpointError(f"{file}: tensor {name!r} holds non-finite values (NaN or inf)")
        except (SafetensorError, OSError, RuntimeError) as err:
            raise CheckpointError(f"{file}: unreadable safetensors file ({first_line(err)})") from None
    for name, shard in weight_map.items():  # a loader trusts the index: each tensor where it says
        if name not in present or present[name][0] != root / shard:
            raise CheckpointError(f"{root / shard}: tensor {name!r} that model.safetensors.index.json "
                                  "places there is not in it")
    layers = config.get("num_hidden_layers")
    if isinstance(layers, int) and layers > len(present):  # each layer saves a tensor at least
        raise CheckpointError(f"{root / 'config.json'}: num_hidden_layers {layers} but the weights hold only "
                              f"{len(present)} tensors (the config names another model)")
    expected, ignored = _expected_tensors(root)
    where = files[0] if len(files) == 1 else root / "model.safetensors.index.json"
    for group, shape in expected:
        names = [name for name in group if name in present]
        if not names:
            raise CheckpointError(f"{where}: tensor {group[0]!r} is missing (the model in {root / 'config.json'} "
                                  "has it; loading would initialise it at random)")
        for name in names:
            file, saved = present[name]
            if saved != shape:
                raise CheckpointError(f"{file}: tensor {name!r} has shape {list(saved)}, but the model in "
                                      f"{root / 'config.json'} has {list(shape)} (the config names another shape)")
    if expected:
        known = {name for group, _ in expected for name in group}
        extra = sorted(name for name in present if name not in known and not any(p.search(name) for p in ignored))
        if extra:
            raise CheckpointError(f"{present[extra[0]][0]}: tensor {extra[0]!r} is not in the model of "
                                  f"{root / 'config.json'} ({len(extra)} such; the config names another model)")
    return config


def verify_tokenizer(path: str | Path, config: dict[str, Any] | None = None) -> None:
    """Raise :class:`CheckpointError` naming the file unless the tokenizer saved at ``path`` is
    whole: its JSON files parse, and ``tokenizer.json`` loads with ids inside ``vocab_size``."""
    root = Path(path)
    if not (root / "tokenizer_config.json").exists():
        raise CheckpointError(f"{root / 'tokenizer_config.json'}: does not exist (no tokenizer saved in {root})")
    parsed = {name: _read_json_object(root / name, "tokenizer file") for name in TOKENIZER_JSON
              if (root / name).exists()}
    if "tokenizer.json" not in parsed:
        return
    file = root / "tokenizer.json"
    data = parsed["tokenizer.json"]
    try:
        from tokenizers import Tokenizer

        Tokenizer.from_str(json.dumps(data))
    except Exception as err:  # noqa: BLE001 (its Rust parser's errors have no common class)
        raise CheckpointError(f"{file}: not a tokenizer ({first_line(err)})") from None
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    tokens = model.get("vocab")
    ids = [v for v in tokens.values() if isinstance(v, int)] if isinstance(tokens, dict) else \
        list(range(len(tokens))) if isinstance(tokens, list) else []
    added = data.get("added_tokens")
    if isinstance(added, list):
        ids += [t["id"] for t in added if isinstance(t, dict) and isinstance(t.get("id"), int)]
    vocab = (config or {}).get("vocab_size")
    if ids and isinstance(vocab, int) and max(ids) >= vocab:
        raise CheckpointError(f"{file}: token id {max(ids)} is outside the model's vocabulary of {vocab} "
                              f"({root / 'config.json'})")


def _read_json_object(file: Path, what: str) -> dict[str, Any]:
    """``file`` parsed as a JSON object of at most :data:`JSON_BYTES`; CheckpointError naming it."""
    try:
        raw = read_capped(file, JSON_BYTES)
    except OSError as err:
        reason = "does not exist" if isinstance(err, FileNotFoundError) else f"unreadable ({err.strerror})"
        raise CheckpointError(f"{file}: {reason} (the checkpoint's {what})") from None
    except ValueError:
        raise CheckpointError(f"{file}: larger than {JSON_BYTES >> 20} MiB (not a {what})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{file}: not JSON, cut or damaged (a {what}: {first_line(err)})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: not a JSON object (a {what})")
    return data


def _read_config(root: Path) -> dict[str, Any]:
    """``root/config.json`` parsed, its sizes positive integers and consistent."""
    file = root / "config.json"
    config = _read_json_object(file, "model config")
    for key in MODEL_SIZES:
        value = config.get(key)
        if value is None and key in ("head_dim", "num_key_value_heads", "max_position_embeddings"):
            continue
        if key in config and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise CheckpointError(f"{file}: {key} must be a positive integer, got {value!r:.40}")
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    kv = config.get("num_key_value_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and config.get("head_dim") is None and hidden % heads:
        raise CheckpointError(f"{file}: hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise CheckpointError(f"{file}: num_attention_heads {heads} is not divisible by num_key_value_heads {kv}")
    return config


def _weight_files(root: Path) -> tuple[list[Path], dict[str, str]]:
    """The safetensors files of ``root`` and its index's weight_map (one file: none)."""
    single, index = root / "model.safetensors", root / "model.safetensors.index.json"
    if single.exists():
        return [single], {}
    if index.exists():
        data = _read_json_object(index, "shard index")
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: unreadable shard index (no weight_map of tensor names to shards)")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise CheckpointError(f"{index}: unreadable shard index (a weight_map entry is not a name)")
        try:
            files = [contained(root, shard, source=index) for shard in sorted(set(weight_map.values()))]
        except ValueError as err:
            raise CheckpointError(str(err)) from None
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{missing[0]}: shard named in {index.name} does not exist")
        return files, weight_map
    raise CheckpointError(f"{single}: does not exist (no weights in {root})")


def _expected_tensors(root: Path) -> tuple[list[tuple[tuple[str, ...], tuple[int, ...]]], list[Any]]:
    """Every tensor the model of ``root/config.json`` saves, as (tied names, shape), and the
    patterns of names its class ignores at load, built on the meta device; empty for a
    ``model_type`` transformers does not know (then ``load_causal_lm`` checks at load)."""
    import re

    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config = AutoConfig.from_pretrained(root)
    except Exception:  # noqa: BLE001 (an architecture this transformers does not know: checked at load)
        return [], []
    if getattr(config, "model_type", None) not in CONFIG_MAPPING:
        return [], []
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except ValueError as err:
        if "Unrecognized configuration class" in str(err):  # not a causal LM this transformers builds
            return [], []
        raise CheckpointError(f"{root / 'config.json'}: cannot build the model it describes ({first_line(err)})") from None
    except Exception as err:  # noqa: BLE001 (sizes that contradict each other: any error of the model's init)
        raise CheckpointError(f"{root / 'config.json'}: cannot build the model it describes "
                              f"({type(err).__name__}: {first_line(err)})") from None
    by_tensor: dict[int, list[str]] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), []).append(name)
        shapes[id(param)] = tuple(param.shape)
    params = {name for names in by_tensor.values() for name in names}
    buffers = [((name,), tuple(t.shape)) for name, t in model.state_dict().items() if name not in params]
    ignored = [re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])]
    return [(tuple(names), shapes[key]) for key, names in by_tensor.items()] + buffers, ignored


def _read_trainer_state(file: Path) -> dict[str, Any]:
    """``trainer_state.pt`` read with ``weights_only=True``; CheckpointError naming it otherwise."""
    if not file.exists():
        raise CheckpointError(f"{file}: does not exist (an incomplete checkpoint)")
    try:
        blob = torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        raise CheckpointError(f"{file}: refusing to load a checkpoint that holds more than tensors and plain "
                              f"data (torch.load weights_only=True said: {first_line(err)})") from None
    except Exception as err:  # noqa: BLE001 (cut or random bytes: zip, EOF, unpickler errors of any kind)
        raise CheckpointError(f"{file}: unreadable ({type(err).__name__}: {first_line(err)})") from None
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
    checkpoint), ``smollm2`` or a hub id; the one way a run loads a model (policy, Teacher,
    Critic). A recipe's model name is made a directory by the command line first."""
    from agents.models import load_causal_lm

    return load_causal_lm(resolve_model_path(name), dtype=dtype, device=device)


def load_checkpoint(path: str | Path, optimizer: Any | None = None) -> dict[str, Any]:
    """The trainer state saved at ``path``; loads the optimizer state too when given
    (:class:`CheckpointError` naming the file when it is cut, random or not plain data)."""
    blob = _read_trainer_state(Path(path) / "trainer_state.pt")
    if optimizer is not None:
        optimizer.load_state_dict(blob["optimizer"])
    return blob["state"]
