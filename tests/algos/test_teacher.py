"""algos.teacher: the Teacher is frozen, comes from the base model or a Stage-I run, and scores
the rows' own token ids (no re-tokenisation), Searchers always and the other roles for the KL."""

import numpy as np
import torch
from conftest import GOOD, TINY_TRAIN, WORLD, KeywordRetriever, run_script

from agents.models import tiny_causal_lm
from algos.batch import rows_from_episodes
from algos.config import TrainConfig
from algos.roles import rules_for
from algos.teacher import freeze, load_teacher, rows_to_score, score_with_teacher
from algos.trainer import Trainer


def _rows(make_env):
    return rows_from_episodes([[run_script(make_env(), GOOD)]], 4096)


def test_the_base_teacher_is_the_policys_start_and_frozen(tiny_dirs):
    policy_dir = tiny_dirs["policy"]
    from transformers import AutoModelForCausalLM

    teacher = load_teacher("base", policy_dir)
    saved = AutoModelForCausalLM.from_pretrained(policy_dir).state_dict()
    assert not teacher.training
    assert not any(p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(v, saved[k]) for k, v in teacher.state_dict().items())


def test_a_stage_one_run_directory_stands_for_its_latest_checkpoint(tmp_path, tiny_dirs):
    policy_dir = tiny_dirs["policy"]
    cfg = TrainConfig(**TINY_TRAIN, stage="teacher", model=policy_dir, out_dir=str(tmp_path / "teacher"))
    trainer = Trainer(cfg, progress=False, retriever=KeywordRetriever(WORLD))
    with torch.no_grad():  # stands in for two steps of Stage I
        for p in trainer.model.parameters():
            p.add_(0.01)
    trainer.step = 2
    trainer.save()
    teacher = load_teacher(str(tmp_path / "teacher"), policy_dir)
    trained = trainer.model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in teacher.state_dict().items())
    base = load_teacher("base", policy_dir).state_dict()
    assert all(not torch.equal(v, base[k]) for k, v in teacher.state_dict().items())


def test_the_teacher_scores_the_rows_own_token_ids(make_env, tokenizer):
    teacher = freeze(tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=4,
                                    initializer_range=0.5))
    rows = _rows(make_env)
    scored = score_with_teacher(teacher, rows, kl_coef=0.0, temperature=0.7)
    assert scored == rows_to_score(rows, 0.0) and {r.role for r in scored} == {"searcher"}
    assert rows_to_score(rows, 0.0, rules_for("team", "outcome")) == scored  # measured: teacher/kl
    assert all(r.teacher_logp is None for r in rows if r.role != "searcher")
    row = scored[0]
    with torch.no_grad():  # by hand: one forward over the row's ids, logits / T, next-token log-probs
        logits = teacher(torch.as_tensor(row.token_ids)[None]).logits[0] / 0.7
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.as_tensor(row.token_ids[1:])[:, None])[:, 0]
    by_hand = logp.numpy()[row.mask[1:]]
    assert len(row.teacher_logp) == row.mask.sum()
    np.testing.assert_allclose(row.teacher_logp, by_hand, atol=1e-5)


def test_with_a_kl_every_role_is_scored(make_env, tokenizer):
    teacher = freeze(tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=4))
    rows = _rows(make_env)
    score_with_teacher(teacher, rows, kl_coef=1e-3, temperature=1.0)
    assert {r.role for r in rows} == {"leader", "searcher", "answerer"}
    assert all(r.teacher_logp is not None and len(r.teacher_logp) == r.mask.sum() for r in rows)
