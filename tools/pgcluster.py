"""A throwaway PostgreSQL cluster: `initdb` in a temporary directory, its own port on loopback.

The Debian package's server binaries are used (`/usr/lib/postgresql/<N>/bin`, or `PG_BIN`). As root the
server runs as the unprivileged `postgres` user, which owns the cluster's directory. The tests' fixtures
(pgserver.py) and the benchmarks (bench/worker.py) both start theirs with it; it needs psycopg, not pytest.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

START_SECS = 30.0
# Nothing here needs to survive a crash of the machine: no waiting for the disk.
FAST_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "32MB",
}


def server_binaries() -> Path:
    configured = os.environ.get("PG_BIN")
    if configured:
        return Path(configured)
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name))
    if not candidates:
        raise RuntimeError(
            "PostgreSQL's server is not installed: this needs the Debian package "
            "postgresql (apt-get install postgresql), or PG_BIN=/path/to/bin"
        )
    return candidates[-1].parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """One cluster: `dsn(database)`, `restart()`, `stop()`; `settings` override `FAST_SETTINGS` (postgres -c)."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.settings = {**FAST_SETTINGS, **(settings or {})}
        self.bin = server_binaries()
        self.root = Path(tempfile.mkdtemp(prefix="agent-bridge-pg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = "postgres"
            pwd.getpwnam(self._user)  # the Debian package creates it; KeyError says it is missing
        self.sockets = self.root / "run"
        for directory in (self.data, self.sockets):
            directory.mkdir()
            if self._user:
                shutil.chown(directory, self._user)
        self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "bridge",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--locale=C",
            ]
        )

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, user=self._user, capture_output=True, timeout=60)
        if done.returncode:
            raise RuntimeError(f"{argv[0]} failed: {done.stderr.decode(errors='replace')}")

    def start(self) -> None:
        with open(self.root / "server.log", "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.bin / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.sockets),
                    *(arg for name, value in self.settings.items() for arg in ("-c", f"{name}={value}")),
                ],
                user=self._user,
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + START_SECS
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited at start: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                psycopg.connect(self.dsn("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self, how: signal.Signals = signal.SIGINT) -> None:
        """SIGINT is PostgreSQL's fast shutdown (clients are disconnected); SIGQUIT is a crash-like stop."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(how)
            self.process.wait(timeout=30)
        self.process = None

    def restart(self, how: signal.Signals = signal.SIGINT) -> None:
        self.stop(how)
        self.start()

    def dsn(self, database: str) -> str:
        return f"postgresql://bridge@127.0.0.1:{self.port}/{database}"

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
