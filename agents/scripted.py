"""ScriptedPolicy: a search team without a language model, the baseline every learned team
should beat.

It plays all three roles from what the env tells each agent (``Observation.info``; never
the world, the gold answers or prompt text), reading questions and passages with
:mod:`agents.reading`:

- **Leader:** one sub-task per chain and hop; after each wave it reads the bridge entity
  from the reports and dispatches the next hop (the last wave takes what is left of a
  chain); then it selects the reports that answered their sub-task.
- **Searcher:** searches its task, resolves as many hops as the passages allow, searches
  again for the first unresolved hop (its question, then its entity plus the relation's
  keywords) up to ``max_searches``, and summarises with the answer-bearing sentences.
- **Answerer:** follows the chain through the evidence; for a comparison it compares the
  years found for each option; otherwise a span of the asked type that is not already
  in the question.

The same observation always gives the same turn (``seed`` only breaks ties where
the evidence cannot decide a comparison, and picks the tasks ``skip_search`` skips).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents.base import Observation
from agents.reading import (
    RELATIONS,
    YEAR,
    Chain,
    Hop,
    Plan,
    answer_kind,
    in_text,
    parse_question,
    read_by_type,
    render,
    resolve,
    sentences_of,
    starts_with,
)
from envs import protocol as P


@dataclass
class _Progress:
    """How far the Leader has followed one chain: the entity reached, what is left."""

    entity: str
    relations: tuple[str, ...]
    stuck: bool = False


SKIPPED_REPORT = "Nothing found."
"""The report of a Searcher that found nothing, or (``skip_search``) did not search."""


class ScriptedPolicy:
    """The scripted team; ``act`` plays any mix of Leaders, Searchers and Answerers.

    Args:
        max_searches: most searches per Searcher task (it stops earlier once it has read
            an answer to every hop).
        seed: breaks ties a comparison's evidence cannot decide, deterministically per
            observation text.
        skip_search: the share of Searcher tasks reported on without searching (the report
            is ``SKIPPED_REPORT``), picked by a hash of ``seed`` and the task: a deliberately
            flawed team, for a warm start that under-searches the way untrained models do.
        repeat_queries: when True, a Searcher whose search did not resolve its hop may ask
            the same query again; by default it moves on to the entity and keywords. (The
            micro recipe's base imitates a team that repeated itself.)
        memory: closed-book facts, ``(entity, relation) -> sentence`` (e.g.
            ``SynthWiki.geography()``): a Searcher that skips the search on a one-hop task it
            knows reports the fact instead of ``SKIPPED_REPORT`` (docs/table2.md).
        skip_known: ``skip_search`` for the one-hop tasks :attr:`memory` holds (None: the
            same share as any task). The same draw decides both, so a task skipped at the
            smaller share is skipped at the larger.
    """

    def __init__(self, max_searches: int = 2, seed: int = 0, skip_search: float = 0.0,
                 repeat_queries: bool = False, memory: Mapping[tuple[str, str], str] | None = None,
                 skip_known: float | None = None):
        if max_searches < 1:
            raise ValueError(f"max_searches must be >= 1, got {max_searches}")
        for name, share in (("skip_search", skip_search), ("skip_known", skip_known)):
            if share is not None and not 0 <= share <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {share}")
        self.max_searches = max_searches
        self.seed = seed
        self.skip_search = skip_search
        self.repeat_queries = repeat_queries
        self.memory = dict(memory or {})
        self.skip_known = skip_search if skip_known is None else skip_known

    def skips(self, task: str, known: bool = False) -> bool:
        """Whether the Searcher reports on ``task`` (``known``: from memory) without searching."""
        share = self.skip_known if known else self.skip_search
        return random.Random(f"{self.seed}:skip:{task}").random() < share

    def act(self, observations: Sequence[Observation]) -> list[str]:
        return [self.turn(obs.role, obs.info, obs.max_new_tokens, context=lambda o=obs: o.text)
                for obs in observations]

    def turn(self, role: str, info: Mapping[str, Any], max_new_tokens: int = 256,
             context: str | Callable[[], str] = "") -> str:
        """One turn of ``role`` from what it knows (``info``: the env's ``infos[agent]`` or
        ``Observation.info``); a report is shortened to fit ``max_new_tokens`` (at about three
        characters a token). ``context`` (the context text, or a function giving it) only
        seeds the tie-break of a comparison the evidence cannot decide."""
        if not isinstance(info, Mapping) or "question" not in info:
            raise TypeError("ScriptedPolicy reads the env's structure, not prompt text: pass the "
                            "observation's info (obs.info / infos[agent]), got "
                            f"{type(info).__name__}")
        if role == P.LEADER:
            return self._leader(info)
        if role == P.SEARCHER:
            return self._searcher(info, max(40, min(600, 3 * max_new_tokens - 30)))
        if role == P.ANSWERER:
            return self._answerer(info, context)
        raise ValueError(f"unknown role {role!r}; expected one of {P.ROLES}")

    def _leader(self, info: Mapping[str, Any]) -> str:
        question = info["question"].strip()
        plan = parse_question(question)
        max_searchers = info.get("max_searchers", 3)
        reports = [(n, task.strip(), (report or P.NO_REPORT).strip()) for n, task, report, *_ in info.get("reports", ())]
        waves_left = info.get("waves_left", info.get("max_waves", 3))
        chains = [_Progress(c.entity, c.relations) for c in plan.chains]
        useful: list[int] = []
        for n, task, report in reports:
            sents = sentences_of("", report)
            for c in chains:
                if c.stuck or not c.relations:
                    continue
                k = next((k for k in range(1, len(c.relations) + 1)
                          if render(c.entity, c.relations[:k]) == task), None)
                if k is None:
                    continue
                last = k == len(c.relations)
                hops = resolve(Chain(c.entity, c.relations[:k]), sents,
                               exclude=question if last and not plan.is_comparison else "",
                               question=question)
                if len(hops) == k:
                    c.entity, c.relations = hops[-1].answer, c.relations[k:]
                    useful.append(n)
                else:
                    c.stuck = True
                break
        pending = [c for c in chains if not c.stuck and c.relations]
        if pending and waves_left > 0:
            tasks = []
            for c in pending[:max_searchers]:
                # Spread the hops over the waves left; the last wave takes the rest.
                k = max(1, len(c.relations) - waves_left + 1)
                tasks.append(render(c.entity, c.relations[:k]))
            return P.write_subtasks(tasks)
        if any(c.stuck or c.relations for c in chains) or not useful:
            useful = [n for n, _, _ in reports]
        return P.write_select(sorted(set(useful)))

    def _searcher(self, info: Mapping[str, Any], max_chars: int = 600) -> str:
        task = info["task"].strip()
        plan = parse_question(task)
        searches = list(info.get("passages", ()))  # one list of passages per search
        asked = () if self.repeat_queries else list(info.get("queries", ()))
        seen, sents = set(), []
        for p in (p for ps in searches for p in ps):
            doc = (str(getattr(p, "title", "")).strip(), str(getattr(p, "text", "")).strip())
            if doc not in seen:
                seen.add(doc)
                sents += sentences_of(*doc)
        exclude = "" if plan.is_comparison else task
        progress = [(c, resolve(c, sents, exclude, task)) for c in plan.chains]
        open_chains = [(c, hops) for c, hops in progress if len(hops) < len(c.relations)]
        last_turn = bool(searches) and info.get("turns_left", 2) <= 1
        one_hop = len(plan.chains) == 1 and len(plan.chains[0].relations) == 1
        recalled = (self.memory.get((plan.chains[0].entity, plan.chains[0].relations[0]))
                    if one_hop else None)
        if not searches and self.skips(task, known=recalled is not None):
            return P.write("summary", recalled or SKIPPED_REPORT)
        if open_chains and len(searches) < self.max_searches and not last_turn:
            if not searches and one_hop:
                return P.write("search", task)
            # The next hop of every open chain: all in one query when there are several
            # (a comparison's options), then one by one, then by entity and keywords.
            hops_next = [(hops[-1].answer if hops else c.entity, c.relations[len(hops)])
                         for c, hops in open_chains]
            asks = [render(entity, (rel,)) for entity, rel in hops_next]
            candidates = ([" ".join(asks)] if len(asks) > 1 else []) + [
                q for (entity, rel), ask in zip(hops_next, asks)
                for q in (ask, f"{entity} {RELATIONS[rel].keywords}".strip())]
            query = next((q for q in candidates if q not in asked), None)
            if query is not None:
                return P.write("search", query)
        return P.write("summary", self._summary(progress, sents, max_chars))

    def _summary(self, progress: list[tuple[Chain, list[Hop]]], sents: list[str],
                 max_chars: int) -> str:
        """The answer-bearing sentences of every resolved hop; for a gap, the sentences
        that mention its entity (or the top passage's first sentence)."""
        lines: list[str] = []
        for chain, hops in progress:
            lines += [h.sentence for h in hops]
            if len(hops) < len(chain.relations):
                entity = hops[-1].answer if hops else chain.entity
                about = [s for s in sents if starts_with(s, entity)]
                lines += about[:2] or [s for s in sents if in_text(entity, s)][:1]
        if not lines and sents:
            lines = [sents[0]]
        text = " ".join(dict.fromkeys(lines))
        return text[:max_chars] if text else SKIPPED_REPORT

    def _answerer(self, info: Mapping[str, Any], context: str | Callable[[], str] = "") -> str:
        question = info["question"].strip()
        plan = parse_question(question)
        sents = [s for _, item in info.get("evidence", ()) for s in sentences_of("", item)]
        if plan.is_comparison:
            return P.write("answer", self._compare(plan, sents, context))
        chain = plan.chains[0]
        hops = resolve(chain, sents, exclude=question, question=question)
        if len(hops) == len(chain.relations):
            return P.write("answer", hops[-1].answer)
        # The chain broke: a span of the final answer's type, from the latest evidence.
        kind = RELATIONS[chain.relations[-1]].kind
        if chain.relations[-1] == "ask":
            kind = answer_kind(question)
        hop = read_by_type(kind, question, sents[::-1], question)
        return P.write("answer", hop.answer if hop else "")

    def _compare(self, plan: Plan, sents: list[str], context: str | Callable[[], str]) -> str:
        values: list[int | None] = []
        for chain in plan.chains:
            hops = resolve(chain, sents)
            year = re.search(YEAR, hops[-1].answer) if len(hops) == len(chain.relations) else None
            if year is None:  # a year in a sentence about the option itself
                year = next((m for s in sents if starts_with(s, chain.entity)
                             for m in [re.search(YEAR, s)] if m), None)
            values.append(int(year.group(0)) if year else None)
        known = [(v, i) for i, v in enumerate(values) if v is not None]
        if plan.direction is not None and len(known) == len(values) and len(set(values)) == len(values):
            pick = min(known) if plan.direction == "min" else max(known)
            return plan.options[pick[1]]
        text = context() if callable(context) else context  # decoded only for a tie
        return random.Random(f"{self.seed}:{text}").choice(plan.options)
