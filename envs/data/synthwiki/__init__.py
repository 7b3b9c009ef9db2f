"""SynthWiki: a seeded synthetic encyclopedia and seven question sets over it.

The embedded default data for a machine with no downloads. Every fact is made up by
``random.Random(seed)``, so no model can answer from memory: a team has to search.
The same seed gives byte-identical corpus and questions.

The world (default sizes)
-------------------------
- 10 countries (capital, official language, year of independence),
- 60 cities, each in a country (founding year, the river it lies on; capitals say so),
- 800 people in families of up to three generations (birth year and city, occupation,
  father, university attended, works, organisations founded),
- 150 organisations (universities, publishing houses, record labels, film studios,
  newspapers, orchestras, shipping companies: founder, founding year, seat),
- 700 works (films with director, producer, studio and shooting city; novels with
  author and publisher; operas with composer and premiere city; albums with singer
  and label).

Names are built from syllables: pronounceable, unique across the world (people, places,
organisations and titles alike), never a real country or capital. Look-alike
distractors are there on purpose: relatives share a surname (600-700 people do), about a
quarter of the people have a namesake whose name differs in one letter, one title in
five differs from another title in one word, and organisations are named after their
founders and cities. Retrieval has to be precise.

Each entity is rendered as 1-2 encyclopedia passages of 2-4 sentences, FlashRAG corpus
rows ``{"id", "contents": "Title\\ntext"}`` whose title is the entity's name and whose
first sentence names it. A person's first passage has birth year and city, occupation
and father; the second (when there is one to write) education, the complete list of
works (oldest first), films produced and organisations founded. The default corpus has
about 2,300 passages (at most ~3,000 by design, so MiniLM indexes it in seconds on a
CPU; with the question as the query it puts the supporting passage of a single-hop
question in its top 3 for about 99% of them).

Questions
---------
Each question is a ``QAItem`` whose ``dataset`` is one of ``DATASETS`` and whose
``metadata`` is ``{"style", "hops", "supporting"}``: ``supporting`` lists the ids of
the passages needed, in hop order, and ``hops == len(supporting)``. In the comparison
styles the answer is one of the two names compared; in all others every gold answer
(aliases included) occurs verbatim in a supporting passage, the first in the last hop's
passage, and the question never contains its answer. Single-hop questions contain the subject's
exact name. Examples from ``default_world()`` (seed 0):

================  =================  ====  ===========================================
dataset           style              hops  example -> answer
================  =================  ====  ===========================================
nq                factoid            1     what river runs through Flizamar
                                           -> Fitreim River | Fitreim
triviaqa          trivia             1     In which year did the album 'Bridge of
                                           Gaiku' first appear? -> 1976
popqa             relation           1     Who is the father of Zirer Vresk?
                                           -> Maileir Vresk
hotpotqa          bridge             2     Which university did the author of
                                           'Stakorn' attend? -> Rabra Polytechnic
hotpotqa          comparison         2     Which city was founded more recently,
                                           Port Vrevenz or Stuska? -> Port Vrevenz
2wikimultihopqa   comparison         2     Who was born later, Sekana Naldvik or
                                           Vazais Maiton? -> Sekana Naldvik
2wikimultihopqa   composition        2     Who is the paternal grandfather of Maisira
                                           Pailane? -> Krima Pailane
2wikimultihopqa   bridge_comparison  4     Which film has the director born first,
                                           'Bremeild Returns' or 'Long Harbour over
                                           Rafli'? -> Bremeild Returns
musique           composition        2-4   What is the capital of the country where
                                           the founder of Maigra Polytechnic was
                                           born? -> Kebene (4 hops)
bamboogle         hard_two_hop       2     Who produced the first film directed by
                                           Dedrar Naldvik? -> Bratreth Meinelin
================  =================  ====  ===========================================

``python -m envs data show NAME --root synthetic`` prints more.

Splits ``train``/``dev``/``test`` are disjoint in question text. They are drawn test
first, so the test set of a seed does not change when ``train`` or ``dev`` grow.

This module builds a world (``build_world``) and writes it out; ``names.py``, ``world.py``,
``render.py`` and ``questions.py`` are the steps, each drawing in a fixed order (reordering
the draws changes every world: ``tests/envs/test_synthwiki_stable.py``).
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

from envs.data.items import DATASETS, write_jsonl
from envs.data.synthwiki.questions import COMPARISON_STYLES, draw_questions
from envs.data.synthwiki.render import render
from envs.data.synthwiki.world import ORG_KINDS, SPLITS, SynthWiki, make_entities

__all__ = ["COMPARISON_STYLES", "SPLITS", "SynthWiki", "build_world", "default_world",
           "write_flashrag"]


def build_world(
    seed: int = 0,
    *,
    train: int = 200,
    dev: int = 50,
    test: int = 100,
    countries: int = 10,
    cities: int = 60,
    people: int = 800,
    orgs: int = 150,
    works: int = 700,
) -> SynthWiki:
    """Build the world for ``seed``: ``train``/``dev``/``test`` questions per dataset.

    The entities depend only on ``seed`` and the entity counts; each dataset's questions
    on ``seed``, the world, and the split sizes. Raises ``ValueError`` when the world is
    too small for the questions asked of it.
    """
    for key, value, least in (("train", train, 0), ("dev", dev, 0), ("test", test, 0),
                              ("countries", countries, 1), ("cities", cities, 1),
                              ("people", people, 50), ("orgs", orgs, len(ORG_KINDS)),
                              ("works", works, 8)):
        if value < least:
            raise ValueError(f"{key} must be >= {least}, got {value}")
    if cities < countries:
        raise ValueError(f"need at least one city per country: cities={cities} < "
                         f"countries={countries}")
    rng = random.Random(f"synthwiki:{seed}:world")
    world = make_entities(seed, rng, countries=countries, cities=cities, people=people, orgs=orgs,
                          works=works)
    render(world, rng)
    sizes = {"test": test, "dev": dev, "train": train}
    for dataset in DATASETS:
        world.question_sets[dataset] = draw_questions(world, dataset, sizes)
    return world


@functools.lru_cache(maxsize=1)
def default_world() -> SynthWiki:
    """``build_world(0)``, built once per process."""
    return build_world(0)


def write_flashrag(world: SynthWiki, out_dir: str | Path) -> dict[str, int]:
    """Write ``<out>/corpus.jsonl`` and ``<out>/<dataset>/{train,dev,test}.jsonl``.

    Returns rows written per file (relative path -> count). ``load_qa(name, split,
    root=out_dir)`` reads the questions back equal.
    """
    out = Path(out_dir)
    written = {"corpus.jsonl": len(world.passages)}
    write_jsonl(out / "corpus.jsonl", world.passages.values())
    for dataset in DATASETS:
        for split in SPLITS:
            items = world.question_sets[dataset][split]
            write_jsonl(out / dataset / f"{split}.jsonl", (item.to_dict() for item in items))
            written[f"{dataset}/{split}.jsonl"] = len(items)
    return written
