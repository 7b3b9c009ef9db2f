"""The Search-R1-compatible retrieval server and its client, on 127.0.0.1."""

from __future__ import annotations

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
        time.sleep(self.delay_s)
        return [[Passage(f"{q}#{i}", "T", q, 1.0 - i / 10) for i in range(top_k)] for q in queries]


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


def test_client_does_not_retry_4xx_and_names_the_url(server):
    client = RemoteRetriever(server.url, retries=3, backoff=5.0)
    start = time.perf_counter()
    with pytest.raises(
        RetrievalError, match=r"127\.0\.0\.1.*HTTP 400: 'topk' must be in \[1, 10\], got 50"
    ):
        client.search(["a"], top_k=50)
    assert time.perf_counter() - start < 4.0  # no backoff sleep happened


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
