"""TRL's GRPOTrainer trains one SearchTeam role through ``make_rollout_func`` (issue 31.3):
two steps on a tiny model; the tokens TRL trains on are exactly the env masks' ones, and
the weights move under a reward that varies inside a group."""

from __future__ import annotations

import pytest

from agents.trl_rollout import blocks, make_rollout_func, segment_sample
from envs.episode import Episode, Segment


def test_a_sample_is_the_segment_from_its_first_generated_token():
    seg = Segment("answerer_0", "answerer", -1, token_ids=[1, 2, 3, 4, 5, 6], loss_mask=[0, 0, 1, 1, 0, 1],
                  logprobs=[0.0, 0.0, -0.5, -0.25, 0.0, -1.0], reward=1.0)
    ep = Episode(question={"id": "q"}, workflow="cascade", segments=[seg], team_em=1.0, final_em=0.0)
    assert segment_sample(ep, "answerer_0") == {
        "prompt_ids": [1, 2], "completion_ids": [3, 4, 5, 6], "logprobs": [-0.5, -0.25, 0.0, -1.0],
        "env_mask": [1, 1, 0, 1], "role_reward": 1.0, "team_em": 1.0, "final_em": 0.0}
    with pytest.raises(ValueError, match="no segment of leader_0"):
        segment_sample(ep, "leader_0")


def test_layout_and_roles_are_checked():
    assert blocks(["a", "a", "b", "b"], 2) == ["a", "b"]
    with pytest.raises(ValueError, match="not one prompt repeated"):
        blocks(["a", "b", "a", "b"], 2)
    with pytest.raises(ValueError, match="OPD term"):
        make_rollout_func(lambda: None, "searcher")


def test_two_grpo_steps_train_exactly_the_masked_tokens(tmp_path, tokenizer, torch_one_thread, monkeypatch):
    pytest.importorskip("trl")
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from agents.hf import HFPolicy
    from agents.models import tiny_causal_lm
    from envs import env_fn
    from envs.data.synthwiki import default_world
    from envs.retrieval.factory import make_retriever

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    items = default_world().questions("hotpotqa", "dev")[:2]
    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=0,
                           eos_token_id=tokenizer.eos_token_id, initializer_range=0.2)
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rollout = make_rollout_func(
        env_fn(workflow="cascade", retriever=make_retriever("words"), max_searcher_turns=2,
               num_candidates=2, max_answerer_turns=1, max_turn_tokens=16),
        "answerer", questions={q.question: q for q in items},
        policy_factory=lambda trainer, call: HFPolicy(trainer.model, trainer.processing_class,
                                                      max_new_tokens=8, seed=call))
    masks: list[list[list[int]]] = []

    def recorded(prompts, trainer):
        out = rollout(prompts, trainer)
        masks.append(out["env_mask"])
        return out

    def varying(prompts, completions, completion_ids=None, **kw):
        # the random model's answers all score 0: reward its first sampled token instead, which
        # varies inside a group, so advantages and gradients are not all zero
        return [float(ids[0] % 5) for ids in completion_ids]

    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, num_generations=2, per_device_train_batch_size=4,
                      learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                      bf16=False, mask_truncated_completions=False, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[varying], args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_dict({"prompt": [q.question for q in items] * 4}),
                          rollout_func=recorded)
    trainer.train()

    logged = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    assert len(masks) == 2 and len(logged) == 2
    for step_masks, mean_length in zip(masks, logged):
        assert len(step_masks) == 4
        trained = [sum(m) for m in step_masks]
        assert mean_length == pytest.approx(sum(trained) / len(trained))
        assert all(0 < t < len(m) for t, m in zip(trained, step_masks))  # env tokens were masked out
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert moved, "no weight changed"


# ---------------------------------------------------------------------------- per-call seeds, segment chosen (issue 44.7)


def _episode(qid, seed, agents):
    """An episode whose segments carry their agent's index and the seed in their ids."""
    segs = []
    for n, agent in enumerate(agents):
        mark = seed * 100 + n
        segs.append(Segment(agent, agent.rpartition("_")[0], -1, token_ids=[mark, mark + 1, mark + 2],
                            loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.5], reward=float(n)))
    return Episode(question={"id": qid}, workflow="hierarchical", segments=segs, team_em=1.0, final_em=1.0,
                   seed=seed)


def test_each_call_draws_new_seeds_and_returns_the_chosen_segment(monkeypatch):
    import types

    import agents.trl_rollout as trl

    seen = []

    def fake_collect(env_fn, policy, items, *, group_size, seed):
        seen.append((policy, list(items), group_size, seed))
        return [[_episode(str(item), seed + b * group_size + g,
                          ["leader_0", "answerer_0", "answerer_1", "answerer_1", "answerer_2"])
                 for g in range(group_size)] for b, item in enumerate(items)]

    monkeypatch.setattr(trl, "collect", fake_collect)
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(num_generations=2))
    factory_calls = []
    rollout = make_rollout_func(lambda: None, "answerer", answerer=1, seed=5,
                                policy_factory=lambda tr, call: factory_calls.append(call) or f"policy{call}")
    first = rollout(["p", "p", "q", "q"], trainer)
    second = rollout(["p", "p"], trainer)
    # seeds: seed + call * 1_000_003, the policy seeded by the call number
    assert [(s[0], s[1], s[2], s[3]) for s in seen] == [("policy0", ["p", "q"], 2, 5), ("policy1", ["p"], 2, 1_000_008)]
    assert factory_calls == [0, 1]
    # answerer_1's first segment (index 2 in each episode), one sample per episode in order
    assert first["prompt_ids"] == [[502], [602], [702], [802]]
    assert first["completion_ids"] == [[503, 504], [603, 604], [703, 704], [803, 804]]
    assert first["role_reward"] == [2.0, 2.0, 2.0, 2.0]
    assert second["prompt_ids"] == [[100000802], [100000902]]
    leader = make_rollout_func(lambda: None, "leader", seed=0, policy_factory=lambda tr, call: None)
    assert leader(["p", "p"], trainer)["prompt_ids"] == [[0], [100]]  # the leader's segment, seeds 0 and 1
