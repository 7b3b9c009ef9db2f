"""The SearchTeam flow on hand-written episodes: rewards, masks, budgets, records."""

import numpy as np
import pytest
from conftest import GOOD, QUESTION, run_script

from envs.episode import Episode, load_episodes, save_episodes


def test_hierarchical_episode_rewards_by_hand(make_env):
    env = make_env()
    ep = run_script(env, GOOD)
    assert ep.candidates == ["Ostria", "the Ostrian Republic", "Kesh", "Kesh", "ostria."]
    assert ep.candidate_em == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert ep.final_answer == "Ostria" and ep.final_em == 1.0 and ep.team_em == 1.0
    assert ep.num_searches == 3 and ep.num_waves == 1 and ep.selection == [2]
    assert ep.reports == ["Port Velm", "Port Velm is in Ostria."]
    assert ep.invalid_turns == 2
    # R_L = 0.9 * 1 + 0.1 * 3/6; searcher_0: 1 search -> b=0.5; searcher_1 invalid once -> b=-1
    assert ep.rewards["leader_0"] == pytest.approx(0.95)
    assert ep.rewards["searcher_0"] == pytest.approx(0.95)
    assert ep.rewards["searcher_1"] == pytest.approx(0.8)
    assert ep.rewards["searcher_2"] == 0.0
    assert [ep.rewards[f"answerer_{j}"] for j in range(5)] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert env.terminations == {} and env.agents == []  # every agent iterated once more, dead


def test_last_reward_is_the_role_reward(make_env):
    env = make_env()
    script = {a: list(t) for a, t in GOOD.items()}
    seen = {}
    for agent in env.agent_iter():
        _, reward, term, trunc, info = env.last()
        if term:
            seen[agent] = reward
            assert info["episode"] is env.episode
        env.step(None if term or trunc else script[agent].pop(0))
    assert seen == pytest.approx(env.episode.rewards)


def test_masks_are_one_exactly_on_generated_tokens(make_env, tokenizer):
    env = make_env()
    turns = {a: [tokenizer.encode(t, add_special_tokens=False) for t in ts] for a, ts in GOOD.items()}
    played = {a: [] for a in turns}
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        ids = turns[agent].pop(0)
        played[agent].append(ids)
        env.step(np.array(ids))
    for seg in env.episode.segments:
        gen = [t for t, m in zip(seg.token_ids, seg.loss_mask) if m]
        assert len(seg.loss_mask) == len(seg.token_ids)
        if seg.role == "searcher":
            continue  # a Searcher's turns are split over waves; checked below
        assert gen == [t for ids in played[seg.agent] for t in ids]
    by_agent = {}
    for seg in env.episode.segments_of("searcher"):
        by_agent.setdefault(seg.agent, []).extend(t for t, m in zip(seg.token_ids, seg.loss_mask) if m)
    for agent, gen in by_agent.items():
        assert gen == [t for ids in played[agent] for t in ids]
    # the retrieved passage text sits in a Searcher's context with mask 0
    seg = env.episode.segments_of("searcher")[0]
    text_env = tokenizer.decode([t for t, m in zip(seg.token_ids, seg.loss_mask) if not m])
    assert "<information>Doc 1(Title: Velmora Quist)" in text_env
    # reports handed to the Leader are env-written: mask 0
    leader = env.episode.segments_of("leader")[0]
    leader_env = tokenizer.decode([t for t, m in zip(leader.token_ids, leader.loss_mask) if not m])
    assert "Report: Port Velm is in Ostria." in leader_env


def test_logprobs_travel_with_tokens_and_serialise(make_env, tokenizer, tmp_path):
    env = make_env(workflow="cascade")
    script = {"searcher_0": ["<summary>Ostria</summary>"],
              **{f"answerer_{j}": ["<answer>Ostria</answer>"] for j in range(5)}}
    for agent in env.agent_iter():
        _, _, term, _, _ = env.last()
        if term:
            env.step(None)
            continue
        ids = tokenizer.encode(script[agent].pop(0), add_special_tokens=False)
        env.step({"token_ids": ids, "logprobs": [-0.5] * len(ids)})
    ep = env.episode
    seg = ep.segments[0]
    assert [lp for lp, m in zip(seg.logprobs, seg.loss_mask) if m] == [-0.5] * seg.num_generated
    assert all(lp == 0.0 for lp, m in zip(seg.logprobs, seg.loss_mask) if not m)
    # cascade searcher: summary with 0 searches -> b_S = 0
    assert ep.rewards["searcher_0"] == pytest.approx(0.9) and "leader_0" not in ep.rewards
    path = tmp_path / "eps.jsonl"
    save_episodes(path, [ep, ep])
    back = load_episodes(path)
    assert back[0] == ep and back[1].to_dict() == ep.to_dict()
    assert Episode.from_dict(ep.to_dict()) == ep
    (tmp_path / "bad.jsonl").write_text('{"question": {}}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_episodes(tmp_path / "bad.jsonl")


def test_budgets_end_roles_instead_of_crashing(make_env):
    env = make_env(max_searcher_turns=2, max_leader_turns=2, max_answerer_turns=2, num_candidates=2,
                   max_searchers=1)
    script = {"leader_0": ["<subtask>Velmora Quist</subtask>", "<subtask>again</subtask>"],
              "searcher_0": ["<search>Velmora</search>", "<search>more</search>", "x", "y"],
              "answerer_0": ["no", "still no"], "answerer_1": ["<answer>Ostria</answer>"]}
    ep = run_script(env, script)
    # wave 1: the Searcher searched on its last turn, so no summary -> empty report;
    # wave 2: two invalid turns -> empty report
    assert ep.reports == ["", ""] and ep.num_waves == 2 and ep.num_searches == 2
    # the Leader spent both its turns on waves, so it selects every report
    assert ep.selection == [1, 2]
    assert ep.candidates == ["", "Ostria"] and ep.final_answer == "Ostria"
    assert ep.segments_of("searcher")[0].reward == pytest.approx(0.9 * 1 - 0.1)


def test_no_waves_left_is_invalid_and_told(make_env, tokenizer):
    env = make_env(max_waves=1, max_searchers=1, num_candidates=1)
    script = {"leader_0": ["<subtask>a</subtask>", "<subtask>b</subtask>", "<select>1</select>"],
              "searcher_0": ["<summary>r</summary>"], "answerer_0": ["<answer>Kesh</answer>"]}
    ep = run_script(env, script)
    leader = ep.segments_of("leader")[0]
    assert leader.invalid_turns == 1 and ep.num_waves == 1
    assert "No waves left" in tokenizer.decode(leader.token_ids)
    assert "no waves left" in tokenizer.decode(leader.token_ids)


def test_garbage_actions_become_invalid_turns(make_env):
    env = make_env(workflow="cascade", num_candidates=1, max_searcher_turns=4)
    for bad in (np.array([[1, 2]]), np.array([10**9]), 3.5, None, object()):
        agent = env.agent_selection
        env.step(bad)
        assert env.infos[agent]["invalid"] and env.infos[agent]["kind"] == "invalid"
        if agent != env.agent_selection:
            break
    assert env.infos["searcher_0"]["note"]


def test_options_pin_the_question(make_env):
    env = make_env()
    env.reset(seed=3, options={"question": "What is the capital of Ostria?"})
    assert env.episode.question["question"] == "What is the capital of Ostria?"
    env.reset(seed=3, options={"question": QUESTION})
    assert env.episode.question["golden_answers"] == ["Ostria", "the Ostrian Republic"]
    assert env.agent_selection == "leader_0"


def test_turn_tail_after_the_stop_is_dropped(make_env, tokenizer):
    env = make_env(workflow="cascade")
    env.step("<search>Ostria capital</search> and then I hallucinate <information>")
    seg = env.episode.segments[0]
    gen = tokenizer.decode([t for t, m in zip(seg.token_ids, seg.loss_mask) if m])
    assert gen == "<search>Ostria capital</search>"
    assert "dropped" in env.infos["searcher_0"]["note"]


def test_config_errors_name_the_value(tokenizer, retriever):
    from envs import search_team_v0

    with pytest.raises(ValueError, match="'pyramid'"):
        search_team_v0.raw_env(workflow="pyramid", tokenizer=tokenizer, retriever=retriever, questions=[QUESTION])
    with pytest.raises(ValueError, match="step_mode"):
        search_team_v0.raw_env(step_mode="word", tokenizer=tokenizer, retriever=retriever, questions=[QUESTION])
    with pytest.raises(ValueError, match="max_waves must be >= 1, got 0"):
        search_team_v0.raw_env(max_waves=0, tokenizer=tokenizer, retriever=retriever, questions=[QUESTION])
