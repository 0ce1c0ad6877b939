"""connect's HTTP client: httpx as the API, over a lean transport of its own on trio streams and h11.

Why a transport of our own: bench row 32 (an echo turn through `connect` against the fake Bot API, compared with
the same turn through stdin/stdout `serve`) makes two HTTP legs per turn, the long poll's answer and the reply's
`sendMessage`. httpx's default transport (httpcore) spends more per request than h11 on a trio stream (it writes
a request's head and body in separate sends, among other things); this one writes them in one. Measured (load 4-7
on 2 shared cores): a call to the fake Bot API 50 ms after the last, median 2.9 ms through httpcore, 2.4 ms here;
row 32 over serve, nine interleaved runs each, median +12.1 ms before, +9.6 ms with it (docs/performance.md).

httpx stays the client (`chat_http_client`): the connectors see an `httpx.AsyncClient`, and every failure here is
one of httpx's exceptions (`ConnectError`, `ReadTimeout`, `RemoteProtocolError`, …), so they keep catching
`httpx.HTTPError`. Nothing here logs, and no message names a URL's path (a Telegram one holds the bot token).
"""

from __future__ import annotations

import math
import select
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.request import getproxies

import h11
import httpx
import trio

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_CONNECTIONS = 16
"""Connections open at once to one origin (scheme, host, port); a request beyond waits, within its pool timeout."""
IDLE_EXPIRY = 5.0
"""Seconds an idle connection is kept for the next request to its origin (httpx's default)."""
READ_SIZE = 64 * 1024
SEND_SIZE = 64 * 1024
"""A request body is sent with its head when it is smaller; a larger one in pieces of about this size."""

Origin = tuple[str, str, int]
"""(scheme, host, port)."""


class _Connection:
    """One HTTP/1.1 connection: its stream, its socket (to look at while idle), its h11 state."""

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType, origin: Origin) -> None:
        self.stream = stream
        self.socket = socket
        self.h11 = h11.Connection(h11.CLIENT)
        self.name = f"{origin[1]}:{origin[2]}"
        self.idle_since = 0.0

    def finished_cleanly(self) -> bool:
        """Both sides done with the request and its response, neither asked to close, and the server sent nothing
        beyond its response (it would be read as the next request's answer): reusable."""
        beyond, closed = self.h11.trailing_data
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE and not beyond and not closed

    def spoken_to_while_idle(self) -> bool:
        """Anything readable on an idle connection is the server closing it (EOF, a reset) or junk: unusable."""
        poller = select.poll()
        poller.register(self.socket.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    def close(self) -> None:
        """Close at once (no TLS close_notify: HTTP/1.1's framing does not need it, and it could block)."""
        self.socket.close()


@dataclass
class _Pool:
    """One origin's connections: the slots of those open, and the idle ones (the most recently used last)."""

    slots: trio.Semaphore
    idle: list[_Connection] = field(default_factory=list)


class TrioH11Transport(httpx.AsyncBaseTransport):
    """An `httpx.AsyncBaseTransport`: HTTP/1.1 on h11 over trio streams, http and https, with a keep-alive pool
    per origin. TLS trusts what httpx trusts by default (`httpx.create_ssl_context()`: certifi, or the
    SSL_CERT_FILE / SSL_CERT_DIR of the environment), hostnames checked. Timeouts are the request's (httpx's
    connect, read, write and pool)."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        idle_expiry: float = IDLE_EXPIRY,
    ) -> None:
        self._ssl_context = ssl_context
        self._max_connections = max_connections
        self._idle_expiry = idle_expiry
        self._pools: dict[Origin, _Pool] = {}
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        origin = _origin_of(request.url)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        pool = self._pools.setdefault(origin, _Pool(trio.Semaphore(self._max_connections)))
        try:
            pool.slots.acquire_nowait()  # no trip through the scheduler when a place is free (the I/O checkpoints)
        except trio.WouldBlock:
            what = f"waiting for a connection to {origin[1]}"
            with _deadline(request, timeouts.get("pool"), httpx.PoolTimeout, what):
                await pool.slots.acquire()
        connection: _Connection | None = None
        try:
            connection = self._idle_connection(pool) or await self._connect(origin, request, timeouts.get("connect"))
            await _send_request(connection, request, timeouts.get("write"))
            head = await _response_head(connection, request, timeouts.get("read"))
        except BaseException:
            if connection is not None:
                connection.close()
            pool.slots.release()
            raise
        return httpx.Response(
            status_code=head.status_code,
            headers=head.headers.raw_items(),
            stream=_ResponseBody(self, pool, connection, request, timeouts.get("read")),
            extensions={"http_version": b"HTTP/" + head.http_version, "reason_phrase": head.reason},
        )

    async def aclose(self) -> None:
        self._closed = True
        for pool in self._pools.values():
            while pool.idle:
                pool.idle.pop().close()

    def release(self, pool: _Pool, connection: _Connection, reusable: bool) -> None:
        """A response's body is done with its connection: idle in the pool when `reusable`, else closed."""
        if reusable and not self._closed:
            connection.h11.start_next_cycle()
            connection.idle_since = trio.current_time()
            pool.idle.append(connection)
        else:
            connection.close()
        pool.slots.release()

    def _idle_connection(self, pool: _Pool) -> _Connection | None:
        """The most recently used idle connection still fit for a request; the others expired or closed are shut."""
        oldest_kept = trio.current_time() - self._idle_expiry
        while pool.idle and pool.idle[0].idle_since < oldest_kept:
            pool.idle.pop(0).close()
        while pool.idle:
            connection = pool.idle.pop()
            if not connection.spoken_to_while_idle():
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin, request: httpx.Request, seconds: float | None) -> _Connection:
        scheme, host, port = origin
        what = f"connecting to {host}:{port}"
        with _deadline(request, seconds, httpx.ConnectTimeout, what), _failures(request, httpx.ConnectError, what):
            tcp = await trio.open_tcp_stream(host, port)
            if scheme == "http":
                return _Connection(tcp, tcp.socket, origin)
            tls = trio.SSLStream(tcp, self._tls_context(), server_hostname=host, https_compatible=True)
            try:
                await tls.do_handshake()
            except BaseException:
                tcp.socket.close()
                raise
            return _Connection(tls, tcp.socket, origin)

    def _tls_context(self) -> ssl.SSLContext:
        if self._ssl_context is None:  # made at the first https connection: loading the trust store takes a while
            self._ssl_context = httpx.create_ssl_context()
        return self._ssl_context


class _ResponseBody(httpx.AsyncByteStream):
    """A response's body, read from its connection as it is iterated; the connection goes back to the pool once the
    body is complete, and is closed if the body is abandoned or fails."""

    def __init__(
        self,
        transport: TrioH11Transport,
        pool: _Pool,
        connection: _Connection,
        request: httpx.Request,
        read_timeout: float | None,
    ) -> None:
        self._transport = transport
        self._pool = pool
        self._connection = connection
        self._request = request
        self._read_timeout = read_timeout
        self._done = False

    def __aiter__(self) -> _ResponseBody:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        try:
            event = await _next_event(self._connection, self._request, self._read_timeout)
        except BaseException:
            self._finish(reusable=False)
            raise
        if isinstance(event, h11.Data):
            return bytes(event.data)
        self._finish(reusable=isinstance(event, h11.EndOfMessage) and self._connection.finished_cleanly())
        if isinstance(event, h11.EndOfMessage):
            raise StopAsyncIteration
        raise httpx.RemoteProtocolError(
            f"{self._connection.name} closed the connection in the middle of a response", request=self._request
        )

    async def aclose(self) -> None:
        if not self._done:
            self._finish(reusable=False)

    def _finish(self, reusable: bool) -> None:
        self._done = True
        self._transport.release(self._pool, self._connection, reusable)


def _origin_of(url: httpx.URL) -> Origin:
    if url.scheme not in DEFAULT_PORTS:
        raise httpx.UnsupportedProtocol(f"connect's HTTP client speaks http and https, not {url.scheme!r}")
    host = url.raw_host.decode("ascii")
    return url.scheme, host, url.port or DEFAULT_PORTS[url.scheme]


async def _send_request(connection: _Connection, request: httpx.Request, seconds: float | None) -> None:
    """The request's head and body in one write when the body is small, in pieces of `SEND_SIZE` when not."""
    assert isinstance(request.stream, httpx.AsyncByteStream)
    with _failures(request, httpx.WriteError, f"sending to {connection.name}"):
        head = h11.Request(method=request.method, target=request.url.raw_path, headers=request.headers.raw)
        pending = bytearray(connection.h11.send(head) or b"")
        async for chunk in request.stream:
            pending += connection.h11.send(h11.Data(data=chunk)) or b""
            if len(pending) >= SEND_SIZE:
                await _write(connection, bytes(pending), request, seconds)
                pending.clear()
        pending += connection.h11.send(h11.EndOfMessage()) or b""
    await _write(connection, bytes(pending), request, seconds)


async def _write(connection: _Connection, data: bytes, request: httpx.Request, seconds: float | None) -> None:
    what = f"sending to {connection.name}"
    with _deadline(request, seconds, httpx.WriteTimeout, what), _failures(request, httpx.WriteError, what):
        await connection.stream.send_all(data)


async def _response_head(connection: _Connection, request: httpx.Request, seconds: float | None) -> h11.Response:
    """The response's status line and headers (an informational 1xx skipped)."""
    while True:
        event = await _next_event(connection, request, seconds)
        if isinstance(event, h11.Response):
            return event
        if not isinstance(event, h11.InformationalResponse):
            raise httpx.RemoteProtocolError(f"{connection.name} closed the connection without a response")


async def _next_event(connection: _Connection, request: httpx.Request, seconds: float | None) -> Any:
    """The next h11 event of the response, reading from the connection (each read within `seconds`) as needed."""
    what = f"reading the response from {connection.name}"
    while True:
        with _failures(request, httpx.ReadError, what):
            event = connection.h11.next_event()
        if event is not h11.NEED_DATA:
            return event
        with _deadline(request, seconds, httpx.ReadTimeout, what), _failures(request, httpx.ReadError, what):
            connection.h11.receive_data(bytes(await connection.stream.receive_some(READ_SIZE)))


@contextmanager
def _deadline(
    request: httpx.Request, seconds: float | None, too_slow: type[httpx.TimeoutException], what: str
) -> Iterator[None]:
    """The block within `seconds` (None: no limit), or httpx's `too_slow`."""
    try:
        with trio.fail_after(math.inf if seconds is None else seconds):
            yield
    except trio.TooSlowError:
        raise too_slow(f"{what}: no progress within {seconds} s", request=request) from None


@contextmanager
def _failures(request: httpx.Request, failed: type[httpx.TransportError], what: str) -> Iterator[None]:
    """The network's and h11's errors in the block as httpx's: `failed`, or a protocol error."""
    try:
        yield
    except h11.RemoteProtocolError as error:
        raise httpx.RemoteProtocolError(f"{what}: {error}", request=request) from error
    except h11.LocalProtocolError as error:
        raise httpx.LocalProtocolError(f"{what}: {error}", request=request) from error
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as error:
        reason = error.__cause__ or error
        raise failed(f"{what}: {type(reason).__name__}: {reason}", request=request) from error


@contextmanager
def whole_request_within(seconds: float) -> Iterator[None]:
    """The block (a request, and the reading of its answer) within `seconds` in all, else httpx's `ReadTimeout`,
    an `httpx.HTTPError` the connectors already treat as the platform being unavailable. httpx's timeouts (and this
    transport's) are per read: a server or a proxy sending a byte now and then would hold a request, and the bot,
    for good. Each connector chooses the seconds of its calls where it defines them."""
    try:
        with trio.fail_after(seconds):
            yield
    except trio.TooSlowError:
        raise httpx.ReadTimeout(f"the request was not answered whole within {seconds} s") from None


def chat_http_client(timeout: float = 60.0) -> httpx.AsyncClient:
    """connect's client for every platform: httpx over `TrioH11Transport`.

    httpx reads the environment's proxies (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY) only for a client without
    a transport of its own. So where the environment names a proxy, the client is httpx's own, which applies them
    by its rules; the lean transport is for the direct path, the one row 32 measures."""
    if any(scheme in getproxies() for scheme in ("http", "https", "all")):
        return httpx.AsyncClient(timeout=httpx.Timeout(timeout))
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout), transport=TrioH11Transport())


__all__ = ["TrioH11Transport", "chat_http_client", "whole_request_within"]
