"""A fake OpenAI Responses API on loopback, so the real Codex CLI (`codex exec`, `codex-acp`) runs offline.

    with OpenAIResponses() as api:
        write_codex_home(home, api.base_url)      # config.toml: this server, no retries, fail fast
        ... codex POSTs /v1/responses, streamed back as server-sent events ...
        api.requests                              # every request codex made, in order

What the fake model does is chosen by the prompt — the text of the last user
message of the request's `input` — so one server serves every test, at once.
Its first word names the scenario, the rest is the scenario's argument:

    say TEXT           answer TEXT, streamed a few words per delta
    think TEXT         a reasoning item (summary "Thinking about: TEXT"), then the answer TEXT
    run CMD            call the tool exec_command {"cmd": CMD}; when codex sends the command's
                       output back, answer "ran: OUTPUT"
    escalate CMD       the same, asking for sandbox_permissions "require_escalated" (the call codex
                       turns into an approval request when a client can answer one, as over ACP)
    patch PATH TEXT    call the custom tool apply_patch, adding the file PATH (relative to codex's cwd) with the
                       line TEXT; when codex sends the patch's outcome back, answer "patched: OUTPUT"
    ask ID Q?|A|B      call request_user_input with one question (id ID, text Q?, options A and B, free text
                       allowed); when codex sends the answers back, answer "answered: OUTPUT" (Plan mode only)
    fail STATUS TEXT   answer HTTP STATUS with an OpenAI error body whose message is TEXT
    anything else      answer "echo: PROMPT"

Every response reports the same usage (`USAGE`); codex adds them up over a
thread. The wire format follows what codex 0.169.0 accepts (a
`response.completed` must carry the response's `id`); the research notes
(`json-clis.md` §1.4) have the captured exchanges this is modelled on.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count
from pathlib import Path
from typing import Any

USAGE = {
    "input_tokens": 100,
    "input_tokens_details": {"cached_tokens": 7},
    "output_tokens": 20,
    "output_tokens_details": {"reasoning_tokens": 3},
    "total_tokens": 120,
}
MODEL = "gpt-5.5"  # in codex's bundled model list: no "model metadata not found" warning


@dataclass(frozen=True)
class Request:
    """One request as the server received it."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any

    def user_texts(self) -> list[str]:
        """The text of every user message in `input`, in order (codex's own context messages included)."""
        return [text for role, text in _messages(self.body) if role == "user"]

    def assistant_texts(self) -> list[str]:
        return [text for role, text in _messages(self.body) if role == "assistant"]

    @property
    def prompt(self) -> str:
        return _prompt(self.body)

    def input_images(self) -> list[str]:
        """The `image_url` of every `input_image` part of a user message in `input`, in order (data: URLs)."""
        items = self.body.get("input") if isinstance(self.body, dict) else None
        return [
            str(part.get("image_url"))
            for item in (items if isinstance(items, list) else ())
            if isinstance(item, dict) and item.get("role") == "user" and isinstance(item.get("content"), list)
            for part in item["content"]
            if isinstance(part, dict) and part.get("type") == "input_image"
        ]


@dataclass
class Stream:
    """A 200 answer: these events as server-sent events."""

    events: list[dict[str, Any]]


@dataclass
class Failure:
    """An HTTP error answer with an OpenAI error body."""

    status: int
    message: str


class OpenAIResponses:
    """The server: start it with `with`, point codex at `base_url`; `requests` records what came in."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._numbers = count(1)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        # A short poll: `shutdown()` waits for the loop to notice (0.5 s by default).
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-openai", daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> OpenAIResponses:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def responses_requests(self) -> list[Request]:
        with self._lock:
            return [request for request in self.requests if request.path.endswith("/responses")]

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def answer(self, body: Any) -> Stream | Failure:
        """What the fake model answers to one request body (see the module docstring)."""
        with self._lock:
            number = next(self._numbers)
        prompt = _prompt(body)
        word, _, argument = prompt.strip().partition(" ")
        response_id = f"resp_{number}"
        if word == "fail":
            status, _, message = argument.partition(" ")
            return Failure(int(status), message)
        if word in ("run", "escalate"):
            output = _tool_output(body)
            if output is None:
                arguments: dict[str, Any] = {"cmd": argument}
                if word == "escalate":
                    arguments.update(sandbox_permissions="require_escalated", justification="the test asks for it")
                return Stream(function_call_events(response_id, "exec_command", arguments, f"call_{number}"))
            return Stream(message_events(response_id, "ran: " + _command_output(output)))
        if word == "patch":
            output = _tool_output(body)
            if output is None:
                path, _, line = argument.partition(" ")
                patch = f"*** Begin Patch\n*** Add File: {path}\n+{line}\n*** End Patch\n"
                return Stream(custom_tool_call_events(response_id, "apply_patch", patch, f"call_{number}"))
            return Stream(message_events(response_id, "patched: " + output.strip()))
        if word == "ask":
            output = _tool_output(body)
            if output is None:
                question_id, _, rest = argument.partition(" ")
                question, *options = rest.split("|")
                asked = {
                    "id": question_id,
                    "header": question_id.title(),
                    "question": question,
                    "options": [{"label": option, "description": f"pick {option}"} for option in options],
                }
                return Stream(
                    function_call_events(response_id, "request_user_input", {"questions": [asked]}, f"call_{number}")
                )
            return Stream(message_events(response_id, "answered: " + output))
        if word == "say":
            return Stream(message_events(response_id, argument))
        if word == "think":
            return Stream(reasoning_events(response_id, f"Thinking about: {argument}", argument))
        return Stream(message_events(response_id, "echo: " + prompt))


# --------------------------------------------------------------------------- what the model streams


def created(response_id: str) -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": response_id, "object": "response", "status": "in_progress"}}


def completed(response_id: str) -> dict[str, Any]:
    return {
        "type": "response.completed",
        "response": {"id": response_id, "object": "response", "status": "completed", "usage": USAGE},
    }


def message_items(text: str, item_id: str, index: int = 0) -> list[dict[str, Any]]:
    """An assistant message, its text streamed a few words per delta."""
    words = text.split(" ")
    deltas = [
        " ".join(words[start : start + 3]) + (" " if start + 3 < len(words) else "")
        for start in range(0, len(words), 3)
    ]
    events: list[dict[str, Any]] = [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []},
        },
        {
            "type": "response.content_part.added",
            "item_id": item_id,
            "output_index": index,
            "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
    ]
    events += [
        {
            "type": "response.output_text.delta",
            "item_id": item_id,
            "output_index": index,
            "content_index": 0,
            "delta": delta,
        }
        for delta in deltas
    ]
    events += [
        {
            "type": "response.output_text.done",
            "item_id": item_id,
            "output_index": index,
            "content_index": 0,
            "text": text,
        },
        {
            "type": "response.output_item.done",
            "output_index": index,
            "item": {
                "type": "message",
                "id": item_id,
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            },
        },
    ]
    return events


def message_events(response_id: str, text: str) -> list[dict[str, Any]]:
    return [created(response_id), *message_items(text, f"msg_{response_id}"), completed(response_id)]


def reasoning_events(response_id: str, summary: str, answer: str) -> list[dict[str, Any]]:
    item_id = f"rs_{response_id}"
    part = {"type": "summary_text", "text": summary}
    return [
        created(response_id),
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"type": "reasoning", "id": item_id, "summary": []},
        },
        {
            "type": "response.reasoning_summary_part.added",
            "item_id": item_id,
            "output_index": 0,
            "summary_index": 0,
            "part": {"type": "summary_text", "text": ""},
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": item_id,
            "output_index": 0,
            "summary_index": 0,
            "delta": summary,
        },
        {
            "type": "response.reasoning_summary_text.done",
            "item_id": item_id,
            "output_index": 0,
            "summary_index": 0,
            "text": summary,
        },
        {
            "type": "response.reasoning_summary_part.done",
            "item_id": item_id,
            "output_index": 0,
            "summary_index": 0,
            "part": part,
        },
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {"type": "reasoning", "id": item_id, "summary": [part], "encrypted_content": None},
        },
        *message_items(answer, f"msg_{response_id}", index=1),
        completed(response_id),
    ]


def function_call_events(
    response_id: str, name: str, arguments: Mapping[str, Any], call_id: str
) -> list[dict[str, Any]]:
    item_id = f"fc_{response_id}"
    encoded = json.dumps(arguments)
    half = len(encoded) // 2
    item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name}
    return [
        created(response_id),
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "arguments": "", "status": "in_progress"},
        },
        *(
            {"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": 0, "delta": piece}
            for piece in (encoded[:half], encoded[half:])
        ),
        {"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": 0, "arguments": encoded},
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {**item, "arguments": encoded, "status": "completed"},
        },
        completed(response_id),
    ]


def custom_tool_call_events(response_id: str, name: str, tool_input: str, call_id: str) -> list[dict[str, Any]]:
    """A call of a free-form ("custom") tool, as codex's apply_patch is: the input is plain text, not JSON."""
    item_id = f"ctc_{response_id}"
    item = {"type": "custom_tool_call", "id": item_id, "call_id": call_id, "name": name}
    return [
        created(response_id),
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "input": "", "status": "in_progress"},
        },
        {"type": "response.custom_tool_call_input.delta", "item_id": item_id, "output_index": 0, "delta": tool_input},
        {"type": "response.custom_tool_call_input.done", "item_id": item_id, "output_index": 0, "input": tool_input},
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {**item, "input": tool_input, "status": "completed"},
        },
        completed(response_id),
    ]


# --------------------------------------------------------------------------- codex's side


def write_codex_home(home: Path, base_url: str) -> Path:
    """A CODEX_HOME whose config sends codex to `base_url` and makes every failure fail at once.

    No request or stream retries (a 5xx would otherwise be retried for ~25 s),
    no unbounded reconnects (a refused connection would be retried for ever),
    a short idle limit on the stream, and no analytics. The provider needs no
    API key, so nothing but CODEX_HOME has to reach codex.
    """
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f"""\
model = "{MODEL}"
model_provider = "fake"

[model_providers.fake]
name = "Fake OpenAI"
base_url = "{base_url}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 5000

[features]
unbounded_connection_retries = false

[analytics]
enabled = false
""")
    return home


# --------------------------------------------------------------------------- plumbing


def _messages(body: Any) -> Iterator[tuple[str, str]]:
    items = body.get("input") if isinstance(body, dict) else None
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and item.get("type") == "message":
            content = item.get("content")
            texts = (
                [part.get("text", "") for part in content if isinstance(part, dict)]
                if isinstance(content, list)
                else []
            )
            yield str(item.get("role")), "".join(texts)


def _prompt(body: Any) -> str:
    """The text of the last user message: what the user said this turn (without the sentence naming a warm turn's
    outbox, an instruction as a model reads it)."""
    texts = [text for role, text in _messages(body) if role == "user"]
    return _OUTBOX_NOTE.sub("", texts[-1]).strip() if texts else ""


_OUTBOX_NOTE = re.compile(r"Files for the user: write them to .*? \(they are sent when the turn ends\)\.")


def _tool_output(body: Any) -> str | None:
    """The output of the tool call this turn made, once codex sends it back (after the prompt), else None."""
    items = body.get("input") if isinstance(body, dict) else None
    output = None
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message" and item.get("role") == "user":
            output = None  # an output before the latest prompt belongs to an earlier turn
        elif item.get("type") in ("function_call_output", "custom_tool_call_output"):
            output = str(item.get("output"))
    return output


def _command_output(output: str) -> str:
    """What the command printed: codex sends it after a header ("Chunk ID: …\\nOutput:\\n")."""
    _, marker, printed = output.partition("Output:\n")
    return (printed if marker else output).strip()


def _handler_for(api: OpenAIResponses) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows what fails
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            api.record(Request("POST", self.path, dict(self.headers), body))
            if not self.path.endswith("/responses"):
                self._send_json(404, {"error": {"message": f"no such endpoint: {self.path}"}})
                return
            answer = api.answer(body)
            if isinstance(answer, Failure):
                self._send_json(
                    answer.status, {"error": {"message": answer.message, "type": "invalid_request_error", "code": None}}
                )
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for event in answer.events:
                self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()

        def do_GET(self) -> None:
            api.record(Request("GET", self.path, dict(self.headers), None))
            self._send_json(404, {"error": {"message": f"no such endpoint: {self.path}"}})

        def _send_json(self, status: int, payload: Mapping[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            self.wfile.write(data)

    return Handler
