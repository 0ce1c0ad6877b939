"""How a turn's events look to a person (`run`, `chat`) or to a program (`run --json`)."""

from __future__ import annotations

import json
from typing import Any, TextIO

from ..dialects import ActivityEvent
from ..result import TurnResult


def describe_activity(event: ActivityEvent) -> str:
    """What the agent is doing, in a few words for a status line."""
    if event.activity == "thinking":
        return "thinking…"
    if event.activity == "plan":
        done = sum(step.status == "completed" for step in event.plan)
        current = next((step.text for step in event.plan if step.status == "in_progress"), "")
        return f"plan {done}/{len(event.plan)}" + (f": {current}" if current else "")
    what = " ".join(part for part in (event.tool, event.title) if part) or "a tool"
    if event.tool and event.title:
        what = f"{event.tool}: {event.title}"
    return f"{what} ({event.status})" if event.status and event.status != "started" else what


class HumanPrinter:
    """Partials as they arrive, then the reply on stdout; the error reply on stderr."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out = out
        self.err = err
        self.open_line = False  # partials left the cursor mid-line

    def show(self, event: Any) -> None:
        if isinstance(event, TurnResult):
            self._show_result(event)
        elif event.kind == "partial" and event.text:
            self.out.write(event.text)
            self.out.flush()
            self.open_line = not event.text.endswith("\n")

    def _show_result(self, result: TurnResult) -> None:
        if self.open_line:
            self.out.write("\n")
        if result.reply:
            self.out.write(result.reply)  # not reply + "\n": a long reply would be copied once more
            self.out.write("\n")
        self.out.flush()
        if result.error_reply:
            self.err.write(result.error_reply + "\n")
            self.err.flush()


class JsonPrinter:
    """NDJSON: one object per event, the result last with every field of the result."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def show(self, event: Any) -> None:
        record = {"event": "result", **event.to_dict()} if isinstance(event, TurnResult) else event.to_dict()
        self.out.write(json.dumps(record, ensure_ascii=False))
        self.out.write("\n")
        self.out.flush()
