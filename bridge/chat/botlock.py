"""One process per bot: a lock file, held with `flock` for the process's life, that names its holder.

Two processes polling one bot token fight (Telegram answers the second one's `getUpdates` with 409, and
each takes updates the other should have). `BotLock` refuses the second `connect` at start instead, with
an error naming the process that holds the bot. The kernel drops the lock when its holder dies, even by
`kill -9`, so a crash never leaves the bot locked.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
from datetime import UTC, datetime
from pathlib import Path

from ..errors import PlatformConflict


def lock_path(directory: str | os.PathLike[str], platform: str, identity: str) -> Path:
    """The lock file of a bot: named by a hash of its identity (the token: never written in the clear)."""
    digest = hashlib.sha256(f"{platform}\0{identity}".encode()).hexdigest()[:16]
    return Path(directory) / f"{platform}-{digest}.lock"


class BotLock:
    """Held from `acquire()` to `release()`; `PlatformConflict` when another process holds it."""

    def __init__(self, path: str | os.PathLike[str], platform: str) -> None:
        self.path = Path(path)
        self.platform = platform
        self._fd = -1

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise PlatformConflict(
                f"this {self.platform} bot is already served by {holder} (lock {self.path}); "
                "one process per bot token: stop that one first, or give this one another bot"
            ) from None
        since = datetime.now(UTC).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"agent-bridge connect, pid {os.getpid()} on {socket.gethostname()} since {since}".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the flock
            self._fd = -1

    def __enter__(self) -> BotLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["BotLock", "lock_path"]
