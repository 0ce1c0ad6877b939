"""`pi --mode json` (`protocol: pi-json`) as a sans-I/O dialect.

The pi coding agent (`badlogic/pi-mono`, `packages/coding-agent/docs/json.md`
and the `AgentEvent` / `AssistantMessage` types) writes its session events as
JSON lines:

- `session` `{id, version, cwd}`: the first line; `id` is the session to pass
  back with `--session`.
- `message_start` / `message_update` / `message_end` `{message}`:
  `message_update.assistantMessageEvent` `text_delta` `{delta}` is shown as it
  comes (a new assistant message starts a new paragraph); `thinking_end`
  `{content}` is thinking. `message_end` of an assistant message carries the
  whole message: its text parts are the reply (the last message with text
  wins), its `usage` `{input, output, cacheRead, cacheWrite, totalTokens,
  cost: {total}}` is added up (input buckets are disjoint), and `stopReason`
  `error` / `aborted` with `errorMessage` says the request failed.
- `tool_execution_start` / `tool_execution_end` `{toolCallId, toolName, args,
  result, isError}`: tool calls.
- `agent_end`: the turn is over. It fails when its last assistant message
  failed (pi retries a failed request itself — `auto_retry_*` — so an error
  followed by a good message is not a failure). A stream without `agent_end`
  did not finish its turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ..turn import Turn
from .base import DialectContext, Handler, JsonLinesDialect, shorten, text_of
from .coding_agents import OUTPUT_CHARS, THINKING_CHARS, FirstSession, Paragraphs, token_usage, tool_title
from .events import ActivityEvent, ErrorEvent, Event, ReplyEvent, UsageEvent

_FAILED_STOPS = ("error", "aborted")


class PiJson(JsonLinesDialect):
    """The dialect; see the module docstring for the mapping."""

    name: ClassVar[str] = "pi-json"
    __slots__ = ("session", "text", "last_failure", "ended")

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        self.session = FirstSession()
        self.text = Paragraphs(keep=False)  # a new assistant message starts a new paragraph; the reply comes whole
        self.last_failure = ""  # the last assistant message's error ("" when it went well)
        self.ended = False

    def on_message_update(self, message: Mapping[str, Any]) -> list[Event]:
        update = message.get("assistantMessageEvent")
        if not isinstance(update, dict):
            return []
        kind = update.get("type")
        handler = self.assistant_events.get(kind) if type(kind) is str else None
        return handler(self, update) if handler is not None else []

    def on_text_delta(self, update: Mapping[str, Any]) -> list[Event]:
        delta = text_of(update.get("delta"))
        return [self.text.add(delta)] if delta else []

    def on_thinking_end(self, update: Mapping[str, Any]) -> list[Event]:
        text = text_of(update.get("content"))
        return [ActivityEvent("thinking", text=shorten(text, THINKING_CHARS))] if text.strip() else []

    def on_message_start(self, message: Mapping[str, Any]) -> list[Event]:
        self.text.pause()
        return []

    def on_tool_start(self, message: Mapping[str, Any]) -> list[Event]:
        return [
            ActivityEvent(
                "tool",
                tool=text_of(message.get("toolName")),
                title=tool_title(message.get("args")),
                status="started",
                call_id=text_of(message.get("toolCallId")),
            )
        ]

    def on_tool_end(self, message: Mapping[str, Any]) -> list[Event]:
        return [
            ActivityEvent(
                "tool",
                text=shorten(_content_text(message.get("result")), OUTPUT_CHARS),
                tool=text_of(message.get("toolName")),
                status="failed" if message.get("isError") is True else "completed",
                call_id=text_of(message.get("toolCallId")),
            )
        ]

    def on_session(self, message: Mapping[str, Any]) -> list[Event]:
        return self.session.see(message.get("id"))

    def on_agent_end(self, message: Mapping[str, Any]) -> list[Event]:
        self.ended = True
        return [ErrorEvent(self.last_failure)] if self.last_failure else []

    def on_message_end(self, line: Mapping[str, Any]) -> list[Event]:
        message = line.get("message")
        if not isinstance(message, dict) or message.get("role") != "assistant":
            return []
        events: list[Event] = []
        usage = message.get("usage")
        if isinstance(usage, dict):
            cost = usage.get("cost")
            counted = token_usage(
                fresh_input=usage.get("input"),
                cache_read=usage.get("cacheRead"),
                cache_write=usage.get("cacheWrite"),
                output=usage.get("output"),
                total=usage.get("totalTokens"),
                cost=cost.get("total") if isinstance(cost, dict) else cost,
            )
            if counted is not None:
                events.append(UsageEvent(counted, replace=False))
        if message.get("stopReason") in _FAILED_STOPS:
            self.last_failure = text_of(message.get("errorMessage")) or f"pi's request ended: {message['stopReason']}"
            return events
        self.last_failure = ""
        text = _content_text(message)
        if text.strip():
            events.append(ReplyEvent(text))
        return events

    def finish(self) -> list[Event]:
        if self.ended:
            return []
        return [
            ErrorEvent(self.last_failure or "pi ended without finishing its turn (no agent_end event)", unfinished=True)
        ]

    handlers: ClassVar[Mapping[str, Handler]] = {
        "message_update": on_message_update,
        "message_start": on_message_start,
        "message_end": on_message_end,
        "tool_execution_start": on_tool_start,
        "tool_execution_end": on_tool_end,
        "session": on_session,
        "agent_end": on_agent_end,
    }
    assistant_events: ClassVar[Mapping[str, Handler]] = {
        "text_delta": on_text_delta,
        "thinking_end": on_thinking_end,
    }
    """The `assistantMessageEvent` of a `message_update`, by type."""


def _content_text(holder: Any) -> str:
    """The text parts of a message or tool result (`{content: [{type: "text", text}, …]}`) joined."""
    if not isinstance(holder, dict):
        return ""
    content = holder.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        text_of(part.get("text")) for part in content if isinstance(part, dict) and part.get("type") == "text"
    )
