"""aionrs `--json-stream` (`protocol: aionrs`): one aionrs process per conversation, as a sans-I/O warm dialect.

aionrs (github.com/iOfficeAI/aionrs, a Rust coding agent) speaks JSON lines
with its host (AionUi) when started with `--json-stream`: one process per
conversation, many turns. This dialect follows the protocol document
(docs/json-stream-protocol.md, protocol 0.2) and, where they differ, aionrs's
own source (crates/aion-protocol, crates/aion-cli/src/json_stream, 0.2.10).

- The agent speaks first: `ready{version, session_id?, capabilities}` once
  its session is set up → `Ready(session_id)`. A session is resumed by argv
  (`--resume <id>`); the resumed process replays nothing on stdout. Without a
  `session_id` (sessions disabled in aionrs's config) the bridge reports
  `Ready("")`: there is nothing to resume, and a later process starts afresh.
- A turn is one `message{msg_id, content, input, files}` line. `msg_id` is
  made fresh for each turn; every event of another msg_id is dropped (a
  missing or null msg_id counts as the turn's own: aionrs's engine errors
  carry none). The text goes in both `content` (what aionrs reads since
  0.1.11, and what AionUi sends) and `input` (its name up to 0.1.10, still in
  the seed document): aionrs ignores a field it does not know and silently
  drops a command without the one it needs, so one line serves every version.
  Attachments the bridge fetched (by their local path), and those that are
  local files (a path or a file:// URL), go in `files`,
  which aionrs lists to its model under "[Attached files]"; other URLs are
  listed the same way at the end of the text, under "[Attached URLs]", so
  they are never lost.
- `text_delta` → partials; the reply is their text, with a blank line where
  it resumes after a tool call. `thinking` → thinking activity.
- `tool_request` → one `PermissionRequest` (kind from its category: info →
  read, edit → edit, exec → exec, mcp → other); `answer` writes `tool_approve`
  (scope `always` for a `Decision.always`) or `tool_deny` with the reason.
  `tool_running`, `tool_result` and `tool_cancelled` are tool activity (a
  cancel the bridge itself asked for is not reported twice); either of the
  first and last for a request still waiting for its answer withdraws it
  (`RequestWithdrawn`: aionrs decided on its own).
- `stream_end` → the reply, its usage (aionrs 0.2.10 reports the session's
  running total, kept across `--resume`), `TurnEnd`.
- `error`: the turn fails with its message. A `retryable` one does not end
  the turn: the agent may go on, and when its text continues after the error
  the turn stands; otherwise the error fails it when the turn ends. An error
  before the turn's stream began ends the turn at once (the message was
  refused: the seed's invalid-command error, after which no stream follows).
  Before `ready`, an error is why the agent could not start. `info` is ignored.
- `cancel()`: pending tool requests are denied ("the turn was cancelled"),
  then `stop`. A seed-following agent ends the stream with `stream_end`
  (`TurnEnd("cancelled")`); aionrs 0.2 itself ends its process on `stop`, so
  the turn ends at its stdout's end and the next turn resumes the session in
  a new process. `shutdown()` is b"": closing stdin is the goodbye.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..permissions import Decision, PermissionRequest
from ..turn import Attachment, Turn
from .agentproc01 import session_id_problem
from .base import DialectContext, Handler, number, shorten, text_of, with_outbox_named
from .coding_agents import (
    CALL_ID_CHARS,
    OPEN_CALLS,
    THINKING_CHARS,
    TITLE_CHARS,
    Paragraphs,
    ToolCall,
    ToolCalls,
    plan_of,
    tool_title,
)
from .events import (
    ActivityEvent,
    AgentInput,
    ErrorEvent,
    Event,
    ProtocolWarning,
    ReplyEvent,
    RequestWithdrawn,
    Usage,
    UsageEvent,
)
from .settings import JsonSettings
from .warm import WarmDialect, WarmState

_KINDS = {"info": "read", "edit": "edit", "exec": "exec", "mcp": "other"}
_CANCELLED = "the turn was cancelled"
_STOP = b'{"type":"stop"}\n'
UNFINISHED = "aionrs ended without finishing its turn (no stream_end)"
NOT_READY = (
    "aionrs ended before it was ready (no ready event); its stderr says why: an unknown --resume id, "
    "a missing API key, a bad flag"
)


class Aionrs(WarmDialect):
    """One aionrs process in `--json-stream` mode: its session and every turn of it (see the module docstring)."""

    name: ClassVar[str] = "aionrs"
    Settings: ClassVar[type] = JsonSettings
    __slots__ = (
        "_turns",
        "_msg_id",
        "_began",
        "_stopping",
        "_text",
        "_tools",
        "_asked",
        "_held_error",
        "_start_failed",
    )

    def __init__(self, context: DialectContext, *, session_id: str, cwd: str) -> None:
        # Neither is written to aionrs: it resumes a session by argv (`resume_args`) and works in its process's cwd.
        super().__init__(context, session_id=session_id, cwd=cwd)
        self._turns = 0
        self._msg_id = ""  # the turn in progress; "" between turns
        self._began = False  # the turn's stream began: the agent took the message
        self._stopping = False
        self._text = Paragraphs(keep=True)
        self._tools = ToolCalls()
        self._asked = ToolCalls()  # the calls the agent asked about this turn, with the bridge's answers
        self._held_error = ""  # a retryable error no text followed yet
        self._start_failed = False  # aionrs said why it could not start

    # ------------------------------------------------------------------ what the bridge writes

    def open(self) -> bytes:
        return b""  # aionrs speaks first: `ready`

    def start_turn(self, turn: Turn, outbox: str) -> bytes:
        self._turns += 1
        self._msg_id = f"bridge-{self._turns}"
        self._began = self._stopping = False
        self._held_error = ""
        self._text = Paragraphs(keep=True)
        self._tools = ToolCalls()
        self._asked.clear()
        return _message_line(self._msg_id, with_outbox_named(turn.message, outbox), turn.attachments)

    def cancel(self) -> bytes:
        if self.state is not WarmState.IN_TURN or self._stopping:
            return b""  # aionrs 0.2 ends its process on a `stop` between turns: never send one there
        self._stopping = True
        denials = [_deny_line(call_id, _CANCELLED) for call_id, call in self._asked.items() if call.allowed is None]
        for call in self._asked.values():
            if call.allowed is None:
                call.allowed = False
        return b"".join(denials) + _STOP

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes:
        call = self._asked.get(request.request_id)
        if call is None or call.allowed is not None:
            return b""  # answered already (by a cancel), or of a turn that is over
        call.allowed = decision.allow
        if decision.allow:
            return _line(
                {
                    "type": "tool_approve",
                    "call_id": request.request_id,
                    "scope": "always" if decision.always else "once",
                }
            )
        return _deny_line(request.request_id, decision.message or "denied by the host")

    # ------------------------------------------------------------------ what the agent writes

    def on_object(self, message: Mapping[str, Any]) -> list[Event]:
        """`ready` whenever it comes; outside a turn, only a start's error matters; in a turn, the turn's own
        events (`handlers`: info, pong, config_changed, mcp_ready and the types of later versions are not there)."""
        kind = message.get("type")
        if kind == "ready":
            return self._on_ready(message)
        if self.state is not WarmState.IN_TURN:
            return self._outside_turn(kind, message)
        msg_id = message.get("msg_id")
        if msg_id is not None and msg_id != "" and msg_id != self._msg_id:
            return []  # another message's event: a turn that is over
        return super().on_object(message)

    def _on_text_delta(self, message: Mapping[str, Any]) -> list[Event]:
        self._began = True
        text = text_of(message.get("text"))
        if not text:
            return []
        self._held_error = ""  # the agent went on after a retryable error
        return [self._text.add(text)]

    def _on_thinking(self, message: Mapping[str, Any]) -> list[Event]:
        self._began = True
        text = text_of(message.get("text"))
        return [ActivityEvent("thinking", text=text[:THINKING_CHARS])] if text else []

    def _on_stream_start(self, message: Mapping[str, Any]) -> list[Event]:
        self._began = True
        return []

    def finish(self) -> list[Event]:
        if self.state is WarmState.STARTING:
            return [] if self._start_failed else [ErrorEvent(NOT_READY, unfinished=True)]
        if self.state is not WarmState.IN_TURN:
            return []
        events: list[Event] = []
        if self._held_error:  # the agent's own words: why it ended, most likely
            events.append(ErrorEvent(self._held_error))
        events.append(ErrorEvent(UNFINISHED, unfinished=True))
        self._msg_id = ""
        return events

    def _on_ready(self, message: Mapping[str, Any]) -> list[Event]:
        if self.state is not WarmState.STARTING:
            return [ProtocolWarning("ignored a second ready event")]
        events: list[Event] = []
        version = text_of(message.get("version"))
        major = version.split(".", 1)[0]
        if major.isdigit() and int(major) > 0:
            events.append(
                ProtocolWarning(
                    f"aionrs says its version is {shorten(version, 40)}; this bridge speaks "
                    "its JSON stream protocol 0.x, and a new major version may change it"
                )
            )
        session_id = message.get("session_id")
        if session_id is None:
            return [*events, self.session_ready("")]  # sessions disabled in aionrs's config: nothing to resume
        problem = session_id_problem(session_id) if isinstance(session_id, str) else "it is not a string"
        if problem is not None:
            events.append(ProtocolWarning(f"ignored the session id of aionrs's ready event because {problem}"))
            session_id = ""
        return [*events, self.session_ready(session_id)]

    def _outside_turn(self, kind: Any, message: Mapping[str, Any]) -> list[Event]:
        if kind != "error":
            return []
        if self.state is WarmState.STARTING:  # aionrs could not start: its fatal error (config_error, say) is why
            self._start_failed = True
            return [ErrorEvent(_error_text(message))]
        code = _error_code(message)
        return [ProtocolWarning(f"aionrs reported an error between turns ({code or 'no code'}); ignored")]

    def _on_tool_request(self, message: Mapping[str, Any]) -> list[Event]:
        self._began = True
        self._text.pause()
        call_id = message.get("call_id")
        tool = message.get("tool")
        if not isinstance(call_id, str) or not call_id or not isinstance(tool, dict):
            return [
                ProtocolWarning(
                    "ignored a tool_request without a call_id or a tool object; the agent may "
                    "wait for its answer until the turn times out"
                )
            ]
        if call_id in self._asked:
            return []  # asked twice: the first question stands
        if self._stopping:  # asked after the bridge said stop: nobody will answer, so the dialect does
            return [AgentInput(_deny_line(call_id, _CANCELLED))]
        name = text_of(tool.get("name"))
        arguments = tool.get("args")
        arguments = arguments if isinstance(arguments, dict) else {}
        if not self._asked.remember(call_id, ToolCall(name, tool_title(arguments), plan=plan_of(arguments))):
            return [  # its answer could not be matched
                ProtocolWarning(
                    f"denied a tool_request whose call_id is over {CALL_ID_CHARS} characters, or "
                    f"one over {OPEN_CALLS} in a turn: its answer could not be matched"
                ),
                AgentInput(_deny_line(call_id, "the bridge cannot keep track of this call")),
            ]
        category = tool.get("category")
        description = text_of(tool.get("description"))
        title = shorten(description, TITLE_CHARS) if description.strip() else tool_title(arguments, or_json=True)
        return [
            PermissionRequest(
                request_id=call_id,
                tool=name,
                kind=_KINDS.get(category, "") if isinstance(category, str) else "",
                title=title,
                input=arguments,
            )
        ]

    def _on_tool_running(self, message: Mapping[str, Any]) -> list[Event]:
        self._began = True
        self._text.pause()
        call_id = text_of(message.get("call_id"))
        call = self._asked.get(call_id)
        name = text_of(message.get("tool_name")) or (call.tool if call else "")
        if call is None:
            return self._tools.started(name, None, call_id)
        withdrawn: list[Event] = []
        if call.allowed is None:  # it runs before the answer came: aionrs decided, nothing is pending any more
            call.allowed = True
            withdrawn.append(RequestWithdrawn(call_id))
        return [*withdrawn, *self._tools.started_as(name, call.title, call.plan, call_id)]

    def _on_tool_result(self, message: Mapping[str, Any]) -> list[Event]:
        self._began = True
        self._text.pause()
        call_id = text_of(message.get("call_id"))
        call = self._asked.get(call_id)
        output = message.get("output") if message.get("output_type") != "image" else None  # base64 says nothing
        return [
            self._tools.ended(
                call_id,
                failed=message.get("status") == "error",
                output=output,
                tool=text_of(message.get("tool_name")) or (call.tool if call else ""),
                title=call.title if call else "",
            )
        ]

    def _on_tool_cancelled(self, message: Mapping[str, Any]) -> list[Event]:
        self._began = True
        self._text.pause()
        call_id = text_of(message.get("call_id"))
        call = self._asked.get(call_id)
        if call is not None and call.allowed is False:
            return []  # the bridge denied it: the host was told so with the answer
        withdrawn: list[Event] = []
        if call is not None:
            if call.allowed is None:  # cancelled before the answer came: nothing is pending any more
                withdrawn.append(RequestWithdrawn(call_id))
            call.allowed = False
        return [
            *withdrawn,
            self._tools.ended(
                call_id,
                failed=True,
                output=message.get("reason"),
                tool=call.tool if call else "",
                title=call.title if call else "",
            ),
        ]

    def _on_stream_end(self, message: Mapping[str, Any]) -> list[Event]:
        events: list[Event] = []
        if self._held_error:
            events.append(ErrorEvent(self._held_error))
        events.append(ReplyEvent(self._text.text))
        usage = _usage(message.get("usage"))
        if usage is not None:
            events.append(UsageEvent(usage))
        return self._end_turn(events, "cancelled" if self._stopping else "end_turn")

    def _on_error(self, message: Mapping[str, Any]) -> list[Event]:
        text = _error_text(message)
        error = message.get("error")
        if not self._began:  # refused before its stream began: no stream follows (seed 4.1)
            return self._end_turn([ErrorEvent(text)], "refused")
        if isinstance(error, dict) and error.get("retryable") is True:
            self._held_error = text
            return [
                ProtocolWarning(
                    f"aionrs reported a retryable error ({_error_code(message) or 'no code'}); "
                    "the turn goes on, and fails if no text follows"
                )
            ]
        return [ErrorEvent(text)]

    def _end_turn(self, events: list[Event], stop_reason: str) -> list[Event]:
        events.extend(self.ignored_lines_warning())
        events.append(self.turn_over(stop_reason))
        self._msg_id = ""
        self._asked.clear()
        self._held_error = ""
        return events

    handlers: ClassVar[Mapping[str, Handler]] = {
        "text_delta": _on_text_delta,
        "thinking": _on_thinking,
        "stream_start": _on_stream_start,
        "tool_request": _on_tool_request,
        "tool_running": _on_tool_running,
        "tool_result": _on_tool_result,
        "tool_cancelled": _on_tool_cancelled,
        "stream_end": _on_stream_end,
        "error": _on_error,
    }


def _message_line(msg_id: str, text: str, attachments: Sequence[Attachment]) -> bytes:
    files: list[str] = []
    urls: list[str] = []
    for attachment in attachments:
        parts = urllib.parse.urlsplit(attachment.url)
        if attachment.path:  # fetched: aionrs reads the local file, image or document
            files.append(attachment.path)
        elif parts.scheme == "file":
            files.append(urllib.parse.unquote(parts.path))
        elif not parts.scheme:
            files.append(attachment.url)
        else:
            urls.append(attachment.url)
    if urls:  # listed as aionrs lists the files it is given
        listing = "\n".join(["[Attached URLs]", *urls])
        text = f"{text.strip()}\n\n{listing}" if text.strip() else listing
    body = json.dumps(text, ensure_ascii=False)  # once: the same text goes in both fields
    line = f'{{"type":"message","msg_id":"{msg_id}","content":{body},"input":{body}'
    if files:
        line += ',"files":' + json.dumps(files, ensure_ascii=False, separators=(",", ":"))
    return (line + "}\n").encode("utf-8")


def _line(command: dict[str, Any]) -> bytes:
    return (json.dumps(command, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "replace")


def _deny_line(call_id: str, reason: str) -> bytes:
    return _line({"type": "tool_deny", "call_id": call_id, "reason": reason})


def _error_text(message: Mapping[str, Any]) -> str:
    error = message.get("error")
    text = text_of(error.get("message")) if isinstance(error, dict) else ""
    if text.strip():
        return text
    code = _error_code(message)
    return f"aionrs reported an error ({code})" if code else "aionrs reported an error"


def _error_code(message: Mapping[str, Any]) -> str:
    error = message.get("error")
    return shorten(text_of(error.get("code")), 40) if isinstance(error, dict) else ""


def _usage(usage: Any) -> Usage | None:
    """aionrs's `input_tokens` already counts the cache's reads and writes (aion-providers adds them in)."""
    if not isinstance(usage, dict):
        return None
    input_tokens, output_tokens = number(usage.get("input_tokens")), number(usage.get("output_tokens"))
    total = input_tokens + output_tokens if input_tokens is not None and output_tokens is not None else None
    values = Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=number(usage.get("cache_read_tokens")),
        total_tokens=total,
    )
    return values if values != Usage() else None
