"""A memory plan per GPU, made before anything loads (``python -m algos plan``; the preflight
runs it on CUDA): what a run's learner, Teacher and rollout engine hold, phase by phase, and
whether it fits.

    python -m algos plan --preset paper --gpus 8 --gpu-memory 80

What each line counts (P parameters; ``r`` bytes of the residual stream, 4 with float32
weights; ``b`` bytes of the compute dtype; T = ``max_tokens_per_batch``; S = the GPUs under
FSDP, else 1):

- resident all along: learner parameters ``4P/S`` (float32, ``algos.precision``), AdamW's two
  moments ``8P/S``, the Teacher ``bP`` (Stage II), the Prompted Critic's base ``bP``
  (``searcher_signal=critic``), under FSDP the gathered replica ``4P``;
- rollouts: engine weights (vLLM's own copy ``bP``; HF's autocast copy ``bP`` when the compute
  dtype is lower, else none) and the KV cache ``2 L kv d b`` bytes per token for
  ``max_context_tokens + max_turn_tokens`` tokens times ``generation_batch_size`` sequences;
- the update: gradients ``4P/S`` and one chunk's activations. Per token and layer a decoder
  layer keeps about ``2 r h + b (2h + 3q + 2kv + 4I)`` bytes (q = heads x head_dim, kv = KV
  heads x head_dim, I = the MLP width: the two norm inputs, their casts, q/k/v, the attention
  output and its reshaped copy, the MLP's gate, up, activation and product). With activation
  checkpointing it keeps ``r h`` per layer and recomputes one layer at a time. The output
  layer keeps the last hidden state ``r h`` per token and a chunk of float32 logits and their
  gradient (``agents.logprobs.LOGIT_CHUNK_ELEMENTS``); under FSDP it takes the model's own forward,
  whose logits ``(b + 8) V`` per token are counted whole (every token a target: a bound).

The peak is the resident memory plus the larger of the two phases (the engine sleeps, or
HF's KV cache is freed, before the update). It must fit in the GPU's memory less
:data:`HEADROOM_GIB`. These are estimates from the architecture, not measurements.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from algos.config import TrainConfig

GIB = 2**30
HEADROOM_GIB = 2.0
"""Left out of each GPU for the CUDA context, cuBLAS workspaces and NCCL buffers."""

LOGIT_CHUNK_ELEMENTS = 1 << 22
"""``agents.logprobs.LOGIT_CHUNK_ELEMENTS`` (rows x vocabulary of float32 logits per chunk of the
output layer), repeated so that the plan imports no model code."""

_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


@dataclass(frozen=True)
class Arch:
    """The numbers of a decoder-only transformer that memory depends on (a ``config.json``'s)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    max_positions: int
    qk_norm: bool = False
    """Per-head RMSNorms on queries and keys (Qwen3): 2 x head_dim weights per layer."""
    attention_bias: bool = False

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Arch:
        """From a Hugging Face ``config.json`` (Llama, Qwen2/3, Mistral, SmolLM2 ...)."""
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(hidden=hidden, layers=int(config["num_hidden_layers"]), heads=heads,
                   kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or hidden // heads),
                   intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                   tied=bool(config.get("tie_word_embeddings", False)),
                   max_positions=int(config.get("max_position_embeddings", 0)),
                   qk_norm=config.get("model_type") in ("qwen3",),
                   attention_bias=bool(config.get("attention_bias", False)))

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.attention_bias else 0)
        return attention + 3 * h * self.intermediate + 2 * h + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def params(self) -> int:
        """Parameters (a tied output layer counted once)."""
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * self.layer_params + self.hidden

    def kv_bytes_per_token(self, b: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * b

    def activation_bytes_per_token_layer(self, r: int, b: int) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * r * h + b * (2 * h + 3 * q + 2 * kv + 4 * self.intermediate)


KNOWN_ARCHS: dict[str, Arch] = {
    # Qwen/Qwen3-4B-Instruct-2507's config.json (the paper's model; not downloadable here)
    "qwen/qwen3-4b-instruct-2507": Arch(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
                                        intermediate=9728, vocab=151936, tied=True, max_positions=262144,
                                        qk_norm=True),
    # HuggingFaceTB/SmolLM2-135M-Instruct (the smollm2 preset; its local copy is a GGUF)
    "smollm2": Arch(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152,
                    tied=True, max_positions=8192),
}
"""Architectures of models a plan may need before they are on this machine, by lower-case id."""
KNOWN_ARCHS["huggingfacetb/smollm2-135m-instruct"] = KNOWN_ARCHS["smollm2"]


def arch_of(model: str) -> Arch:
    """The architecture of ``model``: its ``config.json`` when it is a local folder or run (a
    recipe's name: its built base, or an untrained one), else :data:`KNOWN_ARCHS`."""
    from algos.checkpoint import resolve_model_path
    from algos.presets import RECIPES, prepare_model

    try:
        path = Path(resolve_model_path(prepare_model(model, build=False)))
    except FileNotFoundError:  # a recipe's base not built yet: an untrained one has its shape
        path = Path("/nonexistent")
    if (path / "config.json").is_file():
        return Arch.from_config(json.loads((path / "config.json").read_text(encoding="utf-8")))
    if model in RECIPES:
        return Arch.from_config(RECIPES[model].fresh_model()[0].config.to_dict())
    if model.lower() in KNOWN_ARCHS:
        return KNOWN_ARCHS[model.lower()]
    raise ValueError(f"model {model!r}: no config.json here and not one of the known architectures "
                     f"{sorted(KNOWN_ARCHS)}; give a local model folder")


@dataclass
class Line:
    """One thing a GPU holds: ``phase`` is ``resident``, ``rollouts`` or ``update``."""

    phase: str
    name: str
    bytes: int
    note: str = ""


@dataclass
class Plan:
    """Per-GPU memory of one run (:func:`memory_plan`)."""

    title: str
    lines: list[Line]
    gpu_memory_gib: float
    notes: list[str] = field(default_factory=list)

    def total(self, phase: str) -> int:
        """Bytes held during ``phase`` (``rollouts`` or ``update``), resident memory included."""
        return sum(line.bytes for line in self.lines if line.phase in ("resident", phase))

    @property
    def usable(self) -> int:
        return int((self.gpu_memory_gib - HEADROOM_GIB) * GIB)

    @property
    def peak_phase(self) -> str:
        return max(("rollouts", "update"), key=self.total)

    @property
    def fits(self) -> bool:
        return self.total(self.peak_phase) <= self.usable

    def refusal(self) -> str | None:
        """One line naming what does not fit (None when it fits)."""
        if self.fits:
            return None
        phase = self.peak_phase
        big = sorted((line for line in self.lines if line.phase in ("resident", phase)), key=lambda x: -x.bytes)
        largest = ", ".join(f"{line.name} {line.bytes / GIB:.1f}" for line in big[:3])
        return (f"does not fit: the {phase} phase needs {self.total(phase) / GIB:.1f} GiB per GPU, "
                f"{self.usable / GIB:.1f} usable of {self.gpu_memory_gib:g} GiB; largest: {largest} GiB")

    def render(self) -> str:
        width = max(len(f"{line.phase}: {line.name}") for line in self.lines) + 2
        out = [self.title, f"{'per GPU':<{width}}{'GiB':>8}"]
        for line in self.lines:
            label = f"{line.phase}: {line.name}"
            out.append(f"{label:<{width}}{line.bytes / GIB:>8.2f}" + (f"   {line.note}" if line.note else ""))
        for phase in ("rollouts", "update"):
            out.append(f"{'total during ' + phase:<{width}}{self.total(phase) / GIB:>8.2f}")
        verdict = "fits" if self.fits else "DOES NOT FIT"
        out.append(f"peak {self.total(self.peak_phase) / GIB:.2f} GiB ({self.peak_phase}) of "
                   f"{self.usable / GIB:.2f} usable ({self.gpu_memory_gib:g} GiB less {HEADROOM_GIB:g} for the "
                   f"CUDA context and NCCL): {verdict}")
        out.extend(self.notes)
        return "\n".join(out)


def memory_plan(cfg: TrainConfig, gpus: int, gpu_memory_gib: float, arch: Arch | None = None,
                name: str = "") -> Plan:
    """The per-GPU memory of ``cfg`` on ``gpus`` GPUs of ``gpu_memory_gib`` GiB each."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: must be >= 1")
    if not gpu_memory_gib > 0:
        raise ValueError(f"gpu_memory_gib={gpu_memory_gib}: must be > 0")
    arch = arch if arch is not None else arch_of(cfg.model)
    if cfg.dtype not in _BYTES:
        raise ValueError(f"dtype={cfg.dtype!r}: one of {sorted(_BYTES)}")
    p = arch.params
    b = _BYTES[cfg.dtype]
    mixed = b != 4  # float32 weights, lower compute dtype (algos.precision)
    r = 4  # the residual stream follows the float32 weights
    shards = gpus if cfg.fsdp else 1
    per = f" / {shards} GPUs" if shards > 1 else ""
    t = cfg.max_tokens_per_batch
    lines = [Line("resident", "learner parameters (float32)", 4 * p // shards, f"4 B x {p:,}{per}"),
             Line("resident", "optimizer (AdamW moments, float32)", 8 * p // shards, f"8 B x {p:,}{per}")]
    if cfg.fsdp:
        lines.append(Line("resident", "gathered replica (FSDP, float32)", 4 * p, "generation, scoring, checkpoints"))
    if cfg.stage == "team" and cfg.teacher is not None:
        lines.append(Line("resident", f"Teacher ({cfg.dtype})", b * p))
    if cfg.searcher_signal == "critic" and cfg.stage == "team":
        lines.append(Line("resident", f"Prompted Critic base ({cfg.dtype})", b * p))
    if cfg.rollout_backend == "vllm":
        lines.append(Line("rollouts", f"engine weights (vLLM, {cfg.dtype})", b * p))
    else:
        lines.append(Line("rollouts", "engine weights (HF: the learner's" + (f", cast to {cfg.dtype})" if mixed
                                                                               else ")"), b * p if mixed else 0))
    max_model_len = cfg.max_context_tokens + cfg.max_turn_tokens
    seqs = cfg.generation_batch_size
    lines.append(Line("rollouts", "KV cache", seqs * max_model_len * arch.kv_bytes_per_token(b),
                      f"{max_model_len:,} tokens (max_model_len) x {seqs} sequences"))
    lines.append(Line("update", "gradients (float32)", 4 * p // shards))
    per_layer = arch.activation_bytes_per_token_layer(r, b)
    if cfg.fsdp:  # the model's own forward: all logits at once (a bound: every token a target)
        head = t * arch.vocab * (b + 8)
    else:
        head = 2 * 4 * min(t, max(1, LOGIT_CHUNK_ELEMENTS // arch.vocab)) * arch.vocab
    head += t * arch.hidden * r
    with_ckpt = t * (arch.layers * r * arch.hidden + per_layer) + head
    without = t * arch.layers * per_layer + head
    on = cfg.gradient_checkpointing
    lines.append(Line("update", f"activations ({t:,}-token chunk, checkpointing {'on' if on else 'off'})",
                      with_ckpt if on else without,
                      f"checkpointing {'off' if on else 'on'}: {(without if on else with_ckpt) / GIB:.2f} GiB"))
    if cfg.fsdp:  # FSDP2 gathers a layer (and prefetches the next) in the compute dtype; the root's stay
        root = p - arch.layers * arch.layer_params
        lines.append(Line("update", f"gathered parameters (FSDP, {cfg.dtype})", b * (root + 2 * arch.layer_params)))
    mode = f"FSDP over {gpus} GPUs" if cfg.fsdp else ("DDP: every GPU holds the whole learner" if gpus > 1
                                                      else "one GPU")
    size = f"{p / 1e9:.2f}B" if p >= 1e8 else f"{p / 1e6:.2f}M"
    title = (f"plan: {name or cfg.model} ({cfg.model}, {size} parameters), {cfg.stage} stage, "
             f"{gpus} GPU{'s' if gpus > 1 else ''} x {gpu_memory_gib:g} GiB, {mode}; compute {cfg.dtype}, "
             "weights float32")
    notes = []
    if arch.max_positions and max_model_len > arch.max_positions:
        notes.append(f"note: max_model_len {max_model_len} exceeds the model's {arch.max_positions} positions")
    return Plan(title=title, lines=lines, gpu_memory_gib=gpu_memory_gib, notes=notes)


def main(argv: list[str] | None = None) -> int:
    """``python -m algos plan``: print the plan; exit 1 with one line when it does not fit."""
    import argparse
    import sys

    from algos.config import parse_overrides
    from algos.presets import PRESETS, preset_config

    parser = argparse.ArgumentParser(prog="python -m algos plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the learner runs on (torchrun ranks)")
    parser.add_argument("--gpu-memory", type=float, required=True, metavar="GIB", help="memory of each GPU, GiB")
    parser.add_argument("--stage", choices=("teacher", "team"), default="team",
                        help="default team: Stage II, which also holds the Teacher")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="any TrainConfig field, as for train")
    args = parser.parse_args(argv)
    try:
        overrides = parse_overrides(args.set)
        if args.stage == "team":
            overrides.setdefault("teacher", "base")  # the Teacher is the base's size either way
        else:
            overrides["teacher"] = None
        cfg = preset_config(args.preset, stage=args.stage, **overrides)
        plan = memory_plan(cfg, args.gpus, args.gpu_memory, name=args.preset)
    except ValueError as err:
        print(f"python -m algos plan: error: {err}", file=sys.stderr)
        return 2
    print(plan.render())
    if not plan.fits:
        print(f"python -m algos plan: {plan.refusal()}", file=sys.stderr)
        return 1
    return 0
