"""The Search-R1-compatible retrieval server and its client, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from benchmarks.retrieval_load import run_load  # noqa: E402
from envs.retrieval import DenseRetriever, Passage, RemoteRetriever, RetrievalError, RetrievalServer  # noqa: E402

CORPUS = [
    {
        "id": "d0",
        "contents": '"Marie Curie"\nMarie Curie was a physicist and chemist who won two Nobel Prizes.',
    },
    {
        "id": "d1",
        "contents": "Great Wall of China\nThe Great Wall of China is a series of fortifications in northern China.",
    },
    {
        "id": "d2",
        "contents": "Mitochondrion\nThe mitochondrion is the organelle that produces most of a cell's energy.",
    },
    {"id": "d3", "contents": "Tokyo\nTokyo is the capital and most populous city of Japan."},
    {
        "id": "d4",
        "contents": "Beethoven\nLudwig van Beethoven was a German composer of nine symphonies.",
    },
    {
        "id": "d5",
        "contents": "Sahara\nThe Sahara is the largest hot desert in the world, in North Africa.",
    },
]
QUERIES = [
    "Who won two Nobel Prizes in physics and chemistry?",
    "What is the capital of Japan?",
    "largest hot desert",
]


class FakeRetriever:
    """Answers instantly (after ``delay_s``), recording the size of every search call and
    failing the first ``fail_first`` calls."""

    def __init__(self, delay_s: float = 0.0, fail_first: int = 0):
        self.delay_s = delay_s
        self.fail_first = fail_first
        self.calls: list[tuple[int, int]] = []  # (queries, top_k)
        self.lock = threading.Lock()

    def search(self, queries, top_k=3):
        with self.lock:
            self.calls.append((len(queries), top_k))
            if len(self.calls) <= self.fail_first:
                raise RuntimeError("index not ready")
        self.check(queries)
        time.sleep(self.delay_s)
        return [[Passage(f"{q}#{i}", "T", q, 1.0 - i / 10) for i in range(top_k)] for q in queries]

    def check(self, queries) -> None:
        """Raise here to fail a whole search call."""


def post(url: str, payload, raw: bytes | None = None) -> tuple[int, dict]:
    """POST JSON (or raw bytes) the way a Search-R1 client does; returns (status, JSON body)."""
    data = raw if raw is not None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def retriever(tmp_path_factory) -> DenseRetriever:
    return DenseRetriever(CORPUS, cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def server(retriever):
    srv = RetrievalServer(
        retriever,
        port=0,
        max_topk=10,
        max_queries=8,
        max_body_bytes=4096,
        max_query_chars=200,
        documents=CORPUS,
    )
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def fake_server():
    servers = []

    def make(fake, **kwargs):
        srv = RetrievalServer(fake, port=0, **kwargs)
        srv.start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


def test_search_r1_request_gets_search_r1_response(server, retriever):
    status, body = post(server.url, {"queries": QUERIES, "topk": 3, "return_scores": True})
    assert status == 200
    assert list(body) == ["result"]
    assert len(body["result"]) == len(QUERIES)
    for hits in body["result"]:
        assert len(hits) == 3
        for hit in hits:
            assert set(hit) == {"document", "score"}
            assert set(hit["document"]) == {"id", "contents"}
            assert isinstance(hit["score"], float)
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert [hits[0]["document"]["id"] for hits in body["result"]] == ["d0", "d3", "d5"]
    # Documents as stored, as Search-R1 returns them: wiki-18's title quotes are kept.
    assert body["result"][0][0]["document"] == CORPUS[0]

    status, bare = post(server.url, {"queries": QUERIES[:1], "topk": 2, "return_scores": False})
    assert status == 200
    assert bare["result"][0] == [hit["document"] for hit in body["result"][0][:2]]
    status, default = post(server.url, {"queries": QUERIES[:1]})  # Search-R1's defaults
    assert (
        status == 200
        and len(default["result"][0]) == 3
        and set(default["result"][0][0]) == {"id", "contents"}
    )
    assert post(server.url, {"queries": []}) == (200, {"result": []})


def test_remote_retriever_returns_what_the_local_one_does(server, retriever):
    local = retriever.search(QUERIES, top_k=4)
    for url in (server.url, f"http://127.0.0.1:{server.port}"):  # a bare address gets /retrieve
        remote = RemoteRetriever(url).search(QUERIES, top_k=4)
        assert [[p.id for p in hits] for hits in remote] == [[p.id for p in hits] for hits in local]
        assert [[(p.title, p.text) for p in hits] for hits in remote] == [
            [(p.title, p.text) for p in hits] for hits in local
        ]
        for r_hits, l_hits in zip(remote, local, strict=True):
            assert [p.score for p in r_hits] == pytest.approx([p.score for p in l_hits], abs=1e-5)
    # More queries than one request may carry are sent in order, in several requests.
    chunked = RemoteRetriever(server.url, max_queries_per_request=2).search(QUERIES * 3, top_k=1)
    assert [hits[0].id for hits in chunked] == ["d0", "d3", "d5"] * 3


@pytest.mark.parametrize(
    "payload, raw, status, message",
    [
        (None, b'{"queries": ["a"', 400, "malformed JSON: Expecting"),
        (None, b"\xff\xfe", 400, "malformed JSON"),
        (None, b"\x80abc", 400, "malformed JSON: the body is not UTF-8"),
        (["a"], None, 400, "the body must be a JSON object, got list"),
        ({"topk": 3}, None, 400, "'queries': Field required"),
        ({"queries": "who?"}, None, 400, "'queries': Input should be a valid list, got 'who?'"),
        ({"queries": ["a", 3]}, None, 400, "'queries.1': Input should be a valid string, got 3"),
        ({"queries": ["a"] * 9}, None, 413, "too many queries: 9 in one request, at most 8"),
        ({"queries": ["x" * 201]}, None, 413, "query 0 too long: 201 characters, at most 200"),
        ({"queries": ["a"], "topk": -1}, None, 400, "'topk' must be in [1, 10], got -1"),
        ({"queries": ["a"], "topk": 11}, None, 400, "'topk' must be in [1, 10], got 11"),
        ({"queries": ["a"], "topk": 2.5}, None, 400, "'topk': Input should be a valid integer"),
        ({"queries": ["a"], "topk": "many"}, None, 400, "'topk': Input should be a valid integer"),
        (
            {"queries": ["a"], "return_scores": "maybe"},
            None,
            400,
            "'return_scores': Input should be a valid boolean",
        ),
        ({"queries": ["x" * 5000]}, None, 413, "body too large: 5017 bytes, at most 4096"),
    ],
)
def test_bad_requests_get_4xx_with_a_message(server, payload, raw, status, message):
    got_status, body = post(server.url, payload, raw)
    assert got_status == status
    assert list(body) == ["error"]
    assert message in body["error"]
    assert "\n" not in body["error"]


@pytest.mark.parametrize(
    "payload, hits, scored",
    [
        ({"queries": ["q"], "topk": "2"}, 2, False),  # Search-R1's pydantic coerces "2"
        ({"queries": ["q"], "topk": 0}, 3, False),  # `if not request.topk`: the default
        ({"queries": ["q"], "topk": None}, 3, False),
        ({"queries": ["q"], "topk": 2.0, "return_scores": "true"}, 2, True),
        ({"queries": ["q"], "return_scores": 1, "extra": [1]}, 3, True),  # unknown keys ignored
    ],
)
def test_search_r1_coercions_are_accepted(fake_server, payload, hits, scored):
    srv = fake_server(FakeRetriever())
    status, body = post(srv.url, payload)
    assert status == 200
    assert len(body["result"][0]) == hits
    assert ("score" in body["result"][0][0]) == scored


def test_other_paths_and_health(server):
    status, body = post(f"http://127.0.0.1:{server.port}/search", {"queries": ["a"]})
    assert status == 404 and body == {
        "error": "no such path: POST /search; use POST /retrieve or GET /health"
    }
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/retrieve", timeout=10)  # GET
    assert err.value.code == 405 and "POST /retrieve" in json.loads(err.value.read())["error"]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as resp:
        health = json.loads(resp.read())
    assert health["status"] == "ok" and health["requests"] >= 1 and health["batches"] >= 1


def test_client_does_not_retry_4xx_and_names_the_url(server, monkeypatch):
    import envs.http

    slept = []
    monkeypatch.setattr(envs.http.time, "sleep", slept.append)
    client = RemoteRetriever(server.url, retries=3, backoff=5.0)
    with pytest.raises(
        RetrievalError, match=r"127\.0\.0\.1.*HTTP 400: 'topk' must be in \[1, 10\], got 50"
    ):
        client.search(["a"], top_k=50)
    assert slept == []  # no retry, so no backoff sleep


def test_client_retries_5xx_then_succeeds(fake_server):
    fake = FakeRetriever(fail_first=2)
    srv = fake_server(fake)
    hits = RemoteRetriever(srv.url, retries=3, backoff=0.01).search(["q"], top_k=2)
    assert [p.id for p in hits[0]] == ["q#0", "q#1"]
    assert len(fake.calls) == 3  # two 500s, then the answer
    fake.fail_first = 99
    with pytest.raises(
        RetrievalError,
        match=r"failed after 2 attempts; last error: HTTP 500: "
        r"retrieval failed: RuntimeError: index not ready",
    ):
        RemoteRetriever(srv.url, retries=1, backoff=0.01).search(["q"])


def test_client_gives_up_on_a_dead_server_with_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    with pytest.raises(
        RetrievalError, match=rf"http://127\.0\.0\.1:{port}/retrieve failed after 3 attempts"
    ):
        RemoteRetriever(f"http://127.0.0.1:{port}/retrieve", retries=2, backoff=0.01).search(["q"])
    with pytest.raises(ValueError, match="ftp://x"):
        RemoteRetriever("ftp://x")


def test_concurrent_requests_are_batched_per_topk(fake_server):
    fake = FakeRetriever(delay_s=0.02)
    srv = fake_server(fake, max_batch=64, batch_wait_s=0.01)
    answers: dict[int, list] = {}

    def client(i: int) -> None:
        answers[i] = post(srv.url, {"queries": [f"q{i}"], "topk": 2 + i % 2, "return_scores": True})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (status, body) in answers.items():
        assert status == 200
        assert [h["document"]["id"] for h in body["result"][0]] == [
            f"q{i}#{j}" for j in range(2 + i % 2)
        ]
    assert sum(n for n, _ in fake.calls) == 24
    assert len(fake.calls) < 24  # some search calls served several requests
    assert max(n for n, _ in fake.calls) > 1
    assert srv.stats["requests"] == 24 and srv.stats["batches"] == len(fake.calls)


def test_stop_releases_the_port():
    srv = RetrievalServer(FakeRetriever(), port=0)
    port = srv.start()
    assert port > 0 and post(srv.url, {"queries": ["a"]})[0] == 200
    srv.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(srv.url, data=b"{}", timeout=5)


def test_load_2000_requests_from_16_threads(fake_server):
    # The server's own overhead under load: a retriever as fast as a cached lookup, so the
    # figure is the HTTP + batching path (benchmarks/retrieval_load.py loads the real encoder).
    fake = FakeRetriever(delay_s=0.001)
    srv = fake_server(fake, max_batch=64)
    report = run_load(srv.url, QUERIES, requests=2000, threads=16, time_limit_s=40.0)
    mean_batch = srv.stats["queries"] / max(1, srv.stats["batches"])
    print(
        f"\nretrieval server load: {report.ok} requests in {report.seconds:.1f} s = "
        f"{report.requests_per_s:.0f} requests/s, mean batch {mean_batch:.1f}, "
        f"p99 {report.latency_ms(0.99):.0f} ms"
    )
    assert report.errors == [] and report.error_count == 0
    assert report.ok == report.sent == 2000
    assert srv.stats["requests"] == 2000


# -- hostile and broken requests (issue 17, items 7-9) -----------------------------------------


class TokenizingRetriever(FakeRetriever):
    """Fails a whole search call the way a tokenizer does on text it cannot encode, or on a
    query that names a broken index shard ("boom")."""

    def check(self, queries) -> None:
        for q in queries:
            q.encode("utf-8")  # UnicodeEncodeError on a lone surrogate
            if "boom" in q:
                raise RuntimeError("shard down")


def _hammer(url: str, clients: dict[str, str], rounds: int) -> dict[str, list]:
    """Every client sends ``rounds`` requests with its query, all clients at once."""
    answers: dict[str, list] = {name: [] for name in clients}
    barrier = threading.Barrier(len(clients))

    def client(name: str) -> None:
        barrier.wait(timeout=30)
        for _ in range(rounds):
            answers[name].append(post(url, {"queries": [clients[name]], "return_scores": True}))

    threads = [threading.Thread(target=client, args=(name,)) for name in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return answers


def test_a_lone_surrogate_among_15_valid_clients_fails_no_one(fake_server):
    fake = TokenizingRetriever(delay_s=0.005)
    srv = fake_server(fake, batch_wait_s=0.01)
    clients = {f"ok{i}": f"valid query {i}" for i in range(15)} | {"bad": "emoji \ud83d here"}
    answers = _hammer(srv.url, clients, rounds=10)
    for name, replies in answers.items():
        assert [status for status, _ in replies] == [200] * 10, name
    # The surrogate became U+FFFD before it joined a batch, so the batch stayed whole.
    assert answers["bad"][0][1]["result"][0][0]["document"]["id"] == "emoji \ufffd here#0"
    assert max(n for n, _ in fake.calls) > 1  # requests were batched together


def test_a_request_that_breaks_the_retriever_fails_alone(fake_server):
    fake = TokenizingRetriever(delay_s=0.005)
    srv = fake_server(fake, batch_wait_s=0.01)
    clients = {f"ok{i}": f"valid query {i}" for i in range(15)} | {"bad": "boom"}
    answers = _hammer(srv.url, clients, rounds=10)
    for name, replies in answers.items():
        if name == "bad":
            assert replies == [(500, {"error": "retrieval failed: RuntimeError: shard down"})] * 10
        else:
            assert [status for status, _ in replies] == [200] * 10, name
    assert max(n for n, _ in fake.calls) > 1


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"[" * 100_000, "malformed JSON: nested too deeply"),
        (
            b'{"queries": ["a"], "topk": ' + b"7" * 5001 + b"}",
            "malformed JSON: Exceeds the limit (4300 digits) for integer string conversion",
        ),
        (b'{"queries": ["a"], "topk": 1e999}', "'topk': Input should be a finite number"),
        (
            b'{"queries": ["a"], "topk": ' + b"7" * 4000 + b"}",
            "'topk' must be in [1, 100], got 7777",
        ),
    ],
    ids=["nested-100000", "int-5001-digits", "float-1e999", "int-4000-digits"],
)
def test_hostile_json_gets_a_400_with_one_line(fake_server, raw, message):
    srv = fake_server(FakeRetriever())
    status, body = post(srv.url, None, raw)
    assert status == 400
    assert body["error"].startswith(message) and "\n" not in body["error"]
    assert post(srv.url, {"queries": ["a"]})[0] == 200  # and the server still serves


def test_big_bodies_get_413_with_or_without_a_length(fake_server):
    srv = fake_server(FakeRetriever(), max_body_bytes=1000)
    status, body = post(srv.url, {"queries": ["x" * 2000]})
    assert status == 413 and body["error"] == "body too large: 2017 bytes, at most 1000"
    # A chunked body has no Content-Length: it is counted as it arrives.
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    chunks = iter([b'{"queries": ["', b"x" * 600, b"x" * 600, b'"]}'])
    conn.request("POST", "/retrieve", body=chunks, encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 413
    assert json.loads(resp.read()) == {"error": "body too large: over 1000 bytes"}
    conn.close()


def _closed_by_server(sock: socket.socket, limit_s: float = 20.0) -> bool:
    """Whether the server closes ``sock`` (reads until EOF, at most ``limit_s``)."""
    sock.settimeout(limit_s)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_silent_connections_are_closed(fake_server):
    srv = fake_server(FakeRetriever(), keep_alive_s=0.2)
    threads_before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(64)]
    try:
        # 64 idle sockets cost no thread, and a real request still gets through.
        assert threading.active_count() == threads_before
        assert post(srv.url, {"queries": ["a"]})[0] == 200
        assert all(_closed_by_server(s) for s in idle)  # never sent a byte
    finally:
        for s in idle:
            s.close()
    with socket.create_connection(("127.0.0.1", srv.port)) as slow:  # half a request head
        slow.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")
        assert _closed_by_server(slow)
    with socket.create_connection(("127.0.0.1", srv.port)) as trickle:  # a byte at a time
        head = b"POST /retrieve HTTP/1.1\r\nX-Padding: " + b"x" * 400
        sent = 0
        with contextlib.suppress(OSError):  # the server hangs up while we still send
            while sent < len(head):
                trickle.sendall(head[sent : sent + 1])
                sent += 1
                time.sleep(0.02)  # 400 bytes would take 8 s: 40 times the idle limit
        assert _closed_by_server(trickle)
        assert sent < len(head)
    with socket.create_connection(("127.0.0.1", srv.port)) as stalled:  # half a body
        stalled.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
        stalled.settimeout(20)
        reply = b""
        while chunk := stalled.recv(4096):  # the server closes after its answer
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 408") and b"the request body stalled" in reply
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)  # keep-alive, then idle
    conn.request("POST", "/retrieve", body=b'{"queries": ["a"]}')
    assert conn.getresponse().read()
    assert _closed_by_server(conn.sock)
    conn.close()


def test_bad_settings_are_refused_in_one_line(capsys):
    from envs.retrieval.__main__ import main

    with pytest.raises(ValueError, match=r"max_body_bytes=0 \(must be a positive integer\)"):
        RetrievalServer(FakeRetriever(), max_body_bytes=0)
    with pytest.raises(ValueError, match=r"keep_alive_s=nan"):
        RetrievalServer(FakeRetriever(), keep_alive_s=float("nan"))
    # The command line refuses before it loads the corpus (which does not exist here).
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--corpus", "/nonexistent.jsonl", "--max-query-chars", "-5"])
    assert exit_.value.code == 2
    assert "max_query_chars=-5 (must be a positive integer) (set by --max-query-chars)" in (
        capsys.readouterr().err
    )


def test_skyrl_gym_single_query_request_gets_passages(server, retriever):
    """SkyRL-gym 0.4.0's SearchEnv (skyrl_gym/tools/search.py) POSTs one query as
    {"query": str, "topk": n, "return_scores": true} and reads
    result[i][j]["document"]["contents"] (issue #31.4)."""
    query = "What is the capital of Japan?"
    req = urllib.request.Request(
        server.url,
        data=json.dumps({"query": query, "topk": 2, "return_scores": True}).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        api_response = json.loads(resp.read())
    # What SkyRL's _passages2string does with it:
    docs = [
        [doc_item["document"]["contents"].strip() for doc_item in retrieval]
        for retrieval in api_response.get("result", [])
    ]
    want = [p.contents for p in retriever.search([query], top_k=2)[0]]
    assert docs == [want] and "Tokyo" in docs[0][0]
    # The same answer as Search-R1's body for that one query, byte for byte.
    status, body = post(server.url, {"queries": [query], "topk": 2, "return_scores": True})
    assert status == 200 and body == api_response


@pytest.mark.parametrize(
    "payload, status, message",
    [
        ({"query": "largest hot desert", "top_k": 1}, 200, None),  # PettingLLMs' spelling
        ({"query": "largest hot desert", "topk": 1, "top_k": 5}, 200, None),  # topk wins
        ({"query": 5}, 400, "'query': Input should be a valid string, got 5"),
        ({"query": "x", "top_k": 50}, 400, "'topk' must be in [1, 10], got 50"),
        ({"topk": 2}, 400, "'queries': Field required"),
    ],
)
def test_single_query_requests_are_checked(server, payload, status, message):
    got, body = post(server.url, payload)
    assert got == status
    if message is None:
        assert [[h["id"] for h in hits] for hits in body["result"]] == [["d5"]]  # bare documents
    else:
        assert list(body) == ["error"] and body["error"].startswith(message)
