"""A real `agent-bridge serve` on stdin/stdout, as a bot drives it: requests written as JSON lines, responses
read one by one, each within a deadline (a test whose serve hangs fails in seconds with what it waited for)."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")


class StdioServe:
    def __init__(self, profiles: Path, state: Path, *, deadline: float) -> None:
        self.deadline = deadline
        self.process = subprocess.Popen(
            [AGENT_BRIDGE, "serve", "--profiles", str(profiles), "--state", str(state)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._buffer = b""

    def send(self, request: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request).encode() + b"\n")
        self.process.stdin.flush()

    def until(self, kind: str, request_id: str | None = None) -> list[dict[str, Any]]:
        """Every response up to the first of type `kind` (for request `request_id`, when given)."""
        seen = []
        while True:
            response = self._receive(kind)
            seen.append(response)
            if response["type"] == kind and request_id in (None, response.get("id")):
                return seen

    def _receive(self, kind: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self.process.stdout], [], [], self.deadline)
            assert ready, f"serve said no {kind!r} within {self.deadline} s"
            data = self.process.stdout.read1(65536)  # type: ignore[attr-defined]
            assert data, "serve closed its output"
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> int:
        """Closes serve's stdin and returns its exit code; a serve that does not end in time is killed."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            return self.process.wait(self.deadline)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
