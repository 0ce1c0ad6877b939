"""The AgentProc 0.1 line protocol (`protocol: agentproc-0.1`, the default) as a sans-I/O dialect.

Feed it whatever bytes the agent's stdout produced, in chunks of any size, and
read back events. It never does I/O and never looks at a clock, so every rule
of the wire format is testable without a process. Memory stays bounded
whatever the agent writes: at most one line of `max_line_bytes` is buffered
(see `framing`).
"""

from __future__ import annotations

from typing import ClassVar

from ..errors import ProtocolMisuse
from ..permissions import Decision, PermissionRequest
from ..turn import Turn
from .base import DialectContext, Handover, replace_lone_surrogates, scan_json_string
from .events import ErrorEvent, Event, LineCut, PartialEvent, ProtocolWarning, SessionEvent
from .framing import Lines, LineSplitter
from .settings import NoSettings

SESSION_PREFIX = "AGENT_SESSION:"
PARTIAL_PREFIX = "AGENT_PARTIAL:"
ERROR_PREFIX = "AGENT_ERROR:"
MAX_LINE_BYTES = 1024 * 1024
MAX_SESSION_ID_CHARS = 512

_PARTIAL_PAYLOAD = len(PARTIAL_PREFIX)
_ERROR_PAYLOAD = len(ERROR_PREFIX)
_QUOTED_PARTIAL = PARTIAL_PREFIX + ' "'
_QUOTED_PAYLOAD = len(_QUOTED_PARTIAL)  # where the JSON string's text starts


def decode_payload(raw: str, start: int = 0) -> str:
    """The payload rule for `raw[start:]`: a JSON string is decoded, anything else is the raw text, stripped.

    Taking `start` lets a line be decoded in place, without copying its payload.
    """
    quote = raw.find('"', start)
    if quote >= 0 and (quote == start or raw[start:quote].isspace()):
        try:
            # The C scanner json.loads ends in, without its per-call regex matching.
            value, end = scan_json_string(raw, quote + 1)
        except ValueError:
            pass
        else:
            if end == len(raw) or raw[end:].isspace():
                # Without escapes the value is as long as the quoted text.
                return value if len(value) == end - quote - 2 else _escaped_text(value, raw)
    return raw[start:].strip()


def _escaped_text(value: str, raw: str) -> str:
    """A JSON string's `value`, decoded from `raw` with escapes in it: any lone surrogate one spelled is U+FFFD.

    JSON can spell lone surrogates, which no encoder will accept later; only an escape can.
    """
    if "\\ud" in raw or "\\uD" in raw:
        return replace_lone_surrogates(value)
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
    """Decode an agent's stdout into events, per docs/protocol.md §3.

    `feed()` may be called with any split of the stream; events come out in
    the order their lines ended. `close()` flushes a final unterminated line.
    """

    __slots__ = ("_session_prefix", "_prefixes", "_lines", "_closed", "_prefixes_overlap")

    def __init__(self, session_prefix: str = SESSION_PREFIX, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if not session_prefix:
            raise ValueError("session_prefix must not be empty")
        self._session_prefix = session_prefix
        self._prefixes = (session_prefix, PARTIAL_PREFIX, ERROR_PREFIX)
        # A custom session prefix that one of the others starts with (or the reverse) makes the order matter.
        self._prefixes_overlap = any(
            session_prefix.startswith(other) or other.startswith(session_prefix)
            for other in (PARTIAL_PREFIX, ERROR_PREFIX)
        )
        self._lines = LineSplitter(max_line_bytes)
        self._closed = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for the unfinished line; never more than `max_line_bytes`."""
        return self._lines.buffered_bytes

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes:
        raise NotImplementedError("agentproc-0.1 agents do not ask for permission")

    def feed(self, data: bytes) -> list[Event]:
        if self._closed:
            raise ProtocolMisuse("feed() after close()")
        return self._decode(self._lines.feed(data))

    def close(self) -> list[Event]:
        """End of stream: the unterminated last line, if any, is still a line."""
        if self._closed:
            return []
        self._closed = True
        return self._decode(self._lines.close())

    def _decode(self, lines: Lines) -> list[Event]:
        if lines.cut or self._prefixes_overlap:
            return self._decode_line_by_line(lines)
        # classify() inlined: this loop is most of the bridge's work per byte of a chatty agent.
        session_prefix = self._session_prefix
        session_at = len(session_prefix)
        starts = self._prefixes
        events: list[Event] = []
        add = events.append
        for line in lines.text:
            if not line.startswith(starts):
                add(line)
            elif line.startswith(_QUOTED_PARTIAL):  # the common spelling, `AGENT_PARTIAL: "…"`, decoded here
                try:
                    text, end = scan_json_string(line, _QUOTED_PAYLOAD)
                except ValueError:
                    end = -1
                if end != len(line):
                    text = decode_payload(line, _PARTIAL_PAYLOAD)
                elif len(text) != end - _QUOTED_PAYLOAD - 1:
                    text = _escaped_text(text, line)
                add(PartialEvent(text))
            elif line.startswith(session_prefix):
                session_id = line[session_at:].strip()
                if 0 < len(session_id) <= MAX_SESSION_ID_CHARS and session_id.isprintable() and " " not in session_id:
                    add(SessionEvent(session_id))
                else:
                    add(ProtocolWarning(f"ignored a session line because {session_id_problem(session_id)}"))
            elif line.startswith(PARTIAL_PREFIX):
                add(PartialEvent(decode_payload(line, _PARTIAL_PAYLOAD)))
            else:
                add(ErrorEvent(decode_payload(line, _ERROR_PAYLOAD)))
        return events

    def _decode_line_by_line(self, lines: Lines) -> list[Event]:
        classify = self.classify
        protocol = self._prefixes
        events = [classify(line) if line.startswith(protocol) else line for line in lines.text]
        for index in sorted(lines.cut, reverse=True):  # one event per line, so indexes match
            events.insert(
                index,
                LineCut(
                    f"a stdout line was longer than {self._lines.max_line_bytes} bytes; the rest of it was discarded"
                ),
            )
        return events

    def classify(self, line: str) -> Event:
        """Classify one complete line (without its newline), in the prefix order of docs/protocol.md §3."""
        prefix = self._session_prefix
        if line.startswith(prefix):
            session_id = line[len(prefix) :].strip()
            if 0 < len(session_id) <= MAX_SESSION_ID_CHARS and session_id.isprintable() and " " not in session_id:
                return SessionEvent(session_id)
            return ProtocolWarning(f"ignored a session line because {session_id_problem(session_id)}")
        if line.startswith(PARTIAL_PREFIX):
            return PartialEvent(decode_payload(line, len(PARTIAL_PREFIX)))
        if line.startswith(ERROR_PREFIX):
            return ErrorEvent(decode_payload(line, len(ERROR_PREFIX)))
        return line  # a body line (BodyLine is str)


class AgentProc01(LineDecoder):
    """The dialect: the message in `AGENT_MESSAGE` (and on stdin with `stdin: message` or `line`), lines on stdout."""

    name: ClassVar[str] = "agentproc-0.1"
    Settings: ClassVar[type] = NoSettings
    __slots__ = ()

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context.session_line_prefix)

    @classmethod
    def handover(cls, turn: Turn, context: DialectContext) -> Handover:
        if context.stdin_message:
            message = turn.message.encode("utf-8", "replace")
            return Handover(stdin=message + b"\n" if context.stdin_line else message)
        return Handover()
