"""An encyclopedia reader without a language model: questions parsed into chains of
relations, passages split into sentences about their subject, and relations read off those
sentences by regular expressions. The scripted team (:mod:`agents.scripted`) plays with it.

- **Questions become chains.** ``"In which country was the director of 'X' born?"`` is
  the entity ``X`` and the relations ``director -> born_place -> country``; a comparison
  ``"Which was founded first, A or B?"`` is one chain per option (``A -> founded_year``,
  ``B -> founded_year``) and a direction (the smaller year). Unknown phrasings become a
  one-step chain that asks the question as it is (:func:`parse_question`; :func:`render`
  writes a chain back as a question).
- **Sentences are read with their subject.** A passage's leading pronoun (``He``, ``It``,
  ``His``) is replaced by its title (:func:`sentences_of`), and a relation is answered by a
  regular expression (``born in <Name>``, ``founded in <year>``, ``directed by <Name>``)
  over the sentences that start with the subject, then over those that mention it
  (:func:`read_relation`; :func:`resolve` follows a whole chain).

>>> from agents.reading import parse_question
>>> parse_question("In which country was the director of 'The Orvel Garden' born?").chains
[Chain(entity='The Orvel Garden', relations=('director', 'born_place', 'country'))]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from envs.rewards import normalize_answer

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


def in_text(span: str, text: str) -> bool:
    """Whether ``span`` occurs in ``text`` as whole words, after SQuAD normalisation."""
    a, b = normalize_answer(span), normalize_answer(re.sub(r"['’]s\b", "", text))
    return bool(a) and f" {a} " in f" {b} "


_PRONOUN = re.compile(r"^(?:He|She|It|They|This|The (?:film|novel|opera|album|story|book|city|"
                      r"country|company|university|label|studio|newspaper|orchestra))\b")
_POSSESSIVE = re.compile(r"^(?:His|Her|Its|Their)\b")
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9'\"(])")


def sentences_of(title: str, text: str) -> list[str]:
    """Split a passage (or a report, with no title) into sentences about their subject: a
    leading pronoun is replaced by the title."""
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
        out.append(s)
    return out


_LONGER_NAME = re.compile(r"\s+(?:(?:of|and|for|over)\s+)?[A-Z]")


def starts_with(sentence: str, subject: str) -> bool:
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


def _made(noun: str) -> str:
    return rf"^{_A_NAME}'s (?:only )?{noun}s? (?:include|are|is)\b.*\bSUBJ \("


_BY = rf"by (?:the (?:composer|singer|author|novelist|director|writer) )?{_A_NAME}"
RELATIONS: dict[str, Relation] = {r.name: r for r in (
    Relation("born_place", "In which city was {} born?", "the city where {} was born", "name",
             (rf"\bborn in {_A_NAME}", rf"\bborn (?:in |on )?[^.;()]*?\b\d{{3,4}},? in {_A_NAME}",
              rf"\bnative of {_A_NAME}"), keywords="born in"),
    Relation("born_year", "When was {} born?", None, "year", (rf"\bborn\b[^.;]*?{_A_YEAR}",),
             keywords="born"),
    Relation("occupation", "What is {}'s occupation?", None, "phrase",
             (r"\bis an? (?P<a>[a-z]+(?: [a-z]+){0,2}?)(?= born\b| from\b| who\b| and\b|[.,;])",),
             keywords="occupation"),
    Relation("father", "Who is the father of {}?", "the father of {}", "name",
             (rf"\b(?:son|daughter|child) of {_A_NAME}",), keywords="son of"),
    Relation("director", "Who directed the film {}?", "the director of film {}", "name",
             (rf"\bdirected by {_A_NAME}",), (_made("film"),), "film directed by", work=True),
    Relation("author", "Who wrote the novel {}?", "the author of {}", "name",
             (rf"\b(?:novel|book) by {_A_NAME}", rf"\bwritten by {_A_NAME}"), (_made("novel"),),
             "novel by", work=True),
    Relation("composer", "Who composed the opera {}?", "the composer of {}", "name",
             (rf"\bby the composer {_A_NAME}", rf"\bcomposed by {_A_NAME}",
              rf"\bopera by {_A_NAME}"), (_made("opera"),), "opera by the composer", work=True),
    Relation("singer", "Which singer recorded the album {}?", "the singer of {}", "name",
             (rf"\bby the singer {_A_NAME}", rf"\balbum by {_A_NAME}", rf"\brecorded by {_A_NAME}"),
             (_made("album"),), "album by the singer", work=True),
    Relation("creator", "Who created {}?", "the creator of {}", "name",
             (rf"\b(?:directed|written|composed|recorded|created|made) by {_A_NAME}", rf"\b{_BY}"),
             (_made(r"\w+?"),), "by", work=True),
    Relation("producer", "Who produced the film {}?", "the producer of {}", "name",
             (rf"\bproduced by {_A_NAME}",), (rf"^{_A_NAME} produced the films?\b.*\bSUBJ\b",),
             "produced by", work=True),
    Relation("founder", "Who founded {}?", "the founder of {}", "name",
             (rf"\b(?:founded|established) (?:in \d{{3,4}} )?by {_A_NAME}",),
             (rf"^{_A_NAME} (?:founded|established)\b.*\bSUBJ\b",), "founded by"),
    Relation("founded_year", "When was {} founded?", None, "year",
             (rf"\b(?:founded|established) in {_A_YEAR}",), keywords="founded in"),
    Relation("work_year", "When did {} come out?", None, "year",
             (rf"\bis an? {_A_YEAR} (?:[a-z]+ )?(?:film|album|novel|opera|book|song|record)\b",
              rf"\b(?:published|released|premiered|recorded)(?: in {NAME})? in {_A_YEAR}"),
             (rf"\bSUBJ \({_A_YEAR}\)",), "year", work=True),
    Relation("country", "In which country is {}?", "the country where {} is located", "name",
             (rf"\b(?:city|town|village|place|capital) (?:in|of) {_A_NAME}",
              rf"\blocated in {_A_NAME}"), (rf"^{_A_NAME}\b[^.]*\bcapital is SUBJ\b",),
             "is a city in"),
    Relation("capital", "What is the capital of {}?", "the capital of {}", "name",
             (rf"\bcapital is {_A_NAME}", rf"\bcapital,? {_A_NAME}"),
             (rf"^{_A_NAME}\b[^.]*\bcapital of SUBJ\b",), "capital"),
    Relation("language", "What is the official language of {}?", None, "name",
             (rf"\blanguage is {_A_NAME}", rf"\bspeak {_A_NAME}"), keywords="official language"),
    Relation("river", "What river flows through {}?", None, "name",
             (rf"\b(?:lies|is|stands|located|situated) on the {_A_NAME}",
              rf"\bon the (?P<a>{NAME} River)"), keywords="lies on the river"),
    Relation("university", "Where did {} study?", "the university attended by {}", "name",
             (rf"\bstudied at {_A_NAME}", rf"\battended {_A_NAME}", rf"\bgraduated from {_A_NAME}"),
             keywords="studied at"),
    Relation("publisher", "Who published the novel {}?", "the publisher of {}", "name",
             (rf"\bpublished (?:in \d{{3,4}} )?by {_A_NAME}",), keywords="published by", work=True),
    Relation("first_film", "What was the first film directed by {}?",
             "the first film directed by {}", "title", (), keywords="films are",
             extract=_first_work),
    Relation("ask", "{}", None, "name", ()),
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


def parse_question(question: str) -> Plan:
    """The chains a question asks for. Never fails: an unknown phrasing is one ``ask`` step."""
    q = " ".join(question.split()).rstrip("?.! ").strip()
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


@dataclass(frozen=True)
class Hop:
    """One resolved step: the answer and the sentence it was read from."""

    answer: str
    sentence: str


def answer_kind(question: str) -> str:
    return "year" if re.search(r"\b(?:when|what year|which year)\b", question.lower()) else "name"


def read_relation(rel: str, subject: str, sentences: Sequence[str], exclude: str = "",
                  question: str = "") -> Hop | None:
    """The answer of ``rel`` for ``subject`` in ``sentences`` (rank order), or None; an
    answer equal to the subject or found in ``exclude`` (the question) is skipped."""
    relation = RELATIONS[rel]

    def ok(span: str) -> bool:
        span = span.strip()
        return (bool(span) and span.lower() != subject.lower()
                and not (exclude and in_text(span, exclude)))

    if rel == "ask":
        question = question or subject
        return read_by_type(answer_kind(question), question, sentences, exclude or question)
    about = [s for s in sentences if starts_with(s, subject)]
    if relation.extract is not None:
        spans = ((relation.extract(s, subject), s) for s in about)
        return next((Hop(span, s) for span, s in spans if span and ok(span)), None)
    tries = [(s, s[s.lower().find(subject.lower()) + len(subject):], pattern, 0)
             for s in about for pattern in relation.patterns]
    tries += [(s, s, pattern.replace("SUBJ", re.escape(subject)), re.IGNORECASE)
              for s in sentences if not starts_with(s, subject) and _mentions(s, subject)
              for pattern in relation.reverse]
    for s, text, pattern, flags in tries:
        for m in re.finditer(pattern, text, flags=flags):
            span = re.sub(r"['’]s$", "", m.group("a").strip())
            if ok(span):
                return Hop(span, s)
    return None


def read_by_type(kind: str, question: str, sentences: Sequence[str], exclude: str) -> Hop | None:
    """The first span of ``kind`` (``year``, else a name) not in ``exclude``, from the
    sentences that share the most words with the question (earlier ones first on ties)."""
    words = set(normalize_answer(question).split()) - {"what", "who", "when", "where", "which", "is",
                                                       "was", "did", "does", "of", "in"}
    ranked = sorted(enumerate(sentences),
                    key=lambda t: (-len(words & set(normalize_answer(t[1]).split())), t[0]))
    for _, s in ranked:
        for span in re.findall(YEAR, s) if kind == "year" else _names(s):
            if not in_text(span, exclude):
                return Hop(span, s)
    return None


def resolve(chain: Chain, sentences: Sequence[str], exclude: str = "",
            question: str = "") -> list[Hop]:
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
