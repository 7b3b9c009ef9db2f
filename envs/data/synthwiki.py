"""SynthWiki: a seeded synthetic encyclopedia and seven question sets over it.

The embedded default data for a machine with no downloads. Every fact is made up by
``random.Random(seed)``, so no model can answer from memory: a team has to search.
The same seed gives byte-identical corpus and questions.

The world (default sizes)
-------------------------
- 10 countries (capital, official language, year of independence),
- 60 cities, each in a country (founding year, the river it lies on; capitals say so),
- 800 people in families (birth year and city, occupation, father, university attended,
  works, organisations founded),
- 150 organisations (universities, publishing houses, record labels, film studios,
  newspapers, orchestras, shipping companies: founder, founding year, seat),
- 700 works (films with director, producer, studio and shooting city; novels with
  author and publisher; operas with composer and premiere city; albums with singer
  and label).

Names are built from syllables: pronounceable, unique across the world, never a real
country or capital. Look-alike distractors are there on purpose: relatives share a
surname, about one person in seven has a near-twin whose name differs in one vowel,
some titles differ from another title in one word, and organisations are named after
their founders and cities. Retrieval has to be precise.

Each entity is rendered as 1-2 encyclopedia passages of 2-4 sentences, FlashRAG corpus
rows ``{"id", "contents": "Title\\ntext"}`` whose title is the entity's name; a person
gets a second passage (education, works, organisations founded) when there is one to
write. The default corpus has about 2,000 passages (at most ~3,000 by design, so a
MiniLM encoder indexes it in seconds on a CPU).

Questions
---------
Each question is a ``QAItem`` whose ``dataset`` is one of ``DATASETS`` and whose
``metadata`` is ``{"style", "hops", "supporting"}``: ``supporting`` lists the ids of
the passages needed, in hop order, and ``hops == len(supporting)``. Every gold answer
occurs verbatim in a supporting passage; for comparisons the answer is one of the two
names compared. Single-hop questions contain the subject's exact name.

=================  ======================  ==============================================
dataset            style                   example
=================  ======================  ==============================================
nq                 factoid                 where was Maren Tolvik born -> Kessa
triviaqa           trivia                  Which director made the film 'The Orvel
                                           Garden'? -> Maren Tolvik
popqa              relation                What is Maren Tolvik's occupation? -> painter
hotpotqa           bridge                  In which city was the director of 'The Orvel
                                           Garden' born? -> Kessa
hotpotqa           comparison              Which was founded first, Tolvik Press or
                                           University of Kessa? -> Tolvik Press
2wikimultihopqa    comparison              Who was born first, Maren Tolvik or Maren
                                           Tolvek? -> Maren Tolvek
2wikimultihopqa    composition             Who is the father of the director of film
                                           'The Orvel Garden'? -> Ivo Tolvik
2wikimultihopqa    bridge_comparison       Which film has the director born first, 'A'
                                           or 'B'? -> A
musique            composition (2-4 hops)  What is the capital of the country where the
                                           founder of Tolvik Press was born? -> Drumora
bamboogle          hard_two_hop            What river flows through the city where Maren
                                           Tolvik was born? -> Dunmere River
=================  ======================  ==============================================

(The names above show the shape; ``python -m envs data show NAME --root synthetic``
prints real ones.)

Splits ``train``/``dev``/``test`` are disjoint in question text. They are drawn test
first, so the test set of a seed does not change when ``train`` or ``dev`` grow.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.data.qa import DATASETS, QAItem, write_jsonl

SPLITS = ("train", "dev", "test")

# ----------------------------------------------------------------------------- names

_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "dr", "gr", "kr", "st", "tr", "th", "sk", "vr", "bl", "fl")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "au")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "k", "rn", "ld", "st")
_GIVEN_ENDINGS = ("", "", "n", "l", "r", "s", "ne", "ra", "th", "na", "lo")
_SURNAME_SUFFIXES = ("vik", "sen", "ard", "ell", "ow", "ane", "esk", "orn", "ith", "ander",
                     "ton", "mere", "ovar", "ust", "elin", "aro")
_PLACE_SUFFIXES = ("a", "ora", "ene", "heim", "by", "mar", "ost", "ava", "ir", "ith", "enz")
_COUNTRY_SUFFIXES = ("ia", "and", "ora", "esh", "avia", "onne", "istra", "mark")
_LANGUAGE_SUFFIXES = ("ish", "ian", "ese", "ic")
_PLACE_PREFIXES = ("Port ", "New ", "Upper ", "Lower ", "Fort ")

# Real countries and large cities a syllable generator could hit; names are redrawn.
_REAL_NAMES = frozenset("""
    albania algeria andorra angola armenia austria belarus belgium benin bhutan bolivia
    brazil brunei bulgaria burundi canada chad chile china colombia comoros congo croatia
    cuba cyprus denmark egypt eritrea estonia ethiopia fiji finland france gabon gambia
    georgia germany ghana greece grenada guinea guyana haiti honduras hungary iceland india
    indonesia iran iraq ireland israel italy jamaica japan jordan kenya kiribati kosovo
    kuwait laos latvia lebanon lesotho liberia libya lithuania malawi malaysia mali malta
    mexico moldova monaco mongolia morocco namibia nauru nepal niger nigeria norway oman
    panama peru poland portugal qatar romania russia rwanda samoa serbia slovakia slovenia
    somalia spain sudan sweden syria taiwan tanzania togo tonga tunisia turkey tuvalu uganda
    ukraine vanuatu vietnam yemen zambia
    paris london rome roma berlin madrid lisbon vienna prague warsaw oslo bern riga baku
    doha lima kiev kyiv sofia minsk dublin athens cairo delhi tokyo osaka kobe milan nice
    lyon bonn boston denver austin dallas dakar accra tunis rabat sana amman tehran kabul
    manila hanoi seoul perth sydney moscow bristol leeds hull york derby bath venice genoa
    turin naples sevilla seville valencia bilbao porto geneva basel zurich munich hamburg
    cologne dresden leipzig essen bremen hanover krakow gdansk vilnius tallinn helsinki
    bergen malmo aarhus havana quito bogota caracas santiago lagos nairobi kampala luanda
    harare durban mumbai dhaka lahore karachi beijing shanghai canton macau hong kong
    indiana georgia virginia carolina florida texas ohio iowa idaho utah nevada maine
""".split())


def _syllable(rng: random.Random, coda: bool = True) -> str:
    return rng.choice(_ONSETS) + rng.choice(_VOWELS) + (rng.choice(_CODAS) if coda else "")


def _word(rng: random.Random) -> str:
    """A fictional two-syllable word, capitalised: ``Orvel``, ``Drumost``."""
    return (_syllable(rng, coda=False) + _syllable(rng)).capitalize()


def _given_name(rng: random.Random) -> str:
    return (_syllable(rng, coda=False) + rng.choice(_ONSETS) + rng.choice(_VOWELS)
            + rng.choice(_GIVEN_ENDINGS)).capitalize()


def _surname(rng: random.Random) -> str:
    return (_syllable(rng) + rng.choice(_SURNAME_SUFFIXES)).capitalize()


def _look_alike(rng: random.Random, name: str) -> str:
    """``name`` with one vowel changed (``Tolvik`` -> ``Tolvek``)."""
    positions = [i for i, c in enumerate(name) if c in "aeiou"]
    i = rng.choice(positions)
    vowel = rng.choice([v for v in "aeiou" if v != name[i]])
    return name[:i] + vowel + name[i + 1:]


class _Names:
    """Hands out names unique across the whole world (case-insensitively)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def take(self, make: Callable[[], str]) -> str:
        for _ in range(1000):
            name = make()
            key = name.lower()
            if key not in self.used and not any(part in _REAL_NAMES for part in key.split()):
                self.used.add(key)
                return name
        raise RuntimeError("name space exhausted; enlarge the syllable inventory")

    def try_take(self, name: str) -> bool:
        key = name.lower()
        if key in self.used or any(part in _REAL_NAMES for part in key.split()):
            return False
        self.used.add(key)
        return True


# -------------------------------------------------------------------------- entities


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
    founded: list[int] = field(default_factory=list)
    active: tuple[int, int] = (0, 0)
    passages: list[str] = field(default_factory=list)
    """One or two passage ids: [0] has birth, occupation and father; [1] (when present)
    education, works and organisations founded."""

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


_CREATOR_OCCUPATION = {"film": "film director", "novel": "novelist", "opera": "composer",
                       "album": "singer"}
_OTHER_OCCUPATIONS = ("painter", "architect", "physicist", "chemist", "sculptor",
                      "mathematician", "engineer", "botanist", "poet", "photographer",
                      "cartographer", "astronomer", "economist", "historian", "diplomat",
                      "actor")
# (kind, description, how many per 150 organisations, earliest founder birth year)
_ORG_KINDS = (
    ("university", "university", 35, 1750),
    ("publisher", "publishing house", 25, 1750),
    ("label", "record label", 20, 1860),
    ("studio", "film studio", 20, 1850),
    ("newspaper", "newspaper", 15, 1750),
    ("orchestra", "orchestra", 15, 1750),
    ("shipping", "shipping company", 20, 1750),
)
_ORG_DESCRIPTION = {kind: desc for kind, desc, _, _ in _ORG_KINDS}
_WORK_ORG_KIND = {"film": "studio", "novel": "publisher", "album": "label"}
_EARLIEST_WORK = {"film": 1900, "novel": 1780, "opera": 1780, "album": 1925}
_EARLIEST_CREATOR_BIRTH = {"film": 1865, "novel": 1750, "opera": 1750, "album": 1895}
_TITLE_NOUNS = ("Garden", "Harbour", "Letters", "Winter", "Crown", "Lantern", "Orchard",
                "Bridge", "Tower", "Mirror", "River", "Voyage", "Summer", "Island", "Lamp",
                "Feather", "Bell", "Meadow", "Station", "Window", "Anchor", "Compass")
_TITLE_ADJECTIVES = ("Silver", "Quiet", "Last", "Golden", "Hidden", "Broken", "Distant",
                     "Amber", "Second", "Burning", "Northern", "Paper", "Crimson", "Long")


def _title(rng: random.Random) -> str:
    pattern = rng.randrange(6)
    noun, adj, word = rng.choice(_TITLE_NOUNS), rng.choice(_TITLE_ADJECTIVES), _word(rng)
    if pattern == 0:
        return f"The {word} {noun}"
    if pattern == 1:
        return f"{noun} of {word}"
    if pattern == 2:
        return f"The {adj} {noun} of {word}"
    if pattern == 3:
        return f"{adj} {noun} over {word}"
    if pattern == 4:
        return f"{word}"
    return f"A {noun} for {word}"


def _title_look_alike(rng: random.Random, title: str) -> str:
    """Swap one English word of ``title`` for another (``The Orvel Garden`` -> ``The Orvel Lantern``)."""
    words = title.split()
    swappable = [i for i, w in enumerate(words) if w in _TITLE_NOUNS or w in _TITLE_ADJECTIVES]
    if not swappable:
        return title + " " + rng.choice(("II", "Returns", "Reprise"))
    i = rng.choice(swappable)
    pool = _TITLE_NOUNS if words[i] in _TITLE_NOUNS else _TITLE_ADJECTIVES
    words[i] = rng.choice([w for w in pool if w != words[i]])
    return " ".join(words)


# ----------------------------------------------------------------------------- world


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

    def text(self, passage_id: str) -> str:
        """The contents (``"Title\\ntext"``) of one passage."""
        return self.passages[passage_id]["contents"]


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
    for key, value in dict(train=train, dev=dev, test=test).items():
        if value < 0:
            raise ValueError(f"{key} must be >= 0, got {value}")
    for key, value in dict(countries=countries, cities=cities, people=people, orgs=orgs,
                           works=works).items():
        if value < 2:
            raise ValueError(f"{key} must be >= 2, got {value}")
    if cities < countries:
        raise ValueError(f"need at least one city per country: cities={cities} < countries={countries}")
    rng = random.Random(f"synthwiki:{seed}:world")
    names = _Names(rng)
    world = SynthWiki(seed, [], [], [], [], [], {})
    _make_places(world, rng, names, countries, cities)
    _make_people(world, rng, names, people)
    _make_orgs(world, rng, names, orgs)
    _make_works(world, rng, names, works)
    _attend_universities(world, rng)
    _render(world, rng)
    sizes = {"test": test, "dev": dev, "train": train}
    for dataset in DATASETS:
        world.question_sets[dataset] = _draw_questions(world, dataset, sizes)
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


# ------------------------------------------------------------------------ generation


def _make_places(world: SynthWiki, rng: random.Random, names: _Names, n_countries: int,
                 n_cities: int) -> None:
    for _ in range(n_countries):
        root = (_syllable(rng, coda=False) + _syllable(rng)).capitalize()
        name = names.take(lambda root=root: root + rng.choice(_COUNTRY_SUFFIXES))
        language = names.take(lambda root=root: root.rstrip("aeiou") + rng.choice(_LANGUAGE_SUFFIXES))
        form = rng.choice(("Republic", "Kingdom", "Grand Duchy", "Federation", "Commonwealth"))
        world.countries.append(Country(name, f"{form} of {name}", language, rng.randint(1640, 1960)))
    rivers = [names.take(lambda: _word(rng)) + " River" for _ in range(max(2, n_cities // 2))]

    def city_name() -> str:
        base = _syllable(rng, coda=False) + _syllable(rng, coda=rng.random() < 0.3)
        base = (base + rng.choice(_PLACE_SUFFIXES)).capitalize()
        return (rng.choice(_PLACE_PREFIXES) + base) if rng.random() < 0.15 else base

    for i in range(n_cities):
        country = i if i < n_countries else rng.randrange(n_countries)
        name = names.take(city_name)
        official = f"City of {name}" if rng.random() < 0.3 else None
        world.cities.append(City(name, country, rng.randint(850, 1750), rng.choice(rivers), official))
    for c, country in enumerate(world.countries):
        country.capital = rng.choice([i for i, city in enumerate(world.cities) if city.country == c])


def _make_people(world: SynthWiki, rng: random.Random, names: _Names, n_people: int) -> None:
    people = world.people
    n_cities = len(world.cities)

    def add(given: str, surname: str, male: bool, born: int, father: int | None) -> int:
        people.append(Person(given, surname, male, born, rng.randrange(n_cities), father=father))
        return len(people) - 1

    def new_person(surname: str, male: bool, born: int, father: int | None) -> int | None:
        for _ in range(50):
            given = _given_name(rng)
            if names.try_take(f"{given} {surname}"):
                return add(given, surname, male, born, father)
        return None

    # Families of up to three generations: fathers pass on the surname.
    while len(people) < n_people:
        surname = names.take(lambda: _surname(rng))
        founder = new_person(surname, True, rng.randint(1750, 1900), None)
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
                given, surname2 = _look_alike(rng, model.given), model.surname
            else:
                given, surname2 = model.given, _look_alike(rng, model.surname)
            if names.try_take(f"{given} {surname2}"):
                add(given, surname2, rng.random() < 0.5, rng.randint(1750, 1985), None)

    for person in people:
        start = person.born + rng.randint(18, 30)
        person.active = (start, min(start + rng.randint(8, 45), 2024))


def _make_orgs(world: SynthWiki, rng: random.Random, names: _Names, n_orgs: int) -> None:
    total = sum(share for _, _, share, _ in _ORG_KINDS)
    counts = [max(1, round(n_orgs * share / total)) for _, _, share, _ in _ORG_KINDS]
    counts[0] += n_orgs - sum(counts)  # rounding remainder goes to universities
    for (kind, _, _, earliest), count in zip(_ORG_KINDS, counts):
        founders = [i for i, p in enumerate(world.people) if earliest <= p.born <= 1960]
        for _ in range(count):
            founder = rng.choice(founders)
            person = world.people[founder]
            city = rng.choice((person.birth_city, rng.randrange(len(world.cities))))
            city_name = world.cities[city].name
            make = {
                "university": lambda: rng.choice((f"University of {city_name}",
                                                  f"{city_name} Polytechnic",
                                                  f"{person.surname} College",
                                                  f"{_word(rng)} University")),
                "publisher": lambda: rng.choice((f"{person.surname} Press",
                                                 f"{person.surname} and Sons",
                                                 f"{_word(rng)} Books")),
                "label": lambda: f"{_word(rng)} Records",
                "studio": lambda: rng.choice((f"{_word(rng)} Pictures", f"{person.surname} Studios")),
                "newspaper": lambda: rng.choice((f"The {city_name} Courier",
                                                 f"The {city_name} Herald",
                                                 f"The {_word(rng)} Gazette")),
                "orchestra": lambda: rng.choice((f"{city_name} Philharmonic",
                                                 f"{_word(rng)} Chamber Orchestra")),
                "shipping": lambda: rng.choice((f"{person.surname} Shipping Company",
                                                f"{_word(rng)} Line")),
            }[kind]
            founded = min(person.born + rng.randint(25, 60), 2015)
            world.orgs.append(Org(names.take(make), kind, founded, founder, city))
            person.founded.append(len(world.orgs) - 1)


def _make_works(world: SynthWiki, rng: random.Random, names: _Names, n_works: int) -> None:
    people, shares = world.people, {"film": 0.43, "novel": 0.29, "opera": 0.11, "album": 0.17}
    counts = {kind: max(1, round(n_works * share)) for kind, share in shares.items()}
    counts["film"] += n_works - sum(counts.values())
    unassigned = list(range(len(people)))
    rng.shuffle(unassigned)

    def hire(occupation: str, how_many: int, earliest: int) -> list[int]:
        hired = [i for i in unassigned if earliest <= people[i].born <= 1985][:how_many]
        for i in hired:
            people[i].occupation = occupation
            unassigned.remove(i)
        return hired

    creators = {kind: hire(_CREATOR_OCCUPATION[kind], math.ceil(counts[kind] / 2.5),
                           _EARLIEST_CREATOR_BIRTH[kind]) for kind in counts}
    producers = hire("film producer", max(1, counts["film"] // 8), 1850)
    for i in unassigned:
        people[i].occupation = rng.choice(_OTHER_OCCUPATIONS)

    titles: list[str] = []
    for kind, count in counts.items():
        pool = creators[kind]
        if not pool:
            continue
        # Each creator gets one work, the rest go at random to those with fewer than four.
        owners = list(pool[:count])
        while len(owners) < count:
            owner = rng.choice(pool)
            if owners.count(owner) < 4:
                owners.append(owner)
        for creator in owners:
            born = people[creator].born
            year = min(max(born + rng.randint(24, 60), _EARLIEST_WORK[kind], born + 18), 2023)
            if titles and rng.random() < 0.12:
                candidate = _title_look_alike(rng, rng.choice(titles))
                title = candidate if names.try_take(candidate) else names.take(lambda: _title(rng))
            else:
                title = names.take(lambda: _title(rng))
            titles.append(title)
            work = Work(title, kind, year, creator)
            if kind in ("film", "novel", "opera"):
                work.city = rng.randrange(len(world.cities))
            if kind == "film" and rng.random() < 0.75:
                fit = [p for p in producers if year - 75 <= people[p].born <= year - 22]
                work.producer = rng.choice(fit) if fit else None
            if kind in _WORK_ORG_KIND:
                fit = [o for o, org in enumerate(world.orgs)
                       if org.kind == _WORK_ORG_KIND[kind] and org.founded <= year]
                work.org = rng.choice(fit) if fit and rng.random() < 0.85 else None
            world.works.append(work)
            people[creator].works.append(len(world.works) - 1)
    for person in people:
        person.works.sort(key=lambda w: (world.works[w].year, w))


def _attend_universities(world: SynthWiki, rng: random.Random) -> None:
    universities = [o for o, org in enumerate(world.orgs) if org.kind == "university"]
    for person in world.people:
        fit = [u for u in universities if world.orgs[u].founded <= person.born + 18]
        if fit and rng.random() < 0.55:
            person.university = rng.choice(fit)


# ------------------------------------------------------------------------- rendering


def _render(world: SynthWiki, rng: random.Random) -> None:
    """Write every passage and record its id on the entity it describes."""
    people, cities, orgs, works = world.people, world.cities, world.orgs, world.works

    def add(title: str, sentences: list[str]) -> str:
        pid = str(len(world.passages))
        world.passages[pid] = {"id": pid, "contents": f"{title}\n{' '.join(sentences)}"}
        return pid

    for country in world.countries:
        capital = cities[country.capital].name
        country.passage = add(country.name, [
            f"{country.name}, officially the {country.official_name}, is a country whose capital is {capital}.",
            f"Its official language is {country.language}.",
            f"{country.name} became independent in {country.independence}.",
        ])
    for c, city in enumerate(cities):
        country = world.countries[city.country]
        also = f", officially the {city.official_name}," if city.official_name else ""
        sentences = [f"{city.name}{also} is a city in {country.name}, founded in {city.founded}.",
                     f"It lies on the {city.river}."]
        if country.capital == c:
            sentences.append(f"It is the capital of {country.name}.")
        city.passage = add(city.name, sentences)
    for person in people:
        he, his = ("He", "his") if person.male else ("She", "her")
        where, occupation = cities[person.birth_city].name, person.occupation
        article = "an" if occupation[0] in "aeiou" else "a"
        if rng.random() < 0.5:
            first = f"{person.name} is {article} {occupation} born in {where} in {person.born}."
        else:
            first = f"{person.name} (born {person.born} in {where}) is {article} {occupation}."
        sentences = [first]
        if person.father is not None:
            child = "son" if person.male else "daughter"
            sentences.append(f"{he} is the {child} of {people[person.father].name}.")
        sentences.append(f"{he} was active from {person.active[0]} to {person.active[1]}.")
        person.passages = [add(person.name, sentences)]
        more = []
        if person.university is not None:
            more.append(f"{person.name} studied at {orgs[person.university].name}.")
        if person.works:
            listed = [f"{works[w].title} ({works[w].year})" for w in person.works]
            kind = works[person.works[0]].kind
            noun = {"film": "films", "novel": "novels", "opera": "operas", "album": "albums"}[kind]
            more.append(f"{his.capitalize()} {noun} include {_join(listed)}.")
        if person.founded:
            more.append(f"{he} founded {_join([orgs[o].name for o in person.founded])}.")
        if more:
            person.passages.append(add(person.name, more))
    for org in orgs:
        sentences = [
            f"{org.name} is {_a(_ORG_DESCRIPTION[org.kind])} founded in {org.founded} by {people[org.founder].name}.",
            f"It is based in {cities[org.city].name}.",
        ]
        org.passage = add(org.name, sentences)
    for work in works:
        creator = people[work.creator].name
        if work.kind == "film":
            by = f" and produced by {people[work.producer].name}" if work.producer is not None else ""
            sentences = [f"{work.title} is a {work.year} film directed by {creator}{by}.",
                         f"It was shot in {cities[work.city].name}."]
            if work.org is not None:
                sentences.append(f"The film was released by {orgs[work.org].name}.")
        elif work.kind == "novel":
            by = f" by {orgs[work.org].name}" if work.org is not None else ""
            sentences = [f"{work.title} is a novel by {creator}, published in {work.year}{by}.",
                         f"The story is set in {cities[work.city].name}."]
        elif work.kind == "opera":
            sentences = [f"{work.title} is an opera by the composer {creator}.",
                         f"It premiered in {cities[work.city].name} in {work.year}."]
        else:
            on = f", released on {orgs[work.org].name}" if work.org is not None else ""
            sentences = [f"{work.title} is a {work.year} album by the singer {creator}{on}.",
                         f"It was recorded over {rng.choice(('one summer', 'two years', 'six weeks', 'a winter'))}."]
        work.passage = add(work.title, sentences)


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


# ------------------------------------------------------------------------- questions

# A template draws its subject with the rng and returns (question, answers, supporting
# passage ids), or None when the subject it drew does not fit.
_Draft = tuple[str, list[str], list[str]]
_Template = Callable[[SynthWiki, random.Random], "_Draft | None"]


def _aliases(world: SynthWiki, names: list[str], supporting: list[str]) -> list[str]:
    """Keep the first name and every alias that occurs verbatim in a supporting passage."""
    texts = [world.text(pid) for pid in supporting]
    return [names[0]] + [n for n in names[1:] if any(n in t for t in texts)]


def _city_answers(world: SynthWiki, c: int, supporting: list[str]) -> list[str]:
    city = world.cities[c]
    return _aliases(world, [city.name] + ([city.official_name] if city.official_name else []), supporting)


def _country_answers(world: SynthWiki, c: int, supporting: list[str]) -> list[str]:
    country = world.countries[c]
    return _aliases(world, [country.name, country.official_name], supporting)


def _river_answers(river: str) -> list[str]:
    return [river, river.removesuffix(" River")]


def _occupation_answers(occupation: str) -> list[str]:
    words = occupation.split()
    return [occupation] + ([words[-1]] if len(words) > 1 else [])


def _pick(rng: random.Random, items: list[Any], keep: Callable[[Any], bool]) -> Any | None:
    """A random item satisfying ``keep`` (a few tries, then None)."""
    for _ in range(20):
        item = rng.choice(items)
        if keep(item):
            return item
    return None


def _work(world: SynthWiki, rng: random.Random, kind: str | None = None,
          keep: Callable[[Work], bool] = lambda w: True) -> Work | None:
    return _pick(rng, world.works, lambda w: (kind is None or w.kind == kind) and keep(w))


def _person(world: SynthWiki, rng: random.Random, keep: Callable[[Person], bool] = lambda p: True) -> Person | None:
    return _pick(rng, world.people, keep)


_KIND_NOUN = {"film": "film", "novel": "novel", "opera": "opera", "album": "album"}
_CREATOR_VERB = {"film": "directed", "novel": "wrote", "opera": "composed", "album": "recorded"}


# --- nq: single-hop factoid, lower case and no question mark, like Google queries.

def _nq(world: SynthWiki, rng: random.Random) -> _Draft | None:
    pick = rng.randrange(8)
    if pick < 3:
        p = _person(world, rng)
        sup = [p.passages[0]]
        if pick == 0:
            return f"where was {p.name} born", _city_answers(world, p.birth_city, sup), sup
        if pick == 1:
            return f"when was {p.name} born", [str(p.born)], sup
        return f"what does {p.name} do for a living", _occupation_answers(p.occupation), sup
    if pick == 3:
        c = rng.randrange(len(world.cities))
        city = world.cities[c]
        if rng.random() < 0.5:
            return f"what country is {city.name} in", _country_answers(world, city.country, [city.passage]), [city.passage]
        return f"what river runs through {city.name}", _river_answers(city.river), [city.passage]
    if pick == 4:
        o = rng.choice(world.orgs)
        if rng.random() < 0.5:
            return f"who founded {o.name}", [world.people[o.founder].name], [o.passage]
        return f"when was {o.name} founded", [str(o.founded)], [o.passage]
    if pick == 5:
        country = rng.choice(world.countries)
        return (f"what is the capital of {country.name}",
                _city_answers(world, country.capital, [country.passage]), [country.passage])
    w = rng.choice(world.works)
    if pick == 6:
        return (f"who {_CREATOR_VERB[w.kind]} the {_KIND_NOUN[w.kind]} {w.title}",
                [world.people[w.creator].name], [w.passage])
    return f"when did the {_KIND_NOUN[w.kind]} {w.title} come out", [str(w.year)], [w.passage]


# --- triviaqa: trivia-quiz phrasing, titles in quotes.

def _triviaqa(world: SynthWiki, rng: random.Random) -> _Draft | None:
    pick = rng.randrange(7)
    w = rng.choice(world.works)
    creator = [world.people[w.creator].name]
    if pick == 0:
        question = {
            "film": f"Which director made the film '{w.title}'?",
            "novel": f"Which novelist wrote '{w.title}'?",
            "opera": f"The opera '{w.title}' was composed by whom?",
            "album": f"'{w.title}' was a {w.year} album by which singer?",
        }[w.kind]
        return question, creator, [w.passage]
    if pick == 1:
        return f"In which year did the {_KIND_NOUN[w.kind]} '{w.title}' first appear?", [str(w.year)], [w.passage]
    if pick == 2:
        c = rng.randrange(len(world.cities))
        city = world.cities[c]
        return (f"{city.name}, founded in {city.founded}, is a city in which country?",
                _country_answers(world, city.country, [city.passage]), [city.passage])
    if pick == 3:
        country = rng.choice(world.countries)
        return (f"Which city is the capital of {country.name}?",
                _city_answers(world, country.capital, [country.passage]), [country.passage])
    if pick == 4:
        o = rng.choice(world.orgs)
        return (f"Who founded the {_ORG_DESCRIPTION[o.kind]} {o.name}?",
                [world.people[o.founder].name], [o.passage])
    p = _person(world, rng)
    sup = [p.passages[0]]
    if pick == 5:
        return f"The {p.occupation} {p.name} was born in which city?", _city_answers(world, p.birth_city, sup), sup
    country = rng.choice(world.countries)
    return f"What is the official language of {country.name}?", [country.language], [country.passage]


# --- popqa: PopQA's relation templates.

def _popqa(world: SynthWiki, rng: random.Random) -> _Draft | None:
    pick = rng.randrange(9)
    if pick < 3:
        p = _person(world, rng, (lambda p: p.father is not None) if pick == 2 else (lambda p: True))
        if p is None:
            return None
        sup = [p.passages[0]]
        if pick == 0:
            return f"What is {p.name}'s occupation?", _occupation_answers(p.occupation), sup
        if pick == 1:
            return f"In what city was {p.name} born?", _city_answers(world, p.birth_city, sup), sup
        return f"Who is the father of {p.name}?", [world.people[p.father].name], sup
    if pick == 3:
        w = _work(world, rng, "film", lambda w: w.producer is not None)
        if w is None:
            return None
        return f"Who was the producer of {w.title}?", [world.people[w.producer].name], [w.passage]
    if pick in (4, 5):
        kind = ("film", "novel", "opera")[rng.randrange(3)] if pick == 4 else "novel"
        w = _work(world, rng, kind)
        if w is None:
            return None
        relation = {"film": "Who was the director of", "novel": "Who is the author of",
                    "opera": "Who was the composer of"}[kind]
        return f"{relation} {w.title}?", [world.people[w.creator].name], [w.passage]
    if pick == 6:
        city = rng.choice(world.cities)
        return f"In what country is {city.name}?", _country_answers(world, city.country, [city.passage]), [city.passage]
    country = rng.choice(world.countries)
    capital = world.cities[country.capital]
    if pick == 7:
        return (f"What is the capital of {country.name}?",
                _city_answers(world, country.capital, [country.passage]), [country.passage])
    return f"What is {capital.name} the capital of?", _country_answers(world, capital.country, [capital.passage]), [capital.passage]


# --- hotpotqa: two-hop bridge and comparison.

def _hotpotqa(world: SynthWiki, rng: random.Random) -> _Draft | None:
    people, orgs = world.people, world.orgs
    pick = rng.randrange(5)
    if pick == 0:
        w = _work(world, rng, "film")
        d = people[w.creator]
        sup = [w.passage, d.passages[0]]
        return (f"In which city was the director of '{w.title}' born?",
                _city_answers(world, d.birth_city, sup), sup)
    if pick == 1:
        o = rng.choice(orgs)
        f = people[o.founder]
        return f"What year was the founder of {o.name} born?", [str(f.born)], [o.passage, f.passages[0]]
    if pick == 2:
        w = _work(world, rng, "novel", lambda w: people[w.creator].university is not None)
        if w is None:
            return None
        a = people[w.creator]
        return (f"Which university did the author of '{w.title}' attend?",
                [orgs[a.university].name], [w.passage, a.passages[1]])
    # comparison: two organisations of one kind, or two cities
    if pick == 3:
        a, b = rng.choice(orgs), rng.choice(orgs)
        if a is b or a.kind != b.kind or a.founded == b.founded:
            return None
        first = a if a.founded < b.founded else b
        return f"Which was founded first, {a.name} or {b.name}?", [first.name], [a.passage, b.passage]
    a, b = rng.choice(world.cities), rng.choice(world.cities)
    if a is b or a.founded == b.founded:
        return None
    later = a if a.founded > b.founded else b
    return f"Which city was founded more recently, {a.name} or {b.name}?", [later.name], [a.passage, b.passage]


def _hotpotqa_style(question: str) -> str:
    return "comparison" if question.startswith("Which was founded first") or \
        question.startswith("Which city was founded") else "bridge"


# --- 2wikimultihopqa: dated comparison, composition, bridge comparison.

def _twowiki(world: SynthWiki, rng: random.Random) -> tuple[str, _Draft | None]:
    people = world.people
    pick = rng.randrange(9)
    if pick < 3:  # comparison
        if pick == 2:
            a, b = _work(world, rng, "film"), _work(world, rng, "film")
            if a is b or a.year == b.year:
                return "comparison", None
            first = a if a.year < b.year else b
            return "comparison", (f"Which film came out first, '{a.title}' or '{b.title}'?",
                                  [first.title], [a.passage, b.passage])
        a = _person(world, rng)
        # Half the time against a look-alike (same surname or a near-twin name).
        near = [p for p in people if p is not a and (p.surname == a.surname or p.given == a.given)]
        b = rng.choice(near) if near and rng.random() < 0.5 else _person(world, rng)
        if a is b or a.born == b.born:
            return "comparison", None
        earlier = pick == 0
        answer = a if (a.born < b.born) == earlier else b
        word = "first" if earlier else "later"
        return "comparison", (f"Who was born {word}, {a.name} or {b.name}?", [answer.name],
                              [a.passages[0], b.passages[0]])
    if pick < 7:  # composition
        if pick == 3:
            w = _work(world, rng, "film", lambda w: people[w.creator].father is not None)
            if w is None:
                return "composition", None
            d = people[w.creator]
            return "composition", (f"Who is the father of the director of film '{w.title}'?",
                                   [people[d.father].name], [w.passage, d.passages[0]])
        if pick == 4:
            p = _person(world, rng, lambda p: p.father is not None and people[p.father].father is not None)
            if p is None:
                return "composition", None
            f = people[p.father]
            return "composition", (f"Who is the paternal grandfather of {p.name}?",
                                   [people[f.father].name], [p.passages[0], f.passages[0]])
        if pick == 5:
            p = _person(world, rng, lambda p: p.father is not None)
            if p is None:
                return "composition", None
            f = people[p.father]
            sup = [p.passages[0], f.passages[0]]
            return "composition", (f"Where was the father of {p.name} born?",
                                   _city_answers(world, f.birth_city, sup), sup)
        w = _work(world, rng, rng.choice(("novel", "opera")))
        if w is None:
            return "composition", None
        c = people[w.creator]
        role = "author" if w.kind == "novel" else "composer"
        return "composition", (f"When was the {role} of {w.kind} '{w.title}' born?",
                               [str(c.born)], [w.passage, c.passages[0]])
    a, b = _work(world, rng, "film"), _work(world, rng, "film")
    if a is b or people[a.creator].born == people[b.creator].born:
        return "bridge_comparison", None
    da, db = people[a.creator], people[b.creator]
    first = a if da.born < db.born else b
    return "bridge_comparison", (f"Which film has the director born first, '{a.title}' or '{b.title}'?",
                                 [first.title], [a.passage, da.passages[0], b.passage, db.passages[0]])


# --- musique: 2-4 hop composition.

def _musique(world: SynthWiki, rng: random.Random) -> _Draft | None:
    people, orgs, cities, countries = world.people, world.orgs, world.cities, world.countries
    hops = rng.randint(2, 4)
    pick = rng.randrange(2)
    if hops == 2:
        if pick == 0:
            city = rng.choice(cities)
            country = countries[city.country]
            sup = [city.passage, country.passage]
            return (f"What is the capital of the country where {city.name} is located?",
                    _city_answers(world, country.capital, sup), sup)
        w = _work(world, rng, "novel", lambda w: w.org is not None)
        if w is None:
            return None
        publisher = orgs[w.org]
        return (f"When was the publisher of {w.title} founded?", [str(publisher.founded)],
                [w.passage, publisher.passage])
    if hops == 3:
        if pick == 0:
            w = _work(world, rng, "film")
            d = people[w.creator]
            city = cities[d.birth_city]
            sup = [w.passage, d.passages[0], city.passage]
            return (f"In which country was the director of {w.title} born?",
                    _country_answers(world, city.country, sup), sup)
        w = _work(world, rng, "novel", lambda w: people[w.creator].university is not None)
        if w is None:
            return None
        a = people[w.creator]
        u = orgs[a.university]
        return (f"When was the university attended by the author of {w.title} founded?",
                [str(u.founded)], [w.passage, a.passages[1], u.passage])
    if pick == 0:
        o = rng.choice(orgs)
        f = people[o.founder]
        city = cities[f.birth_city]
        country = countries[city.country]
        sup = [o.passage, f.passages[0], city.passage, country.passage]
        return (f"What is the capital of the country where the founder of {o.name} was born?",
                _city_answers(world, country.capital, sup), sup)
    w = _work(world, rng, "film")
    d = people[w.creator]
    city = cities[d.birth_city]
    country = countries[city.country]
    return (f"What language is spoken in the country where the director of {w.title} was born?",
            [country.language], [w.passage, d.passages[0], city.passage, country.passage])


# --- bamboogle: hard two-hop; the bridge entity is never named.

def _bamboogle(world: SynthWiki, rng: random.Random) -> _Draft | None:
    people, orgs, works = world.people, world.orgs, world.works
    pick = rng.randrange(4)
    if pick == 0:
        p = _person(world, rng)
        city = world.cities[p.birth_city]
        return (f"What river flows through the city where {p.name} was born?",
                _river_answers(city.river), [p.passages[0], city.passage])
    if pick == 1:
        p = _person(world, rng, lambda p: p.university is not None)
        if p is None:
            return None
        u = orgs[p.university]
        return (f"In what year was the university that {p.name} attended founded?",
                [str(u.founded)], [p.passages[1], u.passage])
    if pick == 2:
        o = rng.choice(orgs)
        f = people[o.founder]
        if f.father is None:
            return None
        return (f"Who was the father of the person who founded {o.name}?",
                [people[f.father].name], [o.passage, f.passages[0]])
    d = _person(world, rng, lambda p: p.occupation == "film director" and len(p.works) > 0)
    if d is None:
        return None
    first = works[d.works[0]]
    if first.producer is None or (len(d.works) > 1 and works[d.works[1]].year == first.year):
        return None
    return (f"Who produced the first film directed by {d.name}?", [people[first.producer].name],
            [d.passages[1], first.passage])


def _styled(style: str, template: Callable[[SynthWiki, random.Random], _Draft | None]):
    return lambda world, rng: (style, template(world, rng))


_GENERATORS: dict[str, Callable[[SynthWiki, random.Random], tuple[str, _Draft | None]]] = {
    "nq": _styled("factoid", _nq),
    "triviaqa": _styled("trivia", _triviaqa),
    "popqa": _styled("relation", _popqa),
    "hotpotqa": lambda world, rng: _with_hotpot_style(_hotpotqa(world, rng)),
    "2wikimultihopqa": _twowiki,
    "musique": _styled("composition", _musique),
    "bamboogle": _styled("hard_two_hop", _bamboogle),
}


def _with_hotpot_style(draft: _Draft | None) -> tuple[str, _Draft | None]:
    return ("bridge" if draft is None else _hotpotqa_style(draft[0])), draft


def _draw_questions(world: SynthWiki, dataset: str, sizes: dict[str, int]) -> dict[str, list[QAItem]]:
    """Draw unique questions for one dataset, test first, then dev, then train."""
    rng = random.Random(f"synthwiki:{world.seed}:{dataset}")
    generate = _GENERATORS[dataset]
    seen: set[str] = set()
    needed = sum(sizes.values())
    drafts: list[tuple[str, _Draft]] = []
    attempts = 0
    while len(drafts) < needed:
        attempts += 1
        if attempts > 200 * needed + 1000:
            raise ValueError(
                f"the world has only {len(drafts)} distinct {dataset} questions, {needed} were "
                f"asked for ({sizes}); build a larger world or ask for fewer"
            )
        style, draft = generate(world, rng)
        if draft is None or draft[0] in seen:
            continue
        seen.add(draft[0])
        drafts.append((style, draft))
    out: dict[str, list[QAItem]] = {}
    start = 0
    for split in ("test", "dev", "train"):
        chunk = drafts[start:start + sizes[split]]
        start += sizes[split]
        out[split] = [
            QAItem(
                id=f"{split}_{i}",
                question=question,
                golden_answers=answers,
                dataset=dataset,
                metadata={"style": style, "hops": len(supporting), "supporting": supporting},
            )
            for i, (style, (question, answers, supporting)) in enumerate(chunk)
        ]
    return {split: out[split] for split in SPLITS}
