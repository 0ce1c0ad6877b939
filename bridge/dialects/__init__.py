"""Wire dialects as sans-I/O decoders: bytes in, events out, no I/O and no clock.

A decoder has `feed(data: bytes) -> list[Event]` and `close() -> list[Event]`;
the supervisor drives any of them the same way, so supporting a new agent
protocol means writing a new decoder, not a new supervisor.
"""

from typing import Protocol

from .agentproc01 import (
    ERROR_PREFIX,
    MAX_LINE_BYTES,
    MAX_SESSION_ID_CHARS,
    PARTIAL_PREFIX,
    SESSION_PREFIX,
    LineDecoder,
    decode_payload,
    session_id_problem,
)
from .events import BodyLine, ErrorEvent, Event, LineCut, PartialEvent, ProtocolWarning, SessionEvent
from .framing import LineSplitter


class Decoder(Protocol):
    def feed(self, data: bytes) -> list[Event]: ...
    def close(self) -> list[Event]: ...


__all__ = [
    "ERROR_PREFIX",
    "MAX_LINE_BYTES",
    "MAX_SESSION_ID_CHARS",
    "PARTIAL_PREFIX",
    "SESSION_PREFIX",
    "BodyLine",
    "Decoder",
    "ErrorEvent",
    "Event",
    "LineCut",
    "LineDecoder",
    "LineSplitter",
    "PartialEvent",
    "ProtocolWarning",
    "SessionEvent",
    "decode_payload",
    "session_id_problem",
]
