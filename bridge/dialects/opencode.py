"""`opencode run --format json` (`protocol: opencode-json`) as a sans-I/O dialect.

From opencode's own `packages/opencode/src/cli/cmd/run.ts`: every line is
`{"type", "timestamp", "sessionID", ...}` where `sessionID` is the session
the run works in (the one to pass back with `--session`). Only parts of that
session are written; the types are

- `text` `{part: {text, time}}`: a text part, written once it is complete
  (no token streaming). Each one is shown as it comes; the last is the reply.
- `reasoning` `{part: {text}}` (with `--thinking`): thinking.
- `tool_use` `{part: {tool, callID, state: {status: completed|error, input,
  output, title, error}}}`: a tool call, written once it finished.
- `step_start` / `step_finish` `{part: {reason, cost, tokens: {input, output,
  reasoning, cache: {read, write}}}}`: one model request; its usage is added up.
- `error` `{error: {name, data: {message}}}`: the session failed (exit 1).
- `done` `{reason: "idle", rejected: [permission…]}`: newer builds only, the
  turn is over; the permissions it auto-rejected are reported as denied tools.

Token buckets are disjoint (`input` excludes cache reads and writes,
`output` excludes reasoning) and are folded as `cli_common` says. Older
builds write no `done`, so a stream without it is not an error here; the
exit code says how the run ended.

`aictrl` is a fork of opencode and speaks the same parts; its dialect
(`aictrl.py`) builds on this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ..turn import Turn
from .base import DialectContext, Handler, JsonLinesDialect, shorten, text_of
from .coding_agents import OUTPUT_CHARS, THINKING_CHARS, FirstSession, Paragraphs, add, token_usage, tool_title
from .events import ActivityEvent, ErrorEvent, Event, ReplyEvent, UsageEvent

_TOOL_STATUS = {"completed": "completed", "error": "failed", "running": "started", "pending": "started"}


def part_of(message: Mapping[str, Any]) -> Mapping[str, Any]:
    part = message.get("part")
    return part if isinstance(part, dict) else {}


def parts_usage(tokens: Any, cost: Any) -> UsageEvent | None:
    """Usage of one opencode-family step or message: `tokens` may be missing or null (not reported)."""
    tokens = tokens if isinstance(tokens, dict) else {}
    cache = tokens.get("cache")
    cache = cache if isinstance(cache, dict) else {}
    usage = token_usage(
        fresh_input=tokens.get("input"),
        cache_read=cache.get("read"),
        cache_write=cache.get("write"),
        output=add(tokens.get("output"), tokens.get("reasoning")),
        reasoning=tokens.get("reasoning"),
        total=tokens.get("total"),
        cost=cost,
    )
    return UsageEvent(usage, replace=False) if usage is not None else None


def error_text(error: Any) -> str:
    """The message of an opencode-family error object (`{name, data: {message}}`), or of a plain string."""
    if isinstance(error, str):
        return error
    if not isinstance(error, dict):
        return ""
    data = error.get("data")
    if isinstance(data, dict) and text_of(data.get("message")):
        return text_of(data.get("message"))
    return text_of(error.get("message")) or text_of(error.get("name"))


class OpencodeJson(JsonLinesDialect):
    """The dialect; see the module docstring for the mapping."""

    name: ClassVar[str] = "opencode-json"
    family: ClassVar[str] = "opencode"
    __slots__ = ("session", "text", "reply", "failed", "finished")

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        self.session = FirstSession()
        self.text = Paragraphs(keep=False)  # each text part a paragraph
        self.reply = ""  # the last text part shown (never blank): the reply, given when the stream ends
        self.failed = ""  # the last error reported, so a repeat of it is not reported again
        self.finished = False

    def on_object(self, message: Mapping[str, Any]) -> list[Event]:
        events = self.session.see(message.get("sessionID")) if not self.session.session_id else []
        events.extend(super().on_object(message))
        return events

    def is_ours(self, part: Mapping[str, Any]) -> bool:
        """Whether a part belongs to the turn's session rather than to a sub-agent's."""
        owner, ours = part.get("sessionID"), self.session.session_id
        return not isinstance(owner, str) or not owner or not ours or owner == ours

    def on_text(self, message: Mapping[str, Any]) -> list[Event]:
        part = part_of(message)
        text = text_of(part.get("text"))
        if not text.strip() or not self.is_ours(part):
            return []
        self.text.pause()
        self.reply = text
        return [self.text.add(text)]

    def on_reasoning(self, message: Mapping[str, Any]) -> list[Event]:
        part = part_of(message)
        text = text_of(part.get("text"))
        if not text.strip() or not self.is_ours(part):
            return []
        return [ActivityEvent("thinking", text=shorten(text, THINKING_CHARS))]

    def on_tool_use(self, message: Mapping[str, Any]) -> list[Event]:
        part = part_of(message)
        state = part.get("state")
        state = state if isinstance(state, dict) else {}
        status = _TOOL_STATUS.get(text_of(state.get("status")), "completed")
        if status == "failed":
            detail = text_of(state.get("error"))
        else:
            metadata = state.get("metadata")
            detail = text_of(state.get("output")) or (
                text_of(metadata.get("output")) if isinstance(metadata, dict) else ""
            )
        tool = text_of(part.get("tool"))
        title = shorten(text_of(state.get("title")), 120) or tool_title(state.get("input"))
        return [
            ActivityEvent(
                "tool",
                text=shorten(detail, OUTPUT_CHARS),
                tool=tool,
                title=title,
                status=status,
                call_id=text_of(part.get("callID")),
            )
        ]

    def on_step_finish(self, message: Mapping[str, Any]) -> list[Event]:
        part = part_of(message)
        usage = parts_usage(part.get("tokens"), part.get("cost"))
        return [usage] if usage is not None else []

    def on_error(self, message: Mapping[str, Any]) -> list[Event]:
        return self.fail(error_text(message.get("error")))

    def on_done(self, message: Mapping[str, Any]) -> list[Event]:
        self.finished = True
        rejected = message.get("rejected")
        if not isinstance(rejected, list):
            return []
        return [
            ActivityEvent("tool", tool=permission, status="denied")
            for permission in rejected
            if isinstance(permission, str) and permission
        ]

    def finish(self) -> list[Event]:
        return [ReplyEvent(self.reply)] if self.reply else []

    def fail(self, text: str) -> list[Event]:
        """The turn failed with `text` (a generic one when the agent gave none); a repeat is not reported twice."""
        text = text or f"{self.family} reported an error"
        if text == self.failed:
            return []
        self.failed = text
        return [ErrorEvent(text)]

    handlers: ClassVar[Mapping[str, Handler]] = {
        "text": on_text,
        "reasoning": on_reasoning,
        "tool_use": on_tool_use,
        "step_finish": on_step_finish,
        "error": on_error,
        "done": on_done,
    }
