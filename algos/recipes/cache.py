"""Where a recipe caches the base it builds: one folder per build setting."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from envs.paths import cache_dir


def build_dir(prefix: str, settings: dict[str, Any]) -> Path:
    """``<cache>/models/<prefix>-<key>``, the key the first 12 hex digits of the SHA-256 of
    ``settings`` as sorted JSON: a change of any setting is another base."""
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir("models") / f"{prefix}-{key}"


def cached_base(out_dir: str | Path | None, prefix: str, settings: dict[str, Any], record: str, *,
                build: bool, what: str) -> tuple[Path, bool]:
    """(``out_dir`` or :func:`build_dir`'s, whether a base is there); none and not ``build``:
    FileNotFoundError."""
    folder = build_dir(prefix, settings) if out_dir is None else Path(out_dir)
    found = (folder / record).exists() and (folder / "config.json").exists()
    if not found and not build:
        raise FileNotFoundError(f"no {what} built at {folder} for these settings")
    return folder, found


def save_base(model: Any, tokenizer: Any, records: dict[str, Any], target: Path) -> None:
    """Model, tokenizer and ``records`` into ``target`` at once (a cache entry is replaced)."""
    from algos.recipes.micro.tokenizer import Saver, save_atomically

    replace = target.parent == cache_dir("models")  # a cache entry, never a user's folder
    save_atomically(Saver([model, tokenizer], records), target, replace=replace)
