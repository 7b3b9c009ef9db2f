"""The SearchTeam environment (``envs.search_team``), its turn protocol, records,
retrievers and QA data.

The one env factory: ``envs.make_env(**kwargs)`` makes an env (``wrapped=True`` adds
PettingZoo's order enforcing) and ``envs.env_fn(**kwargs)`` a picklable function that
makes one, for collectors and trainers. Loaded on first use, so ``import envs.data``
stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"make_env": "envs.search_team", "env_fn": "envs.search_team", "apply_turns": "envs.turns"}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'envs' has no attribute {name!r}")
