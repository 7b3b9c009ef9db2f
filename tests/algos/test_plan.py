"""The memory plan (issues 28.6, 42.4, 44): every line of a tiny case computed by hand, with the
critic's base, DDP over several GPUs, FSDP, float32 compute and a peak exactly at the usable
memory; the paper preset's numbers as the GPU review computes them (82.4 GiB at the foreach
AdamW step, 76.3 / ~100 GiB with vLLM on an 80 GB card); bad inputs refused in one line."""

import json
import types

import pytest
import torch

from algos.commands.plan import (
    GIB,
    GRAD_BUCKET_BYTES,
    HEADROOM_GIB,
    KNOWN_ARCHS,
    LOGIT_CHUNK_ELEMENTS,
    Arch,
    arch_of,
    main,
    memory_plan,
)
from algos.commands.preflight import PreflightError, check_disk, check_memory
from algos.commands.presets import preset_config
from algos.config import TrainConfig

TINY = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 16, "vocab_size": 32,
        "tie_word_embeddings": True, "max_position_embeddings": 128}
P = 1448
"""TINY's parameters: embeddings 32*8 = 256 (tied: once); a layer: q 8*8 + k, v 2*(8*4) + o 8*8
= 192, MLP 3*8*16 = 384 (576 in matrices), two norms 16: 592; two layers 1184; final norm 8."""


@pytest.fixture
def tiny_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return tmp_path


def _cfg(model, **kw):
    return TrainConfig(**{"model": str(model), "stage": "team", "teacher": "base", "device": "cuda",
                          "dtype": "bfloat16", "max_tokens_per_batch": 100, "generation_batch_size": 3,
                          "max_context_tokens": 50, "max_turn_tokens": 14, "gradient_checkpointing": True, **kw})


def _lines(plan):
    return {line.name: (line.phase, line.bytes) for line in plan.lines}


def test_every_line_of_a_tiny_plan_by_hand(tiny_dir):
    assert arch_of(str(tiny_dir)).params == P
    assert arch_of(str(tiny_dir)).linear_layer_params == 576
    plan = memory_plan(_cfg(tiny_dir), gpus=1, gpu_memory_gib=24)
    # activations per token and layer (r = 4, b = 2): norms 4*4*8 = 128, five casts of the norm
    # outputs 5*2*8 = 80, attention's q and output 2*2*8 = 32, k and v 2*2*4 = 16, the MLP
    # 4*2*16 = 128, log-sum-exp and norm scales 4*2 + 8 = 16: 400. The recomputed layer's weight
    # casts: 2*576 = 1152. The head: 100 tokens' last hidden state and final norm 3*100*8*4 = 9600;
    # its forward's float32 logits and their scaled copy 2*4*100*32 = 25600. Checkpointing on:
    # 100*2*4*8 + 9600 + max(100*400 + 1152, 25600) = 57152; off: 100*2*400 + 2*1152 + 9600 + 25600
    # = 117504
    assert _lines(plan) == {
        "learner parameters (float32)": ("resident", 4 * P),
        "optimizer (AdamW moments, float32)": ("resident", 8 * P),
        "Teacher (bfloat16)": ("resident", 2 * P),
        "HF generation weights (the learner's, cast to bfloat16)": ("rollouts", 2 * P),
        # float32 keys + bfloat16 values: 2 layers * 1 KV head * 4 dims * (4 + 2) B = 48 B a token;
        # (50 + 14) tokens x 3 sequences
        "HF KV cache": ("rollouts", 64 * 3 * 48),
        # 3 prompts x 50 tokens x (2*4*8 + 2*8 + 3*2*16 = 176) + the 3 x 50 x 50 mask
        "HF prefill (one layer, and the attention mask)": ("rollouts", 3 * 50 * 176 + 3 * 50 * 50),
        "gradients (float32)": ("backward+optimizer step", 4 * P),
        "activations (100-token chunk, checkpointing on)": ("backward", 57152),
        # the head's float32 V x H gradient waits for the tied embedding's: 4 * 32 * 8
        "output layer's gradient in flight (float32, tied)": ("backward", 1024),
        "AdamW step's temporary (fused: none)": ("optimizer step", 0),  # CUDA: fused
        "checkpoints (2 kept + 1 being written)": ("disk", 3 * 12 * P),
    }
    resident = 4 * P + 8 * P + 2 * P
    assert plan.total("rollouts") == resident + 2 * P + 9216 + 33900 == 66284
    assert plan.total("backward") == resident + 4 * P + 57152 + 1024 == 84240
    assert plan.total("optimizer step") == resident + 4 * P == 26064
    assert plan.phases == ("rollouts", "backward", "optimizer step")  # HF: validation is the rollouts again
    assert plan.peak_phase == "backward" and plan.fits and plan.refusal() is None
    off = memory_plan(_cfg(tiny_dir, gradient_checkpointing=False), gpus=1, gpu_memory_gib=24)
    assert _lines(off)["activations (100-token chunk, checkpointing off)"][1] == 117504
    # PyTorch's default on CUDA without fused: sqrt(exp_avg_sq) of every parameter at once
    foreach = memory_plan(_cfg(tiny_dir), gpus=1, gpu_memory_gib=24, fused=False)
    assert _lines(foreach)["AdamW step's temporary (foreach)"] == ("optimizer step", 4 * P)
    assert foreach.total("optimizer step") == 26064 + 4 * P
    cpu = memory_plan(_cfg(tiny_dir, device="cpu"), gpus=1, gpu_memory_gib=24)
    assert "AdamW step's temporary (foreach)" in _lines(cpu)  # the trainer's choice: fused on CUDA only


def test_a_peak_exactly_at_the_usable_memory_fits_and_one_byte_more_does_not(tiny_dir):
    peak = 84240  # the backward phase above
    at = memory_plan(_cfg(tiny_dir), gpus=1, gpu_memory_gib=HEADROOM_GIB + peak / GIB)
    assert at.usable == peak == at.peak and at.fits and at.refusal() is None
    over = memory_plan(_cfg(tiny_dir), gpus=1, gpu_memory_gib=HEADROOM_GIB + (peak - 1) / GIB)
    assert over.usable == peak - 1 and not over.fits
    assert over.refusal().startswith("does not fit: the backward phase needs 0.0 GiB per GPU")


def test_the_critics_base_is_read_from_the_role_rules(tiny_dir, monkeypatch):
    plan = memory_plan(_cfg(tiny_dir, searcher_signal="critic"), gpus=1, gpu_memory_gib=24)
    assert _lines(plan)["Prompted Critic base (bfloat16)"] == ("resident", 2 * P)
    assert plan.total("backward") == 84240 + 2 * P
    assert "Prompted Critic base (bfloat16)" not in _lines(memory_plan(_cfg(tiny_dir), gpus=1, gpu_memory_gib=24))
    # a signal of another name whose rule reads the Critic counts it too (algos.roles.needs_critic)
    import algos.roles

    monkeypatch.setattr(algos.roles, "needs_critic", lambda rules: True)
    assert "Prompted Critic base (bfloat16)" in _lines(memory_plan(_cfg(tiny_dir), gpus=1, gpu_memory_gib=24))


def test_ddp_over_four_gpus_holds_the_whole_learner_on_each(tiny_dir):
    one = memory_plan(_cfg(tiny_dir), gpus=1, gpu_memory_gib=24)
    ddp = memory_plan(_cfg(tiny_dir), gpus=4, gpu_memory_gib=24)
    got = _lines(ddp)
    for name in ("learner parameters (float32)", "optimizer (AdamW moments, float32)", "gradients (float32)",
                 "activations (100-token chunk, checkpointing on)"):
        assert got[name] == _lines(one)[name], name  # nothing divided by the GPUs
    # the gradient all-reduce packs buckets of at most GRAD_BUCKET_BYTES (a model this small: one)
    assert got["gradient all-reduce bucket (DDP)"] == ("optimizer step", min(GRAD_BUCKET_BYTES, 4 * P)) == \
        ("optimizer step", 5792)
    assert ddp.total("optimizer step") == 26064 + 5792 and ddp.total("backward") == 84240
    assert "DDP: every GPU holds the whole learner" in ddp.title


def test_a_tiny_fsdp_plan_by_hand(tiny_dir):
    plan = memory_plan(_cfg(tiny_dir, fsdp=True), gpus=2, gpu_memory_gib=24, fused=False)
    got = {line.name: line.bytes for line in plan.lines}
    assert got["learner parameters (float32)"] == 4 * P // 2
    assert got["optimizer (AdamW moments, float32)"] == 8 * P // 2
    assert got["gradients (float32)"] == 4 * P // 2
    assert got["gathered replica (FSDP, float32)"] == 4 * P
    assert got["AdamW step's temporary (foreach)"] == 4 * P // 2  # foreach over this rank's shards
    # the model's own forward: 100 tokens x 32 logits x (2 + 8) B = 32000, less than the recomputed
    # layer's 100*400 + 1152; + 100*2*4*8 + 9600 = 57152
    assert got["activations (100-token chunk, checkpointing on)"] == 57152
    # gathered in bfloat16: the root's 1448 - 2*592 = 264 parameters and two layers
    assert got["gathered parameters (FSDP, bfloat16)"] == 2 * (264 + 2 * 592)
    assert "gradient all-reduce bucket (DDP)" not in got


def test_float32_compute_by_hand(tiny_dir):
    plan = memory_plan(_cfg(tiny_dir, dtype="float32"), gpus=1, gpu_memory_gib=24)
    got = _lines(plan)
    # no autocast: no copy of the weights to generate with, no weight casts, float32 everywhere.
    # Per token and layer (r = b = 4): norms 4*4*8 = 128, the norm outputs 2*4*8 = 64, q and
    # output 2*4*8 = 64, k and v 2*4*4 = 32, the MLP 4*4*16 = 256, 16: 560
    assert got["HF generation weights (the learner's)"] == ("rollouts", 0)
    assert got["Teacher (float32)"] == ("resident", 4 * P)
    assert got["HF KV cache"] == ("rollouts", 64 * 3 * 2 * 2 * 4 * 4)  # keys and values float32
    assert got["HF prefill (one layer, and the attention mask)"][1] == 3 * 50 * (2 * 4 * 8 + 4 * 8 + 3 * 4 * 16) + 7500
    assert got["activations (100-token chunk, checkpointing on)"][1] == 100 * 2 * 4 * 8 + 9600 + 100 * 560 == 72000
    off = memory_plan(_cfg(tiny_dir, dtype="float32", gradient_checkpointing=False), gpus=1, gpu_memory_gib=24)
    assert _lines(off)["activations (100-token chunk, checkpointing off)"][1] == 100 * 2 * 560 + 35200 == 147200


def test_vllm_reserves_its_share_of_the_card_and_validation_runs_beside_it(tiny_dir):
    plan = memory_plan(_cfg(tiny_dir, rollout_backend="vllm", vllm_gpu_memory_utilization=0.25), gpus=1,
                       gpu_memory_gib=8)
    got = _lines(plan)
    assert got["vLLM engine's reservation"] == ("rollouts+validation", 2 * GIB)  # 0.25 x 8 GiB, whatever it holds
    assert got["HF KV cache"][0] == got["HF generation weights (the learner's, cast to bfloat16)"][0] == "validation"
    resident = 14 * P
    assert plan.total("rollouts") == resident + 2 * GIB
    assert plan.total("validation") == resident + 2 * GIB + 2 * P + 9216 + 33900
    assert plan.phases == ("rollouts", "validation", "backward", "optimizer step") and plan.peak_phase == "validation"


def test_the_disk_holds_the_kept_checkpoints_and_the_teachers_run(tiny_dir):
    ckpt = 12 * P  # the float32 model and AdamW's two moments
    plan = memory_plan(_cfg(tiny_dir, keep_checkpoints=3), gpus=1, gpu_memory_gib=24, teacher_run_on_disk=True,
                       disk_gib=5 * ckpt / GIB)
    assert _lines(plan)["checkpoints (3 kept + 1 being written)"] == ("disk", 4 * ckpt)
    assert _lines(plan)["the Teacher's Stage-I run (its kept checkpoints)"] == ("disk", 3 * ckpt)
    assert plan.disk == 7 * ckpt and plan.fits_gpu and not plan.fits
    assert plan.refusal().startswith("does not fit on disk: checkpoints take up to 0.0 GiB")
    assert memory_plan(_cfg(tiny_dir, keep_checkpoints=3), gpus=1, gpu_memory_gib=24, teacher_run_on_disk=True,
                       disk_gib=7 * ckpt / GIB).fits


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
    assert qwen.hf_kv_bytes_per_token(2) == 221_184  # 36 * 8 * 128 * (4 + 2): 1.5 x
    import agents.logprobs
    import algos.engine.distributed

    assert LOGIT_CHUNK_ELEMENTS == agents.logprobs.LOGIT_CHUNK_ELEMENTS
    assert GRAD_BUCKET_BYTES == algos.engine.distributed.GRAD_BUCKET_BYTES


def _gib(plan, phase):
    return round(plan.total(phase) / GIB, 1)


def test_the_paper_numbers_follow_the_review():
    """shared/reviews/gpu_turn4.md N1, N2: Stage II without FSDP on 8 x 80 GB with PyTorch's
    foreach AdamW needs params 14.98 + AdamW 29.97 + Teacher 7.49 + gradients 14.98 + temporary
    14.98 = 82.4 GiB at the step; vLLM at 0.3 of an 80 GB card (79.6 GiB) needs 76.3 GiB in the
    rollouts and ~100 in validation; on an H200 (140.4 GiB) validation is the peak, ~121."""
    cfg = preset_config("paper", stage="team", teacher="base")
    assert _gib(memory_plan(cfg, 1, 80, fused=False), "optimizer step") == 82.4
    assert _gib(memory_plan(cfg, 8, 80, fused=False), "optimizer step") == 82.7  # + DDP's 0.25 GiB bucket
    assert _gib(memory_plan(cfg, 1, 80), "optimizer step") == 67.4  # fused: no temporary
    vllm = preset_config("paper", stage="team", teacher="base", rollout_backend="vllm")
    on_80 = memory_plan(vllm, 1, 79.6)
    assert _gib(on_80, "rollouts") == 76.3 and 100 <= _gib(on_80, "validation") <= 105 and not on_80.fits
    h200 = memory_plan(vllm, 1, 140.4)
    assert h200.peak_phase == "validation" and 118 <= _gib(h200, "validation") <= 124 and h200.fits


def test_the_paper_preset_without_fsdp_does_not_fit_8x80_but_fits_with_fsdp_and_on_an_h200(capsys):
    assert main(["--preset", "paper", "--gpus", "8", "--gpu-memory", "80"]) == 1
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out and "fits" not in captured.out.split("DOES NOT FIT")[0].splitlines()[-1]
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m algos plan: does not fit: the rollouts phase needs 79.9")
    assert main(["--preset", "paper", "--gpus", "8", "--gpu-memory", "80", "--set", "fsdp=true"]) == 0
    out = capsys.readouterr().out
    assert ": fits" in out and "KV cache" in out and "Teacher (bfloat16)" in out and "checkpointing on" in out
    assert main(["--preset", "paper", "--gpus", "1", "--gpu-memory", "140"]) == 0
    capsys.readouterr()
    assert main(["--preset", "paper", "--gpus", "1", "--gpu-memory", "24"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "optimizer (AdamW moments, float32) 30.0" in err[0]
    # a 64 GiB disk cannot hold Stage II's checkpoints beside Stage I's (N6)
    assert main(["--preset", "paper", "--gpus", "1", "--gpu-memory", "140", "--disk", "64"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m algos plan: does not fit on disk: checkpoints take up to 224.8")


BAD_CONFIGS = [
    ({**TINY, "num_hidden_layers": -3}, "num_hidden_layers=-3: must be an integer in [1, 100,000]"),
    ({**TINY, "hidden_size": "8"}, "hidden_size='8': must be an integer"),
    ({**TINY, "vocab_size": 10**30}, f"vocab_size={10**30}: must be an integer"),
    ({**TINY, "intermediate_size": 16.5}, "intermediate_size=16.5: must be an integer"),
    ({**TINY, "num_attention_heads": True}, "num_attention_heads=True: must be an integer"),
    ({**TINY, "num_key_value_heads": 0}, "num_key_value_heads=0: must be an integer"),
    ({**TINY, "num_key_value_heads": 3, "num_attention_heads": 4}, "num_attention_heads=4 is not a multiple"),
    ({**TINY, "tie_word_embeddings": "yes"}, "tie_word_embeddings='yes': must be true or false"),
    ({k: v for k, v in TINY.items() if k != "vocab_size"}, "missing vocab_size"),
    ([1, 2, 3], "not a JSON object but list"),
]


@pytest.mark.parametrize("config, named", BAD_CONFIGS, ids=[n.split(":")[0][:24] for _, n in BAD_CONFIGS])
def test_a_crafted_config_json_is_refused_in_one_line(config, named, tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["--preset", "paper", "--gpu-memory", "80", "--set", f"model={tmp_path}"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith(f"python -m algos plan: error: {tmp_path / 'config.json'}: ") and named in lines[0]


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"{\"hidden_size\": ", b"[" * 100_000,
                                     b" " * (5 << 20)], ids=["not-utf8", "cut", "deep", "huge"])
def test_an_unreadable_config_json_is_refused_in_one_line(content, tmp_path, capsys):
    (tmp_path / "config.json").write_bytes(content)
    assert main(["--preset", "paper", "--gpu-memory", "80", "--set", f"model={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"python -m algos plan: error: {tmp_path / 'config.json'}: ")


@pytest.mark.parametrize("argv, named", [
    (["--gpu-memory", "inf"], "--gpu-memory=inf"),
    (["--gpu-memory", "nan"], "--gpu-memory=nan"),
    (["--gpu-memory", "-80"], "--gpu-memory=-80.0"),
    (["--gpu-memory", "0"], "--gpu-memory=0.0"),
    (["--gpu-memory", "1e400"], "--gpu-memory=inf"),
    (["--gpu-memory", "80", "--disk", "nan"], "--disk=nan"),
    (["--gpu-memory", "80", "--disk", "-1"], "--disk=-1.0"),
    (["--gpu-memory", "80", "--gpus", "0"], "gpus=0"),
    (["--gpu-memory", "80", "--gpus", "-8"], "gpus=-8"),
])
def test_bad_plan_numbers_are_refused_in_one_line(argv, named, capsys):
    assert main(["--preset", "paper", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and "Traceback" not in captured.err
    assert lines[0].startswith("python -m algos plan: error: ") and named in lines[0], lines[0]


def test_a_negative_line_never_fits(tiny_dir):
    from algos.commands.plan import Line, Plan

    with pytest.raises(ValueError, match="negative"):
        Plan(title="t", lines=[Line("resident", "x", -1)], gpu_memory_gib=1)
    with pytest.raises(ValueError, match="layers"):
        Arch(hidden=8, layers=-2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32, tied=True,
             max_positions=0)


def test_the_preflight_runs_the_plan_on_cuda(monkeypatch, tmp_path):
    cfg = preset_config("paper", stage="team", teacher="base", fsdp=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    memory = {"gib": 24}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: types.SimpleNamespace(total_memory=memory["gib"] * GIB))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(PreflightError, match=r"team stage on cuda \(24 GiB\): does not fit: the rollouts phase needs 79.9"):
        check_memory(cfg)
    memory["gib"] = 140
    check_memory(cfg)  # fits: nothing raised
    monkeypatch.setenv("WORLD_SIZE", "8")
    memory["gib"] = 80
    with pytest.raises(PreflightError, match=r"\(80 GiB\): does not fit: the rollouts phase needs 79.9"):
        check_memory(cfg)
    check_memory(preset_config("paper", stage="team", teacher="base", device="cpu"))  # off CUDA: no plan
    # a crafted config.json is refused in one line, not skipped and not a traceback
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "num_hidden_layers": -3}))
    with pytest.raises(PreflightError, match=r"num_hidden_layers=-3: must be an integer") as err:
        check_memory(preset_config("paper", stage="team", teacher="base", model=str(tmp_path)))
    assert len(str(err.value).splitlines()) == 1


def test_the_preflight_refuses_checkpoints_that_do_not_fit_the_disk(tiny_dir, tmp_path):
    ckpt = 12 * P
    stages = {"teacher": _cfg(tiny_dir, stage="teacher", teacher=None, out_dir=str(tmp_path / "a")),
              "team": _cfg(tiny_dir, out_dir=str(tmp_path / "b"))}
    # Stage I keeps 2, Stage II keeps 2 and writes a third before pruning: 5 checkpoints
    check_disk(stages, resume=False, free=lambda path: 5 * ckpt)
    with pytest.raises(PreflightError, match=r"the checkpoints need up to 0.0 GiB of disk") as err:
        check_disk(stages, resume=False, free=lambda path: 5 * ckpt - 1)
    assert str(tmp_path / "b") in str(err.value)
    check_disk(stages, resume=True, free=lambda path: ckpt)  # resumed: room for one more
    with pytest.raises(PreflightError):
        check_disk(stages, resume=True, free=lambda path: ckpt - 1)
