"""The one interface every policy speaks: ``act(observations) -> actions``, batched.

A user-written policy is any object with that method. The collector hands it every agent
that awaits an action (across all env copies) in one list; it returns one action per
observation, in order: an :class:`Action`, or a plain ``str`` that the collector tokenises
once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from envs.observation import Observation

__all__ = ["Action", "Observation", "Policy"]


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
