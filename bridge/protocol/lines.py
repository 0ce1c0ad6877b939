"""The AgentProc 0.1 line protocol as a sans-I/O decoder.

Feed it whatever bytes the agent's stdout produced, in chunks of any size, and
read back events. It never does I/O and never looks at a clock, so every rule
of the wire format is testable without a process. Memory stays bounded
whatever the agent writes: at most one line of `max_line_bytes` is buffered
(see `framing`).
"""

from __future__ import annotations

import json
import re

from .events import BodyLine, ErrorEvent, Event, LineCut, PartialEvent, ProtocolWarning, SessionEvent
from .framing import LineSplitter

SESSION_PREFIX = "AGENT_SESSION:"
PARTIAL_PREFIX = "AGENT_PARTIAL:"
ERROR_PREFIX = "AGENT_ERROR:"
MAX_LINE_BYTES = 1024 * 1024
MAX_SESSION_ID_CHARS = 512

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_payload(raw: str) -> str:
    """The payload rule: a JSON string is decoded, anything else is the raw text, stripped."""
    text = raw.strip()
    if text[:1] != '"':
        return text
    inner = text[1:-1]
    if text[-1] == '"' and len(text) > 1 and '"' not in inner and "\\" not in inner and inner.isprintable():
        return inner  # a JSON string without escapes or control characters decodes to itself
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if not isinstance(value, str):
        return text
    if "\\u" in text:
        # JSON can spell lone surrogates, which no encoder will accept later.
        value = _LONE_SURROGATE.sub("\ufffd", value)
    return value


def session_id_problem(session_id: str) -> str | None:
    """Why `session_id` is not a usable session id, or None when it is."""
    if not session_id:
        return "it is empty"
    if len(session_id) > MAX_SESSION_ID_CHARS:
        return f"it is {len(session_id)} characters long (the limit is {MAX_SESSION_ID_CHARS})"
    if " " in session_id or not session_id.isprintable():
        return "it contains whitespace or control characters"
    return None


class LineDecoder:
    """Decode an agent's stdout into events, per SPEC §3.

    `feed()` may be called with any split of the stream; events come out in
    the order their lines ended. `close()` flushes a final unterminated line.
    """

    __slots__ = ("_session_prefix", "_lines", "_closed")

    def __init__(self, session_prefix: str = SESSION_PREFIX, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if not session_prefix:
            raise ValueError("session_prefix must not be empty")
        self._session_prefix = session_prefix
        self._lines = LineSplitter(max_line_bytes)
        self._closed = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for the unfinished line; never more than `max_line_bytes`."""
        return self._lines.buffered_bytes

    def feed(self, data: bytes) -> list[Event]:
        if self._closed:
            raise RuntimeError("feed() after close()")
        return self._decode(self._lines.feed(data))

    def close(self) -> list[Event]:
        """End of stream: the unterminated last line, if any, is still a line."""
        if self._closed:
            return []
        self._closed = True
        return self._decode(self._lines.close())

    def _decode(self, lines: list[tuple[bytes, bool]]) -> list[Event]:
        events: list[Event] = []
        classify = self.classify
        for raw, cut in lines:
            if cut:
                events.append(LineCut(f"a stdout line was longer than {self._lines.max_line_bytes} bytes; "
                                      "the rest of it was discarded"))
            events.append(classify(raw.decode("utf-8", "replace")))
        return events

    def classify(self, line: str) -> Event:
        """Classify one complete line (without its newline), in the SPEC's prefix order."""
        prefix = self._session_prefix
        if line.startswith(prefix):
            session_id = line[len(prefix):].strip()
            problem = session_id_problem(session_id)
            if problem is None:
                return SessionEvent(session_id)
            return ProtocolWarning(f"ignored a session line because {problem}")
        if line.startswith("AGENT_"):
            if line.startswith(PARTIAL_PREFIX):
                return PartialEvent(decode_payload(line[len(PARTIAL_PREFIX):]))
            if line.startswith(ERROR_PREFIX):
                return ErrorEvent(decode_payload(line[len(ERROR_PREFIX):]))
        return BodyLine(line)
