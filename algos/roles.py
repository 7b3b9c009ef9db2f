"""The table of role rules: for each stage, role (and Stage-II Searcher signal), which
advantage the role's tokens get, whether the KL to the Teacher applies to them, whether
the Teacher scores them, whether its rows are trained, and what its advantage term needs
(Teacher log-probs, the Prompted Critic).

Every consumer reads this table and nothing else: advantage routing
(:func:`assign_advantages`), the loss's KL mask and the Critic's loading (``algos.trainer``),
Teacher scoring (``algos.teacher``), metrics, the configuration's choice of Searcher signal
(:func:`searcher_signals`) and its refusal of a signal without the Teacher it needs.
Adding a Searcher signal or a role is one :class:`RoleRule` (in :data:`RULES` below, or
:func:`add_rule` from another module) plus its advantage term.

>>> rules = rules_for("team", "opd")
>>> rules["searcher"].kl, rules["leader"].kl
(False, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from algos import advantages as A

if TYPE_CHECKING:
    from algos.batch import Row

STAGES = ("teacher", "team")
"""``teacher``: Stage I (the cascade, GRPO); ``team``: Stage II (the hierarchy, GRPO + OPD)."""


@dataclass(frozen=True)
class RoleRule:
    """How the learner treats one role's tokens in one stage (and Searcher signal)."""

    stage: str
    role: str
    signal: str | None
    """The Stage-II Searcher signal this rule belongs to; None: the rule holds for any."""
    advantage: A.AdvantageTerm
    """The row-level advantage term (``algos.advantages``)."""
    kl: bool
    """The k3 KL toward the Teacher applies to these tokens (with ``kl_coef > 0``)."""
    teacher_scores: bool
    """The Teacher scores these tokens whenever there is a Teacher: for the advantage (OPD)
    or to measure how far the role is from it (metric ``teacher/kl``). Rows with ``kl`` are
    scored too when ``kl_coef > 0``: see :meth:`scored_by_teacher`."""
    trained: bool
    """Its rows reach the loss (False: they move only through shared parameters)."""
    needs_teacher: bool = False
    """Its advantage term reads Teacher log-probs: the config refuses a run of this rule
    without a Teacher, and the Teacher scores its tokens."""
    needs_critic: bool = False
    """Its advantage term reads the Prompted Critic (``AdvantageContext.critic``): the
    Trainer loads one for a run of this rule."""

    def scored_by_teacher(self, kl_coef: float) -> bool:
        """Whether a run with this ``kl_coef`` needs Teacher log-probs for these tokens."""
        return self.teacher_scores or self.needs_teacher or (self.kl and kl_coef > 0)


RULES: tuple[RoleRule, ...] = (
    # Stage I, the cascade: the Searcher's own reward (0.9 R_EM + 0.1 b_S) and the Answerers'
    # candidates, both GRPO; there is no Teacher yet.
    RoleRule("teacher", "searcher", None, A.own_reward_grpo, kl=False, teacher_scores=False, trained=True),
    RoleRule("teacher", "answerer", None, A.candidate_grpo, kl=False, teacher_scores=False, trained=True),
    # Stage II, the hierarchy: Leader and Answerers by GRPO with the KL toward the Teacher ...
    RoleRule("team", "leader", None, A.own_reward_grpo, kl=True, teacher_scores=False, trained=True),
    RoleRule("team", "answerer", None, A.candidate_grpo, kl=True, teacher_scores=False, trained=True),
    # ... and the Searchers by the chosen signal (Table 2), never with the KL: their tokens
    # are the ones distilled, and OPD already pulls them toward the Teacher.
    RoleRule("team", "searcher", "opd", A.opd_term, kl=False, teacher_scores=True, trained=True,
             needs_teacher=True),
    RoleRule("team", "searcher", "outcome", A.team_outcome_grpo, kl=False, teacher_scores=True, trained=True),
    RoleRule("team", "searcher", "none", A.no_term, kl=False, teacher_scores=True, trained=False),
    RoleRule("team", "searcher", "critic", A.critic_grpo, kl=False, teacher_scores=True, trained=True,
             needs_critic=True),
)
"""The table; :func:`add_rule` extends it (every reader looks it up when called)."""


def add_rule(rule: RoleRule) -> None:
    """Add ``rule`` to :data:`RULES`: a new Searcher signal (or role) from outside this file.
    Raises ValueError for an unknown stage or a (stage, role, signal) the table has."""
    global RULES
    if rule.stage not in STAGES:
        raise ValueError(f"RoleRule stage {rule.stage!r} is not one of {STAGES}")
    if any((r.stage, r.role, r.signal) == (rule.stage, rule.role, rule.signal) for r in RULES):
        raise ValueError(f"the table already has a rule for {(rule.stage, rule.role, rule.signal)}")
    RULES = (*RULES, rule)


def searcher_signals() -> tuple[str, ...]:
    """Stage-II Searcher signals, in table order (``opd``, the method, first)."""
    return tuple(dict.fromkeys(r.signal for r in RULES if r.signal is not None))


def rules_for(stage: str, searcher_signal: str = "opd") -> dict[str, RoleRule]:
    """The rule of every role in ``stage`` (``searcher_signal`` picks among signal rows)."""
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r} is not one of {STAGES}")
    if searcher_signal not in searcher_signals():
        raise ValueError(f"searcher_signal {searcher_signal!r} is not one of {searcher_signals()}")
    return {r.role: r for r in RULES if r.stage == stage and r.signal in (None, searcher_signal)}


def needs_teacher(rules: Mapping[str, RoleRule]) -> bool:
    """Whether a run of ``rules`` (:func:`rules_for`) cannot go without a Teacher."""
    return any(r.needs_teacher for r in rules.values())


def needs_critic(rules: Mapping[str, RoleRule]) -> bool:
    """Whether a run of ``rules`` needs the Prompted Critic loaded."""
    return any(r.needs_critic for r in rules.values())


def rule_of(rules: dict[str, RoleRule], role: str) -> RoleRule:
    """``rules[role]`` with an error that names the role and the roles the stage has."""
    try:
        return rules[role]
    except KeyError:
        stage = next(iter(rules.values())).stage if rules else "?"
        raise ValueError(f"no role rule for role {role!r} in stage {stage!r} (it has {sorted(rules)}); "
                         "add a RoleRule in algos/roles.py") from None


def assign_advantages(rows: list[Row], rules: Mapping[str, RoleRule], ctx: A.AdvantageContext) -> None:
    """Fill ``row.advantages`` (N,) and ``row.trained`` for every row from its role's rule.

    ``rules``: the run's rules (:func:`rules_for`). ``ctx``: what the terms read besides the
    rows (the batch's Episodes by question, ``row.group`` indexing them; ``beta``; the
    Prompted Critic when a rule :attr:`~RoleRule.needs_critic`). Each rule's term sees all
    of the rows it applies to at once (group-relative terms need the whole group).
    """
    by_rule: dict[str, list[Row]] = {}
    for row in rows:
        by_rule.setdefault(rule_of(rules, row.role).role, []).append(row)
    for role, mine in by_rule.items():
        rule = rules[role]
        for row, value in zip(mine, rule.advantage(mine, ctx), strict=True):
            n = int(row.mask.sum())
            row.advantages = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).copy()
            row.trained = rule.trained
