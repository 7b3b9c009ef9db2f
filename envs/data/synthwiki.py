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
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from envs.data.items import DATASETS, QAItem, write_jsonl

SPLITS = ("train", "dev", "test")

# ----------------------------------------------------------------------------- names

_ONSETS = tuple("b d f g h k l m n p r s t v z br dr gr kr st tr th sk vr bl fl".split())
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "i", "a", "ai", "ei")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "m", "k", "rn", "ld")
_GIVEN_ENDINGS = ("", "", "n", "l", "r", "s", "ne", "ra", "th", "na", "lo")
_SURNAME_SUFFIXES = tuple(
    "vik sen ard ell ow ane esk orn ith ander ton mere ovar ust elin aro".split()
)
_PLACE_SUFFIXES = ("a", "ora", "ene", "heim", "by", "mar", "ost", "ava", "ir", "ith", "enz")
_COUNTRY_SUFFIXES = ("ia", "and", "ora", "esh", "avia", "onne", "istra", "mark")
_LANGUAGE_SUFFIXES = ("ish", "ian", "ese", "ic")
_PLACE_PREFIXES = ("Port ", "New ", "Upper ", "Lower ", "Fort ")

# Real countries and large cities a syllable generator could hit; names are redrawn.
_REAL_NAMES = frozenset(
    """
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
""".split()
)


def _syllable(rng: random.Random, coda: bool = True) -> str:
    return rng.choice(_ONSETS) + rng.choice(_VOWELS) + (rng.choice(_CODAS) if coda else "")


def _word(rng: random.Random) -> str:
    """A fictional two-syllable word, capitalised: ``Orvel``, ``Drumost``."""
    return (_syllable(rng, coda=False) + _syllable(rng)).capitalize()


def _given_name(rng: random.Random) -> str:
    return (
        _syllable(rng, coda=False)
        + rng.choice(_ONSETS)
        + rng.choice(_VOWELS)
        + rng.choice(_GIVEN_ENDINGS)
    ).capitalize()


def _fuse(base: str, suffix: str) -> str:
    """Join without a vowel pile-up: ``Maigra`` + ``a`` -> ``Maigra``, ``Brudrai`` + ``ith`` -> ``Brudrith``."""
    if base[-1] in "aeiou" and suffix[0] in "aeiou":
        base = base.rstrip("aeiou") or base
    return base + suffix


def _surname(rng: random.Random) -> str:
    while len(name := _fuse(_syllable(rng), rng.choice(_SURNAME_SUFFIXES))) < 5:
        pass
    return name.capitalize()


def _look_alike(rng: random.Random, name: str) -> str:
    """``name`` with one vowel changed (``Tolvik`` -> ``Tolvek``)."""
    positions = [i for i, c in enumerate(name) if c in "aeiou"]
    i = rng.choice(positions)
    vowel = rng.choice([v for v in "aeiou" if v != name[i]])
    return name[:i] + vowel + name[i + 1 :]


class _Names:
    """Hands out names unique across the whole world (case-insensitively)."""

    def __init__(self) -> None:
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


_CREATOR_OCCUPATION = {
    "film": "film director",
    "novel": "novelist",
    "opera": "composer",
    "album": "singer",
}
_OTHER_OCCUPATIONS = tuple(
    "painter architect physicist chemist sculptor mathematician engineer botanist poet"
    " photographer cartographer astronomer economist historian diplomat actor".split()
)
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
_TITLE_NOUNS = tuple(
    "Garden Harbour Letters Winter Crown Lantern Orchard Bridge Tower Mirror River Voyage"
    " Summer Island Lamp Feather Bell Meadow Station Window Anchor Compass".split()
)
_TITLE_ADJECTIVES = tuple(
    "Silver Quiet Last Golden Hidden Broken Distant Amber Second Burning Northern Paper"
    " Crimson Long".split()
)


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
    article = _a(noun).split()[0]
    return f"{article.capitalize()} {noun} for {word}"


def _title_look_alike(rng: random.Random, title: str) -> str:
    """Swap one English word of ``title`` for another (``The Orvel Garden`` -> ``The Orvel Lantern``)."""
    words = title.split()
    swappable = [i for i, w in enumerate(words) if w in _TITLE_NOUNS or w in _TITLE_ADJECTIVES]
    if not swappable:
        return title + " " + rng.choice(("II", "Returns", "Reprise"))
    i = rng.choice(swappable)
    pool = _TITLE_NOUNS if words[i] in _TITLE_NOUNS else _TITLE_ADJECTIVES
    words[i] = rng.choice([w for w in pool if w != words[i]])
    if i == 1 and words[0] in ("A", "An"):
        words[0] = _a(words[1]).split()[0].capitalize()
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
    smallest = dict(countries=1, cities=1, people=50, orgs=len(_ORG_KINDS), works=8)
    for key, value in dict(
        countries=countries, cities=cities, people=people, orgs=orgs, works=works
    ).items():
        if value < smallest[key]:
            raise ValueError(f"{key} must be >= {smallest[key]}, got {value}")
    if cities < countries:
        raise ValueError(
            f"need at least one city per country: cities={cities} < countries={countries}"
        )
    rng = random.Random(f"synthwiki:{seed}:world")
    names = _Names()
    world = SynthWiki(seed, [], [], [], [], [], {})
    _make_places(world, rng, names, countries, cities)
    _make_people(world, rng, names, people)
    _make_orgs(world, rng, names, orgs)
    _make_works(world, rng, names, works)
    _attend_universities(world, rng)
    _career_spans(world, rng)
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


def _make_places(
    world: SynthWiki, rng: random.Random, names: _Names, n_countries: int, n_cities: int
) -> None:
    for _ in range(n_countries):
        root = (_syllable(rng, coda=False) + _syllable(rng)).capitalize()
        name = names.take(lambda root=root: _fuse(root, rng.choice(_COUNTRY_SUFFIXES)))
        language = names.take(
            lambda root=root: root.rstrip("aeiou") + rng.choice(_LANGUAGE_SUFFIXES)
        )
        form = rng.choice(("Republic", "Kingdom", "Grand Duchy", "Federation", "Commonwealth"))
        world.countries.append(
            Country(name, f"{form} of {name}", language, rng.randint(1640, 1960))
        )
    rivers = [names.take(lambda: _word(rng)) + " River" for _ in range(max(2, n_cities // 2))]

    def city_name() -> str:
        base = _syllable(rng, coda=False) + _syllable(rng, coda=rng.random() < 0.3)
        base = _fuse(base, rng.choice(_PLACE_SUFFIXES)).capitalize()
        return (rng.choice(_PLACE_PREFIXES) + base) if rng.random() < 0.15 else base

    for i in range(n_cities):
        country = i if i < n_countries else rng.randrange(n_countries)
        name = names.take(city_name)
        official = f"City of {name}" if rng.random() < 0.3 else None
        world.cities.append(
            City(name, country, rng.randint(850, 1750), rng.choice(rivers), official)
        )
    for c, country in enumerate(world.countries):
        country.capital = rng.choice(
            [i for i, city in enumerate(world.cities) if city.country == c]
        )


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
                given, surname2 = _look_alike(rng, model.given), model.surname
            else:
                given, surname2 = model.given, _look_alike(rng, model.surname)
            if names.try_take(f"{given} {surname2}"):
                add(given, surname2, rng.random() < 0.5, rng.randint(1750, 1985), None)


def _make_orgs(world: SynthWiki, rng: random.Random, names: _Names, n_orgs: int) -> None:
    total = sum(share for _, _, share, _ in _ORG_KINDS)
    counts = [max(1, round(n_orgs * share / total)) for _, _, share, _ in _ORG_KINDS]
    counts[0] += n_orgs - sum(counts)  # rounding remainder goes to universities
    for (kind, _, _, earliest), count in zip(_ORG_KINDS, counts, strict=True):
        founders = [i for i, p in enumerate(world.people) if earliest <= p.born <= 1960]
        founders = founders or list(range(len(world.people)))
        for _ in range(count):
            founder = rng.choice(founders)
            person = world.people[founder]
            city = rng.choice((person.birth_city, rng.randrange(len(world.cities))))
            name = names.take(
                functools.partial(_org_name, rng, kind, person.surname, world.cities[city].name)
            )
            founded = min(person.born + rng.randint(25, 60), 2015)
            world.orgs.append(Org(name, kind, founded, founder, city))
            person.founded.append(len(world.orgs) - 1)


def _org_name(rng: random.Random, kind: str, surname: str, city: str) -> str:
    """Named after the founder, the seat or nothing real: ``Tolvik Press``, ``Kessa Philharmonic``."""
    choices = {
        "university": (
            f"University of {city}",
            f"{city} Polytechnic",
            f"{surname} College",
            f"{_word(rng)} University",
        ),
        "publisher": (f"{surname} Press", f"{surname} and Sons", f"{_word(rng)} Books"),
        "label": (f"{_word(rng)} Records",),
        "studio": (f"{_word(rng)} Pictures", f"{surname} Studios"),
        "newspaper": (f"The {city} Courier", f"The {city} Herald", f"The {_word(rng)} Gazette"),
        "orchestra": (f"{city} Philharmonic", f"{_word(rng)} Chamber Orchestra"),
        "shipping": (f"{surname} Shipping Company", f"{_word(rng)} Line"),
    }[kind]
    return rng.choice(choices)


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

    creators = {
        kind: hire(
            _CREATOR_OCCUPATION[kind], math.ceil(counts[kind] / 2.5), _EARLIEST_CREATOR_BIRTH[kind]
        )
        for kind in counts
    }
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
                fit = [
                    p
                    for p in producers
                    if year - 75 <= people[p].born <= year - 22 and len(people[p].produced) < 6
                ]
                work.producer = rng.choice(fit) if fit else None
                if work.producer is not None:
                    people[work.producer].produced.append(len(world.works))
            if kind in _WORK_ORG_KIND:
                fit = [
                    o for o in orgs_of_kind[_WORK_ORG_KIND[kind]] if world.orgs[o].founded <= year
                ]
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
        country.passage = add(
            country.name,
            [
                f"{country.name}, officially the {country.official_name}, is a country whose capital is {capital}.",
                f"Its official language is {country.language}.",
                f"{country.name} became independent in {country.independence}.",
            ],
        )
    for c, city in enumerate(cities):
        country = world.countries[city.country]
        also = f", officially the {city.official_name}," if city.official_name else ""
        sentences = [
            f"{city.name}{also} is a city in {country.name}, founded in {city.founded}.",
            f"It lies on the {city.river}.",
        ]
        if country.capital == c:
            sentences.append(f"It is the capital of {country.name}.")
        city.passage = add(city.name, sentences)
    for person in people:
        he, his = ("He", "his") if person.male else ("She", "her")
        where, occupation = cities[person.birth_city].name, person.occupation
        if rng.random() < 0.5:
            first = f"{person.name} is {_a(occupation)} born in {where} in {person.born}."
        else:
            first = f"{person.name} (born {person.born} in {where}) is {_a(occupation)}."
        sentences = [first]
        if person.father is not None:
            child = "son" if person.male else "daughter"
            sentences.append(f"{he} is the {child} of {people[person.father].name}.")
        # The second passage opens with the name ("S" and "P" stand for subject and
        # possessive), so that it is found by name as well as the first.
        more = []
        if person.university is not None:
            more.append(f"S studied at {_the(orgs[person.university].name)}.")
        if person.works:
            more.append(_works_sentence([works[w] for w in person.works], "P"))
        if person.produced:
            listed = [f"{works[w].title} ({works[w].year})" for w in person.produced]
            more.append(
                f"S produced the {'film' if len(listed) == 1 else 'films'} {_join(listed)}."
            )
        if person.founded:
            more.append(f"S founded {_join([_the(orgs[o].name) for o in person.founded])}.")
        if len(more) == 1:
            more.append(f"S retired in {person.active[1]}.")
        more = [
            _subject(m, *((person.name, f"{person.name}'s") if i == 0 else (he, his.capitalize())))
            for i, m in enumerate(more)
        ]
        # Two to four sentences each: the career span goes where a passage needs one more.
        if len(sentences) == 1 or not more:
            sentences.append(f"{he} was active from {person.active[0]} to {person.active[1]}.")
        person.passages = [add(person.name, sentences)]
        if more:
            person.passages.append(add(person.name, more))
    for org in orgs:
        subject = _the(org.name)
        sentences = [
            f"{subject[0].upper()}{subject[1:]} is {_a(_ORG_DESCRIPTION[org.kind])} founded in "
            f"{org.founded} by {people[org.founder].name}.",
            f"It is based in {cities[org.city].name}.",
        ]
        org.passage = add(org.name, sentences)
    for work in works:
        creator = people[work.creator].name
        if work.kind == "film":
            by = (
                f" and produced by {people[work.producer].name}"
                if work.producer is not None
                else ""
            )
            sentences = [
                f"{work.title} is a {work.year} film directed by {creator}{by}.",
                f"It was shot in {cities[work.city].name}.",
            ]
            if work.org is not None:
                sentences.append(f"The film was released by {orgs[work.org].name}.")
        elif work.kind == "novel":
            by = f" by {orgs[work.org].name}" if work.org is not None else ""
            sentences = [
                f"{work.title} is a novel by {creator}, published in {work.year}{by}.",
                f"The story is set in {cities[work.city].name}.",
            ]
        elif work.kind == "opera":
            sentences = [
                f"{work.title} is an opera by the composer {creator}.",
                f"It premiered in {cities[work.city].name} in {work.year}.",
            ]
        else:
            on = f", released on {orgs[work.org].name}" if work.org is not None else ""
            sentences = [
                f"{work.title} is a {work.year} album by the singer {creator}{on}.",
                f"It was recorded over {rng.choice(('one summer', 'two years', 'six weeks', 'a winter'))}.",
            ]
        work.passage = add(work.title, sentences)


def _subject(sentence: str, subject: str, possessive: str) -> str:
    """Fill the leading ``S`` (subject) or ``P`` (possessive) placeholder of a sentence."""
    head, rest = sentence.split(" ", 1)
    return f"{subject if head == 'S' else possessive} {rest}"


def _works_sentence(made: list[Work], placeholder: str) -> str:
    """``P films are A (1950) and B (1956).``: the complete list, oldest first."""
    noun = made[0].kind
    listed = [f"{w.title} ({w.year})" for w in made]
    if len(listed) == 1:
        return f"{placeholder} only {noun} is {listed[0]}."
    return f"{placeholder} {noun}s are {_join(listed)}."


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _the(name: str) -> str:
    """``University of Kessa`` reads ``the University of Kessa`` inside a sentence."""
    return f"the {name}" if name.startswith("University of ") else name


def _a(noun: str) -> str:
    vowel_sound = noun[0].lower() in "aeiou" and not noun.lower().startswith("uni")
    return ("an " if vowel_sound else "a ") + noun


# ------------------------------------------------------------------------- questions


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
            f"Who founded the {_ORG_DESCRIPTION[o.kind]} {o.name}?",
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


def _draw_questions(
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
