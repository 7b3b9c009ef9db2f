"""The retrieval server serves requests a query at a time, by fair queuing (issue #27.6): a
small request queued behind big ones goes into the next batch, not after the whole of them,
and the answers are the bytes one search call would give. On 127.0.0.1; no timing
assertions."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from envs.retrieval import Passage, RetrievalServer  # noqa: E402


class GatedRetriever:
    """Records the queries of every search call; each call waits for ``gate`` (bounded)."""

    def __init__(self):
        self.calls: list[list[str]] = []
        self.gate = threading.Event()
        self.lock = threading.Lock()

    def search(self, queries, top_k=3):
        with self.lock:
            self.calls.append(list(queries))
        assert self.gate.wait(30), "the test never opened the gate"
        # Scores that use every bit of a float, so a reordering or a re-rendering shows.
        return [
            [Passage(f"{q}#{i}", "T", q, (hash(q) % 10**9) / 7e9 + 1 / (i + 3)) for i in range(top_k)]
            for q in queries
        ]


def _post(url: str, payload) -> tuple[int, bytes, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def _wait_until(predicate, what: str) -> None:
    for _ in range(500):  # 10 s at most
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _send(url: str, payload, answers: dict, key: str) -> threading.Thread:
    t = threading.Thread(target=lambda: answers.__setitem__(key, _post(url, payload)), daemon=True)
    t.start()
    return t


def test_a_small_request_behind_big_ones_is_served_in_the_next_batch():
    fake = GatedRetriever()
    srv = RetrievalServer(fake, port=0, max_batch=4, batch_wait_s=0.0)
    srv.start()
    try:
        answers: dict[str, tuple] = {}
        big_a = [f"a{i}" for i in range(64)]
        big_b = [f"b{i}" for i in range(64)]
        threads = [_send(srv.url, {"queries": big_a, "topk": 2, "return_scores": True}, answers, "a")]
        _wait_until(lambda: len(fake.calls) == 1, "the first search call")  # in flight, gated
        threads.append(_send(srv.url, {"queries": big_b, "topk": 2, "return_scores": True}, answers, "b"))
        _wait_until(lambda: srv.stats["requests"] == 2, "the second big request")
        threads.append(_send(srv.url, {"queries": ["small"], "topk": 2, "return_scores": True}, answers, "c"))
        _wait_until(lambda: srv.stats["requests"] == 3, "the small request")
        fake.gate.set()
        for t in threads:
            t.join(60)
        assert fake.calls[0] == ["a0", "a1", "a2", "a3"]  # a big request is served in chunks
        # The next call takes a query of each waiting request in turn, the least served first
        # and among equals the one with the fewest left: the small one goes first, then the
        # big ones alternate.
        assert fake.calls[1] == ["small", "b0", "a4", "b1"]
        assert fake.calls[2] == ["a5", "b2", "a6", "b3"]
        assert all(len(c) <= 4 for c in fake.calls)
        assert sum(len(c) for c in fake.calls) == 129
        for key, queries in (("a", big_a), ("b", big_b), ("c", ["small"])):
            status, body, _ = answers[key]
            assert status == 200
            result = json.loads(body)["result"]
            assert [[h["document"]["id"] for h in hits] for hits in result] == [
                [f"{q}#0", f"{q}#1"] for q in queries
            ]
    finally:
        fake.gate.set()
        srv.stop()


def test_fair_queue_order_and_counts():
    from envs.retrieval.fair_queue import FairQueue
    from envs.retrieval.fair_queue import Job as _Job

    fair = FairQueue(max_batch=5)
    a, b = _Job([f"a{i}" for i in range(7)], 3, True), _Job(["b0", "b1", "b2"], 3, True)
    fair.add(a)
    assert fair.take() == [(a, 0, 5)]  # alone: a whole batch, as one segment
    fair.add(b)
    c = _Job(["c0"], 3, True)
    fair.add(c)
    assert fair.queued == 6
    # b and c arrive at a's last tag: c (one query left) first, then b (3 left) before a
    # (served further), then the two alternate.
    assert fair.take() == [(c, 0, 1), (b, 0, 1), (a, 5, 6), (b, 1, 2), (a, 6, 7)]
    assert fair.take() == [(b, 2, 3)]
    assert fair.queued == 0 and len(fair) == 0 and fair.take() == []
    d, e = _Job(["d0", "d1", "d2"], 3, True), _Job(["e0"], 3, True)
    fair.add(d)
    fair.add(e)
    fair.discard(d)
    assert fair.queued == 1 and fair.take() == [(e, 0, 1)]


@pytest.mark.parametrize("return_scores", [True, False])
def test_chunked_answers_are_the_bytes_of_one_search_call(return_scores):
    from envs.retrieval.server import _render

    fake = GatedRetriever()
    fake.gate.set()
    queries = [f"question {i} ünïcode \"quoted\"" for i in range(23)]
    whole = _render({"result": [
        [{"document": {"id": p.id, "contents": p.contents}, "score": p.score} if return_scores
         else {"id": p.id, "contents": p.contents} for p in hits]
        for hits in fake.search(queries, top_k=4)
    ]})
    bodies = []
    for max_batch in (1, 3, 64):
        srv = RetrievalServer(fake, port=0, max_batch=max_batch)
        srv.start()
        try:
            status, body, _ = _post(srv.url, {"queries": queries, "topk": 4, "return_scores": return_scores})
        finally:
            srv.stop()
        assert status == 200
        bodies.append(body)
    assert bodies == [whole, whole, whole]


def test_a_dense_retriever_answers_the_same_passages_chunked(tmp_path):
    from envs.retrieval import DenseRetriever, RemoteRetriever

    corpus = [{"id": f"d{i}", "contents": f"Topic {i}\nPassage number {i} is about subject {i % 5}."}
              for i in range(8)]
    retriever = DenseRetriever(corpus, cache_dir=tmp_path)
    queries = [f"what is subject {i % 5} of passage {i}" for i in range(5)]
    direct = retriever.search(queries, top_k=5)
    srv = RetrievalServer(retriever, port=0, max_batch=2, documents=corpus)
    srv.start()
    try:
        served = RemoteRetriever(srv.url).search(queries, top_k=5)
    finally:
        srv.stop()
    assert [[p.id for p in hits] for hits in served] == [[p.id for p in hits] for hits in direct]
    # The encoder's last bits depend on the batch a query is encoded in (as they did when
    # whole requests were batched together): equal to float32 precision.
    for got, want in zip(served, direct, strict=True):
        assert [p.score for p in got] == pytest.approx([p.score for p in want], abs=1e-6)


def test_a_full_queue_answers_503_with_retry_after():
    fake = GatedRetriever()
    srv = RetrievalServer(fake, port=0, max_batch=2, max_queries=4, max_waiting_queries=6,
                          batch_wait_s=0.0)
    srv.start()
    try:
        answers: dict[str, tuple] = {}
        threads = [_send(srv.url, {"queries": ["x0", "x1"]}, answers, "first")]
        _wait_until(lambda: len(fake.calls) == 1, "the first search call")  # 2 in flight
        threads.append(_send(srv.url, {"queries": [f"y{i}" for i in range(4)]}, answers, "y"))
        _wait_until(lambda: srv.stats["requests"] == 2, "the queued request")  # 4 waiting
        status, body, headers = _post(srv.url, {"queries": ["z0", "z1", "z2"]})  # 7 > 6
        assert status == 503
        assert headers.get("Retry-After") == "1"
        assert json.loads(body) == {
            "error": "the server is busy: 4 queries waiting, at most 6; retry later"
        }
        threads.append(_send(srv.url, {"queries": ["z0", "z1"]}, answers, "z"))  # 6 fit
        _wait_until(lambda: srv.stats["requests"] == 3, "the request that fits")
        fake.gate.set()
        for t in threads:
            t.join(60)
        assert [answers[k][0] for k in ("first", "y", "z")] == [200, 200, 200]
    finally:
        fake.gate.set()
        srv.stop()
    with pytest.raises(ValueError, match=r"max_waiting_queries=3 \(must be at least max_queries=4"):
        RetrievalServer(fake, max_queries=4, max_waiting_queries=3)
