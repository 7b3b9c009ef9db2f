"""Rewards of MultiAgent-OPD (PAPER.md sections 3 and 4), one small function per term.

Everything the env scores goes through here, so the formulas live in one place and the
tests can check each against hand-computed values.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, fields

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and articles, squeeze whitespace."""
    text = text.lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golden_answers: Sequence[str] | str) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer, else 0.0."""
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(gold) for gold in golden_answers))


def majority_answer(candidates: Sequence[str]) -> str:
    """The team's final answer: the most frequent candidate after normalisation.

    Ties go to the candidate that appears first; empty candidates (an Answerer that never
    gave a valid answer) do not vote unless every candidate is empty.
    """
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    for cand in candidates:
        key = normalize_answer(cand)
        if not key:
            continue
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, cand)
    if not counts:
        return ""
    best = max(counts.values())
    return next(first[key] for key in first if counts[key] == best)


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the role rewards; defaults are the paper's."""

    em_weight: float = 0.9
    """Weight of team EM (R_EM) in the Leader's and the Searcher's reward."""
    assign_weight: float = 0.1
    """Weight of R_assign in the Leader's reward."""
    assign_cap: int = 6
    """R_assign = min(C_tool, cap) / cap."""
    behaviour_weight: float = 0.1
    """Weight of the behaviour bonus b_S in the Searcher's reward."""
    bonus_one_search: float = 0.5
    """b_S when the summary came after exactly one search."""
    bonus_two_searches: float = 1.0
    """b_S when the summary came after two or more searches."""
    format_penalty: float = -1.0
    """b_S when the Searcher's output format was invalid (ours: replaces the bonus)."""

    def __post_init__(self) -> None:
        if self.assign_cap < 1:
            raise ValueError(f"assign_cap must be >= 1, got {self.assign_cap}")
        for f in fields(self):
            value = getattr(self, f.name)
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(f"RewardConfig.{f.name} must be finite, got {value}")

    def assign_reward(self, num_searches: int) -> float:
        """R_assign = min(C_tool, cap) / cap."""
        return min(num_searches, self.assign_cap) / self.assign_cap

    def leader_reward(self, team_em: float, num_searches: int) -> float:
        """R_L = 0.9 R_EM + 0.1 R_assign."""
        return self.em_weight * team_em + self.assign_weight * self.assign_reward(num_searches)

    def behaviour_bonus(self, num_searches: int, valid: bool) -> float:
        """b_S: the format penalty when invalid, else 0 / 0.5 / 1 for 0 / 1 / 2+ searches."""
        if not valid:
            return self.format_penalty
        if num_searches >= 2:
            return self.bonus_two_searches
        return self.bonus_one_search if num_searches == 1 else 0.0

    def searcher_reward(self, team_em: float, num_searches: int, valid: bool) -> float:
        """R_S = 0.9 R_EM + 0.1 b_S."""
        bonus = self.behaviour_bonus(num_searches, valid)
        return self.em_weight * team_em + self.behaviour_weight * bonus
