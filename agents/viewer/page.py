"""One self-contained HTML page of one episode (or two side by side), token by token.

Everything heavy happens here, once: every token becomes one ``<span class="k">`` with its
values as data attributes (:func:`token_spans`) and its colour bins as classes, so the
page's script only switches a class on ``<body>`` (colour mode), moves a highlight (n / p)
and fills one tooltip.

Colours: a diverging scale (red below 0, blue above) in 21 bins. Advantages are scaled per
role (a Searcher's OPD term and a Leader's GRPO advantage differ by orders of magnitude),
the Teacher's log-ratio ``log pi_T - log pi_old`` and the old log-prob each on one scale
(:func:`scale_of`).
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.viewer.records import EpisodeValues
from envs.episode import Episode, Segment

BINS = 10
"""Bins on each side of zero: classes ``a0``..``a20`` (``a10`` is zero)."""

MODES = {"adv": "advantage", "teacher": "log pi_T - log pi_old", "logp": "old log-prob", "plain": "generated"}
"""Colour modes: the class prefix each colours by (``a``, ``t``, ``l``), or none."""

NEGATIVE, ZERO, POSITIVE = (178, 24, 43), (247, 247, 247), (33, 102, 172)


def palette() -> list[str]:
    """The 2 * BINS + 1 colours of the diverging scale, most negative first."""
    out = []
    for i in range(-BINS, BINS + 1):
        end, t = (POSITIVE, i / BINS) if i >= 0 else (NEGATIVE, -i / BINS)
        out.append("#" + "".join(f"{round(z + (e - z) * t):02x}" for z, e in zip(ZERO, end)))
    return out


def scale_of(values: Sequence[float]) -> float:
    """The value that takes the end bin: the 95th percentile of ``|values|`` (1 when all are 0)."""
    mags = np.abs(np.asarray([v for v in values if v is not None], dtype=np.float64))
    mags = mags[np.isfinite(mags) & (mags > 0)]
    return float(np.percentile(mags, 95)) if len(mags) else 1.0


def bin_of(value: float, scale: float) -> int:
    """The bin (0 .. 2 * BINS) of ``value`` on a scale whose end bins start at ``+-scale``."""
    if not np.isfinite(value):
        return BINS
    return int(np.clip(np.rint(value / scale * BINS), -BINS, BINS)) + BINS


@dataclass
class TokenValues:
    """The values of one segment's tokens, aligned with its token ids (None: no value)."""

    adv: list[float | None]
    teacher_logratio: list[float | None]
    old: list[float | None]
    loss: list[int | None]
    """1: this token's value entered the loss; 0: predicted but not trained; None: unknown."""
    kl: list[int | None]


def token_values(ep: Episode, values: EpisodeValues | None) -> list[TokenValues]:
    """Per segment, the learner's values spread onto the segment's tokens."""
    out = []
    for i, seg in enumerate(ep.segments):
        n = len(seg.token_ids)
        tv = TokenValues([None] * n, [None] * n, [None] * n, [None] * n, [None] * n)
        sv = values.of_segment(i) if values is not None else None
        if sv is None and values is None and seg.logprobs:  # a plain episode: behaviour log-probs
            tv.old = [float(x) if m else None for x, m in zip(seg.logprobs, seg.loss_mask)]
        if sv is not None:
            for j, p in enumerate(sv.positions):
                tv.old[p] = float(sv.old_logp[j])
                if sv.advantages is not None:
                    tv.adv[p] = float(sv.advantages[j])
                if sv.teacher_logp is not None:
                    tv.teacher_logratio[p] = float(sv.teacher_logp[j]) - float(sv.old_logp[j])
                tv.loss[p] = int(sv.trained)
                tv.kl[p] = int(sv.kl)
        out.append(tv)
    return out


@dataclass
class Scales:
    """The value at the end bin of each colour mode (advantages: per role)."""

    adv: dict[str, float] = field(default_factory=dict)
    teacher: float = 1.0
    logp: float = 1.0

    @classmethod
    def of(cls, shown: Sequence[tuple[Episode, list[TokenValues]]]) -> Scales:
        by_role: dict[str, list[float]] = {}
        ratios: list[float] = []
        logps: list[float] = []
        for ep, tvs in shown:
            for seg, tv in zip(ep.segments, tvs):
                by_role.setdefault(seg.role, []).extend(v for v in tv.adv if v is not None)
                ratios.extend(v for v in tv.teacher_logratio if v is not None)
                logps.extend(v for v in tv.old if v is not None)
        return cls({r: scale_of(v) for r, v in by_role.items() if v}, scale_of(ratios), scale_of(logps))


def _num(x: float | int | None) -> str:
    """A value as a data attribute: exact (``repr`` round-trips a float), '' when None."""
    if x is None:
        return ""
    return repr(float(x)) if isinstance(x, float) else str(x)


def token_spans(seg: Segment, turns: Sequence[tuple[int, int, int]], tv: TokenValues,
                text: Callable[[int], str], scales: Scales, prefix: str) -> str:
    """The HTML of one segment's tokens: runs of env-written text (``envrun``) and the
    agent's turns (``turn``; ``turns`` holds this segment's ``(start, end, play-order
    number)``), every token a span."""
    role = html.escape(seg.role, quote=True)
    adv_scale = scales.adv.get(seg.role, 1.0)
    parts: list[str] = []

    def run(tag: str, lo: int, hi: int) -> None:  # one <span> of tokens lo..hi-1
        parts.append(tag)
        for p in range(lo, hi):
            tid = seg.token_ids[p]
            mask = seg.loss_mask[p]
            classes = ["k", "g" if mask else "e"]
            adv, ratio, old = tv.adv[p], tv.teacher_logratio[p], tv.old[p]
            if adv is not None:
                classes.append(f"a{bin_of(adv, adv_scale)}")
            if ratio is not None:
                classes.append(f"t{bin_of(ratio, scales.teacher)}")
            if old is not None and mask:
                classes.append(f"l{bin_of(old, scales.logp)}")
            piece = text(tid)
            if "\n" in piece:
                classes.append("nl")
            parts.append(
                f'<span class="{" ".join(classes)}" data-id="{tid}" data-role="{role}" data-mask="{mask}" '
                f'data-adv="{_num(adv)}" data-teacher-logratio="{_num(ratio)}" data-old="{_num(old)}" '
                f'data-loss="{_num(tv.loss[p])}" data-kl="{_num(tv.kl[p])}">{html.escape(piece)}</span>')
        parts.append("</span>")

    at = 0
    for start, end, k in sorted(turns):
        if start > at:
            run('<span class="envrun">', at, start)
        run(f'<span class="turn" id="{prefix}-t{k}" data-turn="{k}">', start, end)
        at = max(at, end)
    if at < len(seg.token_ids):
        run('<span class="envrun">', at, len(seg.token_ids))
    return "".join(parts)


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return float(np.mean(vals)) if vals else None


def workflow_tree(ep: Episode, decode: Any, tvs: list[TokenValues]) -> list[dict[str, Any]]:
    """The workflow in play order as nodes: Leader turns, waves of Searchers, Answerers.
    Built from the turn spans and the segments' roles, never from prompt text."""
    nodes: list[dict[str, Any]] = []
    seg_node: dict[int, dict[str, Any]] = {}
    for k, (s, start, end) in enumerate(ep.turn_spans):
        seg = ep.segments[s]
        said = _short(decode(seg.token_ids[start:end]))
        if seg.role == "leader":
            nodes.append({"kind": "leader", "turn": k, "text": said, "agent": seg.agent})
            continue
        kind = "wave" if seg.role == "searcher" else seg.role
        last = nodes[-1] if nodes else None
        if last is None or last["kind"] != kind or (kind == "wave" and last["wave"] != seg.wave):
            last = {"kind": kind, "wave": seg.wave, "members": []}
            nodes.append(last)
        if s not in seg_node:
            index = seg.agent.rsplit("_", 1)[-1]  # an Answerer's candidate
            c = int(index) if seg.role == "answerer" and index.isdigit() else -1
            seg_node[s] = {"seg": s, "agent": seg.agent, "role": seg.role, "first_turn": k, "turns": [],
                           "task": _short(seg.task), "output": _short(seg.output, 240), "reward": seg.reward,
                           "searches": seg.num_searches, "invalid": seg.invalid_turns,
                           "valid_end": seg.finished_validly, "adv": _mean(tvs[s].adv),
                           "em": ep.candidate_em[c] if 0 <= c < len(ep.candidate_em) else None}
            last["members"].append(seg_node[s])
        seg_node[s]["turns"].append({"turn": k, "text": said})
    return nodes


def episode_view(n: int, ep: Episode, values: EpisodeValues | None, tvs: list[TokenValues],
                 tokenizer: Any, text: Callable[[int], str], scales: Scales,
                 source: str) -> dict[str, Any]:
    """Everything the template shows of one episode (``n``: its column, 0 or 1)."""
    from markupsafe import Markup

    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=True)

    prefix = f"e{n}"
    turns: dict[int, list[tuple[int, int, int]]] = {}
    for k, (s, start, end) in enumerate(ep.turn_spans):
        turns.setdefault(s, []).append((start, end, k))
    # contexts in the order their agents first played (agents that never played last)
    order = sorted(range(len(ep.segments)), key=lambda i: turns[i][0][2] if i in turns else len(ep.turn_spans) + i)
    segments = []
    for i in order:
        seg = ep.segments[i]
        segments.append({"index": i, "agent": seg.agent, "role": seg.role, "wave": seg.wave, "reward": seg.reward,
                         "task": _short(seg.task), "tokens": len(seg.token_ids), "generated": seg.num_generated,
                         "adv": _mean(tvs[i].adv),
                         "html": Markup(token_spans(seg, turns.get(i, []), tvs[i], text, scales, prefix))})
    by_role: dict[str, list[float]] = {}  # a Searcher serving two waves counts twice
    for seg in ep.segments:
        by_role.setdefault(seg.role, []).append(seg.reward)
    role_rewards = {r: float(np.mean(v)) for r, v in by_role.items()}
    q = ep.question
    return {
        "n": n, "prefix": prefix, "source": source, "values": values, "question": q.get("question", ""),
        "gold": list(q.get("golden_answers", [])), "dataset": q.get("dataset", ""), "qid": q.get("id", ""),
        "workflow": ep.workflow, "tree": workflow_tree(ep, decode, tvs), "segments": segments,
        "selection": [(i, _short(ep.reports[i - 1], 240) if 0 < i <= len(ep.reports) else "?")
                      for i in ep.selection],
        "candidates": list(zip(ep.candidates, ep.candidate_em)), "final_answer": ep.final_answer,
        "final_em": ep.final_em, "team_em": ep.team_em, "rewards": ep.rewards, "role_rewards": role_rewards,
        "num_turns": len(ep.turn_spans), "num_tokens": sum(len(s.token_ids) for s in ep.segments),
        "searches": ep.num_searches, "waves": ep.num_waves, "invalid": ep.invalid_turns,
    }


def render_page(shown: Sequence[tuple[Episode, EpisodeValues | None, str]], tokenizer: Any) -> str:
    """The page of one episode, or two side by side (same question), as an HTML string.

    ``shown``: (episode, its values or None, where it came from, e.g. ``file#3``)."""
    import jinja2

    if not 1 <= len(shown) <= 2:
        raise ValueError(f"a page shows one or two episodes, not {len(shown)}")
    tvs = [token_values(ep, values) for ep, values, _ in shown]
    scales = Scales.of([(ep, tv) for (ep, _, _), tv in zip(shown, tvs)])
    text = functools.cache(lambda token: tokenizer.decode([token], skip_special_tokens=False))
    views = [episode_view(n, ep, values, tv, tokenizer, text, scales, source)
             for n, ((ep, values, source), tv) in enumerate(zip(shown, tvs))]
    has = {mode: any(v is not None for t in tvs for s in t for v in getattr(s, name))
           for mode, name in (("adv", "adv"), ("teacher", "teacher_logratio"), ("logp", "old"))}
    mode = next((m for m in ("adv", "teacher", "logp") if has[m]), "plain")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    return env.get_template("page.html.j2").render(
        views=views, scales=scales, palette=palette(), bins=BINS, modes=MODES, has=has, mode=mode,
        title=views[0]["question"])
