"""`stamp_relay.py LOG COMMAND [ARG...]`: COMMAND's stdout passed on through this process, each chunk's time logged.

For the latency rows of a real CLI (rows 21 and 22), which cannot stamp its own output: COMMAND keeps this
process's stdin and stderr, and every chunk it writes on stdout is written on ours as soon as it is read. Just
before each write, LOG gets 16 bytes: the stream's offset at the chunk's end and CLOCK_MONOTONIC in ns (one clock
for every process on Linux), both native signed 64-bit. A delay measured from a stamp so includes this write and
everything after it: the reader's wake-up, its parsing, its host's callback. `read_stamps` reads LOG back.
"""

from __future__ import annotations

import bisect
import os
import struct
import subprocess
import sys
import time
from typing import Any

RECORD = struct.Struct("qq")


def read_stamps(path: str) -> tuple[list[int], list[int]]:
    """The log at `path`: the offsets at the end of each chunk, and each chunk's stamp, in the stream's order."""
    with open(path, "rb") as log:
        data = log.read()
    pairs = [RECORD.unpack_from(data, at) for at in range(0, len(data) - len(data) % RECORD.size, RECORD.size)]
    return [offset for offset, _ in pairs], [stamp for _, stamp in pairs]


class Arrivals:
    """The host side: when each event reached the host's callback, against the stamp of the chunk it came in.

    Every instance of `dialect_class` (the bridge's dialect of the relayed CLI) counts the bytes it is fed, so
    `arrived` knows where in the stream the chunk being handled began; the bridge hands a chunk's events to the
    host before it reads the next chunk. The delay is taken from the stamp of the relay's chunk holding that
    first byte: when the bridge read two of the relay's chunks at once, from the earlier one's.
    """

    def __init__(self, dialect_class: Any, log: str) -> None:
        self.log = log
        self.fed = self.chunk_start = 0
        self.times: dict[str, list[tuple[int, int]]] = {}
        feed = dialect_class.feed

        def counted_feed(dialect: Any, data: bytes) -> Any:
            self.chunk_start = self.fed
            self.fed += len(data)
            return feed(dialect, data)

        dialect_class.feed = counted_feed

    def command_prefix(self) -> list[str]:
        """What goes before the CLI's command line: this relay, logging to `log`."""
        return [sys.executable, "-S", os.path.abspath(__file__), self.log]

    def arrived(self, kind: str, counted: bool = True) -> None:
        """An event of `kind` reached the host's callback now (`counted` False: a warm-up's, not kept)."""
        now = time.monotonic_ns()
        if counted:
            self.times.setdefault(kind, []).append((now, self.chunk_start))

    def delays_ms(self) -> dict[str, list[float]]:
        """Per kind, each event's delay from its chunk's stamp, in ms; read once the CLI has exited."""
        offsets, stamps = read_stamps(self.log)
        return {
            kind: [(now - stamps[bisect.bisect_right(offsets, start)]) / 1e6 for now, start in times]
            for kind, times in self.times.items()
        }


def main(argv: list[str]) -> int:
    log = os.open(argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    child = subprocess.Popen(argv[2:], stdout=subprocess.PIPE)
    assert child.stdout is not None
    source, now, offset = child.stdout.fileno(), time.monotonic_ns, 0
    try:
        while chunk := os.read(source, 65536):
            offset += len(chunk)
            stamp = now()
            view = memoryview(chunk)
            while view:
                view = view[os.write(1, view) :]
            os.write(log, RECORD.pack(offset, stamp))
    except BrokenPipeError:  # the reader is gone: so is the point of COMMAND
        child.kill()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
