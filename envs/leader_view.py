"""The Leader as a classic-RL agent: discrete macro-actions over a numeric observation.

:class:`LeaderMacroEnv` is a ``gymnasium.Env`` (on top of :class:`envs.wrappers.SingleRoleEnv`)
in which the Leader only decides *how much to search*: each step it either dispatches a
wave of ``n`` Searchers (``n`` in ``1..K``) on sub-tasks proposed by a fixed decomposition
policy, or stops and lets the Answerers answer. Fixed policies play the Searchers and the
Answerers. Stable-baselines3 trains it as is (the "train only the Leader" baseline).

==================  ===========================================================
Action              ``Discrete(K + 1)``: ``0`` stop (``<select>``), ``n`` dispatch ``n``
                    Searchers on the first ``n`` proposed sub-tasks (then the question
                    itself, then the proposals again, when fewer were proposed)
Observation         ``Box(0, 1, (len(FEATURES),), float32)``: :data:`FEATURES`, read from
                    the Leader's context alone (see below)
Reward              ``-search_cost`` per search as the searches happen; at the end, the
                    Leader's reward ``0.9 R_EM + 0.1 R_assign``
Episode             at most ``max_waves`` decisions; once no wave is left the view stops
                    for the Leader (no decision to make)
==================  ===========================================================

**Observation from what the Leader knows.** Every feature is computed from the Leader's
``infos`` and its context length by :class:`LeaderMacro`, the same code a deployed Leader
(``agents.sb3_leader``) runs, so what the model saw in training is what it sees in use.
Retrieval scores never reach the Leader, so the retrieval signal is the *support* of each
report for its sub-task: the share of the sub-task's content words the report contains.

**Decomposition.** ``decompose`` is either a callable ``(question, wave, reports) ->
list[str]`` (``reports`` are ``(number, sub-task, report)``) or a Leader policy (any
object with ``act``, e.g. ``agents.ScriptedPolicy``): its turn is parsed, its sub-tasks
are the proposals, and when it would select, its selection is the one used on stop
(otherwise every report is selected).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import gymnasium
import numpy as np

from envs import protocol as P
from envs.rewards import normalize_answer
from envs.wrappers import SingleRoleEnv

FEATURES = (
    "waves_done",       # waves dispatched so far / max_waves
    "waves_left",       # waves the Leader may still dispatch / max_waves
    "reports",          # reports so far / (max_waves * max_searchers)
    "last_wave",        # reports of the latest wave / max_searchers
    "empty_reports",    # share of reports that are empty or "Nothing found"
    "support_mean",     # mean support of the latest wave's reports for their sub-tasks
    "support_min",      # the weakest of them
    "agreement",        # mean pairwise word overlap (Jaccard) of the non-empty reports
    "coverage",         # share of the question's content words found in the reports
    "tokens",           # the Leader's context length / max_context_tokens
    "proposed",         # sub-tasks the decomposer proposes now / max_searchers
    "decomposer_stops", # 1 when the decomposer would select rather than dispatch
    "comparison",       # 1 for an "A or B" question
    "question_words",   # content words in the question / 16 (capped at 1)
)
"""The numeric observation, in order; every value lies in [0, 1]."""

_STOPWORDS = frozenset(
    "a an the of in on at to for by from with and or is was were are be been who whom whose what which "
    "when where why how did does do that this these those it its he she his her they their as into than "
    "then there also not no first".split())
_EMPTY_REPORTS = ("", P.NO_REPORT, "nothing found.", "nothing found")


def content_words(text: str) -> set[str]:
    """SQuAD-normalised words of ``text`` minus function words."""
    return set(normalize_answer(text).split()) - _STOPWORDS


@dataclass(frozen=True)
class LeaderState:
    """What the Leader knows, read from its ``infos`` (``Observation.info``)."""

    question: str
    reports: tuple[tuple[int, str, str], ...]
    """``(number, sub-task, report)`` of every report, in arrival order (an empty report
    reads as the env shows it, ``(no report)``)."""
    wave_of: tuple[int, ...]
    """The wave (0-based) each report came back in."""
    waves_done: int
    waves_left: int
    max_waves: int
    max_searchers: int

    @classmethod
    def of_info(cls, info: Mapping[str, Any], max_waves: int = 3, max_searchers: int = 3) -> LeaderState:
        """The state in a Leader's ``infos``; ``max_waves`` and ``max_searchers`` are
        defaults for an info that does not say."""
        if not isinstance(info, Mapping) or "question" not in info:
            raise TypeError("LeaderState reads the Leader's infos (Observation.info), "
                            f"not its prompt text; got {type(info).__name__}")
        max_waves = int(info.get("max_waves", max_waves))
        reports = [(int(n), str(task).strip(), (str(report) or P.NO_REPORT).strip(), int(wave))
                   for n, task, report, wave in info.get("reports", ())]
        return cls(question=str(info["question"]).strip(),
                   reports=tuple((n, task, report) for n, task, report, _ in reports),
                   wave_of=tuple(wave for *_, wave in reports),
                   waves_done=int(info.get("waves_done", 0)),
                   waves_left=int(info.get("waves_left", max_waves)),
                   max_waves=max_waves, max_searchers=int(info.get("max_searchers", max_searchers)))


@dataclass(frozen=True)
class Proposal:
    """What the decomposition policy would do now."""

    subtasks: tuple[str, ...] = ()
    selection: tuple[int, ...] | None = None
    """Its ``<select>`` numbers when it would stop; None when it would dispatch (or said
    nothing usable)."""

    @classmethod
    def of_turn(cls, text: str, state: LeaderState) -> Proposal:
        parsed = P.parse_leader(text, len(state.reports), state.max_searchers)
        if parsed.kind == "dispatch":
            return cls(subtasks=parsed.subtasks)
        if parsed.kind == "select":
            return cls(selection=parsed.selection)
        return cls()


class LeaderMacro:
    """Macro-actions (``0..max_searchers``) and features (scaled by the team's budgets) of
    the Leader; shared by :class:`LeaderMacroEnv` and deployed Leaders."""

    def __init__(self, max_waves: int = 3, max_searchers: int = 3, max_context_tokens: int = 4096):
        for name, value in dict(max_waves=max_waves, max_searchers=max_searchers,
                                max_context_tokens=max_context_tokens).items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.max_waves, self.max_searchers, self.max_context_tokens = max_waves, max_searchers, max_context_tokens
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (len(FEATURES),), np.float32)
        self.action_space = gymnasium.spaces.Discrete(max_searchers + 1)

    def state(self, info: Mapping[str, Any]) -> LeaderState:
        """The Leader's state from its ``infos`` (``Observation.info``)."""
        return LeaderState.of_info(info, self.max_waves, self.max_searchers)

    def features(self, state: LeaderState, num_tokens: int, proposal: Proposal) -> np.ndarray:
        """The observation vector (:data:`FEATURES`, float32 in [0, 1])."""
        reports = state.reports
        last = [r for r, w in zip(reports, state.wave_of) if w == max(state.wave_of, default=-1)]
        filled = [words for _, _, text in reports
                  if text.strip().lower() not in _EMPTY_REPORTS and (words := content_words(text))]
        support = [_share(content_words(task), content_words(text)) for _, task, text in last]
        agreement = [len(a & b) / len(a | b) for a, b in combinations(filled, 2)]  # never empty
        question = content_words(state.question)
        seen = set().union(*filled) if filled else set()
        values = [
            state.waves_done / self.max_waves,
            state.waves_left / self.max_waves,
            len(reports) / (self.max_waves * self.max_searchers),
            len(last) / self.max_searchers,
            1 - len(filled) / len(reports) if reports else 0.0,
            float(np.mean(support)) if support else 0.0,
            min(support, default=0.0),
            float(np.mean(agreement)) if agreement else 0.0,
            _share(question, seen),
            num_tokens / self.max_context_tokens,
            len(proposal.subtasks) / self.max_searchers,
            float(proposal.selection is not None),
            float(" or " in state.question),
            len(question) / 16,
        ]
        return np.clip(np.asarray(values, dtype=np.float32), 0.0, 1.0)

    def turn(self, action: int, state: LeaderState, proposal: Proposal) -> str:
        """The Leader's turn text for a macro-action (a stop once no wave is left)."""
        action = int(action)
        if not 0 <= action <= self.max_searchers:
            raise ValueError(f"macro-action must be in 0..{self.max_searchers}, got {action}")
        if action == 0 or state.waves_left <= 0:
            numbers = proposal.selection if proposal.selection is not None else [n for n, _, _ in state.reports]
            return P.write_select(numbers)
        pool = list(dict.fromkeys([*proposal.subtasks, state.question or "the question"]))
        n = min(action, state.max_searchers)
        return P.write_subtasks([pool[i % len(pool)] for i in range(n)])


def _share(wanted: set[str], found: set[str]) -> float:
    return len(wanted & found) / len(wanted) if wanted else 0.0


def turn_text(action: Any, decode: Callable[[Sequence[int]], str]) -> str:
    """The text of a policy's turn: a ``str``, or an object/dict with ``text`` or ``token_ids``."""
    if isinstance(action, str):
        return action
    get = action.get if isinstance(action, dict) else lambda key: getattr(action, key, None)
    if isinstance(get("text"), str):
        return get("text")
    ids = get("token_ids")
    return decode(list(np.asarray(ids).reshape(-1).tolist())) if ids is not None else ""


class LeaderMacroEnv(gymnasium.Env):
    """The Leader's macro-action view of a SearchTeam env; see the module docstring.

    ``env``: a hierarchical SearchTeam env; ``others``: the policy of the Searchers and
    Answerers (``act(observations)``); ``search_cost``: subtracted from the reward per search.
    """

    metadata = {"render_modes": ["ansi", "human"]}

    def __init__(self, env: Any, others: Any, decompose: Any, *, search_cost: float = 0.0,
                 render_mode: str | None = None):
        if not (callable(getattr(decompose, "act", None)) or callable(decompose)):
            raise TypeError("decompose must be a callable or a Leader policy with act(), "
                            f"got {type(decompose).__name__}")
        if not np.isfinite(search_cost) or search_cost < 0:
            raise ValueError(f"search_cost must be a finite number >= 0, got {search_cost}")
        self.team = SingleRoleEnv(env, "leader", others, render_mode=render_mode)
        self.raw = self.team.raw
        cfg = self.raw.config
        self.macro = LeaderMacro(cfg.max_waves, cfg.max_searchers, cfg.max_context_tokens)
        self.observation_space = self.macro.observation_space
        self.action_space = self.macro.action_space
        self.decompose, self.search_cost, self.render_mode = decompose, float(search_cost), render_mode
        self._now: tuple[LeaderState, Proposal] | None = None

    @property
    def episode(self) -> Any:
        return self.team.episode

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        options = dict(options or {})
        if options.get("question") is None:  # drawn here: one source of randomness
            questions = self.raw.questions
            options["question"] = questions[int(self.np_random.integers(len(questions)))]
        self.team.reset(seed=seed, options=options)
        self._now = None
        return self._observe(), self._info()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.raw.episode is None:
            raise RuntimeError("call reset() before step()")
        searches = self.episode.num_searches
        done = self.raw.done
        if not done:
            done = self._act(int(np.asarray(action).reshape(())))
            if not done and self._decision()[0].waves_left <= 0:
                done = self._act(0)  # no wave left: the only move is to stop
        reward = -self.search_cost * (self.episode.num_searches - searches)
        if done:
            reward += self.team.role_reward()
        return self._observe(), float(reward), bool(done), False, self._info()

    def render(self) -> str | None:
        return self.team.render()

    def close(self) -> None:
        self.team.close()

    def _act(self, action: int) -> bool:
        """Play the Leader's turn for ``action``; whether the episode is over."""
        state, proposal = self._decision()
        self._now = None  # the Leader's context changes
        _, _, done, _, _ = self.team.step(self.macro.turn(action, state, proposal))
        return done

    def _decision(self) -> tuple[LeaderState, Proposal]:
        """The Leader's state and the decomposer's proposal, once per Leader context."""
        if self._now is None:
            state = self.macro.state(self.raw.view("leader_0"))
            self._now = state, self._proposal(state)
        return self._now

    def _proposal(self, state: LeaderState) -> Proposal:
        if callable(getattr(self.decompose, "act", None)):
            obs = self.raw.turn_observation("leader_0")
            return Proposal.of_turn(turn_text(self.decompose.act([obs])[0], self.raw.tokenizer.decode), state)
        subtasks = [str(t).strip() for t in self.decompose(state.question, state.waves_done, list(state.reports))]
        return Proposal(subtasks=tuple(t for t in subtasks if t))

    def _observe(self) -> np.ndarray:
        ids = self.raw.context("leader_0")
        if self.raw.done:  # the last Leader context; a terminal observation is never acted on
            state, proposal = self.macro.state(self.raw.view("leader_0")), Proposal(selection=())
        else:
            state, proposal = self._decision()
        return self.macro.features(state, len(ids), proposal)

    def _info(self) -> dict[str, Any]:
        ep = self.episode
        info: dict[str, Any] = {"searches": ep.num_searches, "waves": ep.num_waves}
        if self.raw.done:
            info.update(team_em=float(ep.team_em), leader_reward=self.team.role_reward())
        return info
