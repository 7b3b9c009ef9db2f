"""The learner on a tiny randomly initialised model: masks, Teacher = policy, every
parameter moves, resume reproduces the straight run."""

import json

import numpy as np
import pytest
import torch
from conftest import GOOD, TINY_TRAIN, WORLD, KeywordRetriever, make_trainer

from agents.hf import HFPolicy
from agents.logprobs import token_logprobs
from agents.models import tiny_causal_lm
from agents.sampling import Sampling
from algos.advantages import AdvantageContext
from algos.batch import pad_rows, rows_from_episodes, score_rows
from algos.config import TrainConfig
from algos.losses import policy_loss
from algos.roles import assign_advantages, rules_for


def _scripted_groups(make_env, n=2):
    from conftest import run_script

    return [[run_script(make_env(), GOOD) for _ in range(n)]]


def test_a_roles_gradient_is_zero_on_env_and_other_roles_tokens(make_env, tokenizer):
    groups = _scripted_groups(make_env, n=1)
    rows = [r for r in rows_from_episodes(groups, 4096) if r.segment.agent in ("leader_0", "searcher_1")]
    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2)
    ids, att, _ = pad_rows(rows)
    every = att.bool().clone()
    every[:, 0] = False
    logp = token_logprobs(model, ids, att, every)  # every position, so we can look at all grads
    logp.retain_grad()
    # the Leader's loss: its generated tokens only
    loss_mask = torch.zeros_like(every)
    for b, r in enumerate(rows):
        if r.role == "leader":
            loss_mask[b, : len(r.mask)] = torch.from_numpy(r.mask)
    flat_mask = loss_mask[every].float()
    policy_loss(logp[None], logp.detach()[None], torch.ones_like(logp)[None], flat_mask[None]).loss.backward()
    grad = logp.grad
    assert torch.all(grad[flat_mask == 0] == 0.0)   # env tokens and other roles' tokens
    assert torch.all(grad[flat_mask == 1] != 0.0)
    # and the mask itself is exactly the generated tokens (prompt, passages, reports: 0)
    leader = next(r for r in rows if r.role == "leader")
    assert leader.mask.sum() == leader.segment.num_generated


def test_assign_advantages_routes_by_role(make_env):
    groups = _scripted_groups(make_env)
    groups[0][1].rewards["leader_0"] = 0.1  # two workflows with different Leader rewards
    rows = rows_from_episodes(groups, 4096)
    for r in rows:
        r.old_logp = np.full(int(r.mask.sum()), -2.0)
        r.teacher_logp = np.full(int(r.mask.sum()), -1.0)
    ctx = AdvantageContext(groups=groups, beta=0.01)
    assign_advantages(rows, rules_for("team", "opd"), ctx)
    leaders = [r for r in rows if r.role == "leader"]
    assert leaders[0].advantages[0] == pytest.approx(0.7071, abs=1e-3) and leaders[1].advantages[0] < 0
    searcher = next(r for r in rows if r.role == "searcher")
    assert np.allclose(searcher.advantages, 0.01)  # beta * (teacher - old) = 0.01 * 1
    answerers = [r.advantages[0] for r in rows if r.role == "answerer" and r.episode is groups[0][0]]
    assert answerers == pytest.approx([0.7303, 0.7303, -1.0954, -1.0954, 0.7303], abs=1e-3)
    assign_advantages(rows, rules_for("team", "none"), ctx)
    assert all(not r.trained for r in rows if r.role == "searcher")


def test_teacher_equal_to_policy_gives_zero_opd_and_kl(tmp_path, tiny_dirs, make_env, tokenizer):
    groups = _scripted_groups(make_env)
    rows = rows_from_episodes(groups, 4096)
    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2)
    for r, old, teacher in zip(rows, score_rows(model, rows), score_rows(model, rows)):
        r.old_logp, r.teacher_logp = old, teacher
    assign_advantages(rows, rules_for("team", "opd"), AdvantageContext(groups=groups))
    searchers = [r for r in rows if r.role == "searcher"]
    assert searchers and all(np.all(r.advantages == 0.0) for r in searchers)
    # and through the trainer: the same checkpoint as policy and Teacher, KL exactly 0
    same = {"policy": tiny_dirs["policy"], "teacher": tiny_dirs["policy"]}
    metrics = make_trainer(tmp_path, same, steps=1).train_step()
    assert metrics["losses/kl_teacher"] == 0.0 and metrics["losses/tokens"] > 0


def test_one_update_moves_every_parameter_and_the_loss_is_finite(tmp_path, tiny_dirs):
    trainer = make_trainer(tmp_path, tiny_dirs, steps=1)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    metrics = trainer.train_step()
    assert np.isfinite(metrics["losses/policy"]) and metrics["losses/kl_teacher"] > 0
    unchanged = [n for n, p in trainer.model.named_parameters() if torch.equal(before[n], p.detach())]
    assert unchanged == []


def test_frozen_embeddings_stay_while_everything_else_moves(tmp_path, tiny_dirs):
    trainer = make_trainer(tmp_path, tiny_dirs, steps=1, freeze_embeddings=True)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train_step()
    unchanged = [n for n, p in trainer.model.named_parameters() if torch.equal(before[n], p.detach())]
    assert unchanged == ["model.embed_tokens.weight"]


def test_resume_continues_exactly(tmp_path, tiny_dirs):
    def losses(metrics):
        return [metrics["losses/policy"], metrics["losses/kl_teacher"]]

    straight = make_trainer(tmp_path / "a", tiny_dirs)
    losses_a = [losses(straight.train_step()) for _ in range(3)]
    first = make_trainer(tmp_path / "b", tiny_dirs)
    losses_b = [losses(first.train_step()) for _ in range(2)]
    first.save()
    resumed = make_trainer(tmp_path / "b", tiny_dirs, resume=True)
    assert resumed.step == 2
    losses_b.append(losses(resumed.train_step()))
    assert np.allclose(losses_b, losses_a, atol=1e-6, rtol=0)
    assert losses_a[2][1] > 0 and losses_a[2] != losses_a[0]  # the updates did change things


def test_config_errors_explain():
    with pytest.raises(ValueError, match="opd Searcher signal needs a Teacher"):
        TrainConfig(stage="team")
    with pytest.raises(ValueError, match="group_size=1"):
        TrainConfig(stage="teacher", group_size=1)
    with pytest.raises(ValueError, match="searcher_signal='judge'"):
        TrainConfig(stage="team", teacher="base", searcher_signal="judge")


def test_a_fresh_run_refuses_a_directory_that_holds_one(tmp_path, tiny_dirs):
    trainer = make_trainer(tmp_path, tiny_dirs, steps=1)
    trainer.log_metrics({"val/avg@1": 0.5}, step=0)
    with pytest.raises(FileExistsError, match="--resume"):
        make_trainer(tmp_path, tiny_dirs, steps=1)
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1  # nothing lost


def test_updates_keep_what_the_model_declares_frozen(tmp_path, tiny_dirs, tokenizer):
    """A base whose config declares frozen parameters (algos.engine.freeze; the micro recipe's wired
    circuit is one) keeps them through RL updates; the rest of the model trains."""
    from algos.engine.freeze import declare_frozen

    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=2, num_heads=2, seed=0,
                           eos_token_id=tokenizer.eos_token_id, initializer_range=0.2)
    declare_frozen(model, ["model.layers.0.*", "model.layers.1.self_attn.k_proj.weight[0:8]"])
    model.save_pretrained(tmp_path / "declared")
    tokenizer.save_pretrained(tmp_path / "declared")
    trainer = make_trainer(tmp_path, {**tiny_dirs, "policy": str(tmp_path / "declared")}, steps=1)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert trainer.train_step()["losses/tokens"] > 0
    params = dict(trainer.model.named_parameters())
    moved = lambda name, rows=slice(None): not torch.equal(params[name][rows], before[name][rows])  # noqa: E731
    assert not any(moved(n) for n in params if n.startswith("model.layers.0."))
    assert not moved("model.layers.1.self_attn.k_proj.weight", slice(0, 8))
    assert moved("model.layers.1.self_attn.k_proj.weight", slice(8, 16))
    assert moved("model.layers.1.mlp.down_proj.weight")
    # weight decay would move what a zero gradient keeps: refused, naming the setting
    with pytest.raises(ValueError, match="weight_decay=0.01.*declares frozen"):
        make_trainer(tmp_path / "decay", {**tiny_dirs, "policy": str(tmp_path / "declared")}, weight_decay=0.01)


def test_token_logprobs_at_a_temperature_are_the_sampling_distributions(tokenizer):
    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=3,
                           initializer_range=0.5)
    ids = torch.tensor([[5, 9, 2, 7, 11]])
    att = torch.ones_like(ids)
    targets = torch.tensor([[False, True, True, False, True]])
    with torch.no_grad():
        logits = model(ids).logits[0]
        got = token_logprobs(model, ids, att, targets, temperature=0.5)
    by_hand = [torch.log_softmax(logits[t - 1] / 0.5, -1)[ids[0, t]] for t in (1, 2, 4)]
    assert torch.allclose(got, torch.stack(by_hand), atol=1e-5)
    assert not torch.allclose(got, token_logprobs(model, ids, att, targets).detach(), atol=1e-3)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(model, ids, att, targets, temperature=0.0)


def test_the_learner_scores_at_the_rollout_temperature(tmp_path, tiny_dirs, monkeypatch):
    """Ratios, OPD advantages and KLs are taken under the distribution the rollouts were
    sampled from: old, new and Teacher log-probs all at the config's temperature."""
    import algos.batch
    import algos.engine.update

    seen = []

    def recording(model, ids, att, tgt, temperature=1.0, **options):
        seen.append(temperature)
        return token_logprobs(model, ids, att, tgt, temperature, **options)

    monkeypatch.setattr(algos.batch, "token_logprobs", recording)
    monkeypatch.setattr(algos.engine.update, "token_logprobs", recording)
    make_trainer(tmp_path, tiny_dirs, steps=1, temperature=0.7).train_step()
    assert seen and set(seen) == {0.7}


def test_one_sampling_reaches_the_rollouts_their_records_and_validation(tmp_path, tiny_dirs, monkeypatch):
    """``TrainConfig.sampling`` is the one holder: the rollout policy samples with it, every
    episode records it, and validation's sampler differs from it only in ``val_temperature``."""
    import algos.trainer

    trainer = make_trainer(tmp_path, tiny_dirs, steps=1, temperature=0.7, top_p=0.9, val_temperature=0.0)
    cfg = trainer.config
    assert cfg.sampling == Sampling(0.7, 0.9, 8) and cfg.val_sampling == Sampling(0.0, 0.9, 8)
    assert trainer.backend.policy.sampling == cfg.sampling
    groups = trainer.collect_rollouts()
    assert {str(ep.sampling[role]) for g in groups for ep in g for role in ("leader", "searcher", "answerer")} == {
        str({"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 8})}
    built = []
    monkeypatch.setattr(algos.trainer, "HFPolicy", lambda *a, **kw: built.append(kw["sampling"]) or HFPolicy(*a, **kw))
    trainer.validate()
    assert built == [cfg.val_sampling]


def test_validation_writes_per_question_records_that_benchmarks_compare_reads(tmp_path, tiny_dirs, capsys):
    from algos.trainer import validation_path
    from benchmarks.__main__ import main

    trainer = make_trainer(tmp_path, tiny_dirs, val_per_dataset=3, val_runs=2)
    em = trainer.validate()
    path = validation_path(tmp_path / "run", 0)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["dataset"], r["id"]) for r in records] == [("nq", q.id) for q in trainer.val_questions]
    assert all(len(r["correct"]) == 2 and len(r["searches"]) == 2 for r in records)
    assert em == pytest.approx(np.mean([r["correct"] for r in records]))
    assert main(["compare", str(path), str(path)]) == 0
    assert "+0.00 points" in capsys.readouterr().out


def test_the_pipeline_summary_compares_each_stage_with_its_base(tmp_path, tiny_dirs):
    from algos.commands.train import run_pipeline

    overrides = {**TINY_TRAIN, "model": tiny_dirs["policy"], "steps": 1, "val_per_dataset": 3}
    lines = []
    summary = run_pipeline("micro", tmp_path, stages=("teacher", "team"), overrides=overrides, progress=False,
                           log=lines.append, retriever=KeywordRetriever(WORLD))
    for stage, workflow in (("teacher", "cascade"), ("team", "hierarchical")):
        got = summary["stages"][stage]
        assert got["workflow"] == workflow and got["steps"] == 1 and got["val_questions"] == 3
        paired = got["paired"]
        assert paired["questions"] == 3 and paired["better"] + paired["worse"] <= 3 and 0 < paired["p_value"] <= 1
        for step in (0, 1):
            assert (tmp_path / stage / "validation" / f"step_{step:06d}.jsonl").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["stages"]["team"]["paired"] == summary["stages"]["team"]["paired"]
    assert summary["wall_time_s"] > 0
    assert any("questions better" in line and "sign test p" in line for line in lines)


def test_resuming_a_stage_that_stopped_before_its_first_checkpoint_says_so(tmp_path, tiny_dirs):
    from algos.commands.train import run_pipeline

    stage = tmp_path / "teacher"
    stage.mkdir()
    (stage / "metrics.jsonl").write_text('{"step": 0, "val/avg@1": 0.5}\n')
    overrides = {**TINY_TRAIN, "model": tiny_dirs["policy"], "steps": 1, "val_per_dataset": 3}
    with pytest.raises(FileNotFoundError, match="stopped before its first checkpoint"):
        run_pipeline("micro", tmp_path, stages=("teacher",), overrides=overrides, resume=True, progress=False,
                     log=lambda _: None, retriever=KeywordRetriever(WORLD))
    assert (stage / "metrics.jsonl").read_text() == '{"step": 0, "val/avg@1": 0.5}\n'  # nothing lost


def test_command_line_overrides_are_typed_and_a_small_training_set_is_the_first_questions(tmp_path, tiny_dirs):
    from algos.__main__ import parse_overrides

    got = parse_overrides(["steps=5", "train_datasets=nq,popqa", "train_per_dataset=2", "learning_rate=2e-4",
                           "teacher=base", "val_split=train"])
    assert got == {"steps": 5, "train_datasets": ("nq", "popqa"), "train_per_dataset": 2, "learning_rate": 2e-4,
                   "teacher": "base", "val_split": "train"}
    with pytest.raises(SystemExit, match="name one of"):
        parse_overrides(["stepz=5"])
    with pytest.raises(ValueError, match="train_per_dataset=0"):
        TrainConfig(stage="teacher", train_per_dataset=0)
    trainer = make_trainer(tmp_path, tiny_dirs, train_datasets=("nq", "popqa"), train_per_dataset=2,
                       val_split="train", val_per_dataset=2, val_datasets=("nq", "popqa"))
    from envs.data import load_qa

    first_two = [q.id for name in ("nq", "popqa") for q in load_qa(name, "train", root="synthetic")[:2]]
    assert [q.id for q in trainer.train_questions] == first_two
    assert [q.id for q in trainer.val_questions] == first_two


def test_pass_rate_filter_keeps_the_questions_some_but_not_all_workflows_got_right(tmp_path, tiny_dirs,
                                                                                   monkeypatch):
    from types import SimpleNamespace

    import algos.trainer

    trainer = make_trainer(tmp_path, tiny_dirs, pass_rate_filter=4, train_per_dataset=3)
    pool = list(trainer.train_questions)
    right = [0, 1, 4, 2, 4, 3]  # right counts of 4, question by question
    asked = []

    def collect(env_fn, sampler, questions, group_size, seed, progress):
        asked.append((len(questions), group_size, sampler.temperature, sampler is trainer.policy))
        return [[SimpleNamespace(team_em=float(k < r)) for k in range(group_size)] for r in right]

    monkeypatch.setattr(algos.trainer, "collect", collect)
    trainer.filter_by_pass_rate()
    assert asked == [(6, 4, trainer.config.temperature, False)] and len(pool) == 6
    expected = [pool[i] for i in (1, 3, 5)]  # 1, 2 and 3 of 4: neither none nor all
    assert [(q.dataset, q.id) for q in trainer.train_questions] == [(q.dataset, q.id) for q in expected]
    saved = json.loads((tmp_path / "run" / "train_questions.json").read_text())
    assert saved["pool"] == 6 and [q["right"] for q in saved["kept"]] == [1, 2, 3]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [{"step": 0, "stage": "team", "data/train_questions": 3.0, "data/train_pool": 6.0}]

    # a resumed run reads the kept questions back and samples nothing
    trainer.save()
    resumed = make_trainer(tmp_path, tiny_dirs, resume=True, pass_rate_filter=4, train_per_dataset=3)
    monkeypatch.setattr(algos.trainer, "collect", lambda *a, **k: pytest.fail("a resumed run re-sampled the filter"))
    resumed.filter_by_pass_rate()
    assert [q.id for q in resumed.train_questions] == [q.id for q in expected]


def test_pass_rate_filter_that_keeps_nothing_says_so(tmp_path, tiny_dirs, monkeypatch):
    from types import SimpleNamespace

    import algos.trainer

    trainer = make_trainer(tmp_path, tiny_dirs, pass_rate_filter=2, train_per_dataset=1)
    monkeypatch.setattr(algos.trainer, "collect",
                        lambda env_fn, sampler, questions, g, seed, progress: [[SimpleNamespace(team_em=0.0)] * g
                                                                               for _ in questions])
    with pytest.raises(ValueError, match="no training question of 2 was right some but not all of 2 times"):
        trainer.filter_by_pass_rate()
    with pytest.raises(ValueError, match="pass_rate_filter"):
        TrainConfig(stage="teacher", pass_rate_filter=1)


def test_every_train_config_field_has_its_line_of_doc():
    """CleanRL's habit: a docstring under each setting (read from the source, as Sphinx would)."""
    import ast
    import dataclasses
    import inspect

    import algos.config

    tree = ast.parse(inspect.getsource(algos.config.TrainConfig))
    body = tree.body[0].body
    documented = {st.target.id for st, nxt in zip(body, body[1:])
                  if isinstance(st, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)}
    missing = [f.name for f in dataclasses.fields(algos.config.TrainConfig) if f.name not in documented]
    assert missing == []
