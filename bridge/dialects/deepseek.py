"""`deepseek exec --output-format stream-json` (`protocol: deepseek-stream-json`) as a sans-I/O dialect.

DeepSeek TUI (`Hmbown/DeepSeek-TUI`, the `deepseek` command; `ExecStreamEvent`
in `crates/tui/src/main.rs`, v0.8) writes, one JSON object per line:

- `content` `{content}`: a delta of the answer, shown as it comes; the reply
  is all of them joined.
- `tool_use` `{name, id, input}` / `tool_result` `{id, output, status:
  success|error}`: tool calls.
- `error` `{error}`: an engine error; it may be recovered from, so it fails
  the turn only when the turn's status says so.
- `session_capture` `{content}`: the id the session was saved under — pass it
  back with `--resume`.
- `metadata` `{meta: {model, input_tokens, output_tokens, session_id,
  status}}`: the turn's usage and how it ended (`completed`, `failed`,
  `interrupted`). deepseek exits 0 either way, so a status other than
  `completed` is the failure, with the last `error` as its text.
- `done`: the end. A stream without it did not finish its turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ..turn import Turn
from .base import DialectContext, Handler, JsonLinesDialect, shorten, text_of
from .coding_agents import OUTPUT_CHARS, FirstSession, Paragraphs, ToolCall, ToolCalls, token_usage, tool_title
from .events import ActivityEvent, ErrorEvent, Event, ReplyEvent, UsageEvent


class DeepseekStreamJson(JsonLinesDialect):
    """The dialect; see the module docstring for the mapping."""

    name: ClassVar[str] = "deepseek-stream-json"
    __slots__ = ("session", "text", "tools", "last_error", "failed", "done")

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        self.session = FirstSession()
        self.text = Paragraphs(keep=True)
        self.tools = ToolCalls()
        self.last_error = ""
        self.failed = False
        self.done = False

    def on_content(self, message: Mapping[str, Any]) -> list[Event]:
        content = text_of(message.get("content"))
        return [self.text.add(content)] if content else []

    def on_tool_use(self, message: Mapping[str, Any]) -> list[Event]:
        call_id, tool = text_of(message.get("id")), text_of(message.get("name"))
        self.tools.remember(call_id, ToolCall(tool))
        return [
            ActivityEvent("tool", tool=tool, title=tool_title(message.get("input")), status="started", call_id=call_id)
        ]

    def on_tool_result(self, message: Mapping[str, Any]) -> list[Event]:
        call_id = text_of(message.get("id"))
        call = self.tools.forget(call_id)
        return [
            ActivityEvent(
                "tool",
                text=shorten(text_of(message.get("output")), OUTPUT_CHARS),
                tool=call.tool if call is not None else "",
                status="failed" if message.get("status") == "error" else "completed",
                call_id=call_id,
            )
        ]

    def on_error(self, message: Mapping[str, Any]) -> list[Event]:
        self.last_error = text_of(message.get("error")) or self.last_error
        return []

    def on_session_capture(self, message: Mapping[str, Any]) -> list[Event]:
        return self.session.see(message.get("content"))

    def on_done(self, message: Mapping[str, Any]) -> list[Event]:
        self.done = True
        return [] if self.failed else [ReplyEvent(self.text.text)]

    def on_metadata(self, message: Mapping[str, Any]) -> list[Event]:
        meta = message.get("meta")
        if not isinstance(meta, dict):
            return []
        events = self.session.see(meta.get("session_id"))
        usage = token_usage(fresh_input=meta.get("input_tokens"), output=meta.get("output_tokens"))
        if usage is not None:
            events.append(UsageEvent(usage))
        status = meta.get("status")
        if isinstance(status, str) and status and status != "completed":
            self.failed = True
            events.append(ErrorEvent(self.last_error or f"deepseek ended the turn: {status}"))
        return events

    def finish(self) -> list[Event]:
        if self.done or self.failed:
            return []
        return [
            ErrorEvent(self.last_error or "deepseek ended without finishing its turn (no done event)", unfinished=True)
        ]

    handlers: ClassVar[Mapping[str, Handler]] = {
        "content": on_content,
        "tool_use": on_tool_use,
        "tool_result": on_tool_result,
        "error": on_error,
        "session_capture": on_session_capture,
        "metadata": on_metadata,
        "done": on_done,
    }
