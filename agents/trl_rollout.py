"""SearchTeam rollouts for TRL's ``GRPOTrainer(rollout_func=...)``: GRPO for the Leader or one
Answerer (optional extra ``trl``; this module itself imports nothing of TRL's). Each GRPO
sample is one role's segment of one episode (:func:`segment_sample`); the Searchers' per-token
OPD term cannot be TRL's one scalar advantage per sample, so ``role="searcher"`` is refused.
The mapping, an example and the tests: docs/ecosystems.md, "TRL".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agents.collect import collect
from envs.episode import Episode

ROLES = ("leader", "answerer")
"""The roles a GRPO sample can be: one segment per episode each (an Answerer by index)."""


def make_rollout_func(env_fn: Callable[[], Any], role: str = "answerer", *,
                      questions: Mapping[str, Any] | None = None,
                      policy_factory: Callable[[Any, int], Any] | None = None, answerer: int = 0,
                      seed: int = 0) -> Callable[[list[str], Any], dict[str, list]]:
    """A ``rollout_func(prompts, trainer)`` that plays SearchTeam episodes and returns one
    ``role`` segment per prompt (the mapping: docs/ecosystems.md, "TRL"); every call draws
    new episodes (seeds ``seed + call * 1_000_003 + ...``). ``questions`` maps a prompt to
    its QA item (a prompt not in it is played as a plain question, whose EM is always 0).
    ``policy_factory(trainer, call)`` makes the policy that plays every role (default: an
    ``agents.hf.HFPolicy`` on ``trainer.model``, seeded by the call number).
    ``answerer``: which Answerer's segment (``answerer_<i>``)."""
    if role not in ROLES:
        hint = (" The Searchers' per-token OPD term cannot be a TRL sample's scalar advantage: train "
                "them with python -m algos train." if role == "searcher" else "")
        raise ValueError(f"role must be one of {ROLES}, got {role!r}.{hint}")
    agent = "leader_0" if role == "leader" else f"answerer_{answerer}"
    calls = itertools.count()

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, list]:
        group = getattr(trainer, "num_generations", None) or getattr(getattr(trainer, "args", None),
                                                                      "num_generations", None)
        if not isinstance(group, int) or group < 1:
            raise ValueError(f"cannot read num_generations from {type(trainer).__name__}")
        unique = blocks(prompts, group)
        call = next(calls)
        policy = (policy_factory or _hf_policy)(trainer, call)
        items = [questions.get(p, p) if questions is not None else p for p in unique]
        groups = collect(env_fn, policy, items, group_size=group, seed=seed + call * 1_000_003)
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                "role_reward", "team_em", "final_em")}
        for ep in (ep for episodes in groups for ep in episodes):
            for key, value in segment_sample(ep, agent).items():
                out[key].append(value)
        return out

    return rollout_func


def blocks(prompts: Sequence[str], group: int) -> list[str]:
    """The unique prompts of TRL's layout (each repeated ``group`` times in a row)."""
    if group < 1 or len(prompts) % group:
        raise ValueError(f"{len(prompts)} prompts do not split into groups of {group}")
    unique = list(prompts[::group])
    for b, p in enumerate(unique):
        if any(q != p for q in prompts[b * group:(b + 1) * group]):
            raise ValueError(f"prompts {b * group}..{(b + 1) * group - 1} are not one prompt repeated "
                             f"{group} times: TRL's rollout_func layout changed")
    return unique


def segment_sample(ep: Episode, agent: str) -> dict[str, Any]:
    """One GRPO sample from ``agent``'s segment of ``ep``: ``prompt_ids`` up to its first
    generated token, then ``completion_ids``, ``logprobs`` and ``env_mask`` (its loss mask)
    over the rest, and the rewards (docs/ecosystems.md, "TRL")."""
    seg = next((s for s in ep.segments if s.agent == agent), None)
    if seg is None:
        raise ValueError(f"episode {ep.question.get('id')!r} has no segment of {agent} "
                         f"(agents: {sorted({s.agent for s in ep.segments})})")
    first = next((i for i, m in enumerate(seg.loss_mask) if m), None)
    if first is None:
        raise ValueError(f"{agent} generated no token in episode {ep.question.get('id')!r}")
    if seg.logprobs is None:
        raise ValueError(f"{agent}'s segment has no behaviour log-probs: the policy must return them")
    return {"prompt_ids": seg.token_ids[:first], "completion_ids": seg.token_ids[first:],
            "logprobs": seg.logprobs[first:], "env_mask": seg.loss_mask[first:],
            "role_reward": float(seg.reward), "team_em": float(ep.team_em), "final_em": float(ep.final_em)}


def role_reward(prompts: Any, completions: Any, role_reward: Sequence[float], **kwargs: Any) -> list[float]:
    """A TRL reward function: the segment's own role reward (the Leader's
    ``0.9 R_EM + 0.1 R_assign``, an Answerer's candidate EM)."""
    return [float(r) for r in role_reward]


def _hf_policy(trainer: Any, call: int) -> Any:
    from agents.hf import HFPolicy

    return HFPolicy(trainer.model, trainer.processing_class, temperature=1.0, seed=call)
