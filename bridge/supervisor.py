"""Run one turn under trio: spawn, pump the pipes, enforce deadlines, escalate kills, reap.

Every task lives in one nursery and every deadline is a cancel scope. Cleanup
— signalling, killing and reaping the agent's process group — runs in
`finally` under a shield, so no exit path (timeout, host cancel, an exception
in a host callback, Ctrl-C) can leave a process behind.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .dialects import ErrorEvent, Event, LineDecoder, PartialEvent, ProtocolWarning, SessionEvent
from .errors import LaunchError
from .launch import LaunchPlan, plan_launch
from .log import get_logger
from .process import AgentProcess, collect_orphans, spawn
from .profile import Profile
from .result import Ending, TurnRecorder, TurnResult
from .turn import Turn

HostEvent = PartialEvent | SessionEvent | ErrorEvent | TurnResult
# Delivers one event to the host; returns an awaitable only when there is something to await.
Emit = Callable[[HostEvent], Awaitable[None] | None]

READ_CHUNK = 64 * 1024
STDERR_TAIL_BYTES = 4096
# After the agent exits and its group is killed, output still in the pipes is
# read for at most this long. Only a process that left the group (setsid) can
# hold a pipe open longer, and it must not hang the turn.
DRAIN_SECS = 1.0
# Orphans killed with the group, or that escaped it, are reaped within this bound (see become_subreaper).
REAP_SECS = 1.0


async def drive_turn(profile: Profile, turn: Turn, emit: Emit | None = None, *,
                     cancel: trio.Event | None = None, turn_id: str | None = None) -> TurnResult:
    """Run one turn to its end and return the result; `emit` sees every host event, the result last.

    Setting `cancel` stops the agent the way a host cancel must (SIGINT, grace,
    SIGKILL) and still returns a result (exit 130). A trio cancellation of the
    caller does the same cleanup, then lets `Cancelled` propagate. `turn_id`
    tags the turn's log records (default: a random id).
    """
    started = trio.current_time()
    plan: LaunchPlan | None = None
    try:
        plan = plan_launch(profile, turn, os.environ)
        agent = spawn(plan, kill_grace_secs=profile.kill_grace_secs)  # first: the bookkeeping below overlaps the agent's start-up
    except LaunchError as err:
        log = _turn_logger(profile, turn_id, plan)
        log.warning("agent could not be started", reason=err.message, exit_code=err.exit_code)
        ending = Ending(spawn_failure=(err.exit_code, err.message))
        return await _finish(TurnRecorder(profile), ending, "", started, emit, log)

    log = _turn_logger(profile, turn_id, plan)
    recorder = TurnRecorder(profile)
    supervisor = _Supervisor(profile, plan, agent, recorder, emit, log, started)
    log.info("agent started", pid=agent.pid, program=profile.argv_template[0])
    try:
        ending = await supervisor.run(cancel)
    except BaseException:
        with trio.CancelScope(shield=True):
            await supervisor.abandon()
        log.info("turn abandoned by the host; agent stopped", exit_code=130)
        raise
    finally:
        agent.close()
    return await _finish(recorder, ending, supervisor.stderr_text(), started, emit, log)


def _turn_logger(profile: Profile, turn_id: str | None, plan: LaunchPlan | None) -> Any:
    log = get_logger(turn_id=turn_id or os.urandom(6).hex(), profile=profile.label)
    for note in plan.notes if plan is not None else ():
        log.warning(note)
    return log


async def _finish(recorder: TurnRecorder, ending: Ending, stderr_tail: str, started: float,
                  emit: Emit | None, log: Any) -> TurnResult:
    duration_ms = round((trio.current_time() - started) * 1000)
    result = recorder.finish(ending, stderr_tail=stderr_tail, duration_ms=duration_ms)
    log.info("turn finished", outcome=result.outcome.value, exit_code=result.exit_code,
             duration_ms=duration_ms, partials=result.partials)
    if emit is not None and (pending := emit(result)) is not None:
        await pending
    return result


class _Reader:
    """Reads one of the agent's pipes, inside one cancel scope armed only once the agent has exited.

    Until then reading has no deadline. After, the pipe may keep the turn
    waiting for at most a budget of `DRAIN_SECS`; only time spent blocked
    waiting uses it up, so a slow host never loses output already written.

    It reads before it waits, and yields to other tasks only to wait — or
    explicitly when reads keep succeeding without waiting, so a flooding agent
    cannot starve the event loop. A stream object would yield before every
    read: one event-loop iteration more per read, which a short turn feels.
    """

    __slots__ = ("fd", "scope", "done", "_budget", "_waiting_since", "_yielded")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self._budget = math.inf
        self._waiting_since: float | None = None  # set while in receive
        self._yielded = True  # a task starts at a schedule point

    @property
    def cut(self) -> bool:
        """The budget ran out before EOF."""
        return self.scope.cancelled_caught

    def start_draining(self, budget: float) -> None:
        self._budget = budget
        if self._waiting_since is not None:
            self._waiting_since = trio.current_time()
            self.scope.deadline = self._waiting_since + budget

    async def receive(self) -> bytes:
        """The next chunk, b"" at EOF; call inside `scope`."""
        draining = self._budget != math.inf
        self._waiting_since = trio.current_time() if draining else 0.0
        if draining:
            self.scope.deadline = self._waiting_since + self._budget
        try:
            if not self._yielded:
                await trio.lowlevel.checkpoint()
            self._yielded = False
            while True:
                try:
                    return os.read(self.fd, READ_CHUNK)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(self.fd)
                    self._yielded = True
        except (trio.ClosedResourceError, OSError):
            return b""
        finally:
            if self._budget != math.inf:
                self._budget -= trio.current_time() - self._waiting_since
                self.scope.deadline = math.inf
            self._waiting_since = None


class _Supervisor:
    """The state of one running agent; `run()` drives it to a reaped end."""

    def __init__(self, profile: Profile, plan: LaunchPlan, agent: AgentProcess, recorder: TurnRecorder,
                 emit: Emit | None, log: Any, started: float) -> None:
        self.profile = profile
        self.plan = plan
        self.agent = agent
        self.recorder = recorder
        self.emit = emit
        self.log = log
        self.decoder = LineDecoder(profile.session_line_prefix)
        self.stdout = _Reader(agent.stdout)
        self.stderr = _Reader(agent.stderr)
        self._stderr_tail = bytearray()
        self._stderr_total = 0
        self.wall_deadline = started + profile.timeout_secs
        idle = profile.idle_timeout_secs
        self.exit_wait = trio.CancelScope(
            deadline=self.wall_deadline if idle is None else min(self.wall_deadline, started + idle)
        )
        self.cancel_requested = False

    async def run(self, cancel: trio.Event | None) -> Ending:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.pump_stdout)
            nursery.start_soon(self.pump_stderr)
            if self.agent.stdin is not None:
                assert self.plan.stdin is not None
                nursery.start_soon(self.feed_stdin, self.plan.stdin)
            if cancel is not None:
                nursery.start_soon(self.watch_cancel, cancel)
            ending = await self.wait_for_exit()
            self.stdout.start_draining(DRAIN_SECS)
            self.stderr.start_draining(DRAIN_SECS)
            for reader in (self.stdout, self.stderr):
                if not reader.done.is_set():  # waiting on a set event would still cost a schedule point
                    await reader.done.wait()
            if self.stdout.cut or self.stderr.cut:
                self.log.warning("a process outside the agent's group still holds its output open; stopped reading",
                                 drain_secs=DRAIN_SECS)
            nursery.cancel_scope.cancel()
        await self.handle(self.decoder.close())
        return ending

    async def wait_for_exit(self) -> Ending:
        with self.exit_wait:
            await self.agent.wait_exited()
        timeout = None
        if self.exit_wait.cancelled_caught:
            if self.cancel_requested:
                self.log.info("turn cancelled by the host; interrupting the agent")
                await self.stop(signal.SIGINT)
            else:
                timeout = "wall" if trio.current_time() >= self.wall_deadline else "idle"
                self.log.warning("turn timed out; terminating the agent", timeout=timeout,
                                 limit_secs=self.profile.timeout_secs if timeout == "wall"
                                 else self.profile.idle_timeout_secs)
                await self.stop(signal.SIGTERM)
        returncode = self.agent.reap()
        await self.reap_leftovers()
        return Ending(returncode=returncode, timeout=timeout, cancelled=self.cancel_requested and timeout is None)

    async def stop(self, signum: int) -> None:
        """`signum` to the group; after `kill_grace_secs`, SIGKILL."""
        self.agent.signal_group(signum)
        with trio.move_on_after(self.profile.kill_grace_secs):
            await self.agent.wait_exited()
            return
        self.log.warning("agent still running after the grace period; killing it",
                         signal=signal.Signals(signum).name, grace_secs=self.profile.kill_grace_secs)
        self.agent.signal_group(signal.SIGKILL)
        await self.agent.wait_exited()

    async def reap_leftovers(self) -> None:
        """Kill and reap what the agent left behind and was handed to us (only a subreaper is)."""
        await collect_orphans(trio.current_time() + REAP_SECS)

    async def abandon(self) -> None:
        """The host went away mid-turn: stop the agent as a host cancel, without reading further."""
        if self.agent.reaped:
            return
        self.agent.close_output()  # the host is gone: nobody reads any more
        await self.stop(signal.SIGINT)
        self.agent.reap()
        await self.reap_leftovers()

    async def watch_cancel(self, cancel: trio.Event) -> None:
        await cancel.wait()
        self.cancel_requested = True
        self.exit_wait.cancel()

    async def pump_stdout(self) -> None:
        feed = self.decoder.feed
        reader = self.stdout
        idle = self.profile.idle_timeout_secs
        exit_wait = self.exit_wait
        try:
            with reader.scope:
                while data := await reader.receive():
                    if idle is None:
                        await self.handle(feed(data))
                    else:
                        # Time spent in host callbacks is not the agent's silence.
                        exit_wait.deadline = self.wall_deadline
                        await self.handle(feed(data))
                        exit_wait.deadline = min(self.wall_deadline, trio.current_time() + idle)
        finally:
            reader.done.set()

    async def handle(self, events: list[Event]) -> None:
        emit = self.emit
        for event in self.recorder.record(events):
            if isinstance(event, ProtocolWarning):
                self.log.warning(event.message)
            elif emit is not None and (pending := emit(event)) is not None:
                await pending

    async def pump_stderr(self) -> None:
        reader = self.stderr
        tail = self._stderr_tail
        try:
            with reader.scope:
                while data := await reader.receive():
                    self._stderr_total += len(data)
                    tail += data
                    if len(tail) > 2 * STDERR_TAIL_BYTES:
                        del tail[:-STDERR_TAIL_BYTES]
        finally:
            reader.done.set()

    def stderr_text(self) -> str:
        """The last few KiB of stderr; when it was cut, starting at a line boundary."""
        tail = bytes(self._stderr_tail[-STDERR_TAIL_BYTES:])
        if self._stderr_total > len(tail):
            newline = tail.find(b"\n")
            if 0 <= newline < len(tail) - 1:
                tail = tail[newline + 1:]
            return "…" + tail.decode("utf-8", "replace")
        return tail.decode("utf-8", "replace")

    async def feed_stdin(self, payload: bytes) -> None:
        """Write the message, then EOF; runs beside the readers so neither side can deadlock."""
        stream = self.agent.stdin
        assert stream is not None
        try:
            await stream.send_all(payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.log.info("agent closed stdin before reading the whole message")
        finally:
            await stream.aclose()
