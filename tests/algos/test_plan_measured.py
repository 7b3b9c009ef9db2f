"""The plan's terms against what PyTorch really holds, on CPU at small scale (issue 42.4):

- activations per token and layer: the tensors autograd saves in one decoder layer (counted by
  ``saved_tensors_hooks``, storages de-duplicated, those shared by every layer such as the rotary
  cos/sin left out) equal :meth:`Arch.activation_bytes_per_token_layer` exactly, for Llama and
  Qwen3 shapes, bfloat16 autocast over float32 weights and float32 throughout; autocast's weight
  casts equal ``b`` x the layer's matrix parameters;
- HF's KV cache under float32 weights and bfloat16 autocast: float32 keys, bfloat16 values, exactly
  :meth:`Arch.hf_kv_bytes_per_token`;
- AdamW's step: the peak resident memory of a subprocess (``VmHWM``, reset before the phase through
  ``/proc/self/clear_refs``; glibc told to map every
  allocation above 64 KiB so that a freed tensor leaves the RSS) over its memory before the step
  is the plan's temporary, 4 B a parameter with ``foreach`` within 10%, and under a tenth of it
  fused;
- the backward: the same subprocess measure of a chunk's backward (with activation checkpointing)
  is the plan's backward phase less its resident lines within 20%.

Measured on this machine (2 cores, torch 2.13 CPU): see docs/scaleout.md, "The memory plan".
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agents import logprobs
from algos.commands.plan import Arch

ROOT = Path(__file__).resolve().parents[2]
SHAPE = dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, head_dim=40,
             intermediate_size=352, vocab_size=600, tie_word_embeddings=True, max_position_embeddings=1024)
"""q = 240 differs from h = 192 and kv = 80, so that each term's coefficient is pinned."""


def _model(kind):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = (Qwen3Config if kind == "qwen3" else LlamaConfig)(**SHAPE)
    model = (Qwen3ForCausalLM if kind == "qwen3" else LlamaForCausalLM)(config).float()
    return model.train(), Arch.from_config(config.to_dict())


def _saved_per_layer(model, tokens, mixed):
    """Bytes autograd saves inside each decoder layer (storages counted once, those saved by
    every layer, e.g. rotary cos/sin, left out), split into per-token activations and weight casts."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = [dict() for _ in model.model.layers]
    current = [None]
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(lambda mod, args, i=i: current.__setitem__(0, i))
        layer.register_forward_hook(lambda mod, args, out: current.__setitem__(0, None))

    def pack(t):
        if current[0] is not None and t.untyped_storage().data_ptr() not in params:
            saved[current[0]][t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), tokens in t.shape)
        return t

    ids = torch.randint(0, SHAPE["vocab_size"], (1, tokens))
    context = torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False) if mixed else torch.autocast(
        "cpu", enabled=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), context:
        model.model(input_ids=ids, use_cache=False)
    shared = set.intersection(*(set(s) for s in saved))
    layer = {k: v for k, v in saved[1].items() if k not in shared}
    return (sum(n for n, per_token in layer.values() if per_token),
            sum(n for n, per_token in layer.values() if not per_token))


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("mixed", [True, False], ids=["bf16-autocast", "float32"])
def test_the_activation_term_is_what_autograd_saves(kind, mixed):
    model, arch = _model(kind)
    tokens = 37
    activations, casts = _saved_per_layer(model, tokens, mixed)
    b = 2 if mixed else 4
    assert activations == tokens * arch.activation_bytes_per_token_layer(4, b)
    assert casts == (b * arch.linear_layer_params if mixed else 0)


def test_hf_keys_are_float32_under_float32_weights():
    model, arch = _model("qwen3")
    model.eval()
    tokens = 29
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=torch.randint(0, SHAPE["vocab_size"], (1, tokens)), use_cache=True)
    cache = out.past_key_values
    layers = cache.layers if hasattr(cache, "layers") else None
    keys = [layer.keys for layer in layers] if layers else [k for k, _ in cache]
    values = [layer.values for layer in layers] if layers else [v for _, v in cache]
    assert {k.dtype for k in keys} == {torch.float32} and {v.dtype for v in values} == {torch.bfloat16}
    held = sum(t.numel() * t.element_size() for t in keys + values)
    assert held == tokens * arch.hf_kv_bytes_per_token(2) == tokens * arch.kv_bytes_per_token(2) * 3 // 2


PROBE = r"""
import json, sys, torch
torch.set_num_threads(1)
from transformers import LlamaConfig, LlamaForCausalLM
from agents.logprobs import token_logprobs
mode, tokens = sys.argv[1], int(sys.argv[2])
def rss():  # current resident bytes
    return int(open("/proc/self/statm").read().split()[1]) * 4096
def peak():  # the resident high-water mark since the last reset()
    import re
    return int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
def reset():  # Linux: writing 5 to clear_refs resets VmHWM to the current RSS
    open("/proc/self/clear_refs", "w").write("5")
torch.manual_seed(0)
config = LlamaConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                     intermediate_size=768, vocab_size=8000, tie_word_embeddings=True, max_position_embeddings=4096)
model = LlamaForCausalLM(config).float().train()
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
kw = {"fused": True} if mode == "fused" else {"foreach": True} if mode == "foreach" else {}
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
ids = torch.randint(0, 8000, (1, tokens)); att = torch.ones_like(ids)
tgt = torch.zeros_like(ids, dtype=torch.bool); tgt[:, 1:] = True
def backward():
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        lp = token_logprobs(model, ids, att, tgt)
    (-lp.mean()).backward()
backward(); opt.step(); opt.zero_grad(set_to_none=True)  # moments allocated, everything warm
backward()
reset(); before = rss(); opt.step(); step = peak() - before
opt.zero_grad(set_to_none=True)
import gc; gc.collect()
reset(); before = rss(); backward(); back = peak() - before
print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "step": step, "backward": back}))
"""


def _probe(mode, tokens=1024):
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["nice", sys.executable, "-c", PROBE, mode, str(tokens)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_adamw_step_temporary_is_measured():
    """foreach: ``sqrt(exp_avg_sq)`` for every parameter at once, 4 B each (the plan's line);
    fused: no temporary to speak of. Each measured as the step's peak RSS over the RSS before it."""
    foreach = _probe("foreach", tokens=64)
    assert 0.9 * 4 * foreach["params"] <= foreach["step"] <= 1.1 * 4 * foreach["params"], foreach
    fused = _probe("fused", tokens=64)
    # measured 0 here; CUDA's fused kernel also updates in place (benchmarks/gpu_probe.py measures it)
    assert fused["step"] <= 0.1 * 4 * fused["params"], fused


def test_a_chunks_backward_is_the_plans_backward_phase():
    """With checkpointing (the paper preset's setting), bfloat16 autocast over float32 weights and
    the chunked output layer: the peak over the resident model, moments and the previous
    gradients being freed is the plan's gradients + activations + the output layer's gradient."""
    from algos.commands.plan import memory_plan
    from algos.config import TrainConfig

    tokens = 1024
    got = _probe("default", tokens=tokens)
    arch = Arch(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, intermediate=768, vocab=8000, tied=True,
                max_positions=4096)
    cfg = TrainConfig(model="x", stage="teacher", device="cpu", dtype="bfloat16", max_tokens_per_batch=tokens,
                      gradient_checkpointing=True)
    plan = memory_plan(cfg, 1, 80, arch=arch)
    predicted = sum(line.bytes for line in plan.lines if line.phase == "backward" or line.phase.startswith("backward+"))
    assert arch.params == got["params"]
    assert 0.8 * predicted <= got["backward"] <= 1.2 * predicted, (got, predicted)


@pytest.mark.parametrize("feature", [True, False], ids=["boolean-logits_to_keep", "full-logits"])
def test_both_logits_to_keep_paths_equal_the_chunked_one(feature, monkeypatch):
    """N4: the boolean ``logits_to_keep`` path is chosen by the feature (transformers 5.17-5.20
    index with it and raise IndexError); with the flag either way, the model's own forward
    (``chunk_elements=0``, what FSDP takes) gives the chunked path's values and gradients."""
    if feature and not logprobs._slices_boolean_masks():
        pytest.skip("this transformers has no boolean slicing")
    monkeypatch.setattr(logprobs, "_BOOL_LOGITS_TO_KEEP", feature)
    model, _ = _model("qwen3")
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 9))
    att = torch.ones_like(ids)
    att[1, :3] = 0
    tgt = torch.zeros_like(ids, dtype=torch.bool)
    tgt[0, 1:] = True
    tgt[1, 4:] = True
    calls = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **kw: calls.append(kw) or forward(*a, **kw))
    full = logprobs.token_logprobs(model, ids, att, tgt, chunk_elements=0)
    assert ("logits_to_keep" in calls[-1]) is feature
    (g_full,) = torch.autograd.grad(full.sum(), model.model.layers[0].mlp.up_proj.weight)
    chunked = logprobs.token_logprobs(model, ids, att, tgt)
    (g_chunk,) = torch.autograd.grad(chunked.sum(), model.model.layers[0].mlp.up_proj.weight)
    torch.testing.assert_close(full, chunked, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g_full, g_chunk, rtol=1e-4, atol=1e-6)


def test_the_feature_is_read_from_transformers_not_its_version(monkeypatch):
    import transformers.modeling_utils as mu

    monkeypatch.setattr(logprobs, "_BOOL_LOGITS_TO_KEEP", None)
    monkeypatch.delattr(mu, "slice_logits_to_keep", raising=False)  # as in transformers 5.17-5.20
    assert logprobs.bool_logits_to_keep() is False
    monkeypatch.setattr(logprobs, "_BOOL_LOGITS_TO_KEEP", None)
    monkeypatch.setattr(mu, "slice_logits_to_keep", lambda h, keep: h[:, keep, :], raising=False)  # 5.20's indexing
    assert logprobs.bool_logits_to_keep() is False
    monkeypatch.setattr(logprobs, "_BOOL_LOGITS_TO_KEEP", True)
    assert logprobs.bool_logits_to_keep(torch.nn.Linear(2, 2)) is False  # a model whose module does not slice
