"""The micro recipe's scripted team plays as it did when its base's SFT data were made.

The micro base's SFT data are the scripted team's episodes written with spaced tags
(``<search> q</search>``, ``algos.recipes.micro.episodes.EosScripted``). The Searcher that
made them compared its next query with the queries as written, spaces kept, so it never
found one asked and, after a first search that did not resolve its hop, asked the same
question again. ``ScriptedPolicy`` now moves on to the entity and keywords by default, and
the recipe asks for the old habit (``repeat_queries=True``): without it 2 of the 1,400
episodes of worlds 0-1 (50 questions per style, both workflows) change, world 1,
hierarchical, bamboogle train_36 and train_45. These tests replay exactly those two.
"""

from __future__ import annotations

import re

import pytest

from envs import protocol as P

# What MiniLM over world 1's corpus (``DenseRetriever``, the retriever the micro episodes
# use for world 1) ranks first for each query these two episodes ask, as corpus ids:
# served from this table, the test needs no encoding. A query not in it finds nothing.
DENSE_TOP3 = {
    "What was the first film directed by Krethor Kaldell?": ("1020", "1017", "1586"),
    "Krethor Kaldell films are": ("1020", "1023", "1586"),
    "Where did Fiflen Domard study?": ("522", "524", "1003"),
    "Fiflen Domard studied at": ("522", "524", "1498"),
}


re_search = re.compile(r"<search>(.*?)</search>", re.DOTALL)


def turns_of(segment) -> str:
    """The text the agent generated in ``segment`` (its loss-masked tokens), decoded."""
    from algos.recipes.micro.tokenizer import micro_tokenizer

    ids = [t for t, m in zip(segment.token_ids, segment.loss_mask) if m]
    return micro_tokenizer().decode(ids)


class TableRetriever:
    """Serves ``DENSE_TOP3`` from a corpus and records every query it is asked."""

    def __init__(self, corpus):
        from envs.retrieval.passage import Passage

        rows = {str(row["id"]): row for row in corpus}
        self.hits = {q: [Passage.from_row(rows[i]) for i in ids] for q, ids in DENSE_TOP3.items()}
        self.asked: list[str] = []

    def search(self, queries, top_k=3):
        self.asked += list(queries)
        return [self.hits.get(q, [])[:top_k] for q in queries]


@pytest.fixture(scope="module")
def replayed():
    """World 1's bamboogle train_36 and train_45, hierarchical, played by the micro recipe's
    scripted team (seed 0, skip_search 0.6) exactly as ``scripted_episodes`` plays them."""
    from agents.collect import collect
    from algos.recipes.micro.episodes import EosScripted, micro_env_fn, questions
    from algos.recipes.micro.tokenizer import micro_tokenizer, synthetic_world

    tok = micro_tokenizer()
    asked = [q for q in questions("train", 50, world_seed=1)
             if q.dataset == "bamboogle" and q.id in ("train_36", "train_45")]
    assert [q.id for q in asked] == ["train_36", "train_45"]
    retriever = TableRetriever(synthetic_world(1).corpus)
    groups = collect(micro_env_fn(tok, "hierarchical", retriever), EosScripted(tok, 0, 0.6),
                     asked, seed=0)
    return asked, [g[0] for g in groups], retriever


def test_searcher_asks_its_unresolved_subtask_again_as_before_infos(replayed):
    asked, episodes, retriever = replayed
    assert asked[0].question == "Who produced the first film directed by Krethor Kaldell?"
    assert asked[1].question == "In what year was the university that Fiflen Domard attended founded?"
    # Each Searcher's first search finds the person but not the asked film or school; the
    # old Searcher then searched the same sub-task once more (f6ac377 asked "Krethor
    # Kaldell films are" and "Fiflen Domard studied at" instead), then summarised.
    film, school = "What was the first film directed by Krethor Kaldell?", "Where did Fiflen Domard study?"
    assert retriever.asked == [film, school, film, school]
    for ep, query in zip(episodes, (film, school)):
        searcher = [s for s in ep.segments if s.role == P.SEARCHER]
        assert [s.agent for s in searcher] == ["searcher_0"] and ep.num_searches == 2
        written = re_search.findall(turns_of(searcher[0]))
        assert written == [f" {query}", f" {query}"]  # spaced tags, the same query twice


def test_the_two_episodes_keep_the_old_reports(replayed):
    _, episodes, _ = replayed
    # The reports the old team handed back (f6ac377^'s episodes).
    assert episodes[0].reports == ["Krethor Kaldell (born 1914 in Lafir) is a film director. "
                                   "Krethor Kaldell is the daughter of Vithune Kaldell."]
    assert episodes[1].reports == ["Fiflen Domard is a film producer born in Haipir in 1860. "
                                   "Fiflen Domard was active from 1887 to 1935."]
