"""The agent's OS process: spawned in its own session, signalled as a group, reaped once.

Waiting uses a pidfd, so a turn costs no thread. `wait_exited()` returns while
the agent is still an unreaped zombie: as long as the zombie exists its process
group id cannot be reused, so `signal_group()` can never hit a stranger.

Every agent's group is guarded by the keeper (`bridge.keeper`) from spawn
until it has been killed, so the group dies even if this process is killed.
Where the kernel lets the bridge make cgroups, each agent is also born in a
cgroup of its own (`bridge.cgroups`), and its end kills everything left in
it: what left the agent's group and session included. A sandboxed agent's
PID namespace does that for it (`bridge.profile.sandbox`).

Orphans. A process that is a child subreaper (`become_subreaper()`: the CLI
and `serve` are) is handed the orphaned descendants of its agents: a child
that left its agent's group with `setsid`, and every intermediate process that
exits. `collect_orphans()` and `sweep_orphans()` kill and reap each such
child that is not in the session of a live agent, so nothing escapes a turn
and no zombie piles up. A child in this process's own session is never
touched: that is the host's own.
"""

from __future__ import annotations

import errno
import os
import queue
import select
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import trio

from .cgroups import CONTAINMENT, SPAWN_LOCK, AgentCgroup
from .errors import LaunchError
from .keeper import KEEPER
from .launch import LaunchPlan
from .limits import LIMIT_GROUPS, AgentGroups, ResourceLimits, exceeded

EXIT_NOT_FOUND = 127
EXIT_CANNOT_RUN = 126
READ_CHUNK = 64 * 1024

# Pids of spawned agents not yet reaped. Spawning, and reaping anything that is
# not an agent, happen under `SPAWN_LOCK`: a child listed under the lock
# stays this process's unreaped child until the lock is released, so its pid
# cannot be reused by a stranger while the lock is held.
_LIVE_AGENTS: set[int] = set()
_subreaper = False
_children_listed: bool | None = None


class AgentProcess:
    """A running agent and the parent's ends of its pipes.

    stdout and stderr are raw non-blocking descriptors: the driver (`agent_io`) reads
    them directly, which saves an event-loop iteration per read over a stream
    object (see `agent_io.Reader`).
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
        self.exceeded = ""  # once reaped: the limit it ended over (`bridge.limits.exceeded`), if known
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
            _LIVE_AGENTS.discard(self.pid)
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


def log_containment(log: Any) -> None:
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
        if pid in _LIVE_AGENTS or pid == keeper:
            continue
        status = _status(pid)
        if status is None:
            continue
        state, group, session = status
        if session == own_session or session in _LIVE_AGENTS:
            continue
        if state == "Z":
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            continue
        if group == pid:
            _kill_quietly(os.killpg, pid)  # its group cannot be reused while it is our unreaped child
        _kill_quietly(os.kill, pid)
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
            while dying := CONTAINMENT.still_in(cgroup):
                await _exited(dying[0])
    if limit_groups is not None:
        with trio.move_on_at(deadline):
            while dying := LIMIT_GROUPS.still_in(limit_groups):
                await _exited(dying[0])


async def sweep_orphans_on_sigchld(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Sweep whenever a child changes state, for a long-lived subreaper (`serve`): orphans that die
    between turns are reaped at once, not at the next turn's end. Run it in a nursery. A change seen while
    a spawn holds the lock is left to the next sweep (the next change, or the end of a turn)."""
    with trio.open_signal_receiver(signal.SIGCHLD) as changes:
        task_status.started()
        async for _ in changes:
            _sweep_unless_spawning()


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


def kill_agents_now() -> None:
    """SIGKILL every agent this process runs, with its group, skipping the grace period (a second Ctrl-C).

    Only groups of unreaped agents are signalled, so none of them can be a stranger's; each turn then
    ends as its cancel would have, and reaps its agent and whatever that left."""
    for pid in list(_LIVE_AGENTS):
        _kill_quietly(os.killpg, pid)


def _kill_quietly(kill: Callable[[int, int], None], target: int) -> None:
    try:
        kill(target, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def start(plan: LaunchPlan, *, kill_grace_secs: float = 5.0) -> AgentProcess:
    """`spawn` for a trio task: of turns started together, every agent is spawned before any turn sets up the rest.

    `Popen` blocks the event loop until the agent has exec'd, and whatever a turn does
    after its spawn delays the spawns of the turns started with it (300 at once: the last
    agent started 0.4 s after the first). So while other agents run, a turn yields right
    after spawning, and the others spawn first. A turn alone does not yield here.

    While other agents run, one born in a cgroup of its own (or in groups for its limits) is spawned in a
    worker thread: joining the cgroup may wait for the kernel (see `Containment.joined`), and their events
    must not wait with it; a sandboxed one in `SPAWNER`'s lasting thread, as bwrap dies with the thread that
    forked it. A turn alone has no such events to delay, and spawns here, sparing the hop to a thread and back
    (bench rows 1 and 29); this thread runs the event loop, which outlives the turn and so its bwrap.
    """
    others_run = bool(_LIVE_AGENTS) or SPAWN_LOCK.locked()
    if others_run and plan.sandboxed:
        return await SPAWNER.run_sync(partial(spawn, plan, kill_grace_secs=kill_grace_secs))
    if others_run and (CONTAINMENT.status().available or (plan.limits is not None and plan.limits.controlled())):
        return await trio.to_thread.run_sync(partial(spawn, plan, kill_grace_secs=kill_grace_secs))
    agent = spawn(plan, kill_grace_secs=kill_grace_secs)
    if others_run:
        await trio.lowlevel.cancel_shielded_checkpoint()  # shielded: the agent must reach its caller
    return agent


class LastingThread:
    """One thread that lives as long as the process, for spawns whose child dies with the thread that forked it.

    bwrap's `--die-with-parent` is `PR_SET_PDEATHSIG`, which the kernel fires when the *thread* that forked bwrap
    ends, not its process; trio's worker threads end after a few idle seconds, which would kill a sandboxed agent
    mid-turn. Spawns are quick and few at a time, so one thread serves them in order.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()

    async def run_sync(self, function: Callable[[], AgentProcess]) -> AgentProcess:
        """`function()` in the lasting thread; like `trio.to_thread.run_sync`, a cancel waits for it to finish."""
        with self._lock:
            if self._thread is None or self._pid != os.getpid():  # none yet, or a forked child's copy of none
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._serve, name="agent-bridge-spawner", daemon=True)
                self._thread.start()
                self._pid = os.getpid()
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        started: list[AgentProcess] = []
        failed: list[BaseException] = []

        def job() -> None:
            try:
                started.append(function())
            except BaseException as err:  # handed to the caller, whatever it is
                failed.append(err)
            token.run_sync_soon(done.set)

        self._jobs.put(job)
        with trio.CancelScope(shield=True):  # the agent it starts must reach the caller, who ends it
            await done.wait()
        if failed:
            raise failed[0]
        return started[0]


SPAWNER = LastingThread()


def spawn(plan: LaunchPlan, *, kill_grace_secs: float = 5.0) -> AgentProcess:
    """Start the agent described by `plan`; raises `LaunchError` with a message saying what to fix.

    The agent's group is guarded by the keeper from here on: should this
    process die, the group gets SIGTERM, then SIGKILL after `kill_grace_secs`.
    """
    pipes = _AgentPipes()
    try:
        pipes.open(wants_stdin=plan.stdin is not None or plan.stdin_open)
        if plan.command_at:  # bwrap or prlimit would start, then fail to find it: say so as for a bare agent
            program = plan.argv[plan.command_at]
            found = _resolve(program, plan)
            if found is None or not os.path.exists(found):
                raise _explain_not_found(program, plan)
        popen, cgroup, limit_groups = _fork_contained(plan, pipes)
        KEEPER.guard(popen.pid, kill_grace_secs)
    except BaseException:
        pipes.close_parent_ends()
        raise
    finally:
        pipes.close_child_ends()
    return AgentProcess(
        popen,
        stdin=trio.lowlevel.FdStream(pipes.stdin_write) if pipes.stdin_write >= 0 else None,
        stdout=pipes.stdout_read,
        stderr=pipes.stderr_read,
        cgroup=cgroup,
        limits=plan.limits,
        limit_groups=limit_groups,
        sandboxed=plan.sandboxed,
    )


class _AgentPipes:
    """The agent's stdout and stderr pipes, and its stdin's when it takes one (else it reads /dev/null): the
    bridge's ends stay open for the agent's life, the agent's are closed once it has them."""

    def __init__(self) -> None:
        self.stdout_read = self.stdout_write = self.stderr_read = self.stderr_write = -1
        self.stdin_read: int = subprocess.DEVNULL
        self.stdin_write = -1

    def open(self, *, wants_stdin: bool) -> None:
        self.stdout_read, self.stdout_write = os.pipe2(os.O_CLOEXEC)
        self.stderr_read, self.stderr_write = os.pipe2(os.O_CLOEXEC)
        if wants_stdin:
            self.stdin_read, self.stdin_write = os.pipe2(os.O_CLOEXEC)

    def close_child_ends(self) -> None:
        for fd in (self.stdout_write, self.stderr_write, self.stdin_read):
            if fd >= 0:
                os.close(fd)

    def close_parent_ends(self) -> None:
        for fd in (self.stdout_read, self.stderr_read, self.stdin_write):
            if fd >= 0:
                os.close(fd)


def _fork_contained(
    plan: LaunchPlan, pipes: _AgentPipes
) -> tuple[subprocess.Popen[bytes], AgentCgroup | None, AgentGroups | None]:
    """The agent forked under the keeper's guard, born in its cgroup and its limits' groups where it gets them."""
    preexec = _signal_reset()
    with SPAWN_LOCK:
        KEEPER.start()  # before the agent: there is no moment when it runs unguarded
        cgroup = limit_groups = None
        try:
            # A sandboxed agent is contained by its PID namespace already: the kernel kills all in it when
            # bwrap's init ends, with the turn or with the bridge (`--die-with-parent`). A cgroup of its own
            # would cost it ~0.25 ms (bench row 29); it gets one only for limits held in that group's files.
            if not plan.sandboxed or LIMIT_GROUPS.held_in_agent_group(plan.limits):
                cgroup = CONTAINMENT.create()
            if cgroup is not None:
                KEEPER.contain(CONTAINMENT.directory)
            if plan.limits is not None:
                limit_groups = LIMIT_GROUPS.create(plan.limits, cgroup)
                if limit_groups is not None:
                    KEEPER.contain_limit_groups(LIMIT_GROUPS.directories)
            with LIMIT_GROUPS.joined(limit_groups), CONTAINMENT.joined(cgroup):
                try:
                    popen = subprocess.Popen(
                        plan.argv,
                        stdin=pipes.stdin_read,
                        stdout=pipes.stdout_write,
                        stderr=pipes.stderr_write,
                        cwd=plan.cwd,
                        env=plan.env,
                        start_new_session=True,
                        close_fds=True,
                        preexec_fn=preexec,
                    )
                except (OSError, ValueError, UnicodeError, subprocess.SubprocessError) as err:
                    raise _explain_spawn_failure(err, plan) from None
        except BaseException:
            if cgroup is not None:
                CONTAINMENT.end(cgroup)
            if limit_groups is not None:
                LIMIT_GROUPS.end(limit_groups)
            raise
        _LIVE_AGENTS.add(popen.pid)
    return popen, cgroup, limit_groups


def _child_of(pid: int) -> int:
    """The first child of process `pid` (0 when it has none, or it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as children:
            first = children.read().split(maxsplit=1)
    except OSError:
        return 0
    return int(first[0]) if first else 0


# The signals the bridge stops an agent with. An ignored disposition survives
# exec, so an agent started by a host that ignores them (nohup, `cmd &` in a
# script) could never be interrupted or terminated gracefully.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _signal_reset() -> Callable[[], None] | None:
    """A pre-exec step restoring default handling of the stop signals, when the bridge ignores them.

    Only then: any pre-exec step makes Python fork instead of vfork, which
    costs every spawn of a large host noticeably more.
    """
    ignored = [signum for signum in _STOP_SIGNALS if signal.getsignal(signum) == signal.SIG_IGN]
    if not ignored:
        return None

    def restore_defaults() -> None:
        try:
            for signum in ignored:
                signal.signal(signum, signal.SIG_DFL)
        except ValueError:
            pass  # spawned from a thread other than the main one: Python refuses; keep the inherited state

    return restore_defaults


def _explain_spawn_failure(err: BaseException, plan: LaunchPlan) -> LaunchError:
    program = plan.argv[0]
    if isinstance(err, OSError) and plan.cwd is not None and err.filename == plan.cwd:
        if isinstance(err, FileNotFoundError):
            return LaunchError(EXIT_CANNOT_RUN, f"the working directory {plan.cwd!r} does not exist")
        if isinstance(err, NotADirectoryError):
            return LaunchError(EXIT_CANNOT_RUN, f"the working directory {plan.cwd!r} is not a directory")
        return LaunchError(EXIT_CANNOT_RUN, f"cannot enter the working directory {plan.cwd!r}: {err.strerror}")
    if isinstance(err, FileNotFoundError):
        return _explain_not_found(program, plan)
    if isinstance(err, PermissionError):
        return LaunchError(
            EXIT_CANNOT_RUN,
            f"{program!r} is not executable (permission denied); try chmod +x {program}"
            if os.path.isfile(_resolve(program, plan) or "")
            else f"{program!r} cannot be executed: permission denied",
        )
    if isinstance(err, IsADirectoryError):
        return LaunchError(EXIT_CANNOT_RUN, f"{program!r} is a directory, not a program")
    if isinstance(err, OSError) and err.errno == errno.E2BIG:
        return LaunchError(
            EXIT_CANNOT_RUN,
            "the arguments and environment are too large for the OS (E2BIG); "
            "shorten them or pass the message with `stdin: message`",
        )
    if isinstance(err, OSError) and err.errno == errno.ENOEXEC:
        return LaunchError(
            EXIT_CANNOT_RUN, f"{program!r} is not a program the OS can run; a script needs a #! line such as #!/bin/sh"
        )
    if isinstance(err, OSError):
        return LaunchError(EXIT_CANNOT_RUN, f"{program!r} cannot be executed: {err.strerror or err}")
    if isinstance(err, subprocess.SubprocessError):  # the pre-exec step failed
        return LaunchError(EXIT_CANNOT_RUN, f"the agent's signal handling could not be reset: {err}")
    return LaunchError(EXIT_CANNOT_RUN, f"the command line cannot be passed to the OS: {err}")


def _explain_not_found(program: str, plan: LaunchPlan) -> LaunchError:
    path = _resolve(program, plan)
    if path is not None and os.path.isfile(path):
        # The file exists, so the missing piece is its #! interpreter.
        try:
            with open(path, "rb") as script:
                first_line = script.readline(256)
        except OSError:
            first_line = b""
        if first_line.startswith(b"#!") and first_line.rstrip(b"\n").endswith(b"\r"):
            import shlex  # only on this error's way

            return LaunchError(
                EXIT_CANNOT_RUN,
                f"{program!r} has Windows line endings (CRLF): its #! line ends with a carriage return, which the "
                f"OS takes as part of the interpreter's name; convert the file: sed -i 's/\\r$//' {shlex.quote(path)} "
                f"(or dos2unix {shlex.quote(path)})",
            )
        if first_line.startswith(b"#!"):
            interpreter = first_line[2:].decode("utf-8", "replace").strip()
            return LaunchError(
                EXIT_CANNOT_RUN, f"{program!r} names an interpreter that does not exist: #!{interpreter}"
            )
    if "/" in program:
        if os.path.isabs(program):
            return LaunchError(EXIT_NOT_FOUND, f"command {program!r} not found")
        return LaunchError(
            EXIT_NOT_FOUND,
            f"command {program!r} not found (relative to {plan.cwd or os.getcwd()}, the agent's working "
            'directory); for a file next to the profile, write "{{PROFILE_DIR}}/'
            f'{program.removeprefix("./")}"',
        )
    return LaunchError(EXIT_NOT_FOUND, f"command {program!r} not found on PATH")


def _resolve(program: str, plan: LaunchPlan) -> str | None:
    """Where the OS looked for `program`: relative paths resolve against the agent's cwd."""
    if "/" in program:
        return os.path.join(plan.cwd or os.getcwd(), program)
    for directory in plan.env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if os.path.exists(candidate):
            return candidate
    return None
