"""JSON over HTTP POST with retries, for the remote retriever (standard library only), and
the error-body helpers the OpenAI-compatible policy shares with it.

Connection errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff (a
``Retry-After`` is honoured, up to 30 s); other 4xx answers and malformed JSON raise at
once. Every error message names the URL, and what the server wrote in it goes through
:func:`envs.terminal.terminal_safe` on one line. ``timeout`` is a deadline for the whole
attempt, not per read (:class:`_Deadline`): a server that trickles a byte a second cannot
hold the caller.
"""

from __future__ import annotations

import functools
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from envs.terminal import terminal_safe


def excerpt(body: bytes | str, n: int = 300) -> str:
    """The first ``n`` characters of a remote ``body``, terminal-safe on one line."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    return terminal_safe(text if len(text) <= n else text[:n] + "...", one_line=True)


def server_message(body: bytes) -> str:
    """The ``error`` (or OpenAI-style ``error.message``) of a JSON error body, else an
    excerpt; terminal-safe on one line, at most 300 characters."""
    try:
        err = json.loads(body).get("error")
        if isinstance(err, Mapping) and err.get("message"):
            return excerpt(str(err["message"]))
        if isinstance(err, str):
            return excerpt(err)
    except (ValueError, AttributeError, RecursionError):
        pass
    return excerpt(body)


def remote_text(value: Any) -> str:
    """``str(value)`` of something a server may have written (an exception naming its bytes),
    terminal-safe on one line, at most 300 characters."""
    return excerpt(str(value))


class _Deadline:
    """The sockets of one attempt, shut down from a timer thread (which wakes a blocked read)
    when ``seconds`` have passed since it began.

    Each socket is registered as a duplicate (``sock.dup()``), so the shutdown reaches the
    connection even after urllib or ``ssl`` has closed or detached the original object, and
    never a later socket that reuses a closed descriptor number."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        dup = sock.dup()
        with self._lock:
            if not self.expired:
                self._socks.append(dup)
                return
        dup.close()
        sock.close()
        raise TimeoutError(f"no complete answer within the {self.seconds:g} s deadline")

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._socks:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked on this connection
                except OSError:  # already closed by the peer
                    pass

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            for sock in self._socks:
                sock.close()
            self._socks.clear()


@functools.cache
def _watched(connection_class: type) -> type:
    """``connection_class`` (an ``http.client`` connection) connecting within a deadline's
    time left and handing its socket to the deadline."""

    class Watched(connection_class):
        def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any):
            super().__init__(*args, **kwargs)
            create = self._create_connection

            def connect(address, timeout=None, source_address=None):
                left = deadline.deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no complete answer within the {deadline.seconds:g} s deadline")
                if isinstance(timeout, (int, float)):  # not socket's "global default" sentinel
                    left = min(timeout, left)
                sock = create(address, left, source_address)
                deadline.watch(sock)
                return sock

            self._create_connection = connect

    Watched.__name__ = f"Watched{connection_class.__name__}"
    return Watched


class _DeadlineHandlerMixin:
    def __init__(self, deadline: _Deadline, **kwargs: Any):
        super().__init__(**kwargs)
        self._deadline = deadline

    def do_open(self, http_class, req, **http_conn_args):
        watched = functools.partial(_watched(http_class), deadline=self._deadline)
        return super().do_open(watched, req, **http_conn_args)


class _DeadlineHTTPHandler(_DeadlineHandlerMixin, urllib.request.HTTPHandler):
    pass


class _DeadlineHTTPSHandler(_DeadlineHandlerMixin, urllib.request.HTTPSHandler):
    pass


def post_json(url: str, body: Any, *, timeout: float = 30.0, retries: int = 3, backoff: float = 0.5,
              error: type[Exception] = RuntimeError) -> Any:
    """POST ``body`` as JSON and return the decoded JSON answer, retrying transient failures.

    ``timeout``: seconds each attempt may take in all, from connecting to the last byte of
    the answer; a call takes at most about ``(retries + 1) * timeout`` plus the backoff."""
    data = json.dumps(body).encode()
    head = {"Content-Type": "application/json"}
    last = ""
    for attempt in range(retries + 1):
        wait = backoff * 2**attempt
        request = urllib.request.Request(url, data=data, headers=head, method="POST")
        deadline = _Deadline(timeout)
        opener = urllib.request.build_opener(_DeadlineHTTPHandler(deadline),
                                             _DeadlineHTTPSHandler(deadline))
        try:
            with opener.open(request, timeout=timeout) as response:
                raw = response.read()
            if deadline.expired:  # a body without a length can end early at the shutdown
                raise TimeoutError("deadline")
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
            if deadline.expired:
                last = f"no complete answer within the {timeout:g} s deadline"
            else:  # a bad status line or a reset names the server's bytes
                last = f"{type(err).__name__}: {remote_text(getattr(err, 'reason', err))}"
        else:
            try:
                return json.loads(raw)
            except (UnicodeDecodeError, ValueError):
                raise error(f"POST {url}: the response is not JSON: {excerpt(raw)}") from None
        finally:
            deadline.close()
        if attempt < retries:
            time.sleep(wait)
    tries = f"{retries + 1} attempt{'s' if retries else ''}"
    raise error(f"POST {url} failed after {tries}; last error: {last}")
