"""The world's entities and how they are made: countries, cities, people, organisations, works.

``make_entities`` draws them from one seeded ``random.Random`` (families, careers, who
founded and made what); ``SynthWiki`` holds them with their passages and question sets.
Rendering the passages is ``render.py``'s job, asking questions ``questions.py``'s.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field

from envs.data.items import DATASETS, QAItem
from envs.data.synthwiki.names import (
    Names,
    city_name,
    country_name,
    family_name,
    given_name,
    language_name,
    look_alike,
    made_up_word,
    org_name,
    title_look_alike,
    work_title,
)

SPLITS = ("train", "dev", "test")


@dataclass
class Country:
    name: str
    official_name: str
    language: str
    independence: int
    capital: int = -1
    """Index into ``SynthWiki.cities``."""
    passage: str = ""


@dataclass
class City:
    name: str
    country: int
    founded: int
    river: str
    official_name: str | None
    passage: str = ""


@dataclass
class Person:
    given: str
    surname: str
    male: bool
    born: int
    birth_city: int
    occupation: str = ""
    father: int | None = None
    university: int | None = None
    """Index into ``SynthWiki.orgs`` (a university)."""
    works: list[int] = field(default_factory=list)
    """Works created (directed, written, composed, recorded), oldest first."""
    produced: list[int] = field(default_factory=list)
    """Films produced, oldest first."""
    founded: list[int] = field(default_factory=list)
    active: tuple[int, int] = (0, 0)
    passages: list[str] = field(default_factory=list)
    """One or two passage ids: [0] has birth, occupation and father; [1] (when present)
    education, works, films produced and organisations founded."""

    @property
    def name(self) -> str:
        return f"{self.given} {self.surname}"


@dataclass
class Org:
    name: str
    kind: str
    founded: int
    founder: int
    city: int
    passage: str = ""


@dataclass
class Work:
    title: str
    kind: str
    """``film``, ``novel``, ``opera`` or ``album``."""
    year: int
    creator: int
    """Director, author, composer or singer (index into people)."""
    city: int | None = None
    """Shooting city (film), setting (novel), premiere city (opera)."""
    producer: int | None = None
    org: int | None = None
    """Studio (film), publisher (novel) or label (album)."""
    passage: str = ""


# kind: (share of the works, the creator's occupation, earliest creator birth year, earliest work)
_WORK_KINDS = {
    "film": (0.43, "film director", 1865, 1900),
    "novel": (0.29, "novelist", 1750, 1780),
    "opera": (0.11, "composer", 1750, 1780),
    "album": (0.17, "singer", 1895, 1925),
}
_OTHER_OCCUPATIONS = tuple(
    "painter architect physicist chemist sculptor mathematician engineer botanist poet"
    " photographer cartographer astronomer economist historian diplomat actor".split()
)
# (kind, description, how many per 150 organisations, earliest founder birth year)
ORG_KINDS = (
    ("university", "university", 35, 1750),
    ("publisher", "publishing house", 25, 1750),
    ("label", "record label", 20, 1860),
    ("studio", "film studio", 20, 1850),
    ("newspaper", "newspaper", 15, 1750),
    ("orchestra", "orchestra", 15, 1750),
    ("shipping", "shipping company", 20, 1750),
)
ORG_DESCRIPTION = {kind: desc for kind, desc, _, _ in ORG_KINDS}
_WORK_ORG_KIND = {"film": "studio", "novel": "publisher", "album": "label"}


@dataclass
class SynthWiki:
    """A built world: entities, the passages that describe them, and the question sets.

    Treat it as read-only (``default_world()`` is shared); ``corpus`` returns copies.
    """

    seed: int
    countries: list[Country]
    cities: list[City]
    people: list[Person]
    orgs: list[Org]
    works: list[Work]
    passages: dict[str, dict[str, str]]
    """Passage id -> corpus row, in corpus order."""
    question_sets: dict[str, dict[str, list[QAItem]]] = field(default_factory=dict)
    """dataset -> split -> questions."""

    @property
    def corpus(self) -> list[dict[str, str]]:
        """The FlashRAG corpus rows ``{"id", "contents": "Title\\ntext"}`` (fresh copies)."""
        return [dict(row) for row in self.passages.values()]

    def questions(self, dataset: str, split: str = "test") -> list[QAItem]:
        """The questions of one dataset (one of ``DATASETS``) and split."""
        if dataset not in self.question_sets:
            raise ValueError(f"unknown dataset {dataset!r}; expected one of: {', '.join(DATASETS)}")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of: {', '.join(SPLITS)}")
        return list(self.question_sets[dataset][split])

    def all_questions(self, split: str = "test") -> dict[str, list[QAItem]]:
        """``{dataset: questions}`` for one split, in ``DATASETS`` order."""
        return {name: self.questions(name, split) for name in DATASETS}

    @functools.cached_property
    def namesakes(self) -> dict[str, list[Person]]:
        """Given name or surname -> the people who bear it."""
        index: dict[str, list[Person]] = {}
        for person in self.people:
            index.setdefault(person.given, []).append(person)
            index.setdefault(person.surname, []).append(person)
        return index

    def text(self, passage_id: str) -> str:
        """The contents (``"Title\\ntext"``) of one passage."""
        return self.passages[passage_id]["contents"]

    def geography(self) -> dict[tuple[str, str], str]:
        """The world's geography as closed-book facts, what a real LM knows without searching:
        ``(entity, relation) -> a sentence stating it``, for each city's ``country`` and
        ``river`` and each country's ``capital`` and ``language`` (the relation names of
        ``agents.reading``; each sentence states its subject, as a report must)."""
        facts = {}
        for city in self.cities:
            facts[city.name, "country"] = f"{city.name} is a city in {self.countries[city.country].name}."
            facts[city.name, "river"] = f"{city.name} lies on the {city.river}."
        for country in self.countries:
            facts[country.name, "capital"] = f"{country.name}'s capital is {self.cities[country.capital].name}."
            facts[country.name, "language"] = f"{country.name}'s official language is {country.language}."
        return facts


def make_entities(seed: int, rng: random.Random, *, countries: int, cities: int, people: int,
                  orgs: int, works: int) -> SynthWiki:
    """A world of these sizes with no passages or questions yet, drawn from ``rng``."""
    names = Names()
    world = SynthWiki(seed, [], [], [], [], [], {})
    _make_places(world, rng, names, countries, cities)
    _make_people(world, rng, names, people)
    _make_orgs(world, rng, names, orgs)
    _make_works(world, rng, names, works)
    _attend_universities(world, rng)
    _career_spans(world, rng)
    return world


def _make_places(world: SynthWiki, rng: random.Random, names: Names, n_countries: int,
                 n_cities: int) -> None:
    for _ in range(n_countries):
        root = made_up_word(rng)  # the stem the country's name and its language share
        name = names.take(functools.partial(country_name, rng, root))
        language = names.take(functools.partial(language_name, rng, root))
        form = rng.choice(("Republic", "Kingdom", "Grand Duchy", "Federation", "Commonwealth"))
        world.countries.append(Country(name, f"{form} of {name}", language,
                                       rng.randint(1640, 1960)))
    rivers = [names.take(functools.partial(made_up_word, rng)) + " River"
              for _ in range(max(2, n_cities // 2))]

    for i in range(n_cities):
        country = i if i < n_countries else rng.randrange(n_countries)
        name = names.take(functools.partial(city_name, rng))
        official = f"City of {name}" if rng.random() < 0.3 else None
        world.cities.append(City(name, country, rng.randint(850, 1750), rng.choice(rivers),
                                 official))
    for c, country in enumerate(world.countries):
        country.capital = rng.choice([i for i, city in enumerate(world.cities)
                                      if city.country == c])


def _make_people(world: SynthWiki, rng: random.Random, names: Names, n_people: int) -> None:
    people = world.people
    n_cities = len(world.cities)

    def add(given: str, surname: str, male: bool, born: int, father: int | None) -> int:
        people.append(Person(given, surname, male, born, rng.randrange(n_cities), father=father))
        return len(people) - 1

    def new_person(surname: str, male: bool, born: int, father: int | None) -> int | None:
        for _ in range(50):
            given = given_name(rng)
            if names.try_take(f"{given} {surname}"):
                return add(given, surname, male, born, father)
        return None

    # Families of up to three generations: fathers pass on the surname.
    while len(people) < n_people:
        surname = names.take(lambda: family_name(rng))
        founder = new_person(surname, True, rng.randint(1750, 1900), None)
        if founder is None:
            continue
        generation = [founder]
        for _ in range(2):
            children = []
            for parent in generation:
                if not people[parent].male or rng.random() < 0.35:
                    continue
                for _ in range(rng.randint(1, 3)):
                    born = people[parent].born + rng.randint(22, 42)
                    if born > 1985 or len(people) >= n_people:
                        break
                    child = new_person(surname, rng.random() < 0.5, born, parent)
                    if child is not None:
                        children.append(child)
            generation = children
        # A near-twin now and then: one vowel off in the given name or the surname.
        if len(people) < n_people and rng.random() < 0.5:
            model = people[rng.choice([founder, *generation])]
            if rng.random() < 0.5:
                given, surname2 = look_alike(rng, model.given), model.surname
            else:
                given, surname2 = model.given, look_alike(rng, model.surname)
            if names.try_take(f"{given} {surname2}"):
                add(given, surname2, rng.random() < 0.5, rng.randint(1750, 1985), None)


def _make_orgs(world: SynthWiki, rng: random.Random, names: Names, n_orgs: int) -> None:
    total = sum(share for _, _, share, _ in ORG_KINDS)
    counts = [max(1, round(n_orgs * share / total)) for _, _, share, _ in ORG_KINDS]
    counts[0] += n_orgs - sum(counts)  # rounding remainder goes to universities
    for (kind, _, _, earliest), count in zip(ORG_KINDS, counts, strict=True):
        founders = [i for i, p in enumerate(world.people) if earliest <= p.born <= 1960]
        founders = founders or list(range(len(world.people)))
        for _ in range(count):
            founder = rng.choice(founders)
            person = world.people[founder]
            city = rng.choice((person.birth_city, rng.randrange(len(world.cities))))
            name = names.take(functools.partial(org_name, rng, kind, person.surname,
                                                world.cities[city].name))
            founded = min(person.born + rng.randint(25, 60), 2015)
            world.orgs.append(Org(name, kind, founded, founder, city))
            person.founded.append(len(world.orgs) - 1)


def _make_works(world: SynthWiki, rng: random.Random, names: Names, n_works: int) -> None:
    people = world.people
    counts = {kind: max(1, round(n_works * share)) for kind, (share, *_) in _WORK_KINDS.items()}
    counts["film"] += n_works - sum(counts.values())
    unassigned = list(range(len(people)))
    rng.shuffle(unassigned)

    def hire(occupation: str, how_many: int, earliest: int) -> list[int]:
        hired = [i for i in unassigned if earliest <= people[i].born <= 1985][:how_many]
        for i in hired:
            people[i].occupation = occupation
            unassigned.remove(i)
        return hired

    creators = {kind: hire(occupation, math.ceil(counts[kind] / 2.5), born)
                for kind, (_, occupation, born, _) in _WORK_KINDS.items()}
    producers = hire("film producer", max(1, counts["film"] // 5), 1850)
    for i in unassigned:
        people[i].occupation = rng.choice(_OTHER_OCCUPATIONS)

    orgs_of_kind: dict[str, list[int]] = {}
    for o, org in enumerate(world.orgs):
        orgs_of_kind.setdefault(org.kind, []).append(o)
    titles: list[str] = []
    for kind, count in counts.items():
        pool = creators[kind]
        if not pool:
            continue
        # Each creator gets one work, the rest go at random to those with fewer than four.
        count = min(count, 4 * len(pool))
        owners = list(pool[:count])
        while len(owners) < count:
            owner = rng.choice(pool)
            if owners.count(owner) < 4:
                owners.append(owner)
        for creator in owners:
            born = people[creator].born
            year = min(max(born + rng.randint(24, 60), _WORK_KINDS[kind][3], born + 18), 2023)
            if titles and rng.random() < 0.12:
                candidate = title_look_alike(rng, rng.choice(titles))
                title = candidate if names.try_take(candidate) else names.take(lambda: work_title(rng))
            else:
                title = names.take(lambda: work_title(rng))
            titles.append(title)
            work = Work(title, kind, year, creator)
            if kind in ("film", "novel", "opera"):
                work.city = rng.randrange(len(world.cities))
            if kind == "film" and rng.random() < 0.75:
                fit = [p for p in producers
                       if year - 75 <= people[p].born <= year - 22 and len(people[p].produced) < 6]
                work.producer = rng.choice(fit) if fit else None
                if work.producer is not None:
                    people[work.producer].produced.append(len(world.works))
            if kind in _WORK_ORG_KIND:
                fit = [o for o in orgs_of_kind[_WORK_ORG_KIND[kind]]
                       if world.orgs[o].founded <= year]
                work.org = rng.choice(fit) if fit and rng.random() < 0.85 else None
            world.works.append(work)
            people[creator].works.append(len(world.works) - 1)
    for person in people:
        person.works.sort(key=lambda w: (world.works[w].year, w))
        person.produced.sort(key=lambda w: (world.works[w].year, w))


def _career_spans(world: SynthWiki, rng: random.Random) -> None:
    """Active years: from adulthood to retirement, covering every dated deed."""
    for person in world.people:
        deeds = [world.works[w].year for w in person.works + person.produced]
        deeds += [world.orgs[o].founded for o in person.founded]
        start = min([person.born + rng.randint(18, 30), *deeds])
        end = min(max([start + rng.randint(8, 45), *deeds]), max([2024, *deeds]))
        person.active = (start, end)


def _attend_universities(world: SynthWiki, rng: random.Random) -> None:
    universities = [o for o, org in enumerate(world.orgs) if org.kind == "university"]
    for person in world.people:
        fit = [u for u in universities if world.orgs[u].founded <= person.born + 18]
        if fit and rng.random() < 0.55:
            person.university = rng.choice(fit)
