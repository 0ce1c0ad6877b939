"""Claude Code as its Agent SDKs drive it (`protocol: claude-sdk`): stream-json both ways, one process per
conversation, with the control protocol for tool approvals, questions and interrupts. Sans-I/O.

The profile's command is the whole command line, `claude -p --input-format
stream-json --output-format stream-json --verbose --permission-prompt-tool stdio
--replay-user-messages` (plus `--include-partial-messages` for partials);
`check` says which of those flags is missing (`argv_problems`). Checked against
Claude Code 2.1.197 (tests/test_claude_sdk_live.py):

- handshake: the `initialize` control request; its answer is `Ready` (the
  stored id when resuming, else "": Claude names a new session in the
  `system/init` of the first turn, a `SessionEvent`). A resumed session the
  CLI does not have is answered, before initialize, by an error `result`
  ("No conversation found with session ID: …") and exit 1: that is the proof
  the session is gone (`SessionGone`);
- a turn: one `user` line (a fresh `uuid` each); the turn's fetched images
  (PNG, JPEG, GIF, WebP up to 5 MB) go in it as base64 `image` blocks, every
  other fetched file is named in its text by its absolute path. What the CLI writes is read
  as `protocol: claude-stream-json` reads it (a `ClaudeStream` per turn does
  it: partials from text deltas, thinking, tool calls and their results);
  the `result` line ends the turn — its `result` is the reply, `is_error` its
  error, `usage` and the cost of the turn (the CLI's `total_cost_usd` counts
  the whole process, so the turn's is the difference);
- `control_request` `can_use_tool`: a `PermissionRequest` (kind by tool:
  `KINDS`), answered allow (always with `updatedInput`), deny (with the
  message), or "always": allow plus a rule for this session only
  (`destination: session`; a Bash command exactly, any other tool whole),
  never the CLI's own suggestion, which writes the rule into the project's
  `.claude/settings.local.json`. `AskUserQuestion` and `ExitPlanMode` arrive
  the same way and are `QuestionRequest`s (`questions_of`). Any other
  request of the CLI gets the error envelope at once. `control_cancel_request`
  withdraws a request still waiting for its answer: `RequestWithdrawn`, and
  a later answer to it writes nothing;
- `cancel()`: the `interrupt` control request; the CLI withdraws what it
  asked and ends the turn with an `aborted_*` result: `TurnEnd("cancelled")`,
  no error;
- `steer()`: another `user` line while the turn runs. The CLI takes it in at
  the turn's next model request, or, when none comes, runs it as a turn of
  its own right after the running one's `result`. With
  `--replay-user-messages` it echoes each message it takes in (our `uuid`,
  `isReplay`), so the dialect knows: a `result` ends the bridge's turn only
  once every steered message was echoed before it. The steered message is
  thus always folded into the running bridge turn (`SteerOutcome(folded=True)`
  with its `TurnEnd`), and the reply is every CLI result's text of the
  bridge turn joined by blank lines (each answers a message the user sent);
  usage and cost add up. Replayed messages are never shown.

Output that belongs to no bridge turn (a background task's turn between
turns, a CLI turn left over from a cancelled one — told by the echo of a
message of an earlier turn) is dropped.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from ..errors import ProtocolMisuse
from ..permissions import CANCELLED, Decision, PermissionRequest
from ..turn import Attachment, Turn
from .base import DialectContext, Handler, shorten, text_of, with_files_named, with_outbox_named
from .claude_stream import ClaudeStream, result_error_text, result_usage, with_system_prompt_appended
from .coding_agents import TITLE_CHARS, Paragraphs, image_data, tool_title
from .events import (
    AgentInput,
    ErrorEvent,
    Event,
    Option,
    ProtocolWarning,
    Question,
    QuestionRequest,
    ReplyEvent,
    RequestWithdrawn,
    SessionGone,
    SteerOutcome,
    Usage,
    UsageEvent,
)
from .settings import JsonSettings
from .warm import Answers, WarmDialect, WarmState

KINDS = {
    "Bash": "exec",
    "BashOutput": "exec",
    "KillShell": "exec",
    "Read": "read",
    "NotebookRead": "read",
    "Glob": "search",
    "Grep": "search",
    "LS": "search",
    "WebSearch": "search",
    "Edit": "edit",
    "MultiEdit": "edit",
    "Write": "edit",
    "NotebookEdit": "edit",
    "WebFetch": "fetch",
    "TodoWrite": "think",
}
"""Claude Code's tools by the policy's kinds (`permissions.TOOL_KINDS`); any other tool (MCP's, Task…) is `other`."""

REQUIRED_FLAGS = {
    "--input-format": ("stream-json", "the bridge writes each message as a stream-json line on stdin"),
    "--output-format": ("stream-json", "the bridge reads Claude Code's stream-json output"),
    "--verbose": (None, "stream-json output needs it in print mode"),
    "--permission-prompt-tool": ("stdio", "tool approvals come to the bridge (else every tool not allowed fails)"),
    "--replay-user-messages": (None, "the bridge tells a steered message's turn by the CLI's echo of it"),
}
"""The flags the protocol cannot do without: flag → (its value, or None for a switch; why)."""

GONE = "No conversation found with session ID"
"""What Claude Code says when the session to resume is not among its stored ones."""
PLAN_QUESTION = "plan"
APPROVE = "Approve"
KEEP_PLANNING = "Keep planning"
_QUESTION_TOOLS = ("AskUserQuestion", "ExitPlanMode")


class ClaudeSdk(WarmDialect):
    """One Claude Code process driven by its SDKs' protocol (see the module docstring)."""

    name: ClassVar[str] = "claude-sdk"
    Settings: ClassVar[type] = JsonSettings
    can_steer: ClassVar[bool] = True

    def __init__(self, context: DialectContext, *, session_id: str, cwd: str) -> None:
        super().__init__(context, session_id=session_id, cwd=cwd)
        self._stored_session = session_id
        self._standing = ""  # added to the system prompt (`tell_standing`)
        self._next_id = 0
        self._calls: dict[str, str] = {}  # our control requests awaiting an answer: request id → subtype
        self._asked: dict[str, tuple[str, Mapping[str, Any]]] = {}  # the CLI's open requests: id → (tool, input)
        self._stream: ClaudeStream | None = None  # reads the turn's output as claude-stream-json does
        self._cancelling = False
        self._unechoed: set[str] = set()  # uuids of this turn's messages the CLI has not taken in yet
        self._steers: dict[str, str] = {}  # uuid of a steered message → its steer id
        self._earlier: set[str] = set()  # uuids of earlier turns' messages not taken in when their turn ended
        self._foreign = False  # the CLI's latest echo was an earlier turn's message: its turn is none of ours
        self._replies = Paragraphs(keep=True)  # the turn's results, a blank line between: bounded, as every reply
        self._cost = 0.0  # the CLI's total_cost_usd so far (it counts the whole process)
        self._last_uuid = ""
        self._start_failed = False  # the CLI said why it could not start (an error result before initialize's answer)

    # ------------------------------------------------------------------ what the engine writes

    def open(self) -> bytes:
        return self._control("initialize", {"hooks": None})

    def start_turn(self, turn: Turn, outbox: str) -> bytes:
        self._stream = ClaudeStream(self.context, turn)
        self._cancelling = False
        self._replies = Paragraphs(keep=True)
        self._steers = {}
        self._unechoed = set()
        return self._user_line(turn, outbox)

    def steer(self, turn: Turn, steer_id: str) -> bytes:
        if self.state is not WarmState.IN_TURN:
            raise ProtocolMisuse(
                f"steer() {'between turns' if self.state is WarmState.READY else 'now'}: only a "
                "running turn takes a steered message (prompt() it instead)"
            )
        data = self._user_line(turn)
        self._steers[self._last_uuid] = steer_id
        return data

    def cancel(self) -> bytes:
        if self.state is not WarmState.IN_TURN or self._cancelling:
            return b""
        self._cancelling = True
        self._asked.clear()  # the CLI withdraws what it asked (control_cancel_request): nothing to answer
        return self._control("interrupt", {})

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes:
        asked = self._asked.pop(request.request_id, None)
        if asked is None or self.state is WarmState.CLOSED:
            return b""  # withdrawn, answered already, or never asked
        tool, tool_input = asked
        if decision.allow:
            response: dict[str, Any] = {"behavior": "allow", "updatedInput": dict(tool_input)}
            if decision.always:
                response["updatedPermissions"] = [_session_rule(tool, tool_input)]
        else:
            message = decision.message or "The user denied this tool use."
            response = {"behavior": "deny", "message": message}
            if decision == CANCELLED:
                response["interrupt"] = True
        return _success(request.request_id, response)

    def answer_question(self, request: QuestionRequest, answers: Answers | None, why: str = "") -> bytes:
        asked = self._asked.pop(request.request_id, None)
        if asked is None or self.state is WarmState.CLOSED:
            return b""
        tool, tool_input = asked
        if answers is None:
            return _success(request.request_id, {"behavior": "deny", "message": why or "the user declined to answer"})
        if tool == "ExitPlanMode":
            chosen = answers.get(PLAN_QUESTION, ())
            if chosen == (APPROVE,):
                return _success(request.request_id, {"behavior": "allow", "updatedInput": dict(tool_input)})
            said = " ".join(label for label in chosen if label != KEEP_PLANNING).strip()
            message = f"The user wants to keep planning: {said}" if said else "The user wants to keep planning."
            return _success(request.request_id, {"behavior": "deny", "message": message})
        replies: dict[str, str] = {}
        for question in request.questions:
            labels = answers.get(question.id)
            if labels:
                replies[question.prompt] = ", ".join(labels)
        return _success(request.request_id, {"behavior": "allow", "updatedInput": {**tool_input, "answers": replies}})

    def tell_standing(self, instructions: str) -> bool:
        self._standing = instructions  # `--append-system-prompt` on the command line
        return True

    def command_line(self, argv: Sequence[str], command_at: int) -> tuple[str, ...]:
        if not self._standing:
            return tuple(argv)
        return with_system_prompt_appended(argv, command_at, self._standing)

    @classmethod
    def argv_problems(cls, argv: Sequence[str]) -> list[str]:
        problems = []
        for flag, (value, why) in REQUIRED_FLAGS.items():
            given = _flag_value(argv, flag, value is not None)
            if given is None:
                spelled = f"{flag} {value}" if value is not None else flag
                problems.append(f"the command lacks `{spelled}`: {why}")
            elif value is not None and given != value:
                problems.append(f"the command has `{flag} {given}`, the protocol needs `{flag} {value}`: {why}")
        return problems

    # ------------------------------------------------------------------ what the CLI writes

    def finish(self) -> list[Event]:
        if self.state is WarmState.IN_TURN:
            return [
                ErrorEvent(
                    "Claude Code's output ended in the middle of the turn (it exited); its stderr may say why",
                    unfinished=True,
                )
            ]
        if self.state is WarmState.STARTING and not self._start_failed:
            return [ErrorEvent("Claude Code exited before it answered initialize; its stderr may say why")]
        return []

    def _to_stream(self, message: Mapping[str, Any]) -> list[Event]:
        """A line of the turn's own output, read as `claude-stream-json` reads it; nothing outside a turn."""
        if self.state is not WarmState.IN_TURN or self._stream is None or self._foreign:
            return []
        return self._stream.on_object(message)

    def _user(self, message: Mapping[str, Any]) -> list[Event]:
        if message.get("isReplay") is not True:
            return self._to_stream(message)  # tool results
        echoed = text_of(message.get("uuid"))
        if echoed in self._unechoed:
            self._unechoed.discard(echoed)
            self._foreign = False
        elif echoed in self._earlier:
            self._earlier.discard(echoed)
            self._foreign = True  # the CLI runs a message of an earlier turn now: that turn's output is no one's
        return []

    def _result(self, message: Mapping[str, Any]) -> list[Event]:
        subtype = text_of(message.get("subtype"))
        failed = message.get("is_error") is True or subtype.startswith("error")
        cost = message.get("total_cost_usd")
        turn_cost = None
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            turn_cost, self._cost = max(float(cost) - self._cost, 0.0), float(cost)
        if self.state is WarmState.STARTING:
            self._start_failed = True
            text = result_error_text(message, subtype) if failed else "Claude Code ended a turn nobody started"
            if self._stored_session and GONE in text:
                return [SessionGone(text), ErrorEvent(text)]
            return [ErrorEvent(text)]
        if self.state is not WarmState.IN_TURN or self._foreign:
            self._foreign = False
            return []  # a turn the bridge did not start (a background task's; a cancelled turn's leftover)
        events: list[Event] = []
        usage = result_usage(message, False)
        if usage is not None or turn_cost is not None:
            usage = usage or Usage()
            events.append(UsageEvent(dataclasses.replace(usage, cost_usd=turn_cost), replace=False))
        if self._cancelling and (
            subtype == "error_during_execution" or text_of(message.get("terminal_reason")).startswith("aborted")
        ):
            return events + self._end("cancelled")
        if failed:
            events.append(ErrorEvent(result_error_text(message, subtype)))
        else:
            reply = text_of(message.get("result"))
            if reply:
                self._replies.pause()  # each result a paragraph of its own
                self._replies.add(reply)
        if not self._cancelling and any(steered in self._unechoed for steered in self._steers):
            return events  # a steered message not taken in yet: the CLI runs it next, in this bridge turn
        return events + self._end("error" if failed else "end_turn")

    def _end(self, reason: str) -> list[Event]:
        events: list[Event] = [SteerOutcome(steer_id, folded=True) for steer_id in self._steers.values()]
        if reason != "cancelled" and reason != "error":
            events.append(ReplyEvent(self._replies.text))
        self._earlier |= self._unechoed
        self._unechoed = set()
        self._steers = {}
        self._asked.clear()
        self._stream = None
        events.append(self.turn_over(reason))
        return events

    def _control_request(self, message: Mapping[str, Any]) -> list[Event]:
        request_id = message.get("request_id")
        request = message.get("request")
        if not isinstance(request_id, str) or not request_id:
            return [ProtocolWarning("Claude Code sent a control request without a request_id; ignored")]
        subtype = request.get("subtype") if isinstance(request, dict) else None
        handler = self.requests.get(subtype) if type(subtype) is str else None
        if handler is None or not isinstance(request, dict):
            return [AgentInput(_error(request_id, f"agent-bridge does not serve {shorten(str(subtype), 80)}"))]
        return handler(self, request_id, request)

    def _can_use_tool(self, request_id: str, request: Mapping[str, Any]) -> list[Event]:
        tool = text_of(request.get("tool_name"))
        tool_input = request.get("input")
        tool_input = tool_input if isinstance(tool_input, dict) else {}
        if self.state is not WarmState.IN_TURN or self._cancelling or self._foreign:
            why = "the turn was cancelled" if self._cancelling else "nobody is there to answer"
            return [AgentInput(_success(request_id, {"behavior": "deny", "message": why}))]
        if tool in _QUESTION_TOOLS:
            questions = questions_of(tool, tool_input)
            if questions:
                self._asked[request_id] = (tool, tool_input)
                return [QuestionRequest(request_id, questions, tool)]
        self._asked[request_id] = (tool, tool_input)
        title = tool_title(tool_input) or shorten(text_of(request.get("title")), TITLE_CHARS) or tool
        return [
            PermissionRequest(
                request_id=request_id, tool=tool, kind=KINDS.get(tool, "other"), title=title, input=tool_input
            )
        ]

    def _cancel_request(self, message: Mapping[str, Any]) -> list[Event]:
        request_id = text_of(message.get("request_id"))
        if self._asked.pop(request_id, None) is None:
            return []  # answered already, or never asked
        return [RequestWithdrawn(request_id)]

    def _control_response(self, message: Mapping[str, Any]) -> list[Event]:
        response = message.get("response")
        if not isinstance(response, dict):
            return []
        subtype = self._calls.pop(text_of(response.get("request_id")), None)
        if subtype is None:
            return []
        failed = response.get("subtype") == "error"
        said = shorten(text_of(response.get("error")), 300)
        if subtype == "initialize":
            if self.state is not WarmState.STARTING:
                return []
            events: list[Event] = []
            if failed:  # an older CLI without initialize: it takes turns all the same
                events.append(ProtocolWarning(f"Claude Code refused initialize ({said}); going on without it"))
            events.append(self.session_ready(self._stored_session))
            return events
        if failed:
            return [ProtocolWarning(f"Claude Code refused {subtype}: {said}")]
        return []

    # ------------------------------------------------------------------ helpers

    def _user_line(self, turn: Turn, outbox: str = "") -> bytes:
        self._last_uuid = str(uuid.uuid4())
        self._unechoed.add(self._last_uuid)
        return _encode(
            {
                "type": "user",
                "message": {"role": "user", "content": _content(turn, outbox)},
                "parent_tool_use_id": None,
                "session_id": "",
                "uuid": self._last_uuid,
            }
        )

    def _control(self, subtype: str, fields: Mapping[str, Any]) -> bytes:
        self._next_id += 1
        request_id = f"bridge_{self._next_id}"
        self._calls[request_id] = subtype
        return _encode({"type": "control_request", "request_id": request_id, "request": {"subtype": subtype, **fields}})

    # ------------------------------------------------------------------ the tables

    handlers: ClassVar[Mapping[str, Handler]] = {
        "stream_event": _to_stream,
        "assistant": _to_stream,
        "system": _to_stream,
        "user": _user,
        "result": _result,
        "control_request": _control_request,
        "control_response": _control_response,
        "control_cancel_request": _cancel_request,
    }
    requests: ClassVar[Mapping[str, Callable[[Any, str, Mapping[str, Any]], list[Event]]]] = {
        "can_use_tool": _can_use_tool,
    }
    """The CLI's control requests the bridge serves, by subtype; any other is answered with the error envelope."""


def questions_of(tool: str, tool_input: Mapping[str, Any]) -> tuple[Question, ...]:
    """The questions of an `AskUserQuestion` or `ExitPlanMode` call (() when its input holds none).

    AskUserQuestion's questions get the ids `q1`, `q2`… in their order; each
    takes the user's own words too (`free_text`), as Claude Code's own prompt
    does ("Other"). ExitPlanMode is one question, id `plan`: the plan as its
    prompt, `Approve` or `Keep planning`, or the user's words (feedback, the
    model keeps planning with them).
    """
    if tool == "ExitPlanMode":
        plan = text_of(tool_input.get("plan"))
        choices = (
            Option(APPROVE, "leave plan mode and carry the plan out"),
            Option(KEEP_PLANNING, "stay in plan mode"),
        )
        return (Question(PLAN_QUESTION, plan or "Approve the plan?", choices, free_text=True, header="Plan"),)
    questions = tool_input.get("questions")
    if not isinstance(questions, list):
        return ()
    asked: list[Question] = []
    for index, question in enumerate(questions, 1):
        if not isinstance(question, dict) or not text_of(question.get("question")):
            continue
        options = tuple(
            Option(text_of(option.get("label")), text_of(option.get("description")))
            for option in question.get("options") or ()
            if isinstance(option, dict) and text_of(option.get("label"))
        )
        asked.append(
            Question(
                f"q{index}",
                text_of(question.get("question")),
                options,
                multi_select=question.get("multiSelect") is True,
                free_text=True,
                header=text_of(question.get("header")),
            )
        )
    return tuple(asked)


def _session_rule(tool: str, tool_input: Mapping[str, Any]) -> dict[str, Any]:
    """ "Always" for this session only: a Bash command exactly, any other tool whole (no `ruleContent`: the CLI
    drops every update of an answer if one has `ruleContent: null`)."""
    rule: dict[str, Any] = {"toolName": tool}
    command = tool_input.get("command")
    if tool == "Bash" and isinstance(command, str) and command:
        rule["ruleContent"] = command
    return {"type": "addRules", "rules": [rule], "behavior": "allow", "destination": "session"}


def _content(turn: Turn, outbox: str) -> str | list[dict[str, Any]]:
    """A message's `content`: its text, and with fetched images of a type the Messages API takes, an `image` block
    (base64) each; every other fetched file is named in the text by its path, for Claude Code to read, and an
    attachment that was not fetched is listed by its URL."""
    images: list[dict[str, Any]] = []
    named: list[Attachment] = []
    for attachment in turn.attachments:
        data = image_data(attachment)
        if data is not None:
            source = {"type": "base64", "media_type": attachment.media_type, "data": data}
            images.append({"type": "image", "source": source})
        elif attachment.path:
            named.append(attachment)
    text = with_files_named(turn.message, named) or turn.message
    if unfetched := [a for a in turn.attachments if not a.path]:
        listing = "\n".join(["[Attached]", *(f"- {a.name}: {a.url}" if a.name else f"- {a.url}" for a in unfetched)])
        text = f"{text}\n\n{listing}" if text.strip() else listing
    text = with_outbox_named(text, outbox)
    if not images:
        return text
    return [*images, {"type": "text", "text": text}] if text.strip() else images  # images first, as Anthropic advises


def _flag_value(argv: Sequence[str], flag: str, takes_value: bool) -> str | None:
    """`flag`'s value in `argv` (`--flag value` or `--flag=value`; "" for a switch given); None when absent."""
    for index, item in enumerate(argv):
        if item == "--":
            break
        if item == flag:
            if not takes_value:
                return ""
            return argv[index + 1] if index + 1 < len(argv) else ""
        if item.startswith(flag + "="):
            return item[len(flag) + 1 :]
    return None


def _encode(message: Mapping[str, Any]) -> bytes:
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "replace")


def _success(request_id: str, response: Mapping[str, Any]) -> bytes:
    return _encode(
        {"type": "control_response", "response": {"subtype": "success", "request_id": request_id, "response": response}}
    )


def _error(request_id: str, text: str) -> bytes:
    return _encode(
        {"type": "control_response", "response": {"subtype": "error", "request_id": request_id, "error": text}}
    )
