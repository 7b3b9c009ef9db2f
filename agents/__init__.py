"""Policies that act in SearchTeam, role routing, and the batched rollout collector.

Heavy modules (torch, transformers) load on first use: ``from agents import HFPolicy``.
"""

from __future__ import annotations

import importlib
from typing import Any

from agents.base import Action, Observation, Policy
from agents.collect import collect
from agents.router import RoleRouter

_LAZY = {"HFPolicy": "agents.hf", "load_causal_lm": "agents.models",
         "tiny_causal_lm": "agents.models", "ScriptedPolicy": "agents.scripted",
         "RandomPolicy": "agents.simple", "HumanPolicy": "agents.simple",
         "OpenAIPolicy": "agents.openai_chat", "make_policy": "agents.registry"}

__all__ = ["Action", "Observation", "Policy", "RoleRouter", "collect", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agents' has no attribute {name!r}")
