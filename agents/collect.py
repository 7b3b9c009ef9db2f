"""The batched rollout collector: the hot path of training and evaluation.

It runs G env copies per question side by side. Every step it sends every agent that
awaits a turn, in every copy, to the policy in one batch, applies the turns, and answers
all the searches they asked for with one retriever call. It drives the copies through
the env's batched API (``turn_observations``, ``envs.turns.apply_turns``), the same
turn path the AEC ``step()`` takes, so the Episodes are exactly those that stepping the
PettingZoo env with the same turns would give.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agents.base import Policy
from agents.sampling import team_settings
from envs.episode import Episode, save_episodes
from envs.observation import observe_awaiting
from envs.turns import apply_turns


def collect(env_fn: Callable[[], Any], policy: Policy, questions: Sequence[Any],
            group_size: int = 1, *, seed: int = 0, max_envs: int | None = None,
            progress: bool | str = False, out: str | Path | None = None) -> list[list[Episode]]:
    """Roll out ``group_size`` workflows per question; Episodes grouped by question.

    ``env_fn()`` makes one SearchTeam env (``envs.env_fn(**kwargs)``, or
    ``search_team_v0.env`` / ``raw_env`` with its arguments bound); copies share its
    retriever. Copy k of question i is reset with seed ``seed + i * group_size + k``.
    ``max_envs`` bounds how many copies run at once (all by default). ``progress``: a bar on
    stderr (a str labels it, e.g. the dataset), counting episodes with the turns played so
    far beside it. ``out`` also writes the Episodes as JSON lines, in question order. Every
    Episode records the policy's sampling settings (``agents.sampling.team_settings``).
    """
    from tqdm.auto import tqdm

    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    jobs = [(i, k) for i in range(len(questions)) for k in range(group_size)]
    results: list[list[Episode | None]] = [[None] * group_size for _ in questions]
    width = max_envs or len(jobs) or 1
    bar = tqdm(total=len(jobs), desc=progress if isinstance(progress, str) else "episodes",
               unit="ep", disable=not progress)
    turns, shown = 0, time.monotonic()
    settings = team_settings(policy)
    envs = [env_fn() for _ in range(min(width, len(jobs)))]
    for start in range(0, len(jobs), width):
        live = []
        for env, (i, k) in zip(envs, jobs[start:start + width]):
            env.reset(seed=seed + i * group_size + k, options={"question": questions[i]})
            live.append((env, i, k))
        while live:  # one batched step over the live copies
            observations = [obs for n, (env, _, _) in enumerate(live)
                            for obs in observe_awaiting(env, n)]
            actions = policy.act(observations)
            if len(actions) != len(observations):
                raise ValueError(f"policy returned {len(actions)} actions for "
                                 f"{len(observations)} observations")
            apply_turns([(live[obs.env_index][0], obs.agent, action)
                         for obs, action in zip(observations, actions)])
            for env, i, k in live:
                if env.unwrapped.done:
                    results[i][k] = env.unwrapped.episode
                    results[i][k].sampling = settings
                    bar.update(1)
            live = [(env, i, k) for env, i, k in live if not env.unwrapped.done]
            turns += len(observations)
            if bar.disable or time.monotonic() - shown < 1:
                continue
            # a batch of long episodes finishes late: the turn count shows the bar is alive
            bar.set_postfix_str(f"{turns} turns")
            shown = time.monotonic()
    bar.close()
    grouped: list[list[Episode]] = results  # type: ignore[assignment]
    if out is not None:
        save_episodes(out, [ep for group in grouped for ep in group])
    return grouped

