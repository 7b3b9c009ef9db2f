"""The seven question sets: a table of question templates per dataset, and the draw.

A dataset's table lists its cases; a question picks one at random, draws the entities it
is about (``_draw``: a random entity and the ones its relations lead to, e.g. a film, its
director, the director's birth city), and fills an ``_Ask``: the question template, the
answer and the supporting passages, all read off the drawn entities. ``draw_questions``
keeps distinct questions that do not give their answer away and deals them out to test,
dev and train.

Every random draw is part of the world's bytes: the order of the cases in a table, the
order of the draws and the number of tries are fixed (``tests/envs/test_synthwiki_stable.py``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, NamedTuple

from envs.data.items import DATASETS, QAItem
from envs.data.synthwiki.world import (
    ORG_DESCRIPTION,
    SPLITS,
    City,
    Country,
    Person,
    SynthWiki,
    Work,
)

Draw = Callable[[SynthWiki, random.Random], "tuple[Any, ...] | None"]
"""Draws the entities one question is about, or None (the case is skipped)."""


class _Draft(NamedTuple):
    style: str
    question: str
    answers: list[str]
    supporting: list[str]
    """Passage ids in hop order."""


def _via(attribute: str, pool: str) -> Callable[[SynthWiki, Any], Any]:
    """A step from an entity to the one its ``attribute`` points at in ``world.<pool>``
    (None where it points nowhere: no father, no university)."""

    def step(world: SynthWiki, entity: Any) -> Any:
        index = getattr(entity, attribute)
        return None if index is None else getattr(world, pool)[index]

    return step


_creator = _via("creator", "people")  # a work's director, author, composer or singer
_producer = _via("producer", "people")
_publisher = _via("org", "orgs")  # of a novel (a film's studio, an album's label)
_founder = _via("founder", "people")
_father = _via("father", "people")
_university = _via("university", "orgs")
_birth_city = _via("birth_city", "cities")
_country = _via("country", "countries")
_capital = _via("capital", "cities")


def _draw(pool: str, *steps: Callable[[SynthWiki, Any], Any], kinds: tuple[str, ...] = (),
          keep: Callable[[Any], bool] = lambda entity: True, tries: int = 20) -> Draw:
    """A random entity of ``world.<pool>`` followed by the entities ``steps`` lead to, each
    step from the entity before it (``_draw("works", _creator, _birth_city)``: a work, its
    creator, the creator's birth city). An entity whose kind is not in ``kinds`` (when
    given), that ``keep`` refuses, or where a step leads nowhere (no father) is drawn again,
    ``tries`` times in all; then the case is skipped."""

    def draw(world: SynthWiki, rng: random.Random) -> tuple[Any, ...] | None:
        items = getattr(world, pool)
        for _ in range(tries):
            drawn = [rng.choice(items)]
            if (kinds and drawn[0].kind not in kinds) or not keep(drawn[0]):
                continue
            for step in steps:
                drawn.append(step(world, drawn[-1]))
                if drawn[-1] is None:
                    break
            else:
                return tuple(drawn)
        return None

    return draw


def _pair(one: Draw, differ: Callable[..., bool]) -> Draw:
    """Two draws of ``one`` to compare: two different entities for which
    ``differ(*first, *second)`` holds (the answer is not a tie), else None."""

    def draw(world: SynthWiki, rng: random.Random) -> tuple[Any, ...] | None:
        a, b = one(world, rng), one(world, rng)
        if a is None or b is None or a[0] is b[0] or not differ(*a, *b):
            return None
        return a + b

    return draw


def _two_people(world: SynthWiki, rng: random.Random) -> tuple[Person, Person] | None:
    """Two people born in different years; half the time the second is a look-alike of the
    first (a relative or a namesake)."""
    a = rng.choice(world.people)
    near = [p for p in world.namesakes[a.surname] + world.namesakes[a.given] if p is not a]
    b = rng.choice(near) if near and rng.random() < 0.5 else rng.choice(world.people)
    if a is b or a.born == b.born:
        return None
    return a, b


_DIRECTOR = _draw("people", keep=lambda p: p.occupation == "film director" and len(p.works) > 0)


def _first_film(world: SynthWiki, rng: random.Random) -> tuple[Person, Work, Person] | None:
    """A film director, their first film and its producer; None when that film has no
    producer or came out in the same year as the second (no single first film)."""
    drawn = _DIRECTOR(world, rng)
    if drawn is None:
        return None
    director = drawn[0]
    first = world.works[director.works[0]]
    if first.producer is None or (len(director.works) > 1
                                  and world.works[director.works[1]].year == first.year):
        return None
    return director, first, world.people[first.producer]


def _names(entity: Any) -> list[str]:
    """An entity's name, then its aliases (a city's or a country's official name)."""
    if isinstance(entity, City):
        return [entity.name, entity.official_name or ""]
    if isinstance(entity, Country):
        return [entity.name, entity.official_name]
    if isinstance(entity, Work):
        return [entity.title]
    return [entity.name]


def _last(*drawn: Any) -> list[str]:
    """The answer is the last entity drawn (the end of the chain)."""
    return _names(drawn[-1])


def _hops(n: int) -> Callable[..., list[str]]:
    """The supporting passages are those of the first ``n`` entities drawn, in hop order (a
    person's first passage: birth, occupation, father)."""

    def supporting(*drawn: Any) -> list[str]:
        return [e.passages[0] if isinstance(e, Person) else e.passage for e in drawn[:n]]

    return supporting


class _Ask(NamedTuple):
    """One question template over the drawn entities."""

    question: str | dict[str, str]
    """A ``str.format`` template over the drawn entities (``{0.name}`` is the first one's
    name), or one per ``kind`` of the first (a work's or an organisation's)."""
    answers: Callable[..., list[str]] = _last
    """The drawn entities -> the answer, then its aliases (an alias is kept only where a
    supporting passage has it verbatim). Default: the last entity drawn."""
    supporting: Callable[..., list[str]] = _hops(1)
    """The drawn entities -> the ids of the passages needed, in hop order. Default: the
    first entity's passage."""
    style: str = ""
    """Empty: the table's style."""


def _river(city: City) -> list[str]:
    """The river through ``city``, also by its short name."""
    return [city.river, city.river.removesuffix(" River")]


def _occupation(person: Person) -> list[str]:
    """The person's occupation, and its last word alone (``director``)."""
    words = person.occupation.split()
    return [person.occupation] + words[-1:] * (len(words) > 1)


def _aliases(world: SynthWiki, names: list[str], supporting: list[str]) -> list[str]:
    """The first name, plus every alias that occurs verbatim in a supporting passage."""
    texts = [world.text(pid) for pid in supporting]
    return [names[0]] + [n for n in names[1:] if n and any(n in t for t in texts)]


# A case is (draw, ask) or (draw, ask, ask): a coin decides between two asks, the first
# on heads. A table's cases are equally likely; a case listed twice is twice as likely.


def _table(style: str, *cases: tuple[Any, ...]) -> tuple[tuple[Any, ...], ...]:
    """The cases, each ask without a style of its own taking ``style``."""
    return tuple((draw, *(ask if ask.style else ask._replace(style=style) for ask in asks))
                 for draw, *asks in cases)


def _year(attribute: str, of: int = 0) -> Callable[..., list[str]]:
    """The answer is a year: ``attribute`` of the ``of``-th entity drawn."""
    return lambda *drawn: [str(getattr(drawn[of], attribute))]


_NQ = _table(  # single-hop factoids, lower case without a question mark, like a search-box query
    "factoid",
    (_draw("people", _birth_city), _Ask("where was {0.name} born")),
    (_draw("people"), _Ask("when was {0.name} born", _year("born"))),
    (_draw("people"), _Ask("what does {0.name} do for a living", _occupation)),
    (_draw("cities", _country), _Ask("what country is {0.name} in"),
     _Ask("what river runs through {0.name}", lambda city, _: _river(city))),
    (_draw("orgs", _founder), _Ask("who founded {0.name}"),
     _Ask("when was {0.name} founded", _year("founded"))),
    (_draw("countries", _capital), _Ask("what is the capital of {0.name}")),
    (_draw("works", _creator), _Ask({"film": "who directed the film {0.title}",
                                     "novel": "who wrote the novel {0.title}",
                                     "opera": "who composed the opera {0.title}",
                                     "album": "who recorded the album {0.title}"})),
    (_draw("works"), _Ask("when did the {0.kind} {0.title} come out", _year("year"))),
)

_TRIVIAQA = _table(  # single-hop trivia-quiz phrasing, titles in quotes
    "trivia",
    (_draw("works", _creator),
     _Ask({"film": "Which director made the film '{0.title}'?",
           "novel": "Which novelist wrote '{0.title}'?",
           "opera": "The opera '{0.title}' was composed by whom?",
           "album": "'{0.title}' was a {0.year} album by which singer?"})),
    (_draw("works"),
     _Ask("In which year did the {0.kind} '{0.title}' first appear?", _year("year"))),
    (_draw("cities", _country),
     _Ask("{0.name}, founded in {0.founded}, is a city in which country?")),
    (_draw("countries", _capital), _Ask("Which city is the capital of {0.name}?")),
    (_draw("countries"),
     _Ask("What is the official language of {0.name}?", lambda c: [c.language])),
    (_draw("orgs", _founder),
     _Ask({kind: f"Who founded the {what} {{0.name}}?" for kind, what in ORG_DESCRIPTION.items()})),
    (_draw("people", _birth_city), _Ask("The {0.occupation} {0.name} was born in which city?")),
)

_POPQA = _table(  # single-hop long-tail relations in PopQA's own templates
    "relation",
    (_draw("people"), _Ask("What is {0.name}'s occupation?", _occupation)),
    (_draw("people", _birth_city), _Ask("In what city was {0.name} born?")),
    (_draw("people", _father), _Ask("Who is the father of {0.name}?")),
    (_draw("works", _producer, kinds=("film",)), _Ask("Who was the producer of {0.title}?")),
    (_draw("works", _creator, kinds=("film",)), _Ask("Who was the director of {0.title}?")),
    (_draw("works", _creator, kinds=("novel", "opera")),
     _Ask({"novel": "Who is the author of {0.title}?",
           "opera": "Who was the composer of {0.title}?"})),
    (_draw("cities", _country), _Ask("In what country is {0.name}?")),
    (_draw("countries", _capital), _Ask("What is the capital of {0.name}?")),
    (_draw("countries", _capital), _Ask("What is {1.name} the capital of?",
                                        lambda country, capital: _names(country),
                                        lambda country, capital: [capital.passage])),
)

_HOTPOTQA = _table(  # two-hop bridge (the bridge entity is named by its relation) and comparison
    "bridge",
    (_draw("works", _creator, _birth_city, kinds=("film",)),
     _Ask("In which city was the director of '{0.title}' born?", _last, _hops(2))),
    (_draw("orgs", _founder),
     _Ask("What year was the founder of {0.name} born?", _year("born", of=1), _hops(2))),
    (_draw("works", _creator, _university, kinds=("novel",)),
     _Ask("Which university did the author of '{0.title}' attend?", _last,
          lambda w, a, u: [w.passage, a.passages[1]])),
    (_pair(_draw("orgs"), lambda a, b: a.kind == b.kind and a.founded != b.founded),
     _Ask("Which was founded first, {0.name} or {1.name}?",
          lambda a, b: [(a if a.founded < b.founded else b).name], _hops(2), "comparison")),
    (_pair(_draw("cities"), lambda a, b: a.founded != b.founded),
     _Ask("Which city was founded more recently, {0.name} or {1.name}?",
          lambda a, b: [(a if a.founded > b.founded else b).name], _hops(2), "comparison")),
)

_FILMS_BY_DIRECTOR_BIRTH = (
    _pair(_draw("works", _creator, kinds=("film",)), lambda a, da, b, db: da.born != db.born),
    _Ask("Which film has the director born first, '{0.title}' or '{2.title}'?",
         lambda a, da, b, db: [(a if da.born < db.born else b).title], _hops(4),
         "bridge_comparison"),
)

_TWOWIKI = _table(  # dated comparison, composition, and bridge comparison, in 2Wiki's phrasing
    "composition",
    (_two_people, _Ask("Who was born first, {0.name} or {1.name}?",
                       lambda a, b: [(a if a.born < b.born else b).name], _hops(2), "comparison")),
    (_two_people, _Ask("Who was born later, {0.name} or {1.name}?",
                       lambda a, b: [(a if a.born > b.born else b).name], _hops(2), "comparison")),
    (_pair(_draw("works", kinds=("film",)), lambda a, b: a.year != b.year),
     _Ask("Which film came out first, '{0.title}' or '{1.title}'?",
          lambda a, b: [(a if a.year < b.year else b).title], _hops(2), "comparison")),
    (_draw("works", _creator, _father, kinds=("film",)),
     _Ask("Who is the father of the director of film '{0.title}'?", _last, _hops(2))),
    (_draw("people", _father, _father),
     _Ask("Who is the paternal grandfather of {0.name}?", _last, _hops(2))),
    (_draw("people", _father, _birth_city),
     _Ask("Where was the father of {0.name} born?", _last, _hops(2))),
    (_draw("works", _creator, kinds=("novel", "opera")),
     _Ask({"novel": "When was the author of novel '{0.title}' born?",
           "opera": "When was the composer of opera '{0.title}' born?"},
          _year("born", of=1), _hops(2))),
    _FILMS_BY_DIRECTOR_BIRTH,
    _FILMS_BY_DIRECTOR_BIRTH,
)

_MUSIQUE = _table(  # composition chains of 2, 3 or 4 hops (two cases each), titles unquoted
    "composition",
    (_draw("cities", _country, _capital),
     _Ask("What is the capital of the country where {0.name} is located?", _last, _hops(2))),
    (_draw("works", _publisher, kinds=("novel",)),
     _Ask("When was the publisher of {0.title} founded?", _year("founded", of=1), _hops(2))),
    (_draw("works", _creator, _birth_city, _country, kinds=("film",)),
     _Ask("In which country was the director of {0.title} born?", _last, _hops(3))),
    (_draw("works", _creator, _university, kinds=("novel",)),
     _Ask("When was the university attended by the author of {0.title} founded?",
          _year("founded", of=2), lambda w, a, u: [w.passage, a.passages[1], u.passage])),
    (_draw("orgs", _founder, _birth_city, _country, _capital),
     _Ask("What is the capital of the country where the founder of {0.name} was born?", _last,
          _hops(4))),
    (_draw("works", _creator, _birth_city, _country, kinds=("film",)),
     _Ask("What language is spoken in the country where the director of {0.title} was born?",
          lambda w, d, city, country: [country.language], _hops(4))),
)

_BAMBOOGLE = _table(  # hard two-hop: the bridge entity is never named, only described
    "hard_two_hop",
    (_draw("people", _birth_city),
     _Ask("What river flows through the city where {0.name} was born?",
          lambda p, city: _river(city), _hops(2))),
    (_draw("people", _university),
     _Ask("In what year was the university that {0.name} attended founded?",
          _year("founded", of=1), lambda p, u: [p.passages[1], u.passage])),
    (_draw("orgs", _founder, _father, tries=1),
     _Ask("Who was the father of the person who founded {0.name}?", _last, _hops(2))),
    (_first_film, _Ask("Who produced the first film directed by {0.name}?", _last,
                       lambda d, film, producer: [d.passages[1], film.passage])),
)

_TABLES: dict[str, tuple[tuple[Any, ...], ...]] = dict(zip(
    DATASETS, (_NQ, _TRIVIAQA, _POPQA, _HOTPOTQA, _TWOWIKI, _MUSIQUE, _BAMBOOGLE), strict=True))


def _generate(world: SynthWiki, rng: random.Random, dataset: str) -> _Draft | None:
    """One question of ``dataset``, or None when its case drew nothing to ask about."""
    table = _TABLES[dataset]
    if dataset == "musique":  # 2, 3 or 4 hops equally often, then one of two chains
        hops = rng.randint(2, 4)
        case = table[2 * (hops - 2) + rng.randrange(2)]
    else:
        case = table[rng.randrange(len(table))]
    draw, *asks = case
    drawn = draw(world, rng)
    if drawn is None:
        return None
    ask = asks[0] if len(asks) == 1 else asks[rng.random() >= 0.5]
    template = ask.question if isinstance(ask.question, str) else ask.question[drawn[0].kind]
    supporting = ask.supporting(*drawn)
    answers = _aliases(world, ask.answers(*drawn), supporting)
    return _Draft(ask.style, template.format(*drawn), answers, supporting)


COMPARISON_STYLES = frozenset({"comparison", "bridge_comparison"})
"""Styles whose answer is one of the names in the question."""


def _gives_away(draft: _Draft) -> bool:
    """An answer that the question itself contains (``the capital of the country where
    Kessa is located`` when Kessa is that capital) is no question."""
    if draft.style in COMPARISON_STYLES:
        return False
    question = draft.question.lower()
    return any(answer.lower() in question for answer in draft.answers)


def draw_questions(world: SynthWiki, dataset: str,
                   sizes: dict[str, int]) -> dict[str, list[QAItem]]:
    """Draw distinct questions for one dataset: test first, then dev, then train."""
    rng = random.Random(f"synthwiki:{world.seed}:{dataset}")
    needed = sum(sizes.values())
    drafts: dict[str, _Draft] = {}  # question text -> draft, in draw order
    misses = 0
    while len(drafts) < needed:
        draft = _generate(world, rng, dataset)
        if draft is None or draft.question in drafts or _gives_away(draft):
            misses += 1
            if misses > 5000:
                raise ValueError(f"the world has too few distinct {dataset} questions: found "
                                 f"{len(drafts)}, asked for {needed} ({sizes}); build a larger "
                                 "world or ask for fewer")
            continue
        misses = 0
        drafts[draft.question] = draft
    ordered = list(drafts.values())
    out: dict[str, list[QAItem]] = {}
    for split in ("test", "dev", "train"):
        chunk, ordered = ordered[: sizes[split]], ordered[sizes[split] :]
        out[split] = [QAItem(id=f"{split}_{i}", question=d.question, golden_answers=d.answers,
                             dataset=dataset, metadata={"style": d.style, "hops": len(d.supporting),
                                                        "supporting": d.supporting})
                      for i, d in enumerate(chunk)]
    return {split: out[split] for split in SPLITS}
