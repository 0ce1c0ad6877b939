"""A fake Anthropic Messages API for Claude Code (`ANTHROPIC_BASE_URL`), with canned scenarios.

`POST /v1/messages` with `"stream": true` is answered with the Messages API's
event sequence (`message_start`, `content_block_start`, `content_block_delta`
× n, `content_block_stop`, `message_delta`, `message_stop`); a request without
`stream` gets one JSON message. Scenarios:

- `text`: "Hello from fake Claude." in three text deltas;
- `thinking`: a thinking block in two deltas, then the text "42";
- `tool`: "Let me run it." and a `Bash` tool call (`echo hi`, or the command given) for each prompt (a later
  turn's too); the request that carries its `tool_result` is answered "The tool said: <its output>";
- `unauthorized`: HTTP 401 with an `authentication_error`;
- `retry`: the stream breaks after a text delta with an `overloaded_error`
  event; Claude Code then asks again without `stream`, and gets `text`'s text whole;
- `overloaded`: HTTP 529 (Claude Code retries this; tests set
  `CLAUDE_CODE_MAX_RETRIES=0`).
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import yaml
from fake_api import Answer, Events, FakeApi, Json, Request

TEXT_PIECES = ["Hello", " from", " fake Claude."]
TEXT_REPLY = "".join(TEXT_PIECES)
MODEL = "claude-fake-1"
CLI_PROFILES = Path(__file__).resolve().parent.parent / "profiles" / "clis"
USAGE = {"input_tokens": 100, "output_tokens": 1, "cache_read_input_tokens": 7, "cache_creation_input_tokens": 0}


def prompts(request: Request) -> list[str]:
    """The text of every user message's last text block, oldest first (the prompt is the last one's)."""
    texts = []
    for message in request.body.get("messages", []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(said(content))
            continue
        blocks = [block.get("text", "") for block in content or [] if block.get("type") == "text"]
        if blocks:
            texts.append(said(blocks[-1]))
    return texts


def said(text: str) -> str:
    """What the user said in a prompt's `text`: without the sentence that names a warm turn's outbox (an
    instruction, as a model reads it)."""
    return _OUTBOX_NOTE.sub("", text)


_OUTBOX_NOTE = re.compile(r"(?:\n\n)?Files for the user: write them to .*? \(they are sent when the turn ends\)\.")


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
            # Claude Code merges a later turn's prompt into the user message that holds the last tool_result: a
            # prompt without a tool call of its own yet is what asks for one (a fresh id each).
            calls = sum(
                1
                for message in request.body.get("messages", [])
                if message.get("role") == "assistant" and isinstance(message.get("content"), list)
                for block in message["content"]
                if isinstance(block, dict) and block.get("type") == "tool_use"
            )
            results = tool_results(request) if calls >= len(user_texts(request)) else []
            if results:
                return message_stream([("text", ["The tool said: ", result_text(results[-1])])])
            return message_stream(
                [
                    ("text", ["Let me run it."]),
                    (
                        "tool_use",
                        {
                            "id": f"toolu_fake{calls + 1}",
                            "name": "Bash",
                            "input": {"command": command, "description": "Run it"},
                        },
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


def result_text(result: dict[str, Any]) -> str:
    """A `tool_result` block's text (its content is a string, or text blocks)."""
    content = result.get("content")
    if isinstance(content, str):
        return content
    return " ".join(block.get("text", "") for block in content or [] if isinstance(block, dict))


def write_claude_profile(path: Path, api: FakeApi, root: Path, **overrides: Any) -> Path:
    """`path`: the ready claude-sdk profile as shipped, running the cached Claude Code against `api`, its HOME and
    working directory under `root` (`root/home`, `root/work`); `overrides` replace fields."""
    from agents_cache import npm_binary

    home, work = root / "home", root / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    profile = yaml.safe_load((CLI_PROFILES / "claude-sdk.yaml").read_text())
    profile.update(
        command=[str(npm_binary("claude")), *profile["command"][1:]],
        env=claude_env(api, str(home)),
        cwd=str(work),
        kill_grace_secs=5,
        **overrides,
    )
    path.write_text(yaml.safe_dump(profile))
    return path


COLOUR_QUESTION = {
    "questions": [
        {
            "question": "Which colour?",
            "header": "Colour",
            "options": [{"label": "Red", "description": "warm"}, {"label": "Blue", "description": "cool"}],
            "multiSelect": False,
        }
    ]
}


def user_texts(request: Request) -> list[str]:
    """Every text the user wrote in the request's history, oldest first: Claude Code merges a new prompt into the
    user message holding the last tool_result, and adds `<system-reminder>` blocks and interruption notes, so the
    prompts are the user text blocks that are none of those."""
    texts = []
    for message in request.body.get("messages", []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for block in blocks:
            text = block.get("text", "") if isinstance(block, dict) and block.get("type") == "text" else ""
            if text and not text.startswith(("<system-reminder>", "[Request interrupted")):
                texts.append(said(text))
    return texts


class Conversation:
    """The answers of a conversation over many turns and processes, keyed on the prompts (`answer` for
    `FakeApi`): a prompt `run CMD` is answered with a Bash call of CMD (each time the prompt is sent anew, even
    when it says what an earlier one said), `ask colour` with an AskUserQuestion call, and the request that
    carries a tool's result with "The tool said: <its output>"; `slow` blocks until `release` is set
    (`started` says it arrived); anything else gets "reply to <prompt>"."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self._calls: set[tuple[str, int]] = set()  # (prompt, how many times it was in the history) given a call
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> Answer:
        if (
            not request.path.startswith("/v1/messages")
            or "count_tokens" in request.path
            or not request.body.get("stream")
        ):
            return Json(200, {"input_tokens": 10})
        texts = user_texts(request)
        prompt = texts[-1] if texts else ""
        key = (prompt, texts.count(prompt))
        with self._lock:
            fresh = key not in self._calls
            if fresh and (prompt.startswith("run ") or prompt == "ask colour"):
                self._calls.add(key)
                call_id = f"toolu_{len(self._calls)}"
            else:
                fresh = False
        if fresh and prompt == "ask colour":
            return message_stream(
                [("tool_use", {"id": call_id, "name": "AskUserQuestion", "input": COLOUR_QUESTION})], "tool_use"
            )
        if fresh:
            command = prompt.removeprefix("run ")
            return message_stream(
                [
                    ("text", ["Let me run it."]),
                    (
                        "tool_use",
                        {"id": call_id, "name": "Bash", "input": {"command": command, "description": "Run it"}},
                    ),
                ],
                "tool_use",
            )
        results = tool_results(request)
        if results and (prompt.startswith("run ") or prompt == "ask colour"):
            return message_stream([("text", ["The tool said: ", result_text(results[-1])])])
        if prompt == "slow":
            self.started.set()
            self.release.wait(30)
        return message_stream([("text", ["reply to ", prompt])])
