"""The table of role rules: for each stage, role (and Stage-II Searcher signal), which
advantage the role's tokens get, whether the KL to the Teacher applies to them, whether
the Teacher scores them, whether its rows are trained, and what its advantage term needs
(Teacher log-probs, the Prompted Critic).

Every consumer reads this table and nothing else: advantage routing and each row's flags
(:func:`assign_advantages`), the Critic's loading, Teacher scoring, metrics and the config's
checks. Adding a Searcher signal or a role is one :class:`RoleRule` (in :data:`RULES`, or
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
    """The Teacher scores these tokens whenever there is one (for OPD, or the ``teacher/kl``
    metric); see :meth:`scored_by_teacher`."""
    trained: bool
    """Its rows reach the loss (False: they move only through shared parameters)."""
    needs_teacher: bool = False
    """Its advantage term reads Teacher log-probs (a run without a Teacher is refused)."""
    needs_critic: bool = False
    """Its advantage term reads the Prompted Critic (the Trainer loads one)."""

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
    """Add ``rule`` (a new Searcher signal or role) to :data:`RULES`; ValueError for an unknown
    stage, a (stage, role, signal) the table has, or :func:`check_declared_needs`' refusal."""
    global RULES
    if rule.stage not in STAGES:
        raise ValueError(f"RoleRule stage {rule.stage!r} is not one of {STAGES}")
    check_declared_needs(rule)
    if any((r.stage, r.role, r.signal) == (rule.stage, rule.role, rule.signal) for r in RULES):
        raise ValueError(f"the table already has a rule for {(rule.stage, rule.role, rule.signal)}")
    RULES = (*RULES, rule)


class _Undeclared:
    """What :func:`check_declared_needs` hands a term for a need its rule does not declare:
    any use of it (as an array, a number or an object) raises."""

    def __init__(self, what: str, flag: str):
        self._why = f"reads {what} but its rule does not declare {flag}=True"

    def _refuse(self, *args: object) -> None:
        raise ValueError(self._why)

    __array__ = __len__ = __iter__ = __getitem__ = __float__ = __neg__ = __getattr__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _refuse


def check_declared_needs(rule: RoleRule) -> None:
    """Refuse (ValueError) a rule whose term reads Teacher log-probs without ``needs_teacher``
    or the Critic without ``needs_critic``, before any model loads: the term runs on a probe of
    two rows whose undeclared needs raise when used (any other failure is left to the learner)."""
    from types import SimpleNamespace

    from algos.batch import Row
    from envs.episode import Episode, Segment

    agent, rows = f"{rule.role}_0", []
    for em in (1.0, 0.0):
        seg = Segment(agent=agent, role=rule.role, wave=0, token_ids=[1, 2, 3, 4], loss_mask=[0, 1, 1, 1], reward=em)
        ep = Episode(question={"id": "probe"}, workflow="hierarchical", segments=[seg], candidate_em=[em, 1.0 - em],
                     team_em=em, final_em=em, rewards={agent: em})
        rows.append(Row(seg.token_ids, seg.loss_mask, seg, ep, 0, old_logp=np.zeros(3), teacher_logp=np.zeros(3)
                        if rule.needs_teacher else _Undeclared("Teacher log-probs", "needs_teacher")))
    critic = (SimpleNamespace(score_rows=lambda rows: [0.5] * len(rows)) if rule.needs_critic
              else _Undeclared("the Prompted Critic", "needs_critic"))
    try:
        rule.advantage(rows, A.AdvantageContext(groups=[[r.episode for r in rows]], critic=critic))
    except ValueError as err:
        if "but its rule does not declare" in str(err):
            raise ValueError(f"the {rule.stage} {rule.role} rule of signal {rule.signal}: its term "
                             f"{getattr(rule.advantage, '__name__', rule.advantage)} {err}") from None
    except Exception:  # noqa: BLE001, S110  (a term the probe cannot run: left to the learner)
        pass


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


def assign_advantages(rows: list[Row], rules: Mapping[str, RoleRule], ctx: A.AdvantageContext,
                      kl_coef: float = 0.0) -> None:
    """Fill ``row.advantages`` (N,) for every row from its role's rule, and its flags
    (:func:`mark_rows`); each rule's term sees all of its rows at once (a group-relative term
    needs the whole group), and ``ctx`` what it reads besides them."""
    mark_rows(rows, rules, kl_coef)
    by_rule: dict[str, list[Row]] = {}
    for row in rows:
        by_rule.setdefault(row.role, []).append(row)
    for role, mine in by_rule.items():
        for row, value in zip(mine, rules[role].advantage(mine, ctx), strict=True):
            n = int(row.mask.sum())
            row.advantages = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).copy()


def mark_rows(rows: list[Row], rules: Mapping[str, RoleRule], kl_coef: float = 0.0) -> None:
    """The one place that decides, per row, ``row.trained`` (its rule's) and ``row.kl`` (its
    rule's ``kl`` and ``kl_coef > 0``). A row with the KL must carry Teacher log-probs."""
    for row in rows:
        rule = rule_of(rules, row.role)
        row.trained, row.kl = rule.trained, rule.kl and kl_coef > 0
        if row.kl and row.teacher_logp is None:
            raise ValueError(f"the KL toward the Teacher applies to {row.role} tokens, but the Teacher "
                             f"did not score the row of {row.segment.agent if row.segment else '?'}")
