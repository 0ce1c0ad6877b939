"""`dsh --profile headless --json` (`protocol: dsh-json`) as a sans-I/O dialect.

DeepSeek Harness (`dsh` ≥ 0.1.6-alpha.1, checked by the reference runner's
bridge against 0.1.7-rc.2) writes its run events as JSON lines:

- `session` `{sessionId, cwd}`: the opening frame; the id to pass back with
  `--session-id` (dsh then adopts that session — it must exist and belong to
  the same working directory).
- `status` `{phase, usage?}`: `phase: "step_end"` carries one step's token
  counts `{inputTokens, outputTokens, totalTokens, cacheReadTokens,
  cacheWriteTokens, reasoningTokens}` in disjoint input buckets; they are
  added up over the turn.
- `text` `{text}`: committed answer text, shown as it comes.
- `thinking` `{text}`: thinking.
- `final` `{text}`: the answer; always written when a turn ends, even one that
  ends in error (then dsh exits non-zero, which fails the turn).
- `error` `{message}`: the run failed (unknown session, missing credential…).

dsh exits 0 when stopped by SIGTERM, so the frames, not the exit code, say
whether the turn finished: a stream without `final` or `error` did not.
Other frames (tool calls, results) are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ..turn import Turn
from .base import DialectContext, Handler, JsonLinesDialect, shorten, text_of
from .coding_agents import THINKING_CHARS, FirstSession, token_usage
from .events import ActivityEvent, ErrorEvent, Event, PartialEvent, ReplyEvent, UsageEvent


class DshJson(JsonLinesDialect):
    """The dialect; see the module docstring for the mapping."""

    name: ClassVar[str] = "dsh-json"
    __slots__ = ("session", "done")

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        self.session = FirstSession()
        self.done = False

    def on_text(self, message: Mapping[str, Any]) -> list[Event]:
        text = text_of(message.get("text"))
        return [PartialEvent(text)] if text else []

    def on_status(self, message: Mapping[str, Any]) -> list[Event]:
        usage = message.get("usage")
        if message.get("phase") != "step_end" or not isinstance(usage, dict):
            return []
        counted = token_usage(
            fresh_input=usage.get("inputTokens"),
            cache_read=usage.get("cacheReadTokens"),
            cache_write=usage.get("cacheWriteTokens"),
            output=usage.get("outputTokens"),
            reasoning=usage.get("reasoningTokens"),
            total=usage.get("totalTokens"),
        )
        return [UsageEvent(counted, replace=False)] if counted is not None else []

    def on_session(self, message: Mapping[str, Any]) -> list[Event]:
        return self.session.see(message.get("sessionId"))

    def on_thinking(self, message: Mapping[str, Any]) -> list[Event]:
        text = text_of(message.get("text"))
        return [ActivityEvent("thinking", text=shorten(text, THINKING_CHARS))] if text.strip() else []

    def on_final(self, message: Mapping[str, Any]) -> list[Event]:
        self.done = True
        return [ReplyEvent(text_of(message.get("text")))]

    def on_error(self, message: Mapping[str, Any]) -> list[Event]:
        self.done = True
        return [ErrorEvent(text_of(message.get("message")) or "dsh reported an error")]

    def finish(self) -> list[Event]:
        return (
            []
            if self.done
            else [ErrorEvent("dsh ended without finishing its turn (no final message)", unfinished=True)]
        )

    handlers: ClassVar[Mapping[str, Handler]] = {
        "text": on_text,
        "status": on_status,
        "session": on_session,
        "thinking": on_thinking,
        "final": on_final,
        "error": on_error,
    }
