"""The suite's guard against leftover agent cgroups: a bridge's `agent-bridge-<pid>-…` directory must be gone once
its bridge is (its keeper removes it, however the bridge died).

One watcher per test session (the xdist controller, or the only process) looks at the cgroup the bridges make
their directories in, ten times a second, and remembers each new directory whose bridge descends from the
session — the tests' own bridges, and those that the programs they start run (acpx's). At the session's end,
every remembered directory whose bridge is dead must be gone within the keeper's own time. A leftover fails the
session, naming the bridge's command line and working directory (the test's tmp_path).

Other sessions' bridges, a bridge gone before the watcher saw its directory, and directories the tests make
themselves (no live owner when seen) are not the session's: a miss, never a false alarm. Nothing is removed
here: a leftover stays for the next bridge to remove ten minutes on (`remove_leftovers`), or for whoever reads
the report.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from procfs import ancestors, process_state

from bridge.confinement.cgroups import directory_owner

POLL_SECS = 0.1
# The keeper tries for 100 × 0.05 s; a dead bridge's directory still there after this is left over.
KEEPER_SECS = 6.0


@dataclass(frozen=True)
class Bridge:
    pid: int
    command: str
    cwd: str


class CgroupLeakWatch:
    """Remembers the directories the session's bridges make in `where`; `leftovers()` names those that stay."""

    def __init__(self, where: Path) -> None:
        self._where = where
        self._session = os.getpid()
        self._seen: set[str] = set(self._names())  # before the session: not its own
        self._ours: dict[Path, Bridge] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cgroup-leak-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def leftovers(self) -> dict[Path, Bridge]:
        """Stop watching; the session's directories still there `KEEPER_SECS` after their bridges died."""
        self._stop.set()
        self._thread.join()
        self._look()
        deadline = time.monotonic() + KEEPER_SECS
        while True:
            left = {path: bridge for path, bridge in self._ours.items() if path.exists() and not _runs(bridge.pid)}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(POLL_SECS)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_SECS):
            self._look()

    def _names(self) -> list[str]:
        try:
            return [name for name in os.listdir(self._where) if directory_owner(name) is not None]
        except OSError:
            return []

    def _look(self) -> None:
        for name in self._names():
            if name in self._seen:
                continue
            self._seen.add(name)
            pid = directory_owner(name)
            assert pid is not None
            bridge = _bridge(pid)
            if bridge is not None and self._session in ancestors(pid):
                self._ours[self._where / name] = bridge


def _bridge(pid: int) -> Bridge | None:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        return Bridge(pid, command.strip(), os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def _runs(pid: int) -> bool:
    return process_state(pid) not in (None, "Z")
