"""`serve --listen HOST:PORT`: the network door on hypercorn, with serve's shutdown (docs/network.md).

Rules checked before anything binds:
- Without tokens, only a loopback address: anyone who can reach a public
  port could otherwise run agents. A public address without `--tokens`
  raises `ListenError` naming the fix.
- The `http` extra must be installed; else `ListenError` names it (`extra`, checked before this module
  is imported: importing it imports the extra's libraries).

Behind a fleet gateway, results an earlier gateway of the same name could not
send stay in the queue for a serve on stdin/stdout of that name (whose bot
comes back for them); the door only says how many wait.

Shutdown drains as stdin/stdout serve does: SIGTERM or SIGINT stops new turns
(`shutting_down`), lets those in flight finish within the grace, then closes
the listener; a second signal cancels every turn at once.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import resource
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import trio

from ..confinement.orphans import sweep_orphans_on_sigchld
from ..errors import ListenError
from ..host.interface import BaseHost
from ..log import get_logger
from .door import Door, DoorLimits
from .tokens import Tokens

if TYPE_CHECKING:
    from hypercorn.trio.worker_context import WorkerContext
    from starlette.applications import Starlette

MAX_REQUEST_HEAD_BYTES = 64 * 1024  # a request line and its headers (docs/network.md)
KEEP_ALIVE_SECS = 15  # an idle connection's life, and the time a request's line and headers have to come
# Descriptors kept from the door's connections for the rest of serve: its turns' agents' pipes, the store, the logs.
DESCRIPTORS_BESIDE_CONNECTIONS = 512


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    @property
    def bind(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_address(text: str, *, option: str = "--listen") -> Address:
    """`HOST:PORT` (`[::1]:8080` for IPv6); raises `ListenError` naming what is wrong (and `option`)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ListenError(f"{option} {text!r}: give HOST:PORT, such as 127.0.0.1:8080 or [::1]:8080")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return Address(host, int(port))


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback address (a name is resolved)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_listen(address: Address, tokens: Tokens | None) -> None:
    if tokens is None and not is_loopback(address.host):
        raise ListenError(
            f"--listen {address.bind} is not a loopback address and serve has no --tokens: anyone who can reach "
            "it could run agents. Give --tokens FILE, or listen on 127.0.0.1"
        )


def contain_connection_errors() -> None:
    """Make hypercorn's trio server end only the connection whose handling raised, never the whole server.

    hypercorn runs each accepted connection as a `TCPServer` in the server's nursery: an exception escaping
    one (h11's `LocalProtocolError` when it answers a WebSocket upgrade followed by other bytes, a protocol
    error in a task of the connection) would cancel every other connection and end serve. hypercorn's trio
    `worker_serve` names the class through its module, `hypercorn.trio.run.TCPServer`, and offers no other
    seam for it: this replaces that name by `ContainedTCPServer` (tests/test_network_hardening.py fails if
    hypercorn stops looking the class up there). Idempotent.
    """
    from importlib.metadata import version

    from hypercorn.trio import run

    server_class = getattr(run, "TCPServer", None)
    if server_class is _contained_tcp_server_class():
        return
    if not isinstance(server_class, type) or server_class.__name__ != "TCPServer":
        raise ListenError(
            f"hypercorn {version('hypercorn')} no longer runs its connections as hypercorn.trio.run.TCPServer, "
            "which the door wraps so that one connection's error cannot end serve: install hypercorn 0.18 "
            "(pip install 'hypercorn==0.18.*'), and report this version to agent-bridge"
        )
    setattr(run, "TCPServer", _contained_tcp_server_class())  # noqa: B010 (an attribute of another module)


def sockets_within_descriptors(wanted: int) -> int:
    """How many TCP connections the door may hold: `wanted`, or fewer when the descriptor limit (RLIMIT_NOFILE)
    cannot hold them and `DESCRIPTORS_BESIDE_CONNECTIONS` more, even raised to its hard limit (as it is, as far as
    needed). Connections past it are closed unread, so clients cannot take the descriptors turns need."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + DESCRIPTORS_BESIDE_CONNECTIONS
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        if raised > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    room = max(soft - DESCRIPTORS_BESIDE_CONNECTIONS, soft // 2)
    get_logger(component="network").warning(
        "the descriptor limit leaves room for fewer connections than the door would hold; the door holds no more "
        "than fit: raise the hard limit (ulimit -Hn, systemd's LimitNOFILE=) or lower --max-connections",
        descriptor_limit=soft,
        connections=room,
        wanted=wanted,
    )
    return room


class SocketBudget:
    """The TCP connections a listener holds open, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def take(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        self.open -= 1


class _ConnectionContext:
    """hypercorn's worker context as one connection sees it: its sleeps (a WebSocket's pings, every
    `websocket_ping_interval`) end once the peer has gone. hypercorn's ping loop looks whether the WebSocket is
    closed only between sleeps: it would otherwise hold the connection, its place in the socket budget and serve's
    shutdown up to a whole interval after the client left. Everything else is the worker's context."""

    def __init__(self, worker: Any, peer_gone: trio.Event) -> None:
        self._worker = worker
        self._peer_gone = peer_gone

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)

    async def sleep(self, wait: float) -> None:
        with trio.move_on_after(wait):
            await self._peer_gone.wait()


@functools.cache
def _contained_tcp_server_class() -> type:
    from hypercorn.trio.tcp_server import TCPServer

    class ContainedTCPServer(TCPServer):
        """A hypercorn connection whose errors are logged (their type only: never what the client sent) and end
        it alone; its ASGI tasks (a WebSocket's, a turn stream's) are cancelled with it. Under a config with a
        `socket_budget`, a connection past it is closed before a byte is read. Overrides hypercorn's `__init__`,
        `run` and `_read_data`: tests/test_network_hardening.py fails if any stops doing its part."""

        def __init__(self, app: Any, config: Any, context: Any, state: Any, stream: Any) -> None:
            self._peer_gone = trio.Event()
            connection_context = cast("WorkerContext", _ConnectionContext(context, self._peer_gone))  # a stand-in
            super().__init__(app, config, connection_context, state, stream)

        async def run(self) -> None:
            budget: SocketBudget | None = getattr(self.config, "socket_budget", None)
            if budget is not None and not budget.take():
                await trio.aclose_forcefully(self.stream)
                return
            try:
                await super().run()
            except* Exception as errors:
                get_logger(component="network").warning(
                    "a connection's handling failed; closed that connection",
                    errors=sorted({type(error).__name__ for error in errors.exceptions}),
                )
                await trio.aclose_forcefully(self.stream)  # no goodbye to a connection in an unknown state
            finally:
                if budget is not None:
                    budget.give_back()

        async def _read_data(self) -> None:
            await super()._read_data()
            # The peer has ended the connection: no request can come any more. hypercorn would wait out the
            # keep-alive timer of an idle connection (and a WebSocket's ping interval) before it lets it go,
            # holding its place in the budget.
            self._peer_gone.set()
            await self.idle_task.stop()

    return ContainedTCPServer


class RequestHeadLimit:
    """ASGI middleware: a request whose line and headers are over `MAX_REQUEST_HEAD_BYTES` gets 431 (a WebSocket
    handshake is refused), before the application sees it.

    h11 refuses a head only while it is incomplete and past its limit, and hypercorn feeds it 64 KiB at a time:
    a head that comes complete in the second read would pass up to twice the limit. The head is measured as
    parsed (h11 drops the spaces around header values).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and _head_bytes(scope) > MAX_REQUEST_HEAD_BYTES:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1009})
                return
            body = b'{"type": "error", "id": null, "code": "request_too_large", "message": "the request line and '
            body += b'headers are longer than %d bytes"}' % MAX_REQUEST_HEAD_BYTES
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            await send({"type": "http.response.start", "status": 431, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def _head_bytes(scope: Any) -> int:
    """The length of a request's line and headers as h11 parsed them (`METHOD target HTTP/1.1`, `name: value`)."""
    method: str = scope.get("method", "GET")
    target = len(scope.get("raw_path") or b"") + (len(scope["query_string"]) + 1 if scope.get("query_string") else 0)
    line = len(method) + 1 + target + len(" HTTP/1.1\r\n")
    return line + sum(len(name) + 2 + len(value) + 2 for name, value in scope["headers"]) + 2


def hypercorn_config(address: Address, *, certfile: str | None, keyfile: str | None, limits: DoorLimits) -> Any:
    from hypercorn.config import Config, Sockets

    class DoorConfig(Config):
        socket_budget: SocketBudget | None = None  # ContainedTCPServer's

        def create_sockets(self) -> Sockets:
            """The listening sockets, with TCP_USER_TIMEOUT: a connection whose peer takes no data for the send
            timeout is aborted by the kernel. Accepted connections inherit it. hypercorn shields its writes from
            cancellation, so this is what ends a write to a client that stopped reading."""
            sockets = super().create_sockets()
            milliseconds = min(int(limits.stall_secs * 1000), 2**31 - 1)
            for sock in [*sockets.secure_sockets, *sockets.insecure_sockets]:
                if sock.family in (socket.AF_INET, socket.AF_INET6) and hasattr(socket, "TCP_USER_TIMEOUT"):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, milliseconds)
            return sockets

    config = DoorConfig()
    config.socket_budget = SocketBudget(limits.max_sockets)
    config.bind = [address.bind]
    # A burst of connections the door would take waits in the kernel's queue for its accept, not dropped there
    # for the client to send its SYN again a second later (hypercorn's default queue holds 100).
    config.backlog = limits.max_sockets
    config.accesslog = None  # a request's path names turns: the bridge logs what it needs itself
    config.errorlog = None
    config.websocket_max_message_size = limits.max_body_bytes
    # hypercorn speaks HTTP/2 too (ALPN, or its preface on the plain port): one stream at a time on a connection,
    # as HTTP/1.1 has, or each TCP connection the socket budget counts could carry 100 bodies being read.
    config.h2_max_concurrent_streams = 1
    config.h11_max_incomplete_size = MAX_REQUEST_HEAD_BYTES  # the rest of the limit: RequestHeadLimit
    config.keep_alive_timeout = KEEP_ALIVE_SECS  # hypercorn restarts it only once a request's head has come
    config.websocket_ping_interval = 30.0  # a peer gone without a word is noticed
    config.graceful_timeout = 2.0
    config.ssl_handshake_timeout = KEEP_ALIVE_SECS  # a TLS connection's handshake, as a request's head, comes soon
    if certfile or keyfile:
        if not (certfile and keyfile):
            raise ListenError("TLS needs both --certfile and --keyfile")
        config.certfile, config.keyfile = certfile, keyfile
        try:
            config.create_ssl_context()
        except (OSError, ValueError) as err:  # ssl.SSLError is an OSError: a file that is no PEM, a key not the cert's
            problem = f"{err.filename}: {err.strerror}" if isinstance(err, OSError) and err.filename else str(err)
            raise ListenError(
                f"TLS: --certfile {certfile!r} and --keyfile {keyfile!r} do not load as a PEM certificate chain and "
                f"its private key ({problem})"
            ) from None
    return config


async def serve_network(
    host: BaseHost,
    address: Address,
    *,
    tokens: Tokens | None,
    limits: DoorLimits,
    certfile: str | None = None,
    keyfile: str | None = None,
    extra_routes: Callable[[Door], list[Any]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Serve `host` on `address` until SIGTERM or SIGINT (or the task is cancelled); returns the exit code.

    `task_status.started` gets the URLs it listens on (a port of 0 picks a free one).
    """
    from hypercorn.trio import serve

    check_listen(address, tokens)
    config = hypercorn_config(address, certfile=certfile, keyfile=keyfile, limits=limits)
    config.socket_budget = SocketBudget(sockets_within_descriptors(limits.max_sockets))
    door = Door(host, tokens, limits)
    app = door_app(door, extra_routes=extra_routes(door) if extra_routes else None)
    stop_listening = trio.Event()
    async with trio.open_nursery() as nursery:
        door.open(nursery)
        try:
            await nursery.start(_shut_down_on_signals, host, stop_listening)
            await nursery.start(sweep_orphans_on_sigchld)
            await _say_what_waits_for_stdin_serve(host)
            async with trio.open_nursery() as server:  # ends once hypercorn has closed its connections
                urls: list[str] = await server.start(serve_app, serve, app, config, stop_listening.wait)
                who = f"{len(tokens)} tokens" if tokens else "no tokens: loopback clients only"
                print(f"agent-bridge serve: listening on {' '.join(urls)} ({who})", file=sys.stderr, flush=True)
                if tokens is None:
                    _say_every_local_process_may_come_in()
                task_status.started(urls)
        finally:
            door.close()
        nursery.cancel_scope.cancel()
    return 0


def door_app(door: Door, *, extra_routes: list[Any] | None = None) -> Starlette:
    """Everything the door serves: health and readiness for anyone; serve's endpoints (with `extra_routes`) and
    the OpenAI-compatible ones, each an application behind its own `TenantGate`, which refuses a request
    without a valid token in that application's own words."""
    from starlette.applications import Starlette

    from .app import health_routes, serve_app
    from .auth import OwnPaths
    from .openai_api import openai_app

    app = Starlette(
        routes=[
            *health_routes(),
            OwnPaths("", app=serve_app(door, extra_routes=extra_routes)),
            OwnPaths("", app=openai_app(door)),
        ]
    )
    app.state.door = door
    return app


def _say_every_local_process_may_come_in() -> None:
    get_logger(component="network").warning(
        "the door has no --tokens: any process on this machine can run every profile through it, a sandboxed "
        "agent with the default `network: true` included; give --tokens FILE to say who may",
    )


async def _say_what_waits_for_stdin_serve(host: BaseHost) -> None:
    """Results an earlier gateway of this name accepted but could not send are left in the queue: they are a
    stdin/stdout serve's bot's (only it comes back for results), and marking them delivered would lose them."""
    waiting = await host.undelivered()
    if waiting:
        get_logger(component="network").warning(
            "results an earlier gateway of this name could not send wait in the queue; the network door has no "
            "client to send them to: `agent-bridge serve --postgres DSN --name NAME` on stdin/stdout sends them",
            waiting=len(waiting),
        )


async def serve_app(
    serve: Callable[..., Awaitable[None]],
    app: Any,
    config: Any,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    *,
    option: str = "--listen",
) -> None:
    """hypercorn's `serve` of `app` (the door's, or a worker's metrics), each connection's errors its own, and
    request heads held to `MAX_REQUEST_HEAD_BYTES`. An address it cannot listen on raises `ListenError` naming
    `option`."""
    contain_connection_errors()
    try:
        await serve(RequestHeadLimit(app), config, shutdown_trigger=shutdown_trigger, task_status=task_status)
    except* OSError as errors:  # hypercorn binds in a nursery of its own: the error comes in a group
        raise ListenError(_cannot_listen(option, config.bind[0], _first_leaf(errors))) from None


def _cannot_listen(option: str, bind: str, error: BaseException) -> str:
    """What to tell the operator when binding `bind` failed with `error`."""
    where = f"{option} {bind}"
    code = error.errno if isinstance(error, OSError) else None
    if code == errno.EADDRINUSE:
        return f"{where}: the address is in use; stop what listens there, or give another port"
    if code == errno.EACCES:
        port = bind.rpartition(":")[2]
        if port.isdigit() and int(port) < 1024:
            return (
                f"{where}: permission denied: a port below 1024 needs root or CAP_NET_BIND_SERVICE; give a port "
                "of 1024 or above"
            )
        return f"{where}: permission denied"
    if code == errno.EADDRNOTAVAIL:
        return f"{where}: no network interface of this machine has that address; give one of its addresses"
    if isinstance(error, socket.gaierror):
        return f"{where}: the host name does not resolve ({error.strerror}); give an address or a name that resolves"
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return f"{where}: cannot listen: {reason}"


def _first_leaf(group: BaseExceptionGroup[OSError]) -> OSError:
    error: OSError | BaseExceptionGroup[OSError] = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def _shut_down_on_signals(
    host: BaseHost, stop_listening: trio.Event, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """SIGTERM or SIGINT: stop taking turns, drain those in flight, then stop listening; a second one cancels all."""
    log = get_logger(component="network")
    draining = False

    async def drain() -> None:
        try:
            await host.aclose()
        finally:
            stop_listening.set()

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async with trio.open_nursery() as nursery:
            async for signum in signals:
                log.info("signal received; shutting down", signal=signal.Signals(signum).name)
                if draining:
                    host.cancel_all()
                    continue
                draining = True
                host.stop_accepting()
                nursery.start_soon(drain)
