"""SearchTeam as an OpenEnv environment: one step is one whole turn of one agent.

Every session holds its own ``raw_env`` (one per workflow it has played) and its own copy
of the tokenizer; the retriever is built once, before serving, and shared. A turn is
played by ``raw_env.play_turns``, the env's one turn path, so a session's Episodes equal
those of the in-process PettingZoo loop for the same turns. Nothing a client sends raises
(docs/ecosystems.md, "What never raises"): a refusal is ``last_turn = {"played": False,
"invalid": True, "reason": ...}`` and changes nothing.

One client's cost is bounded: a reset's question is cut to what a prompt can hold
(:func:`cut_question`) before it is tokenised, and its other fields are bounded
(:data:`MAX_ANSWERS`, :data:`MAX_FIELD_CHARS`). Plain HTTP routes share one env, one
request at a time (a concurrent one is refused), keeping no episode between requests. A
WebSocket session silent for ``idle_timeout_s`` is dropped, freeing its place; it answers
every later request with a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import math
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from envs.__main__ import package_version
from envs.openenv.models import (
    SearchTeamAction,
    SearchTeamObservation,
    SearchTeamState,
    tokenizer_identity,
)
from envs.search_team import MAX_CHARS_PER_TOKEN, _short, default_tokenizer, make_env
from envs.team import MIN_TURN_ROOM, WORKFLOWS, Question

ENV_NAME = "search_team"
RESET_OPTIONS = ("seed", "episode_id", "question", "workflow")
DEFAULT_IDLE_TIMEOUT_S = 300.0
"""A WebSocket session silent this long (no reset, step or state) is dropped."""
MAX_ANSWERS = 64
"""Most golden answers a reset's question may carry."""
MAX_FIELD_CHARS = 256
"""Longest ``id`` and ``dataset`` of a reset's question."""


class SearchTeamEnvironment(Environment[SearchTeamAction, SearchTeamObservation, SearchTeamState]):
    """One session's SearchTeam. ``env_kwargs`` are ``envs.make_env``'s (give ``tokenizer``
    and ``retriever`` objects to share them between sessions, as :func:`make_app` does);
    ``workflow`` is the default a reset may change."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, **env_kwargs: Any):
        super().__init__()
        self.env_kwargs = dict(env_kwargs)
        self.workflow = self.env_kwargs.pop("workflow", "hierarchical")
        shared = self.env_kwargs.pop("tokenizer", None) or default_tokenizer()
        self.identity = tokenizer_identity(shared)
        # A session's own copy: a tokenizer shared by session threads returned wrong ids
        # (docs/ecosystems.md, "Pitfalls, measured").
        self.env_kwargs["tokenizer"] = copy.deepcopy(shared)
        self._envs: dict[str, Any] = {}
        self.env = self._env_for(self.workflow)
        self._state = SearchTeamState(workflow=self.workflow)
        self._closed = ""  # why this session no longer plays ("" while it does)
        self._busy = 0  # requests in progress
        self._last_request = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since this session's last request ended (0 while one is in progress)."""
        return 0.0 if self._busy else time.monotonic() - self._last_request

    @contextlib.contextmanager
    def _request(self) -> Iterator[None]:
        """A request in progress: the session is not idle until it ends."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            self._last_request = time.monotonic()

    def close(self, reason: str = "the session was closed") -> None:
        """Drop the episode and the envs (the tokenizer copy goes with them); every later
        request is answered with a refusal naming ``reason``."""
        self._closed = self._closed or reason
        self._envs = {}
        self.env = _NO_ENV

    def _env_for(self, workflow: str) -> Any:
        if workflow not in self._envs:
            first = next(iter(self._envs.values()), None)
            shared = {} if first is None else {"retriever": first.retriever}
            self._envs[workflow] = make_env(**{**shared, **self.env_kwargs, "workflow": workflow})
        return self._envs[workflow]

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              question: Mapping[str, Any] | str | None = None, workflow: str | None = None,
              **options: Any) -> SearchTeamObservation:
        """A new episode. ``question``: a QA row ``{"question", "golden_answers", "id",
        "dataset"}`` or a plain question (None: drawn from the env's questions with
        ``seed``); ``workflow``: hierarchical or cascade (None: the server's). A bad option
        changes nothing and is answered with ``last_turn.invalid``."""
        with self._request():
            if self._closed:
                return self._observe(_refused("", self._closed))
            reason = _reset_refusal(seed, episode_id, workflow, options)
            item = None
            if not reason and question is not None:
                item, reason = _question_of(question)
            if reason:
                return self._observe(_refused("", "reset refused: " + reason))
            self.env = self._env_for(workflow or self.workflow)
            if item is not None:  # cut to what a prompt can hold (TurnMachine._fit_prompt's limit)
                cfg = self.env.config
                budget = max(1, cfg.max_context_tokens - cfg.max_turn_tokens - MIN_TURN_ROOM)
                item = dataclasses.replace(item, question=cut_question(item.question,
                                                                       self.env.tokenizer, budget))
            self.env.reset(seed=seed, options={"question": item} if item is not None else None)
            self._state = SearchTeamState(episode_id=episode_id or str(uuid.uuid4()), step_count=0,
                                          workflow=self.env.config.workflow)
            return self._observe({}, metadata=dict(self.identity))

    def step(self, action: SearchTeamAction, timeout_s: float | None = None,
             **kwargs: Any) -> SearchTeamObservation:
        """Play ``action.agent``'s whole turn (default: the agent the last observation
        named). Refusals play nothing: see the module docstring."""
        with self._request():
            if self._closed:
                return self._observe(_refused(getattr(action, "agent", "") or "", self._closed))
            raw = self.env
            agent = (getattr(action, "agent", "")
                     or (raw.agent_selection if raw.core is not None else ""))
            reason = _action_refusal(action)
            if not reason and raw.core is None:
                reason = ("call reset first (plain HTTP requests keep no episode between them: "
                          "use a WebSocket session)")
            elif not reason and raw.done:
                reason = "the episode is over: call reset"
            turn: Any = None
            if not reason:
                turn = action.text if action.token_ids is None else {
                    "token_ids": list(action.token_ids), "logprobs": action.logprobs}
                reason = raw.turn_refusal(agent, turn)
            if reason:
                return self._observe(_refused(agent, reason))
            try:
                [result] = raw.play_turns([(agent, turn)])
            except ValueError as err:  # the batch check refused it after all: nothing was played
                return self._observe(_refused(agent, str(err)))
            self._state.step_count += 1
            return self._observe({"agent": agent, "played": True, "kind": result.kind,
                                  "invalid": bool(result.invalid), "reason": result.reason,
                                  "note": result.note})

    @property
    def state(self) -> SearchTeamState:
        self._last_request = time.monotonic()  # asking for the state is activity too
        raw, st = self.env, self._state
        ep = raw.episode
        st.question_id = "" if ep is None else str(ep.question.get("id", ""))
        st.phase, st.awaiting, st.done = raw.phase, raw.awaiting, raw.done
        st.num_searches = 0 if ep is None else ep.num_searches
        st.num_waves = 0 if ep is None else ep.num_waves
        return st

    def get_metadata(self) -> EnvironmentMetadata:
        ident = self.identity
        return EnvironmentMetadata(
            name=ENV_NAME, version=package_version(),
            description=("SearchTeam (mopd): a Leader, Searchers and Answerers answer a question "
                         "with a retriever. One step = one whole turn of the agent the observation "
                         "names; the final observation carries per-agent rewards and the episode "
                         f"record. Tokenizer {ident['tokenizer']} (vocab {ident['vocab_size']}, "
                         f"sha256 {ident['vocab_hash'][:16]}); the reset observation's metadata "
                         "carries the full identity."),
            documentation_url="docs/ecosystems.md")

    def _observe(self, last_turn: dict[str, Any], metadata: dict[str, Any] | None = None) -> SearchTeamObservation:
        raw = self.env
        base = {"last_turn": last_turn, "metadata": metadata or {}}
        if raw.core is None:
            return SearchTeamObservation(**base)
        if raw.done:
            ep = raw.episode
            return SearchTeamObservation(**base, done=True, reward=float(ep.final_em),
                                         rewards={a: float(r) for a, r in ep.rewards.items()},
                                         episode=ep.to_dict())
        agent = raw.agent_selection
        obs = raw.turn_observation(agent)
        ids = obs.token_ids.tolist()
        return SearchTeamObservation(
            **base, agent=agent, role=obs.role, awaiting=raw.awaiting, token_ids=ids,
            text=raw.tokenizer.decode(ids), messages=[dict(m) for m in obs.messages], stop=list(obs.stop),
            max_new_tokens=int(obs.max_new_tokens), info=json_safe(obs.info))


def _refused(agent: str, reason: str) -> dict[str, Any]:
    return {"agent": agent, "played": False, "kind": "refused", "invalid": True, "reason": reason, "note": ""}


def _action_refusal(action: Any) -> str:
    if not isinstance(action, SearchTeamAction):
        return f"not a SearchTeamAction: {type(action).__name__}"
    if action.malformed:
        return action.malformed
    if (action.text is None) == (action.token_ids is None):
        return "give exactly one of text and token_ids"
    if action.logprobs is not None:
        if action.token_ids is None:
            return "logprobs come only with token_ids"
        if len(action.logprobs) != len(action.token_ids):
            return f"logprobs has {len(action.logprobs)} values for {len(action.token_ids)} token ids"
        if not all(math.isfinite(x) and x <= 0 for x in action.logprobs):
            return "logprobs must be finite and <= 0"
    return ""


def _reset_refusal(seed: Any, episode_id: Any, workflow: Any, options: dict[str, Any]) -> str:
    if options:
        return f"unknown options {sorted(options)[:5]}; expected some of {list(RESET_OPTIONS)}"
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        return f"seed must be an int >= 0 or null, got {_short(seed)}"
    if episode_id is not None and not isinstance(episode_id, str):
        return f"episode_id must be a string, got {_short(episode_id)}"
    if workflow is not None and workflow not in WORKFLOWS:
        return f"workflow must be one of {WORKFLOWS}, got {_short(workflow)}"
    return ""


def _question_of(question: Any) -> tuple[Question | None, str]:
    """The QA item a reset asked for, or (None, why not)."""
    if isinstance(question, str):
        return (Question(id="", question=question), "") if question.strip() else (None, "question is empty")
    if not isinstance(question, Mapping):
        return None, f"question must be a string or an object with a 'question', got {_short(question)}"
    text, answers = question.get("question"), question.get("golden_answers", [])
    if not isinstance(text, str) or not text.strip():
        return None, "question.question must be a non-empty string"
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        return None, "question.golden_answers must be a string or a list of strings"
    if len(answers) > MAX_ANSWERS or any(len(a) > MAX_ANSWER_CHARS for a in answers):
        return None, (f"question.golden_answers: at most {MAX_ANSWERS} answers of at most "
                      f"{MAX_ANSWER_CHARS} characters (no longer answer fits a turn)")
    qid, dataset = question.get("id", ""), question.get("dataset", "")
    if not isinstance(qid, (str, int)) or isinstance(qid, bool) or not isinstance(dataset, str):
        return None, "question.id must be a string or an int and question.dataset a string"
    if isinstance(qid, int) and not -10**18 < qid < 10**18:
        return None, "question.id is an int out of range"
    if len(str(qid)) > MAX_FIELD_CHARS or len(dataset) > MAX_FIELD_CHARS:
        return None, f"question.id and question.dataset must have at most {MAX_FIELD_CHARS} characters"
    return Question(id=str(qid), question=text, golden_answers=tuple(answers), dataset=dataset), ""


MAX_ANSWER_CHARS = 4096 * MAX_CHARS_PER_TOKEN
"""Longest golden answer a reset may give: longer than any turn can write."""


def cut_question(text: str, tokenizer: Any, budget: int) -> str:
    """``text`` cut to at most about ``budget`` tokens, tokenising at most
    ``budget * MAX_CHARS_PER_TOKEN`` characters of it: no token spans more characters
    (``envs.search_team.MAX_CHARS_PER_TOKEN``), so what lies beyond could never be shown.
    The first ``budget * 8`` characters are tried first (prose runs about 4 to a token),
    so a long question of ordinary text costs that much. A text of at most ``budget // 4``
    characters (at most 4 tokens a character, one per UTF-8 byte) is returned as is
    without tokenising; a cut text ends in ``" ..."``."""
    if len(text) <= budget // 4:
        return text
    for per_token in (8, MAX_CHARS_PER_TOKEN):
        head = text[: budget * per_token]
        try:
            enc = tokenizer(head, add_special_tokens=False, return_offsets_mapping=True)
            ids, offsets = enc["input_ids"], enc["offset_mapping"]
        except (NotImplementedError, TypeError, ValueError, KeyError):  # no offsets (a slow tokenizer)
            ids, offsets = tokenizer.encode(head, add_special_tokens=False), None
        if len(ids) > budget:
            end = offsets[budget][0] if offsets is not None else len(head) * budget // len(ids)
            return head[:end] + " ..."
        if len(head) == len(text):
            return text
    return head + " ..."


class _NoEnv:
    """What a closed session holds instead of its envs: no episode, nothing else."""

    core = None
    episode = None
    done = False
    phase = ""
    awaiting: list[str] = []
    agent_selection = ""


_NO_ENV = _NoEnv()


def json_safe(value: Any) -> Any:
    """``value`` as JSON values: tuples become lists, a passage (dataclass or named tuple)
    an object of its fields, numpy scalars Python numbers, anything else its ``str``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "_asdict"):
        return json_safe(value._asdict())
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # a numpy scalar
        return json_safe(value.item())
    return str(value)


class _RouteEnvironment(SearchTeamEnvironment):
    """The one env that plain HTTP routes share: lent to one request at a time, and its
    episode dropped when the request ends (OpenEnv closes a route's env after each request),
    so no request sees another's."""

    def __init__(self, **env_kwargs: Any):
        super().__init__(**env_kwargs)
        self._lent = threading.Lock()

    def lend(self) -> Environment:
        """This env, or (while another request holds it) a :class:`_BusyEnvironment`."""
        if self._lent.acquire(blocking=False):
            return self
        return _BusyEnvironment(self)

    def close(self, reason: str = "") -> None:
        for raw in self._envs.values():
            raw.core = None  # no episode survives the request
        self._state = SearchTeamState(workflow=self.workflow)
        if self._lent.locked():
            self._lent.release()


BUSY = ("the server's plain-HTTP env is serving another request: retry, or open a WebSocket "
        "session (/ws), which has an env of its own")


class _BusyEnvironment(Environment[SearchTeamAction, SearchTeamObservation, SearchTeamState]):
    """A plain HTTP request that came while the shared env was lent: refused, building nothing."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, route: _RouteEnvironment):
        super().__init__()
        self.route = route

    def reset(self, *args: Any, **kwargs: Any) -> SearchTeamObservation:
        return SearchTeamObservation(last_turn=_refused("", BUSY))

    def step(self, action: Any, *args: Any, **kwargs: Any) -> SearchTeamObservation:
        return SearchTeamObservation(last_turn=_refused(getattr(action, "agent", "") or "", BUSY))

    @property
    def state(self) -> SearchTeamState:
        return SearchTeamState(workflow=self.route.workflow)

    def get_metadata(self) -> EnvironmentMetadata:
        return self.route.get_metadata()

    def close(self) -> None:
        pass


class _Factory(functools.partial):
    """OpenEnv's env factory. A WebSocket session's env is built in the session's own
    worker thread; plain HTTP routes call the factory on the event loop, and get the shared
    :class:`_RouteEnvironment` instead (or a refusal), never a new env. A ``partial`` of
    the session class, so OpenEnv reads the class's flags without building one."""

    route: _RouteEnvironment

    def __call__(self) -> Environment:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a worker thread: a new session
            return super().__call__()
        return self.route.lend()


class _Server(HTTPEnvServer):
    """OpenEnv's server with an idle timeout that covers WebSocket sessions too (OpenEnv's
    own reaper skips none, but checks every 5 s at best and reads only its activity
    stamps): a session whose env has had no request for ``idle_timeout_s`` is destroyed,
    freeing its place."""

    def __init__(self, *args: Any, idle_timeout_s: float | None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._session_idle_timeout_s = idle_timeout_s

    async def _reap_idle_sessions(self) -> None:
        timeout = self._session_idle_timeout_s
        if timeout is None:
            return
        while True:
            await asyncio.sleep(min(5.0, max(0.02, timeout / 4)))
            async with self._session_lock:
                stale = [sid for sid, env in self._sessions.items()
                         if isinstance(env, SearchTeamEnvironment) and env.idle_for() > timeout]
            for sid in stale:
                env = self._sessions.get(sid)
                if isinstance(env, SearchTeamEnvironment) and env.idle_for() > timeout:
                    env._closed = (f"this session was dropped after {timeout:g} s without a request; "
                                   "open a new one")
                    await self._destroy_session(sid)


def make_app(env_kwargs: Mapping[str, Any] | None = None, max_sessions: int = 8,
             idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S) -> Any:
    """The FastAPI app serving SearchTeam on OpenEnv's routes: at most ``max_sessions``
    WebSocket sessions at once (one more is refused with ``CAPACITY_REACHED``); a session
    silent for ``idle_timeout_s`` seconds is dropped (None: never). The plain HTTP routes'
    env is built here, before any session, and hands its tokenizer and retriever to every
    session (docs/ecosystems.md, "Pitfalls, measured": lazy imports race in threads)."""
    import os

    from fastapi import FastAPI

    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
    if idle_timeout_s is not None and (isinstance(idle_timeout_s, bool) or not isinstance(idle_timeout_s, (int, float))
                                       or not 0 < idle_timeout_s < math.inf):
        raise ValueError(f"idle_timeout_s must be a number of seconds > 0 (or None: never), got {idle_timeout_s!r}")
    kwargs = dict(env_kwargs or {})
    route = _RouteEnvironment(**kwargs)
    kwargs.update(tokenizer=kwargs.get("tokenizer") or default_tokenizer(), retriever=route.env.retriever)
    factory = _Factory(SearchTeamEnvironment, **kwargs)
    factory.route = route
    app = FastAPI(title=f"OpenEnv: {ENV_NAME} (mopd)", version=package_version())
    server = _Server(factory, SearchTeamAction, SearchTeamObservation, max_sessions, env_name=ENV_NAME,
                     state_cls=SearchTeamState, idle_timeout_s=idle_timeout_s)
    server.register_routes(app, mode=os.environ.get("OPENENV_MODE", "simulation"))
    app.state.openenv_server = server
    return app
