"""`agent-bridge serve`: the JSON Lines protocol, in process over memory streams and as a real process.

The in-process tests drive `bridge.cli.serve.Server` with the same host a real
`serve` builds; the process tests check what only a process has: stdin EOF,
SIGTERM, the 1 MiB line bound, stdout carrying nothing but protocol lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import RESULT_FIELDS, SAMPLE_AGENTS
from hostkit import Lab

import bridge
from bridge.cli.serve import Server
from bridge.errors import RequestError
from bridge.serving.output import Output, json_line
from bridge.serving.requests import decode_request, parse_turn


def turn(request_id: Any, message: str, conversation: str = "chat", **fields: Any) -> dict[str, Any]:
    return {
        "type": "turn",
        "id": request_id,
        "profile": "rec",
        "conversation": conversation,
        "message": message,
        **fields,
    }


def turn_request(request_id: Any = "x", **fields: Any) -> dict[str, Any]:
    """A valid turn request for profile `rec`, with `fields` replaced."""
    return {**turn(request_id, "hi"), **fields}


def strict_json(line: bytes | str) -> Any:
    """Parse a response as any JSON parser would: NaN and Infinity are not JSON."""

    def not_json(constant: str) -> Any:
        raise AssertionError(f"serve wrote {constant}, which is not JSON: {line[:200]!r}")

    return json.loads(line, parse_constant=not_json)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


LONE_SURROGATE = "\ud800"
NEAR_THE_DEPTH_LIMIT = range(sys.getrecursionlimit() - 300, sys.getrecursionlimit() + 1)
# Lines a hostile or buggy bot may write, each with the id and the error codes its one response may carry.
# Values nested around the parser's depth limit parse or not depending on the stack: either code is right.
# The id is the one a response echoes when the line parsed (a bad_json response's id is null).
HOSTILE_STRINGS: list[tuple[str, Any, set[str]]] = [
    *(
        (
            json.dumps(turn_request(f"sur-{field}", **{field: f"a{LONE_SURROGATE}b"})),
            f"sur-{field}",
            {"invalid_request"},
        )
        for field in ("conversation", "session_name", "message", "session_id", "from_user", "profile")
    ),
    (
        json.dumps(turn_request("sur-url", attachments=[{"type": "file", "url": LONE_SURROGATE}])),
        "sur-url",
        {"invalid_request"},
    ),
    (json.dumps(turn_request("nul-conversation", conversation="a\0b")), "nul-conversation", {"invalid_request"}),
    (json.dumps(turn_request("nul\0id")), "nul\0id", {"invalid_request"}),
    (
        json.dumps(turn_request("huge-conversation", conversation="c" * 900_000)),
        "huge-conversation",
        {"invalid_request"},
    ),
    (json.dumps(turn_request(2**63)), 2**63, {"invalid_request"}),
]
HOSTILE_JSON: list[tuple[str, Any, set[str]]] = [
    (nested(5000), None, {"bad_json"}),
    ('{"type": "stats", "id": ' + "7" * 5000 + "}", None, {"bad_json"}),  # over Python's 4300-digit limit
    ('{"type": "stats", "id": NaN}', None, {"invalid_request"}),
    *(
        (f'{{"type": "stats", "id": {nested(depth)}}}', None, {"bad_json", "invalid_request"})
        for depth in NEAR_THE_DEPTH_LIMIT
    ),
    *(
        (f'{{"type": {nested(depth)}, "id": "deep-type-{depth}"}}', f"deep-type-{depth}", {"bad_json", "unknown_type"})
        for depth in NEAR_THE_DEPTH_LIMIT
    ),
]
HOSTILE = HOSTILE_STRINGS + HOSTILE_JSON


class Client:
    """The bot's side of a serve session: JSON lines in, JSON lines out."""

    def __init__(self, requests: trio.abc.SendStream, responses: trio.abc.ReceiveStream) -> None:
        self._requests = requests
        self._responses = responses
        self._buffer = b""

    async def send(self, request: dict[str, Any] | str | bytes) -> None:
        if isinstance(request, dict):
            request = json.dumps(request)
        if isinstance(request, str):
            request = request.encode()
        await self._requests.send_all(request + b"\n")

    async def receive(self) -> dict[str, Any]:
        with trio.fail_after(10):
            while b"\n" not in self._buffer:
                data = await self._responses.receive_some()
                assert data, "serve closed its output"
                self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return strict_json(line)

    async def until(self, kind: str, request_id: Any) -> list[dict[str, Any]]:
        """Responses up to and including the first of `kind` for `request_id`."""
        seen = []
        while True:
            response = await self.receive()
            seen.append(response)
            if response["type"] == kind and response.get("id") == request_id:
                return seen

    async def close(self) -> None:
        await self._requests.aclose()


@pytest.fixture
async def serve(lab: Lab) -> AsyncIterator[Any]:
    """serve(**host_options) -> (Client, Server) running in the background until the test ends."""
    async with trio.open_nursery() as nursery:

        async def start(max_request_bytes: int = 1024, **options: Any) -> tuple[Client, Server]:
            host = bridge.open_host(lab.profiles, state=lab.state, **options)
            client_sends, server_receives = trio.testing.memory_stream_one_way_pair()
            server_sends, client_receives = trio.testing.memory_stream_one_way_pair()
            server = Server(host, server_receives, server_sends, max_request_bytes=max_request_bytes)

            async def run() -> None:
                async with host:
                    await server.run()

            nursery.start_soon(run)
            return Client(client_sends, client_receives), server

        yield start
        nursery.cancel_scope.cancel()


async def test_a_turn_is_accepted_streams_and_ends_with_a_full_result(serve: Any, lab: Lab) -> None:
    client, _ = await serve()
    await client.send(
        turn(
            "t1",
            "tag=x session=s-1",
            from_user="ann",
            session_name="default",
            attachments=[{"type": "image", "url": "data:image/gif;base64,R0lGODlhAQABAAAAACw="}],
        )
    )
    responses = await client.until("result", "t1")
    assert [r["type"] for r in responses] == ["accepted", "partial", "session", "result"]
    assert all(r["id"] == "t1" for r in responses)
    assert responses[1]["text"] == "started" and responses[2]["session_id"] == "s-1"
    result = responses[-1]
    assert set(result) == RESULT_FIELDS | {"type", "id"}
    assert (result["outcome"], result["exit_code"], result["reply"]) == ("ok", 0, "reply x one")
    await client.send(turn(7, "tag=y"))  # integer ids work too; the session is resumed
    assert (await client.until("result", 7))[-1]["outcome"] == "ok"
    assert [words[2] for words in lab.lines() if words[0] == "start"] == ["-", "s-1"]


async def test_what_the_agent_does_is_answered_as_activity_and_the_result_carries_usage(serve: Any, lab: Lab) -> None:
    """An agentproc-0.4 agent thinks and asks to use tools; the profile's policy answers, the bot sees both."""
    (lab.profiles / "ap4.yaml").write_text(
        textwrap.dedent(f"""\
        protocol: agentproc-0.4
        command: [{sys.executable!r}, {str(SAMPLE_AGENTS / "wire04_agent.py")!r}]
        env: {{STREAM_DELAY: "0", TMPDIR: {str(lab.root)!r}}}
        permissions: {{allow: [Read]}}
    """)
    )
    client, _ = await serve()
    await client.send(turn("a1", "hi tool=Read", profile="ap4"))
    responses = await client.until("result", "a1")
    assert [r["type"] for r in responses] == ["accepted", "session", "activity", "activity", *["partial"] * 4, "result"]
    session_id = responses[1]["session_id"]
    assert responses[2] == {"type": "activity", "id": "a1", "activity": "thinking", "text": "reading turn 1"}
    tool = responses[3]
    assert tool.pop("call_id").startswith("req-")
    assert tool == {
        "type": "activity",
        "id": "a1",
        "activity": "tool",
        "tool": "Read",
        "status": "allowed",
        "title": "count the 2 word(s) of your message",
    }
    result = responses[-1]
    assert (result["outcome"], result["session_id"], result["usage"]) == (
        "ok",
        session_id,
        {"input_tokens": 2, "output_tokens": 7, "total_tokens": 9},
    )

    await client.send(turn("a2", "again", profile="ap4"))  # the conversation's session is resumed
    responses = await client.until("result", "a2")
    assert [(r["tool"], r["status"]) for r in responses if r["type"] == "activity" and r["activity"] == "tool"] == [
        ("Bash", "denied")
    ]
    assert responses[-1]["reply"] == (
        "You said: again\n(Bash was denied: Bash is not in the profile's allow list)\n"
        "(last time you said: hi tool=Read)"
    )
    assert responses[-1]["session_id"] == session_id


async def test_a_tool_the_profile_asks_about_is_a_permission_the_bot_answers_with_decide(serve: Any, lab: Lab) -> None:
    (lab.profiles / "ap4.yaml").write_text(
        textwrap.dedent(f"""\
        protocol: agentproc-0.4
        command: [{sys.executable!r}, {str(SAMPLE_AGENTS / "wire04_agent.py")!r}]
        env: {{STREAM_DELAY: "0", TMPDIR: {str(lab.root)!r}}}
        permissions: {{ask: [Read], timeout_secs: 5}}
    """)
    )
    client, _ = await serve()
    await client.send(turn("p1", "hi tool=Read", profile="ap4"))
    asked = (await client.until("permission", "p1"))[-1]
    assert (asked["tool"], asked["title"]) == ("Read", "count the 2 word(s) of your message")
    question = asked["request_id"]
    for bad, code in [
        ({"id": "nope", "request_id": question, "allow": True}, "unknown_turn"),
        ({"id": "p1", "request_id": "q-nope", "allow": True}, "unknown_request"),
        ({"id": "p1", "request_id": question}, "invalid_request"),
        ({"id": "p1", "request_id": question, "allow": "yes"}, "invalid_request"),
        ({"id": "p1", "request_id": question, "allow": True, "why": 1}, "invalid_request"),
    ]:
        await client.send({"type": "decide", **bad})
        error = await client.receive()
        assert (error["type"], error["code"]) == ("error", code), bad
    for bad, code in [
        ({"id": "nope", "request_id": question, "answers": None}, "unknown_turn"),
        ({"id": "p1", "request_id": question, "answers": None}, "unknown_request"),  # a permission is no question
        ({"id": "p1", "request_id": question}, "invalid_request"),
        ({"id": "p1", "request_id": question, "answers": None, "allow": True}, "invalid_request"),
    ]:
        await client.send({"type": "answer", **bad})
        error = await client.receive()
        assert (error["type"], error["code"]) == ("error", code), bad
    await client.send({"type": "decide", "id": "p1", "request_id": question, "allow": True})
    responses = await client.until("result", "p1")
    tool = next(r for r in responses if r["type"] == "activity" and r["activity"] == "tool")
    assert (tool["tool"], tool["status"]) == ("Read", "allowed")
    assert responses[-1]["outcome"] == "ok"
    await client.send({"type": "decide", "id": "p1", "request_id": question, "allow": False})
    assert (await client.receive())["code"] == "unknown_turn"  # the turn is over


async def test_a_number_json_has_not_in_what_the_agent_asks_reaches_the_bot_as_null(serve: Any, lab: Lab) -> None:
    """An agent may write NaN or 1e999 (Python's json does); serve's lines stay JSON any parser reads."""
    agent = lab.root / "nan_agent.py"
    agent.write_text(
        textwrap.dedent("""\
        import sys
        sys.stdin.readline()
        print('{"type":"permission_request","request_id":"r1","tool_name":"Bash",'
              '"input":{"n":NaN,"big":1e999,"small":-Infinity,"ok":0.5}}', flush=True)
        sys.stdin.readline()
        print('{"type":"result","text":"done","cost":NaN}', flush=True)
    """)
    )
    (lab.profiles / "nan.yaml").write_text(
        f"protocol: agentproc-0.4\ncommand: [{sys.executable!r}, {str(agent)!r}]\n"
        "permissions: {ask: [Bash], timeout_secs: 5}\n"
    )
    client, _ = await serve()
    await client.send(turn("n1", "hi", profile="nan"))
    asked = (await client.until("permission", "n1"))[-1]  # strict_json: NaN or Infinity fails here
    assert asked["input"] == {"n": None, "big": None, "small": None, "ok": 0.5}
    await client.send({"type": "decide", "id": "n1", "request_id": asked["request_id"], "allow": True})
    assert (await client.until("result", "n1"))[-1]["reply"] == "done"


def write_warm_profile(lab: Lab) -> None:
    """Profile `aionrs`: the sample aionrs agent, warm, its sessions under the lab."""
    (lab.profiles / "aionrs.yaml").write_text(
        textwrap.dedent(f"""\
        protocol: aionrs
        command: [{sys.executable!r}, {str(SAMPLE_AGENTS / "aionrs_like.py")!r}, --json-stream]
        resume_args: ["--resume={{{{SESSION_ID}}}}"]
        cwd: {str(lab.root)!r}
        env: {{STREAM_DELAY: "0", HOME: {str(lab.root)!r}}}
        permissions: {{default: deny, ask: [edit], timeout_secs: 5}}
    """)
    )


async def test_a_warm_conversation_keeps_its_agent_and_its_questions_are_answered_by_decide(
    serve: Any, lab: Lab
) -> None:
    write_warm_profile(lab)
    client, _ = await serve()
    await client.send(turn("w1", "please tool=Write", profile="aionrs"))
    asked = (await client.until("permission", "w1"))[-1]
    assert (asked["tool"], asked["kind"]) == ("Write", "edit")
    await client.send(
        {"type": "decide", "id": "w1", "request_id": asked["request_id"], "allow": False, "message": "not today"}
    )
    first = (await client.until("result", "w1"))[-1]
    assert first["outcome"] == "ok" and "(Write was denied: not today)" in first["reply"]
    await client.send(turn("w2", "again think", profile="aionrs"))
    second = (await client.until("result", "w2"))[-1]
    assert second["session_id"] == first["session_id"] and "last time you said: please tool=Write" in second["reply"]
    await client.send({"type": "stats", "id": "s"})
    assert (await client.until("stats", "s"))[-1]["warm"] == 1  # one live agent took both turns


async def test_malformed_requests_get_an_error_and_serve_carries_on(serve: Any) -> None:
    client, _ = await serve(max_request_bytes=1024)
    bad: list[tuple[bytes | str | dict[str, Any], Any, str]] = [
        (b"this is not json", None, "bad_json"),
        (b"\xff\xfe{", None, "bad_json"),
        ("[1, 2]", None, "invalid_request"),
        ({"id": "x"}, "x", "invalid_request"),
        ({"type": "dance", "id": "x"}, "x", "unknown_type"),
        ({"type": "turn", "id": "x", "profile": "rec", "conversation": "c"}, "x", "invalid_request"),
        ({**turn("x", "hi"), "message": 42}, "x", "invalid_request"),
        ({**turn("x", "hi"), "conversation": ""}, "x", "invalid_request"),
        ({**turn("x", "hi"), "mesage": "hi"}, "x", "invalid_request"),
        ({**turn(True, "hi")}, True, "invalid_request"),
        ({**turn("x", "hi"), "attachments": [{"type": "smell", "url": "u"}]}, "x", "invalid_request"),
        ({**turn("x", "hi"), "attachments": "https://x"}, "x", "invalid_request"),
        ({**turn("x", "nul\u0000byte")}, "x", "invalid_request"),
        ({**turn("x", "hi"), "profile": "nope"}, "x", "unknown_profile"),
        ({"type": "cancel", "id": "never-started"}, "never-started", "unknown_turn"),
        (b'{"type": "turn", "id": "big", "message": "' + b"x" * 2000 + b'"}', None, "request_too_large"),
    ]
    for request, request_id, code in bad:
        await client.send(request)
        response = await client.receive()
        assert (response["type"], response["id"], response["code"]) == ("error", request_id, code), request
        assert response["message"]
    await client.send(b"")  # blank lines are ignored
    await client.send(turn("ok", "tag=after"))
    assert (await client.until("result", "ok"))[-1]["outcome"] == "ok"


async def test_a_profile_that_does_not_load_is_an_error_for_that_request(serve: Any, lab: Lab) -> None:
    (lab.profiles / "broken.yaml").write_text("command: x\ntimout_secs: 1\n")
    client, _ = await serve()
    await client.send({**turn("x", "hi"), "profile": "broken"})
    response = await client.receive()
    assert response["code"] == "profile_invalid" and "did you mean 'timeout_secs'" in response["message"]


async def test_a_duplicate_in_flight_id_and_a_full_queue_are_refused(serve: Any, lab: Lab) -> None:
    client, _ = await serve(max_concurrent=1, max_queued=1)
    gate = lab.gate()
    await client.send(turn("a", f"tag=a gate={gate}"))
    assert (await client.until("partial", "a"))[0]["type"] == "accepted"
    await client.send(turn("a", "tag=again", conversation="other"))
    assert (await client.receive())["code"] == "duplicate_id"
    await client.send(turn("b", "tag=b", conversation="other"))
    assert (await client.receive())["type"] == "accepted"
    await client.send(turn("c", "tag=c", conversation="third"))
    refused = await client.receive()
    assert (refused["type"], refused["id"], refused["code"]) == ("error", "c", "queue_full")
    await client.send({"type": "stats", "id": "s"})
    stats = await client.receive()
    assert (stats["type"], stats["id"], stats["running"], stats["queued"], stats["refused"]) == ("stats", "s", 1, 1, 1)
    await lab.release(gate)
    await client.until("result", "a")
    await client.until("result", "b")
    await client.send({"type": "stats"})
    stats = await client.receive()
    assert (stats["completed"], stats["failed"], stats["outcomes"]["ok"]) == (2, 0, 2)


async def test_cancel_stops_a_running_turn_with_sigint_and_it_still_gets_a_result(serve: Any, lab: Lab) -> None:
    client, _ = await serve(max_concurrent=1)
    gate = lab.gate()
    await client.send(turn("slow", f"tag=slow gate={gate}"))
    await client.until("partial", "slow")
    await client.send(turn("queued", "tag=queued", conversation="other"))
    await client.until("accepted", "queued")
    await client.send({"type": "cancel", "id": "queued"})
    await client.send({"type": "cancel", "id": "slow"})
    results = {}
    while len(results) < 2:
        response = await client.receive()
        assert response["type"] == "result", response  # a successful cancel has no reply of its own
        results[response["id"]] = (response["exit_code"], response["outcome"])
    assert results == {"slow": (130, "cancelled"), "queued": (130, "cancelled")}
    assert lab.events("sigint") == ["slow"] and lab.events("start") == ["slow"]


async def test_eof_shuts_down_after_the_turns_in_flight_are_answered(serve: Any, lab: Lab) -> None:
    client, server = await serve()
    gate = lab.gate()
    await client.send(turn("a", f"tag=a gate={gate}"))
    await client.until("partial", "a")
    await client.close()  # EOF: no more requests
    await trio.testing.wait_all_tasks_blocked()
    assert server.host.closing
    await lab.release(gate)
    result = (await client.until("result", "a"))[-1]
    assert result["outcome"] == "ok"


async def test_while_shutting_down_new_turns_are_refused_but_cancel_and_stats_work(serve: Any, lab: Lab) -> None:
    client, server = await serve(shutdown_grace=30)
    gate = lab.gate()
    await client.send(turn("a", f"tag=a gate={gate}"))
    await client.until("partial", "a")
    server.request_shutdown()  # what SIGTERM does
    await client.send(turn("late", "tag=late", conversation="other"))
    assert (await client.receive())["code"] == "shutting_down"
    await client.send({"type": "stats", "id": 1})
    assert (await client.receive())["closing"] is True
    await client.send({"type": "cancel", "id": "a"})
    assert (await client.until("result", "a"))[-1]["exit_code"] == 130


async def test_when_the_client_stops_reading_every_turn_is_cancelled_and_serve_ends(lab: Lab) -> None:
    gate = lab.gate()
    client_sends, server_receives = trio.testing.memory_stream_one_way_pair()
    server_sends, client_receives = trio.testing.memory_stream_one_way_pair()
    async with bridge.open_host(lab.profiles, state=lab.state, shutdown_grace=30) as host:
        server = Server(host, server_receives, server_sends)
        client = Client(client_sends, client_receives)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.run)
                await client.send(turn("a", f"tag=a gate={gate}"))
                await client.until("partial", "a")
                await client_receives.aclose()  # the bot went away
                await client.send({"type": "stats"})  # its answer cannot be written
            # server.run() returned without waiting for the 30 s grace
    assert server.output.broken
    assert lab.events("sigint") == ["a"]


async def test_hostile_strings_are_refused_before_accepted(serve: Any, lab: Lab) -> None:
    client, _ = await serve(max_request_bytes=1024 * 1024)
    hostile = [
        (turn("s1", "hi", conversation=LONE_SURROGATE), "conversation"),
        (turn("s2", "hi", session_name=LONE_SURROGATE), "session_name"),
        (turn("s3", LONE_SURROGATE), "message"),
        (turn("s4", "hi", session_id=LONE_SURROGATE), "session_id"),
        (turn("n1", "hi", conversation="a\0b"), "conversation"),
        (turn("n\0", "hi"), "id"),
        (turn("big", "hi", conversation="c" * 900_000), "conversation"),
    ]
    for request, field in hostile:
        await client.send(request)
        response = await client.receive()
        assert (response["type"], response["id"], response["code"]) == ("error", request["id"], "invalid_request")
        assert response["message"].startswith(f"{field} "), response["message"]
    await client.send(turn("ok", "tag=ok"))
    assert (await client.until("result", "ok"))[-1]["outcome"] == "ok"
    assert lab.events("start") == ["ok"]  # nothing hostile reached an agent


async def test_json_python_cannot_parse_is_bad_json_and_serve_carries_on(serve: Any) -> None:
    client, _ = await serve(max_request_bytes=1024 * 1024)
    for line, request_id, codes in HOSTILE_JSON:
        await client.send(line)
        response = await client.receive()
        assert response["type"] == "error" and response["code"] in codes, (line[:60], response)
        assert response["id"] == (None if response["code"] == "bad_json" else request_id), response
    await client.send({"type": "stats", "id": "after"})
    assert (await client.receive())["id"] == "after"


async def test_ids_7_and_quoted_7_name_the_same_turn(serve: Any, lab: Lab) -> None:
    client, _ = await serve()
    gate = lab.gate()
    await client.send(turn(7, f"tag=seven gate={gate}"))
    await client.until("partial", 7)
    await client.send(turn("7", "tag=again", conversation="other"))
    refused = await client.receive()
    assert (refused["type"], refused["id"], refused["code"]) == ("error", "7", "duplicate_id")
    await client.send({"type": "cancel", "id": "7"})
    result = (await client.until("result", 7))[-1]
    assert (result["exit_code"], result["outcome"]) == (130, "cancelled")
    assert lab.events("start") == ["seven"] and lab.events("sigint") == ["seven"]


def test_parse_turn_fills_defaults() -> None:
    request = parse_turn(
        {
            "type": "turn",
            "id": "x",
            "profile": "p",
            "conversation": "c",
            "message": "m",
            "attachments": [{"type": "file", "url": "https://h/r.pdf"}],
        }
    )
    assert (request.turn.session_name, request.turn.from_user, request.turn.session_id) == ("default", "", "")
    assert request.turn.attachments[0].name == "r.pdf"


STRING_FIELDS = [
    "id",
    "profile",
    "conversation",
    "message",
    "session_name",
    "session_id",
    "from_user",
    "attachment url",
    "attachment name",
]


def with_field(field: str, value: Any) -> dict[str, Any]:
    """A valid turn request (as parse_turn sees it) with `field` set to `value`."""
    request = {"type": "turn", "id": "x", "profile": "p", "conversation": "c", "message": "m"}
    if field == "attachment url" and isinstance(value, str):
        value = "https://h/" + value  # a serve client's url is an URL: a bare path is refused
    if field.startswith("attachment "):
        return {**request, "attachments": [{"type": "file", "url": "https://h/r.pdf", field.split()[1]: value}]}
    return {**request, field: value}


def refusal(request: dict[str, Any]) -> str:
    with pytest.raises(RequestError) as caught:
        parse_turn(request)
    assert caught.value.code == "invalid_request"
    return caught.value.message


@pytest.mark.parametrize("field", STRING_FIELDS)
@pytest.mark.parametrize("bad, named", [(LONE_SURROGATE, "lone surrogate"), ("\0", "NUL")])
def test_parse_turn_refuses_a_lone_surrogate_or_a_nul_in_every_string_field(field: str, bad: str, named: str) -> None:
    message = refusal(with_field(field, f"ok{bad}ok"))
    assert message.startswith(f"{field} ") and named in message


@pytest.mark.parametrize("field", STRING_FIELDS)
def test_parse_turn_takes_any_valid_unicode(field: str) -> None:
    assert parse_turn(with_field(field, "ж😀é"))


@pytest.mark.parametrize(
    "field, limit",
    [
        ("id", 256),
        ("profile", 256),
        ("conversation", 1024),
        ("session_name", 256),
        ("from_user", 1024),
        ("session_id", 512),
    ],
)
def test_parse_turn_takes_a_field_at_its_length_limit_and_refuses_one_character_more(field: str, limit: int) -> None:
    assert parse_turn(with_field(field, "x" * limit))
    message = refusal(with_field(field, "x" * (limit + 1)))
    assert message.startswith(f"{field} ") and str(limit) in message


def test_parse_turn_does_not_bound_the_message_below_the_line_limit() -> None:
    message = "ж" * (1024 * 1024)
    assert parse_turn(with_field("message", message)).turn.message is message


def test_an_integer_id_must_fit_in_a_signed_64_bit_integer() -> None:
    for fits in (2**63 - 1, -(2**63), 0, 7):
        assert parse_turn(with_field("id", fits)).id == fits
    for too_big in (2**63, -(2**63) - 1, 10**4000):
        message = refusal(with_field("id", too_big))
        assert message.startswith("id ") and "64-bit" in message


@pytest.mark.parametrize("session_id", ["a b", "a\tb", "a\x1bb", "a\u2028b"])
def test_parse_turn_holds_a_session_id_to_the_protocol_s_rule(session_id: str) -> None:
    message = refusal(with_field("session_id", session_id))
    assert message.startswith("session_id ") and "whitespace or control" in message


@pytest.mark.parametrize("line", [nested(100_000), '{"a": ' * 100_000, "1" * 5000, '{"id": -' + "1" * 4301 + "}"])
def test_decode_request_calls_whatever_json_cannot_parse_bad_json(line: str) -> None:
    with pytest.raises(RequestError) as caught:
        decode_request(line)
    assert caught.value.code == "bad_json"


# --------------------------------------------------------------------------- as a process


def start_serve(lab: Lab, *options: str) -> subprocess.Popen[bytes]:
    with open(lab.root / "serve.log", "wb") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bridge",
                "serve",
                "--profiles",
                str(lab.profiles),
                "--state",
                str(lab.state),
                *options,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )


def read_until(proc: subprocess.Popen[bytes], kind: str, request_id: Any) -> list[dict[str, Any]]:
    assert proc.stdout is not None
    seen = []
    while True:
        line = proc.stdout.readline()
        assert line, "serve ended early"
        seen.append(json.loads(line))
        if seen[-1]["type"] == kind and seen[-1].get("id") == request_id:
            return seen


def send(proc: subprocess.Popen[bytes], request: dict[str, Any] | bytes) -> None:
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(request).encode() if isinstance(request, dict) else request) + b"\n")
    proc.stdin.flush()


def test_serve_process_answers_every_turn_then_exits_0_at_eof(lab: Lab) -> None:
    proc = start_serve(lab)
    try:
        send(proc, b"x" * (1024 * 1024 + 10))  # one line over 1 MiB
        assert read_until(proc, "error", None)[-1]["code"] == "request_too_large"
        for index in range(3):
            send(proc, turn(f"t{index}", f"tag=t{index}", conversation=f"c{index % 2}"))
        proc.stdin.close()  # type: ignore[union-attr]
        out = proc.stdout.read()  # type: ignore[union-attr]
        proc.wait(timeout=30)
    finally:
        proc.kill()
    responses = [json.loads(line) for line in out.splitlines()]  # nothing but protocol lines
    results = {r["id"]: r for r in responses if r["type"] == "result"}
    assert sorted(results) == ["t0", "t1", "t2"] and all(r["outcome"] == "ok" for r in results.values())
    assert proc.returncode == 0, (lab.root / "serve.log").read_text()


def finish(proc: subprocess.Popen[bytes], lab: Lab) -> None:
    """EOF on serve's stdin; it exits 0 once every turn is answered."""
    proc.stdin.close()  # type: ignore[union-attr]
    proc.stdout.read()  # type: ignore[union-attr]
    assert proc.wait(timeout=30) == 0, (lab.root / "serve.log").read_text()


@pytest.mark.parametrize("profile", ["rec", "aionrs"])
def test_serve_takes_only_the_conversations_own_session_id_unless_started_with_any(lab: Lab, profile: str) -> None:
    write_warm_profile(lab)
    proc = start_serve(lab)
    try:
        send(proc, turn("a1", "tag=a1 session=s-alice", conversation="alice", profile=profile))
        alice = read_until(proc, "result", "a1")[-1]["session_id"]
        assert alice
        send(proc, turn("b1", "tag=b1", conversation="bob", profile=profile))
        bob = read_until(proc, "result", "b1")[-1]["session_id"]
        send(proc, turn("b2", "tag=b2", conversation="bob", profile=profile, session_id=alice))
        refused = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert (refused["type"], refused["id"], refused["code"]) == ("error", "b2", "session_id_refused")  # no run
        assert "leave session_id empty" in refused["message"] and "--session-ids any" in refused["message"]
        send(proc, turn("a2", "tag=a2", conversation="alice", profile=profile, session_id=alice))
        own = read_until(proc, "result", "a2")[-1]  # its own id: taken
        finish(proc, lab)
    finally:
        proc.kill()
    proc = start_serve(lab, "--session-ids", "any")
    try:
        send(proc, turn("b3", "tag=b3", conversation="bob", profile=profile, session_id=alice))
        foreign = read_until(proc, "result", "b3")[-1]  # any: bob's turn resumes alice's session
        finish(proc, lab)
    finally:
        proc.kill()
    assert own["outcome"] == foreign["outcome"] == "ok"
    if profile == "rec":  # the recorder notes the session each agent started in
        assert [(words[1], words[2]) for words in lab.lines() if words[0] == "start"] == [
            ("a1", "-"),
            ("b1", "-"),
            ("a2", "s-alice"),
            ("b3", "s-alice"),
        ]
    else:
        assert own["session_id"] == foreign["session_id"] == alice != bob


@contextmanager
def serving_a_held_turn(lab: Lab, shutdown_grace: str) -> Iterator[subprocess.Popen[bytes]]:
    """A serve process running turn `held` (its agent waits on a gate) for the block to stop with signals; after
    it, `held` must have been cancelled (its agent interrupted) and serve must have exited 0."""
    gate = lab.gate()
    proc = start_serve(lab, "--shutdown-grace", shutdown_grace)
    try:
        send(proc, turn("held", f"tag=held gate={gate}"))
        read_until(proc, "partial", "held")
        yield proc
        result = read_until(proc, "result", "held")[-1]
        assert (result["exit_code"], result["outcome"]) == (130, "cancelled")
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert lab.events("sigint") == ["held"]


def test_serve_process_sigterm_cancels_turns_past_the_grace_and_exits_0(lab: Lab) -> None:
    with serving_a_held_turn(lab, shutdown_grace="0.2") as proc:
        proc.send_signal(signal.SIGTERM)


def test_serve_process_second_signal_cancels_at_once(lab: Lab) -> None:
    with serving_a_held_turn(lab, shutdown_grace="600") as proc:
        proc.send_signal(signal.SIGINT)
        # A signal is handled when trio gets to it, maybe after requests already in the pipe: ask until it shows.
        while not (send(proc, {"type": "stats"}) or read_until(proc, "stats", None)[-1]["closing"]):
            pass
        send(proc, turn("late", "tag=late", conversation="other"))
        assert read_until(proc, "error", "late")[-1]["code"] == "shutting_down"
        proc.send_signal(signal.SIGTERM)


def test_serve_reads_requests_from_a_file_too(lab: Lab) -> None:
    requests = lab.root / "requests.jsonl"
    requests.write_text("".join(json.dumps(turn(f"t{i}", f"tag=t{i}")) + "\n" for i in range(2)))
    with open(requests, "rb") as stdin:
        proc = subprocess.run(
            [sys.executable, "-m", "bridge", "serve", "--profiles", str(lab.profiles), "--state", str(lab.state)],
            stdin=stdin,
            capture_output=True,
            timeout=60,
        )
    results = [json.loads(line) for line in proc.stdout.splitlines() if b'"result"' in line]
    assert [(r["id"], r["outcome"]) for r in results] == [("t0", "ok"), ("t1", "ok")]
    assert proc.returncode == 0, proc.stderr


def test_the_cli_does_not_import_the_host_runtime_for_other_commands() -> None:
    code = "import sys, bridge.cli; sys.exit('bridge.host.runtime' in sys.modules or 'bridge.cli.serve' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_serve_process_answers_hostile_input_by_the_protocol_and_stays_up(lab: Lab) -> None:
    lines = [line for line, _, _ in HOSTILE]
    lines += [json.dumps(turn("fine", "tag=fine")), json.dumps({"type": "stats", "id": "after"})]
    proc = start_serve(lab)
    try:
        out, _ = proc.communicate(("\n".join(lines) + "\n").encode(), timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, (lab.root / "serve.log").read_text()[-3000:]
    responses = [strict_json(line) for line in out.splitlines()]
    accepted = [r["id"] for r in responses if r["type"] == "accepted"]
    assert accepted == ["fine"]
    for request_id in accepted:  # every accepted turn ends in exactly one result (or store_error)
        assert (
            len(
                [
                    r
                    for r in responses
                    if r["id"] == request_id and (r["type"] == "result" or r.get("code") == "store_error")
                ]
            )
            == 1
        )
    refusals = [r for r in responses if r["id"] not in ("fine", "after")]
    assert len(refusals) == len(HOSTILE)
    for (line, request_id, codes), response in zip(HOSTILE, refusals):
        assert response["type"] == "error" and response["code"] in codes, (line[:80], response)
        assert response["id"] == (None if response["code"] == "bad_json" else request_id), (line[:80], response)
    assert [r["type"] for r in responses if r["id"] == "after"] == ["stats"]
    assert lab.events("start") == ["fine"]


def test_serve_process_notices_a_closed_stdout_without_writing_and_cancels_its_turns(lab: Lab) -> None:
    gate = lab.gate()
    proc = start_serve(lab, "--shutdown-grace", "600")
    try:
        send(proc, turn("held", f"tag=held gate={gate}"))
        read_until(proc, "partial", "held")
        agent = lab.pid("held")
        proc.stdout.close()  # type: ignore[union-attr]  # the bot stops reading; serve has nothing to write
        closed = time.monotonic()
        proc.wait(timeout=3)
        took = time.monotonic() - closed
    finally:
        proc.kill()
        proc.stdin.close()  # type: ignore[union-attr]
    assert proc.returncode == 1, (lab.root / "serve.log").read_text()[-3000:]
    assert took < 2.0
    assert lab.events("sigint") == ["held"]
    with pytest.raises(ProcessLookupError):
        os.killpg(agent, 0)  # the agent and everything in its group are gone


def test_serve_with_a_missing_profiles_directory_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bridge", "serve", "--profiles", str(tmp_path / "none"), "--state", str(tmp_path / "s")],
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2 and b"profiles directory cannot be read" in proc.stderr
    assert proc.stdout == b""


async def test_a_response_whose_sender_is_cancelled_mid_write_is_still_written_whole_before_the_next() -> None:
    """A turn's deadline or cancel can fire while its line is half written to a slow client: the line is finished
    before any other, never cut (the next response would run into it and neither would parse)."""
    read_end, write_end = os.pipe()
    stream = trio.lowlevel.FdStream(write_end)
    output = Output(stream.send_all, json_line, on_broken=lambda: None)
    client = trio.lowlevel.FdStream(read_end)
    text = "x" * 300_000  # more than a pipe holds: the write waits for the client
    first = trio.CancelScope()

    async def send_first() -> None:
        with first:
            await output.send({"type": "partial", "id": "a", "text": text})

    async def send_second() -> None:
        assert await output.send({"type": "result", "id": "b", "reply": "done"})

    with trio.fail_after(10):
        async with client, trio.open_nursery() as nursery:
            await nursery.start(output.run)
            nursery.start_soon(send_first)
            await trio.testing.wait_all_tasks_blocked()  # the pipe is full: the first line is half written
            first.cancel()
            nursery.start_soon(send_second)
            received = b""
            while received.count(b"\n") < 2:
                received += await client.receive_some(65536)
            await output.close()
    assert first.cancelled_caught
    first_line, second_line = received.decode().splitlines()
    assert json.loads(first_line) == {"type": "partial", "id": "a", "text": text}
    assert json.loads(second_line) == {"type": "result", "id": "b", "reply": "done"}
