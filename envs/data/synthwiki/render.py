"""Rendering: every entity of a world written as 1-2 encyclopedia passages.

``render`` fills ``SynthWiki.passages`` with FlashRAG rows ``{"id", "contents":
"Title\\ntext"}`` in corpus order and records each passage id on the entity it describes.
"""

from __future__ import annotations

import random

from envs.data.synthwiki.names import with_article
from envs.data.synthwiki.world import ORG_DESCRIPTION, SynthWiki, Work


def render(world: SynthWiki, rng: random.Random) -> None:
    """Write every passage and record its id on the entity it describes."""
    people, cities, orgs, works = world.people, world.cities, world.orgs, world.works

    def add(title: str, sentences: list[str]) -> str:
        pid = str(len(world.passages))
        world.passages[pid] = {"id": pid, "contents": f"{title}\n{' '.join(sentences)}"}
        return pid

    for country in world.countries:
        capital = cities[country.capital].name
        country.passage = add(country.name, [
            f"{country.name}, officially the {country.official_name}, is a country whose capital "
            f"is {capital}.",
            f"Its official language is {country.language}.",
            f"{country.name} became independent in {country.independence}."])
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
        if rng.random() < 0.5:
            first = f"{person.name} is {with_article(occupation)} born in {where} in {person.born}."
        else:
            first = f"{person.name} (born {person.born} in {where}) is {with_article(occupation)}."
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
            more.append(f"S produced the {'film' if len(listed) == 1 else 'films'} "
                        f"{_join(listed)}.")
        if person.founded:
            more.append(f"S founded {_join([_the(orgs[o].name) for o in person.founded])}.")
        if len(more) == 1:
            more.append(f"S retired in {person.active[1]}.")
        more = [_subject(m, *((person.name, f"{person.name}'s") if i == 0
                              else (he, his.capitalize()))) for i, m in enumerate(more)]
        # Two to four sentences each: the career span goes where a passage needs one more.
        if len(sentences) == 1 or not more:
            sentences.append(f"{he} was active from {person.active[0]} to {person.active[1]}.")
        person.passages = [add(person.name, sentences)]
        if more:
            person.passages.append(add(person.name, more))
    for org in orgs:
        subject = _the(org.name)
        sentences = [f"{subject[0].upper()}{subject[1:]} is "
                     f"{with_article(ORG_DESCRIPTION[org.kind])} founded in {org.founded} by "
                     f"{people[org.founder].name}.",
                     f"It is based in {cities[org.city].name}."]
        org.passage = add(org.name, sentences)
    for work in works:
        creator = people[work.creator].name
        if work.kind == "film":
            by = (f" and produced by {people[work.producer].name}" if work.producer is not None
                  else "")
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
            over = rng.choice(("one summer", "two years", "six weeks", "a winter"))
            sentences = [f"{work.title} is a {work.year} album by the singer {creator}{on}.",
                         f"It was recorded over {over}."]
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
