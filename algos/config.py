"""Training configuration: one dataclass for both stages, validated on construction (the
presets that fill it are in :mod:`algos.commands.presets`).

Where PAPER.md is silent we use Search-R1's published defaults (learning rate 1e-6,
5 samples per question, temperature 1, top-3 retrieval); the ``micro`` preset departs
from them so that a 5M-parameter model trains in minutes, and says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from agents.registry import ROLLOUT_BACKENDS
from agents.sampling import Sampling
from algos.losses import AGGREGATIONS
from algos.roles import STAGES, check_declared_needs, needs_teacher, rules_for, searcher_signals


@dataclass
class TrainConfig:
    """One training run. Stage ``teacher`` is Stage I (C-MAS, GRPO; writes the Teacher);
    stage ``team`` is Stage II (H-MAS from the base model, GRPO + OPD, KL to the Teacher)."""

    stage: str = "team"
    """``teacher`` (Stage I) or ``team`` (Stage II)."""
    model: str = "smollm2"
    """The base model pi_0: ``smollm2``, ``micro`` (the SFT-warmed micro model), a hub id or a path."""
    teacher: str | None = None
    """Stage II only: a Stage-I checkpoint directory, or ``base`` (the base-model diagnostic)."""
    searcher_signal: str = "opd"
    """Stage II Searcher signal: one of ``algos.roles.searcher_signals()`` (Table 2)."""
    out_dir: str = "runs/mopd"
    """Checkpoints, metrics.jsonl, TensorBoard events and summary.json go here."""

    steps: int = 100
    """Policy updates (each on one batch of fresh rollouts)."""
    questions_per_step: int = 16
    """Questions sampled per step; each is rolled out ``group_size`` times."""
    group_size: int = 5
    """G: workflows sampled per question (Search-R1: 5)."""
    learning_rate: float = 1e-6
    """Search-R1's default."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay (must be 0 for a model that declares frozen parameters)."""
    max_grad_norm: float = 1.0
    """Each minibatch's gradient is clipped to this global L2 norm."""
    minibatches: int = 1
    """Optimizer steps per batch of rollouts (>1 makes the clip matter)."""
    freeze_embeddings: bool = False
    """Keep the token embeddings (tied: the output layer too) as they are (why: docs/micro.md)."""
    clip_eps: float = 0.2
    """PPO's ratio clip: the surrogate stops rewarding a ratio beyond ``1 +- clip_eps``."""
    beta: float = 0.01
    """OPD advantage scale (PAPER: 0.01)."""
    kl_coef: float = 1e-3
    """KL toward the Teacher on the tokens of roles whose rule has ``kl`` (PAPER: 1e-3)."""
    aggregation: str = "token-mean"
    """``token-mean`` (every trained token weighs the same) or ``sequence-mean`` (each row's mean, then over rows)."""
    critic_em_weight: float = 0.5
    """Prompted Critic: Searcher reward = w R_EM + (1 - w) score (ours)."""

    temperature: float = 1.0
    """Rollout sampling temperature; old, new and Teacher log-probs are taken at it too."""
    top_p: float = 1.0
    """Nucleus sampling of the rollouts (1: the whole distribution)."""
    max_turn_tokens: int = 256
    """Most tokens in one turn (``envs.team.TeamConfig``, as the six env fields below)."""
    max_context_tokens: int = 4096
    """Most tokens in one agent's context."""
    max_waves: int = 3
    """Most waves the Leader may dispatch."""
    max_searchers: int = 3
    """Most Searchers in one wave (K)."""
    max_searcher_turns: int = 4
    """Turns a Searcher gets per sub-task (searches plus the summary)."""
    num_candidates: int = 5
    """Answerers (C), each writing one candidate."""
    top_k: int = 3
    """Passages per search."""

    data: str = "synthetic"
    """``synthetic`` or a FlashRAG-layout directory."""
    train_datasets: tuple[str, ...] = ("nq", "hotpotqa")
    """PAPER: NQ + HotpotQA."""
    train_split: str = "train"
    """The split of ``train_datasets`` trained on."""
    train_per_dataset: int | None = None
    """Only the first N training questions of each dataset (None: all); with ``val_split="train"``
    and the same ``val_per_dataset``, a check that the learner fits a small set."""
    pass_rate_filter: int = 0
    """G > 0: train only on the questions that G workflows of the starting model got right
    some but not all times (kept in ``<out_dir>/train_questions.json``). 0: off."""
    val_datasets: tuple[str, ...] = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
    """The datasets validation avg@k is taken over (the seven benchmarks)."""
    val_split: str = "dev"
    """The split of ``val_datasets`` validated on."""
    val_per_dataset: int = 10
    """Validation questions per dataset (the first N of its split)."""
    val_runs: int = 1
    """Workflows per validation question (avg@k over them; k=1 is the paper's avg@1)."""
    val_temperature: float = 1.0
    """Sampling temperature for validation (0 = greedy)."""
    eval_every: int = 10
    """Validation avg@1 every this many steps (and before the first and after the last)."""
    save_every: int = 10
    """Checkpoint every this many steps (and after the last)."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints stay on disk."""
    sample_every: int = 1
    """Keep a sample (episodes with the loss's per-token values, ``<out_dir>/samples/``) every
    this many steps and at every validation. 0: never."""
    sample_episodes: int = 4
    """Episodes per sample: training, the first question's workflows first (one GRPO group);
    validation, the first run of the first questions (the same at every validation)."""
    max_nonfinite: int = 3
    """Stop after this many non-finite losses in a row (each one skips its step)."""

    seed: int = 0
    """Seeds torch, the question draw, the minibatch order and the rollouts' sampler."""
    base_seed: int | None = None
    """The seed a recipe's base is built for (None: ``seed``): runs of several seeds share one."""
    device: str = "cpu"
    """Where the models live: ``cpu``, ``cuda`` or ``cuda:N`` (torchrun gives each rank its GPU)."""
    dtype: str = "float32"
    """What the model computes in: ``float32`` or ``bfloat16`` (weights stay float32:
    ``algos.engine.precision``)."""
    generation_batch_size: int = 32
    """Contexts per forward when HF generates the rollouts and validation."""
    max_tokens_per_batch: int = 16384
    """Padded tokens per forward/backward chunk (memory bound)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them."""
    max_row_tokens: int = 4096
    """A row (one agent's context) keeps its first this many tokens."""
    retriever: str = "default"
    """``default`` (MiniLM over the synthetic corpus), a corpus JSONL, or an http(s) URL."""
    retriever_index: str = "auto"
    """A local corpus's index: ``auto``, ``flat``, ``hnsw`` or ``ivf`` (docs/performance.md)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra SearchTeam keyword arguments."""

    rollout_backend: str = "hf"
    """Who generates the rollouts: ``hf`` or ``vllm`` (an in-process engine; docs/scaleout.md)."""
    vllm_gpu_memory_utilization: float = 0.3
    """``rollout_backend=vllm``: the GPU's share the engine reserves (the learner shares it)."""
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    """``rollout_backend=vllm``: more ``vllm.EngineArgs``, plain JSON values (docs/scaleout.md)."""
    rollout_workers: int = 0
    """0: rollouts in the trainer's process; N: N Ray actors (the Episodes do not depend on N)."""
    ray_address: str | None = None
    """None starts Ray here; ``auto`` joins ``ray start``'s cluster; ``ray://host:port`` another."""
    fsdp: bool = False
    """Under ``torchrun``: shard parameters, gradients and AdamW state over the ranks (FSDP2)."""

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"TrainConfig.{name}={getattr(self, name)!r}: {why}")

        _check_field_types(self, bad)
        if self.stage not in STAGES:
            raise bad("stage", f"must be one of {STAGES}")
        if self.searcher_signal not in searcher_signals():
            raise bad("searcher_signal", f"must be one of {searcher_signals()}")
        if self.aggregation not in AGGREGATIONS:
            raise bad("aggregation", f"must be one of {AGGREGATIONS}")
        for rule in rules_for(self.stage, self.searcher_signal).values():  # before any model loads
            try:
                check_declared_needs(rule)
            except ValueError as err:
                raise bad("searcher_signal", str(err)) from None
        if self.teacher is None and needs_teacher(rules_for(self.stage, self.searcher_signal)):
            raise bad("teacher", f"the {self.searcher_signal} Searcher signal needs a Teacher: a Stage-I "
                      "checkpoint or 'base'")
        if self.stage == "team" and self.teacher is None and self.kl_coef != 0:
            raise bad("kl_coef", "a KL toward the Teacher needs a Teacher; set kl_coef=0 or give teacher")
        if self.stage == "teacher" and self.teacher is not None:
            raise bad("teacher", "Stage I trains the Teacher; it has none itself")
        for name in ("steps", "questions_per_step", "minibatches", "max_turn_tokens", "eval_every",
                     "save_every", "keep_checkpoints", "max_nonfinite", "generation_batch_size", "val_runs",
                     "sample_episodes", "val_per_dataset", "max_context_tokens", "max_waves",
                     "max_searchers", "max_searcher_turns", "num_candidates", "top_k",
                     "max_tokens_per_batch", "max_row_tokens"):
            if getattr(self, name) < 1:  # a negative limit would slice from the end, not refuse
                raise bad(name, "must be >= 1")
        if self.sample_every < 0:
            raise bad("sample_every", "must be >= 0 (0: keep no samples)")
        if self.base_seed is not None and self.base_seed < 0:
            raise bad("base_seed", "must be >= 0, or None for the run's seed")
        if self.train_per_dataset is not None and self.train_per_dataset < 1:
            raise bad("train_per_dataset", "must be >= 1, or None for every training question")
        if self.group_size < 2:
            raise bad("group_size", "GRPO needs at least 2 workflows per question")
        if self.pass_rate_filter == 1 or self.pass_rate_filter < 0:
            raise bad("pass_rate_filter", "must be 0 (off) or >= 2 (one workflow cannot be partly right)")
        if not self.learning_rate > 0:
            raise bad("learning_rate", "must be > 0")
        if not 0 < self.clip_eps < 1:
            raise bad("clip_eps", "must be in (0, 1)")
        for name in ("beta", "kl_coef", "weight_decay"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        for name, key in (("temperature", "temperature"), ("val_temperature", "temperature"), ("top_p", "top_p")):
            try:  # Sampling's ranges: 0 is greedy, a tiny temperature overflows the logits
                Sampling(**{key: getattr(self, name)})
            except ValueError as err:
                raise bad(name, str(err).removeprefix(f"{key} ")) from None
        if not self.max_grad_norm > 0:  # clip_grad_norm_ with a negative bound flips the gradient
            raise bad("max_grad_norm", "must be > 0")
        if not 0 <= self.critic_em_weight <= 1:
            raise bad("critic_em_weight", "must be in [0, 1]")
        from envs.retrieval.dense import INDEX_KINDS  # faiss: only once a config is made

        if self.retriever_index not in INDEX_KINDS:
            raise bad("retriever_index", f"must be one of {INDEX_KINDS}")
        if self.rollout_backend not in ROLLOUT_BACKENDS:
            raise bad("rollout_backend", f"must be one of {ROLLOUT_BACKENDS}")
        if self.rollout_workers < 0:
            raise bad("rollout_workers", "must be >= 0 (0: rollouts in the trainer's process)")
        if self.rollout_backend == "vllm" and self.rollout_workers:
            raise bad("rollout_workers", "vLLM inside Ray workers is not wired yet: use rollout_backend=vllm "
                      "with rollout_workers=0 (the engine in the trainer's process), or hf workers")
        world = os.environ.get("WORLD_SIZE", "1")
        if self.rollout_backend == "vllm" and world.isdigit() and int(world) > 1:
            # each rank's in-process engine would take GPU 0 (vLLM's own single-process
            # executor), and its set_device would move the rank there too
            raise bad("rollout_backend", f"vLLM under torchrun (WORLD_SIZE={world}) is not supported: every "
                      "rank's engine would land on GPU 0; run vLLM rollouts in one process, or hf under torchrun")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise bad("vllm_gpu_memory_utilization", "must be in (0, 1]")
        owned = sorted(set(self.vllm_kwargs) & {"model", "seed", "dtype", "gpu_memory_utilization", "logprobs_mode"})
        if owned:
            raise bad("vllm_kwargs", f"{owned} are set by the run itself (dtype is the run's dtype; "
                      "gpu_memory_utilization is vllm_gpu_memory_utilization)")
        for key, value in self.vllm_kwargs.items():
            if not _plain_json(value):
                raise bad("vllm_kwargs", f"{key!r} must be a plain JSON value (number, string, bool, null, "
                          f"list or object of them), got {type(value).__name__}")
        self.train_datasets = tuple(self.train_datasets)
        self.val_datasets = tuple(self.val_datasets)

    @property
    def build_seed(self) -> int:
        """The seed of the recipe base this run starts from: ``base_seed``, else ``seed``."""
        return self.seed if self.base_seed is None else self.base_seed

    @property
    def sampling(self) -> Sampling:
        """What the rollouts sample with; the old, new and Teacher log-probs use its temperature."""
        return Sampling(self.temperature, self.top_p, self.max_turn_tokens)

    @property
    def val_sampling(self) -> Sampling:
        """What validation samples with: :attr:`sampling` at ``val_temperature``."""
        return Sampling(self.val_temperature, self.top_p, self.max_turn_tokens)

    @property
    def workflow(self) -> str:
        return "cascade" if self.stage == "teacher" else "hierarchical"

    def env_shape(self) -> dict[str, Any]:
        """SearchTeam keyword arguments of this run (workflow excluded): every field named as one
        of ``envs.team.TeamConfig``'s, then ``env_kwargs``."""
        from envs.team import TeamConfig

        team = TeamConfig.keywords()
        shape = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in team}
        return dict(**shape, **self.env_kwargs)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}; known: {sorted(known)}")
        return cls(**data)


def _check_field_types(config: TrainConfig, bad: Any) -> None:
    """Refuse a value of the wrong kind before any range check reads it (``steps="abc"``,
    ``freeze_embeddings="ture"``, ``beta=nan``, which passes every ``<`` test)."""
    for f in dataclasses.fields(config):
        value, kind = getattr(config, f.name), str(f.type)
        if value is None and kind.endswith("| None"):
            continue
        if kind == "bool":
            ok = isinstance(value, bool)
        elif kind.startswith("int"):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and not math.isfinite(value):
                raise bad(f.name, "must be a finite number")
        elif kind.startswith("str"):
            ok = isinstance(value, str)
        elif kind.startswith("tuple"):
            ok = isinstance(value, (tuple, list)) and all(isinstance(x, str) for x in value)
        elif kind.startswith("dict"):
            ok = isinstance(value, dict)
        else:
            ok = True
        if not ok:
            raise bad(f.name, f"must be {kind.replace('tuple[str, ...]', 'a list of strings')}")


# --------------------------------------------------------------------------- --set overrides

BOOLEANS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
"""The words ``--set name=value`` takes for a bool field (any case); anything else is refused."""


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["steps=5", "train_datasets=nq,hotpotqa"]`` -> TrainConfig overrides, each parsed by its
    field's type (tuples comma-separated, dicts JSON, ``none`` for an optional field); an
    unknown name or a value of the wrong kind is a ``ValueError`` naming the pair."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--set {pair!r}: expected name=value with name one of {sorted(fields)}")
        out[name] = _parse_value(pair, str(fields[name].type), raw)
    return out


def _parse_value(pair: str, kind: str, raw: str) -> Any:
    if kind.endswith("| None") and raw.lower() == "none":
        return None
    try:
        if kind == "bool":
            if raw.lower() not in BOOLEANS:
                raise ValueError
            return BOOLEANS[raw.lower()]
        if kind.startswith("int"):
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind.startswith("tuple"):
            return tuple(x for x in raw.split(",") if x)
        if kind.startswith("dict"):
            value = json.loads(raw)
            if not isinstance(value, dict):
                raise ValueError
            return value
    except ValueError:
        wanted = {"bool": f"one of {'/'.join(BOOLEANS)}", "float": "a number",
                  "dict": 'a JSON object, e.g. {"top_k": 5}'}
        raise ValueError(f"--set {pair!r}: expected {wanted.get(kind.split('[')[0], 'an integer')}") from None
    return raw


def _plain_json(value: Any) -> bool:
    """Whether ``value`` is made of JSON's own types only (it travels in a config file)."""
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_plain_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_json(v) for k, v in value.items())
    return False
