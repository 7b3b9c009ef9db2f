"""A retrieval HTTP server speaking Search-R1's protocol, standard library only.

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
      -> 200 {"result": [[{"document": {"id": ..., "contents": "Title\\ntext"}, "score": 0.83}, ...], ...]}
         (with "return_scores": false, the default as in Search-R1, each hit is the bare document)
    GET /health     -> 200 {"status": "ok", "requests": ..., "queries": ..., "batches": ...}

Bad requests get a 4xx with ``{"error": message}``. Requests are batched across clients
(PITFALLS 7): handler threads enqueue their queries, and one worker thread takes whatever
is queued, up to ``max_batch`` queries gathered within ``batch_wait_s``, and calls
``retriever.search`` once per distinct ``topk`` in it.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from envs.retrieval.passage import Passage, Retriever

log = logging.getLogger(__name__)


class _HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Job:
    """One request's queries waiting for the worker."""

    queries: list[str]
    topk: int
    done: threading.Event = field(default_factory=threading.Event)
    result: list[list[Passage]] | None = None
    error: _HttpError | None = None


class RetrievalServer:
    """Serve ``retriever`` over HTTP on ``host:port`` (port 0 picks a free one).

    Args:
        retriever: any Retriever; called from one worker thread only.
        max_batch: most queries per ``retriever.search`` call (one request bigger than this
            is still answered in one call).
        batch_wait_s: how long the worker waits for more requests to join a batch.
        default_topk: ``topk`` when a request leaves it out (or null).
        max_topk: largest ``topk`` accepted.
        max_queries: most queries in one request.
        max_body_bytes: largest request body accepted.
        request_timeout_s: how long a handler waits for its answer before a 503.

    >>> server = RetrievalServer(retriever, port=0); port = server.start()  # doctest: +SKIP
    >>> server.stop()  # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever,
        host: str = "127.0.0.1",
        port: int = 8000,
        max_batch: int = 64,
        batch_wait_s: float = 0.003,
        default_topk: int = 3,
        max_topk: int = 100,
        max_queries: int = 1024,
        max_body_bytes: int = 4 << 20,
        request_timeout_s: float = 300.0,
    ):
        if max_batch < 1 or max_topk < 1 or max_queries < 1 or not 1 <= default_topk <= max_topk:
            raise ValueError(
                f"bad server limits: max_batch={max_batch}, default_topk={default_topk}, "
                f"max_topk={max_topk}, max_queries={max_queries}"
            )
        self.retriever = retriever
        self.host, self.port = host, port
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.default_topk = default_topk
        self.max_topk = max_topk
        self.max_queries = max_queries
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.stats = {"requests": 0, "queries": 0, "batches": 0}
        self._stats_lock = threading.Lock()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/retrieve"

    def start(self) -> int:
        """Bind, start serving and batching in background threads; return the bound port."""
        if self._httpd is not None:
            raise RuntimeError(f"the retrieval server is already running on port {self.port}")
        handler = type("Handler", (_Handler,), {"server_state": self})
        httpd = ThreadingHTTPServer((self.host, self.port), handler, bind_and_activate=False)
        httpd.daemon_threads = True
        httpd.request_queue_size = 256  # the default 5 drops connections under concurrent rollouts
        httpd.allow_reuse_address = True
        try:
            httpd.server_bind()
            httpd.server_activate()
        except OSError:
            httpd.server_close()
            raise
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._threads = [
            threading.Thread(target=self._batch_loop, name="retrieval-batcher", daemon=True),
            threading.Thread(
                target=httpd.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="retrieval-http",
                daemon=True,
            ),
        ]
        for t in self._threads:
            t.start()
        return self.port

    def stop(self) -> None:
        """Stop serving and join the threads; requests in flight get a 503."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=10)
        self._httpd, self._threads = None, []

    def __enter__(self) -> RetrievalServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the batching worker ----------------------------------------------------------------

    def _batch_loop(self) -> None:
        carry: _Job | None = None
        while True:
            job = carry if carry is not None else self._jobs.get()
            carry = None
            if job is None:
                break
            batch, n = [job], len(job.queries)
            deadline = time.monotonic() + self.batch_wait_s
            stopping = False
            while n < self.max_batch:
                try:
                    nxt = self._jobs.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    break
                if n + len(nxt.queries) > self.max_batch:
                    carry = nxt
                    break
                batch.append(nxt)
                n += len(nxt.queries)
            self._run(batch)
            if stopping:
                break
        # Answer whatever is left so no handler waits for its timeout.
        for job in ([carry] if carry else []) + _drain(self._jobs):
            job.error = _HttpError(503, "the retrieval server is shutting down")
            job.done.set()

    def _run(self, batch: list[_Job]) -> None:
        by_topk: dict[int, list[_Job]] = {}
        for job in batch:
            by_topk.setdefault(job.topk, []).append(job)
        for topk, jobs in by_topk.items():
            queries = [q for job in jobs for q in job.queries]
            try:
                results = self.retriever.search(queries, top_k=topk)
                if len(results) != len(queries):
                    raise RuntimeError(
                        f"retriever answered {len(results)} of {len(queries)} queries"
                    )
            except Exception as e:  # the worker must survive a failing retriever
                log.exception("retrieval failed")
                for job in jobs:
                    job.error = _HttpError(500, f"retrieval failed: {type(e).__name__}: {e}")
                    job.done.set()
                continue
            with self._stats_lock:
                self.stats["batches"] += 1
                self.stats["queries"] += len(queries)
            start = 0
            for job in jobs:
                job.result = results[start : start + len(job.queries)]
                start += len(job.queries)
                job.done.set()

    def submit(self, queries: list[str], topk: int) -> list[list[Passage]]:
        """Queue queries for the worker and wait for their passages (what a handler does)."""
        if not queries:
            return []
        job = _Job(queries, topk)
        self._jobs.put(job)
        if not job.done.wait(self.request_timeout_s):
            raise _HttpError(503, f"retrieval timed out after {self.request_timeout_s} s")
        if job.error is not None:
            raise job.error
        return job.result

    # -- the protocol -----------------------------------------------------------------------

    def parse_request(self, body: bytes) -> tuple[list[str], int, bool]:
        """Validate a /retrieve body; raise _HttpError(4xx, message) on anything wrong."""
        try:
            req = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _HttpError(400, f"malformed JSON: {e}") from None
        if not isinstance(req, dict):
            raise _HttpError(400, f"the body must be a JSON object, got {type(req).__name__}")
        queries = req.get("queries")
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise _HttpError(400, f"'queries' must be a list of strings, got {_short(queries)}")
        if len(queries) > self.max_queries:
            raise _HttpError(
                413, f"too many queries: {len(queries)} in one request, at most {self.max_queries}"
            )
        topk = req.get("topk")
        if topk is None:
            topk = self.default_topk
        if isinstance(topk, bool) or not isinstance(topk, int):
            raise _HttpError(400, f"'topk' must be an integer, got {_short(topk)}")
        if not 1 <= topk <= self.max_topk:
            raise _HttpError(400, f"'topk' must be in [1, {self.max_topk}], got {topk}")
        return_scores = req.get("return_scores", False)
        if not isinstance(return_scores, bool):
            raise _HttpError(
                400, f"'return_scores' must be true or false, got {_short(return_scores)}"
            )
        return queries, topk, return_scores

    def retrieve(self, body: bytes) -> dict[str, Any]:
        """Answer a /retrieve body in Search-R1's shape."""
        queries, topk, return_scores = self.parse_request(body)
        with self._stats_lock:
            self.stats["requests"] += 1
        results = self.submit(queries, topk)
        if return_scores:
            return {"result": [[_hit(p) for p in hits] for hits in results]}
        return {"result": [[_document(p) for p in hits] for hits in results]}

    def health(self) -> dict[str, Any]:
        with self._stats_lock:
            return {"status": "ok", **self.stats}


def _document(p: Passage) -> dict[str, str]:
    return {"id": p.id, "contents": p.contents}


def _hit(p: Passage) -> dict[str, Any]:
    return {"document": _document(p), "score": p.score}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _drain(q: queue.Queue) -> list:
    items = []
    while True:
        try:
            item = q.get_nowait()
        except queue.Empty:
            return [i for i in items if i is not None]
        items.append(item)


class _Handler(BaseHTTPRequestHandler):
    server_state: RetrievalServer  # set on the per-server subclass
    protocol_version = "HTTP/1.1"  # keep-alive for clients that reuse connections

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/health":
            self._reply(200, self.server_state.health())
        else:
            self._reply(
                404, {"error": f"no such path: {self.path}; use POST /retrieve or GET /health"}
            )

    def do_POST(self) -> None:
        state = self.server_state
        if self.path.split("?", 1)[0] != "/retrieve":
            self._discard_body()
            self._reply(404, {"error": f"no such path: {self.path}; use POST /retrieve"})
            return
        try:
            length = self.headers.get("Content-Length")
            if length is None:
                raise _HttpError(411, "a Content-Length header is required")
            try:
                n = int(length)
            except ValueError:
                raise _HttpError(400, f"bad Content-Length: {length!r}") from None
            if n < 0:
                raise _HttpError(400, f"bad Content-Length: {length!r}")
            if n > state.max_body_bytes:
                self.close_connection = True  # the unread body must not be parsed as a request
                raise _HttpError(413, f"body too large: {n} bytes, at most {state.max_body_bytes}")
            self._reply(200, state.retrieve(self.rfile.read(n)))
        except _HttpError as e:
            self._reply(e.status, {"error": e.message})

    def _discard_body(self) -> None:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = 0
        if 0 < n <= self.server_state.max_body_bytes:
            self.rfile.read(n)
        elif n:
            self.close_connection = True

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)
