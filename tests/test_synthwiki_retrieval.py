"""The dense retriever finds the gold passage of the synthetic world's single-hop questions."""

from __future__ import annotations

import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from envs.data.synthwiki import default_world  # noqa: E402
from envs.retrieval import DenseRetriever  # noqa: E402

SINGLE_HOP = ("nq", "triviaqa", "popqa")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("synthwiki-retrieval")


@pytest.fixture(scope="module")
def retriever(cache) -> DenseRetriever:
    start = time.perf_counter()
    r = DenseRetriever(default_world().corpus, index="flat", cache_dir=cache)
    print(
        f"\nencoded the synthetic world ({len(r)} passages) in {time.perf_counter() - start:.1f} s"
    )
    return r


def test_gold_passage_in_top3_for_single_hop_questions(retriever):
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


def test_second_build_over_the_world_loads_the_cache(retriever, cache):
    again = DenseRetriever(default_world().corpus, index="flat", cache_dir=cache)
    assert again.loaded_from_cache
    assert again.cache_path == retriever.cache_path
    query = default_world().questions("nq", "test")[0].question
    assert [p.id for p in again.search([query])[0]] == [p.id for p in retriever.search([query])[0]]
