"""What an awaiting agent sees: the :class:`Observation` record, and the awaiting agents' of
an env (one agent's: ``raw_env.turn_observation``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np


@dataclass
class Observation:
    """What one awaiting agent sees (``agents.Observation`` is this class)."""

    agent: str
    """PettingZoo agent name, e.g. ``searcher_1``."""
    role: str
    """``leader``, ``searcher`` or ``answerer`` (the name before the last ``_``)."""
    token_ids: np.ndarray
    """The agent's whole context, 1-D int64 token ids (no padding)."""
    stop: tuple[str, ...] = ()
    """Strings that end this role's turn (the env also ends a turn at EOS)."""
    max_new_tokens: int = 256
    """How many tokens this turn may still take (turn budget and context room)."""
    env_index: int = 0
    """Which env copy the agent lives in (the collector's bookkeeping)."""
    decode: Callable[[Sequence[int]], str] | None = field(default=None, repr=False)
    """Turns token ids into text; ``text`` uses it."""
    info: dict[str, Any] = field(default_factory=dict, repr=False)
    """The structure the agent knows (``raw_env.view``: question, sub-task, passages,
    reports, waves left, ...); policies read it instead of parsing ``text``."""
    messages: tuple[dict[str, str], ...] = field(default=(), repr=False)
    """The same context as chat messages ``{"role": "system"|"user"|"assistant",
    "content": str}``, in order, built from the env's structure (``raw_env.messages``),
    never parsed from text: system and user contents are the env's own words, assistant
    contents the agent's decoded turns. Unquoted: a chat request quotes each content
    (``envs.chat.quote_message``). Empty for an observation built by hand. The token
    ids stay the only truth for training; this is a view for chat-API policies."""

    @cached_property
    def text(self) -> str:
        """The context as text (decoded once, on first use)."""
        if self.decode is None:
            raise ValueError(f"observation of {self.agent} has no decoder to render its text")
        return self.decode(self.token_ids.tolist())


def observe_awaiting(env: Any, env_index: int = 0) -> list[Observation]:
    """One Observation per agent awaiting a turn in ``env``, in cycle order."""
    return env.unwrapped.turn_observations(env_index)
