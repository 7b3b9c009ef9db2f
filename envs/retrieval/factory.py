"""One way to get a retriever from a setting: ``make_retriever(spec)``.

=============================  ===============================================
spec                           retriever
=============================  ===============================================
``default``                    MiniLM over the synthetic world's corpus (one per
                               process; its index cached on disk)
``words``                      :class:`~envs.retrieval.lexical.WordOverlapRetriever`
                               over the synthetic world's corpus (nothing to
                               load or encode: smoke runs, the ``tiny`` preset)
``http://...`` / ``https://``  :class:`RemoteRetriever`: a Search-R1-style server
anything else                  :class:`DenseRetriever` over that corpus JSONL(.gz)
=============================  ===============================================

The trainer's ``retriever`` setting, the benchmark suite's ``--corpus`` and
``--retriever-url`` and the env's default all come through here. The index kind
(``index=``, the trainer's ``retriever_index``) is a setting beside the spec.
"""

from __future__ import annotations

import os
from typing import Any

DEFAULT = "default"
WORDS = "words"


def spec_kind(spec: str | os.PathLike) -> str:
    """``"default"``, ``"words"``, ``"url"`` or ``"corpus"``: which row of the table ``spec``
    is (for a caller that checks a setting without building the retriever). Raises
    ``ValueError`` for an empty spec."""
    spec = os.fspath(spec)
    if not spec.strip():
        raise ValueError(f"retriever spec {spec!r}: give 'default', 'words', a corpus JSONL path or an "
                         "http(s) URL")
    if spec in (DEFAULT, WORDS):
        return spec
    return "url" if spec.startswith(("http://", "https://")) else "corpus"


def make_retriever(spec: str | os.PathLike = DEFAULT, *, index: str | None = None, progress: bool = True,
                   **kwargs: Any) -> Any:
    """The retriever ``spec`` names (table above). ``index``: a local corpus's
    (``DenseRetriever``'s ``index``; None = ``auto``), only None or ``auto`` for a URL (its
    server has chosen). ``kwargs`` go to the retriever's class (``timeout=`` for a URL,
    ``nprobe=`` for a corpus); ``default`` takes none. ``progress``: as ``DenseRetriever``'s.
    ValueError for an empty spec or an unknown index kind."""
    from envs.retrieval.dense import INDEX_KINDS

    spec = os.fspath(spec)
    kind = spec_kind(spec)
    if index is not None and index not in INDEX_KINDS:
        raise ValueError(f"retriever index {index!r}: expected one of {INDEX_KINDS}")
    if kind == "default":
        if kwargs:
            raise ValueError(f"the default retriever takes no settings, got {sorted(kwargs)}")
        return default_retriever(index or "auto", progress=progress)
    if kind == "words":
        if kwargs or index not in (None, "auto"):
            raise ValueError(f"the words retriever takes no settings and no index, got "
                             f"{sorted(kwargs) or f'index={index!r}'}")
        from envs.retrieval.lexical import WordOverlapRetriever

        return WordOverlapRetriever()
    if kind == "url":
        if index not in (None, "auto"):
            raise ValueError(f"retriever index {index!r} with the server {spec}: a server chooses its "
                             "own index (python -m envs.retrieval serve --index ...)")
        from envs.retrieval.remote import RemoteRetriever

        return RemoteRetriever(spec, **kwargs)
    from envs.retrieval.dense import DenseRetriever

    return DenseRetriever(spec, index=index or "auto", progress=progress, **kwargs)


_DEFAULTS: dict[str, Any] = {}


def default_retriever(index: str = "auto", *, progress: bool = True) -> Any:
    """MiniLM over the synthetic world's corpus, built once per process and index kind (the
    embeddings and index are cached under ``envs.paths.cache_dir``, so a later process
    loads them). ``auto`` is flat at the world's size. ``progress``: whether the first build
    in a process says that it encodes the corpus (when nothing is cached yet)."""
    if index not in _DEFAULTS:
        from envs.data.synthwiki import default_world
        from envs.retrieval.dense import DenseRetriever

        _DEFAULTS[index] = DenseRetriever(default_world().corpus, index=index, progress=progress)
    return _DEFAULTS[index]
