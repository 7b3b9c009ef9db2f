"""The memory plan (issue 28.6): every line of a tiny case computed by hand, the paper preset
fitting 8 x 80 GiB and one H200 and refused on 24 GiB in one line, the preflight refusing on
CUDA before anything is built."""

import json
import types

import pytest
import torch

from algos.config import TrainConfig
from algos.plan import GIB, HEADROOM_GIB, KNOWN_ARCHS, Arch, arch_of, main, memory_plan
from algos.preflight import PreflightError, check_memory
from algos.presets import preset_config

TINY = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 16, "vocab_size": 32,
        "tie_word_embeddings": True, "max_position_embeddings": 128}


@pytest.fixture
def tiny_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return tmp_path


def _cfg(model, **kw):
    return TrainConfig(**{"model": str(model), "stage": "team", "teacher": "base", "device": "cuda",
                          "dtype": "bfloat16", "max_tokens_per_batch": 100, "generation_batch_size": 3,
                          "max_context_tokens": 50, "max_turn_tokens": 14, "gradient_checkpointing": True, **kw})


def test_every_line_of_a_tiny_plan_by_hand(tiny_dir):
    # parameters: embeddings 32*8 = 256 (tied: once); a layer: q 8*8 + k, v 2*(8*4) + o 8*8 = 192,
    # MLP 3*8*16 = 384, two norms 16: 592; two layers 1184; final norm 8: 1448
    assert arch_of(str(tiny_dir)).params == 1448
    plan = memory_plan(_cfg(tiny_dir), gpus=1, gpu_memory_gib=24)
    got = {line.name: (line.phase, line.bytes) for line in plan.lines}
    # activations per token and layer: 2*4*8 (norm inputs, float32) + 2*(2*8 + 3*8 + 2*4 + 4*16) = 288;
    # the head: 100 tokens' hidden 100*8*4 = 3200 + float32 logits and gradient 2*4*100*32 = 25600;
    # checkpointing on: 100*(2*4*8 + 288) + 28800 = 64000; off: 100*2*288 + 28800 = 86400
    assert got == {
        "learner parameters (float32)": ("resident", 4 * 1448),
        "optimizer (AdamW moments, float32)": ("resident", 8 * 1448),
        "Teacher (bfloat16)": ("resident", 2 * 1448),
        "engine weights (HF: the learner's, cast to bfloat16)": ("rollouts", 2 * 1448),
        # 2 (k, v) * 2 layers * 1 KV head * 4 dims * 2 B = 32 B a token; (50 + 14) tokens x 3 sequences
        "KV cache": ("rollouts", 64 * 3 * 32),
        "gradients (float32)": ("update", 4 * 1448),
        "activations (100-token chunk, checkpointing on)": ("update", 64000),
    }
    assert "checkpointing off: " in plan.lines[-1].note
    resident = 4 * 1448 + 8 * 1448 + 2 * 1448
    assert plan.total("rollouts") == resident + 2 * 1448 + 6144 == 29312
    assert plan.total("update") == resident + 4 * 1448 + 64000 == 90064
    assert plan.peak_phase == "update" and plan.fits and plan.refusal() is None
    off = memory_plan(_cfg(tiny_dir, gradient_checkpointing=False), gpus=1, gpu_memory_gib=24)
    assert off.lines[-1].bytes == 86400
    # 80,000 bytes usable: the update (90,064) does not fit
    tight = memory_plan(_cfg(tiny_dir), gpus=1, gpu_memory_gib=HEADROOM_GIB + 80_000 / GIB)
    assert not tight.fits and tight.refusal().startswith("does not fit: the update phase needs")


def test_a_tiny_fsdp_plan_by_hand(tiny_dir):
    plan = memory_plan(_cfg(tiny_dir, fsdp=True), gpus=2, gpu_memory_gib=24)
    got = {line.name: line.bytes for line in plan.lines}
    assert got["learner parameters (float32)"] == 4 * 1448 // 2
    assert got["optimizer (AdamW moments, float32)"] == 8 * 1448 // 2
    assert got["gradients (float32)"] == 4 * 1448 // 2
    assert got["gathered replica (FSDP, float32)"] == 4 * 1448
    # the model's own forward: 100 tokens x 32 logits x (2 + 8) B = 32000, + hidden 3200;
    # + 100*(2*4*8 + 288) = 35200
    assert got["activations (100-token chunk, checkpointing on)"] == 70400
    # gathered in bfloat16: the root's 1448 - 2*592 = 264 parameters and two layers
    assert got["gathered parameters (FSDP, bfloat16)"] == 2 * (264 + 2 * 592)


def test_the_parameter_count_is_the_models_own():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  intermediate_size=24, vocab_size=40, tie_word_embeddings=False, max_position_embeddings=64)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**config))
    assert Arch.from_config(model.config.to_dict()).params == sum(p.numel() for p in model.parameters())
    # the paper's model: 151936*2560 embeddings (tied) + 36 layers of 100,930,816 + 2560
    qwen = KNOWN_ARCHS["qwen/qwen3-4b-instruct-2507"]
    assert qwen.params == 151936 * 2560 + 36 * 100_930_816 + 2560 == 4_022_468_096
    assert qwen.kv_bytes_per_token(2) == 147_456  # 2 * 36 * 8 * 128 * 2


def test_the_paper_preset_fits_8x80_and_one_h200_and_is_refused_on_24_gib(capsys):
    assert main(["--preset", "paper", "--gpus", "8", "--gpu-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "KV cache" in out and "Teacher (bfloat16)" in out and "checkpointing on" in out
    assert main(["--preset", "paper", "--gpus", "1", "--gpu-memory", "141"]) == 0
    capsys.readouterr()
    assert main(["--preset", "paper", "--gpus", "1", "--gpu-memory", "24"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m algos plan: does not fit: the update phase needs")
    assert "optimizer (AdamW moments, float32) 30.0" in err[0]


def test_the_preflight_runs_the_plan_on_cuda(monkeypatch):
    cfg = preset_config("paper", stage="team", teacher="base")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    memory = {"gib": 24}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: types.SimpleNamespace(total_memory=memory["gib"] * GIB))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(PreflightError, match=r"team stage on cuda \(24 GiB\): does not fit: the update phase"):
        check_memory(cfg)
    memory["gib"] = 80
    check_memory(cfg)  # fits: nothing raised
    check_memory(preset_config("paper", stage="team", teacher="base", device="cpu"))  # off CUDA: no plan
