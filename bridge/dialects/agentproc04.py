"""agentproc wire 0.4 (`protocol: agentproc-0.4`), the reference runner's JSON lines, as a sans-I/O dialect.

The turn goes to the agent as one compact JSON `turn` line on stdin, written
exactly as the reference runner (agentproc 0.20) writes it; stdin is then
closed, unless the profile has a `permissions:` section: then the turn says
`"permission": true` and stdin stays open for `permission_response` lines.

The agent answers with one JSON object per line:

- `partial{text, role}`: a chunk of the reply (`role` `thinking`: its
  reasoning, an activity; any other role is forwarded as a partial);
- `result{text, usage}`: the reply, whole; only the first one counts, and
  none after an error;
- `error{message, usage}`: the turn fails with that message;
- `permission_request{request_id, tool_name, input, description}`: may it run
  a tool? The profile's policy answers (see `answer`);
- `session_id` on any of them: the first valid one is the session.

Where this differs from the reference runner on purpose (see docs/protocols/agentproc.md):
the reply is `result.text` even when partials streamed (the reference then
returns ""), or, with no `result` at all, the output partials joined; a
session id over 512 characters or one that is not text is refused too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..permissions import Decision, PermissionRequest
from ..turn import Attachment, Turn
from .agentproc01 import MAX_SESSION_ID_CHARS
from .base import DialectContext, Handler, Handover, JsonLinesDialect, number, scan_json_string, shorten, text_of
from .coding_agents import TITLE_CHARS, Paragraphs, money, tool_title
from .events import (
    ActivityEvent,
    AgentInput,
    ErrorEvent,
    Event,
    ProtocolWarning,
    ReplyEvent,
    SessionEvent,
    Usage,
    UsageEvent,
)
from .settings import JsonSettings

PROTOCOL_VERSION = "0.4"
# The partial-line reader (`AgentProc04.read_lines`, bench row 15): the start every partial line of the agentproc
# SDKs has, and the bound on the line ends it remembers (an agent has
# a few; a hostile one cannot make them hold more than 64 Ki characters).
_PARTIAL_HEAD = '{"type":"partial","text":"'
_MAX_LINE_ENDS = 64
_MAX_LINE_END_CHARS = 1024
# The reference's rule (runner.is_valid_session_id): the SDK stores a session as <id>.jsonl.
_UNSAFE_SESSION_ID = re.compile(r"[/\\\x00-\x1f]")
_UNSAFE_REQUEST_ID = re.compile(r"[\s\x00-\x1f]")


class AgentProc04(JsonLinesDialect):
    """One turn of an agentproc wire 0.4 agent."""

    name: ClassVar[str] = "agentproc-0.4"
    Settings: ClassVar[type] = JsonSettings
    __slots__ = (
        "_session_id",
        "_session_warned",
        "_result_seen",
        "_error_seen",
        "_usage_seen",
        "_text",
        "_unknown",
        "_unanswerable",
        "_malformed_requests",
        "_line_ends",
    )

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        self._session_id = ""
        self._session_warned: set[str] = set()  # the session warnings given: each is logged once per turn
        self._result_seen = False
        self._error_seen = False
        self._usage_seen = False
        self._text = Paragraphs(keep=True)  # output partials, the reply when no result comes
        self._unknown = 0  # JSON objects that are no 0.4 event
        self._unanswerable = 0  # permission requests while nobody answers
        self._malformed_requests = 0
        self._line_ends: dict[str, tuple[Any, Any]] = {}  # see read_lines

    @classmethod
    def handover(cls, turn: Turn, context: DialectContext) -> Handover:
        line: dict[str, Any] = {
            "type": "turn",
            "message": turn.message,
            "session_id": turn.session_id,
            "session_name": turn.session_name,
            "protocol_version": PROTOCOL_VERSION,
        }
        if turn.attachments:
            line["attachments"] = [_attachment(attachment) for attachment in turn.attachments]
        if context.permissions:
            line["permission"] = True
        data = (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        return Handover(stdin=data, keep_open=context.permissions)

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes:
        return _permission_response(request.request_id, decision.allow, decision.message)

    def on_unknown(self, message: Mapping[str, Any]) -> list[Event]:
        self._unknown += 1  # legacy 0.3 `session`/`text` lines included: the reference ignores them too
        return []

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if not self._result_seen and not self._error_seen and self._text.text:
            events.append(ReplyEvent(self._text.text))
        self._text = Paragraphs(keep=False)
        if self._unknown:
            events.append(
                ProtocolWarning(
                    f"ignored {self._unknown} JSON line(s) that were no wire 0.4 event "
                    "(partial, result, error, permission_request)"
                )
            )
        if self._malformed_requests:
            events.append(
                ProtocolWarning(
                    f"refused {self._malformed_requests} malformed permission request(s): "
                    "each needs a request_id without whitespace, a tool_name and an "
                    "input object"
                )
            )
        return events

    def read_lines(self, lines: Sequence[str], events: list[Event]) -> None:
        """Every line of the stream, partial lines (the bulk of it) read without decoding them as JSON.

        The dialects' one hot-path trick, kept because bench row 15 (wire-0.4 throughput) halves without it
        (PROFILING.md). A partial line as agents write it, `{"type":"partial","text":"…"` and then members other than
        `type` and `text`, is read by decoding the text alone and looking the members after it up among the line
        ends seen before (an agent ends its lines alike: the same role, the same session id). A partial line of
        another shape is decoded as JSON, and read on by the same code; every other line is decoded and dispatched
        (`handlers`). A partial's events are made here, not in a method per line: a call per line is a tenth of the
        stream's cost.
        """
        line_ends = self._line_ends
        head_chars = len(_PARTIAL_HEAD)
        text: Any  # the partial's text: a str when read here, anything when decoded
        for line in lines:
            members = None
            # A lone surrogate's escape is left to decoding, which cleans it (a backslash is looked for first:
            # memchr, where looking for an escape costs ~1 ns a character).
            if line.startswith(_PARTIAL_HEAD) and (
                "\\" not in line or not ("\\u" in line and ("\\ud" in line or "\\uD" in line))
            ):
                try:
                    text, end = scan_json_string(line, head_chars)
                except ValueError:
                    pass
                else:
                    tail = line[end:]
                    members = line_ends.get(tail)
                    if (
                        members is None
                        and (members := _partial_members(tail)) is not None
                        and len(line_ends) < _MAX_LINE_ENDS
                        and len(tail) <= _MAX_LINE_END_CHARS
                    ):
                        line_ends[tail] = members
            if members is not None:
                role, session_id = members
            else:
                message = self.json_object(line, events)
                if message is None:
                    continue
                if message.get("type") != "partial":
                    events.extend(self.on_object(message))
                    continue
                text, role, session_id = message.get("text"), message.get("role"), message.get("session_id")
            if session_id != self._session_id:  # the same id on every line: rarely a new one
                events.extend(self._session(session_id))
            if not text or not isinstance(text, str):
                continue
            if role == "thinking":
                if not self._error_seen:  # the reference forwards no partial of any role after an error
                    events.append(ActivityEvent("thinking", text))
                continue
            events.append(self._text.add(text))  # kept for the reply until a result or an error comes

    def _result(self, message: Mapping[str, Any]) -> list[Event]:
        if self._result_seen or self._error_seen:
            # At most one result, none after an error; an ignored result's usage still counts if none came yet.
            return self._usage(message) if self._error_seen and not self._usage_seen else []
        self._result_seen = True
        self._text = Paragraphs(keep=False)
        events = self._session(message.get("session_id"))
        events.append(ReplyEvent(text_of(message.get("text"))))
        events.extend(self._usage(message))
        return events

    def _error(self, message: Mapping[str, Any]) -> list[Event]:
        self._error_seen = True
        self._text = Paragraphs(keep=False)
        events = self._session(message.get("session_id"))
        events.append(ErrorEvent(text_of(message.get("message"))))
        events.extend(self._usage(message))  # an error's usage replaces the result's, as the reference keeps it
        return events

    def _permission_request(self, message: Mapping[str, Any]) -> list[Event]:
        events = self._session(message.get("session_id"))
        if not self.context.permissions:
            self._unanswerable += 1
            if self._unanswerable == 1:
                events.append(
                    ProtocolWarning(
                        "the agent asked permission to run a tool, but the profile has no "
                        "permissions: section (the agent was told nobody answers); ignored. "
                        "Add a permissions: section to answer such requests"
                    )
                )
            return events
        request_id = message.get("request_id")
        tool = message.get("tool_name")
        tool_input = message.get("input")
        if (
            not isinstance(request_id, str)
            or not request_id.strip()
            or _UNSAFE_REQUEST_ID.search(request_id)
            or not isinstance(tool, str)
            or not tool
            or not isinstance(tool_input, dict)
        ):
            # Refused without asking the policy, so that the agent does not wait for an answer that never comes.
            self._malformed_requests += 1
            salvaged = request_id.strip() if isinstance(request_id, str) else ""
            if salvaged and not _UNSAFE_REQUEST_ID.search(salvaged):
                events.append(AgentInput(_permission_response(salvaged, False, "malformed permission request")))
            return events
        description = text_of(message.get("description"))
        title = shorten(description, TITLE_CHARS) if description.strip() else tool_title(tool_input, or_json=True)
        events.append(PermissionRequest(request_id=request_id, tool=tool, title=title, input=tool_input))
        return events

    def _session(self, session_id: Any) -> list[Event]:
        """The event of a line's session id: the first valid one is the session, later different ones warned."""
        if not isinstance(session_id, str) or not session_id or session_id == self._session_id:
            return []
        problem = _session_id_problem(session_id)
        if problem is None and not self._session_id:
            self._session_id = session_id
            return [SessionEvent(session_id)]
        if problem is None:
            problem = (
                "it differs from the turn's first one, which stays the session (wire 0.4: the first valid id wins)"
            )
        if problem in self._session_warned:  # an agent stamps its id on every line: one warning is enough
            return []
        self._session_warned.add(problem)
        return [ProtocolWarning(f"ignored a session id because {problem}")]

    def _usage(self, message: Mapping[str, Any]) -> list[Event]:
        usage = message.get("usage")
        if not isinstance(usage, dict):
            return []
        values = Usage(
            input_tokens=number(usage.get("input_tokens")),
            output_tokens=number(usage.get("output_tokens")),
            cached_input_tokens=number(usage.get("cache_read_input_tokens")),
            reasoning_tokens=number(usage.get("reasoning_tokens")),
            total_tokens=number(usage.get("total_tokens")),
            cost_usd=money(usage.get("cost_usd")),
        )
        if values == Usage():
            return []
        self._usage_seen = True
        return [UsageEvent(values)]

    handlers: ClassVar[Mapping[str, Handler]] = {  # and "partial", which `read_lines` reads
        "result": _result,
        "error": _error,
        "permission_request": _permission_request,
    }


def _partial_members(tail: str) -> tuple[Any, Any] | None:
    """(role, session_id) of the members that end a partial line after its text; None unless exactly JSON's."""
    if tail.startswith(","):
        try:
            members = json.loads("{" + tail[1:])
        except (ValueError, RecursionError):
            return None
        # Empty: a trailing comma, which JSON refuses. A later `type` or `text` would replace the line's own.
        if not isinstance(members, dict) or not members or "type" in members or "text" in members:
            return None
    elif not tail.startswith("}") or tail[1:].strip(" \t\n\r"):
        return None
    else:
        members = {}
    return members.get("role"), members.get("session_id")


def _attachment(attachment: Attachment) -> dict[str, Any]:
    """Our `Attachment` in wire 0.4's words: `{kind, url, filename}`, and once the bridge fetched it `path` (the
    local file, absolute), `media_type` and `size`; the 0.20 SDK hands the entries to the agent as they are
    (`ctx.attachments`)."""
    shape: dict[str, Any] = {"kind": attachment.type, "url": attachment.url}
    if attachment.name:
        shape["filename"] = attachment.name
    if attachment.path:
        shape.update(path=attachment.path, media_type=attachment.media_type, size=attachment.size)
    return shape


def _permission_response(request_id: str, allow: bool, message: str) -> bytes:
    # Key order and compact form as the reference writes it; never `updated_input`: no decision carries one yet.
    line: dict[str, Any] = {
        "type": "permission_response",
        "request_id": request_id,
        "behavior": "allow" if allow else "deny",
    }
    if message:
        line["message"] = message
    return (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "replace")


def _session_id_problem(session_id: str) -> str | None:
    if session_id in (".", ".."):
        return f"it is {session_id!r}"
    if _UNSAFE_SESSION_ID.search(session_id):
        return "it contains '/', '\\' or a control character"
    if len(session_id) > MAX_SESSION_ID_CHARS:
        return f"it is {len(session_id)} characters long (the limit is {MAX_SESSION_ID_CHARS})"
    if "\ufffd" in session_id:  # a lone surrogate, or invalid UTF-8, cleaned: not the id the agent meant
        return "it is not valid text"
    return None
