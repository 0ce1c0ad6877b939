"""How a turn's events look to a person (`run`, `chat`) or to a program (`run --json`)."""

from __future__ import annotations

import json
from typing import Any, TextIO

from ..result import TurnResult


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
