"""Workers and gateways as real processes on one PostgreSQL database, for the scale-out tests.

`Fleet(lab, dsn)` starts `agent-bridge worker` processes on the lab's
profiles and `agent-bridge serve --postgres` gateways; a `Gateway` is a
JSON Lines client whose responses are read by a thread into a queue, so a
test waits for a response with a deadline and never blocks forever.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from hostkit import Lab

WAIT_SECS = 20.0


def eventually(check: Callable[[], Any], what: str, within: float = WAIT_SECS) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def release(gate: Path) -> None:
    """Let the agent waiting on FIFO `gate` go on (`hostkit.Lab.release`, for tests without trio)."""

    def opened() -> bool:
        try:
            os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as err:
            if err.errno == errno.ENXIO:  # nobody reads it yet
                return False
            raise
        return True

    eventually(opened, f"an agent to wait on {gate.name}")


class Gateway:
    def __init__(self, argv: list[str], log: Path) -> None:
        with open(log, "ab") as err:
            self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        self.responses: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.responses.put(json.loads(line))
        self.responses.put(None)

    def send(self, request: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()

    def next(self, within: float = WAIT_SECS) -> dict[str, Any]:
        try:
            response = self.responses.get(timeout=within)
        except queue.Empty:
            raise AssertionError(f"no response within {within} s; seen so far: {self.seen[-5:]}") from None
        assert response is not None, "the gateway closed its output"
        self.seen.append(response)
        return response

    def until(self, kind: str, request_id: Any, within: float = WAIT_SECS) -> list[dict[str, Any]]:
        got = []
        deadline = time.monotonic() + within
        while True:
            got.append(self.next(max(0.01, deadline - time.monotonic())))
            if got[-1]["type"] == kind and got[-1].get("id") == request_id:
                return got

    def results(self, ids: set[Any], within: float = WAIT_SECS) -> dict[Any, dict[str, Any]]:
        """The first result of each of `ids` (errors count as results here), waiting for all of them."""
        found = {r["id"]: r for r in self.seen if r["type"] in ("result", "error") and r.get("id") in ids}
        deadline = time.monotonic() + within
        while set(found) != ids:
            response = self.next(max(0.01, deadline - time.monotonic()))
            if response["type"] in ("result", "error") and response.get("id") in ids:
                found.setdefault(response["id"], response)
        return found

    def rest(self) -> list[dict[str, Any]]:
        """Every response still to come, once the gateway closed its output."""
        rest = []
        while (response := self.responses.get(timeout=WAIT_SECS)) is not None:
            self.seen.append(response)
            rest.append(response)
        return rest

    def close(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout=WAIT_SECS)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=WAIT_SECS)


class Fleet:
    def __init__(self, lab: Lab, dsn: str) -> None:
        self.lab = lab
        self.dsn = dsn
        self.workers: list[subprocess.Popen[bytes]] = []
        self.gateways: list[Gateway] = []
        self._names = iter(range(1, 1000))
        self._connection: psycopg.Connection[tuple[Any, ...]] | None = None

    def worker(self, *options: str, lease_secs: float = 1.0, max_concurrent: int = 8) -> subprocess.Popen[bytes]:
        [process] = self.start_workers(1, *options, lease_secs=lease_secs, max_concurrent=max_concurrent)
        return process

    def start_workers(
        self, count: int, *options: str, lease_secs: float = 1.0, max_concurrent: int = 8
    ) -> list[subprocess.Popen[bytes]]:
        """`count` workers alike, started at once (each takes a second or so to start), once all are registered."""
        names = [f"w{next(self._names)}" for _ in range(count)]
        started = [self._start_worker(name, options, lease_secs, max_concurrent) for name in names]
        eventually(
            lambda: self.query("SELECT count(*) FROM bridge_workers WHERE id = ANY(%s)", names) == [(count,)],
            f"workers {', '.join(names)} to start",
        )
        return started

    def _start_worker(
        self, name: str, options: tuple[str, ...], lease_secs: float, max_concurrent: int
    ) -> subprocess.Popen[bytes]:
        with open(self.lab.root / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bridge",
                    "worker",
                    "--postgres",
                    self.dsn,
                    "--profiles",
                    str(self.lab.profiles),
                    "--lease-secs",
                    str(lease_secs),
                    "--max-concurrent",
                    str(max_concurrent),
                    "--name",
                    name,
                    "--log-level",
                    "info",
                    *options,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        self.workers.append(process)
        return process

    def gateway(self, *options: str) -> Gateway:
        """A `serve --postgres` gateway, returned at once: started before the workers (which wait until they
        are registered), it starts while they do; what a test sends it waits in its pipe until it reads."""
        gateway = Gateway(
            [sys.executable, "-m", "bridge", "serve", "--postgres", self.dsn, *options], self.lab.root / "gateway.log"
        )
        self.gateways.append(gateway)
        return gateway

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """The rows, or none while the server is out of reach or the tables are not made yet.

        One connection, kept: the tests poll with this every few milliseconds, and a connection each time
        cost the server a backend process each (a third of its CPU in the fleet tests). A connection the
        server dropped (a restart) is replaced at once."""
        for attempt in range(2):
            try:
                if self._connection is None or self._connection.closed:
                    self._connection = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                return self._connection.execute(sql, params).fetchall()
            except psycopg.OperationalError:  # out of reach, or the connection kept is gone
                self._close_connection()
                if attempt:
                    return []
            except psycopg.Error:  # its tables not made yet
                return []
        return []

    def _close_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def log(self, name: str) -> str:
        path = self.lab.root / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.kill()
        for process in self.workers:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            process.wait(timeout=WAIT_SECS)
        self._close_connection()


def turn(
    request_id: Any, message: str, conversation: str = "chat", profile: str = "rec", **fields: Any
) -> dict[str, Any]:
    return {
        "type": "turn",
        "id": request_id,
        "profile": profile,
        "conversation": conversation,
        "message": message,
        **fields,
    }
