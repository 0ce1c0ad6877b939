"""`kimi --print --output-format=stream-json` (`protocol: kimi-stream-json`) as a sans-I/O dialect.

Kimi Code CLI prints whole messages, one JSON object per line, in its own
message format (`docs/*/customization/print-mode.md`, and the `JsonPrinter`
of `src/kimi_cli/ui/print/visualize.py`):

- `{"role": "assistant", "content": …, "tool_calls": [{id, function:
  {name, arguments}}]?}`: an assistant message. `content` is a string when
  the message is one text part, else a list of parts — `{"type": "text",
  "text"}` and `{"type": "think", "think"}` (thinking models). Each message's
  text is shown as it comes; the last one is the reply. Tool calls are
  reported as started.
- `{"role": "tool", "tool_call_id", "content"}`: the tool's result; a
  content that starts with `<system>ERROR:` is a failed call.
- Notifications and plan displays (objects without `role`) are ignored.

Kimi names no session in this output: the session is the one the profile
passes with `--session` (`{{NEW_SESSION_ID}}` for a new one, `{{SESSION_ID}}`
to resume; kimi creates a session it does not know). When a run fails, kimi
prints the error as a plain line on stdout (`print(str(e))`) and exits 1 (or
75 when a retry may help); that line is the turn's error. There is no usage
and no terminal event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ..turn import Turn
from .base import DialectContext, Handler, JsonLinesDialect, shorten, text_of
from .coding_agents import OUTPUT_CHARS, THINKING_CHARS, Paragraphs, ToolCall, ToolCalls, tool_title
from .events import ActivityEvent, ErrorEvent, Event, ReplyEvent


class KimiStreamJson(JsonLinesDialect):
    """The dialect; see the module docstring for the mapping."""

    name: ClassVar[str] = "kimi-stream-json"
    kind_key = "role"
    __slots__ = ("tools", "text", "reply", "error_line")

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        self.tools = ToolCalls()  # to name a call's result
        self.text = Paragraphs(keep=False)  # each message a paragraph
        self.reply = ""  # the last message's text (never blank), given as the reply when the stream ends
        self.error_line = ""

    def on_assistant(self, message: Mapping[str, Any]) -> list[Event]:
        events: list[Event] = []
        content = message.get("content")
        if type(content) is str:  # most messages: one text part
            text = content
        else:
            texts: list[str] = []
            for part in content if isinstance(content, list) else ():
                if not isinstance(part, dict):
                    continue
                kind = part.get("type")
                if kind == "text":
                    texts.append(text_of(part.get("text")))
                elif kind == "think" and (thought := text_of(part.get("think"))).strip():
                    events.append(ActivityEvent("thinking", text=shorten(thought, THINKING_CHARS)))
            text = "".join(texts)
        if text.strip():
            self.text.pause()
            events.append(self.text.add(text))
            self.reply = text
        calls = message.get("tool_calls")
        if calls is None:
            return events
        for call in calls if isinstance(calls, list) else ():
            if not isinstance(call, dict):
                continue
            function = call.get("function")
            function = function if isinstance(function, dict) else {}
            call_id, tool = text_of(call.get("id")), text_of(function.get("name"))
            self.tools.remember(call_id, ToolCall(tool))
            events.append(
                ActivityEvent(
                    "tool", tool=tool, title=tool_title(function.get("arguments")), status="started", call_id=call_id
                )
            )
        return events

    def on_tool_result(self, message: Mapping[str, Any]) -> list[Event]:
        call_id = text_of(message.get("tool_call_id"))
        content = message.get("content")
        if isinstance(content, list):
            text = "".join(
                text_of(part.get("text")) for part in content if isinstance(part, dict) and part.get("type") == "text"
            )
        else:
            text = text_of(content)
        failed = text.lstrip().startswith("<system>ERROR:")
        call = self.tools.forget(call_id)
        return [
            ActivityEvent(
                "tool",
                text=shorten(text, OUTPUT_CHARS),
                tool=call.tool if call is not None else "",
                status="failed" if failed else "completed",
                call_id=call_id,
            )
        ]

    def on_other_line(self, line: str) -> list[Event]:
        if line.strip():
            self.error_line = line.strip()
        return []

    def finish(self) -> list[Event]:
        events: list[Event] = [ReplyEvent(self.reply)] if self.reply else []
        if self.error_line:
            events.append(ErrorEvent(self.error_line))
        return events

    handlers: ClassVar[Mapping[str, Handler]] = {"assistant": on_assistant, "tool": on_tool_result}
