"""The turn protocol: what each role is told, how its turns are parsed, and how turns are
framed as chat messages in token ids.

Tags (``<think>...</think>`` is free text for every role and is ignored by the parser):

============  ====================================================  ===========================
role          a valid turn                                          effect
============  ====================================================  ===========================
leader        one ``<subtask>...</subtask>`` per Searcher           dispatches a wave
leader        ``<select>1, 3</select>`` (report numbers, may be     hands those reports to the
              empty)                                                Answerers; the Leader is done
searcher      ``<search>query</search>``                            the env answers with
                                                                    ``<information>Doc 1(Title:
                                                                    T) text ...</information>``
searcher      ``<summary>report</summary>``                         ends the Searcher; the report
                                                                    goes back to the Leader
answerer      ``<answer>text</answer>``                             the candidate answer
============  ====================================================  ===========================

Parsing sees only what the agent generated in this turn, never its prompt (PITFALLS 6).
A Searcher's turn is read up to its first action tag; anything else is invalid.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

LEADER, SEARCHER, ANSWERER = "leader", "searcher", "answerer"
ROLES = (LEADER, SEARCHER, ANSWERER)

STOP_STRINGS: dict[str, tuple[str, ...]] = {
    LEADER: ("</select>",),
    SEARCHER: ("</search>", "</summary>"),
    ANSWERER: ("</answer>",),
}
"""Closing tags that end a role's turn (EOS ends any turn). A Leader's wave ends at EOS,
since one turn carries several ``<subtask>`` tags."""

TAGS = ("think", "subtask", "select", "search", "summary", "answer")

SYSTEM_PROMPTS: dict[str, str] = {
    LEADER: (
        "You are the Leader of a research team that answers questions using a search "
        "engine. You cannot search yourself. To dispatch a wave of Searchers, write one "
        "<subtask>...</subtask> per Searcher (at most {max_searchers}); each sub-task must "
        "stand on its own. Their numbered reports come back to you. You may dispatch at "
        "most {max_waves} waves. When you have enough evidence, write "
        "<select>numbers</select> with the numbers of the reports the Answerer should "
        "read, e.g. <select>1, 3</select>. You may think first inside <think>...</think>."
    ),
    SEARCHER: (
        "You are a Searcher. Find the information your task asks for. To search, write "
        "<search>query</search>; the results come back inside <information>...</information>. "
        "You may search up to {max_searches} times. When you are done, write "
        "<summary>report</summary> with a short report of what you found, including the "
        "exact answer. You may think first inside <think>...</think>."
    ),
    ANSWERER: (
        "You are the Answerer. Read the question and the evidence, then write the answer "
        "as a short phrase inside <answer>...</answer>, with no explanation. You may think "
        "first inside <think>...</think>."
    ),
}

FORMAT_REMINDERS: dict[str, str] = {
    LEADER: "Write <subtask>...</subtask> tags to dispatch Searchers, or <select>numbers</select>.",
    SEARCHER: "Write <search>query</search> or <summary>report</summary>.",
    ANSWERER: "Write the answer as <answer>short answer</answer>.",
}


# --------------------------------------------------------------------------- the env's words
# Every string the env writes into a context (or its render log) is one of these templates,
# filled by name. Policies never parse them back: the structure they need is in
# ``infos[agent]`` (see ``envs.team.TeamEpisode.view``).

LEADER_USER = "Question: {question}"
"""The Leader's first user message."""
SEARCHER_USER = "Task: {task}"
"""A Searcher's first user message: its sub-task (the question in the cascade)."""
ANSWERER_USER = "Question: {question}\n\nEvidence:\n{evidence}"
"""Every Answerer's user message: the question and the selected reports."""
EVIDENCE_ITEM = "[{number}] {report}"
NO_EVIDENCE = "(none)"
NO_REPORT = "(no report)"
"""Shown in place of an empty report (a Searcher that ended without a valid summary)."""
REPORT_ITEM = "[{number}] Sub-task: {task}\nReport: {report}"
"""One report as the Leader sees it after a wave."""
WAVE_RESULTS = "{reports}\n\n{ask}"
WAVES_LEFT = ("Waves left: {waves_left}. Dispatch another wave with <subtask> tags, or choose "
              "the reports for the Answerer with <select>numbers</select>.")
NO_WAVES_LEFT = "No waves left: choose the reports for the Answerer with <select>numbers</select>."
PASSAGE = "Doc {number}(Title: {title}) {text}"
INFORMATION = "<information>{docs}</information>"
"""Search-R1's observation of a search's passages."""
LAST_TURN_NOTE = "\nYou have one turn left: write your <summary> now."
"""Appended to the passages when the Searcher has one turn left."""
SEARCH_FAILED = "<information>The search failed ({error}); no passages.</information>"
"""What a Searcher sees when its retriever failed even after retries."""
INVALID_TURN = "Invalid turn: {reason}. {reminder}"
NO_WAVES_REASON = "no waves left; write <select>numbers</select>"
LOG_QUESTION = "Question: {question}"
LOG_TURN = "[{agent}] {text}"
LOG_INVALID = "  (invalid: {reason})"
LOG_OUTCOME = "Candidates: {candidates}  final: {final!r}  gold: {gold}  R_EM={team_em:.0f}"
LOG_REWARDS = "Rewards: {rewards}"
LOG_REWARD_ITEM = "{agent}={reward:.3f}"
LOG_ROLE_OUTCOME = "Candidates: {candidates}  final: {final!r}  gold: {gold}  reward: {reward:.3f}"
"""Lines of ``render()``'s log (for people, never in a context)."""


# --------------------------------------------------------------------------- prompt sets
# What each role is told (system prompt, worked exchanges) and reminded of (after an invalid
# turn) is a named, swappable set; the tags, the parser and every other template stay the same.

SHORT_SYSTEM_PROMPTS: dict[str, str] = {
    LEADER: ("Send up to {max_searchers} searches as <subtask>...</subtask>, then pick reports "
             "with <select>...</select>. Example: <subtask>Who directed Titanic?</subtask>"),
    SEARCHER: ("Search with <search>...</search>, then report with <summary>...</summary>. "
               "Example: <search>capital of France</search>"),
    ANSWERER: "Answer with <answer>...</answer>. Example: <answer>Paris</answer>",
}
"""One line per role, each with one concrete example of its tag, for small models (a
135M model lost in the paper's paragraph answered in prose, docs/benchmarks.md)."""

SHORT_FORMAT_REMINDERS: dict[str, str] = {
    LEADER: "Example: <subtask>Who directed Titanic?</subtask> or <select>1</select>",
    SEARCHER: "Example: <search>capital of France</search> or <summary>Paris</summary>",
    ANSWERER: "Example: <answer>Paris</answer>",
}


@dataclass(frozen=True)
class PromptSet:
    """The words that tell each role its protocol: ``system`` (templates filled with the
    team's budgets ``{max_searchers}``, ``{max_waves}``, ``{max_searches}``), ``reminders``
    (appended to the reason after an invalid turn) and ``demos``."""

    name: str
    system: dict[str, str]
    reminders: dict[str, str]
    demos: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """Per role, worked exchanges ``(user, assistant)`` the env writes between the system
    prompt and the real first user message (env text: loss mask 0, never the agent's)."""


ONESHOT_DEMOS: dict[str, tuple[tuple[str, str], ...]] = {
    LEADER: ((LEADER_USER.format(question="Who directed Titanic?"),
              "<subtask>Who directed Titanic?</subtask>"),),
    SEARCHER: ((SEARCHER_USER.format(task="What is the capital of France?"),
                "<search>capital of France</search>"),),
    ANSWERER: ((ANSWERER_USER.format(question="What is the capital of France?",
                                     evidence=EVIDENCE_ITEM.format(number=1, report="Paris is the capital of France.")),
                "<answer>Paris</answer>"),),
}
"""One worked exchange per role (the ``short`` set's examples, played as a turn): a 135M
model copies a demonstrated turn where it ignores a described one (docs/benchmarks.md)."""

PROMPT_SETS: dict[str, PromptSet] = {
    "paper": PromptSet("paper", SYSTEM_PROMPTS, FORMAT_REMINDERS),
    "short": PromptSet("short", SHORT_SYSTEM_PROMPTS, SHORT_FORMAT_REMINDERS),
    "oneshot": PromptSet("oneshot", SHORT_SYSTEM_PROMPTS, SHORT_FORMAT_REMINDERS, ONESHOT_DEMOS),
}
"""The env's prompt sets by name: ``paper`` (the default; every recorded number used it),
``short`` (one line per role with an example) and ``oneshot`` (``short`` plus one worked
exchange per role before the real question)."""
DEFAULT_PROMPTS = "paper"


def prompt_set(name: str) -> PromptSet:
    """The prompt set called ``name``; ValueError (one line listing the sets) otherwise."""
    if not isinstance(name, str) or name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; the sets are {', '.join(PROMPT_SETS)}")
    return PROMPT_SETS[name]


def role_of(agent: str) -> str:
    """The role of a PettingZoo agent name: the part before the last ``_``."""
    return agent.rsplit("_", 1)[0]


# --------------------------------------------------------------------------- parsing

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)


def _tag_re(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL)


_TAG_RES = {tag: _tag_re(tag) for tag in TAGS}


def strip_think(text: str) -> str:
    """The turn without its ``<think>`` blocks (an unclosed one runs to the end)."""
    return _THINK.sub(" ", text)


def count_tags(text: str) -> dict[str, int]:
    """Complete ``<tag>...</tag>`` pairs per protocol tag (format-health metrics)."""
    return {tag: len(_TAG_RES[tag].findall(text)) for tag in TAGS}


@dataclass(frozen=True)
class ParsedTurn:
    """What a turn asks for. ``kind`` is one of ``dispatch``, ``select``, ``search``,
    ``summary``, ``answer`` or ``invalid``; ``reason`` says why a turn is invalid."""

    kind: str
    subtasks: tuple[str, ...] = ()
    selection: tuple[int, ...] = ()
    text: str = ""
    reason: str = ""
    notes: tuple[str, ...] = field(default=())
    written: str = field(default="", compare=False)
    """A search's query exactly as written between its tags (``text`` is it stripped)."""


def _invalid(reason: str) -> ParsedTurn:
    return ParsedTurn("invalid", reason=reason)


_NUMBER_LIST = re.compile(r"^[\s,;]*(\d+([\s,;]+\d+)*)?[\s,;]*$")


def parse_leader(text: str, num_reports: int, max_searchers: int) -> ParsedTurn:
    """A Leader turn: ``dispatch`` (first ``max_searchers`` sub-tasks) or ``select``."""
    body = strip_think(text)
    subtasks = [s.strip() for s in _TAG_RES["subtask"].findall(body)]
    selects = _TAG_RES["select"].findall(body)
    if subtasks and selects:
        return _invalid("a turn either dispatches sub-tasks or selects reports, not both")
    if selects:
        raw = selects[0].strip()
        if raw.lower() in ("", "none"):
            return ParsedTurn("select")
        if not _NUMBER_LIST.match(raw):
            return _invalid(f"<select> takes report numbers like 1, 3; got {raw[:40]!r}")
        numbers = list(dict.fromkeys(int(n) for n in re.findall(r"\d+", raw)))
        bad = [n for n in numbers if not 1 <= n <= num_reports]
        if bad:
            return _invalid(f"no report numbered {bad[0]}; there are {num_reports} reports")
        return ParsedTurn("select", selection=tuple(numbers))
    if subtasks:
        if any(not s for s in subtasks):
            return _invalid("a <subtask> is empty")
        notes = ()
        if len(subtasks) > max_searchers:
            notes = (f"only the first {max_searchers} sub-tasks were dispatched",)
        return ParsedTurn("dispatch", subtasks=tuple(subtasks[:max_searchers]), notes=notes)
    return _invalid("no <subtask> or <select> tag")


def parse_searcher(text: str) -> ParsedTurn:
    """A Searcher turn, read up to its first complete ``<search>`` or ``<summary>``."""
    body = strip_think(text)
    found = [(m.start(), tag, m.group(1)) for tag in ("search", "summary")
             if (m := _TAG_RES[tag].search(body))]
    if not found:
        return _invalid("no <search> or <summary> tag")
    _, tag, written = min(found)
    content = written.strip()
    if tag == "search":
        if not content:
            return _invalid("the <search> query is empty")
        return ParsedTurn("search", text=content, written=written)
    return ParsedTurn("summary", text=content)


def parse_answerer(text: str) -> ParsedTurn:
    """An Answerer turn: its first ``<answer>``."""
    match = _TAG_RES["answer"].search(strip_think(text))
    if match is None:
        return _invalid("no <answer> tag")
    return ParsedTurn("answer", text=match.group(1).strip())


# --------------------------------------------------------------------------- writing

def write(tag: str, text: object) -> str:
    """An action with one tag: ``write("search", "X director") == "<search>X director</search>"``
    (scripted policies and the Leader view write their turns with these)."""
    if tag not in TAGS:
        raise ValueError(f"tag {tag!r} is not one of {TAGS}")
    return f"<{tag}>{text}</{tag}>"


def write_subtasks(tasks: Sequence[str]) -> str:
    """A Leader's wave: one ``<subtask>`` per Searcher."""
    return "".join(write("subtask", t) for t in tasks)


def write_select(numbers: Sequence[int]) -> str:
    """A Leader's choice of reports for the Answerers: ``<select>1, 3</select>``."""
    return write("select", ", ".join(str(n) for n in numbers))


def render_rewards(rewards: dict[str, float]) -> str:
    """The log's last line: each agent's reward."""
    return LOG_REWARDS.format(rewards=", ".join(LOG_REWARD_ITEM.format(agent=a, reward=r)
                                                for a, r in rewards.items()))


# --------------------------------------------------------------------------- rendering


def render_passages(passages: Sequence[Any], turns_left: int | None = None) -> str:
    """Search-R1's observation: ``<information>Doc 1(Title: T) text ...</information>``,
    with :data:`LAST_TURN_NOTE` when ``turns_left == 1``."""
    docs = "\n".join(PASSAGE.format(number=i, title=p.title, text=p.text) for i, p in enumerate(passages, 1))
    return INFORMATION.format(docs=docs) + (LAST_TURN_NOTE if turns_left == 1 else "")


def render_reports(reports: Sequence[tuple[int, str, str]]) -> str:
    """Reports as the Leader sees them: ``[n] Sub-task: ...`` then ``Report: ...``."""
    return "\n".join(REPORT_ITEM.format(number=n, task=task, report=report or NO_REPORT)
                     for n, task, report in reports)


def render_wave_results(reports: Sequence[tuple[int, str, str]], waves_left: int) -> str:
    """What the Leader reads after a wave: the wave's reports, then how many waves are left."""
    ask = WAVES_LEFT.format(waves_left=waves_left) if waves_left > 0 else NO_WAVES_LEFT
    return WAVE_RESULTS.format(reports=render_reports(reports), ask=ask)


def render_evidence(question: str, reports: Sequence[tuple[int, str]]) -> str:
    """The Answerers' user message: the question and the ``(number, report)`` selected."""
    items = "\n".join(EVIDENCE_ITEM.format(number=n, report=r or NO_REPORT) for n, r in reports)
    return ANSWERER_USER.format(question=question, evidence=items or NO_EVIDENCE)


def render_corrective(role: str, reason: str, prompts: str = DEFAULT_PROMPTS) -> str:
    """The observation after an invalid turn: why, and the role's format reminder in the
    prompt set ``prompts``."""
    return INVALID_TURN.format(reason=reason, reminder=prompt_set(prompts).reminders[role])


def render_search_failure(error: BaseException | str) -> str:
    """A short observation for a search whose retriever failed (the error's first line)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    name = type(error).__name__ if isinstance(error, BaseException) else "error"
    return SEARCH_FAILED.format(error=f"{name}: {text[:120]}" if text else name)


def clean_text(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates, e.g. a JSON ``"\\ud83d"``)
    replaced by U+FFFD; valid surrogate pairs are joined. Valid text is returned as is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


# --------------------------------------------------------------------------- chat framing


def _special_id(tokenizer: Any, token: str) -> int | None:
    """The id of ``token`` when the vocabulary has it (not the unknown token), else None.
    Looked up directly: building ``get_vocab()`` costs ~0.1 s per env on a 49k vocabulary."""
    try:
        ids = tokenizer.convert_tokens_to_ids([token])
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    tid = ids[0] if ids else None
    if tid is None or tid == getattr(tokenizer, "unk_token_id", None):
        return None
    return int(tid)


class ChatFormat:
    """Frames turns as chat messages, in token ids, without re-tokenising anything.

    ChatML (``<|im_start|>role\\n...<|im_end|>``) when the tokenizer knows those tokens
    (SmolLM2, Qwen, the micro preset's tokenizer), a plain ``User:``/``Assistant:`` layout
    otherwise. Env-written pieces start and end on special tokens or newlines, so
    encoding them separately never changes how the agent's own tokens are split.

    **Quoted text is never markup.** Everything inside a message (questions, sub-tasks,
    reports, passages, corrective messages, and text actions) goes through :meth:`encode`,
    which turns off special-token parsing: a spelled ``<|im_end|>\\n<|im_start|>system``
    stays ordinary tokens and cannot forge a chat turn. Only the frame's own markers are
    the real special ids. Added tokens that are not special (the micro tokenizer's
    ``<search>``...) still tokenise as themselves.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        start, end = _special_id(tokenizer, "<|im_start|>"), _special_id(tokenizer, "<|im_end|>")
        self.chatml = start is not None and end is not None
        self.end_id = end if self.chatml else tokenizer.eos_token_id
        self._cache: dict[str, list[int]] = {}
        self._special_ids = frozenset(int(i) for i in (getattr(tokenizer, "all_special_ids", None) or ()))
        self._special_strings = tuple(sorted(
            (str(t) for t in (getattr(tokenizer, "all_special_tokens", None) or ()) if str(t)),
            key=len, reverse=True))
        self._split_kwarg = True  # cleared if the tokenizer's encode does not take it

    def encode(self, text: str) -> list[int]:
        """Token ids of quoted (untrusted) text: no special tokens, never raises on a ``str``
        (what UTF-8 cannot encode becomes U+FFFD)."""
        text = clean_text(text)
        ids = self._encode_plain(text)
        if self._special_ids and not self._special_ids.isdisjoint(ids):
            ids = self._encode_escaped(text)  # a tokenizer that ignored split_special_tokens
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        if self._split_kwarg:
            try:
                return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
            except TypeError:
                self._split_kwarg = False
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _encode_escaped(self, text: str) -> list[int]:
        """Encode around every spelled special token, breaking each after its first
        character, so no piece can match it; used only when the tokenizer parses specials
        whatever it is told."""
        pieces, i, start = [], 0, 0
        while i < len(text):
            hit = next((s for s in self._special_strings if text.startswith(s, i)), None)
            if hit is None:
                i += 1
                continue
            pieces += [text[start:i], hit[:1], hit[1:]]
            i = start = i + len(hit)
        pieces.append(text[start:])
        ids: list[int] = []
        for piece in pieces:
            if piece:
                ids += list(self.tokenizer.encode(piece, add_special_tokens=False))
        return [t for t in ids if t not in self._special_ids]

    def _markup(self, text: str) -> list[int]:
        """Token ids of the env's own frame (special markers parsed), cached."""
        if text not in self._cache:
            self._cache[text] = list(self.tokenizer.encode(text, add_special_tokens=False))
        return self._cache[text]

    def prompt(self, system: str, user: str, demos: Sequence[tuple[str, str]] = ()) -> list[int]:
        """System and first user message, ending in the assistant's header; ``demos``
        (``(user, assistant)`` exchanges, env text) come between them, each reply closed as
        an agent's turn is."""
        if demos:
            (first, reply), rest = demos[0], demos[1:]
            ids = self.prompt(system, first) + self.encode(reply)
            ids += self.closing(ids)
            for demo_user, demo_reply in rest:
                ids += self.observation(demo_user) + self.encode(demo_reply)
                ids += self.closing(ids)
            return ids + self.observation(user)
        if self.chatml:
            return (self._markup(f"<|im_start|>system\n{system}<|im_end|>\n") + self._markup("<|im_start|>")
                    + self.encode(f"user\n{user}") + self._markup("<|im_end|>\n<|im_start|>assistant\n"))
        return self._markup(f"System: {system}\n\n") + self.encode(f"User: {plain_quote(user)}\n\nAssistant:")

    def closing(self, turn: Sequence[int]) -> list[int]:
        """What closes an assistant turn that the agent itself did not close."""
        if turn and turn[-1] == self.end_id:
            return []
        if self.chatml:
            return [self.end_id]
        return [] if self.end_id is None else [self.end_id]

    def observation(self, text: str) -> list[int]:
        """A user message written by the env, ending in the assistant's header again."""
        if self.chatml:
            return (self._markup("\n<|im_start|>") + self.encode(f"user\n{text}")
                    + self._markup("<|im_end|>\n<|im_start|>assistant\n"))
        return self.encode(f"\n\nUser: {plain_quote(text)}\n\nAssistant:")


_PLAIN_HEADER = re.compile(r"(?m)^([ \t]*)(System|User|Assistant):")


def plain_quote(text: str) -> str:
    """Quoted text for the plain ``User:``/``Assistant:`` layout (tokenizers without ChatML):
    a line that starts with a header word gets a fullwidth colon (``User\uff1a``), so a
    report or passage cannot open a turn there either."""
    return _PLAIN_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}\uff1a", text)


ZERO_WIDTH_JOINER = "\u200d"
SPELLED_MARKERS: tuple[str, ...] = (
    "<|", "<\uff5c", "<s>", "</s>", "<eos>", "<bos>", "<pad>", "<unk>", "<start_of_turn>",
    "<end_of_turn>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "[SEP]", "[CLS]", "[MASK]",
    "[PAD]", "[UNK]")
"""Spelled special markers of the common chat templates that :func:`quote_message` breaks:
``<|`` covers every ``<|...|>`` (ChatML, Llama 3, Phi), ``<\uff5c`` DeepSeek's fullwidth bars."""


def quote_message(text: str, special_tokens: Sequence[str] = ()) -> str:
    r"""``text`` made safe as the content of a chat request's message, in any chat layout.

    A chat server renders contents with its own template and tokenises the result with
    special-token parsing on, so a spelled marker in a content would become a real turn
    there. Each occurrence of :data:`SPELLED_MARKERS` and of ``special_tokens`` (the
    server's special strings, when known) gets a zero-width joiner after its first
    character (``<|im_start|>`` -> ``<\u200d|im_start|>``), which no marker contains, so
    none can match; a line that starts with a plain-layout header (``User:``) is quoted as
    :func:`plain_quote` does. Text with neither is returned as is; quoting twice changes
    nothing more. What UTF-8 cannot encode becomes U+FFFD (:func:`clean_text`).

    >>> quote_message("<|im_end|>\nUser: hi") == "<\u200d|im_end|>\nUser\uff1a hi"
    True
    """
    text = clean_text(text)
    pattern = _marker_pattern(tuple(special_tokens))
    while pattern.search(text):  # a marker that began inside an earlier one is caught next pass
        text = pattern.sub(lambda m: m.group(0)[0] + ZERO_WIDTH_JOINER + m.group(0)[1:], text)
    return plain_quote(text)


@functools.lru_cache(maxsize=32)
def _marker_pattern(special_tokens: tuple[str, ...]) -> re.Pattern[str]:
    markers = {m for m in SPELLED_MARKERS + special_tokens if len(m) > 1}
    return re.compile("|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True)))


_CHAT_FORMATS: weakref.WeakKeyDictionary[Any, ChatFormat] = weakref.WeakKeyDictionary()


def chat_format(tokenizer: Any) -> ChatFormat:
    """The :class:`ChatFormat` of ``tokenizer``, one per tokenizer object in a process: the
    env copies of a rollout share its cache of encoded frames and system prompts (making an
    env no longer encodes them again). A tokenizer that cannot be weakly referenced gets a
    new one each time."""
    try:
        chat = _CHAT_FORMATS.get(tokenizer)
        if chat is None:
            chat = _CHAT_FORMATS[tokenizer] = ChatFormat(tokenizer)
        return chat
    except TypeError:  # not weakly referenceable (or unhashable)
        return ChatFormat(tokenizer)


class TurnEnder:
    """Decides where a turn ends: at EOS, or at the token that completes a stop string.

    Both step modes use :meth:`ends_at` on the same positions, so a token stream ends its
    turns at the same tokens whether it arrives whole or one token at a time.
    """

    window = 16  # tokens decoded to look for a stop string that the newest token completed

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int]):
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(i for i in eos_ids if i is not None)

    def ends_at(self, ids: Sequence[int], i: int, stops: Sequence[str]) -> bool:
        """Whether the turn ``ids`` ends with token ``i`` (given it did not end before)."""
        if ids[i] in self.eos_ids:
            return True
        tail = self.tokenizer.decode(list(ids[max(0, i - self.window + 1): i + 1]))
        return any(stop in tail for stop in stops)

    def first_end(self, ids: Sequence[int], stops: Sequence[str]) -> int | None:
        """Index of the token that ends the turn, or None when the turn never ends."""
        ids = list(ids)
        eos = next((i for i, t in enumerate(ids) if t in self.eos_ids), len(ids))
        head = ids[:eos]

        def stopped(n: int) -> bool:  # whether the first n tokens already hold a stop string
            text = self.tokenizer.decode(head[:n])
            return any(stop in text for stop in stops)

        if not stopped(len(head)):
            return eos if eos < len(ids) else None
        lo, hi = 1, len(head)  # the shortest stopped prefix, by bisection: O(log n) decodes
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if stopped(mid) else (mid + 1, hi)
        # confirm with the token-by-token rule, so both step modes agree exactly
        for i in range(lo - 1, len(head)):
            if self.ends_at(head, i, stops):
                return i
        return eos if eos < len(ids) else None
