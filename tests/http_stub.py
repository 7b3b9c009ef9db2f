"""A scripted HTTP server on 127.0.0.1 for the tests of our HTTP clients (the retriever's,
the OpenAI-compatible policy's): each POST gets the next scripted answer."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedServer:
    """Answers each POST with the next scripted ``(status, body)``, repeating the last one: a
    str or JSON body (a callable is called with the request's body first), or ``(None, raw)``
    for raw bytes written as the whole answer (a broken status line). Records every request
    as ``(body, headers)``; ``url`` is its root, ``base_url`` the root's ``/v1``."""

    def __init__(self, script):
        self.script = list(script)
        self.requests: list[tuple[dict, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                # HTTP header names are case-insensitive: keep them in one case
                headers = {k.title(): v for k, v in self.headers.items()}
                outer.requests.append((body, headers))
                status, reply = outer.script[min(len(outer.requests), len(outer.script)) - 1]
                if status is None:
                    self.wfile.write(reply)
                    self.close_connection = True
                    return
                reply = reply(body) if callable(reply) else reply
                data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.base_url = f"{self.url}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
