"""Optional engines (Ray, vLLM) are extras: importing one that is missing says, in one line,
which install brings it."""

from __future__ import annotations

from typing import Any


def require(module: str, needed_by: str, install: str) -> Any:
    """``import module`` (a top-level package), or ImportError naming what needs it and the
    install that brings it."""
    try:
        return __import__(module)  # a top-level package (the import statement's own hook)
    except ImportError:
        raise ImportError(f"{needed_by} needs {module}, which is not installed: {install}") from None
