"""The codex-app-server dialect, pure: real transcripts of the pinned `codex app-server` replayed, and every rule.

tests/transcripts/codex-app-server/NAME.jsonl is codex's stdout byte for byte
while the dialect drove it (`capture.py` there), NAME.script.json what the
bridge did and at which byte (a prompt, an answer, a cancel, a steer). A replay
feeds the bytes in any split, does the same at the same byte, and must see the
same events; every message the dialect writes validates against the pinned
binary's schema (tests/schemas/codex-app-server/, checked against the binary here).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from agents_cache import npm_binary
from codex_app_server_schema import SCHEMAS, WHOLE, generate, load

from bridge.dialects import DialectContext, dialect_class
from bridge.dialects.codex_app_server import MAX_HELD, CodexAppServer
from bridge.dialects.events import (
    ActivityEvent,
    AgentInput,
    ErrorEvent,
    Event,
    Option,
    PartialEvent,
    PlanStep,
    ProtocolWarning,
    Question,
    QuestionRequest,
    Ready,
    ReplyEvent,
    RequestWithdrawn,
    SessionGone,
    SteerOutcome,
    TurnEnd,
    Usage,
    UsageEvent,
)
from bridge.dialects.settings import CodexAppServerSettings
from bridge.errors import ProtocolMisuse
from bridge.permissions import CANCELLED, Decision, PermissionRequest
from bridge.turn import Attachment, Turn

TRANSCRIPTS = Path(__file__).resolve().parent / "transcripts" / "codex-app-server"
WORK = "/tmp/tmpi5_1tp9s/ws"  # the capture's working directory, as codex names it in the transcripts
THREAD = "01a217a1-15ff-7a71-b0cd-177b7afe8769"
CAPTURED = {
    "new-thread": CodexAppServerSettings(sandbox="read-only"),
    "resume": CodexAppServerSettings(sandbox="read-only"),
    "resume-unknown": CodexAppServerSettings(sandbox="read-only"),
    "plan-mode": CodexAppServerSettings(sandbox="read-only", plan_mode=True),
}
STORED = {"resume": THREAD, "resume-unknown": "01a2177e-0000-7000-8000-000000000000"}


def dialect(settings: CodexAppServerSettings | None = None, session_id: str = "") -> CodexAppServer:
    made = dialect_class("codex-app-server")(
        DialectContext(settings=settings or CodexAppServerSettings()), session_id=session_id, cwd=WORK
    )
    assert isinstance(made, CodexAppServer)
    return made


class Replay:
    """A transcript fed to a fresh dialect in chunks `split` cuts, the bridge's actions done at their byte."""

    def __init__(self, name: str, split: Callable[[bytes], Iterator[bytes]] = lambda data: iter([data])) -> None:
        self.dialect = dialect(CAPTURED[name], STORED.get(name, ""))
        self.written: list[bytes] = [self.dialect.open()]
        self.events: list[Event] = []
        self.turns: list[list[Event]] = []  # the events of each turn, its TurnEnd last
        data = (TRANSCRIPTS / f"{name}.jsonl").read_bytes()
        script = json.loads((TRANSCRIPTS / f"{name}.script.json").read_text())
        at = 0
        for action in [*script, {"at": len(data), "do": "end"}]:
            for chunk in split(data[at : action["at"]]):
                self._take(self.dialect.feed(chunk))
            at = action["at"]
            self._do(action)
        self._take(self.dialect.close())

    def _take(self, events: list[Event]) -> None:
        for event in events:
            self.events.append(event)
            if isinstance(event, AgentInput):
                self.written.append(event.data)
            if isinstance(event, TurnEnd):
                start = max((i for i, e in enumerate(self.events[:-1]) if isinstance(e, TurnEnd)), default=-1) + 1
                self.turns.append([e for e in self.events[start:] if not isinstance(e, AgentInput)])

    def _do(self, action: dict[str, Any]) -> None:
        kind, dialect = action["do"], self.dialect
        if kind == "prompt":
            self.written.append(dialect.prompt(Turn(action["text"])))
        elif kind == "answer":
            request = [event for event in self.events if isinstance(event, PermissionRequest)][-1]
            self.written.append(dialect.answer(request, Decision(allow=action["allow"], always=action["always"])))
        elif kind == "answer_question":
            question = [event for event in self.events if isinstance(event, QuestionRequest)][-1]
            answers = action["answers"]
            labels = {key: tuple(value) for key, value in answers.items()} if answers is not None else None
            self.written.append(dialect.answer_question(question, labels, "declined"))
        elif kind == "cancel":
            self.written.append(dialect.cancel())
        elif kind == "steer":
            self.written.append(dialect.steer(Turn(action["text"]), action["steer_id"]))

    def messages(self) -> list[dict[str, Any]]:
        """Every message the dialect wrote, in order."""
        return [json.loads(line) for data in self.written for line in data.decode().splitlines()]


def of(kind: type, events: list[Any]) -> list[Any]:
    return [event for event in events if isinstance(event, kind)]


def partial_text(events: list[Event]) -> str:
    return "".join(event.text for event in of(PartialEvent, events))


@pytest.fixture(scope="module")
def new_thread() -> Replay:
    return Replay("new-thread")


# ---------------------------------------------------------------------- the real transcripts


def test_a_new_thread_is_the_session_and_a_turn_streams_its_reply_and_the_threads_usage(new_thread):
    [ready] = of(Ready, new_thread.events)
    assert ready.session_id == THREAD
    first = new_thread.turns[0]
    assert partial_text(first) == "Hello from the fake model."
    assert of(ReplyEvent, first) == [ReplyEvent("Hello from the fake model.")]  # the echoed userMessage is not it
    assert of(UsageEvent, first)[-1] == UsageEvent(Usage(100, 20, 7, 3, 120))
    assert first[-1] == TurnEnd("end_turn")
    assert not of(ErrorEvent, new_thread.events[: new_thread.events.index(first[-1])])
    # usage is the thread's running total: the second turn's replaces the first's and counts it
    assert of(UsageEvent, new_thread.turns[1])[-1].usage.total_tokens == 240


def test_the_handshake_initializes_then_starts_a_thread_without_a_jsonrpc_member(new_thread):
    initialize, initialized, start = new_thread.messages()[:3]
    assert initialize["method"] == "initialize" and initialize["id"] == 0 and "jsonrpc" not in initialize
    assert initialize["params"]["capabilities"]["experimentalApi"] is False
    assert initialized == {"method": "initialized"}
    assert start["method"] == "thread/start"
    assert start["params"] == {"cwd": WORK, "approvalPolicy": "on-request", "sandbox": "read-only"}


def test_reasoning_is_thinking_and_a_command_is_tool_activity(new_thread):
    think, run = new_thread.turns[1], new_thread.turns[2]
    assert of(ActivityEvent, think) == [ActivityEvent("thinking", text="Thinking about: about life")]
    assert of(ReplyEvent, think) == [ReplyEvent("about life")]
    started, completed = of(ActivityEvent, run)
    assert (started.tool, started.title, started.status) == ("command_execution", "echo hi", "started")
    assert (completed.title, completed.status, completed.text) == ("echo hi", "completed", "exit code 0: hi")
    assert started.call_id == completed.call_id != ""
    assert of(ReplyEvent, run) == [ReplyEvent("ran: hi")]


def test_command_approvals_are_permission_requests_answered_accept_decline_and_accept_for_session(new_thread):
    accepted, declined, always, again = new_thread.turns[3:7]
    requests = [of(PermissionRequest, turn) for turn in (accepted, declined, always, again)]
    assert [len(asked) for asked in requests] == [1, 1, 1, 0]  # the same command, accepted for the session
    request = requests[0][0]
    assert (request.tool, request.kind, request.title) == ("command_execution", "exec", f"touch {WORK}/accepted")
    assert request.input["reason"] == "the test asks for it" and request.input["cwd"] == WORK
    answers = [message for message in new_thread.messages() if "result" in message and "decision" in message["result"]]
    assert [answer["result"]["decision"] for answer in answers[:3]] == ["accept", "decline", "acceptForSession"]
    assert [answer["id"] for answer in answers[:3]] == [0, 1, 2]  # codex's own ids, from 0
    assert of(ActivityEvent, declined)[-1].status == "denied"
    assert all(turn[-1] == TurnEnd("end_turn") for turn in (accepted, declined, always, again))


def test_a_file_change_approval_is_an_edit_named_by_its_paths(new_thread):
    patched = new_thread.turns[7]
    [request] = of(PermissionRequest, patched)
    assert (request.tool, request.kind, request.title) == ("file_change", "edit", f"add {WORK}/notes.txt")
    assert of(ActivityEvent, patched)[-1].status == "completed"
    assert of(ReplyEvent, patched)[0].text.startswith("patched: ")


def test_a_cancel_during_a_pending_approval_interrupts_and_the_withdrawn_request_takes_no_answer(new_thread):
    cancelled = new_thread.turns[8]
    assert cancelled[-1] == TurnEnd("cancelled") and not of(ErrorEvent, cancelled) and not of(ReplyEvent, cancelled)
    interrupt = [message for message in new_thread.messages() if message.get("method") == "turn/interrupt"]
    assert len(interrupt) == 1 and interrupt[0]["params"]["threadId"] == THREAD
    [request] = of(PermissionRequest, cancelled)
    assert new_thread.dialect.answer(request, Decision(allow=True)) == b""


def test_a_steered_message_is_folded_into_the_running_turn_before_it_ends(new_thread):
    steered = new_thread.turns[9]
    assert of(SteerOutcome, steered) == [SteerOutcome("steer-1", folded=True)]
    assert steered.index(of(SteerOutcome, steered)[0]) < len(steered) - 1
    # the model's next request carried the command's output and the steered message: it answered the latter
    assert of(ReplyEvent, steered) == [ReplyEvent("steered")]
    [steer] = [message for message in new_thread.messages() if message.get("method") == "turn/steer"]
    assert steer["params"]["expectedTurnId"] and steer["params"]["input"] == [{"type": "text", "text": "say steered"}]


def test_a_failed_turn_fails_with_codexs_error_and_the_next_turn_works(new_thread):
    failed, after = new_thread.turns[10:12]
    [error] = of(ErrorEvent, failed)
    assert "401 Unauthorized" in error.text and "bad key" in error.text
    assert failed[-1] == TurnEnd("failed") and not of(ReplyEvent, failed)
    assert of(ReplyEvent, after) == [ReplyEvent("after failure")] and after[-1] == TurnEnd("end_turn")
    assert len(new_thread.turns) == 12


def test_a_stored_thread_is_resumed_without_its_history_and_its_usage_goes_on():
    replay = Replay("resume")
    resume = [message for message in replay.messages() if message.get("method") == "thread/resume"]
    assert resume[0]["params"]["threadId"] == THREAD and resume[0]["params"]["excludeTurns"] is True
    assert of(Ready, replay.events) == [Ready(THREAD)]
    [turn] = replay.turns
    assert of(ReplyEvent, turn) == [ReplyEvent("again")]
    assert of(UsageEvent, turn)[-1].usage.total_tokens > 120 * 12  # the thread's total, every earlier turn counted


def test_a_stored_thread_codex_has_no_rollout_of_is_gone():
    replay = Replay("resume-unknown")
    [gone] = of(SessionGone, replay.events)
    assert "no rollout found for thread id" in gone.detail
    assert not of(Ready, replay.events)


def test_plan_modes_question_is_asked_and_answered_and_a_declined_one_answers_nothing():
    replay = Replay("plan-mode")
    answered, declined = replay.turns
    [question] = of(QuestionRequest, answered)
    assert question.tool == "request_user_input" and question.request_id == "0"
    assert question.questions == (
        Question(
            "color",
            "Which color?",
            (Option("Red", "pick Red"), Option("Blue", "pick Blue")),
            free_text=True,
            header="Color",
        ),
    )
    answers = [message["result"] for message in replay.messages() if "answers" in message.get("result", {})]
    assert answers == [{"answers": {"color": {"answers": ["Blue"]}}}, {"answers": {}}]
    assert of(ReplyEvent, answered)[0].text == 'answered: {"answers":{"color":{"answers":["Blue"]}}}'
    assert of(ReplyEvent, declined)[0].text == 'answered: {"answers":{}}'  # codex went on without an answer
    start = [message for message in replay.messages() if message.get("method") == "turn/start"][0]
    assert start["params"]["collaborationMode"] == {
        "mode": "plan",
        "settings": {"model": "gpt-5.5", "developer_instructions": None},
    }
    assert replay.messages()[0]["params"]["capabilities"]["experimentalApi"] is True


def _cut_everywhere(data: bytes) -> Iterator[bytes]:
    return (data[i : i + 1] for i in range(len(data)))


def _cut_at_random(seed: int) -> Callable[[bytes], Iterator[bytes]]:
    def split(data: bytes) -> Iterator[bytes]:
        chooser = random.Random(seed + len(data))
        at = 0
        while at < len(data):
            size = chooser.randint(1, 700)
            yield data[at : at + size]
            at += size

    return split


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_any_split_of_the_bytes_gives_the_same_events(name):
    whole = Replay(name)
    assert Replay(name, _cut_everywhere).events == whole.events
    for seed in range(3):
        assert Replay(name, _cut_at_random(seed)).events == whole.events


# ---------------------------------------------------------------------- the schema


def test_the_kept_schema_is_what_the_pinned_codex_prints():
    for name, text in generate(npm_binary("codex")).items():
        assert (SCHEMAS / name).read_text() == text, (
            f"codex app-server's schema of {name} changed: see the diff, then `python tests/codex_app_server_schema.py`"
        )


def _validator(name: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(load(name))


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_every_message_the_dialect_writes_is_valid_by_the_schema(name):
    replay = Replay(name)
    asked = {}  # codex's request id → its method (codex numbers its requests afresh per process)
    for line in (TRANSCRIPTS / f"{name}.jsonl").read_bytes().splitlines():
        message = json.loads(line)
        if "method" in message and "id" in message:
            asked[message["id"]] = message["method"]
    responses = {
        "item/commandExecution/requestApproval": "CommandExecutionRequestApprovalResponse.json",
        "item/fileChange/requestApproval": "FileChangeRequestApprovalResponse.json",
        "item/tool/requestUserInput": "ToolRequestUserInputResponse.json",
    }
    for message in replay.messages():
        if "method" in message:
            _validator("ClientRequest.json" if "id" in message else "ClientNotification.json").validate(message)
        elif "error" in message:
            _validator("JSONRPCError.json").validate(message)
        else:
            _validator(responses[asked[message["id"]]]).validate(message["result"])
    assert set(WHOLE) >= set(responses.values())


# ---------------------------------------------------------------------- every rule, by hand


def line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


def in_turn(settings: CodexAppServerSettings | None = None, turn_id: str = "T1") -> CodexAppServer:
    """A dialect whose thread is ready and whose turn `turn_id` has started (its response read)."""
    made = dialect(settings)
    made.open()
    made.feed(line({"id": 0, "result": {}}))
    made.feed(line({"id": 1, "result": {"thread": {"id": "th-1"}, "model": "gpt-5.5"}}))
    made.prompt(Turn("hi"))
    if turn_id:
        made.feed(line({"id": 2, "result": {"turn": {"id": turn_id}}}))
    return made


def note(method: str, **params: Any) -> bytes:
    return line({"method": method, "params": {"threadId": "th-1", **params}})


def completed(turn_id: str = "T1", status: str = "completed", **turn: Any) -> bytes:
    return note("turn/completed", turn={"id": turn_id, "status": status, **turn})


def test_codexs_request_id_0_is_its_own_even_while_our_request_0_awaits_its_response():
    made = dialect()
    made.open()  # our initialize is id 0
    events = made.feed(line({"id": 0, "method": "item/tool/call", "params": {}}))
    [refusal] = of(AgentInput, events)
    assert json.loads(refusal.data)["error"]["code"] == -32601  # answered at once: no turn waits for it
    [handshake] = of(AgentInput, made.feed(line({"id": 0, "result": {}})))  # still our initialize's response
    assert b'"initialized"' in handshake.data and b"thread/start" in handshake.data


def test_what_codex_says_of_a_turn_before_its_id_is_known_waits_for_it_and_another_turns_is_dropped():
    made = in_turn(turn_id="")
    early = [
        note("item/agentMessage/delta", turnId="OLD", itemId="m0", delta="stale"),
        note("item/agentMessage/delta", turnId="T1", itemId="m1", delta="early"),
        line({"id": 7, "method": "item/commandExecution/requestApproval", "params": {"turnId": "OLD", "itemId": "c"}}),
    ]
    assert [made.feed(data) for data in early] == [[], [], []]
    events = made.feed(line({"id": 2, "result": {"turn": {"id": "T1"}}}))
    assert of(PartialEvent, events) == [PartialEvent("early")]
    [declined] = of(AgentInput, events)  # the old turn's request: nobody asks the user now
    assert json.loads(declined.data) == {"id": 7, "result": {"decision": "decline"}}


def test_a_codex_that_talks_on_without_naming_its_turn_is_held_to_a_bound_and_its_requests_are_declined():
    made = in_turn(turn_id="")
    for index in range(MAX_HELD):
        assert made.feed(note("item/agentMessage/delta", turnId="T1", itemId="m1", delta=f"{index} ")) == []
    assert made.feed(note("item/agentMessage/delta", turnId="T1", itemId="m1", delta="past the bound")) == []
    approval = {"turnId": "T1", "itemId": "c", "command": "rm -rf /"}
    [declined] = made.feed(line({"id": 9, "method": "item/commandExecution/requestApproval", "params": approval}))
    assert json.loads(declined.data) == {"id": 9, "result": {"decision": "decline"}}  # nobody waits for it
    events = made.feed(line({"id": 2, "result": {"turn": {"id": "T1"}}}))
    assert "".join(event.text for event in of(PartialEvent, events)) == "".join(f"{i} " for i in range(MAX_HELD))


def test_a_cancel_before_the_turns_id_interrupts_once_the_id_arrives_and_ends_cancelled():
    made = in_turn(turn_id="")
    assert made.cancel() == b""
    [interrupt] = of(AgentInput, made.feed(line({"id": 2, "result": {"turn": {"id": "T1"}}})))
    assert json.loads(interrupt.data)["method"] == "turn/interrupt"
    assert json.loads(interrupt.data)["params"] == {"threadId": "th-1", "turnId": "T1"}
    assert made.feed(line({"id": 3, "error": {"code": -32600, "message": "no active turn to interrupt"}})) == []
    assert made.feed(completed(status="interrupted")) == [TurnEnd("cancelled")]


def test_a_turn_codex_interrupts_unasked_fails():
    assert in_turn().feed(completed(status="interrupted")) == [
        ErrorEvent("codex interrupted the turn by itself"),
        TurnEnd("cancelled"),
    ]


def test_a_pending_approval_the_engine_cancels_is_answered_cancel():
    made = in_turn()
    [request] = made.feed(line({"id": 0, "method": "item/fileChange/requestApproval", "params": {"turnId": "T1"}}))
    assert json.loads(made.answer(request, CANCELLED)) == {"id": 0, "result": {"decision": "cancel"}}
    assert made.cancel() == b""  # the turn is being cancelled already
    assert made.feed(completed(status="interrupted")) == [TurnEnd("cancelled")]


def test_a_request_codex_resolves_by_itself_takes_no_answer_later():
    made = in_turn()
    params = {"turnId": "T1", "itemId": "c1", "command": "/bin/bash -lc 'rm x'", "commandActions": []}
    [request] = made.feed(line({"id": 4, "method": "item/commandExecution/requestApproval", "params": params}))
    assert request.title == "/bin/bash -lc 'rm x'"  # no parsed action: the command as codex runs it
    assert made.feed(note("serverRequest/resolved", requestId=4)) == [RequestWithdrawn("4")]
    assert made.answer(request, Decision(allow=True)) == b""


def test_a_request_the_bridge_answered_is_not_withdrawn_by_its_resolution():
    made = in_turn()
    params = {"turnId": "T1", "itemId": "c1", "command": "ls", "commandActions": []}
    [request] = made.feed(line({"id": 5, "method": "item/commandExecution/requestApproval", "params": params}))
    assert made.answer(request, Decision(allow=True)) != b""
    assert made.feed(note("serverRequest/resolved", requestId=5)) == []


def test_a_steer_unanswered_when_the_turn_completes_holds_the_turns_end_until_codex_answers():
    made = in_turn()
    steer = json.loads(made.steer(Turn("more"), "s1"))
    assert made.feed(note("item/completed", turnId="T1", item={"type": "agentMessage", "id": "m", "text": "hi"})) == [
        PartialEvent("hi")  # a message that came whole, without deltas
    ]
    assert made.feed(completed()) == []
    events = made.feed(line({"id": steer["id"], "error": {"code": -32600, "message": "no active turn"}}))
    assert events == [SteerOutcome("s1", folded=False), ReplyEvent("hi"), TurnEnd("end_turn")]


def test_a_steer_before_the_turns_id_is_sent_with_the_id_and_one_during_a_cancel_is_not_folded():
    made = in_turn(turn_id="")
    assert made.steer(Turn("early"), "s1") == b""
    [sent] = of(AgentInput, made.feed(line({"id": 2, "result": {"turn": {"id": "T1"}}})))
    steer = json.loads(sent.data)
    assert steer["params"]["expectedTurnId"] == "T1"
    assert made.feed(line({"id": steer["id"], "result": {"turnId": "T1"}})) == [SteerOutcome("s1", folded=True)]
    made.cancel()
    assert made.steer(Turn("late"), "s2") == b""
    assert made.feed(completed(status="interrupted")) == [SteerOutcome("s2", folded=False), TurnEnd("cancelled")]
    with pytest.raises(ProtocolMisuse):
        made.steer(Turn("between"), "s3")


def test_several_messages_of_a_turn_are_its_reply_a_blank_line_between_as_the_partials_show_them():
    made = in_turn()
    events: list[Event] = []
    for item_id, text in (("m1", "Let me look."), ("m2", "Found it.")):
        item = {"type": "agentMessage", "id": item_id, "text": ""}
        events += made.feed(note("item/started", turnId="T1", item=item))
        events += made.feed(note("item/agentMessage/delta", turnId="T1", itemId=item_id, delta=text))
        events += made.feed(note("item/completed", turnId="T1", item={**item, "text": text}))
    events += made.feed(completed())
    assert partial_text(events) == "Let me look.\n\nFound it."
    assert of(ReplyEvent, events) == [ReplyEvent("Let me look.\n\nFound it.")]


def test_a_retry_is_a_warning_plans_are_plan_steps_and_other_items_are_tool_activity():
    made = in_turn()
    assert made.feed(note("error", turnId="T1", willRetry=True, error={"message": "Reconnecting 1/5"})) == [
        ProtocolWarning("codex is retrying a request to its model API: Reconnecting 1/5")
    ]
    plan = [{"step": "Look", "status": "completed"}, {"step": "Fix", "status": "inProgress"}, {"step": "Test"}]
    assert made.feed(note("turn/plan/updated", turnId="T1", plan=plan)) == [
        ActivityEvent("plan", plan=(PlanStep("Look", "completed"), PlanStep("Fix", "in_progress"), PlanStep("Test")))
    ]
    mcp = {"type": "mcpToolCall", "id": "x", "server": "docs", "tool": "find", "status": "inProgress"}
    [started] = made.feed(note("item/started", turnId="T1", item=mcp))
    assert (started.tool, started.status) == ("docs.find", "started")
    assert made.feed(note("item/started", turnId="T1", item={"type": "somethingNew", "id": "y"})) == []
    made.feed(note("error", turnId="T1", willRetry=False, error={"message": "gave up"}))
    assert made.feed(completed(status="failed")) == [ErrorEvent("gave up"), TurnEnd("failed")]


def test_a_refused_turn_start_fails_the_turn_and_a_refused_thread_start_fails_the_start():
    made = in_turn(turn_id="")
    assert made.feed(line({"id": 2, "error": {"code": -32600, "message": "invalid thread id"}})) == [
        ErrorEvent("codex refused the turn: invalid thread id"),
        TurnEnd("error"),
    ]
    starting = dialect(session_id="01a2177e-c32f-7771-a36f-278a4fc739f0")
    starting.open()
    starting.feed(line({"id": 0, "result": {}}))
    assert starting.feed(line({"id": 1, "error": {"code": -32603, "message": "disk full"}})) == [
        ErrorEvent("codex refused thread/resume: disk full")  # not proof that the thread is gone
    ]
    assert starting.close() == [
        ErrorEvent("codex's output ended before its thread was ready; its stderr may say why", unfinished=True)
    ]


def test_image_attachments_are_images_and_other_attachments_are_named_in_the_text():
    made = dialect()
    made.open()
    made.feed(line({"id": 0, "result": {}}))
    made.feed(line({"id": 1, "result": {"thread": {"id": "th-1"}}}))
    attachments = (
        Attachment("image", "file:///tmp/a%20b.png"),
        Attachment("image", "https://x.test/c.png"),
        Attachment("file", "https://x.test/notes.txt"),
    )
    start = json.loads(made.prompt(Turn("look", attachments=attachments)))
    assert start["params"]["input"] == [
        {"type": "text", "text": "look"},
        {"type": "localImage", "path": "/tmp/a b.png"},
        {"type": "image", "url": "https://x.test/c.png"},
        {"type": "text", "text": "[attached file: notes.txt https://x.test/notes.txt]"},
    ]


def test_fetched_images_are_local_images_and_other_fetched_files_are_named_in_the_text():
    made = dialect()
    made.open()
    made.feed(line({"id": 0, "result": {}}))
    made.feed(line({"id": 1, "result": {"thread": {"id": "th-1"}}}))
    turns = "/w/.agent-bridge/attachments/t1"
    attachments = (
        Attachment("image", "https://x.test/c.png", path=f"{turns}/c.png", media_type="image/png", size=9),
        Attachment("file", "https://x.test/n", name="notes.txt", path=f"{turns}/notes.txt", media_type="text/plain"),
    )
    start = json.loads(made.prompt(Turn("look", attachments=attachments)))
    assert start["params"]["input"] == [
        {"type": "text", "text": f"look\n\nAttached files:\n- {turns}/notes.txt (file, text/plain)"},
        {"type": "localImage", "path": f"{turns}/c.png"},
    ]


@pytest.mark.parametrize(
    ("argv", "problems"),
    [
        (["codex", "app-server"], 0),
        (["codex", "app-server", "--listen", "stdio://"], 0),
        (["codex", "exec"], 1),
        (["codex", "app-server", "--listen", "ws://127.0.0.1:4000"], 1),
        (["codex", "app-server", "--listen=unix:///tmp/s"], 1),
    ],
)
def test_check_says_what_the_command_line_lacks(argv, problems):
    assert len(CodexAppServer.argv_problems(argv)) == problems


@pytest.mark.parametrize(
    "bad",
    [{"approval_policy": "always"}, {"sandbox": "none"}, {"model": ""}],
)
def test_settings_refuse_what_codex_would_not_take(bad):
    with pytest.raises(ValueError):
        CodexAppServerSettings(**bad)
