"""A memory plan per GPU, made before anything loads (``python -m algos plan``; the preflight
runs it on CUDA): what a run's learner, Teacher and rollout engine hold, phase by phase, whether
it fits, and what its checkpoints take on disk.

    python -m algos plan --preset paper --gpus 8 --gpu-memory 80 [--disk 64]

What each line counts (P parameters; ``r`` bytes of the residual stream, 4 with float32
weights; ``b`` bytes of the compute dtype; T = ``max_tokens_per_batch``; S = the GPUs under
FSDP, else 1; h, q, kv, I = hidden, heads x head_dim, KV heads x head_dim, MLP width; V the
vocabulary; L layers):

- resident all along: learner parameters ``4P/S`` (float32, ``algos.engine.precision``), AdamW's two
  moments ``8P/S``, the Teacher ``bP`` (Stage II), the Prompted Critic's base ``bP`` (a role
  rule that ``needs_critic``, ``algos.roles``), under FSDP the gathered replica ``4P``;
- rollouts: with vLLM, the engine's reservation, ``vllm_gpu_memory_utilization`` x the card
  (vLLM takes that share of the whole card, whatever its weights and KV cache need); with HF,
  the autocast copy of the weights ``bP`` (a lower compute dtype only), the KV cache and the
  prefill. HF's keys are float32 under float32 weights (the rotary cos/sin follow the float32
  embedding output and promote ``k * cos``; Qwen3's ``k_norm`` returns ``weight * x``), values
  in the compute dtype: ``L kv (4 + b)`` bytes per token, for ``max_context_tokens +
  max_turn_tokens`` tokens x ``generation_batch_size`` sequences. The prefill of that batch
  holds one layer's transients at a time, ``2rh + bh + 3bI`` a token, and a (B, 1, T, T) mask;
- validation (and the pass-rate filter): HF generation by the learner's replica. With HF
  rollouts it is the rollouts phase again; with vLLM it runs while the engine is awake, so
  the engine's share and HF's copy, KV cache and prefill are held together;
- backward: gradients ``4P/S`` and one chunk's activations. What autograd keeps per token and
  decoder layer, counted from the saved tensors (``tests/algos/test_plan_measured.py`` checks it
  against PyTorch's own): the two norms' float32 input and normalised value ``4rh``, the
  projections' inputs (``5bh`` with autocast, whose cache is off in the update so that q, k, v,
  gate and up each cast the norm output anew; ``2rh`` in float32), attention's q and output
  ``2bq``, its k and v ``2b kv``, the MLP's ``4bI``, and with per-head q/k norms (Qwen3) their
  float32 input and cast ``(r + b)(q + kv)``. Autocast also keeps each layer's weights cast,
  ``b`` x its linear parameters. With activation checkpointing a chunk keeps ``rh`` per layer
  and token and recomputes one layer (and its weight casts) at a time, else every layer's. The
  output layer keeps the last hidden state and the final norm's ``3rh`` per token; its forward
  holds a chunk of float32 logits and their scaled copy (``agents.logprobs.LOGIT_CHUNK_ELEMENTS``),
  which with checkpointing never meets a recomputed layer (the larger of the two counts); under
  FSDP it takes the model's own forward, whose logits ``(b + 8) V`` per token are counted whole
  (every token a target: a bound). Tied to the embedding, the output layer's float32 gradient
  ``4VH`` waits in autograd's buffer for the embedding's;
- optimizer step: gradients ``4P/S`` and AdamW's temporary: ``4P/S`` with PyTorch's
  ``foreach`` (``sqrt(exp_avg_sq)`` for every parameter at once), none fused (the trainer's
  choice on CUDA, ``algos.engine.precision.fused_adamw``); with DDP the gradient all-reduce's bucket.

The peak is the resident memory plus the largest phase (the engine sleeps, HF's KV cache is
freed, before the update). It must fit in the GPU's memory less :data:`HEADROOM_GIB`.
Checkpoints on disk: the model in float32 ``4P`` and AdamW's moments ``8P`` each,
``keep_checkpoints`` of them plus the one being written, and in Stage II the Stage-I run's
kept ones (its Teacher). These are estimates from the architecture, checked against measured
peaks at small scale on CPU (``tests/algos/test_plan_measured.py``) and, on a GPU, by
``benchmarks/gpu_probe.py``.
"""

from __future__ import annotations

import json
import math
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

GRAD_BUCKET_BYTES = 1 << 28
"""``algos.engine.distributed.GRAD_BUCKET_BYTES``: the gradient all-reduce's one bucket copy (DDP)."""

PHASES = ("rollouts", "validation", "backward", "optimizer step")
"""The phases a GPU goes through in a step; a :class:`Line` is ``resident`` or held in some."""

MAX_GPU_MEMORY_GIB = 1 << 20
"""The largest ``--gpu-memory`` / ``--disk`` taken (a GiB figure past this is a typo)."""

_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}

_LIMITS = {  # Arch field: (config.json key, smallest, largest) -- far beyond any real model
    "hidden": ("hidden_size", 1, 1 << 20),
    "layers": ("num_hidden_layers", 1, 100_000),
    "heads": ("num_attention_heads", 1, 1 << 16),
    "kv_heads": ("num_key_value_heads", 1, 1 << 16),
    "head_dim": ("head_dim", 1, 1 << 16),
    "intermediate": ("intermediate_size", 1, 1 << 22),
    "vocab": ("vocab_size", 1, 1 << 26),
    "max_positions": ("max_position_embeddings", 0, 1 << 40),
}
CONFIG_MAX_BYTES = 1 << 22
"""A model's ``config.json`` larger than this (4 MiB) is refused unread."""


def _integer(value: Any, key: str, low: int, high: int) -> int:
    """``value`` as an int in [low, high] (not a bool, float, string or null), or ValueError
    naming ``key`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(f"{key}={shown}: must be an integer in [{low}, {high:,}]")
    return value


@dataclass(frozen=True)
class Arch:
    """The numbers of a decoder-only transformer that memory depends on, each checked on
    construction (ValueError naming the key)."""

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

    def __post_init__(self) -> None:
        for name, (key, low, high) in _LIMITS.items():
            _integer(getattr(self, name), key, low, high)
        if self.heads % self.kv_heads:
            raise ValueError(f"num_attention_heads={self.heads} is not a multiple of "
                             f"num_key_value_heads={self.kv_heads}")
        for name in ("tied", "qk_norm", "attention_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be true or false")

    @classmethod
    def from_config(cls, config: Any, source: str = "config.json") -> Arch:
        """From a Hugging Face ``config.json``'s dict (ValueError naming ``source``)."""
        try:
            if not isinstance(config, dict):
                raise ValueError(f"not a JSON object but {type(config).__name__}")
            missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                   "vocab_size") if k not in config]
            if missing:
                raise ValueError(f"missing {', '.join(missing)}")
            hidden = _integer(config["hidden_size"], "hidden_size", *_LIMITS["hidden"][1:])
            heads = _integer(config["num_attention_heads"], "num_attention_heads", *_LIMITS["heads"][1:])
            kv_heads = config.get("num_key_value_heads")
            head_dim = config.get("head_dim")
            flags = {}
            for key, default in (("tie_word_embeddings", False), ("attention_bias", False)):
                flags[key] = config.get(key, default)
                if not isinstance(flags[key], bool):
                    raise ValueError(f"{key}={flags[key]!r}: must be true or false")
            return cls(hidden=hidden, layers=config["num_hidden_layers"], heads=heads,
                       kv_heads=heads if kv_heads is None else kv_heads,
                       head_dim=(hidden // heads if hidden >= heads else 0) if head_dim is None else head_dim,
                       intermediate=config["intermediate_size"], vocab=config["vocab_size"],
                       tied=flags["tie_word_embeddings"],
                       max_positions=config.get("max_position_embeddings") or 0,
                       qk_norm=config.get("model_type") in ("qwen3",),
                       attention_bias=flags["attention_bias"])
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None

    @classmethod
    def from_file(cls, path: Path) -> Arch:
        """From a ``config.json`` file; a bad one is a ValueError naming the file."""
        try:
            size = path.stat().st_size
            if size > CONFIG_MAX_BYTES:
                raise ValueError(f"{size:,} bytes, more than a model config's {CONFIG_MAX_BYTES:,}")
            config = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, ValueError, RecursionError) as err:
            raise ValueError(f"{path}: unreadable ({' '.join(str(err).split())[:200]})") from None
        return cls.from_config(config, source=str(path))

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def linear_layer_params(self) -> int:
        """A decoder layer's matrix (and bias) parameters: what autocast casts."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        return h * q + 2 * h * kv + q * h + (q + 2 * kv if self.attention_bias else 0) + 3 * h * self.intermediate

    @property
    def layer_params(self) -> int:
        return self.linear_layer_params + 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def params(self) -> int:
        """Parameters (a tied output layer counted once)."""
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * self.layer_params + self.hidden

    def kv_bytes_per_token(self, b: int) -> int:
        """A KV cache of keys and values both in ``b`` bytes (vLLM's; HF's in float32)."""
        return 2 * self.layers * self.kv_dim * b

    def hf_kv_bytes_per_token(self, b: int) -> int:
        """HF's KV cache under float32 weights computing in ``b`` bytes: float32 keys (the
        rotary cos/sin and q/k-norm weights are float32 and promote them), values in ``b``."""
        return self.layers * self.kv_dim * (4 + b)

    def activation_bytes_per_token_layer(self, r: int, b: int) -> int:
        """What autograd keeps per token of one decoder layer (see the module's docstring):
        ``b < r`` is autocast over float32 weights, ``b == r`` float32 throughout."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        casts = 5 * b * h if b < r else 2 * r * h
        out = 4 * r * h + casts + 2 * b * q + 2 * b * kv + 4 * b * self.intermediate + 4 * self.heads + 8
        if self.qk_norm:
            out += (r + b) * (q + kv) + 4 * (self.heads + self.kv_heads)
        return out

    def prefill_bytes_per_token(self, r: int, b: int) -> int:
        """One layer's transients per token of a no-grad prefill: the residual and the norm's
        output, its cast, the MLP's gate, up and product."""
        return 2 * r * self.hidden + b * self.hidden + 3 * b * self.intermediate


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


class UnknownArch(ValueError):
    """No architecture is known for a model here (a hub id not in :data:`KNOWN_ARCHS`, a recipe's
    base not built when building is not allowed): the preflight skips its plan."""


def arch_of(model: str, *, build: bool = True) -> Arch:
    """The architecture of ``model``: its ``config.json`` (a recipe's built base, else an
    untrained one when ``build``), else :data:`KNOWN_ARCHS`'; ValueError when none is sane."""
    from algos.commands.presets import RECIPES, prepare_model
    from algos.engine.checkpoint import resolve_model_path

    try:
        path = Path(resolve_model_path(prepare_model(model, build=False)))
    except FileNotFoundError:  # a recipe's base not built yet: an untrained one has its shape
        path = Path("/nonexistent")
    if (path / "config.json").is_file():
        return Arch.from_file(path / "config.json")
    if model in RECIPES and build:
        return Arch.from_config(RECIPES[model].fresh_model()[0].config.to_dict(), source=f"recipe {model}")
    if model.lower() in KNOWN_ARCHS:
        return KNOWN_ARCHS[model.lower()]
    raise UnknownArch(f"model {model!r}: no config.json here and not one of the known architectures "
                     f"{sorted(KNOWN_ARCHS)}; give a local model folder")


@dataclass
class Line:
    """One thing a GPU (or the disk) holds: ``phase`` is ``resident``, ``disk``, or phases of
    :data:`PHASES` joined by ``+``."""

    phase: str
    name: str
    bytes: int
    note: str = ""

    def during(self, phase: str) -> bool:
        return self.phase == "resident" or phase in self.phase.split("+")


@dataclass
class Plan:
    """Per-GPU memory of one run (:func:`memory_plan`) and its checkpoints' disk."""

    title: str
    lines: list[Line]
    gpu_memory_gib: float
    notes: list[str] = field(default_factory=list)
    disk_gib: float | None = None
    """The disk the run writes to, GiB (None: not checked)."""

    def __post_init__(self) -> None:
        bad = [line for line in self.lines if line.bytes < 0]
        if bad:  # a negative term would make a run "fit": never
            raise ValueError(f"the plan's line {bad[0].name!r} is negative ({bad[0].bytes}): a bad input")

    def total(self, phase: str) -> int:
        """Bytes held during ``phase`` (one of :data:`PHASES`), resident memory included."""
        return sum(line.bytes for line in self.lines if line.phase != "disk" and line.during(phase))

    @property
    def disk(self) -> int:
        """Bytes the run's checkpoints take at most on disk."""
        return sum(line.bytes for line in self.lines if line.phase == "disk")

    @property
    def usable(self) -> int:
        return int((self.gpu_memory_gib - HEADROOM_GIB) * GIB)

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases this run has (validation only where it differs from the rollouts)."""
        return tuple(p for p in PHASES if any(line.phase not in ("resident", "disk") and line.during(p)
                                              for line in self.lines))

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    @property
    def peak(self) -> int:
        return self.total(self.peak_phase)

    @property
    def fits_gpu(self) -> bool:
        return self.peak <= self.usable

    @property
    def fits_disk(self) -> bool:
        return self.disk_gib is None or self.disk <= self.disk_gib * GIB

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_disk

    def refusal(self) -> str | None:
        """One line naming what does not fit (None when it fits)."""
        if self.fits:
            return None
        if not self.fits_gpu:
            phase = self.peak_phase
            big = sorted((line for line in self.lines if line.phase != "disk" and line.during(phase)),
                         key=lambda x: -x.bytes)
            largest = ", ".join(f"{line.name} {line.bytes / GIB:.1f}" for line in big[:3])
            return (f"does not fit: the {phase} phase needs {self.total(phase) / GIB:.1f} GiB per GPU, "
                    f"{self.usable / GIB:.1f} usable of {self.gpu_memory_gib:g} GiB; largest: {largest} GiB")
        return (f"does not fit on disk: checkpoints take up to {self.disk / GIB:.1f} GiB, the disk has "
                f"{self.disk_gib:.1f} GiB free (lower keep_checkpoints, or write --out elsewhere)")

    def render(self) -> str:
        width = max(len(f"{line.phase}: {line.name}") for line in self.lines) + 2
        out = [self.title, f"{'per GPU':<{width}}{'GiB':>8}"]
        for line in self.lines:
            label = f"{line.phase}: {line.name}"
            out.append(f"{label:<{width}}{line.bytes / GIB:>8.2f}" + (f"   {line.note}" if line.note else ""))
        for phase in self.phases:
            out.append(f"{'total during ' + phase:<{width}}{self.total(phase) / GIB:>8.2f}")
        verdict = "fits" if self.fits_gpu else "DOES NOT FIT"
        out.append(f"peak {self.peak / GIB:.2f} GiB ({self.peak_phase}) of "
                   f"{self.usable / GIB:.2f} usable ({self.gpu_memory_gib:g} GiB less {HEADROOM_GIB:g} for the "
                   f"CUDA context and NCCL): {verdict}")
        disk = f"disk: checkpoints up to {self.disk / GIB:.2f} GiB"
        if self.disk_gib is None:
            out.append(disk + " (--disk GIB checks them against the disk)")
        else:
            out.append(disk + f" of {self.disk_gib:g} GiB: " + ("fits" if self.fits_disk else "DOES NOT FIT"))
        out.extend(self.notes)
        return "\n".join(out)


def check_size(value: Any, name: str) -> float:
    """A GiB figure in (0, :data:`MAX_GPU_MEMORY_GIB`], else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_GPU_MEMORY_GIB:
        raise ValueError(f"{name}={value!r}: must be a finite number of GiB in (0, {MAX_GPU_MEMORY_GIB:,}]")
    return float(value)


def memory_plan(cfg: TrainConfig, gpus: int, gpu_memory_gib: float, arch: Arch | None = None,
                name: str = "", *, disk_gib: float | None = None, teacher_run_on_disk: bool | None = None,
                fused: bool | None = None) -> Plan:
    """The per-GPU memory of ``cfg`` on ``gpus`` GPUs of ``gpu_memory_gib`` GiB each, and its
    checkpoints against ``disk_gib`` GiB of free disk (None: not checked).
    ``teacher_run_on_disk`` (default: ``cfg.teacher`` not None nor ``base``): the Stage-I run's
    checkpoints share the disk; ``fused`` (default: the trainer's choice): AdamW fused."""
    from algos.engine.precision import fused_adamw
    from algos.roles import needs_critic, rules_for

    _integer(gpus, "gpus", 1, 1 << 20)
    gpu_memory_gib = check_size(gpu_memory_gib, "gpu_memory_gib")
    if disk_gib is not None:
        disk_gib = check_size(disk_gib, "disk_gib")
    arch = arch if arch is not None else arch_of(cfg.model)
    if cfg.dtype not in _BYTES:
        raise ValueError(f"dtype={cfg.dtype!r}: one of {sorted(_BYTES)}")
    fused = fused_adamw(cfg.device) if fused is None else fused
    p = arch.params
    b = _BYTES[cfg.dtype]
    mixed = b != 4  # float32 weights, lower compute dtype (algos.engine.precision)
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
    if needs_critic(rules_for(cfg.stage, cfg.searcher_signal)):
        lines.append(Line("resident", f"Prompted Critic base ({cfg.dtype})", b * p))

    # generation: the rollouts, and validation (HF, by the learner's replica)
    max_model_len = cfg.max_context_tokens + cfg.max_turn_tokens
    seqs = cfg.generation_batch_size
    vllm = cfg.rollout_backend == "vllm"
    hf_phases = "validation" if vllm else "rollouts"
    if vllm:
        share = cfg.vllm_gpu_memory_utilization
        lines.append(Line("rollouts+validation", "vLLM engine's reservation", int(share * gpu_memory_gib * GIB),
                          f"vllm_gpu_memory_utilization {share:g} x {gpu_memory_gib:g} GiB (awake during validation)"))
    lines.append(Line(hf_phases, "HF generation weights (the learner's" + (f", cast to {cfg.dtype})" if mixed else ")"),
                      b * p if mixed else 0))
    kv_note = "float32 keys, " + cfg.dtype + " values" if mixed else "float32 keys and values"
    lines.append(Line(hf_phases, "HF KV cache", seqs * max_model_len * arch.hf_kv_bytes_per_token(b),
                      f"{max_model_len:,} tokens (max_model_len) x {seqs} sequences, {kv_note}"))
    prompt = cfg.max_context_tokens
    lines.append(Line(hf_phases, "HF prefill (one layer, and the attention mask)",
                      seqs * prompt * arch.prefill_bytes_per_token(r, b) + seqs * prompt * prompt,
                      f"{seqs} prompts of up to {prompt:,} tokens"))

    # the update: backward, then the optimizer step
    lines.append(Line("backward+optimizer step", "gradients (float32)", 4 * p // shards, f"4 B x {p:,}{per}"))
    per_layer = arch.activation_bytes_per_token_layer(r, b)
    casts = b * arch.linear_layer_params if mixed else 0  # autocast's saved weight casts, per layer
    if cfg.fsdp:  # the model's own forward: all logits at once (a bound: every token a target)
        logits = t * arch.vocab * (b + 8)
    else:  # the chunked head's forward holds a chunk's float32 logits and their scaled copy
        logits = 2 * 4 * min(t, max(1, LOGIT_CHUNK_ELEMENTS // arch.vocab)) * arch.vocab
    kept = t * 3 * r * arch.hidden  # the last hidden state and the final norm's input and output
    # checkpointing: a hidden state per layer, and the larger of one recomputed layer and the logits
    with_ckpt = t * arch.layers * r * arch.hidden + kept + max(t * per_layer + casts, logits)
    without = t * arch.layers * per_layer + arch.layers * casts + kept + logits
    on = cfg.gradient_checkpointing
    lines.append(Line("backward", f"activations ({t:,}-token chunk, checkpointing {'on' if on else 'off'})",
                      with_ckpt if on else without,
                      f"{per_layer:,} B per token and layer; checkpointing {'off' if on else 'on'}: "
                      f"{(without if on else with_ckpt) / GIB:.2f} GiB"))
    if arch.tied:  # the head's float32 gradient waits in autograd's buffer for the embedding's
        lines.append(Line("backward", "output layer's gradient in flight (float32, tied)",
                          4 * arch.vocab * arch.hidden, "until the embedding's gradient is added to it"))
    if cfg.fsdp:  # FSDP2 gathers a layer (and prefetches the next) in the compute dtype; the root's stay
        root = p - arch.layers * arch.layer_params
        lines.append(Line("backward", f"gathered parameters (FSDP, {cfg.dtype})", b * (root + 2 * arch.layer_params)))
    lines.append(Line("optimizer step", "AdamW step's temporary" + (" (fused: none)" if fused else " (foreach)"),
                      0 if fused else 4 * p // shards,
                      "torch.optim.AdamW(fused=True)" if fused else f"sqrt(exp_avg_sq) of every parameter: 4 B x {p:,}{per}"))
    if gpus > 1 and not cfg.fsdp:
        lines.append(Line("optimizer step", "gradient all-reduce bucket (DDP)", min(GRAD_BUCKET_BYTES, 4 * p)))

    # checkpoints on disk: the model in float32 and AdamW's moments, keep + the one being written
    ckpt = 12 * p
    keep = cfg.keep_checkpoints
    lines.append(Line("disk", f"checkpoints ({keep} kept + 1 being written)", (keep + 1) * ckpt,
                      f"each the float32 model {4 * p / GIB:.2f} + AdamW {8 * p / GIB:.2f} GiB"))
    on_disk = cfg.teacher not in (None, "base") if teacher_run_on_disk is None else teacher_run_on_disk
    if cfg.stage == "team" and on_disk:
        lines.append(Line("disk", "the Teacher's Stage-I run (its kept checkpoints)", keep * ckpt))

    if cfg.fsdp:
        mode = f"FSDP over {gpus} GPUs"
    else:
        mode = "DDP: every GPU holds the whole learner" if gpus > 1 else "one GPU"
    size = f"{p / 1e9:.2f}B" if p >= 1e8 else f"{p / 1e6:.2f}M"
    title = (f"plan: {name or cfg.model} ({cfg.model}, {size} parameters), {cfg.stage} stage, "
             f"{gpus} GPU{'s' if gpus > 1 else ''} x {gpu_memory_gib:g} GiB, {mode}; compute {cfg.dtype}, "
             f"weights float32; rollouts {cfg.rollout_backend}; AdamW {'fused' if fused else 'foreach'}")
    notes = []
    if not vllm:
        notes.append("validation and the pass-rate filter: as the rollouts (HF)")
    if arch.max_positions and max_model_len > arch.max_positions:
        notes.append(f"note: max_model_len {max_model_len} exceeds the model's {arch.max_positions} positions")
    return Plan(title=title, lines=lines, gpu_memory_gib=gpu_memory_gib, notes=notes, disk_gib=disk_gib)


def main(argv: list[str] | None = None) -> int:
    """``python -m algos plan``: print the plan; exit 1 with one line when it does not fit, 2
    with one line naming the value when an input is not sane."""
    import argparse
    import sys

    from algos.commands.presets import PRESETS, preset_config
    from algos.config import parse_overrides

    parser = argparse.ArgumentParser(prog="python -m algos plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the learner runs on (torchrun ranks)")
    parser.add_argument("--gpu-memory", type=float, required=True, metavar="GIB", help="memory of each GPU, GiB")
    parser.add_argument("--disk", type=float, default=None, metavar="GIB",
                        help="free disk where the run writes, GiB: its checkpoints are checked against it")
    parser.add_argument("--stage", choices=("teacher", "team"), default="team",
                        help="default team: Stage II, which also holds the Teacher")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="any TrainConfig field, as for train")
    args = parser.parse_args(argv)
    try:
        check_size(args.gpu_memory, "--gpu-memory")
        if args.disk is not None:
            check_size(args.disk, "--disk")
        overrides = parse_overrides(args.set)
        teacher_run = None
        if args.stage == "team":
            # the Teacher is the base's size either way; on disk, train's Stage I run is kept beside
            teacher_run = "teacher" not in overrides or overrides["teacher"] not in (None, "base")
            overrides.setdefault("teacher", "base")
        else:
            overrides["teacher"] = None
        cfg = preset_config(args.preset, stage=args.stage, **overrides)
        plan = memory_plan(cfg, args.gpus, args.gpu_memory, name=args.preset, disk_gib=args.disk,
                           teacher_run_on_disk=teacher_run)
    except (ValueError, OSError, OverflowError) as err:
        print(f"python -m algos plan: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(plan.render())
    if not plan.fits:
        print(f"python -m algos plan: {plan.refusal()}", file=sys.stderr)
        return 1
    return 0
