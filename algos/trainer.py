"""The MultiAgent-OPD learner, Stage I and Stage II, as one story:

1. sample questions; roll out G workflows per question with the current policy;
2. cut the Episodes into rows (one per agent context) and recompute the old log-probs;
3. score the rows with the Teacher (``algos.teacher``: Searcher tokens for OPD; Leader
   and Answerer tokens for the KL);
4. per-token advantages by role (``algos.advantages``);
5. PPO-style update with the clipped surrogate (``algos.losses``);
6. log metrics under stable names, validate, checkpoint.

All roles share one set of parameters: one model plays every agent.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.collect import collect
from agents.hf import HFPolicy, token_logprobs
from algos import advantages as A
from algos.batch import Row, batches_by_tokens, pad_rows, rows_from_episodes, score_rows, split_flat
from algos.checkpoint import latest_checkpoint, load_checkpoint, resolve_model_path, save_checkpoint
from algos.config import TrainConfig
from algos.freeze import frozen
from algos.losses import policy_loss
from algos.teacher import load_teacher, score_with_teacher
from envs.episode import Episode, question_record
from envs.protocol import TAGS


class NonFiniteLoss(RuntimeError):
    pass


def validation_path(out_dir: str | Path, step: int) -> Path:
    """Where a run's validation at ``step`` writes its per-question records (JSONL in the
    format of ``benchmarks.metrics``; step 0 is the base model)."""
    return Path(out_dir) / "validation" / f"step_{step:06d}.jsonl"


def load_model(name: str, device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
    """(model, tokenizer): ``micro`` builds (or reuses) the SFT-warmed micro model."""
    from agents.models import load_causal_lm

    if name == "micro":
        from algos.micro import build_micro_base

        name = str(build_micro_base())
    return load_causal_lm(resolve_model_path(name), dtype=dtype, device=device)


def make_retriever(spec: str) -> Any:
    from envs.search_team import default_retriever

    if spec == "default":
        return default_retriever()
    if spec.startswith(("http://", "https://")):
        from envs.retrieval import RemoteRetriever

        return RemoteRetriever(spec)
    from envs.retrieval import DenseRetriever

    return DenseRetriever(spec)


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
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        checkpoint = latest_checkpoint(self.out) if resume else None
        if resume and checkpoint is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {self.out / 'checkpoints'}")
        if not resume and (self.out / "metrics.jsonl").exists():
            raise FileExistsError(f"{self.out} already holds a run (metrics.jsonl); a new run there "
                                  "would mix its metrics into the old ones. Pass --resume to continue "
                                  "it, or give another --out")
        torch.manual_seed(cfg.seed)
        if checkpoint is not None:  # the checkpoint's weights win over any model given
            model, tokenizer = load_model(str(checkpoint), cfg.device, cfg.dtype)
        elif model is None:
            model, tokenizer = load_model(cfg.model, cfg.device, cfg.dtype)
        self.model, self.tokenizer = model, tokenizer
        self.model.train()
        # (the config allows a Teacher in Stage II only)
        self.teacher = load_teacher(cfg.teacher, cfg.model, cfg.device, cfg.dtype) if cfg.teacher else None
        self.critic = None
        if cfg.stage == "team" and cfg.searcher_signal == "critic":
            from algos.critic import PromptedCritic

            base, _ = load_model(cfg.model, cfg.device, cfg.dtype)
            self.critic = PromptedCritic(base, tokenizer)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.learning_rate,
                                           weight_decay=cfg.weight_decay)
        self.policy = HFPolicy(self.model, tokenizer, temperature=cfg.temperature, top_p=cfg.top_p,
                               max_new_tokens=cfg.max_turn_tokens, seed=cfg.seed,
                               batch_size=cfg.generation_batch_size)
        self.retriever = retriever if retriever is not None else make_retriever(cfg.retriever)
        self.train_questions = load_questions(cfg.data, cfg.train_datasets, cfg.train_split, cfg.train_per_dataset)
        self.val_questions = load_questions(cfg.data, cfg.val_datasets, cfg.val_split, cfg.val_per_dataset)
        self.rng = np.random.default_rng(cfg.seed)
        self.step = 0
        self.nonfinite_in_a_row = 0
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, self.optimizer)
            self._set_state(state)
        self.writer = _tensorboard(self.out / "tb")

    # ------------------------------------------------------------------ setup

    def env_fn(self, workflow: str | None = None, questions: Sequence[Any] | None = None):
        from envs import search_team_v0

        kwargs = dict(workflow=workflow or self.config.workflow, tokenizer=self.tokenizer,
                      retriever=self.retriever, questions=questions or self.train_questions,
                      **self.config.env_shape())
        return lambda: search_team_v0.raw_env(**kwargs)

    # ------------------------------------------------------------------ the loop

    def train(self, validate_first: bool = True) -> dict[str, Any]:
        """Run to ``config.steps``; validation avg@1 before the first step (unless told not
        to), every ``eval_every`` steps and at the end."""
        cfg = self.config
        history = []
        if self.step == 0 and validate_first:
            self._log({"val/avg@1": self.validate()}, step=0)
        bar = _bar(range(self.step, cfg.steps), self.progress, "train " + cfg.stage)
        for _ in bar:
            try:
                metrics = self.train_step()
            except NonFiniteLoss as err:
                self._log({"losses/nonfinite": 1.0, "losses/nonfinite_in_a_row": self.nonfinite_in_a_row})
                if self.nonfinite_in_a_row >= cfg.max_nonfinite:
                    raise RuntimeError(f"{self.nonfinite_in_a_row} non-finite losses in a row; "
                                       f"the last good checkpoint is {latest_checkpoint(self.out)}") from err
                continue
            if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                metrics["val/avg@1"] = self.validate()
            self._log(metrics)
            history.append(metrics)
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(em=f"{metrics['team/em']:.2f}", searches=f"{metrics['team/searches_per_workflow']:.1f}")
            if self.step % cfg.save_every == 0 or self.step == cfg.steps:
                self.save()
        return {"steps": self.step, "history": history}

    def train_step(self) -> dict[str, float]:
        """One batch of rollouts and the update on it."""
        cfg = self.config
        t0 = time.perf_counter()
        # 1. rollouts: G workflows per question, the current policy for every role
        picks = self.rng.choice(len(self.train_questions), size=cfg.questions_per_step,
                                replace=len(self.train_questions) < cfg.questions_per_step)
        questions = [self.train_questions[i] for i in picks]
        self.model.eval()
        groups = collect(self.env_fn(), self.policy, questions, cfg.group_size,
                         seed=cfg.seed + 1_000_003 * (self.step + 1))
        t1 = time.perf_counter()
        # 2. rows, with the old log-probs recomputed by the training model
        rows = rows_from_episodes(groups, cfg.max_row_tokens)
        for row, logp in zip(rows, score_rows(self.model, rows, max_tokens=cfg.max_tokens_per_batch,
                                              pad_id=self.pad_id, temperature=cfg.temperature)):
            row.old_logp = logp
        # 3. the Teacher scores the exact same token contexts
        if self.teacher is not None:
            score_with_teacher(self.teacher, rows, kl_coef=cfg.kl_coef, temperature=cfg.temperature,
                               max_tokens=cfg.max_tokens_per_batch, pad_id=self.pad_id)
        # 4. per-token advantages by role
        critic_scores = self.critic.score_rows(rows) if self.critic is not None else None
        assign_advantages(rows, groups, cfg, critic_scores)
        t2 = time.perf_counter()
        # 5. the update
        update = self.update(rows)
        t3 = time.perf_counter()
        self.step += 1
        metrics = rollout_metrics(groups, rows)
        metrics.update(update)
        tokens = sum(ep.output_tokens for g in groups for ep in g)
        metrics.update({"perf/rollout_s": t1 - t0, "perf/score_s": t2 - t1, "perf/update_s": t3 - t2,
                        "perf/generated_tokens_per_s": tokens / max(t1 - t0, 1e-9),
                        "perf/trained_tokens_per_s": update["losses/tokens"] / max(t3 - t2, 1e-9)})
        return metrics

    def update(self, rows: list[Row]) -> dict[str, float]:
        """``minibatches`` optimizer steps over the rows, gradients accumulated in chunks."""
        cfg = self.config
        trained = [r for r in rows if r.trained]
        if not trained:
            return {"losses/policy": 0.0, "losses/kl_teacher": 0.0, "losses/clip_fraction": 0.0,
                    "losses/approx_kl": 0.0, "losses/grad_norm": 0.0, "losses/tokens": 0.0}
        order = self.rng.permutation(len(trained))
        parts = [list(p) for p in np.array_split(order, min(cfg.minibatches, len(trained)))]
        sums = dict.fromkeys(("policy", "kl", "clip", "approx_kl"), 0.0)
        total_tokens = sum(int(r.mask.sum()) for r in trained)
        grad_norms = []
        self.model.train()
        with frozen(self.model):  # what the model declares frozen (config.mopd_frozen) stays put
            for part in parts:
                mb = sorted((trained[i] for i in part), key=lambda r: len(r.token_ids))
                mb_tokens = sum(int(r.mask.sum()) for r in mb)
                self.optimizer.zero_grad(set_to_none=True)
                for chunk in batches_by_tokens(mb, cfg.max_tokens_per_batch):
                    out = self._chunk_loss(chunk)
                    n = sum(int(r.mask.sum()) for r in chunk)
                    weight = n / mb_tokens if cfg.aggregation == "token-mean" else len(chunk) / len(mb)
                    if not torch.isfinite(out.loss):
                        self.optimizer.zero_grad(set_to_none=True)
                        self.nonfinite_in_a_row += 1
                        raise NonFiniteLoss(f"loss {out.loss.item()} at step {self.step}")
                    (out.loss * weight).backward()
                    for key, value in (("policy", out.policy_loss), ("kl", out.kl), ("clip", out.clip_fraction),
                                       ("approx_kl", out.approx_kl_old)):
                        sums[key] += value * n
                if cfg.freeze_embeddings:
                    self.model.get_input_embeddings().weight.grad = None
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)))
                self.optimizer.step()
        self.nonfinite_in_a_row = 0
        return {"losses/policy": sums["policy"] / total_tokens, "losses/kl_teacher": sums["kl"] / total_tokens,
                "losses/clip_fraction": sums["clip"] / total_tokens,
                "losses/approx_kl": sums["approx_kl"] / total_tokens,
                "losses/grad_norm": float(np.mean(grad_norms)), "losses/tokens": float(total_tokens)}

    def _chunk_loss(self, chunk: list[Row]):
        cfg = self.config
        device = next(self.model.parameters()).device
        ids, att, tgt = (t.to(device) for t in pad_rows(chunk, self.pad_id))
        flat = token_logprobs(self.model, ids, att, tgt, cfg.temperature)  # (N,) with graph
        cat = lambda xs: torch.as_tensor(np.concatenate(xs), dtype=flat.dtype, device=device)  # noqa: E731
        old = cat([r.old_logp for r in chunk])
        adv = cat([r.advantages for r in chunk])
        kl_rows = [r.teacher_logp is not None and r.role != "searcher" for r in chunk]
        ref = kl_mask = None
        if cfg.kl_coef > 0 and any(kl_rows):
            ref = cat([r.teacher_logp if k else r.old_logp for r, k in zip(chunk, kl_rows)])
            kl_mask = cat([np.full(int(r.mask.sum()), float(k)) for r, k in zip(chunk, kl_rows)])
        if cfg.aggregation == "sequence-mean":
            # one row per sequence: pad the flat values back into (B, T_max) rows
            pieces = [split_flat(x, chunk) for x in (flat, old, adv)]
            flat, old, adv = (torch.nn.utils.rnn.pad_sequence(p, batch_first=True) for p in pieces)
            mask = torch.nn.utils.rnn.pad_sequence([torch.ones(len(p)) for p in pieces[0]], batch_first=True)
            if ref is not None:
                ref = torch.nn.utils.rnn.pad_sequence(split_flat(ref, chunk), batch_first=True)
                kl_mask = torch.nn.utils.rnn.pad_sequence(split_flat(kl_mask, chunk), batch_first=True)
        else:
            flat, old, adv = flat[None], old[None], adv[None]
            mask = torch.ones_like(flat)
            if ref is not None:
                ref, kl_mask = ref[None], kl_mask[None]
        return policy_loss(flat, old, adv, mask, clip_eps=cfg.clip_eps, ref_logp_BT=ref, kl_mask_BT=kl_mask,
                           kl_coef=cfg.kl_coef, aggregation=cfg.aggregation)

    # ------------------------------------------------------------------ validation, logging, state

    @torch.no_grad()
    def validate(self, questions: Sequence[Any] | None = None, workflow: str | None = None) -> float:
        """avg@k on the held-out questions: the team samples at the training temperature,
        ``val_runs`` workflows per question, mean EM of the final answer. The sampler is
        seeded the same way at every validation, so base and trained models are compared
        on common random numbers. Per-question results go to :func:`validation_path`
        (``benchmarks compare`` reads them)."""
        cfg = self.config
        questions = list(questions or self.val_questions)
        if not questions:
            return float("nan")
        sampler = HFPolicy(self.model, self.tokenizer, temperature=cfg.val_temperature, top_p=cfg.top_p,
                           max_new_tokens=cfg.max_turn_tokens, seed=cfg.seed + 7,
                           batch_size=cfg.generation_batch_size)
        self.model.eval()
        groups = collect(self.env_fn(workflow, questions), sampler, questions, cfg.val_runs,
                         seed=cfg.seed + 99_991)
        self.model.train()
        records = [question_record(g) for g in groups]
        path = validation_path(self.out, self.step)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        return float(np.mean([ep.final_em for g in groups for ep in g]))

    def _log(self, metrics: dict[str, float], step: int | None = None) -> None:
        step = self.step if step is None else step
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "stage": self.config.stage, **metrics}) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(key, value, step)
            self.writer.flush()

    def save(self) -> Path:
        return save_checkpoint(self.out, self.step, self.model, self.tokenizer, self.optimizer,
                               self._get_state(), self.config.to_dict(), keep=self.config.keep_checkpoints)

    def _get_state(self) -> dict[str, Any]:
        return {"step": self.step, "nonfinite_in_a_row": self.nonfinite_in_a_row,
                "numpy_rng": self.rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(), "policy_rng": self.policy.generator.get_state()}

    def _set_state(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.nonfinite_in_a_row = int(state["nonfinite_in_a_row"])
        self.rng.bit_generator.state = state["numpy_rng"]
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        self.policy.generator.set_state(state["policy_rng"])


# ---------------------------------------------------------------------- advantages by role


def assign_advantages(rows: list[Row], groups: Sequence[Sequence[Episode]], cfg: TrainConfig,
                      critic_scores: Sequence[float] | None = None) -> None:
    """Fill ``row.advantages`` (N,) for every row, routed by role (PAPER.md section 4)."""
    by_episode = {id(ep): i for episodes in groups for i, ep in enumerate(episodes)}
    leader_adv = {g: A.leader_advantages([ep.rewards.get("leader_0", 0.0) for ep in eps])
                  for g, eps in enumerate(groups)}
    outcome_adv = {g: A.outcome_advantages([ep.team_em for ep in eps]) for g, eps in enumerate(groups)}
    searcher_reward_adv = {g: A.group_advantages([ep.rewards.get("searcher_0", 0.0) for ep in eps])
                           for g, eps in enumerate(groups)}
    answerer_adv = {id(ep): A.answerer_advantages(ep.candidate_em) for eps in groups for ep in eps}
    critic_adv = _critic_advantages(rows, critic_scores, cfg) if critic_scores is not None else {}
    for k, row in enumerate(rows):
        n = int(row.mask.sum())
        i = by_episode[id(row.episode)]
        if row.role == "leader":
            value: float | np.ndarray = leader_adv[row.group][i]
        elif row.role == "answerer":
            value = answerer_adv[id(row.episode)][int(row.segment.agent.rsplit("_", 1)[1])]
        elif cfg.stage == "teacher":  # Stage I: the Searcher's own GRPO reward
            value = searcher_reward_adv[row.group][i]
        elif cfg.searcher_signal == "opd":
            value = A.opd_advantages(row.teacher_logp, row.old_logp, np.ones(n), beta=cfg.beta)
        elif cfg.searcher_signal == "outcome":
            value = outcome_adv[row.group][i]
        elif cfg.searcher_signal == "critic":
            value = critic_adv[k]
        else:  # none: Searcher tokens carry no loss; only shared parameters move them
            value, row.trained = 0.0, False
        row.advantages = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).copy()


def _critic_advantages(rows: list[Row], scores: Sequence[float], cfg: TrainConfig) -> dict[int, float]:
    """Prompted Critic: group-relative over the Searchers of a question's workflows."""
    by_group: dict[int, list[int]] = {}
    for k, row in enumerate(rows):
        if row.role == "searcher":
            by_group.setdefault(row.group, []).append(k)
    out: dict[int, float] = {}
    for ks in by_group.values():
        rewards = [A.critic_rewards(rows[k].episode.team_em, [scores[k]], cfg.critic_em_weight)[0] for k in ks]
        for k, adv in zip(ks, A.group_advantages(rewards)):
            out[k] = float(adv)
    return out


# ---------------------------------------------------------------------- metrics


def rollout_metrics(groups: Sequence[Sequence[Episode]], rows: Sequence[Row]) -> dict[str, float]:
    """Stable metric names (PITFALLS 4-5: searches and invalid turns are the health signals)."""
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
    }
    for role in ("leader", "searcher", "answerer"):
        values = [s.reward for ep in eps for s in ep.segments if s.role == role]
        if values:
            metrics[f"reward/{role}"] = float(np.mean(values))
    for tag in TAGS:
        metrics[f"tags/{tag}"] = sum(ep.tag_counts.get(tag, 0) for ep in eps) / n
    searcher = [r for r in rows if r.role == "searcher" and r.teacher_logp is not None]
    if searcher:  # sampled reverse KL(pi_old || pi_T) on Searcher tokens
        metrics["teacher/kl"] = float(np.mean(np.concatenate([r.old_logp - r.teacher_logp for r in searcher])))
    all_old = np.concatenate([r.old_logp for r in rows]) if rows else np.zeros(1)
    metrics["policy/entropy"] = float(-all_old.mean())  # Monte-Carlo estimate on sampled tokens
    return metrics


def _tensorboard(path: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional; metrics.jsonl always exists
        return None
    return SummaryWriter(str(path))


def _bar(iterable: Any, show: bool, desc: str) -> Any:
    if not show:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, unit="step")
