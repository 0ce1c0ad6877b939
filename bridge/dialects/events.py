"""What decoders produce: one event per meaningful thing the agent said.

`PartialEvent`, `SessionEvent` and `ErrorEvent` are also what a host receives
while a turn runs (after the turn-level rules have filtered them), so one class
serves both the wire and the public API.

Events are plain records, made once per line and never reused by the bridge.
They are not `frozen`: that would double the cost of making one, and two
thirds of a chatty agent's lines are events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(slots=True)
class PartialEvent:
    """A streamed chunk of the reply, to show the user at once."""

    kind: ClassVar[str] = "partial"
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "text": self.text}


@dataclass(slots=True)
class SessionEvent:
    """A valid session id; the last one of a turn is the one to resume with."""

    kind: ClassVar[str] = "session"
    session_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "session_id": self.session_id}


@dataclass(slots=True)
class ErrorEvent:
    """The agent's user-readable error; the turn fails whatever its exit code."""

    kind: ClassVar[str] = "error"
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "text": self.text}


BodyLine = str
"""A line of the final reply is just its text: body lines are most of what agents
write, never reach a host one by one, and need nothing but the text."""


@dataclass(slots=True)
class ProtocolWarning:
    """Something the agent wrote that the bridge had to ignore or cut; logged, never fatal."""

    message: str


@dataclass(slots=True)
class LineCut(ProtocolWarning):
    """A line over the length limit was cut there; the turn's output is no longer whole."""


Event = PartialEvent | SessionEvent | ErrorEvent | BodyLine | ProtocolWarning
