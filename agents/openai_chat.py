"""An OpenAI-compatible chat-completions endpoint as a batched policy, on the ``openai`` SDK.

Any server that speaks ``POST /v1/chat/completions`` works: vLLM, llama.cpp's server,
llama-cpp-python's server, a hosted API. Each observation's chat messages, which the env
builds from its structure (``Observation.messages``; no decoded context is ever parsed
back into messages), are sent with every content quoted (:func:`chat_messages`) and the
role's stop strings, and the reply comes back as ``Action(text=...)``: the env tokenises
it once; there are no token ids and no log-probs, so this policy can act and be evaluated
but not be trained on-policy.

**Quoted contents.** The server renders the messages with its own chat template, so a
passage that spells ``<|im_end|>\\n<|im_start|>system`` would become a real system turn
there: every content goes through ``envs.chat.quote_message``.

Requests go through the SDK's async client (:class:`OpenAIPolicy`) on one event loop thread
per policy, so ``act`` works the same from plain code, threads or a notebook.

>>> policy = OpenAIPolicy("smollm2", base_url="http://127.0.0.1:8080/v1")  # doctest: +SKIP
>>> [action] = policy.act([observation])                                   # doctest: +SKIP
>>> action.text                                                            # doctest: +SKIP
'<search>capital of Ostria</search>'
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from agents.base import Action, Observation
from envs.chat import quote_message
from envs.http import excerpt, remote_text, server_message

CHAT_ROLES = ("system", "user", "assistant")


def chat_messages(obs: Observation, special_tokens: Sequence[str] = ()) -> list[dict[str, str]]:
    """The ``messages`` of a chat request for ``obs``: its :attr:`Observation.messages`
    (built by the env from its structure), each content quoted with
    ``envs.chat.quote_message`` (``special_tokens``: the server's special strings,
    broken besides the common markers). Raises ValueError naming the agent when the
    observation has no messages (built by hand without them) or one of another role."""
    if not obs.messages:
        raise ValueError(f"observation of {obs.agent} has no chat messages: build it with the env "
                         "(raw_env.turn_observation / turn_observations) or give "
                         "Observation(messages=...)")
    out = []
    for i, message in enumerate(obs.messages):
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES or not isinstance(content, str):
            raise ValueError(f"observation of {obs.agent}: message {i} has role {role!r} and a "
                             f"{type(content).__name__} content; need a role in {CHAT_ROLES} and "
                             "a str")
        out.append({"role": role, "content": quote_message(content, special_tokens)})
    return out


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


_RETRIED_STATUS = (408, 409, 429)  # and every 5xx: what the SDK retries


class OpenAIError(RuntimeError):
    """A chat-completions request that failed: the message names the URL and the cause, on
    one line, with what the server wrote made terminal-safe (``envs.http.server_message``)."""


def _sdk():
    try:
        import openai
    except ModuleNotFoundError:
        raise ModuleNotFoundError("the OpenAI-compatible policy needs the openai package: "
                                  "pip install openai") from None
    return openai


class OpenAIPolicy:
    """Acts by calling ``POST {base_url}/chat/completions`` once per observation, up to
    ``concurrency`` requests at a time, through the ``openai`` SDK's ``AsyncOpenAI`` client.

    ``api_key_env`` names the environment variable that holds the key; when it is unset no
    ``Authorization`` header is sent (local servers). The SDK retries connection errors,
    timeouts, HTTP 408, 409, 429 and 5xx ``retries`` times, waiting about
    ``backoff * 2**attempt`` seconds (less up to 25% jitter, at most 8 s) or the server's
    ``Retry-After``; other HTTP errors raise at once. ``extra`` is merged into every
    request body (server-specific options such as ``top_k``, ``seed`` or llama.cpp's
    ``grammar``). ``special_tokens`` (the server tokenizer's), ``markers`` (the ``openai:``
    spec's ``?markers=[A]|[B]``) and those of ``tokenizer``'s chat template (a local copy of
    the server's) are broken in every message content besides the built-in markers.

    ``timeout`` bounds each phase of an attempt (connect, send, each wait for the server's
    bytes); ``deadline`` bounds the whole request, every attempt and wait included (default
    ``(retries + 1) * timeout + 8 * retries``, 8 s being the SDK's longest backoff), so a
    server that trickles its answer a byte at a time cannot hold a request longer. A server
    that decodes one request at a time (llama-cpp-python's) makes the last of
    ``concurrency`` requests wait for all the others, so lower ``concurrency`` or raise
    ``timeout`` for such a server. ``close()`` ends the client and its event loop thread.
    """

    def __init__(self, model: str, base_url: str = "http://127.0.0.1:8080/v1",
                 api_key_env: str = "OPENAI_API_KEY", temperature: float = 1.0, top_p: float = 1.0,
                 max_tokens: int = 256, timeout: float = 60.0, retries: int = 3,
                 backoff: float = 0.5, concurrency: int = 8, extra: Mapping[str, Any] | None = None,
                 special_tokens: Sequence[str] = (), deadline: float | None = None,
                 markers: Sequence[str] = (), tokenizer: Any = None):
        if deadline is None:
            deadline = (retries + 1) * timeout + 8.0 * retries
        if (max_tokens < 1 or concurrency < 1 or retries < 0 or timeout <= 0 or backoff < 0
                or not deadline > 0):
            raise ValueError(f"need max_tokens >= 1, concurrency >= 1, retries >= 0, timeout > 0, "
                             f"backoff >= 0 and deadline > 0; got max_tokens={max_tokens}, "
                             f"concurrency={concurrency}, retries={retries}, timeout={timeout}, "
                             f"backoff={backoff}, deadline={deadline}")
        from agents.sampling import Sampling

        Sampling(temperature=temperature, top_p=top_p)  # the spec's ranges (ValueError, one line)
        _sdk()  # fail now, not at the first act(), when the SDK is missing
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.deadline = float(deadline)
        self.retries = retries
        self.backoff = backoff
        self.concurrency = concurrency
        self.extra = dict(extra or {})
        from envs.chat import check_marker, template_markers

        named = tuple(check_marker(m, "OpenAIPolicy markers") for m in markers)
        own = template_markers(tokenizer) if tokenizer is not None else ()
        # every marker broken besides the built-in ones: configuration only, never a message's
        self.special_tokens = tuple(dict.fromkeys((*(str(t) for t in special_tokens), *named, *own)))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._start_lock = threading.Lock()

    def act(self, observations: Sequence[Observation]) -> list[Action | str]:
        """One ``Action(text=...)`` per observation, in order. Raises :class:`OpenAIError`
        when a request fails for good (the first failure in batch order), ``ValueError``
        for an observation without chat messages (:func:`chat_messages`)."""
        if not observations:
            return []
        bodies = [self.request_body(obs) for obs in observations]
        loop = self._ensure_loop()
        future = asyncio.run_coroutine_threadsafe(self._act_all(observations, bodies), loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt: stop the requests still in flight
            raise

    def request_body(self, obs: Observation) -> dict[str, Any]:
        """The JSON body sent for ``obs``."""
        body: dict[str, Any] = {"model": self.model,
                                "messages": chat_messages(obs, self.special_tokens),
                                "max_tokens": max(1, min(obs.max_new_tokens, self.max_tokens)),
                                "temperature": self.temperature, "top_p": self.top_p}
        if obs.stop:
            body["stop"] = list(obs.stop)
        body.update(self.extra)
        return body

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The decoded JSON reply to one request ``body`` (e.g. :meth:`request_body`'s), as
        the server sent it: for a look at the raw choice (``finish_reason`` and the like)."""
        loop = self._ensure_loop()
        return asyncio.run_coroutine_threadsafe(self._post(body), loop).result()

    async def _act_all(self, observations: Sequence[Observation],
                       bodies: Sequence[dict[str, Any]]) -> list[Action | str]:
        gate = asyncio.Semaphore(self.concurrency)

        async def one(obs: Observation, body: dict[str, Any]) -> Action:
            async with gate:
                return _action(await self._post(body), obs, self.url)

        tasks = [asyncio.ensure_future(one(o, b)) for o, b in zip(observations, bodies, strict=True)]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in tasks:  # the first failure in batch order, as a sequential loop would
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()
            return [await task for task in tasks]
        finally:
            for task in tasks:
                task.cancel()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="openai-policy",
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _make_client(self) -> Any:
        openai = _sdk()
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        backoff = self.backoff

        class Client(openai.AsyncOpenAI):
            # The SDK starts its backoff at 0.5 s; scale it to ours (a documented knob here,
            # and tests against a local server need not sleep).
            def _calculate_retry_timeout(self, remaining_retries, options, response_headers=None):
                seconds = super()._calculate_retry_timeout(remaining_retries, options,
                                                           response_headers)
                if response_headers is not None and response_headers.get("retry-after"):
                    return seconds  # the server said how long: honour it
                return seconds * backoff / 0.5

        # No key: a placeholder the SDK insists on, and each request omits the header.
        self._omit_auth = None if key else {"Authorization": openai.Omit()}
        return Client(base_url=self.base_url, api_key=key or "unused", timeout=self.timeout,
                      max_retries=self.retries)

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        """The decoded JSON reply to one request, after the SDK's retries."""
        openai = _sdk()
        if self._client is None:  # made on the loop thread: its connections belong to it
            self._client = self._make_client()
        known = {k: body[k] for k in ("model", "messages", "max_tokens", "temperature",
                                      "top_p", "stop") if k in body}
        extra_body = {k: v for k, v in body.items() if k not in known}
        create = self._client.chat.completions.with_raw_response.create
        retried = f"POST {self.url} failed after {self.retries + 1} attempts; last error:"
        try:
            raw = await asyncio.wait_for(create(**known, extra_body=extra_body or None,
                                                extra_headers=self._omit_auth), self.deadline)
        except asyncio.TimeoutError:  # the whole request, however the server trickles
            raise OpenAIError(f"POST {self.url}: no complete answer within the {self.deadline:g} s "
                              "deadline") from None
        except openai.APIStatusError as e:
            status, message = e.status_code, server_message(e.response.content)
            if status in _RETRIED_STATUS or status >= 500:
                raise OpenAIError(f"{retried} HTTP {status}: {message}") from None
            raise OpenAIError(f"POST {self.url} -> HTTP {status}: {message}") from None
        except openai.APIConnectionError as e:  # refused, reset, timed out
            cause = e.__cause__ or e
            raise OpenAIError(f"{retried} {type(cause).__name__}: {remote_text(cause)}") from None
        except openai.OpenAIError as e:  # any other failure the SDK reports
            raise OpenAIError(f"POST {self.url}: {type(e).__name__}: {remote_text(e)}") from None
        content = raw.http_response.content
        try:
            reply = json.loads(content)
        except (UnicodeDecodeError, ValueError):
            raise OpenAIError(f"POST {self.url}: the response is not JSON: {excerpt(content)}") from None
        if not isinstance(reply, dict):
            raise OpenAIError(f"POST {self.url}: the response is not a JSON object: "
                              f"{excerpt(json.dumps(reply))}")
        return reply

    def close(self) -> None:
        """Close the client's connections and stop the event loop thread (idempotent)."""
        loop, thread = self._loop, self._thread
        if loop is None:
            return
        if threading.current_thread() is thread:  # dropped inside the loop: just stop it
            self._loop, self._thread, self._client = None, None, None
            loop.call_soon(loop.stop)
            return
        if self._client is not None:
            client, self._client = self._client, None
            asyncio.run_coroutine_threadsafe(client.close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=10)
        loop.close()
        self._loop, self._thread = None, None

    def __getstate__(self) -> dict[str, Any]:
        # Settings only (e.g. to ship the policy to a rollout worker): the client, its loop
        # and thread are made again on the first act() there.
        state = dict(self.__dict__)
        state.update(_loop=None, _thread=None, _client=None, _start_lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_lock = threading.Lock()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to close cleanly
            pass


def _action(reply: dict[str, Any], obs: Observation, url: str) -> Action:
    """The Action a chat-completions ``reply`` to ``obs`` makes, with its stop restored."""
    try:
        choice = reply["choices"][0]
        text = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        text = None
    if not isinstance(text, str):
        raise OpenAIError(f"POST {url}: the response has no choices[0].message.content: "
                          f"{excerpt(json.dumps(reply))}")
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
