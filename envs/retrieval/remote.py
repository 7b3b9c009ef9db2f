"""``RemoteRetriever``: the Retriever interface over a Search-R1-style HTTP server (ours, or
Search-R1's own servers: dense e5 + wiki-18, BM25, retrieve-and-rerank), with urllib only."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from envs.http import post_json
from envs.protocol import short_repr
from envs.retrieval.passage import Passage, check_search


class RetrievalError(RuntimeError):
    """The retrieval server could not be reached, or refused or garbled an answer."""


class RemoteRetriever:
    """Search a retrieval server speaking Search-R1's ``POST /retrieve`` protocol at ``url``
    (a bare ``http://host:port`` gets ``/retrieve`` appended). ``timeout``, ``retries`` and
    ``backoff`` are :func:`envs.http.post_json`'s (``timeout`` a deadline for each whole
    attempt); batches over ``max_queries_per_request`` are sent as several requests, in order.
    """

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_queries_per_request: int = 256,
    ):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("the retrieval url must be http(s)://host:port[/retrieve], "
                             f"got {url!r}")
        if parts.path in ("", "/"):
            url = urllib.parse.urlunsplit(parts._replace(path="/retrieve"))
        if retries < 0 or timeout <= 0 or backoff < 0 or max_queries_per_request < 1:
            raise ValueError(f"bad client settings: timeout={timeout}, retries={retries}, "
                             f"backoff={backoff}, "
                             f"max_queries_per_request={max_queries_per_request}")
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff
        self.max_queries_per_request = max_queries_per_request

    def describe(self) -> dict[str, Any]:
        """What a result file should record about this retriever (PITFALLS 11)."""
        return {"retriever": "remote", "url": self.url}

    def search(self, queries: Sequence[str], top_k: int = 3) -> list[list[Passage]]:
        """One ranked list of Passages (with scores) per query, best first."""
        check_search(queries, top_k)
        results: list[list[Passage]] = []
        step = self.max_queries_per_request
        for start in range(0, len(queries), step):
            chunk = list(queries[start : start + step])
            answer = post_json(self.url, {"queries": chunk, "topk": top_k, "return_scores": True},
                               timeout=self.timeout, retries=self.retries, backoff=self.backoff,
                               error=RetrievalError)
            results.extend(self._parse(answer, len(chunk)))
        return results

    def _parse(self, answer: Any, n_queries: int) -> list[list[Passage]]:
        try:
            result = answer["result"]
            if not isinstance(result, list) or len(result) != n_queries:
                got = (len(result) if isinstance(result, list)
                       else f"not a list but {short_repr(result)}:")
                raise ValueError(f"{got} result lists for {n_queries} queries")
            for hits in result:
                if not isinstance(hits, list):
                    raise ValueError(f"a result must be a list of hits, got {short_repr(hits)}")
            return [[_passage(hit) for hit in hits] for hits in result]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RetrievalError(f"{self.url} answered in an unexpected shape: {e}") from None


def _passage(hit: Any) -> Passage:
    """Read one hit in any shape Search-R1's servers answer with (docs/retrieval_server.md):
    ``{"document", "score"}`` or the bare document, ``{"id", "contents", ...}``, BM25's
    ``{"title", "text"[, "contents"]}`` without an id (id ``""``), or the rerank server's
    ``contents`` string; null fields count as absent. ValueError or TypeError otherwise.
    """
    score: Any = 0.0
    doc = hit
    if isinstance(hit, Mapping) and "document" in hit:
        doc, score = hit["document"], hit.get("score")
    if score is None:
        score = 0.0
    if isinstance(score, bool) or not isinstance(score, (int, float, str)):
        raise ValueError(f"a score must be a number, got {short_repr(score)}")
    if isinstance(doc, str):
        return Passage.from_contents("", doc, float(score))
    if not isinstance(doc, Mapping):
        raise ValueError(f"a document must be a JSON object or a string, got {short_repr(doc)}")
    row = {key: value for key, value in doc.items() if value is not None}
    pid = row.get("id", row.get("_id", row.get("docid", "")))
    if isinstance(pid, bool) or not isinstance(pid, (str, int, float)):
        raise ValueError(f"a document id must be a string or a number, got {short_repr(pid)}")
    if "contents" not in row and "text" not in row:
        raise ValueError(f"a document needs 'contents' or 'text', got keys {sorted(row)}")
    return Passage.from_row({**row, "id": str(pid)}, score=float(score))
