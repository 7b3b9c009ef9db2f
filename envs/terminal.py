"""What reaches a terminal: text made safe, the turn prompt, and the turn screen.

``python -m envs step`` (every role by hand) and ``agents.simple.HumanPolicy`` (the
``human`` policy of ``python -m agents play`` and the benchmarks) read turns with
:func:`read_turn`, so both take the same :data:`COMMANDS`, and show each turn's header
and each agent's new context with one :class:`ContextScreen`.

Text that the env, a model, the corpus or a dataset wrote reaches a terminal only through
:func:`terminal_safe` (or :func:`safe_print`): an escape sequence in a passage would
otherwise clear the screen, move the cursor or write the clipboard (OSC 52).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from envs import protocol as P

RULE = "─" * 72
"""The line between two turns on screen."""

COMMANDS = """Commands (never sent as a turn):
  :help          this list
  :ctx           the agent's whole context, its prompt included
  :all ANSWER    Answerers: ANSWER is this and every later Answerer's candidate
  :quit          leave (Ctrl-D too)"""

EXAMPLES = {
    P.LEADER: "<subtask>Who directed X?</subtask> (one per Searcher) or <select>1, 2</select>",
    P.SEARCHER: "<search>X director</search>, then <summary>X was directed by Y.</summary>",
    P.ANSWERER: "<answer>Y</answer>",
}
"""One example turn per role, for the first prompt a person sees for that role."""


_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
"""Bidirectional controls: they reorder what is shown around them ("Trojan Source")."""
_UNSAFE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) not in "\n\t"}
_UNSAFE.update({c: f"\\u{c:04x}" for c in _BIDI})


def terminal_safe(text: str, *, one_line: bool = False) -> str:
    r"""``text`` as a terminal may show it: every C0 control but newline and tab (ESC, BEL,
    carriage return, backspace...), DEL, every C1 control (CSI U+009B, OSC U+009D...) and the
    bidirectional controls are written out visibly (ESC as ``\x1b``, U+202E as ``\u202e``),
    so no escape sequence (CSI, OSC, OSC 52 clipboard writes) reaches the terminal whole.
    ``one_line``: newlines and tabs become spaces too (an error line). Printable text,
    non-ASCII letters included, is unchanged; applying it twice changes nothing more.

    >>> print(terminal_safe("Doc 1\x1b]52;c;ZXZpbA==\x07 \x1b[2Jsé\r"))
    Doc 1\x1b]52;c;ZXZpbA==\x07 \x1b[2Jsé\x0d
    """
    text = str(text)
    if one_line:
        text = text.replace("\r\n", " ").replace("\n", " ").replace("\t", " ")
    return text.translate(_UNSAFE)


def first_line(err: BaseException, width: int | None = None) -> str:
    """The first line of ``err``'s message (cut to ``width`` characters), or its type's name
    when the message is empty: what a one-line refusal quotes of an error it caught."""
    text = str(err).strip()
    return text.splitlines()[0][:width] if text else type(err).__name__


def safe_print(*parts: object, sep: str = " ") -> None:
    """``print`` for text we did not write (passages, model turns, dataset rows): the
    joined text goes through :func:`terminal_safe` first."""
    print(terminal_safe(sep.join(map(str, parts))))


class Quit(EOFError):
    """``:quit`` was typed. An ``EOFError``, so that whoever ends a session on Ctrl-D ends
    it on ``:quit`` the same way."""


@dataclass
class Typed:
    """A turn a person typed at :func:`read_turn`."""

    text: str
    """The whole turn, as it goes to the env."""
    for_all: bool = False
    """``:all`` was used: the same turn is meant for every later Answerer."""


def answer_turn(answer: str) -> str:
    """``:all ANSWER``'s turn: ANSWER inside ``<answer>`` tags unless it has them already."""
    answer = answer.strip()
    return answer if "<answer>" in answer else P.write("answer", answer)


def read_turn(agent: str, role: str, context: Callable[[], str], *,
              input_fn: Callable[[str], str] = input,
              output_fn: Callable[[str], object] = safe_print) -> Typed:
    """Read lines at the prompt ``"<agent>> "`` until one is a turn (an empty line asks again),
    answering the :data:`COMMANDS` on the way (``context()`` only for ``:ctx``, shown through
    :func:`terminal_safe` whatever ``output_fn`` is). Raises :class:`Quit` on ``:quit``;
    end of input (``EOFError``) propagates."""
    while True:
        line = input_fn(f"{agent}> ")
        command, _, rest = line.strip().partition(" ")
        if command == ":help":
            output_fn(f"{COMMANDS}\nA turn for {agent}, e.g. {EXAMPLES.get(role, '')}")
        elif command == ":ctx":
            output_fn(terminal_safe(context()))
        elif command == ":quit":
            raise Quit(":quit")
        elif command == ":all":
            if role != P.ANSWERER:
                output_fn(f":all is for Answerers; {agent} is a {role}. Type its turn, or :help.")
            elif not rest.strip():
                output_fn(":all needs the answer, e.g. :all Debra Tilell")
            else:
                return Typed(answer_turn(rest), for_all=True)
        elif command.startswith(":") and len(command) > 1 and command[1:].isalpha():
            output_fn(f"unknown command {command}; :help lists the commands")
        elif line.strip():
            return Typed(line)


def team_line(agents: Sequence[str]) -> str:
    """Who plays, in one line: ``leader_0, searcher_0..searcher_2, answerer_0..answerer_4``,
    and what the Answerers do (there are several candidates, one per Answerer)."""
    groups: dict[str, list[str]] = {}
    for agent in agents:
        groups.setdefault(P.role_of(agent), []).append(agent)
    names = [g[0] if len(g) == 1 else f"{g[0]}..{g[-1]}" for g in groups.values()]
    answerers = len(groups.get(P.ANSWERER, []))
    return (f"Agents: {', '.join(names)}. The {answerers} Answerers each write one candidate "
            "from the same context; the majority candidate is the team's answer "
            "(':all ANSWER' gives one answer to every Answerer).")


class ContextScreen:
    """What a terminal episode loop has shown of each agent's context, so that each turn
    shows only what is new: the agent's prompt at its first turn, then what the env wrote
    since. ``out`` must make the text terminal-safe (:func:`safe_print`)."""

    def __init__(self, decode: Callable[[list[int]], str], out: Callable[[str], object]):
        self.decode, self.out = decode, out
        self.shown: dict[str, int] = {}  # agent -> how much of its context is on screen
        self.shown_as: dict[tuple[int, ...], str] = {}  # a context on screen -> the agent it was shown for

    def header(self, agent: str, turn: int, phase: str) -> None:
        """The rule above a turn and ``<agent> · turn N · phase P`` (``turn`` counts from 0,
        as ``infos[agent]["turn"]``)."""
        self.out(f"{RULE}\n{agent} · turn {turn + 1} · phase {phase}")

    def context(self, agent: str, context: Sequence[int]) -> None:
        """The part of ``agent``'s context not on screen yet (nothing when nothing is new).
        The Answerers share one context: it is shown once, and the next ones say whose it is."""
        start = self.shown.get(agent, 0)
        if start > len(context):
            start = 0
        twin = self.shown_as.setdefault(tuple(context), agent)
        if twin != agent and start == 0:
            self.out(f"(the same context as {twin})")
            return
        text = self.decode(list(context[start:]))
        if text.strip():
            self.out(text.rstrip())

    def seen(self, agent: str, length: int) -> None:
        """The first ``length`` tokens of ``agent``'s context are on screen (after its turn
        and what the env wrote back at once)."""
        self.shown[agent] = length
