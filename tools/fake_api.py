"""A fake model API on loopback for driving real coding CLIs offline: canned answers, every request recorded.

`FakeApi(answer)` runs an HTTP server on 127.0.0.1 (a free port) in a thread
for as long as its `with` block. Each POST is parsed and recorded in
`requests`, then `answer(request)` says what to send back: a JSON body with a
status, or a 200 `text/event-stream` of server-sent events, written one at a
time like a model streams them. GETs are answered 404 (the CLIs probe the base
URL at start-up and carry on). Family modules (`fake_anthropic`, `fake_gemini`)
build the answers; tests pick a scenario per server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Request:
    """One POST the CLI made: path (with its query), headers (lower-case names) and the JSON body."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass(frozen=True)
class Json:
    status: int
    body: dict[str, Any]


@dataclass(frozen=True)
class Events:
    """A 200 event stream: each item is one SSE event's `data` (a JSON object), with its `event:` name if given."""

    events: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)


Answer = Json | Events


class FakeApi:
    """The server; `url` is its base URL, `requests` what it was sent (in order)."""

    def __init__(self, answer: Callable[[Request], Answer]) -> None:
        self.answer = answer
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        # shutdown() waits for serve_forever to look at its flag, every poll interval (0.5 s unless given)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def posts(self, fragment: str) -> list[Request]:
        """The recorded requests whose path contains `fragment`."""
        with self._lock:
            return [request for request in self.requests if fragment in request.path]

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._send_json(Json(404, {"error": {"code": 404, "message": "not found"}}))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {}
                request = Request(self.path, {name.lower(): value for name, value in self.headers.items()}, body)
                api._record(request)
                answer = api.answer(request)
                if isinstance(answer, Json):
                    self._send_json(answer)
                else:
                    self._send_events(answer)

            def _send_json(self, answer: Json) -> None:
                data = json.dumps(answer.body).encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _send_events(self, answer: Events) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                for name, data in answer.events:
                    head = f"event: {name}\n" if name else ""
                    self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
                    self.wfile.flush()

        return Handler
