"""A retrieval HTTP server speaking Search-R1's protocol, on FastAPI and uvicorn.

    POST /retrieve {"queries": ["q1", ...], "topk": 3, "return_scores": true}
      -> 200 {"result": [[{"document": {"id": "0", "contents": "..."}, "score": 0.83}, ...], ...]}
    POST /retrieve {"query": "q1", "topk" or "top_k": 3, ...} -> {"result": [[...]]}
    GET /health -> 200 {"status": "ok", "requests", "queries", "batches", "rejected", "dropped"}

docs/retrieval_server.md is the reference: Search-R1 compatibility, the limits and their
status codes, and the batching: each request is validated alone (a bad one fails alone,
with ``{"error": "<one line>"}``), then served a query at a time by a :class:`FairQueue`
(``retriever.search`` once per distinct ``topk``, in a worker thread: PITFALLS 7); what is
still queued of a request whose client disconnected is dropped (``dropped`` counts them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from envs.data.items import iter_lines
from envs.protocol import clean_text, short_repr
from envs.retrieval.corpus import JsonlCorpus
from envs.retrieval.fair_queue import FairQueue, Job, Segment
from envs.retrieval.passage import Passage, Retriever

log = logging.getLogger(__name__)
_SHUTTING_DOWN = "the retrieval server is shutting down"


class QueryRequest(BaseModel):
    """Search-R1's request model, field for field (its coercions are pydantic's lax mode)."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class SingleQueryRequest(BaseModel):
    """The one-query request of SkyRL-gym's SearchEnv (``{"query", "topk", "return_scores"}``)
    and PettingLLMs (``top_k``)."""

    query: str
    topk: int | None = None
    top_k: int | None = None
    return_scores: bool = False


class _HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class CorpusDocuments:
    """The corpus rows as stored, by passage id: what Search-R1 returns as a ``document``,
    with every column any row has (null where a row lacks it), as its ``datasets`` table.

    A plain JSONL file stays on disk (a :class:`JsonlCorpus`: only offsets and the id map in
    memory); :meth:`by_row` wraps a lazy corpus of wiki-18 size without reading it (no id
    map, no column scan: a document is found by the Passage's ``row``, with its own keys).
    """

    def __init__(self) -> None:
        self.columns: dict[str, None] | None = {}  # an ordered set; None = each row's own
        self._index: dict[str, int] | None = {}
        self._rows: list[Mapping[str, Any]] | None = None
        self._corpus: JsonlCorpus | None = None

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> CorpusDocuments:
        """Index in-memory rows (``{"id", "contents", ...}`` or ``{"id", "title", "text"}``)."""
        docs = cls()
        docs._rows = []
        for n, row in enumerate(rows, start=1):
            docs._add(row, len(docs._rows), f"corpus row {n}")
            docs._rows.append(row)
        return docs

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> CorpusDocuments:
        """Index a JSONL(.gz) corpus; ValueError names the file and line of a malformed row."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file not found: {str(path)!r}")
        docs = cls()
        if path.suffix == ".gz":
            docs._rows = []
            for lineno, line in iter_lines(path):  # a truncated .gz: ValueError naming file and line
                if line.strip():
                    try:
                        row = json.loads(line)
                    except (ValueError, RecursionError) as e:
                        raise ValueError(f"{path}:{lineno}: malformed corpus line: {e}") from None
                    docs._add(row, len(docs._rows), f"{path}:{lineno}")
                    docs._rows.append(row)
            return docs
        docs._corpus = JsonlCorpus(path)
        for n in range(len(docs._corpus)):  # where(n) rereads the file up to n: only for an error
            docs._add(docs._corpus.row(n), n, lambda n=n: docs._corpus.where(n))
        return docs

    @classmethod
    def by_row(cls, corpus: JsonlCorpus) -> CorpusDocuments:
        """Documents of a lazy corpus, found by row number (nothing is read up front)."""
        docs = cls()
        docs._corpus, docs._index, docs.columns = corpus, None, None
        return docs

    def _add(self, row: Mapping[str, Any], n: int, where: str | Callable[[], str]) -> None:
        """Index ``row`` as row ``n``; ``where`` (or what it returns) names it in an error."""
        problem = ("a corpus row must be a JSON object" if not isinstance(row, Mapping)
                   else "a corpus row needs an 'id'" if row.get("id", row.get("_id")) is None else None)
        if problem:
            raise ValueError(f"{where() if callable(where) else where}: {problem}")
        pid = row.get("id", row.get("_id"))
        self._index.setdefault(str(pid), n)  # DenseRetriever refuses repeated ids
        for key in row:
            self.columns.setdefault(key)

    def document(self, pid: str, row: int | None = None) -> dict[str, Any] | None:
        """The stored row of passage ``pid`` with every corpus column, or None if unknown.
        ``row`` (the Passage's) is used where there is no id map, and only if that row's
        id is ``pid``."""
        if self._index is None:
            if row is None or not 0 <= row < len(self._corpus):
                return None
            stored = self._corpus.row(row)
            if not isinstance(stored, dict) or str(stored.get("id", stored.get("_id"))) != pid:
                return None
            return stored
        n = self._index.get(pid)
        if n is None:
            return None
        stored = self._rows[n] if self._rows is not None else self._corpus.row(n)
        return {key: stored.get(key) for key in self.columns}


def _render(content: Any) -> bytes:
    """The bytes FastAPI writes for ``content`` returned from an endpoint: its
    ``JSONResponse`` rendering (tests/envs/test_searchr1_compat.py holds the two equal)."""
    return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")


def _error_body(message: str) -> bytes:
    return _render({"error": " ".join(message.split())})  # one line, whatever the cause


def _parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except UnicodeDecodeError:
        raise _HttpError(400, "malformed JSON: the body is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise _HttpError(400, f"malformed JSON: {e}") from None
    except RecursionError:
        raise _HttpError(400, "malformed JSON: nested too deeply") from None
    except ValueError as e:  # e.g. an integer over 4300 digits
        raise _HttpError(400, f"malformed JSON: {str(e).split(';')[0]}") from None


def _validation_message(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    got = first.get("input")
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where!r}: {first['msg']}, got {short_repr(got)}{more}"


class _IdleTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing connections that hold a socket without asking anything.

    uvicorn arms its keep-alive timer only after a response, and any byte disarms it. Here
    a request head must also be complete within ``timeout_keep_alive`` of the connection
    opening (or of the previous response), however slowly its bytes trickle in, so neither
    a client that connects and sends nothing nor one that sends a header a byte at a time
    keeps a socket.
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline = self.loop.time() + self.timeout_keep_alive
        self._arm_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timer
        self._head_deadline = self.loop.time() + self.timeout_keep_alive

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # disarms the timer
        if self.conn.their_state is h11.IDLE:  # the next request head is not complete yet
            self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self.timeout_keep_alive_task is None and not self.transport.is_closing():
            self.timeout_keep_alive_task = self.loop.call_later(
                max(0.0, self._head_deadline - self.loop.time()), self.timeout_keep_alive_handler)


class RetrievalServer:
    """Serve ``retriever`` (called from one worker thread only) over HTTP on ``host:port``
    (port 0 picks a free one).

    The limits are ``serve``'s flags of the same names (docs/retrieval_server.md, "Limits":
    each one's meaning, default and status code); ``default_topk`` (Search-R1's ``--topk``)
    answers a ``topk`` left out, null or 0. ``documents``: the stored rows to answer with (a
    ``CorpusDocuments`` or rows); None = read them from ``retriever.corpus_source`` when
    that is a file, else ``{"id", "contents"}`` of the Passages.

    >>> server = RetrievalServer(retriever, port=0); port = server.start()  # doctest: +SKIP
    >>> server.stop()  # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever,
        host: str = "127.0.0.1",
        port: int = 8000,
        max_batch: int = 4,
        batch_wait_s: float = 0.003,
        default_topk: int = 3,
        max_topk: int = 100,
        max_queries: int = 1024,
        max_waiting_queries: int = 8192,
        max_body_bytes: int = 1 << 20,
        max_query_chars: int = 4096,
        keep_alive_s: float = 5.0,
        request_timeout_s: float = 300.0,
        documents: CorpusDocuments | Iterable[Mapping[str, Any]] | None = None,
    ):
        limits = dict(max_batch=max_batch, max_topk=max_topk, max_queries=max_queries,
                      max_waiting_queries=max_waiting_queries, max_body_bytes=max_body_bytes,
                      max_query_chars=max_query_chars)
        for name, value in limits.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"bad server limit: {name}={value!r} (must be a positive integer)")
        if max_waiting_queries < max_queries:
            raise ValueError(f"bad server limit: max_waiting_queries={max_waiting_queries} (must "
                             f"be at least max_queries={max_queries}, or a request of max_queries "
                             "could never be served)")
        if not 1 <= default_topk <= max_topk:
            raise ValueError(f"bad server limit: default_topk={default_topk} (must be in "
                             f"[1, {max_topk}])")
        times = dict(batch_wait_s=batch_wait_s, keep_alive_s=keep_alive_s,
                     request_timeout_s=request_timeout_s)
        for name, value in times.items():
            if not value >= 0 or value == float("inf") or (name != "batch_wait_s" and value == 0):
                raise ValueError(f"bad server setting: {name}={value!r}")
        # Every setting is an attribute of its own name (self.max_batch, self.keep_alive_s, ...).
        vars(self).update(limits, default_topk=default_topk, **times)
        self.retriever, self.host, self.port = retriever, host, port
        if documents is None:
            passages = getattr(retriever, "passages", None)
            source = getattr(retriever, "corpus_source", None)
            if isinstance(passages, JsonlCorpus):  # a lazy retriever: share its reader
                documents = CorpusDocuments.by_row(passages)
            elif isinstance(source, (str, os.PathLike)) and Path(source).is_file():
                documents = CorpusDocuments.from_file(source)
        elif not isinstance(documents, CorpusDocuments):
            documents = CorpusDocuments.from_rows(documents)
        self.documents = documents
        self.stats = {"requests": 0, "queries": 0, "batches": 0, "rejected": 0, "dropped": 0}
        self._stats_lock = threading.Lock()
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._fair = FairQueue(max_batch)
        self._arrived: asyncio.Event | None = None  # set while jobs wait in _fair
        self._full: asyncio.Event | None = None  # set when _fair holds a whole batch
        self._in_flight: list[Segment] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self.app = self._make_app()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/retrieve"

    def start(self) -> int:
        """Bind, serve and batch in background threads; return the bound port."""
        if self._uvicorn is not None:
            raise RuntimeError(f"the retrieval server is already running on port {self.port}")
        family, kind, proto, _, address = socket.getaddrinfo(self.host, self.port,
                                                             type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, http=_IdleTimeoutH11, lifespan="on", log_level="warning", access_log=False,
            timeout_keep_alive=self.keep_alive_s,  # type: ignore[arg-type]  # a float works
            timeout_graceful_shutdown=5,
            backlog=2048)  # the kernel queue; concurrent rollouts open many connections at once
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="retrieval-search")
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [sock]},
                                        name="retrieval-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._uvicorn = None
                sock.close()
                raise RuntimeError(f"the retrieval server did not start on {self.url}")
            time.sleep(0.01)
        return self.port

    def stop(self) -> None:
        """Stop serving and join the threads; requests still queued get a 503."""
        if self._uvicorn is None:
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # Answer what waits now: uvicorn would otherwise wait for those handlers, then
            # cancel them, before the lifespan's shutdown runs.
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._close_queue)
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._uvicorn, self._thread, self._executor = None, None, None

    def __enter__(self) -> RetrievalServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def health(self) -> dict[str, Any]:
        with self._stats_lock:
            return {"status": "ok", **self.stats}

    def _count(self, **increments: int) -> None:
        with self._stats_lock:
            for key, n in increments.items():
                self.stats[key] += n

    def _make_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI):
            self._fair = FairQueue(self.max_batch)
            self._arrived, self._full = asyncio.Event(), asyncio.Event()
            self._loop, self._closing = asyncio.get_running_loop(), False
            batcher = asyncio.create_task(self._batch_loop())
            try:
                yield
            finally:
                batcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await batcher
                self._close_queue()

        app = FastAPI(title="mopd retrieval server", lifespan=lifespan, docs_url=None,
                      redoc_url=None, openapi_url=None)

        @app.post("/retrieve")
        async def retrieve(request: Request) -> Response:
            try:
                job = self.parse_request(await self._read_body(request))
            except _HttpError as e:
                self._count(rejected=1)
                return _error(e.status, e.message, close=e.status in (408, 413))
            if not job.queries:
                self._count(requests=1)
                return Response(_render({"result": []}), media_type="application/json")
            if self._closing:
                return _error(503, _SHUTTING_DOWN)
            if self._fair.queued + len(job.queries) > self.max_waiting_queries:
                self._count(rejected=1)
                return _error(503, f"the server is busy: {self._fair.queued} queries waiting, at "
                                   f"most {self.max_waiting_queries}; retry later",
                              headers={"Retry-After": "1"})
            self._count(requests=1)
            job.future = asyncio.get_running_loop().create_future()
            self._enqueue(job)
            gone = asyncio.ensure_future(_disconnected(request))
            try:
                done, _ = await asyncio.wait({job.future, gone}, timeout=self.request_timeout_s,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if job.future in done:
                status, body = job.future.result()
                return Response(body, status_code=status, media_type="application/json")
            job.abandoned = True  # what is queued of it is dropped; a batch in flight skips it
            self._fair.discard(job)
            if gone in done and not gone.cancelled() and gone.result():
                self._count(dropped=1)
                return _error(499, "the client disconnected before its answer")  # read by nobody
            return _error(503, f"retrieval timed out after {self.request_timeout_s} s")

        @app.get("/health")
        async def health() -> Response:
            return Response(_render(self.health()), media_type="application/json")

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
            where = f"{request.method} {request.url.path}"
            if exc.status_code == 404:
                return _error(404, f"no such path: {where}; use POST /retrieve or GET /health")
            if exc.status_code == 405:
                return _error(405, f"{where} is not allowed; use POST /retrieve or GET /health")
            return _error(exc.status_code, str(exc.detail))

        @app.exception_handler(Exception)
        async def internal_error(request: Request, exc: Exception) -> Response:
            log.exception("retrieval server error")
            return _error(500, f"internal error: {type(exc).__name__}: {exc}")

        return app

    async def _read_body(self, request: Request) -> bytes:
        """The body, refused with a 413 as soon as it is known to exceed ``max_body_bytes``, and
        with a 408 when it stalls for ``keep_alive_s`` or takes over ``request_timeout_s``."""
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise _HttpError(400, f"bad Content-Length: {short_repr(length)}")
            if int(length) > self.max_body_bytes:
                raise _HttpError(413, f"body too large: {length} bytes, at most "
                                      f"{self.max_body_bytes}")
        chunks, size = [], 0
        stream = request.stream().__aiter__()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout_s
        while True:
            wait = min(self.keep_alive_s, deadline - loop.time())
            try:
                chunk = await asyncio.wait_for(stream.__anext__(), max(0.0, wait))
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                why = (f"took over {self.request_timeout_s} s" if loop.time() >= deadline
                       else f"stalled for {self.keep_alive_s} s")
                raise _HttpError(408, f"the request body {why}") from None
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _HttpError(413, f"body too large: over {self.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def parse_request(self, body: bytes) -> Job:
        """Validate a /retrieve body on its own; raise _HttpError(4xx, one line) if it is bad.
        Search-R1's ``queries`` wins when a body has both it and ``query``."""
        req = _parse_json(body)
        if not isinstance(req, dict):
            raise _HttpError(400, f"the body must be a JSON object, got {type(req).__name__}")
        try:
            if "query" in req and "queries" not in req:
                single = SingleQueryRequest.model_validate(req)
                parsed = QueryRequest(queries=[single.query], topk=single.topk or single.top_k,
                                      return_scores=single.return_scores)
            else:
                parsed = QueryRequest.model_validate(req)
        except ValidationError as e:
            raise _HttpError(400, _validation_message(e)) from None
        queries = parsed.queries
        if len(queries) > self.max_queries:
            raise _HttpError(413, f"too many queries: {len(queries)} in one request, at most "
                                  f"{self.max_queries}")
        for i, q in enumerate(queries):
            if len(q) > self.max_query_chars:
                raise _HttpError(413, f"query {i} too long: {len(q)} characters, at most "
                                      f"{self.max_query_chars}")
        topk = parsed.topk or self.default_topk  # Search-R1: `if not request.topk` -> default
        if not 1 <= topk <= self.max_topk:
            raise _HttpError(400, f"'topk' must be in [1, {self.max_topk}], got {topk}")
        return Job([clean_text(q) for q in queries], topk, parsed.return_scores)

    def _enqueue(self, job: Job) -> None:
        job.pieces = [None] * len(job.queries)
        self._fair.add(job)
        self._arrived.set()
        if self._fair.queued >= self.max_batch:
            self._full.set()

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        fair = self._fair
        while True:
            await self._arrived.wait()
            if fair.queued < self.max_batch and self.batch_wait_s > 0:
                self._full.clear()
                with contextlib.suppress(asyncio.TimeoutError):  # wait for more to join
                    await asyncio.wait_for(self._full.wait(), self.batch_wait_s)
            batch = fair.take()
            if fair.queued < self.max_batch:
                self._full.clear()
            if not fair.queued:
                self._arrived.clear()
            if not batch:
                continue
            self._in_flight = batch
            try:
                await loop.run_in_executor(self._executor, self._serve_batch, batch)
            except Exception as e:  # the batcher must outlive any one batch
                for job, _, _ in batch:
                    _fail(job, e)
            self._in_flight = []
            for job in _jobs_of(batch):
                if job.reply is not None:
                    fair.discard(job)  # a failed job's other queries are not searched
                    _resolve(job)

    def _close_queue(self) -> None:
        """Answer every request still waiting with a 503; refuse new ones."""
        self._closing = True
        jobs = _jobs_of(self._in_flight) + self._fair.drain()
        self._in_flight = []
        for job in jobs:
            if job.future is not None and not job.future.done():
                job.future.set_result((503, _error_body(_SHUTTING_DOWN)))

    def _serve_batch(self, batch: Sequence[Segment]) -> None:
        """Search for every segment of ``batch`` (worker thread), filling each job's pieces
        and setting the reply of each job that is complete or failed."""
        by_topk: dict[int, list[Segment]] = {}
        for seg in batch:
            if seg[0].reply is None and not seg[0].abandoned:
                by_topk.setdefault(seg[0].topk, []).append(seg)
        for topk, segs in by_topk.items():
            try:
                self._search(segs, topk)
            except Exception as e:
                if len(_jobs_of(segs)) == 1:
                    _fail(segs[0][0], e)
                    continue
                # Isolate: retry each request alone, so only those that break the retriever fail.
                for job in _jobs_of(segs):
                    try:
                        self._search([seg for seg in segs if seg[0] is job], topk)
                    except Exception as e_alone:
                        _fail(job, e_alone)

    def _search(self, segs: Sequence[Segment], topk: int) -> None:
        queries = [q for job, start, stop in segs for q in job.queries[start:stop]]
        results = self.retriever.search(queries, top_k=topk)
        if len(results) != len(queries):
            raise RuntimeError(f"the retriever answered {len(results)} of {len(queries)} queries")
        self._count(batches=1, queries=len(queries))
        i = 0
        for job, start, stop in segs:
            hits, i = results[i : i + stop - start], i + stop - start
            if job.reply is not None:
                continue
            try:
                for n, h in enumerate(hits, start=start):
                    job.pieces[n] = _render(self._hits(h, job.return_scores))
            except Exception as e:  # e.g. a NaN score, which JSON cannot carry
                job.reply = (500, _error_body(f"cannot render the answer: {type(e).__name__}: {e}"))
                continue
            job.answered += stop - start
            if job.answered == len(job.queries):
                # The bytes _render({"result": [...]}) gives, from the pieces rendered so far.
                job.reply = (200, b'{"result":[' + b",".join(job.pieces) + b"]}")
                job.pieces = []
                if self._loop is not None:  # answer now, not after the batch's other calls
                    with contextlib.suppress(RuntimeError):  # the loop closed: stop() answers
                        self._loop.call_soon_threadsafe(_resolve, job)

    def _hits(self, hits: Sequence[Passage], return_scores: bool) -> list[Any]:
        docs = [self._document(p) for p in hits]
        if return_scores:
            return [{"document": d, "score": p.score} for d, p in zip(docs, hits, strict=True)]
        return docs

    def _document(self, p: Passage) -> dict[str, Any]:
        doc = None if self.documents is None else self.documents.document(p.id, p.row)
        # Without the stored rows: the Passage's fields (wiki-18's title quotes are lost here).
        return doc if doc is not None else {"id": p.id, "contents": p.contents}


async def _disconnected(request: Request) -> bool:
    """Wait until the client of ``request`` (whose body is read) disconnects; True then.
    The server's next ASGI message for a request whose body is complete is the disconnect
    (uvicorn sends it when the connection is lost, or once the response is sent)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return True


def _resolve(job: Job) -> None:
    if job.future is not None and not job.future.done():
        job.future.set_result(job.reply)


def _jobs_of(segments: Iterable[Segment]) -> list[Job]:
    """The distinct jobs of ``segments``, in first-seen order."""
    return list({id(job): job for job, _, _ in segments}.values())


def _fail(job: Job, e: Exception) -> None:
    log.warning("retrieval failed for %d queries: %r", len(job.queries), e)
    job.reply = (500, _error_body(f"retrieval failed: {type(e).__name__}: {e}"))


def _error(status: int, message: str, close: bool = False,
           headers: Mapping[str, str] | None = None) -> Response:
    # Close after a refused body: its unread bytes must not be parsed as the next request.
    headers = {**(headers or {}), **({"connection": "close"} if close else {})} or None
    return Response(_error_body(message), status_code=status, media_type="application/json",
                    headers=headers)
