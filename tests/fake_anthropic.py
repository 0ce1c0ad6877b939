"""A fake Anthropic Messages API for Claude Code (`ANTHROPIC_BASE_URL`), with canned scenarios.

`POST /v1/messages` with `"stream": true` is answered with the Messages API's
event sequence (`message_start`, `content_block_start`, `content_block_delta`
× n, `content_block_stop`, `message_delta`, `message_stop`); a request without
`stream` gets one JSON message. Scenarios:

- `text`: "Hello from fake Claude." in three text deltas;
- `thinking`: a thinking block in two deltas, then the text "42";
- `tool`: "Let me run it." and a `Bash` tool call (`echo hi`, or the command given); the request
  that carries its `tool_result` is answered "The tool said: <its output>";
- `unauthorized`: HTTP 401 with an `authentication_error`;
- `retry`: the stream breaks after a text delta with an `overloaded_error`
  event; Claude Code then asks again without `stream`, and gets `text`'s text whole;
- `overloaded`: HTTP 529 (Claude Code retries this; tests set
  `CLAUDE_CODE_MAX_RETRIES=0`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from fake_api import Answer, Events, FakeApi, Json, Request

TEXT_PIECES = ["Hello", " from", " fake Claude."]
TEXT_REPLY = "".join(TEXT_PIECES)
MODEL = "claude-fake-1"
USAGE = {"input_tokens": 100, "output_tokens": 1, "cache_read_input_tokens": 7, "cache_creation_input_tokens": 0}


def prompts(request: Request) -> list[str]:
    """The text of every user message's last text block, oldest first (the prompt is the last one's)."""
    texts = []
    for message in request.body.get("messages", []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
            continue
        blocks = [block.get("text", "") for block in content or [] if block.get("type") == "text"]
        if blocks:
            texts.append(blocks[-1])
    return texts


def tool_results(request: Request) -> list[dict[str, Any]]:
    """The tool_result blocks of the last user message."""
    users = [message for message in request.body.get("messages", []) if message.get("role") == "user"]
    content = users[-1].get("content") if users else None
    return [block for block in content or [] if isinstance(block, dict) and block.get("type") == "tool_result"]


def message_stream(blocks: list[tuple[str, Any]], stop_reason: str = "end_turn") -> Events:
    """The stream of one assistant message made of `blocks`: ("text", [pieces]), ("thinking", [pieces]),
    ("tool_use", {"id", "name", "input"})."""
    events: list[tuple[str | None, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": MODEL,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": USAGE,
                },
            },
        )
    ]
    for index, (kind, value) in enumerate(blocks):
        if kind == "tool_use":
            start = {"type": "tool_use", "id": value["id"], "name": value["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(value["input"])}]
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": piece} for piece in value]
            deltas.append({"type": "signature_delta", "signature": "c2lnbmF0dXJl"})
        else:
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in value]
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        events.extend(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}) for delta in deltas
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": 12},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return Events(events)


def answer(scenario: str, command: str = "echo hi") -> Any:
    """The answer function of `scenario` for `FakeApi` (`command`: what the `tool` scenario runs)."""

    streams = 0  # streaming requests answered so far

    def respond(request: Request) -> Answer:
        nonlocal streams
        if not request.path.startswith("/v1/messages") or "count_tokens" in request.path:
            return Json(200, {"input_tokens": 10})
        if not request.body.get("stream"):  # a fallback after a broken stream: the text, whole
            return Json(
                200,
                {
                    "id": "msg_whole",
                    "type": "message",
                    "role": "assistant",
                    "model": MODEL,
                    "content": [{"type": "text", "text": TEXT_REPLY}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 5, "output_tokens": 1},
                },
            )
        streams += 1
        if scenario == "unauthorized":
            return Json(
                401, {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
            )
        if scenario == "overloaded":
            return Json(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
        if scenario == "retry" and streams == 1:
            broken = message_stream([("text", ["Draft that will be lost"])]).events[:3]
            return Events(
                [*broken, ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})]
            )
        if scenario == "thinking":
            return message_stream([("thinking", ["The user wants", " a number."]), ("text", ["4", "2"])])
        if scenario == "tool":
            results = tool_results(request)
            if results:
                content = results[0].get("content")
                output = (
                    content
                    if isinstance(content, str)
                    else " ".join(block.get("text", "") for block in content or [] if isinstance(block, dict))
                )
                return message_stream([("text", ["The tool said: ", output])])
            return message_stream(
                [
                    ("text", ["Let me run it."]),
                    (
                        "tool_use",
                        {"id": "toolu_fake1", "name": "Bash", "input": {"command": command, "description": "Run it"}},
                    ),
                ],
                stop_reason="tool_use",
            )
        return message_stream([("text", TEXT_PIECES)])

    return respond


def fake_anthropic(scenario: str = "text", command: str = "echo hi") -> FakeApi:
    """A server for `scenario` (start it with `with`); point Claude Code at it with `claude_env`."""
    return FakeApi(answer(scenario, command))


def claude_env(api: FakeApi, home: str) -> dict[str, str]:
    """The environment that runs Claude Code against `api` with nothing of the user's: fast, no retries, and its
    temporary files (the Bash tool's) under `home` rather than /tmp."""
    os.makedirs(os.path.join(home, "tmp"), exist_ok=True)
    return {
        "HOME": home,
        "TMPDIR": os.path.join(home, "tmp"),
        "ANTHROPIC_BASE_URL": api.url,
        "ANTHROPIC_API_KEY": "sk-fake",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "DISABLE_AUTOUPDATER": "1",
    }
