"""`agent-bridge serve`: the host runtime as a sidecar speaking JSON Lines on stdin/stdout.

A bot in any language starts one `serve` process and writes one JSON request
per line; every response is one JSON line tagged with the request's id. The
protocol is documented in docs/serve.md; its requests and their handling live
in `bridge.serving`, shared with the network door (`serve --listen`).

`Server` speaks the protocol over any pair of trio streams, so it is tested in
process; `serve_stdio` wires it to the process's stdin/stdout and signals.
"""

from __future__ import annotations

import argparse
import os
import signal
import stat
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..confinement.orphans import sweep_orphans_on_sigchld
from ..dialects import LineSplitter
from ..engine.run import ungrouped
from ..host.interface import BaseHost, ClientSessionIds
from ..host.runtime import DEFAULT_MAX_CONCURRENT, DEFAULT_MAX_QUEUED, DEFAULT_SHUTDOWN_GRACE, open_host
from ..log import get_logger
from ..serving.file_delivery import DEFAULT_FILE_TTL, FileDeliveries
from ..serving.output import Output, json_line, watch_for_hang_up
from ..serving.requests import MAX_REQUEST_BYTES, REQUEST_TOO_LARGE
from ..serving.session import ClientSession

READ_CHUNK = 64 * 1024


class Server:
    """One serve session: reads requests from `input`, runs turns on `host`, answers on `output`."""

    def __init__(
        self,
        host: BaseHost,
        input: trio.abc.ReceiveStream,
        output: trio.abc.SendStream,
        *,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        file_ttl: float = DEFAULT_FILE_TTL,
    ) -> None:
        self.host = host
        self._file_ttl = file_ttl
        self._input = input
        self.output: Output[bytes] = Output(output.send_all, json_line, self._client_gone)
        self._max_request_bytes = max_request_bytes
        self._client: ClientSession | None = None
        self._receive_scope: trio.CancelScope | None = None
        self._stop_reading = False
        self._shutdown_started = False
        self._shutdown_done = trio.Event()
        self._system: trio.Nursery | None = None
        self._log = get_logger(component="serve")

    async def run(self) -> None:
        """Serve until EOF on input (or `request_shutdown()`), then shut down gracefully.

        Returns once every accepted turn has been answered with its result.
        """
        async with trio.open_nursery() as system:
            self._system = system
            files = FileDeliveries(system, self._file_ttl)
            await system.start(self.output.run)
            try:
                async with trio.open_nursery() as turns:
                    self._client = client = ClientSession(self.host, self.output.send, files, turns)
                    for turn_id, request_id in await self.host.undelivered():  # accepted by a serve that stopped
                        turns.start_soon(client.follow, turn_id, request_id)
                    await self._read_requests(client)
                    self._begin_shutdown()
                    await self._shutdown_done.wait()
                await self.output.close()
            finally:
                files.close()  # the bot is gone: no file it did not take is left behind
            system.cancel_scope.cancel()

    def request_shutdown(self) -> None:
        """Stop taking turns, finish (or, after the grace, cancel) those in flight, then stop reading.

        Requests keep being read meanwhile: a client may still cancel a turn
        or ask for stats. Calling it again cancels every turn at once.
        """
        if self._shutdown_started:
            self._log.warning("asked again to shut down; cancelling every turn now")
            self.host.cancel_all()
            return
        self._begin_shutdown()

    def _begin_shutdown(self) -> None:
        if self._shutdown_started:
            return
        self._shutdown_started = True
        self.host.stop_accepting()
        assert self._system is not None
        self._system.start_soon(self._shut_down)

    async def _shut_down(self) -> None:
        try:
            await self.host.aclose()
        finally:
            self._stop_reading = True
            if self._receive_scope is not None:
                self._receive_scope.cancel()
            self._shutdown_done.set()

    def _client_gone(self) -> None:
        self._log.warning("the client stopped reading responses; cancelling every turn")
        self._begin_shutdown()
        self.host.cancel_all()

    async def _read_requests(self, client: ClientSession) -> None:
        lines = LineSplitter(self._max_request_bytes)
        while not self._stop_reading:
            with trio.CancelScope() as scope:
                self._receive_scope = scope
                try:
                    data = await self._input.receive_some(READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as err:
                    self._log.warning("cannot read requests; shutting down", error=str(err))
                    data = b""
            self._receive_scope = None
            if scope.cancelled_caught:
                return
            batch = lines.feed(data) if data else lines.close()
            for index, line in enumerate(batch.text):
                if index in batch.cut:
                    await client.error(
                        None,
                        REQUEST_TOO_LARGE,
                        f"a request line is longer than {self._max_request_bytes} bytes; it was discarded",
                    )
                else:
                    await client.handle_text(line)
            if not data:
                return


async def serve_stdio(host: BaseHost, *, file_ttl: float = DEFAULT_FILE_TTL) -> int:
    """Serve on this process's stdin/stdout until EOF, SIGTERM or SIGINT; returns the exit code.

    File descriptor 1 is pointed at stderr once the protocol has its own copy
    of it, so nothing but protocol lines can reach the client's stdout.
    """
    protocol_out = os.dup(1)
    os.dup2(2, 1)
    stdin = _input_stream(os.dup(0))
    # FdStream makes the descriptions non-blocking; both ends are the client's pipes (stderr,
    # which may share a terminal with them, must stay apart from stdout for the protocol anyway).
    stdout = trio.lowlevel.FdStream(protocol_out)
    server = Server(host, stdin, stdout, file_ttl=file_ttl)
    async with stdin, stdout, trio.open_nursery() as nursery:
        await nursery.start(_shut_down_on_signals, server)  # handlers in place before any agent starts
        await nursery.start(sweep_orphans_on_sigchld)
        nursery.start_soon(watch_for_hang_up, protocol_out, server.output)
        await server.run()
        nursery.cancel_scope.cancel()
    return 1 if server.output.broken else 0


def _input_stream(fd: int) -> trio.abc.ReceiveStream:
    """A pipe, socket or terminal is read through trio's I/O loop; a file (`serve < requests.jsonl`),
    which epoll cannot watch, by blocking reads in a worker thread."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd):
        return trio.lowlevel.FdStream(fd)
    return _FileStream(fd)


class _FileStream(trio.abc.ReceiveStream):
    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._fd < 0:
            raise trio.ClosedResourceError
        return await trio.to_thread.run_sync(os.read, self._fd, max_bytes or READ_CHUNK, abandon_on_cancel=True)

    async def aclose(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        await trio.lowlevel.checkpoint()


async def _shut_down_on_signals(server: Server, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """SIGTERM or SIGINT: graceful shutdown; a second one cancels every turn at once."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            get_logger(component="serve").info("signal received; shutting down", signal=signal.Signals(signum).name)
            server.request_shutdown()


def run_serve(
    profiles: str | os.PathLike[str] | None,
    *,
    state: str | os.PathLike[str] | None = None,
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    max_queued: int = DEFAULT_MAX_QUEUED,
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
    postgres: str | None = None,
    name: str = "serve",
    namespace: str | None = None,
    session_ids: ClientSessionIds = "stored",
    file_ttl: float = DEFAULT_FILE_TTL,
    attachment_hosts: tuple[str, ...] = (),
    door: dict[str, Any] | None = None,
) -> int:
    """`agent-bridge serve`: returns the exit code (0 after a graceful shutdown).

    A profiles directory that cannot be read or a store that cannot be opened
    raises a `BridgeError` before anything is read. With `postgres`, serve is
    a gateway to the workers of that database (`name`: see `RemoteHost`);
    else `namespace` is that of a PostgreSQL `state`. `session_ids`: the
    host's `client_session_ids`. `file_ttl`: seconds a file an agent left waits for the bot's `ack_file`.
    `attachment_hosts`: the host's exceptions to the attachments' address rule.
    `door`: serve over the network instead (`listen`, and `tokens`, `certfile`, `keyfile`, `max_connections`,
    `max_turns_per_connection`, `send_timeout`, `body_timeout`: the CLI's options of those names).
    """
    listening = _network_door(door, file_ttl) if door is not None else None
    from ..confinement.orphans import become_subreaper, log_containment

    become_subreaper()  # this process is ours: killed grandchildren get reaped here
    log_containment(get_logger(component="serve"))

    async def main() -> int:
        host = open_host(
            profiles,
            state=state,
            max_concurrent=max_concurrent,
            max_queued=max_queued,
            shutdown_grace=shutdown_grace,
            postgres=postgres,
            gateway_name=name,
            namespace=namespace,
            client_session_ids=session_ids,
            attachment_hosts=attachment_hosts,
        )
        async with host:
            if listening is not None:
                return await listening(host)
            return await serve_stdio(host, file_ttl=file_ttl)

    with ungrouped():  # a BridgeError at start (the door's port in use…) reaches the CLI as itself
        return trio.run(main)


def _network_door(options: dict[str, Any], file_ttl: float) -> Callable[[BaseHost], Awaitable[int]]:
    """Check the network door's options before anything opens; returns what serves a host through it."""
    from ..network.extra import require_http_extra

    require_http_extra()  # before the door's modules, which import its libraries
    from ..network.door import DoorLimits
    from ..network.listen import check_listen, hypercorn_config, parse_address, serve_network
    from ..network.tokens import load_tokens

    address = parse_address(options["listen"])
    tokens = load_tokens(options["tokens"]) if options.get("tokens") else None
    check_listen(address, tokens)
    defaults = DoorLimits()
    limits = DoorLimits(
        max_connections=options.get("max_connections", defaults.max_connections),
        max_turns_per_connection=options.get("max_turns_per_connection", defaults.max_turns_per_connection),
        stall_secs=options.get("send_timeout", defaults.stall_secs),
        body_secs=options.get("body_timeout", defaults.body_secs),
        file_ttl=file_ttl,
    )
    # The certificate and key load now: a gateway must not take its name, nor serve open its store, for nothing.
    hypercorn_config(address, certfile=options.get("certfile"), keyfile=options.get("keyfile"), limits=limits)

    async def listening(host: BaseHost) -> int:
        return await serve_network(
            host,
            address,
            tokens=tokens,
            limits=limits,
            certfile=options.get("certfile"),
            keyfile=options.get("keyfile"),
        )

    return listening


def serve_command(args: argparse.Namespace) -> int:
    if args.profiles is None and args.postgres is None:
        args.command_parser.error("serve needs --profiles DIR (or --postgres DSN, to be a gateway to workers)")
    if args.postgres is not None and args.namespace is not None:
        args.command_parser.error("a gateway's namespace is its --name: use --name instead of --namespace")
    if args.postgres is not None and args.attachment_hosts:
        args.command_parser.error(
            "a gateway fetches no attachments, its workers do: give --allow-attachment-host to agent-bridge worker"
        )
    door_options = (
        "tokens",
        "certfile",
        "keyfile",
        "max_connections",
        "max_turns_per_connection",
        "send_timeout",
        "body_timeout",
    )
    if args.listen is None and (given := [name for name in door_options if getattr(args, name) is not None]):
        args.command_parser.error(f"--{given[0].replace('_', '-')} is an option of the network door: add --listen")
    limits = {
        name: value
        for name in ("max_concurrent", "max_queued", "shutdown_grace", "file_ttl")
        if (value := getattr(args, name)) is not None
    }
    if args.listen is not None:
        limits["door"] = {name: value for name in door_options if (value := getattr(args, name)) is not None} | {
            "listen": args.listen
        }
    return run_serve(
        args.profiles,
        state=args.state,
        postgres=args.postgres,
        name=args.name,
        namespace=args.namespace,
        session_ids=args.session_ids,
        attachment_hosts=tuple(args.attachment_hosts),
        **limits,
    )
