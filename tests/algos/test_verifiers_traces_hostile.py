"""Issue 44.3: malformed verifiers traces (algos.from_verifiers) raise the documented
ValueError, never IndexError, TypeError, AttributeError or KeyError, and never loop: node
parents that form a cycle are caught by a visited set; sizes are bounded; a mopd_segment or
mopd_episode with a field mopd does not have is refused. A little fuzzing (hypothesis) over
JSON values put anywhere in a valid record."""

from __future__ import annotations

import copy
import json
import signal
from dataclasses import asdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from algos.from_verifiers import (
    episode_from_verifiers,
    groups_from_verifiers,
    read_traces,
    rows_from_verifiers,
    trace_tokens,
)
from envs.episode import Episode, Segment


def _record() -> dict:
    """A valid two-segment verifiers episode record, written by hand as finalize writes it."""
    segments = [Segment(agent="leader_0", role="leader", wave=-1, token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                        logprobs=[0.0, -0.5, -0.25], reward=1.0),
                Segment(agent="answerer_1", role="answerer", wave=-1, token_ids=[4, 5], loss_mask=[0, 1],
                        logprobs=[0.0, -1.0], reward=0.0)]
    ep = Episode(question={"id": "q1", "question": "who?", "golden_answers": ["x"], "dataset": "nq"},
                 workflow="w", segments=segments)
    summary = {k: v for k, v in ep.to_dict().items() if k != "segments"}
    traces = [{"task": {"data": {"id": f"{s.agent}@{s.wave}"}}, "nodes": [
        {"parent": None, "token_ids": s.token_ids[:1], "mask": [False], "logprobs": []},
        {"parent": 0, "token_ids": s.token_ids[1:], "mask": [True] * (len(s.token_ids) - 1),
         "logprobs": [lp for lp, m in zip(s.logprobs, s.loss_mask) if m]}],
        "rewards": {"role": {"score": s.reward}},
        "info": {"mopd_segment": {"index": i, **asdict(s)}, "mopd_episode": summary}} for i, s in enumerate(segments)]
    return {"id": "ep-1", "ok": True, "task": {"key": "nq/q1"}, "traces": traces}


class Looped(Exception):
    pass


def _bounded(call, *args, seconds=1):
    """``call(*args)`` stopped after ``seconds`` (the code before the fix looped for ever)."""
    def stop(*_):
        raise Looped(f"{call.__name__} did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        return call(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_the_hand_written_record_is_valid():
    [[ep]] = groups_from_verifiers([_record()], tokens="trace")
    assert ep.segments[0].token_ids == [1, 2, 3] and ep.segments[0].loss_mask == [0, 1, 1]
    assert ep.segments[0].logprobs == [0.0, -0.5, -0.25]


@pytest.mark.parametrize("nodes", [
    [{"parent": 1, "token_ids": [1], "mask": [True]}, {"parent": 0, "token_ids": [2], "mask": [True]},
     {"parent": 0, "token_ids": [3], "mask": [True]}],  # a leaf hanging off a two-node cycle
    [{"parent": 2, "token_ids": [1], "mask": [True]}, {"parent": 0, "token_ids": [2], "mask": [True]},
     {"parent": 1, "token_ids": [3], "mask": [True]}, {"parent": 1, "token_ids": [4], "mask": [True]}],
])
def test_node_parents_that_form_a_cycle_are_refused_not_looped(nodes):
    with pytest.raises(ValueError, match="cycle"):
        _bounded(trace_tokens, {"nodes": nodes})


def test_a_cycle_off_the_branch_is_refused():
    nodes = [{"parent": None, "token_ids": [1], "mask": [True]},
             {"parent": 2, "token_ids": [2], "mask": [True]}, {"parent": 1, "token_ids": [3], "mask": [True]}]
    with pytest.raises(ValueError, match="off its branch"):
        _bounded(trace_tokens, {"nodes": nodes})


@pytest.mark.parametrize("trace, match", [
    ({"nodes": [{"parent": 5, "token_ids": [1], "mask": [True]}]}, "parent 5"),
    ({"nodes": [{"parent": -1, "token_ids": [1], "mask": [True]}]}, "parent -1"),
    ({"nodes": [{"parent": [0], "token_ids": [1], "mask": [True]}]}, r"parent \[0\]"),
    ({"nodes": [{"parent": "0", "token_ids": [1], "mask": [True]}]}, "parent '0'"),
    ({"nodes": [{"parent": 0, "token_ids": [1], "mask": [True]}]}, "parent 0"),  # its own parent
    ({"nodes": [{"parent": True, "token_ids": [1]}, {"parent": None}]}, "parent True"),
    ({"nodes": {"0": {"parent": None}}}, "a list expected"),
    ({"nodes": ["node"]}, "item 0 is a str"),
    ({"nodes": [{"parent": None, "token_ids": 5, "mask": [True]}]}, "token_ids must be a list"),
    ({"nodes": [{"parent": None, "token_ids": ["1"], "mask": [True]}]}, "token_ids must be a list"),
    ({"nodes": [{"parent": None, "token_ids": [-1], "mask": [True]}]}, "token_ids must be a list"),
    ({"nodes": [{"parent": None, "token_ids": [1], "mask": "1"}]}, "mask must be a list"),
    ({"nodes": [{"parent": None, "token_ids": [1], "mask": [True], "logprobs": [{}]}]}, "logprobs must be"),
    ({"nodes": [{"parent": None, "token_ids": [1], "mask": [True], "logprobs": ["x"]}]}, "logprobs must be"),
    ({"nodes": [{"parent": None, "token_ids": [1], "mask": [True], "logprobs": 3}]}, "logprobs must be"),
    ("nodes", "must be an object"),
])
def test_a_malformed_trace_raises_the_documented_value_error(trace, match):
    with pytest.raises(ValueError, match=match):
        _bounded(trace_tokens, trace)


def test_sizes_are_bounded(monkeypatch):
    import algos.from_verifiers as fv

    monkeypatch.setattr(fv, "MAX_NODES", 3)
    chain = [{"parent": i - 1 if i else None, "token_ids": [1], "mask": [True]} for i in range(4)]
    with pytest.raises(ValueError, match="4 items, more than the 3 allowed"):
        trace_tokens({"nodes": chain})
    monkeypatch.setattr(fv, "MAX_TRACE_TOKENS", 2)
    with pytest.raises(ValueError, match="more than the 2 token ids"):
        trace_tokens({"nodes": chain[:3]})
    monkeypatch.setattr(fv, "MAX_TRACES", 1)
    with pytest.raises(ValueError, match="traces: 2 items, more than the 1 allowed"):
        episode_from_verifiers(_record())


def _edit(change):
    record = _record()
    change(record)
    return record


@pytest.mark.parametrize("change, match", [
    (lambda r: r["traces"][0]["info"]["mopd_segment"].update(evil=1), "unknown field 'evil'"),
    (lambda r: r["traces"][0]["info"]["mopd_episode"].update(evil=1), "unknown field 'evil'"),
    (lambda r: r["traces"][0]["info"]["mopd_segment"].pop("agent"), "field 'agent' is missing"),
    (lambda r: r["traces"][0]["info"]["mopd_episode"].pop("question"), "field 'question' is missing"),
    (lambda r: r["traces"][0]["info"]["mopd_segment"].update(token_ids="abc"), "field 'token_ids' is not"),
    (lambda r: r["traces"][0]["info"]["mopd_segment"].update(token_ids=[1, -2, 3]), "token id outside"),
    (lambda r: r["traces"][0]["info"]["mopd_segment"].update(loss_mask=[0, 1]), "loss mask"),
    (lambda r: r["traces"][0]["info"]["mopd_segment"].update(loss_mask=[0, 2, 1]), "loss mask"),
    (lambda r: r["traces"][0]["info"]["mopd_segment"].update(logprobs=[0.0]), "1 log-probs for 3"),
    (lambda r: r["traces"][0]["info"]["mopd_segment"].update(wave="0"), "field 'wave' is not int"),
    (lambda r: r["traces"][0]["info"]["mopd_episode"].update(rewards={"a": "x"}), "field 'rewards' is not"),
    (lambda r: r["traces"][0]["info"]["mopd_episode"].update(team_em=float("nan")), "field 'team_em' is not"),
    (lambda r: r["traces"][0]["info"]["mopd_segment"].update(index=[0]), r"segment index \[0\]"),
    (lambda r: r["traces"][0]["info"]["mopd_segment"].update(index=None), "segment index None"),
    (lambda r: r["traces"][0].update(info="x"), "no mopd_segment"),
    (lambda r: r["traces"][0].update(task="x"), None),  # a task that is not an object: the label is "?"
    (lambda r: r["traces"][0]["rewards"]["role"].update(score=float("nan")), "no role reward"),
    (lambda r: r["traces"][0].update(rewards=[1]), "no role reward"),
    (lambda r: r.update(traces="abc"), "a list expected"),
    (lambda r: r.update(traces=[1, 2]), "item 0 is a int"),
    (lambda r: r.update(ok=False, errors=["boom"]), "not ok: 'boom'"),
    (lambda r: r.update(ok=False, errors="boom"), "not ok: 'boom'"),
    (lambda r: r.update(group="g"), None),  # a group id that is not an object: grouped by task
])
def test_a_malformed_record_raises_the_documented_value_error(change, match):
    record = _edit(change)
    if match is None:
        assert len(groups_from_verifiers([record])) == 1
        return
    with pytest.raises(ValueError, match=match):
        groups_from_verifiers([record], tokens="mopd")


def test_a_record_that_is_not_an_object_is_a_value_error():
    with pytest.raises(ValueError, match="expected a verifiers episode record"):
        groups_from_verifiers([[1, 2]])


def test_names_from_a_record_are_quoted(tmp_path):
    record = _edit(lambda r: r.update(id="ep\x1b]52;c;ZXZpbA==\x07", ok=False, errors=[{"message": "\x1b[2J"}]))
    with pytest.raises(ValueError) as info:
        episode_from_verifiers(record)
    assert "\x1b" not in str(info.value) and "\\x1b]52" in str(info.value) and "\n" not in str(info.value)


def test_a_line_past_the_limit_is_refused(tmp_path, monkeypatch):
    import algos.from_verifiers as fv

    monkeypatch.setattr(fv, "MAX_LINE_BYTES", 10_000)
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(_record()) + "\n" + json.dumps({"traces": [], "pad": "x" * 20_000}) + "\n")
    with pytest.raises(ValueError, match="line 2: longer than 10,000 bytes"):
        read_traces(tmp_path)


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=3),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                     max_leaves=6)


def _paths(value, prefix=()):
    """Every place (a key path) inside a JSON value."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


_PLACES = [p for p in _paths(_record()) if p]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(place=st.sampled_from(_PLACES), value=_JSON, tokens=st.sampled_from(["auto", "mopd", "trace"]))
def test_fuzz_any_value_anywhere_is_accepted_or_a_value_error(place, value, tokens):
    """Down to the learner's rows: what is accepted builds rows without an error."""
    record = copy.deepcopy(_record())
    target = record
    for key in place[:-1]:
        target = target[key]
    target[place[-1]] = value
    try:
        _bounded(rows_from_verifiers, [record], 64, tokens)
    except ValueError:
        pass


@settings(max_examples=300, deadline=None)
@given(parents=st.lists(st.one_of(st.none(), st.integers(-1, 6)), min_size=0, max_size=6))
def test_fuzz_any_parents_are_a_branch_or_a_value_error(parents):
    nodes = [{"parent": p, "token_ids": [i], "mask": [True], "logprobs": [-0.1]} for i, p in enumerate(parents)]
    try:
        ids, mask, logprobs = _bounded(trace_tokens, {"nodes": nodes})
    except ValueError:
        return
    assert sorted(ids) == list(range(len(parents))) and mask == [1] * len(ids)  # every node, once
