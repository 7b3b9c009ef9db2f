"""The one interface every policy speaks: ``act(observations) -> actions``, batched.

A user-written policy is any object with that method. The collector hands it every agent
that awaits an action (across all env copies) in one list; it returns one action per
observation, in order: an :class:`Action`, or a plain ``str`` that the collector tokenises
once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass
class Observation:
    """What one awaiting agent sees."""

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

    @cached_property
    def text(self) -> str:
        """The context as text (decoded once, on first use)."""
        if self.decode is None:
            raise ValueError(f"observation of {self.agent} has no decoder to render its text")
        return self.decode(self.token_ids.tolist())


@dataclass
class Action:
    """One whole turn. Give ``token_ids`` (exact, never re-tokenised) or ``text``."""

    token_ids: Sequence[int] | np.ndarray | None = None
    logprobs: Sequence[float] | np.ndarray | None = None
    """Behaviour log-probs of ``token_ids`` under the sampling distribution, when known."""
    text: str | None = None


@runtime_checkable
class Policy(Protocol):
    def act(self, observations: Sequence[Observation]) -> list[Action | str]: ...
