"""What every dialect is: a sans-I/O object between an agent's bytes and the bridge's events.

A one-turn dialect (`Dialect`) is made for one turn of one agent process. The
turn engine asks the dialect's class how the turn is handed to the agent
(`handover`: what goes on stdin, and whether stdin stays open for answers),
feeds it whatever the agent writes on stdout (`feed`, `close`), and, when the
agent asks permission for a tool, gets the bytes of the answer from it
(`answer`). A long-lived agent's dialect (`warm.WarmDialect`) holds a whole
conversation instead. No I/O, no clock: a dialect is tested from
transcripts, without a process.

`JsonLinesReader` is what every family that writes one JSON object per line
shares: framing with a bound, decoding, what to do with lines that are not
JSON objects, and dispatch. `JsonLinesDialect` (one turn) and
`warm.WarmDialect` (a conversation) build on it; a family module only maps
messages to events.

Every dialect dispatches one way: a table. A family's class ends with
`handlers`, a dict from a message's type (the member named by `kind_key`,
"type" unless the family says otherwise) to the method that maps such a
message to events; a type not in the table goes to `on_unknown` (nothing, by
default: families add message types, and a bridge must not break on them). A
message nested in another (codex's items, Claude's stream events, ACP's
session updates) is dispatched the same way, by a second table; so are the
messages of a family whose type is no member (ACP's JSON-RPC methods, Ante's
event names). Why a table: it reads as the protocol's own list of message
types, a new type is one line, a subclass extends its parent's table
(`{**Parent.handlers, ...}`), and the lookup is one step however many types
there are, where an if-chain tries each in turn. (AgentProc 0.1 writes
prefixed text lines, not messages: `agentproc01.LineDecoder` classifies them.)

What a family keeps while it reads has one shape for every family, in
`coding_agents`: `ToolCalls` (tool calls in flight, under one bound),
`Paragraphs` (text in pieces, shown and joined), `FirstSession`/`SessionIds`.
"""

from __future__ import annotations

import functools
import json
import json.decoder
import json.scanner
import math
import posixpath
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

from ..errors import ProtocolMisuse
from ..permissions import Decision, PermissionRequest
from ..turn import Attachment, Turn
from .events import Event, LineCut, ProtocolWarning
from .framing import Lines, LineSplitter
from .settings import JSON_MAX_LINE_BYTES, JsonSettings


@dataclass(slots=True, frozen=True)
class Handover:
    """How a turn reaches the agent besides argv and the environment.

    `stdin` is written to the agent's stdin (None: stdin is /dev/null, at end of
    file at once). With `keep_open` stdin stays a pipe after that, for the
    answers to the agent's questions; it is closed when the agent exits.
    `message` is the prompt as this family hands it, for `{{MESSAGE}}` in argv
    and in the profile's env (None: the turn's message as it is): the message
    with the turn's fetched files named in it, for a CLI that reads files it is
    told of. `options` go into argv right after the profile's `command` (before
    the session's and the message's words), one protocol option per word, such
    as codex's `--image=PATH`.
    """

    stdin: bytes | None = None
    keep_open: bool = False
    message: str | None = None
    options: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class DialectContext:
    """What a dialect needs to know of the profile; the turn engine builds it (dialects never see a Profile).

    `settings` is the dialect's own settings object (its `Settings` class,
    filled from the profile's section named after the protocol). `permissions`
    says the profile has a `permissions:` section: the host answers the
    agent's questions, so a family that must announce it may do so.
    `stdin_message`: the profile writes the message to stdin (`stdin: message`
    or `line`); `stdin_line`: followed by a newline (`stdin: line`).
    """

    settings: Any = None
    session_line_prefix: str = "AGENT_SESSION:"
    stdin_message: bool = False
    permissions: bool = False
    stdin_line: bool = False


class Dialect(Protocol):
    """The shape every dialect has (see the module docstring)."""

    name: ClassVar[str]
    Settings: ClassVar[type]

    def __init__(self, context: DialectContext, turn: Turn) -> None: ...

    @classmethod
    def handover(cls, turn: Turn, context: DialectContext) -> Handover: ...

    def feed(self, data: bytes) -> list[Event]: ...

    def close(self) -> list[Event]: ...

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes: ...


Handler = Callable[[Any, Mapping[str, Any]], list[Event]]
"""A dialect's method that maps one message (the dialect, the message) to events."""


class JsonLinesReader:
    """What every family that writes one JSON object per line shares: framing with a bound, decoding, dispatch.

    The base of `JsonLinesDialect` (one turn) and of `warm.WarmDialect` (one process, many turns); subclasses fill
    `handlers` (see the module docstring).
    """

    name: ClassVar[str] = ""
    Settings: ClassVar[type] = JsonSettings
    kind_key: ClassVar[str] = "type"
    """The member of a message that names its type."""
    handlers: ClassVar[Mapping[str, Handler]] = {}
    """Message type → the method that maps such a message to events."""
    __slots__ = ("context", "_lines", "_ignored")

    def __init__(self, context: DialectContext) -> None:
        self.context = context
        settings = context.settings if context.settings is not None else self.Settings()
        self._lines = LineSplitter(getattr(settings, "max_line_bytes", JSON_MAX_LINE_BYTES))
        self._ignored = 0  # lines that were not JSON objects

    def ignored_lines_warning(self) -> list[Event]:
        """The one warning that says how many lines were not JSON objects (nothing when none), counting afresh."""
        if not self._ignored:
            return []
        warning = ProtocolWarning(f"ignored {self._ignored} stdout line(s) that were not JSON objects")
        self._ignored = 0
        return [warning]

    def on_object(self, message: Mapping[str, Any]) -> list[Event]:
        """The events one JSON object of the agent's stream stands for: its type's handler says (see `handlers`)."""
        kind = message.get(self.kind_key)
        handler = self.handlers.get(kind) if type(kind) is str else None  # a list is no dict key: it would raise
        return handler(self, message) if handler is not None else self.on_unknown(message)

    def on_unknown(self, message: Mapping[str, Any]) -> list[Event]:
        """A message whose type has no handler: nothing, unless the family counts or reads such messages."""
        return []

    def on_other_line(self, line: str) -> list[Event]:
        """A line that is not a JSON object: counted, and one warning at the end says how many.

        A family whose CLI prints something meaningful outside JSON (an error
        message on stdout, say) overrides this.
        """
        self._ignored += 1
        return []

    def decode_lines(self, lines: Lines) -> list[Event]:
        """The events of the lines one chunk of output ended, a warning where a line was cut."""
        events: list[Event] = []
        cut = lines.cut
        if not cut:
            self.read_lines(lines.text, events)
            return events
        start = 0
        for index in sorted(cut):
            self.read_lines(lines.text[start:index], events)
            events.append(LineCut(f"a stdout line was longer than {self._lines.max_line_bytes} bytes; it was ignored"))
            start = index + 1
        self.read_lines(lines.text[start:], events)
        return events

    def read_lines(self, lines: Sequence[str], events: list[Event]) -> None:
        """Append the events of whole lines, each decoded as JSON.

        A family may override it to read its most common line without decoding it as JSON; what it appends
        must be exactly what decoding would give.
        """
        scan, on_object, extend = _scan, self.on_object, events.extend
        for line in lines:
            # The hot path of every JSON dialect (bench rows 7, 15 and 17): the usual line, read as `json_object`
            # would read it. Looking for a backslash first is much cheaper (memchr) than looking for an escape, and
            # most lines have none; a slice compares faster than a `startswith` call.
            if line[:1] == "{" and ("\\" not in line or "\\u" not in line):
                try:
                    message, end = scan(line, 0)
                except (StopIteration, ValueError, RecursionError):
                    pass
                else:
                    if end == len(line) or not line[end:].strip(_JSON_SPACE):
                        extend(on_object(message))
                        continue
            message = self.json_object(line, events)
            if message is not None:
                extend(on_object(message))

    def json_object(self, line: str, events: list[Event]) -> dict[str, Any] | None:
        """`line` decoded as a JSON object, lone surrogates cleaned; None for any other line (see `on_other_line`)."""
        message = _object_of(line)
        if message is None:
            if line.strip():
                events.extend(self.on_other_line(line))
            return None
        if "\\u" in line and ("\\ud" in line or "\\uD" in line):  # only an escape can spell a lone surrogate
            return cast(dict[str, Any], _without_lone_surrogates(message))  # it gives back a dict for a dict
        return message


class JsonLinesDialect(JsonLinesReader):
    """One turn of a family that writes one JSON object per line (see `Dialect`)."""

    __slots__ = ("turn", "_closed")

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context)
        self.turn = turn
        self._closed = False

    mention: ClassVar[str] = "{path}"
    """How the family's CLI is told of a file in its prompt (`{path}` is its absolute path): see `files_named`."""

    @classmethod
    def handover(cls, turn: Turn, context: DialectContext) -> Handover:
        # The turn is in argv: stdin is at end of file at once. Attachments are named in the prompt, which is all a
        # CLI without an input of its own for files can be given.
        return Handover(message=with_files_named(turn.message, turn.attachments, cls.mention))

    def feed(self, data: bytes) -> list[Event]:
        if self._closed:
            raise ProtocolMisuse("feed() after close()")
        return self.decode_lines(self._lines.feed(data))

    def close(self) -> list[Event]:
        if self._closed:
            return []
        self._closed = True
        events = self.decode_lines(self._lines.close())
        events.extend(self.finish())
        events.extend(self.ignored_lines_warning())
        return events

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes:
        raise NotImplementedError(f"{self.name} agents do not ask for permission")

    def finish(self) -> list[Event]:
        """Events due at the end of the stream (a reply assembled from pieces, say)."""
        return []


def with_files_named(message: str, attachments: Sequence[Attachment], mention: str = "{path}") -> str | None:
    """`message` followed by a list of `attachments`, each fetched file as `mention` spells it (`{path}`: its absolute
    path; `@{path}` for a CLI that reads a file named so), one passed through by its URL; None without attachments
    (the message as it is). The one way every family names files in its prompt."""
    listing = files_named(attachments, mention)
    if not listing:
        return None
    return f"{message}\n\n{listing}" if message.strip() else listing


def with_outbox_named(message: str, outbox: str) -> str:
    """`message` followed by `outbox_named(outbox)` (the message as it is without an outbox): how a warm family whose
    turn is one text names the turn's outbox."""
    note = outbox_named(outbox)
    if not note:
        return message
    return f"{message}\n\n{note}" if message.strip() else note


def outbox_named(outbox: str) -> str:
    """The words that tell an agent's model where its files for the user go ("" for no outbox): once per session
    as a standing instruction, or after a message (`outbox.tell_agent`); the program itself has `AGENT_OUTBOX`."""
    return f"Files for the user: write them to {outbox} (they are sent when the turn ends)." if outbox else ""


def files_named(attachments: Sequence[Attachment], mention: str = "{path}") -> str:
    """`attachments` as lines of text for the agent ("" when there are none): a fetched file by its path, one the
    profile passes through (`attachments.fetch: false`) by its URL as sent, for the agent to use itself."""
    lines = ["Attached files:"]
    for attachment in attachments:
        about: list[str] = [attachment.type]
        if attachment.media_type:
            about.append(attachment.media_type)
        where = attachment.path or urllib.parse.urlsplit(attachment.url).path
        if attachment.name and attachment.name != posixpath.basename(where):
            about.append(f"sent as {attachment.name!r}")
        named = mention.format(path=_mentioned(attachment.path, mention)) if attachment.path else attachment.url
        lines.append(f"- {named} ({', '.join(about)})")
    return "\n".join(lines) if len(lines) > 1 else ""


def _mentioned(path: str, mention: str) -> str:
    # `@path` ends at the first space, as Gemini CLI reads it; a space escaped with a backslash is part of the path.
    return path.replace("\\", "\\\\").replace(" ", "\\ ") if mention.startswith("@") else path


def _finite_or_null(text: str) -> float | None:
    """A JSON number with a fraction or exponent; None (null) for one past a float's range (1e999)."""
    value = float(text)
    return value if math.isfinite(value) else None


# An agent may write NaN, Infinity or 1e999, which Python's decoder takes: kept as they are, the events that carry
# the agent's values (a permission request's input) would reach a host as NaN or Infinity, which no strict JSON
# parser reads (serve's bots, the network door's clients, PostgreSQL's jsonb). They are null instead.
_DECODER = json.JSONDecoder(parse_constant=lambda constant: None, parse_float=_finite_or_null)
# The C scanner json.loads ends up in, called directly: json.loads's three Python frames around it cost as much as
# decoding a short event line (bench rows 7, 15 and 17, the JSON dialects' throughput).
# typeshed types make_scanner's argument as a make_scanner (a TODO in its stub); it is the decoder whose settings it
# scans with. And typeshed's json.decoder leaves out scanstring, which the module has (json.loads's string decoder).
_scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]
scan_json_string: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
"""The C decoder of a JSON string's text from its opening quote's next index (json.loads's own; typeshed does not
declare it): (the text, the index after its closing quote). Dialects that read a line's string alone use it."""
_JSON_SPACE = " \t\n\r"


def _object_of(line: str) -> dict[str, Any] | None:
    """`json.loads(line)` when that is a dict, else None (not JSON, or JSON of another type)."""
    try:
        if line.startswith("{"):
            message, end = _scan(line, 0)
            if end != len(line) and line[end:].strip(_JSON_SPACE):
                return None  # json.loads: "Extra data"
        else:
            message = _DECODER.decode(line)
    except (StopIteration, ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def replace_lone_surrogates(text: str) -> str:
    """`text` with every lone surrogate as U+FFFD. JSON can spell them (only an escape can), and no host could
    encode them."""
    return _lone_surrogate().sub("\ufffd", text)


@functools.cache
def _lone_surrogate() -> re.Pattern[str]:
    """Compiled on first use (~1 ms): a stream seldom spells a lone surrogate, and a run should not pay for it."""
    return re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(value: Any) -> Any:
    """Every lone surrogate in a decoded object, as U+FFFD (see `replace_lone_surrogates`)."""
    if isinstance(value, str):
        return replace_lone_surrogates(value)
    if isinstance(value, dict):
        return {_without_lone_surrogates(key): _without_lone_surrogates(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_lone_surrogates(item) for item in value]
    return value


def text_of(value: Any) -> str:
    """A string field of an agent's JSON, or "" when it is missing or not a string."""
    return value if isinstance(value, str) else ""


def shorten(text: str, limit: int = 200) -> str:
    """One line of at most `limit` characters, for a status line: the words of `text`, one space between them."""
    if len(text) > limit:
        # Collapsing the whitespace of a prefix gives a prefix of the whole text collapsed: a tool's output costs
        # no more than its first few hundred characters (unless they are mostly whitespace).
        head = _collapsed(text[: limit + limit // 4 + 8])
        if len(head) > limit:
            return head[: limit - 1] + "…"
    line = _collapsed(text)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _collapsed(text: str) -> str:
    """`" ".join(text.split())`, without a string object per word when spaces and newlines are its only whitespace
    (every other whitespace character is unprintable): a tool's output of non-Latin-1 text cost ~8 ns a character."""
    line = text.replace("\n", " ")
    if not line.isprintable():
        return " ".join(text.split())
    while "  " in line:
        line = line.replace("  ", " ")
    return line.strip(" ")


def number(value: Any) -> int | None:
    """A token count from an agent's JSON, or None when it is not a whole number."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value
