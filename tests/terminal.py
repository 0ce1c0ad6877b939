"""`agent-bridge …` on the slave side of a pseudo-terminal, the way a person runs it."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from pathlib import Path

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
WAIT = 20.0  # an upper bound for a loaded machine; passing tests never wait for it


class Terminal:
    """`agent-bridge ARGS…` with the pty as stdin, stdout, stderr and controlling terminal."""

    def __init__(self, *args: str, env: dict[str, str], program: str = AGENT_BRIDGE, cwd: str | None = None) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal, as in a real terminal
            try:
                if cwd is not None:
                    os.chdir(cwd)
                os.execve(program, [program, *args], env)
            finally:
                os._exit(127)
        self.pid = pid
        self.fd = fd
        self.output = b""
        self.seen = 0  # output before this offset has been matched already

    def expect(self, pattern: bytes | re.Pattern[bytes]) -> bytes:
        """Wait until `pattern` appears in output not matched yet; return the output up to its end."""
        deadline = time.monotonic() + WAIT
        while True:
            if isinstance(pattern, bytes):
                at = self.output.find(pattern, self.seen)
                end = at + len(pattern) if at >= 0 else -1
            else:
                match = pattern.search(self.output, self.seen)
                end = match.end() if match else -1
            if end >= 0:
                before, self.seen = self.output[self.seen : end], end
                return before
            if not self._read(deadline):
                raise AssertionError(
                    f"{pattern!r} did not appear; the terminal shows:\n"
                    f"{self.output[self.seen :].decode(errors='replace')}"
                )

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def exit_code(self) -> int:
        """Wait for the command to end (reading what it still prints); its exit code."""
        deadline = time.monotonic() + WAIT
        while self._read(deadline):
            pass
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)

    def _read(self, deadline: float) -> bool:
        """Read what is there within the deadline; False at the deadline or when the terminal closed."""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: the command exited and the slave side is closed
            return False
        self.output += chunk
        return bool(chunk)

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)


def screen_lines(output: bytes) -> list[str]:
    """The lines a person reads: the status line's drawings and erasures (`\\r…\\r`) and line ends resolved."""
    lines = []
    for line in output.decode(errors="replace").replace("\r\n", "\n").split("\n"):
        lines.append(line.rsplit("\r", 1)[-1])  # what a carriage return wrote over is gone
    return lines
