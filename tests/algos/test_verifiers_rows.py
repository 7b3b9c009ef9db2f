"""algos.from_verifiers (issue 31.2): verifiers episode records of mopd-search-team back into
mopd's Episodes and learner rows. The records here are written by hand in the shape
SearchTeamEnv.finalize gives them (tests/agents/test_verifiers.py checks the env writes that
shape), so these tests need no verifiers install: the learner side reads plain JSON."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest

from agents.collect import collect
from agents.scripted import ScriptedPolicy
from algos import advantages as A
from algos.batch import rows_from_episodes
from algos.from_verifiers import (
    episode_from_verifiers,
    groups_from_verifiers,
    read_traces,
    rows_from_verifiers,
    trace_tokens,
)
from envs import env_fn


def norm(ep) -> dict:
    data = json.loads(json.dumps(ep.to_dict()))
    data.pop("sampling", None)
    return data


def record_of(ep, key: str, *, ok: bool = True) -> dict:
    """A verifiers episode record (one traces.jsonl line) of a mopd Episode, as finalize
    writes it: one trace per segment, in another order than the segments."""
    summary = {k: v for k, v in ep.to_dict().items() if k != "segments"}
    traces = []
    for index, seg in reversed(list(enumerate(ep.segments))):
        traces.append({
            "task": {"type": "Task", "data": {"id": f"{seg.agent}@{seg.wave}"}},
            "agent": {"name": seg.role, "trainable": True}, "nodes": [], "ok": True,
            "rewards": {"role": {"score": seg.reward, "weight": 1.0}},
            "metrics": {"team_em": ep.team_em},
            "info": {"mopd_segment": {"index": index, **asdict(seg)}, "mopd_episode": summary}})
    return {"id": f"ep-{key}", "ok": ok, "task": {"type": "SearchTeamTask", "key": key, "data": {}},
            "traces": traces, "errors": [] if ok else [{"type": "X", "message": "boom"}]}


@pytest.fixture(scope="module")
def played():
    from envs.data.synthwiki import default_world
    from envs.retrieval.factory import make_retriever

    world = default_world()
    questions = world.questions("hotpotqa", "dev")[:2] + world.questions("musique", "dev")[:1]
    groups = collect(env_fn(retriever=make_retriever("words")), ScriptedPolicy(), questions, group_size=2, seed=5)
    # the scripted team plays a question the same way every time: vary what GRPO reads
    # (the Leader's reward, the candidates' EM) so that its advantages are not all zero
    groups[0][1].rewards["leader_0"] += 0.5
    groups[0][1].candidate_em[:2] = [1.0, 0.0]
    records = [record_of(ep, f"{q.dataset}/{q.id}") for q, g in zip(questions, groups) for ep in g]
    return groups, records


def test_records_give_back_the_episodes_grouped_by_task(played, tmp_path):
    groups, records = played
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    back = groups_from_verifiers(read_traces(tmp_path))  # the run directory, as vf-eval writes it
    assert [len(g) for g in back] == [2, 2, 2]
    assert [[norm(ep) for ep in g] for g in back] == [[norm(ep) for ep in g] for g in groups]
    # a consumer's group id wins over the task key
    regrouped = [dict(r, group={"id": "all"}) for r in records]
    assert [len(g) for g in groups_from_verifiers(regrouped)] == [6]


def test_rows_and_per_role_advantages_equal_the_in_process_ones(played):
    groups, records = played
    back, rows = rows_from_verifiers(records, max_len=4096)
    want = rows_from_episodes(groups, 4096)
    assert [(r.segment.agent, r.group) for r in rows] == [(r.segment.agent, r.group) for r in want]
    for a, b in zip(rows, want):
        assert np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.mask, b.mask)
    assert {r.role for r in rows} == {"leader", "searcher", "answerer"}
    for role, term in (("leader", A.own_reward_grpo), ("answerer", A.candidate_grpo)):
        got = term([r for r in rows if r.role == role], A.AdvantageContext(groups=back))
        expected = term([r for r in want if r.role == role], A.AdvantageContext(groups=groups))
        assert got == pytest.approx(expected)
        assert any(abs(v) > 0.5 for v in got)


def test_role_reward_comes_from_the_trace(played):
    _, records = played
    record = json.loads(json.dumps(records[0]))
    trace = next(t for t in record["traces"] if t["agent"]["name"] == "leader")
    trace["rewards"]["role"]["score"] = 0.25
    ep = episode_from_verifiers(record)
    assert ep.segments_of("leader")[0].reward == 0.25


def _trace_with_tokens() -> dict:
    # system + user (prompt, never trained), a sampled reply, a user message, a sampled reply
    nodes = [
        {"parent": None, "token_ids": [1, 2, 3], "mask": [False] * 3, "logprobs": []},
        {"parent": 0, "token_ids": [4, 5], "mask": [False, False], "logprobs": []},
        {"parent": 1, "token_ids": [6, 7, 8], "mask": [False, True, True], "logprobs": [-0.5, -0.25]},
        {"parent": 2, "token_ids": [9], "mask": [False], "logprobs": []},
        {"parent": 3, "token_ids": [10, 11], "mask": [True, True], "logprobs": [-1.0, -2.0]},
    ]
    return {"nodes": nodes}


def test_trace_tokens_follow_the_branch_and_spread_the_logprobs():
    ids, mask, logprobs = trace_tokens(_trace_with_tokens())
    assert ids == list(range(1, 12))
    assert mask == [0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1]
    assert logprobs == [0.0] * 6 + [-0.5, -0.25, 0.0, -1.0, -2.0]
    forked = _trace_with_tokens()
    forked["nodes"].append({"parent": 2, "token_ids": [12], "mask": [True], "logprobs": [-3.0]})
    with pytest.raises(ValueError, match="2 branches"):
        trace_tokens(forked)
    missing = _trace_with_tokens()
    missing["nodes"][4]["logprobs"] = []
    assert trace_tokens(missing)[2] is None


def test_auto_trains_on_the_trace_tokens_when_every_trace_has_them(played):
    _, records = played
    record = json.loads(json.dumps(records[0]))
    for trace in record["traces"]:
        trace["nodes"] = _trace_with_tokens()["nodes"]
    [[ep]] = groups_from_verifiers([record])
    assert all(seg.token_ids == list(range(1, 12)) and sum(seg.loss_mask) == 4 for seg in ep.segments)
    _, rows = rows_from_verifiers([record], max_len=64)
    assert [r.num_targets for r in rows] == [4] * len(ep.segments)
    # one trace without ids: the env's tokens for all (an eval relay carries text only)
    record["traces"][0]["nodes"] = []
    [[ep]] = groups_from_verifiers([record])
    assert ep.segments[0].token_ids == records[0]["traces"][-1]["info"]["mopd_segment"]["token_ids"]
    with pytest.raises(ValueError, match="no token ids"):
        groups_from_verifiers([record], tokens="trace")


def test_refusals_name_the_episode(played):
    _, records = played
    failed = dict(records[0], ok=False, errors=[{"message": "boom"}])
    with pytest.raises(ValueError, match="not ok.*boom"):
        groups_from_verifiers([failed])
    assert len(groups_from_verifiers([failed, records[2]], skip_failed=True)) == 1
    short = json.loads(json.dumps(records[0]))
    short["traces"].pop()
    with pytest.raises(ValueError, match="segments"):
        episode_from_verifiers(short)
    bare = json.loads(json.dumps(records[0]))
    bare["traces"][0]["info"] = {}
    with pytest.raises(ValueError, match="no mopd_segment"):
        episode_from_verifiers(bare)
    with pytest.raises(ValueError, match="tokens must be"):
        groups_from_verifiers(records, tokens="text")
