"""The performance suite: what mopd's machinery costs next to the limits, the minimal code
that does the same work.

    python -m benchmarks perf                       # tiny random Llama, full sizes
    python -m benchmarks perf --quick               # small sizes, under 3 minutes on 2 cores
    python -m benchmarks perf --model smollm2 --out perf-smollm2.json
    python -m benchmarks perf --quick --scaleout    # + Ray workers and torchrun ranks (issue 15)

Every timing figure is a ratio of two costs measured in the same run: the sides run
interleaved (A, B, A, B, ...) after one untimed warm-up of each, ``reps`` times, and the
figure is the median of the per-pair ratios (the range over the pairs is kept too), so a
machine shared with other jobs shifts both sides alike. torch and faiss run on one thread
for the same reason (``--threads`` to change it; recorded); the load average at the start is
recorded. Cost ratios are
``mopd / bare`` (above 1: mopd is slower by that factor); speedups are ``slow / fast``;
shares are fractions of one timed run. ``before`` sides run the code this release replaced
(full-vocabulary logits and log-softmax, a 49k float64 CDF per step, a tail decode per
row per step), kept here so that before and after are measured in one run.

The bare side of each figure is the minimal implementation of the same work:

===============================================  =========================================
figure                                           A / B
===============================================  =========================================
``decode.{greedy,sampled}.collect_vs_minimal``   ``collect`` with an HFPolicy (16 env
                                                 copies) / :func:`minimal_decode`, a
                                                 hand-written KV-cache loop over the same
                                                 prompts, batches and lengths; the same
                                                 tokens and log-probs (checked: details)
``decode.*.policy_vs_minimal``                   HFPolicy's share of that collect / it
``decode.*.before_vs_after``                     the collect with the replaced decoding
                                                 step / with this one
``decode.*.peer.generate_vs_minimal``            peer: ``model.generate`` / the minimal loop
``env.outside_policy_share``                     (collect - policy) / collect (greedy)
``env.construction_share``                       making the env copies / the collect
``collect.batched_speedup.{model,scripted}``     ``collect(max_envs=1)`` / batched collect
``collect.env_construction_share.scripted``      making the envs / the scripted collect
``learner.update_vs_fwd_bwd``                    ``Trainer.update`` / a plain forward +
                                                 ``cross_entropy`` + backward (the model's
                                                 own logits) on the same rows
``learner.update.before_vs_after``               update with full-vocabulary logits / now
``learner.memory.mb_per_trained_token``          peak memory per trained token (MB, not a
                                                 ratio; slope between two batch sizes)
``learner.memory.before_vs_after``               that figure before / after
``learner.memory.update_vs_fwd_bwd``             that figure / the plain forward+backward's
``teacher.score_rows_vs_forward``                ``score_rows`` / a no-grad forward
``retrieval.flat@N.search_vs_faiss``             ``DenseRetriever.search`` / faiss alone on
                                                 precomputed query vectors, N passages
``retrieval.<kind>@N.speedup``                   flat search / ``<kind>`` search, end to end
``retrieval.<kind>@N.faiss_speedup``             the same, faiss alone
``retrieval.recall_at_3.<kind>.<corpus>``        recall@3 of ``<kind>`` against flat, MiniLM
                                                 embeddings of a real or synthetic corpus
                                                 (a fraction, not a ratio of costs)
``retrieval.batched_speedup``                    one query per call / all in one call
``scaling.<dim>=<v>.{time,input_tokens,          cost at setting v / at the smallest, for
output_tokens}``                                 G, waves, Searchers (collect), passages
``collect.ray_workers_speedup`` (``--scaleout``)  1 Ray worker's collect / 2 workers' (the
                                                 tiny base; ``benchmarks/scaleout_perf.py``)
``learner.ddp_step_ratio`` (``--scaleout``)      a learner step on 2 gloo ranks / in one
                                                 process, same global batch
===============================================  =========================================

Policies: the model-bound sections use ``--model`` (default a tiny random Llama from
``agents.models.tiny_causal_lm`` over the env's tokenizer; ``smollm2`` the real one; ``micro``
the SFT-warmed micro model); greedy, and sampled at the trainer's temperature and top-p.
Elsewhere the scripted team plays (fast, deterministic). The scaling runs use a Leader that
always dispatches every wave and every Searcher slot, so the cost follows the setting. A
random model never writes a valid turn: Leader retries, then Answerers.

The passage-count runs (100k and 1M passages) search synthetic passages whose vectors are
seeded random unit vectors, not encodings (encoding 1M passages takes hours on 2 cores; a
flat scan costs the same whatever its vectors hold, and random vectors are the hardest case
for an approximate index: their recall there is a floor, not an estimate). Recall is
measured on real embeddings instead: MiniLM over the synthetic world's corpus and over the
real corpora in ``--realdata`` (``../shared/realdata``), with their own questions; there the
IVF index is also run at the probe fraction it has at 1M passages (``nprobe=1``).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
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


INDEX_KINDS = ("flat", "hnsw", "ivf")


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
    """The model-bound rollouts run ``questions x group_size`` env copies side by side."""
    max_turn_tokens: int = 32
    """Turn budget of the model-bound rollouts (a random model always fills it)."""
    num_candidates: int = 5
    """Answerers in the model-bound rollouts."""
    rows: int = 32
    """Training rows (agent contexts from scripted episodes) for the learner sections; the
    memory slope is taken between half of them and all of them."""
    max_row_tokens: int = 1024
    queries: int = 64
    """Search queries per retrieval call."""
    scaling_questions: int = 2
    group_sizes: tuple[int, ...] = (2, 4, 8)
    waves: tuple[int, ...] = (1, 2, 3)
    searchers: tuple[int, ...] = (1, 2, 3)
    scaling_group_size: int = 2
    """G of the waves and Searchers runs."""
    corpus_sizes: tuple[int, ...] = (100_000, 1_000_000)
    """Passage counts of the flat-index runs (random vectors; see the module docstring)."""
    approximate: tuple[tuple[str, int], ...] = (("ivf", 100_000), ("hnsw", 100_000), ("ivf", 1_000_000))
    """(index kind, passages) pairs measured against flat; each size must be in ``corpus_sizes``
    (building HNSW over 100k passages takes minutes on one core, IVF seconds)."""
    recall_queries: int = 300
    """At most this many questions per corpus for recall (spread over its question list)."""
    realdata: str | None = None
    """Folder of the real corpora (``corpora/*.jsonl`` and question files) for recall; None:
    ``../shared/realdata`` beside the project when it exists; "": none."""
    seed: int = 0
    threads: int = 1
    """torch's and faiss's intra-op threads during the run (``algos.reproducible.run_threads``;
    one: two threads on busy cores wait on each other and blur the ratios)."""

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"PerfSettings.model={self.model!r}: must be one of {MODELS}")
        for name in ("reps", "questions", "group_size", "max_turn_tokens", "num_candidates", "rows",
                     "max_row_tokens", "queries", "scaling_questions", "scaling_group_size", "recall_queries",
                     "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"PerfSettings.{name}={getattr(self, name)!r}: must be >= 1")
        for name in ("group_sizes", "waves", "searchers", "corpus_sizes"):
            values = getattr(self, name)
            if len(values) < 2 or min(values) < 1:
                raise ValueError(f"PerfSettings.{name}={values!r}: give two or more settings, each >= 1")
        for kind, size in self.approximate:
            if kind not in INDEX_KINDS[1:] or size not in self.corpus_sizes:
                raise ValueError(f"PerfSettings.approximate has ({kind!r}, {size}): the kind must be "
                                 f"hnsw or ivf and the size one of corpus_sizes {self.corpus_sizes}")


PRESETS: dict[str, PerfSettings] = {
    "full": PerfSettings(),
    # under 3 minutes on 2 busy cores with the tiny model
    "quick": PerfSettings(reps=3, max_turn_tokens=8, num_candidates=2, rows=16,
                          max_row_tokens=768, queries=32, scaling_questions=1,
                          group_sizes=(2, 4), waves=(1, 2), searchers=(1, 3),
                          approximate=(("ivf", 100_000),)),
    # the smallest run that still measures every figure (tests)
    "test": PerfSettings(reps=2, questions=2, group_size=4, max_turn_tokens=4, num_candidates=1,
                         rows=4, max_row_tokens=256, queries=8, scaling_questions=1,
                         group_sizes=(1, 2), waves=(1, 2), searchers=(1, 2), scaling_group_size=1,
                         corpus_sizes=(300, 1200), approximate=(("ivf", 1200), ("hnsw", 1200)),
                         recall_queries=40, realdata=""),
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


def load_average() -> float | None:
    """The 1-minute load average (other jobs on the machine), or None where unknown."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def peak_memory(fn: Callable[[], Any], device: torch.device | None = None) -> float:
    """Bytes by which ``fn()`` raised peak memory above what was in use when it started.

    On CUDA: the allocator's peak. On a Linux CPU: the process's peak resident set
    (``VmHWM``), reset through ``/proc/self/clear_refs`` after returning freed memory to
    the OS (``malloc_trim``), so earlier peaks do not count. Elsewhere NaN."""
    import ctypes
    import gc
    import re

    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return float(torch.cuda.max_memory_allocated(device) - start)

    def status(field_name: str) -> int:
        text = Path("/proc/self/status").read_text()
        return int(re.search(rf"{field_name}:\s+(\d+) kB", text).group(1)) * 1024

    try:
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        start = status("VmRSS")
    except (OSError, AttributeError):
        return float("nan")
    fn()
    return float(status("VmHWM") - start)


class TimedPolicy:
    """Wraps a policy: seconds spent in ``act``, and (when ``record``) every call's prompts,
    the turns returned and their log-probs, for replaying the same generation elsewhere."""

    def __init__(self, policy: Any, record: bool = False):
        self.policy = policy
        self.record = record
        self.seconds = 0.0
        self.calls: list[tuple[list[np.ndarray], list[int]]] = []
        self.outputs: list[list[tuple[list[int], list[float]]]] = []

    def act(self, observations: Sequence[Observation]) -> list[Any]:
        start = time.perf_counter()
        actions = self.policy.act(observations)
        self.seconds += time.perf_counter() - start
        if self.record:
            self.calls.append(([np.asarray(o.token_ids) for o in observations],
                               [len(a.token_ids) for a in actions]))
            self.outputs.append([(list(a.token_ids), list(a.logprobs or [])) for a in actions])
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
    vectors instead of encodings (see the module docstring); queries are encoded for real.
    ``index``: the index kind built over them (HNSW and IVF are written under
    ``cache_dir``; flat is not written anywhere)."""

    def __init__(self, n: int, dim: int, seed: int = 0, index: str = "flat",
                 cache_dir: str | None = None):
        rng = np.random.default_rng(seed)
        vectors = rng.standard_normal((n, dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        self.vectors = vectors  # (n, dim)
        words = ("river", "castle", "founded", "born", "capital", "novel", "composer", "island",
                 "railway", "museum", "treaty", "harbour", "painter", "valley", "guild")
        picks = rng.integers(len(words), size=(n, 4))
        corpus = [{"id": str(i), "contents": f"Entry {i}\nEntry {i} is known for its "
                   + " ".join(words[j] for j in picks[i]) + "."} for i in range(n)]
        super().__init__(corpus, index=index, cache_dir=cache_dir)

    def _load_or_encode_passages(self) -> tuple[np.ndarray, bool]:
        return self.vectors, True

    @property
    def faiss_index(self) -> Any:
        """The faiss index ``search`` uses (for timing faiss alone on the same index)."""
        return self._index


def _cache_arg(model: Any) -> str:
    """The KV-cache keyword of ``model.forward`` (transformers >= 5.2x renamed it)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def minimal_decode(model: Any, calls: Sequence[tuple[list[np.ndarray], list[int]]], batch_size: int,
                   pad_id: int, temperature: float, top_p: float, seed: int) -> list[list[list[int]]]:
    """The limit of decoding: replay recorded policy calls with a bare KV-cache loop and the
    shared decoding step (``agents.hf.next_tokens``): the same prompts in the same
    length-sorted, left-padded batches as ``HFPolicy``, each row stopped at its recorded
    length (so a sampled replay draws the same uniforms and gives the same tokens). No stop
    strings, no per-row bookkeeping beyond that. Returns the tokens per call, per prompt."""
    from agents.hf import next_tokens, pad_batch

    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    cache_kw = _cache_arg(model)
    out_tokens: list[list[list[int]]] = []
    with torch.inference_mode():
        for prompts, lengths in calls:
            tokens_of: list[list[int]] = [[] for _ in prompts]
            order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
            for lo in range(0, len(order), batch_size):
                rows = [i for i in order[lo:lo + batch_size] if lengths[i] > 0]
                if not rows:
                    continue
                ids, mask, position = pad_batch([prompts[i] for i in rows], pad_id, "left")
                out = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True,
                            logits_to_keep=1)
                cache, logits, position = getattr(out, cache_kw), out.logits[:, -1], position[:, -1:] + 1
                while True:
                    token, _ = next_tokens(logits, temperature, top_p, generator)
                    for b, i in enumerate(rows):
                        tokens_of[i].append(int(token[b]))
                    keep = [b for b, i in enumerate(rows) if len(tokens_of[i]) < lengths[i]]
                    if not keep:
                        break
                    if len(keep) < len(rows):
                        index = torch.tensor(keep)
                        cache.reorder_cache(index)
                        token, mask, position = token[index], mask[index], position[index]
                        rows = [rows[b] for b in keep]
                    mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=-1)
                    out = model(input_ids=token[:, None], attention_mask=mask, position_ids=position,
                                use_cache=True, **{cache_kw: cache})
                    cache, logits, position = getattr(out, cache_kw), out.logits[:, -1], position + 1
            out_tokens.append(tokens_of)
    return out_tokens


def legacy_policy(policy: Any) -> Any:
    """``policy`` (an HFPolicy) with the decoding step this release replaced: a full
    log-softmax per step, the sampled token drawn from a float64 cumulative sum over the
    whole vocabulary, and the generated tail decoded for stop strings at every step."""
    from agents.hf import HFPolicy, nucleus_logprobs

    class LegacyDecoding(HFPolicy):
        def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            logits = logits.float()
            normaliser = logits.logsumexp(-1)
            if not bool(torch.isfinite(normaliser).all()):
                raise ValueError("non-finite logits")
            if self.temperature == 0:
                logp = logits.log_softmax(-1)
                tokens = logp.argmax(-1)
            else:
                logp = (logits / self.temperature if self.temperature != 1 else logits).log_softmax(-1)
                if self.top_p < 1:
                    logp = nucleus_logprobs(logp, self.top_p)
                cdf = logp.exp().double().cumsum(-1)
                total = cdf[:, -1:]
                u = torch.rand(total.shape, generator=self.generator, dtype=torch.float64)
                u = torch.minimum((u * total).clamp_min(torch.finfo(torch.float64).tiny), total)
                tokens = torch.searchsorted(cdf, u).squeeze(-1)
            return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

        def _stopped_by_string(self, generated: list[int], stops: tuple[str, ...], window: int) -> bool:
            tail = self.tokenizer.decode(generated[-window:], skip_special_tokens=False)
            return any(stop in tail for stop in stops)

    legacy = LegacyDecoding.__new__(LegacyDecoding)
    legacy.__dict__.update(policy.__dict__)
    legacy.generator = torch.Generator(device=policy.device)
    return legacy


def bare_generate(model: Any, calls: Sequence[tuple[list[np.ndarray], list[int]]], batch_size: int,
                  pad_id: int, eos_id: int, temperature: float = 0.0, top_p: float = 1.0) -> None:
    """Peer: replay recorded policy calls with ``model.generate`` (greedy, or sampled at
    ``temperature``: other draws, the same lengths): the same prompts, in the same
    length-sorted batches as ``HFPolicy``, each batch to its longest recorded turn."""
    from agents.hf import pad_batch

    sampling = ({"do_sample": False} if temperature == 0 else
                {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0})
    with torch.inference_mode():
        for prompts, lengths in calls:
            order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
            for lo in range(0, len(order), batch_size):
                chunk = order[lo:lo + batch_size]
                new = max(lengths[i] for i in chunk)
                if new == 0:
                    continue
                ids, mask, _ = pad_batch([prompts[i] for i in chunk], pad_id, "left")  # as HFPolicy does
                model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                               pad_token_id=pad_id, eos_token_id=eos_id, **sampling)


def plain_fwd_bwd(model: Any, ids: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor) -> None:
    """The plain way to train on these tokens: the model's own logits at the predicting
    positions, ``cross_entropy``, backward."""
    from agents.hf import position_ids_of

    model.zero_grad(set_to_none=True)
    predictors = torch.zeros_like(targets)
    predictors[:, :-1] = targets[:, 1:]
    position = position_ids_of(mask)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position,
                   logits_to_keep=predictors).logits  # (N, V)
    torch.nn.functional.cross_entropy(logits.float(), ids[targets], reduction="sum").backward()


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


def model_rollouts(bench: Bench, temperature: float, top_p: float = 1.0) -> None:
    """Decoding with the model: collect (this release's decoding step and the replaced one)
    against the minimal KV-cache loop on the same prompts and lengths, ``model.generate`` as
    a peer; greedy (``temperature=0``) also batched against one env copy at a time."""
    from agents.collect import collect
    from agents.hf import HFPolicy

    s = bench.settings
    mode = "greedy" if temperature == 0 else "sampled"
    questions = bench.pick(s.questions)
    env_fn = bench.env_fn(max_turn_tokens=s.max_turn_tokens, max_waves=1,
                          num_candidates=s.num_candidates)
    policy = HFPolicy(bench.model, bench.tokenizer, temperature=temperature, top_p=top_p,
                      max_new_tokens=s.max_turn_tokens, batch_size=16, seed=s.seed)
    before = legacy_policy(policy)
    pad = bench.tokenizer.pad_token_id if bench.tokenizer.pad_token_id is not None else policy.eos_token_id
    recorded = TimedPolicy(policy, record=True)  # the warm-up round's batched collect

    def run(which: Any, max_envs: int | None) -> Trial:
        def trial() -> dict[str, float]:
            which.generator.manual_seed(s.seed)  # every round draws the same tokens
            timed = recorded if which is policy and max_envs is None and not recorded.calls else TimedPolicy(which)
            make = TimedEnvFn(env_fn)
            groups = collect(make, timed, questions, s.group_size, seed=s.seed, max_envs=max_envs)
            return {"policy": timed.seconds, "construct": make.seconds,
                    "output_tokens": sum(ep.output_tokens for g in groups for ep in g)}
        return trial

    def minimal() -> None:
        minimal_decode(bench.model, recorded.calls, policy.batch_size, pad, temperature, top_p, s.seed)

    trials = {"collect": run(policy, None), "before": run(before, None), "minimal": minimal,
              "generate": lambda: bare_generate(bench.model, recorded.calls, policy.batch_size, pad,
                                                policy.eos_token_id, temperature, top_p)}
    if mode == "greedy":
        trials["sequential"] = run(policy, 1)
    t = interleaved(trials, s.reps)
    # the limit generated exactly what the policy generated
    replay = minimal_decode(bench.model, recorded.calls, policy.batch_size, pad, temperature, top_p, s.seed)
    got = [[tokens for tokens, _ in call_out] for call_out in recorded.outputs]
    mismatched = sum(a != b for call_a, call_b in zip(got, replay) for a, b in zip(call_a, call_b))
    copies = len(questions) * s.group_size
    bench.details[f"decode.{mode}"] = {
        "env_copies": copies, "temperature": temperature, "top_p": top_p,
        "policy_calls": len(recorded.calls), "turns": sum(len(lengths) for _, lengths in recorded.calls),
        "output_tokens": sum(sum(lengths) for _, lengths in recorded.calls),
        "turns_differing_from_minimal_loop": int(mismatched),
        "output_tokens_before": t["before.output_tokens"][-1],
        **({"output_tokens_sequential": t["sequential.output_tokens"][-1]} if mode == "greedy" else {})}
    if mismatched:
        bench.log(f"  warning: {mismatched} turns differ between the policy and the minimal loop")
    what = f"{copies} env copies, {mode}" + (f" at temperature {temperature}" if temperature else "")
    bench.add(f"decode.{mode}.collect_vs_minimal", figure(
        t["collect"], t["minimal"], f"collect (HFPolicy) / minimal KV-cache loop, same prompts and tokens, {what}"))
    bench.add(f"decode.{mode}.policy_vs_minimal", figure(
        t["collect.policy"], t["minimal"], "HFPolicy.act time inside that collect / minimal loop"))
    bench.add(f"decode.{mode}.before_vs_after", figure(
        t["before"], t["collect"], "collect with the replaced decoding step / with this one"))
    bench.add(f"decode.{mode}.before_collect_vs_minimal", figure(
        t["before"], t["minimal"], "collect with the replaced decoding step / minimal loop"))
    bench.add(f"decode.{mode}.peer.generate_vs_minimal", figure(
        t["generate"], t["minimal"], "peer: model.generate on the same prompts and lengths / minimal loop"))
    if mode != "greedy":
        return
    outside = [a - p for a, p in zip(t["collect"], t["collect.policy"])]
    bench.add("env.outside_policy_share", figure(
        outside, t["collect"], "(collect - policy) / collect: env, collector, env construction"))
    bench.add("env.construction_share", figure(
        t["collect.construct"], t["collect"], f"making the {copies} envs inside collect / collect"))
    bench.add("collect.batched_speedup.model", figure(
        t["sequential"], t["collect"], f"collect max_envs=1 / batched, {copies} copies, HFPolicy"))


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


@contextlib.contextmanager
def full_vocabulary_logits():
    """The learner's log-probs as before this release: every trained token's logits at once."""
    import agents.hf

    saved = agents.hf.LOGIT_CHUNK_ELEMENTS
    agents.hf.LOGIT_CHUNK_ELEMENTS = 0
    try:
        yield
    finally:
        agents.hf.LOGIT_CHUNK_ELEMENTS = saved


def learner(bench: Bench) -> None:
    """Trainer.update against a plain forward + cross_entropy + backward (time and peak
    memory per trained token, before and after chunked log-probs), and score_rows against
    a no-grad forward."""
    from agents.collect import collect
    from agents.scripted import ScriptedPolicy
    from algos.advantages import AdvantageContext
    from algos.batch import Row, pad_rows, rows_from_episodes, score_rows
    from algos.config import TrainConfig
    from algos.roles import assign_advantages
    from algos.trainer import Trainer

    s = bench.settings
    groups = collect(bench.env_fn(), ScriptedPolicy(seed=s.seed), bench.pick(2), 2, seed=s.seed)
    every = rows_from_episodes(groups, s.max_row_tokens)
    rows = every[:: max(1, len(every) // s.rows)][: s.rows]  # Leader, Searcher and Answerer rows
    pad = bench.tokenizer.pad_token_id if bench.tokenizer.pad_token_id is not None else 0
    device = next(bench.model.parameters()).device
    with tempfile.TemporaryDirectory(prefix="mopd-perf-") as out:
        config = TrainConfig(stage="team", teacher=None, searcher_signal="outcome", kl_coef=0.0,
                             model=s.model, out_dir=out, group_size=2, seed=s.seed,
                             train_datasets=("nq",), val_datasets=("nq",), val_per_dataset=1)
        trainer = Trainer(config, progress=False, model=bench.model, tokenizer=bench.tokenizer,
                          retriever=bench.retriever)
        for row, logp in zip(rows, score_rows(bench.model, rows, pad_id=pad)):
            row.old_logp = logp
        assign_advantages(rows, trainer.rules, AdvantageContext(groups=groups, beta=config.beta))
        for row in rows:  # scripted rows may hold all-zero advantages; the cost is the same
            row.trained = True
        ids, mask, targets = (t.to(device) for t in pad_rows(rows, pad))
        tokens = int(targets.sum())

        def update_before(batch: list[Any] = rows) -> None:
            with full_vocabulary_logits():
                trainer.update(batch)

        bench.model.train()
        t = interleaved({
            "update": call(trainer.update, rows),
            "update_before": update_before,
            "fwd_bwd": call(plain_fwd_bwd, bench.model, ids, mask, targets),
            "score": call(score_rows, bench.model, rows, max_tokens=config.max_tokens_per_batch, pad_id=pad),
            "forward": call(bare_forward, bench.model, ids, mask, targets),
        }, s.reps)

        # Peak memory per trained token: the slope between the rows as they are and the same
        # rows with every token trained, so the context (the decoder's activations,
        # attention) and what does not grow at all (gradients, AdamW's moments) drop out.
        dense = [Row(r.token_ids, np.ones_like(r.mask), r.segment, r.episode, r.group) for r in rows]
        for row, logp in zip(dense, score_rows(bench.model, dense, pad_id=pad)):
            row.old_logp = logp
            row.advantages = np.linspace(-1.0, 1.0, len(logp))
        sides = {"after": trainer.update, "before": update_before,
                 "fwd_bwd": lambda rs: plain_fwd_bwd(bench.model, *(x.to(device) for x in pad_rows(rs, pad)))}
        memory: dict[str, dict[str, float]] = {}
        for name, fn in sides.items():
            fn(dense)  # warm-up: allocations that persist (optimizer state) happen here
            # the lower of two peaks: what else the process allocates meanwhile only adds to one
            p1, p2 = (min(peak_memory(lambda fn=fn, rs=rs: fn(rs), device) for _ in range(2)) for rs in (rows, dense))
            n1, n2 = tokens, sum(r.num_targets for r in dense)
            memory[name] = {"peak_mb_generated_tokens": p1 / 2**20, "peak_mb_every_token": p2 / 2**20,
                            "trained_tokens": [n1, n2], "mb_per_trained_token": (p2 - p1) / max(1, n2 - n1) / 2**20}
        bench.model.zero_grad(set_to_none=True)
        bench.model.eval()
        if trainer.writer is not None:
            trainer.writer.close()
    bench.details["learner"] = {
        "rows": len(rows), "padded_shape": list(ids.shape), "trained_tokens": tokens,
        "context_tokens": int(mask.sum()), "max_tokens_per_batch": config.max_tokens_per_batch,
        "memory": memory, "peers": {"trl": _trl_note()}}
    bench.add("learner.update_vs_fwd_bwd", figure(
        t["update"], t["fwd_bwd"], f"Trainer.update / plain forward + cross_entropy + backward, same {len(rows)} "
        f"rows ({tokens} trained tokens); tokens/s ratio = 1 / this"))
    bench.add("learner.update.before_vs_after", figure(
        t["update_before"], t["update"], "Trainer.update with full-vocabulary logits / with chunked log-probs"))
    after, before, plain = (memory[k]["mb_per_trained_token"] for k in ("after", "before", "fwd_bwd"))
    n1, n2 = memory["after"]["trained_tokens"]
    bench.add("learner.memory.mb_per_trained_token", Figure(
        after, after, after, f"peak memory per trained token of Trainer.update, MB (slope from {n1} to {n2} "
        "trained tokens in the same rows; not a ratio)"))
    bench.add("learner.memory.before_vs_after", Figure(
        before / after, before / after, before / after,
        f"peak MB per trained token with full-vocabulary logits ({before:.3f}) / chunked ({after:.3f})"))
    bench.add("learner.memory.update_vs_fwd_bwd", Figure(
        after / plain, after / plain, after / plain,
        f"peak MB per trained token, Trainer.update / plain forward + cross_entropy + backward ({plain:.3f})"))
    bench.add("teacher.score_rows_vs_forward", figure(
        t["score"], t["forward"], "score_rows / a no-grad forward of the same rows as one padded batch"))


def _trl_note() -> str:
    """Whether the TRL peer could be run (it is not wired in; see docs/performance.md)."""
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        return "not installed: no TRL figure"
    return "installed, not measured by this suite (docs/performance.md has a measured comparison)"


def retrieval(bench: Bench, dim: int, queries: list[str]) -> None:
    """Search at 100k and 1M passages (random vectors): DenseRetriever against faiss alone
    on precomputed query vectors, flat against the approximate kinds (end to end and faiss
    alone), query batching, and cost against passage count. Then recall on real embeddings."""
    import gc

    s = bench.settings
    sizes = sorted(s.corpus_sizes)
    flat_times: dict[int, list[float]] = {}
    random_recall: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="mopd-perf-index-") as cache:
        for n in sizes:
            start = time.perf_counter()
            flat = SyntheticRetriever(n, dim, seed=s.seed, index="flat")
            bench.details.setdefault("retrieval_build_s", {})[f"flat@{n}"] = round(time.perf_counter() - start, 1)
            q = np.ascontiguousarray(flat.encoder.encode(  # (Q, dim), as search encodes them
                [flat.query_prefix + x for x in queries], batch_size=flat.batch_size,
                normalize_embeddings=True, convert_to_numpy=True), dtype=np.float32)
            trials: dict[str, Trial] = {"search": call(flat.search, queries, 3),
                                        "faiss": call(flat.faiss_index.search, q, 3)}
            others = {}
            for kind, size in s.approximate:
                if size == n:
                    start = time.perf_counter()
                    others[kind] = SyntheticRetriever(n, dim, seed=s.seed, index=kind, cache_dir=cache)
                    bench.details.setdefault("retrieval_build_s", {})[f"{kind}@{n}"] = round(
                        time.perf_counter() - start, 1)
                    trials[kind] = call(others[kind].search, queries, 3)
                    trials[f"{kind}.faiss"] = call(_faiss_search, others[kind], q)
            if n == sizes[0]:
                trials["single"] = call(lambda r=flat: [r.search([x], 3) for x in queries])
            t = interleaved(trials, s.reps)
            flat_times[n] = t["search"]
            bench.add(f"retrieval.flat@{n}.search_vs_faiss", figure(
                t["search"], t["faiss"], f"DenseRetriever.search / faiss alone on precomputed query vectors, "
                f"{len(queries)} queries, {n} passages (random vectors), flat"))
            exact = [[p.row for p in hits] for hits in flat.search(queries, 3)]
            for kind, r in others.items():
                bench.add(f"retrieval.{kind}@{n}.speedup", figure(
                    t["search"], t[kind], f"flat search / {kind} search, end to end, {n} passages (random vectors)"))
                bench.add(f"retrieval.{kind}@{n}.faiss_speedup", figure(
                    t["faiss"], t[f"{kind}.faiss"], f"faiss flat / faiss {kind}, {n} passages (random vectors)"))
                random_recall[f"{kind}@{n}"] = recall_at(exact, [[p.row for p in h] for h in r.search(queries, 3)])
            if n == sizes[0]:
                bench.add("retrieval.batched_speedup", figure(
                    t["single"], t["search"], f"{len(queries)} calls of one query / one call of "
                    f"{len(queries)}, {n} passages"))
            del flat, others, trials
            gc.collect()
    bench.details["retrieval_recall_at_3_random_vectors"] = random_recall  # a floor: no structure
    for n in sizes[1:]:
        bench.add(f"scaling.corpus={n}.time", figure(
            flat_times[n], flat_times[sizes[0]], f"flat search time over {n} passages / over {sizes[0]} "
            f"(linear: {n / sizes[0]:.2f}; measured in separate rounds)"))
    real_recall(bench)


def _faiss_search(retriever: SyntheticRetriever, q: np.ndarray) -> None:
    """faiss alone, with the search parameters ``retriever.search`` passes."""
    import faiss

    index = retriever.faiss_index
    if retriever.index_kind == "hnsw":
        index.search(q, 3, params=faiss.SearchParametersHNSW(efSearch=max(retriever.ef_search, 3)))
    elif retriever.index_kind == "ivf":
        index.search(q, 3, params=faiss.SearchParametersIVF(nprobe=min(retriever.nprobe, index.nlist)))
    else:
        index.search(q, 3)


def recall_at(exact: Sequence[Sequence[int]], found: Sequence[Sequence[int]]) -> float:
    """Mean over queries of |found ∩ exact| / |exact| (recall@k against the exact top k)."""
    return float(np.mean([len(set(e) & set(f)) / max(1, len(e)) for e, f in zip(exact, found, strict=True)]))


def realdata_root(setting: str | None) -> Path | None:
    """The real-corpus folder: the setting, or ``../shared/realdata`` beside the project."""
    if setting == "":
        return None
    root = Path(setting) if setting else Path(__file__).resolve().parents[2] / "shared" / "realdata"
    return root if (root / "corpora").is_dir() else None


def real_recall(bench: Bench) -> None:
    """Recall@3 of HNSW and IVF against flat on real embeddings: MiniLM over the synthetic
    world's corpus and over the real corpora, each with its own questions. IVF runs at its
    default ``nprobe`` and at ``nprobe=1`` (the fraction of lists it probes at 1M passages)."""
    from envs.data.synthwiki import default_world

    s = bench.settings
    sets: dict[str, tuple[Any, list[str]]] = {
        "synthetic": (default_world().corpus, [q.question for q in bench.questions])}
    root = realdata_root(s.realdata)
    if root is not None:
        def questions(*files: str) -> list[str]:
            return [json.loads(line)["question"] for f in files if (root / f).is_file()
                    for line in (root / f).read_text().splitlines() if line.strip()]

        sets["hotpotqa_2wiki_dev"] = (str(root / "corpora" / "hotpotqa_2wiki_dev.jsonl"),
                                      questions("hotpotqa/dev.jsonl", "2wikimultihopqa/dev.jsonl"))
        sets["musique_train"] = (str(root / "corpora" / "musique_train.jsonl"), questions("musique/train.jsonl"))
    details = {}
    for name, (corpus, qs) in sets.items():
        if isinstance(corpus, str) and not Path(corpus).is_file():
            continue
        qs = qs[:: max(1, len(qs) // s.recall_queries)][: s.recall_queries]
        flat = DenseRetriever(corpus, index="flat")
        exact = [[p.row for p in hits] for hits in flat.search(qs, 3)]
        for label, kwargs in (("hnsw", {"index": "hnsw"}), ("ivf", {"index": "ivf"}),
                              ("ivf_nprobe1", {"index": "ivf", "nprobe": 1})):
            r = DenseRetriever(corpus, **kwargs)
            value = recall_at(exact, [[p.row for p in hits] for hits in r.search(qs, 3)])
            details[f"{label}.{name}"] = {"passages": len(flat), "queries": len(qs), "index": r.index_kind,
                                          "recall_at_3": value}
            bench.add(f"retrieval.recall_at_3.{label}.{name}", Figure(
                value, value, value, f"recall@3 of {r.index_kind}{' nprobe=1' if 'nprobe' in kwargs else ''} "
                f"against flat, MiniLM, {len(flat)} passages, {len(qs)} questions (a fraction)"))
    bench.details["retrieval_recall_real"] = details


def scaling(bench: Bench) -> None:
    """Rollout cost against G, waves and Searchers (passage count: in :func:`retrieval`)."""
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
        from algos.models import load_model as load_trainer_model
        from algos.presets import prepare_model

        return load_trainer_model(prepare_model("micro"))
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")


def run_perf(settings: PerfSettings, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every section; returns ``{"meta", "figures", "details"}`` (JSON-ready). torch and
    faiss run on ``settings.threads`` threads meanwhile (restored afterwards)."""
    from algos.reproducible import run_threads

    with run_threads(settings.threads):
        return _run_perf(settings, log)


def _run_perf(settings: PerfSettings, log: Callable[[str], None]) -> dict[str, Any]:
    from algos.config import TrainConfig
    from envs.retrieval.factory import default_retriever
    from envs.search_team import default_questions

    start = time.perf_counter()
    load = load_average()
    n = settings.threads
    train = TrainConfig(teacher="base")  # the trainer's sampling settings
    log(f"perf: model={settings.model} reps={settings.reps} torch and faiss threads={n} (--threads N "
        f"to change; one gives the stablest timings), load average {load} on {os.cpu_count()} cores")
    model, tokenizer = load_model(settings.model)
    model.eval()
    bench = Bench(settings, model, tokenizer, default_retriever(), list(default_questions()), log)
    dim = bench.retriever.encoder.encode(["dimension"]).shape[1]
    pool = [q.question for q in bench.questions]
    queries = [pool[i % len(pool)] for i in range(0, settings.queries * 7, 7)]
    sections = [("decoding, greedy", lambda: model_rollouts(bench, 0.0)),
                (f"decoding, sampled at the trainer's temperature {train.temperature}",
                 lambda: model_rollouts(bench, train.temperature, train.top_p)),
                ("rollouts with the scripted team", lambda: scripted_rollouts(bench)),
                ("learner update, memory and teacher scoring", lambda: learner(bench)),
                ("retrieval", lambda: retrieval(bench, dim, queries)),
                ("scaling", lambda: scaling(bench))]
    seconds = {}
    for title, section in sections:
        log(f"{title} ...")
        t0 = time.perf_counter()
        section()
        seconds[title] = round(time.perf_counter() - t0, 1)
        log(f"  ({seconds[title]:.0f} s)")
    bench.details["section_seconds"] = seconds
    meta = {"model": settings.model, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer), "torch_threads": n, "faiss_threads": n,
            "torch": torch.__version__, "settings": asdict(settings),
            "load_average_start": load, "load_average_end": load_average(), "cpu_count": os.cpu_count(),
            "wall_s": time.perf_counter() - start,
            "method": "A/B interleaved after one warm-up each; median of per-pair ratios"}
    return {"meta": meta, "figures": {k: asdict(v) for k, v in bench.figures.items()},
            "details": bench.details}


def add_scaleout(result: dict[str, Any], settings: PerfSettings, log: Callable[[str], None] = print) -> None:
    """Add issue 15's two ratios to ``result`` (figures ``collect.ray_workers_speedup`` and
    ``learner.ddp_step_ratio``, the raw measurement under ``details["scaleout"]``), measured by
    :func:`benchmarks.scaleout_perf.measure` with ``settings.reps`` interleaved pairs on the
    tiny preset's base (``micro``'s base for ``--model micro``). Without ray, the Ray ratio is
    skipped with one line and only the learner's is measured."""
    import importlib.util

    from benchmarks import scaleout_perf

    only = None
    if importlib.util.find_spec("ray") is None:
        log("scaleout: collect.ray_workers_speedup skipped: ray is not installed "
            "(pip install -e '.[distributed]')")
        only = "ddp"
    log("scale-out: Ray rollout workers and torchrun ranks ...")
    t0 = time.perf_counter()
    measured = scaleout_perf.measure("micro" if settings.model == "micro" else "tiny", pairs=settings.reps,
                                     only=only)
    whats = {"collect.ray_workers_speedup": ("collect.pairs", "1 Ray worker's collect / 2 workers' "
                                             "(same questions and seeds; above 1: 2 are faster)"),
             "learner.ddp_step_ratio": ("learner.pairs", "learner step on 2 gloo ranks / in 1 process "
                                        "(same global batch; below 1: 2 are faster)")}
    for name, (pairs_key, what) in whats.items():
        if name in measured:
            pairs = [float(x) for x in measured.get(pairs_key) or [measured[name]]]
            fig = Figure(float(measured[name]), min(pairs), max(pairs), what)
            result["figures"][name] = asdict(fig)
            log(f"  {name:<44} {fig.ratio:8.3f}  [{fig.low:.3f}, {fig.high:.3f}]")
    result.setdefault("details", {})["scaleout"] = measured
    result.setdefault("details", {}).setdefault("section_seconds", {})["scale-out"] = round(
        time.perf_counter() - t0, 1)


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
    parser.add_argument("--out", default="results/perf.json", help="where the JSON goes (folder made)")
    parser.add_argument("--scaleout", action="store_true",
                        help="also measure collect.ray_workers_speedup (2 Ray workers / 1; skipped without ray) "
                             "and learner.ddp_step_ratio (2 gloo ranks / 1 process), issue 15")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch/faiss intra-op threads (default 1: the stablest timings; perf.json records it)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads {args.threads}: must be >= 1")
    if args.quick and args.tiny_for_tests:
        parser.error("--quick and --tiny-for-tests are two presets; give one")
    settings = PRESETS["test" if args.tiny_for_tests else "quick" if args.quick else "full"]
    settings = replace(settings, model=args.model, threads=args.threads)
    if args.reps is not None:
        if args.reps < 1:
            parser.error(f"--reps must be >= 1, got {args.reps}")
        settings = replace(settings, reps=args.reps)
    result = run_perf(settings, log=lambda line: print(line, flush=True))
    if args.scaleout:
        add_scaleout(result, settings, log=lambda line: print(line, flush=True))
    table = markdown_table(result)
    print("\n" + table)
    wall = result["meta"]["wall_s"]
    meta = result["meta"]
    print(f"\nwall time {wall:.0f} s; torch on {settings.threads} thread(s); load average {meta['load_average_start']} -> "
          f"{meta['load_average_end']} on {meta['cpu_count']} cores; every timing figure is a ratio of two "
          f"timings taken in this run, interleaved, median of {settings.reps} pairs")
    bad = [k for k, f in result["figures"].items() if not (math.isfinite(f["ratio"]) and f["ratio"] > 0)]
    if bad:
        print(f"warning: non-finite or non-positive figures: {bad}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0
