"""Rows 25–28, the network door (issue 23): real `agent-bridge serve` processes, stdin/stdout against `--listen`.

`make bench` runs these samples in its workers (case `network`); alone, from the repository, one of each:

    bench/.venv/bin/python bench/network.py

- `turn`: one `serve --profiles` on stdin/stdout and one `serve --profiles --listen 127.0.0.1:0`, the same echo
  agent (sample_agents/echo.sh) behind both; turn by turn, the order rotating, a turn through stdin/stdout, `POST
  /v1/turns` as Server-Sent Events, `POST /v1/turns` as JSON, and WebSocket `/v1/ws`, each timed from writing the
  request to reading its `result`. The clients are written here on bare sockets and pipes (HTTP/1.1 keep-alive with
  chunked bodies, RFC 6455 frames), so they add little of their own, and they do the same work: one `json.dumps`
  per request, one `json.loads` per response, on each transport's framing.
- `latency`: agents/ticker.py through one serve (`transport` stdin, sse or ws), the client taking the clock when
  a read returns and subtracting the time the agent wrote into each partial, as row 4 does in-process.
- `idle`: 1,000 WebSocket connections opened to one listening serve and left idle; its RSS (VmRSS, and its peak
  VmHWM) from /proc with them open, while a turn on one more connection still completes.
"""

from __future__ import annotations

import base64
import json
import os
import re
import resource
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from worker import ECHO_AGENT, Invalid, check_echo, die_with_parent, expect  # noqa: E402  (bench/ is a directory of scripts)

clock_ns = time.perf_counter_ns
LISTENING = re.compile(rb"listening on http://([\d.]+):(\d+)")
TEXT, CLOSE, PING, PONG = 0x1, 0x8, 0x9, 0xA  # WebSocket opcodes


# --------------------------------------------------------------------------- the servers


class Serve:
    """One `agent-bridge serve --profiles DIR` process: on stdin/stdout, or (`listen`) on a port of loopback."""

    def __init__(self, profiles: str, state: str, *, listen: bool) -> None:
        argv = [sys.executable, "-m", "bridge", "serve", "--profiles", profiles, "--state", state]
        if listen:
            argv += ["--listen", "127.0.0.1:0"]
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if listen else sys.stderr,
            preexec_fn=die_with_parent,
        )
        self.port = 0
        if listen:
            self.port = self._port()

    def _port(self) -> int:
        """The port serve names on stderr; the rest of its stderr is copied to ours (a full pipe would block it)."""
        assert self.process.stderr is not None
        err = self.process.stderr
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = err.readline()
            if not line:
                raise Invalid(f"serve --listen exited {self.process.wait()} before it listened")
            sys.stderr.buffer.write(line)
            if found := LISTENING.search(line):
                threading.Thread(target=lambda: [sys.stderr.buffer.write(rest) for rest in err], daemon=True).start()
                return int(found.group(2))
        raise AssertionError("unreachable: readline blocks until serve writes")

    def rss_mb(self) -> tuple[float, float]:
        """Its resident set now (VmRSS) and at its peak (VmHWM), in MiB."""
        values = {}
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    values[line[:5]] = int(line.split()[1]) / 1024
        return values["VmRSS"], values["VmHWM"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@contextmanager
def servers(command: list[str], *, stdio: bool, listen: bool) -> Iterator[tuple[Serve | None, Serve | None]]:
    """Serves (stdin/stdout, listening) of one profile `agent` running `command`, each with a store of its own."""
    with tempfile.TemporaryDirectory() as directory:
        profiles = os.path.join(directory, "profiles")
        os.mkdir(profiles)
        with open(os.path.join(profiles, "agent.yaml"), "w") as file:
            json.dump({"command": command, "timeout_secs": 60, "max_reply_chars": None}, file)  # JSON is YAML
        started: list[Serve] = []
        try:
            plain = Serve(profiles, os.path.join(directory, "stdio.sqlite3"), listen=False) if stdio else None
            started += [plain] if plain else []
            network = Serve(profiles, os.path.join(directory, "net.sqlite3"), listen=True) if listen else None
            started += [network] if network else []
            yield plain, network
        finally:
            for serve in started:
                serve.stop()


# --------------------------------------------------------------------------- the clients


def turn_request(request_id: str, message: str) -> dict[str, Any]:
    return {"type": "turn", "id": request_id, "profile": "agent", "conversation": "chat", "message": message}


class Client:
    """One client of one serve: `send` a request, then `responses` yields (when its read returned, the response)."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def fd(self) -> int:
        raise NotImplementedError

    def send(self, request: dict[str, Any]) -> None:
        raise NotImplementedError

    def parse(self) -> Iterator[dict[str, Any]]:
        """The whole responses at the start of `self.buffer` (taken out of it)."""
        raise NotImplementedError

    def read(self, deadline: float) -> int:
        """Read what is there into the buffer (waiting until `deadline`); the clock when the read returned."""
        poll = select.poll()  # not select(): a thousand connections' descriptors go past FD_SETSIZE
        poll.register(self.fd(), select.POLLIN)
        expect(bool(poll.poll(max(0.0, deadline - time.monotonic()) * 1000)), "serve sent nothing before the deadline")
        chunk = os.read(self.fd(), 262144)
        arrived = time.monotonic_ns()
        expect(bool(chunk), "serve closed the connection")
        self.buffer += chunk
        return arrived

    def responses(self, within: float = 60.0) -> Iterator[tuple[int, dict[str, Any]]]:
        """Every response, up to and with the turn's `result`; an `error` ends the sample."""
        deadline = time.monotonic() + within
        while True:
            arrived = self.read(deadline)
            for response in self.parse():
                expect(response["type"] != "error", f"serve answered an error: {response}")
                yield arrived, response
                if response["type"] == "result":
                    return

    def result(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send a turn and read every response to the end of it; its `result`."""
        self.send(request)
        last: dict[str, Any] = {}
        for _, last in self.responses():
            pass
        return last


class Stdio(Client):
    """serve's JSON Lines on its stdin and stdout."""

    def __init__(self, serve: Serve) -> None:
        super().__init__()
        assert serve.process.stdin is not None and serve.process.stdout is not None
        self._in, self._out = serve.process.stdin.fileno(), serve.process.stdout.fileno()

    def fd(self) -> int:
        return self._out

    def send(self, request: dict[str, Any]) -> None:
        os.write(self._in, json.dumps(request).encode() + b"\n")

    def parse(self) -> Iterator[dict[str, Any]]:
        buffer = self.buffer
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            yield json.loads(line)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Http(Client):
    """`POST /v1/turns` on one keep-alive HTTP/1.1 connection: its event stream (chunked), or its result as JSON."""

    def __init__(self, port: int, *, as_json: bool = False) -> None:
        super().__init__()
        self.sock = connect(port)
        self._accept = b"application/json" if as_json else b"text/event-stream"
        self._head: dict[str, str] | None = None
        self._events = bytearray()  # the event stream's bytes, out of their chunks
        self._ended = False  # its last chunk read

    def fd(self) -> int:
        return self.sock.fileno()

    def send(self, request: dict[str, Any]) -> None:
        body = json.dumps(request).encode()
        self.sock.sendall(
            b"POST /v1/turns HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: "
            + self._accept
            + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
        )
        self._head, self._ended = None, False

    def parse(self) -> Iterator[dict[str, Any]]:
        buffer = self.buffer
        if self._head is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            status, *fields = bytes(buffer[:end]).decode("latin-1").split("\r\n")
            del buffer[: end + 4]
            self._head = {name.lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)}
            expect(status.split()[1] == "200", f"POST /v1/turns answered {status}")
        if "content-length" in self._head:  # the result as JSON
            length = int(self._head["content-length"])
            if len(buffer) >= length:
                body = bytes(buffer[:length])
                del buffer[:length]
                yield json.loads(body)
            return
        while (end := buffer.find(b"\r\n")) >= 0:  # chunked: size, data, CRLF
            size = int(bytes(buffer[:end]), 16)
            if len(buffer) < end + 2 + size + 2:
                break
            self._ended = size == 0
            self._events += buffer[end + 2 : end + 2 + size]
            del buffer[: end + 2 + size + 2]
        events = self._events
        while (end := events.find(b"\n\n")) >= 0:
            frame = bytes(events[:end])
            del events[: end + 2]
            yield json.loads(frame[frame.index(b"\ndata: ") + 7 :])

    def responses(self, within: float = 60.0) -> Iterator[tuple[int, dict[str, Any]]]:
        yield from super().responses(within)
        deadline = time.monotonic() + within
        while "content-length" not in (self._head or {}) and not self._ended:  # the stream's end, before the next
            self.read(deadline)
            expect(not list(self.parse()), "a response after the result")


class WebSocket(Client):
    """`/v1/ws`: one request or response per text message (client frames masked, as RFC 6455 says)."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.sock = connect(port)
        key = base64.b64encode(os.urandom(16))
        self.sock.sendall(
            b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        deadline = time.monotonic() + 30
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            self.read(deadline)
        status = bytes(self.buffer[: self.buffer.find(b"\r\n")])
        expect(status.startswith(b"HTTP/1.1 101"), f"/v1/ws answered {status!r}")
        del self.buffer[: end + 4]

    def fd(self) -> int:
        return self.sock.fileno()

    def frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes((mask * (n // 4 + 1))[:n], "big")).to_bytes(n, "big")
        self.sock.sendall(head + mask + masked)

    def send(self, request: dict[str, Any]) -> None:
        self.frame(TEXT, json.dumps(request).encode())

    def parse(self) -> Iterator[dict[str, Any]]:
        buffer = self.buffer
        while len(buffer) >= 2:
            first, n = buffer[0], buffer[1] & 0x7F
            start = 2
            if n == 126:
                start, n = 4, int.from_bytes(buffer[2:4], "big")
            elif n == 127:
                start, n = 10, int.from_bytes(buffer[2:10], "big")
            if len(buffer) < start + n:
                return
            payload = bytes(buffer[start : start + n])
            del buffer[: start + n]
            expect(first & 0x80 != 0, "a fragmented message: the door sends each response whole")
            opcode = first & 0x0F
            expect(opcode != CLOSE, f"the door closed the WebSocket: {payload!r}")
            if opcode == PING:
                self.frame(PONG, payload)
            elif opcode == TEXT:
                yield json.loads(payload)

    def idle(self) -> bool:
        """Nothing but the door's keep-alive pings (answered) has come, and the connection is open."""
        poll = select.poll()
        poll.register(self.fd(), select.POLLIN)
        while poll.poll(0):
            chunk = os.read(self.fd(), 65536)
            self.buffer += chunk
            if not chunk or list(self.parse()):
                return False
        return True


# --------------------------------------------------------------------------- 25, 26. a turn through each door


def turn(p: dict[str, Any]) -> dict[str, Any]:
    """Turns through stdin/stdout, SSE, JSON and WebSocket, one after another in rotating order."""
    with servers([ECHO_AGENT], stdio=True, listen=True) as (plain, network):
        assert plain is not None and network is not None
        clients: dict[str, Client] = {
            "stdin": Stdio(plain),
            "sse": Http(network.port),
            "json": Http(network.port, as_json=True),
            "ws": WebSocket(network.port),
        }
        names = list(clients)
        times: dict[str, list[float]] = {name: [] for name in names}
        for i in range(p["warmup"] + p["turns"]):
            shift = (i + p["round"]) % len(names)
            for name in names[shift:] + names[:shift]:
                request_id = f"{name}-{i}"
                request = turn_request(request_id, request_id)
                began = clock_ns()
                result = clients[name].result(request)
                elapsed = clock_ns() - began
                expect(result["id"] == request_id, f"the result of another turn: {result}")
                check_echo(result)
                if i >= p["warmup"]:
                    times[name].append(elapsed / 1e6)
    return {f"{name}_ms": values for name, values in times.items()}


# --------------------------------------------------------------------------- 27. partial latency over each door


def latency(p: dict[str, Any]) -> dict[str, Any]:
    """One ticker turn through `transport`: from the agent writing each partial to the client's read returning it."""
    ticker = [sys.executable, "-S", os.path.join(HERE, "agents", "ticker.py"), str(p["seconds"]), str(p["interval_ms"])]
    transport = p["transport"]
    with servers(ticker, stdio=transport == "stdin", listen=transport != "stdin") as (plain, network):
        if plain is not None:
            client: Client = Stdio(plain)
        else:
            assert network is not None
            client = Http(network.port) if transport == "sse" else WebSocket(network.port)
        client.send(turn_request("tick", "tick"))
        delays = []
        result: dict[str, Any] = {}
        for arrived, response in client.responses():
            if response["type"] == "partial":
                delays.append(arrived - int(response["text"]))
            elif response["type"] == "result":
                result = response
    expect(result.get("outcome") == "ok" and result.get("reply") == "ticked", f"ticker turn failed: {result}")
    expected = int(p["seconds"] * 1000 / p["interval_ms"])
    expect(len(delays) >= expected * 0.9, f"only {len(delays)} partials arrived, expected ~{expected}")
    return {"delay_ms": [d / 1e6 for d in delays[p["skip"] :]]}


# --------------------------------------------------------------------------- 28. idle WebSocket connections


def idle(p: dict[str, Any]) -> dict[str, Any]:
    """`connections` idle WebSockets held open on one listening serve; its RSS with them open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = p["connections"] + 256
    if soft < wanted:  # serve inherits it: each connection is a descriptor on both sides
        expect(hard == resource.RLIM_INFINITY or hard >= wanted, f"RLIMIT_NOFILE's hard limit {hard} < {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    with servers([ECHO_AGENT], stdio=False, listen=True) as (_, network):
        assert network is not None
        busy = WebSocket(network.port)
        check_echo(busy.result(turn_request("first", "first")))
        before, _ = network.rss_mb()
        began = time.monotonic()
        quiet = [WebSocket(network.port) for _ in range(p["connections"])]
        opened = time.monotonic() - began
        began_ns = clock_ns()
        check_echo(busy.result(turn_request("second", "second")))
        turn_ms = (clock_ns() - began_ns) / 1e6
        rss, peak = network.rss_mb()
        expect(all(ws.idle() for ws in quiet), "the door closed or wrote to an idle connection")
        for ws in quiet:
            ws.sock.close()
    return {
        "rss_mb": [rss],
        "peak_rss_mb": [peak],
        "before_mb": [before],
        "open_s": [opened],
        "turn_ms": [turn_ms],
    }


def main() -> None:
    from report import stats

    began = time.monotonic()
    for name, values in (
        ("turn", turn({"turns": 30, "warmup": 3, "round": 0})),
        ("latency, sse", latency({"seconds": 1, "interval_ms": 5, "skip": 10, "transport": "sse"})),
        ("idle", idle({"connections": 1000})),
    ):
        for measure, numbers in values.items():
            st = stats(numbers)
            print(f"{name} {measure}: median {st['median']:.3f}, p99 {st['p99']:.3f} over {st['n']}")
    print(f"({time.monotonic() - began:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
