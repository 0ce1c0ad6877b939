"""Ante's `serve --stdio` (`protocol: ante`): one warm process per conversation, JSON Lines both ways. Sans-I/O.

The bridge writes one `OpMsg` per line (`{"op": …, "id": "op_<ULID>"}`) and
reads one `EventMsg` per line (`{"timestamp", "id", "event", "parent"}`,
`parent` the id of the op that caused it). An event is `"Name"` or
`{"Name": payload}`.

- `open()`: `StartSession` with the profile's `ante:` settings and the
  agent's cwd, or `ResumeSession` with the stored session id. `SessionStart`
  → `Ready(session_id)`. A resume Ante refuses (`Error`) starts a new session
  instead, with a warning: the conversation goes on, without its history.
- `prompt(turn)`: `UserInput` with a fresh op id (the message, with the
  turn's fetched files named in it by their paths). Then `TurnStart` …
  `MessageDelta` (partials; the reply is all of them, a blank line where the
  text resumes after a tool) or, when Ante does not stream, `AgentMessage`
  (the same, whole) … `TurnEnd{Completed|Interrupted|Error}` → `TurnEnd`, an
  `ErrorEvent` first for `Error` (and for an interruption the bridge did not
  ask for). `ThinkingDelta`/`Thinking` → thinking activity, `ToolStart`/
  `ToolUpdate`/`ToolEnd` → tool activity, `UsageUpdate` → usage (as Ante
  counts it), `Error` → `ErrorEvent`. A streamed message or thinking block is
  repeated whole when its step ends: the repeat is not shown twice.
- `TurnPause{Approval{tools}}` → one `PermissionRequest` per tool (its id is
  the tool call's id); `answer()` returns nothing until every tool of that
  pause is decided, then one `ApprovalResponse` with them all: `Accept`,
  `AcceptForSession` (`Decision.always`) or `Skip`.
- `cancel()`: the undecided tools of a pause answered `Skip`, then
  `Interrupt`. Not `Abort`: Ante removed it from its wire (0.preview.85: "deny
  and stop composes as a deny plus an interrupt"), and a deny plus an
  interrupt means the same to the versions that still have it.
- `shutdown()`: `Shutdown`; Ante answers `SessionEnd` and `Goodbye` and exits.

Which events are this turn's. A resumed session replays up to 200 events of
its history right after `SessionStart`, and nothing marks where the replay
ends, so the dialect scopes a turn by its lifecycle and recognises its start
by the op that caused it: from `prompt()` on, the turn begins at the
`TurnStart` whose `parent` is the `UserInput`'s op id (or whose `turn_id` is,
as Ante's own SDK clients assume), and everything up to its `TurnEnd` is the
turn's, whatever parent Ante gives each event (it parents some to the
`ApprovalResponse`, some to nothing). Everything outside that span is dropped.
This is robust because replayed events can never carry this process's op ids:
they are random ULIDs, made fresh per op, and the replay precedes the first
turn (Ante handles ops in order). For an agent that parents nothing, a
parentless `TurnStart` is the turn's unless a replayed turn is open (one that
began with a replay-only `UserInput` event); once the first turn of the
process has started, no replay can follow, and parentless events are trusted.

Read leniently where Ante's later wire differs from the protocol reference
the bridge follows: a tool's arguments as `input` or `args`, a turn error as
`{message}` or `{headline, details}`, `SessionEnd` bare or with fields.
Unknown events and fields are ignored. The dialect never decides, never logs,
and knows no clock; its one impurity is the randomness of op ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..permissions import Decision, PermissionRequest
from ..turn import Turn
from .agentproc01 import session_id_problem
from .base import DialectContext, number, shorten, text_of, with_files_named, with_outbox_named
from .coding_agents import THINKING_CHARS, TITLE_CHARS, Paragraphs, ToolCall, ToolCalls, output_excerpt, tool_title
from .events import (
    ActivityEvent,
    AgentInput,
    ErrorEvent,
    Event,
    ProtocolWarning,
    ReplyEvent,
    Usage,
    UsageEvent,
)
from .settings import AnteSettings
from .warm import WarmDialect, WarmState

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# Ante's built-in tools, by the kinds a profile's `permissions:` lists may name (MCP tools have no kind).
_TOOL_KINDS = {
    "Read": "read",
    "Grep": "search",
    "Glob": "search",
    "Edit": "edit",
    "MultiEdit": "edit",
    "Write": "edit",
    "NotebookEdit": "edit",
    "Bash": "exec",
    "WebFetch": "fetch",
    "WebSearch": "fetch",
}
_TOOL_STATUSES = {"Completed": "completed", "Failed": "failed", "Denied": "denied", "Cancelled": "failed"}
_UNFINISHED = "Ante's output ended before the turn finished (it exited or was killed)"
# The events of a turn whose body is text; every other one has fields.
_TEXT_BODIES = frozenset({"MessageDelta", "AgentMessage", "ThinkingDelta", "Thinking", "Error"})


def new_op_id() -> str:
    """A fresh `op_<ULID>` (128 random bits in Crockford's base32, as Ante's `Id` parses them)."""
    value = int.from_bytes(os.urandom(16), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "op_" + "".join(reversed(chars))


@dataclass(slots=True)
class _Pause:
    """A `TurnPause{Approval}`: its turn, its tools in Ante's order, and the decisions made so far."""

    turn_id: Any
    tool_ids: list[str]
    decisions: dict[str, str] = field(default_factory=dict)

    def response(self, undecided: str = "") -> dict[str, Any]:
        """The `ApprovalResponse` op for every tool (`undecided` for those still open)."""
        responses = [[tool_id, self.decisions.get(tool_id, undecided)] for tool_id in self.tool_ids]
        return {"ApprovalResponse": {"turn_id": self.turn_id, "responses": responses}}


class Ante(WarmDialect):
    """One Ante `serve --stdio` process: its session, then its turns one after another."""

    name: ClassVar[str] = "ante"
    Settings: ClassVar[type] = AnteSettings
    __slots__ = (
        "_settings",
        "_stored_session",
        "_standing",
        "_cwd",
        "_resuming",
        "_turn_started",
        "_handshake_op",
        "_replay_possible",
        "_in_replayed_turn",
        "_turn_op",
        "_turn_ops",
        "_turn_id",
        "_cancelled",
        "_error",
        "_text",
        "_streamed_text",
        "_streamed_thinking",
        "_tools",
        "_pauses",
    )

    def __init__(self, context: DialectContext, *, session_id: str, cwd: str) -> None:
        super().__init__(context, session_id=session_id, cwd=cwd)
        self._settings = context.settings if context.settings is not None else AnteSettings()
        self._stored_session = session_id
        self._standing = ""  # added to the system prompt of a new session (`tell_standing`)
        self._cwd = cwd
        # Finer steps within the WarmState: STARTING is a start or a resume; IN_TURN waits for the turn's TurnStart
        # after prompt(), then is inside the turn.
        self._resuming = False
        self._turn_started = False
        self._handshake_op = ""
        self._replay_possible = False  # a resumed session's replay may still be on its way
        self._in_replayed_turn = False  # between a replayed turn's start and its TurnEnd
        self._turn_op = ""  # the UserInput's op id
        self._turn_ops: set[str] = set()  # every op id sent for the turn in progress
        self._new_turn()

    def _new_turn(self) -> None:
        self._turn_id: Any = None  # Ante's id of the turn, from its TurnStart
        self._cancelled = False
        self._error = ""  # the last error reported in this turn (a TurnEnd repeating it is not said twice)
        self._text = Paragraphs(keep=True)
        self._streamed_text = False  # MessageDelta since the last AgentMessage: that one is their repeat
        self._streamed_thinking = False
        self._tools = ToolCalls()
        self._pauses: dict[str, _Pause] = {}  # tool call id → the pause waiting for its decision

    # ------------------------------------------------------------------ what the engine writes

    def open(self) -> bytes:
        if self._stored_session:
            self._resuming = True
            self._handshake_op, data = _op({"ResumeSession": {"session_id": self._stored_session}})
            return data
        return self._start_session()

    def start_turn(self, turn: Turn, outbox: str) -> bytes:
        self._new_turn()
        self._turn_started = False
        # UserInput is text alone (the seed has no image or file input): fetched files are named in it by path.
        message = with_outbox_named(turn.message, outbox)
        self._turn_op, data = _op({"UserInput": with_files_named(message, turn.attachments) or message})
        self._turn_ops = {self._turn_op}
        return data

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes:
        pause = self._pauses.get(request.request_id)
        if pause is None or request.request_id in pause.decisions:
            return b""  # answered already (cancel() answers what is still open), or not a question of this turn
        pause.decisions[request.request_id] = (
            "Skip" if not decision.allow else "AcceptForSession" if decision.always else "Accept"
        )
        if len(pause.decisions) < len(pause.tool_ids):
            return b""
        for tool_id in pause.tool_ids:
            del self._pauses[tool_id]
        return self._turn_op_line(pause.response())

    def cancel(self) -> bytes:
        if self.state is not WarmState.IN_TURN or self._cancelled:
            return b""
        self._cancelled = True
        pauses = {id(pause): pause for pause in self._pauses.values()}.values()
        self._pauses.clear()
        return b"".join(self._turn_op_line(pause.response(undecided="Skip")) for pause in pauses) + self._turn_op_line(
            "Interrupt"
        )

    def shutdown(self) -> bytes:
        return _op("Shutdown")[1]

    def tell_standing(self, instructions: str) -> bool:
        if self._stored_session:  # ResumeSession takes no system prompt: the first turn says it
            return False
        self._standing = instructions
        return True

    def _start_session(self) -> bytes:
        settings = self._settings
        append = "\n\n".join(text for text in (settings.append_system_prompt, self._standing) if text) or None
        self._resuming = False
        self._handshake_op, data = _op(
            {
                "StartSession": {
                    "model": settings.model,
                    "provider": settings.provider,
                    "policy": settings.policy,
                    "streaming": settings.streaming,
                    "system_prompt": settings.system_prompt,
                    "append_system_prompt": append,
                    "allowed_tools": list(settings.allowed_tools) if settings.allowed_tools is not None else None,
                    "disallowed_tools": list(settings.disallowed_tools)
                    if settings.disallowed_tools is not None
                    else None,
                    "cwd": self._cwd or None,
                    "thinking": settings.thinking,
                }
            }
        )
        return data

    def _turn_op_line(self, op: Any) -> bytes:
        """The line of an op of the turn in progress, whose id joins the turn's."""
        op_id, line = _op(op)
        self._turn_ops.add(op_id)
        return line

    # ------------------------------------------------------------------ what Ante says

    def on_object(self, message: Mapping[str, Any]) -> list[Event]:
        event = message.get("event")
        if isinstance(event, str):
            name, body = event, None
        elif isinstance(event, dict) and len(event) == 1:
            name, body = next(iter(event.items()))
        else:
            return []
        parent = message.get("parent")
        parent = parent if isinstance(parent, str) and parent else ""
        if self.state is WarmState.IN_TURN:
            return self._in_turn(name, body) if self._turn_started else self._waiting(name, body, parent)
        if self.state is WarmState.READY:
            self._note_replay(name)
            return []
        return self._handshake(name, body, parent)

    def finish(self) -> list[Event]:
        if self.state is WarmState.IN_TURN:
            return [ErrorEvent(_UNFINISHED, unfinished=True)]
        if self.state is WarmState.STARTING:
            return [ErrorEvent("Ante exited before its session started", unfinished=True)]
        return []

    def _handshake(self, name: str, body: Any, parent: str) -> list[Event]:
        if parent and parent != self._handshake_op:
            return []
        if name == "SessionStart":
            self._replay_possible = self._resuming
            session_id = body.get("session_id") if isinstance(body, dict) else None
            if not isinstance(session_id, str) or (problem := session_id_problem(session_id)) is not None:
                why = "it gave none" if not isinstance(session_id, str) else problem
                return [ProtocolWarning(f"Ante's session cannot be resumed later: {why}"), self.session_ready("")]
            return [self.session_ready(session_id)]
        if name != "Error":
            return []  # SessionEnd of no session, ExtensionRefreshed, Info…
        if self._resuming:
            return [
                ProtocolWarning(
                    "Ante could not resume the stored session (it said why in an Error event); "
                    "started a new session, without the conversation's history"
                ),
                AgentInput(self._start_session()),
            ]
        return [ErrorEvent(f"Ante could not start a session: {_error_text(body)}")]

    def _note_replay(self, name: str) -> None:
        """Follow the replayed history between turns: which of its turns is open."""
        if name in ("UserInput", "TurnStart"):  # UserInput events are only ever replayed, never live
            self._in_replayed_turn = True
        elif name == "TurnEnd":
            self._in_replayed_turn = False

    def _waiting(self, name: str, body: Any, parent: str) -> list[Event]:
        """After prompt(), until the turn starts: only its TurnStart, or an error or end caused by its ops."""
        if name not in ("TurnStart", "TurnEnd", "Error") or not self._caused_by_turn(name, body, parent):
            self._note_replay(name)
            return []
        if name == "TurnStart":
            self._turn_started = True
            self._replay_possible = False
            self._turn_id = body.get("turn_id") if isinstance(body, dict) else None
            return []
        if name == "Error":  # refused before it started ("session not initialized", a busy agent…)
            return self._end_turn({"Error": {"message": _error_text(body)}})
        return self._end_turn(body.get("status") if isinstance(body, dict) else None)

    def _caused_by_turn(self, name: str, body: Any, parent: str) -> bool:
        if isinstance(body, dict) and body.get("turn_id") == self._turn_op:
            return True
        if parent:
            return parent in self._turn_ops
        if not self._replay_possible:
            return True
        return name == "TurnStart" and not self._in_replayed_turn

    def _in_turn(self, name: str, body: Any) -> list[Event]:
        handler = self.turn_events.get(name)
        if handler is None or (name not in _TEXT_BODIES and not isinstance(body, dict)):
            return []  # CompactStart, SessionEnd… do not matter here; an event without its fields says nothing
        return handler(self, body)

    def _message_delta(self, body: Any) -> list[Event]:
        if isinstance(body, str) and body:
            self._streamed_text = True
            return [self._text.add(body)]
        return []

    def _agent_message(self, body: Any) -> list[Event]:
        if self._streamed_text:
            self._streamed_text = False
            return []
        return [self._text.add(body)] if isinstance(body, str) and body else []

    def _thinking_delta(self, body: Any) -> list[Event]:
        if isinstance(body, str) and body:
            self._streamed_thinking = True
            return [ActivityEvent("thinking", text=body)]
        return []

    def _thinking(self, body: Any) -> list[Event]:
        if self._streamed_thinking:
            self._streamed_thinking = False
            return []
        return [ActivityEvent("thinking", text=body[:THINKING_CHARS])] if isinstance(body, str) and body else []

    def _turn_error(self, body: Any) -> list[Event]:
        return self._report(_error_text(body))

    def _usage_update(self, body: Mapping[str, Any]) -> list[Event]:
        return _usage(body.get("usage"))

    def _turn_end(self, body: Mapping[str, Any]) -> list[Event]:
        turn_id = body.get("turn_id")
        if turn_id is not None and self._turn_id is not None and turn_id != self._turn_id:
            return []  # not this turn's end (a sub-agent's, say)
        return self._end_turn(body.get("status"))

    def _tool_start(self, body: Mapping[str, Any]) -> list[Event]:
        call_id, tool, arguments = text_of(body.get("id")), text_of(body.get("name")), _arguments(body)
        title = tool_title(arguments)
        self._tools.remember(call_id, ToolCall(tool, title))
        self._text.pause()
        return [ActivityEvent("tool", tool=tool, title=title, status="started", call_id=call_id)]

    def _tool_update(self, body: Mapping[str, Any]) -> list[Event]:
        call_id = text_of(body.get("tool_use_id"))
        call = self._tools.get(call_id)
        tool, title = (call.tool, call.title) if call is not None else ("", "")
        progress = shorten(text_of(body.get("message")))
        return [ActivityEvent("tool", tool=tool, title=title, status="started", call_id=call_id, text=progress)]

    def _tool_end(self, body: Mapping[str, Any]) -> list[Event]:
        call_id = text_of(body.get("tool_use_id"))
        call = self._tools.forget(call_id)
        tool, title = (call.tool, call.title) if call is not None else (text_of(body.get("tool_name")), "")
        status = body.get("status")
        word = _TOOL_STATUSES.get(status if isinstance(status, str) else "", "completed")
        if body.get("is_error") is True and word == "completed":
            word = "failed"
        return [
            ActivityEvent(
                "tool",
                tool=tool,
                title=title,
                status=word,
                call_id=call_id,
                text=_result_excerpt(body.get("result_json")) or ("cancelled" if status == "Cancelled" else ""),
            )
        ]

    def _pause(self, body: Mapping[str, Any]) -> list[Event]:
        reason = body.get("reason")
        approval = reason.get("Approval") if isinstance(reason, dict) else None
        if not isinstance(approval, dict):
            return [
                ProtocolWarning(
                    "Ante paused the turn for something other than a tool approval; the bridge "
                    "cannot answer that, so the turn waits until it is cancelled or times out"
                )
            ]
        turn_id = body.get("turn_id", self._turn_id)
        pause = _Pause(turn_id, [])
        events: list[Event] = []
        tools = approval.get("tools")
        for tool in tools if isinstance(tools, list) else ():
            call_id = tool.get("id") if isinstance(tool, dict) else None
            if not isinstance(call_id, str) or not call_id or call_id in self._pauses:
                continue
            name, arguments = text_of(tool.get("name")), _arguments(tool)
            pause.tool_ids.append(call_id)
            self._pauses[call_id] = pause
            events.append(
                PermissionRequest(
                    request_id=call_id,
                    tool=name,
                    kind=_TOOL_KINDS.get(name, ""),
                    title=tool_title(arguments, or_json=True) or shorten(name, TITLE_CHARS),
                    input=arguments if isinstance(arguments, dict) else {},
                )
            )
        if not pause.tool_ids:  # nothing the host could decide: answered at once, so the turn goes on
            events.append(
                ProtocolWarning(
                    "Ante asked approval for no tool the bridge could name (each needs an "
                    "id); answered with no decision"
                )
            )
            events.append(AgentInput(self._turn_op_line(pause.response())))
        return events

    def _report(self, text: str) -> list[Event]:
        self._error = text
        return [ErrorEvent(text)]

    def _end_turn(self, status: Any) -> list[Event]:
        word, details = (
            (status, None)
            if isinstance(status, str)
            else next(iter(status.items()))
            if isinstance(status, dict) and len(status) == 1
            else ("Completed", None)
        )
        events: list[Event] = []
        if word == "Error":
            text = _error_text(details) or "Ante ended the turn with an error"
            if text != self._error:
                events.extend(self._report(text))
        elif word == "Interrupted" and not self._cancelled:
            reason = text_of(details.get("reason")) if isinstance(details, dict) else ""
            events.append(ErrorEvent(f"Ante interrupted the turn: {reason}" if reason else "Ante interrupted the turn"))
        if self._text.text:
            events.append(ReplyEvent(self._text.text))
        events.append(self.turn_over(word if isinstance(word, str) else "Completed"))
        self._turn_ops = set()
        self._new_turn()
        return events

    turn_events: ClassVar[Mapping[str, Callable[[Any, Any], list[Event]]]] = {
        "MessageDelta": _message_delta,
        "AgentMessage": _agent_message,
        "ThinkingDelta": _thinking_delta,
        "Thinking": _thinking,
        "Error": _turn_error,
        "ToolStart": _tool_start,
        "ToolUpdate": _tool_update,
        "ToolEnd": _tool_end,
        "TurnPause": _pause,
        "UsageUpdate": _usage_update,
        "TurnEnd": _turn_end,
    }
    """The events of a turn once it started, by name (before it, between turns and in the handshake, the few
    events that matter are read where the state is: `_waiting`, `_note_replay`, `_handshake`)."""


def _op(op: Any) -> tuple[str, bytes]:
    """An `OpMsg` line with a fresh id: (the id, the line)."""
    op_id = new_op_id()
    line = json.dumps({"op": op, "id": op_id}, ensure_ascii=False, separators=(",", ":")) + "\n"
    return op_id, line.encode("utf-8")


def _arguments(tool: Mapping[str, Any]) -> Any:
    """A tool call's arguments: `input` in the protocol reference, `args` in Ante's later wire."""
    return tool["input"] if "input" in tool else tool.get("args")


def _error_text(value: Any) -> str:
    """An error's words: a string, `{message}`, or Ante's later `{headline, details}`."""
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        return ""
    if message := text_of(value.get("message")):
        return message
    headline = text_of(value.get("headline"))
    details = (
        [detail for detail in value.get("details") or () if isinstance(detail, str) and detail]
        if isinstance(value.get("details"), list)
        else []
    )
    return f"{headline} — {'; '.join(details)}" if headline and details else headline


def _result_excerpt(result: Any) -> str:
    if isinstance(result, dict):
        for key in ("content", "stdout", "output", "message"):
            if excerpt := output_excerpt(result.get(key)):
                return excerpt
        return ""
    return output_excerpt(result)


def _usage(usage: Any) -> list[Event]:
    if not isinstance(usage, dict):
        return []
    input_tokens, output_tokens = number(usage.get("input_tokens")), number(usage.get("output_tokens"))
    if input_tokens is None and output_tokens is None:
        return []
    total = number(usage.get("total_tokens"))
    if total is None and input_tokens is not None and output_tokens is not None:
        total = input_tokens + output_tokens
    return [
        UsageEvent(
            Usage(
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cached_input_tokens=number(usage.get("cache_read_input_tokens")),
                total_tokens=total,
            )
        )
    ]
