"""JSON over HTTP POST with retries, for the remote retriever (standard library only, so
``envs`` needs no HTTP client package), and the error-body helpers that the
OpenAI-compatible policy (on the ``openai`` SDK) shares with it.

Connection errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff (a
server's ``Retry-After`` is honoured, up to 30 s); other 4xx answers and malformed JSON
raise at once. Every error message names the URL.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any


def excerpt(body: bytes | str, n: int = 300) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    return text if len(text) <= n else text[:n] + "..."


def server_message(body: bytes) -> str:
    """The ``error`` (or OpenAI-style ``error.message``) of a JSON error body, else an excerpt."""
    try:
        err = json.loads(body).get("error")
        if isinstance(err, Mapping) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except (ValueError, AttributeError):
        pass
    return excerpt(body)


def post_json(url: str, body: Any, *, headers: Mapping[str, str] | None = None, timeout: float = 30.0,
              retries: int = 3, backoff: float = 0.5, error: type[Exception] = RuntimeError) -> Any:
    """POST ``body`` as JSON and return the decoded JSON answer, retrying transient failures."""
    data = json.dumps(body).encode()
    head = {"Content-Type": "application/json", **(headers or {})}
    last = ""
    for attempt in range(retries + 1):
        wait = backoff * 2**attempt
        request = urllib.request.Request(url, data=data, headers=head, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            try:
                message = server_message(err.read())
            except OSError:
                message = str(err.reason)
            if err.code != 429 and err.code < 500:
                raise error(f"POST {url} -> HTTP {err.code}: {message}") from None
            last = f"HTTP {err.code}: {message}"
            retry_after = err.headers.get("Retry-After", "") if err.headers else ""
            if retry_after.strip().isdigit():
                wait = max(wait, min(float(retry_after), 30.0))
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:  # refused, reset, timed out
            last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
        else:
            try:
                return json.loads(raw)
            except (UnicodeDecodeError, ValueError):
                raise error(f"POST {url}: the response is not JSON: {excerpt(raw)}") from None
        if attempt < retries:
            time.sleep(wait)
    raise error(f"POST {url} failed after {retries + 1} attempts; last error: {last}")
