"""A scripted OpenAI-compatible chat endpoint that plays SearchTeam's roles without a model,
for checking the plumbing (``vf-eval``, ``agents.openai_chat.OpenAIPolicy``) offline.

    python -m mopd_search_team.scripted_endpoint --port 18991

It reads only the chat messages it is sent, as a model would: the role from the system
prompt, the Leader dispatches the question as one sub-task and then selects every
report; a Searcher searches its task and then summarises the first passage; an Answerer
answers with the title of its first piece of evidence. The same messages always give the
same reply. Like real chat APIs it drops the stop string it stopped on. It serves
``POST /v1/chat/completions`` (plain and ``stream``) and ``GET /v1/models`` on
127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "scripted"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def reply(messages: list[dict[str, Any]]) -> str:
    """The scripted turn for a chat (before the stop string is dropped)."""
    system = next((_text(m.get("content")) for m in messages if m.get("role") == "system"), "")
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    last = users[-1] if users else ""
    first = users[0] if users else ""
    roles = {r: system.find(r) for r in ("Leader", "Searcher", "Answerer") if r in system}
    role = min(roles, key=roles.get) if roles else "Answerer"
    if role == "Leader":
        numbers = re.findall(r"^\[(\d+)\] Sub-task:", last, re.MULTILINE)
        if numbers:
            return f"<select>{', '.join(numbers)}</select>"
        question = re.sub(r"^Question:\s*", "", first).strip()
        return f"<subtask>{question}</subtask>"
    if role == "Searcher":
        if "<information>" in last:
            doc = re.search(r"Doc 1\(Title: ([^)]*)\) ([^.]*\.?)", last)
            return f"<summary>{doc.group(1)}: {doc.group(2)}</summary>" if doc else "<summary>nothing found</summary>"
        task = re.sub(r"^Task:\s*", "", first).strip()
        return f"<search>{task}</search>"
    evidence = re.search(r"^\[\d+\] ([^:\n]+):", first, re.MULTILINE)
    return f"<answer>{evidence.group(1).strip() if evidence else 'unknown'}</answer>"


def completion(body: dict[str, Any]) -> tuple[str, str]:
    """``(content, finish_reason)`` for a request body: the scripted turn, its stop string
    dropped when it ends with one the request named."""
    text = reply(body.get("messages") or [])
    stops = body.get("stop") or []
    stops = [stops] if isinstance(stops, str) else stops
    for stop in stops:
        if stop and text.endswith(stop):
            return text[: -len(stop)], "stop"
    return text, "stop"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "mopd"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except ValueError:
            self._json(400, {"error": {"message": "the body is not JSON"}})
            return
        content, finish = completion(body)
        self.server.requests += 1  # type: ignore[attr-defined]
        base = {"id": f"chatcmpl-{self.server.requests}", "created": int(time.time()),  # type: ignore[attr-defined]
                "model": body.get("model", MODEL)}
        usage = {"prompt_tokens": 1, "completion_tokens": max(1, len(content.split())),
                 "total_tokens": 1 + max(1, len(content.split()))}
        if not body.get("stream"):
            self._json(200, {**base, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}]})
            return
        chunks = [{**base, "object": "chat.completion.chunk", "choices": [
                      {"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": None}]},
                  {**base, "object": "chat.completion.chunk", "usage": usage, "choices": [
                      {"index": 0, "delta": {}, "finish_reason": finish}]}]
        data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self._send(200, data.encode(), "text/event-stream")

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, data: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:  # quiet: tests and vf-eval print enough
        pass


class ScriptedEndpoint:
    """The endpoint on a thread: ``with ScriptedEndpoint() as ep: ep.base_url`` (port 0:
    any free one). ``requests`` counts the completions served."""

    def __init__(self, port: int = 0):
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self.server.requests = 0  # type: ignore[attr-defined]
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def requests(self) -> int:
        return self.server.requests  # type: ignore[attr-defined]

    def __enter__(self) -> ScriptedEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mopd_search_team.scripted_endpoint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=18991)
    args = parser.parse_args(argv)
    server = ScriptedEndpoint(args.port).server
    print(f"scripted endpoint on http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
