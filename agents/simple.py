"""Two policies without a model: ``RandomPolicy`` (the floor any team must clear) and
``HumanPolicy`` (a person at the terminal plays the awaiting agents, one turn each).

>>> RandomPolicy(seed=0).act([observation])                  # doctest: +SKIP
['<search>born Kessa</search> the']
>>> HumanPolicy().act([observation])                         # doctest: +SKIP
=== searcher_0 (searcher) ===
Task: Where was Maren Tolvik born?
[Write <search>query</search> or <summary>report</summary>. ':help' lists the commands, ...]
searcher_0> <search>Maren Tolvik</search>
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from agents.base import Action, Observation
from envs import protocol as P
from envs.terminal import answer_turn, read_turn, terminal_safe

TEXT, TOKENS = "text", "tokens"

_WORDS = ("the", "of", "in", "who", "what", "was", "born", "city", "film", "year", "founded",
          "director", "river", "capital", "country", "answer", "search", "report", "Doc", "Title",
          "1901", "1850", "and", "is", "a", "by", "1", "2", "3")


class RandomPolicy:
    """Random turns: protocol-looking text (``mode="text"``: random tags, often unclosed,
    around random words) or uniformly random token ids (``mode="tokens"``).

    Seeded: the same seed and the same sequence of ``act`` calls give the same turns.
    Most turns are invalid; an answer is never right but by accident.

    Args:
        mode: ``"text"`` (returns ``str``) or ``"tokens"`` (returns :class:`Action` with
            token ids and their log-probs under the uniform distribution, ``-log V``).
        vocab_size: V, required for ``"tokens"``.
        max_tokens: most tokens (``"tokens"``) or words (``"text"``) in one turn; a turn
            never exceeds the observation's ``max_new_tokens`` either.
        seed: seeds the generator.
    """

    def __init__(self, mode: str = TEXT, vocab_size: int | None = None, max_tokens: int = 32, seed: int = 0):
        if mode not in (TEXT, TOKENS):
            raise ValueError(f"mode must be 'text' or 'tokens', got {mode!r}")
        if mode == TOKENS and (vocab_size is None or vocab_size < 1):
            raise ValueError(f"mode='tokens' needs vocab_size >= 1, got {vocab_size!r}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.mode = mode
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.rng = np.random.default_rng(seed)

    def act(self, observations: Sequence[Observation]) -> list[Action | str]:
        return [self._tokens(obs) if self.mode == TOKENS else self._text(obs) for obs in observations]

    def _limit(self, obs: Observation) -> int:
        return max(1, min(self.max_tokens, obs.max_new_tokens))

    def _tokens(self, obs: Observation) -> Action:
        n = int(self.rng.integers(1, self._limit(obs) + 1))
        ids = self.rng.integers(0, self.vocab_size, size=n, dtype=np.int64)
        return Action(token_ids=ids, logprobs=np.full(n, -math.log(self.vocab_size)))

    def _words(self, n: int) -> str:
        return " ".join(_WORDS[int(i)] for i in self.rng.integers(0, len(_WORDS), size=n))

    def _text(self, obs: Observation) -> str:
        budget = max(1, self._limit(obs) // 2)  # words are often two tokens or more
        parts = []
        for _ in range(int(self.rng.integers(1, 4))):
            n = int(self.rng.integers(1, min(budget, 6) + 1))
            if self.rng.random() < 0.6:
                tag = P.TAGS[int(self.rng.integers(len(P.TAGS)))]
                body = (", ".join(str(int(k)) for k in self.rng.integers(0, 6, size=n))
                        if tag == "select" else self._words(n))
                closed = self.rng.random() < 0.5
                parts.append(f"<{tag}>{body}" + (f"</{tag}>" if closed else ""))
            else:
                parts.append(self._words(n))
        return " ".join(parts)


def last_user_message(messages: Sequence[Mapping[str, str]]) -> str:
    """The newest message the env wrote into a context: the content of the last ``user``
    message of ``messages`` (``Observation.messages``, ``raw_env.messages(agent)``), or
    ``""`` when there is none. Messages come from the env's structure: a decoded context is
    never parsed back into them (a passage could spell a header)."""
    return next((m["content"].strip() for m in reversed(messages) if m.get("role") == "user"), "")


class HumanPolicy:
    """A person types each turn. For every observation it shows the agent, its role and
    the newest message in its context, then reads lines until one is a turn (sent as
    typed): the commands of ``envs.terminal`` (``:help``, ``:ctx`` for the whole context,
    ``:all ANSWER``, ``:quit``) are answered on the way and are never a turn, the same
    commands as ``python -m envs step``.

    The Answerers of one episode share one context: it is shown once (the next ones say
    whose it is), and ``:all ANSWER`` makes ANSWER the candidate of this Answerer and of
    every later Answerer of the same env and question, without asking again. An Answerer's
    bare answer ``Paris`` is sent as ``<answer>Paris</answer>``. ``:quit`` and end of input
    raise ``EOFError`` (``envs.terminal.Quit`` is one), so a session ends cleanly on either.

    Args:
        input_fn: reads one line given a prompt (``input`` by default).
        output_fn: shows text (``print`` by default), given it through
            :func:`envs.terminal.terminal_safe`.
        show_context: show the newest message of each context (False when the caller,
            like ``python -m agents play``, shows the contexts itself).
    """

    def __init__(self, input_fn: Callable[[str], str] = input, output_fn: Callable[[str], object] = print,
                 show_context: bool = True):
        self.input_fn = input_fn
        self.output_fn = lambda text: output_fn(terminal_safe(text))  # passages and reports may hold escapes
        self.show_context = show_context
        self._for_all: dict[int, tuple[str, str]] = {}  # env index -> (question, turn) of ':all'
        self._shown: dict[int, tuple[bytes, str]] = {}  # env index -> (context, agent) last shown
        self._roles_met: set[str] = set()  # roles whose how-to was shown

    def act(self, observations: Sequence[Observation]) -> list[str]:
        return [self._turn(obs) for obs in observations]

    def _turn(self, obs: Observation) -> str:
        question = str(obs.info.get("question", ""))
        if obs.role != P.ANSWERER:  # a new phase (or episode) ends what ':all' covered
            self._for_all.pop(obs.env_index, None)
        pending = self._for_all.get(obs.env_index)
        if pending is not None and pending[0] == question:
            self.output_fn(f"{obs.agent}> {pending[1]}   (:all)")
            return pending[1]
        if self.show_context:
            self.output_fn(f"\n=== {obs.agent} ({obs.role}) ===")
            context = np.asarray(obs.token_ids).tobytes()
            twin = self._shown.get(obs.env_index)
            if twin is not None and twin[0] == context and twin[1] != obs.agent:
                self.output_fn(f"(the same context as {twin[1]})")
            else:  # an observation built without messages: its task or question
                self.output_fn(last_user_message(obs.messages)
                               or str(obs.info.get("task") or obs.info.get("question") or ""))
                self._shown[obs.env_index] = (context, obs.agent)
        if obs.role not in self._roles_met:
            self._roles_met.add(obs.role)
            if obs.role == P.ANSWERER:
                self.output_fn("[Each Answerer writes one candidate; the majority is the team's answer. "
                               "':all ANSWER' answers for this and every later Answerer.]")
        hint = P.FORMAT_REMINDERS.get(obs.role, "")
        self.output_fn(f"[{hint} ':help' lists the commands, ':ctx' shows the whole context.]")
        typed = read_turn(obs.agent, obs.role, lambda: obs.text, input_fn=self.input_fn,
                          output_fn=self.output_fn)
        text = answer_turn(typed.text) if obs.role == P.ANSWERER else typed.text
        if typed.for_all:
            self._for_all[obs.env_index] = (question, text)
        return text
