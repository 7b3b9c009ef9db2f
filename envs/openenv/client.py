"""The typed OpenEnv client of a SearchTeam server, and the conversions a policy needs
on the client side (no model code here: ``agents.openenv_client.collect_remote`` drives
a policy through this client).

>>> with SearchTeamClient(base_url="http://127.0.0.1:8000").sync() as env:    # doctest: +SKIP
...     result = env.reset(seed=0, question={"question": "Who ...?", "golden_answers": ["X"]})
...     while not result.done:
...         obs = result.observation
...         result = env.step(SearchTeamAction(agent=obs.agent, text=my_policy(obs)))
...     episode = Episode.from_dict(result.observation.episode)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from envs.episode import Episode
from envs.observation import Observation
from envs.openenv.models import (
    SearchTeamAction,
    SearchTeamObservation,
    SearchTeamState,
    tokenizer_identity,
)
from envs.retrieval.passage import Passage


class SearchTeamClient(EnvClient[SearchTeamAction, SearchTeamObservation, SearchTeamState]):
    """A WebSocket session with a SearchTeam server (``python -m envs.openenv serve``):
    async by default, ``.sync()`` for plain calls. ``reset(seed=, question=, workflow=)``."""

    def _step_payload(self, action: SearchTeamAction) -> dict[str, Any]:
        return action.model_dump(exclude_none=True, exclude_defaults=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[SearchTeamObservation]:
        fields = {k: v for k, v in payload.get("observation", {}).items() if k in SearchTeamObservation.model_fields}
        fields.update(done=bool(payload.get("done", False)), reward=payload.get("reward"))
        obs = SearchTeamObservation(**fields)
        return StepResult(observation=obs, reward=payload.get("reward"), done=obs.done,
                          metadata=payload.get("metadata"))

    def _parse_state(self, payload: dict[str, Any]) -> SearchTeamState:
        return SearchTeamState(**payload)


def question_payload(item: Any) -> dict[str, Any] | str:
    """A QA item (``envs.data.QAItem``, a dict or any object with ``question`` and
    ``golden_answers``; a plain string) as the JSON a reset takes."""
    if isinstance(item, str):
        return item
    get = item.get if isinstance(item, dict) else lambda k, d=None: getattr(item, k, d)
    answers = get("golden_answers", ())
    return {"id": str(get("id", "")), "question": get("question"), "dataset": str(get("dataset", "") or ""),
            "golden_answers": [answers] if isinstance(answers, str) else [str(a) for a in answers]}


def turn_observation(obs: SearchTeamObservation, env_index: int = 0) -> Observation:
    """The wire observation as the ``envs.observation.Observation`` a batched policy takes:
    token ids as an int64 array, the server's decoded text, passages in ``info`` as
    :class:`~envs.retrieval.passage.Passage` again."""
    info = dict(obs.info)
    if "passages" in info:
        info["passages"] = [[_passage(p) for p in ps] for ps in info["passages"]]
    text = obs.text
    return Observation(agent=obs.agent, role=obs.role, token_ids=np.asarray(obs.token_ids, dtype=np.int64),
                       stop=tuple(obs.stop), max_new_tokens=obs.max_new_tokens, env_index=env_index,
                       decode=lambda _ids: text, info=info, messages=tuple(dict(m) for m in obs.messages))


def _passage(p: Any) -> Any:
    if not isinstance(p, dict):
        return p
    return Passage(id=str(p.get("id", "")), title=str(p.get("title", "")), text=str(p.get("text", "")),
                   score=float(p.get("score", 0.0) or 0.0))


def action_of(agent: str, action: Any) -> SearchTeamAction:
    """A policy's action (``agents.Action``-like with ``token_ids``/``logprobs``/``text``,
    or a ``str``) as the wire action for ``agent``."""
    if isinstance(action, str):
        return SearchTeamAction(agent=agent, text=action)
    ids = getattr(action, "token_ids", None)
    if ids is None:
        return SearchTeamAction(agent=agent, text=getattr(action, "text", None) or "")
    lps = getattr(action, "logprobs", None)
    return SearchTeamAction(agent=agent, token_ids=[int(t) for t in np.asarray(ids).reshape(-1)],
                            logprobs=None if lps is None else [float(x) for x in np.asarray(lps).reshape(-1)])


def episode_of(obs: SearchTeamObservation) -> Episode:
    """The Episode record a final observation carries."""
    if not obs.done or obs.episode is None:
        raise ValueError(f"the episode is not over (agent {obs.agent!r} acts next)")
    return Episode.from_dict(obs.episode)


def check_tokenizer(metadata: dict[str, Any] | None, tokenizer: Any) -> None:
    """Raise ValueError when the server's tokenizer (a reset observation's metadata) is
    not ``tokenizer``: the same token ids would be other tokens there."""
    theirs = metadata or {}
    ours = tokenizer_identity(tokenizer)
    if theirs.get("vocab_hash") != ours["vocab_hash"]:
        raise ValueError(f"the server tokenizes with {theirs.get('tokenizer', '?')!r} (vocab "
                         f"{theirs.get('vocab_size', '?')}, sha256 {str(theirs.get('vocab_hash'))[:16]}), the "
                         f"policy with {ours['tokenizer']!r} (vocab {ours['vocab_size']}, sha256 "
                         f"{ours['vocab_hash'][:16]}): token ids would mean other tokens")
