"""Every agent context stays token-for-token what it was: the micro preset's trained
numbers, the scripted baseline and saved episodes depend on it.

The digests below were recorded on the env before the one-step-path refactor and the
protocol templates (commit 5c43515); a change to any word the env writes, to how quoted
text is tokenised, or to how turns are cut shows up here. If a change is meant, say why in
the commit and record the new digests.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import Doc, KeywordRetriever

from agents.base import Action
from agents.collect import collect
from agents.scripted import ScriptedPolicy
from envs import search_team_v0

DIGESTS = {
    "hierarchical": "2f10a86c19843a98",
    "cascade": "8fa1e61fe0936083",
    "aec-token": "99273360a67f0ff1",
}


def _world():
    from envs.data.qa import DATASETS
    from envs.data.synthwiki import default_world

    world = default_world()
    docs = []
    for row in world.corpus:
        title, _, text = row["contents"].partition("\n")
        docs.append(Doc(row["id"], title, text))
    questions = [q for name in DATASETS for q in world.questions(name, "dev")[:2]]
    return docs, questions


def digest(episodes) -> str:
    """sha256 over every segment's agent, wave, token ids and loss mask, and the outcome."""
    h = hashlib.sha256()
    for ep in episodes:
        for s in ep.segments:
            h.update(json.dumps([s.agent, s.wave, s.token_ids, s.loss_mask]).encode())
        h.update(json.dumps([ep.candidates, ep.rewards, ep.num_searches]).encode())
    return h.hexdigest()[:16]


class EosLeader:
    """The scripted team, with the Leader's turns as token ids closed by EOS (as the micro
    recipe's imitation data writes them)."""

    def __init__(self, tokenizer):
        self.scripted, self.tokenizer = ScriptedPolicy(seed=0), tokenizer

    def act(self, observations):
        out = []
        for obs, text in zip(observations, self.scripted.act(observations)):
            if obs.role == "leader":
                ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
                out.append(Action(token_ids=ids))
            else:
                out.append(text)
        return out


@pytest.fixture(scope="module")
def world():
    return _world()


@pytest.mark.parametrize("workflow", ["hierarchical", "cascade"])
def test_scripted_contexts_are_unchanged(tokenizer, world, workflow):
    docs, questions = world
    policy = EosLeader(tokenizer) if workflow == "hierarchical" else ScriptedPolicy(seed=0)
    groups = collect(lambda: search_team_v0.raw_env(workflow=workflow, tokenizer=tokenizer,
                                                    retriever=KeywordRetriever(docs), questions=questions),
                     policy, questions, seed=3)
    assert digest([g[0] for g in groups]) == DIGESTS[workflow]


def test_token_mode_contexts_are_unchanged(tokenizer, world):
    docs, questions = world
    env = search_team_v0.env(step_mode="token", tokenizer=tokenizer, retriever=KeywordRetriever(docs),
                             questions=questions)
    policy, episodes = ScriptedPolicy(seed=0), []
    for i, question in enumerate(questions[::3]):
        env.reset(seed=i, options={"question": question})
        raw = env.unwrapped
        queue: list[int] = []
        for agent in env.agent_iter():
            _, _, term, trunc, _ = env.last()
            if term or trunc:
                env.step(None)
                continue
            if not queue:
                [obs] = [o for o in raw.turn_observations() if o.agent == agent]
                queue = tokenizer.encode(policy.act([obs])[0], add_special_tokens=False) + [tokenizer.eos_token_id]
            before = len(raw.episode.turn_spans)
            env.step(queue.pop(0))
            if len(raw.episode.turn_spans) > before:
                queue = []
        episodes.append(raw.episode)
    assert digest(episodes) == DIGESTS["aec-token"]
