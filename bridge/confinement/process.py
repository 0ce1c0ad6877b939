"""The agent's OS process: spawned in its own session (`bridge.confinement.spawner`), signalled as a group, reaped once.

Waiting uses a pidfd, so a turn costs no thread. `wait_exited()` returns while
the agent is still an unreaped zombie: as long as the zombie exists its process
group id cannot be reused, so `signal_group()` can never hit a stranger.

Every agent's group is guarded by the keeper (`bridge.confinement.keeper`) from spawn
until it has been killed, so the group dies even if this process is killed.
Where the kernel lets the bridge make cgroups, each agent is also born in a
cgroup of its own (`bridge.confinement.cgroups`), and its end kills everything left in
it: what left the agent's group and session included. A sandboxed agent's
PID namespace does that for it (`bridge.confinement.sandbox`). What escapes an
agent's group is swept by `bridge.confinement.orphans`.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
from collections.abc import Callable
from functools import partial

import trio

from .cgroups import CONTAINMENT, AgentCgroup
from .keeper import KEEPER
from .limits import LIMIT_GROUPS, AgentGroups, ResourceLimits, exceeded

READ_CHUNK = 64 * 1024

LIVE_AGENTS: set[int] = set()
"""Pids of spawned agents not yet reaped. Spawning, and reaping anything that is not an agent, happen under
`SPAWN_LOCK`: a child listed under the lock stays this process's unreaped child until the lock is released, so
its pid cannot be reused by a stranger while the lock is held."""


class AgentProcess:
    """A running agent and the parent's ends of its pipes.

    stdout and stderr are raw non-blocking descriptors: the driver (`bridge.engine.driver`) reads
    them directly, which saves an event-loop iteration per read over a stream
    object (see `driver.Reader`).
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdin: trio.lowlevel.FdStream | None,
        stdout: int,
        stderr: int,
        cgroup: AgentCgroup | None = None,
        limits: ResourceLimits | None = None,
        limit_groups: AgentGroups | None = None,
        sandboxed: bool = False,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.sandboxed = sandboxed  # the process is bwrap, which runs the agent in a session of its own
        self.cgroup = cgroup  # the agent's own cgroup, where the bridge may make them
        self.limits = limits
        self.limit_groups = limit_groups  # its groups for the limits only a cgroup controller holds
        self.exceeded = ""  # once reaped: the limit it ended over (`bridge.confinement.limits.exceeded`), if known
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        for fd in (stdout, stderr):
            os.set_blocking(fd, False)
        self._exited = False
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # not Linux ≥ 5.3: fall back to a waiting thread
            self._pidfd = None
        self._exit_or_stderr: select.epoll | None = None  # made by the first `wait_exited(on_stderr)`

    @property
    def reaped(self) -> bool:
        return self._popen.returncode is not None

    @property
    def reads_stderr_while_waiting(self) -> bool:
        """Whether `wait_exited(on_stderr)` can read stderr (it needs a pidfd); else stderr needs a task of its own."""
        return self._pidfd is not None

    async def wait_exited(self, on_stderr: Callable[[bytes], None] | None = None) -> None:
        """Return once the agent has exited, without reaping it.

        With `on_stderr` (see `reads_stderr_while_waiting`), stderr is read meanwhile: each chunk is handed
        to it, and b"" at the end of stderr. One wait for both saves a turn a task. It reads one chunk per
        wake-up, so an agent flooding stderr cannot starve the event loop.
        """
        if self._exited:
            return
        if on_stderr is not None and self._pidfd is not None and self.stderr >= 0:
            await self._wait_exited_reading_stderr(on_stderr)
        elif self._pidfd is not None:
            await trio.lowlevel.wait_readable(self._pidfd)
        else:
            await trio.to_thread.run_sync(
                partial(os.waitid, os.P_PID, self.pid, os.WEXITED | os.WNOWAIT), abandon_on_cancel=True
            )
        self._exited = True

    async def _wait_exited_reading_stderr(self, on_stderr: Callable[[bytes], None]) -> None:
        ready = self._exit_or_stderr
        if ready is None:  # an epoll of our own, which trio waits on like any descriptor
            ready = self._exit_or_stderr = select.epoll(2)
            assert self._pidfd is not None  # wait_exited calls this only with a pidfd
            ready.register(self._pidfd, select.EPOLLIN)
            ready.register(self.stderr, select.EPOLLIN)
        while True:
            exited = False
            for fd, _ in ready.poll(0):
                if fd == self._pidfd:
                    exited = True  # and the end of stderr, when it came with the exit, is read first
                    continue
                try:
                    data = os.read(fd, READ_CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    ready.unregister(fd)
                on_stderr(data)
            if exited:
                return
            await trio.lowlevel.wait_readable(ready.fileno())

    def signal_group(self, signum: int) -> None:
        """Send `signum` to every process in the agent's group (it leads a session of its own).

        A sandboxed agent's stop signals go to the group bwrap's child leads (`--new-session`): the agent and
        what it started, and not bwrap, which would die of them and take the agent down before its grace. That
        group id stays the agent's while bwrap, our unreaped child, has not reaped its child; after, it could
        be reused only once the pid counter wrapped around in between."""
        if self.reaped:
            return  # the group id may belong to someone else by now
        group = self.pid
        if self.sandboxed and signum != signal.SIGKILL:
            group = _child_of(self.pid) or self.pid  # none yet: bwrap has started nothing to spare
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            pass
        except PermissionError:  # a member changed credentials (setuid); signal what we can
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def reap(self) -> int:
        """Collect the exited agent's status (negative: killed by that signal).

        Anything else still in its group is killed first, while the zombie
        keeps the group id ours; then everything left in its cgroup, wherever
        it went.
        """
        if not self.reaped:
            self.signal_group(signal.SIGKILL)
            KEEPER.release(self.pid)
            returncode = self._popen.wait()
            LIVE_AGENTS.discard(self.pid)
            groups = self.limit_groups
            events = groups.events() if groups is not None else []
            if self.cgroup is not None:
                CONTAINMENT.end(self.cgroup)
            if groups is not None:
                LIMIT_GROUPS.end(groups)
            self.exceeded = exceeded(self.limits, returncode, events)
        assert self._popen.returncode is not None
        return self._popen.returncode

    def close_output(self) -> None:
        """Stop reading the agent: close our ends of stdout and stderr (idempotent)."""
        self.stdout = _close_fd(self.stdout)
        self.stderr = _close_fd(self.stderr)

    def close(self) -> None:
        """Close the pipes and the pidfd (idempotent).

        The process must have been reaped, and nothing may wait on its descriptors any
        more (its readers have ended). So they are closed without `notify_closing`, which
        only wakes a task waiting on one, and costs a system call or an exception each.
        """
        if self.stdin is not None:
            self.stdin.close()
        for fd in (self.stdout, self.stderr, self._pidfd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.stdout = self.stderr = -1
        self._pidfd = None
        if self._exit_or_stderr is not None:
            self._exit_or_stderr.close()
            self._exit_or_stderr = None


def _close_fd(fd: int) -> int:
    """Close a descriptor trio may be waiting on; returns -1, the closed marker."""
    if fd >= 0:
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
    return -1


def _child_of(pid: int) -> int:
    """The first child of process `pid` (0 when it has none, or it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as children:
            first = children.read().split(maxsplit=1)
    except OSError:
        return 0
    return int(first[0]) if first else 0


def kill_agents_now() -> None:
    """SIGKILL every agent this process runs, with its group, skipping the grace period (a second Ctrl-C).

    Only groups of unreaped agents are signalled, so none of them can be a stranger's; each turn then
    ends as its cancel would have, and reaps its agent and whatever that left."""
    for pid in list(LIVE_AGENTS):
        kill_quietly(os.killpg, pid)


def kill_quietly(kill: Callable[[int, int], None], target: int) -> None:
    try:
        kill(target, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
