"""What dialects produce: one event model for every agent family.

Whatever an agent speaks — AgentProc lines, agentproc wire 0.4, Codex's or
Claude Code's JSON — its dialect says it with these events:

- `PartialEvent`: a chunk of the reply to show at once; `SessionEvent`: the id
  to resume with; `ErrorEvent`: the agent's user-readable error;
- the reply: `BodyLine`s (AgentProc 0.1 builds it line by line) or a
  `ReplyEvent` (JSON families give it whole);
- `ActivityEvent`: what the agent is doing — thinking, a tool call started or
  finished, a plan. It never enters the reply;
- `UsageEvent`: tokens and cost, reported on the result;
- `PermissionRequest` (from `bridge.permissions`): the agent asks before a tool;
- `AgentInput`: bytes the dialect writes back to the agent on its own;
- `Ready`, `TurnEnd`, `FileRequest`: what long-lived (warm) agents add: the
  session takes turns, a turn is over, the agent asks to read or write a file;
- `ProtocolWarning`: something the dialect had to ignore or cut; logged.

`PartialEvent`, `SessionEvent`, `ErrorEvent` and `ActivityEvent` are also what
a host receives while a turn runs (after the turn-level rules have filtered
them), so one class serves both the wire and the public API.

Events are plain records, made once per line and never reused by the bridge.
They are not `frozen`: that would double the cost of making one, and two
thirds of a chatty agent's lines are events.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from ..permissions import PermissionRequest
from ..records import FrozenRecord, Record


class PartialEvent(Record):
    """A streamed chunk of the reply, to show the user at once."""

    __slots__ = ("text",)
    kind: ClassVar[str] = "partial"

    def __init__(self, text: str) -> None:
        self.text = text

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "text": self.text}


class SessionEvent(Record):
    """A valid session id; the last one of a turn is the one to resume with."""

    __slots__ = ("session_id",)
    kind: ClassVar[str] = "session"

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "session_id": self.session_id}


class ErrorEvent(Record):
    """The agent's user-readable error; the turn fails whatever its exit code.

    `unfinished`: not the agent's words but the dialect's — the agent's stream
    ended without its final event. It fails the turn only when the agent ended
    on its own: after a timeout or a cancel, that is the cause the host is told.
    """

    __slots__ = ("text", "unfinished")
    kind: ClassVar[str] = "error"

    def __init__(self, text: str, unfinished: bool = False) -> None:
        self.text = text
        self.unfinished = unfinished

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "text": self.text}


BodyLine = str
"""A line of the final reply is just its text: body lines are most of what agents
write, never reach a host one by one, and need nothing but the text."""


class ReplyEvent(Record):
    """The reply as the agent gives it whole (a JSON family's final answer); it replaces any earlier one."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class PlanStep(FrozenRecord):
    """One entry of an agent's plan: what, and `pending` | `in_progress` | `completed`."""

    __slots__ = ("text", "status")
    text: str
    status: str

    def __init__(self, text: str, status: str = "pending") -> None:
        self._assign(text=text, status=status)

    def to_dict(self) -> dict[str, str]:
        return {"text": self.text, "status": self.status}


ActivityKind = Literal["thinking", "tool", "plan"]


class ActivityEvent(Record):
    """What the agent is doing, for a status line; never part of the reply.

    - `thinking`: `text` is (a piece of) its reasoning;
    - `tool`: a tool call — `tool` its name as the agent calls it, `title` what
      a person reads ("ls -la", "Read README.md"), `status` `started`,
      `completed` or `failed`, `call_id` ties the events of one call together,
      `text` a short excerpt of its output when it finished;
    - `plan`: `plan` holds every step as the agent sees them now.
    """

    __slots__ = ("activity", "text", "tool", "title", "status", "call_id", "plan")
    kind: ClassVar[str] = "activity"

    def __init__(
        self,
        activity: ActivityKind,
        text: str = "",
        tool: str = "",
        title: str = "",
        status: str = "",
        call_id: str = "",
        plan: tuple[PlanStep, ...] = (),
    ) -> None:
        self.activity = activity
        self.text = text
        self.tool = tool
        self.title = title
        self.status = status
        self.call_id = call_id
        self.plan = plan

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"event": self.kind, "activity": self.activity}
        for name in ("text", "tool", "title", "status", "call_id"):
            value = getattr(self, name)
            if value:
                record[name] = value
        if self.plan:
            record["plan"] = [step.to_dict() for step in self.plan]
        return record


class Usage(FrozenRecord):
    """What a turn cost, as far as the agent said: tokens (None where it did not say) and money."""

    __slots__ = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens", "total_tokens", "cost_usd")
    input_tokens: int | None
    output_tokens: int | None
    cached_input_tokens: int | None
    reasoning_tokens: int | None
    total_tokens: int | None
    cost_usd: float | None

    def __init__(
        self,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        cached_input_tokens: int | None = None,
        reasoning_tokens: int | None = None,
        total_tokens: int | None = None,
        cost_usd: float | None = None,
    ) -> None:
        self._assign(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached_input_tokens,
            reasoning_tokens=reasoning_tokens,
            total_tokens=total_tokens,
            cost_usd=cost_usd,
        )

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__ if getattr(self, name) is not None}

    def plus(self, other: Usage) -> Usage:
        """Both turns' worth (a family that reports per step, say): each field summed where either has it."""
        values: dict[str, Any] = {}
        for name in self.__slots__:
            mine, theirs = getattr(self, name), getattr(other, name)
            values[name] = theirs if mine is None else mine if theirs is None else mine + theirs
        return Usage(**values)


class UsageEvent(Record):
    """Usage the agent reported; the turn's result carries the last one (`replace`) or their sum."""

    __slots__ = ("usage", "replace")

    def __init__(self, usage: Usage, replace: bool = True) -> None:
        self.usage = usage
        self.replace = replace


class AgentInput(Record):
    """Bytes the dialect itself must write to the agent's stdin: a protocol-level answer no policy decides.

    agentproc-0.4 refuses a malformed permission request this way, so the agent
    does not wait for an answer that would never come. Written after anything
    queued before; dropped once stdin is closed.
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class Ready(Record):
    """A long-lived agent's session is set up (new, or resumed) and takes turns; `session_id` is its id."""

    __slots__ = ("session_id",)

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id


class TurnEnd(Record):
    """A long-lived agent finished the turn and stays alive for the next one.

    `stop_reason` is the family's own word (`end_turn`, `cancelled`, `refusal`…);
    a dialect that sees the turn fail reports an `ErrorEvent` before this.
    """

    __slots__ = ("stop_reason",)

    def __init__(self, stop_reason: str = "end_turn") -> None:
        self.stop_reason = stop_reason


class FileRequest(Record):
    """A warm agent asks the bridge to read or write a text file (ACP `fs/read_text_file`, `fs/write_text_file`).

    Only when the profile granted it (`acp: {fs_read: true}` / `fs_write`); the
    engine executes it confined to the session's working directory and answers
    with the dialect's `file_reply(request_id, content=…)` or `(…, error=…)`.
    `operation` is `read` (`line`: the first line, 1-based, and `limit`: how
    many lines, each None for all) or `write` (`content`: the whole new text).
    """

    __slots__ = ("request_id", "operation", "path", "content", "line", "limit")

    def __init__(
        self,
        request_id: str,
        operation: Literal["read", "write"],
        path: str,
        content: str | None = None,
        line: int | None = None,
        limit: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.operation = operation
        self.path = path
        self.content = content
        self.line = line
        self.limit = limit


class ProtocolWarning(Record):
    """Something the agent wrote that the bridge had to ignore or cut; logged, never fatal."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


class LineCut(ProtocolWarning):
    """A line over the length limit was cut there; the turn's output is no longer whole."""

    __slots__ = ()


Event = (
    PartialEvent
    | SessionEvent
    | ErrorEvent
    | BodyLine
    | ReplyEvent
    | ActivityEvent
    | UsageEvent
    | PermissionRequest
    | AgentInput
    | Ready
    | TurnEnd
    | FileRequest
    | ProtocolWarning
)
