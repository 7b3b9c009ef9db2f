"""Gymnasium single-agent views of SearchTeam: one role learns, fixed policies play the rest.

:class:`SingleRoleEnv` turns the multi-agent episode into a ``gymnasium.Env`` for classic
single-agent RL libraries. It controls one role (``"leader"``, ``"searcher"``,
``"answerer"``) or one agent (``"searcher_1"``); every other agent is played by ``others``,
any object with ``act(observations) -> actions`` (every ``agents`` policy qualifies; the
records it gets are :class:`envs.observation.Observation`, which ``agents.Observation`` names).

==================  ===========================================================
Observation         ``Dict(observation=Box(0, V-1, (L,), int64), length=Box(0, L, (1,),
                    int64))``: the controlled agent's context, as in the AEC env
Action              ``Sequence(Discrete(V), stack=True)``: one whole turn of token ids
                    (a ``str`` or an ``agents.Action`` is accepted too, tokenised once)
Reward              0 until the end; then the mean role reward of the controlled agents
                    that took part (the Leader's ``0.9 R_EM + 0.1 R_assign`` for ``leader``)
Episode end         ``terminated`` when the team has answered; never truncated (the env's
                    budgets end every role)
==================  ===========================================================

When several controlled agents await a turn (the Searchers of one wave), they act one per
step in cycle order; ``info["agent"]`` names the agent whose context the observation is,
and ``info`` holds what it knows (``raw_env.view``: question, sub-task, passages, reports,
waves left), so a policy never has to parse the context.
``reset`` redraws the question (from ``self.np_random``) when the episode ended before the
controlled role got a turn (a Leader that never dispatched a Searcher); with a question
forced through ``options``, it returns an empty context and the next step ends the episode.
Example: ``SingleRoleEnv(search_team_v0.raw_env(), "leader", agents.ScriptedPolicy())``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import gymnasium
import numpy as np

from envs import protocol as P
from envs.search_team import agent_spaces
from envs.terminal import safe_print

MAX_REDRAWS = 32
"""Questions ``reset`` tries before it gives up finding a turn for the controlled role."""


def play_others(raw: Any, others: Any, controlled: Collection[str]) -> None:
    """Let ``others`` play every awaiting agent not in ``controlled``, in batches (one
    retriever call per batch), until a controlled agent awaits or the episode is over."""
    while not raw.done and not any(a in controlled for a in raw.awaiting):
        observations = raw.turn_observations()
        if not observations:  # the env always has someone awaiting before it is done
            raise RuntimeError(f"no agent awaits a turn in phase {raw.phase!r}")
        actions = others.act(observations)
        if len(actions) != len(observations):
            raise ValueError(f"others returned {len(actions)} actions for {len(observations)} observations")
        raw.play_turns([(obs.agent, action) for obs, action in zip(observations, actions)])


class SingleRoleEnv(gymnasium.Env):
    """One role (or one agent) of a SearchTeam env as a ``gymnasium.Env``; see the module
    docstring.

    Args:
        env: a SearchTeam env (``search_team_v0.raw_env`` or ``env``; its step mode does
            not matter: this view always acts in whole turns).
        role: ``leader``, ``searcher``, ``answerer``, or one agent name (``searcher_0``).
        others: the policy of every agent not controlled: ``act(observations) -> actions``.
    """

    metadata = {"render_modes": ["ansi", "human"]}

    def __init__(self, env: Any, role: str, others: Any, *, render_mode: str | None = None):
        raw = env.unwrapped
        if not hasattr(raw, "play_turns") or not hasattr(raw, "turn_observations"):
            raise TypeError(f"env must be a SearchTeam env (search_team_v0.raw_env), got {type(env).__name__}")
        if role not in P.ROLES and role not in raw.possible_agents:
            raise ValueError(f"role must be one of {P.ROLES} or an agent of {raw.possible_agents}, got {role!r}")
        self.controlled = [a for a in raw.possible_agents if a == role or P.role_of(a) == role]
        if not self.controlled:
            raise ValueError(f"the {raw.config.workflow} workflow has no {role!r} agent "
                             f"(agents: {raw.possible_agents})")
        if not callable(getattr(others, "act", None)):
            raise TypeError(f"others must have act(observations) -> actions, got {type(others).__name__}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None, 'ansi' or 'human', got {render_mode!r}")
        self.raw, self.role, self.others, self.render_mode = raw, role, others, render_mode
        self.observation_space, self.action_space = agent_spaces(raw.config.max_context_tokens,
                                                                 raw.vocab_size)
        self._controlled = frozenset(self.controlled)
        self.agent: str | None = None
        """The controlled agent whose turn is next (None when the episode is over)."""

    @property
    def episode(self) -> Any:
        """The current (or last) ``envs.episode.Episode``."""
        return self.raw.episode

    def context(self) -> list[int]:
        """The token ids of the current agent's context (empty when no agent is current)."""
        return self.raw.context(self.agent) if self.agent is not None else []

    def context_text(self) -> str:
        return self.raw.tokenizer.decode(self.context())

    def role_reward(self) -> float:
        """Mean reward of the controlled agents that took part (0.0 before the end)."""
        ep = self.raw.episode
        if ep is None or not self.raw.done:
            return 0.0
        played = {s.agent for s in ep.segments} & self._controlled
        return float(np.mean([ep.rewards[a] for a in played])) if played else 0.0

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        forced = options.get("question") is not None
        for _ in range(1 if forced else MAX_REDRAWS):
            if not forced:
                questions = self.raw.questions
                options["question"] = questions[int(self.np_random.integers(len(questions)))]
            self.raw.reset(seed=seed, options=options)
            play_others(self.raw, self.others, self._controlled)
            if not self.raw.done:
                break
        self.agent = self._next_agent()
        return self._observe(), self._info()

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self.raw.episode is None:
            raise RuntimeError("call reset() before step()")
        info: dict[str, Any] = {}
        if self.agent is not None:
            [result] = self.raw.play_turns([(self.agent, action)])
            info = {"kind": result.kind, "invalid": result.invalid, "reason": result.reason or result.note,
                    "note": result.note}
            play_others(self.raw, self.others, self._controlled)
        done = self.raw.done
        self.agent = None if done else self._next_agent()
        return self._observe(), self.role_reward(), done, False, {**self._info(), **info}

    def render(self) -> str | None:
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without a render_mode; pass render_mode='ansi' or 'human'")
            return None
        ep = self.raw.episode
        if ep is None:
            text = "(not reset)"
        elif self.raw.done:
            text = P.LOG_ROLE_OUTCOME.format(candidates=ep.candidates, final=ep.final_answer,
                                             gold=ep.question["golden_answers"], reward=self.role_reward())
        else:
            text = f"[{self.agent}]\n{self.context_text()}"
        if self.render_mode == "human":  # passages may hold escape sequences: shown, not obeyed
            safe_print(text)
            return None
        return text

    def _next_agent(self) -> str | None:
        if self.raw.done:
            return None
        awaiting = self.raw.awaiting
        return next(a for a in self.raw.possible_agents if a in awaiting and a in self._controlled)

    def _observe(self) -> dict[str, np.ndarray]:
        return self.raw.padded(self.context())

    def _info(self) -> dict[str, Any]:
        """The current agent's ``raw_env.view`` and the episode's counters."""
        ep = self.raw.episode
        info: dict[str, Any] = self.raw.view(self.agent) if self.agent is not None else {}
        info.update(agent=self.agent, searches=ep.num_searches, waves=ep.num_waves)
        if self.raw.done:
            info.update(team_em=float(ep.team_em), final_answer=ep.final_answer)
        return info
