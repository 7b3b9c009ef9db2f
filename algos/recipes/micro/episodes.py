"""The micro base's training data: the scripted team's episodes in the micro env, written as a
model should write them (EOS after every turn, a space after each opening tag), and the
episodes the base imitates."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

from agents.scripted import SKIPPED_REPORT, ScriptedPolicy
from algos.recipes.micro.settings import ENV
from algos.recipes.micro.tokenizer import synthetic_world
from envs import protocol as P
from envs.retrieval.passage import MemoRetriever

WORKFLOWS = ("hierarchical", "cascade")


_OPENING_TAG = re.compile("(" + "|".join(f"<{t}>" for t in P.TAGS) + r")(?=\S)")


def spaced_tags(text: str) -> str:
    """``text`` with a space after each opening protocol tag that a word follows directly:
    ``<answer>Ludina Tovar</answer>`` becomes ``<answer> Ludina Tovar</answer>``. A byte-level
    BPE fuses a word's leading space into its token, so a name mid-sentence in a passage
    (`` Ludina``) and the same name right after a tag (``L`` + ``udina``) share no token,
    and a copy head cannot copy it. The parsers strip the space, so the turn means the same.

    >>> spaced_tags("<search>Who wrote it?</search><summary> Kept.</summary>")
    '<search> Who wrote it?</search><summary> Kept.</summary>'
    """
    return _OPENING_TAG.sub(r"\1 ", text)


class EosScripted:
    """The scripted team as a model should write it: every turn closed by EOS, and a space
    after each opening tag (:func:`spaced_tags`). The env cuts a Searcher or Answerer turn at
    its closing tag (the EOS is dropped, the env closes the message), but a Leader's wave of
    sub-tasks ends only at EOS, so imitation has to see that EOS among the generated
    (loss-masked) tokens."""

    def __init__(self, tokenizer: Any, seed: int = 0, skip_search: float = 0.0,
                 memory: Any = None, skip_known: float | None = None):
        # repeat_queries: the base's SFT episodes were made by a Searcher that compared its
        # next query with the queries as written, spaces inside the tags kept, so under
        # spaced tags no query ever matched and it asked again after a search that did not
        # resolve its hop (2 of 1,400 episodes in worlds 0-1, tests/envs/test_scripted_replay.py)
        self.policy = ScriptedPolicy(seed=seed, skip_search=skip_search, repeat_queries=True,
                                     memory=memory, skip_known=skip_known)
        self.tokenizer = tokenizer

    def act(self, observations: Sequence[Any]) -> list[Any]:
        from agents.base import Action

        eos = self.tokenizer.eos_token_id
        return [Action(token_ids=self.tokenizer.encode(spaced_tags(text), add_special_tokens=False) + [eos])
                for text in self.policy.act(observations)]


def micro_env_fn(tokenizer: Any, workflow: str = "hierarchical", retriever: Any = None,
                 **overrides: Any) -> Any:
    """A function that makes one micro-preset SearchTeam env (``settings.ENV`` + overrides)
    over the synthetic world; for :func:`agents.collect.collect`."""
    from envs import env_fn
    from envs.retrieval.factory import default_retriever

    return env_fn(workflow=workflow, tokenizer=tokenizer, retriever=retriever or default_retriever(),
                  **{**ENV, **overrides})


def questions(split: str, per_dataset: int, world_seed: int = 0, start: int = 0) -> list[Any]:
    """Questions ``start`` to ``start + per_dataset`` of each dataset of a world's split."""
    from envs.data.qa import DATASETS

    world = synthetic_world(world_seed)
    return [q for d in DATASETS for q in world.questions(d, split)[start:start + per_dataset]]


def scripted_episodes(tokenizer: Any, per_dataset: int, *, split: str = "train",
                      workflows: Sequence[str] = WORKFLOWS, retriever: Any = None,
                      worlds: Sequence[int] = (0,), seed: int = 0, skip_search: float = 0.0,
                      recall: bool = False, known_worlds: Collection[int] | None = None,
                      skip_known: float | None = None, start: int = 0,
                      progress: bool = False) -> list[Any]:
    """The scripted team's Episodes on ``per_dataset`` synthetic questions of each dataset in
    ``split`` (from question ``start``), one per question and workflow, in the micro env, for
    each world seed in ``worlds`` (0 = ``default_world()``). ``retriever`` serves world 0
    (default: ``default_retriever()``); another world is searched by MiniLM over its corpus.
    ``skip_search``, ``skip_known``: as :class:`agents.scripted.ScriptedPolicy`'s; with
    ``recall``, a skipping Searcher states the fact of a one-hop task of a world in
    ``known_worlds`` (None: every world) from its geography instead of ``SKIPPED_REPORT``."""
    from agents.collect import collect
    from envs.retrieval import DenseRetriever
    from envs.retrieval.factory import default_retriever

    episodes = []
    for world_seed in worlds:
        if world_seed == 0:
            searched = retriever or default_retriever(progress=progress)
        else:
            searched = DenseRetriever(synthetic_world(world_seed).corpus, progress=progress)
        memo = MemoRetriever(searched)
        asked = questions(split, per_dataset, world_seed, start)
        knows = recall and (known_worlds is None or world_seed in known_worlds)
        memory = synthetic_world(world_seed).geography() if knows else None
        for workflow in workflows:
            groups = collect(micro_env_fn(tokenizer, workflow, memo),
                             EosScripted(tokenizer, seed, skip_search, memory, skip_known),
                             asked, seed=seed, max_envs=128, progress=progress)
            episodes += [ep for group in groups for ep in group]
    return episodes


def imitated(episodes: Sequence[Any], recalled: Collection[str] = ()) -> list[Any]:
    """The scripted episodes the base imitates: those the team answered right, and those in
    which a Searcher reported without searching, right or not, so that the base skips as often
    as the team it imitates. ``recalled``: the reports a skipping Searcher writes from memory
    (the worlds' geography sentences); an episode with one counts as skipped."""
    skipped = {SKIPPED_REPORT, *recalled}
    return [ep for ep in episodes if ep.team_em == 1 or not skipped.isdisjoint(ep.reports)]


def recalled_right(episodes: Sequence[Any], recalled: Collection[str]) -> list[Any]:
    """The episodes in which a Searcher stated a fact from memory (one of ``recalled``) and
    the team answered right: closed-book practice, the path from memory to a right answer."""
    facts = set(recalled)
    return [ep for ep in episodes if ep.team_em == 1 and not facts.isdisjoint(ep.reports)]


def fact_rows(tokenizer: Any, worlds: Sequence[int], repeats: int) -> list[Any]:
    """Closed-book facts as text to learn, what pretraining gives a real LM: each geography
    sentence of each world in ``worlds`` (``SynthWiki.geography()``), ``repeats`` times, as
    an EOS-started row of the tokens a report from memory writes after ``<summary>`` (the
    sentence with its leading space, :func:`spaced_tags`)."""
    from algos.sft import text_rows

    eos = tokenizer.eos_token_id
    ids = [[eos, *tokenizer.encode(" " + sentence, add_special_tokens=False)]
           for w in worlds for sentence in synthetic_world(w).geography().values()]
    return text_rows(ids * repeats)
