"""The network door against hostile connections (issue 34): what one connection sends ends that connection alone.

A real `agent-bridge serve --listen` process on loopback (tests/doorkit.py) runs tests/hostkit.py's recorder;
the hostile clients are raw sockets writing the exact bytes, and a well-behaved client (httpx, httpx-ws) runs a
turn at the same time to show that nothing reached it.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import httpx_ws
import pytest
import trio
from doorkit import ListeningServe, serve_argv, serves  # noqa: F401  (serves is a fixture)
from hostkit import Lab
from httpx_ws import aconnect_ws

from bridge.network.auth import web_page_problem
from bridge.network.door import SOCKETS_BEYOND_CONNECTIONS

DEADLINE = 10.0
SECRET_TEXT = b"secret-message-text-0123"
JSON = {"Accept": "application/json"}

UPGRADE = (
    b"GET /any/path HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
TLS_CLIENT_HELLO = bytes.fromhex("160301002f0100002b0303") + bytes(32) + bytes.fromhex("000002002f0100")

# Each is written whole, in one write, on a connection of its own.
HOSTILE_BYTES = {
    "a WebSocket upgrade followed by other bytes (issue 34)": UPGRADE + SECRET_TEXT,
    "a WebSocket upgrade to /v1/ws followed by other bytes": UPGRADE.replace(b"/any/path", b"/v1/ws") + SECRET_TEXT,
    "an invalid WebSocket upgrade followed by other bytes": UPGRADE.replace(b"Sec-WebSocket-Version: 13", b"X: y")
    + SECRET_TEXT,
    "a WebSocket upgrade whose frame is garbage": UPGRADE.replace(b"/any/path", b"/v1/ws") + b"\xff" * 64,
    "a TLS handshake on the plain port": TLS_CLIENT_HELLO,
    "a bad Host header": b"GET /healthz HTTP/1.1\r\nHost: \x00\x01bad host\r\n\r\n" + SECRET_TEXT,
    "two Host headers and a body past its length": b"POST /v1/turns HTTP/1.1\r\nHost: a\r\nHost: b\r\n"
    b"Content-Length: 2\r\n\r\n{}" + SECRET_TEXT,
    "a request line of garbage": b"\x16\x03\x01 / HTTP/9.9\r\n\r\n" + SECRET_TEXT,
    "a chunked body that lies": b"POST /v1/turns HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\n" + SECRET_TEXT,
}

WS_UPGRADE = UPGRADE.replace(b"/any/path", b"/v1/ws")
NO_MASK = bytes(4)
# Each after the handshake's 101, on a connection of its own.
HOSTILE_FRAMES = {
    "a ping longer than a control frame may be": b"\x89\xfe\x00\xc8" + NO_MASK + b"a" * 200,
    "a close longer than a control frame may be": b"\x88\xfe\x00\xc8" + NO_MASK + b"a" * 200,
    "a fragmented ping": b"\x09\x81" + NO_MASK + b"a",
    "a frame of a reserved opcode": b"\x83\x81" + NO_MASK + b"a",
    "an unmasked text frame": b"\x81\x05hello",
    "a text frame that is not UTF-8": b"\x81\x82" + NO_MASK + b"\xff\xfe",
}


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def send_and_read_until_closed(url: str, data: bytes, *, reset: bool = False, half_close: bool = True) -> bytes:
    """Write `data` in one write (and, with `half_close`, end the sending side); read what the door answers until
    it ends the connection (or, with `reset`, reset the connection after the first bytes of the answer)."""
    sock = trio.socket.socket()
    received = bytearray()
    with sock:
        await sock.connect(("127.0.0.1", port_of(url)))
        try:
            await sock.send(data)
            if half_close and not reset:
                sock.shutdown(socket.SHUT_WR)
        except OSError:  # the door ended the connection already (reset, or not connected any more)
            return b""
        with trio.move_on_after(DEADLINE) as waiting:
            while True:
                try:
                    chunk = await sock.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                received += chunk
                if reset:  # SO_LINGER 0: close() sends a RST
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    break
    assert not waiting.cancelled_caught, (
        f"the door neither ended the connection nor reset it within {DEADLINE} s: {bytes(received)!r}"
    )
    return bytes(received)


async def send_after_the_handshake(url: str, frame: bytes) -> None:
    """Open a WebSocket on /v1/ws by hand, and once the door said 101, write `frame`; read until it ends it."""
    sock = trio.socket.socket()
    with sock:
        await sock.connect(("127.0.0.1", port_of(url)))
        await sock.send(WS_UPGRADE)
        with trio.fail_after(DEADLINE):
            answer = await sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 101"), answer
        await sock.send(frame)
        with trio.move_on_after(DEADLINE) as waiting:
            try:
                while await sock.recv(65536):
                    pass
            except ConnectionResetError:
                pass
    assert not waiting.cancelled_caught, f"the door did not end the connection within {DEADLINE} s"


async def assert_still_serving(http: httpx.AsyncClient, serve: ListeningServe, after: str) -> None:
    try:
        with trio.fail_after(DEADLINE):
            response = await http.get("/healthz")
    except httpx.TransportError as err:
        raise AssertionError(f"after {after}, serve answers no more ({err!r}): {serve.output()}") from None
    assert response.status_code == 200, response.text


def start_serve(lab: Lab, serves: list[ListeningServe], *options: str) -> ListeningServe:
    argv = serve_argv("--profiles", str(lab.profiles), "--state", str(lab.state), "--listen", "127.0.0.1:0", *options)
    serve = ListeningServe(argv, lab.root / "serve.log")
    serves.append(serve)
    return serve


def turn(request_id: str, message: str, **fields: Any) -> str:
    return json.dumps(
        {"type": "turn", "id": request_id, "profile": "rec", "conversation": request_id} | fields | {"message": message}
    )


async def receive_until(ws: Any, kind: str) -> dict[str, Any]:
    with trio.fail_after(DEADLINE):
        while (response := json.loads(await ws.receive_text()))["type"] != kind:
            assert response["type"] in ("accepted", "partial"), response
    return response


async def test_no_bytes_a_connection_sends_end_serve_or_touch_another_connections_turn(
    lab: Lab, serves: list[ListeningServe]
) -> None:
    serve = start_serve(lab, serves)
    gate = lab.gate()
    async with httpx.AsyncClient(base_url=serve.url) as http, aconnect_ws("/v1/ws", http) as ws:
        await ws.send_text(turn("held", f"tag=held gate={gate}"))
        await receive_until(ws, "partial")
        for what, data in HOSTILE_BYTES.items():
            await send_and_read_until_closed(serve.url, data)
            await assert_still_serving(http, serve, what)
        for what, frame in HOSTILE_FRAMES.items():
            await send_after_the_handshake(serve.url, frame)
            await assert_still_serving(http, serve, what)
        healthz = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        await send_and_read_until_closed(serve.url, healthz, reset=True)
        await assert_still_serving(http, serve, "a client that resets mid-response")

        await lab.release(gate)
        result = await receive_until(ws, "result")
        assert result["id"] == "held" and result["outcome"] == "ok", result
        with trio.fail_after(DEADLINE):
            after = await http.post(
                "/v1/turns", content=turn("after", "tag=after"), headers={"Accept": "application/json"}
            )
        assert after.status_code == 200 and after.json()["reply"] == "reply after one", after.text
    assert serve.stop() == 0, serve.output()
    assert SECRET_TEXT.decode() not in serve.output()


def test_the_door_contains_connection_errors_where_hypercorn_looks_up_its_connection_class() -> None:
    """The seam `contain_connection_errors` replaces: hypercorn's trio `worker_serve` runs each connection as the
    `TCPServer` its module names. If hypercorn changes that, this fails before a hostile client finds out."""
    from hypercorn.trio import run

    from bridge.network.listen import contain_connection_errors

    contain_connection_errors()
    assert "TCPServer" in run.worker_serve.__code__.co_names
    assert run.TCPServer.__name__ == "ContainedTCPServer"


def test_the_door_refuses_to_start_on_a_hypercorn_whose_connections_it_cannot_contain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hypercorn.trio import run

    from bridge.errors import ListenError
    from bridge.network.listen import contain_connection_errors

    monkeypatch.delattr(run, "TCPServer")
    with pytest.raises(ListenError, match="hypercorn.trio.run.TCPServer"):
        contain_connection_errors()


async def test_a_body_that_does_not_come_within_the_body_timeout_is_answered_408_and_the_connection_closed(
    lab: Lab, serves: list[ListeningServe]
) -> None:
    serve = start_serve(lab, serves, "--body-timeout", "0.5")
    answers: dict[str, bytes] = {}

    async def stall_a_body(path: str) -> None:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
        answers[path] = await send_and_read_until_closed(serve.url, head.encode() + b'\r\n{"profile"', half_close=False)

    async with trio.open_nursery() as nursery:  # the three bodies stall at once: one body timeout for all
        for path in ("/v1/turns", "/v1/turns/t/cancel", "/v1/chat/completions"):
            nursery.start_soon(stall_a_body, path)
    for path, answer in answers.items():
        assert answer.startswith(b"HTTP/1.1 408"), (path, answer)
        assert b"request_timeout" in answer and b"connection: close" in answer, (path, answer)
    assert len(answers) == 3
    assert lab.events("start") == []


async def test_connections_past_the_listeners_bound_are_closed_unread_while_others_still_send_their_head(
    lab: Lab, serves: list[ListeningServe]
) -> None:
    serve = start_serve(lab, serves, "--max-connections", "1")
    bound = 1 + SOCKETS_BEYOND_CONNECTIONS
    healthz = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    stalled = []
    try:
        for _ in range(bound):  # each sends the start of a head and no more
            sock = trio.socket.socket()
            await sock.connect(("127.0.0.1", port_of(serve.url)))
            await sock.send(b"GET /healthz HTTP/1.1\r\nHost: 127")
            stalled.append(sock)
        assert await send_and_read_until_closed(serve.url, healthz) == b"", "one past the bound was let in"
        stalled.pop().close()
        with trio.fail_after(DEADLINE):
            while not (answer := await send_and_read_until_closed(serve.url, healthz)):
                await trio.sleep(0.01)  # the door counts the closed one back once it has seen it go
        assert answer.startswith(b"HTTP/1.1 200"), answer
    finally:
        for sock in stalled:
            sock.close()


async def test_a_websocket_client_that_left_holds_nothing_up_serves_shutdown_waits_for_none(
    lab: Lab, serves: list[ListeningServe]
) -> None:
    serve = start_serve(lab, serves)
    async with httpx.AsyncClient(base_url=serve.url) as http, aconnect_ws("/v1/ws", http) as ws:
        await ws.send_text(turn("left", "tag=left"))
        assert (await receive_until(ws, "result"))["outcome"] == "ok"
    started = time.monotonic()
    assert serve.stop() == 0, serve.output()
    # hypercorn's WebSocket pings (every 30 s) would hold the connection until its graceful timeout (2 s) ran out
    assert time.monotonic() - started < 1.5, "serve waited for a WebSocket connection whose client had left"


async def test_a_request_head_over_64_kib_is_refused_and_one_of_64_kib_is_served(
    lab: Lab, serves: list[ListeningServe]
) -> None:
    serve = start_serve(lab, serves)

    def head_of(size: int) -> bytes:
        start, end = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Pad: ", b"\r\n\r\n"
        return start + b"a" * (size - len(start) - len(end)) + end

    for size, status in ((64 * 1024, b"200"), (64 * 1024 + 1, b"431"), (120 * 1024, b"431")):
        answer = await send_and_read_until_closed(serve.url, head_of(size))
        assert answer.startswith(b"HTTP/1.1 " + status), (size, answer[:200])


async def test_a_door_without_tokens_warns_at_start_that_every_local_process_can_come_in(
    lab: Lab, serves: list[ListeningServe], tmp_path: Path
) -> None:
    without = start_serve(lab, serves)
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(json.dumps({"token-of-tenant-a-0123456789": {"name": "a"}}))
    tokens.chmod(0o600)
    with_tokens = ListeningServe(
        serve_argv(
            "--profiles",
            str(lab.profiles),
            "--state",
            str(tmp_path / "other.sqlite3"),
            "--listen",
            "127.0.0.1:0",
            "--tokens",
            str(tokens),
        ),
        tmp_path / "with-tokens.log",
    )
    serves.append(with_tokens)
    assert without.stop() == 0 and with_tokens.stop() == 0
    warning = "any process on this machine can run every profile"
    assert warning in without.output() and "network: true" in without.output(), without.output()
    assert warning not in with_tokens.output(), with_tokens.output()


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """(certificate, key): self-signed for 127.0.0.1, made by `openssl` (as tests/test_network_tls.py does)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_over_tls_no_handshake_garbage_nor_bytes_inside_it_end_serve(
    lab: Lab, serves: list[ListeningServe], certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    serve = start_serve(lab, serves, "--certfile", str(cert), "--keyfile", str(key))
    trusting = ssl.create_default_context(cafile=str(cert))
    async with httpx.AsyncClient(base_url=serve.url, verify=trusting) as http:
        for what, data in {
            "a ClientHello of garbage": TLS_CLIENT_HELLO,
            "plain HTTP on the TLS port": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "random bytes": bytes(range(256)) * 4,
        }.items():
            await send_and_read_until_closed(serve.url.replace("https://", "http://"), data)
            await assert_still_serving(http, serve, what)
        with trio.fail_after(DEADLINE):
            tcp = await trio.open_tcp_stream("127.0.0.1", port_of(serve.url))
            tls = trio.SSLStream(tcp, trusting, server_hostname="127.0.0.1")
            await tls.send_all(UPGRADE + SECRET_TEXT)  # the bytes, inside TLS
            try:
                while await tls.receive_some(65536):
                    pass
            except trio.BrokenResourceError:
                pass
            await trio.aclose_forcefully(tls)
        await assert_still_serving(http, serve, "a WebSocket upgrade followed by other bytes inside TLS")
    assert serve.stop() == 0, serve.output()


async def test_clients_that_stall_their_bodies_cannot_take_the_descriptors_a_turn_needs(
    lab: Lab, serves: list[ListeningServe]
) -> None:
    descriptors = 700  # serve's whole descriptor limit, hard too: it cannot raise it
    argv = serve_argv("--profiles", str(lab.profiles), "--state", str(lab.state), "--listen", "127.0.0.1:0")
    serve = ListeningServe(["prlimit", f"--nofile={descriptors}:{descriptors}", *argv], lab.root / "serve.log")
    serves.append(serve)
    stalled_body = b"POST /v1/turns HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"
    stalled: list[trio.socket.SocketType] = []
    try:
        async with httpx.AsyncClient(base_url=serve.url) as http, aconnect_ws("/v1/ws", http) as ws:
            for _ in range(descriptors + 100):  # more than serve could hold open
                sock = trio.socket.socket()
                stalled.append(sock)
                with trio.move_on_after(0.9) as dropped:  # a connection the kernel dropped comes again in 1 s
                    try:
                        await sock.connect(("127.0.0.1", port_of(serve.url)))
                        await sock.send(stalled_body)
                    except OSError:  # closed unread: past what the door holds
                        pass
                assert not dropped.cancelled_caught, "the door's listen queue did not take a burst of connections"
            # The kernel queues them all for the door's accept: the turn comes once the door has come to the
            # last one (it closes it unread, past what it holds), so the stalled ones hold what they can.
            with trio.move_on_after(DEADLINE):
                try:
                    await stalled[-1].recv(1)
                except OSError:
                    pass
            await ws.send_text(turn("after", "tag=after"))
            result = await receive_until(ws, "result")
    finally:
        for sock in stalled:
            sock.close()
    assert result["outcome"] == "ok", result
    assert "descriptor limit" in serve.output(), serve.output()


async def http2_stalled_bodies(url: str, streams: int) -> list[Any]:
    """Open `streams` HTTP/2 streams at once on one connection (the preface on the plain port), each the start of a
    `POST /v1/turns` body and no more, ignoring what the door's settings allow; the h2 events it answers with
    until it ends the connection (or answers every stream)."""
    import h2.config
    import h2.connection
    import h2.events

    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    head = [(":method", "POST"), (":path", "/v1/turns"), (":scheme", "http"), (":authority", "127.0.0.1")]
    for stream_id in range(1, 2 * streams, 2):
        client.send_headers(stream_id, [*head, ("content-length", "100")])
        client.send_data(stream_id, b"{")
    events: list[Any] = []
    sock = trio.socket.socket()
    with sock, trio.fail_after(DEADLINE):
        await sock.connect(("127.0.0.1", port_of(url)))
        await sock.send(client.data_to_send())
        answered = 0
        while answered < streams:
            try:
                data = await sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            for event in client.receive_data(data):
                events.append(event)
                answered += isinstance(event, h2.events.ResponseReceived)
                if isinstance(event, h2.events.ConnectionTerminated):
                    return events
            await sock.send(client.data_to_send())
    return events


async def test_an_http2_connection_reads_one_request_at_a_time_as_http1_does(
    lab: Lab, serves: list[ListeningServe]
) -> None:
    """The socket bound holds one request being read per connection: HTTP/2's streams do not multiply it (each
    could hold a body of 1 MiB for --body-timeout). A client that opens more streams than the door's settings
    allow loses its connection; one that keeps to them is served."""
    import h2.events

    serve = start_serve(lab, serves, "--body-timeout", "0.5")
    events = await http2_stalled_bodies(serve.url, 3)
    statuses = [dict(event.headers)[b":status"] for event in events if isinstance(event, h2.events.ResponseReceived)]
    assert len(statuses) <= 1, f"one HTTP/2 connection had {len(statuses)} bodies read at once: {statuses}"
    assert any(isinstance(event, h2.events.ConnectionTerminated) for event in events), events
    async with httpx.AsyncClient(base_url=serve.url, http1=False, http2=True) as http2:
        with trio.fail_after(DEADLINE):
            response = await http2.post(
                "/v1/turns", content=turn("h2", "tag=h2"), headers={"Accept": "application/json"}
            )
    assert (response.http_version, response.status_code) == ("HTTP/2", 200), response.text
    assert response.json()["reply"] == "reply h2 one"
    assert lab.events("start") == ["h2"]  # none of the stalled bodies ran a turn


async def test_a_door_without_tokens_serves_no_web_page_a_browser_on_this_machine_shows(
    lab: Lab, serves: list[ListeningServe]
) -> None:
    """A page of another site could post a turn (a form, a `fetch` CORS lets through unread) or open a WebSocket
    (CORS covers none), and one whose name is rebound to 127.0.0.1 could read the answers: each is refused, 403,
    before a turn starts; the programs of this machine (no Origin, or a loopback one) are served."""
    serve = start_serve(lab, serves)
    port = port_of(serve.url)
    page = {"Content-Type": "text/plain;charset=UTF-8", "Origin": "https://evil.example"}
    rebound = {"Host": f"rebound.evil.example:{port}"}
    async with httpx.AsyncClient(base_url=serve.url, timeout=DEADLINE) as http:
        for headers in (page, rebound, {"Origin": "null"}):
            refused = await http.post("/v1/turns", content=turn("page", "tag=page"), headers=headers)
            assert refused.status_code == 403, (headers, refused.text)
            # its body unread, the connection carries no other request: the next one, sent on it, found it closed
            assert refused.headers["connection"] == "close"
            assert refused.json()["code"] == "forbidden"
            assert (await http.get("/v1/stats", headers=headers)).status_code == 403
            chat = {"model": "rec", "messages": [{"role": "user", "content": "tag=chat"}]}
            openai = await http.post("/v1/chat/completions", content=json.dumps(chat), headers=headers)
            assert openai.status_code == 403 and openai.json()["error"]["code"] == "forbidden", openai.text
        with pytest.raises(httpx_ws.WebSocketUpgradeError) as upgrade:
            async with aconnect_ws("/v1/ws", http, headers=page):
                pass
        assert upgrade.value.response.status_code == 403
        local = ({}, {"Origin": f"http://localhost:{port}"}, {"Host": f"localhost:{port}", "Origin": "http://[::1]"})
        for number, headers in enumerate(local):
            served = await http.post(
                "/v1/turns", content=turn(f"local{number}", f"tag=local{number}"), headers={**headers, **JSON}
            )
            assert served.status_code == 200 and served.json()["outcome"] == "ok", (headers, served.text)
    assert lab.events("start") == ["local0", "local1", "local2"]


@pytest.mark.parametrize(
    ("host", "origin", "refused"),
    [
        (None, None, False),
        ("127.0.0.1:8080", None, False),
        ("127.9.9.9", "http://127.0.0.1:3000", False),
        ("[::1]:8080", "http://[::1]:3000", False),
        ("LOCALHOST:8080", "http://app.localhost", False),
        ("evil.example:8080", None, True),
        ("localhost.:8080", None, True),
        ("10.0.0.1:8080", None, True),
        ("127.0.0.1:8080", "https://evil.example", True),
        ("127.0.0.1:8080", "null", True),
        ("127.0.0.1:8080", "http://127.0.0.1.evil.example", True),
    ],
)
def test_web_page_problem_tells_a_page_from_a_local_program(
    host: str | None, origin: str | None, refused: bool
) -> None:
    assert (web_page_problem(host, origin) is not None) is refused
