"""The keeper: agents never outlive the bridge that started them, however it dies.

A bridge killed with SIGKILL, by the OOM killer or by a crashed container
runs no `finally` block, so it cannot stop its agents itself. Something that
survives it must. The keeper is a tiny `/bin/sh` process, started once per
bridge process (before its first agent) in a session of its own, so that no
signal aimed at the bridge's terminal or process group reaches it. It ignores
SIGTERM too: a supervisor that stops a whole process tree (systemd's stop,
acpx closing its agent, any tree-kill) signals the keeper with its bridge,
and a keeper gone first would leave the bridge's cgroup directory behind. It
ends on its own once the bridge has.

It holds two things from the bridge:
- its stdin, a pipe whose only writer is the bridge. Nothing is ever written:
  the keeper just waits for the end of file, which the kernel delivers when
  the bridge dies, whatever killed it;
- a registry, an anonymous in-memory file (memfd) the bridge updates in place
  with `pwrite`: one fixed-width slot per agent group, `PGID GRACE_MS`, blank
  when free. Updating it wakes nobody, so guarding an agent costs the bridge
  two small writes per turn and costs the keeper nothing.

At the end of file the keeper reads the registry, sends SIGTERM to every
group in it, and SIGKILL to each one still alive after its own grace — what a
timeout does. A group whose processes are all zombies is dead: their parent,
the bridge, is gone, and whoever adopted them reaps them at its own pace.
Where agents have cgroups of their own (`bridge.confinement.cgroups`), the
registry's first line names the bridge's directory of them: the keeper then
kills every process left in it with `cgroup.kill` — whatever left its agent's
group (`setsid`) included — and removes the directory. Where the bridge had
moved itself into a leaf of that directory to pass a cgroup v2 controller
down (`bridge.confinement.cgroups.LEAF`), the keeper, which lives there too, kills the
agents' groups one by one instead, then undoes the move: it takes back the
controllers the second line names from the directory's parent, moves what
is left in the leaf (itself, any other child of the bridge) back there, and
removes the leaf and the directory. The lines after it
name the directories of the agents' cgroup v1 groups for their limits
(`bridge.confinement.limits`), up to a blank line: the keeper kills what is left in
them and removes them too. When the bridge ends normally the registry holds
no group and the keeper only tidies up.

A group's slot is cleared only after the bridge has SIGKILLed the group
while its leader is still an unreaped zombie, so the registry never holds the
id of a group that a stranger could have taken while the bridge lived. A
`pwrite` is one system call, so a bridge killed at any moment leaves each slot
either old or new, never torn.
"""

from __future__ import annotations

import os
import subprocess
import threading

from .cgroups import LEAF

NAME = "agent-bridge-keeper"
_HEADER = 4096  # the agents' cgroup directory (or nothing), controllers to take back, their v1 limit directories
_SLOT = 32  # bytes per registry slot after it: "PGID GRACE_MS", space-padded, then a newline
_FREE = b" " * (_SLOT - 1) + b"\n"
_SCRIPT = r"""
trap '' INT HUP TERM
# Whether group $1 has a process that is not a zombie: one whose parent died is reaped by an init or subreaper at
# its own pace, and `kill -0` counts it alive, so a dead group would hold the keeper for the whole grace.
alive() {
  for stat in /proc/[0-9]*/stat; do
    read -r line < "$stat" 2>/dev/null || continue
    set -f; set -- "$1" ${line##*") "}; set +f
    [ "$4" = "$1" ] && [ "$2" != Z ] && return 0
  done
  return 1
}
while read -r _; do :; done
groups=
{
  IFS= read -r cgroup
  read -r passed
  limited=
  while IFS= read -r directory && [ -n "$directory" ]; do limited="$limited$directory
"; done
  while read -r group grace; do
    case $group$grace in ''|*[!0-9]*) continue ;; esac
    groups="$groups $group:$grace"
  done
} < "/proc/self/fd/$1"
for entry in $groups; do kill -s TERM -- "-${entry%%:*}" 2>/dev/null; done
waited=0
while [ -n "$groups" ]; do
  left=
  for entry in $groups; do
    group=${entry%%:*}
    alive "$group" || continue
    if [ "$waited" -ge "${entry#*:}" ]; then kill -s KILL -- "-$group" 2>/dev/null; else left="$left $entry"; fi
  done
  groups=$left
  [ -n "$groups" ] || break
  sleep 0.05
  waited=$((waited + 50))
done
case $cgroup in /*)
  leaf="$cgroup/$2/"
  if [ -d "$leaf" ]; then
    for agent in "$cgroup"/*/; do [ "$agent" = "$leaf" ] || echo 1 > "${agent}cgroup.kill" 2>/dev/null; done
  else
    echo 1 > "$cgroup/cgroup.kill" 2>/dev/null
  fi
  tries=0
  while [ -d "$cgroup" ] && [ "$tries" -lt 100 ]; do
    left=
    for agent in "$cgroup"/*/; do
      [ "$agent" = "$leaf" ] || rmdir "$agent" 2>/dev/null || left=1
    done
    if [ -z "$left" ] && [ -d "$leaf" ]; then
      for controller in $(cat "$cgroup/cgroup.subtree_control"); do
        echo "-$controller" > "$cgroup/cgroup.subtree_control" 2>/dev/null
      done
      for controller in $passed; do echo "-$controller" > "${cgroup%/*}/cgroup.subtree_control" 2>/dev/null; done
      while read -r pid; do echo "$pid" > "${cgroup%/*}/cgroup.procs" 2>/dev/null; done < "${leaf}cgroup.procs"
      rmdir "$leaf" 2>/dev/null
    fi
    rmdir "$cgroup" 2>/dev/null && break
    sleep 0.05
    tries=$((tries + 1))
  done
esac
IFS='
'
for directory in $limited; do
  tries=0
  while [ -d "$directory" ] && [ "$tries" -lt 100 ]; do
    for agent in "$directory"/*/; do
      [ -d "$agent" ] || continue
      while read -r pid; do kill -s KILL "$pid" 2>/dev/null; done < "$agent/cgroup.procs"
      rmdir "$agent" 2>/dev/null
    done
    rmdir "$directory" 2>/dev/null && break
    sleep 0.05
    tries=$((tries + 1))
  done
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
        self._pipe = -1  # our end of the keeper's stdin; closed only by our death (or a fork's child)
        self._registry = -1
        self._cgroups = ""  # the directory of agent cgroups named in the registry's header
        self._passed: tuple[str, ...] = ()  # the controllers its parent passes down only for the bridge
        self._limit_groups: tuple[str, ...] = ()  # the directories of agents' v1 limit groups named there too
        self._slots: dict[int, int] = {}  # pgid -> slot
        self._free: list[int] = []  # slots cleared for reuse
        self._used = 0  # slots ever used

    @property
    def pid(self) -> int | None:
        """The keeper's pid, once it runs."""
        process = self._process
        return process.pid if process is not None else None

    def start(self) -> None:
        """Make sure a keeper runs: start one, or replace one that died. Call before spawning an agent, under
        `bridge.confinement.cgroups.SPAWN_LOCK` (the keeper must not be born in an agent's cgroup)."""
        with self._lock:
            self._open_registry()
            if self._process is None or self._process.poll() is not None:
                self._spawn()

    def contain(self, directory: str) -> None:
        """Should this process die, kill every process in the cgroup `directory` (after the groups' grace)."""
        with self._lock:
            if directory != self._cgroups:
                self._write_header(directory, self._passed, self._limit_groups)

    def take_back(self, controllers: tuple[str, ...]) -> None:
        """Should this process die, take these cgroup v2 controllers back from its directory's parent (after
        undoing its move into its leaf there)."""
        with self._lock:
            if controllers != self._passed:
                self._write_header(self._cgroups, controllers, self._limit_groups)

    def contain_limit_groups(self, directories: tuple[str, ...]) -> None:
        """Should this process die, kill every process in these directories of cgroup v1 groups, and remove them."""
        with self._lock:
            if directories != self._limit_groups:
                self._write_header(self._cgroups, self._passed, directories)

    def _write_header(self, cgroups: str, passed: tuple[str, ...], limit_groups: tuple[str, ...]) -> None:
        self._open_registry()
        lines = (cgroups, " ".join(passed), *limit_groups)
        header = "".join(f"{line}\n" for line in lines).encode() + b"\n"
        if len(header) > _HEADER:
            raise ValueError(f"cgroup paths of over {_HEADER - 3} bytes: {lines!r}")
        os.pwrite(self._registry, header.ljust(_HEADER, b"\n"), 0)
        self._cgroups, self._passed, self._limit_groups = cgroups, passed, limit_groups

    def guard(self, pgid: int, grace_secs: float) -> None:
        """Kill group `pgid` (SIGTERM, then SIGKILL after `grace_secs`) if this process dies."""
        record = f"{pgid} {max(0, round(grace_secs * 1000))}".encode()
        with self._lock:
            self._open_registry()
            slot = self._free.pop() if self._free else self._next_slot()
            self._slots[pgid] = slot
            os.pwrite(self._registry, record.ljust(_SLOT - 1) + b"\n", _HEADER + slot * _SLOT)

    def release(self, pgid: int) -> None:
        """Group `pgid` is dead (or about to be, SIGKILLed): stop guarding it."""
        with self._lock:
            slot = self._slots.pop(pgid, None)
            if slot is not None:
                os.pwrite(self._registry, _FREE, _HEADER + slot * _SLOT)
                self._free.append(slot)

    def registry(self) -> bytes:
        """The registry as the keeper reads it: the header line, then one slot per group ever guarded."""
        with self._lock:
            self._open_registry()
            return os.pread(self._registry, _HEADER + self._used * _SLOT, 0)

    def _next_slot(self) -> int:
        self._used += 1
        return self._used - 1

    def _open_registry(self) -> None:
        if self._registry < 0:
            self._registry = os.memfd_create(NAME, os.MFD_CLOEXEC)
            os.pwrite(self._registry, b"\n" * _HEADER, 0)

    def _spawn(self) -> None:
        """Start a keeper; a replacement inherits the registry, so it guards every group already in it."""
        if self._process is not None:  # it died: collect it, and let its pipe go
            self._process.wait()
            os.close(self._pipe)
            self._pipe = -1
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            self._process = subprocess.Popen(
                ["/bin/sh", "-c", _SCRIPT, NAME, str(self._registry), LEAF],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env=_ENVIRONMENT,
                start_new_session=True,
                close_fds=True,
                pass_fds=(self._registry,),
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._pipe = write_end

    def _forget_after_fork(self) -> None:
        """In a forked child: the parent's keeper guards the parent's agents, not ours."""
        self._lock = threading.Lock()
        for fd in (self._pipe, self._registry):
            if fd >= 0:
                os.close(fd)
        self._pipe = self._registry = -1
        self._process = None
        self._cgroups = ""
        self._passed = ()
        self._limit_groups = ()
        self._slots, self._free, self._used = {}, [], 0


KEEPER = Keeper()
os.register_at_fork(after_in_child=KEEPER._forget_after_fork)
