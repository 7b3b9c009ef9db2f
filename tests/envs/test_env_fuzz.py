"""Fuzzing: random token ids and random protocol-like text never crash the env, and
every turn is either parsed into an action or flagged invalid."""

import random

import numpy as np
import pytest

KINDS = {"dispatch", "select", "search", "summary", "answer", "invalid"}
FRAGMENTS = ["<think>", "</think>", "<subtask>", "</subtask>", "<select>", "</select>",
             "<search>", "</search>", "<summary>", "</summary>", "<answer>", "</answer>",
             "<information>", "1, 2", "3", "0", "-1", "Velmora", "Ostria", " ", "\n", "é漢🙂",
             "<|im_end|>", "<|im_start|>", "<", ">", "</", "Doc 1(Title:", "none", "99999999999"]


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 12)))


def random_action(rng: random.Random, vocab: int):
    kind = rng.random()
    if kind < 0.45:
        return random_text(rng)
    if kind < 0.9:
        return np.array([rng.randrange(vocab) for _ in range(rng.randint(0, 40))], dtype=np.int64)
    return rng.choice([[], [vocab + 5], np.zeros((2, 2), dtype=np.int64), "", 7, {"token_ids": [1, 2], "logprobs": [0.0]}])


@pytest.mark.parametrize("workflow", ["hierarchical", "cascade"])
def test_two_thousand_random_turns(make_env, workflow):
    rng = random.Random(1234)
    env = make_env(workflow=workflow, max_context_tokens=1024, max_turn_tokens=64)
    turns = episodes = 0
    while turns < 2000:
        agent = env.agent_selection
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            if not env.agents:
                ep = env.episode
                for seg in ep.segments:
                    assert len(seg.loss_mask) == len(seg.token_ids) <= 1024
                assert len(ep.candidates) == 5 and ep.turns > 0
                episodes += 1
                env.reset(seed=episodes)
            continue
        env.step(random_action(rng, env.vocab_size))
        info = env.infos[agent]
        assert info["kind"] in KINDS and info["invalid"] == (info["kind"] == "invalid")
        turns += 1
    assert episodes >= 10


def test_random_tokens_in_token_mode(make_env):
    rng = np.random.default_rng(7)
    env = make_env(step_mode="token", max_context_tokens=512, max_turn_tokens=24, num_candidates=2)
    space = env.action_space(env.agent_selection)
    space.seed(7)
    ends = 0
    for _ in range(4000):
        if not env.agents:
            env.reset(seed=int(rng.integers(100)))
        obs, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        agent = env.agent_selection
        turn = env.infos[agent].get("turn", 0)
        env.step(space.sample(obs["action_mask"]))
        if env.infos.get(agent, {}).get("turn", turn) != turn:
            ends += 1
            assert env.infos[agent]["kind"] in KINDS
    assert ends >= 100  # turns end at EOS, a stop tag or the 24-token budget
