"""Spawning an agent: in its own session, guarded by the keeper, in its cgroup and limit groups where there are.

`start` is `spawn` for a trio task; `SPAWNER` is the one lasting thread a sandboxed agent is forked from.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from functools import partial
from typing import Protocol

import trio

from .cgroups import CONTAINMENT, SPAWN_LOCK, AgentCgroup
from .keeper import KEEPER
from .limits import LIMIT_GROUPS, AgentGroups, ResourceLimits
from .process import LIVE_AGENTS, AgentProcess
from .spawn_failures import CommandLine, explain_not_found, explain_spawn_failure, resolved_program


class SpawnPlan(CommandLine, Protocol):
    """What of a launch plan (`bridge.engine.launch.LaunchPlan`) a spawn reads: confinement sits below the engine."""

    @property
    def stdin(self) -> bytes | None: ...
    @property
    def stdin_open(self) -> bool: ...
    @property
    def command_at(self) -> int: ...
    @property
    def sandboxed(self) -> bool: ...
    @property
    def limits(self) -> ResourceLimits | None: ...


async def start(plan: SpawnPlan, *, kill_grace_secs: float = 5.0) -> AgentProcess:
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
    others_run = bool(LIVE_AGENTS) or SPAWN_LOCK.locked()
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


def spawn(plan: SpawnPlan, *, kill_grace_secs: float = 5.0) -> AgentProcess:
    """Start the agent described by `plan`; raises `LaunchError` with a message saying what to fix.

    The agent's group is guarded by the keeper from here on: should this
    process die, the group gets SIGTERM, then SIGKILL after `kill_grace_secs`.
    """
    parent_fds: list[int] = []
    child_fds: list[int] = []

    def pipe() -> tuple[int, int]:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        return read_end, write_end

    try:
        stdout_read, stdout_write = pipe()
        parent_fds.append(stdout_read)
        child_fds.append(stdout_write)
        stderr_read, stderr_write = pipe()
        parent_fds.append(stderr_read)
        child_fds.append(stderr_write)
        stdin_arg: int = subprocess.DEVNULL
        stdin_write = -1
        wants_stdin = plan.stdin is not None or plan.stdin_open
        if wants_stdin:
            stdin_arg, stdin_write = pipe()
            child_fds.append(stdin_arg)
            parent_fds.append(stdin_write)
        _check_the_wrapped_command(plan)
        popen, cgroup, limit_groups = _popen_confined(plan, stdin_arg, stdout_write, stderr_write)
        KEEPER.guard(popen.pid, kill_grace_secs)
    except BaseException:
        for fd in parent_fds:
            os.close(fd)
        raise
    finally:
        for fd in child_fds:
            os.close(fd)
    return AgentProcess(
        popen,
        stdin=trio.lowlevel.FdStream(stdin_write) if wants_stdin else None,
        stdout=stdout_read,
        stderr=stderr_read,
        cgroup=cgroup,
        limits=plan.limits,
        limit_groups=limit_groups,
        sandboxed=plan.sandboxed,
    )


def _check_the_wrapped_command(plan: SpawnPlan) -> None:
    """bwrap or prlimit would start, then fail to find the agent's program: say so as for a bare agent."""
    if plan.command_at:
        program = plan.argv[plan.command_at]
        found = resolved_program(program, plan)
        if found is None or not os.path.exists(found):
            raise explain_not_found(program, plan)


def _popen_confined(
    plan: SpawnPlan, stdin: int, stdout: int, stderr: int
) -> tuple[subprocess.Popen[bytes], AgentCgroup | None, AgentGroups | None]:
    """Popen the agent under the keeper, in its cgroup and limit groups where it gets them; listed as live."""
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
                        stdin=stdin,
                        stdout=stdout,
                        stderr=stderr,
                        cwd=plan.cwd,
                        env=plan.env,
                        start_new_session=True,
                        close_fds=True,
                        preexec_fn=preexec,
                    )
                except (OSError, ValueError, UnicodeError, subprocess.SubprocessError) as err:
                    raise explain_spawn_failure(err, plan) from None
        except BaseException:
            if cgroup is not None:
                CONTAINMENT.end(cgroup)
            if limit_groups is not None:
                LIMIT_GROUPS.end(limit_groups)
            raise
        LIVE_AGENTS.add(popen.pid)
    return popen, cgroup, limit_groups


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
