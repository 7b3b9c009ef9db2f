"""Episode records: everything the learner and the benchmarks need from one workflow.

A :class:`Segment` is one agent's context, built token by token as the episode runs:
the mask is written while tokens are appended (1 on tokens the agent generated, 0 on
prompts, retrieved passages and reports handed over), never reconstructed afterwards
(PITFALLS 1 and 2).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Segment:
    """One agent's context in one episode (a Searcher gets one per wave it served)."""

    agent: str
    """PettingZoo agent name, e.g. ``searcher_1``."""
    role: str
    """``leader``, ``searcher`` or ``answerer``."""
    wave: int
    """The wave a Searcher served (0-based); -1 for the Leader and the Answerers."""
    token_ids: list[int] = field(default_factory=list)
    """The whole context: prompt, the agent's turns, env observations."""
    loss_mask: list[int] = field(default_factory=list)
    """1 exactly on tokens this agent generated; same length as ``token_ids``."""
    logprobs: list[float] | None = field(default_factory=list)
    """Behaviour log-probs aligned with ``token_ids`` (0.0 where the mask is 0); None
    when the policy did not give them for every turn of this segment."""
    reward: float = 0.0
    """The role reward this segment earned (set when the episode ends)."""
    task: str = ""
    """What the agent was asked: the question, or a Searcher's sub-task."""
    output: str = ""
    """What it produced: a Searcher's report, an Answerer's candidate ('' when none)."""
    turns: int = 0
    invalid_turns: int = 0
    num_searches: int = 0
    finished_validly: bool = False
    """Whether the agent ended with a valid closing action (summary, select, answer)
    rather than by running out of budget."""

    def append(self, ids: Sequence[int], generated: bool, logprobs: Sequence[float] | None = None) -> None:
        """Add tokens with their mask in one place; the only way tokens enter a segment."""
        self.token_ids.extend(int(t) for t in ids)
        self.loss_mask.extend([1 if generated else 0] * len(ids))
        if self.logprobs is None:
            return
        if generated and logprobs is None:
            self.logprobs = None
        elif generated:
            self.logprobs.extend(float(x) for x in logprobs)
        else:
            self.logprobs.extend([0.0] * len(ids))

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)


@dataclass
class Episode:
    """One workflow on one question."""

    question: dict[str, Any]
    """The QA item as a FlashRAG row: id, question, golden_answers, dataset."""
    workflow: str
    segments: list[Segment] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)
    candidate_em: list[float] = field(default_factory=list)
    final_answer: str = ""
    """The majority candidate (ties: the first)."""
    team_em: float = 0.0
    """R_EM: 1 when any candidate is correct."""
    final_em: float = 0.0
    """EM of the final answer (what the benchmarks count)."""
    num_searches: int = 0
    search_failures: int = 0
    """Searches whose retriever failed (after retries); each Searcher was told and went on."""
    num_waves: int = 0
    input_tokens: int = 0
    """Sum over model calls (turns) of the context length the model read."""
    output_tokens: int = 0
    invalid_turns: int = 0
    turns: int = 0
    selection: list[int] = field(default_factory=list)
    """Report numbers the Leader handed to the Answerers."""
    reports: list[str] = field(default_factory=list)
    """Every Searcher report, numbered 1.. in arrival order."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Each agent's reward."""
    tag_counts: dict[str, int] = field(default_factory=dict)
    """Complete protocol tags per kind in all generated turns (format health)."""
    turn_spans: list[list[int]] = field(default_factory=list)
    """``[segment index, start, end]`` of every turn in play order: the turn's tokens are
    ``segments[i].token_ids[start:end]`` (replay, per-turn analysis)."""
    seed: int | None = None
    prompts: str = "paper"
    """The env's prompt set (``envs.protocol.PROMPT_SETS``); records from before it was
    kept were all played with ``paper``."""
    sampling: dict[str, Any] | None = None
    """What each role's policy sampled with, ``{role: {"temperature", "top_p",
    "max_new_tokens"} or None}`` (``agents.sampling.team_settings``; None: not recorded)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        """The Episode of a :meth:`to_dict` record. A ``values`` block (the learner's
        per-token values that training samples add, ``agents.viewer.records``) is skipped."""
        data = {k: v for k, v in data.items() if k != "values"}
        data["segments"] = [Segment(**s) for s in data.get("segments", [])]
        return cls(**data)

    def segments_of(self, role: str) -> list[Segment]:
        return [s for s in self.segments if s.role == role]


def groups_to_dicts(groups: Sequence[Sequence[Episode]]) -> list[list[dict[str, Any]]]:
    """Episodes grouped by question as plain JSON values (what crosses a process boundary:
    model- and corpus-written text travels as JSON, never pickled)."""
    return [[ep.to_dict() for ep in group] for group in groups]


def groups_from_dicts(data: Sequence[Sequence[dict[str, Any]]]) -> list[list[Episode]]:
    """The inverse of :func:`groups_to_dicts`."""
    return [[Episode.from_dict(d) for d in group] for group in data]


def question_record(episodes: Sequence[Episode]) -> dict[str, Any]:
    """One question's result over its k runs (``episodes``, all on the same question), in
    the per-question format of ``benchmarks.metrics``: ``correct`` holds each run's final
    EM; the costs are per run too."""
    if not episodes:
        raise ValueError("question_record needs at least one episode")
    q = episodes[0].question
    return {
        "dataset": q.get("dataset", ""), "id": q.get("id", ""), "question": q.get("question", ""),
        "golden_answers": list(q.get("golden_answers", [])),
        "correct": [ep.final_em for ep in episodes], "team_em": [ep.team_em for ep in episodes],
        "final_answers": [ep.final_answer for ep in episodes], "candidates": [ep.candidates for ep in episodes],
        "searches": [ep.num_searches for ep in episodes], "input_tokens": [ep.input_tokens for ep in episodes],
        "search_failures": [ep.search_failures for ep in episodes],
        "output_tokens": [ep.output_tokens for ep in episodes],
        "invalid_turns": [ep.invalid_turns for ep in episodes],
    }


def save_episodes(path: str | Path, episodes: Iterable[Episode], append: bool = False) -> None:
    """Write episodes as JSON lines (the folder is made when missing)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for ep in episodes:
            f.write(json.dumps(ep.to_dict(), ensure_ascii=False) + "\n")


def load_episodes(path: str | Path) -> list[Episode]:
    """Read episodes written by :func:`save_episodes`; a bad line (bad JSON, nested too
    deep, not an episode) names file and line."""
    from envs.data.items import loads

    episodes = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                episodes.append(Episode.from_dict(loads(line)))
            except (ValueError, TypeError, KeyError, AttributeError) as err:
                raise ValueError(f"{path}:{lineno}: not an episode record: {err}") from err
    return episodes
