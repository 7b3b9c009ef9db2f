"""The MultiAgent-OPD learner, Stage I and Stage II, as one story:

1. sample questions; roll out G workflows per question with the current policy;
2. cut the Episodes into rows (one per agent context) and recompute the old log-probs;
3. score the rows with the Teacher (``algos.teacher``: Searcher tokens for OPD; Leader
   and Answerer tokens for the KL);
4. per-token advantages by role, and each row's ``trained`` and ``kl`` flags;
5. PPO-style update with the clipped surrogate (``algos.losses``), applied entirely or
   not at all: the engine's (``algos.engine.update``), which knows no role and no rank;
6. log metrics under stable names, keep a sample of the step (``algos.samples``), validate,
   checkpoint.

What each role gets in steps 3-5 (its advantage, the KL, Teacher scoring, whether it is
trained) is the table of role rules, ``algos.roles``; this file names no role.
All roles share one set of parameters: one model plays every agent.
"""

from __future__ import annotations

import gc
import json
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from agents.backends import RolloutBackend, as_backend
from agents.collect import collect
from agents.hf import HFPolicy
from agents.models import local_model_dir
from agents.registry import make_rollout_policy
from agents.sampling import Sampling
from algos import advantages as A
from algos.batch import Row, rows_from_episodes, score_rows
from algos.config import TrainConfig
from algos.engine import distributed as D
from algos.engine.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_model,
    resolve_model_path,
    save_checkpoint,
    usable_checkpoint,
)
from algos.engine.freeze import declared_frozen
from algos.engine.precision import precision_for
from algos.engine.update import NonFiniteLoss, Update, WeightOverflow
from algos.mechanism import outcome_signal
from algos.report import truncate_metrics
from algos.roles import RoleRule, assign_advantages, needs_critic, rule_of, rules_for
from algos.samples import keep_sample
from algos.teacher import load_teacher, score_with_teacher
from envs.episode import Episode, question_record
from envs.protocol import TAGS
from envs.retrieval.factory import make_retriever

__all__ = ["NonFiniteLoss", "Trainer", "rollout_metrics", "validation_path"]


def validation_path(out_dir: str | Path, step: int) -> Path:
    """Where a run's validation at ``step`` writes its per-question records (JSONL in the
    format of ``benchmarks.metrics``; step 0 is the base model)."""
    return Path(out_dir) / "validation" / f"step_{step:06d}.jsonl"


def load_questions(data: str, datasets: Sequence[str], split: str, limit: int | None = None) -> list[Any]:
    from envs.data import load_qa

    root = "synthetic" if data == "synthetic" else data
    out = []
    for name in datasets:
        out.extend(load_qa(name, split, root=root)[:limit])
    return out


class Trainer:
    """Trains ``config.model`` for ``config.stage``; ``resume=True`` continues ``out_dir``."""

    def __init__(self, config: TrainConfig, *, resume: bool = False, progress: bool = True,
                 model: Any = None, tokenizer: Any = None, retriever: Any = None):
        self.config = cfg = config
        # this process's place among torchrun's ranks (one process: rank 0 of 1, every collective
        # trivial) and how the trained model lies on them (FSDP2 shards; else every rank holds it)
        self.dist: D.Dist = D.this_process(cfg.device)
        self.layout = D.layout_for(self.dist, cfg.fsdp)
        self.is_main = self.dist.is_main  # rank 0 writes metrics and checkpoints
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress = progress and self.is_main
        checkpoint = None
        if resume:  # the newest checkpoint that verifies; a damaged newer one is skipped, rank 0 says which and why
            quiet = {} if self.is_main else {"log": lambda line: None}
            checkpoint = usable_checkpoint(self.out, **quiet)
        if resume and checkpoint is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {self.out / 'checkpoints'}")
        if not resume and (self.out / "metrics.jsonl").exists():
            raise FileExistsError(f"{self.out} already holds a run (metrics.jsonl); a new run there "
                                  "would mix its metrics into the old ones. Pass --resume to continue "
                                  "it, or give another --out")
        torch.manual_seed(cfg.seed)
        # the trained model keeps float32 weights; cfg.dtype is what its forwards compute in
        self.precision = precision_for(cfg.device, cfg.dtype)
        self.precision.configure()
        if checkpoint is not None or model is None:  # a checkpoint's weights win over any given
            model, tokenizer = load_model(str(checkpoint or cfg.model), cfg.device,
                                          str(self.precision.param_dtype).removeprefix("torch."))
        self.precision.prepare(model)
        if cfg.weight_decay > 0 and declared_frozen(model):
            raise ValueError(f"TrainConfig.weight_decay={cfg.weight_decay}: the model {cfg.model} declares frozen "
                             f"parameters ({declared_frozen(model)[0]}, ...), and AdamW's decay would move them "
                             "although their gradient is zero; use weight_decay=0")
        self.model, self.tokenizer = model, tokenizer
        self.model.train()
        if cfg.gradient_checkpointing:  # recompute each layer's activations in the backward
            if hasattr(self.model, "activation_checkpointing_enable"):  # (transformers >= 5.x's name)
                self.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # generation, scoring, validation and checkpoints read the replica: the trained model
        # itself, or (FSDP2) a gathered copy of its shards, refreshed after every update
        self.full_model = self.layout.prepare(self.model, self.precision)
        # (the config allows a Teacher in Stage II only)
        self.teacher = load_teacher(cfg.teacher, cfg.model, cfg.device, cfg.dtype) if cfg.teacher else None
        self.rules = rules_for(cfg.stage, cfg.searcher_signal)
        self.critic = None
        if needs_critic(self.rules):  # a rule's term reads the Prompted Critic (algos.roles)
            from algos.critic import PromptedCritic

            base, _ = load_model(cfg.model, cfg.device, cfg.dtype)
            self.critic = PromptedCritic(base, tokenizer)
        self.optimizer = self.precision.adamw(self.model.parameters(), lr=cfg.learning_rate,  # fused on CUDA
                                              weight_decay=cfg.weight_decay)
        self.rng = np.random.default_rng(cfg.seed)  # (the questions and the minibatches)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # how one update runs on this run's ranks (algos.engine): this file names no rank
        self.engine = Update(self.model, self.optimizer, self.layout, self.precision, cfg, rng=self.rng,
                             pad_id=self.pad_id)
        self.model_path = str(checkpoint) if checkpoint is not None else resolve_model_path(cfg.model)
        self.backend: RolloutBackend = self._rollout_backend()
        """What generates this process's rollouts (``agents.backends``); ``policy`` too."""
        self.engine_sleeps = self.backend.can_sleep and str(cfg.device).startswith("cuda")
        """An in-process engine (vLLM) on the learner's GPU sleeps from the end of the rollouts
        until the updated weights are pushed into it."""
        self.retriever = retriever if retriever is not None else make_retriever(cfg.retriever, index=cfg.retriever_index,
                                                                               progress=self.progress)
        if cfg.rollout_workers and self.is_main:  # Ray actors sharing one retriever (the URL, or an actor)
            from agents.ray_rollout import RayRolloutPool

            self.pool = RayRolloutPool(
                cfg.rollout_workers, model=self.full_model, tokenizer=self.tokenizer,
                env_kwargs=dict(workflow=cfg.workflow, **cfg.env_shape()),
                retriever=retriever if retriever is not None else cfg.retriever, backend=cfg.rollout_backend,
                address=cfg.ray_address, retriever_index=cfg.retriever_index,
                policy_kwargs=dict(sampling=cfg.sampling, batch_size=cfg.generation_batch_size))
        else:
            self.pool = _NoWorkers()
        self.train_questions = load_questions(cfg.data, cfg.train_datasets, cfg.train_split, cfg.train_per_dataset)
        self.val_questions = load_questions(cfg.data, cfg.val_datasets, cfg.val_split, cfg.val_per_dataset)
        self.step = 0
        self.nonfinite_in_a_row = 0
        self.rollout_stats: dict[str, float] = {}
        """The Ray workers' statistics of the last rollouts (none without workers)."""
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, self.layout.checkpoint_optimizer(self.model, self.optimizer))
            self.step = int(state["step"])
            self.nonfinite_in_a_row = int(state["nonfinite_in_a_row"])
            self.rng.bit_generator.state = state["numpy_rng"]
            torch.set_rng_state(state["torch_rng"])
            random.setstate(state["python_rng"])
            if state.get("policy_rng") is not None:
                self.backend.set_state(state["policy_rng"])
            if self.is_main:  # (one writer: ranks replacing the same file would race)
                truncate_metrics(self.out / "metrics.jsonl", self.step)  # the later steps run again
        self.writer = _tensorboard(self.out / "tb") if self.is_main else None
        self.dist.barrier()  # no rank starts before every rank has checked and loaded

    @property
    def policy(self) -> RolloutBackend:
        """The rollout backend (the name the collector knows it by)."""
        return self.backend

    @policy.setter
    def policy(self, policy: Any) -> None:  # a test's or a recipe's own policy: a backend around it
        self.backend = as_backend(policy)

    def _rollout_backend(self) -> RolloutBackend:
        """The trainer's own generation backend (``rollout_backend``; with Ray workers the
        trainer's is HF: the workers generate)."""
        cfg = self.config
        settings = dict(sampling=cfg.sampling, seed=cfg.seed, batch_size=cfg.generation_batch_size)
        if cfg.rollout_backend == "vllm" and not cfg.rollout_workers:
            # the engine reads model files itself: a directory, not an alias such as smollm2; it
            # computes in the learner's dtype and holds only as long a sequence as the env makes
            engine = {"dtype": cfg.dtype, "max_model_len": cfg.max_context_tokens + cfg.max_turn_tokens,
                      "gpu_memory_utilization": cfg.vllm_gpu_memory_utilization, **cfg.vllm_kwargs}
            return make_rollout_policy("vllm", local_model_dir(self.model_path), self.tokenizer,
                                       **settings, **engine)
        return make_rollout_policy("hf", self.full_model, self.tokenizer, **settings)

    def _push_weights(self) -> None:
        """The updated weights into the engines that generate with their own copy (the Ray
        workers, a vLLM engine); under FSDP2 first into the gathered replica."""
        self.pool.push_weights(self.engine.sync_replica(self.full_model))
        # every name, tied ones included: vLLM reloads layer by layer, and a layer whose name is
        # missing (a tied lm_head) keeps its old processed weights (HF on this very model: nothing to copy)
        self.backend.load_weights(self.full_model.named_parameters(remove_duplicate=False))

    def close(self) -> None:
        """Free the engine (vLLM allows one sleep-mode engine per process), the Ray workers,
        the models and the optimizer before another Trainer is built."""
        if self.backend is not None:
            self.backend.close()
        if self.pool is not None:
            self.pool.shutdown()
        if self.writer is not None:
            self.writer.close()
        self.backend = self.pool = self.writer = None
        self.model = self.full_model = self.optimizer = self.teacher = self.critic = self.layout = self.engine = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ setup

    def env_fn(self, questions: Sequence[Any] | None = None):
        """A function that makes one env of this run over ``questions`` (None: training's)."""
        from envs import env_fn

        return env_fn(workflow=self.config.workflow, tokenizer=self.tokenizer, retriever=self.retriever,
                      questions=self.train_questions if questions is None else questions,
                      **self.config.env_shape())

    # ------------------------------------------------------------------ the loop

    def train(self, validate_first: bool = True) -> dict[str, Any]:
        """Run to ``config.steps``; validation avg@1 before the first step (unless told not
        to), every ``eval_every`` steps and at the end."""
        cfg = self.config
        history = []
        if self.step == 0 and validate_first:
            self.log_metrics({"val/avg@1": self.validate()}, step=0)
        if cfg.pass_rate_filter:
            self.filter_by_pass_rate()
        bar = tqdm(total=cfg.steps, initial=self.step, desc="train " + cfg.stage, unit="step",
                   disable=not self.progress)
        while self.step < cfg.steps:  # a skipped (non-finite) step does not count
            try:
                metrics = self.train_step()
            except NonFiniteLoss as err:
                # logged at the step it attempted: a resume from before it drops the row with the step's
                self.log_metrics({"losses/nonfinite": 1.0, "losses/nonfinite_in_a_row": self.nonfinite_in_a_row},
                                 step=self.step + 1)
                if self.nonfinite_in_a_row >= cfg.max_nonfinite:
                    raise RuntimeError(f"{self.nonfinite_in_a_row} non-finite steps in a row (the last: {err}); "
                                       f"the last good checkpoint is {latest_checkpoint(self.out)}") from err
                continue
            bar.update(1)
            if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                metrics["val/avg@1"] = self.validate()
            self.log_metrics(metrics)
            history.append(metrics)
            bar.set_postfix(em=f"{metrics['team/em']:.2f}", searches=f"{metrics['team/searches_per_workflow']:.1f}")
            if self.step % cfg.save_every == 0 or self.step == cfg.steps:
                self.save()
        bar.close()
        return {"steps": self.step, "history": history}

    def train_step(self) -> dict[str, float]:
        """One batch of rollouts and the update on it."""
        t0 = time.perf_counter()
        with self.precision.compute():
            groups = self.collect_rollouts()
        return self.learn(groups, rollout_s=time.perf_counter() - t0)

    def collect_rollouts(self) -> list[list[Episode]]:
        """Step 1: G workflows per question, the current policy for every role; each group with
        its own seed when several processes roll (``agents.ray_rollout.collect_groups``)."""
        cfg = self.config
        picks = self.rng.choice(len(self.train_questions), size=cfg.questions_per_step,
                                replace=len(self.train_questions) < cfg.questions_per_step)
        questions = [self.train_questions[i] for i in picks]
        seed = cfg.seed + 1_000_003 * (self.step + 1)
        self.full_model.eval()
        if cfg.rollout_workers:  # rank 0 drives the Ray workers; every rank gets their batch
            groups = self.dist.share_groups(self.pool.collect(questions, cfg.group_size, seed=seed))
            self.rollout_stats = dict(self.pool.last_stats)
            return groups
        return self.dist.collect(self.env_fn(), self.policy, questions, cfg.group_size, seed)

    def learn(self, groups: list[list[Episode]], rollout_s: float = 0.0) -> dict[str, float]:
        """Steps 2-5 on a batch of Episodes grouped by question (every rank passes the
        same batch); the step's metrics."""
        cfg = self.config
        t1 = time.perf_counter()
        if self.engine_sleeps:  # the engine's GPU memory goes to scoring and the update; the new
            self.backend.sleep()  # weights wake it (_push_weights -> load_weights)
        # 2. rows, with the old log-probs recomputed by the training model
        rows = rows_from_episodes(groups, cfg.max_row_tokens)
        temperature = cfg.sampling.temperature

        def old_logp(mine: list[Row]) -> None:
            for row, logp in zip(mine, score_rows(self.full_model, mine, max_tokens=cfg.max_tokens_per_batch,
                                                  pad_id=self.pad_id, temperature=temperature)):
                row.old_logp = logp

        def teacher_logp(mine: list[Row]) -> None:  # 3. the same token contexts (the rows the rules name)
            score_with_teacher(self.teacher, mine, kl_coef=cfg.kl_coef, temperature=temperature,
                               max_tokens=cfg.max_tokens_per_batch, pad_id=self.pad_id, rules=self.rules)

        self.engine.score(rows, old_logp, *([teacher_logp] if self.teacher is not None else []))
        # 4. per-token advantages by role, and each row's trained and KL flags
        ctx = A.AdvantageContext(groups=groups, beta=cfg.beta, critic_em_weight=cfg.critic_em_weight,
                                 critic=self.critic)
        assign_advantages(rows, self.rules, ctx, kl_coef=cfg.kl_coef)
        t2 = time.perf_counter()
        # 5. the update
        try:
            update = self.update(rows)
        except NonFiniteLoss:  # a skipped step: the engine gets the unchanged weights back, awake
            self._push_weights()
            raise
        self._push_weights()
        t3 = time.perf_counter()
        self.step += 1
        if self.is_main and cfg.sample_every and self.step % cfg.sample_every == 0:
            self.keep_sample("train", groups, rows)  # a few episodes with the values the loss used
        metrics = rollout_metrics(groups, rows, self.rules)
        metrics.update(update)
        metrics.update(self.rollout_stats)
        tokens = sum(ep.output_tokens for g in groups for ep in g)
        metrics.update({"perf/rollout_s": rollout_s, "perf/score_s": t2 - t1, "perf/update_s": t3 - t2,
                        "perf/generated_tokens_per_s": tokens / max(rollout_s, 1e-9),
                        "perf/trained_tokens_per_s": update["losses/tokens"] / max(t3 - t2, 1e-9)})
        return metrics

    def update(self, rows: list[Row]) -> dict[str, float]:
        """Step 5 (:meth:`Update.step`); a skipped step counts toward ``max_nonfinite``."""
        try:
            stats = self.engine.step(rows, self.step + 1)
        except NonFiniteLoss:
            self.nonfinite_in_a_row += 1
            raise
        except WeightOverflow as err:
            raise RuntimeError(f"{err}; the last good checkpoint is {latest_checkpoint(self.out)}") from err
        self.nonfinite_in_a_row = 0
        return stats

    def filter_by_pass_rate(self) -> None:
        """``TrainConfig.pass_rate_filter``: rank 0 samples once with a sampler of its own (the
        rollouts' is not advanced) and writes ``train_questions.json``; every rank, and a run
        that resumes, reads that file."""
        cfg = self.config
        path = self.out / "train_questions.json"
        by_id = {(q.dataset, q.id): q for q in self.train_questions}
        if not path.exists() and self.step:
            raise FileNotFoundError(f"{path}: a run with pass_rate_filter resumes from step {self.step} "
                                    "but the questions it kept before step 1 are not there")
        if not path.exists() and self.is_main:
            groups = self._sample_apart(self.train_questions, cfg.pass_rate_filter, cfg.sampling,
                                        seeds=(cfg.seed + 999_983, cfg.seed + 999_979), label="pass-rate filter")
            right = [int(sum(ep.team_em for ep in g)) for g in groups]
            kept = [{"dataset": q.dataset, "id": q.id, "right": r}
                    for q, r in zip(self.train_questions, right) if 0 < r < cfg.pass_rate_filter]
            partial = path.with_name(path.name + ".tmp")  # (a run killed while writing leaves no half file)
            partial.write_text(json.dumps({"group_size": cfg.pass_rate_filter, "pool": len(self.train_questions),
                                           "kept": kept}, indent=1) + "\n", encoding="utf-8")
            partial.replace(path)
        self.dist.barrier()
        ids = [(q["dataset"], q["id"]) for q in json.loads(path.read_text(encoding="utf-8"))["kept"]]
        if self.step == 0:
            self.log_metrics({"data/train_questions": float(len(ids)), "data/train_pool": float(len(by_id))}, step=0)
        missing = [i for i in ids if i not in by_id]
        if missing or not ids:
            raise ValueError(f"{path}: " + (f"{len(missing)} kept questions are not training questions of this "
                                            f"run (the first: {missing[0]})" if missing else
                                            f"no training question of {len(self.train_questions)} was right "
                                            f"some but not all of {cfg.pass_rate_filter} times: nothing to train on"))
        self.train_questions = [by_id[i] for i in ids]

    # ------------------------------------------------------------------ validation, logging, state

    @torch.no_grad()
    def validate(self) -> float:
        """avg@k on the held-out questions, sampled the same way at every validation (common
        random numbers for base and trained models); records go to :func:`validation_path`."""
        cfg = self.config
        questions = list(self.val_questions)
        if not questions or not self.is_main:  # rank 0 validates (the others' value is not logged)
            return float("nan")
        groups = self._sample_apart(questions, cfg.val_runs, cfg.val_sampling, seeds=(cfg.seed + 7, cfg.seed + 99_991),
                                    label=f"validate step {self.step}")
        records = [question_record(g) for g in groups]
        path = validation_path(self.out, self.step)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        if cfg.sample_every:
            self.keep_sample("validation", groups)
        return float(np.mean([ep.final_em for g in groups for ep in g]))

    def _sample_apart(self, questions: Sequence[Any], runs: int, sampling: Sampling, *, seeds: tuple[int, int],
                      label: str) -> list[list[Episode]]:
        """``runs`` workflows per question by the current weights with a sampler seeded by
        ``seeds`` (the sampler's, the envs'): the same weights give the same episodes."""
        cfg = self.config
        sampler = HFPolicy(self.full_model, self.tokenizer, sampling=sampling, seed=seeds[0],
                           batch_size=cfg.generation_batch_size)
        self.full_model.eval()
        with self.precision.compute():
            groups = collect(self.env_fn(questions), sampler, questions, runs, seed=seeds[1],
                             progress=label if self.progress else False)
        self.model.train()
        return groups

    def keep_sample(self, kind: str, groups: list[list[Episode]], rows: list[Row] | None = None) -> Path:
        """This step's ``kind`` sample (``algos.samples.keep_sample``)."""
        return keep_sample(kind, groups, rows, out=self.out, step=self.step, config=self.config,
                           tokenizer=self.tokenizer, model=self.full_model, teacher=self.teacher,
                           pad_id=self.pad_id, rules=self.rules)

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """One row of ``metrics.jsonl`` (and TensorBoard) at ``step`` (default: the current one)."""
        if not self.is_main:
            return
        step = self.step if step is None else step
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "stage": self.config.stage, **metrics}) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(key, value, step)
            self.writer.flush()

    def save(self) -> Path | None:
        """Rank 0 writes the checkpoint (every rank calls it: FSDP2 gathers the optimizer first)."""
        optimizer = self.layout.checkpoint_optimizer(self.model, self.optimizer, gather=True)
        if not self.is_main:  # the replicas are equal: rank 0 writes the one checkpoint
            return None
        state = {"step": self.step, "nonfinite_in_a_row": self.nonfinite_in_a_row,
                 "numpy_rng": self.rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                 "python_rng": random.getstate(),
                 "policy_rng": self.backend.get_state()}  # (the rollout sampler's; None: it keeps none)
        return save_checkpoint(self.out, self.step, self.full_model, self.tokenizer, optimizer, state,
                               self.config.to_dict(), keep=self.config.keep_checkpoints)


class _NoWorkers:
    """The Ray worker pool where there is none (no ``rollout_workers``, or a rank other than 0)."""

    last_stats: dict[str, float] = {}

    def collect(self, questions: Sequence[Any], group_size: int, seed: int = 0) -> None:
        return None

    def push_weights(self, model: Any) -> None:
        """No worker holds a copy."""

    def shutdown(self) -> None:
        """No worker to stop."""


# ---------------------------------------------------------------------- metrics


def rollout_metrics(groups: Sequence[Sequence[Episode]], rows: Sequence[Row],
                    rules: dict[str, RoleRule] | None = None) -> dict[str, float]:
    """Stable metric names (PITFALLS 4-5: searches and invalid turns are the health signals).
    ``rules``: the run's role rules (default: Stage II, ``opd``); ``reward/<role>`` for each
    role they name, ``teacher/kl`` on the Teacher-scored tokens of roles without a KL term."""
    rules = rules if rules is not None else rules_for("team", "opd")
    eps = [ep for g in groups for ep in g]
    n = len(eps)
    metrics = {
        "team/em": sum(ep.team_em for ep in eps) / n,
        "team/final_em": sum(ep.final_em for ep in eps) / n,
        "team/searches_per_workflow": sum(ep.num_searches for ep in eps) / n,
        "team/waves_per_workflow": sum(ep.num_waves for ep in eps) / n,
        "team/invalid_rate": sum(ep.invalid_turns for ep in eps) / max(1, sum(ep.turns for ep in eps)),
        "team/output_tokens": sum(ep.output_tokens for ep in eps) / n,
        "team/input_tokens": sum(ep.input_tokens for ep in eps) / n,
        "team/search_failures": sum(ep.search_failures for ep in eps) / n,
        **{f"team/{name}": value for name, value in outcome_signal(groups).items()},
    }
    for role in rules:
        values = [s.reward for ep in eps for s in ep.segments if s.role == role]
        if values:
            metrics[f"reward/{role}"] = float(np.mean(values))
    for tag in TAGS:
        metrics[f"tags/{tag}"] = sum(ep.tag_counts.get(tag, 0) for ep in eps) / n
    distilled = [r for r in rows if r.teacher_logp is not None and not rule_of(rules, r.role).kl]
    if distilled:  # sampled reverse KL(pi_old || pi_T) on the Searchers' tokens
        metrics["teacher/kl"] = float(np.mean(np.concatenate([r.old_logp - r.teacher_logp for r in distilled])))
    all_old = np.concatenate([r.old_logp for r in rows]) if rows else np.zeros(1)
    metrics["policy/entropy"] = float(-all_old.mean())  # Monte-Carlo estimate on sampled tokens
    return metrics


def _tensorboard(path: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional; metrics.jsonl always exists
        return None
    return SummaryWriter(str(path))
