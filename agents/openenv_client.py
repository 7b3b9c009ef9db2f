"""``collect_remote``: the collector over the wire, against a SearchTeam OpenEnv server
(``python -m envs.openenv serve``; optional extra ``openenv``): ``agents.collect.collect``'s
contract over one WebSocket session per episode, at most ``max_sessions`` at once; a
deterministic policy gives exactly ``collect``'s Episodes (docs/ecosystems.md, "OpenEnv").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agents.base import Policy
from agents.sampling import team_settings
from envs.episode import Episode
from envs.openenv.client import (
    SearchTeamClient,
    action_of,
    check_tokenizer,
    episode_of,
    question_payload,
    turn_observation,
)

MAX_ROUNDS = 100_000
"""A bound on policy rounds per window of sessions (every round plays one turn in every
live session, and every turn spends an agent's budget, so real episodes end far sooner)."""


def collect_remote(url: str, policy: Policy, questions: Sequence[Any], group_size: int = 1, *,
                   seed: int = 0, max_sessions: int = 8, workflow: str | None = None,
                   tokenizer: Any = None, message_timeout_s: float = 300.0) -> list[list[Episode]]:
    """Roll out ``group_size`` episodes per question on the server at ``url``; Episodes
    grouped by question. ``workflow``: ask each reset for it (None: the server's).
    ``tokenizer`` (default: the policy's ``tokenizer``, if it has one) must be the
    server's when the policy sends token ids: checked on the first reset (ValueError).
    A turn the server refuses (the policy answered an agent that does not await, or sent
    a malformed action) raises RuntimeError with the server's reason. Must not be called
    from a running event loop (it runs its own)."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
    tokenizer = tokenizer if tokenizer is not None else getattr(policy, "tokenizer", None)
    return asyncio.run(_collect(url, policy, list(questions), group_size, seed, max_sessions, workflow,
                                tokenizer, message_timeout_s))


async def _collect(url, policy, questions, group_size, seed, max_sessions, workflow, tokenizer,
                   timeout) -> list[list[Episode]]:
    jobs = [(i, k) for i in range(len(questions)) for k in range(group_size)]
    results: list[list[Episode | None]] = [[None] * group_size for _ in questions]
    settings = team_settings(policy)
    payloads = [question_payload(q) for q in questions]
    for start in range(0, len(jobs), max_sessions):
        window = jobs[start:start + max_sessions]
        clients = [SearchTeamClient(base_url=url, message_timeout_s=timeout) for _ in window]
        try:
            for client in clients:  # one at a time: a refused session fails here, by name
                await client.connect()
            options = {} if workflow is None else {"workflow": workflow}
            firsts = await asyncio.gather(*(c.reset(seed=seed + i * group_size + k, question=payloads[i], **options)
                                            for c, (i, k) in zip(clients, window)))
            for result in firsts:
                if result.observation.last_turn.get("played") is False:
                    raise RuntimeError("the server refused the reset: "
                                       f"{result.observation.last_turn.get('reason')}")
            if tokenizer is not None:
                check_tokenizer(firsts[0].observation.metadata, tokenizer)
            live = list(zip(clients, window, (r.observation for r in firsts)))
            for _ in range(MAX_ROUNDS):
                if not live:
                    break
                observations = [turn_observation(obs, n) for n, (_, _, obs) in enumerate(live)]
                actions = await asyncio.to_thread(policy.act, observations)  # keeps the sockets' pings alive
                if len(actions) != len(observations):
                    raise ValueError(f"policy returned {len(actions)} actions for {len(observations)} observations")
                steps = await asyncio.gather(*(c.step(action_of(o.agent, a))
                                               for (c, _, _), o, a in zip(live, observations, actions)))
                still = []
                for (client, (i, k), _), result in zip(live, steps):
                    obs = result.observation
                    if obs.last_turn.get("played") is False:
                        raise RuntimeError(f"the server refused {obs.last_turn.get('agent')!r}'s turn "
                                           f"(question {i}, copy {k}): {obs.last_turn.get('reason')}")
                    if obs.done:
                        ep = episode_of(obs)
                        ep.sampling = settings
                        results[i][k] = ep
                    else:
                        still.append((client, (i, k), obs))
                live = still
            else:
                raise RuntimeError(f"episodes still running after {MAX_ROUNDS} rounds")
        finally:
            for client in clients:
                try:
                    await client.close()
                except Exception:  # noqa: BLE001 - closing a socket the server already dropped
                    pass
    return results  # type: ignore[return-value]
