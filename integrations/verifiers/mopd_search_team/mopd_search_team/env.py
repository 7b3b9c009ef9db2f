"""SearchTeamEnv: mopd's SearchTeam as a verifiers 0.4 multi-agent ``Env``.

Three seats, ``leader``, ``searcher`` and ``answerer``. A seat left unpinned plays the
run's model (``--model``/``--client``), so one model plays every role, as the paper's
agents share their parameters; pin a seat (``--env.searcher.model ...``) to give it
another. mopd's own env (``envs.make_env``) arbitrates: it writes every prompt, parses
every turn, runs the searches and scores the episode. The seats only answer.

One mopd segment (one agent's context: the Leader's, each Answerer's, one per wave a
Searcher served) is one verifiers interaction, so one trace, whose task id is
``<agent>@<wave>`` (``searcher_1@0``, ``leader_0@-1``). A turn is one
``Interaction.turn``; what the env writes next (passages, reports, a correction) goes in
as the next user messages, every content quoted as mopd's chat policy quotes it
(``agents.openai_chat.chat_messages``). ``finalize`` records on each trace its segment's
role reward (``role``), the team's ``team_em``/``final_em``/``num_searches`` as metrics,
and in ``trace.info`` the mopd segment (``mopd_segment``: its tokens in the env's chat
format, loss mask, reward, index) and the episode without its segments
(``mopd_episode``), from which ``algos.from_verifiers`` rebuilds the Episode.

Chat APIs drop the stop string they stopped on: each seat asks for its role's stop strings
and the reply gets its closing tag back (``agents.openai_chat.restore_stop``) unless it was
cut at the token limit, exactly as ``agents.openai_chat.OpenAIPolicy`` does in process.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict, dataclass
from typing import Any

import verifiers.v1 as vf

from agents.openai_chat import chat_messages, restore_stop
from envs import make_env
from envs import protocol as P
from envs.team import TeamConfig


def _seat(role: str) -> vf.AgentConfig:
    # The null harness runs no code, so the local subprocess runtime is the default: a
    # SearchTeam seat never needs verifiers' remote sandbox (its own default).
    return vf.AgentConfig(harness={"id": "null"}, runtime=vf.SubprocessConfig(),
                          sampling=vf.SamplingConfig(stop=list(P.STOP_STRINGS[role])))


_TEAM = TeamConfig()  # the team settings default to the env's own, never copied here


class SearchTeamEnvConfig(vf.EnvConfig):
    leader: vf.AgentConfig = _seat(P.LEADER)
    searcher: vf.AgentConfig = _seat(P.SEARCHER)
    answerer: vf.AgentConfig = _seat(P.ANSWERER)
    workflow: str = _TEAM.workflow
    """``hierarchical`` (Leader, Searchers, Answerers) or ``cascade`` (Stage I: no Leader)."""
    max_waves: int = _TEAM.max_waves
    max_searchers: int = _TEAM.max_searchers
    max_searcher_turns: int = _TEAM.max_searcher_turns
    num_candidates: int = _TEAM.num_candidates
    max_answerer_turns: int = _TEAM.max_answerer_turns
    top_k: int = _TEAM.top_k
    max_turn_tokens: int = _TEAM.max_turn_tokens
    max_context_tokens: int = _TEAM.max_context_tokens
    prompts: str = _TEAM.prompts
    """mopd's prompt set (``envs.protocol.PROMPT_SETS``)."""
    retriever: str = "default"
    """``default`` (MiniLM over the synthetic world), ``words``, a corpus JSONL, or the URL
    of ``python -m envs.retrieval serve``."""
    tokenizer: str | None = None
    """The tokenizer mopd's records use (None: SmolLM2's, the env's default)."""


@dataclass
class _Seat:
    """One open interaction: a mopd segment in play."""

    stack: contextlib.AsyncExitStack
    interaction: Any
    sent: int
    """How many of the agent's chat messages the interaction has seen (its replies included)."""
    over: bool = False
    """Its run ended (a seat limit): further turns are empty."""
    closed: bool = False


class SearchTeamEnv(vf.Env[SearchTeamEnvConfig]):
    """See the module docstring."""

    def __init__(self, config: SearchTeamEnvConfig) -> None:
        super().__init__(config)
        self._kwargs: dict[str, Any] | None = None
        self._runs: dict[str, Any] = {}
        """trace id -> the mopd env that played it, from ``run`` to ``finalize`` (the G
        rollouts of a task share one Task object, so the task cannot key this)."""

    def env_kwargs(self) -> dict[str, Any]:
        """``envs.make_env`` keyword arguments, the retriever and tokenizer built once."""
        if self._kwargs is None:
            from envs.retrieval.factory import make_retriever

            cfg = self.config
            kwargs: dict[str, Any] = {k: getattr(cfg, k) for k in TeamConfig.keywords() if hasattr(cfg, k)}
            kwargs["retriever"] = make_retriever(cfg.retriever, progress=False)
            if cfg.tokenizer:
                from envs.tokenizer import load_tokenizer

                kwargs["tokenizer"] = load_tokenizer(cfg.tokenizer)
            make_env(**kwargs)  # fail at start, not in the first rollout, on a bad setting
            self._kwargs = kwargs
        return self._kwargs

    async def start(self) -> None:
        self.env_kwargs()

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        env = make_env(**self.env_kwargs())
        env.reset(seed=task.data.idx or 0, options={"question": task.question()})
        seats: dict[str, _Seat] = {}
        try:
            while not env.done:
                replies = await asyncio.gather(*(self._turn(env, agent, task, agents, seats)
                                                 for agent in env.awaiting))
                # searches and parsing: mopd's env, on this thread (its tokenizer is not
                # shared across threads)
                env.play_turns(replies)
                await asyncio.gather(*(self._close(seat) for key, seat in seats.items()
                                       if env.done or _segment_over(env, key)))
        except BaseException:
            for seat in seats.values():  # no finalize follows a failed run
                self._runs.pop(seat.interaction.trace.id, None)
            raise
        finally:
            await asyncio.gather(*(self._close(seat) for seat in seats.values()), return_exceptions=True)

    async def _turn(self, env: Any, agent: str, task: vf.Task, agents: vf.Agents,
                    seats: dict[str, _Seat]) -> tuple[str, str]:
        """One turn of ``agent``: its reply, the closing tag restored ("" once its run ended)."""
        obs = env.turn_observation(agent)
        key = f"{agent}@{obs.info['wave']}"
        messages = chat_messages(obs)
        seat = seats.get(key)
        if seat is None:
            system = messages[0]["content"] if messages[0]["role"] == "system" else None
            prompt = messages[1:] if system is not None else messages
            sub = vf.Task(vf.TaskData(idx=task.data.idx, id=key, system_prompt=system,
                                      prompt=prompt[0]["content"] if len(prompt) == 1 else prompt))
            stack = contextlib.AsyncExitStack()
            interaction = await stack.enter_async_context(getattr(agents, obs.role).interaction(sub))
            seat = seats[key] = _Seat(stack, interaction, len(messages))
            self._runs[interaction.trace.id] = env
            segment = await interaction.turn()
        elif seat.closed:
            raise RuntimeError(f"{key} awaits a turn after its segment was judged over")
        elif seat.over:
            return agent, ""
        else:
            new = messages[seat.sent:]
            if not new or any(m["role"] != "user" for m in new):
                raise RuntimeError(f"{key}: expected new user messages after the agent's reply, got roles "
                                   f"{[m['role'] for m in new]}")
            segment = await seat.interaction.turn(new)
        seat.sent = len(messages) + 1
        if segment.terminated:  # a seat limit ended the run: an empty (invalid) turn
            seat.over = True
            return agent, ""
        text = _reply_text(segment)
        calls = seat.interaction.trace.calls
        if calls and calls[-1].finish_reason == "length":  # a cut-off turn closed nothing
            return agent, text
        return agent, restore_stop(text, obs.stop)

    async def _close(self, seat: _Seat) -> None:
        """End a seat's interaction (its trace completes, ``user_closed``), once."""
        if not seat.closed:
            seat.closed = True
            await seat.stack.aclose()

    async def finalize(self, task: vf.Task, episode: vf.Episode) -> None:
        played = {id(env): env for env in (self._runs.pop(t.id, None) for t in episode.traces) if env is not None}
        if len(played) != 1:
            raise ValueError(f"the episode's {len(episode.traces)} traces come from {len(played)} SearchTeam "
                             "episodes; expected exactly one")
        ep = next(iter(played.values())).episode
        segments = {f"{s.agent}@{s.wave}": (i, s) for i, s in enumerate(ep.segments)}
        traced = [t.task.data.id for t in episode.traces]
        if sorted(traced) != sorted(segments):
            raise ValueError(f"traces {sorted(traced)} do not match the episode's segments {sorted(segments)}")
        summary = {k: v for k, v in ep.to_dict().items() if k != "segments"}
        for trace in episode.traces:
            index, seg = segments[trace.task.data.id]
            trace.record_reward("role", float(seg.reward))
            trace.record_metric("team_em", float(ep.team_em))
            trace.record_metric("final_em", float(ep.final_em))
            trace.record_metric("num_searches", float(ep.num_searches))
            trace.info["mopd_segment"] = {"index": index, **asdict(seg)}
            trace.info["mopd_episode"] = summary


def _segment_over(env: Any, key: str) -> bool:
    """Whether a segment can take no more turns: a Searcher or Answerer that no longer
    awaits (its wave's segment, or its answer, is done; the Leader's context goes on)."""
    agent = key.rsplit("@", 1)[0]
    return P.role_of(agent) != P.LEADER and agent not in env.awaiting


def _reply_text(segment: Any) -> str:
    """The last assistant message's content as the model wrote it (``last_reply`` strips
    whitespace, which would change the turn's tokens)."""
    for message in reversed(segment.messages):
        if isinstance(message, vf.AssistantMessage):
            return message.content if isinstance(message.content, str) else segment.last_reply
    return segment.last_reply
