"""The turn protocol's words: what each role is told, how its turns are parsed and written,
and every template the env fills. Text only: ``envs.chat`` puts these words into token ids
(the chat frame) and finds where a generated turn ends.

What each tag does is the env's doc page (``envs.search_team``, "Flow"). Parsing sees only
what the agent generated in this turn, never its prompt (PITFALLS 6): ``<think>`` blocks are
ignored, a ``<select>`` may be empty, a Searcher's turn is read up to its first action tag.
"""

from __future__ import annotations

import re
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


# Every string the env writes into a context (or its render log) is one of these templates,
# filled by name. Policies never parse them back: the structure they need is in
# ``infos[agent]`` (see ``envs.team.TurnMachine.view``).

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
"""The env's prompt sets by name (``paper``, the default, is what every recorded number used)."""
DEFAULT_PROMPTS = "paper"


def prompt_set(name: str) -> PromptSet:
    """The prompt set called ``name``; ValueError (one line listing the sets) otherwise."""
    if not isinstance(name, str) or name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; the sets are {', '.join(PROMPT_SETS)}")
    return PROMPT_SETS[name]


def role_of(agent: str) -> str:
    """The role of a PettingZoo agent name: the part before the last ``_``."""
    return agent.rsplit("_", 1)[0]


_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_TAG_RES = {tag: re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL) for tag in TAGS}


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
    _, tag, content = min(found)
    content = content.strip()
    if tag == "search":
        if not content:
            return _invalid("the <search> query is empty")
        return ParsedTurn("search", text=content)
    return ParsedTurn("summary", text=content)


def parse_answerer(text: str) -> ParsedTurn:
    """An Answerer turn: its first ``<answer>``."""
    match = _TAG_RES["answer"].search(strip_think(text))
    if match is None:
        return _invalid("no <answer> tag")
    return ParsedTurn("answer", text=match.group(1).strip())


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


def short_repr(value: Any, width: int = 80) -> str:
    """``repr(value)`` cut to ``width`` characters (ending in ``...``), for error messages."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def clean_text(text: str) -> str:
    """``text`` with what UTF-8 cannot encode (lone surrogates, e.g. a JSON ``"\\ud83d"``)
    replaced by U+FFFD; valid surrogate pairs are joined. Valid text is returned as is."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
