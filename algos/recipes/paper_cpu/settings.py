"""The paper_cpu preset's settings, defined once. Plain data: the build and the preset
registry read it from here.

What it keeps of the ``paper`` preset (``algos.commands.presets``): a Qwen3 decoder (grouped-query
attention, per-head q/k RMSNorm, tied embeddings, as Qwen3-4B-Instruct-2507), activation
checkpointing, the paper's team shape (3 waves of up to 3 Searchers with 4 turns each, 5
candidates, top-3 passages), its learning rate, group size and generation batch; and what
the paper runs on GPUs: FSDP2 (``fsdp=True``: run under torchrun) and Ray rollout workers.
What it shrinks or changes for a CPU: the model (a few million parameters over the micro
tokenizer's 4k vocabulary), turn and context lengths, questions per step, steps,
validation; float32 compute (``dtype``: bfloat16 autocast is a GPU setting here), the
``words`` retriever (nothing to encode), and chunks small enough that a minibatch takes
several (so FSDP2's lock-step padding runs)."""

from __future__ import annotations

from typing import Any

MODEL = "paper_cpu"
"""The model name the preset trains: the random Qwen3 base (``RECIPE.prepare_model``)."""

QWEN3: dict[str, Any] = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                             num_attention_heads=6, num_key_value_heads=2, head_dim=32,
                             tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6)
"""The ``Qwen3Config`` fields of the base (the vocabulary, special ids and positions come from
the tokenizer and :data:`ENV`): Qwen3-4B's ratios (3 query heads per KV head, head_dim apart
from hidden / heads, tied embeddings, its RoPE base) at 2.4M parameters."""

ENV: dict[str, int] = {"max_turn_tokens": 24, "max_context_tokens": 1024, "max_waves": 3,
                       "max_searchers": 3, "max_searcher_turns": 4, "num_candidates": 5, "top_k": 3}
"""SearchTeam arguments: the paper's team (TrainConfig's defaults) with short turns and
contexts."""

TRAIN: dict[str, Any] = dict(
    model=MODEL, steps=2, questions_per_step=2, group_size=5, learning_rate=1e-6, **ENV,
    device="cpu", dtype="float32", gradient_checkpointing=True, fsdp=True, rollout_workers=2,
    generation_batch_size=8, max_tokens_per_batch=2048, max_row_tokens=1024, temperature=1.0,
    train_datasets=("nq", "hotpotqa"), val_datasets=("nq", "hotpotqa"), val_per_dataset=1,
    val_temperature=0.0, eval_every=2, save_every=2, sample_every=1, retriever="words")
"""The preset's ``TrainConfig`` settings: two steps of each stage under ``torchrun
--nproc-per-node 2`` with two Ray workers."""
