"""Agents in cgroups of their own, ended with `cgroup.kill`: no `setsid` escapes it.

A process that leaves its agent's process group (`setsid`, a daemon's double
fork) is out of reach of a signal to the group. It is not out of its cgroup:
every process an agent starts stays in the agent's cgroup whatever it does
with sessions and groups, and writing 1 to the cgroup's `cgroup.kill`
SIGKILLs all of them at once (cgroup v2, Linux 5.14 and later).

Where the bridge may make cgroups — as root, or in a subtree systemd delegated
to its user (`Delegate=yes`) — each bridge process gets one directory below
its own cgroup, and each agent a cgroup in it:

    <the bridge's cgroup>/agent-bridge-<pid>-<random>/<n>

The end of a turn, or of a warm agent, kills and removes its agent's cgroup
(`AgentCgroup.end`); when the bridge dies, its keeper kills the whole
directory (`bridge.confinement.keeper`); a directory whose keeper was killed
with its bridge is removed by the next bridge making its own beside it
(`remove_leftovers`). Where no cgroup can be had (no cgroup v2, not
root and nothing delegated, a read-only /sys/fs/cgroup), `status()` says why
and agents run as before: their process groups are killed, and escapees are
caught only by a subreaper (`bridge.confinement.orphans.become_subreaper`).

Born inside. Python 3.11 cannot fork straight into a cgroup (`clone3` with
`CLONE_INTO_CGROUP`), and an agent moved there after its exec could fork
before the move lands. So for the instant of the fork the spawning process
itself joins the agent's cgroup (`joined`) and leaves it as soon as the
agent exists. Every child the bridge starts, the keeper included, is started
under `SPAWN_LOCK`, so no other child is born in an agent's cgroup; a host's
own threads that start processes of their own during that instant would put
them there too (see docs/processes.md).
"""

from __future__ import annotations

import errno
import os
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ..errors import LaunchError

# Every child this process starts (agents, the keeper) is started under this lock: while it is held by a spawn,
# the whole process may stand in an agent's cgroup.
SPAWN_LOCK = threading.Lock()
DIRECTORY_PREFIX = "agent-bridge-"
# The bridge's own leaf inside its directory of agent cgroups, once it had to move there to pass a controller down.
LEAF = "bridge"
# A dead bridge's directory made this long ago is a leftover (`remove_leftovers`; its mtime is when it was made). A
# younger one is left alone: its keeper may still be at work, and a leak stays visible for a while (the test suite
# looks for them).
LEFTOVER_AFTER_SECS = 600.0


class _Removable(Protocol):
    def remove(self) -> bool: ...

    def pids(self) -> list[int]: ...


Group = TypeVar("Group", bound=_Removable)


class Leftovers(Generic[Group]):
    """Ended agents' groups that still held a dying process when last tried: each removed as soon as it can be.
    Not locked: its owner holds its own lock around every call."""

    def __init__(self) -> None:
        self._groups: list[Group] = []

    def keep(self, group: Group) -> None:
        self._groups.append(group)

    def remove_what_can_go(self) -> None:
        self._groups = [group for group in self._groups if not group.remove()]

    def still_in(self, group: Group) -> list[int] | None:
        """The processes keeping `group` from being removed, None once it is (every other that can go goes too).

        [] while only exiting processes hold it: the kernel hides a process from `cgroup.procs` once it begins to
        exit, but it counts until it has left the group — ask again in a moment."""
        self.remove_what_can_go()
        return group.pids() if group in self._groups else None


class ContainmentStatus:
    """Whether agents get cgroups of their own; `where` is the cgroup they go below, `reason` why not."""

    __slots__ = ("available", "where", "reason")

    def __init__(self, available: bool, where: str = "", reason: str = "") -> None:
        self.available = available
        self.where = where
        self.reason = reason

    def __repr__(self) -> str:
        return f"ContainmentStatus(available={self.available}, where={self.where!r}, reason={self.reason!r})"

    def describe(self) -> str:
        if self.available:
            return f"each agent in a cgroup of its own below {self.where} (ended with cgroup.kill)"
        return (
            f"agents are not contained in cgroups: {self.reason}; a process that leaves its agent's process "
            "group is stopped only by a subreaper bridge, and outlives a bridge killed with SIGKILL"
        )


def cgroup2_mount(mountinfo: str) -> tuple[str, str] | None:
    """(mount point, root of the mounted subtree) of the first cgroup v2 file system in `mountinfo`, or None.

    A line of /proc/self/mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS…] - FSTYPE SOURCE SUPEROPTS.
    """
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        words = fields.split()
        if rest.split()[:1] == ["cgroup2"] and len(words) >= 5:
            return unescape_mount_field(words[4]), unescape_mount_field(words[3])
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    """The process's cgroup v2 path (`0::/path` in /proc/self/cgroup), or None."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def unescape_mount_field(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for escaped, character in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, character)
    return field


def read_text(path: str) -> str:
    """A cgroup file's (or /proc file's) text."""
    with open(path, encoding="utf-8", errors="replace") as file:
        return file.read()


def write_text(path: str, text: str) -> None:
    """Write `text` to a cgroup file in one system call (a cgroup file takes one value per write)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(descriptor, text.encode())
    finally:
        os.close(descriptor)


@dataclass(slots=True, frozen=True)
class ControllerPlan:
    """How cgroup v2 controller `controller` reaches the agents' groups (`plan_controller`): first this process
    (and its keeper) moves into its leaf when `move`, then `+controller` is written to the `cgroup.subtree_control`
    of each directory in `enable`, in order. `reason` says why it cannot reach them ("" when it can)."""

    controller: str
    enable: tuple[str, ...] = ()
    move: bool = False
    reason: str = ""


def plan_controller(
    controller: str,
    *,
    home: str,
    directory: str,
    root: bool,
    offered: frozenset[str],
    passed: frozenset[str],
    procs: frozenset[int],
    ours: frozenset[int],
) -> ControllerPlan:
    """How `controller` can be enabled for the groups in `directory`, this process's directory of agent groups
    below `home` — from what was read of `home`: its `cgroup.controllers` (`offered`), `cgroup.subtree_control`
    (`passed`) and `cgroup.procs` (`procs`); `ours` are this process and its keeper.

    The kernel's rule: a cgroup other than the root that holds processes cannot pass a domain controller to its
    children (EBUSY). `directory` never holds one, so it can pass what it has; `home` can when it is the root,
    or once it is empty — when every process in it is ours, this process moves them into a leaf of its own
    (`LEAF`) inside `directory` first.
    """
    if controller in passed:
        return ControllerPlan(controller, enable=(directory,))
    if controller not in offered:
        why = (
            "it is bound to a cgroup v1 hierarchy, or not in this kernel"
            if root
            else "the cgroup above it keeps it; run the bridge under systemd with Delegate=yes, or give it a cgroup "
            "that has the controller"
        )
        listed = " ".join(sorted(offered)) or "none"
        return ControllerPlan(
            controller,
            reason=f"the {controller} controller is not offered to {home} (its cgroup.controllers: {listed}): {why}",
        )
    if root or not procs:
        return ControllerPlan(controller, enable=(home, directory))
    if procs <= ours:
        return ControllerPlan(controller, enable=(home, directory), move=True)
    others = " ".join(str(pid) for pid in sorted(procs - ours)[:5])
    return ControllerPlan(
        controller,
        reason=f"the {controller} controller is not passed to {home}'s children and other processes live in "
        f"{home} (pids {others}{' …' if len(procs - ours) > 5 else ''}): run the bridge as the only process "
        f"of its cgroup (under systemd, a service with Delegate=yes), or write +{controller} to "
        f"{home}/cgroup.subtree_control once those processes are in a cgroup of their own below it",
    )


class AgentCgroup:
    """One agent's cgroup."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def kill(self) -> None:
        """SIGKILL every process in the cgroup, wherever its session or group — never this process: should it
        still stand in the cgroup (it could not leave after a spawn), nothing is killed."""
        try:
            if str(os.getpid()) in read_text(os.path.join(self.path, "cgroup.procs")).split():
                return
            write_text(os.path.join(self.path, "cgroup.kill"), "1")
        except FileNotFoundError:
            pass

    def pids(self) -> list[int]:
        """The processes in the cgroup (none once it is removed)."""
        try:
            return [int(word) for word in read_text(os.path.join(self.path, "cgroup.procs")).split()]
        except FileNotFoundError:
            return []

    def remove(self) -> bool:
        """Remove the cgroup; False while a process is still in it."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass
        except OSError as err:
            if err.errno == errno.EBUSY:
                return False
            raise
        return True


class Containment:
    """This process's agent cgroups: found once, made as agents start, removed as they end. Thread-safe."""

    def __init__(self) -> None:
        self._status: ContainmentStatus | None = None
        self._home = ""  # the cgroup this process lives in, which it returns to after each spawn
        self._above = ""  # the cgroup its directory is made in: `_home` until it moves into its `LEAF`
        self._root = False  # `_above` is the root cgroup, which may hold processes and pass controllers down
        self._directory = ""  # this process's directory of agent cgroups, once made
        self._passed: list[str] = []  # controllers passed to the agents' groups
        self._passed_above: list[str] = []  # of which `_above` passed down only because this process asked
        self._made = 0
        self._leftovers: Leftovers[AgentCgroup] = Leftovers()
        self._lock = threading.Lock()

    @property
    def directory(self) -> str:
        """This process's directory of agent cgroups; "" until the first agent, or without cgroups."""
        return self._directory

    def status(self) -> ContainmentStatus:
        """Whether agents get cgroups here, and why not (found once per process; creates nothing)."""
        if self._status is None:
            self._status, self._home = _probe()
            self._above = self._home
            self._root = bool(self._home) and not os.path.exists(os.path.join(self._home, "cgroup.type"))
        return self._status

    @property
    def passed_above(self) -> tuple[str, ...]:
        """The controllers this process had its directory's parent pass down (its keeper takes them back)."""
        return tuple(self._passed_above)

    def plan(self, controller: str, ours: frozenset[int] = frozenset()) -> ControllerPlan:
        """How cgroup v2 controller `controller` would reach the agents' groups, or why it cannot (reads, changes
        nothing). `ours`: this process's other processes that may move with it (its keeper)."""
        status = self.status()
        if not status.available:
            return ControllerPlan(controller, reason=f"agents get no cgroup v2 group here: {status.reason}")
        if controller in self._passed:
            return ControllerPlan(controller)
        try:
            offered, passed = (
                frozenset(read_text(os.path.join(self._above, name)).split())
                for name in ("cgroup.controllers", "cgroup.subtree_control")
            )
            procs = frozenset(int(word) for word in read_text(os.path.join(self._above, "cgroup.procs")).split())
        except OSError as err:
            return ControllerPlan(controller, reason=f"{self._above} cannot be read ({err.strerror})")
        return plan_controller(
            controller,
            home=self._above,
            directory=self._directory or os.path.join(self._above, f"{DIRECTORY_PREFIX}{os.getpid()}-…"),
            root=self._root,
            offered=offered,
            passed=passed,
            procs=procs,
            ours=ours | {os.getpid()},
        )

    def pass_down(self, controller: str, ours: frozenset[int] = frozenset()) -> None:
        """Make cgroup v2 controller `controller` reach every agent group (`plan`): once, at the first agent that
        needs it; this process (and `ours`) may move into its leaf for it. Call under `SPAWN_LOCK`.

        Raises `LaunchError` when it cannot."""
        if controller in self._passed:
            return
        with self._lock:
            try:
                plan = self.plan(controller, ours)
                if plan.reason:
                    raise LaunchError(126, f"the agent's limits cannot be set up: {plan.reason}")
                if not self._directory:
                    self._make_directory()
                    plan = self.plan(controller, ours)  # now with the directory's own path
                if plan.move:
                    leaf = os.path.join(self._directory, LEAF)
                    os.makedirs(leaf, exist_ok=True)
                    for pid in sorted(ours):
                        write_text(os.path.join(leaf, "cgroup.procs"), str(pid))
                    write_text(os.path.join(leaf, "cgroup.procs"), "0")
                    self._home = leaf
                for directory in plan.enable:
                    write_text(os.path.join(directory, "cgroup.subtree_control"), f"+{controller}")
                    if directory == self._above:
                        self._passed_above.append(controller)
            except OSError as err:
                why = f"{err.strerror} ({err.filename})" if err.filename else str(err.strerror)
                raise LaunchError(126, f"the {controller} controller cannot be passed to the agents: {why}") from None
            self._passed.append(controller)

    def _make_directory(self) -> None:
        """This process's directory of agent cgroups, made at its first agent; then, once per process, the
        directories that bridges killed together with their keepers left beside it go (`remove_leftovers`)."""
        self._directory = make_directory(self._above)
        remove_leftovers(self._above)

    def turn_off(self, reason: str = "turned off by the host") -> None:
        """No cgroups for agents in this process from now on (a host whose process must not move between
        cgroups, even for the instant of a fork); call before the first agent starts."""
        with self._lock:
            self._status = ContainmentStatus(False, reason=reason)

    def create(self) -> AgentCgroup | None:
        """A new, empty cgroup for the next agent; None without cgroups. Call under `SPAWN_LOCK`.

        Raises `LaunchError` when it cannot be made (the cgroup file system is out of room, or was taken away).
        """
        if not self.status().available:
            return None
        with self._lock:
            self._leftovers.remove_what_can_go()
            self._made += 1
            try:
                if not self._directory:
                    self._make_directory()
                path = os.path.join(self._directory, str(self._made))
                try:
                    os.mkdir(path)
                except FileNotFoundError:  # removed as a dead bridge's by a bridge in another PID namespace
                    self._directory = make_directory(self._above)
                    path = os.path.join(self._directory, str(self._made))
                    os.mkdir(path)
            except OSError as err:
                raise LaunchError(
                    126, f"no cgroup can be made for the agent in {self._directory or self._above}: {err.strerror}"
                ) from None
        return AgentCgroup(path)

    @contextmanager
    def joined(self, group: AgentCgroup | None) -> Iterator[None]:
        """This whole process stands in `group` while the block runs (it forks the agent); then back home.

        Call under `SPAWN_LOCK`. The first move after a quiet spell waits for the kernel (an RCU grace period:
        ~0.2 ms on a 6.18 kernel, ms under load, 10–20 ms on older ones); later ones take tens of microseconds.
        """
        if group is None:
            yield
            return
        try:
            write_text(os.path.join(group.path, "cgroup.procs"), "0")
        except OSError as err:
            raise LaunchError(126, f"the agent's cgroup {group.path} cannot be entered: {err.strerror}") from None
        try:
            yield
        finally:
            write_text(os.path.join(self._home, "cgroup.procs"), "0")

    def end(self, group: AgentCgroup) -> None:
        """The agent is reaped: kill whatever is left in its cgroup, and remove the cgroup (now, or later)."""
        if group.remove():
            return
        group.kill()
        if not group.remove():
            with self._lock:
                self._leftovers.keep(group)

    def still_in(self, group: AgentCgroup) -> list[int] | None:
        """The processes keeping an ended agent's cgroup from being removed (wait for them to exit, then ask
        again; [] while only exiting ones do); None once it is removed. Every other such cgroup that can be
        removed now is."""
        with self._lock:
            return self._leftovers.still_in(group)

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's directory and cgroups are the parent's."""
        self._lock = threading.Lock()
        self._status = None
        self._home = self._above = self._directory = ""
        self._root = False
        self._passed, self._passed_above = [], []
        self._made = 0
        self._leftovers = Leftovers()


def _probe() -> tuple[ContainmentStatus, str]:
    """(status, the cgroup directory this process lives in)."""
    try:
        mount = cgroup2_mount(read_text("/proc/self/mountinfo"))
        path = own_cgroup(read_text("/proc/self/cgroup"))
    except OSError as err:
        return ContainmentStatus(False, reason=f"/proc cannot be read ({err.strerror})"), ""
    if mount is None:
        return ContainmentStatus(False, reason="no cgroup v2 file system is mounted"), ""
    if path is None:
        return ContainmentStatus(False, reason="this process has no cgroup v2 path in /proc/self/cgroup"), ""
    mount_point, mounted_root = mount
    if mounted_root != "/":
        if path != mounted_root and not path.startswith(mounted_root.rstrip("/") + "/"):
            return ContainmentStatus(False, reason=f"this process's cgroup {path} is outside the mounted one"), ""
        path = path[len(mounted_root.rstrip("/")) :]
    home = os.path.join(mount_point, path.lstrip("/")).rstrip("/") or "/"
    if "\n" in home:  # the keeper reads the directory's path as one line
        return ContainmentStatus(False, reason=f"this process's cgroup path {home!r} holds a newline"), ""
    if not os.path.exists(os.path.join(home, "cgroup.procs")):
        return ContainmentStatus(False, reason=f"this process's cgroup {home} cannot be found"), ""
    try:
        trial = make_directory(home)
    except OSError as err:
        why = (
            "it is not writable: run the bridge as root, or under systemd with Delegate=yes"
            if err.errno in (errno.EACCES, errno.EPERM)
            else "the cgroup file system is read-only"
            if err.errno == errno.EROFS
            else err.strerror
        )
        return ContainmentStatus(False, where=home, reason=f"no cgroup can be made in {home}: {why}"), ""
    try:
        killable = os.path.exists(os.path.join(trial, "cgroup.kill"))
    finally:
        os.rmdir(trial)
    if not killable:
        return ContainmentStatus(
            False, where=home, reason="the kernel has no cgroup.kill (Linux 5.14 or later has)"
        ), ""
    return ContainmentStatus(True, where=home), home


def make_directory(home: str) -> str:
    """A new directory `agent-bridge-<pid>-<random>` in cgroup `home` (cgroup v2, or a v1 hierarchy)."""
    while True:
        path = os.path.join(home, f"{DIRECTORY_PREFIX}{os.getpid()}-{secrets.token_hex(3)}")
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return path


def directory_owner(name: str) -> int | None:
    """The pid in a bridge's directory name, `agent-bridge-<pid>-<6 hex digits>` (`make_directory`), else None."""
    if not name.startswith(DIRECTORY_PREFIX):
        return None
    pid, _, suffix = name[len(DIRECTORY_PREFIX) :].partition("-")
    if not (pid.isdigit() and len(suffix) == 6 and all(digit in "0123456789abcdef" for digit in suffix)):
        return None
    return int(pid)


def remove_leftovers(home: str) -> list[str]:
    """Remove from cgroup `home` the directories of agent cgroups that bridges killed together with their keepers
    left there (`kill -9` of a whole process tree): each `agent-bridge-<pid>-…` of a pid that no longer runs,
    made over `LEFTOVER_AFTER_SECS` ago — its empty groups first, then itself. The kernel refuses to remove a
    group a process still holds: such a directory stays. Returns the paths removed.

    Pids are this process's PID namespace's: a bridge in another one, in the same cgroup, would look dead."""
    try:
        names = os.listdir(home)
    except OSError:
        return []
    removed = []
    for name in names:
        pid = directory_owner(name)
        if pid is None or pid == os.getpid() or _runs(pid):
            continue
        path = os.path.join(home, name)
        try:
            if time.time() - os.stat(path).st_mtime < LEFTOVER_AFTER_SECS:
                continue
            for entry in os.scandir(path):
                if entry.is_dir(follow_symlinks=False):
                    os.rmdir(entry.path)
            os.rmdir(path)
        except OSError:  # a group still in use, or gone meanwhile (its keeper, another bridge)
            continue
        removed.append(path)
    return removed


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


CONTAINMENT = Containment()
os.register_at_fork(after_in_child=CONTAINMENT.forget_after_fork)
