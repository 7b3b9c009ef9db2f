"""The batched collector sends every awaiting agent of every copy in one batch, and answers the
searches of a batch with one retriever call (the AEC step takes the same turn path)."""

import pytest
from conftest import GOOD, QUESTION, WORLD, Item, KeywordRetriever

from agents import RoleRouter, collect
from envs import search_team_v0


class ScriptPolicy:
    """Plays GOOD's turns, picking the turn from how many replies the context holds."""

    def __init__(self):
        self.batches = []

    def act(self, observations):
        self.batches.append([o.agent for o in observations])
        out = []
        for obs in observations:
            turn = obs.text.count("<|im_start|>assistant") - 1
            turns = GOOD[obs.agent]
            if obs.role == "searcher":  # a Searcher's turns restart in every wave context
                turns = turns[turn:] if turn < len(turns) else turns[-1:]
                out.append(turns[0])
            else:
                out.append(turns[min(turn, len(turns) - 1)])
        return out


def test_collect_batches_agents_and_searches(tokenizer):
    retriever = KeywordRetriever(WORLD)
    other = Item("q2", "Where was Velmora Quast born?", ("Dunmere",))
    policy = ScriptPolicy()
    groups = collect(lambda: search_team_v0.env(tokenizer=tokenizer, retriever=retriever),
                     policy, [QUESTION, other], group_size=3, seed=5)
    assert [len(g) for g in groups] == [3, 3]
    assert groups[0][0].question["id"] == "q1" and groups[1][2].question["id"] == "q2"
    assert [ep.seed for g in groups for ep in g] == [5, 6, 7, 8, 9, 10]
    # the first batch holds the six Leaders, all at once
    assert policy.batches[0] == ["leader_0"] * 6
    # searches were answered in batches too: fewer retriever calls than searches
    searches = sum(ep.num_searches for g in groups for ep in g)
    assert searches == 18 and retriever.calls < searches


def test_router_sends_each_role_to_its_policy(tokenizer, tmp_path):
    calls = []

    class Fixed:
        def __init__(self, text):
            self.text = text

        def act(self, observations):
            calls.append((self.text, [o.role for o in observations]))
            return [self.text] * len(observations)

    router = RoleRouter({"searcher": Fixed("<summary>Ostria</summary>"),
                         "answerer": Fixed("<answer>Ostria</answer>")})
    out = tmp_path / "eps.jsonl"
    groups = collect(lambda: search_team_v0.raw_env(tokenizer=tokenizer, retriever=KeywordRetriever(WORLD),
                                                    workflow="cascade"),
                     router, [QUESTION], group_size=2, out=out)
    assert all(ep.final_em == 1.0 for ep in groups[0])
    assert calls[0] == ("<summary>Ostria</summary>", ["searcher", "searcher"])
    assert calls[1] == ("<answer>Ostria</answer>", ["answerer"] * 10)
    assert len(out.read_text().splitlines()) == 2
    with pytest.raises(KeyError, match="no policy for role 'leader'"):
        router.act([type("O", (), {"role": "leader"})()])
