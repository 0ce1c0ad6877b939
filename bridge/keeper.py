"""The keeper: agents never outlive the bridge that started them, however it dies.

A bridge killed with SIGKILL, by the OOM killer or by a crashed container
runs no `finally` block, so it cannot stop its agents itself. Something that
survives it must. The keeper is a tiny `/bin/sh` process, started once per
bridge process (at its first agent) in a session of its own, so that no
signal aimed at the bridge's terminal or process group reaches it. It reads
its stdin, a pipe whose only writer is the bridge:

    + PGID GRACE_MS     an agent's process group to guard, and its kill grace
    - PGID              that group is gone (the bridge reaped it)

The kernel closes the pipe when the bridge dies, whatever killed it. At that
end of file the keeper sends SIGTERM to every group still registered, and
SIGKILL to each one still alive after its own grace — what a timeout does.
Then it exits. When the bridge ends normally every group was released, and
the keeper exits at once.

A guarded group is released only after the supervisor has SIGKILLed it while
its leader is still an unreaped zombie, so the keeper never holds the id of
a group that could have been reused by a stranger while the bridge lived.

Cost per turn: two writes of a few bytes to a pipe. Cost per process: one
spawn of `sh` (about a millisecond, in parallel with the bridge).
"""

from __future__ import annotations

import os
import subprocess
import threading

NAME = "agent-bridge-keeper"
_SCRIPT = r"""
trap '' INT HUP
live=' '
while read -r op group grace; do
  case $group in ''|*[!0-9]*) continue ;; esac
  case $op in
    +) live="$live$group:$grace " ;;
    -) case $live in
         *" $group:"*) rest=${live#*" $group:"}; live="${live%%" $group:"*} ${rest#* }" ;;
       esac ;;
  esac
done
for entry in $live; do kill -s TERM -- "-${entry%%:*}" 2>/dev/null; done
waited=0
while :; do
  left=
  for entry in $live; do
    group=${entry%%:*}
    kill -s 0 -- "-$group" 2>/dev/null || continue
    if [ "$waited" -ge "${entry#*:}" ]; then kill -s KILL -- "-$group" 2>/dev/null; else left="$left $entry"; fi
  done
  [ -n "$left" ] || exit 0
  live=$left
  sleep 0.05
  waited=$((waited + 50))
done
"""
_ENVIRONMENT = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}


class Keeper:
    """The bridge's side of the keeper: register groups, release them, restart a keeper that died.

    Thread-safe: turns run by several threads (each with its own trio loop)
    share the one keeper of their process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._pipe = -1
        self._groups: dict[int, int] = {}  # pgid -> grace in ms
        self._stuck_warned = False

    @property
    def pid(self) -> int | None:
        """The keeper's pid, once it runs."""
        process = self._process
        return process.pid if process is not None else None

    def guard(self, pgid: int, grace_secs: float) -> None:
        """Kill group `pgid` (SIGTERM, then SIGKILL after `grace_secs`) if this process dies."""
        grace_ms = max(0, round(grace_secs * 1000))
        with self._lock:
            self._groups[pgid] = grace_ms
            self._send(f"+ {pgid} {grace_ms}\n")

    def release(self, pgid: int) -> None:
        """Group `pgid` is dead (or about to be, SIGKILLed): stop guarding it."""
        with self._lock:
            if self._groups.pop(pgid, None) is not None:
                self._send(f"- {pgid}\n")

    def start(self) -> None:
        """Start the keeper now, if it is not running (`guard` does this on demand)."""
        with self._lock:
            if self._pipe < 0:
                self._spawn()

    def _send(self, line: str) -> None:
        if self._pipe < 0:
            self._spawn()
        try:
            os.write(self._pipe, line.encode())
        except BrokenPipeError:  # the keeper died: a new one takes over every live group
            self._discard()
            self._spawn()
            self._write_all()
        except BlockingIOError:  # its pipe is full: the keeper is stopped or stuck
            if not self._stuck_warned:
                from .log import get_logger

                self._stuck_warned = True
                get_logger(component="keeper").warning(
                    "the keeper process is not reading; agents started now may outlive a killed bridge",
                    keeper_pid=self.pid)

    def _write_all(self) -> None:
        lines = "".join(f"+ {pgid} {grace}\n" for pgid, grace in self._groups.items())
        if lines:
            try:
                os.write(self._pipe, lines.encode())
            except OSError:
                pass  # a keeper that dies at once is replaced at the next registration

    def _spawn(self) -> None:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            self._process = subprocess.Popen(
                ["/bin/sh", "-c", _SCRIPT, NAME], stdin=read_end, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, cwd="/", env=_ENVIRONMENT, start_new_session=True, close_fds=True,
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        os.set_blocking(write_end, False)
        self._pipe = write_end

    def _discard(self) -> None:
        """Forget a dead keeper: close our end and collect its exit status."""
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        if self._process is not None:
            try:
                self._process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent's keeper guards the parent's agents, not ours."""
        self._lock = threading.Lock()
        if self._pipe >= 0:
            os.close(self._pipe)
        self._pipe = -1
        self._process = None
        self._groups = {}


KEEPER = Keeper()
os.register_at_fork(after_in_child=KEEPER._forget_after_fork)
