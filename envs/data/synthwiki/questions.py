"""The seven question sets: one generator per dataset, and the draw of distinct questions.

Each generator turns a random draw of entities into a ``_Draft`` (style, question,
answers, supporting passages); ``draw_questions`` keeps distinct ones that do not give
their answer away and deals them out to test, dev and train.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, NamedTuple

from envs.data.items import QAItem
from envs.data.synthwiki.world import ORG_DESCRIPTION, SPLITS, SynthWiki, Work


class _Draft(NamedTuple):
    style: str
    question: str
    answers: list[str]
    supporting: list[str]
    """Passage ids in hop order."""


def _aliases(world: SynthWiki, names: list[str], supporting: list[str]) -> list[str]:
    """The first name, plus every alias that occurs verbatim in a supporting passage."""
    texts = [world.text(pid) for pid in supporting]
    return [names[0]] + [n for n in names[1:] if n and any(n in t for t in texts)]


def _city_answers(world: SynthWiki, c: int, supporting: list[str]) -> list[str]:
    city = world.cities[c]
    return _aliases(world, [city.name, city.official_name or ""], supporting)


def _country_answers(world: SynthWiki, c: int, supporting: list[str]) -> list[str]:
    country = world.countries[c]
    return _aliases(world, [country.name, country.official_name], supporting)


def _river_answers(river: str) -> list[str]:
    return [river, river.removesuffix(" River")]


def _occupation_answers(occupation: str) -> list[str]:
    words = occupation.split()
    return [occupation] + words[-1:] * (len(words) > 1)


def _pick(rng: random.Random, items: list[Any], keep: Callable[[Any], bool]) -> Any | None:
    """A random item satisfying ``keep``, or None after a few misses (the template is skipped)."""
    for _ in range(20):
        item = rng.choice(items)
        if keep(item):
            return item
    return None


def _work(
    world: SynthWiki,
    rng: random.Random,
    kinds: tuple[str, ...],
    keep: Callable[[Work], bool] = lambda w: True,
) -> Work | None:
    return _pick(rng, world.works, lambda w: w.kind in kinds and keep(w))


_CREATOR_VERB = {"film": "directed", "novel": "wrote", "opera": "composed", "album": "recorded"}


def _nq(world: SynthWiki, rng: random.Random) -> _Draft | None:
    """Single-hop factoid, lower case without a question mark, like a search-box query."""
    style, pick = "factoid", rng.randrange(8)
    if pick < 3:
        p = rng.choice(world.people)
        sup = [p.passages[0]]
        if pick == 0:
            return _Draft(
                style, f"where was {p.name} born", _city_answers(world, p.birth_city, sup), sup
            )
        if pick == 1:
            return _Draft(style, f"when was {p.name} born", [str(p.born)], sup)
        return _Draft(
            style, f"what does {p.name} do for a living", _occupation_answers(p.occupation), sup
        )
    if pick == 3:
        city = rng.choice(world.cities)
        sup = [city.passage]
        if rng.random() < 0.5:
            return _Draft(
                style,
                f"what country is {city.name} in",
                _country_answers(world, city.country, sup),
                sup,
            )
        return _Draft(
            style, f"what river runs through {city.name}", _river_answers(city.river), sup
        )
    if pick == 4:
        o = rng.choice(world.orgs)
        if rng.random() < 0.5:
            return _Draft(
                style, f"who founded {o.name}", [world.people[o.founder].name], [o.passage]
            )
        return _Draft(style, f"when was {o.name} founded", [str(o.founded)], [o.passage])
    if pick == 5:
        country = rng.choice(world.countries)
        sup = [country.passage]
        return _Draft(
            style,
            f"what is the capital of {country.name}",
            _city_answers(world, country.capital, sup),
            sup,
        )
    w = rng.choice(world.works)
    if pick == 6:
        return _Draft(
            style,
            f"who {_CREATOR_VERB[w.kind]} the {w.kind} {w.title}",
            [world.people[w.creator].name],
            [w.passage],
        )
    return _Draft(style, f"when did the {w.kind} {w.title} come out", [str(w.year)], [w.passage])


def _triviaqa(world: SynthWiki, rng: random.Random) -> _Draft | None:
    """Single-hop trivia-quiz phrasing, titles in quotes."""
    style, pick = "trivia", rng.randrange(7)
    if pick < 2:
        w = rng.choice(world.works)
        if pick == 1:
            return _Draft(
                style,
                f"In which year did the {w.kind} '{w.title}' first appear?",
                [str(w.year)],
                [w.passage],
            )
        question = {
            "film": f"Which director made the film '{w.title}'?",
            "novel": f"Which novelist wrote '{w.title}'?",
            "opera": f"The opera '{w.title}' was composed by whom?",
            "album": f"'{w.title}' was a {w.year} album by which singer?",
        }[w.kind]
        return _Draft(style, question, [world.people[w.creator].name], [w.passage])
    if pick == 2:
        city = rng.choice(world.cities)
        return _Draft(
            style,
            f"{city.name}, founded in {city.founded}, is a city in which country?",
            _country_answers(world, city.country, [city.passage]),
            [city.passage],
        )
    if pick == 3:
        country = rng.choice(world.countries)
        return _Draft(
            style,
            f"Which city is the capital of {country.name}?",
            _city_answers(world, country.capital, [country.passage]),
            [country.passage],
        )
    if pick == 4:
        country = rng.choice(world.countries)
        return _Draft(
            style,
            f"What is the official language of {country.name}?",
            [country.language],
            [country.passage],
        )
    if pick == 5:
        o = rng.choice(world.orgs)
        return _Draft(
            style,
            f"Who founded the {ORG_DESCRIPTION[o.kind]} {o.name}?",
            [world.people[o.founder].name],
            [o.passage],
        )
    p = rng.choice(world.people)
    sup = [p.passages[0]]
    return _Draft(
        style,
        f"The {p.occupation} {p.name} was born in which city?",
        _city_answers(world, p.birth_city, sup),
        sup,
    )


def _popqa(world: SynthWiki, rng: random.Random) -> _Draft | None:
    """Single-hop long-tail relations in PopQA's own templates."""
    style, pick = "relation", rng.randrange(9)
    people = world.people
    if pick < 3:
        p = rng.choice(people) if pick < 2 else _pick(rng, people, lambda p: p.father is not None)
        if p is None:
            return None
        sup = [p.passages[0]]
        if pick == 0:
            return _Draft(
                style, f"What is {p.name}'s occupation?", _occupation_answers(p.occupation), sup
            )
        if pick == 1:
            return _Draft(
                style,
                f"In what city was {p.name} born?",
                _city_answers(world, p.birth_city, sup),
                sup,
            )
        return _Draft(style, f"Who is the father of {p.name}?", [people[p.father].name], sup)
    if pick == 3:
        w = _work(world, rng, ("film",), lambda w: w.producer is not None)
        if w is None:
            return None
        return _Draft(
            style, f"Who was the producer of {w.title}?", [people[w.producer].name], [w.passage]
        )
    if pick in (4, 5):
        w = _work(world, rng, ("film",) if pick == 4 else ("novel", "opera"))
        if w is None:
            return None
        relation = {
            "film": "Who was the director of",
            "novel": "Who is the author of",
            "opera": "Who was the composer of",
        }[w.kind]
        return _Draft(style, f"{relation} {w.title}?", [people[w.creator].name], [w.passage])
    if pick == 6:
        city = rng.choice(world.cities)
        return _Draft(
            style,
            f"In what country is {city.name}?",
            _country_answers(world, city.country, [city.passage]),
            [city.passage],
        )
    country = rng.choice(world.countries)
    if pick == 7:
        return _Draft(
            style,
            f"What is the capital of {country.name}?",
            _city_answers(world, country.capital, [country.passage]),
            [country.passage],
        )
    capital = world.cities[country.capital]
    return _Draft(
        style,
        f"What is {capital.name} the capital of?",
        _country_answers(world, capital.country, [capital.passage]),
        [capital.passage],
    )


def _hotpotqa(world: SynthWiki, rng: random.Random) -> _Draft | None:
    """Two-hop bridge (the bridge entity is named by its relation) and comparison."""
    people, orgs, pick = world.people, world.orgs, rng.randrange(5)
    if pick == 0:
        w = _work(world, rng, ("film",))
        if w is None:
            return None
        d = people[w.creator]
        sup = [w.passage, d.passages[0]]
        return _Draft(
            "bridge",
            f"In which city was the director of '{w.title}' born?",
            _city_answers(world, d.birth_city, sup),
            sup,
        )
    if pick == 1:
        o = rng.choice(orgs)
        f = people[o.founder]
        return _Draft(
            "bridge",
            f"What year was the founder of {o.name} born?",
            [str(f.born)],
            [o.passage, f.passages[0]],
        )
    if pick == 2:
        w = _work(world, rng, ("novel",), lambda w: people[w.creator].university is not None)
        if w is None:
            return None
        a = people[w.creator]
        return _Draft(
            "bridge",
            f"Which university did the author of '{w.title}' attend?",
            [orgs[a.university].name],
            [w.passage, a.passages[1]],
        )
    if pick == 3:
        a, b = rng.choice(orgs), rng.choice(orgs)
        if a is b or a.kind != b.kind or a.founded == b.founded:
            return None
        first = a if a.founded < b.founded else b
        return _Draft(
            "comparison",
            f"Which was founded first, {a.name} or {b.name}?",
            [first.name],
            [a.passage, b.passage],
        )
    a, b = rng.choice(world.cities), rng.choice(world.cities)
    if a is b or a.founded == b.founded:
        return None
    later = a if a.founded > b.founded else b
    return _Draft(
        "comparison",
        f"Which city was founded more recently, {a.name} or {b.name}?",
        [later.name],
        [a.passage, b.passage],
    )


def _twowiki(world: SynthWiki, rng: random.Random) -> _Draft | None:
    """Dated comparison, composition, and bridge comparison, in 2Wiki's phrasing."""
    people, pick = world.people, rng.randrange(9)
    if pick < 2:
        a = rng.choice(people)
        # Half the time against a look-alike: a relative or a namesake.
        near = [p for p in world.namesakes[a.surname] + world.namesakes[a.given] if p is not a]
        b = rng.choice(near) if near and rng.random() < 0.5 else rng.choice(people)
        if a is b or a.born == b.born:
            return None
        earlier = pick == 0
        answer = a if (a.born < b.born) == earlier else b
        return _Draft(
            "comparison",
            f"Who was born {'first' if earlier else 'later'}, {a.name} or {b.name}?",
            [answer.name],
            [a.passages[0], b.passages[0]],
        )
    if pick == 2:
        a, b = _work(world, rng, ("film",)), _work(world, rng, ("film",))
        if a is None or b is None or a is b or a.year == b.year:
            return None
        first = a if a.year < b.year else b
        return _Draft(
            "comparison",
            f"Which film came out first, '{a.title}' or '{b.title}'?",
            [first.title],
            [a.passage, b.passage],
        )
    if pick == 3:
        w = _work(world, rng, ("film",), lambda w: people[w.creator].father is not None)
        if w is None:
            return None
        d = people[w.creator]
        return _Draft(
            "composition",
            f"Who is the father of the director of film '{w.title}'?",
            [people[d.father].name],
            [w.passage, d.passages[0]],
        )
    if pick == 4:
        p = _pick(
            rng, people, lambda p: p.father is not None and people[p.father].father is not None
        )
        if p is None:
            return None
        f = people[p.father]
        return _Draft(
            "composition",
            f"Who is the paternal grandfather of {p.name}?",
            [people[f.father].name],
            [p.passages[0], f.passages[0]],
        )
    if pick == 5:
        p = _pick(rng, people, lambda p: p.father is not None)
        if p is None:
            return None
        f = people[p.father]
        sup = [p.passages[0], f.passages[0]]
        return _Draft(
            "composition",
            f"Where was the father of {p.name} born?",
            _city_answers(world, f.birth_city, sup),
            sup,
        )
    if pick == 6:
        w = _work(world, rng, ("novel", "opera"))
        if w is None:
            return None
        c = people[w.creator]
        role = "author" if w.kind == "novel" else "composer"
        return _Draft(
            "composition",
            f"When was the {role} of {w.kind} '{w.title}' born?",
            [str(c.born)],
            [w.passage, c.passages[0]],
        )
    a, b = _work(world, rng, ("film",)), _work(world, rng, ("film",))
    if a is None or b is None or people[a.creator].born == people[b.creator].born:
        return None
    da, db = people[a.creator], people[b.creator]
    first = a if da.born < db.born else b
    return _Draft(
        "bridge_comparison",
        f"Which film has the director born first, '{a.title}' or '{b.title}'?",
        [first.title],
        [a.passage, da.passages[0], b.passage, db.passages[0]],
    )


def _musique(world: SynthWiki, rng: random.Random) -> _Draft | None:
    """Composition chains of 2, 3 or 4 hops (equally often), titles unquoted."""
    people, orgs, cities, countries = world.people, world.orgs, world.cities, world.countries
    hops, pick = rng.randint(2, 4), rng.randrange(2)
    if hops == 2 and pick == 0:
        city = rng.choice(cities)
        country = countries[city.country]
        sup = [city.passage, country.passage]
        return _Draft(
            "composition",
            f"What is the capital of the country where {city.name} is located?",
            _city_answers(world, country.capital, sup),
            sup,
        )
    if hops == 2:
        w = _work(world, rng, ("novel",), lambda w: w.org is not None)
        if w is None:
            return None
        publisher = orgs[w.org]
        return _Draft(
            "composition",
            f"When was the publisher of {w.title} founded?",
            [str(publisher.founded)],
            [w.passage, publisher.passage],
        )
    if hops == 3 and pick == 0:
        w = _work(world, rng, ("film",))
        if w is None:
            return None
        d = people[w.creator]
        city = cities[d.birth_city]
        sup = [w.passage, d.passages[0], city.passage]
        return _Draft(
            "composition",
            f"In which country was the director of {w.title} born?",
            _country_answers(world, city.country, sup),
            sup,
        )
    if hops == 3:
        w = _work(world, rng, ("novel",), lambda w: people[w.creator].university is not None)
        if w is None:
            return None
        a = people[w.creator]
        u = orgs[a.university]
        return _Draft(
            "composition",
            f"When was the university attended by the author of {w.title} founded?",
            [str(u.founded)],
            [w.passage, a.passages[1], u.passage],
        )
    if pick == 0:
        o = rng.choice(orgs)
        f = people[o.founder]
        city = cities[f.birth_city]
        country = countries[city.country]
        sup = [o.passage, f.passages[0], city.passage, country.passage]
        return _Draft(
            "composition",
            f"What is the capital of the country where the founder of {o.name} was born?",
            _city_answers(world, country.capital, sup),
            sup,
        )
    w = _work(world, rng, ("film",))
    if w is None:
        return None
    d = people[w.creator]
    city = cities[d.birth_city]
    country = countries[city.country]
    return _Draft(
        "composition",
        f"What language is spoken in the country where the director of {w.title} was born?",
        [country.language],
        [w.passage, d.passages[0], city.passage, country.passage],
    )


def _bamboogle(world: SynthWiki, rng: random.Random) -> _Draft | None:
    """Hard two-hop: the bridge entity is never named, only described."""
    people, orgs, works, pick = world.people, world.orgs, world.works, rng.randrange(4)
    style = "hard_two_hop"
    if pick == 0:
        p = rng.choice(people)
        city = world.cities[p.birth_city]
        return _Draft(
            style,
            f"What river flows through the city where {p.name} was born?",
            _river_answers(city.river),
            [p.passages[0], city.passage],
        )
    if pick == 1:
        p = _pick(rng, people, lambda p: p.university is not None)
        if p is None:
            return None
        u = orgs[p.university]
        return _Draft(
            style,
            f"In what year was the university that {p.name} attended founded?",
            [str(u.founded)],
            [p.passages[1], u.passage],
        )
    if pick == 2:
        o = rng.choice(orgs)
        f = people[o.founder]
        if f.father is None:
            return None
        return _Draft(
            style,
            f"Who was the father of the person who founded {o.name}?",
            [people[f.father].name],
            [o.passage, f.passages[0]],
        )
    d = _pick(rng, people, lambda p: p.occupation == "film director" and len(p.works) > 0)
    if d is None:
        return None
    first = works[d.works[0]]
    if first.producer is None or (len(d.works) > 1 and works[d.works[1]].year == first.year):
        return None  # no producer to ask for, or no single first film
    return _Draft(
        style,
        f"Who produced the first film directed by {d.name}?",
        [people[first.producer].name],
        [d.passages[1], first.passage],
    )


_GENERATORS: dict[str, Callable[[SynthWiki, random.Random], _Draft | None]] = {
    "nq": _nq,
    "triviaqa": _triviaqa,
    "popqa": _popqa,
    "hotpotqa": _hotpotqa,
    "2wikimultihopqa": _twowiki,
    "musique": _musique,
    "bamboogle": _bamboogle,
}


COMPARISON_STYLES = frozenset({"comparison", "bridge_comparison"})
"""Styles whose answer is one of the names in the question."""


def _gives_away(draft: _Draft) -> bool:
    """An answer that the question itself contains (``the capital of the country where
    Kessa is located`` when Kessa is that capital) is no question."""
    if draft.style in COMPARISON_STYLES:
        return False
    question = draft.question.lower()
    return any(answer.lower() in question for answer in draft.answers)


def draw_questions(
    world: SynthWiki, dataset: str, sizes: dict[str, int]
) -> dict[str, list[QAItem]]:
    """Draw distinct questions for one dataset: test first, then dev, then train."""
    rng = random.Random(f"synthwiki:{world.seed}:{dataset}")
    generate = _GENERATORS[dataset]
    needed = sum(sizes.values())
    drafts: dict[str, _Draft] = {}  # question text -> draft, in draw order
    misses = 0
    while len(drafts) < needed:
        draft = generate(world, rng)
        if draft is None or draft.question in drafts or _gives_away(draft):
            misses += 1
            if misses > 5000:
                raise ValueError(
                    f"the world has too few distinct {dataset} questions: found {len(drafts)}, "
                    f"asked for {needed} ({sizes}); build a larger world or ask for fewer"
                )
            continue
        misses = 0
        drafts[draft.question] = draft
    ordered = list(drafts.values())
    out: dict[str, list[QAItem]] = {}
    for split in ("test", "dev", "train"):
        chunk, ordered = ordered[: sizes[split]], ordered[sizes[split] :]
        out[split] = [
            QAItem(
                id=f"{split}_{i}",
                question=d.question,
                golden_answers=d.answers,
                dataset=dataset,
                metadata={"style": d.style, "hops": len(d.supporting), "supporting": d.supporting},
            )
            for i, d in enumerate(chunk)
        ]
    return {split: out[split] for split in SPLITS}
