"""The network door (`serve --listen`): serve's protocol over WebSocket and HTTP, tokens, and bad input.

A real `serve_network` on loopback (hypercorn on trio) in the test's own trio
run, driven by real clients: httpx for HTTP and Server-Sent Events, httpx-ws
for `/v1/ws`. The agents are tests/hostkit.py's recorder, so a test can hold a
turn open (`gate=`) and see which process ran (`Lab.pid`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from conftest import SAMPLE_AGENTS, assert_no_live_process
from hostkit import Lab
from httpx_ws import WebSocketDisconnect, aconnect_ws
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute

from bridge.host.runtime import open_host
from bridge.network.door import Door, DoorLimits
from bridge.network.listen import door_app, parse_address, serve_network
from bridge.network.tokens import parse_tokens

TOKEN_A = "token-of-tenant-a-0123456789"
TOKEN_B = "token-of-tenant-b-0123456789"
TOKENS = {
    TOKEN_A: {"name": "alpha"},
    TOKEN_B: {"name": "beta", "profiles": ["rec"]},
}


LAB_PROFILES = ("rec", "other")  # the `lab` fixture's (conftest.py)


@asynccontextmanager
async def door(lab: Lab, *, tokens: dict[str, Any] | None = None, **limits: Any) -> AsyncIterator[str]:
    """A listening door on the lab's profiles; yields its base URL."""
    host = open_host(lab.profiles, state=lab.state)
    async with host, trio.open_nursery() as nursery:
        urls = await nursery.start(
            partial(
                serve_network,
                host,
                parse_address("127.0.0.1:0"),
                tokens=parse_tokens(tokens) if tokens else None,
                limits=DoorLimits(**limits),
            )
        )
        yield urls[0]
        nursery.cancel_scope.cancel()


def turn(request_id: Any, message: str, conversation: str = "chat", profile: str = "rec", **fields: Any) -> str:
    return json.dumps(
        {"type": "turn", "id": request_id, "profile": profile, "conversation": conversation, "message": message}
        | fields
    )


async def until(ws: Any, kind: str, request_id: Any) -> list[dict[str, Any]]:
    """Responses read until the one of `kind` for `request_id` (inclusive)."""
    seen = []
    with trio.fail_after(10):
        while True:
            response = json.loads(await ws.receive_text())
            seen.append(response)
            if response["type"] == kind and response.get("id") == request_id:
                return seen


async def started(lab: Lab, tag: str) -> None:
    """Until the agent tagged `tag` has started (the diary is a file: polled)."""
    with trio.fail_after(10):
        while tag not in lab.events("start"):
            await trio.sleep(0.02)


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a text/event-stream body."""
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---------------------------------------------------------------------------- WebSocket


async def test_a_websocket_speaks_serves_protocol_and_each_connection_has_its_own_ids(lab: Lab) -> None:
    async with door(lab) as url, httpx.AsyncClient(base_url=url) as http:
        async with aconnect_ws("/v1/ws", http) as one, aconnect_ws("/v1/ws", http) as two:
            await one.send_text(turn(1, "tag=one"))
            await two.send_text(turn(1, "tag=two"))  # the same id on another connection: another turn
            first = await until(one, "result", 1)
            second = await until(two, "result", 1)
            await one.send_text(json.dumps({"type": "stats", "id": "s"}))
            stats = await until(one, "stats", "s")
    assert [r["type"] for r in first] == ["accepted", "partial", "result"]
    assert first[-1]["reply"] == "reply one one" and second[-1]["reply"] == "reply two one"
    assert stats[-1]["completed"] == 2


async def test_a_connection_cannot_touch_another_connections_turn(lab: Lab) -> None:
    gate = lab.gate()
    async with door(lab) as url, httpx.AsyncClient(base_url=url) as http:
        async with aconnect_ws("/v1/ws", http) as owner, aconnect_ws("/v1/ws", http) as stranger:
            await owner.send_text(turn("held", f"tag=held gate={gate}"))
            await until(owner, "partial", "held")
            await stranger.send_text(json.dumps({"type": "cancel", "id": "held"}))
            refused = (await until(stranger, "error", "held"))[-1]
            await lab.release(gate)
            result = (await until(owner, "result", "held"))[-1]
    assert refused["code"] == "unknown_turn"
    assert result["outcome"] == "ok"


async def test_a_websocket_dropped_mid_turn_cancels_its_turns_and_their_agents_die(lab: Lab) -> None:
    gate = lab.gate()
    async with door(lab) as url, httpx.AsyncClient(base_url=url) as http:
        async with aconnect_ws("/v1/ws", http) as ws:
            await ws.send_text(turn("t", f"tag=dropped gate={gate}"))
            await until(ws, "partial", "t")
        with trio.fail_after(10):
            while "dropped" not in lab.events("sigint"):
                await trio.sleep(0.02)
        assert_no_live_process([lab.pid("dropped")])
        response = await http.get("/v1/stats")
    assert response.json()["outcomes"]["cancelled"] == 1


async def test_a_websocket_bad_message_gets_an_error_and_the_connection_carries_on(lab: Lab) -> None:
    async with door(lab, max_body_bytes=64 * 1024) as url, httpx.AsyncClient(base_url=url) as http:
        async with aconnect_ws("/v1/ws", http) as ws:
            await ws.send_text("not json")
            bad = json.loads(await ws.receive_text())
            await ws.send_bytes(b'{"type": "stats"}')
            binary = json.loads(await ws.receive_text())
            await ws.send_text(turn(1, "tag=after"))
            result = (await until(ws, "result", 1))[-1]
        async with aconnect_ws("/v1/ws", http) as ws:
            await ws.send_text(turn(2, "x" * 100_000))  # over the door's message limit: the connection closes
            with pytest.raises(WebSocketDisconnect) as closed:
                with trio.fail_after(10):
                    await ws.receive_text()
    assert bad["code"] == "bad_json" and binary["code"] == "invalid_request"
    assert result["outcome"] == "ok"
    assert closed.value.code == 1009  # "message too big"


async def test_a_connection_has_at_most_its_share_of_turns_in_flight(lab: Lab) -> None:
    gates = [lab.gate(), lab.gate()]
    async with door(lab, max_turns_per_connection=2) as url, httpx.AsyncClient(base_url=url) as http:
        async with aconnect_ws("/v1/ws", http) as ws, aconnect_ws("/v1/ws", http) as other:
            for number, gate in enumerate(gates):
                await ws.send_text(turn(number, f"tag=t{number} gate={gate}", conversation=f"c{number}"))
                await until(ws, "accepted", number)
            await ws.send_text(turn(2, "tag=t2"))
            refused = (await until(ws, "error", 2))[-1]
            await other.send_text(turn(2, "tag=elsewhere", conversation="c9"))  # another connection has its own share
            elsewhere = (await until(other, "result", 2))[-1]
            await lab.release(gates[0])
            await until(ws, "result", 0)
            await ws.send_text(turn(3, "tag=t3", conversation="c3"))  # one finished: room for one more
            third = (await until(ws, "result", 3))[-1]
            await lab.release(gates[1])
            await until(ws, "result", 1)
    assert refused["code"] == "too_many_turns"
    assert elsewhere["outcome"] == third["outcome"] == "ok"
    assert "t2" not in lab.events("start")


# ---------------------------------------------------------------------------- HTTP


async def test_post_turns_streams_the_turns_responses_as_server_sent_events(lab: Lab) -> None:
    async with door(lab) as url, httpx.AsyncClient(base_url=url) as http:
        body = {"id": "e1", "profile": "rec", "conversation": "c", "message": "tag=sse"}
        response = await http.post("/v1/turns", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert [kind for kind, _ in events] == ["accepted", "partial", "result"]
    assert all(data["id"] == "e1" and data["type"] == kind for kind, data in events)
    assert events[-1][1]["reply"] == "reply sse one"


async def test_post_turns_gives_the_result_alone_to_a_client_that_accepts_json(lab: Lab) -> None:
    async with door(lab) as url, httpx.AsyncClient(base_url=url) as http:
        body = {"profile": "rec", "conversation": "c", "message": "tag=json exit=3"}
        response = await http.post("/v1/turns", json=body, headers={"Accept": "application/json"})
    result = response.json()
    assert response.status_code == 200 and result["type"] == "result"
    assert result["exit_code"] == 3 and result["id"]  # an id the door chose, as none was given


async def test_a_turn_posted_over_http_is_cancelled_by_its_id(lab: Lab) -> None:
    gate = lab.gate()
    results: list[httpx.Response] = []
    async with door(lab) as url, httpx.AsyncClient(base_url=url) as http:

        async def post() -> None:
            body = {"id": "h1", "profile": "rec", "conversation": "c", "message": f"tag=held gate={gate}"}
            results.append(await http.post("/v1/turns", json=body, headers={"Accept": "application/json"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post)
            await started(lab, "held")
            cancelled = await http.post("/v1/turns/h1/cancel")
        again = await http.post("/v1/turns/h1/cancel")  # the turn is over
    assert cancelled.status_code == 200
    assert results[0].json()["outcome"] == "cancelled"
    assert again.status_code == 404 and again.json()["code"] == "unknown_turn"


HANG_UP_NOTICED_SECS = 3.0  # the door hears of a hang-up at once; this leaves room for a loaded machine


async def test_an_event_stream_client_that_hangs_up_has_its_turn_cancelled_within_moments(lab: Lab) -> None:
    gate = lab.gate()
    async with door(lab) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        body = {"id": "sse", "profile": "rec", "conversation": "c", "message": f"tag=listener gate={gate}"}
        async with http.stream("POST", "/v1/turns", json=body) as stream:
            async for line in stream.aiter_lines():
                if line == "event: partial":
                    break  # the agent runs: hang up, and the door should stop it
        with trio.move_on_after(HANG_UP_NOTICED_SECS):
            while "listener" not in lab.events("sigint"):
                await trio.sleep(0.02)
        assert "listener" in lab.events("sigint"), (
            f"the turn of an event-stream client that hung up was not cancelled within {HANG_UP_NOTICED_SECS} s"
        )
        assert_no_live_process([lab.pid("listener")])
        stats = (await http.get("/v1/stats")).json()
    assert stats["outcomes"]["cancelled"] == 1, stats


async def test_a_permission_is_decided_over_http(lab: Lab) -> None:
    (lab.profiles / "ap4.yaml").write_text(
        f"protocol: agentproc-0.4\n"
        f"command: [{sys.executable!r}, {str(SAMPLE_AGENTS / 'wire04_agent.py')!r}]\n"
        f"env: {{STREAM_DELAY: '0', TMPDIR: {str(lab.root)!r}}}\n"
        "permissions: {ask: [Read], timeout_secs: 5}\n"
    )
    text = ""
    async with door(lab) as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        body = {"id": "p", "profile": "ap4", "conversation": "c", "message": "hi tool=Read"}
        async with http.stream("POST", "/v1/turns", json=body) as stream:
            async for chunk in stream.aiter_text():
                text += chunk
                if "event: permission" in text and text.endswith("\n\n") and "decided" not in locals():
                    asked = next(data for kind, data in sse_events(text) if kind == "permission")
                    wrong = await http.post("/v1/turns/p/decide", json={"request_id": "nope", "allow": True})
                    bad = await http.post("/v1/turns/p/decide", json={"request_id": asked["request_id"]})
                    decided = await http.post(
                        "/v1/turns/p/decide", json={"request_id": asked["request_id"], "allow": True}
                    )
    events = sse_events(text)
    tool = next(data for kind, data in events if kind == "activity" and data["activity"] == "tool")
    assert wrong.status_code == 404 and wrong.json()["code"] == "unknown_request"
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"
    assert decided.status_code == 200
    assert (tool["tool"], tool["status"]) == ("Read", "allowed")
    assert events[-1][1]["outcome"] == "ok"


async def test_files_an_agent_leaves_are_downloaded_by_url_then_acknowledged(lab: Lab) -> None:
    agent = lab.root / "writer.sh"
    agent.write_text('#!/bin/sh\nprintf "report body" > "$AGENT_OUTBOX/report.txt"\necho done\n')
    agent.chmod(0o755)
    (lab.profiles / "writer.yaml").write_text(f'command: ["{agent}"]\n')
    async with door(lab, tokens=TOKENS) as url, httpx.AsyncClient(base_url=url) as http:
        body = {"id": "f", "profile": "writer", "conversation": "c", "message": "go"}
        events = sse_events((await http.post("/v1/turns", json=body, headers=bearer(TOKEN_A))).text)
        offered = next(data for kind, data in events if kind == "file")
        stranger = await http.get(offered["url"], headers=bearer(TOKEN_B))
        downloaded = await http.get(offered["url"], headers=bearer(TOKEN_A))
        acknowledged = await http.delete(offered["url"], headers=bearer(TOKEN_A))
        gone = await http.get(offered["url"], headers=bearer(TOKEN_A))
    assert offered["url"] == "/v1/files/http/f/report.txt" and offered["size"] == len("report body")
    assert stranger.status_code == 404
    assert downloaded.status_code == 200 and downloaded.content == b"report body"
    assert acknowledged.status_code == 200
    assert gone.status_code == 404 and not Path(offered["path"]).exists()


# ---------------------------------------------------------------------------- tokens and tenants


async def test_every_endpoint_but_health_needs_a_valid_token(lab: Lab) -> None:
    async with door(lab, tokens=TOKENS) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 200
        body = {"profile": "rec", "conversation": "c", "message": "tag=x"}
        for headers in ({}, bearer("wrong-token-0123456789"), {"Authorization": TOKEN_A}, bearer(TOKEN_A + "x")):
            for method, path, payload in (
                ("GET", "/v1/stats", None),
                ("POST", "/v1/turns", body),
                ("POST", "/v1/turns/x/cancel", None),
                ("GET", "/v1/files/http/x/y", None),
            ):
                response = await http.request(method, path, json=payload, headers=headers)
                assert response.status_code == 401, (method, path, headers)
                assert response.json()["code"] == "unauthorized"
                assert response.headers["connection"] == "close"  # a body it did not read may follow on it
                assert TOKEN_A not in response.text
            with pytest.raises(Exception) as refused:
                async with aconnect_ws("/v1/ws", http, headers=headers):
                    pass
            assert "401" in str(refused.value)
        assert lab.events("start") == []
        allowed = await http.post("/v1/turns", json=body, headers=bearer(TOKEN_A))
    assert sse_events(allowed.text)[-1][1]["outcome"] == "ok"


def door_routes(routes: list[BaseRoute]) -> list[tuple[str, str]]:
    """(method, path) of every route the door's application has, mounted ones included; "WS" for a WebSocket.
    A path parameter is "x"."""
    found: list[tuple[str, str]] = []
    for route in routes:
        if isinstance(route, Mount):
            found += door_routes(route.routes)
        elif isinstance(route, (Route, WebSocketRoute)):
            path = re.sub(r"{[^}]*}", "x", route.path)
            methods = sorted((route.methods or set()) - {"HEAD"}) if isinstance(route, Route) else ["WS"]
            found += [(method, path) for method in methods]
    return found


async def test_every_route_of_the_door_but_health_refuses_a_request_without_a_valid_token(lab: Lab) -> None:
    routes = door_routes(door_app(Door(open_host(lab.profiles, state=lab.state), parse_tokens(TOKENS))).routes)
    public = {("GET", "/healthz"), ("GET", "/readyz")}
    assert public < set(routes) and ("POST", "/v1/chat/completions") in routes and ("WS", "/v1/ws") in routes
    async with door(lab, tokens=TOKENS) as url, httpx.AsyncClient(base_url=url) as http:
        for method, path in routes:
            for headers in ({}, bearer("wrong-token-0123456789"), {"Authorization": f"Basic {TOKEN_A}"}):
                if method == "WS":
                    with pytest.raises(Exception, match="401"):
                        async with aconnect_ws(path, http, headers=headers):
                            pass
                    continue
                response = await http.request(method, path, json={}, headers=headers)
                if (method, path) in public:
                    assert response.status_code == 200, path
                    continue
                assert (response.status_code, response.headers.get("www-authenticate")) == (401, "Bearer"), path
    assert lab.events("start") == []


async def test_tenants_see_only_their_own_turns_profiles_and_conversations(lab: Lab) -> None:
    gate = lab.gate()
    async with door(lab, tokens=TOKENS) as url, httpx.AsyncClient(base_url=url) as http:
        first = {"id": "s1", "profile": "rec", "conversation": "shared", "message": "tag=a1 session=sess-a"}
        await http.post("/v1/turns", json=first, headers=bearer(TOKEN_A))
        # beta's conversation "shared" is its own: alpha's session is not resumed
        second = {"id": "s2", "profile": "rec", "conversation": "shared", "message": "tag=b1"}
        await http.post("/v1/turns", json=second, headers=bearer(TOKEN_B))
        third = {"id": "s3", "profile": "rec", "conversation": "shared", "message": "tag=a2"}
        await http.post("/v1/turns", json=third, headers=bearer(TOKEN_A))
        hidden = {"id": "o", "profile": "other", "conversation": "c", "message": "tag=o"}
        refused = await http.post("/v1/turns", json=hidden, headers=bearer(TOKEN_B))

        async with trio.open_nursery() as nursery:
            held = {"id": "h", "profile": "rec", "conversation": "c", "message": f"tag=h gate={gate}"}
            nursery.start_soon(partial(http.post, "/v1/turns", json=held, headers=bearer(TOKEN_A)))
            await started(lab, "h")
            other_cancel = await http.post("/v1/turns/h/cancel", headers=bearer(TOKEN_B))
            async with aconnect_ws("/v1/ws", http, headers=bearer(TOKEN_B)) as ws:
                await ws.send_text(json.dumps({"type": "cancel", "id": "h"}))
                ws_cancel = (await until(ws, "error", "h"))[-1]
            await lab.release(gate)
    sessions = {words[1]: words[2] for words in lab.lines() if words[0] == "start"}
    assert sessions == {"a1": "-", "b1": "-", "a2": "sess-a", "h": "-"}
    assert refused.status_code == 404 and refused.json()["code"] == "unknown_profile"
    assert "other" not in refused.json()["message"].replace("'other'", "")  # names nothing else it could use
    assert other_cancel.status_code == 404 and ws_cancel["code"] == "unknown_turn"
    assert "h" not in lab.events("sigint")


async def test_a_profile_that_does_not_load_is_refused_to_a_tenant_naming_no_file_of_the_server(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    (lab.profiles / "broken.yaml").write_text("command: x\ntimout_secs: 1\n")
    async with door(lab, tokens=TOKENS) as url, httpx.AsyncClient(base_url=url) as http:
        broken = {"id": "b", "profile": "broken", "conversation": "c", "message": "hi"}
        refused = await http.post("/v1/turns", json=broken, headers=bearer(TOKEN_A))
        async with aconnect_ws("/v1/ws", http, headers=bearer(TOKEN_A)) as ws:
            await ws.send_text(json.dumps({"type": "turn", **broken}))
            over_ws = (await until(ws, "error", "b"))[-1]
    for error in (refused.json(), over_ws):
        assert error["code"] == "profile_invalid"
        assert error["message"] == "profile 'broken' does not load now; the server's log says why"
    assert refused.status_code == 422
    assert "broken.yaml:2: unknown key 'timout_secs'" in capsys.readouterr().err  # the operator's log says why


def test_a_tokens_file_that_does_not_hold_is_refused_naming_the_entry_not_the_token() -> None:
    from bridge.errors import ListenError

    for data, words in (
        ({"short": {"name": "a"}}, "16 to"),
        ({TOKEN_A: {"name": "a/b"}}, "name"),
        ({TOKEN_A: {"name": "a", "shell": True}}, "unknown field 'shell'"),
        ({TOKEN_A: {"name": "a"}, TOKEN_B: {"name": "a", "profiles": ["x"]}}, "must agree"),
        ({TOKEN_A: "a"}, "mapping"),
        ([], "must map"),
    ):
        with pytest.raises(ListenError) as refused:
            parse_tokens(data)
        assert words in str(refused.value)
        assert TOKEN_A not in str(refused.value) and TOKEN_B not in str(refused.value)


def test_tokens_are_told_apart_by_compare_digest_against_every_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a token is is decided by a constant-time comparison with each entry, all of them, whichever matches:
    a `==`, or a loop that stops at the match, would say by its time how much of a guess was right."""
    import hmac

    import bridge.network.tokens

    tokens = parse_tokens({TOKEN_A: {"name": "alpha"}, TOKEN_B: {"name": "beta"}, "token-c-0123456789": {"name": "c"}})
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(bridge.network.tokens.hmac, "compare_digest", recording)
    alpha = tokens.tenant_of(TOKEN_A)
    assert alpha is not None and alpha.name == "alpha"
    assert len(compared) == 3, f"the token was compared with {len(compared)} of the 3 entries in constant time"
    assert all(isinstance(a, bytes) and isinstance(b, bytes) and len(a) == len(b) for a, b in compared)

    compared.clear()
    assert tokens.tenant_of("a-wrong-token-0123456789") is None
    assert len(compared) == 3
    # compare_digest alone decides: told that everything matches, the door believes it
    monkeypatch.setattr(bridge.network.tokens.hmac, "compare_digest", lambda a, b: True)
    assert tokens.tenant_of("a-wrong-token-0123456789") is not None, "something other than compare_digest decided"


def test_tenants_whose_conversation_prefixes_nest_are_refused_so_no_two_share_a_store_key() -> None:
    from bridge.errors import ListenError

    for data, names in (
        ({TOKEN_A: {"name": "ops:eu"}, TOKEN_B: {"name": "ops"}}, ("'ops'", "'ops:eu'", "'eu:room'")),
        ({TOKEN_A: {"name": "a", "conversation_prefix": "x"}, TOKEN_B: {"name": "b", "conversation_prefix": "x"}}, ()),
        ({TOKEN_A: {"name": "a", "conversation_prefix": ""}, TOKEN_B: {"name": "b"}}, ("'a'", "'b'")),
    ):
        with pytest.raises(ListenError) as refused:
            parse_tokens(data)
        assert "conversation_prefix" in str(refused.value) and all(name in str(refused.value) for name in names)
        assert TOKEN_A not in str(refused.value) and TOKEN_B not in str(refused.value)
    apart = parse_tokens({TOKEN_A: {"name": "ops:eu", "conversation_prefix": "ops-eu:"}, TOKEN_B: {"name": "ops"}})
    assert len(apart) == 2


def test_a_tenant_with_an_empty_conversation_prefix_is_said_loudly(capsys: pytest.CaptureFixture[str]) -> None:
    import bridge.log

    bridge.log.configure_logging("warning", "json")
    try:
        parse_tokens({TOKEN_A: {"name": "everything", "conversation_prefix": ""}})
        [warning] = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        bridge.log.configure_logging()
    assert warning["level"] == "warning" and "every conversation" in warning["event"], warning
    assert warning["tenant"] == "everything" and TOKEN_A not in json.dumps(warning)


def test_serve_with_nesting_tenants_refuses_to_start_naming_them(lab: Lab, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(json.dumps({TOKEN_A: {"name": "ops:eu"}, TOKEN_B: {"name": "ops"}}))
    tokens.chmod(0o600)
    argv = [sys.executable, "-m", "bridge", "serve", "--profiles", str(lab.profiles), "--state", str(lab.state)]
    serve = subprocess.Popen(
        [*argv, "--listen", "127.0.0.1:0", "--tokens", str(tokens)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert serve.stderr is not None
        said = []
        for line in iter(serve.stderr.readline, ""):  # until serve exits, or says it listens
            assert not line.startswith("agent-bridge serve: listening"), f"serve started with nesting tenants: {said}"
            said.append(line)
        assert serve.wait(timeout=10) != 0, said
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert "'ops'" in "".join(said) and "'ops:eu'" in "".join(said), said


async def test_a_token_with_no_profiles_is_a_monitoring_token(lab: Lab) -> None:
    monitor = "token-of-the-monitor-0123456789"
    async with door(lab, tokens={**TOKENS, monitor: {"name": "grafana", "profiles": []}}) as url:
        async with httpx.AsyncClient(base_url=url, headers=bearer(monitor)) as http:
            assert (await http.get("/metrics")).status_code == 200
            assert (await http.get("/v1/stats")).status_code == 200
            body = {"profile": "rec", "conversation": "c", "message": "tag=monitor"}
            refused = await http.post("/v1/turns", json=body)
            async with aconnect_ws("/v1/ws", http) as ws:
                await ws.send_text(turn("w", "tag=monitor-ws"))
                over_ws = (await until(ws, "error", "w"))[-1]
    assert refused.status_code == 404 and refused.json()["code"] == "unknown_profile", refused.text
    assert over_ws["code"] == "unknown_profile", over_ws
    assert lab.events("start") == []


# ---------------------------------------------------------------------------- bad input


async def test_bad_bodies_get_clear_errors_and_start_nothing(lab: Lab) -> None:
    async with door(lab, max_body_bytes=64 * 1024) as url, httpx.AsyncClient(base_url=url) as http:
        cases = [
            (b"{not json", 400, "bad_json"),
            (b"[1, 2]", 400, "invalid_request"),
            (json.dumps({"profile": "rec", "conversation": "c"}).encode(), 400, "invalid_request"),
            (json.dumps({"profile": "nope", "conversation": "c", "message": "m"}).encode(), 404, "unknown_profile"),
            (json.dumps({"type": "cancel", "id": 1}).encode(), 400, "invalid_request"),
            (b'{"message": "' + b"x" * 70_000 + b'"}', 413, "request_too_large"),
            (b"\xff\xfe", 400, "bad_json"),
        ]
        for body, status, code in cases:
            response = await http.post("/v1/turns", content=body)
            assert (response.status_code, response.json()["code"]) == (status, code), body[:40]

        # a body larger than declared-nothing: streamed in chunks, refused once past the limit
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b"x" * 16_384

        streamed = await http.post("/v1/turns", content=chunks())
        assert streamed.status_code == 413
    assert lab.events("start") == []


def test_serve_refuses_a_public_address_without_tokens_and_options_of_the_door_without_listen(lab: Lab) -> None:
    public = subprocess.run(
        [sys.executable, "-m", "bridge", "serve", "--profiles", str(lab.profiles), "--listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert public.returncode != 0 and "--tokens" in public.stderr
    stray = subprocess.run(
        [sys.executable, "-m", "bridge", "serve", "--profiles", str(lab.profiles), "--tokens", "t.yaml"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert stray.returncode == 2 and "add --listen" in stray.stderr


async def test_sigterm_drains_the_turns_in_flight_then_serve_exits(lab: Lab) -> None:
    gate = lab.gate()
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bridge", "serve", "--profiles", str(lab.profiles), "--listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    said = b""
    with trio.fail_after(20):
        while b"listening on" not in said:
            said += await proc.stderr.receive_some(4096)
    url = said.decode().split("listening on ")[1].split()[0]
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        results: list[httpx.Response] = []

        async def post() -> None:
            body = {"profile": "rec", "conversation": "c", "message": f"tag=drained gate={gate}"}
            results.append(await http.post("/v1/turns", json=body, headers={"Accept": "application/json"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post)
            await started(lab, "drained")
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(10):
                while (await http.get("/readyz")).status_code != 503:
                    await trio.sleep(0.02)
            late = await http.post("/v1/turns", json={"profile": "rec", "conversation": "d", "message": "tag=late"})
            await lab.release(gate)
    with trio.fail_after(20):
        code = await proc.wait()
    assert results[0].json()["outcome"] == "ok"
    assert late.status_code == 503 and late.json()["code"] == "shutting_down"
    assert code == 0 and "late" not in lab.events("start")
    assert os.waitstatus_to_exitcode(code) == 0


def test_only_listen_pays_for_the_http_libraries(lab: Lab) -> None:
    """`serve` on stdin/stdout (and every other command) never imports hypercorn, Starlette or prometheus-client."""
    code = (
        "import sys, bridge.cli.serve, bridge.cli.main; "
        "sys.exit(sorted(m for m in ('hypercorn', 'starlette', 'prometheus_client', 'bridge.network') "
        "if m in sys.modules) or 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
