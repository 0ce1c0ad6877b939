"""How much an agent may take: a profile's `limits:` (memory, CPU time, processes, file size, open files).

Each limit is enforced by the one mechanism that can hold it here (docs/sandbox.md, "Limits"):

- `memory_mb` and `processes` need a cgroup controller, `memory` or `pids`.
  cgroup v2 first: the agent's own v2 group (`bridge.confinement.cgroups`) gets
  `memory.max` (and `memory.swap.max` 0) or `pids.max`, once the controller
  is passed down to it (`Containment.pass_down`, which may move the bridge
  into a leaf of its own). Else a cgroup v1 hierarchy with the controller
  that the bridge may make groups in (as root, on the hybrid layout): a group
  of the agent's own there, `<hierarchy>/<the bridge's group>/agent-bridge-<pid>-<random>/<n>`,
  with `memory.limit_in_bytes` or `pids.max`.
  No rlimit stands in for them: RLIMIT_AS caps address space, not memory (a
  JavaScript runtime reserves gigabytes it never touches), and RLIMIT_NPROC
  counts every process of the user, not the agent's, and binds no root.
- `cpu_secs`, `file_size_mb` and `open_files` are rlimits (RLIMIT_CPU,
  RLIMIT_FSIZE, RLIMIT_NOFILE), set by util-linux's `prlimit` in front of the
  agent's command (`prlimit_words`): it sets them on itself and execs the
  agent, so the agent cannot start anything before they hold. (Setting them
  in Python between fork and exec would make Python fork the whole bridge
  instead of vforking it: ~5 ms a turn for a bridge of 40 MB here, bench row
  30, against one exec of prlimit.) They bind each process of the agent (a
  child inherits its own copy): `cpu_secs` is CPU time per process, not for
  all of them together.

A limit no mechanism can hold here is never dropped quietly: the agent is
not started (`LaunchError`, the turn's outcome `spawn_failed`), and
`agent-bridge check` says which and why.

Born inside. The agent must be in its groups before it can fork, so, as for
its cgroup v2 group (`bridge.confinement.cgroups`), the spawning thread joins them for
the instant of the fork (`LimitGroups.joined`, under `SPAWN_LOCK`): in a v1
hierarchy a single thread can move, so nothing else of the bridge is
counted against the agent's limits meanwhile. In v2 the whole bridge process
stands in the agent's group for that instant, and its threads count against
`pids.max`: the limit is raised by their number (and a few more the bridge
might start meanwhile) until the bridge is back home.

An agent that ends while over a limit ends its turn with outcome
`limit_exceeded`, naming the limit (`exceeded`): the out-of-memory killer
acted in its memory group (`memory.events` or v1's `memory.oom_control`), a
fork failed at its `pids.max` (`pids.events`), or it died of SIGXCPU or
SIGXFSZ. An agent that ignores SIGXFSZ (CPython does, from its start) gets
EFBIG from the write instead, and the kernel keeps no trace of the signal it
dropped: the only evidence left is the agent's own stderr naming the error
(`refused_write`), which then names `file_size_mb` too.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

from ..errors import LaunchError
from .cgroups import CONTAINMENT, AgentCgroup, Leftovers, make_directory, read_text, unescape_mount_field, write_text
from .keeper import KEEPER

MIB = 1024 * 1024
# Each limit a controller holds: (controller, the file that sets it in v1, in v2).
_CONTROLLED = {
    "memory_mb": ("memory", "memory.limit_in_bytes", "memory.max"),
    "processes": ("pids", "pids.max", "pids.max"),
}
# Threads the bridge might start while it stands in an agent's v2 group, beyond those it has.
_SPARE_THREADS = 8
_PRLIMIT_OPTIONS = {resource.RLIMIT_CPU: "cpu", resource.RLIMIT_FSIZE: "fsize", resource.RLIMIT_NOFILE: "nofile"}
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
    """A profile's `limits:` section (`Profile.limits`), and how each limit is enforced; None leaves that one
    unlimited."""

    memory_mb: int | None = None
    cpu_secs: int | None = None
    processes: int | None = None
    file_size_mb: int | None = None
    open_files: int | None = None

    @classmethod
    def of(cls, section: ResourceLimits | None) -> ResourceLimits | None:
        """A profile's `limits:`, or None when it sets none."""
        return section if section is not None and section.items() else None

    def items(self) -> list[tuple[str, int]]:
        """(name, value) of each limit set, in the order of the fields."""
        return [(field.name, value) for field in fields(self) if (value := getattr(self, field.name)) is not None]

    def controlled(self) -> list[tuple[str, int]]:
        """The limits only a cgroup controller holds."""
        return [(name, value) for name, value in self.items() if name in _CONTROLLED]

    def rlimits(self) -> tuple[tuple[int, int, int], ...]:
        """(resource, soft, hard) to set on the agent as it starts (`prlimit_words`), within this process's own
        hard limits (only root may raise one). RLIMIT_CPU's hard limit is a second above the soft: SIGXCPU first, which
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


def prlimit_words(prlimit: str, rlimits: tuple[tuple[int, int, int], ...]) -> list[str]:
    """prlimit's words (`prlimit` its path) up to and including the `--` after which the agent's argv follows:
    it sets `rlimits` (`ResourceLimits.rlimits`) on itself and execs the agent."""
    words = [prlimit]
    for which, soft, hard in rlimits:
        words.append(f"--{_PRLIMIT_OPTIONS[which]}={soft}:{hard}")
    words.append("--")
    return words


# --------------------------------------------------------------------------- the v1 groups


@dataclass(slots=True, frozen=True)
class Hierarchy:
    """A cgroup v1 hierarchy with one controller (`memory`, `pids`): `home` is this process's group in it,
    "" when no group can be made there (`reason` says why)."""

    controller: str
    home: str = ""
    reason: str = ""


class AgentGroups:
    """One agent's v1 groups, {controller: path}, and the controllers its v2 group holds limits by
    ({controller: value}, in the group at `v2`)."""

    __slots__ = ("paths", "v2", "in_v2")

    def __init__(self, paths: dict[str, str], v2: str = "", in_v2: dict[str, int] | None = None) -> None:
        self.paths = paths
        self.v2 = v2
        self.in_v2 = in_v2 or {}

    def events(self) -> list[str]:
        """The controlled limits the agent ran into: the OOM killer acted in its memory group, or a fork
        failed at its `pids.max`. Read before the groups are removed."""
        hit = []
        for name, (controller, file_v1, key) in (
            ("memory_mb", ("memory", "memory.oom_control", "oom_kill")),
            ("processes", ("pids", "pids.events", "max")),
        ):
            if controller in self.in_v2:
                events = os.path.join(self.v2, f"{controller}.events")
            elif controller in self.paths:
                events = os.path.join(self.paths[controller], file_v1)
            else:
                continue
            if _counter(events, key):
                hit.append(name)
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
        self._ways: dict[str, tuple[str, str]] = {}  # controller -> ("v2" or "v1", how) or ("", why not)
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
            return f"{_RLIMITS[name][0]} (set by prlimit as the agent starts), per process of the agent", ""
        version, how = self._way(_CONTROLLED[name][0])
        return (how, "") if version else ("", how)

    def held_in_agent_group(self, limits: ResourceLimits | None) -> bool:
        """Whether some of `limits` are held in the agent's own v2 group, which `CONTAINMENT` makes."""
        return limits is not None and any(self._way(_CONTROLLED[name][0])[0] == "v2" for name, _ in limits.controlled())

    def _way(self, controller: str) -> tuple[str, str]:
        """Whether `controller`'s limits are held in cgroup v2 or v1 here, and how — or why neither can: v2 when
        it can reach the agents' groups, else v1. Decided once per process (at its first agent, or `check`)."""
        if controller in self._ways:
            return self._ways[controller]
        file_v1, file_v2 = next(files for c, *files in _CONTROLLED.values() if c == controller)
        plan = CONTAINMENT.plan(controller, _companions())
        hierarchy = self.hierarchies()[controller]
        if not plan.reason:
            moved = " (the bridge moves into a leaf of its own there, to pass the controller down)" if plan.move else ""
            way = ("v2", f"cgroup v2 {file_v2} in the agent's own group below {CONTAINMENT.status().where}{moved}")
        elif hierarchy.home:
            way = ("v1", f"cgroup v1 {file_v1} in a group of its own below {hierarchy.home}")
        else:
            way = ("", f"{hierarchy.reason}, and cgroup v2 cannot hold it: {plan.reason}")
        self._ways[controller] = way
        return way

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

    def create(self, limits: ResourceLimits, cgroup: AgentCgroup | None) -> AgentGroups | None:
        """The agent's groups with its controlled limits set — its v2 `cgroup` (from `CONTAINMENT`) for those v2
        holds, v1 groups made here for the others; None when it has none. Call under `SPAWN_LOCK`.

        Raises `LaunchError` when a limit cannot be enforced here, or a group cannot be made."""
        controlled = limits.controlled()
        if not controlled:
            return None
        refusal = self.refusal(limits)
        if refusal:
            raise LaunchError(126, refusal)
        in_v2 = {
            _CONTROLLED[name][0]: value for name, value in controlled if self._way(_CONTROLLED[name][0])[0] == "v2"
        }
        if in_v2:
            if cgroup is None:
                raise LaunchError(126, "the agent's limits cannot be set up: it has no cgroup v2 group")
            self._set_in_v2(cgroup.path, in_v2)
        paths: dict[str, str] = {}
        with self._lock:
            self._leftovers.remove_what_can_go()
            self._made += 1
            try:
                for name, value in controlled:
                    controller, file, _ = _CONTROLLED[name]
                    if controller in in_v2:
                        continue
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
        return AgentGroups(paths, cgroup.path if cgroup is not None else "", in_v2)

    @staticmethod
    def _set_in_v2(path: str, in_v2: dict[str, int]) -> None:
        """Pass the controllers down to the agent's v2 group at `path`, and set its limits there."""
        for controller in in_v2:
            pass_down(controller)
        try:
            for file, value in v2_settings(in_v2, swap=os.path.exists(os.path.join(path, "memory.swap.max"))):
                write_text(os.path.join(path, file), value)
        except OSError as err:
            raise LaunchError(126, f"the agent's limits cannot be set up: {err.strerror} ({err.filename})") from None

    @contextmanager
    def joined(self, groups: AgentGroups | None) -> Iterator[None]:
        """The calling thread stands in the agent's v1 groups while the block runs (it forks the agent); then back.
        Wraps `Containment.joined`, the move into its v2 group, whose `pids.max` it raises for that while.
        Call under `SPAWN_LOCK`."""
        if groups is None:
            yield
            return
        entered = []
        pids_max = os.path.join(groups.v2, "pids.max")
        try:
            if "pids" in groups.in_v2:  # the whole bridge is about to stand in the v2 group: room for its threads
                write_text(
                    pids_max, str(pids_max_while_joined(groups.in_v2["pids"], len(os.listdir("/proc/self/task"))))
                )
            for controller, path in groups.paths.items():
                write_text(os.path.join(path, "tasks"), "0")
                entered.append(controller)
            yield
        except OSError as err:
            raise LaunchError(126, f"the agent's limit groups cannot be entered: {err.strerror}") from None
        finally:
            for controller in entered:
                write_text(os.path.join(self.hierarchies()[controller].home, "tasks"), "0")
            if "pids" in groups.in_v2:
                write_text(pids_max, str(groups.in_v2["pids"]))

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

    def still_in(self, groups: AgentGroups) -> list[int] | None:
        """The processes keeping an ended agent's groups from being removed ([] while only exiting ones do); None
        once they are."""
        with self._lock:
            return self._leftovers.still_in(groups)

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's groups are the parent's."""
        self._lock = threading.Lock()
        self._hierarchies = None
        self._ways = {}
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


# EFBIG in the words programs print for it: strerror's "File too large" (C, Python, Rust, shells), Go's
# "file too large", Node's "EFBIG", Python's and Rust's errno 27.
_EFBIG_WORDS = re.compile(r"\bEFBIG\b|\b[Ff]ile too large\b|\[Errno 27\]|\(os error 27\)")
REFUSED_WRITE = "file_size_mb refused"  # `refused_write`'s name for file_size_mb, which `describe_exceeded` tells


def refused_write(limits: ResourceLimits | None, returncode: int, stderr_tail: str) -> str:
    """`REFUSED_WRITE` when a failed agent (`returncode` ≠ 0) under `file_size_mb` said on stderr that a write
    failed with EFBIG — the only trace left by an agent that ignores SIGXFSZ, as every Python agent does; else ""."""
    if limits is None or limits.file_size_mb is None or returncode == 0:
        return ""
    return REFUSED_WRITE if _EFBIG_WORDS.search(stderr_tail) else ""


def describe_exceeded(name: str, limits: ResourceLimits | None) -> str:
    """What a turn's error says of limit `name` (the agent "went over …")."""
    how = {
        "memory_mb": "the out-of-memory killer stopped it",
        "cpu_secs": "it was stopped with SIGXCPU",
        "processes": "it could not start another process",
        "file_size_mb": "a write past it was stopped with SIGXFSZ",
        REFUSED_WRITE: 'a write past it failed (EFBIG, "File too large") and it exited',
    }.get(name, "")
    name = "file_size_mb" if name == REFUSED_WRITE else name
    value = getattr(limits, name, None) if limits is not None else None
    setting = f"{name}: {value}" if value is not None else name
    return f"went over its {_WHAT.get(name, name)} limit ({setting})" + (f": {how}" if how else "")


def v2_settings(in_v2: dict[str, int], *, swap: bool) -> list[tuple[str, str]]:
    """(file, value) to write in an agent's v2 group for its limits `in_v2` ({controller: limit}); `swap`: the
    group has `memory.swap.max`. v2 counts swap apart from memory: none, so both together stay below the limit."""
    settings = []
    if "memory" in in_v2:
        settings.append(("memory.max", str(in_v2["memory"] * MIB)))
        if swap:
            settings.append(("memory.swap.max", "0"))
    if "pids" in in_v2:
        settings.append(("pids.max", str(in_v2["pids"])))
    return settings


def pids_max_while_joined(processes: int, threads: int) -> int:
    """An agent's v2 `pids.max` while the bridge, with `threads` threads, stands in its group to fork it."""
    return processes + threads + _SPARE_THREADS


def pass_down(controller: str) -> None:
    """Make cgroup v2 controller `controller` reach the agents' groups (`Containment.pass_down`, the bridge's
    keeper moving with it), and tell the keeper what to take back should the bridge die. Call under `SPAWN_LOCK`."""
    CONTAINMENT.pass_down(controller, _companions())
    KEEPER.take_back(CONTAINMENT.passed_above)


def _companions() -> frozenset[int]:
    """This process's other processes that move with it into its leaf: its keeper."""
    pid = KEEPER.pid
    return frozenset() if pid is None else frozenset({pid})


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
        return Hierarchy(controller, reason=f"no cgroup v1 {controller} hierarchy is mounted")
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
