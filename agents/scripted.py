"""ScriptedPolicy: a search team without a language model, the baseline every learned team
should beat.

It plays all three roles from what the env tells each agent (``Observation.info``: the
question, its sub-task, the passages it saw, the reports in hand, the waves left; never
the world, never the gold answers, never by parsing prompt text), with a few rules any
reader of encyclopedia text would use:

- **Questions become chains.** ``"In which country was the director of 'X' born?"`` is
  the entity ``X`` and the relations ``director -> born_place -> country``; a comparison
  ``"Which was founded first, A or B?"`` is one chain per option (``A -> founded_year``,
  ``B -> founded_year``) and a direction (the smaller year). Unknown phrasings become a
  one-step chain that asks the question as it is.
- **Sentences are read with their subject.** A passage's leading pronoun (``He``, ``It``,
  ``His``) is replaced by its title, and a relation is answered by a regular expression
  (``born in <Name>``, ``founded in <year>``, ``directed by <Name>``) over the sentences
  that start with the subject, then over those that mention it.
- **Leader:** one sub-task per chain and hop; after each wave it reads the bridge entity
  from the reports and dispatches the next hop (the last wave takes what is left of a
  chain); then it selects the reports that answered their sub-task.
- **Searcher:** searches its task, resolves as many hops as the passages allow, searches
  again for the first unresolved hop (its question, then its entity plus the relation's
  keywords) up to ``max_searches``, and summarises with the answer-bearing sentences.
- **Answerer:** follows the chain through the evidence; for a comparison it compares the
  years found for each option; otherwise a span of the asked type that is not already
  in the question.

The same observation always gives the same turn (``seed`` only breaks ties where
the evidence cannot decide a comparison, and picks the tasks ``skip_search`` skips).

>>> from agents.scripted import parse_question
>>> parse_question("In which country was the director of 'The Orvel Garden' born?").chains
[Chain(entity='The Orvel Garden', relations=('director', 'born_place', 'country'))]
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents.base import Observation
from envs import protocol as P
from envs.rewards import normalize_answer

# ----------------------------------------------------------------------------- spans

_CONNECTORS = ("of", "and", "for", "over", "on", "the", "de", "la", "von", "van", "der", "du")
NAME = r"[A-Z][\w'’-]*(?:(?:\s+(?:" + "|".join(_CONNECTORS) + r"))*\s+[A-Z][\w'’-]*)*"
"""A proper name: capitalised words, possibly joined by ``of``, ``and``, ``for`` ..."""
YEAR = r"\b\d{3,4}\b"
_A_NAME = rf"(?:the )?(?P<a>{NAME})"
_A_YEAR = rf"(?P<a>{YEAR})"
_NOT_NAMES = frozenset("a an the he she it its his her they their in on of who what when where "
                       "which how doc title report evidence question task".split())


def _names(text: str) -> list[str]:
    """Proper-name spans in ``text``, minus lone function words (``The``, ``It``)."""
    out = []
    for m in re.finditer(NAME, text):
        words = re.sub(r"['’]s$", "", m.group(0)).split()
        if m.start() == 0 and len(words) > 1 and words[0] in ("The", "A", "An", "His", "Her", "Its"):
            words = words[1:]  # a sentence-initial article is not part of the name
        span = " ".join(words)
        if span and span.lower() not in _NOT_NAMES:
            out.append(span)
    return out


def _in_text(span: str, text: str) -> bool:
    """Whether ``span`` occurs in ``text`` as whole words, after SQuAD normalisation."""
    a, b = normalize_answer(span), normalize_answer(re.sub(r"['’]s\b", "", text))
    return bool(a) and f" {a} " in f" {b} "


# ----------------------------------------------------------------------------- sentences


@dataclass(frozen=True)
class Sentence:
    text: str
    """The sentence, its leading pronoun replaced by the passage's title."""
    title: str = ""


_PRONOUN = re.compile(r"^(?:He|She|It|They|This|The (?:film|novel|opera|album|story|book|city|"
                      r"country|company|university|label|studio|newspaper|orchestra))\b")
_POSSESSIVE = re.compile(r"^(?:His|Her|Its|Their)\b")
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9'\"(])")


def sentences_of(title: str, text: str) -> list[Sentence]:
    """Split a passage (or a report, with no title) into sentences about their subject."""
    out = []
    for s in _SPLIT.split(" ".join(text.split())):
        s = s.strip()
        if not s:
            continue
        if title:
            if _POSSESSIVE.match(s):
                s = _POSSESSIVE.sub(f"{title}'s", s, count=1)
            elif _PRONOUN.match(s):
                s = _PRONOUN.sub(title, s, count=1)
        out.append(Sentence(s, title))
    return out


_LONGER_NAME = re.compile(r"\s+(?:(?:of|and|for|over)\s+)?[A-Z]")


def _starts_with(sentence: str, subject: str) -> bool:
    """Whether the sentence is about ``subject``: it opens with it (after an optional
    ``The``), and the name does not go on (``Kessa`` is not ``Kessa Polytechnic``)."""
    if sentence[:4] == "The " and subject[:4] != "The ":
        sentence = sentence[4:]
    n = len(subject)
    if n == 0 or sentence[:n].lower() != subject.lower():
        return False
    rest = sentence[n:]
    return not rest or (not rest[0].isalnum() and not _LONGER_NAME.match(rest))


def _mentions(sentence: str, subject: str) -> bool:
    """Whether ``subject`` occurs in the sentence as a whole name, not inside a longer one."""
    for m in re.finditer(rf"(?<!\w){re.escape(subject)}(?!\w)", sentence, re.IGNORECASE):
        before = sentence[:m.start()]
        if _LONGER_NAME.match(sentence[m.end():]):
            continue
        if re.search(r"\S\s+[A-Z][\w'-]*\s+$", before):  # "Upper Kessa", not "In Kessa"
            continue
        return True
    return False


# ----------------------------------------------------------------------------- relations


@dataclass(frozen=True)
class Relation:
    """One step of a chain: how to ask it, how to name its answer inside a longer question,
    and how to read the answer off a sentence about the subject."""

    name: str
    ask: str
    """The question for one hop; ``{}`` is the subject (quoted when it is a title)."""
    describe: str | None
    """The answer as a noun phrase (``the city where {} was born``); None for years."""
    kind: str
    """What the answer is: ``name``, ``year``, ``phrase`` or ``title``."""
    patterns: tuple[str, ...]
    """Regexes with group ``a``, tried on sentences that start with the subject."""
    reverse: tuple[str, ...] = ()
    """Regexes tried on sentences that mention the subject elsewhere (``SUBJ`` = it)."""
    keywords: str = ""
    """Words for a refined query: ``<subject> <keywords>``."""
    work: bool = False
    """The subject is a title (quoted in questions)."""
    extract: Callable[[str, str], str | None] | None = None
    """A custom reader ``(sentence, subject) -> answer`` instead of ``patterns``."""


def _first_work(sentence: str, subject: str) -> str | None:
    """The earliest title in ``X's films are T1 (1950), T2 (1955) and T3 (1960)``."""
    m = re.search(r"\b(?:only )?films? (?:include|are|is) (.+)", sentence)
    if m is None:
        return None
    items = re.findall(r"\s*(?:and\s+)?(.+?) \((\d{3,4})\)(?:,|\s+and\b|\.|$)", m.group(1))
    if not items:
        return None
    return min(items, key=lambda item: int(item[1]))[0].strip()


def _rel(name: str, ask: str, describe: str | None, kind: str, patterns: Sequence[str],
         reverse: Sequence[str] = (), keywords: str = "", work: bool = False,
         extract: Callable[[str, str], str | None] | None = None) -> Relation:
    return Relation(name, ask, describe, kind, tuple(patterns), tuple(reverse), keywords, work, extract)


def _made(noun: str) -> str:
    return rf"^{_A_NAME}'s (?:only )?{noun}s? (?:include|are|is)\b.*\bSUBJ \("


_BY = rf"by (?:the (?:composer|singer|author|novelist|director|writer) )?{_A_NAME}"
RELATIONS: dict[str, Relation] = {r.name: r for r in (
    _rel("born_place", "In which city was {} born?", "the city where {} was born", "name",
         [rf"\bborn in {_A_NAME}", rf"\bborn (?:in |on )?[^.;()]*?\b\d{{3,4}},? in {_A_NAME}",
          rf"\bnative of {_A_NAME}"], keywords="born in"),
    _rel("born_year", "When was {} born?", None, "year", [rf"\bborn\b[^.;]*?{_A_YEAR}"],
         keywords="born"),
    _rel("occupation", "What is {}'s occupation?", None, "phrase",
         [r"\bis an? (?P<a>[a-z]+(?: [a-z]+){0,2}?)(?= born\b| from\b| who\b| and\b|[.,;])"],
         keywords="occupation"),
    _rel("father", "Who is the father of {}?", "the father of {}", "name",
         [rf"\b(?:son|daughter|child) of {_A_NAME}"], keywords="son of"),
    _rel("director", "Who directed the film {}?", "the director of film {}", "name",
         [rf"\bdirected by {_A_NAME}"], [_made("film")], "film directed by", work=True),
    _rel("author", "Who wrote the novel {}?", "the author of {}", "name",
         [rf"\b(?:novel|book) by {_A_NAME}", rf"\bwritten by {_A_NAME}"], [_made("novel")],
         "novel by", work=True),
    _rel("composer", "Who composed the opera {}?", "the composer of {}", "name",
         [rf"\bby the composer {_A_NAME}", rf"\bcomposed by {_A_NAME}", rf"\bopera by {_A_NAME}"],
         [_made("opera")], "opera by the composer", work=True),
    _rel("singer", "Which singer recorded the album {}?", "the singer of {}", "name",
         [rf"\bby the singer {_A_NAME}", rf"\balbum by {_A_NAME}", rf"\brecorded by {_A_NAME}"],
         [_made("album")], "album by the singer", work=True),
    _rel("creator", "Who created {}?", "the creator of {}", "name",
         [rf"\b(?:directed|written|composed|recorded|created|made) by {_A_NAME}", rf"\b{_BY}"],
         [_made(r"\w+?")], "by", work=True),
    _rel("producer", "Who produced the film {}?", "the producer of {}", "name",
         [rf"\bproduced by {_A_NAME}"], [rf"^{_A_NAME} produced the films?\b.*\bSUBJ\b"],
         "produced by", work=True),
    _rel("founder", "Who founded {}?", "the founder of {}", "name",
         [rf"\b(?:founded|established) (?:in \d{{3,4}} )?by {_A_NAME}"],
         [rf"^{_A_NAME} (?:founded|established)\b.*\bSUBJ\b"], "founded by"),
    _rel("founded_year", "When was {} founded?", None, "year",
         [rf"\b(?:founded|established) in {_A_YEAR}"], keywords="founded in"),
    _rel("work_year", "When did {} come out?", None, "year",
         [rf"\bis an? {_A_YEAR} (?:[a-z]+ )?(?:film|album|novel|opera|book|song|record)\b",
          rf"\b(?:published|released|premiered|recorded)(?: in {NAME})? in {_A_YEAR}"],
         [rf"\bSUBJ \({_A_YEAR}\)"], "year", work=True),
    _rel("country", "In which country is {}?", "the country where {} is located", "name",
         [rf"\b(?:city|town|village|place|capital) (?:in|of) {_A_NAME}", rf"\blocated in {_A_NAME}"],
         [rf"^{_A_NAME}\b[^.]*\bcapital is SUBJ\b"], "is a city in"),
    _rel("capital", "What is the capital of {}?", "the capital of {}", "name",
         [rf"\bcapital is {_A_NAME}", rf"\bcapital,? {_A_NAME}"],
         [rf"^{_A_NAME}\b[^.]*\bcapital of SUBJ\b"], "capital"),
    _rel("language", "What is the official language of {}?", None, "name",
         [rf"\blanguage is {_A_NAME}", rf"\bspeak {_A_NAME}"], keywords="official language"),
    _rel("river", "What river flows through {}?", None, "name",
         [rf"\b(?:lies|is|stands|located|situated) on the {_A_NAME}", rf"\bon the (?P<a>{NAME} River)"],
         keywords="lies on the river"),
    _rel("university", "Where did {} study?", "the university attended by {}", "name",
         [rf"\bstudied at {_A_NAME}", rf"\battended {_A_NAME}", rf"\bgraduated from {_A_NAME}"],
         keywords="studied at"),
    _rel("publisher", "Who published the novel {}?", "the publisher of {}", "name",
         [rf"\bpublished (?:in \d{{3,4}} )?by {_A_NAME}"], keywords="published by", work=True),
    _rel("first_film", "What was the first film directed by {}?", "the first film directed by {}",
         "title", [], keywords="films are", extract=_first_work),
    _rel("ask", "{}", None, "name", []),
)}
"""Every relation a chain can follow; ``ask`` is the whole question, read by answer type."""

# Question forms, tried in order on the question with its first letter lower-cased and
# its final punctuation removed; ``e`` is the subject (an entity or a description).
_WORK = r"(?: the)?(?: (?:film|novel|opera|album|book))?"
_WHEN = r"(?:when|(?:in )?(?:which|what) year)"
_QUESTIONS: list[tuple[re.Pattern[str], tuple[str, ...]]] = [(re.compile(p), rels) for p, rels in (
    (r"(?:in )?(?:which|what) country was (?P<e>.+) born", ("born_place", "country")),
    (r"(?:where|(?:in )?(?:which|what) (?:city|town|place)) was (?P<e>.+) born", ("born_place",)),
    (r"(?P<e>.+?) was born in (?:which|what) (?:city|town|place)", ("born_place",)),
    (rf"{_WHEN} was (?P<e>.+) born", ("born_year",)),
    (r"what does (?P<e>.+) do for a living", ("occupation",)),
    (r"what (?:is|was) (?P<e>.+?)['’]s (?:occupation|profession|job)", ("occupation",)),
    (r"what (?:is|was) the (?:occupation|profession) of (?P<e>.+)", ("occupation",)),
    (r"who (?:is|was) the paternal grandfather of (?P<e>.+)", ("father", "father")),
    (r"who (?:is|was) the father of (?P<e>.+)", ("father",)),
    (rf"(?:who directed|which director (?:made|directed)|who (?:is|was) the director of){_WORK} (?P<e>.+)",
     ("director",)),
    (rf"(?:who wrote|which (?:novelist|author|writer) wrote|who (?:is|was) the (?:author|writer) of){_WORK} (?P<e>.+)",
     ("author",)),
    (rf"(?:who composed|who (?:is|was) the composer of){_WORK} (?P<e>.+)", ("composer",)),
    (r"(?P<e>.+?) was composed by whom", ("composer",)),
    (rf"(?:who recorded|which singer recorded|who (?:is|was) the singer of){_WORK} (?P<e>.+)", ("singer",)),
    (r"(?P<e>.+?) was an? (?:\d{4} )?album by which singer", ("singer",)),
    (rf"(?:who produced|who (?:is|was) the producer of){_WORK} (?P<e>.+)", ("producer",)),
    (r"(?:who founded|who (?:is|was) the founder of) (?P<e>.+)", ("founder",)),
    (rf"{_WHEN} was (?P<e>.+) (?:founded|established)", ("founded_year",)),
    (r"when did (?P<e>.+) come out", ("work_year",)),
    (r"(?:in )?(?:which|what) year did (?P<e>.+?) (?:first appear|come out|premiere|appear)", ("work_year",)),
    (rf"{_WHEN} was (?P<e>.+) (?:released|published)", ("work_year",)),
    (r"what country is (?P<e>.+) in", ("country",)),
    (r"(?:in )?(?:which|what) country is (?P<e>.+?)(?: in| located)?", ("country",)),
    (r"(?P<e>.+?)(?:, founded in \d+,)? is a city in (?:which|what) country", ("country",)),
    (r"what is (?P<e>.+) the capital of", ("country",)),
    (r"(?:what|which city) is the capital (?:city )?of (?P<e>.+)", ("capital",)),
    (r"what is the (?:official )?language of (?P<e>.+)", ("language",)),
    (r"what (?:official )?language is spoken in (?P<e>.+)", ("language",)),
    (r"(?:what|which) river (?:runs|flows) through (?P<e>.+)", ("river",)),
    (r"(?:which|what) university did (?P<e>.+) attend", ("university",)),
    (r"where did (?P<e>.+) study", ("university",)),
    (r"who published (?P<e>.+)", ("publisher",)),
    (r"what was the first film directed by (?P<e>.+)", ("first_film",)),
)]

# Descriptions inside a question: a noun phrase that names the answer of another chain.
_DESCRIPTIONS: list[tuple[re.Pattern[str], tuple[str, ...]]] = [(re.compile(p), rels) for p, rels in (
    (r"(?:the )?first film directed by (?P<e>.+)", ("first_film",)),
    (r"(?:the )?person who founded (?P<e>.+)", ("founder",)),
    (r"(?:the )?(?:city|town|place) where (?P<e>.+) was born", ("born_place",)),
    (r"(?:the )?country where (?P<e>.+) was born", ("born_place", "country")),
    (r"(?:the )?country (?:where|in which) (?P<e>.+) is(?: located)?", ("country",)),
    (r"(?:the )?university (?:attended by|that) (?P<e>.+?)(?: attended)?", ("university",)),
    (r"(?:the )?director of (?:the )?(?:film )?(?P<e>.+)", ("director",)),
    (r"(?:the )?(?:author|writer) of (?:the )?(?:novel )?(?P<e>.+)", ("author",)),
    (r"(?:the )?composer of (?:the )?(?:opera )?(?P<e>.+)", ("composer",)),
    (r"(?:the )?singer of (?:the )?(?:album )?(?P<e>.+)", ("singer",)),
    (r"(?:the )?creator of (?P<e>.+)", ("creator",)),
    (r"(?:the )?producer of (?:the )?(?:film )?(?P<e>.+)", ("producer",)),
    (r"(?:the )?founder of (?P<e>.+)", ("founder",)),
    (r"(?:the )?father of (?P<e>.+)", ("father",)),
    (r"(?:the )?publisher of (?:the )?(?:novel )?(?P<e>.+)", ("publisher",)),
    (r"(?:the )?capital of (?P<e>.+)", ("capital",)),
)]

_EARLIER = re.compile(r"\b(?:first|earlier|earliest|older|oldest|sooner|before)\b")
_LATER = re.compile(r"\b(?:later|latest|more recent(?:ly)?|most recent(?:ly)?|younger|youngest|"
                    r"last|newer|newest|after)\b")


@dataclass(frozen=True)
class Chain:
    entity: str
    """The named entity the chain starts from."""
    relations: tuple[str, ...]
    """Relations followed from it, in order (names in ``RELATIONS``)."""


@dataclass(frozen=True)
class Plan:
    """A parsed question: one chain, or for a comparison one chain per option."""

    question: str
    chains: list[Chain]
    options: tuple[str, ...] = ()
    """The compared options as written (comparisons only)."""
    direction: str | None = None
    """``min`` (first, earlier, older) or ``max`` (later, more recently); None if unknown."""

    @property
    def is_comparison(self) -> bool:
        return len(self.options) >= 2


def _unquote(text: str) -> str | None:
    m = re.fullmatch(r"(?:[a-z][\w-]*\s+)*(?:'(.+)'|\"(.+)\"|‘(.+)’)", text)
    return None if m is None else next(g for g in m.groups() if g is not None)


def parse_entity(text: str) -> tuple[str, tuple[str, ...]]:
    """``(entity, relations)`` of a subject phrase: a name, a quoted title, or a
    description such as ``the director of film 'X'`` (recursively)."""
    text = text.strip().strip(",").strip()
    for pattern, rels in _DESCRIPTIONS:
        m = pattern.fullmatch(text)
        if m:
            entity, inner_rels = parse_entity(m.group("e"))
            return entity, inner_rels + rels
    inner = _unquote(text)
    if inner is not None:
        return inner, ()
    # "the novel The Trubum Compass", "The mathematician Maren Tolvik" -> the name; but
    # "A station for Trener" is a title, kept whole.
    m = re.match(r"(?:[Tt]he |[Aa]n? )?((?:[a-z][\w-]*\s+)+)(?=['\"A-Z])", text)
    if m and m.group(1).split()[-1] not in _CONNECTORS:
        stripped = text[m.end():]
        return parse_entity(stripped) if _unquote(stripped) else (stripped, ())
    return text, ()


def _comparison(question: str) -> Plan | None:
    m = re.fullmatch(r"(?P<head>[^,]+?),\s*(?P<opts>.+)", question)
    if m is None or " or " not in m.group("opts"):
        return None
    opts = m.group("opts")
    quoted = [next(g for g in q if g) for q in re.findall(r"'([^']+)'|\"([^\"]+)\"|‘([^’]+)’", opts)]
    if len(quoted) == 2:
        options = tuple(quoted)
    else:
        parts = opts.split(" or ")
        if len(parts) != 2:
            return None
        options = tuple(parse_entity(p)[0] for p in parts)
    head = m.group("head").lower()
    direction = "min" if _EARLIER.search(head) else "max" if _LATER.search(head) else None
    if "born" in head:
        inner = next((r for r in ("director", "author", "composer", "singer", "founder", "father")
                      if re.search(rf"\b{r}\b", head)), None)
        rels = ((inner,) if inner else ()) + ("born_year",)
    elif re.search(r"\b(?:founded|established)\b", head):
        rels = ("founded_year",)
    elif re.search(r"came out|released|published|appeared|premiered|made|produced|written|recorded", head):
        rels = ("work_year",)
    else:  # an attribute we do not know: read each option's passage for a year
        rels = ("ask",)
    return Plan(question, [Chain(o, rels) for o in options], options, direction)


def _normalise_question(question: str) -> str:
    return " ".join(question.split()).rstrip("?.! ").strip()


def parse_question(question: str) -> Plan:
    """The chains a question asks for. Never fails: an unknown phrasing is one ``ask`` step."""
    q = _normalise_question(question)
    plan = _comparison(q)
    if plan is not None:
        return plan
    low = q[:1].lower() + q[1:]  # "Who"/"who" alike; names keep their capitals
    for pattern, rels in _QUESTIONS:
        m = pattern.fullmatch(low)
        if m:
            entity, inner = parse_entity(q[m.start("e"):m.end("e")])
            return Plan(question, [Chain(entity, inner + rels)])
    return Plan(question, [Chain(question.strip(), ("ask",))])


def render(entity: str, relations: Sequence[str]) -> str:
    """The question that follows ``relations`` from ``entity`` (``parse_question`` reads it
    back to the same chain)."""
    if not relations:
        return entity
    first = RELATIONS[relations[0]]
    subject = f"'{entity}'" if first.work else entity
    for name in relations[:-1]:
        describe = RELATIONS[name].describe
        if describe is None:  # a year is never a subject
            raise ValueError(f"relation {name!r} cannot be followed by another relation")
        subject = describe.format(subject)
    return RELATIONS[relations[-1]].ask.format(subject)


# ----------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Hop:
    """One resolved step: the answer and the sentence it was read from."""

    answer: str
    sentence: str


def _typed_spans(kind: str, text: str) -> list[str]:
    if kind == "year":
        return re.findall(YEAR, text)
    return _names(text)


def _answer_kind(question: str) -> str:
    q = question.lower()
    if re.search(r"\b(?:when|what year|which year|in what year)\b", q):
        return "year"
    return "name"


def read_relation(rel: str, subject: str, sentences: Sequence[Sentence], exclude: str = "",
                  question: str = "") -> Hop | None:
    """The answer of ``rel`` for ``subject`` in ``sentences`` (rank order), or None.

    Sentences that start with the subject are read first, then sentences that mention it;
    an answer equal to the subject or found in ``exclude`` (the question) is skipped.
    """
    relation = RELATIONS[rel]

    def ok(span: str) -> bool:
        span = span.strip()
        return (bool(span) and span.lower() != subject.lower()
                and not (exclude and _in_text(span, exclude)))

    if rel == "ask":
        question = question or subject
        return _read_by_type(_answer_kind(question), question, sentences, exclude or question)
    about = [s for s in sentences if _starts_with(s.text, subject)]
    others = [s for s in sentences if not _starts_with(s.text, subject) and _mentions(s.text, subject)]
    for s in about:
        rest = s.text[s.text.lower().find(subject.lower()) + len(subject):]
        if relation.extract is not None:
            span = relation.extract(s.text, subject)
            if span and ok(span):
                return Hop(span, s.text)
            continue
        for pattern in relation.patterns:
            for m in re.finditer(pattern, rest):
                span = re.sub(r"['’]s$", "", m.group("a").strip())
                if ok(span):
                    return Hop(span, s.text)
    subj = re.escape(subject)
    for s in others:
        for pattern in relation.reverse:
            for m in re.finditer(pattern.replace("SUBJ", subj), s.text, flags=re.IGNORECASE):
                span = re.sub(r"['’]s$", "", m.group("a").strip())
                if ok(span):
                    return Hop(span, s.text)
    return None


def _read_by_type(kind: str, question: str, sentences: Sequence[Sentence], exclude: str) -> Hop | None:
    """The first span of ``kind`` (``year``, else a name) not in ``exclude``, from the
    sentences that share the most words with the question (earlier ones first on ties)."""
    words = set(normalize_answer(question).split()) - {"what", "who", "when", "where", "which", "is",
                                                       "was", "did", "does", "of", "in"}
    ranked = sorted(enumerate(sentences),
                    key=lambda t: (-len(words & set(normalize_answer(t[1].text).split())), t[0]))
    for _, s in ranked:
        for span in _typed_spans(kind, s.text):
            if not _in_text(span, exclude):
                return Hop(span, s.text)
    return None


def resolve(chain: Chain, sentences: Sequence[Sentence], exclude: str = "", question: str = "") -> list[Hop]:
    """Follow ``chain`` through ``sentences``; the hops resolved, stopping at the first gap.
    ``exclude`` applies to the last hop (a final answer is never a span of the question)."""
    hops: list[Hop] = []
    entity = chain.entity
    for i, rel in enumerate(chain.relations):
        last = i == len(chain.relations) - 1
        hop = read_relation(rel, entity, sentences, exclude if last else "", question)
        if hop is None:
            break
        hops.append(hop)
        entity = hop.answer
    return hops


# ----------------------------------------------------------------------------- observations


@dataclass(frozen=True)
class Doc:
    title: str
    text: str


def _docs(passages: Sequence[Sequence[object]]) -> list[list[Doc]]:
    """The passages a Searcher saw (``info["passages"]``, one list per search)."""
    return [[Doc(str(getattr(p, "title", "")).strip(), str(getattr(p, "text", "")).strip()) for p in ps]
            for ps in passages]


def _require_info(info: object) -> Mapping[str, Any]:
    if not isinstance(info, Mapping) or "question" not in info:
        raise TypeError("ScriptedPolicy reads the env's structure, not prompt text: pass the "
                        f"observation's info (obs.info / infos[agent]), got {type(info).__name__}")
    return info


# ----------------------------------------------------------------------------- the policy


@dataclass
class _Progress:
    """How far the Leader has followed one chain: the entity reached, what is left."""

    entity: str
    relations: tuple[str, ...]
    stuck: bool = False


SKIPPED_REPORT = "Nothing found."
"""The report of a Searcher that found nothing, or (``skip_search``) did not search."""


class ScriptedPolicy:
    """The scripted team; ``act`` plays any mix of Leaders, Searchers and Answerers.

    Args:
        max_searches: most searches per Searcher task (it stops earlier once it has read
            an answer to every hop).
        seed: breaks ties a comparison's evidence cannot decide, deterministically per
            observation text.
        skip_search: the share of Searcher tasks reported on without searching (the report
            is ``SKIPPED_REPORT``), picked by a hash of ``seed`` and the task: a deliberately
            flawed team, for a warm start that under-searches the way untrained models do.
    """

    def __init__(self, max_searches: int = 2, seed: int = 0, skip_search: float = 0.0):
        if max_searches < 1:
            raise ValueError(f"max_searches must be >= 1, got {max_searches}")
        if not 0 <= skip_search <= 1:
            raise ValueError(f"skip_search must be in [0, 1], got {skip_search}")
        self.max_searches = max_searches
        self.seed = seed
        self.skip_search = skip_search

    def skips(self, task: str) -> bool:
        """Whether the Searcher reports on ``task`` without searching (``skip_search``)."""
        return random.Random(f"{self.seed}:skip:{task}").random() < self.skip_search

    def act(self, observations: Sequence[Observation]) -> list[str]:
        return [self.turn(obs.role, obs.info, obs.max_new_tokens, context=lambda o=obs: o.text)
                for obs in observations]

    def turn(self, role: str, info: Mapping[str, Any], max_new_tokens: int = 256,
             context: str | Callable[[], str] = "") -> str:
        """One turn of ``role`` from what it knows (``info``: the env's ``infos[agent]`` or
        ``Observation.info``); a report is shortened to fit ``max_new_tokens`` (at about three
        characters a token). ``context`` (the context text, or a function giving it) only
        seeds the tie-break of a comparison the evidence cannot decide."""
        info = _require_info(info)
        if role == P.LEADER:
            return self._leader(info)
        if role == P.SEARCHER:
            return self._searcher(info, max(40, min(600, 3 * max_new_tokens - 30)))
        if role == P.ANSWERER:
            return self._answerer(info, context)
        raise ValueError(f"unknown role {role!r}; expected one of {P.ROLES}")

    # ------------------------------------------------------------------ Leader

    def _leader(self, info: Mapping[str, Any]) -> str:
        question = info["question"].strip()
        plan = parse_question(question)
        max_searchers = info.get("max_searchers", 3)
        reports = [(n, task.strip(), (report or P.NO_REPORT).strip()) for n, task, report, *_ in info.get("reports", ())]
        waves_left = info.get("waves_left", info.get("max_waves", 3))
        chains = [_Progress(c.entity, c.relations) for c in plan.chains]
        useful: list[int] = []
        for n, task, report in reports:
            sents = sentences_of("", report)
            for c in chains:
                if c.stuck or not c.relations:
                    continue
                k = next((k for k in range(1, len(c.relations) + 1)
                          if render(c.entity, c.relations[:k]) == task), None)
                if k is None:
                    continue
                last = k == len(c.relations)
                hops = resolve(Chain(c.entity, c.relations[:k]), sents,
                               exclude=question if last and not plan.is_comparison else "",
                               question=question)
                if len(hops) == k:
                    c.entity, c.relations = hops[-1].answer, c.relations[k:]
                    useful.append(n)
                else:
                    c.stuck = True
                break
        pending = [c for c in chains if not c.stuck and c.relations]
        if pending and waves_left > 0:
            tasks = []
            for c in pending[:max_searchers]:
                # Spread the hops over the waves left; the last wave takes the rest.
                k = max(1, len(c.relations) - waves_left + 1)
                tasks.append(render(c.entity, c.relations[:k]))
            return P.write_subtasks(tasks)
        if any(c.stuck or c.relations for c in chains) or not useful:
            useful = [n for n, _, _ in reports]
        return P.write_select(sorted(set(useful)))

    # ------------------------------------------------------------------ Searcher

    def _searcher(self, info: Mapping[str, Any], max_chars: int = 600) -> str:
        task = info["task"].strip()
        plan = parse_question(task)
        searches = _docs(info.get("passages", ()))
        # A query is "already asked" only if written character for character the same
        # (spaces inside the tags kept), as the prompt-reading Searcher compared it before
        # f6ac377: a team that writes ``<search> q</search>`` (the micro recipe's spaced
        # tags) asks ``q`` again when the first search did not resolve it. The micro base's
        # SFT episodes were made that way; deduplicating on the stripped query changes them.
        asked = list(info.get("written_queries", info.get("queries", ())))
        seen, sents = set(), []
        for docs in searches:
            for d in docs:
                if (d.title, d.text) not in seen:
                    seen.add((d.title, d.text))
                    sents += sentences_of(d.title, d.text)
        exclude = "" if plan.is_comparison else task
        progress = [(c, resolve(c, sents, exclude, task)) for c in plan.chains]
        open_chains = [(c, hops) for c, hops in progress if len(hops) < len(c.relations)]
        last_turn = bool(searches) and info.get("turns_left", 2) <= 1
        if not searches and self.skips(task):
            return P.write("summary", SKIPPED_REPORT)
        if open_chains and len(searches) < self.max_searches and not last_turn:
            if not searches and len(plan.chains) == 1 and len(plan.chains[0].relations) == 1:
                return P.write("search", task)
            # The next hop of every open chain: all in one query when there are several
            # (a comparison's options), then one by one, then by entity and keywords.
            hops_next = [(hops[-1].answer if hops else c.entity, c.relations[len(hops)])
                         for c, hops in open_chains]
            asks = [render(entity, (rel,)) for entity, rel in hops_next]
            candidates = ([" ".join(asks)] if len(asks) > 1 else []) + [
                q for (entity, rel), ask in zip(hops_next, asks)
                for q in (ask, f"{entity} {RELATIONS[rel].keywords}".strip())]
            query = next((q for q in candidates if q not in asked), None)
            if query is not None:
                return P.write("search", query)
        return P.write("summary", self._summary(progress, sents, max_chars))

    def _summary(self, progress: list[tuple[Chain, list[Hop]]], sents: list[Sentence],
                 max_chars: int) -> str:
        """The answer-bearing sentences of every resolved hop; for a gap, the sentences
        that mention its entity (or the top passage's first sentence)."""
        lines: list[str] = []
        for chain, hops in progress:
            lines += [h.sentence for h in hops]
            if len(hops) < len(chain.relations):
                entity = hops[-1].answer if hops else chain.entity
                about = [s.text for s in sents if _starts_with(s.text, entity)]
                lines += about[:2] or [s.text for s in sents if _in_text(entity, s.text)][:1]
        if not lines and sents:
            lines = [sents[0].text]
        text = " ".join(dict.fromkeys(lines))
        return text[:max_chars] if text else SKIPPED_REPORT

    # ------------------------------------------------------------------ Answerer

    def _answerer(self, info: Mapping[str, Any], context: str | Callable[[], str] = "") -> str:
        question = info["question"].strip()
        plan = parse_question(question)
        sents = [s for _, item in info.get("evidence", ()) for s in sentences_of("", item)]
        if plan.is_comparison:
            return P.write("answer", self._compare(plan, sents, context))
        chain = plan.chains[0]
        hops = resolve(chain, sents, exclude=question, question=question)
        if len(hops) == len(chain.relations):
            return P.write("answer", hops[-1].answer)
        # The chain broke: a span of the final answer's type, from the latest evidence.
        kind = RELATIONS[chain.relations[-1]].kind
        if chain.relations[-1] == "ask":
            kind = _answer_kind(question)
        hop = _read_by_type(kind, question, sents[::-1], question)
        return P.write("answer", hop.answer if hop else "")

    def _compare(self, plan: Plan, sents: list[Sentence], context: str | Callable[[], str]) -> str:
        values: list[int | None] = []
        for chain in plan.chains:
            hops = resolve(chain, sents)
            value = None
            if len(hops) == len(chain.relations):
                year = re.search(YEAR, hops[-1].answer)
                value = int(year.group(0)) if year else None
            if value is None:  # a year in a sentence about the option itself
                year = next((m.group(0) for s in sents if _starts_with(s.text, chain.entity)
                             for m in [re.search(YEAR, s.text)] if m), None)
                value = int(year) if year else None
            values.append(value)
        known = [(v, i) for i, v in enumerate(values) if v is not None]
        if plan.direction is not None and len(known) == len(values) and len(set(values)) == len(values):
            pick = min(known) if plan.direction == "min" else max(known)
            return plan.options[pick[1]]
        text = context() if callable(context) else context  # decoded only for a tie
        return random.Random(f"{self.seed}:{text}").choice(plan.options)
