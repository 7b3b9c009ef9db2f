"""What crosses the wire between a SearchTeam OpenEnv server and its clients: the action,
the observation and the state (pydantic models on OpenEnv's bases), and the tokenizer's
identity, without which token-id actions mean nothing.

One step is one whole turn of one agent. The observation names the agent that acts next
(the AEC ``agent_selection``) and carries what ``raw_env.turn_observation`` gives a batched
policy; the last one (``done``) carries the per-agent rewards and the whole
``Episode.to_dict()``: segments with token ids, loss masks and behaviour log-probs.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field, PrivateAttr, StrictInt, ValidationError, model_validator


class SearchTeamAction(Action):
    """One whole turn. Give ``text`` or ``token_ids`` (with ``logprobs`` when known).

    A payload of the wrong shape is not refused by validation (that would be an HTTP 422
    or a WebSocket ``VALIDATION_ERROR`` that names no turn): it becomes an action that the
    environment answers with ``last_turn.invalid`` and the reason, playing nothing."""

    agent: str = Field(default="", description="the agent this turn is for; '' = the observation's agent")
    text: str | None = Field(default=None, description="the turn as text, tokenised once by the env")
    token_ids: list[StrictInt] | None = Field(
        default=None, description="the turn's exact token ids under the server's tokenizer (never re-tokenised)")
    logprobs: list[float] | None = Field(
        default=None, description="behaviour log-probs, one per token id (only with token_ids)")

    _malformed: str = PrivateAttr(default="")

    @model_validator(mode="wrap")
    @classmethod
    def _keep_malformed(cls, data: Any, handler: Any) -> SearchTeamAction:
        try:
            return handler(data)
        except ValidationError as err:
            agent = data.get("agent") if isinstance(data, dict) else None
            action = cls.model_construct(agent=agent if isinstance(agent, str) else "")
            action._malformed = "malformed action: " + describe_errors(err)
            return action

    @property
    def malformed(self) -> str:
        """Why the payload was not an action (``""`` when it was one)."""
        return self._malformed


class SearchTeamObservation(Observation):
    """The agent that must act next and its context; at the end, the episode record.
    ``done``, ``reward`` (``final_em`` at the end, None before) and ``metadata`` come from
    OpenEnv's base; ``metadata`` holds the tokenizer's identity after a reset."""

    agent: str = Field(default="", description="who acts next ('' when done or not reset)")
    role: str = Field(default="", description="leader, searcher or answerer")
    awaiting: list[str] = Field(default_factory=list, description="every agent awaiting a turn now")
    token_ids: list[int] = Field(default_factory=list, description="the agent's whole context")
    text: str = Field(default="", description="the context decoded (special tokens kept)")
    messages: list[dict[str, str]] = Field(default_factory=list, description="the context as chat messages")
    stop: list[str] = Field(default_factory=list, description="strings that end this role's turn")
    max_new_tokens: int = Field(default=0, description="most tokens the turn may take")
    info: dict[str, Any] = Field(default_factory=dict, description="raw_env.view(agent), JSON values")
    last_turn: dict[str, Any] = Field(
        default_factory=dict,
        description="what the previous request did: agent, played, kind, invalid, reason, note")
    rewards: dict[str, float] = Field(default_factory=dict, description="each agent's reward, at the end")
    episode: dict[str, Any] | None = Field(default=None, description="Episode.to_dict(), at the end")


class SearchTeamState(State):
    """Where the session's episode stands (``episode_id`` and ``step_count`` from the base)."""

    question_id: str = ""
    workflow: str = ""
    phase: str = ""
    awaiting: list[str] = Field(default_factory=list)
    done: bool = False
    num_searches: int = 0
    num_waves: int = 0


def describe_errors(err: ValidationError, limit: int = 3) -> str:
    """A validation error in one short line: where and what, never the (untrusted, maybe
    huge) input itself."""
    parts = [f"{'.'.join(str(x) for x in e['loc']) or 'action'}: {e['msg']}" for e in err.errors()[:limit]]
    more = len(err.errors()) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


_IDENTITIES: dict[int, tuple[Any, dict[str, Any]]] = {}
"""id(tokenizer) -> (the tokenizer, kept alive so its id is never reused; its identity)."""


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """``{"tokenizer": name, "vocab_size": V, "vocab_hash": sha256 of the vocabulary}``:
    token ids sent by a client mean the same tokens only when these agree."""
    key = id(tokenizer)
    if key not in _IDENTITIES:
        vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
        digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
        _IDENTITIES[key] = (tokenizer, {"tokenizer": str(getattr(tokenizer, "name_or_path", "")),
                                        "vocab_size": len(tokenizer), "vocab_hash": digest})
    return dict(_IDENTITIES[key][1])
