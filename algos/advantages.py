"""Per-token advantages of MultiAgent-OPD (PAPER.md section 4): the math, and the
row-level terms that the table of role rules (:mod:`algos.roles`) names.

``A_t = A^GRPO_L,i`` on Leader tokens (group: the G workflows of a question),
``A^GRPO_A,i,j`` on Answerer tokens (group: the C candidates of workflow i), and
``A^OPD_S,t = beta * M_t * (log pi_T - log pi_old)`` on Searcher tokens. The Searcher's
signal is swappable for the paper's diagnostics: one term per signal row of the table.
Suffixes name dimensions: ``_G`` workflows of a question, ``_C`` candidates, ``_T`` tokens.

A row-level term is a function ``term(rows, context) -> values``: given every row one rule
applies to (in batch order) and the batch's :class:`AdvantageContext`, one value per row,
a float (the same for each of the row's tokens) or an ``(N,)`` array (one per generated
token). Which role gets which term is decided in :mod:`algos.roles` only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # for annotations only: nothing here needs the learner's row code at run time
    from algos.batch import Row
    from envs.episode import Episode


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> np.ndarray:
    """GRPO: ``(r - mean) / (std + eps)`` within one group (sample std, as TRL).

    A group whose rewards are all equal (or a group of one) gets all zeros.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.size < 2 or np.ptp(r) == 0.0:
        return np.zeros_like(r)
    return (r - r.mean()) / (r.std(ddof=1) + eps)


def opd_advantages(teacher_logp_T: np.ndarray, old_logp_T: np.ndarray, mask_T: np.ndarray,
                   beta: float = 0.01) -> np.ndarray:
    """``beta * M_t * (log pi_T(a_t|h_t) - log pi_old(a_t|h_t))`` per token.

    Both log-probs are of the tokens actually in the sequence, scored on the Searcher's own
    context; they enter as constants (detached). Masked tokens get exactly 0.
    """
    teacher = np.asarray(teacher_logp_T, dtype=np.float64)
    old = np.asarray(old_logp_T, dtype=np.float64)
    mask = np.asarray(mask_T, dtype=np.float64)
    if not teacher.shape == old.shape == mask.shape:
        raise ValueError(f"shapes differ: teacher {teacher.shape}, old {old.shape}, mask {mask.shape}")
    return beta * mask * np.where(mask > 0, teacher - old, 0.0)


def critic_rewards(team_em: float, scores: Sequence[float], em_weight: float = 0.5) -> np.ndarray:
    """Prompted Critic: a Searcher's reward ``0.5 R_EM + 0.5 score`` (ours; configurable)."""
    s = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
    return em_weight * team_em + (1.0 - em_weight) * s


# ---------------------------------------------------------------------- row-level terms


@dataclass
class AdvantageContext:
    """What the row-level terms may read besides the rows themselves."""

    groups: Sequence[Sequence[Episode]]
    """The batch's Episodes by question: ``groups[row.group]`` are the G workflows of a row's question."""
    beta: float = 0.01
    """OPD scale."""
    critic_em_weight: float = 0.5
    """Prompted Critic: weight of R_EM in a judged row's reward."""
    critic: Any = None
    """The Prompted Critic (``score_rows(rows) -> list[float]``, one score per row), or None."""

    def workflow_index(self, row: Row) -> int:
        """Which of its question's G workflows the row's episode is (by identity)."""
        for i, ep in enumerate(self.groups[row.group]):
            if ep is row.episode:
                return i
        raise ValueError(f"row of {row.segment.agent} belongs to no episode of question group {row.group}")


Values = list["float | np.ndarray"]
AdvantageTerm = Callable[[Sequence["Row"], AdvantageContext], Values]
"""``term(rows, context)``: one value per row, a float or an (N,) array."""


def own_reward_grpo(rows: Sequence[Row], ctx: AdvantageContext) -> Values:
    """GRPO of the agent's own role reward over the G workflows of its question: the Leader's
    ``R_L`` (Stage II), the cascade Searcher's ``0.9 R_EM + 0.1 b_S`` (Stage I)."""
    out: Values = []
    for row in rows:
        agent = row.segment.agent
        rewards_G = [ep.rewards.get(agent, 0.0) for ep in ctx.groups[row.group]]
        out.append(float(group_advantages(rewards_G)[ctx.workflow_index(row)]))
    return out


def candidate_grpo(rows: Sequence[Row], ctx: AdvantageContext) -> Values:
    """``A^GRPO_A,i,j``: GRPO of each Answerer's candidate EM ``c_i,j`` within its own workflow
    (the C candidates)."""
    out: Values = []
    for row in rows:
        candidate = int(row.segment.agent.rsplit("_", 1)[1])
        out.append(float(group_advantages(row.episode.candidate_em)[candidate]))
    return out


def opd_term(rows: Sequence[Row], ctx: AdvantageContext) -> Values:
    """On-policy distillation: ``beta * (log pi_T - log pi_old)`` on every generated token."""
    out: Values = []
    for row in rows:
        if row.teacher_logp is None:
            raise ValueError(f"the opd advantage of {row.segment.agent} needs Teacher log-probs; "
                             "the Teacher did not score this row")
        out.append(opd_advantages(row.teacher_logp, row.old_logp, np.ones(len(row.old_logp)), beta=ctx.beta))
    return out


def team_outcome_grpo(rows: Sequence[Row], ctx: AdvantageContext) -> Values:
    """The ``outcome`` diagnostic: GRPO of the team outcome R_EM over the G workflows of the
    row's question, on every token (the signal that collapses search in Table 2)."""
    return [float(group_advantages([ep.team_em for ep in ctx.groups[row.group]])[ctx.workflow_index(row)])
            for row in rows]


def critic_grpo(rows: Sequence[Row], ctx: AdvantageContext) -> Values:
    """Prompted Critic: ``w R_EM + (1 - w) score`` per row, GRPO over the judged rows of one
    question (all its workflows' Searchers)."""
    if ctx.critic is None:
        raise ValueError("the critic advantage needs a Prompted Critic (AdvantageContext.critic is None)")
    scores = list(ctx.critic.score_rows(list(rows)))
    if len(scores) != len(rows):
        raise ValueError(f"the critic scored {len(scores)} rows of {len(rows)}")
    by_group: dict[int, list[int]] = {}
    for k, row in enumerate(rows):
        by_group.setdefault(row.group, []).append(k)
    out: Values = [0.0] * len(rows)
    for ks in by_group.values():
        rewards = [float(critic_rewards(rows[k].episode.team_em, [scores[k]], ctx.critic_em_weight)[0]) for k in ks]
        for k, adv in zip(ks, group_advantages(rewards)):
            out[k] = float(adv)
    return out


def no_term(rows: Sequence[Row], ctx: AdvantageContext) -> Values:
    """No signal: every token's advantage is 0 (used with untrained rows)."""
    return [0.0] * len(rows)

