"""An OpenAI-compatible chat-completions endpoint as a batched policy (standard library only).

Any server that speaks ``POST /v1/chat/completions`` works: vLLM, llama.cpp's server,
llama-cpp-python's server, a hosted API. Each observation's context text is split back
into chat messages (:func:`split_messages`), sent with the role's stop strings, and the
reply comes back as ``Action(text=...)``: the env tokenises it once; there are no token ids
and no log-probs, so this policy can act and be evaluated but not be trained on-policy.

Chat APIs drop the stop string they stopped on; :func:`restore_stop` puts it back, so a
Searcher's ``<search>foo`` returns as ``<search>foo</search>`` (the env parses only
complete tags).

>>> policy = OpenAIPolicy("smollm2", base_url="http://127.0.0.1:8080/v1")  # doctest: +SKIP
>>> [action] = policy.act([observation])                                   # doctest: +SKIP
>>> action.text                                                            # doctest: +SKIP
'<search>capital of Ostria</search>'
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agents.base import Action, Observation
from envs.http import excerpt, post_json

# --------------------------------------------------------------------------- chat messages

_CHATML_TURN = re.compile(r"<\|im_start\|>([^\n<]*)\n(.*?)(<\|im_end\|>|\Z)", re.DOTALL)
_PLAIN_TURN = re.compile(r"(?:^|\n\n)(System|User|Assistant):")
# Special-token text that a decoded context may carry around a turn (EOS, BOS); a chat
# server would read it as literal text, or worse as a real special token mid-prompt.
_SPECIAL_EDGE = re.compile(r"^(?:\s*(?:<\|[A-Za-z_]+\|>|<s>|</s>|<eos>|<bos>))+"
                           r"|(?:(?:<\|[A-Za-z_]+\|>|<s>|</s>|<eos>|<bos>)\s*)+$")


def split_messages(text: str) -> list[dict[str, str]]:
    """Chat messages (``{"role", "content"}``, in order) of a context in ChatML or in the
    plain ``System:/User:/Assistant:`` layout of :class:`envs.protocol.ChatFormat`.

    A trailing empty assistant header is the generation prompt and is dropped. Raises
    ``ValueError`` for a context in neither layout, or one that ends inside a non-empty
    assistant turn (a chat API cannot portably continue a partial turn).
    """
    chatml = "<|im_start|>" in text
    if chatml:
        head = text[: text.index("<|im_start|>")]
        turns = [(m.group(1).strip(), m.group(2), bool(m.group(3)))
                 for m in _CHATML_TURN.finditer(text)]
    else:  # no turn is closed by a marker; only a last Assistant header is left open
        parts = _PLAIN_TURN.split(text)
        head, roles = parts[0], [r.lower() for r in parts[1::2]]
        turns = [(role, body, not (i == len(roles) - 1 and role == "assistant"))
                 for i, (role, body) in enumerate(zip(roles, parts[2::2], strict=True))]
    if _SPECIAL_EDGE.sub("", head).strip():
        raise ValueError(f"context is neither ChatML nor the plain layout: starts {head[:80]!r}")
    if not turns:
        raise ValueError(f"context holds no chat messages: {text[:80]!r}")
    messages = []
    for i, (role, body, closed) in enumerate(turns):
        content = _SPECIAL_EDGE.sub("", body)
        if not chatml:  # "\n\nUser: text\n\nAssistant:" pads each turn with whitespace
            content = content.strip()
        if i == len(turns) - 1 and not closed:
            if role != "assistant":
                raise ValueError(f"context ends inside an unclosed {role!r} message")
            if content.strip():
                raise ValueError("context ends inside a partial assistant turn "
                                 f"({content[-80:]!r}); a chat API cannot continue it")
            break  # the generation prompt
        messages.append({"role": role, "content": content})
    return messages


def restore_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` with the stop string that closes its last unclosed tag appended.

    Chat APIs strip the matched stop string; the closing tags in ``stops`` (``</search>``)
    are put back only where the text opened that tag and did not close it again. Among
    several open tags, the one opened last wins. Text with no open tag is returned as is.
    """
    best, best_at = None, -1
    for stop in stops:
        m = re.fullmatch(r"</([^<>/\s]+)>", stop)
        if m is None:
            continue
        opened = text.rfind(f"<{m.group(1)}>")
        if opened > best_at and text.find(stop, opened) < 0:
            best, best_at = stop, opened
    return text if best is None else text + best


# --------------------------------------------------------------------------- HTTP


class OpenAIError(RuntimeError):
    """A chat-completions request that failed: the message names the URL and the cause."""


class OpenAIPolicy:
    """Acts by calling ``POST {base_url}/chat/completions`` once per observation, up to
    ``concurrency`` requests at a time.

    ``api_key_env`` names the environment variable that holds the key; when it is unset no
    ``Authorization`` header is sent (local servers). Connection errors, timeouts, HTTP 429
    and 5xx are retried ``retries`` times, waiting ``backoff * 2**attempt`` seconds (or the
    server's ``Retry-After``, at most 30 s); other HTTP errors raise at once. ``extra`` is
    merged into every request body (server-specific options such as ``top_k`` or ``seed``).

    ``timeout`` covers one whole request, queueing included: a server that decodes one
    request at a time (llama-cpp-python's) makes the last of ``concurrency`` requests wait
    for all the others, so lower ``concurrency`` or raise ``timeout`` for such a server.
    """

    def __init__(
        self,
        model: str,
        base_url: str = "http://127.0.0.1:8080/v1",
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 256,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 8,
        extra: Mapping[str, Any] | None = None,
    ):
        if max_tokens < 1 or concurrency < 1 or retries < 0 or timeout <= 0:
            raise ValueError(
                f"need max_tokens >= 1, concurrency >= 1, retries >= 0 and timeout > 0; got "
                f"max_tokens={max_tokens}, concurrency={concurrency}, retries={retries}, "
                f"timeout={timeout}"
            )
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.concurrency = concurrency
        self.extra = dict(extra or {})

    def act(self, observations: Sequence[Observation]) -> list[Action | str]:
        """One ``Action(text=...)`` per observation, in order. Raises :class:`OpenAIError`
        when a request fails for good (the first failure in batch order)."""
        if not observations:
            return []
        if len(observations) == 1:
            return [self._act_one(observations[0])]
        workers = min(self.concurrency, len(observations))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="openai") as pool:
            futures = [pool.submit(self._act_one, obs) for obs in observations]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def request_body(self, obs: Observation) -> dict[str, Any]:
        """The JSON body sent for ``obs``."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": split_messages(obs.text),
            "max_tokens": max(1, min(obs.max_new_tokens, self.max_tokens)),
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if obs.stop:
            body["stop"] = list(obs.stop)
        body.update(self.extra)
        return body

    def _act_one(self, obs: Observation) -> Action:
        reply = self._post(self.request_body(obs))
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            text = None
            choice = {}
        if not isinstance(text, str):
            raise OpenAIError(
                f"POST {self.url}: the response has no choices[0].message.content: "
                f"{excerpt(json.dumps(reply))}"
            )
        if choice.get("finish_reason") == "length":  # a cut-off turn closed nothing
            return Action(text=text)
        # vLLM (stop_reason) and SGLang (matched_stop) say what they stopped on: a stop
        # string, a token id, or None for EOS; other servers leave it to restore_stop
        key = next((k for k in ("stop_reason", "matched_stop") if k in choice), None)
        if key is None:
            return Action(text=restore_stop(text, obs.stop))
        matched = choice[key]
        if isinstance(matched, str) and matched in obs.stop and not text.endswith(matched):
            text += matched
        return Action(text=text)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """The decoded JSON reply to one request, after retrying transient failures."""
        reply = post_json(self.url, body, headers=self._headers(), timeout=self.timeout, retries=self.retries,
                          backoff=self.backoff, error=OpenAIError)
        if not isinstance(reply, dict):
            raise OpenAIError(f"POST {self.url}: the response is not a JSON object: {excerpt(json.dumps(reply))}")
        return reply
