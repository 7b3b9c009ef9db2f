"""The token side of the protocol (whose words are ``envs.protocol``'s): turns framed as chat
messages in token ids (:class:`ChatFormat`), a chat request's contents quoted
(:func:`quote_message`), and where a generated turn ends (:class:`TurnEnder`).
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from envs.protocol import clean_text


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

    **Quoted text is never markup.** Everything inside a message, text actions included,
    goes through :meth:`encode`, with special-token parsing off; only the frame's own markers
    are special ids. Added tokens that are not special (the micro tokenizer's ``<search>``)
    still tokenise as themselves.
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
        """What closes an assistant turn that the agent itself did not close (nothing without
        an end token: a plain layout whose tokenizer has no EOS)."""
        return [] if self.end_id is None or (turn and turn[-1] == self.end_id) else [self.end_id]

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
    # every <|...|>: ChatML (<|im_start|>, Qwen, SmolLM2, Phi-4's <|im_sep|>), Llama 3
    # (<|start_header_id|>, <|eot_id|>, <|python_tag|>), Llama 4 (<|header_start|>), Phi-3
    # (<|user|>, <|end|>), Command-R, Granite, gpt-oss (<|channel|>, <|message|>)
    "<|",
    # DeepSeek V2/V3/R1's fullwidth bars: <\uff5cUser\uff5c>, <\uff5cend\u2581of\u2581sentence\uff5c>
    "<\uff5c",
    # sentencepiece and BERT-style specials
    "<s>", "</s>", "<eos>", "<bos>", "<pad>", "<unk>", "[SEP]", "[CLS]", "[MASK]", "[PAD]", "[UNK]",
    # Gemma 1-3, SmolVLM/Idefics
    "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<end_of_utterance>",
    # Llama 2 and Mistral v1-v3
    "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>",
    # Mistral v3/v7 (tekken) and later: system prompt, tools, images, fill-in-the-middle, thinking
    "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CONTENT]", "[ARGS]", "[CALL_ID]", "[IMG]", "[IMG_BREAK]",
    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[THINK]", "[/THINK]",
    # ChatGLM / GLM-4
    "[gMASK]", "<sop>", "<eop>",
)
"""Spelled special markers of the common chat templates that :func:`quote_message` breaks:
``<|`` covers every ``<|...|>`` (ChatML, Llama 3, Phi), ``<\uff5c`` DeepSeek's fullwidth bars."""

_TEMPLATE_MARKER = re.compile(
    r"<\|[^|<>\s]{1,48}\|>"          # <|im_start|>, <|eot_id|>
    r"|<\uff5c[^<>\s]{1,48}\uff5c>"   # DeepSeek's
    r"|\[/?[A-Z][A-Z_]{1,31}\]"        # [INST], [/SYSTEM_PROMPT] (not a Jinja messages[idx])
    r"|<</?[A-Z]{2,16}>>"             # <<SYS>>
    r"|</?[a-z][a-z_]{1,31}>")        # <start_of_turn>, <end_of_turn>, <tool_call>
"""What a spelled marker looks like inside a chat template's text."""

MAX_MARKER_CHARS = 64


def check_marker(marker: str, where: str = "marker") -> str:
    """``marker`` when it can be a marker (else a one-line ``ValueError`` naming ``where`` and
    why); a protocol tag cannot be: breaking ``<answer>`` would hide the agents' own turns."""
    from envs.protocol import TAGS

    if not isinstance(marker, str) or not 2 <= len(marker) <= MAX_MARKER_CHARS:
        raise ValueError(f"{where}: a marker has 2 to {MAX_MARKER_CHARS} characters, got {marker!r:.80}")
    if not marker.isprintable() or any(c.isspace() for c in marker):
        raise ValueError(f"{where}: a marker has no whitespace or control characters, got {marker!r}")
    if marker.isalnum():
        raise ValueError(f"{where}: a marker is markup, not a word (it needs a character other than "
                         f"letters and digits), got {marker!r}")
    if marker in {f"<{t}>" for t in TAGS} | {f"</{t}>" for t in TAGS}:
        raise ValueError(f"{where}: {marker!r} is one of the protocol's own tags, not a chat marker")
    return marker


def template_markers(tokenizer: Any) -> tuple[str, ...]:
    """The markers of ``tokenizer``'s own chat layout: its special strings and every spelled
    marker its chat template writes (``[INST]``, ``<start_of_turn>``, ``<|eot_id|>``...), for
    :func:`quote_message`. Read from the tokenizer (trusted configuration) only; what does
    not pass :func:`check_marker` (a protocol tag, a bare word) is left out. Empty when the
    tokenizer has neither."""
    found: list[str] = [str(t) for t in (getattr(tokenizer, "all_special_tokens", None) or ())]
    template = getattr(tokenizer, "chat_template", None)
    templates = template.values() if isinstance(template, Mapping) else [template]
    for text in templates:
        if isinstance(text, str):
            found += _TEMPLATE_MARKER.findall(text)
    out = []
    for marker in dict.fromkeys(found):
        try:
            out.append(check_marker(marker))
        except ValueError:
            continue
    return tuple(out)


def quote_message(text: str, special_tokens: Sequence[str] = ()) -> str:
    r"""``text`` made safe as the content of a chat request's message, in any chat layout.

    A chat server tokenises the rendered template with special-token parsing on, so a
    spelled marker in a content would become a real turn there. Each occurrence of
    :data:`SPELLED_MARKERS` and of ``special_tokens`` (the markers of the policy's own
    template, :func:`template_markers`' or given; never read from the text being quoted)
    gets a zero-width joiner after its first character (``<|im_start|>`` ->
    ``<\u200d|im_start|>``), which no marker contains; a line that starts with a
    plain-layout header is quoted as :func:`plain_quote` does. Quoting twice changes
    nothing more; what UTF-8 cannot encode becomes U+FFFD.

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
