"""What decides whether outcome RL keeps or drops search, as figures over Episodes (issue 30).

The Searcher's first decision (``<search>`` or ``<summary>``) gets its workflow's advantage,
and under GRPO the expected push on log-odds(search) follows the *within-group covariance*
between searching and R_EM: positive, outcome RL raises search; at or below zero (searches that
do not pay, a no-search path that is right on its own), it can drop it. Only groups whose R_EM
varies carry an outcome advantage at all. :func:`search_covariance` measures both on groups
of sampled workflows; :func:`greedy_figures` gives greedy avg@1 with the two-choice questions
apart; :class:`NothingFound` is the retriever for "what the team knows without searching", and
:class:`SearchFirst` the policy for "what it would score if no Searcher skipped the tool": the
most that unlearning the skip habit alone can gain.
The learner logs :func:`outcome_signal` at every step (``team/mixed_em_groups``,
``team/cov_searches_em``); a recipe can measure a base with the rest before training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from envs import protocol as P
from envs.data.synthwiki import COMPARISON_STYLES
from envs.retrieval.passage import Passage

SKIP_FILE = "skip_probability.json"
"""In a run's directory: the Searchers' skip probability of the run's starting model and final
checkpoint (``{"step0", "final", "final_step", ...}``), Table 2's continuous endpoint."""

QUESTION_SUBSETS_FILE = "question_subsets.json"
"""In an ablation's directory: named sets of its validation questions that Table 2 reports
apart (``{name: {"about": text, "questions": [[dataset, id], ...]}}``)."""


class NothingFound:
    """A retriever that finds nothing: the team plays on what it knows without searching."""

    def search(self, queries: Sequence[str], top_k: int = 3) -> list[list[Passage]]:
        return [[] for _ in queries]


class SearchFirst:
    """A token policy whose Searchers never report before searching: a Searcher turn with no
    search of its own yet starts with ``search_token`` (at log-prob 0), ``policy`` writing the
    rest and every other turn. (Given ``<summary>``'s id, its Searchers never search.)"""

    def __init__(self, policy: Any, search_token: int):
        self.policy, self.search_token = policy, int(search_token)

    def act(self, observations: Sequence[Any]) -> list[Any]:
        from agents.base import Action

        forced = [o.role == P.SEARCHER and not o.info.get("queries") and o.max_new_tokens > 1
                  for o in observations]
        asked = [replace(o, token_ids=np.append(np.asarray(o.token_ids, np.int64), self.search_token),
                         max_new_tokens=o.max_new_tokens - 1) if f else o
                 for o, f in zip(observations, forced, strict=True)]
        actions = self.policy.act(asked)
        out = []
        for action, f in zip(actions, forced, strict=True):
            if f:
                if not isinstance(action, Action) or action.token_ids is None:
                    raise TypeError("SearchFirst wraps a token policy: its actions must carry token_ids")
                logprobs = None if action.logprobs is None else [0.0, *action.logprobs]
                action = Action(token_ids=[self.search_token, *action.token_ids], logprobs=logprobs)
            out.append(action)
        return out


def _covariances(groups: Sequence[Sequence[Any]],
                 searched: Callable[[Any], float] = lambda ep: ep.num_searches) -> np.ndarray:
    """Per group, the population covariance of ``searched(episode)`` with R_EM (``team_em``)."""
    out = []
    for g in groups:
        x = np.array([searched(ep) for ep in g], float)
        r = np.array([ep.team_em for ep in g], float)
        out.append(float(np.mean((x - x.mean()) * (r - r.mean()))))
    return np.array(out)


def _mixed(groups: Sequence[Sequence[Any]]) -> np.ndarray:
    """Per group, whether its R_EM varies (only those carry an outcome advantage)."""
    return np.array([len({ep.team_em for ep in g}) > 1 for g in groups])


def outcome_signal(groups: Sequence[Sequence[Any]]) -> dict[str, float]:
    """Per training step, what outcome GRPO can push on (module docstring): the share of
    ``groups`` whose R_EM varies and the mean within-group covariance of searches with R_EM."""
    return {"mixed_em_groups": float(_mixed(groups).mean()), "cov_searches_em": float(_covariances(groups).mean())}


def search_covariance(groups: Sequence[Sequence[Any]], *, n_resamples: int = 2000,
                      seed: int = 0) -> dict[str, Any]:
    """The within-group covariance of searching with R_EM over ``groups`` (the G workflows of
    a question each): the mean of each group's, for the search count and for "searched at
    all", with a 95% bootstrap over questions, and the sampled rates (a one-workflow group: 0)."""
    if not groups or any(not g for g in groups):
        raise ValueError("search_covariance needs at least one non-empty group of episodes")
    counts = _covariances(groups)
    any_search = _covariances(groups, lambda ep: float(ep.num_searches > 0))
    mixed = _mixed(groups)
    episodes = [ep for g in groups for ep in g]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(groups), size=(n_resamples, len(groups)))

    def interval(values: np.ndarray) -> list[float]:
        means = values[picks].mean(axis=1)
        return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]

    mixed_counts = counts[mixed] if mixed.any() else np.array([0.0])
    return {
        "groups": len(groups), "group_size": max(len(g) for g in groups),
        "cov_searches_em": float(counts.mean()), "cov_searches_em_ci95": interval(counts),
        "cov_searched_em": float(any_search.mean()), "cov_searched_em_ci95": interval(any_search),
        "cov_searches_em_mixed_groups": float(mixed_counts.mean()),
        "mixed_group_share": float(mixed.mean()),
        "searches_per_workflow": float(np.mean([ep.num_searches for ep in episodes])),
        "searched_share": float(np.mean([ep.num_searches > 0 for ep in episodes])),
        "team_em": float(np.mean([ep.team_em for ep in episodes])),
        "invalid_rate": sum(ep.invalid_turns for ep in episodes) / max(1, sum(ep.turns for ep in episodes)),
        "ci": "percentile bootstrap over questions (groups), seeds fixed",
    }


def two_choice(questions: Sequence[Any]) -> set[tuple[str, str]]:
    """``(dataset, id)`` of the two-choice questions among ``questions`` (QAItems): the
    synthetic comparison styles, whose answer is one of two names written in the question."""
    return {(q.dataset, q.id) for q in questions if (q.metadata or {}).get("style") in COMPARISON_STYLES}


def greedy_figures(episodes: Sequence[Any], two_choice_ids: set[tuple[str, str]] = frozenset()) -> dict[str, Any]:
    """avg@1 (final EM) as a macro over datasets, and apart on the questions that are not
    two-choice (``two_choice_ids``: their ``(dataset, id)``); searches and invalid turns per
    workflow."""
    by_dataset: dict[str, list[float]] = {}
    open_by_dataset: dict[str, list[float]] = {}
    for ep in episodes:
        dataset = ep.question.get("dataset", "")
        by_dataset.setdefault(dataset, []).append(ep.final_em)
        if (dataset, ep.question.get("id")) not in two_choice_ids:
            open_by_dataset.setdefault(dataset, []).append(ep.final_em)
    n = max(1, len(episodes))
    return {
        "questions": len(episodes),
        "macro_avg@1": float(np.mean([np.mean(v) for v in by_dataset.values()])),
        "macro_avg@1_not_two_choice": float(np.mean([np.mean(v) for v in open_by_dataset.values()])),
        "two_choice_questions": len(episodes) - sum(len(v) for v in open_by_dataset.values()),
        "right": int(sum(ep.final_em for ep in episodes)),
        "searches_per_workflow": sum(ep.num_searches for ep in episodes) / n,
        "invalid_turns_per_workflow": sum(ep.invalid_turns for ep in episodes) / n,
        "per_dataset": {d: float(np.mean(v)) for d, v in sorted(by_dataset.items())},
    }
