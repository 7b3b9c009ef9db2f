"""One client's cost stays bounded (issue 44.5): an OpenEnv reset question is cut before it
is tokenised whole; plain HTTP routes reuse the server's one env instead of building one per
request; an idle session is dropped so a newcomer gets in; the retrieval server searches
nothing more for a client that has disconnected. Every measure is a count, not a time."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from envs.retrieval import Passage, RetrievalServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, what: str, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# ---------------------------------------------------------------------------- retrieval server


class GatedRetriever:
    """Blocks its first search until ``gate`` is set; records every query it searches."""

    def __init__(self):
        self.gate = threading.Event()
        self.searched: list[str] = []
        self.started = threading.Event()

    def search(self, queries, top_k=3):
        self.started.set()
        self.gate.wait(30)
        self.searched += list(queries)
        return [[Passage(f"{q}#{i}", "T", q, 1.0) for i in range(top_k)] for q in queries]


def _health(server: RetrievalServer) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as resp:
        return json.loads(resp.read())


def test_the_retrieval_server_drops_the_queued_work_of_a_client_that_left():
    retriever = GatedRetriever()
    with RetrievalServer(retriever, port=0, max_batch=1, batch_wait_s=0) as server:
        answers = {}

        def first():  # holds the retriever while the second client queues and leaves
            req = urllib.request.Request(server.url, data=json.dumps({"queries": ["held"]}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                answers["first"] = resp.status

        thread = threading.Thread(target=first)
        thread.start()
        assert retriever.started.wait(10)
        body = json.dumps({"queries": [f"left {i}" for i in range(5)]}).encode()
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        _wait(lambda: server._fair.queued == 5, "the second request to queue")
        sock.close()  # the client leaves before its answer
        end = time.monotonic() + 10
        while server._fair.queued and time.monotonic() < end:  # the server sees it leave
            time.sleep(0.01)
        retriever.gate.set()
        thread.join(30)
        assert answers == {"first": 200}
        # a later request is served as usual, and nothing of the one that left was searched
        req = urllib.request.Request(server.url, data=json.dumps({"queries": ["later"]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
        assert retriever.searched == ["held", "later"]  # was: held, left 0..4, later
        assert _health(server)["dropped"] == 1


# ---------------------------------------------------------------------------- OpenEnv

needs_openenv = pytest.mark.skipif(importlib.util.find_spec("openenv") is None,
                                   reason="the openenv extra is not installed")


@pytest.fixture(scope="module")
def retriever():
    from envs.retrieval.factory import make_retriever

    return make_retriever("words")


class Recorder:
    """Stands in for a tokenizer's Rust backend and records the characters of every text
    it is asked to encode (the cost of tokenising is linear in them)."""

    def __init__(self, inner):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "lengths", [])

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if not (callable(value) and name.startswith("encode")):
            return value

        def encode(first, *args, **kwargs):
            texts = [first] if isinstance(first, str) else list(first)
            self.lengths.extend(len(t if isinstance(t, str) else "".join(t)) for t in texts)
            return value(first, *args, **kwargs)

        return encode

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


@needs_openenv
def test_a_huge_reset_question_is_cut_before_it_is_tokenised(retriever):
    from envs.openenv.server import SearchTeamEnvironment
    from envs.search_team import MAX_CHARS_PER_TOKEN

    session = SearchTeamEnvironment(retriever=retriever)
    recorder = Recorder(session.env.tokenizer._tokenizer)
    session.env.tokenizer._tokenizer = recorder
    budget = 4096 - 256 - 16  # what the first prompt may hold: max_context - max_turn - MIN_TURN_ROOM
    question = "Who directed " + "x" * 8_000_000 + "?"
    obs = session.reset(seed=0, question={"question": question, "golden_answers": ["y"]})
    assert obs.last_turn == {} and obs.agent == "leader_0"
    assert recorder.lengths and max(recorder.lengths) <= budget * MAX_CHARS_PER_TOKEN  # was 8,000,014
    kept = session.env.question.question
    assert question.startswith(kept[: -len(" ...")]) and kept.endswith(" ...") and len(kept) < budget * 8
    assert len(json.dumps(obs.info)) < 100_000  # every observation carries the question
    # an ordinary question is kept whole, and costs no extra tokenising
    recorder.lengths.clear()
    session.reset(seed=0, question="Who directed The Glass Harbor?")
    assert session.env.question.question == "Who directed The Glass Harbor?"
    # answers, id and dataset are bounded too
    for bad, why in (({"question": "q", "golden_answers": ["a"] * 65}, "at most 64 answers"),
                     ({"question": "q", "id": "i" * 300}, "at most 256 characters"),
                     ({"question": "q", "id": 10**40}, "out of range")):
        refused = session.reset(seed=0, question=bad)
        assert why in refused.last_turn["reason"] and refused.last_turn["played"] is False


@needs_openenv
def test_cut_question_keeps_the_budget_in_tokens(tokenizer):
    from envs.openenv.server import cut_question

    text = " ".join(f"word{i}" for i in range(5000))
    cut = cut_question(text, tokenizer, 100)
    assert cut.endswith(" ...") and text.startswith(cut[:-4])
    assert len(tokenizer.encode(cut[:-4], add_special_tokens=False)) == 100
    assert cut_question("short", tokenizer, 100) == "short"
    whole = " ".join(f"w{i}" for i in range(20))
    assert cut_question(whole, tokenizer, 100) == whole  # fits: unchanged


@pytest.fixture()
def serve(retriever):
    """Start a server on 127.0.0.1 for ``make_app(**kwargs)``; stopped at the end."""
    import uvicorn

    from envs.openenv.server import make_app

    servers = []

    def start(**kwargs):
        port = _free_port()
        srv = uvicorn.Server(uvicorn.Config(make_app({"retriever": retriever}, **kwargs), host="127.0.0.1",
                                            port=port, log_level="warning"))
        thread = threading.Thread(target=srv.run, daemon=True)
        thread.start()
        servers.append((srv, thread))
        _wait(lambda: srv.started, "the server to start", 60)
        return f"http://127.0.0.1:{port}"

    yield start
    for srv, thread in servers:
        srv.should_exit = True
        thread.join(timeout=10)


def _call(method: str, url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


@needs_openenv
def test_plain_http_routes_reuse_the_servers_env(serve, monkeypatch):
    import envs.openenv.server as server_module

    built = []
    real = server_module.make_env
    monkeypatch.setattr(server_module, "make_env", lambda **kw: built.append(kw) or real(**kw))
    url = serve(max_sessions=2)
    at_start = len(built)
    assert at_start == 1  # the one env the routes share (it also warms the tokenizer up)
    for i in range(3):
        first = _call("POST", url + "/reset", {"seed": i})["observation"]
        assert first["agent"] == "leader_0" and first["last_turn"] == {}
        # the next request sees no episode: nothing of another request's survives it
        step = _call("POST", url + "/step", {"action": {"text": "<answer>x</answer>"}})["observation"]
        assert "call reset first" in step["last_turn"]["reason"]
        assert _call("GET", url + "/state")["step_count"] == 0
        assert _call("GET", url + "/metadata")["name"] == "search_team"
    assert len(built) == at_start  # was one env (and one tokenizer copy) per request


@needs_openenv
def test_a_request_while_the_route_env_is_lent_is_refused(retriever):
    from envs.openenv.server import BUSY, _RouteEnvironment

    route = _RouteEnvironment(retriever=retriever)
    assert route.lend() is route
    busy = route.lend()
    assert busy is not route and BUSY in busy.reset(seed=0).last_turn["reason"]
    assert busy.state.step_count == 0
    route.close()
    assert route.lend() is route


@needs_openenv
def test_an_idle_session_is_dropped_and_a_newcomer_gets_in(serve):
    from envs.openenv.client import SearchTeamClient
    from envs.openenv.models import SearchTeamAction

    url = serve(max_sessions=1, idle_timeout_s=0.3)

    async def play():
        idle = SearchTeamClient(base_url=url, message_timeout_s=60)
        first = await idle.reset(seed=0)
        assert first.observation.agent == "leader_0"
        refused = SearchTeamClient(base_url=url, message_timeout_s=60)
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):  # the place is taken
            await refused.reset(seed=0)
        await refused.close()
        await asyncio.sleep(1.0)  # the first session says nothing
        newcomer = SearchTeamClient(base_url=url, message_timeout_s=60)
        result = await newcomer.reset(seed=1)
        assert result.observation.agent == "leader_0"
        late = await idle.step(SearchTeamAction(text="<select>1</select>"))
        assert late.observation.last_turn["played"] is False
        assert "dropped after 0.3 s without a request" in late.observation.last_turn["reason"]
        await newcomer.close()
        await idle.close()

    asyncio.run(play())


@needs_openenv
def test_a_session_that_keeps_asking_is_not_dropped(serve):
    from envs.openenv.client import SearchTeamClient

    url = serve(max_sessions=1, idle_timeout_s=0.4)

    async def play():
        client = SearchTeamClient(base_url=url, message_timeout_s=60)
        await client.reset(seed=0)
        for _ in range(8):  # 1.6 s in all, never 0.4 s silent
            await asyncio.sleep(0.2)
            assert (await client.state()).step_count == 0
        result = await client.reset(seed=1)
        assert result.observation.last_turn == {}
        await client.close()

    asyncio.run(play())


@needs_openenv
def test_bad_idle_timeouts_are_refused():
    from envs.openenv.server import make_app

    for bad in (0, -1, float("nan"), float("inf"), "300", True):
        with pytest.raises(ValueError, match="idle_timeout_s"):
            make_app({"retriever": object()}, idle_timeout_s=bad)
