"""`grok -p … --output-format streaming-json` (`protocol: grok-streaming-json`) as a sans-I/O dialect.

Grok Build (xAI) writes one JSON object per line. From captures of grok
0.2.101 (`--output-format streaming-json`) and the reference runner's adapter:

- `text` `{data}`: a delta of the answer (near token-sized). Each is shown as
  it comes; the reply is all of them joined (`end` carries no text).
- `thought` `{data}`: a delta of reasoning. Consecutive deltas are gathered
  into one thinking activity, reported when something else arrives.
- `end` `{stopReason, sessionId, requestId, usage, num_turns, modelUsage}`:
  the turn is over; `sessionId` is the id to resume with (`-r/--resume`).
  `stopReason: "Cancelled"` is a failure: headless grok cancels a tool call
  it would have to ask permission for (run it with `--always-approve`).
- `error` `{message, sessionId?}`: the turn failed.

`usage` is `{input_tokens, cache_read_input_tokens, output_tokens,
reasoning_tokens, total_tokens}` where the cache reads are not part of
`input_tokens` (the captured totals are input + cache reads + output), so they
are added to it; reasoning is part of `output_tokens`. A stream that ends
without `end` or `error` did not finish its turn. Other types (tool progress
in later versions, `max_turns_reached`) are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ..turn import Turn
from .base import DialectContext, Handler, JsonLinesDialect, number, shorten, text_of
from .coding_agents import THINKING_CHARS, FirstSession, Paragraphs, money, token_usage
from .events import ActivityEvent, ErrorEvent, Event, ReplyEvent, UsageEvent


class GrokStreamingJson(JsonLinesDialect):
    """The dialect; see the module docstring for the mapping."""

    name: ClassVar[str] = "grok-streaming-json"
    __slots__ = ("session", "text", "thought", "thought_chars", "ended", "failed")

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        self.session = FirstSession()
        self.text = Paragraphs(keep=True)
        self.thought: list[str] = []
        self.thought_chars = 0
        self.ended = False
        self.failed = False

    def on_thought(self, message: Mapping[str, Any]) -> list[Event]:
        data = text_of(message.get("data"))
        if data and self.thought_chars < THINKING_CHARS:
            self.thought.append(data)
            self.thought_chars += len(data)
        return []

    def on_text(self, message: Mapping[str, Any]) -> list[Event]:
        events = self.thinking()
        data = text_of(message.get("data"))
        if data:
            events.append(self.text.add(data))
        return events

    def on_end(self, message: Mapping[str, Any]) -> list[Event]:
        self.ended = True
        events = self.thinking()
        events.extend(self.session.see(message.get("sessionId")))
        usage = _usage(message.get("usage"), message.get("total_cost_usd"))
        if usage is not None:
            events.append(usage)
        if message.get("stopReason") == "Cancelled":
            self.failed = True
            events.append(
                ErrorEvent(
                    "grok cancelled the turn (a tool needed a permission that headless grok "
                    "cannot ask for; run it with --always-approve, or allow the tool)"
                )
            )
        else:
            events.append(ReplyEvent(self.text.text))
        return events

    def on_error(self, message: Mapping[str, Any]) -> list[Event]:
        self.failed = True
        events = self.thinking()
        events.extend(self.session.see(message.get("sessionId")))
        events.append(ErrorEvent(text_of(message.get("message")) or "grok reported an error"))
        return events

    def thinking(self) -> list[Event]:
        """The reasoning gathered so far as one activity (nothing when there is none): consecutive thought deltas
        are one thinking activity, reported before whatever comes next."""
        if not self.thought:
            return []
        text = "".join(self.thought)
        self.thought.clear()
        self.thought_chars = 0
        return [ActivityEvent("thinking", text=shorten(text, THINKING_CHARS))] if text.strip() else []

    def finish(self) -> list[Event]:
        events = self.thinking()
        if not self.ended and not self.failed:
            events.append(ErrorEvent("grok ended without finishing its turn (no end event)", unfinished=True))
        return events

    handlers: ClassVar[Mapping[str, Handler]] = {
        "thought": on_thought,
        "text": on_text,
        "end": on_end,
        "error": on_error,
    }


def _usage(usage: Any, cost: Any) -> UsageEvent | None:
    if not isinstance(usage, dict):
        return None
    counted = token_usage(
        fresh_input=usage.get("input_tokens"),
        cache_read=usage.get("cache_read_input_tokens"),
        cache_write=usage.get("cache_creation_input_tokens"),
        output=usage.get("output_tokens"),
        reasoning=usage.get("reasoning_tokens"),
        total=number(usage.get("total_tokens")),
        cost=money(cost),
    )
    return UsageEvent(counted) if counted is not None else None
