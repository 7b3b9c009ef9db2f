"""Remote calls end at their deadline, however slowly the server answers (issue #27.5).

A socket timeout bounds each read: a server that sends one byte a second never trips a
2 s read timeout. These tests run such a server on 127.0.0.1, in a thread, for at most
``TRICKLE_FOR_S`` seconds per connection.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest

from algos.commands.preflight import PreflightError, check_retriever
from envs.retrieval import RemoteRetriever, RetrievalError

TRICKLE_FOR_S = 12.0  # the old per-read timeout waited this long, then failed on the hang-up


class TrickleServer:
    """Answers every connection with a valid Search-R1 answer, ``interval_s`` per byte,
    giving up (closing) after ``TRICKLE_FOR_S``."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.body = json.dumps({"result": [[{"document": {"id": "0", "contents": "T\nx"}, "score": 1.0}]]})
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/retrieve"
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        for _ in range(20):  # bounded: a test opens one or two connections
            while not self.stop.is_set():
                try:
                    conn, _ = self.listener.accept()
                    break
                except TimeoutError:
                    continue
            else:
                return
            t = threading.Thread(target=self._trickle, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _trickle(self, conn: socket.socket) -> None:
        answer = (
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(self.body)}\r\nConnection: close\r\n\r\n{self.body}"
        ).encode()
        give_up = time.monotonic() + TRICKLE_FOR_S
        with conn, contextlib.suppress(OSError):  # the client hangs up at its deadline
            conn.settimeout(1.0)
            conn.recv(65536)  # the request (small: one recv holds it)
            for i in range(len(answer)):
                if self.stop.is_set() or time.monotonic() > give_up:
                    return
                conn.sendall(answer[i : i + 1])
                self.stop.wait(self.interval_s)

    def close(self) -> None:
        self.stop.set()
        self.accepting.join(timeout=5)
        for t in self.threads:
            t.join(timeout=5)
        self.listener.close()


@pytest.fixture
def trickle():
    servers: list[TrickleServer] = []

    def make(interval_s: float) -> TrickleServer:
        servers.append(TrickleServer(interval_s))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_remote_retriever_stops_at_its_deadline_on_a_trickling_server(trickle):
    srv = trickle(1.0)  # one byte a second: every read succeeds well within 2 s
    client = RemoteRetriever(srv.url, timeout=2, retries=0)
    start = time.monotonic()
    with pytest.raises(RetrievalError) as err:
        client.search(["q"], top_k=1)
    elapsed = time.monotonic() - start
    assert elapsed < 6.0, f"held for {elapsed:.1f} s with a 2 s deadline"
    message = str(err.value)
    assert "\n" not in message
    assert srv.url in message and "within the 2 s deadline" in message
    assert "failed after 1 attempt;" in message


def test_the_deadline_covers_every_attempt(trickle):
    srv = trickle(1.0)
    start = time.monotonic()
    with pytest.raises(RetrievalError, match=r"failed after 2 attempts; .* 1\.5 s deadline"):
        RemoteRetriever(srv.url, timeout=1.5, retries=1, backoff=0.01).search(["q"])
    assert time.monotonic() - start < 7.0


def test_a_slow_answer_that_ends_before_the_deadline_is_read(trickle):
    srv = trickle(0.002)  # the whole answer (~200 bytes) in well under the 20 s deadline
    hits = RemoteRetriever(srv.url, timeout=20, retries=0).search(["q"], top_k=1)
    assert [(p.id, p.text, p.score) for p in hits[0]] == [("0", "x", 1.0)]


def test_preflight_probe_stops_at_its_deadline(trickle):
    srv = trickle(1.0)
    start = time.monotonic()
    with pytest.raises(PreflightError) as err:
        check_retriever(srv.url, timeout=2)
    elapsed = time.monotonic() - start
    assert elapsed < 6.0, f"the preflight probe held for {elapsed:.1f} s with a 2 s deadline"
    assert str(err.value).startswith(f"retriever={srv.url!r} does not answer: ")
    assert "within the 2 s deadline" in str(err.value) and "\n" not in str(err.value)


def test_the_openai_policy_stops_at_its_deadline_on_a_trickling_server(trickle):
    """The SDK's timeout bounds each read; ``deadline`` bounds the whole request."""
    pytest.importorskip("openai")
    import numpy as np

    from agents.base import Observation
    from agents.openai_chat import OpenAIError, OpenAIPolicy

    srv = trickle(1.0)
    policy = OpenAIPolicy("m", base_url=f"http://127.0.0.1:{srv.port}/v1", timeout=2, retries=0)
    assert policy.deadline == 2.0  # (retries + 1) * timeout + 8 * retries
    obs = Observation(agent="searcher_0", role="searcher", token_ids=np.zeros(1, dtype=np.int64),
                      messages=({"role": "user", "content": "Task: t"},))
    start = time.monotonic()
    try:
        with pytest.raises(OpenAIError) as err:
            policy.act([obs])
    finally:
        policy.close()
    elapsed = time.monotonic() - start
    assert elapsed < 6.0, f"held for {elapsed:.1f} s with a 2 s deadline"
    assert str(err.value) == f"POST {policy.url}: no complete answer within the 2 s deadline"
