"""SearchTeam as an OpenEnv environment: one step is one whole turn of one agent.

Every session holds its own ``raw_env`` (one per workflow it has played) and its own
copy of the tokenizer; the retriever is built once, before serving, and shared.
A turn is played by ``raw_env.play_turns``, the env's one turn path, so a session's
Episodes equal those of the in-process PettingZoo loop for the same turns.

Nothing a client sends raises: a step before reset, an agent that awaits no turn and a
malformed action are answered with ``last_turn = {"played": False, "invalid": True,
"reason": ...}`` and change nothing; out-of-vocabulary token ids are model output, as in
the AEC env: they play as an invalid (empty) turn and the note says so.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import uuid
from collections.abc import Mapping
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from envs.openenv.models import (
    SearchTeamAction,
    SearchTeamObservation,
    SearchTeamState,
    tokenizer_identity,
)
from envs.search_team import default_tokenizer, make_env
from envs.team import WORKFLOWS, Question

ENV_NAME = "search_team"
RESET_OPTIONS = ("seed", "episode_id", "question", "workflow")


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
        # A session's own copy: one transformers tokenizer encoding in several threads at
        # once returned wrong ids (measured: 5 of 1,200 encodes in 4 threads differed;
        # sessions run in their own threads). Copying takes about 0.1 s.
        self.env_kwargs["tokenizer"] = copy.deepcopy(shared)
        self._envs: dict[str, Any] = {}
        self.env = self._env_for(self.workflow)
        self._state = SearchTeamState(workflow=self.workflow)

    def _env_for(self, workflow: str) -> Any:
        if workflow not in self._envs:
            first = next(iter(self._envs.values()), None)
            shared = {} if first is None else {"retriever": first.retriever}
            self._envs[workflow] = make_env(**{**shared, **self.env_kwargs, "workflow": workflow})
        return self._envs[workflow]

    # ------------------------------------------------------------------ OpenEnv API

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              question: Mapping[str, Any] | str | None = None, workflow: str | None = None,
              **options: Any) -> SearchTeamObservation:
        """A new episode. ``question``: a QA row ``{"question", "golden_answers", "id",
        "dataset"}`` or a plain question (None: drawn from the env's questions with
        ``seed``); ``workflow``: hierarchical or cascade (None: the server's). A bad option
        changes nothing and is answered with ``last_turn.invalid``."""
        reason = _reset_refusal(seed, episode_id, workflow, options)
        item = None
        if not reason and question is not None:
            item, reason = _question_of(question)
        if reason:
            return self._observe(_refused("", "reset refused: " + reason))
        self.env = self._env_for(workflow or self.workflow)
        self.env.reset(seed=seed, options={"question": item} if item is not None else None)
        self._state = SearchTeamState(episode_id=episode_id or str(uuid.uuid4()), step_count=0,
                                      workflow=self.env.config.workflow)
        return self._observe({}, metadata=dict(self.identity))

    def step(self, action: SearchTeamAction, timeout_s: float | None = None,
             **kwargs: Any) -> SearchTeamObservation:
        """Play ``action.agent``'s whole turn (default: the agent the last observation
        named). Refusals play nothing: see the module docstring."""
        raw = self.env
        agent = getattr(action, "agent", "") or (raw.agent_selection if raw.core is not None else "")
        reason = _action_refusal(action)
        if not reason and raw.core is None:
            reason = "call reset first (over plain HTTP every request gets a fresh env: use a WebSocket session)"
        elif not reason and raw.done:
            reason = "the episode is over: call reset"
        turn: Any = None
        if not reason:
            turn = action.text if action.token_ids is None else {"token_ids": list(action.token_ids),
                                                                 "logprobs": action.logprobs}
            reason = raw.turn_refusal(agent, turn)
        if reason:
            return self._observe(_refused(agent, reason))
        try:
            [result] = raw.play_turns([(agent, turn)])
        except ValueError as err:  # the batch check refused it after all: nothing was played
            return self._observe(_refused(agent, str(err)))
        self._state.step_count += 1
        return self._observe({"agent": agent, "played": True, "kind": result.kind,
                              "invalid": bool(result.invalid), "reason": result.reason, "note": result.note})

    @property
    def state(self) -> SearchTeamState:
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
            name=ENV_NAME, version=_version(),
            description=("SearchTeam (mopd): a Leader, Searchers and Answerers answer a question "
                         "with a retriever. One step = one whole turn of the agent the observation "
                         "names; the final observation carries per-agent rewards and the episode "
                         f"record. Tokenizer {ident['tokenizer']} (vocab {ident['vocab_size']}, "
                         f"sha256 {ident['vocab_hash'][:16]}); the reset observation's metadata "
                         "carries the full identity."),
            documentation_url="docs/ecosystems.md")

    # ------------------------------------------------------------------ observations

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
    qid, dataset = question.get("id", ""), question.get("dataset", "")
    if not isinstance(qid, (str, int)) or isinstance(qid, bool) or not isinstance(dataset, str):
        return None, "question.id must be a string or an int and question.dataset a string"
    return Question(id=str(qid), question=text, golden_answers=tuple(answers), dataset=dataset), ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mopd")
    except PackageNotFoundError:
        return "unknown"


def make_app(env_kwargs: Mapping[str, Any] | None = None, max_sessions: int = 8) -> Any:
    """The FastAPI app serving SearchTeam: OpenEnv's routes (``/ws`` sessions, ``/reset``,
    ``/step``, ``/state``, ``/schema``, ``/metadata``, ``/health``, ``/mcp``), at most
    ``max_sessions`` WebSocket sessions at once (one more is refused with
    ``CAPACITY_REACHED``).

    One env is built here, before any session: the tokenizer and the retriever load in
    this thread and are handed to every session (each copies the tokenizer; the retriever
    is shared read-only). Sessions are built in worker threads, where transformers' lazy
    imports race: a cold server failed 3 of 4 concurrent sessions with ``FACTORY_ERROR``
    without this warm-up."""
    if not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
    kwargs = dict(env_kwargs or {})
    warm = SearchTeamEnvironment(**kwargs)
    kwargs.update(tokenizer=kwargs.get("tokenizer") or default_tokenizer(), retriever=warm.env.retriever)
    return create_app(functools.partial(SearchTeamEnvironment, **kwargs), SearchTeamAction,
                      SearchTeamObservation, env_name=ENV_NAME, max_concurrent_envs=max_sessions,
                      state_cls=SearchTeamState)
