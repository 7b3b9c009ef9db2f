"""One way to get a retriever from a setting: ``make_retriever(spec)``.

=============================  ===============================================
spec                           retriever
=============================  ===============================================
``default``                    MiniLM over the synthetic world's corpus (one per
                               process; its index cached on disk)
``http://...`` / ``https://``  :class:`RemoteRetriever`: a Search-R1-style server
anything else                  :class:`DenseRetriever` over that corpus JSONL(.gz)
=============================  ===============================================

The trainer's ``retriever`` setting, the benchmark suite's ``--corpus`` and
``--retriever-url`` and the env's default all come through here.
"""

from __future__ import annotations

import functools
import os
from typing import Any

DEFAULT = "default"


def spec_kind(spec: str | os.PathLike) -> str:
    """``"default"``, ``"url"`` or ``"corpus"``: which row of the table ``spec`` is (for a
    caller that checks a setting without building the retriever). Raises ``ValueError``
    for an empty spec."""
    spec = os.fspath(spec)
    if not spec.strip():
        raise ValueError(f"retriever spec {spec!r}: give 'default', a corpus JSONL path or an http(s) URL")
    if spec == DEFAULT:
        return "default"
    return "url" if spec.startswith(("http://", "https://")) else "corpus"


def make_retriever(spec: str | os.PathLike = DEFAULT, **kwargs: Any) -> Any:
    """The retriever ``spec`` names (table above). ``kwargs`` go to the retriever's class
    (e.g. ``timeout=`` for a URL, ``index="hnsw"`` for a corpus); ``default`` takes none.
    Raises ``ValueError`` for an empty spec, ``FileNotFoundError`` for a corpus that does
    not exist (from ``DenseRetriever``)."""
    spec = os.fspath(spec)
    kind = spec_kind(spec)
    if kind == "default":
        if kwargs:
            raise ValueError(f"the default retriever takes no settings, got {sorted(kwargs)}")
        return default_retriever()
    if kind == "url":
        from envs.retrieval.remote import RemoteRetriever

        return RemoteRetriever(spec, **kwargs)
    from envs.retrieval.dense import DenseRetriever

    return DenseRetriever(spec, **kwargs)


@functools.lru_cache(maxsize=1)
def default_retriever() -> Any:
    """MiniLM over the synthetic world's corpus, built once per process (the embeddings and
    index are cached under ``envs.paths.cache_dir``, so a later process loads them)."""
    from envs.data.synthwiki import default_world
    from envs.retrieval.dense import DenseRetriever

    return DenseRetriever(default_world().corpus)
