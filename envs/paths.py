"""Where mopd keeps what it builds once and reuses: converted tokenizers and models,
retrieval embeddings and indexes, the synthetic world. Override with ``MOPD_CACHE``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$MOPD_CACHE`` (default ``~/.cache/mopd``) joined with ``parts``, created on demand."""
    root = Path(os.environ.get("MOPD_CACHE", Path.home() / ".cache" / "mopd"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
