"""`protocol: ante`: the pure warm dialect from transcripts, then driving the sample Ante daemon.

Transcripts are written in the shapes of Ante's protocol reference (the seed
`ante-jsonl-protocol.txt`): `EventMsg` lines whose `parent` is the op the
dialect sent. Op ids are random, so each transcript is built around the ids
the dialect actually wrote. The second half drives `sample_agents/ante_like.py`
with the dialect and a small loop standing in for the warm engine: a real
process, several turns, approvals, interrupt, and a resume after the process
was killed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import PYTHON, SAMPLE_AGENTS, TURN_DEADLINE

import bridge
from bridge import Turn
from bridge.dialects import (
    PROTOCOLS,
    ActivityEvent,
    AgentInput,
    DialectContext,
    ErrorEvent,
    LineCut,
    PartialEvent,
    ProtocolWarning,
    ReplyEvent,
    Usage,
    UsageEvent,
    dialect_class,
)
from bridge.dialects.ante import Ante, new_op_id
from bridge.dialects.events import Ready, TurnEnd
from bridge.dialects.settings import AnteSettings
from bridge.errors import ProfileError
from bridge.permissions import Decision, PermissionRequest

SAMPLE = SAMPLE_AGENTS / "ante_like.py"
OP_ID = re.compile(r"op_[0-7][0-9A-HJKMNP-TV-Z]{25}")
SESSION = "ses_01ARZ3NDEKTSV4RRFFQ69G5FAV"
ALLOW, DENY = Decision(allow=True), Decision(allow=False)


def event_line(event: Any, parent: str | None = None) -> bytes:
    message: dict[str, Any] = {"timestamp": "2025-06-01T12:00:00Z", "id": "evt_01ARZ3NDEKTSV4RRFFQ69G5FAV",
                               "event": event}
    if parent is not None:
        message["parent"] = parent
    return (json.dumps(message) + "\n").encode()


def ops(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines()]


def op_id(data: bytes) -> str:
    [op] = ops(data)
    return op["id"]


def dialect(session_id: str = "", settings: AnteSettings | None = None) -> Ante:
    return Ante(DialectContext(settings=settings), session_id=session_id, cwd="/work/project")


def ready(session_id: str = "") -> Ante:
    ante = dialect(session_id)
    start = ante.open()
    assert ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/work/project"}},
                                op_id(start))) == [Ready(SESSION)]
    return ante


def without_warnings(events: list[Any]) -> list[Any]:
    return [event for event in events if not isinstance(event, ProtocolWarning)]


def streamed_turn(parent: str) -> bytes:
    """A streaming turn as the reference's complete flow shows it (no tools)."""
    return b"".join([
        event_line({"TurnStart": {"turn_id": "step_01"}}, parent),
        event_line({"ThinkingDelta": "Let me"}, parent),
        event_line({"ThinkingDelta": " look."}, parent),
        event_line({"Thinking": "Let me look."}, parent),
        event_line({"MessageDelta": "The project"}, parent),
        event_line({"MessageDelta": " is a web server."}, parent),
        event_line({"AgentMessage": "The project is a web server."}, parent),
        event_line({"UsageUpdate": {"usage": {"input_tokens": 1500, "output_tokens": 300}}}, parent),
        event_line({"TurnEnd": {"turn_id": "step_01", "status": "Completed"}}, parent),
    ])


STREAMED_EVENTS = [ActivityEvent("thinking", text="Let me"), ActivityEvent("thinking", text=" look."),
                   PartialEvent("The project"), PartialEvent(" is a web server."),
                   UsageEvent(Usage(input_tokens=1500, output_tokens=300, total_tokens=1800)),
                   ReplyEvent("The project is a web server."), TurnEnd("Completed")]


# --------------------------------------------------------------------------- the session


def test_a_new_session_starts_with_the_profiles_settings_and_the_agents_cwd():
    settings = AnteSettings(model="claude-sonnet-4-6", provider="anthropic", policy="Auto", streaming=False,
                            append_system_prompt="Answer briefly.", allowed_tools=["Read", "Grep"],
                            disallowed_tools=["Bash"], thinking="Deep")
    [start] = ops(dialect(settings=settings).open())
    assert OP_ID.fullmatch(start["id"])
    assert start["op"] == {"StartSession": {
        "model": "claude-sonnet-4-6", "provider": "anthropic", "policy": "Auto", "streaming": False,
        "system_prompt": None, "append_system_prompt": "Answer briefly.", "allowed_tools": ["Read", "Grep"],
        "disallowed_tools": ["Bash"], "cwd": "/work/project", "thinking": "Deep"}}
    [defaults] = ops(dialect().open())
    assert defaults["op"]["StartSession"]["model"] is None  # Ante's own default
    assert defaults["op"]["StartSession"]["streaming"] is True


def test_session_start_makes_the_session_ready_and_later_noise_is_dropped():
    ante = dialect()
    start = op_id(ante.open())
    assert ante.feed(event_line({"ExtensionRefreshed": {"session_id": SESSION, "skills": []}}, start)) == []
    assert ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, start)) == [Ready(SESSION)]
    assert ante.feed(event_line({"InfoBlockStart": {"id": "mcp", "header": "Warming up"}})
                     + event_line({"ExtensionRefreshed": {"session_id": SESSION}})) == []


def test_a_session_id_that_cannot_be_stored_is_a_warning_and_a_session_without_one():
    ante = dialect()
    start = op_id(ante.open())
    events = ante.feed(event_line({"SessionStart": {"session_id": "has space", "cwd": "/w"}}, start))
    assert events[-1] == Ready("")
    assert "cannot be resumed later" in events[0].message


def test_a_session_ante_cannot_start_fails_with_its_words():
    ante = dialect()
    start = op_id(ante.open())
    assert ante.feed(event_line({"Error": "Authentication failed: invalid API key"}, start)) == [
        ErrorEvent("Ante could not start a session: Authentication failed: invalid API key")]


def test_a_stored_session_is_resumed_and_its_replayed_history_never_reaches_a_turn():
    ante = dialect(SESSION)
    [resume] = ops(ante.open())
    assert resume["op"] == {"ResumeSession": {"session_id": SESSION}}
    old_input, old_approval = new_op_id(), new_op_id()
    replay = b"".join([  # the last events of the earlier process, with its op ids
        event_line({"UserInput": "first question"}, old_input),
        event_line({"TurnStart": {"turn_id": "step_old"}}, old_input),
        event_line({"MessageDelta": "old answer"}, old_input),
        event_line({"TurnPause": {"turn_id": "step_old", "reason": {"Approval": {
            "tools": [{"id": "tool_old", "name": "Bash", "input": {"command": "rm -rf /"}}], "message": "?"}}}},
            old_input),
        event_line({"ToolEnd": {"tool_use_id": "tool_old", "status": "Completed"}}, old_approval),
        event_line({"Error": "an old error"}, old_approval),
        event_line({"TurnEnd": {"turn_id": "step_old", "status": "Completed"}}, old_approval),
    ])
    events = ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, resume["id"])
                       + event_line({"ExtensionRefreshed": {"session_id": SESSION}}, resume["id"]) + replay[:300])
    assert events == [Ready(SESSION)]
    prompt = ante.prompt(Turn("second question"))  # the engine may prompt while the replay still streams
    assert ante.feed(replay[300:]) == []
    assert without_warnings(ante.feed(streamed_turn(op_id(prompt)))) == STREAMED_EVENTS


def test_an_agent_that_parents_nothing_still_gets_its_replay_dropped():
    """Without parents, a replayed turn opens with the replay-only UserInput event; the live one does not."""
    ante = dialect(SESSION)
    resume = op_id(ante.open())
    replay = b"".join([
        event_line({"UserInput": "first question"}),
        event_line({"TurnStart": {"turn_id": "step_old"}}),
        event_line({"MessageDelta": "old answer"}),
        event_line({"Error": "an old error"}),
        event_line({"TurnEnd": {"turn_id": "step_old", "status": {"Error": {"message": "old"}}}}),
        event_line({"UserInput": "second question"}),
    ])
    assert ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, resume)) == [Ready(SESSION)]
    ante.prompt(Turn("third question"))
    live = event_line({"TurnStart": {"turn_id": "step_new"}}) + event_line({"MessageDelta": "new answer"}) \
        + event_line({"TurnEnd": {"turn_id": "step_new", "status": "Completed"}})
    assert ante.feed(replay + event_line({"TurnStart": {"turn_id": "step_old2"}})
                     + event_line({"TurnEnd": {"turn_id": "step_old2", "status": "Completed"}}) + live) == [
        PartialEvent("new answer"), ReplyEvent("new answer"), TurnEnd("Completed")]


def test_a_turn_start_named_after_the_input_op_is_the_turns_even_without_a_parent():
    ante = dialect(SESSION)
    resume = op_id(ante.open())
    ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, resume))
    prompt = op_id(ante.prompt(Turn("hi")))
    assert ante.feed(event_line({"UserInput": "old"}) + event_line({"TurnStart": {"turn_id": prompt}})
                     + event_line({"MessageDelta": "hello"})) == [PartialEvent("hello")]


def test_a_resume_ante_refuses_starts_a_new_session_and_says_so():
    ante = dialect("ses_gone")
    resume = op_id(ante.open())
    events = ante.feed(event_line({"Error": "session not found: ses_gone"}, resume))
    [warning, restart] = events
    assert isinstance(warning, ProtocolWarning) and "started a new session" in warning.message
    assert "session not found" not in warning.message  # the agent's words stay out of the log
    [start] = ops(restart.data)
    assert "StartSession" in start["op"] and start["op"]["StartSession"]["cwd"] == "/work/project"
    assert ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, start["id"])) == [
        Ready(SESSION)]


# --------------------------------------------------------------------------- turns


def test_a_streamed_turn_shows_its_deltas_and_its_reply_is_their_concatenation():
    ante = ready()
    prompt = ante.prompt(Turn("explain what this project does"))
    [user_input] = ops(prompt)
    assert user_input["op"] == {"UserInput": "explain what this project does"}
    assert ante.feed(streamed_turn(user_input["id"])) == STREAMED_EVENTS


def test_a_turn_that_is_not_streamed_gives_each_message_whole():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    events = ante.feed(b"".join([
        event_line({"TurnStart": {"turn_id": "step_01"}}, parent),
        event_line({"Thinking": "Let me analyze the codebase structure..."}, parent),
        event_line({"AgentMessage": "Let me check."}, parent),
        event_line({"ToolStart": {"id": "t1", "name": "Read", "input": {"file_path": "/src/main.rs"}}}, parent),
        event_line({"ToolEnd": {"tool_use_id": "t1", "status": "Completed", "result_json": {"content": "fn main"},
                                "is_error": False}}, parent),
        event_line({"AgentMessage": "It is a web server."}, parent),
        event_line({"TurnEnd": {"turn_id": "step_01", "status": "Completed"}}, parent),
    ]))
    assert events == [
        ActivityEvent("thinking", text="Let me analyze the codebase structure..."),
        PartialEvent("Let me check."),
        ActivityEvent("tool", tool="Read", title="/src/main.rs", status="started", call_id="t1"),
        ActivityEvent("tool", tool="Read", title="/src/main.rs", status="completed", call_id="t1", text="fn main"),
        PartialEvent("\n\nIt is a web server."),
        ReplyEvent("Let me check.\n\nIt is a web server."),
        TurnEnd("Completed"),
    ]


def test_text_around_tool_calls_is_paragraphs_and_a_steps_repeat_is_not_shown_twice():
    """The reference's flow: deltas, ToolStart, pause, the tool, more deltas, then the step's AgentMessage."""
    ante = ready()
    parent = op_id(ante.prompt(Turn("fix bug")))
    events = ante.feed(b"".join([
        event_line({"TurnStart": {"turn_id": "step_01"}}, parent),
        event_line({"MessageDelta": "Let me look."}, parent),
        event_line({"ToolStart": {"id": "t1", "name": "Bash", "input": {"command": "ls -la"}}}, parent),
        event_line({"ToolUpdate": {"tool_use_id": "t1", "seq": 0, "message": "Running…"}}, parent),
        event_line({"ToolEnd": {"tool_use_id": "t1", "status": "Completed", "result_json": {"content": "a.txt"},
                                "is_error": False}}, parent),
        event_line({"MessageDelta": "Found it."}, parent),
        event_line({"AgentMessage": "Found it."}, parent),
        event_line({"TurnEnd": {"turn_id": "step_01", "status": "Completed"}}, parent),
    ]))
    assert [event for event in events if isinstance(event, (PartialEvent, ReplyEvent))] == [
        PartialEvent("Let me look."), PartialEvent("\n\nFound it."), ReplyEvent("Let me look.\n\nFound it.")]
    assert [(event.status, event.text) for event in events if isinstance(event, ActivityEvent)] == [
        ("started", ""), ("started", "Running…"), ("completed", "a.txt")]


@pytest.mark.parametrize("status, is_error, expected", [
    ("Completed", False, "completed"), ("Completed", True, "failed"), ("Failed", True, "failed"),
    ("Denied", True, "denied"), ("Cancelled", True, "failed"), ("SomethingNew", False, "completed"),
])
def test_tool_end_statuses(status, is_error, expected):
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    ante.feed(event_line({"TurnStart": {"turn_id": "s"}}, parent))
    [end] = ante.feed(event_line({"ToolEnd": {"tool_use_id": "t9", "tool_name": "Grep", "status": status,
                                              "result_json": None, "is_error": is_error}}, parent))
    assert (end.tool, end.status, end.call_id) == ("Grep", expected, "t9")


def test_errors_fail_the_turn_once_and_a_turn_error_status_comes_before_its_end():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    events = ante.feed(b"".join([
        event_line({"TurnStart": {"turn_id": "s1"}}, parent),
        event_line({"MessageDelta": "partial"}, parent),
        event_line({"Error": "rate limited"}, parent),
        event_line({"TurnEnd": {"turn_id": "s1", "status": {"Error": {"message": "rate limited"}}}}, parent),
    ]))
    assert events == [PartialEvent("partial"), ErrorEvent("rate limited"), ReplyEvent("partial"), TurnEnd("Error")]
    parent = op_id(ante.prompt(Turn("again")))
    events = ante.feed(event_line({"TurnStart": {"turn_id": "s2"}}, parent) + event_line({"TurnEnd": {
        "turn_id": "s2", "status": {"Error": {"kind": "quota", "headline": "Quota exhausted",
                                              "details": ["HTTP 429", "retry later"]}}}}, parent))
    assert events == [ErrorEvent("Quota exhausted — HTTP 429; retry later"), TurnEnd("Error")]


def test_an_input_ante_refuses_before_the_turn_starts_ends_the_turn():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    assert ante.feed(event_line({"Error": "session not initialized"}, parent)) == [
        ErrorEvent("session not initialized"), TurnEnd("Error")]
    ante.prompt(Turn("the next turn can start"))


def test_an_interruption_nobody_asked_for_fails_the_turn():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    events = ante.feed(event_line({"TurnStart": {"turn_id": "s"}}, parent)
                       + event_line({"TurnEnd": {"turn_id": "s", "status": {"Interrupted": {"reason": "steered"}}}}))
    assert events == [ErrorEvent("Ante interrupted the turn: steered"), TurnEnd("Interrupted")]


def test_events_after_the_turn_end_are_dropped_and_each_turn_has_a_fresh_op_id():
    ante = ready()
    first = op_id(ante.prompt(Turn("one")))
    ante.feed(event_line({"TurnStart": {"turn_id": "s1"}}, first) + event_line({"TurnEnd": {
        "turn_id": "s1", "status": "Completed"}}, first))
    assert ante.feed(event_line({"UsageUpdate": {"usage": {"input_tokens": 1, "output_tokens": 1}}}, first)
                     + event_line({"MessageDelta": "late"}, first)) == []
    second = op_id(ante.prompt(Turn("two")))
    assert second != first
    assert ante.feed(event_line({"MessageDelta": "early, from the first"}, first)
                     + event_line({"TurnStart": {"turn_id": "s2"}}, second)
                     + event_line({"MessageDelta": "two"}, second)) == [PartialEvent("two")]


def test_prompt_outside_an_idle_session_is_a_programming_error():
    ante = dialect()
    ante.open()
    with pytest.raises(RuntimeError, match="wait for Ready or TurnEnd"):
        ante.prompt(Turn("too early"))


# --------------------------------------------------------------------------- approvals


def paused(tools: list[dict[str, Any]]) -> tuple[Ante, list[Any]]:
    ante = ready()
    parent = op_id(ante.prompt(Turn("fix bug")))
    events = ante.feed(event_line({"TurnStart": {"turn_id": "step_T"}}, parent) + event_line({"TurnPause": {
        "turn_id": "step_T", "reason": {"Approval": {"tools": tools, "message": "Allow?"}}}}, parent))
    return ante, events


TWO_TOOLS = [{"id": "tool_use_abc123", "name": "Bash", "input": {"command": "ls -la"}},
             {"id": "tool_use_def456", "name": "Write", "args": {"file_path": "notes.md", "content": "x"}}]


def test_a_pause_asks_one_question_per_tool():
    _, events = paused(TWO_TOOLS)
    assert events == [
        PermissionRequest(request_id="tool_use_abc123", tool="Bash", kind="exec", title="ls -la",
                          input={"command": "ls -la"}),
        PermissionRequest(request_id="tool_use_def456", tool="Write", kind="edit", title="notes.md",
                          input={"file_path": "notes.md", "content": "x"}),
    ]


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_pause_is_answered_once_every_tool_is_decided_whatever_the_order(order):
    ante, requests = paused(TWO_TOOLS)
    decisions = [ALLOW, DENY]
    first, second = order
    assert ante.answer(requests[first], decisions[first]) == b""
    [response] = ops(ante.answer(requests[second], decisions[second]))
    assert OP_ID.fullmatch(response["id"])
    assert response["op"] == {"ApprovalResponse": {"turn_id": "step_T", "responses": [
        ["tool_use_abc123", "Accept"], ["tool_use_def456", "Skip"]]}}
    assert ante.answer(requests[first], ALLOW) == b""  # answered: nothing more to say


def test_always_is_accept_for_session_and_a_denial_stays_a_skip():
    ante, requests = paused(TWO_TOOLS)
    ante.answer(requests[0], Decision(allow=True, always=True))
    [response] = ops(ante.answer(requests[1], Decision(allow=False, always=True)))
    assert response["op"]["ApprovalResponse"]["responses"] == [
        ["tool_use_abc123", "AcceptForSession"], ["tool_use_def456", "Skip"]]


def test_events_after_an_approval_belong_to_the_turn_whatever_their_parent():
    ante, requests = paused(TWO_TOOLS[:1])
    approval = op_id(ante.answer(requests[0], ALLOW))
    assert ante.feed(event_line({"MessageDelta": "done"}, approval) + event_line({"TurnEnd": {
        "turn_id": "step_T", "status": "Completed"}}, approval)) == [PartialEvent("done"), ReplyEvent("done"),
                                                                       TurnEnd("Completed")]


def test_cancel_skips_the_undecided_tools_then_interrupts():
    ante, requests = paused(TWO_TOOLS)
    assert ante.answer(requests[0], ALLOW) == b""
    response, interrupt = ops(ante.cancel())
    assert response["op"]["ApprovalResponse"]["responses"] == [
        ["tool_use_abc123", "Accept"], ["tool_use_def456", "Skip"]]
    assert interrupt["op"] == "Interrupt" and OP_ID.fullmatch(interrupt["id"])
    assert ante.answer(requests[1], Decision(allow=False, message="the turn was cancelled")) == b""
    assert ante.cancel() == b""  # asked once
    events = ante.feed(event_line({"ToolEnd": {"tool_use_id": "tool_use_def456", "status": "Cancelled",
                                               "result_json": None, "is_error": True}}, interrupt["id"])
                       + event_line({"TurnEnd": {"turn_id": "step_T", "status": {"Interrupted": {
                           "reason": "interrupted by the user"}}}}, interrupt["id"]))
    assert events[-1] == TurnEnd("Interrupted")
    assert not any(isinstance(event, ErrorEvent) for event in events)  # the engine reports the cancel


def test_cancel_outside_a_turn_says_nothing_and_inside_one_interrupts():
    ante = ready()
    assert ante.cancel() == b""
    ante.prompt(Turn("hi"))
    [interrupt] = ops(ante.cancel())
    assert interrupt["op"] == "Interrupt"


def test_a_pause_with_no_tool_to_ask_about_is_answered_at_once():
    ante, events = paused([{"name": "Bash", "input": {}}])
    [warning, reply] = events
    assert "no tool" in warning.message
    [response] = ops(reply.data)
    assert response["op"] == {"ApprovalResponse": {"turn_id": "step_T", "responses": []}}


def test_a_pause_for_something_else_than_approval_is_a_warning():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    events = ante.feed(event_line({"TurnStart": {"turn_id": "s"}}, parent) + event_line({"TurnPause": {
        "turn_id": "s", "reason": {"Question": {"tool_use_id": "q", "questions": []}}}}, parent))
    [warning] = events
    assert "cannot answer" in warning.message


# --------------------------------------------------------------------------- the end of the stream


def test_shutdown_says_goodbye_and_the_answer_is_ignored():
    ante = ready()
    [shutdown] = ops(ante.shutdown())
    assert shutdown["op"] == "Shutdown"
    assert ante.feed(event_line("SessionEnd") + event_line({"SessionEnd": {"session_id": SESSION}})
                     + event_line("Goodbye")) == []
    assert ante.close() == []


def test_the_stream_ending_mid_turn_or_before_the_session_is_unfinished():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    ante.feed(event_line({"TurnStart": {"turn_id": "s"}}, parent) + event_line({"MessageDelta": "cut sh"}, parent))
    [error] = ante.close()
    assert error.unfinished and "before the turn finished" in error.text
    starting = dialect()
    starting.open()
    [error] = starting.close()
    assert error.unfinished and "before its session started" in error.text


def test_garbage_is_counted_never_fatal():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    events = ante.feed(b"".join([
        b"not json at all\n", b"[1, 2]\n", b'"a string"\n', b"{broken\n", b"\n",
        event_line({"TurnStart": {"turn_id": "s"}}, parent),
        event_line({"NewFancyEvent": {"x": 1}}, parent), event_line(42, parent), event_line({"a": 1, "b": 2}),
        event_line({"MessageDelta": 7}, parent), event_line({"ToolStart": "not an object"}, parent),
        event_line({"ToolEnd": {}}, parent), event_line({"UsageUpdate": {"usage": "lots"}}, parent),
        event_line({"TurnPause": {"turn_id": "s", "reason": {"Approval": {"tools": "nope"}}}}, parent),
        b'{"timestamp": 1, "id": null, "event": {"MessageDelta": "ok"}, "parent": 5}\n',
        event_line({"TurnEnd": {"turn_id": "s", "status": ["odd"]}}, parent),
    ]))
    assert [event for event in events if isinstance(event, (PartialEvent, ReplyEvent, TurnEnd))] == [
        PartialEvent("ok"), ReplyEvent("ok"), TurnEnd("Completed")]
    assert [warning.message for warning in ante.close() if isinstance(warning, ProtocolWarning)] == [
        "ignored 4 stdout line(s) that were not JSON objects"]


def test_a_line_over_the_limit_is_cut_and_the_turn_goes_on():
    ante = Ante(DialectContext(settings=AnteSettings(max_line_bytes=4096)), session_id="", cwd="/w")
    start = op_id(ante.open())
    ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, start))
    parent = op_id(ante.prompt(Turn("hi")))
    events = ante.feed(event_line({"TurnStart": {"turn_id": "s"}}, parent)
                       + event_line({"MessageDelta": "x" * 10_000}, parent)
                       + event_line({"MessageDelta": "after"}, parent)
                       + event_line({"TurnEnd": {"turn_id": "s", "status": "Completed"}}, parent))
    assert isinstance(events[0], LineCut)
    assert events[1:] == [PartialEvent("after"), ReplyEvent("after"), TurnEnd("Completed")]


def test_a_transcript_fed_byte_by_byte_gives_the_same_events():
    def run(chunk: int) -> list[Any]:
        ante = dialect(SESSION)
        resume = op_id(ante.open())
        history = event_line({"UserInput": "old"}, "op_01") + event_line({"TurnStart": {"turn_id": "o"}}, "op_01") \
            + event_line({"MessageDelta": "old ünïcödé"}, "op_01")
        events = feed(ante, event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, resume) + history,
                      chunk)
        prompt = ante.prompt(Turn("hi"))
        return events + feed(ante, streamed_turn(op_id(prompt)).replace(b"web server", "wéb sérvér ✓".encode()),
                             chunk) + ante.close()

    def feed(ante: Ante, data: bytes, chunk: int) -> list[Any]:
        return [event for start in range(0, len(data), chunk) for event in ante.feed(data[start:start + chunk])]

    whole = run(1 << 20)
    assert whole[0] == Ready(SESSION) and whole[-2] == ReplyEvent("The project is a wéb sérvér ✓.")
    assert run(1) == whole
    assert run(7) == whole


# --------------------------------------------------------------------------- profiles


def test_the_protocol_is_warm_and_its_settings_are_checked(tmp_path):
    assert PROTOCOLS["ante"].warm and dialect_class("ante") is Ante
    profile = bridge.Profile.from_mapping({"command": ["ante", "serve", "--stdio"], "protocol": "ante",
                                           "ante": {"model": "m", "allowed_tools": ["Read"], "thinking": "Max"}})
    assert profile.settings.allowed_tools == ("Read",) and profile.settings.thinking == "Max"
    with pytest.raises(ProfileError, match="thinking must be one of Disabled, Enabled, Deep, Max"):
        bridge.Profile.from_mapping({"command": "ante serve --stdio", "protocol": "ante",
                                     "ante": {"thinking": "lots"}})
    with pytest.raises(ProfileError, match="allowed_tools"):
        bridge.Profile.from_mapping({"command": "ante serve --stdio", "protocol": "ante",
                                     "ante": {"allowed_tools": "Read"}})
    with pytest.raises(ProfileError, match="cannot be in the argv of protocol ante"):
        bridge.Profile.from_mapping({"command": "ante serve --stdio", "protocol": "ante", "args": ["{{MESSAGE}}"]})


# --------------------------------------------------------------------------- the sample daemon, driven for real


class Daemon:
    """The sample Ante daemon with the dialect and a loop standing in for the warm engine."""

    def __init__(self, process: trio.Process, ante: Ante) -> None:
        self.process = process
        self.ante = ante
        self.stdin = process.stdin
        self.stdout = process.stdout

    @classmethod
    @asynccontextmanager
    async def running(cls, home: Path, session_id: str = "", settings: AnteSettings | None = None
                      ) -> AsyncIterator[tuple[Daemon, list[Any]]]:
        """The daemon started, its session set up (the events up to Ready); killed at the end if still running."""
        process = await trio.lowlevel.open_process([PYTHON, str(SAMPLE), "serve", "--stdio"], stdin=subprocess.PIPE,
                                                   stdout=subprocess.PIPE, env={**os.environ, "ANTE_HOME": str(home)})
        try:
            daemon = cls(process, Ante(DialectContext(settings=settings), session_id=session_id, cwd=str(home)))
            await daemon.send(daemon.ante.open())
            yield daemon, await daemon.until(Ready)
        finally:
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                await process.wait()

    async def send(self, data: bytes) -> None:
        if data:
            await self.stdin.send_all(data)

    async def until(self, kind: type, decide: Callable[[PermissionRequest], Decision] | None = None,
                    on_event: Callable[[Any], bytes] | None = None) -> list[Any]:
        """Every event up to the first of `kind` (or the end of the stream), answering what must be answered."""
        events: list[Any] = []
        while True:
            data = await self.stdout.receive_some()
            batch = self.ante.feed(data) if data else self.ante.close()
            for event in batch:
                events.append(event)
                if isinstance(event, AgentInput):
                    await self.send(event.data)
                elif isinstance(event, PermissionRequest) and decide is not None:
                    await self.send(self.ante.answer(event, decide(event)))
                if on_event is not None:
                    await self.send(on_event(event))
                if isinstance(event, kind):
                    return events
            if not data:
                return events

    async def turn(self, message: str, decide: Callable[[PermissionRequest], Decision] | None = None,
                   on_event: Callable[[Any], bytes] | None = None) -> list[Any]:
        await self.send(self.ante.prompt(Turn(message)))
        return await self.until(TurnEnd, decide, on_event)

    async def shutdown(self) -> int:
        await self.send(self.ante.shutdown())
        await self.stdin.aclose()
        assert await self.until(type(None)) == []  # SessionEnd and Goodbye are nobody's turn
        return await self.process.wait()


def reply(events: list[Any]) -> str:
    [answer] = [event.text for event in events if isinstance(event, ReplyEvent)]
    return answer


async def test_one_daemon_takes_several_turns_and_a_killed_ones_session_resumes_without_its_history(tmp_path):
    with trio.fail_after(TURN_DEADLINE):
        async with Daemon.running(tmp_path) as (daemon, events):
            [started] = events
            session_id = started.session_id
            first = await daemon.turn("think about it")
            assert [event for event in first if isinstance(event, ActivityEvent)] == [
                ActivityEvent("thinking", text="Let me "), ActivityEvent("thinking", text="think.")]
            assert reply(first) == "You said: think about it." and first[-1] == TurnEnd("Completed")
            second = await daemon.turn("and again")
            assert reply(second) == ("You said: and again. I remember 1 earlier message(s); the last was: think "
                                     "about it.")
            assert [event.usage for event in second if isinstance(event, UsageEvent)] == [
                Usage(input_tokens=45, output_tokens=20, total_tokens=65)]  # the session's running totals
            daemon.process.kill()

        async with Daemon.running(tmp_path, session_id) as (resumed, events):
            assert events == [Ready(session_id)]
            third = await resumed.turn("one more")
            assert reply(third) == "You said: one more. I remember 2 earlier message(s); the last was: and again."
            partials = "".join(event.text for event in third if isinstance(event, PartialEvent))
            assert partials == reply(third)  # none of the replayed history
            assert await resumed.shutdown() == 0


async def test_a_resume_the_daemon_refuses_starts_a_new_session(tmp_path):
    with trio.fail_after(TURN_DEADLINE):
        async with Daemon.running(tmp_path, "ses_01ARZ3NDEKTSV4RRFFQ69G5FAV") as (daemon, events):
            warning, restart, started = events
            assert isinstance(warning, ProtocolWarning) and isinstance(restart, AgentInput)
            assert started.session_id.startswith("ses_") and started.session_id != "ses_01ARZ3NDEKTSV4RRFFQ69G5FAV"
            assert reply(await daemon.turn("hello")) == "You said: hello."
            assert await daemon.shutdown() == 0


async def test_tools_wait_for_every_decision_and_accept_for_session_is_remembered(tmp_path):
    asked: list[PermissionRequest] = []

    def decide(request: PermissionRequest) -> Decision:
        asked.append(request)
        return Decision(allow=True, always=True) if request.tool == "Bash" else DENY

    with trio.fail_after(TURN_DEADLINE):
        async with Daemon.running(tmp_path) as (daemon, _):
            events = await daemon.turn("use the tools", decide)
            assert [(request.tool, request.kind, request.title) for request in asked] == [
                ("Bash", "exec", "ls -la"), ("Read", "read", "README.md")]
            assert reply(events) == "Let me check.\n\nBash: ran. Read: skipped. You said: use the tools."
            assert [(event.tool, event.status) for event in events if isinstance(event, ActivityEvent)
                    and event.status != "started"] == [("Bash", "completed"), ("Read", "denied")]
            asked.clear()
            events = await daemon.turn("a tool again", decide)
            assert asked == []  # Bash was accepted for the session
            assert reply(events).startswith("Let me check.\n\nBash: ran. You said: a tool again.")
            assert await daemon.shutdown() == 0


async def test_cancel_with_a_pending_pause_and_cancel_mid_text_both_end_the_turn_interrupted(tmp_path):
    def cancel_when_asked(event: Any) -> bytes:
        return daemon.ante.cancel() if isinstance(event, PermissionRequest) else b""

    def cancel_after_the_first_words(event: Any) -> bytes:
        return daemon.ante.cancel() if isinstance(event, PartialEvent) else b""

    with trio.fail_after(TURN_DEADLINE):
        async with Daemon.running(tmp_path) as (daemon, _):
            events = await daemon.turn("use the tools and wait", on_event=cancel_when_asked)
            assert events[-1] == TurnEnd("Interrupted")
            assert [(event.tool, event.status) for event in events if isinstance(event, ActivityEvent)
                    and event.status != "started"] == [("Bash", "denied"), ("Read", "denied")]
            events = await daemon.turn("wait for it", on_event=cancel_after_the_first_words)
            assert events[-1] == TurnEnd("Interrupted") and not any(isinstance(event, ErrorEvent) for event in events)
            assert reply(await daemon.turn("still there?")).startswith("You said: still there?")
            assert await daemon.shutdown() == 0


async def test_a_failing_turn_and_a_crash_mid_turn(tmp_path):
    with trio.fail_after(TURN_DEADLINE):
        async with Daemon.running(tmp_path, settings=AnteSettings(streaming=False)) as (daemon, _):
            events = await daemon.turn("fail please")
            assert events[-2:] == [ErrorEvent("make-believe provider failure: rate limited"), TurnEnd("Error")]
            assert reply(await daemon.turn("whole")).startswith("You said: whole.")
            events = await daemon.turn("crash now")
            assert events[-1] == ErrorEvent(
                "Ante's output ended before the turn finished (it exited or was killed)", unfinished=True)
            assert await daemon.process.wait() == 3
