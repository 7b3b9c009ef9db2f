"""The retrieval section: ``DenseRetriever.search`` against faiss alone, flat against HNSW
and IVF, query batching and cost against passage count (over seeded random unit vectors, not
encodings: their recall is a floor), and recall@3 on MiniLM embeddings of real corpora.
docs/performance.md ("Retrieval") says why, and what the figures were.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.perf.harness import Bench, Figure, Trial, call, figure, interleaved
from envs.retrieval.dense import DenseRetriever


class SyntheticRetriever(DenseRetriever):
    """``DenseRetriever`` over ``n`` synthetic passages whose vectors are seeded random unit
    vectors instead of encodings; queries are encoded for real."""

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


def retrieval(bench: Bench, dim: int, queries: list[str]) -> None:
    """The section's figures (the module's docstring) into ``bench``."""
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
    root = Path(setting) if setting else Path(__file__).resolve().parents[3] / "shared" / "realdata"
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
