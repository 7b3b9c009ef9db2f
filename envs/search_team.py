"""SearchTeam: an LLM agent team answers open-domain questions with a retriever.

This module's docstring is the environment's documentation page.

==================  ===========================================================
Import              ``from envs import search_team_v0``
Agents              hierarchical: ``leader_0``, ``searcher_0..K-1``, ``answerer_0..C-1``;
                    cascade: ``searcher_0``, ``answerer_0..C-1``
Actions (turn)      ``Sequence(Discrete(V), stack=True)``: one whole turn of token ids
                    (a ``str``, an ``agents.Action`` or a dict ``{"token_ids", "logprobs"}``
                    is accepted too; text is tokenised once)
Actions (token)     ``Discrete(V)``: one token id (or ``{"token_id", "logprob"}``)
Observations        ``Dict(observation=Box(0, V-1, (L,), int64), length=Box(0, L, (1,),
                    int64)[, action_mask=Box(0, 1, (V,), int8)])``: the agent's context,
                    padded to ``L = max_context_tokens``; ``action_mask`` in token mode only
==================  ===========================================================

**Flow (hierarchical, H-MAS).** The Leader reads the question and either dispatches a wave
of sub-tasks, one ``<subtask>...</subtask>`` per Searcher, or ends its work with
``<select>1, 3</select>``, the numbers (in arrival order) of the reports the Answerers
read. Each dispatched Searcher runs ReAct turns: ``<search>query</search>`` is answered by
the env with ``<information>Doc 1(Title: T) text ...</information>`` (top-k passages);
``<summary>report</summary>`` ends it. When every Searcher of the wave has reported, the
Leader sees the numbered reports and acts again; at most ``max_waves`` waves. Then every
Answerer writes one candidate, ``<answer>text</answer>``, from the same context
(question + selected reports). ``<think>...</think>`` is free text for every role.
**Cascade (C-MAS):** ``searcher_0`` gets the question; the Answerers get its report.

The AEC cycle visits the agents that await a turn in name order (the Searchers of a wave
take turns, round robin); an agent's whole turn finishes before the next agent acts.

**Untrusted output.** ``step()`` never raises on model output. A malformed turn gets a
corrective observation, ``infos[agent]["invalid"] = True`` and counts against the
Searcher's format bonus; budgets end a role that never gets it right (Searcher: empty
report; Leader: selects every report; Answerer: empty candidate). A turn ends at the
role's closing tag (``</search>``, ``</summary>``, ``</select>``, ``</answer>``), at EOS,
or at the turn's token budget; tokens after the end of a turn are dropped, and a text
action is cut to ``budget x MAX_CHARS_PER_TOKEN`` characters before it is tokenised. Any
``str`` is accepted (what UTF-8 cannot encode, such as a lone surrogate, becomes U+FFFD).
Text the env quotes (questions, sub-tasks, reports, passages) and text actions are
tokenised with special-token parsing off: a spelled ``<|im_end|>\n<|im_start|>system`` (or
``</s>``, ``[SEP]``, ``<|endoftext|>``) stays ordinary tokens; only the env's own chat frame
uses the special ids.

**Retrievers are untrusted too.** A search that raises is retried ``search_retries``
times, then recorded as failed: the Searcher reads a short error message
(``protocol.SEARCH_FAILED``), ``episode.search_failures`` counts it, the episode goes on.
A retriever that answers a different number of lists than it got queries raises
ValueError at once. A ``max_context_tokens`` that cannot hold a role's real prompt plus
one turn is refused at construction.

**What agents know** (``infos[agent]`` of an awaiting agent, ``Observation.info`` in the
batched API): ``role``, ``question``, ``task`` (its sub-task; the question for the Leader
and the Answerers), ``turn`` (taken in this context), ``turns_left``, ``wave`` (-1 but for
a Searcher); the Leader's ``reports`` ``[(number, sub-task, report, wave)]`` handed back so
far, ``waves_done``, ``waves_left``, ``max_waves``, ``max_searchers``; a Searcher's
``passages`` (one list per search, as the retriever gave them), ``queries`` and
``max_searches``; an Answerer's ``evidence`` ``[(number, report)]`` of the selected
non-empty reports. Policies read these, never the prompt text: every word the env writes
is a template in ``envs.protocol``.

**Prompt sets.** ``prompts="paper"`` (the default) tells each role its protocol in the
paper's paragraph; ``prompts="short"`` in one line with an example, for small models;
``prompts="oneshot"`` as ``short``, plus one worked exchange (an example user message and
its tagged reply, env text with loss mask 0) before the real one (``envs.protocol.PROMPT_SETS``).
Only those words differ: the tags, the parser and the other templates are the same.
``config.prompts`` and every ``episode.prompts`` record the set.

**One turn path, a batched API.** ``envs.turns.apply_turns`` is the only code that
plays a turn; ``step()`` calls it for one agent, ``play_turns`` for several agents of one
env, and ``agents.collect`` for every awaiting agent of many envs (one retriever call per
batch). ``awaiting``, ``turn_observations()``, ``view(agent)``, ``done`` and ``episode``
are the rest of the batched API. Make envs with ``envs.make_env(**kwargs)`` or, for
collectors, ``envs.env_fn(**kwargs)``.

**Step modes.** ``turn``: one step is one whole turn. ``token``: one step is one token;
the mask allows every token until the turn's budget is reached, where it allows only EOS.
The same token streams give identical Episodes in both modes.

**Rewards** (all agents, at the end; weights in ``RewardConfig``): each Answerer gets its
candidate's exact match; the Leader ``0.9 R_EM + 0.1 min(C_tool, 6)/6``; a Searcher
``0.9 R_EM + 0.1 b_S`` (b_S = 0 / 0.5 / 1 after 0 / 1 / 2+ searches, -1 for an invalid
format), averaged over the waves it served. ``R_EM`` = 1 when any candidate is correct
(SQuAD-normalised EM against every gold answer). The team's final answer is the majority
candidate (ties: the first).

**Records.** ``env.unwrapped.episode`` (and ``infos[agent]["episode"]`` at the end) is the
:class:`envs.episode.Episode`: per segment the exact token ids, role, wave, loss mask and
behaviour log-probs; per episode R_EM, candidates, final answer and cost counters.

**Version history.** v0: first release.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium.utils import seeding
from pettingzoo import AECEnv
from pettingzoo.utils import wrappers

from envs import protocol as P
from envs.chat import ChatFormat, TurnEnder, chat_format
from envs.episode import Episode
from envs.observation import Observation
from envs.team import TeamConfig, TurnMachine, TurnResult, check_room
from envs.terminal import safe_print
from envs.turns import PreparedTurn, apply_turns

STEP_MODES = ("turn", "token")
_short = functools.partial(P.short_repr, width=60)  # a value in an error message
MAX_CHARS_PER_TOKEN = 128
"""A text action is cut to ``turn budget x MAX_CHARS_PER_TOKEN`` characters before it is
tokenised (no token of SmolLM2's or the micro vocabulary spans more than 81), so a huge
string costs no more than a full turn."""


def env(**kwargs: Any) -> AECEnv:
    """The wrapped environment (order enforcing), the PettingZoo way."""
    return wrappers.OrderEnforcingWrapper(raw_env(**kwargs))


def make_env(*, wrapped: bool = False, **kwargs: Any) -> Any:
    """The one env factory: a SearchTeam env with ``raw_env``'s keyword arguments
    (``wrapped=True`` adds PettingZoo's order enforcing, as :func:`env` does)."""
    return env(**kwargs) if wrapped else raw_env(**kwargs)


def env_fn(**kwargs: Any) -> Callable[[], Any]:
    """A function that makes one env with these arguments (picklable; for
    ``agents.collect``, trainers and benchmarks, which make many copies)."""
    return functools.partial(make_env, **kwargs)


def agent_spaces(L: int, V: int, step_mode: str = "turn") -> tuple[gymnasium.spaces.Dict, Any]:
    """One agent's (observation, action) spaces, new objects: the table above, for contexts
    of ``L`` tokens of a ``V``-token vocabulary."""
    box = gymnasium.spaces.Box
    spaces = {"observation": box(0, V - 1, (L,), np.int64), "length": box(0, L, (1,), np.int64)}
    if step_mode == "token":
        spaces["action_mask"] = box(0, 1, (V,), np.int8)
        return gymnasium.spaces.Dict(spaces), gymnasium.spaces.Discrete(V)
    return gymnasium.spaces.Dict(spaces), gymnasium.spaces.Sequence(gymnasium.spaces.Discrete(V),
                                                                    stack=True)


@functools.lru_cache(maxsize=1)
def default_tokenizer() -> Any:
    from envs.tokenizer import load_tokenizer

    return load_tokenizer()


@functools.lru_cache(maxsize=1)
def default_questions() -> tuple[Any, ...]:
    """The synthetic world's training questions, all seven styles."""
    from envs.data.synthwiki import default_world

    world = default_world()
    return tuple(q for qs in world.all_questions("train").values() for q in qs)


class raw_env(AECEnv):
    """The SearchTeam AEC environment; see the module docstring."""

    metadata = {"render_modes": ["human", "ansi"], "name": "search_team_v0",
                "is_parallelizable": False}

    def __init__(
        self,
        *,
        step_mode: str = "turn",
        tokenizer: Any = None,
        retriever: Any = None,
        questions: Sequence[Any] | None = None,
        render_mode: str | None = None,
        search_retries: int = 2,
        search_backoff: float = 0.1,
        **team: Any,
    ):
        """``team``: the team's shape and budgets, each field of :class:`envs.team.TeamConfig`
        by name, with its default (``workflow``, ``max_waves``, ``max_searchers``, ...,
        ``rewards`` as a ``RewardConfig`` or a dict of its fields, ``prompts``); declared
        there once. Any other keyword is a TypeError naming it."""
        super().__init__()
        self.config = TeamConfig.from_keywords(**team)
        if step_mode not in STEP_MODES:
            raise ValueError(f"step_mode must be one of {STEP_MODES}, got {step_mode!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None, 'human' or 'ansi', got {render_mode!r}")
        self.step_mode = step_mode
        self.render_mode = render_mode
        self.tokenizer = tokenizer if tokenizer is not None else default_tokenizer()
        if retriever is None:  # MiniLM over the synthetic world's corpus, one per process
            from envs.retrieval.factory import default_retriever

            retriever = default_retriever()
        self.retriever = retriever
        self.questions = list(questions) if questions is not None else list(default_questions())
        if not self.questions:
            raise ValueError("questions is empty: give at least one QA item (or None for the synthetic world)")
        self.chat = chat_format(self.tokenizer)  # shared by the env copies: its frame cache too
        self.vocab_size = len(self.tokenizer)
        self.eos_id = self.chat.end_id
        self.ender = TurnEnder(self.tokenizer, [self.eos_id, self.tokenizer.eos_token_id])
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        check_room(self.config, self.chat)
        if not isinstance(search_retries, int) or search_retries < 0:
            raise ValueError(f"search_retries must be an int >= 0, got {search_retries!r}")
        if not np.isfinite(search_backoff) or search_backoff < 0:
            raise ValueError(f"search_backoff must be a finite number >= 0, got {search_backoff!r}")
        self.search_retries, self.search_backoff = search_retries, float(search_backoff)

        self.possible_agents = self.config.agents
        self._eos_only = np.zeros(self.vocab_size, dtype=np.int8)
        self._eos_only[self.eos_id] = 1
        self.core: TurnMachine | None = None
        self.np_random, _ = seeding.np_random(None)

    @property
    def observation_spaces(self) -> dict[str, gymnasium.spaces.Space]:
        return self._spaces[0]

    @property
    def action_spaces(self) -> dict[str, gymnasium.spaces.Space]:
        return self._spaces[1]

    @functools.cached_property
    def _spaces(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Each agent's spaces, built on first use: gymnasium's constructors are 60% of
        making an env, and rollouts (which make many copies) never ask for them."""
        L, V = self.config.max_context_tokens, self.vocab_size
        spaces = [agent_spaces(L, V, self.step_mode) for _ in self.possible_agents]
        return tuple(dict(zip(self.possible_agents, s)) for s in zip(*spaces))

    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.action_spaces[agent]

    @property
    def episode(self) -> Episode | None:
        """The current (or last) episode's record."""
        return None if self.core is None else self.core.episode

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        if seed is not None:
            self.np_random, _ = seeding.np_random(seed)
        question = (options or {}).get("question")
        if question is None:
            question = self.questions[int(self.np_random.integers(len(self.questions)))]
        self.core = TurnMachine(self.config, self.chat, question, seed=seed)
        self.agents = self.possible_agents[:]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {"role": P.role_of(a)} for a in self.agents}
        self._buffers: dict[str, tuple[list[int], list[float] | None]] = {}
        self._log: list[str] = [P.LOG_QUESTION.format(question=self.core.question.question)]
        self._rendered = 0
        self.agent_selection = self.core.awaiting[0]
        self._update_views()

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        out = self.padded(self.context(agent))
        if self.step_mode == "token":
            out["action_mask"] = self.action_mask(agent)
        return out

    def padded(self, context: Sequence[int]) -> dict[str, np.ndarray]:
        """``{"observation": context padded to max_context_tokens, "length": [len]}``."""
        obs = np.full(self.config.max_context_tokens, self.pad_id, dtype=np.int64)
        obs[: len(context)] = context
        return {"observation": obs, "length": np.array([len(context)], dtype=np.int64)}

    # Collectors, trainers, wrappers and benchmarks drive the env through these (and
    # ``envs.turns.apply_turns`` across many envs); the AEC ``step`` is one of them.

    @property
    def awaiting(self) -> list[str]:
        """The agents that await a turn now, in cycle order (empty before reset and at the end)."""
        return [] if self.core is None else list(self.core.awaiting)

    @property
    def done(self) -> bool:
        """Whether the current episode has ended (False before the first reset)."""
        return self.core is not None and self.core.done

    @property
    def phase(self) -> str:
        """``leader``, ``search``, ``answer`` or ``done`` (``""`` before reset)."""
        return "" if self.core is None else self.core.phase

    @property
    def question(self) -> Any:
        """The current episode's question (``envs.team.Question``), None before reset."""
        return None if self.core is None else self.core.question

    def view(self, agent: str) -> dict[str, Any]:
        """What ``agent`` knows (the module docstring's list); ``infos[agent]`` holds it too."""
        self._require_reset()
        return self.core.view(agent)

    def turn_observation(self, agent: str, env_index: int = 0) -> Observation:
        """The record a batched policy gets for ``agent``: its context (whole turns only),
        stop strings, turn budget and :meth:`view` as ``info``."""
        self._require_reset()
        role = P.role_of(agent)
        return Observation(agent=agent, role=role,
                           token_ids=np.asarray(self.core.context(agent), dtype=np.int64),
                           stop=P.STOP_STRINGS[role], max_new_tokens=self.core.turn_budget(agent),
                           env_index=env_index, decode=self.tokenizer.decode, info=self.core.view(agent),
                           messages=self.core.chat_messages(agent))

    def messages(self, agent: str) -> tuple[dict[str, str], ...]:
        """``agent``'s context (whole turns) as chat messages ``{"role", "content"}``, unquoted
        (``envs.observation.Observation.messages`` says more)."""
        self._require_reset()
        return self.core.chat_messages(agent)

    def turn_observations(self, env_index: int = 0) -> list[Observation]:
        """One :meth:`turn_observation` per awaiting agent, in cycle order."""
        return [self.turn_observation(a, env_index) for a in self.awaiting]

    def play_turns(self, turns: Sequence[tuple[str, Any]]) -> list[TurnResult]:
        """Apply whole turns ``(agent, action)`` of awaiting agents, then answer their
        searches in one retriever call: :func:`envs.turns.apply_turns` on this env alone."""
        return apply_turns([(self, agent, action) for agent, action in turns])

    def turn_refusal(self, agent: str, action: Any, *, any_action: bool = False) -> str:
        """Why ``agent`` cannot play ``action`` now (not reset, not awaiting, or unless
        ``any_action`` an action of no accepted form; out-of-vocabulary ids are model output,
        played as an invalid turn), or ``""``. Changes nothing."""
        if self.core is None:
            return "the env was not reset"
        if agent not in self.core.awaiting:
            return f"{agent!r} is not awaiting a turn (awaiting: {self.core.awaiting})"
        return "" if any_action else _form_error(action)

    def context(self, agent: str) -> list[int]:
        """The agent's context, including the turn it is writing (token mode)."""
        base = self.core.context(agent) if self.core is not None else []
        buf = self._buffers.get(agent)
        return base + buf[0] if buf else list(base)

    def context_text(self, agent: str) -> str:
        """The agent's context as text, for people."""
        return self.tokenizer.decode(self.context(agent))

    def action_mask(self, agent: str) -> np.ndarray:
        """Every token, until the turn's budget is reached; then only EOS."""
        used = len(self._buffers.get(agent, ([], None))[0])
        if self.core is not None and used >= self.core.turn_budget(agent) - 1:
            return self._eos_only.copy()
        return np.ones(self.vocab_size, dtype=np.int8)

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        if self.step_mode == "token":
            turn = self._token_step(agent, action)
            if turn is not None:
                apply_turns([(self, agent, turn)])
        else:
            apply_turns([(self, agent, action)], any_action=True)  # step() takes any action
        self._accumulate_rewards()

    def prepare_turn(self, agent: str, action: Any) -> PreparedTurn:
        """A whole turn from any accepted action form, cut at its end and at its budget:
        (token ids, log-probs or None, note). Never raises on the action."""
        self._require_reset()
        if isinstance(action, PreparedTurn):
            return action
        budget = self.core.turn_budget(agent)
        ids, lps, note = _turn_ids(action, self.chat, self.vocab_size, budget)
        end = self.ender.first_end(ids[:budget], P.STOP_STRINGS[P.role_of(agent)])
        if end is not None and end + 1 < len(ids):
            note = note or f"{len(ids) - end - 1} tokens after the end of the turn were dropped"
            ids, lps = ids[: end + 1], None if lps is None else lps[: end + 1]
        if len(ids) > budget:
            note = note or f"turn cut to its budget of {budget} tokens"
            ids, lps = ids[:budget], None if lps is None else lps[:budget]
        return PreparedTurn(ids, lps, note)

    def _token_step(self, agent: str, action: Any) -> PreparedTurn | None:
        """Append one token; return the whole turn once it has ended."""
        token, logprob = _token_of(action)
        note = ""
        if token is None or not 0 <= token < self.vocab_size:
            note = f"not a token id in [0, {self.vocab_size}): {_short(action)}; EOS used"
            token, logprob = self.eos_id, None
        ids, lps = self._buffers.get(agent) or ([], [])
        ids.append(token)
        if lps is not None and logprob is not None:
            lps.append(logprob)
        else:
            lps = None
        self._buffers[agent] = (ids, lps)
        budget = self.core.turn_budget(agent)
        if not (self.ender.ends_at(ids, len(ids) - 1, P.STOP_STRINGS[P.role_of(agent)])
                or len(ids) >= budget):
            return None
        del self._buffers[agent]
        return PreparedTurn(ids, lps, note)

    # The three steps of a turn, in the order ``envs.turns.apply_turns`` calls them;
    # that function is the only caller, so a turn is done one way in every mode.

    def begin_turn(self, agent: str, action: Any) -> TurnResult:
        """Cut, record and parse ``agent``'s turn; a search is left pending for
        :meth:`end_search`. Raises ValueError if ``agent`` does not await a turn."""
        ids, lps, note = self.prepare_turn(agent, action)  # RuntimeError before a reset
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        result = self.core.play(agent, ids, lps, text=text)
        result.note = note
        seg = self.core.live[agent]
        self._log.append(P.LOG_TURN.format(agent=agent, text=text))
        if result.invalid:
            self._log.append(P.LOG_INVALID.format(reason=result.reason))
        self.infos[agent] = {"role": seg.role, "kind": result.kind, "invalid": result.invalid,
                             "reason": result.reason, "turn": seg.turns, "wave": seg.wave,
                             "text": text, "note": note}
        return result

    def end_search(self, agent: str, passages: Sequence[Any] | None, error: BaseException | None = None) -> None:
        """Hand ``agent`` the passages of its pending search, or (``passages`` None) tell
        it the search failed with ``error``."""
        if passages is None:
            self.core.fail_search(agent, error if error is not None else "no answer")
            self._log.append("  " + P.render_search_failure(error or "no answer"))
            self.infos[agent] = {**self.infos.get(agent, {}), "search_error": str(error)}
        else:
            self.core.deliver(agent, passages)
            self._log.append("  " + P.render_passages(passages))

    def settle(self, agent: str) -> None:
        """After a batch of turns (``agent`` played last here): score a finished episode,
        or select the next awaiting agent after ``agent``; refresh the awaiting agents' infos."""
        if self.core.done:
            self._finish()
        else:
            self.agent_selection = self._next_agent(agent)
            self._update_views()

    def _update_views(self) -> None:
        for a in self.core.awaiting:
            self.infos[a] = {**self.infos[a], **self.core.view(a)}

    def _require_reset(self) -> None:
        if self.core is None:
            raise RuntimeError("call reset() before driving the env")

    def _next_agent(self, current: str) -> str:
        """The next awaiting agent after ``current`` in cycle order (round robin)."""
        order = self.possible_agents
        start = order.index(current) + 1
        for candidate in order[start:] + order[:start]:
            if candidate in self.core.awaiting:
                return candidate
        raise RuntimeError(f"no agent awaits a turn in phase {self.core.phase!r}")  # a core bug

    def _finish(self) -> None:
        ep = self.core.episode
        self.rewards = {a: float(ep.rewards.get(a, 0.0)) for a in self.agents}
        for a in self.agents:
            self.terminations[a] = True
            self.infos[a] = {**self.infos[a], "episode": ep}
        self._log.append(P.LOG_OUTCOME.format(candidates=ep.candidates, final=ep.final_answer,
                                              gold=ep.question["golden_answers"], team_em=ep.team_em))
        self._log.append(P.render_rewards(self.rewards))
        self.agent_selection = self.agents[0]

    def render(self) -> str | None:
        """What happened since the last render: turns, retrieved passages, the outcome."""
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without a render_mode; pass render_mode='ansi' or 'human'")
            return None
        lines = self._log[self._rendered:] if self.core is not None else ["(not reset)"]
        self._rendered = len(self._log)
        text = P.clean_text("\n".join(lines)) if lines else f"(phase {self.core.phase}, awaiting {self.core.awaiting})"
        if self.render_mode == "human":  # passages may hold escape sequences: shown, not obeyed
            safe_print(text)
            return None
        return text


def _token_of(action: Any) -> tuple[int | None, float | None]:
    """(token id, log-prob) from an int, a 0-d array, an object or a dict; None if garbage."""
    logprob = None
    if isinstance(action, dict):
        action, logprob = action.get("token_id"), action.get("logprob")
    elif hasattr(action, "token_id"):
        action, logprob = action.token_id, getattr(action, "logprob", None)
    try:
        arr = np.asarray(action)
        if arr.size != 1 or not np.issubdtype(arr.dtype, np.integer):
            return None, None
        return int(arr.reshape(())), None if logprob is None else float(logprob)
    except (TypeError, ValueError):
        return None, None


def _unpack(action: Any) -> tuple[Any, Any, Any]:
    """(token ids, log-probs, text) of any action form, each None where it has none."""
    if isinstance(action, dict):
        return action.get("token_ids"), action.get("logprobs"), action.get("text")
    if hasattr(action, "token_ids") or hasattr(action, "text"):
        return (getattr(action, "token_ids", None), getattr(action, "logprobs", None),
                getattr(action, "text", None))
    if isinstance(action, str):
        return None, None, action
    return action, None, None


def _id_array(ids: Any) -> np.ndarray | None:
    """``ids`` as a 1-D integer array, or None when they are not one."""
    try:
        arr = np.asarray(ids)
    except (TypeError, ValueError):
        return None
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        return None
    return arr


def _form_error(action: Any) -> str:
    """Why ``action`` has none of the accepted forms of a whole turn, or ``""``."""
    if isinstance(action, PreparedTurn):
        return ""
    ids, _, text = _unpack(action)
    if ids is None:
        return "" if isinstance(text, str) else f"not a turn: {_short(action)}"
    return "" if _id_array(ids) is not None else f"not a 1-D sequence of token ids: {_short(ids)}"


def _turn_ids(action: Any, chat: ChatFormat, vocab: int,
              budget: int) -> tuple[list[int], list[float] | None, str]:
    """(token ids, log-probs or None, note) of a whole turn; garbage gives an empty turn.
    Work stops at ``budget``: a text is cut to ``budget * MAX_CHARS_PER_TOKEN`` characters
    before it is tokenised, token ids past the budget are not looked at."""
    error = _form_error(action)
    if error:
        return [], None, error
    ids, logprobs, text = _unpack(action)
    if ids is None:
        return chat.encode(text[: budget * MAX_CHARS_PER_TOKEN]), None, ""
    arr = _id_array(ids)
    full = arr.size
    arr = arr[: budget + 1]  # one past the budget, so the cut in prepare_turn can say it cut
    if arr.size and (arr.min() < 0 or arr.max() >= vocab):
        return [], None, f"token ids outside [0, {vocab}): {_short(ids)}"
    out = arr.astype(np.int64).tolist()
    try:  # log-probs that are not one finite number per token id are dropped
        lps = np.asarray(logprobs, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return out, None, ""
    keep = logprobs is not None and lps.size == full and np.isfinite(lps[: len(out)]).all()
    return out, lps[: len(out)].tolist() if keep else None, ""
