"""The learner under faults (issue 17.10-12): checkpoints never unpickle objects and never
hold non-finite weights; a step with a NaN or an infinity anywhere changes nothing and does
not count; the sampler refuses non-finite logits; chunking never changes the objective."""

import json
import pickle

import numpy as np
import pytest
import torch
from conftest import GOOD, make_trainer, run_script

from agents.hf import HFPolicy
from agents.models import tiny_causal_lm
from algos.advantages import AdvantageContext
from algos.batch import rows_from_episodes, score_rows
from algos.engine.checkpoint import latest_checkpoint, load_checkpoint
from algos.report import truncate_metrics
from algos.roles import assign_advantages
from algos.trainer import NonFiniteLoss

RAN = []


def _run(what):
    RAN.append(what)


class Payload:
    """Unpickling this calls ``_run``: the stand-in for a shell command."""

    def __reduce__(self):
        return (_run, ("unpickled",))


def test_a_checkpoint_holding_a_pickled_object_is_refused(tmp_path, tiny_dirs):
    trainer = make_trainer(tmp_path, tiny_dirs, steps=1)
    path = trainer.save()
    state = load_checkpoint(path, trainer.optimizer)  # our own state loads with weights_only=True
    assert state["step"] == 0 and isinstance(state["python_rng"], tuple)
    torch.save({"optimizer": trainer.optimizer.state_dict(), "state": {"step": 0, "x": Payload()}},
               path / "trainer_state.pt")
    with pytest.raises(ValueError, match=r"trainer_state\.pt: refusing to load"):
        load_checkpoint(path)
    with pytest.raises(ValueError, match="refusing to load"):
        make_trainer(tmp_path, tiny_dirs, resume=True)
    assert RAN == []
    pickle.loads(pickle.dumps(Payload()))  # the payload is live: plain unpickling runs it
    assert RAN == ["unpickled"]


def test_a_checkpoint_with_non_finite_weights_is_never_written(tmp_path, tiny_dirs):
    trainer = make_trainer(tmp_path, tiny_dirs, steps=1)
    good = trainer.save()
    with torch.no_grad():
        next(trainer.model.parameters())[0].fill_(float("nan"))
    trainer.step = 1
    with pytest.raises(ValueError, match="non-finite weights"):
        trainer.save()
    assert latest_checkpoint(tmp_path / "run") == good
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["latest", "step_000000"]


def _state(trainer):
    params = [p.detach().clone() for p in trainer.model.parameters()]
    moments = {k: {n: v.clone() for n, v in s.items()} for k, s in trainer.optimizer.state_dict()["state"].items()}
    return params, moments


def _same(a, b):
    (pa, ma), (pb, mb) = a, b
    return (all(torch.equal(x, y) for x, y in zip(pa, pb)) and ma.keys() == mb.keys()
            and all(torch.equal(ma[k][n], mb[k][n]) for k in ma for n in ma[k]))


def test_a_nan_in_the_second_minibatch_undoes_the_first(tmp_path, tiny_dirs):
    trainer = make_trainer(tmp_path, tiny_dirs, steps=3, minibatches=2)
    trainer.train_step()  # AdamW now has moments that a half-applied step would change
    before = _state(trainer)
    steps = []
    original_step, original_loss = trainer.optimizer.step, trainer.engine.chunk_loss

    def counting_step(*args, **kwargs):
        steps.append(1)
        return original_step(*args, **kwargs)

    def nan_after_a_step(chunk, totals=None):
        out = original_loss(chunk, totals)
        if steps:
            out.loss = out.loss * float("nan")
        return out

    trainer.optimizer.step, trainer.engine.chunk_loss = counting_step, nan_after_a_step
    with pytest.raises(NonFiniteLoss, match="minibatch 2 of 2"):
        trainer.train_step()
    assert steps == [1]  # the first minibatch did step ...
    assert _same(_state(trainer), before)  # ... and was undone, moments included
    assert trainer.step == 1 and trainer.nonfinite_in_a_row == 1


def test_nan_gradients_with_a_finite_loss_are_not_applied(tmp_path, tiny_dirs):
    trainer = make_trainer(tmp_path, tiny_dirs, steps=3, minibatches=1)
    trainer.train_step()
    before = _state(trainer)
    param = trainer.model.get_output_embeddings().weight
    handle = param.register_hook(lambda g: g * float("nan"))
    with pytest.raises(NonFiniteLoss, match="gradient norm nan"):
        trainer.train_step()
    handle.remove()
    assert _same(_state(trainer), before) and trainer.step == 1


def test_skipped_steps_do_not_count(tmp_path, tiny_dirs):
    trainer = make_trainer(tmp_path, tiny_dirs, steps=4, save_every=2)
    original = trainer.engine.chunk_loss
    failed = []

    def nan_once_at_step_two(chunk, totals=None):
        out = original(chunk, totals)
        if trainer.step == 1 and not failed:
            failed.append(trainer.step)
            out.loss = out.loss * float("inf")
        return out

    trainer.engine.chunk_loss = nan_once_at_step_two
    result = trainer.train(validate_first=False)
    assert failed == [1] and result["steps"] == 4 and len(result["history"]) == 4
    assert latest_checkpoint(tmp_path / "run").name == "step_000004"
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "losses/nonfinite" in r] == [2]  # the step it attempted
    truncate_metrics(tmp_path / "run" / "metrics.jsonl", 1)  # a resume from step 1 drops it
    assert "losses/nonfinite" not in (tmp_path / "run" / "metrics.jsonl").read_text()


def test_the_sampler_refuses_non_finite_logits(tokenizer):
    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2)
    with torch.no_grad():
        model.get_output_embeddings().weight.fill_(float("nan"))
    from agents.base import Observation

    obs = Observation(agent="leader_0", role="leader", token_ids=np.array([1, 2, 3]), max_new_tokens=4)
    with pytest.raises(ValueError, match="NaN or infinite in 1 of 1 rows"):
        HFPolicy(model, tokenizer, temperature=1.0).act([obs])


# ---------------------------------------------------------------------- chunking


def _scored_rows(make_env, tokenizer, trainer):
    groups = [[run_script(make_env(), GOOD) for _ in range(2)]]
    groups[0][1].rewards["leader_0"] = 0.1
    rows = rows_from_episodes(groups, 4096)
    teacher = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=7,
                             initializer_range=0.3)
    for r, old, ref in zip(rows, score_rows(trainer.model, rows), score_rows(teacher, rows)):
        r.old_logp, r.teacher_logp = old, ref
    assign_advantages(rows, trainer.rules, AdvantageContext(groups=groups, beta=trainer.config.beta),
                      kl_coef=trainer.config.kl_coef)
    return rows


@pytest.mark.parametrize("aggregation", ["token-mean", "sequence-mean"])
def test_the_objective_does_not_depend_on_chunking(tmp_path, tiny_dirs, make_env, tokenizer, aggregation):
    """Same rows, KL on: one chunk and one chunk per row give the same loss and gradient."""
    trainer = make_trainer(tmp_path, tiny_dirs, steps=1, kl_coef=1.0, aggregation=aggregation)
    with torch.no_grad():  # a policy away from old and Teacher: ratios and KLs are not trivial
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))
    rows = _scored_rows(make_env, tokenizer, trainer)
    kl_rows = [r for r in rows if r.kl]
    assert kl_rows and len(kl_rows) < len(rows)  # Searcher rows carry no KL: the counts differ
    results = []
    for max_tokens in (10**6, max(len(r.token_ids) for r in rows)):
        trainer.config.max_tokens_per_batch = max_tokens
        trainer.model.zero_grad(set_to_none=True)
        stats = trainer.engine.backward(rows)
        grad = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        results.append((stats["loss"], stats["kl"], grad))
    (loss_a, kl_a, grad_a), (loss_b, kl_b, grad_b) = results
    assert loss_b == pytest.approx(loss_a, rel=1e-6) and kl_b == pytest.approx(kl_a, rel=1e-6)
    assert kl_a > 0.01  # the KL term weighs in
    assert float((grad_a - grad_b).norm() / grad_a.norm()) < 1e-6
