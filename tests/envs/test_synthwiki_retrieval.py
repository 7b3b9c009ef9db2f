"""The dense retriever finds the gold passage of the synthetic world's single-hop questions."""

from __future__ import annotations

import os

from envs.data.synthwiki import default_world
from envs.paths import cache_dir
from envs.retrieval import DenseRetriever

SINGLE_HOP = ("nq", "triviaqa", "popqa")


def test_gold_passage_in_top3_for_single_hop_questions(world_retriever):
    retriever = world_retriever
    world = default_world()
    items = [q for dataset in SINGLE_HOP for q in world.questions(dataset, "test")]
    assert len(items) >= 100
    results = retriever.search([q.question for q in items], top_k=3)
    misses = []
    for item, hits in zip(items, results, strict=True):
        gold = set(item.metadata["supporting"])
        if not gold & {p.id for p in hits}:
            misses.append((item.dataset, item.question, sorted(gold), [p.title for p in hits]))
    rate = 1 - len(misses) / len(items)
    by_dataset = {
        d: 1 - sum(m[0] == d for m in misses) / sum(q.dataset == d for q in items)
        for d in SINGLE_HOP
    }
    print(
        f"recall@3 on {len(items)} single-hop questions: {rate:.3f} "
        + ", ".join(f"{d} {r:.2f}" for d, r in by_dataset.items())
    )
    for miss in misses[:10]:
        print("miss:", miss)
    assert rate >= 0.9


def test_second_build_over_the_world_loads_the_cache(world_retriever):
    session_cache = os.environ["MOPD_CACHE"]  # conftest's temporary folder, not ~/.cache/mopd
    assert str(cache_dir()).startswith(session_cache) and ".cache" not in session_cache.split(os.sep)
    assert os.path.commonpath([world_retriever.cache_path, session_cache]) == session_cache
    again = DenseRetriever(default_world().corpus, index="flat")
    assert again.loaded_from_cache
    assert again.cache_path == world_retriever.cache_path
    query = default_world().questions("nq", "test")[0].question
    assert [p.id for p in again.search([query])[0]] == [p.id for p in world_retriever.search([query])[0]]
