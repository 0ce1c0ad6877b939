"""`protocol: aionrs`: the pure dialect from transcripts, then the sample agent driven by a small loop.

The transcripts are written as aionrs 0.2.10 serializes its events
(crates/aion-protocol/src/events.rs: `type` first, fields in declaration
order, a `None` msg_id of an error left out) and as its protocol document
shows them. aionrs itself is a Rust binary that is not installable here;
`sample_agents/aionrs_like.py` speaks its protocol and stands in for it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import PROFILES, PYTHON, SAMPLE_AGENTS, TURN_DEADLINE, assert_no_live_process, process_state
from dialectkit import assert_every_cut_decodes_alike, fed_byte_by_byte, warnings, without_warnings

import bridge
from bridge import Turn
from bridge.dialects import (
    ActivityEvent,
    AgentInput,
    DialectContext,
    ErrorEvent,
    JsonSettings,
    LineCut,
    PartialEvent,
    ReplyEvent,
    Usage,
    UsageEvent,
    dialect_class,
)
from bridge.dialects.aionrs import NOT_READY, UNFINISHED, Aionrs
from bridge.dialects.events import Ready, RequestWithdrawn, TurnEnd
from bridge.engine.questions import Questions
from bridge.engine.warm_agents import WarmAgent
from bridge.errors import ProtocolMisuse
from bridge.permissions import Decision, PermissionRequest
from bridge.turn import Attachment

AGENT = SAMPLE_AGENTS / "aionrs_like.py"
CONTEXT = DialectContext(settings=JsonSettings(), permissions=True)

READY = (
    b'{"type":"ready","version":"0.2.10","session_id":"a1b2c3","capabilities":{"tool_approval":true,'
    b'"image_input":"unknown","thinking":true,"effort":false,"effort_levels":[],"modes":["default",'
    b'"auto_edit","yolo"],"current_mode":"default","mcp":false}}\n'
)
# The document's first turn (3.2), as aionrs writes it, for the dialect's first msg_id.
HELLO = (
    b'{"type":"stream_start","msg_id":"bridge-1"}\n'
    b'{"type":"thinking","text":"A greeting.","msg_id":"bridge-1"}\n'
    b'{"type":"text_delta","text":"Hi! ","msg_id":"bridge-1"}\n'
    b'{"type":"text_delta","text":"How can I help?","msg_id":"bridge-1"}\n'
    b'{"type":"stream_end","msg_id":"bridge-1","usage":{"input_tokens":1500,"output_tokens":320,'
    b'"cache_read_tokens":800,"cache_write_tokens":200}}\n'
)
HELLO_EVENTS = [
    ActivityEvent("thinking", text="A greeting."),
    PartialEvent("Hi! "),
    PartialEvent("How can I help?"),
    ReplyEvent("Hi! How can I help?"),
    UsageEvent(Usage(input_tokens=1500, output_tokens=320, cached_input_tokens=800, total_tokens=1820)),
    TurnEnd("end_turn"),
]
# The tool approval flow (3.3): the agent pauses at the request until it is answered.
ASKS_TO_WRITE = (
    b'{"type":"stream_start","msg_id":"bridge-1"}\n'
    b'{"type":"text_delta","text":"I\'ll create the file.","msg_id":"bridge-1"}\n'
    b'{"type":"tool_request","msg_id":"bridge-1","call_id":"t1","tool":{"name":"Write","category":'
    b'"edit","args":{"file_path":"/src/hello.rs","content":"fn main() {}"},"description":'
    b'"Write to /src/hello.rs"}}\n'
)
WRITE_REQUEST = PermissionRequest(
    request_id="t1",
    tool="Write",
    kind="edit",
    title="Write to /src/hello.rs",
    input={"file_path": "/src/hello.rs", "content": "fn main() {}"},
)
WROTE = (
    b'{"type":"tool_running","msg_id":"bridge-1","call_id":"t1","tool_name":"Write"}\n'
    b'{"type":"tool_result","msg_id":"bridge-1","call_id":"t1","tool_name":"Write","status":"success",'
    b'"output":"File written successfully","output_type":"text"}\n'
    b'{"type":"text_delta","text":"File created successfully.","msg_id":"bridge-1"}\n'
    b'{"type":"stream_end","msg_id":"bridge-1","usage":{"input_tokens":10,"output_tokens":5}}\n'
)


def started(*, session_id: str = "", prompt: str = "hello") -> Aionrs:
    """A dialect past `ready`, with its first turn sent."""
    dialect = Aionrs(CONTEXT, session_id=session_id, cwd="/tmp")
    assert dialect.open() == b""
    assert dialect.feed(READY) == [Ready("a1b2c3")]
    dialect.prompt(Turn(prompt))
    return dialect


def lines(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines()]


# --------------------------------------------------------------------------- what the bridge writes


def test_the_protocol_is_registered_as_warm() -> None:
    assert dialect_class("aionrs") is Aionrs
    assert bridge.dialects.PROTOCOLS["aionrs"].warm
    assert not bridge.dialects.PROTOCOLS["aionrs"].message_on_stdin


def test_the_message_carries_the_text_as_content_and_as_input_with_a_fresh_msg_id() -> None:
    dialect = Aionrs(CONTEXT, session_id="", cwd="/tmp")
    dialect.feed(READY)
    first = dialect.prompt(Turn('héllo "you"\nbye'))
    # content: what aionrs reads since 0.1.11 and AionUi sends; input: its name up to 0.1.10 and the seed
    # document's. serde ignores the field it does not know, so both kinds of agent take the same line.
    assert (
        first
        == (
            '{"type":"message","msg_id":"bridge-1","content":"héllo \\"you\\"\\nbye","input":"héllo \\"you\\"\\nbye"}\n'
        ).encode()
    )
    dialect.feed(b'{"type":"stream_end","msg_id":"bridge-1"}\n')
    assert lines(dialect.prompt(Turn("again")))[0]["msg_id"] == "bridge-2"


def test_local_attachments_are_files_and_urls_are_listed_in_the_text() -> None:
    dialect = Aionrs(CONTEXT, session_id="", cwd="/tmp")
    dialect.feed(READY)  # a prompt waits for the session
    turn = Turn(
        "  look at these ",
        attachments=(
            Attachment("image", "file:///srv/a%20b.png"),
            Attachment("file", "/tmp/notes.txt"),
            Attachment("image", "https://example.com/x.png"),
        ),
    )
    message = lines(dialect.prompt(turn))[0]
    assert message["files"] == ["/srv/a b.png", "/tmp/notes.txt"]
    assert message["content"] == message["input"] == "look at these\n\n[Attached URLs]\nhttps://example.com/x.png"
    only_a_url = Turn("", attachments=(Attachment("file", "https://example.com/y.pdf"),))
    dialect.feed(b'{"type":"stream_end","msg_id":"bridge-1"}\n')
    message = lines(dialect.prompt(only_a_url))[0]
    assert message["content"] == "[Attached URLs]\nhttps://example.com/y.pdf" and "files" not in message


def test_fetched_attachments_are_files_by_their_local_path_and_leave_the_text_alone() -> None:
    dialect = Aionrs(CONTEXT, session_id="", cwd="/w")
    dialect.feed(READY)
    shot = Attachment("image", "https://example.com/x.png", path="/w/.agent-bridge/attachments/t/x.png")
    message = lines(dialect.prompt(Turn("look", attachments=(shot,))))[0]
    assert (message["files"], message["content"]) == (["/w/.agent-bridge/attachments/t/x.png"], "look")


def test_the_agent_speaks_first_and_closing_stdin_is_the_goodbye() -> None:
    dialect = Aionrs(CONTEXT, session_id="a1b2c3", cwd="/tmp")
    assert dialect.open() == b"" and dialect.shutdown() == b""
    assert dialect.cancel() == b""  # no turn: a stop would end aionrs 0.2's process


# --------------------------------------------------------------------------- ready


def test_ready_names_the_session() -> None:
    dialect = Aionrs(CONTEXT, session_id="", cwd="/tmp")
    assert dialect.feed(READY) == [Ready("a1b2c3")]
    assert warnings(dialect.feed(READY)) == ["ignored a second ready event"]


def test_without_sessions_ready_has_no_id_and_the_bridge_reports_none() -> None:
    dialect = Aionrs(CONTEXT, session_id="", cwd="/tmp")
    assert dialect.feed(b'{"type":"ready","version":"0.2.0","capabilities":{}}\n') == [Ready("")]


@pytest.mark.parametrize("session_id", ['"has space"', "7", '""'])
def test_an_unusable_session_id_is_warned_about_and_not_stored(session_id: str) -> None:
    dialect = Aionrs(CONTEXT, session_id="", cwd="/tmp")
    events = dialect.feed(f'{{"type":"ready","version":"0.2.0","session_id":{session_id}}}\n'.encode())
    assert without_warnings(events) == [Ready("")]
    assert warnings(events)[0].startswith("ignored the session id of aionrs's ready event because")


def test_a_new_major_version_is_warned_about() -> None:
    dialect = Aionrs(CONTEXT, session_id="", cwd="/tmp")
    events = dialect.feed(b'{"type":"ready","version":"1.0.0","session_id":"s"}\n')
    assert without_warnings(events) == [Ready("s")]
    assert "a new major version may change it" in warnings(events)[0]


def test_before_ready_only_an_error_counts_and_the_end_says_it_never_got_ready() -> None:
    dialect = Aionrs(CONTEXT, session_id="gone", cwd="/tmp")
    events = dialect.feed(
        b'{"type":"info","msg_id":"","message":"starting"}\n'
        b'{"type":"error","msg_id":null,"error":{"code":"config_error","message":'
        b'"ANTHROPIC_API_KEY not set","retryable":false}}\n'
    )
    assert events == [ErrorEvent("ANTHROPIC_API_KEY not set")]
    assert dialect.close() == []  # its own words say why better than the dialect could
    silent = Aionrs(CONTEXT, session_id="gone", cwd="/tmp")
    assert silent.close() == [ErrorEvent(NOT_READY, unfinished=True)]


# --------------------------------------------------------------------------- a turn


def test_a_turn_streams_partials_thinking_and_ends_with_the_reply_and_usage() -> None:
    dialect = started()
    assert dialect.feed(HELLO) == HELLO_EVENTS
    assert dialect.close() == []  # between turns: nothing was cut short


@pytest.mark.parametrize("transcript", [HELLO, ASKS_TO_WRITE + WROTE])
def test_any_split_of_a_transcript_gives_the_same_events(transcript: bytes) -> None:
    whole = started().feed(transcript)
    assert fed_byte_by_byte(started(), transcript) == whole
    assert_every_cut_decodes_alike(started, transcript, whole, step=7, close=False)


def test_events_of_other_messages_between_turns_and_of_unknown_types_are_dropped() -> None:
    dialect = Aionrs(CONTEXT, session_id="", cwd="/tmp")
    stale = b'{"type":"text_delta","text":"old","msg_id":"bridge-1"}\n{"type":"stream_end","msg_id":"bridge-1"}\n'
    assert dialect.feed(stale) == []  # before ready
    dialect.feed(READY)
    assert dialect.feed(stale) == []  # between turns
    dialect.prompt(Turn("hi"))
    other = (
        b'{"type":"text_delta","text":"not ours","msg_id":"m-other"}\n'
        b'{"type":"stream_end","msg_id":"m-other"}\n'
        b'{"type":"pong"}\n{"type":"mcp_ready","name":"x","tools":[]}\n{"type":"config_changed"}\n'
        b'{"type":"info","msg_id":"bridge-1","message":"Stream interrupted, retrying... (1/2)"}\n'
        b'{"type":"compaction_started","msg_id":"bridge-1"}\n'
    )
    assert dialect.feed(other) == []
    # A missing or null msg_id is the turn's own (aionrs's engine errors carry none).
    assert dialect.feed(b'{"type":"text_delta","text":"ours"}\n{"type":"stream_end","msg_id":null}\n') == [
        PartialEvent("ours"),
        ReplyEvent("ours"),
        TurnEnd("end_turn"),
    ]


def test_garbage_lines_are_counted_and_reported_when_the_turn_ends() -> None:
    dialect = started()
    events = dialect.feed(b'not json\n[1,2]\n"text"\n\n' + HELLO)
    assert without_warnings(events) == HELLO_EVENTS
    assert warnings(events) == ["ignored 3 stdout line(s) that were not JSON objects"]
    dialect.prompt(Turn("again"))
    assert warnings(dialect.feed(b'{"type":"stream_end","msg_id":"bridge-2"}\n')) == []  # counted per turn


def test_a_line_over_the_limit_is_cut_and_the_turn_goes_on() -> None:
    dialect = Aionrs(DialectContext(settings=JsonSettings(max_line_bytes=4096)), session_id="", cwd="/tmp")
    dialect.feed(READY)
    dialect.prompt(Turn("hi"))
    huge = b'{"type":"text_delta","text":"' + b"x" * 5000 + b'","msg_id":"bridge-1"}\n'
    events = dialect.feed(huge + HELLO)
    assert isinstance(events[0], LineCut)
    assert events[1:] == HELLO_EVENTS


def test_the_text_after_a_tool_call_starts_a_new_paragraph_and_activity_never_enters_the_reply() -> None:
    dialect = started()
    events = dialect.feed(
        b'{"type":"text_delta","text":"Let me look.","msg_id":"bridge-1"}\n'
        b'{"type":"tool_running","msg_id":"bridge-1","call_id":"c9","tool_name":"Glob"}\n'
        b'{"type":"tool_result","msg_id":"bridge-1","call_id":"c9","tool_name":"Glob",'
        b'"status":"error","output":"no match","output_type":"text"}\n'
        b'{"type":"text_delta","text":"Found nothing.","msg_id":"bridge-1"}\n'
        b'{"type":"stream_end","msg_id":"bridge-1"}\n'
    )
    assert events == [
        PartialEvent("Let me look."),
        ActivityEvent("tool", tool="Glob", status="started", call_id="c9"),
        ActivityEvent("tool", tool="Glob", status="failed", call_id="c9", text="no match"),
        PartialEvent("\n\nFound nothing."),
        ReplyEvent("Let me look.\n\nFound nothing."),
        TurnEnd("end_turn"),
    ]


def test_an_image_result_is_not_excerpted_and_a_diff_is() -> None:
    dialect = started()
    events = dialect.feed(
        b'{"type":"tool_result","msg_id":"bridge-1","call_id":"c1","tool_name":"Read",'
        b'"status":"success","output":"iVBORw0KGgo=","output_type":"image"}\n'
        b'{"type":"tool_result","msg_id":"bridge-1","call_id":"c2","tool_name":"Edit",'
        b'"status":"success","output":"--- a/x\\n+++ b/x","output_type":"diff",'
        b'"metadata":{"file_path":"x"}}\n'
    )
    assert events == [
        ActivityEvent("tool", tool="Read", status="completed", call_id="c1"),
        ActivityEvent("tool", tool="Edit", status="completed", call_id="c2", text="--- a/x +++ b/x"),
    ]


# --------------------------------------------------------------------------- approvals


def test_a_tool_request_is_a_permission_request_and_an_approval_lets_it_run() -> None:
    dialect = started()
    events = dialect.feed(ASKS_TO_WRITE)
    assert events == [PartialEvent("I'll create the file."), WRITE_REQUEST]
    assert lines(dialect.answer(WRITE_REQUEST, Decision(allow=True))) == [
        {"type": "tool_approve", "call_id": "t1", "scope": "once"}
    ]
    assert dialect.answer(WRITE_REQUEST, Decision(allow=False)) == b""  # answered already
    assert dialect.feed(WROTE) == [
        ActivityEvent("tool", tool="Write", title="/src/hello.rs", status="started", call_id="t1"),
        ActivityEvent(
            "tool",
            tool="Write",
            title="/src/hello.rs",
            status="completed",
            call_id="t1",
            text="File written successfully",
        ),
        PartialEvent("\n\nFile created successfully."),
        ReplyEvent("I'll create the file.\n\nFile created successfully."),
        UsageEvent(Usage(input_tokens=10, output_tokens=5, total_tokens=15)),
        TurnEnd("end_turn"),
    ]


def test_an_approval_for_always_has_scope_always() -> None:
    dialect = started()
    dialect.feed(ASKS_TO_WRITE)
    assert lines(dialect.answer(WRITE_REQUEST, Decision(allow=True, always=True))) == [
        {"type": "tool_approve", "call_id": "t1", "scope": "always"}
    ]


def test_a_denial_carries_its_reason_and_the_agent_s_cancel_is_not_reported_twice() -> None:
    dialect = started()
    dialect.feed(ASKS_TO_WRITE)
    assert lines(dialect.answer(WRITE_REQUEST, Decision(allow=False, message="Write is not in the allow list"))) == [
        {"type": "tool_deny", "call_id": "t1", "reason": "Write is not in the allow list"}
    ]
    assert (
        dialect.feed(
            b'{"type":"tool_cancelled","msg_id":"bridge-1","call_id":"t1","reason":"Write is not in the allow list"}\n'
        )
        == []
    )  # the host heard "denied" with the answer
    dialect2 = started()
    dialect2.feed(ASKS_TO_WRITE)
    assert lines(dialect2.answer(WRITE_REQUEST, Decision(allow=False))) == [
        {"type": "tool_deny", "call_id": "t1", "reason": "denied by the host"}
    ]


def test_a_cancel_the_agent_made_itself_is_a_failed_tool() -> None:
    dialect = started()
    dialect.feed(ASKS_TO_WRITE)
    events = dialect.feed(b'{"type":"tool_cancelled","msg_id":"bridge-1","call_id":"t1","reason":"timed out"}\n')
    assert events == [
        RequestWithdrawn("t1"),  # it waited for the host's answer: the host is told it is gone
        ActivityEvent("tool", tool="Write", title="/src/hello.rs", status="failed", call_id="t1", text="timed out"),
    ]
    assert dialect.answer(WRITE_REQUEST, Decision(allow=True)) == b""  # nothing waits for it any more


@pytest.mark.parametrize(
    ("category", "kind"),
    [("info", "read"), ("edit", "edit"), ("exec", "exec"), ("mcp", "other"), ("network", ""), (None, "")],
)
def test_the_category_is_the_kind_of_tool(category: str | None, kind: str) -> None:
    dialect = started()
    tool = {"name": "mcp__docs__search", "category": category, "args": {"query": "warm pools"}}
    events = dialect.feed(
        json.dumps({"type": "tool_request", "msg_id": "bridge-1", "call_id": "c1", "tool": tool}).encode() + b"\n"
    )
    assert events == [
        PermissionRequest(
            request_id="c1", tool="mcp__docs__search", kind=kind, title="warm pools", input={"query": "warm pools"}
        )
    ]


def test_several_requests_are_answered_one_by_one() -> None:
    dialect = started()
    events = dialect.feed(
        b'{"type":"tool_request","msg_id":"bridge-1","call_id":"t1","tool":{"name":"Read",'
        b'"category":"info","args":{"file_path":"a.rs"},"description":"Read a.rs"}}\n'
        b'{"type":"tool_request","msg_id":"bridge-1","call_id":"t2","tool":{"name":"Read",'
        b'"category":"info","args":{"file_path":"b.rs"},"description":"Read b.rs"}}\n'
        b'{"type":"tool_request","msg_id":"bridge-1","call_id":"t2","tool":{"name":"Read"}}\n'
    )
    assert [event.request_id for event in events] == ["t1", "t2"]  # asked twice: the first question stands
    assert lines(dialect.answer(events[1], Decision(allow=False, message="no")))[0]["call_id"] == "t2"
    assert lines(dialect.answer(events[0], Decision(allow=True)))[0]["call_id"] == "t1"


def test_a_malformed_request_is_warned_about() -> None:
    dialect = started()
    events = dialect.feed(
        b'{"type":"tool_request","msg_id":"bridge-1","tool":{"name":"Bash"}}\n'
        b'{"type":"tool_request","msg_id":"bridge-1","call_id":"c","tool":"Bash"}\n'
    )
    assert len(warnings(events)) == 2 and without_warnings(events) == []


# --------------------------------------------------------------------------- stop


def test_stop_denies_the_pending_requests_then_stops_and_the_stream_end_ends_the_turn_cancelled() -> None:
    dialect = started()
    dialect.feed(
        ASKS_TO_WRITE + b'{"type":"tool_request","msg_id":"bridge-1","call_id":"t2","tool":{"name":'
        b'"Bash","category":"exec","args":{"command":"ls"}}}\n'
    )
    assert lines(dialect.cancel()) == [
        {"type": "tool_deny", "call_id": "t1", "reason": "the turn was cancelled"},
        {"type": "tool_deny", "call_id": "t2", "reason": "the turn was cancelled"},
        {"type": "stop"},
    ]
    assert dialect.cancel() == b""  # asked already
    assert dialect.answer(WRITE_REQUEST, Decision(allow=True)) == b""  # the cancel answered it
    late = dialect.feed(
        b'{"type":"tool_request","msg_id":"bridge-1","call_id":"t3","tool":{"name":"Read",'
        b'"category":"info","args":{}}}\n'
    )
    assert late == [AgentInput(b'{"type":"tool_deny","call_id":"t3","reason":"the turn was cancelled"}\n')]
    assert dialect.feed(
        b'{"type":"tool_cancelled","msg_id":"bridge-1","call_id":"t1","reason":"stopped"}\n'
        b'{"type":"stream_end","msg_id":"bridge-1","usage":{"input_tokens":0,"output_tokens":0}}\n'
    ) == [
        ReplyEvent("I'll create the file."),
        UsageEvent(Usage(input_tokens=0, output_tokens=0, total_tokens=0)),
        TurnEnd("cancelled"),
    ]
    assert dialect.cancel() == b""  # between turns


def test_aionrs_0_2_ends_its_process_on_stop_which_leaves_the_turn_unfinished() -> None:
    dialect = started()
    dialect.feed(HELLO.split(b"\n")[0] + b"\n")
    assert dialect.cancel() == b'{"type":"stop"}\n'
    assert dialect.close() == [ErrorEvent(UNFINISHED, unfinished=True)]


# --------------------------------------------------------------------------- errors


def test_an_engine_error_fails_the_turn_which_ends_at_stream_end() -> None:
    dialect = started()
    events = dialect.feed(
        b'{"type":"stream_start","msg_id":"bridge-1"}\n'
        b'{"type":"error","error":{"code":"engine_error","message":"Stopped after reaching the '
        b'turn budget (max_turns=20)","retryable":false}}\n'
    )
    assert events == [ErrorEvent("Stopped after reaching the turn budget (max_turns=20)")]
    assert dialect.feed(
        b'{"type":"stream_end","msg_id":"bridge-1","usage":{"input_tokens":0,"output_tokens":0}}\n'
    ) == [ReplyEvent(""), UsageEvent(Usage(input_tokens=0, output_tokens=0, total_tokens=0)), TurnEnd("end_turn")]


def test_a_retryable_error_does_not_end_the_turn_and_fails_it_only_if_no_text_follows() -> None:
    rate_limited = (
        b'{"type":"stream_start","msg_id":"bridge-1"}\n'
        b'{"type":"error","msg_id":"bridge-1","error":{"code":"provider_error","message":"Rate limit '
        b'exceeded. Retry after 30s.","retryable":true}}\n'
    )
    dialect = started()
    events = dialect.feed(rate_limited)
    assert without_warnings(events) == [] and "retryable error (provider_error)" in warnings(events)[0]
    assert dialect.feed(
        b'{"type":"text_delta","text":"Done.","msg_id":"bridge-1"}\n{"type":"stream_end","msg_id":"bridge-1"}\n'
    ) == [PartialEvent("Done."), ReplyEvent("Done."), TurnEnd("end_turn")]
    dialect = started()
    dialect.feed(rate_limited)
    assert dialect.feed(b'{"type":"stream_end","msg_id":"bridge-1"}\n') == [
        ErrorEvent("Rate limit exceeded. Retry after 30s."),
        ReplyEvent(""),
        TurnEnd("end_turn"),
    ]
    dialect = started()
    dialect.feed(rate_limited)
    assert dialect.close() == [
        ErrorEvent("Rate limit exceeded. Retry after 30s."),
        ErrorEvent(UNFINISHED, unfinished=True),
    ]


def test_an_error_before_the_stream_began_refuses_the_message_and_ends_the_turn() -> None:
    dialect = started()
    events = dialect.feed(
        b'{"type":"error","msg_id":null,"error":{"code":"protocol_error","message":'
        b'"Unknown command type: mesage","retryable":false}}\n'
        b'{"type":"stream_end","msg_id":"bridge-1"}\n'
    )
    assert events == [ErrorEvent("Unknown command type: mesage"), TurnEnd("refused")]
    dialect.prompt(Turn("next"))  # the process takes the next turn


def test_an_error_without_a_message_says_its_code_and_errors_between_turns_are_warnings() -> None:
    dialect = started()
    dialect.feed(b'{"type":"stream_start","msg_id":"bridge-1"}\n')
    assert dialect.feed(b'{"type":"error","error":{"code":"tool_error"}}\n{"type":"error","error":3}\n') == [
        ErrorEvent("aionrs reported an error (tool_error)"),
        ErrorEvent("aionrs reported an error"),
    ]
    dialect.feed(b'{"type":"stream_end","msg_id":"bridge-1"}\n')
    events = dialect.feed(
        b'{"type":"error","error":{"code":"protocol_error","message":"AddMcpServer rejected","retryable":false}}\n'
    )
    assert warnings(events) == ["aionrs reported an error between turns (protocol_error); ignored"]


def test_the_stream_ending_mid_turn_and_mid_line_is_unfinished_and_between_turns_is_not() -> None:
    dialect = started()
    assert dialect.feed(HELLO[:-10]) == HELLO_EVENTS[:3]
    events = dialect.close()  # the stream_end line was cut short by the end of stdout
    assert without_warnings(events) == [ErrorEvent(UNFINISHED, unfinished=True)]
    assert warnings(events) == ["ignored 1 stdout line(s) that were not JSON objects"]
    dialect = started()
    dialect.feed(HELLO)
    assert dialect.close() == []


def test_prompt_during_a_turn_is_a_bug_of_the_caller() -> None:
    with pytest.raises(ProtocolMisuse):
        started().prompt(Turn("two at once"))


# --------------------------------------------------------------------------- the sample agent, driven by a loop


class Conversation:
    """One aionrs-like process and its dialect, driven the way the warm engine drives them (a test-sized loop)."""

    def __init__(self, process: trio.Process, dialect: Aionrs) -> None:
        self.process = process
        self.dialect = dialect
        self.ended = False

    async def write(self, data: bytes) -> None:
        if data:
            assert self.process.stdin is not None
            await self.process.stdin.send_all(data)

    async def until(
        self,
        kinds: tuple[type, ...],
        decide: Callable[[PermissionRequest], Decision] | None = None,
        on_request: Callable[[PermissionRequest], Any] | None = None,
    ) -> list[Any]:
        """Events up to one of `kinds` (or the end of stdout); requests answered by `decide`."""
        assert self.process.stdout is not None
        events: list[Any] = []
        while True:
            data = await self.process.stdout.receive_some(65536)
            batch = self.dialect.feed(data) if data else self.dialect.close()
            for event in batch:
                events.append(event)
                if isinstance(event, AgentInput):
                    await self.write(event.data)
                elif isinstance(event, PermissionRequest):
                    if on_request is not None:
                        await on_request(event)
                    if decide is not None:
                        await self.write(self.dialect.answer(event, decide(event)))
            if not data:
                self.ended = True
                return events
            if any(isinstance(event, kinds) for event in batch):
                return events

    async def turn(
        self, message: str, decide: Callable[[PermissionRequest], Decision] | None = None, **turn: Any
    ) -> list[Any]:
        await self.write(self.dialect.prompt(Turn(message, **turn)))
        return await self.until((TurnEnd,), decide)


@asynccontextmanager
async def conversation(state: Path, *args: str, session_id: str = "", **env: str) -> AsyncIterator[Conversation]:
    environment = {**os.environ, "AIONRS_LIKE_STATE_DIR": str(state), "STREAM_DELAY": "0", **env}
    argv = [PYTHON, str(AGENT), "--json-stream", *(["--resume", session_id] if session_id else []), *args]
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=environment
    )
    try:
        yield Conversation(process, Aionrs(CONTEXT, session_id=session_id, cwd=str(state)))
    finally:
        with trio.CancelScope(shield=True):
            if process.stdin is not None:
                await process.stdin.aclose()  # the goodbye
            with trio.move_on_after(5):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


def reply_of(events: list[Any]) -> str:
    replies = [event.text for event in events if isinstance(event, ReplyEvent)]
    return replies[-1] if replies else ""


def ready_id(events: list[Any]) -> str:
    return next(event.session_id for event in events if isinstance(event, Ready))


async def test_one_process_takes_several_turns_and_a_new_one_resumes_the_session(tmp_path: Path) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with conversation(tmp_path) as chat:
            session_id = ready_id(await chat.until((Ready,)))
            first = await chat.turn("hello think")
            assert ActivityEvent("thinking", text="Turn 1 of this process; the user wrote 2 word(s).") in first
            assert reply_of(first) == "You said: hello think"
            assert "".join(event.text for event in first if isinstance(event, PartialEvent)) == reply_of(first)
            second = await chat.turn("and again")
            assert reply_of(second) == "You said: and again\n(last time you said: hello think)"
            pid = chat.process.pid
        assert chat.process.returncode == 0  # closing stdin ended it
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        async with conversation(tmp_path, session_id=session_id) as chat:
            assert await chat.until((Ready,)) == [Ready(session_id)]  # resumed: nothing replayed
            third = await chat.turn("third")
            assert reply_of(third) == "You said: third\n(last time you said: and again)"
            usage = next(event.usage for event in third if isinstance(event, UsageEvent))
            assert usage.input_tokens == 10 + 2 + 10 + 2 + 10 + 1  # the session's running total, as aionrs's


async def test_a_process_killed_between_turns_resumes_in_a_new_one(tmp_path: Path) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with conversation(tmp_path) as chat:
            session_id = ready_id(await chat.until((Ready,)))
            await chat.turn("remember me")
            chat.process.send_signal(signal.SIGKILL)
            assert without_warnings(await chat.until((TurnEnd,))) == []  # stdout ends between turns: nothing lost
        async with conversation(tmp_path, session_id=session_id) as chat:
            await chat.until((Ready,))
            assert reply_of(await chat.turn("who")) == "You said: who\n(last time you said: remember me)"


@pytest.mark.parametrize("field", ["content", "input"])
async def test_agents_that_read_only_content_or_only_input_both_take_the_message(tmp_path: Path, field: str) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with conversation(tmp_path, AIONRS_LIKE_FIELD=field) as chat:
            await chat.until((Ready,))
            assert reply_of(await chat.turn("either way")) == "You said: either way"


async def test_approvals_allow_deny_and_always(tmp_path: Path) -> None:
    asked: list[PermissionRequest] = []

    def policy(request: PermissionRequest) -> Decision:
        asked.append(request)
        if request.tool == "Bash":
            return Decision(allow=False, message="no shell here")
        return Decision(allow=True, always=request.tool == "Read")

    with trio.fail_after(TURN_DEADLINE):
        async with conversation(tmp_path) as chat:
            await chat.until((Ready,))
            events = await chat.turn("go tool=Read tool=Bash", policy)
            assert [(request.tool, request.kind, request.title) for request in asked] == [
                ("Read", "read", "Read README.md"),
                ("Bash", "exec", "Bash ls -la"),
            ]
            assert reply_of(events) == (
                "Let me use Read, Bash.\n\nYou said: go tool=Read tool=Bash\n"
                "(Read was allowed for the session)\n(Bash was denied: no shell here)"
            )
            tools = [
                (event.tool, event.status)
                for event in events
                if isinstance(event, ActivityEvent) and event.activity == "tool"
            ]
            assert tools == [("Read", "started"), ("Read", "completed")]  # the denial was the answer's to report
            asked.clear()
            again = await chat.turn("once more tool=Grep tool=Write", policy)
            # Grep is info, like Read, approved for the session: only Write is asked.
            assert [request.tool for request in asked] == ["Write"]
            assert "(Grep was allowed)\n(Write was allowed)" in reply_of(again)


async def test_stop_with_a_pending_request_ends_the_turn_and_the_process_takes_the_next(tmp_path: Path) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with conversation(tmp_path) as chat:
            await chat.until((Ready,))

            async def stop(request: PermissionRequest) -> None:  # a host that cancels instead of answering
                await chat.write(chat.dialect.cancel())

            await chat.write(chat.dialect.prompt(Turn("write tool=Write")))
            events = await chat.until((TurnEnd,), on_request=stop)
            assert events[-1] == TurnEnd("cancelled")
            assert not any(isinstance(event, ErrorEvent) for event in events)
            assert reply_of(await chat.turn("still there?")) == (
                "You said: still there?\n(last time you said: write tool=Write)"
            )


async def test_stop_mid_stream_with_an_agent_that_ends_on_stop_leaves_the_turn_unfinished(tmp_path: Path) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with conversation(tmp_path, AIONRS_LIKE_EXIT_ON_STOP="1") as chat:
            session_id = ready_id(await chat.until((Ready,)))
            await chat.write(chat.dialect.prompt(Turn("hold on")))
            assert await chat.until((PartialEvent,)) == [PartialEvent("You")]
            await chat.write(chat.dialect.cancel())
            assert await chat.until((TurnEnd,)) == [ErrorEvent(UNFINISHED, unfinished=True)]
            assert chat.ended
        async with conversation(tmp_path, session_id=session_id) as chat:
            await chat.until((Ready,))
            assert "(last time you said: hold on)" in reply_of(await chat.turn("back"))


async def test_errors_from_the_agent(tmp_path: Path) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with conversation(tmp_path) as chat:
            await chat.until((Ready,))
            failed = await chat.turn("fail now")
            assert ErrorEvent("the model is not available (make-believe)") in failed and failed[-1] == TurnEnd()
            limited = without_warnings(await chat.turn("rate-limit"))
            assert limited[0] == ErrorEvent("Rate limit exceeded. Retry after 30s.")
            recovered = await chat.turn("flaky but fine")
            assert not any(isinstance(event, ErrorEvent) for event in recovered)
            assert reply_of(recovered).startswith("You said: flaky but fine")
            garbage = await chat.turn("garbage")
            assert "ignored 1 stdout line(s) that were not JSON objects" in warnings(garbage)
            crashed = await chat.turn("crash")
            assert crashed[-1] == ErrorEvent(UNFINISHED, unfinished=True) and chat.ended


async def test_sessions_disabled_and_an_unknown_session(tmp_path: Path) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with conversation(tmp_path, AIONRS_LIKE_NO_SESSIONS="1") as chat:
            assert await chat.until((Ready,)) == [Ready("")]
            assert reply_of(await chat.turn("no memory")) == "You said: no memory"
        async with conversation(tmp_path, session_id="never-was") as chat:
            assert await chat.until((Ready,)) == [ErrorEvent(NOT_READY, unfinished=True)]


# --------------------------------------------------------------------------- through the public API


@pytest.fixture
def ready_profile(tmp_path: Path) -> Callable[..., bridge.Profile]:
    """profiles/aionrs.yaml as shipped, its sessions kept under tmp_path and its words sent without delay."""

    def make(**env: str) -> bridge.Profile:
        profile = bridge.load_profile(PROFILES / "aionrs.yaml", cache=False)
        return profile.replace(
            env={**profile.env, "STREAM_DELAY": "0", "AIONRS_LIKE_STATE_DIR": str(tmp_path), **env}, kill_grace_secs=2
        )

    return make


def recorder(into: list[Any]) -> Callable[[Any], None]:
    return into.append


async def test_one_warm_process_holds_the_conversation_and_the_policy_answers_its_tools(
    ready_profile: Callable[..., bridge.Profile],
) -> None:
    seen: list[Any] = []
    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(ready_profile())
            await agent.start(nursery)
            pid = agent.pid
            first = await agent.turn(Turn("hello think"), recorder(seen))
            # The profile allows read tools and denies exec ones, without asking anybody.
            tools = await agent.turn(Turn("look tool=Read tool=Bash"), recorder(seen))
            assert agent.pid == pid and agent.alive
            await agent.close()
    assert first.ok and first.reply == "You said: hello think"
    assert first.session_id == tools.session_id == agent.session_id != ""
    assert [event.text for event in seen if isinstance(event, PartialEvent)][:3] == ["You", " said:", " hello"]
    assert ActivityEvent("thinking", text="Turn 1 of this process; the user wrote 2 word(s).") in seen
    assert tools.ok and tools.reply == (
        "Let me use Read, Bash.\n\nYou said: look tool=Read tool=Bash\n(Read was allowed)\n"
        "(Bash was denied: Bash is not allowed by the profile)\n(last time you said: hello think)"
    )
    assert [
        (event.tool, event.status) for event in seen if isinstance(event, ActivityEvent) and event.activity == "tool"
    ] == [("Read", "allowed"), ("Bash", "denied"), ("Read", "started"), ("Read", "completed")]
    assert first.usage == Usage(input_tokens=10 + 2, output_tokens=4, cached_input_tokens=10, total_tokens=16)
    assert tools.usage is not None and tools.usage.input_tokens == 12 + 10 + 3  # the session's running total
    assert_no_live_process([pid])


async def test_a_question_the_profile_asks_goes_to_the_host_and_always_sticks_for_the_session(
    ready_profile: Callable[..., bridge.Profile],
) -> None:
    asked: list[PermissionRequest] = []

    def host(questions: Questions) -> Callable[[Any], None]:
        def on_event(event: Any) -> None:
            if isinstance(event, PermissionRequest):
                asked.append(event)
                questions.decide(event.request_id, Decision(allow=True, always=True))

        return on_event

    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(ready_profile())
            await agent.start(nursery)
            questions = Questions()
            wrote = await agent.turn(Turn("save tool=Write"), host(questions), questions=questions)
            questions = Questions()
            edited = await agent.turn(Turn("change tool=Edit"), host(questions), questions=questions)
            await agent.close()
    # Write is an edit tool, which the profile asks the host about; "always" approved edits for the session.
    assert [(request.tool, request.kind, request.title) for request in asked] == [("Write", "edit", "Write notes.txt")]
    assert "(Write was allowed for the session)" in wrote.reply
    assert edited.ok and "(Edit was allowed)" in edited.reply


async def test_a_cancel_while_a_question_is_open_stops_the_turn_and_the_agent_takes_the_next(
    ready_profile: Callable[..., bridge.Profile],
) -> None:
    cancel = trio.Event()

    def on_event(event: Any) -> None:
        if isinstance(event, PermissionRequest):
            cancel.set()  # the host cancels instead of answering

    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(ready_profile())
            await agent.start(nursery)
            stopped = await agent.turn(Turn("save tool=Write"), on_event, cancel=cancel)
            assert agent.alive  # the agent ended the stream; its process goes on
            after = await agent.turn(Turn("still there?"))
            await agent.close()
    assert (stopped.outcome, stopped.exit_code) == ("cancelled", 130)
    assert after.ok and after.reply == "You said: still there?\n(last time you said: save tool=Write)"


async def test_aionrs_0_2_ends_on_stop_and_the_next_turn_resumes_in_a_new_process(
    ready_profile: Callable[..., bridge.Profile],
) -> None:
    profile = ready_profile(AIONRS_LIKE_EXIT_ON_STOP="1")
    cancel = trio.Event()

    def on_event(event: Any) -> None:
        if isinstance(event, PartialEvent):
            cancel.set()

    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            stopped = await agent.turn(Turn("hold on"), on_event, cancel=cancel)
            assert not agent.alive
            await agent.close()
        resumed = await bridge.run_turn(profile, Turn("back", session_id=stopped.session_id))
    assert (stopped.outcome, stopped.exit_code, stopped.error) == ("cancelled", 130, "")
    assert resumed.ok and resumed.reply == "You said: back\n(last time you said: hold on)"


async def test_a_timeout_stops_the_turn_and_the_agent_stays_warm(ready_profile: Callable[..., bridge.Profile]) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(ready_profile().replace(timeout_secs=0.5))
            await agent.start(nursery)
            held = await agent.turn(Turn("hold"))
            after = await agent.turn(Turn("next"))
            await agent.close()
    assert (held.outcome, held.exit_code) == ("timeout", 124)
    assert after.ok and after.reply.startswith("You said: next")


async def test_a_conversation_resumes_after_its_process_was_killed(
    ready_profile: Callable[..., bridge.Profile],
) -> None:
    profile = ready_profile()
    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            first = await agent.turn(Turn("remember me"))
            assert agent.pid is not None
            os.kill(agent.pid, signal.SIGKILL)
            await agent.close()  # reaps it
            assert not agent.alive and agent.returncode == -signal.SIGKILL
            again = WarmAgent(profile, session_id=first.session_id)
            await again.start(nursery)
            resumed = await again.turn(Turn("who am I"))
            await again.close()
    assert resumed.ok and resumed.session_id == first.session_id
    assert resumed.reply == "You said: who am I\n(last time you said: remember me)"


async def test_run_turn_starts_an_agent_per_turn_and_resumes_the_stored_session(
    ready_profile: Callable[..., bridge.Profile],
) -> None:
    profile = ready_profile()
    with trio.fail_after(TURN_DEADLINE):
        first = await bridge.run_turn(profile, Turn("one"))
        second = await bridge.run_turn(profile, Turn("two", session_id=first.session_id))
        unknown = await bridge.run_turn(profile, Turn("three", session_id="never-was"))
        failed = await bridge.run_turn(profile, Turn("fail", session_id=first.session_id))
    assert first.ok and second.ok and first.session_id == second.session_id
    assert second.reply == "You said: two\n(last time you said: one)"
    assert unknown.outcome == "spawn_failed" and NOT_READY in unknown.error_reply
    assert "Session 'never-was' not found" in unknown.stderr_tail
    assert (failed.outcome, failed.error) == ("agent_error", "the model is not available (make-believe)")


def test_agent_bridge_run_drives_the_ready_profile(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(PYTHON).parent / "agent-bridge"), "run", str(PROFILES / "aionrs.yaml"), "hello tool=Read"],
        capture_output=True,
        text=True,
        timeout=TURN_DEADLINE,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["Let me use Read.", "", "You said: hello tool=Read", "(Read was allowed)"]


# --------------------------------------------------------------------------- in a host, and in chat


@pytest.fixture
def host_profiles(tmp_path: Path) -> Path:
    """A profiles directory with `aionrs`: the sample agent, the ready profile's policy, sessions under tmp_path.

    `--project-dir` (an aionrs flag the stand-in ignores) marks its processes' argv with tmp_path, so the test
    can find them.
    """
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "aionrs.yaml").write_text(
        textwrap.dedent(f"""\
        protocol: aionrs
        command: [{PYTHON}, {AGENT}, --json-stream, --project-dir, {tmp_path}]
        resume_args: ["--resume={{{{SESSION_ID}}}}"]
        kill_grace_secs: 2
        env: {{AIONRS_LIKE_STATE_DIR: {tmp_path / "sessions"}, STREAM_DELAY: "0"}}
        permissions: {{default: deny, allow: [read], ask: [edit], deny: [exec], timeout_secs: 5}}
    """)
    )
    return profiles


def agent_pids(marker: Path) -> list[int]:
    """The live processes whose argv names `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(marker).encode() in argv and str(AGENT).encode() in argv and process_state(int(entry.name)) != "Z":
            pids.append(int(entry.name))
    return pids


def thoughts(events: list[Any]) -> list[str]:
    return [event.text for event in events if isinstance(event, ActivityEvent) and event.activity == "thinking"]


async def test_the_host_keeps_one_process_per_conversation_and_answers_tools_by_policy_and_by_asking(
    host_profiles: Path, tmp_path: Path
) -> None:
    seen: list[Any] = []
    asked: list[str] = []

    def on_permission(request: PermissionRequest) -> bool:
        asked.append(request.tool)
        return True

    with trio.fail_after(TURN_DEADLINE):
        async with bridge.open_host(host_profiles, state=tmp_path / "state.sqlite3") as host:
            first = await host.submit("aionrs", "chat-1", Turn("hello think"), on_event=seen.append)
            tools = await host.submit(
                "aionrs",
                "chat-1",
                Turn("think tool=Read tool=Bash tool=Write"),
                on_event=seen.append,
                on_permission=on_permission,
            )
            other = await host.submit("aionrs", "chat-2", Turn("think"), on_event=seen.append)
            assert host.stats().warm == 2 and len(agent_pids(tmp_path)) == 2
    assert thoughts(seen) == [
        "Turn 1 of this process; the user wrote 2 word(s).",
        "Turn 2 of this process; the user wrote 4 word(s).",  # the same process
        "Turn 1 of this process; the user wrote 1 word(s).",
    ]  # another conversation's
    assert asked == ["Write"]  # read is allowed and exec denied by the profile; edit is asked
    assert first.ok and tools.ok and other.ok and first.session_id == tools.session_id != other.session_id
    assert tools.reply.endswith(
        "(Read was allowed)\n(Bash was denied: Bash is not allowed by the profile)\n"
        "(Write was allowed)\n(last time you said: hello think)"
    )
    assert agent_pids(tmp_path) == []  # the host said goodbye to both


async def test_in_a_host_a_cancel_with_a_question_open_keeps_the_process_and_a_killed_one_is_resumed(
    host_profiles: Path, tmp_path: Path
) -> None:
    seen: list[Any] = []
    with trio.fail_after(TURN_DEADLINE):
        async with bridge.open_host(host_profiles, state=tmp_path / "state.sqlite3") as host:
            async with trio.open_nursery() as nursery:

                def on_event(event: Any) -> None:
                    if isinstance(event, PermissionRequest):
                        assert host.cancel("t1")  # instead of an answer

                cancelled = await host.submit(
                    "aionrs", "chat", Turn("save tool=Write"), on_event=on_event, turn_id="t1"
                )
                nursery.cancel_scope.cancel()
            kept = await host.submit("aionrs", "chat", Turn("think"), on_event=seen.append)
            [pid] = agent_pids(tmp_path)
            os.kill(pid, signal.SIGKILL)
            while process_state(pid) is not None:  # reaped: the pool knows it is gone
                await trio.sleep(0.01)
            resumed = await host.submit("aionrs", "chat", Turn("think again"), on_event=seen.append)
    assert (cancelled.outcome, cancelled.exit_code) == ("cancelled", 130)
    assert thoughts(seen) == [
        "Turn 2 of this process; the user wrote 1 word(s).",  # the cancel kept it
        "Turn 1 of this process; the user wrote 2 word(s).",
    ]  # a new process…
    assert resumed.ok and resumed.session_id == kept.session_id
    assert resumed.reply.endswith("(last time you said: think)")  # …that resumed the session


def test_piped_chat_carries_the_conversation_and_denies_what_nobody_can_be_asked(tmp_path: Path) -> None:
    env = {
        **{name: value for name, value in os.environ.items() if not name.startswith("AGENT_")},
        "TMPDIR": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "xdg-state"),
    }
    done = subprocess.run(
        [str(Path(PYTHON).parent / "agent-bridge"), "chat", str(PROFILES / "aionrs.yaml")],
        input="hello\nsave tool=Write\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "You said: hello",
        "Let me use Write.",
        "",
        "You said: save tool=Write",
        "(Write was denied: nobody was at a terminal to answer)",
        "(last time you said: hello)",
    ]
    assert "denied Write: Write notes.txt (nobody at a terminal to ask)" in done.stderr


def test_a_tool_the_agent_runs_before_the_answer_came_withdraws_its_request() -> None:
    dialect = started()
    dialect.feed(ASKS_TO_WRITE)
    events = dialect.feed(WROTE)
    assert events[:2] == [
        RequestWithdrawn("t1"),
        ActivityEvent("tool", tool="Write", title="/src/hello.rs", status="started", call_id="t1"),
    ]
    assert dialect.answer(WRITE_REQUEST, Decision(allow=False)) == b""
