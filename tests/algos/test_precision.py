"""Mixed precision that trains (issue 28.5): float32 weights and AdamW state, forwards in the
configured compute dtype; float32 runs untouched."""

import contextlib

import pytest
import torch
from conftest import WORLD, KeywordRetriever

import algos.engine.update as update_module
from agents.logprobs import token_logprobs
from agents.models import tiny_causal_lm
from algos.config import TrainConfig
from algos.engine.precision import precision_for
from algos.trainer import Trainer

ONE_STEP = dict(steps=1, questions_per_step=1, group_size=2, learning_rate=1e-6, max_turn_tokens=8,
                max_context_tokens=512, max_waves=1, max_searchers=1, max_searcher_turns=2, num_candidates=2,
                val_per_dataset=1, val_datasets=("nq",), eval_every=100, save_every=100, max_row_tokens=512,
                generation_batch_size=8, minibatches=1)


def test_a_lower_dtype_keeps_float32_weights_and_computes_in_it():
    p = precision_for("cuda:1", "bf16")
    assert (p.param_dtype, p.compute_dtype, p.device_type, p.mixed) == (torch.float32, torch.bfloat16, "cuda", True)
    policy = p.fsdp_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    with pytest.warns(UserWarning, match="CUDA is not available"):  # (this machine has no GPU)
        ctx = p.compute()
    assert isinstance(ctx, torch.autocast) and (ctx.device, ctx.fast_dtype) == ("cuda", torch.bfloat16)
    with precision_for("cpu", "bfloat16").compute():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    plain = precision_for("cpu", "float32")
    assert not plain.mixed and plain.fsdp_policy() is None and isinstance(plain.compute(), contextlib.nullcontext)
    with pytest.raises(ValueError, match="'float8'"):
        precision_for("cpu", "float8")


def test_tf32_only_on_cuda_with_a_lower_compute_dtype(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    precision_for("cpu", "bfloat16").configure()
    precision_for("cuda", "float32").configure()
    assert calls == []
    precision_for("cuda", "bfloat16").configure()
    assert calls == ["high"]


def test_a_given_low_precision_model_is_kept_in_float32():
    model = tiny_causal_lm(64, hidden_size=8, num_layers=1, num_heads=2).to(torch.bfloat16)
    precision_for("cpu", "bfloat16").prepare(model)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    precision_for("cpu", "float32").prepare(model.to(torch.bfloat16))  # float32 compute: as given
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_the_chunked_output_layer_gives_one_gradient_under_autocast(tokenizer):
    """Its backward recomputes the logits outside autocast: the forward must not have
    computed them in bfloat16, or the softmax of the backward is not the forward's."""
    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=3)
    ids = torch.randint(0, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(0))
    att = torch.ones_like(ids)
    tgt = torch.zeros_like(ids, dtype=torch.bool)
    tgt[:, 4:] = True
    grads = []
    for chunk in (None, 0):  # the chunked head, then the model's own forward
        model.zero_grad()
        with precision_for("cpu", "bfloat16").compute():
            logp = token_logprobs(model, ids, att, tgt, chunk_elements=chunk)
        logp.sum().backward()
        grads.append(model.lm_head.weight.grad.clone())
    # the same bfloat16 decoder under both; the head in float32 (chunked) or bfloat16 (own
    # forward): equal to bfloat16's precision, and the chunked one is not off by a factor
    assert torch.allclose(grads[0], grads[1], rtol=0.05, atol=1e-3)


def test_one_bf16_step_at_lr_1e6_moves_the_weights_that_got_a_gradient(tmp_path, tiny_dirs, monkeypatch):
    """Today's bug (W1): bfloat16 weights with AdamW at 1e-6 kept about 2% of the updates.
    Counted: the weights whose gradient exceeds AdamW's eps (1e-8), which its first step
    moves by at least lr / 2; a smaller gradient's step (lr * g / (g + eps)) can round away
    in float32 too."""
    seen = []
    real = update_module.token_logprobs

    def spy(*args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(*args, **kwargs)

    monkeypatch.setattr(update_module, "token_logprobs", spy)
    cfg = TrainConfig(**{**ONE_STEP, "model": tiny_dirs["policy"], "out_dir": str(tmp_path / "run"),
                         "teacher": tiny_dirs["teacher"], "dtype": "bfloat16"})
    trainer = Trainer(cfg, progress=False, retriever=KeywordRetriever(WORLD))
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert {p.dtype for p in trainer.teacher.parameters()} == {torch.bfloat16}  # frozen: compute dtype
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    grads = {}
    step = trainer.optimizer.step

    def keep_grads(*args, **kwargs):
        grads.update({n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    monkeypatch.setattr(trainer.optimizer, "step", keep_grads)
    trainer.train_step()
    assert seen and all(s == (True, torch.bfloat16) for s in seen)  # the update's forwards ran in bf16
    got = moved = 0
    for n, p in trainer.model.named_parameters():
        nonzero = grads[n].abs() > 1e-8
        got += int(nonzero.sum())
        moved += int((nonzero & (p.detach() != before[n])).sum())
        assert trainer.optimizer.state[p]["exp_avg"].dtype == torch.float32
    assert got > 10_000 and moved / got >= 0.99, f"{moved} of {got} weights with a gradient moved"


def test_float32_runs_use_no_autocast_and_checkpointing_changes_no_number(tmp_path, tiny_dirs, monkeypatch):
    seen = []
    real = update_module.token_logprobs

    def spy(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return real(*args, **kwargs)

    monkeypatch.setattr(update_module, "token_logprobs", spy)
    metrics = []
    for checkpointing in (False, True):
        cfg = TrainConfig(**{**ONE_STEP, "model": tiny_dirs["policy"], "out_dir": str(tmp_path / f"run{checkpointing}"),
                             "teacher": tiny_dirs["teacher"], "gradient_checkpointing": checkpointing})
        trainer = Trainer(cfg, progress=False, retriever=KeywordRetriever(WORLD))
        model = trainer.model
        on = model.is_activation_checkpointing if hasattr(model, "is_activation_checkpointing") else \
            model.is_gradient_checkpointing
        assert on == checkpointing
        metrics.append(trainer.train_step())
    assert seen and not any(seen)
    assert metrics[0]["losses/tokens"] > 0
    for key in ("losses/policy", "losses/grad_norm", "losses/kl_teacher"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-6), key
