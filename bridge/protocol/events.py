"""What decoders produce: one event per meaningful thing the agent said.

`PartialEvent`, `SessionEvent` and `ErrorEvent` are also what a host receives
while a turn runs (after the turn-level rules have filtered them), so one class
serves both the wire and the public API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class PartialEvent:
    """A streamed chunk of the reply, to show the user at once."""

    kind: ClassVar[str] = "partial"
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "text": self.text}


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """A valid session id; the last one of a turn is the one to resume with."""

    kind: ClassVar[str] = "session"
    session_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "session_id": self.session_id}


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """The agent's user-readable error; the turn fails whatever its exit code."""

    kind: ClassVar[str] = "error"
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "text": self.text}


@dataclass(frozen=True, slots=True)
class BodyLine:
    """A line of the final reply; internal, the host gets the joined body in the result."""

    text: str


@dataclass(frozen=True, slots=True)
class ProtocolWarning:
    """Something the agent wrote that the bridge had to ignore or cut; logged, never fatal."""

    message: str


@dataclass(frozen=True, slots=True)
class LineCut(ProtocolWarning):
    """A line over the length limit was cut there; the turn's output is no longer whole."""


Event = PartialEvent | SessionEvent | ErrorEvent | BodyLine | ProtocolWarning
