"""End to end, every row the trainer feeds the loss, checked against values computed here
without ``algos``: a fault-injected team plays valid, mixed-reward episodes (its Answerers
are sometimes wrong, its Searchers search once or twice), so every advantage path carries a
signal a sign, routing or grouping bug would change (PITFALLS: tests whose advantages are
all zero). For Stage I and for Stage II with every Searcher signal and teacher=base:
the loss mask, the old and the Teacher log-probs, the advantage and the KL mask of each row.
"""

import importlib

import numpy as np
import pytest
import torch
from conftest import Q2, QUESTION, SETUP, WORLD, FaultyTeam, KeywordRetriever

import algos.engine.update
from algos.config import TrainConfig
from algos.roles import needs_critic, rules_for, searcher_signals
from algos.trainer import Trainer


def grpo(rewards):
    r = np.asarray(rewards, dtype=np.float64)
    if np.ptp(r) == 0:
        return np.zeros_like(r)
    return (r - r.mean()) / (r.std(ddof=1) + 1e-6)


def logprobs_by_hand(model, ids, mask, temperature):
    """Teacher-forced log-probs of ids[mask] under ``model``: one plain forward pass."""
    with torch.no_grad():
        logits = model(torch.as_tensor(ids)[None]).logits[0]
    before = torch.as_tensor(mask[1:])  # position t - 1 predicts token t
    scaled = logits[:-1][before].double() / temperature
    return (torch.log_softmax(scaled, -1).gather(-1, torch.as_tensor(ids[1:][mask[1:]])[:, None])[:, 0]).numpy()


def per_row(tensor, counts):
    """Row b's n_b values out of the loss's (B, N_max) or flat (1, N) layout."""
    if tensor.shape[0] == len(counts):
        return [tensor[b, :n].detach().double().numpy() for b, n in enumerate(counts)]
    return [p.detach().double().numpy() for p in torch.split(tensor.reshape(-1), counts)]


def run_one_step(tmp_path, tiny_dirs, monkeypatch, **overrides):
    """One trainer step on the faulty team; returns (trainer, the policy before the step,
    the Episodes by question, and every row fed to the loss with its tensors)."""
    from transformers import AutoModelForCausalLM

    cfg = TrainConfig(**{**SETUP, "model": tiny_dirs["policy"], "out_dir": str(tmp_path / "run"), **overrides})
    trainer = Trainer(cfg, progress=False, retriever=KeywordRetriever(WORLD))
    trainer.train_questions = [QUESTION, Q2]
    trainer.policy = FaultyTeam(seed=cfg.seed)
    base = AutoModelForCausalLM.from_pretrained(tiny_dirs["policy"]).eval()
    groups_seen, fed, calls = [], [], []
    collect_module = importlib.import_module("agents.collect")  # (the package's `collect` is the function)
    original_collect, original_chunk = collect_module.collect, trainer.engine.chunk_loss

    def recording_collect(*args, **kwargs):
        groups = original_collect(*args, **kwargs)
        groups_seen.append(groups)
        return groups

    def recording_loss(logp, old, adv, mask, **kwargs):
        calls.append(dict(old=old, adv=adv, mask=mask, ref=kwargs.get("ref_logp_BT"),
                          kl_mask=kwargs.get("kl_mask_BT")))
        return original_loss(logp, old, adv, mask, **kwargs)

    def recording_chunk(chunk, totals=None):
        n_calls = len(calls)
        out = original_chunk(chunk, totals)
        assert len(calls) == n_calls + 1
        counts = [int(np.asarray(r.mask).sum()) for r in chunk]
        call = calls[-1]
        got = {k: (per_row(v, counts) if v is not None else [None] * len(chunk)) for k, v in call.items()}
        for b, row in enumerate(chunk):
            fed.append((row, {k: got[k][b] for k in got}))
        return out

    original_loss = algos.engine.update.policy_loss
    monkeypatch.setattr(collect_module, "collect", recording_collect)  # (the one-process Dist's rollouts)
    monkeypatch.setattr(algos.engine.update, "policy_loss", recording_loss)
    trainer.engine.chunk_loss = recording_chunk
    trainer.train_step()
    [groups] = groups_seen
    return trainer, base, groups, fed


def expected_advantage(row, groups, stage, signal, beta, old, teacher, critic_scores):
    """The advantage of ``row``'s tokens from the Episodes' rewards, by PAPER.md section 4."""
    g = next(k for k, eps in enumerate(groups) if any(ep is row.episode for ep in eps))
    eps = groups[g]
    i = next(k for k, ep in enumerate(eps) if ep is row.episode)
    agent = row.segment.agent
    if agent == "leader_0":
        return grpo([ep.rewards["leader_0"] for ep in eps])[i]
    if agent.startswith("answerer_"):
        return grpo(row.episode.candidate_em)[int(agent.split("_")[1])]
    if stage == "teacher":  # the cascade Searcher's own reward, 0.9 R_EM + 0.1 b_S
        return grpo([ep.rewards["searcher_0"] for ep in eps])[i]
    if signal == "opd":
        return beta * (teacher - old)
    if signal == "outcome":
        return grpo([ep.team_em for ep in eps])[i]
    if signal == "critic":  # w R_EM + (1 - w) score, over the Searchers of the question
        mine = [(ep, s) for ep, s in critic_scores.values() if any(ep is e for e in eps)]
        rewards = [0.5 * ep.team_em + 0.5 * min(max(s, 0.0), 1.0) for ep, s in mine]
        k = next(k for k, (ep, _) in enumerate(mine) if ep is row.episode)
        return grpo(rewards)[k]
    raise AssertionError(f"no advantage expected for {agent} under {signal}")


CASES = [
    pytest.param(dict(stage="teacher"), id="stage1"),
    pytest.param(dict(stage="team", teacher="TEACHER", searcher_signal="opd", kl_coef=0.5), id="opd"),
    pytest.param(dict(stage="team", teacher="TEACHER", searcher_signal="outcome", kl_coef=0.5), id="outcome"),
    pytest.param(dict(stage="team", teacher="TEACHER", searcher_signal="none", kl_coef=0.5), id="none"),
    pytest.param(dict(stage="team", searcher_signal="critic", kl_coef=0.0), id="critic"),
    pytest.param(dict(stage="team", teacher="base", searcher_signal="opd", kl_coef=0.5), id="teacher_base"),
]


@pytest.mark.parametrize("overrides", CASES)
def test_every_row_fed_to_the_loss_by_hand(tmp_path, tiny_dirs, monkeypatch, torch_one_thread, overrides):
    from transformers import AutoModelForCausalLM

    overrides = dict(overrides)
    if overrides.get("teacher") == "TEACHER":
        overrides["teacher"] = tiny_dirs["teacher"]
    critic_scores = {}
    if overrides.get("searcher_signal") == "critic":
        from algos.critic import PromptedCritic

        original = PromptedCritic.score_rows

        def recording(self, rows):
            scores = original(self, rows)
            critic_scores.update({(id(r.episode), r.segment.agent): (r.episode, s) for r, s in zip(rows, scores)})
            return scores

        monkeypatch.setattr(PromptedCritic, "score_rows", recording)
    trainer, base, groups, fed = run_one_step(tmp_path, tiny_dirs, monkeypatch, **overrides)
    cfg = trainer.config
    stage, signal = cfg.stage, cfg.searcher_signal
    teacher_dir = {None: None, "base": tiny_dirs["policy"]}.get(cfg.teacher, cfg.teacher)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval() if teacher_dir else None

    # the team played valid, mixed-reward episodes: every GRPO group has a signal
    episodes = [ep for eps in groups for ep in eps]
    assert len(groups) == 2 and all(len(eps) == 4 for eps in groups)
    assert all(ep.invalid_turns == 0 and ep.num_searches >= 1 for ep in episodes)
    assert all(np.ptp([ep.team_em for ep in eps]) > 0 for eps in groups)
    key = "searcher_0" if stage == "teacher" else "leader_0"
    assert all(np.ptp([ep.rewards[key] for ep in eps]) > 0 for eps in groups)
    assert sum(np.ptp(ep.candidate_em) > 0 for ep in episodes) >= 3

    # which rows reach the loss: every segment that generated, once (Searchers not under none)
    expected_agents = sorted((id(ep), seg.agent) for ep in episodes for seg in ep.segments
                             if any(seg.loss_mask[1:]) and not (seg.role == "searcher" and signal == "none"
                                                                and stage == "team"))
    assert sorted((id(row.episode), row.segment.agent) for row, _ in fed) == expected_agents
    roles_fed = {row.segment.role for row, _ in fed}
    assert roles_fed == ({"searcher", "answerer"} if stage == "teacher" else
                         {"leader", "answerer"} | ({"searcher"} if signal != "none" else set()))

    for row, got in fed:
        seg = row.segment
        mask = np.asarray(seg.loss_mask[: cfg.max_row_tokens], dtype=bool)
        mask[0] = False
        ids = np.asarray(seg.token_ids[: cfg.max_row_tokens], dtype=np.int64)
        assert np.array_equal(np.asarray(row.token_ids), ids)
        assert mask.sum() == len(got["old"]) and mask.sum() < len(ids)  # generated tokens only
        old = logprobs_by_hand(base, ids, mask, cfg.temperature)
        np.testing.assert_allclose(got["old"], old, atol=2e-5, err_msg=f"old log-probs of {seg.agent}")
        t_logp = logprobs_by_hand(teacher, ids, mask, cfg.temperature) if teacher is not None else None
        adv = expected_advantage(row, groups, stage, signal, cfg.beta, old, t_logp, critic_scores)
        np.testing.assert_allclose(got["adv"], np.broadcast_to(adv, old.shape), atol=2e-5,
                                   err_msg=f"advantage of {seg.agent}")
        kl = stage == "team" and cfg.kl_coef > 0 and seg.role in ("leader", "answerer")
        if got["kl_mask"] is None:
            assert not kl, f"no KL fed for {seg.agent}"
        else:
            assert np.all(got["kl_mask"] == float(kl)), f"KL mask of {seg.agent}"
            if kl:
                np.testing.assert_allclose(got["ref"], t_logp, atol=2e-5, err_msg=f"Teacher log-probs of {seg.agent}")
    if cfg.teacher == "base":  # the Teacher is the policy's start: OPD and KL are exactly 0 at step 1
        assert all(np.allclose(got["adv"], 0.0, atol=1e-6) for row, got in fed if row.segment.role == "searcher")
    if signal == "critic":
        assert len(critic_scores) == sum(1 for row, _ in fed if row.segment.role == "searcher")


@pytest.mark.parametrize("signal", searcher_signals())  # the registry, not a hand list
def test_every_registered_searcher_signal_runs_through_the_learner(tmp_path, tiny_dirs, monkeypatch,
                                                                   torch_one_thread, signal):
    """Rows, loss and a step for each Searcher signal of the table: the rows its rules train
    reach the loss with their KL flags, finite advantages, and the step is applied."""
    rules = rules_for("team", signal)
    trainer, base, groups, fed = run_one_step(tmp_path, tiny_dirs, monkeypatch, stage="team", searcher_signal=signal,
                                              teacher=tiny_dirs["teacher"], kl_coef=0.5)
    assert (trainer.critic is not None) == needs_critic(rules)
    assert {row.role for row, _ in fed} == {role for role, rule in rules.items() if rule.trained}
    for row, got in fed:
        assert row.trained and row.kl == rules[row.role].kl
        assert np.all(np.isfinite(got["adv"])) and len(got["adv"]) == row.num_targets
        assert np.all(got["kl_mask"] == float(row.kl)) if got["kl_mask"] is not None else not row.kl
    assert trainer.step == 1 and trainer.nonfinite_in_a_row == 0
    moved = any(not torch.equal(p, q) for p, q in zip(trainer.model.parameters(), base.parameters()))
    assert moved  # the step changed the weights
