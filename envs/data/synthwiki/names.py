"""The world's words: pronounceable made-up names, work titles, and look-alikes of both.

Every name is built from syllables by a seeded ``random.Random``; ``Names`` keeps them
unique across the whole world (case-insensitively) and never a real country or city.
"""

from __future__ import annotations

import random
from collections.abc import Callable

_ONSETS = tuple("b d f g h k l m n p r s t v z br dr gr kr st tr th sk vr bl fl".split())
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "i", "a", "ai", "ei")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "m", "k", "rn", "ld")
_GIVEN_ENDINGS = ("", "", "n", "l", "r", "s", "ne", "ra", "th", "na", "lo")
_SURNAME_SUFFIXES = tuple("vik sen ard ell ow ane esk orn ith ander ton mere ovar ust elin aro"
                          .split())
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

TITLE_NOUNS = tuple("Garden Harbour Letters Winter Crown Lantern Orchard Bridge Tower Mirror River"
                    " Voyage Summer Island Lamp Feather Bell Meadow Station Window Anchor Compass"
                    .split())
TITLE_ADJECTIVES = tuple("Silver Quiet Last Golden Hidden Broken Distant Amber Second Burning"
                         " Northern Paper Crimson Long".split())


def _syllable(rng: random.Random, coda: bool = True) -> str:
    return rng.choice(_ONSETS) + rng.choice(_VOWELS) + (rng.choice(_CODAS) if coda else "")


def made_up_word(rng: random.Random) -> str:
    """A fictional two-syllable word, capitalised: ``Orvel``, ``Drumost``."""
    return (_syllable(rng, coda=False) + _syllable(rng)).capitalize()


def given_name(rng: random.Random) -> str:
    """A first name: ``Sekana``, ``Maileir``."""
    return (_syllable(rng, coda=False) + rng.choice(_ONSETS) + rng.choice(_VOWELS)
            + rng.choice(_GIVEN_ENDINGS)).capitalize()


def _fuse(base: str, suffix: str) -> str:
    """Join without a vowel pile-up: ``Maigra`` + ``a`` -> ``Maigra``, ``Brudrai`` + ``ith`` -> ``Brudrith``."""
    if base[-1] in "aeiou" and suffix[0] in "aeiou":
        base = base.rstrip("aeiou") or base
    return base + suffix


def family_name(rng: random.Random) -> str:
    """A surname of five letters or more, passed from father to children: ``Tolvik``."""
    while len(name := _fuse(_syllable(rng), rng.choice(_SURNAME_SUFFIXES))) < 5:
        pass
    return name.capitalize()


def look_alike(rng: random.Random, name: str) -> str:
    """``name`` with one vowel changed (``Tolvik`` -> ``Tolvek``)."""
    positions = [i for i, c in enumerate(name) if c in "aeiou"]
    i = rng.choice(positions)
    vowel = rng.choice([v for v in "aeiou" if v != name[i]])
    return name[:i] + vowel + name[i + 1 :]


class Names:
    """Hands out names unique across the whole world (case-insensitively)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def take(self, make: Callable[[], str]) -> str:
        """The first of up to 1,000 names ``make()`` draws that :meth:`try_take` gets."""
        for _ in range(1000):
            name = make()
            if self.try_take(name):
                return name
        raise RuntimeError("name space exhausted; enlarge the syllable inventory")

    def try_take(self, name: str) -> bool:
        """Reserve ``name``; False when it is taken or holds a real place's name."""
        key = name.lower()
        if key in self.used or any(part in _REAL_NAMES for part in key.split()):
            return False
        self.used.add(key)
        return True


def country_name(rng: random.Random, root: str) -> str:
    return _fuse(root, rng.choice(_COUNTRY_SUFFIXES))


def language_name(rng: random.Random, root: str) -> str:
    return root.rstrip("aeiou") + rng.choice(_LANGUAGE_SUFFIXES)


def city_name(rng: random.Random) -> str:
    base = _syllable(rng, coda=False) + _syllable(rng, coda=rng.random() < 0.3)
    base = _fuse(base, rng.choice(_PLACE_SUFFIXES)).capitalize()
    return (rng.choice(_PLACE_PREFIXES) + base) if rng.random() < 0.15 else base


def work_title(rng: random.Random) -> str:
    """A film, novel, opera or album title: ``The Orvel Garden``, ``Long Harbour over Rafli``."""
    pattern = rng.randrange(6)
    noun, adj, word = rng.choice(TITLE_NOUNS), rng.choice(TITLE_ADJECTIVES), made_up_word(rng)
    article = with_article(noun).split()[0].capitalize()
    return (f"The {word} {noun}", f"{noun} of {word}", f"The {adj} {noun} of {word}",
            f"{adj} {noun} over {word}", word, f"{article} {noun} for {word}")[pattern]


def title_look_alike(rng: random.Random, title: str) -> str:
    """Swap one English word of ``title`` for another (``The Orvel Garden`` -> ``The Orvel Lantern``)."""
    words = title.split()
    swappable = [i for i, w in enumerate(words) if w in TITLE_NOUNS or w in TITLE_ADJECTIVES]
    if not swappable:
        return title + " " + rng.choice(("II", "Returns", "Reprise"))
    i = rng.choice(swappable)
    pool = TITLE_NOUNS if words[i] in TITLE_NOUNS else TITLE_ADJECTIVES
    words[i] = rng.choice([w for w in pool if w != words[i]])
    if i == 1 and words[0] in ("A", "An"):
        words[0] = with_article(words[1]).split()[0].capitalize()
    return " ".join(words)


def org_name(rng: random.Random, kind: str, surname: str, city: str) -> str:
    """Named after the founder, the seat or nothing real: ``Tolvik Press``, ``Kessa Philharmonic``."""
    choices = {
        "university": (f"University of {city}", f"{city} Polytechnic", f"{surname} College",
                       f"{made_up_word(rng)} University"),
        "publisher": (f"{surname} Press", f"{surname} and Sons", f"{made_up_word(rng)} Books"),
        "label": (f"{made_up_word(rng)} Records",),
        "studio": (f"{made_up_word(rng)} Pictures", f"{surname} Studios"),
        "newspaper": (f"The {city} Courier", f"The {city} Herald", f"The {made_up_word(rng)} Gazette"),
        "orchestra": (f"{city} Philharmonic", f"{made_up_word(rng)} Chamber Orchestra"),
        "shipping": (f"{surname} Shipping Company", f"{made_up_word(rng)} Line"),
    }[kind]
    return rng.choice(choices)


def with_article(noun: str) -> str:
    """``a film director``, ``an actor``, ``a university``."""
    vowel_sound = noun[0].lower() in "aeiou" and not noun.lower().startswith("uni")
    return ("an " if vowel_sound else "a ") + noun
