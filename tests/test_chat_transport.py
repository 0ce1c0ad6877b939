"""connect's HTTP transport (bridge.chat.http_transport) against real servers on loopback.

The servers are written here on trio, byte by byte, so that each can misbehave the way a real one sometimes does:
close a kept-alive connection, reset one in the middle of a body, go silent, answer in chunks. The client is httpx,
as the connectors use it; what they rely on is that every failure is one of httpx's exceptions.
"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
import trustme
from chatkit import TELEGRAM_TOKEN

from bridge.chat.http_transport import TrioH11Transport, chat_http_client

SECRET_PATH = f"/bot{TELEGRAM_TOKEN}/getUpdates"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


class Peer:
    """One connection the test server accepted: requests read from it, bytes written to it."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = b""

    async def request(self) -> tuple[str, str, bytes] | None:
        """The next request's method, target and body (Content-Length framed), or None at the end of the stream."""
        while b"\r\n\r\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.buffer += data
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        method, target, _ = lines[0].split(" ")
        length = next((int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")), 0)
        while len(self.buffer) < length:
            self.buffer += await self.stream.receive_some(65536)
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return method, target, body

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    def reset(self) -> None:
        """Close with a TCP reset (SO_LINGER 0), as a crashed server or a middlebox does."""
        assert isinstance(self.stream, trio.SocketStream)
        self.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.stream.socket.close()


Script = Callable[[Peer, "Server"], Awaitable[None]]


@dataclass
class Server:
    port: int
    connections: int = 0
    targets: list[str] = field(default_factory=list)
    events: dict[str, trio.Event] = field(default_factory=dict)

    def event(self, name: str) -> trio.Event:
        return self.events.setdefault(name, trio.Event())


async def start(
    nursery: trio.Nursery, script: Script, tls: ssl.SSLContext | None = None, host: str = "127.0.0.1"
) -> Server:
    """A server on loopback running `script` for each connection it accepts."""
    server = Server(port=0)

    async def accepted(stream: trio.abc.Stream) -> None:
        server.connections += 1
        await script(Peer(stream), server)

    if tls is None:
        listeners = await nursery.start(partial(trio.serve_tcp, accepted, 0, host=host))
    else:
        serve = partial(trio.serve_ssl_over_tcp, accepted, 0, tls, host=host, https_compatible=True)
        listeners = await nursery.start(serve)
    server.port = (listeners[0].transport_listener if tls else listeners[0]).socket.getsockname()[1]
    return server


def answer(body: bytes, *, status: str = "200 OK", headers: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s\r\n%s" % (status.encode(), len(body), headers, body)


async def echo_targets(peer: Peer, server: Server) -> None:
    """Answer every request with its target, keeping the connection open."""
    while (request := await peer.request()) is not None:
        server.targets.append(request[1])
        await peer.send(answer(request[1].encode()))


# --------------------------------------------------------------------------------------------- keep-alive


async def test_a_kept_alive_connection_carries_the_next_requests(nursery: trio.Nursery) -> None:
    server = await start(nursery, echo_targets)
    async with httpx.AsyncClient(transport=TrioH11Transport()) as client:
        for number in range(3):
            response = await client.post(f"http://127.0.0.1:{server.port}/call/{number}", json={"n": number})
            assert (response.status_code, response.text) == (200, f"/call/{number}")
    assert server.connections == 1


async def test_ipv6_loopback_works_like_ipv4(nursery: trio.Nursery) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        server = await start(nursery, echo_targets, host="::1")
    except OSError:
        pytest.skip("::1 cannot be bound here")
    async with httpx.AsyncClient(transport=TrioH11Transport()) as client:
        response = await client.get(f"http://[::1]:{server.port}/six")
    assert response.text == "/six"


@pytest.mark.parametrize("leaving", ["closes", "sends junk", "sends junk with its answer"])
async def test_an_idle_connection_the_server_left_is_never_used_again(nursery: trio.Nursery, leaving: str) -> None:
    junk = b"HTTP/1.1 500 Not for you\r\nContent-Length: 0\r\n\r\n"

    async def leave_after_one(peer: Peer, server: Server) -> None:
        if server.connections > 1:
            return await echo_targets(peer, server)
        assert await peer.request() is not None
        # No `Connection: close`: the client keeps the connection for its next request.
        await peer.send(answer(b"first") + (junk if leaving == "sends junk with its answer" else b""))
        await server.event("answer read").wait()  # then the connection is idle in the client's pool
        if leaving == "closes":
            await peer.stream.aclose()
        elif leaving == "sends junk":
            await peer.send(junk)
        server.event("left").set()
        await trio.sleep_forever()

    server = await start(nursery, leave_after_one)
    async with httpx.AsyncClient(transport=TrioH11Transport(), timeout=5) as client:
        assert (await client.get(f"http://127.0.0.1:{server.port}/one")).text == "first"
        server.event("answer read").set()
        await server.event("left").wait()
        response = await client.get(f"http://127.0.0.1:{server.port}/two")
    assert (response.status_code, response.text) == (200, "/two")
    assert server.connections == 2


async def test_a_response_with_connection_close_is_not_kept(nursery: trio.Nursery) -> None:
    async def close_each(peer: Peer, server: Server) -> None:
        assert await peer.request() is not None
        await peer.send(answer(b"bye", headers=b"Connection: close\r\n"))
        await trio.sleep_forever()  # the client closes it: it never sends on it again

    server = await start(nursery, close_each)
    async with httpx.AsyncClient(transport=TrioH11Transport(), timeout=2) as client:
        for _ in range(2):
            assert (await client.get(f"http://127.0.0.1:{server.port}/")).text == "bye"
    assert server.connections == 2


async def test_closing_the_client_closes_its_idle_connections(nursery: trio.Nursery) -> None:
    async def note_the_end(peer: Peer, server: Server) -> None:
        await echo_targets(peer, server)
        server.event("ended").set()

    server = await start(nursery, note_the_end)
    client = httpx.AsyncClient(transport=TrioH11Transport())
    await client.get(f"http://127.0.0.1:{server.port}/")
    await client.aclose()
    with trio.fail_after(2):
        await server.event("ended").wait()


# --------------------------------------------------------------------------------------------- failures


@pytest.mark.parametrize(("breaking", "error"), [("reset", httpx.ReadError), ("close", httpx.RemoteProtocolError)])
async def test_a_connection_broken_in_the_middle_of_a_body_is_httpx_error_and_not_reused(
    nursery: trio.Nursery, breaking: str, error: type[httpx.HTTPError]
) -> None:
    async def break_the_first(peer: Peer, server: Server) -> None:
        if server.connections > 1:
            return await echo_targets(peer, server)
        assert await peer.request() is not None
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
        if breaking == "reset":
            peer.reset()
        else:
            await peer.stream.aclose()

    server = await start(nursery, break_the_first)
    # One connection at a time: the broken one's place must be given back, or the next request would wait.
    async with httpx.AsyncClient(transport=TrioH11Transport(max_connections=1), timeout=2) as client:
        with pytest.raises(error):
            await client.get(f"http://127.0.0.1:{server.port}/broken")
        response = await client.get(f"http://127.0.0.1:{server.port}/next")
    assert response.text == "/next"
    assert server.connections == 2


async def test_a_silent_server_is_a_read_timeout_that_names_no_path(nursery: trio.Nursery) -> None:
    async def silent(peer: Peer, server: Server) -> None:
        assert await peer.request() is not None
        await trio.sleep_forever()

    server = await start(nursery, silent)
    async with httpx.AsyncClient(transport=TrioH11Transport()) as client:
        with trio.fail_after(3), pytest.raises(httpx.ReadTimeout) as raised:
            await client.get(f"http://127.0.0.1:{server.port}{SECRET_PATH}", timeout=httpx.Timeout(5, read=0.2))
    assert TELEGRAM_TOKEN not in str(raised.value)


async def test_a_refused_connection_is_a_connect_error_that_names_no_path() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, never listening: connecting is refused
        async with httpx.AsyncClient(transport=TrioH11Transport()) as client:
            with pytest.raises(httpx.ConnectError) as raised:
                await client.get(f"http://127.0.0.1:{port}{SECRET_PATH}")
    assert TELEGRAM_TOKEN not in str(raised.value)


async def test_waiting_beyond_the_pool_timeout_for_a_connection_is_a_pool_timeout(nursery: trio.Nursery) -> None:
    async def half_a_body_then_targets(peer: Peer, server: Server) -> None:
        if server.connections > 1:
            return await echo_targets(peer, server)
        assert await peer.request() is not None
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf.")
        await trio.sleep_forever()

    server = await start(nursery, half_a_body_then_targets)
    url = f"http://127.0.0.1:{server.port}"
    async with httpx.AsyncClient(transport=TrioH11Transport(max_connections=1), timeout=2) as client:
        async with client.stream("GET", f"{url}/held"):
            with trio.fail_after(2), pytest.raises(httpx.PoolTimeout):
                await client.get(f"{url}/waiting", timeout=httpx.Timeout(2, pool=0.2))
        # The held response, closed before its body was complete, gave its place back (its connection closed).
        assert (await client.get(f"{url}/after")).text == "/after"
    assert server.connections == 2


# --------------------------------------------------------------------------------------------- bodies


async def test_a_chunked_body_is_read_whole_and_its_connection_kept(nursery: trio.Nursery) -> None:
    async def chunked_then_targets(peer: Peer, server: Server) -> None:
        assert await peer.request() is not None
        await peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await peer.send(b"7\r\n, world\r\n0\r\n\r\n")
        await echo_targets(peer, server)

    server = await start(nursery, chunked_then_targets)
    async with httpx.AsyncClient(transport=TrioH11Transport(), timeout=2) as client:
        assert (await client.get(f"http://127.0.0.1:{server.port}/chunked")).text == "hello, world"
        assert (await client.get(f"http://127.0.0.1:{server.port}/next")).text == "/next"
    assert server.connections == 1


async def test_head_204_and_304_have_no_body_and_keep_the_connection(nursery: trio.Nursery) -> None:
    async def bodiless(peer: Peer, server: Server) -> None:
        while (request := await peer.request()) is not None:
            method, target, _ = request
            if method == "HEAD":  # the length a GET would have, and no body
                await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
            elif target == "/204":
                await peer.send(b"HTTP/1.1 204 No Content\r\n\r\n")
            elif target == "/304":
                await peer.send(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n")
            else:
                await peer.send(answer(target.encode()))

    server = await start(nursery, bodiless)
    url = f"http://127.0.0.1:{server.port}"
    async with httpx.AsyncClient(transport=TrioH11Transport(), timeout=2) as client:
        head = await client.head(f"{url}/file")
        assert (head.status_code, head.headers["content-length"], head.content) == (200, "5", b"")
        assert ((await client.get(f"{url}/204")).status_code, (await client.get(f"{url}/304")).status_code) == (
            204,
            304,
        )
        assert (await client.get(f"{url}/after")).text == "/after"
    assert server.connections == 1


async def test_a_large_body_is_streamed_not_read_before_it_is_handed_out(nursery: trio.Nursery) -> None:
    half = b"x" * (1 << 20)

    async def in_two_halves(peer: Peer, server: Server) -> None:
        assert await peer.request() is not None
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 * len(half)) + half)
        await server.event("first chunk read").wait()  # the second half only once the client has some of the first
        await peer.send(half)

    server = await start(nursery, in_two_halves)
    received = 0
    async with httpx.AsyncClient(transport=TrioH11Transport(), timeout=5) as client:
        with trio.fail_after(5):
            async with client.stream("GET", f"http://127.0.0.1:{server.port}/download") as response:
                async for chunk in response.aiter_raw():
                    received += len(chunk)
                    server.event("first chunk read").set()
    assert received == 2 * len(half)


async def test_a_request_body_larger_than_one_write_arrives_whole(nursery: trio.Nursery) -> None:
    async def echo_lengths(peer: Peer, server: Server) -> None:
        while (request := await peer.request()) is not None:
            await peer.send(answer(str(len(request[2])).encode()))

    server = await start(nursery, echo_lengths)
    async with httpx.AsyncClient(transport=TrioH11Transport(), timeout=5) as client:
        for size in (10, 300_000):
            response = await client.post(f"http://127.0.0.1:{server.port}/upload", content=b"u" * size)
            assert response.text == str(size)


# --------------------------------------------------------------------------------------------- TLS


@pytest.fixture
def certificate_authority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> trustme.CA:
    """A CA of the test's own, trusted the way a user trusts theirs: SSL_CERT_FILE."""
    authority = trustme.CA()
    authority.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    return authority


def server_tls(authority: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(context)
    return context


async def test_https_to_a_trusted_certificate_keeps_its_connection(
    nursery: trio.Nursery, certificate_authority: trustme.CA
) -> None:
    server = await start(nursery, echo_targets, tls=server_tls(certificate_authority))
    async with httpx.AsyncClient(transport=TrioH11Transport(), timeout=5) as client:
        for number in range(2):
            assert (await client.get(f"https://localhost:{server.port}/tls/{number}")).text == f"/tls/{number}"
    assert server.connections == 1


async def test_https_refuses_a_certificate_for_another_name(
    nursery: trio.Nursery, certificate_authority: trustme.CA
) -> None:
    server = await start(nursery, echo_targets, tls=server_tls(certificate_authority))
    async with httpx.AsyncClient(transport=TrioH11Transport(), timeout=5) as client:
        with pytest.raises(httpx.ConnectError, match="certificate"):
            await client.get(f"https://127.0.0.1:{server.port}/")  # the certificate is localhost's
    assert server.targets == []


async def test_https_refuses_a_certificate_nobody_trusts(
    nursery: trio.Nursery, certificate_authority: trustme.CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await start(nursery, echo_targets, tls=server_tls(certificate_authority))
    monkeypatch.delenv("SSL_CERT_FILE")  # httpx's default trust (certifi) does not know the test's CA
    async with httpx.AsyncClient(transport=TrioH11Transport(), timeout=5) as client:
        with pytest.raises(httpx.ConnectError, match="certificate"):
            await client.get(f"https://localhost:{server.port}/")
    assert server.targets == []


# --------------------------------------------------------------------------------------------- proxies


async def test_the_environments_proxy_carries_what_it_covers_and_no_proxy_goes_direct(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct = await start(nursery, echo_targets)
    proxy = await start(nursery, echo_targets)
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("NO_PROXY", "localhost")
    async with chat_http_client(timeout=5) as client:
        # Nothing listens on 127.0.0.9:1: only the proxy can answer.
        assert (await client.get("http://127.0.0.9:1/through")).status_code == 200
        assert (await client.get(f"http://localhost:{direct.port}/direct")).text == "/direct"
    assert proxy.targets == ["http://127.0.0.9:1/through"]  # a proxy's request names the whole URL
    assert direct.targets == ["/direct"]
