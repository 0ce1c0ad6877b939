"""`protocol: agentproc-0.4`: the pure dialect from transcripts, then real agents of the reference project.

The transcripts are lines agentproc 0.20's SDK and hub bridges really write.
The real counterparts are the reference package itself (a test-only
dependency): its echo agent, agents written with its SDK, and its runner,
whose turn line, answers and rules the dialect must match byte for byte.
"""

from __future__ import annotations

import base64
import importlib.resources
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
from agentproc import runner as reference
from attachment_files import PNG, TURN_FILES, sent
from conftest import PROFILES, PYTHON, TURN_DEADLINE, write_agent
from dialectkit import assert_every_cut_decodes_alike, fed_byte_by_byte, fed_whole, warnings, without_warnings
from hypothesis import given
from hypothesis import strategies as st

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
    SessionEvent,
    Usage,
    UsageEvent,
    agentproc04,
    dialect_class,
)
from bridge.dialects.agentproc04 import AgentProc04
from bridge.permissions import Decision, PermissionRequest
from bridge.turn import Attachment

ECHO_AGENT = Path(str(importlib.resources.files("agentproc") / "hub_data" / "echo-agent" / "bridge.py"))
ASKS = DialectContext(settings=JsonSettings(), permissions=True)
TOLD_NOBODY_ANSWERS = DialectContext(settings=JsonSettings())

# The SDK's own lines (agentproc 0.20 `create_profile`, verified): a streaming turn and an error turn.
STREAM = (
    b'{"type":"partial","text":"thinking about it","role":"thinking"}\n'
    b'{"type":"partial","text":"Hello "}\n'
    b'{"type":"partial","text":"world","role":"output"}\n'
    b'{"type":"result","text":"Hello world","session_id":"sess-1"}\n'
)
STREAM_EVENTS = [
    ActivityEvent("thinking", text="thinking about it"),
    PartialEvent("Hello "),
    PartialEvent("world"),
    SessionEvent("sess-1"),
    ReplyEvent("Hello world"),
]
SOFT_ERROR = b'{"type":"error","message":"soft error"}\n{"type":"result","text":"body after error"}\n'
# A hub bridge's (dsh) turn with usage, and a permission request as the SDK writes it.
WITH_USAGE = (
    b'{"type":"partial","text":"Gem ","session_id":"s-9"}\n'
    b'{"type":"result","text":"Gem reply","session_id":"s-9","usage":{"input_tokens":120,'
    b'"output_tokens":30,"total_tokens":150,"cache_read_input_tokens":100,"cache_creation_input_tokens":7,'
    b'"reasoning_tokens":12,"duration_ms":900,"cost_usd":0.0042}}\n'
)
ASK = (
    b'{"type":"partial","text":"about to run a tool"}\n'
    b'{"type":"permission_request","request_id":"r1","tool_name":"Bash","input":{"command":"ls"},'
    b'"description":"List files"}\n'
)


def decode(data: bytes, context: DialectContext = ASKS, turn: Turn = Turn("hi")) -> list[Any]:
    return fed_whole(AgentProc04(context, turn), data)


# --------------------------------------------------------------------------- the turn line


def test_the_protocol_is_registered_and_writes_the_message_to_stdin() -> None:
    assert dialect_class("agentproc-0.4") is AgentProc04
    assert bridge.dialects.PROTOCOLS["agentproc-0.4"].message_on_stdin


def test_the_turn_line_is_compact_json_in_the_reference_order_and_stdin_closes_after_it() -> None:
    handover = AgentProc04.handover(Turn('héllo "you"', session_name="chat-7", from_user="ann"), TOLD_NOBODY_ANSWERS)
    assert (
        handover.stdin
        == (
            '{"type":"turn","message":"héllo \\"you\\"","session_id":"","session_name":"chat-7",'
            '"protocol_version":"0.4"}\n'
        ).encode()
    )
    assert not handover.keep_open  # nobody answers: the agent sees EOF after its turn


def test_attachments_take_the_wire_shape_and_permission_keeps_stdin_open() -> None:
    turn = Turn(
        "look",
        session_id="abc-123",
        attachments=(Attachment("image", "https://e/x.png"), Attachment("file", "file:///tmp/", name="")),
    )
    handover = AgentProc04.handover(turn, ASKS)
    assert handover.stdin == (
        b'{"type":"turn","message":"look","session_id":"abc-123","session_name":"default",'
        b'"protocol_version":"0.4","attachments":[{"kind":"image","url":"https://e/x.png",'
        b'"filename":"x.png"},{"kind":"file","url":"file:///tmp/","filename":"tmp"}],'
        b'"permission":true}\n'
    )
    assert handover.keep_open


async def test_the_turn_line_is_byte_for_byte_the_one_the_reference_runner_writes(tmp_path: Path) -> None:
    recorder = write_agent(
        tmp_path,
        "recorder.py",
        f"""\
        #!{PYTHON}
        import sys
        open(sys.argv[1], "wb").write(sys.stdin.buffer.readline())
        print('{{"type":"result","text":"ok"}}')
    """,
    )
    notes = tmp_path / "a b.txt"
    notes.write_text("milk\n")
    # Fetched by the bridge before the agent starts: each entry then has its path, media type and size.
    attachments = (
        Attachment("image", "data:image/png;base64," + base64.b64encode(PNG).decode(), name="dot.png"),
        Attachment("file", str(notes), name="ü.txt"),
    )
    for permission in (False, True):
        theirs, ours = tmp_path / f"theirs-{permission}", tmp_path / f"ours-{permission}"
        profile = bridge.Profile.from_mapping(
            {
                "protocol": "agentproc-0.4",
                "command": [str(recorder), str(ours)],
                "cwd": str(tmp_path),
                **({"permissions": {"default": "deny"}} if permission else {}),
            }
        )
        with trio.fail_after(TURN_DEADLINE):
            result = await bridge.run_turn(
                profile, Turn('héllo\n"there"', session_id="s 1:x", session_name="chat-7", attachments=attachments)
            )
        assert result.reply == "ok", result.error
        entries = json.loads(ours.read_bytes())["attachments"]
        assert [(entry["kind"], entry["filename"], entry["media_type"], entry["size"]) for entry in entries] == [
            ("image", "dot.png", "image/png", len(PNG)),
            ("file", "ü.txt", "text/plain", 5),
        ]
        # The reference runner, given the same entries, writes the same bytes.
        done = await trio.to_thread.run_sync(
            lambda: reference.run(
                {"command": PYTHON, "args": [str(recorder), str(theirs)], "permission": permission, "timeout_secs": 10},
                reference.RunOptions(
                    message='héllo\n"there"', session_id="s 1:x", session_name="chat-7", attachments=entries
                ),
            )
        )
        assert done.reply == "ok"
        assert ours.read_bytes() == theirs.read_bytes()


# --------------------------------------------------------------------------- events from transcripts


def test_a_streaming_turn_gives_thinking_partials_the_session_and_the_reply() -> None:
    assert decode(STREAM) == STREAM_EVENTS


@pytest.mark.parametrize("transcript", [STREAM, WITH_USAGE, ASK, SOFT_ERROR])
def test_any_split_of_the_stream_gives_the_same_events(transcript: bytes) -> None:
    whole = decode(transcript)
    assert_every_cut_decodes_alike(lambda: AgentProc04(ASKS, Turn("hi")), transcript, whole)
    dialect = AgentProc04(ASKS, Turn("hi"))
    assert fed_byte_by_byte(dialect, transcript) + dialect.close() == whole


def test_roles_other_than_thinking_are_partials_and_empty_chunks_are_dropped() -> None:
    lines = (
        b'{"type":"partial","text":"a","role":"output"}\n{"type":"partial","text":"b","role":"tool-log"}\n'
        b'{"type":"partial","text":"c","role":7}\n{"type":"partial","text":""}\n{"type":"partial","text":3}\n'
        b'{"type":"partial","text":"","role":"thinking"}\n{"type":"result","text":"abc"}\n'
    )
    assert decode(lines) == [PartialEvent("a"), PartialEvent("b"), PartialEvent("c"), ReplyEvent("abc")]


def test_only_the_first_result_counts() -> None:
    lines = b'{"type":"result","text":"first","session_id":"s1"}\n{"type":"result","text":"second","session_id":"s2"}\n'
    assert decode(lines) == [SessionEvent("s1"), ReplyEvent("first")]


def test_without_a_result_the_output_partials_are_the_reply() -> None:
    lines = (
        b'{"type":"partial","text":"why","role":"thinking"}\n{"type":"partial","text":"only "}\n'
        b'{"type":"partial","text":"partial"}\n'
    )
    assert decode(lines) == [
        ActivityEvent("thinking", text="why"),
        PartialEvent("only "),
        PartialEvent("partial"),
        ReplyEvent("only partial"),
    ]
    assert decode(b'{"type":"result","text":""}\n') == [ReplyEvent("")]  # an empty result is still the reply
    assert decode(b"") == []


def test_an_error_fails_the_turn_and_no_result_after_it_counts() -> None:
    assert decode(SOFT_ERROR) == [ErrorEvent("soft error")]
    lines = (
        b'{"type":"partial","text":"before"}\n{"type":"error","message":"bad","session_id":"s-e"}\n'
        b'{"type":"partial","text":"hmm","role":"thinking"}\n{"type":"partial","text":"after"}\n'
        b'{"type":"error"}\n'
    )
    # Partials after the error are the recorder's to drop (it stops forwarding them); thinking stops here.
    assert decode(lines) == [
        PartialEvent("before"),
        SessionEvent("s-e"),
        ErrorEvent("bad"),
        PartialEvent("after"),
        ErrorEvent(""),
    ]


def test_usage_maps_the_recommended_keys() -> None:
    assert decode(WITH_USAGE) == [
        SessionEvent("s-9"),
        PartialEvent("Gem "),
        ReplyEvent("Gem reply"),
        UsageEvent(
            Usage(
                input_tokens=120,
                output_tokens=30,
                cached_input_tokens=100,
                reasoning_tokens=12,
                total_tokens=150,
                cost_usd=0.0042,
            )
        ),
    ]


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ('{"input_tokens":3,"output_tokens":4,"cost_usd":1}', Usage(input_tokens=3, output_tokens=4, cost_usd=1.0)),
        ('{"input_tokens":true,"output_tokens":"4","total_tokens":2.5,"cost_usd":NaN}', None),
        ('{"cost_usd":Infinity,"input_tokens":0}', Usage(input_tokens=0)),
        ('{"duration_ms":12}', None),
        (f'{{"cost_usd":{10**400}}}', None),
        ("[1,2]", None),
    ],
)
def test_usage_takes_only_numbers_it_can_use(usage: str, expected: Usage | None) -> None:
    events = decode(f'{{"type":"result","text":"r","usage":{usage}}}\n'.encode())
    assert events == [ReplyEvent("r")] + ([UsageEvent(expected)] if expected else [])


def test_usage_is_kept_as_the_reference_keeps_it() -> None:
    first = b'{"type":"result","text":"r","usage":{"input_tokens":1}}\n'
    later_result = b'{"type":"result","text":"x","usage":{"input_tokens":2}}\n'
    error = b'{"type":"error","message":"e","usage":{"input_tokens":3}}\n'
    on_partial = b'{"type":"partial","text":"p","usage":{"input_tokens":9}}\n'

    def usages(lines: bytes) -> list[int | None]:
        return [event.usage.input_tokens for event in decode(lines) if isinstance(event, UsageEvent)]

    assert usages(on_partial + first + later_result) == [1]  # partials carry none; a second result is ignored
    assert usages(first + error) == [1, 3]  # an error's usage replaces the result's (the last one is kept)
    assert usages(error + later_result) == [3]  # after an error, a result's usage only if none came yet
    assert usages(b'{"type":"error","message":"e"}\n' + later_result) == [2]


# --------------------------------------------------------------------------- sessions


def test_the_first_valid_session_id_wins_and_a_different_one_is_warned_once() -> None:
    lines = (
        b'{"type":"partial","text":"a","session_id":"first"}\n{"type":"partial","text":"b","session_id":"first"}\n'
        b'{"type":"partial","text":"c","session_id":"second"}\n{"type":"error","message":"x","session_id":"third"}\n'
        b'{"type":"partial","text":"d","session_id":"a/b"}\n{"type":"partial","text":"e","session_id":"c/d"}\n'
    )
    events = decode(lines)
    assert [event for event in events if isinstance(event, SessionEvent)] == [SessionEvent("first")]
    assert warnings(events) == [  # each once per turn, whatever the agent stamps on its lines
        "ignored a session id because it differs from the turn's first one, which stays the session "
        "(wire 0.4: the first valid id wins)",
        "ignored a session id because it contains '/', '\\' or a control character",
    ]
    assert not any("second" in message or "third" in message for message in warnings(events))


@pytest.mark.parametrize("session_id", ["a/b", "..", ".", "a\\b", "tab\there", "nul\u0000", "x" * 513, "\ud800"])
def test_an_invalid_session_id_is_ignored_with_a_warning_and_the_valid_one_after_it_counts(session_id: str) -> None:
    lines = (
        json.dumps({"type": "partial", "text": "a", "session_id": session_id})
        + "\n"
        + '{"type":"result","text":"r","session_id":"good"}\n'
    ).encode()
    events = decode(lines)
    assert without_warnings(events) == [PartialEvent("a"), SessionEvent("good"), ReplyEvent("r")]
    assert len(warnings(events)) == 1 and warnings(events)[0].startswith("ignored a session id because")


def test_the_reference_accepts_spaces_colons_and_unicode_in_a_session_id_and_so_do_we() -> None:
    assert decode('{"type":"result","text":"r","session_id":"x y:z+ü"}\n'.encode()) == [
        SessionEvent("x y:z+ü"),
        ReplyEvent("r"),
    ]
    assert decode(b'{"type":"result","text":"r","session_id":7}\n{"type":"result","session_id":""}\n') == [
        ReplyEvent("r")
    ]


@given(st.text(max_size=40))
def test_our_session_rule_is_the_reference_rule_for_ids_a_host_can_hold(session_id: str) -> None:
    line = (json.dumps({"type": "partial", "text": "a", "session_id": session_id}) + "\n").encode()
    accepted = SessionEvent(session_id) in decode(line)
    text = not any("\ud800" <= character <= "\udfff" for character in session_id)  # a lone surrogate is not text
    assert accepted == (reference.is_valid_session_id(session_id) and text)


# --------------------------------------------------------------------------- permission requests


def test_a_permission_request_becomes_one_request_to_the_policy() -> None:
    assert decode(ASK) == [
        PartialEvent("about to run a tool"),
        PermissionRequest("r1", tool="Bash", title="List files", input={"command": "ls"}),
        ReplyEvent("about to run a tool"),
    ]  # no result came: the partials are the reply


@pytest.mark.parametrize(
    ("tool_input", "title"),
    [
        ({"command": "ls -la"}, "ls -la"),
        ({"file_path": "/srv/README.md", "limit": 5}, "/srv/README.md"),
        ({"url": "https://example.org/"}, "https://example.org/"),
        ({"a": 1, "b": [True, None]}, '{"a":1,"b":[true,null]}'),
        ({"command": "x" * 500}, "x" * 119 + "…"),
        ({}, ""),
    ],
)
def test_without_a_description_the_title_is_a_short_rendering_of_the_input(
    tool_input: dict[str, Any], title: str
) -> None:
    line = json.dumps({"type": "permission_request", "request_id": "r", "tool_name": "T", "input": tool_input})
    assert decode(line.encode() + b"\n") == [PermissionRequest("r", tool="T", title=title, input=tool_input)]


@pytest.mark.parametrize(
    "request_",
    [
        {"request_id": "r1", "input": {}},  # no tool_name (the SDK writes null)
        {"request_id": " r1 ", "tool_name": "", "input": {}},
        {"request_id": "r1", "tool_name": "Bash", "input": ["ls"]},
        {"request_id": "r1", "tool_name": "Bash"},
    ],
)
def test_a_malformed_request_is_refused_without_asking_the_policy(request_: dict[str, Any]) -> None:
    events = decode((json.dumps({"type": "permission_request", **request_}) + "\n").encode())
    expected = (
        reference.format_permission_response(
            {"request_id": "r1", "behavior": "deny", "message": "malformed permission request"}
        )
        + "\n"
    )
    assert without_warnings(events) == [AgentInput(expected.encode())]
    assert warnings(events) == [
        "refused 1 malformed permission request(s): each needs a request_id without "
        "whitespace, a tool_name and an input object"
    ]


@pytest.mark.parametrize("request_id", [None, "", "  ", "r 1", "r\n1", 7])
def test_a_malformed_request_without_a_usable_id_gets_no_answer(request_id: Any) -> None:
    line = json.dumps({"type": "permission_request", "request_id": request_id, "tool_name": "Bash", "input": {}})
    events = decode(line.encode() + b"\n")
    assert without_warnings(events) == [] and len(warnings(events)) == 1


def test_malformed_requests_are_those_the_reference_calls_malformed() -> None:
    for request_ in (
        {"request_id": "r", "tool_name": "T", "input": {}},
        {"request_id": "r", "tool_name": "T"},
        {"request_id": "r\t", "tool_name": "T", "input": {}},
        {"request_id": "r", "input": {}},
        {"request_id": "r", "tool_name": 5, "input": {}},
        {"tool_name": "T", "input": {}},
    ):
        events = without_warnings(decode((json.dumps({"type": "permission_request", **request_}) + "\n").encode()))
        asked = any(isinstance(event, PermissionRequest) for event in events)
        assert asked == reference.is_valid_permission_request({"type": "permission_request", **request_}), request_


def test_when_nobody_answers_requests_are_ignored_with_one_warning() -> None:
    events = decode(ASK + ASK.replace(b"r1", b"r2") + b'{"type":"result","text":"done"}\n', TOLD_NOBODY_ANSWERS)
    assert without_warnings(events) == [
        PartialEvent("about to run a tool"),
        PartialEvent("about to run a tool"),
        ReplyEvent("done"),
    ]
    assert len(warnings(events)) == 1 and "no permissions: section" in warnings(events)[0]


@pytest.mark.parametrize(
    ("decision", "line"),
    [
        (Decision(allow=True), b'{"type":"permission_response","request_id":"r1","behavior":"allow"}\n'),
        (
            Decision(allow=True, always=True, message="ok"),
            b'{"type":"permission_response","request_id":"r1","behavior":"allow","message":"ok"}\n',
        ),
        (Decision(allow=False), b'{"type":"permission_response","request_id":"r1","behavior":"deny"}\n'),
        (
            Decision(allow=False, message="Bash is not allowed by the profile"),
            b'{"type":"permission_response","request_id":"r1","behavior":"deny",'
            b'"message":"Bash is not allowed by the profile"}\n',
        ),
    ],
)
def test_an_answer_is_one_permission_response_line_as_the_reference_writes_it(decision: Decision, line: bytes) -> None:
    request = PermissionRequest("r1", tool="Bash", input={"command": "ls"})
    assert AgentProc04(ASKS, Turn("hi")).answer(request, decision) == line
    theirs = {"request_id": "r1", "behavior": "allow" if decision.allow else "deny", "message": decision.message}
    assert line == (reference.format_permission_response(theirs) + "\n").encode()


# --------------------------------------------------------------------------- what is not an event


def test_garbage_lines_are_ignored_and_counted_in_one_warning() -> None:
    lines = (
        b'not json\n[1,2]\n"text"\n{"no":"type"}\n{"type":7}\n{"type":"session","id":"legacy"}\n'
        b'{"type":"text","text":"legacy"}\n\n   \n{"type":"result","text":"r"}\n\xff\xfe\n{"type":"partial"\n'
    )
    events = decode(lines)
    assert without_warnings(events) == [ReplyEvent("r")]
    assert sorted(warnings(events)) == [
        "ignored 4 JSON line(s) that were no wire 0.4 event (partial, result, error, permission_request)",
        "ignored 5 stdout line(s) that were not JSON objects",
    ]
    assert not any("legacy" in message for message in warnings(events))  # the agent's text stays out of logs


def test_a_line_over_the_limit_is_cut_and_the_lines_around_it_still_count_in_order() -> None:
    context = DialectContext(settings=JsonSettings(max_line_bytes=4096), permissions=True)
    long_result = b'{"type":"result","text":"' + b"x" * 5000 + b'"}\n'
    events = decode(
        b'{"type":"partial","text":"before "}\n'
        + long_result
        + b'{"type":"partial","text":"after","session_id":"s"}\n',
        context,
    )
    assert events[0] == PartialEvent("before ") and isinstance(events[1], LineCut)
    assert events[2:] == [SessionEvent("s"), PartialEvent("after"), ReplyEvent("before after")]


def test_an_unterminated_last_line_still_counts_and_crlf_is_a_line_end() -> None:
    assert decode(b'{"type":"partial","text":"a"}\r\n{"type":"result","text":"r"}') == [
        PartialEvent("a"),
        ReplyEvent("r"),
    ]


def test_a_line_cut_by_the_end_of_the_stream_is_not_json_and_ignored() -> None:
    events = decode(b'{"type":"partial","text":"a"}\n{"type":"result","te')
    assert without_warnings(events) == [PartialEvent("a"), ReplyEvent("a")]
    assert warnings(events) == ["ignored 1 stdout line(s) that were not JSON objects"]


def test_lone_surrogates_spelled_in_json_cannot_reach_the_host() -> None:
    events = decode(b'{"type":"partial","text":"a\\ud800b"}\n{"type":"result","text":"\\udfff\xc3\xa9"}\n')
    assert events == [PartialEvent("a\ufffdb"), ReplyEvent("\ufffdé")]


_MEMBERS = st.sampled_from(
    [
        ("role", "thinking"),
        ("role", "output"),
        ("role", None),
        ("role", 3),
        ("session_id", "s1"),
        ("session_id", "s/2"),
        ("session_id", ""),
        ("session_id", "s\ud800"),
        ("type", "result"),
        ("text", "again"),
        ("usage", {"type": "x"}),
        ("x", [1, {"text": 2}]),
    ]
)


@given(
    text=st.sampled_from(["a", "é\ud800", "\n", "", 'x"y\\', "\u2028"]),
    members=st.lists(_MEMBERS, max_size=4),
    ascii_only=st.booleans(),
    ending=st.sampled_from(["", " ", "\t", "x", "}", ",", "\x0c"]),
    other_session=st.booleans(),
)
def test_partial_lines_read_without_decoding_them_give_the_events_of_the_decoded_lines(
    text: str, members: list[tuple[str, Any]], ascii_only: bool, ending: str, other_session: bool
) -> None:
    tail = "".join("," + json.dumps(key) + ":" + json.dumps(value, ensure_ascii=ascii_only) for key, value in members)
    line = '{"type":"partial","text":' + json.dumps(text, ensure_ascii=ascii_only) + tail + "}"
    line = line[:-1] + ending + "}" if ending == "," else line + ending
    second = line.replace('"s1"', '"s4"') if other_session else line
    data = "\n".join([line, second, line]).encode("utf-8", "surrogatepass") + b"\n"
    fast, decoded = AgentProc04(ASKS, Turn("hi")), AgentProc04(ASKS, Turn("hi"))
    fast_events = fast.feed(data) + fast.close()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(agentproc04, "_PARTIAL_HEAD", "no line starts so")  # every line decoded as JSON
        assert fast_events == decoded.feed(data) + decoded.close()


# --------------------------------------------------------------------------- real agents


def sdk_agent(directory: Path, body: str, name: str = "sdk_agent.py") -> Path:
    """An agent written with the reference SDK: `body` is the handler's, `ctx` the turn's context."""
    return write_agent(
        directory,
        name,
        f"#!{PYTHON}\nimport json, os, sys\n"
        "from agentproc import AgentResult, ProtocolError, create_profile\n"
        "def handler(ctx):\n" + textwrap.indent(textwrap.dedent(body), "    ") + "create_profile(handler)\n",
    )


def profile_of(agent: Path, **fields: Any) -> bridge.Profile:
    return bridge.Profile.from_mapping(
        {"protocol": "agentproc-0.4", "command": [str(agent)], "timeout_secs": 10, **fields}, profile_dir=agent.parent
    )


async def run(profile: bridge.Profile, turn: Turn) -> tuple[bridge.TurnResult, list[Any]]:
    events: list[Any] = []
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, turn, on_event=events.append)
    return result, events[:-1]


async def test_the_reference_echo_agent_answers_through_agentproc_04(tmp_path: Path) -> None:
    profile = bridge.Profile.from_mapping(
        {"protocol": "agentproc-0.4", "command": [PYTHON, str(ECHO_AGENT)], "timeout_secs": 10}
    )
    result, events = await run(profile, Turn('say "hi" — ünïcode'))
    assert (result.outcome, result.reply, result.session_id, events) == ("ok", 'You said: say "hi" — ünïcode', "", [])


async def test_an_sdk_agent_streams_thinks_reports_usage_and_resumes_its_session(tmp_path: Path) -> None:
    agent = sdk_agent(
        tmp_path,
        """\
        if ctx.session_id:
            return AgentResult(f"resumed {ctx.session_id} with {ctx.message}", ctx.session_id)
        ctx.send_partial("let me see", role="thinking")
        ctx.send_partial("Hello ")
        ctx.send_partial("world", role="output")
        print(json.dumps({"type": "result", "text": "Hello world", "session_id": "sess-1",
                          "usage": {"input_tokens": 5, "output_tokens": 2, "cost_usd": 0.5}}), flush=True)
        sys.exit(0)
    """,
    )
    profile = profile_of(agent, resume_args=["--resumed"])  # the SDK agent ignores argv; the turn line carries it
    first, events = await run(profile, Turn("hi"))
    assert events == [
        ActivityEvent("thinking", text="let me see"),
        PartialEvent("Hello "),
        PartialEvent("world"),
        SessionEvent("sess-1"),
    ]
    assert (first.outcome, first.reply, first.session_id, first.partials) == ("ok", "Hello world", "sess-1", 2)
    assert first.usage == Usage(input_tokens=5, output_tokens=2, cost_usd=0.5)
    second, events = await run(profile, Turn("again", session_id=first.session_id))
    assert (second.reply, second.session_id, events) == (
        "resumed sess-1 with again",
        "sess-1",
        [SessionEvent("sess-1")],
    )


async def test_sdk_errors_fail_the_turn_with_their_message(tmp_path: Path) -> None:
    agent = sdk_agent(
        tmp_path,
        """\
        if ctx.message == "soft":
            ctx.send_error("soft error")
            return "body after error"
        raise ProtocolError("fatal thing")
    """,
    )
    soft, _ = await run(profile_of(agent), Turn("soft"))
    assert (soft.outcome, soft.exit_code, soft.reply, soft.error_reply) == ("agent_error", 1, "", "soft error")
    fatal, events = await run(profile_of(agent), Turn("raise"))
    assert (fatal.outcome, fatal.exit_code, fatal.error, events) == (
        "agent_error",
        1,
        "fatal thing",
        [ErrorEvent("fatal thing")],
    )


ASKING_AGENT = """\
    tool = ctx.message.split()[0] if ctx.message else "Bash"
    ctx.send_permission_request({"request_id": "r1", "tool_name": tool, "input": {"command": "ls -la"}})
    answer = ctx.read_permission_response()
    return json.dumps(answer)
"""


@pytest.mark.parametrize(
    ("policy", "tool", "allowed"),
    [
        ({"allow": ["Bash"]}, "Bash", True),  # by tool name
        ({"allow": ["mcp__docs__*"]}, "mcp__docs__search", True),  # by wildcard
        ({"allow": ["Read"]}, "Bash", False),  # default deny
        ({}, "Bash", False),
        ({"default": "allow"}, "Bash", True),
        ({"allow": ["*"], "deny": ["Ba?h"]}, "Bash", False),  # deny wins
        ({"default": "allow", "deny": ["Bash"]}, "Bash", False),
    ],
)
async def test_the_profiles_policy_answers_an_sdk_agents_permission_request(
    tmp_path: Path, policy: dict[str, Any], tool: str, allowed: bool
) -> None:
    profile = profile_of(sdk_agent(tmp_path, ASKING_AGENT), permissions=policy)
    result, events = await run(profile, Turn(f"{tool} please"))
    answer = json.loads(result.reply)
    assert answer["request_id"] == "r1" and answer["behavior"] == ("allow" if allowed else "deny")
    assert "updated_input" not in answer
    if not allowed:
        assert answer["message"] == f"{tool} is not " + (
            "allowed by the profile" if "deny" in policy else "in the profile's allow list"
        )
    status = "allowed" if allowed else "denied"
    assert events == [ActivityEvent("tool", tool=tool, title="ls -la", status=status, call_id="r1")]


async def test_a_malformed_request_is_answered_deny_so_the_agent_does_not_wait(tmp_path: Path) -> None:
    agent = sdk_agent(
        tmp_path,
        """\
        ctx.send_permission_request({"request_id": "r7", "input": {}})  # no tool_name: malformed
        return json.dumps(ctx.read_permission_response())
    """,
    )
    result, events = await run(profile_of(agent, permissions={"default": "allow"}), Turn("hi"))
    assert json.loads(result.reply) == {
        "type": "permission_response",
        "request_id": "r7",
        "behavior": "deny",
        "message": "malformed permission request",
    }
    assert events == []  # the host sees no tool: none was asked for


async def test_without_a_permissions_section_the_agent_is_told_nobody_answers(tmp_path: Path) -> None:
    agent = write_agent(
        tmp_path,
        "asks_anyway.py",
        f"""\
        #!{PYTHON}
        import json, sys
        turn = json.loads(sys.stdin.readline())
        print(json.dumps({{"type": "permission_request", "request_id": "r1", "tool_name": "Bash", "input": {{}}}}),
              flush=True)
        rest = sys.stdin.read()  # EOF at once: nobody answers
        print(json.dumps({{"type": "result", "text": f"permission={{turn.get('permission')}} rest={{rest!r}}"}}))
    """,
    )
    result, events = await run(profile_of(agent), Turn("hi"))
    assert (result.outcome, result.reply, events) == ("ok", "permission=None rest=''", [])


async def test_open_turn_yields_activity_events_between_partials(tmp_path: Path) -> None:
    agent = sdk_agent(
        tmp_path,
        """\
        ctx.send_partial("hmm", role="thinking")
        ctx.send_permission_request({"request_id": "r1", "tool_name": "Read", "input": {"file_path": "a.txt"}})
        ctx.read_permission_response()
        ctx.send_partial("read it")
        return "done"
    """,
    )
    seen: list[Any] = []
    with trio.fail_after(TURN_DEADLINE):
        async with bridge.open_turn(profile_of(agent, permissions={"allow": ["Read"]}), Turn("hi")) as stream:
            async for event in stream:
                seen.append(event)
    assert seen[:-1] == [
        ActivityEvent("thinking", text="hmm"),
        ActivityEvent("tool", tool="Read", title="a.txt", status="allowed", call_id="r1"),
        PartialEvent("read it"),
    ]
    assert seen[-1].reply == "done"


# --------------------------------------------------------------------------- the bundled profile


async def test_bundled_agentproc_echo_profile_streams_asks_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the sample keeps its sessions
    profile = bridge.load_profile(PROFILES / "agentproc-echo.yaml").replace(env={"STREAM_DELAY": "0"})
    first, events = await run(profile, Turn("hello there"))
    assert first.outcome == "ok" and first.session_id
    assert events[0] == SessionEvent(first.session_id) and events[1] == ActivityEvent("thinking", text="reading turn 1")
    tool = events[2]
    assert (tool.tool, tool.status, tool.title) == ("Bash", "denied", "count the 2 word(s) of your message")
    assert [event.text for event in events[3:]] == ["You", " said:", " hello", " there"]
    assert first.reply == "You said: hello there\n(Bash was denied: Bash is not allowed by the profile)"
    assert first.usage == Usage(input_tokens=2, output_tokens=14, total_tokens=16)

    second, events = await run(profile, Turn("tool=Read again", session_id=first.session_id))
    assert second.session_id == first.session_id
    assert second.reply == "You said: tool=Read again\n(Read was allowed)\n(last time you said: hello there)"
    assert ActivityEvent("thinking", text="reading turn 2") in events

    empty, _ = await run(profile, Turn(""))
    assert (empty.outcome, empty.error_reply) == ("agent_error", "the message is empty: say something")


def test_a_fetched_attachment_carries_its_path_media_type_and_size_an_unfetched_one_does_not() -> None:
    path = "/w/.agent-bridge/attachments/t1/x.png"
    fetched = Attachment("image", "https://e/x.png", path=path, media_type="image/png", size=68)
    handover = AgentProc04.handover(Turn("look", attachments=(fetched, Attachment("file", "https://e/a.txt"))), ASKS)
    assert json.loads(handover.stdin or b"")["attachments"] == [
        {
            "kind": "image",
            "url": "https://e/x.png",
            "filename": "x.png",
            "path": "/w/.agent-bridge/attachments/t1/x.png",
            "media_type": "image/png",
            "size": 68,
        },
        {"kind": "file", "url": "https://e/a.txt", "filename": "a.txt"},
    ]


async def test_an_sdk_agent_reads_its_fetched_attachments_from_their_paths(tmp_path: Path) -> None:
    agent = sdk_agent(
        tmp_path,
        """\
        seen = []
        for entry in ctx.attachments:
            with open(entry["path"], "rb") as file:
                size = len(file.read())
            where = entry["path"].rsplit("/", 1)[0].replace(os.getcwd(), ".")
            seen.append(f"{entry['kind']} {where} {entry['media_type']} {size}/{entry['size']}")
        return AgentResult("; ".join(seen))
    """,
    )
    sources = tmp_path / "sources"
    sources.mkdir()
    result, _ = await run(profile_of(agent, cwd=str(tmp_path)), Turn("look", attachments=sent(sources)))
    assert result.outcome == "ok", result.error
    # The engine fetched them into the turn's directory; the agent read them there, by the path in its turn line.
    [image, notes] = result.reply.split("; ")
    assert re.fullmatch(rf"image \./{TURN_FILES} image/png {len(PNG)}/{len(PNG)}", image)
    assert re.fullmatch(rf"file \./{TURN_FILES} text/plain 5/5", notes)
