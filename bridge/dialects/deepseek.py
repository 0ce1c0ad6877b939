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
from .base import DialectContext, JsonLinesDialect, shorten, text_of
from .coding_agents import OUTPUT_CHARS, TEXT_BOUND, FirstSession, token_usage, tool_title
from .events import ActivityEvent, ErrorEvent, Event, PartialEvent, ReplyEvent, UsageEvent

_MAX_TRACKED_CALLS = 1000


class DeepseekStreamJson(JsonLinesDialect):
    """The dialect; see the module docstring for the mapping."""

    name: ClassVar[str] = "deepseek-stream-json"
    __slots__ = ("session", "text", "text_chars", "tool_names", "last_error", "failed", "done")

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        self.session = FirstSession()
        self.text: list[str] = []
        self.text_chars = 0
        self.tool_names: dict[str, str] = {}
        self.last_error = ""
        self.failed = False
        self.done = False

    def on_object(self, message: Mapping[str, Any]) -> list[Event]:
        kind = message.get("type")
        if kind == "content":
            content = text_of(message.get("content"))
            if not content:
                return []
            if self.text_chars < TEXT_BOUND:
                self.text.append(content)
                self.text_chars += len(content)
            return [PartialEvent(content)]
        if kind == "tool_use":
            call_id, tool = text_of(message.get("id")), text_of(message.get("name"))
            if call_id and len(self.tool_names) < _MAX_TRACKED_CALLS:
                self.tool_names[call_id] = tool
            return [
                ActivityEvent(
                    "tool", tool=tool, title=tool_title(message.get("input")), status="started", call_id=call_id
                )
            ]
        if kind == "tool_result":
            call_id = text_of(message.get("id"))
            return [
                ActivityEvent(
                    "tool",
                    text=shorten(text_of(message.get("output")), OUTPUT_CHARS),
                    tool=self.tool_names.pop(call_id, ""),
                    status="failed" if message.get("status") == "error" else "completed",
                    call_id=call_id,
                )
            ]
        if kind == "error":
            self.last_error = text_of(message.get("error")) or self.last_error
            return []
        if kind == "session_capture":
            return self.session.see(message.get("content"))
        if kind == "metadata":
            return self.on_metadata(message.get("meta"))
        if kind == "done":
            self.done = True
            return [] if self.failed else [ReplyEvent("".join(self.text))]
        return []

    def on_metadata(self, meta: Any) -> list[Event]:
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
