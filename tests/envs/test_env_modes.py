"""Turn mode and token mode give identical Episodes for the same token streams."""

import numpy as np
import pytest
from conftest import GOOD


def _streams(tokenizer):
    """Each agent's turns as token ids; a turn with no closing tag ends with EOS."""
    stops = ("</search>", "</summary>", "</answer>", "</select>")
    out = {}
    for agent, turns in GOOD.items():
        out[agent] = []
        for text in turns:
            ids = tokenizer.encode(text, add_special_tokens=False)
            out[agent].append(ids if text.endswith(stops) else ids + [tokenizer.eos_token_id])
    return out


def _logprob(token):
    return -((token % 7) + 1) / 10


def _run_turns(env, streams):
    streams = {a: list(s) for a, s in streams.items()}
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        ids = streams[agent].pop(0)
        env.step({"token_ids": np.array(ids), "logprobs": [_logprob(t) for t in ids]})
    return env.unwrapped.episode


def _run_tokens(env, streams):
    flat = {a: [t for ids in s for t in ids] for a, s in streams.items()}
    steps = 0
    for agent in env.agent_iter():
        obs, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        token = flat[agent].pop(0)
        assert obs["action_mask"][token] == 1
        env.step({"token_id": np.int32(token), "logprob": _logprob(token)})
        steps += 1
    assert all(not rest for rest in flat.values())
    return env.unwrapped.episode, steps


@pytest.mark.parametrize("workflow", ["hierarchical", "cascade"])
def test_turn_and_token_modes_give_identical_episodes(make_env, tokenizer, workflow):
    streams = _streams(tokenizer)
    if workflow == "cascade":
        streams["searcher_0"] = streams["searcher_1"]
        del streams["leader_0"], streams["searcher_1"]
    by_turn = _run_turns(make_env(workflow=workflow), streams)
    by_token, steps = _run_tokens(make_env(workflow=workflow, step_mode="token"), streams)
    assert steps == sum(len(ids) for s in streams.values() for ids in s)
    assert by_turn.to_dict() == by_token.to_dict()
    assert by_turn.team_em == 1.0 and by_turn.num_searches > 0
    assert all(seg.logprobs is not None for seg in by_turn.segments)


def test_token_mode_mask_allows_only_eos_at_the_budget(make_env, tokenizer):
    env = make_env(step_mode="token", max_turn_tokens=6)
    filler = tokenizer.encode(" hello", add_special_tokens=False)[0]
    eos = env.eos_id
    for _ in range(5):
        mask = env.observe("leader_0")["action_mask"]
        assert mask.sum() == len(mask)
        env.step(filler)
    mask = env.observe("leader_0")["action_mask"]
    assert mask.sum() == 1 and mask[eos] == 1
    length = env.observe("leader_0")["length"][0]
    env.step(eos)
    assert env.infos["leader_0"]["invalid"] and env.infos["leader_0"]["turn"] == 1
    # the context grew by the 6 turn tokens plus the corrective observation
    assert env.observe("leader_0")["length"][0] > length + 1


def test_turn_mode_cuts_an_overlong_turn_to_the_budget(make_env, tokenizer):
    env = make_env(max_turn_tokens=6)
    env.step(np.array(tokenizer.encode(" hello" * 20, add_special_tokens=False)))
    seg = env.episode.segments[0]
    assert seg.num_generated == 6 and "budget" in env.infos["leader_0"]["note"]
