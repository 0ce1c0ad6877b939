"""Gemini CLI's stream-json (`protocol: gemini-stream-json`) as a sans-I/O dialect.

`gemini --output-format stream-json -- MESSAGE` writes one JSON object per line
(checked against Gemini CLI 0.61.0 run here, and its source):

- `init` carries `session_id`: the id to resume with (`--resume ID`);
- assistant `message`s with `delta: true` are chunks of text: each is a
  partial, and the reply is all of them joined (`result` carries no text),
  with a blank line where the text resumes after a tool call. A `message`
  without `delta` is a whole piece of text, taken the same way;
- `tool_use` (`tool_name`, `tool_id`, `parameters`) starts a tool call,
  `tool_result` (`status` success/error, `output`, `error.message`) ends it;
- `result` ends the turn: `status: error` fails it with `error.message`, or,
  when the result has none, the message of the last `error` line of severity
  error (gemini goes on after some of those, a quota notice say, so they do
  not fail the turn by themselves; `warning`s never do); `stats` is the
  turn's usage (tokens, no cost);
- no `result` by the end: the turn did not finish. Gemini exits 0 without
  one when it is interrupted, so the exit code alone would call it a success.

The turn's fetched files are named in the prompt as `@PATH` (a space escaped
with a backslash), the syntax Gemini CLI reads files by, images among them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ..turn import Turn
from .base import DialectContext, Handler, JsonLinesDialect, number, shorten, text_of
from .coding_agents import UNFINISHED, Paragraphs, SessionIds, ToolCalls
from .events import ErrorEvent, Event, ReplyEvent, Usage, UsageEvent
from .settings import JsonSettings


class GeminiStream(JsonLinesDialect):
    """One turn of Gemini CLI (see the module docstring)."""

    name: ClassVar[str] = "gemini-stream-json"
    Settings: ClassVar[type] = JsonSettings
    mention: ClassVar[str] = "@{path}"  # Gemini CLI reads a file named `@path` in its prompt (images and PDFs too)
    __slots__ = ("_sessions", "_text", "_tools", "_last_error", "_finished")

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        self._sessions = SessionIds()
        self._text = Paragraphs(keep=True)
        self._tools = ToolCalls()
        self._last_error = ""  # the last error line of severity error
        self._finished = False

    def _message(self, message: Mapping[str, Any]) -> list[Event]:
        text = message.get("content")
        if type(text) is str and text and message.get("role") == "assistant":
            return [self._text.add(text)]
        return []

    def _tool_use(self, message: Mapping[str, Any]) -> list[Event]:
        self._text.pause()
        return self._tools.started(
            text_of(message.get("tool_name")), message.get("parameters"), text_of(message.get("tool_id"))
        )

    def _init(self, message: Mapping[str, Any]) -> list[Event]:
        return self._sessions.report(message.get("session_id"))

    def _error(self, message: Mapping[str, Any]) -> list[Event]:
        if message.get("severity") == "error" and (text := text_of(message.get("message")).strip()):
            self._last_error = shorten(text, 2000)
        return []

    def finish(self) -> list[Event]:
        if self._finished:
            return []
        return [ErrorEvent(f"{UNFINISHED}: {self._last_error}" if self._last_error else UNFINISHED, unfinished=True)]

    def _tool_result(self, message: Mapping[str, Any]) -> list[Event]:
        failed = message.get("status") == "error"
        error = message.get("error")
        output = message.get("output")
        if failed and isinstance(error, dict) and isinstance(error.get("message"), str):
            output = error["message"]
        return [self._tools.ended(text_of(message.get("tool_id")), failed=failed, output=output)]

    def _result(self, message: Mapping[str, Any]) -> list[Event]:
        self._finished = True
        events: list[Event] = []
        stats = message.get("stats")
        if isinstance(stats, dict):
            events.append(
                UsageEvent(
                    Usage(
                        input_tokens=number(stats.get("input_tokens")),
                        output_tokens=number(stats.get("output_tokens")),
                        cached_input_tokens=number(stats.get("cached")),
                        total_tokens=number(stats.get("total_tokens")),
                    )
                )
            )
        if message.get("status") == "error":
            error = message.get("error")
            text = text_of(error.get("message")).strip() if isinstance(error, dict) else ""
            events.append(ErrorEvent(text or self._last_error or "the agent reported an error"))
        else:
            events.append(ReplyEvent(self._text.text))
        return events

    handlers: ClassVar[Mapping[str, Handler]] = {
        "message": _message,
        "tool_use": _tool_use,
        "tool_result": _tool_result,
        "init": _init,
        "error": _error,
        "result": _result,
    }
