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
  `QuestionRequest`: the agent asks the user to choose (one or more
  `Question`s, each with its `Option`s); `RequestWithdrawn`: the agent
  withdrew one of those before it was answered;
- `AgentInput`: bytes the dialect writes back to the agent on its own;
- `Ready`, `TurnEnd`, `FileRequest`, `SteerOutcome`, `SessionGone`: what
  long-lived (warm) agents add: the session takes turns, a turn is over, the
  agent asks to read or write a file, a message steered into the running turn
  was taken in (or not), the stored session to resume is gone;
- `ProtocolWarning`: something the dialect had to ignore or cut; logged.

`FileEvent` is no dialect's: it is a file the agent left in the turn's outbox,
which the engine reports when the turn ends (`bridge.files.outbox`).

`PartialEvent`, `SessionEvent`, `ErrorEvent`, `ActivityEvent`,
`QuestionRequest`, `RequestWithdrawn` and `FileEvent` are also what
a host receives while a turn runs (after the turn-level rules have filtered
them), so one class serves both the wire and the public API.

Events are slotted dataclasses, made once per line and never changed by the
bridge — but not `frozen`, the one place this package trades that guarantee for
speed: a frozen dataclass sets each field through `object.__setattr__`, which
makes an `ActivityEvent` cost 1.2 µs instead of 0.27 µs, and a JSON dialect's
throughput 10–30% lower in `bench/dialect_loop.py` (bench rows 2, 7, 15 and 17
read it). `Usage` and `PlanStep`, values inside events, are frozen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal

from ..permissions import PermissionRequest


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
    """The agent's user-readable error; the turn fails whatever its exit code.

    `unfinished`: not the agent's words but the dialect's — the agent's stream
    ended without its final event. It fails the turn only when the agent ended
    on its own: after a timeout or a cancel, that is the cause the host is told.
    """

    kind: ClassVar[str] = "error"

    text: str
    unfinished: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "text": self.text}


BodyLine = str
"""A line of the final reply is just its text: body lines are most of what agents
write, never reach a host one by one, and need nothing but the text."""


@dataclass(slots=True)
class ReplyEvent:
    """The reply as the agent gives it whole (a JSON family's final answer); it replaces any earlier one."""

    text: str


@dataclass(slots=True, frozen=True)
class PlanStep:
    """One entry of an agent's plan: what, and `pending` | `in_progress` | `completed`."""

    text: str
    status: str = "pending"

    def to_dict(self) -> dict[str, str]:
        return {"text": self.text, "status": self.status}


ActivityKind = Literal["thinking", "tool", "plan", "notice"]


@dataclass(slots=True)
class ActivityEvent:
    """What the agent is doing, for a status line; never part of the reply.

    - `thinking`: `text` is (a piece of) its reasoning;
    - `tool`: a tool call — `tool` its name as the agent calls it, `title` what
      a person reads ("ls -la", "Read README.md"), `status` `started`,
      `completed` or `failed`, `call_id` ties the events of one call together,
      `text` a short excerpt of its output when it finished;
    - `plan`: `plan` holds every step as the agent sees them now;
    - `notice`: the bridge tells the host something a chat may show (`text`):
      the stored session was gone and a new one was started, say.
    """

    kind: ClassVar[str] = "activity"

    activity: ActivityKind
    text: str = ""
    tool: str = ""
    title: str = ""
    status: str = ""
    call_id: str = ""
    plan: tuple[PlanStep, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"event": self.kind, "activity": self.activity}
        for name in ("text", "tool", "title", "status", "call_id"):
            value = getattr(self, name)
            if value:
                record[name] = value
        if self.plan:
            record["plan"] = [step.to_dict() for step in self.plan]
        return record


@dataclass(slots=True, frozen=True)
class Usage:
    """What a turn cost, as far as the agent said: tokens (None where it did not say) and money."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _USAGE_FIELDS if getattr(self, name) is not None}

    def plus(self, other: Usage) -> Usage:
        """Both turns' worth (a family that reports per step, say): each field summed where either has it."""
        values: dict[str, Any] = {}
        for name in _USAGE_FIELDS:
            mine, theirs = getattr(self, name), getattr(other, name)
            values[name] = theirs if mine is None else mine if theirs is None else mine + theirs
        return Usage(**values)


_USAGE_FIELDS = tuple(field.name for field in fields(Usage))


@dataclass(slots=True)
class UsageEvent:
    """Usage the agent reported; the turn's result carries the last one (`replace`) or their sum."""

    usage: Usage
    replace: bool = True


@dataclass(slots=True)
class AgentInput:
    """Bytes the dialect itself must write to the agent's stdin: a protocol-level answer no policy decides.

    agentproc-0.4 refuses a malformed permission request this way, so the agent
    does not wait for an answer that would never come. Written after anything
    queued before; dropped once stdin is closed.
    """

    data: bytes


@dataclass(slots=True)
class Ready:
    """A long-lived agent's session is set up (new, or resumed) and takes turns; `session_id` is its id."""

    session_id: str


@dataclass(slots=True)
class TurnEnd:
    """A long-lived agent finished the turn and stays alive for the next one.

    `stop_reason` is the family's own word (`end_turn`, `cancelled`, `refusal`…);
    a dialect that sees the turn fail reports an `ErrorEvent` before this.
    """

    stop_reason: str = "end_turn"


@dataclass(slots=True)
class FileRequest:
    """A warm agent asks the bridge to read or write a text file (ACP `fs/read_text_file`, `fs/write_text_file`).

    Only when the profile granted it (`acp: {fs_read: true}` / `fs_write`); the
    engine executes it confined to the session's working directory and answers
    with the dialect's `file_reply(request_id, content=…)` or `(…, error=…)`.
    `operation` is `read` (`line`: the first line, 1-based, and `limit`: how
    many lines, each None for all) or `write` (`content`: the whole new text).
    """

    request_id: str
    operation: Literal["read", "write"]
    path: str
    content: str | None = None
    line: int | None = None
    limit: int | None = None


@dataclass(slots=True, frozen=True)
class Option:
    """One choice of a `Question`: its `label` (what an answer names) and what it means."""

    label: str
    description: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"label": self.label, "description": self.description}


@dataclass(slots=True, frozen=True)
class Question:
    """One thing an agent asks the user: `prompt`, the `options` to choose from, whether several may be chosen
    (`multi_select`) and whether an answer may be the user's own words instead (`free_text`). `id` names it in an
    answer; `header` is a short label for it ("Colour"), when the agent gives one."""

    id: str
    prompt: str
    options: tuple[Option, ...] = ()
    multi_select: bool = False
    free_text: bool = False
    header: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prompt": self.prompt,
            "header": self.header,
            "options": [option.to_dict() for option in self.options],
            "multi_select": self.multi_select,
            "free_text": self.free_text,
        }


@dataclass(slots=True)
class QuestionRequest:
    """The agent asks the user to choose, and waits: Claude Code's AskUserQuestion and ExitPlanMode, Codex's
    requests for user input.

    `request_id` is the dialect's handle for the answer; `tool` the agent's name
    for the asking (`AskUserQuestion`, `ExitPlanMode`, `request_user_input`).
    The answer maps each question's `id` to the labels chosen (or the user's
    own words where `free_text`), see `bridge.answers`; no answer at all
    declines, and the agent is told so.
    """

    kind: ClassVar[str] = "question"

    request_id: str
    questions: tuple[Question, ...]
    tool: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.kind,
            "request_id": self.request_id,
            "tool": self.tool,
            "questions": [question.to_dict() for question in self.questions],
        }


@dataclass(slots=True)
class RequestWithdrawn:
    """The agent withdrew its `PermissionRequest` or `QuestionRequest` `request_id` before it was answered (Claude
    Code's `control_cancel_request`, codex's `serverRequest/resolved`, ACP's `$/cancel_request`): the request is
    gone, and an answer to it is refused as for a request that does not exist."""

    kind: ClassVar[str] = "withdrawn"

    request_id: str

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, "request_id": self.request_id}


@dataclass(slots=True)
class SteerOutcome:
    """What became of a message steered into the running turn (`WarmDialect.steer`): `folded` when the agent took
    it into that turn, else it must run as a turn of its own (the agent refused it, or the turn had ended)."""

    steer_id: str
    folded: bool


@dataclass(slots=True)
class SessionGone:
    """The agent proved the stored session it was told to resume no longer exists (deleted, expired, another
    machine's). Only such proof: a resume that failed for another reason is an `ErrorEvent`. `detail` is the
    agent's own words. The engine then starts a new session or fails the turn (the profile's
    `on_resume_failure`)."""

    detail: str


@dataclass(slots=True)
class FileEvent:
    """A file the agent left in the turn's outbox for the user: its `name` there, the absolute `path` it has now,
    its `size` in bytes and its `media_type` (from the name)."""

    kind: ClassVar[str] = "file"

    name: str
    path: str
    size: int
    media_type: str

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.kind, **asdict(self)}


@dataclass(slots=True)
class ProtocolWarning:
    """Something the agent wrote that the bridge had to ignore or cut; logged, never fatal."""

    message: str


@dataclass(slots=True)
class LineCut(ProtocolWarning):
    """A line over the length limit was cut there; the turn's output is no longer whole."""


Event = (
    PartialEvent
    | SessionEvent
    | ErrorEvent
    | BodyLine
    | ReplyEvent
    | ActivityEvent
    | UsageEvent
    | PermissionRequest
    | QuestionRequest
    | RequestWithdrawn
    | AgentInput
    | Ready
    | TurnEnd
    | FileRequest
    | SteerOutcome
    | SessionGone
    | ProtocolWarning
)
