"""Per-token advantages of MultiAgent-OPD (PAPER.md section 4), routed by role.

``A_t = A^GRPO_L,i`` on Leader tokens (group: the G workflows of a question),
``A^GRPO_A,i,j`` on Answerer tokens (group: the C candidates of workflow i), and
``A^OPD_S,t = beta * M_t * (log pi_T - log pi_old)`` on Searcher tokens. The Searcher's
signal is swappable for the paper's diagnostics: ``outcome``, ``none``, ``critic``.
Suffixes name dimensions: ``_G`` workflows of a question, ``_C`` candidates, ``_T`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SEARCHER_SIGNALS = ("opd", "outcome", "none", "critic")


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> np.ndarray:
    """GRPO: ``(r - mean) / (std + eps)`` within one group (sample std, as TRL).

    A group whose rewards are all equal (or a group of one) gets all zeros.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.size < 2 or np.ptp(r) == 0.0:
        return np.zeros_like(r)
    return (r - r.mean()) / (r.std(ddof=1) + eps)


def leader_advantages(leader_rewards_G: Sequence[float]) -> np.ndarray:
    """``A^GRPO_L,i`` over the G workflows of one question (rewards R_L,i)."""
    return group_advantages(leader_rewards_G)


def answerer_advantages(candidate_em_C: Sequence[float]) -> np.ndarray:
    """``A^GRPO_A,i,j`` within one workflow over its C candidates (rewards c_i,j)."""
    return group_advantages(candidate_em_C)


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


def outcome_advantages(team_em_G: Sequence[float]) -> np.ndarray:
    """The ``outcome`` diagnostic: each Searcher token gets its workflow's GRPO advantage of
    the team outcome R_EM (the signal that collapses search in Table 2)."""
    return group_advantages(team_em_G)


def critic_rewards(team_em: float, scores: Sequence[float], em_weight: float = 0.5) -> np.ndarray:
    """Prompted Critic: a Searcher's reward ``0.5 R_EM + 0.5 score`` (ours; configurable)."""
    s = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
    return em_weight * team_em + (1.0 - em_weight) * s
