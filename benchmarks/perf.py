"""The performance suite: what mopd's machinery costs next to the bare library calls it wraps.

    python -m benchmarks perf                       # tiny random Llama, full sizes
    python -m benchmarks perf --quick               # small sizes, a few minutes on 2 cores
    python -m benchmarks perf --model smollm2 --out perf-smollm2.json

Every figure is a ratio of two costs measured in the same run: the two sides run
interleaved (A, B, A, B, ...) after one untimed warm-up of each, ``reps`` times, and the
figure is the median of the per-pair ratios (the range over the pairs is kept too), so a
machine shared with other jobs shifts both sides alike. torch (and faiss) run on one thread
for the same reason. Cost ratios are ``mopd / bare`` (above 1: mopd is slower by that
factor); speedups are ``slow / fast``; shares are fractions of one timed run.

==========================================  ================================================
figure                                      A / B
==========================================  ================================================
``env.collect_vs_generate``                 ``collect`` with an HFPolicy (16 env copies) /
                                            ``model.generate`` on the same prompts, batches
                                            and turn lengths (both greedy: the same tokens)
``env.policy_vs_generate``                  the HFPolicy's share of that collect / generate
``env.outside_policy_share``                (collect - policy) / collect: env, collector,
                                            env construction
``env.construction_share``                  making the env copies inside that collect / it
``collect.batched_speedup.model``           ``collect(max_envs=1)`` / ``collect`` (all copies
                                            in one policy batch), HFPolicy
``collect.batched_speedup.scripted``        the same with the scripted team and MiniLM
``collect.env_construction_share.scripted`` making the envs / the batched scripted collect
``learner.update_vs_fwd_bwd``               ``Trainer.update`` / ``token_logprobs(...).sum()
                                            .backward()`` on the same rows (same tokens, so the
                                            inverse is the ratio of tokens/s)
``teacher.score_rows_vs_forward``           ``algos.batch.score_rows`` / a no-grad forward of
                                            the same rows as one padded batch
``retrieval.search_vs_bare``                ``DenseRetriever.search`` / ``encode`` + faiss
``retrieval.batched_speedup``               one query per call / all queries in one call
``scaling.<dim>=<v>.{time,input_tokens,     cost at setting v / cost at the smallest setting,
output_tokens}``                            for G, waves, Searchers per wave (collect) and
                                            corpus size (search)
==========================================  ================================================

Policies: the model-bound sections (1-4) use ``--model`` (default a tiny random Llama from
``agents.models.tiny_causal_lm`` over the env's tokenizer; ``smollm2`` the real one; ``micro``
the SFT-warmed micro model); elsewhere the policy is not what is measured and the scripted
team plays (fast, deterministic). The scaling runs use a Leader that always dispatches
every wave and every Searcher slot, so the cost follows the setting. A random model never
writes a valid turn, so its episodes hold no searches: Leader retries, then Answerers.

The corpus-size runs search synthetic passages whose vectors are seeded random unit vectors
(encoding 16k passages takes minutes on 2 cores; a flat index costs the same whatever its
vectors hold); the queries are encoded for real and ``search`` is ``DenseRetriever``'s own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from agents.base import Observation  # noqa: E402
from envs import protocol as P  # noqa: E402
from envs.retrieval.dense import DenseRetriever  # noqa: E402

MODELS = ("tiny", "smollm2", "micro")


@dataclass(frozen=True)
class PerfSettings:
    """The sizes of one perf run (see ``PRESETS``)."""

    model: str = "tiny"
    """``tiny`` (random Llama, hidden 64, 2 layers, the env's 49k vocabulary), ``smollm2``
    or ``micro``."""
    reps: int = 5
    """Timed A/B pairs per figure, after one untimed warm-up of each side."""
    questions: int = 4
    group_size: int = 4
    """Sections 1-2 run ``questions x group_size`` env copies side by side."""
    max_turn_tokens: int = 32
    """Turn budget of the model-bound rollouts (a random model always fills it)."""
    num_candidates: int = 5
    """Answerers in the model-bound rollouts."""
    rows: int = 32
    """Training rows (agent contexts from scripted episodes) for sections 3-4."""
    max_row_tokens: int = 1024
    queries: int = 64
    """Search queries per retrieval call."""
    scaling_questions: int = 2
    group_sizes: tuple[int, ...] = (2, 4, 8)
    waves: tuple[int, ...] = (1, 2, 3)
    searchers: tuple[int, ...] = (1, 2, 3)
    scaling_group_size: int = 2
    """G of the waves and Searchers runs."""
    corpus_sizes: tuple[int, ...] = (1000, 4000, 16000)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"PerfSettings.model={self.model!r}: must be one of {MODELS}")
        for name in ("reps", "questions", "group_size", "max_turn_tokens", "num_candidates", "rows",
                     "max_row_tokens", "queries", "scaling_questions", "scaling_group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"PerfSettings.{name}={getattr(self, name)!r}: must be >= 1")
        for name in ("group_sizes", "waves", "searchers", "corpus_sizes"):
            values = getattr(self, name)
            if len(values) < 2 or min(values) < 1:
                raise ValueError(f"PerfSettings.{name}={values!r}: give two or more settings, each >= 1")


PRESETS: dict[str, PerfSettings] = {
    "full": PerfSettings(),
    # about 2-3 minutes on 2 busy cores with the tiny model
    "quick": PerfSettings(reps=3, max_turn_tokens=8, num_candidates=2, rows=16,
                          max_row_tokens=768, queries=32, scaling_questions=1),
    # the smallest run that still measures every figure (tests)
    "test": PerfSettings(reps=2, questions=2, group_size=4, max_turn_tokens=4, num_candidates=1,
                         rows=4, max_row_tokens=256, queries=8, scaling_questions=1,
                         group_sizes=(1, 2), waves=(1, 2), searchers=(1, 2), scaling_group_size=1,
                         corpus_sizes=(200, 800)),
}


# ---------------------------------------------------------------------- measuring


@dataclass
class Figure:
    """One ratio: the median over the timed pairs, and their range."""

    ratio: float
    low: float
    high: float
    what: str
    a_median: float | None = None
    """Median of side A (seconds, or a count), for context only: absolute figures on a
    shared machine are noise."""
    b_median: float | None = None


def figure(a: Sequence[float], b: Sequence[float], what: str) -> Figure:
    """The median and range of ``a[i] / b[i]`` over paired runs."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need paired runs, got {len(a)} and {len(b)}")
    ratios = [x / y if y > 0 else float("inf") for x, y in zip(a, b)]
    return Figure(statistics.median(ratios), min(ratios), max(ratios), what,
                  statistics.median(a), statistics.median(b))


Trial = Callable[[], "dict[str, float] | None"]


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Trial:
    """A trial that calls ``fn(*args, **kwargs)`` and reports nothing but its time."""

    def trial() -> None:
        fn(*args, **kwargs)

    return trial


def interleaved(trials: dict[str, Trial], reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run the trials in turn (A, B, C, A, B, C, ...), ``warmup`` untimed rounds then ``reps``
    timed ones. Returns each trial's wall seconds per timed round under its name, and any
    number it returns (``{"policy": 1.2}``) under ``name.key``."""
    out: dict[str, list[float]] = {name: [] for name in trials}
    for r in range(warmup + reps):
        for name, trial in trials.items():
            start = time.perf_counter()
            extra = trial() or {}
            elapsed = time.perf_counter() - start
            if r >= warmup:
                out[name].append(elapsed)
                for key, value in extra.items():
                    out.setdefault(f"{name}.{key}", []).append(float(value))
    return out


class TimedPolicy:
    """Wraps a policy: seconds spent in ``act``, and (when ``record``) every call's prompts
    and the lengths of the turns returned, for replaying the same generation elsewhere."""

    def __init__(self, policy: Any, record: bool = False):
        self.policy = policy
        self.record = record
        self.seconds = 0.0
        self.calls: list[tuple[list[np.ndarray], list[int]]] = []

    def act(self, observations: Sequence[Observation]) -> list[Any]:
        start = time.perf_counter()
        actions = self.policy.act(observations)
        self.seconds += time.perf_counter() - start
        if self.record:
            self.calls.append(([np.asarray(o.token_ids) for o in observations],
                               [len(a.token_ids) for a in actions]))
        return actions


class TimedEnvFn:
    """Wraps an ``env_fn``: seconds spent making envs (``collect`` makes its copies on every
    call, as the trainer does every step)."""

    def __init__(self, env_fn: Callable[[], Any]):
        self.env_fn = env_fn
        self.seconds = 0.0

    def __call__(self) -> Any:
        start = time.perf_counter()
        env = self.env_fn()
        self.seconds += time.perf_counter() - start
        return env


# ---------------------------------------------------------------------- the pieces measured


class FullBudgetTeam:
    """The scripted team, except that the Leader dispatches every Searcher slot in every
    wave it has (cycling the scripted Leader's sub-tasks, or the question), so a rollout's
    cost follows ``max_waves`` and ``max_searchers``."""

    def __init__(self, seed: int = 0):
        from agents.scripted import ScriptedPolicy

        self.scripted = ScriptedPolicy(seed=seed)

    def act(self, observations: Sequence[Observation]) -> list[str]:
        return [self._leader(o) if o.role == P.LEADER else self.scripted.act([o])[0] for o in observations]

    def _leader(self, obs: Observation) -> str:
        """Reads the Leader's ``info`` (waves left, Searcher slots, question), never its prompt."""
        info = obs.info
        turn = self.scripted.act([obs])[0]
        if info["waves_left"] <= 0:
            return turn  # it selects when no wave is left
        slots = info["max_searchers"]
        parsed = P.parse_leader(turn, len(info["reports"]), slots)
        tasks = list(parsed.subtasks) or [info["question"].strip()]
        return "".join(f"<subtask>{tasks[i % len(tasks)]}</subtask>" for i in range(slots))


class SyntheticRetriever(DenseRetriever):
    """``DenseRetriever`` over ``n`` synthetic passages whose vectors are seeded random unit
    vectors instead of encodings (see the module docstring); queries are encoded for real."""

    def __init__(self, n: int, dim: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        vectors = rng.standard_normal((n, dim)).astype(np.float32)
        self.vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)  # (n, dim)
        words = ("river", "castle", "founded", "born", "capital", "novel", "composer", "island",
                 "railway", "museum", "treaty", "harbour", "painter", "valley", "guild")
        picks = rng.integers(len(words), size=(n, 12))
        corpus = [{"id": str(i), "contents": f"Entry {i}\nEntry {i} is known for its "
                   + " ".join(words[j] for j in picks[i]) + "."} for i in range(n)]
        super().__init__(corpus)  # a flat index over given vectors: nothing is cached

    def _load_or_encode_passages(self) -> tuple[np.ndarray, bool]:
        return self.vectors, True


def bare_generate(model: Any, calls: Sequence[tuple[list[np.ndarray], list[int]]], batch_size: int,
                  pad_id: int, eos_id: int) -> None:
    """Replay recorded policy calls with ``model.generate`` (greedy): the same prompts, in
    the same length-sorted batches as ``HFPolicy``, each batch to its longest recorded turn."""
    with torch.inference_mode():
        for prompts, lengths in calls:
            order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
            for lo in range(0, len(order), batch_size):
                chunk = order[lo:lo + batch_size]
                new = max(lengths[i] for i in chunk)
                if new == 0:
                    continue
                width = max(len(prompts[i]) for i in chunk)
                ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for b, i in enumerate(chunk):  # left padding, as HFPolicy does
                    ids[b, width - len(prompts[i]):] = torch.from_numpy(prompts[i])
                    mask[b, width - len(prompts[i]):] = 1
                model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, pad_token_id=pad_id, eos_token_id=eos_id)


def bare_forward(model: Any, ids: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor) -> None:
    """No-grad forward of one padded batch: the decoder over every token, the output layer
    at the positions that predict a target."""
    predictors = torch.zeros_like(targets)
    predictors[:, :-1] = targets[:, 1:]
    with torch.inference_mode():
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        model.get_output_embeddings()(hidden[predictors])  # (N, V)


# ---------------------------------------------------------------------- the suite


@dataclass
class Bench:
    """What every section shares: the model, the env's parts, the settings."""

    settings: PerfSettings
    model: Any
    tokenizer: Any
    retriever: Any
    questions: list[Any]
    log: Callable[[str], None]
    figures: dict[str, Figure] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def pick(self, n: int) -> list[Any]:
        """``n`` questions spread over the pool (every style of the synthetic world)."""
        step = max(1, len(self.questions) // n)
        return list(self.questions[::step][:n])

    def env_fn(self, **kwargs: Any) -> Callable[[], Any]:
        from envs import env_fn

        return env_fn(tokenizer=self.tokenizer, retriever=self.retriever, questions=self.questions[:1], **kwargs)

    def add(self, name: str, fig: Figure) -> None:
        self.figures[name] = fig
        self.log(f"  {name:<44} {fig.ratio:8.3f}  [{fig.low:.3f}, {fig.high:.3f}]")


def model_rollouts(bench: Bench) -> None:
    """Sections 1-2 with the model: collect batched and sequential, and bare generate."""
    from agents.collect import collect
    from agents.hf import HFPolicy

    s = bench.settings
    questions = bench.pick(s.questions)
    env_fn = bench.env_fn(max_turn_tokens=s.max_turn_tokens, max_waves=1,
                          num_candidates=s.num_candidates)
    policy = HFPolicy(bench.model, bench.tokenizer, temperature=0.0, max_new_tokens=s.max_turn_tokens,
                      batch_size=16, seed=s.seed)
    pad = bench.tokenizer.pad_token_id if bench.tokenizer.pad_token_id is not None else policy.eos_token_id
    recorded = TimedPolicy(policy, record=True)  # the warm-up round's batched collect

    def run(max_envs: int | None) -> Trial:
        def trial() -> dict[str, float]:
            timed = recorded if max_envs is None and not recorded.calls else TimedPolicy(policy)
            make = TimedEnvFn(env_fn)
            groups = collect(make, timed, questions, s.group_size, seed=s.seed, max_envs=max_envs)
            episodes = [ep for g in groups for ep in g]
            return {"policy": timed.seconds, "construct": make.seconds,
                    "output_tokens": sum(ep.output_tokens for ep in episodes)}
        return trial

    t = interleaved({"batched": run(None), "sequential": run(1),
                     "generate": lambda: bare_generate(bench.model, recorded.calls, policy.batch_size,
                                                       pad, policy.eos_token_id)}, s.reps)
    copies = len(questions) * s.group_size
    bench.details["model_rollouts"] = {
        "env_copies": copies, "policy_calls": len(recorded.calls),
        "turns": sum(len(lengths) for _, lengths in recorded.calls),
        "output_tokens": sum(sum(lengths) for _, lengths in recorded.calls),
        "output_tokens_sequential": t["sequential.output_tokens"][-1]}
    outside = [a - p for a, p in zip(t["batched"], t["batched.policy"])]
    bench.add("env.collect_vs_generate", figure(
        t["batched"], t["generate"], "collect (HFPolicy, all copies batched) / model.generate, same prompts and lengths"))
    bench.add("env.policy_vs_generate", figure(
        t["batched.policy"], t["generate"], "HFPolicy.act time inside that collect / model.generate"))
    bench.add("env.outside_policy_share", figure(
        outside, t["batched"], "(collect - policy) / collect: env, collector, env construction"))
    bench.add("env.construction_share", figure(
        t["batched.construct"], t["batched"], f"making the {copies} envs inside collect / collect"))
    bench.add("collect.batched_speedup.model", figure(
        t["sequential"], t["batched"], f"collect max_envs=1 / batched, {copies} copies, HFPolicy"))


def scripted_rollouts(bench: Bench) -> None:
    """Section 2 with the scripted team and the dense retriever, and env construction."""
    from agents.collect import collect
    from agents.scripted import ScriptedPolicy

    s = bench.settings
    questions = bench.pick(s.questions)
    env_fn = bench.env_fn()
    policy = ScriptedPolicy(seed=s.seed)
    copies = len(questions) * s.group_size

    def run(max_envs: int | None) -> Trial:
        def trial() -> dict[str, float]:
            make = TimedEnvFn(env_fn)
            collect(make, policy, questions, s.group_size, seed=s.seed, max_envs=max_envs)
            return {"construct": make.seconds}
        return trial

    t = interleaved({"batched": run(None), "sequential": run(1)}, s.reps)
    bench.add("collect.batched_speedup.scripted", figure(
        t["sequential"], t["batched"], f"collect max_envs=1 / batched, {copies} copies, scripted team + MiniLM"))
    bench.add("collect.env_construction_share.scripted", figure(
        t["batched.construct"], t["batched"], f"making the {copies} envs inside the batched scripted collect / it"))


def learner(bench: Bench) -> None:
    """Sections 3-4: Trainer.update and score_rows against bare forward(+backward) passes."""
    from agents.collect import collect
    from agents.hf import token_logprobs
    from agents.scripted import ScriptedPolicy
    from algos.batch import pad_rows, rows_from_episodes, score_rows
    from algos.config import TrainConfig
    from algos.trainer import Trainer, assign_advantages

    s = bench.settings
    groups = collect(bench.env_fn(), ScriptedPolicy(seed=s.seed), bench.pick(2), 2, seed=s.seed)
    every = rows_from_episodes(groups, s.max_row_tokens)
    rows = every[:: max(1, len(every) // s.rows)][: s.rows]  # Leader, Searcher and Answerer rows
    pad = bench.tokenizer.pad_token_id if bench.tokenizer.pad_token_id is not None else 0
    with tempfile.TemporaryDirectory(prefix="mopd-perf-") as out:
        config = TrainConfig(stage="team", teacher=None, searcher_signal="outcome", kl_coef=0.0,
                             model=s.model, out_dir=out, group_size=2, seed=s.seed,
                             train_datasets=("nq",), val_datasets=("nq",), val_per_dataset=1)
        trainer = Trainer(config, progress=False, model=bench.model, tokenizer=bench.tokenizer,
                          retriever=bench.retriever)
        for row, logp in zip(rows, score_rows(bench.model, rows, pad_id=pad)):
            row.old_logp = logp
        assign_advantages(rows, groups, config)
        ids, mask, targets = pad_rows(rows, pad)
        tokens = int(targets.sum())
        bench.details["learner"] = {
            "rows": len(rows), "padded_shape": list(ids.shape), "trained_tokens": tokens,
            "context_tokens": int(mask.sum()), "max_tokens_per_batch": config.max_tokens_per_batch}

        def fwd_bwd() -> None:
            bench.model.zero_grad(set_to_none=True)
            token_logprobs(bench.model, ids, mask, targets).sum().backward()

        bench.model.train()
        t = interleaved({
            "update": call(trainer.update, rows),
            "fwd_bwd": fwd_bwd,
            "score": call(score_rows, bench.model, rows, max_tokens=config.max_tokens_per_batch, pad_id=pad),
            "forward": call(bare_forward, bench.model, ids, mask, targets),
        }, s.reps)
        bench.model.zero_grad(set_to_none=True)
        bench.model.eval()
        if trainer.writer is not None:
            trainer.writer.close()
    bench.add("learner.update_vs_fwd_bwd", figure(
        t["update"], t["fwd_bwd"], f"Trainer.update / token_logprobs(...).sum().backward(), same {len(rows)} rows "
        f"({tokens} trained tokens); tokens/s ratio = 1 / this"))
    bench.add("teacher.score_rows_vs_forward", figure(
        t["score"], t["forward"], "score_rows / a no-grad forward of the same rows as one padded batch"))


def retrieval(bench: Bench, retrievers: dict[int, SyntheticRetriever], queries: list[str]) -> None:
    """Section 5: DenseRetriever.search against the encoder plus faiss, and query batching."""
    import faiss

    s = bench.settings
    size = max(retrievers)
    retriever = retrievers[size]
    index = faiss.IndexFlatIP(retriever.vectors.shape[1])
    index.add(retriever.vectors)
    encoder = retriever.encoder

    def bare() -> None:
        q = encoder.encode(queries, batch_size=retriever.batch_size, normalize_embeddings=True,
                           convert_to_numpy=True)
        index.search(np.ascontiguousarray(q, dtype=np.float32), 3)

    t = interleaved({"search": call(retriever.search, queries, 3), "bare": bare,
                     "single": call(lambda: [retriever.search([q], 3) for q in queries])}, s.reps)
    bench.add("retrieval.search_vs_bare", figure(
        t["search"], t["bare"], f"DenseRetriever.search / encode + faiss, {len(queries)} queries, {size} passages"))
    bench.add("retrieval.batched_speedup", figure(
        t["single"], t["search"], f"{len(queries)} calls of one query / one call of {len(queries)}"))


def scaling(bench: Bench, retrievers: dict[int, SyntheticRetriever], queries: list[str]) -> None:
    """Section 6: rollout cost against G, waves and Searchers; search cost against corpus size."""
    from agents.collect import collect

    s = bench.settings
    questions = bench.pick(s.scaling_questions)
    team = FullBudgetTeam(seed=s.seed)
    dims = {"group_size": [(g, {}, g) for g in s.group_sizes],
            "waves": [(w, {"max_waves": w}, s.scaling_group_size) for w in s.waves],
            "searchers": [(k, {"max_searchers": k}, s.scaling_group_size) for k in s.searchers]}
    def rollout(env_fn: Callable[[], Any], group: int) -> Trial:
        def trial() -> dict[str, float]:
            eps = [ep for g in collect(env_fn, team, questions, group, seed=s.seed) for ep in g]
            return {"input_tokens": sum(ep.input_tokens for ep in eps),
                    "output_tokens": sum(ep.output_tokens for ep in eps),
                    "searches": sum(ep.num_searches for ep in eps),
                    "waves": sum(ep.num_waves for ep in eps), "episodes": len(eps)}
        return trial

    for dim, settings in dims.items():
        t = interleaved({str(v): rollout(bench.env_fn(**kw), g) for v, kw, g in settings}, s.reps)
        base = str(settings[0][0])
        bench.details[f"scaling.{dim}"] = {
            str(v): {k.split(".", 1)[1]: t[k][-1] for k in t if k.startswith(f"{v}.")} for v, _, _ in settings}
        for value, _, _ in settings[1:]:
            v = str(value)
            bench.add(f"scaling.{dim}={v}.time", figure(
                t[v], t[base], f"collect time at {dim}={v} / at {base} (linear: {value / settings[0][0]:.2f})"))
            for key in ("input_tokens", "output_tokens"):
                bench.add(f"scaling.{dim}={v}.{key}", figure(
                    t[f"{v}.{key}"], t[f"{base}.{key}"], f"{key} at {dim}={v} / at {base}"))
    sizes = sorted(retrievers)
    t = interleaved({str(n): call(retrievers[n].search, queries, 3) for n in sizes}, s.reps)
    for n in sizes[1:]:
        bench.add(f"scaling.corpus={n}.time", figure(
            t[str(n)], t[str(sizes[0])], f"search time over {n} passages / over {sizes[0]} "
            f"(linear: {n / sizes[0]:.2f})"))


def load_model(name: str) -> tuple[Any, Any]:
    """(model, tokenizer) for ``--model``."""
    if name == "tiny":
        from agents.models import tiny_causal_lm
        from envs.search_team import default_tokenizer

        tokenizer = default_tokenizer()
        return tiny_causal_lm(len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id), tokenizer
    if name == "smollm2":
        from agents.models import load_causal_lm

        return load_causal_lm("smollm2")
    if name == "micro":  # the micro recipe's base: built once, then loaded by path
        from algos.config import prepare_model
        from algos.models import load_model as load_trainer_model

        return load_trainer_model(prepare_model("micro"))
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")


def run_perf(settings: PerfSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every section; returns ``{"meta", "figures", "details"}`` (JSON-ready). torch and
    faiss run on one thread meanwhile (restored afterwards)."""
    import faiss

    from envs.search_team import default_questions, default_retriever

    start = time.perf_counter()
    threads, faiss_threads = torch.get_num_threads(), faiss.omp_get_max_threads()
    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    try:
        log(f"perf: model={settings.model} reps={settings.reps} torch threads=1 (set for stable timings), "
            f"faiss threads=1")
        model, tokenizer = load_model(settings.model)
        model.eval()
        bench = Bench(settings, model, tokenizer, default_retriever(), list(default_questions()), log)
        dim = bench.retriever.encoder.encode(["dimension"]).shape[1]
        retrievers = {n: SyntheticRetriever(n, dim, seed=settings.seed)
                      for n in settings.corpus_sizes}
        pool = [q.question for q in bench.questions]
        queries = [pool[i % len(pool)] for i in range(0, settings.queries * 7, 7)]
        sections = [("1-2. rollouts with the model", lambda: model_rollouts(bench)),
                    ("2. rollouts with the scripted team", lambda: scripted_rollouts(bench)),
                    ("3-4. learner update and teacher scoring", lambda: learner(bench)),
                    ("5. retrieval", lambda: retrieval(bench, retrievers, queries)),
                    ("6. scaling", lambda: scaling(bench, retrievers, queries))]
        seconds = {}
        for title, section in sections:
            log(f"{title} ...")
            t0 = time.perf_counter()
            section()
            seconds[title] = round(time.perf_counter() - t0, 1)
            log(f"  ({seconds[title]:.0f} s)")
        bench.details["section_seconds"] = seconds
        meta = {"model": settings.model, "parameters": sum(p.numel() for p in model.parameters()),
                "vocab_size": len(tokenizer), "torch_threads": 1, "faiss_threads": 1,
                "torch": torch.__version__, "settings": asdict(settings),
                "wall_s": time.perf_counter() - start,
                "method": "A/B interleaved after one warm-up each; median of per-pair ratios"}
    finally:
        torch.set_num_threads(threads)
        faiss.omp_set_num_threads(faiss_threads)
    return {"meta": meta, "figures": {k: asdict(v) for k, v in bench.figures.items()},
            "details": bench.details}


def markdown_table(result: dict[str, Any]) -> str:
    """The figures as a Markdown table (ratio, range over the pairs, what A / B is)."""
    lines = ["| figure | ratio | range | A / B |", "|---|---:|---:|---|"]
    for name, f in result["figures"].items():
        lines.append(f"| {name} | {f['ratio']:.3f} | {f['low']:.3f}-{f['high']:.3f} | {f['what']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks perf", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", choices=MODELS)
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes on 2 cores)")
    parser.add_argument("--tiny-for-tests", action="store_true", help="the smallest sizes (tests)")
    parser.add_argument("--reps", type=int, default=None, help="timed A/B pairs per figure")
    parser.add_argument("--out", default="perf.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    if args.quick and args.tiny_for_tests:
        parser.error("--quick and --tiny-for-tests are two presets; give one")
    settings = PRESETS["test" if args.tiny_for_tests else "quick" if args.quick else "full"]
    settings = replace(settings, model=args.model)
    if args.reps is not None:
        if args.reps < 1:
            parser.error(f"--reps must be >= 1, got {args.reps}")
        settings = replace(settings, reps=args.reps)
    result = run_perf(settings, log=lambda line: print(line, flush=True))
    table = markdown_table(result)
    print("\n" + table)
    wall = result["meta"]["wall_s"]
    print(f"\nwall time {wall:.0f} s; torch on 1 thread; every figure is a ratio of two timings "
          f"taken in this run, interleaved, median of {settings.reps} pairs")
    bad = [k for k, f in result["figures"].items() if not (math.isfinite(f["ratio"]) and f["ratio"] > 0)]
    if bad:
        print(f"warning: non-finite or non-positive figures: {bad}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0
