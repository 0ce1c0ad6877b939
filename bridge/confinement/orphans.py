"""Orphans: what leaves an agent's group is killed and reaped here, so nothing escapes a turn.

A process that is a child subreaper (`become_subreaper()`: the CLI
and `serve` are) is handed the orphaned descendants of its agents: a child
that left its agent's group with `setsid`, and every intermediate process that
exits. `collect_orphans()` and `sweep_orphans()` kill and reap each such
child that is not in the session of a live agent, so nothing escapes a turn
and no zombie piles up. A child in this process's own session is never
touched: that is the host's own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import trio

from ..log import Logger
from .cgroups import CONTAINMENT, SPAWN_LOCK, AgentCgroup
from .keeper import KEEPER
from .limits import LIMIT_GROUPS, AgentGroups
from .process import LIVE_AGENTS, kill_quietly

_subreaper = False
_children_listed: bool | None = None


def become_subreaper() -> bool:
    """Adopt the orphaned descendants of agents (Linux), so they are killed and reaped here.

    Without it they are reparented to PID 1 (or an outer subreaper): a process
    that escaped an agent's group runs on, and in many containers PID 1 never
    reaps the dead. Process-wide: from then on every child of this process that
    is in another session than this process's own, and is not a live agent's,
    counts as an orphan of an agent. So only a program that owns its process
    (the CLI, `serve`), or a host whose own children stay in its session,
    should call it. Returns whether the OS agreed.
    """
    global _subreaper
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_CHILD_SUBREAPER = 36
        _subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _subreaper = False
    return _subreaper


def log_containment(log: Logger) -> None:
    """Say once, at start-up, whether this process's agents get cgroups of their own, and why not."""
    status = CONTAINMENT.status()
    if status.available:
        log.info("each agent runs in a cgroup of its own", below=status.where)
    else:
        log.info(
            "agents are not contained in cgroups",
            reason=status.reason,
            effect="a process that leaves its agent's group is stopped only by this subreaper, and outlives "
            "this process if it is killed with SIGKILL",
        )


def sweep_orphans() -> list[int]:
    """Reap dead orphans and SIGKILL live ones; returns the pids killed, which are still to be reaped.

    A no-op unless `become_subreaper()` succeeded. Orphans are children of this
    process outside its own session and outside the sessions of live agents
    (an agent leads a session of its own, so its session id is its pid).
    """
    with SPAWN_LOCK:
        return _sweep()


def _sweep_unless_spawning() -> list[int] | None:
    """`sweep_orphans()`, or None at once when a spawn holds the lock (a worker thread's may wait for the
    kernel while it joins a cgroup: the event loop must not wait with it)."""
    if not SPAWN_LOCK.acquire(blocking=False):
        return None
    try:
        return _sweep()
    finally:
        SPAWN_LOCK.release()


def _sweep() -> list[int]:
    if not _subreaper:
        return []
    killed = []
    own_session = os.getsid(0)
    keeper = KEEPER.pid
    for pid in _children():
        if pid in LIVE_AGENTS or pid == keeper:
            continue
        status = _status(pid)
        if status is None:
            continue
        state, group, session = status
        if session == own_session or session in LIVE_AGENTS:
            continue
        if state == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            continue
        if group == pid:
            kill_quietly(os.killpg, pid)  # its group cannot be reused while it is our unreaped child
        kill_quietly(os.kill, pid)
        killed.append(pid)
    return killed


async def collect_orphans(
    deadline: float, cgroup: AgentCgroup | None = None, limit_groups: AgentGroups | None = None
) -> None:
    """Sweep until no orphan is left alive or unreaped, or until `deadline` (trio time); then remove the
    ended agent's `cgroup` and `limit_groups` once what was killed in them has exited.

    Each orphan killed hands its own children to this process when it dies,
    so the sweep repeats until a round kills nothing.
    """
    while True:
        killed = _sweep_unless_spawning()
        if killed is None:
            killed = await trio.to_thread.run_sync(sweep_orphans)
        if not killed:
            break
        with trio.move_on_at(deadline) as scope:
            for pid in killed:
                await _exited(pid)
        if scope.cancelled_caught:
            return
    if cgroup is not None:
        with trio.move_on_at(deadline):
            while (dying := CONTAINMENT.still_in(cgroup)) is not None:
                await _one_exited(dying)
    if limit_groups is not None:
        with trio.move_on_at(deadline):
            while (dying := LIMIT_GROUPS.still_in(limit_groups)) is not None:
                await _one_exited(dying)


async def sweep_orphans_on_sigchld(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Sweep whenever a child changes state, for a long-lived subreaper (`serve`): orphans that die
    between turns are reaped at once, not at the next turn's end. Run it in a nursery. A change seen while
    a spawn holds the lock is left to the next sweep (the next change, or the end of a turn)."""
    with trio.open_signal_receiver(signal.SIGCHLD) as changes:
        task_status.started()
        async for _ in changes:
            _sweep_unless_spawning()


async def _one_exited(dying: list[int]) -> None:
    """Until the first of `dying` has exited; a moment, when none is listed: an exiting process is no longer
    listed in its cgroup's `cgroup.procs` but keeps it from being removed until it has left (an escaped agent's
    cgroup was left behind in that window, under load)."""
    if dying:
        await _exited(dying[0])
    else:
        await trio.sleep(0.001)


async def _exited(pid: int) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except (ProcessLookupError, AttributeError, OSError):
        await trio.sleep(0.001)  # gone already, or no pidfds: the next sweep tells
        return
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        trio.lowlevel.notify_closing(pidfd)
        os.close(pidfd)


def _children() -> Iterator[int]:
    """This process's children, from /proc: each thread keeps a list of the children it has."""
    global _children_listed
    if _children_listed is None:
        _children_listed = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
    if not _children_listed:  # a kernel without CONFIG_PROC_CHILDREN
        yield from _children_by_scan()
        return
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children", "rb") as listing:
                text = listing.read()
        except OSError:  # a thread that just ended
            continue
        yield from map(int, text.split())


def _children_by_scan() -> Iterator[int]:
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            status = _stat_fields(int(entry))
            if status is not None and int(status[1]) == me:
                yield int(entry)


def _status(pid: int) -> tuple[str, int, int] | None:
    """(state letter, process group, session) of `pid`, or None once it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return fields[0], int(fields[2]), int(fields[3])


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode("ascii", "replace")
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
