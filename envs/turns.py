"""The one implementation of a turn: :func:`apply_turns`, whoever drives the env (the AEC
``step()``, ``raw_env.play_turns``, the batched collector, the single-role views). Each turn
is cut, recorded and parsed by ``raw_env.begin_turn``; each env then ``settle``s (scores a
finished episode, or selects its next agent and refreshes ``infos``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple


class PreparedTurn(NamedTuple):
    """A whole turn already cut at its end and budget (``raw_env.prepare_turn``)."""

    ids: list[int]
    logprobs: list[float] | None
    note: str


def apply_turns(turns: Sequence[tuple[Any, str, Any]], *, any_action: bool = False) -> list[Any]:
    """Apply whole turns ``(env, agent, action)`` in order, answer every search they asked
    for with one :func:`search` per retriever, then settle each env; returns the turns'
    ``envs.team.TurnResult``. The batch is checked whole first (:func:`check_batch`, where
    ``any_action`` plays an action of no accepted form as an invalid empty turn, the AEC
    ``step()``'s way), so a refused batch leaves every env as it was.
    """
    check_batch(turns, any_action=any_action)
    results, searches, last_agent = [], {}, {}
    for env, agent, action in turns:
        raw = env.unwrapped
        result = raw.begin_turn(agent, action)
        results.append(result)
        last_agent[id(raw)] = (raw, agent)
        if result.query is not None:
            key = id(raw.retriever)
            searches.setdefault(key, (raw, []))[1].append((raw, agent, result.query))
    for first, pending in searches.values():
        hits, error = search(first.retriever, [q for _, _, q in pending], first.config.top_k,
                             first.search_retries, first.search_backoff)
        for k, (raw, agent, _) in enumerate(pending):
            raw.end_search(agent, None if hits is None else hits[k], error)
    for raw, agent in last_agent.values():
        raw.settle(agent)
    return results


def check_batch(turns: Sequence[tuple[Any, str, Any]], *, any_action: bool = False) -> None:
    """Raise ValueError naming the first turn of ``turns`` that :func:`apply_turns` must
    refuse (``turn 2 of 3 (searcher_1, env 0)``): of an env not reset, of an agent not
    awaiting (or twice), or an action of no accepted form; change nothing."""
    numbers: dict[int, int] = {}  # id(raw env) -> its number in the batch, in order of appearance
    for env, _, _ in turns:
        numbers.setdefault(id(env.unwrapped), len(numbers))
    seen: set[tuple[int, str]] = set()
    for i, (env, agent, action) in enumerate(turns):
        raw = env.unwrapped
        key = (id(raw), agent)
        reason = ("it already plays a turn earlier in this batch" if key in seen
                  else raw.turn_refusal(agent, action, any_action=any_action))
        if reason:
            where = f", env {numbers[id(raw)]}" if len(numbers) > 1 else ""
            raise ValueError(f"turn {i + 1} of {len(turns)} ({agent}{where}) refused: {reason}; "
                             "no turn of the batch was applied")
        seen.add(key)


def search(retriever: Any, queries: list[str], top_k: int, retries: int = 2,
           backoff: float = 0.1) -> tuple[list[Any] | None, BaseException | None]:
    """``(one passage list per query, None)``, or ``(None, the last error)`` when every try
    raised (``retries`` more after the first, ``backoff`` seconds apart, doubling): the
    Searchers are then told the search failed. A retriever that breaks its contract (the
    wrong number of lists) is a ValueError at once."""
    error: BaseException | None = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            hits = retriever.search(queries, top_k)
        except Exception as err:  # a timeout, a dropped connection: untrusted, like model output
            error = err
            continue
        count = len(hits) if isinstance(hits, Sequence) else None
        if count != len(queries):
            got = "nothing" if hits is None else f"{count} result lists" if count is not None \
                else f"a {type(hits).__name__}"
            raise ValueError(f"retriever {type(retriever).__name__}.search answered {got} for "
                             f"{len(queries)} queries; it must return one list of passages per query")
        bad = next((i for i, h in enumerate(hits) if not isinstance(h, Sequence) or isinstance(h, str)), None)
        if bad is not None:
            raise ValueError(f"retriever {type(retriever).__name__}.search answered a "
                             f"{type(hits[bad]).__name__} for query {bad}; it must be a list of passages")
        return [list(h) for h in hits], None
    return None, error
