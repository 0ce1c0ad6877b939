"""How much an agent may take: a profile's `limits:` (memory, CPU time, processes, file size, open files).

Each limit is enforced by the one mechanism that can hold it here (docs/sandbox.md, "Limits"):

- `memory_mb` and `processes` need a cgroup controller: a cgroup v1 `memory`
  (`memory.limit_in_bytes`) or `pids` (`pids.max`) hierarchy the bridge may
  make groups in (as root). Each agent gets a group of its own in each, below
  the bridge's own group there: `<hierarchy>/<the bridge's group>/agent-bridge-<pid>-<random>/<n>`.
  No rlimit stands in for them: RLIMIT_AS caps address space, not memory (a
  JavaScript runtime reserves gigabytes it never touches), and RLIMIT_NPROC
  counts every process of the user, not the agent's, and binds no root.
- `cpu_secs`, `file_size_mb` and `open_files` are rlimits (RLIMIT_CPU,
  RLIMIT_FSIZE, RLIMIT_NOFILE), set in the agent between its fork and its
  exec, so it cannot start anything before they hold. They bind each process
  of the agent (a child inherits its own copy): `cpu_secs` is CPU time per
  process, not for all of them together.

A limit no mechanism can hold here is never dropped quietly: the agent is
not started (`LaunchError`, the turn's outcome `spawn_failed`), and
`agent-bridge check` says which and why.

Born inside. The agent must be in its groups before it can fork, so, as for
its cgroup v2 group (`bridge.cgroups`), the spawning thread joins them for
the instant of the fork (`LimitGroups.joined`, under `SPAWN_LOCK`): in a v1
hierarchy a single thread can move, so nothing else of the bridge is
counted against the agent's limits meanwhile.

An agent that ends while over a limit ends its turn with outcome
`limit_exceeded`, naming the limit (`exceeded`): the out-of-memory killer
acted in its memory group, a fork failed at its `pids.max`, or it died of
SIGXCPU or SIGXFSZ.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from .cgroups import Leftovers, make_directory, read_text, unescape_mount_field, write_text
from .errors import LaunchError

MIB = 1024 * 1024
NAMES = ("memory_mb", "cpu_secs", "processes", "file_size_mb", "open_files")
# Each limit a v1 controller holds: (hierarchy, the file that sets it).
_CONTROLLED = {"memory_mb": ("memory", "memory.limit_in_bytes"), "processes": ("pids", "pids.max")}
_RLIMITS = {
    "cpu_secs": ("RLIMIT_CPU", resource.RLIMIT_CPU, 1),
    "file_size_mb": ("RLIMIT_FSIZE", resource.RLIMIT_FSIZE, MIB),
    "open_files": ("RLIMIT_NOFILE", resource.RLIMIT_NOFILE, 1),
}
_WHAT = {
    "memory_mb": "memory",
    "cpu_secs": "CPU time",
    "processes": "process",
    "file_size_mb": "file size",
    "open_files": "open file",
}


@dataclass(slots=True, frozen=True)
class ResourceLimits:
    """A profile's `limits:`; None leaves that one unlimited."""

    memory_mb: int | None = None
    cpu_secs: int | None = None
    processes: int | None = None
    file_size_mb: int | None = None
    open_files: int | None = None

    @classmethod
    def of(cls, section: Mapping[str, Any] | None) -> ResourceLimits | None:
        """The limits of a profile's (validated) `limits:` section; None when it sets none."""
        if not section:
            return None
        limits = cls(**{name: section.get(name) for name in NAMES})
        return limits if limits.items() else None

    def items(self) -> list[tuple[str, int]]:
        """(name, value) of each limit set, in `NAMES` order."""
        return [(field.name, value) for field in fields(self) if (value := getattr(self, field.name)) is not None]

    def controlled(self) -> list[tuple[str, int]]:
        """The limits only a cgroup controller holds."""
        return [(name, value) for name, value in self.items() if name in _CONTROLLED]

    def rlimits(self) -> tuple[tuple[int, int, int], ...]:
        """(resource, soft, hard) to set in the agent before its exec, within this process's own hard limits
        (only root may raise one). RLIMIT_CPU's hard limit is a second above the soft: SIGXCPU first, which
        names the limit, then SIGKILL for an agent that ignores it."""
        found = []
        for name, value in self.items():
            if name not in _RLIMITS:
                continue
            _, which, unit = _RLIMITS[name]
            soft = value * unit
            hard = soft + 1 if which == resource.RLIMIT_CPU else soft
            ceiling = resource.getrlimit(which)[1]
            if ceiling != resource.RLIM_INFINITY:
                soft, hard = min(soft, ceiling), min(hard, ceiling)
            found.append((which, soft, hard))
        return tuple(found)


def set_rlimits(rlimits: tuple[tuple[int, int, int], ...]) -> None:
    """In the agent, between fork and exec: set its rlimits (`ResourceLimits.rlimits`)."""
    for which, soft, hard in rlimits:
        resource.setrlimit(which, (soft, hard))


# --------------------------------------------------------------------------- the v1 groups


@dataclass(slots=True, frozen=True)
class Hierarchy:
    """A cgroup v1 hierarchy with one controller (`memory`, `pids`): `home` is this process's group in it,
    "" when no group can be made there (`reason` says why)."""

    controller: str
    home: str = ""
    reason: str = ""


class AgentGroups:
    """One agent's v1 groups: {controller: path}."""

    __slots__ = ("paths",)

    def __init__(self, paths: dict[str, str]) -> None:
        self.paths = paths

    def events(self) -> list[str]:
        """The controlled limits the agent ran into: the OOM killer acted in its memory group, or a fork
        failed at its `pids.max`. Read before the groups are removed."""
        hit = []
        memory = self.paths.get("memory")
        if memory is not None and _counter(os.path.join(memory, "memory.oom_control"), "oom_kill"):
            hit.append("memory_mb")
        pids = self.paths.get("pids")
        if pids is not None and _counter(os.path.join(pids, "pids.events"), "max"):
            hit.append("processes")
        return hit

    def pids(self) -> list[int]:
        """The processes in any of the groups (none once they are removed)."""
        found: set[int] = set()
        for path in self.paths.values():
            try:
                found.update(int(word) for word in read_text(os.path.join(path, "cgroup.procs")).split())
            except FileNotFoundError:
                pass
        return sorted(found)

    def remove(self) -> bool:
        """Remove every group that can be; False while a process is still in one."""
        removed = True
        for path in self.paths.values():
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as err:
                if err.errno != errno.EBUSY:
                    raise
                removed = False
        return removed


class LimitGroups:
    """This process's v1 groups for agents' controlled limits: found once, made as agents start, removed as
    they end. Thread-safe."""

    def __init__(self) -> None:
        self._hierarchies: dict[str, Hierarchy] | None = None
        self._directories: dict[str, str] = {}  # controller -> this process's directory of agent groups there
        self._made = 0
        self._leftovers: Leftovers[AgentGroups] = Leftovers()
        self._lock = threading.Lock()

    @property
    def directories(self) -> tuple[str, ...]:
        """The directories of agent groups made so far (the keeper removes them if this process dies)."""
        return tuple(self._directories.values())

    def hierarchies(self) -> dict[str, Hierarchy]:
        """The `memory` and `pids` hierarchies, and whether this process can make groups in them (found once)."""
        if self._hierarchies is None:
            self._hierarchies = _probe()
        return self._hierarchies

    def mechanism(self, name: str) -> tuple[str, str]:
        """(how limit `name` is held here, "") or ("", why it cannot be)."""
        if name in _RLIMITS:
            return f"{_RLIMITS[name][0]}, per process of the agent", ""
        controller, file = _CONTROLLED[name]
        hierarchy = self.hierarchies()[controller]
        if hierarchy.home:
            return f"cgroup v1 {file} in a group of its own below {hierarchy.home}", ""
        return "", hierarchy.reason

    def describe(self, limits: ResourceLimits) -> list[tuple[str, bool]]:
        """A line for each limit, for `check`: how it is enforced here, or why it cannot be (False)."""
        lines = []
        for name, value in limits.items():
            mechanism, reason = self.mechanism(name)
            if mechanism:
                lines.append((f"limit {name}: {value} by {mechanism}", True))
            else:
                refused = f"limit {name}: {value} cannot be enforced here ({reason}): the agent will not start"
                lines.append((refused, False))
        return lines

    def refusal(self, limits: ResourceLimits) -> str:
        """Why an agent with these limits cannot be started here; "" when every limit can be held."""
        missing = []
        for name, _ in limits.controlled():
            mechanism, reason = self.mechanism(name)
            if not mechanism:
                missing.append(f"{name} ({reason})")
        if not missing:
            return ""
        return (
            f"its limits cannot all be enforced here: {'; '.join(missing)}; the agent is not run without them "
            "(remove the limit from the profile, or run the bridge where it can make cgroups: docs/sandbox.md)"
        )

    def create(self, limits: ResourceLimits) -> AgentGroups | None:
        """The agent's groups with its controlled limits set; None when it has none. Call under `SPAWN_LOCK`.

        Raises `LaunchError` when a limit cannot be enforced here, or a group cannot be made."""
        controlled = limits.controlled()
        if not controlled:
            return None
        refusal = self.refusal(limits)
        if refusal:
            raise LaunchError(126, refusal)
        paths: dict[str, str] = {}
        with self._lock:
            self._leftovers.remove_what_can_go()
            self._made += 1
            try:
                for name, value in controlled:
                    controller, file = _CONTROLLED[name]
                    directory = self._directories.get(controller)
                    if directory is None:
                        directory = self._directories[controller] = make_directory(self.hierarchies()[controller].home)
                    path = os.path.join(directory, str(self._made))
                    os.mkdir(path)
                    paths[controller] = path
                    if controller == "memory":
                        write_text(os.path.join(path, file), str(value * MIB))
                        swap = os.path.join(path, "memory.memsw.limit_in_bytes")
                        if os.path.exists(swap):  # swap counted too, else the limit only moves memory to swap
                            write_text(swap, str(value * MIB))
                    else:
                        write_text(os.path.join(path, file), str(value))
            except OSError as err:
                AgentGroups(paths).remove()
                why = f"{err.strerror} ({err.filename})"
                raise LaunchError(126, f"the agent's limits cannot be set up: {why}") from None
        return AgentGroups(paths)

    @contextmanager
    def joined(self, groups: AgentGroups | None) -> Iterator[None]:
        """The calling thread stands in the agent's groups while the block runs (it forks the agent); then back.
        Call under `SPAWN_LOCK`."""
        if groups is None:
            yield
            return
        entered = []
        try:
            for controller, path in groups.paths.items():
                write_text(os.path.join(path, "tasks"), "0")
                entered.append(controller)
            yield
        except OSError as err:
            raise LaunchError(126, f"the agent's limit groups cannot be entered: {err.strerror}") from None
        finally:
            for controller in entered:
                write_text(os.path.join(self.hierarchies()[controller].home, "tasks"), "0")

    def end(self, groups: AgentGroups) -> None:
        """The agent is reaped: kill whatever is left in its groups, and remove them (now, or later)."""
        if groups.remove():
            return
        for pid in groups.pids():  # listed in a group only the agent's processes enter
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not groups.remove():
            with self._lock:
                self._leftovers.keep(groups)

    def still_in(self, groups: AgentGroups) -> list[int]:
        """The processes keeping an ended agent's groups from being removed; [] once they are."""
        with self._lock:
            return self._leftovers.still_in(groups)

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's groups are the parent's."""
        self._lock = threading.Lock()
        self._hierarchies = None
        self._directories = {}
        self._made = 0
        self._leftovers = Leftovers()


def exceeded(limits: ResourceLimits | None, returncode: int, events: list[str]) -> str:
    """The limit a failed agent (`returncode` ≠ 0, or killed) ran into, by its groups' `events` or the signal
    that killed it — or killed the process whose status it passed on as 128+N, as a shell or bwrap does;
    "" when none is known."""
    if limits is None or returncode == 0:
        return ""
    if events:
        return events[0]
    for signum, name in ((signal.SIGXCPU, "cpu_secs"), (signal.SIGXFSZ, "file_size_mb")):
        if returncode in (-signum, 128 + signum) and getattr(limits, name) is not None:
            return name
    return ""


def describe_exceeded(name: str, limits: ResourceLimits | None) -> str:
    """What a turn's error says of limit `name` (the agent "went over …")."""
    value = getattr(limits, name, None) if limits is not None else None
    setting = f"{name}: {value}" if value is not None else name
    how = {
        "memory_mb": "the out-of-memory killer stopped it",
        "cpu_secs": "it was stopped with SIGXCPU",
        "processes": "it could not start another process",
        "file_size_mb": "a write past it was stopped with SIGXFSZ",
    }.get(name, "")
    return f"went over its {_WHAT.get(name, name)} limit ({setting})" + (f": {how}" if how else "")


def _counter(path: str, key: str) -> int:
    """A `key value` line's value in a cgroup's events file (0 when absent or unreadable)."""
    try:
        text = read_text(path)
    except OSError:
        return 0
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == key and words[1].isdigit():
            return int(words[1])
    return 0


def _probe() -> dict[str, Hierarchy]:
    try:
        mountinfo = read_text("/proc/self/mountinfo")
        own = read_text("/proc/self/cgroup")
    except OSError as err:
        reason = f"/proc cannot be read ({err.strerror})"
        return {controller: Hierarchy(controller, reason=reason) for controller in ("memory", "pids")}
    return {controller: _probe_one(controller, mountinfo, own) for controller in ("memory", "pids")}


def _probe_one(controller: str, mountinfo: str, own: str) -> Hierarchy:
    mount = _v1_mount(mountinfo, controller)
    if mount is None:
        return Hierarchy(
            controller,
            reason=f"no cgroup v1 {controller} hierarchy is mounted (cgroup v2 controllers are not used yet)",
        )
    mount_point, mounted_root = mount
    path = None
    for line in own.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            path = parts[2]
    if path is None or not (path == mounted_root or path.startswith(mounted_root.rstrip("/") + "/")):
        return Hierarchy(controller, reason=f"this process's {controller} group is outside the mounted hierarchy")
    home = os.path.join(mount_point, path[len(mounted_root.rstrip("/")) :].lstrip("/")).rstrip("/")
    if "\n" in home:  # the keeper reads each directory as one line
        return Hierarchy(controller, reason=f"this process's {controller} group path holds a newline")
    try:
        trial = make_directory(home)
    except OSError as err:
        why = "run the bridge as root" if err.errno in (errno.EACCES, errno.EPERM) else err.strerror
        return Hierarchy(controller, reason=f"no group can be made in {home}: {why}")
    os.rmdir(trial)
    return Hierarchy(controller, home=home)


def _v1_mount(mountinfo: str, controller: str) -> tuple[str, str] | None:
    """(mount point, mounted root) of the cgroup v1 hierarchy holding `controller`."""
    for line in mountinfo.splitlines():
        fields_, _, rest = line.partition(" - ")
        words, after = fields_.split(), rest.split()
        if len(words) >= 5 and len(after) >= 3 and after[0] == "cgroup" and controller in after[2].split(","):
            return unescape_mount_field(words[4]), unescape_mount_field(words[3])
    return None


LIMIT_GROUPS = LimitGroups()
os.register_at_fork(after_in_child=LIMIT_GROUPS.forget_after_fork)
