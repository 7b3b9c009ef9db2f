"""SearchTeam on verifiers 0.4 (issue 31.2): integrations/verifiers/mopd_search_team.

Fast: SearchTeamEnv.run and finalize with seats that answer in process (the scripted
endpoint's replies, no harness subprocess): one trace per mopd segment, role rewards on
the traces, and the Episode algos.from_verifiers rebuilds equals agents.collect's with
the same text policy. Slow: ``vf-eval mopd-search-team`` itself against the scripted
OpenAI-compatible endpoint, local runtime, ``--no-push``, compared with the in-process
run of agents.openai_chat.OpenAIPolicy on the same endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1")
pytest.importorskip("mopd_search_team")

from mopd_search_team import SearchTeamEnv, SearchTeamEnvConfig  # noqa: E402
from mopd_search_team.scripted_endpoint import ScriptedEndpoint, completion  # noqa: E402

from agents.base import Action  # noqa: E402
from agents.collect import collect  # noqa: E402
from agents.openai_chat import OpenAIPolicy, chat_messages, restore_stop  # noqa: E402
from algos.from_verifiers import episode_from_verifiers, groups_from_verifiers, read_traces  # noqa: E402
from envs import env_fn  # noqa: E402
from envs import protocol as P  # noqa: E402


def norm(ep) -> dict:
    data = json.loads(json.dumps(ep.to_dict()))
    data.pop("sampling", None)
    return data


class ScriptedChat:
    """The scripted endpoint's replies as an in-process policy (what OpenAIPolicy would get)."""

    def act(self, observations):
        return [Action(text=restore_stop(completion({"messages": chat_messages(o), "stop": list(o.stop)})[0],
                                         o.stop)) for o in observations]


class _Interaction:
    """An interaction whose model is the scripted endpoint, holding its own chat as a
    harness does (its replies without the stop string)."""

    def __init__(self, task, role):
        self.role = role
        self.trace = vf.Trace(task=vf.TraceTask(type="Task", data=task.data),
                              agent=vf.AgentInfo(config=vf.AgentConfig(), name=role))
        prompt = task.data.prompt
        self.chat = ([{"role": "system", "content": task.data.system_prompt}]
                     + ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                        else [m if isinstance(m, dict) else m.model_dump() for m in prompt]))

    async def turn(self, message=None):
        if message is not None:
            self.chat += list(message)
        content, _ = completion({"messages": self.chat, "stop": list(P.STOP_STRINGS[self.role])})
        self.chat.append({"role": "assistant", "content": content})
        return vf.Segment(messages=[vf.AssistantMessage(content=content)])


class _Seat:
    def __init__(self, role, done):
        self.role, self.done = role, done

    @contextlib.asynccontextmanager
    async def interaction(self, task):
        it = _Interaction(task, self.role)
        yield it
        self.done.append(it.trace)


class _Agents:
    def __init__(self):
        self.traces = []
        for role in P.ROLES:
            setattr(self, role, _Seat(role, self.traces))


@pytest.fixture(scope="module")
def team_env():
    return SearchTeamEnv(SearchTeamEnvConfig(taskset={"id": "mopd-search-team", "limit": 3}, retriever="words"))


def _play(env, task):
    agents = _Agents()
    asyncio.run(env.run(task, agents))
    episode = vf.Episode(task=vf.TraceTask(type="SearchTeamTask", data=task.data, key=task.key),
                         traces=agents.traces, ok=True)
    asyncio.run(env.finalize(task, episode))
    return episode


@pytest.mark.parametrize("workflow", ["hierarchical", "cascade"])
def test_one_trace_per_segment_with_its_role_reward(team_env, workflow):
    team_env.config.workflow = workflow
    team_env._kwargs = None
    try:
        for task in list(team_env.taskset)[:2]:
            episode = _play(team_env, task)
            [[want]] = collect(env_fn(**team_env.env_kwargs()), ScriptedChat(), [task.question()], 1,
                               seed=task.data.idx)
            keys = sorted(t.task.data.id for t in episode.traces)
            assert keys == sorted(f"{s.agent}@{s.wave}" for s in want.segments)
            assert len(keys) == len(set(keys)) >= (6 if workflow == "cascade" else 7)
            by_key = {f"{s.agent}@{s.wave}": s for s in want.segments}
            for trace in episode.traces:
                seg = by_key[trace.task.data.id]
                assert trace.agent.name == seg.role
                assert trace.rewards["role"].score == seg.reward
                assert trace.metrics["team_em"] == want.team_em
            assert norm(episode_from_verifiers(episode)) == norm(want)
            assert team_env._runs == {}  # finalize took the episode's hand-off
    finally:
        team_env.config.workflow = "hierarchical"
        team_env._kwargs = None


def test_finalize_refuses_traces_that_are_not_the_segments(team_env):
    task = list(team_env.taskset)[0]
    agents = _Agents()
    asyncio.run(team_env.run(task, agents))
    dropped = agents.traces.pop()
    team_env._runs.pop(dropped.id, None)
    episode = vf.Episode(task=vf.TraceTask(type="SearchTeamTask", data=task.data), traces=agents.traces, ok=True)
    with pytest.raises(ValueError, match="do not match the episode's segments"):
        asyncio.run(team_env.finalize(task, episode))


@pytest.mark.slow
def test_vf_eval_against_a_scripted_endpoint_equals_the_in_process_run(tmp_path):
    """The acceptance run: vf-eval with the local runtime and --no-push; every episode ok,
    traces == segments, role rewards and final answers == agents.collect over the same
    endpoint (needs uv and, the first time, PyPI for the harness's script environment)."""
    bindir = Path(sys.executable).parent
    vf_eval = bindir / "vf-eval"
    if not vf_eval.exists():
        pytest.skip("vf-eval is not installed beside this Python")
    tasks, group = 2, 2
    with ScriptedEndpoint() as endpoint:
        env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
               "SCRIPTED_KEY": "unused", "HF_HUB_OFFLINE": "1"}
        cmd = [str(vf_eval), "mopd-search-team", "-m", "scripted", "-r", str(group), "-n", str(tasks),
               "--client.base-url", endpoint.base_url, "--client.api-key-var", "SCRIPTED_KEY", "--no-push",
               "--env.leader.runtime.type", "subprocess", "--env.searcher.runtime.type", "subprocess",
               "--env.answerer.runtime.type", "subprocess", "--env.retriever", "words",
               "-o", str(tmp_path), "--run.dir", "parity", "--no-rich", "--clean"]
        start = time.monotonic()
        run = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        seconds = time.monotonic() - start
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        records = read_traces(tmp_path / "parity")

        from envs.data import load_qa
        from envs.retrieval.factory import make_retriever

        questions = load_qa("hotpotqa", "dev", root="synthetic", limit=tasks)
        policy = OpenAIPolicy("scripted", base_url=endpoint.base_url, api_key_env="")
        try:
            want = collect(env_fn(retriever=make_retriever("words")), policy, questions, 1)
        finally:
            policy.close()
    print(f"vf-eval: {len(records)} episodes in {seconds:.0f} s")
    assert len(records) == tasks * group
    assert all(r["ok"] and not r.get("errors") for r in records)
    groups = groups_from_verifiers(records, tokens="mopd")
    assert [len(g) for g in groups] == [group] * tasks
    expected = {eps[0].question["id"]: eps[0] for eps in want}
    for episodes in groups:
        for ep in episodes:
            assert norm(ep) == norm(expected[ep.question["id"]])  # answers, candidates, rewards, tokens
    for record in records:
        ep = expected[record["task"]["data"]["qa_id"]]
        traced = {t["task"]["data"]["id"]: t["rewards"]["role"]["score"] for t in record["traces"]}
        assert traced == {f"{s.agent}@{s.wave}": s.reward for s in ep.segments}
