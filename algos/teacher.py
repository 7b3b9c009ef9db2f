"""The frozen Teacher of Stage II (PAPER.md section 4, :func:`load_teacher`) and how it scores
the team's tokens.

It scores the exact token ids each :class:`algos.batch.Row` holds (never detokenised and
retokenised), at the rollout temperature, like the policy's old log-probs; which rows, the
table of role rules says (``algos.roles``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from algos.batch import Row, score_rows
from algos.roles import RoleRule, rule_of, rules_for


def load_teacher(teacher: str, base_model: str, device: str = "cpu", dtype: str = "float32") -> Any:
    """The frozen Teacher model. ``teacher``: ``"base"`` (then ``base_model``), a Stage-I run
    directory (its latest checkpoint) or a model path; one that does not load whole raises
    :class:`agents.models.ModelFileError` naming the file."""
    from algos.engine.checkpoint import load_model

    model, _ = load_model(base_model if teacher == "base" else teacher, device, dtype)
    return freeze(model)


def freeze(model: Any) -> Any:
    """``model`` in eval mode with no parameter that asks for a gradient; returned for chaining."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def rows_to_score(rows: Sequence[Row], kl_coef: float,
                  rules: dict[str, RoleRule] | None = None) -> list[Row]:
    """The rows the Teacher must score, by their role's rule (:meth:`RoleRule.scored_by_teacher`).
    ``rules``: the run's role rules (default: Stage II with the ``opd`` Searcher signal)."""
    rules = rules if rules is not None else rules_for("team", "opd")
    return [r for r in rows if rule_of(rules, r.role).scored_by_teacher(kl_coef)]


def score_with_teacher(teacher: Any, rows: Sequence[Row], *, kl_coef: float, temperature: float,
                       max_tokens: int = 16384, pad_id: int = 0,
                       rules: dict[str, RoleRule] | None = None) -> list[Row]:
    """Fill ``row.teacher_logp`` (one log-prob per generated token, at ``temperature``) for the
    rows :func:`rows_to_score` picks; returns those rows. The others keep ``None``."""
    needs = rows_to_score(rows, kl_coef, rules)
    for row, logp in zip(needs, score_rows(teacher, needs, max_tokens=max_tokens, pad_id=pad_id,
                                           temperature=temperature)):
        row.teacher_logp = logp
    return needs
