"""`aictrl run --format json` (`protocol: aictrl-ndjson`) as a sans-I/O dialect.

aictrl is a fork of opencode (`github.com/aictrl-dev/cli`), so its parts —
`text`, `reasoning`, `tool_use` — are opencode's (see `opencode.py`). What it
adds, from its `EVENTS.md` (schema "1") and `packages/cli/src/cli/cmd/run.ts`
(0.4.1):

- Every line carries the envelope `{type, timestamp, sessionID, …}`; newer
  builds add `schemaVersion` and `invocationID` to every line. `sessionID` is
  the primary session's, from `session_start` on: the id to resume with
  (`--session`). Sub-agents' parts carry their own `part.sessionID`: their
  tool calls are shown, their text never becomes the reply.
- `message_complete` `{tokens: {total?, input, output, reasoning, cache:
  {read, write}} | null, cost}`: usage per assistant message, added up over
  the turn (`cost` is a number in the code, an object of numbers in the seed;
  both are summed; `tokens: null` means the usage is missing and nothing is
  counted). `step_finish` repeats the per-step share of the same
  usage and is not counted again.
- `permission_rejected` / `permission_granted` `{callID, tool, permission,
  patterns, input}`: a tool denied (headless mode auto-rejects what no rule
  allows) or allowed.
- Errors: `session_error` `{reason, code, message}` (the primary session
  ended abnormally), the raw `error` `{error: {name, data: {message}},
  sourceSessionID}` (a sub-agent's is not the turn's failure), and
  `invocation_error` `{phase, code, message}` before a session exists.
- `session_complete` ends the turn. Its `error` field is deprecated in the
  seed ("key on session_error"), so it fails nothing by itself; a stream that
  ends without `session_complete` — and without an error saying why — did not
  finish its turn.

Unknown types (`tool_catalog`, `skill_*`, `subagent_*`, `step_start`, …) are
ignored, as the schema asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from .base import Handler, text_of
from .coding_agents import tool_title
from .events import ActivityEvent, ErrorEvent, Event
from .opencode import OpencodeJson, error_text, parts_usage


class AictrlNdjson(OpencodeJson):
    """The dialect; see the module docstring for the mapping."""

    name: ClassVar[str] = "aictrl-ndjson"
    family: ClassVar[str] = "aictrl"
    __slots__ = ()

    def on_message_complete(self, message: Mapping[str, Any]) -> list[Event]:
        if message.get("tokens") is None:
            return []  # usageStatus "missing": the provider reported nothing, the cost of 0 with it means nothing
        usage = parts_usage(message.get("tokens"), message.get("cost"))
        return [usage] if usage is not None else []

    def on_permission(self, message: Mapping[str, Any]) -> list[Event]:
        patterns = message.get("patterns")
        shown = (
            ", ".join(pattern for pattern in patterns if isinstance(pattern, str)) if isinstance(patterns, list) else ""
        )
        tool = text_of(message.get("tool")) or text_of(message.get("permission"))
        status = "denied" if message.get("type") == "permission_rejected" else "allowed"
        return [
            ActivityEvent(
                "tool",
                tool=tool,
                title=tool_title(message.get("input")) or shown[:120],
                status=status,
                call_id=text_of(message.get("callID")),
            )
        ]

    def on_error(self, message: Mapping[str, Any]) -> list[Event]:
        source = message.get("sourceSessionID")
        if isinstance(source, str) and source and self.session.session_id and source != self.session.session_id:
            return []  # a sub-agent failed; the primary session goes on (or reports its own error)
        return self.fail(error_text(message.get("error")))

    def on_session_error(self, message: Mapping[str, Any]) -> list[Event]:
        text = text_of(message.get("message"))
        if not text:
            reason = text_of(message.get("reason")) or "unknown"
            text = f"aictrl ended the session abnormally ({reason})"
        return self.fail(text)

    def on_invocation_error(self, message: Mapping[str, Any]) -> list[Event]:
        text = text_of(message.get("message")) or "aictrl could not start the run"
        code = text_of(message.get("code"))
        return self.fail(f"{text} ({code})" if code else text)

    def on_session_complete(self, message: Mapping[str, Any]) -> list[Event]:
        self.finished = True
        return []

    def on_invocation_complete(self, message: Mapping[str, Any]) -> list[Event]:
        if message.get("status") == "error" and not self.failed:
            return self.fail("aictrl reported that the run failed")
        return []

    def finish(self) -> list[Event]:
        events = super().finish()
        if not self.finished and not self.failed:
            events.append(
                ErrorEvent("aictrl ended without finishing its turn (no session_complete event)", unfinished=True)
            )
        return events

    handlers: ClassVar[Mapping[str, Handler]] = {
        **{kind: handler for kind, handler in OpencodeJson.handlers.items() if kind not in ("step_finish", "done")},
        "error": on_error,
        "message_complete": on_message_complete,
        "permission_rejected": on_permission,
        "permission_granted": on_permission,
        "session_error": on_session_error,
        "invocation_error": on_invocation_error,
        "session_complete": on_session_complete,
        "invocation_complete": on_invocation_complete,
    }
