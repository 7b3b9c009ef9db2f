"""What an awaiting agent sees, and applying a batch of whole turns.

Both the batched collector (``agents.collect``) and the single-role Gymnasium views
(``envs.wrappers``) drive SearchTeam cores directly; they share these two functions so
the observation record and the one-retriever-call-per-batch rule live in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from envs import protocol as P


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

    @cached_property
    def text(self) -> str:
        """The context as text (decoded once, on first use)."""
        if self.decode is None:
            raise ValueError(f"observation of {self.agent} has no decoder to render its text")
        return self.decode(self.token_ids.tolist())


def observe(env: Any, agent: str, env_index: int = 0) -> Observation:
    """The record of ``agent``'s context in a SearchTeam env (after reset)."""
    raw = env.unwrapped
    role = P.role_of(agent)
    return Observation(agent=agent, role=role, token_ids=np.asarray(raw.core.context(agent), dtype=np.int64),
                       stop=P.STOP_STRINGS[role], max_new_tokens=raw.core.turn_budget(agent),
                       env_index=env_index, decode=raw.tokenizer.decode)


def observe_awaiting(env: Any, env_index: int = 0) -> list[Observation]:
    """One Observation per agent awaiting a turn in ``env``, in cycle order."""
    return [observe(env, agent, env_index) for agent in env.unwrapped.core.awaiting]


def apply_turns(turns: Sequence[tuple[Any, str, Any]]) -> list[Any]:
    """Apply whole turns ``(env, agent, action)`` in order, then answer every search they
    asked for with one retriever call per retriever. Returns the cores' TurnResults."""
    results, searches = [], {}
    for env, agent, action in turns:
        raw = env.unwrapped
        ids, logprobs, note = raw.prepare_turn(agent, action)
        result = raw.core.play(agent, ids, logprobs)
        result.reason = result.reason or note
        results.append(result)
        if result.query is not None:
            searches.setdefault(id(raw.retriever), (raw.retriever, raw.config.top_k, []))[2].append(
                (raw.core, agent, result.query))
    for retriever, top_k, pending in searches.values():
        hits = retriever.search([q for _, _, q in pending], top_k)
        for (core, agent, _), passages in zip(pending, hits):
            core.deliver(agent, passages)
    return results
