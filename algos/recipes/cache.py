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
