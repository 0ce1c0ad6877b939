"""`protocol: ante`: the pure warm dialect from transcripts, then driving the sample Ante daemon.

Transcripts are written in the shapes of Ante's protocol reference (the seed
`ante-jsonl-protocol.txt`): `EventMsg` lines whose `parent` is the op the
dialect sent. Op ids are random, so each transcript is built around the ids
the dialect actually wrote. The second half drives `sample_agents/ante_like.py`
(the bundled `profiles/ante.yaml`, and `profiles/clis/ante.yaml` with the
sample on PATH as `ante`) through the warm engine's public API and the CLI:
several turns of one process, approvals by policy and by the host,
interrupt, timeout, and a resume after the process was killed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import CLI_PROFILES, PROFILES, PYTHON, SAMPLE_AGENTS, TURN_DEADLINE, assert_no_live_process

import bridge
from bridge import Turn
from bridge.dialects import (
    PROTOCOLS,
    ActivityEvent,
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
from bridge.engine.warm_agents import WarmAgent
from bridge.errors import ProfileError, ProtocolMisuse
from bridge.permissions import Decision, PermissionRequest
from bridge.turn import Attachment

SAMPLE = SAMPLE_AGENTS / "ante_like.py"
AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
OP_ID = re.compile(r"op_[0-7][0-9A-HJKMNP-TV-Z]{25}")
SESSION = "ses_01ARZ3NDEKTSV4RRFFQ69G5FAV"
ALLOW, DENY = Decision(allow=True), Decision(allow=False)


def event_line(event: Any, parent: str | None = None) -> bytes:
    message: dict[str, Any] = {
        "timestamp": "2025-06-01T12:00:00Z",
        "id": "evt_01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "event": event,
    }
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
    assert ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/work/project"}}, op_id(start))) == [
        Ready(SESSION)
    ]
    return ante


def without_warnings(events: list[Any]) -> list[Any]:
    return [event for event in events if not isinstance(event, ProtocolWarning)]


def streamed_turn(parent: str) -> bytes:
    """A streaming turn as the reference's complete flow shows it (no tools)."""
    return b"".join(
        [
            event_line({"TurnStart": {"turn_id": "step_01"}}, parent),
            event_line({"ThinkingDelta": "Let me"}, parent),
            event_line({"ThinkingDelta": " look."}, parent),
            event_line({"Thinking": "Let me look."}, parent),
            event_line({"MessageDelta": "The project"}, parent),
            event_line({"MessageDelta": " is a web server."}, parent),
            event_line({"AgentMessage": "The project is a web server."}, parent),
            event_line({"UsageUpdate": {"usage": {"input_tokens": 1500, "output_tokens": 300}}}, parent),
            event_line({"TurnEnd": {"turn_id": "step_01", "status": "Completed"}}, parent),
        ]
    )


STREAMED_EVENTS = [
    ActivityEvent("thinking", text="Let me"),
    ActivityEvent("thinking", text=" look."),
    PartialEvent("The project"),
    PartialEvent(" is a web server."),
    UsageEvent(Usage(input_tokens=1500, output_tokens=300, total_tokens=1800)),
    ReplyEvent("The project is a web server."),
    TurnEnd("Completed"),
]


# --------------------------------------------------------------------------- the session


def test_a_new_session_starts_with_the_profiles_settings_and_the_agents_cwd():
    settings = AnteSettings(
        model="claude-sonnet-4-6",
        provider="anthropic",
        policy="Auto",
        streaming=False,
        append_system_prompt="Answer briefly.",
        allowed_tools=["Read", "Grep"],
        disallowed_tools=["Bash"],
        thinking="Deep",
    )
    [start] = ops(dialect(settings=settings).open())
    assert OP_ID.fullmatch(start["id"])
    assert start["op"] == {
        "StartSession": {
            "model": "claude-sonnet-4-6",
            "provider": "anthropic",
            "policy": "Auto",
            "streaming": False,
            "system_prompt": None,
            "append_system_prompt": "Answer briefly.",
            "allowed_tools": ["Read", "Grep"],
            "disallowed_tools": ["Bash"],
            "cwd": "/work/project",
            "thinking": "Deep",
        }
    }
    [defaults] = ops(dialect().open())
    assert defaults["op"]["StartSession"]["model"] is None  # Ante's own default
    assert defaults["op"]["StartSession"]["streaming"] is True


def test_session_start_makes_the_session_ready_and_later_noise_is_dropped():
    ante = dialect()
    start = op_id(ante.open())
    assert ante.feed(event_line({"ExtensionRefreshed": {"session_id": SESSION, "skills": []}}, start)) == []
    assert ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, start)) == [Ready(SESSION)]
    assert (
        ante.feed(
            event_line({"InfoBlockStart": {"id": "mcp", "header": "Warming up"}})
            + event_line({"ExtensionRefreshed": {"session_id": SESSION}})
        )
        == []
    )


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
        ErrorEvent("Ante could not start a session: Authentication failed: invalid API key")
    ]


def test_a_stored_session_is_resumed_and_its_replayed_history_never_reaches_a_turn():
    ante = dialect(SESSION)
    [resume] = ops(ante.open())
    assert resume["op"] == {"ResumeSession": {"session_id": SESSION}}
    old_input, old_approval = new_op_id(), new_op_id()
    replay = b"".join(
        [  # the last events of the earlier process, with its op ids
            event_line({"UserInput": "first question"}, old_input),
            event_line({"TurnStart": {"turn_id": "step_old"}}, old_input),
            event_line({"MessageDelta": "old answer"}, old_input),
            event_line(
                {
                    "TurnPause": {
                        "turn_id": "step_old",
                        "reason": {
                            "Approval": {
                                "tools": [{"id": "tool_old", "name": "Bash", "input": {"command": "rm -rf /"}}],
                                "message": "?",
                            }
                        },
                    }
                },
                old_input,
            ),
            event_line({"ToolEnd": {"tool_use_id": "tool_old", "status": "Completed"}}, old_approval),
            event_line({"Error": "an old error"}, old_approval),
            event_line({"TurnEnd": {"turn_id": "step_old", "status": "Completed"}}, old_approval),
        ]
    )
    events = ante.feed(
        event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, resume["id"])
        + event_line({"ExtensionRefreshed": {"session_id": SESSION}}, resume["id"])
        + replay[:300]
    )
    assert events == [Ready(SESSION)]
    prompt = ante.prompt(Turn("second question"))  # the engine may prompt while the replay still streams
    assert ante.feed(replay[300:]) == []
    assert without_warnings(ante.feed(streamed_turn(op_id(prompt)))) == STREAMED_EVENTS


def test_an_agent_that_parents_nothing_still_gets_its_replay_dropped():
    """Without parents, a replayed turn opens with the replay-only UserInput event; the live one does not."""
    ante = dialect(SESSION)
    resume = op_id(ante.open())
    replay = b"".join(
        [
            event_line({"UserInput": "first question"}),
            event_line({"TurnStart": {"turn_id": "step_old"}}),
            event_line({"MessageDelta": "old answer"}),
            event_line({"Error": "an old error"}),
            event_line({"TurnEnd": {"turn_id": "step_old", "status": {"Error": {"message": "old"}}}}),
            event_line({"UserInput": "second question"}),
        ]
    )
    assert ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, resume)) == [Ready(SESSION)]
    ante.prompt(Turn("third question"))
    live = (
        event_line({"TurnStart": {"turn_id": "step_new"}})
        + event_line({"MessageDelta": "new answer"})
        + event_line({"TurnEnd": {"turn_id": "step_new", "status": "Completed"}})
    )
    assert ante.feed(
        replay
        + event_line({"TurnStart": {"turn_id": "step_old2"}})
        + event_line({"TurnEnd": {"turn_id": "step_old2", "status": "Completed"}})
        + live
    ) == [PartialEvent("new answer"), ReplyEvent("new answer"), TurnEnd("Completed")]


def test_a_turn_start_named_after_the_input_op_is_the_turns_even_without_a_parent():
    ante = dialect(SESSION)
    resume = op_id(ante.open())
    ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, resume))
    prompt = op_id(ante.prompt(Turn("hi")))
    assert ante.feed(
        event_line({"UserInput": "old"})
        + event_line({"TurnStart": {"turn_id": prompt}})
        + event_line({"MessageDelta": "hello"})
    ) == [PartialEvent("hello")]


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
        Ready(SESSION)
    ]


# --------------------------------------------------------------------------- turns


def test_a_streamed_turn_shows_its_deltas_and_its_reply_is_their_concatenation():
    ante = ready()
    prompt = ante.prompt(Turn("explain what this project does"))
    [user_input] = ops(prompt)
    assert user_input["op"] == {"UserInput": "explain what this project does"}
    assert ante.feed(streamed_turn(user_input["id"])) == STREAMED_EVENTS


def test_fetched_attachments_are_named_in_the_user_input_by_path_unfetched_ones_by_url():
    shot = Attachment("image", "https://e/x.png", path="/w/.agent-bridge/attachments/t/x.png", media_type="image/png")
    [user_input] = ops(ready().prompt(Turn("look", attachments=(shot, Attachment("file", "https://e/y.txt")))))
    assert user_input["op"] == {
        "UserInput": "look\n\nAttached files:\n- /w/.agent-bridge/attachments/t/x.png (image, image/png)\n"
        "- https://e/y.txt (file)"
    }


def test_a_turn_that_is_not_streamed_gives_each_message_whole():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    events = ante.feed(
        b"".join(
            [
                event_line({"TurnStart": {"turn_id": "step_01"}}, parent),
                event_line({"Thinking": "Let me analyze the codebase structure..."}, parent),
                event_line({"AgentMessage": "Let me check."}, parent),
                event_line({"ToolStart": {"id": "t1", "name": "Read", "input": {"file_path": "/src/main.rs"}}}, parent),
                event_line(
                    {
                        "ToolEnd": {
                            "tool_use_id": "t1",
                            "status": "Completed",
                            "result_json": {"content": "fn main"},
                            "is_error": False,
                        }
                    },
                    parent,
                ),
                event_line({"AgentMessage": "It is a web server."}, parent),
                event_line({"TurnEnd": {"turn_id": "step_01", "status": "Completed"}}, parent),
            ]
        )
    )
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
    events = ante.feed(
        b"".join(
            [
                event_line({"TurnStart": {"turn_id": "step_01"}}, parent),
                event_line({"MessageDelta": "Let me look."}, parent),
                event_line({"ToolStart": {"id": "t1", "name": "Bash", "input": {"command": "ls -la"}}}, parent),
                event_line({"ToolUpdate": {"tool_use_id": "t1", "seq": 0, "message": "Running…"}}, parent),
                event_line(
                    {
                        "ToolEnd": {
                            "tool_use_id": "t1",
                            "status": "Completed",
                            "result_json": {"content": "a.txt"},
                            "is_error": False,
                        }
                    },
                    parent,
                ),
                event_line({"MessageDelta": "Found it."}, parent),
                event_line({"AgentMessage": "Found it."}, parent),
                event_line({"TurnEnd": {"turn_id": "step_01", "status": "Completed"}}, parent),
            ]
        )
    )
    assert [event for event in events if isinstance(event, (PartialEvent, ReplyEvent))] == [
        PartialEvent("Let me look."),
        PartialEvent("\n\nFound it."),
        ReplyEvent("Let me look.\n\nFound it."),
    ]
    assert [(event.status, event.text) for event in events if isinstance(event, ActivityEvent)] == [
        ("started", ""),
        ("started", "Running…"),
        ("completed", "a.txt"),
    ]


@pytest.mark.parametrize(
    "status, is_error, expected",
    [
        ("Completed", False, "completed"),
        ("Completed", True, "failed"),
        ("Failed", True, "failed"),
        ("Denied", True, "denied"),
        ("Cancelled", True, "failed"),
        ("SomethingNew", False, "completed"),
    ],
)
def test_tool_end_statuses(status, is_error, expected):
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    ante.feed(event_line({"TurnStart": {"turn_id": "s"}}, parent))
    [end] = ante.feed(
        event_line(
            {
                "ToolEnd": {
                    "tool_use_id": "t9",
                    "tool_name": "Grep",
                    "status": status,
                    "result_json": None,
                    "is_error": is_error,
                }
            },
            parent,
        )
    )
    assert (end.tool, end.status, end.call_id) == ("Grep", expected, "t9")


def test_errors_fail_the_turn_once_and_a_turn_error_status_comes_before_its_end():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    events = ante.feed(
        b"".join(
            [
                event_line({"TurnStart": {"turn_id": "s1"}}, parent),
                event_line({"MessageDelta": "partial"}, parent),
                event_line({"Error": "rate limited"}, parent),
                event_line({"TurnEnd": {"turn_id": "s1", "status": {"Error": {"message": "rate limited"}}}}, parent),
            ]
        )
    )
    assert events == [PartialEvent("partial"), ErrorEvent("rate limited"), ReplyEvent("partial"), TurnEnd("Error")]
    parent = op_id(ante.prompt(Turn("again")))
    events = ante.feed(
        event_line({"TurnStart": {"turn_id": "s2"}}, parent)
        + event_line(
            {
                "TurnEnd": {
                    "turn_id": "s2",
                    "status": {
                        "Error": {
                            "kind": "quota",
                            "headline": "Quota exhausted",
                            "details": ["HTTP 429", "retry later"],
                        }
                    },
                }
            },
            parent,
        )
    )
    assert events == [ErrorEvent("Quota exhausted — HTTP 429; retry later"), TurnEnd("Error")]


def test_an_input_ante_refuses_before_the_turn_starts_ends_the_turn():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    assert ante.feed(event_line({"Error": "session not initialized"}, parent)) == [
        ErrorEvent("session not initialized"),
        TurnEnd("Error"),
    ]
    ante.prompt(Turn("the next turn can start"))


def test_an_interruption_nobody_asked_for_fails_the_turn():
    ante = ready()
    parent = op_id(ante.prompt(Turn("hi")))
    events = ante.feed(
        event_line({"TurnStart": {"turn_id": "s"}}, parent)
        + event_line({"TurnEnd": {"turn_id": "s", "status": {"Interrupted": {"reason": "steered"}}}})
    )
    assert events == [ErrorEvent("Ante interrupted the turn: steered"), TurnEnd("Interrupted")]


def test_events_after_the_turn_end_are_dropped_and_each_turn_has_a_fresh_op_id():
    ante = ready()
    first = op_id(ante.prompt(Turn("one")))
    ante.feed(
        event_line({"TurnStart": {"turn_id": "s1"}}, first)
        + event_line({"TurnEnd": {"turn_id": "s1", "status": "Completed"}}, first)
    )
    assert (
        ante.feed(
            event_line({"UsageUpdate": {"usage": {"input_tokens": 1, "output_tokens": 1}}}, first)
            + event_line({"MessageDelta": "late"}, first)
        )
        == []
    )
    second = op_id(ante.prompt(Turn("two")))
    assert second != first
    assert ante.feed(
        event_line({"MessageDelta": "early, from the first"}, first)
        + event_line({"TurnStart": {"turn_id": "s2"}}, second)
        + event_line({"MessageDelta": "two"}, second)
    ) == [PartialEvent("two")]


def test_prompt_outside_an_idle_session_is_a_programming_error():
    ante = dialect()
    ante.open()
    with pytest.raises(ProtocolMisuse, match="wait for Ready or TurnEnd"):
        ante.prompt(Turn("too early"))


# --------------------------------------------------------------------------- approvals


def paused(tools: list[dict[str, Any]]) -> tuple[Ante, list[Any]]:
    ante = ready()
    parent = op_id(ante.prompt(Turn("fix bug")))
    events = ante.feed(
        event_line({"TurnStart": {"turn_id": "step_T"}}, parent)
        + event_line(
            {"TurnPause": {"turn_id": "step_T", "reason": {"Approval": {"tools": tools, "message": "Allow?"}}}}, parent
        )
    )
    return ante, events


TWO_TOOLS = [
    {"id": "tool_use_abc123", "name": "Bash", "input": {"command": "ls -la"}},
    {"id": "tool_use_def456", "name": "Write", "args": {"file_path": "notes.md", "content": "x"}},
]


def test_a_pause_asks_one_question_per_tool():
    _, events = paused(TWO_TOOLS)
    assert events == [
        PermissionRequest(
            request_id="tool_use_abc123", tool="Bash", kind="exec", title="ls -la", input={"command": "ls -la"}
        ),
        PermissionRequest(
            request_id="tool_use_def456",
            tool="Write",
            kind="edit",
            title="notes.md",
            input={"file_path": "notes.md", "content": "x"},
        ),
    ]


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_pause_is_answered_once_every_tool_is_decided_whatever_the_order(order):
    ante, requests = paused(TWO_TOOLS)
    decisions = [ALLOW, DENY]
    first, second = order
    assert ante.answer(requests[first], decisions[first]) == b""
    [response] = ops(ante.answer(requests[second], decisions[second]))
    assert OP_ID.fullmatch(response["id"])
    assert response["op"] == {
        "ApprovalResponse": {
            "turn_id": "step_T",
            "responses": [["tool_use_abc123", "Accept"], ["tool_use_def456", "Skip"]],
        }
    }
    assert ante.answer(requests[first], ALLOW) == b""  # answered: nothing more to say


def test_always_is_accept_for_session_and_a_denial_stays_a_skip():
    ante, requests = paused(TWO_TOOLS)
    ante.answer(requests[0], Decision(allow=True, always=True))
    [response] = ops(ante.answer(requests[1], Decision(allow=False, always=True)))
    assert response["op"]["ApprovalResponse"]["responses"] == [
        ["tool_use_abc123", "AcceptForSession"],
        ["tool_use_def456", "Skip"],
    ]


def test_events_after_an_approval_belong_to_the_turn_whatever_their_parent():
    ante, requests = paused(TWO_TOOLS[:1])
    approval = op_id(ante.answer(requests[0], ALLOW))
    assert ante.feed(
        event_line({"MessageDelta": "done"}, approval)
        + event_line({"TurnEnd": {"turn_id": "step_T", "status": "Completed"}}, approval)
    ) == [PartialEvent("done"), ReplyEvent("done"), TurnEnd("Completed")]


def test_cancel_skips_the_undecided_tools_then_interrupts():
    ante, requests = paused(TWO_TOOLS)
    assert ante.answer(requests[0], ALLOW) == b""
    response, interrupt = ops(ante.cancel())
    assert response["op"]["ApprovalResponse"]["responses"] == [
        ["tool_use_abc123", "Accept"],
        ["tool_use_def456", "Skip"],
    ]
    assert interrupt["op"] == "Interrupt" and OP_ID.fullmatch(interrupt["id"])
    assert ante.answer(requests[1], Decision(allow=False, message="the turn was cancelled")) == b""
    assert ante.cancel() == b""  # asked once
    events = ante.feed(
        event_line(
            {
                "ToolEnd": {
                    "tool_use_id": "tool_use_def456",
                    "status": "Cancelled",
                    "result_json": None,
                    "is_error": True,
                }
            },
            interrupt["id"],
        )
        + event_line(
            {"TurnEnd": {"turn_id": "step_T", "status": {"Interrupted": {"reason": "interrupted by the user"}}}},
            interrupt["id"],
        )
    )
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
    events = ante.feed(
        event_line({"TurnStart": {"turn_id": "s"}}, parent)
        + event_line(
            {"TurnPause": {"turn_id": "s", "reason": {"Question": {"tool_use_id": "q", "questions": []}}}}, parent
        )
    )
    [warning] = events
    assert "cannot answer" in warning.message


# --------------------------------------------------------------------------- the end of the stream


def test_shutdown_says_goodbye_and_the_answer_is_ignored():
    ante = ready()
    [shutdown] = ops(ante.shutdown())
    assert shutdown["op"] == "Shutdown"
    assert (
        ante.feed(
            event_line("SessionEnd") + event_line({"SessionEnd": {"session_id": SESSION}}) + event_line("Goodbye")
        )
        == []
    )
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
    events = ante.feed(
        b"".join(
            [
                b"not json at all\n",
                b"[1, 2]\n",
                b'"a string"\n',
                b"{broken\n",
                b"\n",
                event_line({"TurnStart": {"turn_id": "s"}}, parent),
                event_line({"NewFancyEvent": {"x": 1}}, parent),
                event_line(42, parent),
                event_line({"a": 1, "b": 2}),
                event_line({"MessageDelta": 7}, parent),
                event_line({"ToolStart": "not an object"}, parent),
                event_line({"ToolEnd": {}}, parent),
                event_line({"UsageUpdate": {"usage": "lots"}}, parent),
                event_line({"TurnPause": {"turn_id": "s", "reason": {"Approval": {"tools": "nope"}}}}, parent),
                b'{"timestamp": 1, "id": null, "event": {"MessageDelta": "ok"}, "parent": 5}\n',
                event_line({"TurnEnd": {"turn_id": "s", "status": ["odd"]}}, parent),
            ]
        )
    )
    assert [event for event in events if isinstance(event, (PartialEvent, ReplyEvent, TurnEnd))] == [
        PartialEvent("ok"),
        ReplyEvent("ok"),
        TurnEnd("Completed"),
    ]
    assert [warning.message for warning in ante.close() if isinstance(warning, ProtocolWarning)] == [
        "ignored 4 stdout line(s) that were not JSON objects"
    ]


def test_a_line_over_the_limit_is_cut_and_the_turn_goes_on():
    ante = Ante(DialectContext(settings=AnteSettings(max_line_bytes=4096)), session_id="", cwd="/w")
    start = op_id(ante.open())
    ante.feed(event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, start))
    parent = op_id(ante.prompt(Turn("hi")))
    events = ante.feed(
        event_line({"TurnStart": {"turn_id": "s"}}, parent)
        + event_line({"MessageDelta": "x" * 10_000}, parent)
        + event_line({"MessageDelta": "after"}, parent)
        + event_line({"TurnEnd": {"turn_id": "s", "status": "Completed"}}, parent)
    )
    assert isinstance(events[0], LineCut)
    assert events[1:] == [PartialEvent("after"), ReplyEvent("after"), TurnEnd("Completed")]


def test_a_transcript_fed_byte_by_byte_gives_the_same_events():
    def run(chunk: int) -> list[Any]:
        ante = dialect(SESSION)
        resume = op_id(ante.open())
        history = (
            event_line({"UserInput": "old"}, "op_01")
            + event_line({"TurnStart": {"turn_id": "o"}}, "op_01")
            + event_line({"MessageDelta": "old ünïcödé"}, "op_01")
        )
        events = feed(ante, event_line({"SessionStart": {"session_id": SESSION, "cwd": "/w"}}, resume) + history, chunk)
        prompt = ante.prompt(Turn("hi"))
        return (
            events
            + feed(ante, streamed_turn(op_id(prompt)).replace(b"web server", "wéb sérvér ✓".encode()), chunk)
            + ante.close()
        )

    def feed(ante: Ante, data: bytes, chunk: int) -> list[Any]:
        return [event for start in range(0, len(data), chunk) for event in ante.feed(data[start : start + chunk])]

    whole = run(1 << 20)
    assert whole[0] == Ready(SESSION) and whole[-2] == ReplyEvent("The project is a wéb sérvér ✓.")
    assert run(1) == whole
    assert run(7) == whole


# --------------------------------------------------------------------------- profiles


def test_the_protocol_is_warm_and_its_settings_are_checked(tmp_path):
    assert PROTOCOLS["ante"].warm and dialect_class("ante") is Ante
    profile = bridge.Profile.from_mapping(
        {
            "command": ["ante", "serve", "--stdio"],
            "protocol": "ante",
            "ante": {"model": "m", "allowed_tools": ["Read"], "thinking": "Max"},
        }
    )
    assert profile.settings.allowed_tools == ("Read",) and profile.settings.thinking == "Max"
    with pytest.raises(ProfileError, match="thinking must be one of Disabled, Enabled, Deep, Max"):
        bridge.Profile.from_mapping({"command": "ante serve --stdio", "protocol": "ante", "ante": {"thinking": "lots"}})
    with pytest.raises(ProfileError, match="allowed_tools"):
        bridge.Profile.from_mapping(
            {"command": "ante serve --stdio", "protocol": "ante", "ante": {"allowed_tools": "Read"}}
        )
    with pytest.raises(ProfileError, match="cannot be in the argv of protocol ante"):
        bridge.Profile.from_mapping({"command": "ante serve --stdio", "protocol": "ante", "args": ["{{MESSAGE}}"]})


# --------------------------------------------------------------------------- the sample daemon through the engine


@pytest.fixture
def sample(tmp_path: Path) -> bridge.Profile:
    """profiles/ante.yaml (default deny, read allowed), keeping its sessions in the test's directory."""
    profile = bridge.load_profile(PROFILES / "ante.yaml", cache=False)
    return profile.replace(env={"ANTE_HOME": str(tmp_path / "ante-home")}, kill_grace_secs=2)


@asynccontextmanager
async def warm(profile: bridge.Profile, session_id: str = "") -> AsyncIterator[WarmAgent]:
    async with trio.open_nursery() as nursery:
        agent = WarmAgent(profile, session_id=session_id)
        await agent.start(nursery)
        try:
            yield agent
        finally:
            await agent.close()


def collect(into: list[Any]) -> Callable[[Any], None]:
    return into.append


def partial_text(events: list[Any]) -> str:
    return "".join(event.text for event in events if isinstance(event, PartialEvent))


async def test_one_warm_process_takes_several_turns(sample):
    events: list[Any] = []
    with trio.fail_after(TURN_DEADLINE):
        async with warm(sample) as agent:
            first = await agent.turn(Turn("think about it"), collect(events))
            second = await agent.turn(Turn("and again"))
            pid = agent.pid
    assert first.ok and first.reply == "You said: think about it."
    assert first.session_id.startswith("ses_") and second.session_id == first.session_id
    assert partial_text(events) == first.reply
    assert [event.text for event in events if isinstance(event, ActivityEvent)] == ["Let me ", "think."]
    assert second.reply == "You said: and again. I remember 1 earlier message(s); the last was: think about it."
    assert second.usage == Usage(input_tokens=45, output_tokens=20, total_tokens=65)  # the session's running totals
    assert_no_live_process([pid])


async def test_tools_are_answered_by_the_profiles_policy(sample):
    events: list[Any] = []
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(sample, Turn("use the tools"), on_event=collect(events))
    assert result.reply == "Let me check.\n\nBash: skipped. Read: ran. You said: use the tools."
    decided = [
        (event.tool, event.status)
        for event in events
        if isinstance(event, ActivityEvent) and event.status in ("allowed", "denied", "completed")
    ]
    assert decided == [("Bash", "denied"), ("Read", "allowed"), ("Bash", "denied"), ("Read", "completed")]


async def test_the_host_decides_and_always_is_remembered_for_the_session(sample):
    profile = sample.replace(permissions={"default": "ask", "timeout_secs": 5})
    asked: list[str] = []

    def on_event(event: Any) -> None:
        if isinstance(event, PermissionRequest):
            asked.append(event.tool)
            questions.decide(event.request_id, Decision(allow=True, always=True) if event.tool == "Bash" else DENY)

    with trio.fail_after(TURN_DEADLINE):
        async with warm(profile) as agent:
            questions = bridge.engine.questions.Questions()
            first = await agent.turn(Turn("use the tools"), on_event, questions=questions)
            questions = bridge.engine.questions.Questions()
            second = await agent.turn(Turn("a tool again"), on_event, questions=questions)
    assert asked == ["Bash", "Read"]  # Bash was not asked again: Ante accepts it for the session
    assert first.reply.startswith("Let me check.\n\nBash: ran. Read: skipped.")
    assert second.reply.startswith("Let me check.\n\nBash: ran. You said: a tool again.")


async def test_a_question_nobody_answers_is_a_skip_and_the_turn_goes_on(sample):
    profile = sample.replace(permissions={"default": "ask", "timeout_secs": 0.2})
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("a tool"), on_event=lambda event: None)
    assert result.ok and result.reply.startswith("Let me check.\n\nBash: skipped.")


async def test_cancel_interrupts_the_turn_pending_questions_and_all_and_the_agent_stays_warm(sample):
    profile = sample.replace(permissions={"default": "ask", "timeout_secs": 30})
    cancel = trio.Event()

    def cancel_when(kind: type) -> Callable[[Any], None]:
        return lambda event: cancel.set() if isinstance(event, kind) else None

    with trio.fail_after(TURN_DEADLINE):
        async with warm(profile) as agent:
            asked = await agent.turn(Turn("use the tools and wait"), cancel_when(PermissionRequest), cancel=cancel)
            cancel = trio.Event()
            waiting = await agent.turn(Turn("wait for it"), cancel_when(PartialEvent), cancel=cancel)
            after = await agent.turn(Turn("still there?"))
            assert agent.alive
    for result in (asked, waiting):
        assert (result.outcome, result.exit_code) == ("cancelled", 130)
    assert after.ok and after.reply.startswith("You said: still there?")


async def test_a_timeout_interrupts_the_turn_and_the_agent_stays_warm(sample):
    with trio.fail_after(TURN_DEADLINE):
        async with warm(sample.replace(timeout_secs=0.5)) as agent:
            stopped = await agent.turn(Turn("wait for it"))
            after = await agent.turn(Turn("next"))
    assert (stopped.outcome, stopped.exit_code) == ("timeout", 124)
    assert after.ok


async def test_a_killed_agents_session_resumes_in_a_new_process_without_its_history_as_output(sample):
    events: list[Any] = []
    with trio.fail_after(TURN_DEADLINE):
        async with warm(sample) as agent:
            first = await agent.turn(Turn("think about it"))
            await agent.turn(Turn("use the tools"))
            pid = agent.pid
            os.kill(pid, signal.SIGKILL)
        async with warm(sample, first.session_id) as resumed:
            assert resumed.session_id == first.session_id
            third = await resumed.turn(Turn("one more"), collect(events))
    assert third.ok and third.session_id == first.session_id
    assert third.reply == "You said: one more. I remember 2 earlier message(s); the last was: use the tools."
    assert partial_text(events) == third.reply  # the replayed history is nobody's output
    assert not any(isinstance(event, (ActivityEvent, ErrorEvent, PermissionRequest)) for event in events)


async def test_run_turn_resumes_the_stored_session_and_a_session_ante_lost_starts_anew(sample):
    with trio.fail_after(TURN_DEADLINE):
        first = await bridge.run_turn(sample, Turn("hello"))
        second = await bridge.run_turn(sample, Turn("again", session_id=first.session_id))
        lost = await bridge.run_turn(sample, Turn("anyone?", session_id="ses_01ARZ3NDEKTSV4RRFFQ69G5FAV"))
    assert second.session_id == first.session_id and "I remember 1 earlier message(s)" in second.reply
    assert lost.ok and lost.reply == "You said: anyone?."
    assert lost.session_id.startswith("ses_") and lost.session_id not in (first.session_id, SESSION)


async def test_a_failed_turn_and_a_crash_mid_turn(sample):
    with trio.fail_after(TURN_DEADLINE):
        async with warm(sample.replace(ante={"streaming": False})) as agent:
            failed = await agent.turn(Turn("fail please"))
            fine = await agent.turn(Turn("whole"))
            crashed = await agent.turn(Turn("crash now"))
            assert not agent.alive
    assert (failed.outcome, failed.error) == ("agent_error", "make-believe provider failure: rate limited")
    assert fine.ok and fine.partials == 1  # not streamed: the message came whole
    assert (crashed.outcome, crashed.exit_code) == ("agent_error", 3)
    assert crashed.error == "Ante's output ended before the turn finished (it exited or was killed)"


async def test_the_ready_profile_of_the_real_ante_runs_unchanged(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ante").write_text(f'#!/bin/sh\nexec {PYTHON} {SAMPLE} "$@"\n')
    (bin_dir / "ante").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path))
    profile = bridge.load_profile(CLI_PROFILES / "ante.yaml", cache=False)
    with trio.fail_after(TURN_DEADLINE):
        first = await bridge.run_turn(profile, Turn("-n use the tools"))
        second = await bridge.run_turn(profile, Turn("and then?", session_id=first.session_id))
    assert first.reply == "Let me check.\n\nBash: skipped. Read: ran. You said: -n use the tools."
    assert second.session_id == first.session_id and "the last was: -n use the tools" in second.reply
    assert (tmp_path / ".ante-like" / "sessions" / f"{first.session_id}.jsonl").exists()


def test_run_on_the_command_line(tmp_path):
    profile = tmp_path / "ante.yaml"
    profile.write_text(
        (PROFILES / "ante.yaml").read_text().replace("{{PROFILE_DIR}}", str(PROFILES))
        + f"env: {{ANTE_HOME: {json.dumps(str(tmp_path))}}}\n"
    )
    done = subprocess.run(
        [AGENT_BRIDGE, "run", str(profile), "--json", "think, then a tool"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    *events, result = [json.loads(line) for line in done.stdout.splitlines()]
    assert result["reply"] == "Let me check.\n\nBash: skipped. You said: think, then a tool."
    assert {"event": "activity", "activity": "thinking", "text": "Let me "} in events
    assert [event["status"] for event in events if event.get("tool") == "Bash"] == ["started", "denied", "denied"]
