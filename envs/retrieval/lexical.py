"""A retriever with nothing to load: passages ranked by the words they share with the query
(``make_retriever("words")``), so smoke tests, CI and the ``tiny`` preset never wait on a
sentence encoder. It pickles (a Ray actor can hold it) and knows no synonyms: a stand-in
for tests and smoke runs, not a benchmark retriever."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from envs.retrieval.passage import Passage

_WORD = re.compile(r"\w+")


class WordOverlapRetriever:
    """Scores a passage by the inverse-document-frequency weighted count of the query's
    distinct words it contains (ties: corpus order). ``corpus``: FlashRAG rows
    (``{"id", "contents"}``) or Passages; default: the default synthetic world's."""

    def __init__(self, corpus: Sequence[Mapping[str, Any] | Passage] | None = None):
        if corpus is None:
            from envs.data.synthwiki import default_world

            corpus = default_world().corpus
        self.passages = [p if isinstance(p, Passage) else Passage.from_row(p) for p in corpus]
        self.index: dict[str, list[int]] = {}
        for i, p in enumerate(self.passages):
            for w in set(_WORD.findall(f"{p.title} {p.text}".lower())):
                self.index.setdefault(w, []).append(i)
        n = max(len(self.passages), 1)
        self.idf = {w: float(n / len(ids)) ** 0.5 for w, ids in self.index.items()}

    def search(self, queries: Sequence[str], top_k: int = 3) -> list[list[Passage]]:
        out = []
        for q in queries:
            score: Counter[int] = Counter()
            # the query's words in the order written, not a set's: a set of strings iterates in
            # an order PYTHONHASHSEED picks per process, and float sums in another order can
            # differ in the last bit, and so break a tie another way
            for w in dict.fromkeys(_WORD.findall(q.lower())):
                for i in self.index.get(w, ()):
                    score[i] += self.idf[w]
            best = sorted(score.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]
            out.append([Passage(p.id, p.title, p.text, float(s))
                        for p, s in ((self.passages[i], s) for i, s in best)])
        return out
