"""Search-R1 compatibility, both ways, against a reference written from Search-R1's published
``search_r1/search/retrieval_server.py`` (PeterGriffinJin/Search-R1; its response-building
logic re-stated here, not copied):

- its request model is ``queries: List[str]; topk: Optional[int] = None;
  return_scores: bool = False`` (pydantic, lax mode); ``if not request.topk`` -> ``--topk``;
- the corpus is ``datasets.load_dataset("json", ...)``, an Arrow table read by
  ``pyarrow.json``: one column per key seen in any row, null where a row lacks it; a
  document is ``corpus[int(idx)]``, that table's row;
- the dense answer is ``{"result": [[{"document": doc, "score": score}, ...], ...]}`` with
  ``scores`` from faiss's float32 array via ``.tolist()``; FastAPI renders the dict;
- its BM25 retriever over an index that stores the documents answers
  ``{"title": first line stripped of '"', "text": the other lines, "contents": contents}``
  (no id); over a plain index it answers the table's rows; its rerank server answers the
  ``"title"\\ncontents`` string as the document.

Our server must send the same bytes for the same corpus rows and ranking; our client must
read every one of those shapes.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pyarrow.json as pa_json  # noqa: E402  # what datasets.load_dataset("json") reads with
import pytest  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.encoders import jsonable_encoder  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from envs.retrieval import Passage, RemoteRetriever, RetrievalServer  # noqa: E402

ROWS = [
    {
        "id": "0",
        "contents": '"Evan Morris"\nEvan Morris Evan L. Morris (January 26, 1977 – July 9, 2015) '
        "was a lobbyist for Genentech.",
    },
    {"id": "1", "contents": '"Café ""Le Dôme"""\nA café in Paris, 中文 text and ünïcode.'},
    {"id": "2", "contents": "No title line in this passage about deserts", "url": "https://x.org"},
    {"contents": '"Tokyo"\nTokyo is the capital of Japan.\nA second line.', "id": "3"},
    {"id": "4", "contents": '"Sahara"\nThe Sahara is a "hot" desert.', "url": None},
]
QUERY = "Tokyo capital desert"


def rank(query: str, k: int) -> tuple[list[int], list[float]]:
    """A deterministic stand-in for e5 + faiss: word overlap, as float32 scores (faiss's)."""
    words = set(query.lower().split())
    sims = np.array(
        [
            len(words & set(r["contents"].lower().split())) / 10 + i / 1000
            for i, r in enumerate(ROWS)
        ],
        dtype=np.float32,
    )
    order = np.argsort(-sims, kind="stable")[:k]
    return order.tolist(), sims[order].tolist()


class RankingRetriever:
    """Our Retriever over the same rows and ranking (``corpus_source`` like DenseRetriever's)."""

    def __init__(self, corpus_source: str | None = None):
        self.corpus_source = corpus_source

    def search(self, queries, top_k=3):
        out = []
        for q in queries:
            idxs, scores = rank(q, top_k)
            out.append(
                [Passage.from_row(ROWS[i], score=s) for i, s in zip(idxs, scores, strict=True)]
            )
        return out


# -- the reference: Search-R1's server, re-stated ---------------------------------------------


class SearchR1QueryRequest(BaseModel):
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def searchr1_table(path: Path) -> list[dict]:
    return pa_json.read_json(path).to_pylist()  # what datasets.load_dataset("json") holds


def searchr1_result(request: dict, table: list[dict], default_topk: int = 3) -> dict:
    req = SearchR1QueryRequest.model_validate(request)
    topk = req.topk or default_topk
    result = []
    for q in req.queries:
        idxs, scores = rank(q, topk)
        docs = [table[i] for i in idxs]
        if req.return_scores:
            result.append([{"document": d, "score": s} for d, s in zip(docs, scores, strict=True)])
        else:  # Search-R1 itself fails here (it unpacks one list into two); the intended shape
            result.append(docs)
    return {"result": result}


def fastapi_bytes(content: dict) -> bytes:
    """What FastAPI writes for a dict returned by an endpoint with no response model."""
    return JSONResponse(jsonable_encoder(content)).body


def bm25_stored_document(contents: str) -> dict:
    lines = contents.split("\n")
    return {"title": lines[0].strip('"'), "text": "\n".join(lines[1:]), "contents": contents}


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "wiki.jsonl"
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS), encoding="utf-8"
    )
    return path


def post_raw(url: str, payload: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, resp.read()


@contextlib.contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 in a thread; yield its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


REQUESTS = [
    {"queries": [QUERY, "Evan Morris lobbyist", "café Paris"], "topk": 3, "return_scores": True},
    {"queries": [QUERY], "topk": "2", "return_scores": "true"},
    {"queries": [QUERY], "topk": 0, "return_scores": 1},
    {"queries": [QUERY], "topk": None, "return_scores": True, "unknown": [1]},
    {"queries": [QUERY, QUERY], "return_scores": "yes"},
    {"queries": [QUERY], "topk": 5, "return_scores": True},
    {"queries": [], "return_scores": True},
    {"queries": [QUERY], "topk": 2},
]


# -- our server -> Search-R1's bytes ----------------------------------------------------------


@pytest.mark.parametrize("source", ["file", "rows"])
def test_our_server_sends_search_r1_bytes(corpus_file, source):
    table = searchr1_table(corpus_file)
    # The reference table is the rows as stored, plus the columns other rows have.
    assert table[0] == {**ROWS[0], "url": None}
    assert table[3] == {"id": "3", "contents": ROWS[3]["contents"], "url": None}
    if source == "file":
        server = RetrievalServer(RankingRetriever(str(corpus_file)), port=0)
    else:
        server = RetrievalServer(RankingRetriever(), port=0, documents=ROWS)
    with server:
        for request in REQUESTS:
            status, body = post_raw(server.url, request)
            assert status == 200
            assert body == fastapi_bytes(searchr1_result(request, table)), request
    hit = json.loads(body)["result"][0][0]
    assert hit == table[3]  # return_scores false: the bare document


def test_search_r1_client_reads_the_same_text_from_our_server(corpus_file):
    """Search-R1's generation loop formats hits as ``Doc i(Title: <first line>) <rest>``:
    the model sees wiki-18's quotes, so ours must keep them."""

    def passages2string(hits: list[dict]) -> str:  # search_r1/llm_agent/generation.py
        out = ""
        for i, hit in enumerate(hits):
            lines = hit["document"]["contents"].split("\n")
            out += f"Doc {i + 1}(Title: {lines[0]}) {chr(10).join(lines[1:])}\n"
        return out

    with RetrievalServer(RankingRetriever(str(corpus_file)), port=0) as server:
        _, body = post_raw(
            server.url, {"queries": ["Evan Morris lobbyist"], "topk": 1, "return_scores": True}
        )
    assert passages2string(json.loads(body)["result"][0]) == (
        'Doc 1(Title: "Evan Morris") Evan Morris Evan L. Morris (January 26, 1977 – July 9, 2015) '
        "was a lobbyist for Genentech.\n"
    )


# -- Search-R1's servers -> our client --------------------------------------------------------


def searchr1_app(table: list[dict]) -> FastAPI:
    app = FastAPI()

    def hits(request: SearchR1QueryRequest, document) -> dict:
        result = []
        for q in request.queries:
            idxs, scores = rank(q, request.topk or 3)
            result.append(
                [
                    {"document": document(table[i]), "score": s}
                    for i, s in zip(idxs, scores, strict=True)
                ]
            )
        return {"result": result}

    @app.post("/dense/retrieve")
    def dense(request: SearchR1QueryRequest):
        return hits(request, lambda row: row)

    @app.post("/bm25-stored/retrieve")
    def bm25_stored(request: SearchR1QueryRequest):
        return hits(request, lambda row: bm25_stored_document(row["contents"]))

    @app.post("/rerank/retrieve")
    def rerank(request: SearchR1QueryRequest):
        return hits(request, lambda row: row["contents"])

    @app.post("/title-text/retrieve")
    def title_text(request: SearchR1QueryRequest):
        def doc(row):
            d = bm25_stored_document(row["contents"])
            return {"title": d["title"], "text": d["text"]}

        return hits(request, doc)

    @app.post("/bare/retrieve")
    def bare(request: SearchR1QueryRequest):
        return {
            "result": [[table[i] for i in rank(q, request.topk or 3)[0]] for q in request.queries]
        }

    return app


def test_our_client_reads_every_search_r1_shape(corpus_file):
    queries = [QUERY, "Evan Morris lobbyist"]
    expected = RankingRetriever().search(queries, top_k=3)
    with serve(searchr1_app(searchr1_table(corpus_file))) as base:
        dense = RemoteRetriever(f"{base}/dense/retrieve").search(queries, top_k=3)
        assert dense == expected  # ids, titles (quotes parsed), texts and scores
        assert dense[0][0] == Passage(
            "3", "Tokyo", "Tokyo is the capital of Japan.\nA second line.", dense[0][0].score
        )
        for shape in ("bm25-stored", "rerank"):  # no ids
            got = RemoteRetriever(f"{base}/{shape}/retrieve").search(queries, top_k=3)
            assert got == [
                [Passage("", p.title, p.text, p.score) for p in hits] for hits in expected
            ]
        title_text = RemoteRetriever(f"{base}/title-text/retrieve").search([QUERY], top_k=2)
        assert [(p.id, p.title, p.text) for p in title_text[0]] == [
            ("", "Tokyo", "Tokyo is the capital of Japan.\nA second line."),
            ("", "Sahara", 'The Sahara is a "hot" desert.'),
        ]
        bare = RemoteRetriever(f"{base}/bare/retrieve").search([QUERY], top_k=2)
        assert [(p.id, p.title, p.score) for p in bare[0]] == [
            ("3", "Tokyo", 0.0),
            ("4", "Sahara", 0.0),
        ]


@pytest.mark.parametrize(
    "answer, message",
    [
        ({"results": []}, "'result'"),
        ({"result": "x"}, "not a list"),
        (
            {"result": [[{"document": 3, "score": 1.0}]]},
            "a document must be a JSON object or a string",
        ),
        (
            {"result": [[{"document": {"id": "1"}, "score": 1.0}]]},
            "a document needs 'contents' or 'text'",
        ),
        ({"result": [[{"document": {"contents": "a"}, "score": [1]}]]}, "a score must be a number"),
        ([1, 2], "unexpected shape"),
    ],
)
def test_our_client_refuses_other_shapes_with_a_retrieval_error(answer, message):
    from envs.retrieval import RetrievalError

    app = FastAPI()

    @app.post("/retrieve")
    def retrieve():
        return answer

    with serve(app) as base:
        with pytest.raises(RetrievalError, match=message):
            RemoteRetriever(base, retries=0).search(["q"])
