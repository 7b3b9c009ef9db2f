"""The SearchTeam core: a small state machine over one episode, one handler per role.

It knows which agents await a turn, applies whole turns (token ids in, token ids out),
and records the Episode as it goes. It knows nothing of PettingZoo or of step modes: the
AEC env (``envs.search_team``) drives it one agent at a time, and a batched collector may
drive many cores at once, gathering every pending search into one retriever call
(``play`` returns the query; ``deliver`` hands the passages back).

Phases: ``leader`` -> ``search`` (a wave) -> ``leader`` -> ... -> ``answer`` -> ``done``
(hierarchical), or ``search`` -> ``answer`` -> ``done`` (cascade).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from envs import protocol as P
from envs.chat import ChatFormat
from envs.episode import Episode, Segment
from envs.rewards import RewardConfig, exact_match, majority_answer

WORKFLOWS = ("hierarchical", "cascade")
MIN_TURN_ROOM = 16
"""Context tokens an agent must have left to be given another turn."""


@dataclass(frozen=True)
class TeamConfig:
    """Shape and budgets of the team. Budgets end roles; they never crash the env."""

    workflow: str = "hierarchical"
    """``hierarchical`` (H-MAS: Leader, waves of Searchers, Answerers) or ``cascade``
    (C-MAS: one Searcher on the question, then the Answerers)."""
    max_waves: int = 3
    """Most waves the Leader may dispatch."""
    max_searchers: int = 3
    """Most Searchers in one wave (K); agents ``searcher_0..K-1``."""
    max_searcher_turns: int = 4
    """Turns a Searcher gets per sub-task (searches plus the summary)."""
    max_leader_turns: int = 0
    """Turns the Leader gets in all; 0 means ``max_waves + 2``."""
    max_answerer_turns: int = 2
    """Turns an Answerer gets to write a valid ``<answer>``."""
    num_candidates: int = 5
    """Answerers (C), each writing one candidate from the same context."""
    top_k: int = 3
    """Passages per search."""
    max_turn_tokens: int = 256
    """Most tokens in one turn."""
    max_context_tokens: int = 4096
    """Most tokens in one agent's context; also the observation array's length."""
    rewards: RewardConfig = field(default_factory=RewardConfig)
    prompts: str = P.DEFAULT_PROMPTS
    """The prompt set (``envs.protocol.PROMPT_SETS``): what each role is told and reminded
    of. ``paper`` is the default; the tags and the parser are the same in every set."""

    def __post_init__(self) -> None:
        if self.workflow not in WORKFLOWS:
            raise ValueError(f"workflow must be one of {WORKFLOWS}, got {self.workflow!r}")
        for name in ("max_waves", "max_searchers", "max_searcher_turns", "max_answerer_turns",
                     "num_candidates", "top_k", "max_turn_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        P.prompt_set(self.prompts)  # an unknown name stops here, listing the sets
        if self.max_leader_turns < 0:
            raise ValueError(f"max_leader_turns must be >= 0, got {self.max_leader_turns}")
        if self.max_context_tokens < 4 * MIN_TURN_ROOM + self.max_turn_tokens:
            raise ValueError(
                f"max_context_tokens={self.max_context_tokens} leaves no room for a prompt "
                f"and a {self.max_turn_tokens}-token turn"
            )

    @classmethod
    def keywords(cls) -> tuple[str, ...]:
        """The field names, in order: the SearchTeam keyword arguments that set the team
        (``raw_env(max_waves=2)``; ``TrainConfig.env_shape`` passes its fields of these names)."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_keywords(cls, **kwargs: Any) -> TeamConfig:
        """The config these SearchTeam keyword arguments set (the others keep their defaults);
        ``rewards`` may also be a dict of ``RewardConfig`` fields, or None for the default.
        An unknown keyword is a TypeError that names it and the closest field name."""
        known = cls.keywords()
        for name in kwargs:
            if name not in known:
                import difflib

                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise TypeError(f"SearchTeam got an unexpected keyword argument {name!r}; {hint}"
                                f"the team's settings are {', '.join(known)}")
        rewards = kwargs.pop("rewards", None)
        if rewards is not None:
            kwargs["rewards"] = RewardConfig(**rewards) if isinstance(rewards, dict) else rewards
        return cls(**kwargs)

    @property
    def leader_turns(self) -> int:
        return self.max_leader_turns or self.max_waves + 2

    @property
    def agents(self) -> list[str]:
        """The possible agents, in the order the AEC env cycles through them."""
        searchers = 1 if self.workflow == "cascade" else self.max_searchers
        leader = ["leader_0"] if self.workflow == "hierarchical" else []
        return (leader + [f"searcher_{i}" for i in range(searchers)]
                + [f"answerer_{j}" for j in range(self.num_candidates)])


def check_room(config: TeamConfig, chat: ChatFormat) -> None:
    """Refuse a config whose contexts cannot hold a role's real prompt (with this
    tokenizer) plus one whole turn: such an env would run out of room in the first turn.
    Raises ValueError naming the settings and the smallest ``max_context_tokens`` that fits."""
    prompts = system_prompts(config)
    roles = sorted({P.role_of(a) for a in config.agents}, key=P.ROLES.index)
    demos = P.prompt_set(config.prompts).demos
    need, worst = max((len(chat.prompt(prompts[role], "", demos.get(role, ()))), role) for role in roles)
    minimum = need + config.max_turn_tokens + MIN_TURN_ROOM
    if config.max_context_tokens < minimum:
        raise ValueError(
            f"max_context_tokens={config.max_context_tokens} cannot hold the {worst}'s prompt "
            f"({need} tokens with this tokenizer), a max_turn_tokens={config.max_turn_tokens} turn "
            f"and {MIN_TURN_ROOM} tokens of room: use max_context_tokens >= {minimum} or a "
            "smaller max_turn_tokens")


def system_prompts(config: TeamConfig) -> dict[str, str]:
    """Each role's system prompt in the config's prompt set, filled with the team's budgets."""
    return {role: text.format(max_searchers=config.max_searchers, max_waves=config.max_waves,
                              max_searches=config.max_searcher_turns - 1)
            for role, text in P.prompt_set(config.prompts).system.items()}


@dataclass(frozen=True)
class Question:
    """The minimal view of a QA item the core needs (``envs.data.QAItem`` has it)."""

    id: str
    question: str
    golden_answers: tuple[str, ...] = ()
    dataset: str = ""

    @classmethod
    def of(cls, item: Any) -> Question:
        if isinstance(item, str):
            return cls(id="", question=item)
        answers = item.golden_answers
        return cls(str(item.id), item.question,
                   (answers,) if isinstance(answers, str) else tuple(answers),
                   getattr(item, "dataset", ""))


@dataclass
class TurnResult:
    """What one turn did; the AEC env copies it into ``infos``."""

    kind: str
    invalid: bool = False
    reason: str = ""
    query: str | None = None
    """The search query awaiting ``deliver`` (Searcher search turns only)."""
    note: str = ""
    """What the env did to the action before playing it (cut at its end or budget, ...)."""


class TurnMachine:
    """The turn state machine of one episode: its phase, who awaits a turn, the turns played;
    it writes the :class:`~envs.episode.Episode` record (``self.episode``) as it goes. Held by
    the AEC env as ``raw_env.core``. Create, then alternate ``awaiting`` / ``play`` (/ ``deliver``)."""

    def __init__(self, config: TeamConfig, chat: ChatFormat, question: Any, seed: int | None = None):
        self.config = config
        self.chat = chat
        self.question = Question.of(question)
        self.phase = "leader"
        self.episode = Episode(
            question={"id": self.question.id, "question": self.question.question,
                      "golden_answers": list(self.question.golden_answers),
                      "dataset": self.question.dataset},
            workflow=config.workflow, seed=seed, prompts=config.prompts,
            tag_counts=dict.fromkeys(P.TAGS, 0),
        )
        self.live: dict[str, Segment] = {}
        """The segment each agent is writing now."""
        self._live_index: dict[str, int] = {}
        """Where each live segment sits in ``episode.segments``."""
        self.awaiting: list[str] = []
        self.pending: dict[str, str] = {}
        """Searchers whose search awaits its passages."""
        self._wave_reports: list[tuple[int, str, str, int]] = []
        self.reports_shown: list[tuple[int, str, str, int]] = []
        """``(number, sub-task, report, wave)`` of every report handed back to the Leader."""
        self.passages: dict[str, list[list[Any]]] = {}
        """Each live Searcher's passages, one list per delivered search."""
        self.queries: dict[str, list[str]] = {}
        """Each live Searcher's search queries so far."""
        self.messages: dict[str, list[tuple[str, str]]] = {}
        """Each live agent's context as chat messages ``(role, content)``, recorded beside its
        token ids as they are appended (``envs.observation.Observation.messages``)."""
        self._prompts = system_prompts(config)
        text = self.question.question
        if config.workflow == "hierarchical":
            self._start("leader_0", -1, text, P.LEADER_USER.format(question=text))
        else:
            self.phase = "search"
            self._start("searcher_0", 0, text, P.SEARCHER_USER.format(task=text))
        self.awaiting = list(self.live)  # the one agent just started

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def context(self, agent: str) -> list[int]:
        """The agent's current context (empty for an agent that has not been given work)."""
        seg = self.live.get(agent)
        return seg.token_ids if seg is not None else []

    def chat_messages(self, agent: str) -> tuple[dict[str, str], ...]:
        """:attr:`messages` of ``agent`` as fresh ``{"role", "content"}`` dicts (none before it
        is given work)."""
        return tuple({"role": role, "content": content} for role, content in self.messages.get(agent, ()))

    def turn_budget(self, agent: str) -> int:
        """Most tokens the agent's next turn may have (leaves room for the closing token)."""
        room = self.config.max_context_tokens - len(self.context(agent)) - 1
        return max(1, min(self.config.max_turn_tokens, room))

    def play(self, agent: str, ids: Sequence[int], logprobs: Sequence[float] | None = None,
             text: str | None = None) -> TurnResult:
        """Apply one whole turn of ``agent``. ``text`` is the decoded turn, when known."""
        if agent not in self.awaiting:
            raise ValueError(f"{agent} is not awaiting a turn (awaiting: {self.awaiting})")
        seg = self.live[agent]
        ep = self.episode
        ep.input_tokens += len(seg.token_ids)
        ep.output_tokens += len(ids)
        ep.turns += 1
        seg.turns += 1
        start = len(seg.token_ids)
        seg.append(ids, generated=True, logprobs=logprobs)
        ep.turn_spans.append([self._live_index[agent], start, len(seg.token_ids)])
        seg.append(self.chat.closing(ids), generated=False)
        if text is None:
            text = self.chat.tokenizer.decode(list(ids), skip_special_tokens=True)
        self.messages[agent].append(("assistant", text))
        for tag, n in P.count_tags(text).items():
            ep.tag_counts[tag] += n
        handler = {P.LEADER: self._leader_turn, P.SEARCHER: self._searcher_turn,
                   P.ANSWERER: self._answerer_turn}[seg.role]
        result = handler(agent, seg, text)
        if result.invalid:
            seg.invalid_turns += 1
            ep.invalid_turns += 1
        return result

    def deliver(self, agent: str, passages: Sequence[Any]) -> None:
        """Hand a Searcher the passages of its pending search."""
        self.pending.pop(agent)
        self.passages[agent].append(list(passages))
        seg = self.live[agent]
        turns_left = self.config.max_searcher_turns - seg.turns
        if turns_left > 0 and self._observe(seg, P.render_passages(passages, turns_left)):
            self._await(agent)
        else:
            self._finish_searcher(agent, seg, "", valid=False)

    def fail_search(self, agent: str, error: BaseException | str) -> None:
        """The retriever failed on ``agent``'s pending search: the Searcher reads a short
        error message and goes on (the search still counts as made); the episode counts it."""
        self.pending.pop(agent)
        self.episode.search_failures += 1
        seg = self.live[agent]
        if seg.turns < self.config.max_searcher_turns and self._observe(seg, P.render_search_failure(error)):
            self._await(agent)
        else:
            self._finish_searcher(agent, seg, "", valid=False)

    def view(self, agent: str) -> dict[str, Any]:
        """What ``agent`` knows, as structure (``infos[agent]``; the keys are listed in
        ``envs.search_team``'s docstring): policies read it instead of parsing their context."""
        role = P.role_of(agent)
        seg = self.live.get(agent)
        cfg, ep = self.config, self.episode
        turns = seg.turns if seg is not None else 0
        view: dict[str, Any] = {"role": role, "question": self.question.question,
                                "task": seg.task if seg is not None else "", "turn": turns,
                                "wave": seg.wave if seg is not None else -1}
        if role == P.LEADER:
            view.update(reports=[(n, task, report, wave) for n, task, report, wave in self.reports_shown],
                        waves_done=ep.num_waves, waves_left=max(0, cfg.max_waves - ep.num_waves),
                        max_waves=cfg.max_waves, max_searchers=cfg.max_searchers,
                        turns_left=max(0, cfg.leader_turns - turns))
        elif role == P.SEARCHER:
            view.update(passages=[list(ps) for ps in self.passages.get(agent, [])],
                        queries=list(self.queries.get(agent, [])),
                        max_searches=cfg.max_searcher_turns - 1,
                        turns_left=max(0, cfg.max_searcher_turns - turns))
        else:
            view.update(evidence=[(n, ep.reports[n - 1].strip()) for n in ep.selection
                                  if ep.reports[n - 1].strip()],
                        turns_left=max(0, cfg.max_answerer_turns - turns))
        return view

    def _leader_turn(self, agent: str, seg: Segment, text: str) -> TurnResult:
        cfg = self.config
        parsed = P.parse_leader(text, len(self.episode.reports), cfg.max_searchers)
        if parsed.kind == "dispatch" and self.episode.num_waves >= cfg.max_waves:
            parsed = P.ParsedTurn("invalid", reason=P.NO_WAVES_REASON)
        if parsed.kind == "dispatch":
            self.awaiting.remove(agent)
            self._start_wave(parsed.subtasks)
            return TurnResult("dispatch")
        if parsed.kind == "select":
            seg.finished_validly = True
            self._start_answerers(list(parsed.selection))
            return TurnResult("select")
        return self._invalid(seg, cfg.leader_turns, parsed.reason, self._answer_every_report)

    def _searcher_turn(self, agent: str, seg: Segment, text: str) -> TurnResult:
        parsed = P.parse_searcher(text)
        if parsed.kind == "search":
            seg.num_searches += 1
            self.episode.num_searches += 1
            self.awaiting.remove(agent)
            self.pending[agent] = parsed.text
            self.queries[agent].append(parsed.text)
            return TurnResult("search", query=parsed.text)
        if parsed.kind == "summary":
            self._finish_searcher(agent, seg, parsed.text, valid=True)
            return TurnResult("summary")
        return self._invalid(seg, self.config.max_searcher_turns, parsed.reason,
                             lambda: self._finish_searcher(agent, seg, "", valid=False))

    def _answerer_turn(self, agent: str, seg: Segment, text: str) -> TurnResult:
        parsed = P.parse_answerer(text)
        if parsed.kind == "answer":
            seg.output, seg.finished_validly = parsed.text, True
            self._retire(agent)
            return TurnResult("answer")
        return self._invalid(seg, self.config.max_answerer_turns, parsed.reason,
                             lambda: self._retire(agent))

    def _invalid(self, seg: Segment, turns: int, reason: str,
                 end: Callable[[], None]) -> TurnResult:
        """An invalid turn: the role is told why (its format reminder), or ``end()``s once its
        ``turns`` are used or its context has no room for the message."""
        corrective = P.render_corrective(seg.role, reason, self.config.prompts)
        if seg.turns >= turns or not self._observe(seg, corrective):
            end()
        return TurnResult("invalid", invalid=True, reason=reason)

    def _start_wave(self, subtasks: Sequence[str]) -> None:
        self.phase = "search"
        wave = self.episode.num_waves
        self._wave_reports = []
        for i, task in enumerate(subtasks):
            agent = f"searcher_{i}"
            self._start(agent, wave, task, P.SEARCHER_USER.format(task=task))
            self.awaiting.append(agent)

    def _finish_searcher(self, agent: str, seg: Segment, report: str, valid: bool) -> None:
        seg.output, seg.finished_validly = report, valid
        self._retire(agent)
        ep = self.episode
        ep.reports.append(report)
        self._wave_reports.append((len(ep.reports), seg.task, report, seg.wave))
        if self.awaiting or self.pending:
            return
        ep.num_waves += 1
        if self.config.workflow == "cascade":
            self._start_answerers([1])
            return
        self.phase = "leader"
        leader = self.live["leader_0"]
        left = self.config.max_waves - ep.num_waves
        waves = [(n, task, report) for n, task, report, _ in self._wave_reports]
        if leader.turns < self.config.leader_turns and self._observe(leader, P.render_wave_results(waves, left)):
            self.reports_shown += self._wave_reports
            self._await("leader_0")
        else:
            self._answer_every_report()

    def _start_answerers(self, selection: list[int]) -> None:
        ep = self.episode
        ep.selection = selection
        self.awaiting = [a for a in self.awaiting if a != "leader_0"]
        self.phase = "answer"
        user = P.render_evidence(self.question.question, [(n, ep.reports[n - 1]) for n in selection])
        for j in range(self.config.num_candidates):
            agent = f"answerer_{j}"
            self._start(agent, -1, self.question.question, user)
            self.awaiting.append(agent)

    def _answer_every_report(self) -> None:
        """The Leader's budget or context ran out: the Answerers read every report."""
        self._start_answerers(list(range(1, len(self.episode.reports) + 1)))

    def _retire(self, agent: str) -> None:
        if agent in self.awaiting:  # a Searcher retired on its search results is pending
            self.awaiting.remove(agent)
        if self.phase == "answer" and not self.awaiting:
            self._score()

    def _score(self) -> None:
        """Role rewards at the end of the episode (PAPER.md sections 3-4)."""
        self.phase = "done"
        ep, rc = self.episode, self.config.rewards
        gold = self.question.golden_answers
        answerers = ep.segments_of(P.ANSWERER)
        ep.candidates = [s.output for s in answerers]
        ep.candidate_em = [exact_match(c, gold) if c else 0.0 for c in ep.candidates]
        ep.team_em = max(ep.candidate_em, default=0.0)
        ep.final_answer = majority_answer(ep.candidates)
        ep.final_em = exact_match(ep.final_answer, gold) if ep.final_answer else 0.0
        per_agent: dict[str, list[float]] = {a: [] for a in self.config.agents}
        for seg in ep.segments:
            if seg.role == P.LEADER:
                seg.reward = rc.leader_reward(ep.team_em, ep.num_searches)
            elif seg.role == P.SEARCHER:
                valid = seg.finished_validly and seg.invalid_turns == 0
                seg.reward = rc.searcher_reward(ep.team_em, seg.num_searches, valid)
            else:
                seg.reward = ep.candidate_em[int(seg.agent.rsplit("_", 1)[1])]
            per_agent[seg.agent].append(seg.reward)
        ep.rewards = {a: (sum(r) / len(r) if r else 0.0) for a, r in per_agent.items()}

    def _start(self, agent: str, wave: int, task: str, user: str) -> None:
        """Open a fresh context for ``agent`` (a new segment of the episode)."""
        role = P.role_of(agent)
        seg = Segment(agent=agent, role=role, wave=wave, task=task)
        system = self._prompts[role]
        demos = P.prompt_set(self.config.prompts).demos.get(role, ())
        ids, user = self._fit_prompt(system, user, demos)
        seg.append(ids, generated=False)
        self.live[agent] = seg
        self.messages[agent] = [("system", system)]
        for demo_user, demo_reply in demos:  # env text: a worked exchange, not the agent's turn
            self.messages[agent] += [("user", demo_user), ("assistant", demo_reply)]
        self.messages[agent].append(("user", user))
        if role == P.SEARCHER:
            self.passages[agent], self.queries[agent] = [], []
        self._live_index[agent] = len(self.episode.segments)
        self.episode.segments.append(seg)

    def _fit_prompt(self, system: str, user: str,
                    demos: Sequence[tuple[str, str]] = ()) -> tuple[list[int], str]:
        """The prompt's ids and the user text they hold, shortening over-long user text so a
        turn still fits (:func:`check_room` made sure that ``MIN_TURN_ROOM`` tokens are left)."""
        limit = self.config.max_context_tokens - self.config.max_turn_tokens - MIN_TURN_ROOM
        ids = self.chat.prompt(system, user, demos)
        for _ in range(64):  # each pass cuts about a fifth; the cap only guards a fixed point
            if len(ids) <= limit or len(user) <= 16:
                break
            shorter = user[: int(len(user) * 0.8 * limit / len(ids))] + " ..."
            if shorter == user:  # the " ..." put back what the cut took: no progress
                break
            user, ids = shorter, self.chat.prompt(system, shorter, demos)
        if len(ids) + MIN_TURN_ROOM > self.config.max_context_tokens:
            user, ids = "", self.chat.prompt(system, "", demos)  # even 16 characters did not fit
        return ids, user

    def _observe(self, seg: Segment, text: str) -> bool:
        """Append an env-written message; False when the context has no room left for it."""
        ids = self.chat.observation(text)
        if len(seg.token_ids) + len(ids) + MIN_TURN_ROOM > self.config.max_context_tokens:
            return False
        seg.append(ids, generated=False)
        self.messages[seg.agent].append(("user", text))
        return True

    def _await(self, agent: str) -> None:
        """Put ``agent`` back among the awaiting, keeping the cycle order."""
        order = self.config.agents
        self.awaiting.append(agent)
        self.awaiting.sort(key=order.index)
