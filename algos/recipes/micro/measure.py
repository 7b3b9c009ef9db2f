"""What the micro recipe measures: team statistics of a list of Episodes, and how likely a
model is to report without searching (README's "skip probability")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from algos.recipes.micro.episodes import EosScripted, micro_env_fn, questions
from envs import protocol as P
from envs.observation import observe_awaiting


def team_stats(episodes: Sequence[Any]) -> dict[str, float]:
    """Team EM (any candidate right), final-answer EM, invalid-turn rate, searches per
    workflow, and per-dataset team EM (``em/<dataset>``) of a list of Episodes."""
    if not episodes:
        return {}
    n = len(episodes)
    turns = sum(ep.turns for ep in episodes)
    stats = {"episodes": float(n), "team_em": sum(ep.team_em for ep in episodes) / n,
             "final_em": sum(ep.final_em for ep in episodes) / n,
             "invalid_rate": sum(ep.invalid_turns for ep in episodes) / max(1, turns),
             "searches": sum(ep.num_searches for ep in episodes) / n}
    by_dataset: dict[str, list[float]] = {}
    for ep in episodes:
        by_dataset.setdefault(ep.question.get("dataset", ""), []).append(ep.team_em)
    stats.update({f"em/{d}": sum(v) / len(v) for d, v in by_dataset.items()})
    return stats


def searcher_skip_probability(model: Any, tokenizer: Any, *, workflow: str = "cascade",
                              split: str = "dev", per_dataset: int = 20,
                              retriever: Any = None) -> list[float]:
    """How likely ``model`` is to report without searching: for each first Searcher turn on
    the first ``per_dataset`` questions of each style in ``split`` (micro env), the
    probability of opening it with ``<summary>`` rather than ``<search>`` (the two renormalised,
    temperature 1). In ``hierarchical`` the scripted Leader writes the wave, so every model is
    probed on the same contexts. README's "skip probability" is the mean."""
    import torch

    ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<search>", "<summary>")]
    leader = EosScripted(tokenizer)
    env = micro_env_fn(tokenizer, workflow, retriever)()
    contexts = []
    for question in questions(split, per_dataset):
        env.reset(seed=0, options={"question": question})
        observations = observe_awaiting(env)
        if workflow == "hierarchical":
            env.step(leader.act(observations)[0])
            observations = observe_awaiting(env)
        contexts += [list(o.token_ids) for o in observations if o.role == P.SEARCHER]
    probabilities = []
    with torch.no_grad():
        for context in contexts:
            logits = model(torch.tensor([context])).logits[0, -1, ids]
            probabilities.append(torch.softmax(logits.double(), -1)[1].item())
    return probabilities


def fact_recall(model: Any, tokenizer: Any, world_seed: int = 0) -> dict[str, float]:
    """How many of the world's closed-book facts (``SynthWiki.geography()``) ``model`` states
    from memory: a fact counts when, after EOS, its subject and its relation's wording
    (`` Lifith is a city in``), every token of its object (`` Beisumark.``) is the greedy
    choice, with nothing to read it from. The share per relation and overall (``all``)."""
    import os

    import torch

    from algos.recipes.micro.tokenizer import synthetic_world

    facts = synthetic_world(world_seed).geography()
    wording = {}  # what every sentence of a relation says between subject and object
    for relation in {r for _, r in facts}:
        rests = [s[len(e):] for (e, r), s in facts.items() if r == relation]
        wording[relation] = os.path.commonprefix(rests).rpartition(" ")[0]
    eos = tokenizer.eos_token_id
    hits: dict[str, list[bool]] = {}
    with torch.no_grad():
        for (entity, relation), sentence in facts.items():
            known = len(tokenizer.encode(" " + entity + wording[relation], add_special_tokens=False))
            ids = [eos, *tokenizer.encode(" " + sentence, add_special_tokens=False)]
            guess = model(torch.tensor([ids])).logits[0, :-1].argmax(-1).tolist()
            hits.setdefault(relation, []).append(guess[known:] == ids[known + 1:])
    every = [h for v in hits.values() for h in v]
    return {"all": sum(every) / len(every), **{r: sum(v) / len(v) for r, v in sorted(hits.items())}}
