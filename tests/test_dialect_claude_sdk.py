"""protocol: claude-sdk, the pure dialect, fed what Claude Code 2.1.197 wrote (tests/transcripts/claude-sdk/).

Each transcript holds every line the real CLI read (`"dir": "in"`) and wrote
(`"out"`), in order (captured by /work/notes' claude-sdk-drive.py, trimmed). A
replay feeds the CLI's lines to the dialect and, where the CLI read something,
makes the dialect write its own version of it: a user line is `prompt()` (or
`steer()` while a turn runs), an interrupt is `cancel()`, an answer is
`answer()`/`answer_question()`. The echo of a user message
(`--replay-user-messages`) carries the uuid the dialect chose.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bridge.dialects import (
    ActivityEvent,
    AgentInput,
    DialectContext,
    ErrorEvent,
    PartialEvent,
    ProtocolWarning,
    QuestionRequest,
    Ready,
    ReplyEvent,
    RequestWithdrawn,
    SessionEvent,
    SessionGone,
    SteerOutcome,
    TurnEnd,
    UsageEvent,
    dialect_class,
)
from bridge.dialects.claude_sdk import ClaudeSdk, questions_of
from bridge.dialects.warm import WarmState
from bridge.errors import ProtocolMisuse
from bridge.permissions import CANCELLED, Decision, PermissionRequest
from bridge.turn import Attachment, Turn

TRANSCRIPTS = Path(__file__).parent / "transcripts" / "claude-sdk"
SESSION = "25b7d05a-10b6-45b0-9000-2fffdf57b38a"


def dialect(session_id: str = "") -> ClaudeSdk:
    dialect: ClaudeSdk = dialect_class("claude-sdk")(DialectContext(), session_id=session_id, cwd="/work")
    return dialect


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


def written(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines()]


@dataclass
class Replay:
    """What a replay saw: every event, and every line the dialect wrote."""

    events: list[Any] = field(default_factory=list)
    wrote: list[dict[str, Any]] = field(default_factory=list)

    def of(self, kind: type) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]


Splitter = Callable[[bytes], Iterator[bytes]]


def whole(data: bytes) -> Iterator[bytes]:
    yield data


def replay(
    name: str,
    split: Splitter = whole,
    session_id: str = "",
    decide: Callable[[PermissionRequest, dict[str, Any]], Decision] | None = None,
) -> Replay:
    """Feed transcript `name` to a fresh dialect; its "in" lines become the dialect's own calls (see the module
    docstring). `decide` turns a permission request and the answer the CLI got into a `Decision`."""
    sdk = dialect(session_id)
    seen = Replay()
    pending: dict[str, Any] = {}  # request id → the PermissionRequest / QuestionRequest asked
    uuids: dict[str, str] = {}  # a user message's text → the uuid the dialect gave it
    chunk = b""

    def feed() -> None:
        nonlocal chunk
        for piece in split(chunk):
            for event in sdk.feed(piece):
                seen.events.append(event)
                if isinstance(event, (PermissionRequest, QuestionRequest)):
                    pending[event.request_id] = event
                if isinstance(event, AgentInput):
                    seen.wrote.extend(written(event.data))
        chunk = b""

    def write(data: bytes) -> None:
        seen.wrote.extend(written(data))

    for line in (TRANSCRIPTS / f"{name}.jsonl").read_text().splitlines():
        record = json.loads(line)
        message = record["msg"]
        if record["dir"] == "out":
            if message.get("isReplay"):
                message = {**message, "uuid": uuids.get(message["message"]["content"], message["uuid"])}
            chunk += encode(message)
            continue
        feed()
        kind = message["type"]
        if kind == "user":
            turn = Turn(message["message"]["content"])
            data = sdk.steer(turn, f"steer-{len(uuids)}") if sdk.state is WarmState.IN_TURN else sdk.prompt(turn)
            uuids[turn.message] = written(data)[0]["uuid"]
            write(data)
        elif kind == "control_request":
            write(sdk.open() if message["request"]["subtype"] == "initialize" else sdk.cancel())
        elif kind == "control_response":
            response = message["response"]
            asked = pending.pop(response["request_id"], None)
            if isinstance(asked, QuestionRequest) and response["subtype"] == "error":
                write(sdk.answer_question(asked, None, response["error"]))
            elif isinstance(asked, QuestionRequest):
                given = response["response"]["updatedInput"].get("answers", {})
                by_prompt = {question.prompt: question.id for question in asked.questions}
                answers = {by_prompt[prompt]: tuple(text.split(", ")) for prompt, text in given.items()}
                write(sdk.answer_question(asked, answers))
            elif isinstance(asked, PermissionRequest):
                body = response.get("response") or {}
                if decide is not None:
                    decision = decide(asked, body)
                elif response["subtype"] == "error":
                    decision = Decision(allow=False, message=response["error"])
                else:
                    decision = Decision(
                        body["behavior"] == "allow", bool(body.get("updatedPermissions")), body.get("message", "")
                    )
                write(sdk.answer(asked, decision))
    feed()
    seen.events.extend(sdk.close())
    return seen


# ---------------------------------------------------------------------- the handshake


def test_open_is_the_initialize_request_and_its_answer_makes_the_session_ready():
    sdk = dialect()
    [request] = written(sdk.open())
    assert request == {
        "type": "control_request",
        "request_id": request["request_id"],
        "request": {"subtype": "initialize", "hooks": None},
    }
    answer = {"type": "control_response", "response": {"subtype": "success", "request_id": request["request_id"]}}
    assert sdk.feed(encode(answer)) == [Ready("")]


def test_a_resumed_session_is_ready_under_its_stored_id():
    sdk = dialect(SESSION)
    [request] = written(sdk.open())
    answer = {"type": "control_response", "response": {"subtype": "success", "request_id": request["request_id"]}}
    assert sdk.feed(encode(answer)) == [Ready(SESSION)]


def test_a_cli_that_refuses_initialize_takes_turns_all_the_same():
    sdk = dialect()
    [request] = written(sdk.open())
    refused = {
        "type": "control_response",
        "response": {"subtype": "error", "request_id": request["request_id"], "error": "Unsupported"},
    }
    [warning, ready] = sdk.feed(encode(refused))
    assert isinstance(warning, ProtocolWarning) and ready == Ready("")


def test_a_session_the_cli_does_not_have_is_gone_and_that_is_the_start_error():
    seen = replay("resume-unknown", session_id="00000000-0000-4000-8000-000000000000")
    detail = "No conversation found with session ID: 00000000-0000-4000-8000-000000000000"
    assert seen.events[:2] == [SessionGone(detail), ErrorEvent(detail)]
    assert not seen.of(Ready)


def test_an_error_result_before_ready_without_the_proof_is_no_session_gone():
    sdk = dialect(SESSION)
    sdk.open()
    failed = {"type": "result", "subtype": "error_during_execution", "is_error": True, "errors": ["disk full"]}
    assert sdk.feed(encode(failed)) == [ErrorEvent("disk full")]


def test_exiting_before_initialize_is_answered_is_an_error():
    sdk = dialect()
    sdk.open()
    [error] = sdk.close()
    assert isinstance(error, ErrorEvent) and "before it answered initialize" in error.text


# ---------------------------------------------------------------------- turns


def test_a_turn_is_a_user_line_with_a_fresh_uuid_each_time():
    sdk = dialect()
    request = written(sdk.open())[0]
    sdk.feed(
        encode({"type": "control_response", "response": {"subtype": "success", "request_id": request["request_id"]}})
    )
    [first] = written(sdk.prompt(Turn("hello")))
    assert first == {
        "type": "user",
        "message": {"role": "user", "content": "hello"},
        "parent_tool_use_id": None,
        "session_id": "",
        "uuid": first["uuid"],
    }
    sdk.feed(encode({"type": "result", "subtype": "success", "is_error": False, "result": "hi"}))
    [second] = written(sdk.prompt(Turn("again", attachments=(Attachment("image", "https://x/cat.png", "cat"),))))
    assert second["uuid"] != first["uuid"]
    assert second["message"]["content"] == "again\n\n[Attached]\n- cat: https://x/cat.png"


def test_two_turns_stream_partials_report_the_session_and_end_with_the_result():
    seen = replay("user-uuid-echo")
    assert seen.of(Ready) == [Ready("")]
    assert [event.text for event in seen.of(PartialEvent)] == ["Hello", " from", " fake Claude."]
    assert seen.of(ReplyEvent) == [ReplyEvent("Hello from fake Claude.")]
    assert len(seen.of(SessionEvent)) == 1 and seen.of(TurnEnd) == [TurnEnd("end_turn")]
    [usage] = seen.of(UsageEvent)
    assert usage.usage.input_tokens == 107 and usage.usage.output_tokens == 12


def test_the_cost_of_a_turn_is_the_difference_of_the_clis_running_totals():
    seen = replay("allow-always")
    costs = [event.usage.cost_usd for event in seen.of(UsageEvent)]
    assert costs == pytest.approx([0.001607, 0.001607])
    assert seen.of(TurnEnd) == [TurnEnd("end_turn"), TurnEnd("end_turn")]


def test_prompt_before_ready_or_during_a_turn_is_misuse():
    sdk = dialect()
    sdk.open()
    with pytest.raises(ProtocolMisuse):
        sdk.prompt(Turn("too early"))
    with pytest.raises(ProtocolMisuse):
        sdk.steer(Turn("nothing runs"), "s1")


def test_output_between_turns_belongs_to_no_turn():
    sdk = dialect()
    request = written(sdk.open())[0]
    sdk.feed(
        encode({"type": "control_response", "response": {"subtype": "success", "request_id": request["request_id"]}})
    )
    stray = [
        {"type": "system", "subtype": "init", "session_id": SESSION},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "background"}]}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "background", "total_cost_usd": 0.5},
    ]
    assert sdk.feed(b"".join(map(encode, stray))) == []
    sdk.prompt(Turn("hi"))
    [usage, reply, end] = sdk.feed(
        encode({"type": "result", "subtype": "success", "result": "hi", "total_cost_usd": 0.75})
    )
    assert usage.usage.cost_usd == pytest.approx(0.25) and reply == ReplyEvent("hi") and end == TurnEnd("end_turn")


def test_an_error_result_fails_the_turn_and_the_process_stays():
    sdk = dialect()
    request = written(sdk.open())[0]
    sdk.feed(
        encode({"type": "control_response", "response": {"subtype": "success", "request_id": request["request_id"]}})
    )
    sdk.prompt(Turn("hi"))
    failed = {"type": "result", "subtype": "success", "is_error": True, "result": "Invalid API key"}
    assert sdk.feed(encode(failed)) == [ErrorEvent("Invalid API key"), TurnEnd("error")]
    assert sdk.state is WarmState.READY


def test_output_ending_mid_turn_is_an_unfinished_turn():
    sdk = dialect()
    request = written(sdk.open())[0]
    sdk.feed(
        encode({"type": "control_response", "response": {"subtype": "success", "request_id": request["request_id"]}})
    )
    sdk.prompt(Turn("hi"))
    [error] = sdk.close()
    assert isinstance(error, ErrorEvent) and error.unfinished


# ---------------------------------------------------------------------- permissions


def test_a_tool_call_is_asked_as_a_permission_by_kind_and_allow_sends_the_input_back():
    seen = replay("allow-always")
    [asked] = seen.of(PermissionRequest)  # the second turn's identical call is not asked: "always" held
    assert (asked.tool, asked.kind, asked.title) == ("Bash", "exec", "touch marker-allowed")
    assert asked.input == {"command": "touch marker-allowed", "description": "Run it"}
    [answer] = [line for line in seen.wrote if line["type"] == "control_response"]
    assert answer["response"] == {
        "subtype": "success",
        "request_id": asked.request_id,
        "response": {
            "behavior": "allow",
            "updatedInput": {"command": "touch marker-allowed", "description": "Run it"},
            "updatedPermissions": [
                {
                    "type": "addRules",
                    "rules": [{"toolName": "Bash", "ruleContent": "touch marker-allowed"}],
                    "behavior": "allow",
                    "destination": "session",
                }
            ],
        },
    }
    tools = [(event.status, event.title) for event in seen.of(ActivityEvent) if event.activity == "tool"]
    assert tools[:2] == [("started", "touch marker-allowed"), ("completed", "touch marker-allowed")]


@pytest.mark.parametrize(
    ("tool", "kind", "rule"),
    [
        ("Edit", "edit", {"toolName": "Edit"}),
        ("Read", "read", {"toolName": "Read"}),
        ("Grep", "search", {"toolName": "Grep"}),
        ("WebFetch", "fetch", {"toolName": "WebFetch"}),
        ("mcp__docs__search", "other", {"toolName": "mcp__docs__search"}),
    ],
)
def test_always_for_another_tool_is_the_whole_tool_for_this_session_never_a_null_rule(tool, kind, rule):
    sdk = in_turn()
    [asked] = sdk.feed(encode(can_use_tool("r1", tool, {"file_path": "/work/a.py"})))
    assert asked.kind == kind
    [answer] = written(sdk.answer(asked, Decision(allow=True, always=True)))
    [update] = answer["response"]["response"]["updatedPermissions"]
    assert update == {"type": "addRules", "rules": [rule], "behavior": "allow", "destination": "session"}


def test_a_denied_tool_is_told_the_message_and_the_turn_succeeds():
    seen = replay("deny")
    first = [line for line in seen.wrote if line["type"] == "control_response"][0]
    assert first["response"]["response"] == {"behavior": "deny", "message": "The user said no."}
    assert seen.of(ReplyEvent)[0] == ReplyEvent("The tool said: The user said no.")
    assert [event.status for event in seen.of(ActivityEvent) if event.activity == "tool"][:2] == ["started", "failed"]


def test_cancel_with_a_question_pending_interrupts_and_a_late_answer_writes_nothing():
    seen = replay("deny")
    # Second turn: the CLI asked, the bridge interrupted, the CLI withdrew the question and ended the turn.
    asked = seen.of(PermissionRequest)[1]
    interrupts = [line for line in seen.wrote if line["type"] == "control_request"]
    assert [line["request"] for line in interrupts] == [
        {"subtype": "initialize", "hooks": None},
        {"subtype": "interrupt"},
    ]
    assert seen.of(TurnEnd) == [TurnEnd("end_turn"), TurnEnd("cancelled"), TurnEnd("end_turn")]
    assert [event for event in seen.of(ErrorEvent)] == []
    assert asked.request_id not in [
        line["response"]["request_id"] for line in seen.wrote if line["type"] == "control_response"
    ]


def test_a_withdrawn_request_is_said_once_and_gets_no_answer():
    sdk = in_turn()
    [asked] = sdk.feed(encode(can_use_tool("r1", "Bash", {"command": "ls"})))
    withdrawal = encode({"type": "control_cancel_request", "request_id": "r1"})
    assert sdk.feed(withdrawal) == [RequestWithdrawn("r1")]
    assert sdk.feed(withdrawal) == []  # gone already
    assert sdk.answer(asked, Decision(allow=True)) == b""


def test_a_withdrawn_question_gets_no_answer_and_an_answered_one_is_not_withdrawn():
    sdk = in_turn()
    ask = can_use_tool(
        "q1",
        "AskUserQuestion",
        {
            "questions": [
                {
                    "question": "Colour?",
                    "header": "Colour",
                    "options": [{"label": "red"}, {"label": "blue"}],
                    "multiSelect": False,
                }
            ]
        },
    )
    [question] = sdk.feed(encode(ask))
    assert isinstance(question, QuestionRequest)
    assert sdk.feed(encode({"type": "control_cancel_request", "request_id": "q1"})) == [RequestWithdrawn("q1")]
    assert sdk.answer_question(question, {question.questions[0].id: ("red",)}) == b""
    [again] = sdk.feed(encode({**ask, "request_id": "q2"}))
    assert sdk.answer_question(again, {again.questions[0].id: ("red",)}) != b""
    assert (
        sdk.feed(encode({"type": "control_cancel_request", "request_id": "q2"})) == []
    )  # answered: nothing to withdraw


def test_an_answer_after_cancel_writes_nothing_and_cancel_is_sent_once():
    sdk = in_turn()
    [asked] = sdk.feed(encode(can_use_tool("r1", "Bash", {"command": "ls"})))
    [interrupt] = written(sdk.cancel())
    assert interrupt["request"] == {"subtype": "interrupt"}
    assert sdk.cancel() == b""
    assert sdk.answer(asked, CANCELLED) == b""


def test_a_request_while_cancelling_or_between_turns_is_denied_at_once():
    sdk = in_turn()
    sdk.cancel()
    [reply] = sdk.feed(encode(can_use_tool("r2", "Bash", {"command": "ls"})))
    assert isinstance(reply, AgentInput)
    assert written(reply.data)[0]["response"]["response"] == {"behavior": "deny", "message": "the turn was cancelled"}


def test_an_unknown_control_request_gets_the_error_envelope_at_once():
    sdk = in_turn()
    request = {"type": "control_request", "request_id": "x1", "request": {"subtype": "elicitation"}}
    [reply] = sdk.feed(encode(request))
    assert written(reply.data) == [
        {
            "type": "control_response",
            "response": {"subtype": "error", "request_id": "x1", "error": "agent-bridge does not serve elicitation"},
        }
    ]


# ---------------------------------------------------------------------- questions


def test_ask_user_question_is_a_question_and_the_answer_goes_back_in_updated_input():
    seen = replay("ask-user-question")
    [question] = seen.of(QuestionRequest)
    assert question.tool == "AskUserQuestion" and not seen.of(PermissionRequest)
    [asked] = question.questions
    assert (asked.id, asked.prompt, asked.header, asked.multi_select, asked.free_text) == (
        "q1",
        "Which colour?",
        "Colour",
        False,
        True,
    )
    assert [(option.label, option.description) for option in asked.options] == [("Red", "warm"), ("Blue", "cool")]
    [answer] = [line for line in seen.wrote if line["type"] == "control_response"]
    assert answer["response"]["response"]["behavior"] == "allow"
    assert answer["response"]["response"]["updatedInput"]["answers"] == {"Which colour?": "Blue"}
    assert answer["response"]["response"]["updatedInput"]["questions"][0]["question"] == "Which colour?"


def test_multi_select_labels_are_joined_with_commas():
    seen = replay("ask-multi-and-error-response")
    question = seen.of(QuestionRequest)[0]
    assert question.questions[0].multi_select
    answer = [line for line in seen.wrote if line["type"] == "control_response"][0]
    assert answer["response"]["response"]["updatedInput"]["answers"] == {"Which toppings?": "Cheese, Ham"}


def test_a_declined_question_is_denied_with_why():
    sdk = in_turn()
    ask = {"questions": [{"question": "Which?", "options": [{"label": "A"}], "multiSelect": False}]}
    [question] = sdk.feed(encode(can_use_tool("r1", "AskUserQuestion", ask)))
    [answer] = written(sdk.answer_question(question, None, "nobody answered in time"))
    assert answer["response"]["response"] == {"behavior": "deny", "message": "nobody answered in time"}
    assert sdk.answer_question(question, None, "again") == b""


def test_exit_plan_mode_is_one_question_approve_allows_anything_else_keeps_planning():
    seen = replay("exit-plan-mode")
    [question] = seen.of(QuestionRequest)
    [plan] = question.questions
    assert (question.tool, plan.id, plan.prompt, plan.free_text) == ("ExitPlanMode", "plan", "1. Do A\n2. Do B", True)
    assert [option.label for option in plan.options] == ["Approve", "Keep planning"]
    sdk = in_turn()
    for answers, expected in [
        ({"plan": ("Approve",)}, {"behavior": "allow", "updatedInput": {"plan": "P"}}),
        ({"plan": ("Keep planning",)}, {"behavior": "deny", "message": "The user wants to keep planning."}),
        (
            {"plan": ("Add tests first",)},
            {"behavior": "deny", "message": "The user wants to keep planning: Add tests first"},
        ),
    ]:
        [asked] = sdk.feed(encode(can_use_tool("p", "ExitPlanMode", {"plan": "P"})))
        assert written(sdk.answer_question(asked, answers))[0]["response"]["response"] == expected


def test_questions_of_skips_what_is_no_question():
    assert questions_of("AskUserQuestion", {"questions": "no"}) == ()
    assert [q.id for q in questions_of("AskUserQuestion", {"questions": [{"x": 1}, {"question": "B?"}]})] == ["q2"]


# ---------------------------------------------------------------------- interrupt and steering


def test_an_interrupt_mid_request_ends_the_turn_cancelled_and_the_next_turn_runs():
    seen = replay("interrupt-in-request-and-steer-replay")
    ends = seen.of(TurnEnd)
    assert ends[0] == TurnEnd("cancelled") and not seen.of(ErrorEvent)
    assert seen.of(ReplyEvent)[0] == ReplyEvent("reply 2")


def test_a_message_steered_at_a_tool_boundary_is_folded_into_the_running_turn():
    seen = replay("interrupt-in-request-and-steer-replay")
    assert seen.of(SteerOutcome) == [SteerOutcome("steer-3", folded=True)]
    assert seen.of(TurnEnd) == [TurnEnd("cancelled"), TurnEnd("end_turn"), TurnEnd("end_turn")]
    assert seen.of(ReplyEvent)[-1] == ReplyEvent("reply 4")
    outcome = seen.events.index(seen.of(SteerOutcome)[0])
    assert TurnEnd("end_turn") in seen.events[outcome:]  # with the turn's end at the latest


def test_a_message_steered_into_the_last_request_runs_after_it_in_the_same_bridge_turn():
    seen = replay("steer-during-final-request")
    # The CLI ended a turn (reply 1), then ran the steered message as its own (reply 2): one bridge turn.
    assert seen.of(TurnEnd) == [TurnEnd("end_turn")]
    assert seen.of(SteerOutcome) == [SteerOutcome("steer-1", folded=True)]
    assert seen.of(ReplyEvent) == [ReplyEvent("reply 1\n\nreply 2")]
    assert not [event for event in seen.of(PartialEvent) if "steer" in event.text]  # echoes are never shown


def test_a_cancelled_turns_leftover_message_runs_later_and_its_turn_is_nobodys():
    sdk = in_turn()
    steer = written(sdk.steer(Turn("late"), "s1"))[0]["uuid"]
    sdk.cancel()
    aborted = {
        "type": "result",
        "subtype": "error_during_execution",
        "is_error": True,
        "terminal_reason": "aborted_streaming",
    }
    assert sdk.feed(encode(aborted)) == [SteerOutcome("s1", folded=True), TurnEnd("cancelled")]
    mine = written(sdk.prompt(Turn("next")))[0]["uuid"]
    leftover = [
        {"type": "user", "isReplay": True, "uuid": steer, "message": {"role": "user", "content": "late"}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "for late"},
        {"type": "user", "isReplay": True, "uuid": mine, "message": {"role": "user", "content": "next"}},
    ]
    assert sdk.feed(b"".join(map(encode, leftover))) == []
    [reply, end] = sdk.feed(encode({"type": "result", "subtype": "success", "is_error": False, "result": "for next"}))
    assert (reply, end) == (ReplyEvent("for next"), TurnEnd("end_turn"))


# ---------------------------------------------------------------------- the command line


def test_argv_problems_name_each_missing_flag_in_either_form():
    complete = [
        "claude",
        "-p",
        "--input-format=stream-json",
        "--output-format",
        "stream-json",
        "--verbose",
        "--permission-prompt-tool",
        "stdio",
        "--replay-user-messages",
    ]
    assert ClaudeSdk.argv_problems(complete) == []
    problems = ClaudeSdk.argv_problems(["claude", "-p", "--output-format", "json"])
    assert len(problems) == 5
    assert problems[0].startswith("the command lacks `--input-format stream-json`")
    assert problems[1].startswith(
        "the command has `--output-format json`, the protocol needs `--output-format stream-json`"
    )
    assert any("--replay-user-messages" in problem for problem in problems)


# ---------------------------------------------------------------------- the bytes


def random_splits(seed: int) -> Splitter:
    rng = random.Random(seed)

    def split(data: bytes) -> Iterator[bytes]:
        start = 0
        while start < len(data):
            end = start + rng.randint(1, 200)
            yield data[start:end]
            start = end

    return split


def every_byte(data: bytes) -> Iterator[bytes]:
    for index in range(len(data)):
        yield data[index : index + 1]


def comparable(seen: Replay) -> list[Any]:
    """The events with the request and uuid values that differ between replays made alike."""
    return [event for event in seen.events if not isinstance(event, AgentInput)]


@pytest.mark.parametrize("name", sorted(path.stem for path in TRANSCRIPTS.glob("*.jsonl")))
def test_any_split_of_the_bytes_gives_the_same_events(name):
    session = "00000000-0000-4000-8000-000000000000" if name == "resume-unknown" else ""
    one = comparable(replay(name, session_id=session))
    for seed in range(3):
        assert comparable(replay(name, random_splits(seed), session_id=session)) == one
    assert comparable(replay(name, every_byte, session_id=session)) == one


# ---------------------------------------------------------------------- helpers


def in_turn() -> ClaudeSdk:
    sdk = dialect()
    request = written(sdk.open())[0]
    sdk.feed(
        encode({"type": "control_response", "response": {"subtype": "success", "request_id": request["request_id"]}})
    )
    sdk.prompt(Turn("go"))
    return sdk


def can_use_tool(request_id: str, tool: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "control_request",
        "request_id": request_id,
        "request": {"subtype": "can_use_tool", "tool_name": tool, "input": tool_input, "tool_use_id": "toolu_1"},
    }
