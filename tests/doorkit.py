"""`agent-bridge serve --listen` as a real process, for the tests of the network door that need one.

`ListeningServe` starts it, keeps everything it writes (in a log file too),
and gives its URL once it says it listens; a serve that exits first fails
the wait with what it said.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

WAIT_SECS = 20.0
LISTENING = "agent-bridge serve: listening on "


def write_tokens(path: Path, tenants: dict[str, str], **fields: Any) -> Path:
    """A tokens file: each token → a tenant of that name (and `fields` for every entry)."""
    path.write_text(yaml.safe_dump({token: {"name": name, **fields} for token, name in tenants.items()}))
    path.chmod(0o600)
    return path


def serve_argv(*options: str) -> list[str]:
    return [sys.executable, "-m", "bridge", "serve", *options]


class ListeningServe:
    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.said: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self._wait_for_url()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with open(self.log, "a") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                self._lines.put(line)
        self._lines.put(None)

    def _wait_for_url(self) -> str:
        while True:
            try:
                line = self._lines.get(timeout=WAIT_SECS)
            except queue.Empty:
                raise AssertionError(f"serve did not listen within {WAIT_SECS} s: {self.said}") from None
            if line is None:
                raise AssertionError(f"serve exited ({self.process.wait()}) before it listened: {self.said}")
            self.said.append(line)
            if line.startswith(LISTENING):
                return line[len(LISTENING) :].split()[0]

    def output(self) -> str:
        """Everything it wrote so far."""
        return self.log.read_text()

    def output_saying(self, words: str) -> str:
        """Everything it wrote, once that holds `words`: its lines reach the log through a thread of their own."""
        deadline = time.monotonic() + WAIT_SECS
        while words not in (said := self.output()):
            assert time.monotonic() < deadline, f"serve did not say {words!r} within {WAIT_SECS} s: {said[-2000:]}"
            time.sleep(0.01)
        return said

    def stop(self) -> int:
        """SIGTERM (serve drains and exits); its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=WAIT_SECS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError("serve did not exit within its wait after SIGTERM") from None


@pytest.fixture
def serves() -> Iterator[list[ListeningServe]]:
    """The listening serves a test starts (appended here), stopped at its end."""
    started: list[ListeningServe] = []
    try:
        yield started
    finally:
        for serve in started:
            serve.stop()


def sse_events(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The responses of a `text/event-stream` body, from its lines (`httpx.Response.iter_lines()`), as they come."""
    kind = None
    for line in lines:
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            response = json.loads(line[len("data: ") :])
            assert response["type"] == kind, (kind, response)
            yield response
