"""The network door under idle and slow clients: many connections held open, too many, and clients that stop reading.

A real hypercorn serves a real host in the test's trio loop (`serve_network`), and the clients are real: httpx and
httpx-ws for the well-behaved ones, and for those that misbehave a WebSocket (wsproto) or HTTP client on a bare
socket, which reads only when the test says so.
"""

from __future__ import annotations

import json
import resource
import select
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from conftest import PYTHON, RECORD_PIDS, SAMPLE_AGENTS, TURN_DEADLINE, assert_no_live_process, read_pids
from httpx_ws import aconnect_ws
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Ping, Request, TextMessage

import bridge
from bridge.network.app import WS_TRY_AGAIN_LATER
from bridge.network.door import DoorLimits
from bridge.network.listen import parse_address, serve_network

IDLE_CONNECTIONS = 1000
STALL_SECS = 0.5
# A partial of 1 KB as fast as the agent can write: the door has more to send than a client that stops reading takes.
FLOOD = RECORD_PIDS + textwrap.dedent(
    """
    import os
    line = b'AGENT_PARTIAL: "' + b"x" * 1024 + b'"\\n'
    while True:
        os.write(1, line)
    """
)


def turn(request_id: str, profile: str = "echo", message: str = "hello") -> dict[str, Any]:
    return {"type": "turn", "id": request_id, "profile": profile, "conversation": request_id, "message": message}


@asynccontextmanager
async def listening(tmp_path: Path, pid_file: Path, **limits: Any) -> AsyncIterator[tuple[str, bridge.BaseHost]]:
    """A door on a free port of loopback over a host with profiles `echo` and `flood` (which records its pids)."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "echo.yaml").write_text(json.dumps({"command": [str(SAMPLE_AGENTS / "echo.sh")]}))
    flood = tmp_path / "flood.py"
    flood.write_text(FLOOD)
    (profiles / "flood.yaml").write_text(
        json.dumps({"command": [PYTHON, str(flood)], "env": {"PID_FILE": str(pid_file)}, "timeout_secs": 60})
    )
    host = bridge.open_host(profiles, state=tmp_path / "state.sqlite3")
    async with host, trio.open_nursery() as nursery:
        serving = partial(serve_network, host, parse_address("127.0.0.1:0"), tokens=None, limits=DoorLimits(**limits))
        urls: list[str] = await nursery.start(serving)
        yield urls[0], host
        nursery.cancel_scope.cancel()


async def echo_over_http(url: str, request_id: str) -> None:
    """A turn by a client that reads: POST /v1/turns for its result as JSON."""
    with trio.fail_after(TURN_DEADLINE):
        async with httpx.AsyncClient(base_url=url) as client:
            response = await client.post("/v1/turns", json=turn(request_id), headers={"Accept": "application/json"})
    assert response.status_code == 200 and response.json()["reply"] == "echo: hello", response.text


async def echo_over_ws(url: str, request_id: str) -> None:
    """A turn by a WebSocket client that reads (httpx-ws), from `accepted` to its `result`."""
    with trio.fail_after(TURN_DEADLINE):
        async with httpx.AsyncClient(base_url=url) as client, aconnect_ws("/v1/ws", client) as ws:
            await ws.send_text(json.dumps(turn(request_id)))
            while (response := json.loads(await ws.receive_text()))["type"] != "result":
                assert response["type"] in ("accepted", "partial"), response
    assert response["id"] == request_id and response["reply"] == "echo: hello", response


async def wait_until_cancelled(host: bridge.BaseHost, pid_file: Path) -> None:
    """The flooding turn ended as cancelled, and its agent is gone."""
    with trio.fail_after(TURN_DEADLINE):
        while (stats := await host.current_stats()).running or not stats.completed:
            await trio.sleep(0.01)
    assert stats.completed == 1 and stats.outcomes["cancelled"] == 1, stats
    pids = read_pids(pid_file)
    assert pids, "the flooding agent never started"
    assert_no_live_process(pids)


class BareClient:
    """A client on a bare socket with a small receive buffer, which reads only when asked to (`read`, `drain`)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream

    @classmethod
    async def connect(cls, url: str) -> BareClient:
        port = int(url.rsplit(":", 1)[1])
        sock = trio.socket.socket()
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)  # before connect: a small window
        await sock.connect(("127.0.0.1", port))
        return cls(trio.SocketStream(sock))

    async def read_until(self, marker: bytes) -> bytes:
        """Read until `marker` has come; what came."""
        received = bytearray()
        with trio.fail_after(TURN_DEADLINE):
            while marker not in received:
                chunk = await self.stream.receive_some(65536)
                assert chunk, f"the server closed the connection before {marker!r}: {bytes(received)!r}"
                received += chunk
        return bytes(received)

    async def wait_closed(self) -> None:
        """Read what the server still sends, until it ends the connection (closes or resets it)."""
        with trio.fail_after(TURN_DEADLINE):
            try:
                while await self.stream.receive_some(65536):
                    pass
            except trio.BrokenResourceError:  # reset: the kernel gave up on this reader for the door
                pass


class BareWebSocket(BareClient):
    """A WebSocket client (wsproto) on a `BareClient`."""

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream)
        self.ws = WSConnection(ConnectionType.CLIENT)

    @classmethod
    async def open(cls, url: str) -> tuple[BareWebSocket, Any]:
        """Connect and hand-shake; the client and the handshake's answer (AcceptConnection or RejectConnection)."""
        client = await cls.connect(url)
        assert isinstance(client, BareWebSocket)
        await client.stream.send_all(client.ws.send(Request(host="127.0.0.1", target="/v1/ws")))
        return client, await client.event()

    async def event(self) -> Any:
        """The next thing the server says but its keep-alive pings."""
        with trio.fail_after(TURN_DEADLINE):
            while True:
                for event in self.ws.events():
                    if not isinstance(event, Ping):
                        return event
                self.ws.receive_data(await self.stream.receive_some(65536) or None)

    async def pending_events(self) -> list[Any]:
        """What the server has said and the client not yet read, without waiting for more."""
        poll = select.poll()  # not select(): the descriptors of a thousand connections go past FD_SETSIZE
        poll.register(self.stream.socket.fileno(), select.POLLIN)
        while poll.poll(0):
            data = await self.stream.receive_some(65536)
            self.ws.receive_data(data or None)
            if not data:
                break
        return list(self.ws.events())

    async def send(self, request: dict[str, Any]) -> None:
        await self.stream.send_all(self.ws.send(TextMessage(json.dumps(request))))

    async def aclose(self) -> None:
        await self.stream.aclose()


@pytest.fixture
def many_files() -> Iterator[None]:
    """Room for both ends of the idle connections in this process: the soft RLIMIT_NOFILE raised (as far as the hard
    one allows), restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * IDLE_CONNECTIONS + 512
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"RLIMIT_NOFILE's hard limit {hard} is under the {wanted} descriptors this test holds")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_thousand_idle_websockets_stay_open_while_a_turn_on_another_completes(
    tmp_path: Path, pid_file: Path, many_files: None
) -> None:
    async with listening(tmp_path, pid_file) as (url, host):
        idle = []
        for _ in range(IDLE_CONNECTIONS):
            client, answer = await BareWebSocket.open(url)
            assert isinstance(answer, AcceptConnection), answer
            idle.append(client)
        await echo_over_ws(url, "busy")
        await echo_over_http(url, "plain")
        for client in idle:  # the door said nothing to them but its keep-alive pings, and closed none
            assert all(isinstance(event, Ping) for event in await client.pending_events())
        for client in idle:
            await client.aclose()


async def test_the_connection_past_max_connections_is_refused_until_one_closes(tmp_path: Path, pid_file: Path) -> None:
    async with listening(tmp_path, pid_file, max_connections=2) as (url, host):
        first, answer = await BareWebSocket.open(url)
        assert isinstance(answer, AcceptConnection)
        second, answer = await BareWebSocket.open(url)
        assert isinstance(answer, AcceptConnection)

        third, answer = await BareWebSocket.open(url)
        assert isinstance(answer, AcceptConnection), answer  # accepted to be told why: close code 1013
        closing = await third.event()
        assert isinstance(closing, CloseConnection) and closing.code == WS_TRY_AGAIN_LATER, closing
        with trio.fail_after(TURN_DEADLINE):
            async with httpx.AsyncClient(base_url=url) as client:
                response = await client.post("/v1/turns", json=turn("refused"))
        assert response.status_code == 503 and response.json()["code"] == "too_many_connections", response.text

        await first.aclose()
        await wait_for_a_free_connection(url)
        await echo_over_ws(url, "after")
        await second.aclose()


async def wait_for_a_free_connection(url: str) -> None:
    """Once the door has seen a client go, a new one is let in (the door counts it back when it sees the close)."""
    with trio.fail_after(TURN_DEADLINE):
        while True:
            client, answer = await BareWebSocket.open(url)
            await client.aclose()
            if isinstance(answer, AcceptConnection):
                return
            await trio.sleep(0.01)


async def test_a_websocket_client_that_stops_reading_is_dropped_and_its_turn_cancelled(
    tmp_path: Path, pid_file: Path
) -> None:
    async with listening(tmp_path, pid_file, stall_secs=STALL_SECS) as (url, host):
        slow, answer = await BareWebSocket.open(url)
        assert isinstance(answer, AcceptConnection)
        await slow.send(turn("flood", profile="flood"))
        answer = await slow.event()
        assert isinstance(answer, TextMessage) and json.loads(answer.data)["type"] == "accepted", answer
        # From now on it reads nothing while the agent floods: the door's writes block, and it gives up on them.
        await wait_until_cancelled(host, pid_file)
        await slow.wait_closed()
        await echo_over_ws(url, "next")
        await echo_over_http(url, "plain")


async def test_an_event_stream_client_that_stops_reading_is_dropped_and_its_turn_cancelled(
    tmp_path: Path, pid_file: Path
) -> None:
    async with listening(tmp_path, pid_file, stall_secs=STALL_SECS) as (url, host):
        slow = await BareClient.connect(url)
        body = json.dumps(turn("flood", profile="flood")).encode()
        await slow.stream.send_all(
            b"POST /v1/turns HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert (await slow.read_until(b"event: accepted")).startswith(b"HTTP/1.1 200")
        await wait_until_cancelled(host, pid_file)  # as it reads no more
        await slow.wait_closed()
        await echo_over_http(url, "next")
        await echo_over_ws(url, "socket")
