"""SearchTeam on OpenEnv (issue 31.1), checked with OpenEnv's own validator and client and
with ours: wire Episodes equal the in-process AEC loop and ``agents.collect`` field for
field; token-id actions keep their ids and log-probs; G concurrent sessions on a cold
server all equal ``collect``'s group, and session G+1 is refused; hostile requests get
``last_turn.invalid``, never a 500."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("openenv")

from agents.collect import collect  # noqa: E402
from agents.openenv_client import collect_remote  # noqa: E402
from agents.scripted import ScriptedPolicy  # noqa: E402
from envs import env_fn, make_env  # noqa: E402
from envs.openenv.client import SearchTeamClient, check_tokenizer, question_payload  # noqa: E402
from envs.openenv.models import SearchTeamAction  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
G = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen | None = None, seconds: float = 120) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up in {seconds} s")


def norm(episode) -> dict:
    """An Episode (or its dict) as JSON values, without the sampling record that only
    collectors write."""
    data = episode if isinstance(episode, dict) else episode.to_dict()
    data = json.loads(json.dumps(data))
    data.pop("sampling", None)
    return data


@pytest.fixture(scope="module")
def retriever():
    from envs.retrieval.factory import make_retriever

    return make_retriever("words")


@pytest.fixture(scope="module")
def questions():
    """Four dev questions over two datasets of the synthetic world."""
    from envs.data.synthwiki import default_world

    world = default_world()
    return world.questions("hotpotqa", "dev")[:2] + world.questions("musique", "dev")[:2]


@pytest.fixture(scope="module")
def server(retriever):
    """An in-process server (uvicorn in a thread) on 127.0.0.1 with the words retriever."""
    import uvicorn

    from envs.openenv.server import make_app

    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(make_app({"retriever": retriever}, max_sessions=G),
                                        host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    _wait_up(url)
    yield url
    srv.should_exit = True
    thread.join(timeout=10)


def aec_loop(policy, question, seed, retriever, workflow):
    """The reference: the PettingZoo AEC loop in process, one turn per step."""
    env = make_env(wrapped=True, retriever=retriever, workflow=workflow)
    env.reset(seed=seed, options={"question": question})
    raw = env.unwrapped
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else policy.act([raw.turn_observation(agent)])[0])
    return raw.episode


def _objects(passages):
    return [[SimpleNamespace(**p) for p in ps] for ps in passages]


@pytest.mark.parametrize("workflow", ["hierarchical", "cascade"])
def test_openenv_generic_client_plays_the_aec_episodes(server, questions, retriever, workflow):
    """OpenEnv's GenericEnvClient (plain dicts, no mopd types) plays every role."""
    from openenv.core import GenericEnvClient

    policy = ScriptedPolicy()
    wire = []
    with GenericEnvClient(base_url=server, message_timeout_s=120).sync() as client:
        for i, q in enumerate(questions):
            result = client.reset(seed=i, question=question_payload(q), workflow=workflow)
            steps = 0
            while not result.done:
                o = result.observation
                info = {**o["info"], "passages": _objects(o["info"].get("passages", []))}
                text = policy.turn(o["role"], info, o["max_new_tokens"], context=o["text"])
                result = client.step({"agent": o["agent"], "text": text})
                assert result.observation["last_turn"]["played"] is True
                steps += 1
                assert steps < 200
            assert result.reward == result.observation["episode"]["final_em"]
            assert result.observation["rewards"] == result.observation["episode"]["rewards"]
            wire.append(result.observation["episode"])
    local = [aec_loop(ScriptedPolicy(), q, i, retriever, workflow) for i, q in enumerate(questions)]
    assert [norm(w) for w in wire] == [norm(e) for e in local]
    assert {w["question"]["dataset"] for w in wire} == {"hotpotqa", "musique"}
    assert sum(w["final_em"] for w in wire) >= 2  # the team plays real, mostly right, episodes
    segments = wire[0]["segments"]
    assert all(len(s["token_ids"]) == len(s["loss_mask"]) == len(s["logprobs"] or s["loss_mask"]) for s in segments)


@pytest.mark.parametrize("workflow", ["hierarchical", "cascade"])
def test_collect_remote_equals_collect(server, questions, retriever, workflow):
    """Our client: the same groups, seeds and records as agents.collect (group of 2)."""
    remote = collect_remote(server, ScriptedPolicy(), questions, group_size=2, seed=3, max_sessions=G,
                            workflow=workflow)
    local = collect(env_fn(retriever=retriever, workflow=workflow), ScriptedPolicy(), questions,
                    group_size=2, seed=3)
    assert [[ep.seed for ep in g] for g in remote] == [[3, 4], [5, 6], [7, 8], [9, 10]]
    assert [[json.loads(json.dumps(ep.to_dict())) for ep in g] for g in remote] == \
        [[json.loads(json.dumps(ep.to_dict())) for ep in g] for g in local]
    assert remote[0][0].sampling == local[0][0].sampling


def test_token_actions_keep_ids_and_logprobs(server, retriever, tokenizer, questions, torch_one_thread):
    """An HF policy's token ids and behaviour log-probs cross the wire unchanged: the
    Episodes equal the in-process loop's (the same one-agent-at-a-time calls, so the
    policy's generator is consumed in the same order)."""
    from agents.hf import HFPolicy
    from agents.models import tiny_causal_lm

    model = tiny_causal_lm(len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=0,
                           eos_token_id=tokenizer.eos_token_id, initializer_range=0.2)

    def policy():
        return HFPolicy(model, tokenizer, temperature=1.0, max_new_tokens=12, seed=0)

    wire, remote_policy = [], policy()
    with SearchTeamClient(base_url=server, message_timeout_s=120).sync() as client:
        for i, q in enumerate(questions[:2]):
            result = client.reset(seed=i, question=question_payload(q), workflow="cascade")
            check_tokenizer(result.observation.metadata, tokenizer)
            while not result.done:
                from envs.openenv.client import action_of, turn_observation

                obs = turn_observation(result.observation)
                result = client.step(action_of(obs.agent, remote_policy.act([obs])[0]))
            wire.append(result.observation.episode)
    local_policy = policy()
    local = [aec_loop(local_policy, q, i, retriever, "cascade") for i, q in enumerate(questions[:2])]
    assert [norm(w) for w in wire] == [norm(e) for e in local]
    generated = [s for w in wire for s in w["segments"] if sum(s["loss_mask"])]
    assert generated and all(s["logprobs"] is not None for s in generated)
    assert any(lp < 0 for s in generated for lp in s["logprobs"])


def test_check_tokenizer_refuses_another_vocabulary(tokenizer):
    from envs.openenv.models import tokenizer_identity

    class Toy:
        name_or_path = "toy"

        def get_vocab(self):
            return {"a": 0, "b": 1}

        def __len__(self):
            return 2

    check_tokenizer(tokenizer_identity(tokenizer), tokenizer)
    with pytest.raises(ValueError, match="other tokens"):
        check_tokenizer(tokenizer_identity(tokenizer), Toy())


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, {}


def test_hostile_requests_are_answered_invalid(server):
    # plain HTTP: every request gets a fresh env, so a step has no episode
    status, body = _post(server + "/step", {"action": {"text": "<answer>x</answer>"}})
    assert status == 200 and body["observation"]["last_turn"]["invalid"] is True
    assert "call reset first" in body["observation"]["last_turn"]["reason"]
    status, body = _post(server + "/step", {"action": {"text": "x" * 10_000_000}})
    assert status == 200 and body["observation"]["last_turn"]["played"] is False
    status, body = _post(server + "/step", {"action": {"token_ids": "abc", "bogus": 1}})
    assert status == 200 and "malformed action" in body["observation"]["last_turn"]["reason"]
    status, body = _post(server + "/reset", {"question": {"question": 5}})
    assert status == 200 and "reset refused" in body["observation"]["last_turn"]["reason"]

    with SearchTeamClient(base_url=server).sync() as client:
        first = client.reset(seed=0).observation
        assert first.agent == "leader_0" and first.awaiting == ["leader_0"]

        def refused(action) -> str:
            obs = client.step(action).observation
            assert obs.last_turn["played"] is False and obs.last_turn["invalid"] is True
            assert obs.token_ids == first.token_ids  # nothing was played
            return obs.last_turn["reason"]

        assert "not awaiting" in refused(SearchTeamAction(agent="answerer_0", text="<answer>x</answer>"))
        assert "exactly one of" in refused(SearchTeamAction())
        assert "logprobs has 1 values for 2" in refused(SearchTeamAction(token_ids=[1, 2], logprobs=[-0.5]))
        # 10 MB of text is cut to the turn's budget and played as one (invalid) turn
        big = client.step(SearchTeamAction(text="y" * 10_000_000)).observation
        assert big.last_turn["played"] is True and big.last_turn["invalid"] is True
        # out-of-vocabulary ids are model output: an invalid empty turn, with a note
        oov = client.step(SearchTeamAction(token_ids=[10**9, -1])).observation
        assert oov.last_turn["played"] is True and oov.last_turn["invalid"] is True
        assert "outside [0, " in oov.last_turn["note"]
        state = client.state()
        assert state.step_count == 2 and state.phase == "leader" and not state.done

    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url=server).sync() as raw_client:  # payloads our client never sends
        raw_client.reset(seed=0)
        for payload, reason in (({"token_ids": [1.5]}, "token_ids.0"), ({"txt": "hi"}, "txt"),
                                ({"text": 7}, "text"), ({"agent": ["x"], "text": "hi"}, "agent")):
            obs = raw_client.step(payload).observation
            assert obs["last_turn"]["played"] is False, payload
            assert obs["last_turn"]["reason"].startswith("malformed action: " + reason), obs["last_turn"]


@pytest.mark.parametrize("workflow", ["hierarchical"])
def test_cold_server_takes_g_sessions_and_refuses_one_more(tmp_path, questions, retriever, workflow):
    """``python -m envs.openenv serve`` in a fresh process: ``openenv validate`` passes; then
    G sessions open at once as its first sessions and all G equal collect's group;
    session G+1 is refused with CAPACITY_REACHED, not left hanging."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "envs.openenv", "serve", "--port", str(port),
                             "--retriever", "words", "--max-sessions", str(G)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_up(url, proc)
        question = questions[2]

        async def group():
            clients = [SearchTeamClient(base_url=url, message_timeout_s=120) for _ in range(G + 1)]
            firsts = await asyncio.gather(*(c.reset(seed=k, question=question_payload(question))
                                            for c, k in zip(clients[:G], range(G))))
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                await asyncio.wait_for(clients[G].reset(seed=0), timeout=30)
            policy = ScriptedPolicy()
            from envs.openenv.client import action_of, turn_observation

            async def play(client, result):
                while not result.done:
                    obs = turn_observation(result.observation)
                    result = await client.step(action_of(obs.agent, policy.act([obs])[0]))
                return result.observation.episode

            episodes = await asyncio.gather(*(play(c, r) for c, r in zip(clients, firsts)))
            for c in clients:
                await c.close()
            return episodes

        wire = asyncio.run(group())
        [local] = collect(env_fn(retriever=retriever), ScriptedPolicy(), [question], group_size=G)
        assert [norm(w) for w in wire] == [norm(e) for e in local]

        validate = subprocess.run(["openenv", "validate", "--url", url, "--timeout", "60"],
                                  capture_output=True, text=True, timeout=180)
        assert validate.returncode == 0, validate.stdout + validate.stderr
        assert "Verdict: PASS" in validate.stdout
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
