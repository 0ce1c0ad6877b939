"""The agent's process as the bridge drives it: pipes, per-turn deadlines, kill escalation and its end.

`AgentIO` is the one driver of an agent process, whether it lives for one turn
(`one_process`) or for many (`warm_agents`). It knows nothing of what the agent
says: it reads stdout (`Reader`) and hands each chunk to whoever drives the
turn, keeps the stderr tail (`StderrTail`), writes to stdin as often as asked
(the handover, then whatever `send` queues in its `StdinQueue`), drains the pipes
for a bounded time once the agent has exited, and reaps the agent and whatever
it left behind. A turn's wall and idle deadlines are a `TurnDeadline`, armed
per turn (`begin_turn`): a one-turn process waits for its exit under it, a
warm agent waits for its turn's end. `run()` is a one-turn process's whole
life — the host's cancel or a deadline stop it with SIGINT or SIGTERM to the
group, the grace, SIGKILL. Every task runs in a nursery, every deadline is a
cancel scope, and cleanup runs under a shield, so no exit path can leave a
process behind.
"""

from __future__ import annotations

import math
import os
import signal
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import trio

from ..confinement.orphans import collect_orphans
from ..confinement.process import READ_CHUNK, AgentProcess
from ..log import Logger
from .launch import LaunchPlan
from .result import Ending

if TYPE_CHECKING:
    from ..profile import Profile

STDERR_TAIL_BYTES = 4096
# After the agent exits and its group is killed, output still in the pipes is
# read for at most this long. Only a process that left the group (setsid) can
# hold a pipe open longer, and it must not hang the turn.
DRAIN_SECS = 1.0
# Orphans killed with the group, or that escaped it, are reaped within this bound (see become_subreaper).
REAP_SECS = 1.0
# What may wait unwritten on an agent's stdin: mostly the bridge's answers to what the agent asked. A
# normal text file the bridge reads for it (at most 16 MiB) takes at most 32 MiB as a JSON line, so two such
# answers fit; one larger message (16 MiB of control characters, escaped) still gets through while nothing
# else waits.
STDIN_QUEUE_LIMIT_BYTES = 64 * 1024 * 1024


class Reader:
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


class StderrTail:
    """An agent's stderr as it is read: each chunk to `on_chunk` (if any), the last few KiB kept for the result."""

    __slots__ = ("on_chunk", "_tail", "_total")

    def __init__(self, on_chunk: Callable[[bytes], None] | None = None) -> None:
        self.on_chunk = on_chunk
        self._tail = bytearray()
        self._total = 0

    async def pump(self, reader: Reader) -> None:
        """Read `reader` to its end (or its scope's cancel)."""
        with reader.scope:
            while data := await reader.receive():
                self.take(data)

    def take(self, data: bytes) -> None:
        if self.on_chunk is not None:
            self.on_chunk(data)
        self._total += len(data)
        tail = self._tail
        tail += data
        if len(tail) > 2 * STDERR_TAIL_BYTES:
            del tail[:-STDERR_TAIL_BYTES]

    def clear(self) -> None:
        """Start over (a warm agent's next turn)."""
        self._tail.clear()
        self._total = 0

    def text(self) -> str:
        """The last few KiB; when stderr was longer, from a line boundary on, after "…"."""
        tail = bytes(self._tail[-STDERR_TAIL_BYTES:])
        if self._total > len(tail):
            newline = tail.find(b"\n")
            if 0 <= newline < len(tail) - 1:
                tail = tail[newline + 1 :]
            return "…" + tail.decode("utf-8", "replace")
        return tail.decode("utf-8", "replace")


class StdinQueue:
    """What the bridge writes to an agent's stdin, in order, bounded by bytes; `write_to` writes it.

    `put` never waits: it is called while the agent's output is being handled. What waits unwritten
    (queued, or being written) may exceed `limit` bytes only by one message put while nothing waited,
    so the largest answer reaches an agent that reads. Past that, the agent is not reading what it
    asked for: the queue drops all it holds at once, takes nothing more, and calls `on_overflow`
    (once), whose driver kills the agent.
    """

    __slots__ = ("limit", "waiting", "overflowed", "_queue", "_closed", "_on_overflow", "_wakeup", "_writing")

    def __init__(self, on_overflow: Callable[[], None], limit: int = STDIN_QUEUE_LIMIT_BYTES) -> None:
        self.limit = limit
        self.waiting = 0  # bytes put and not yet written
        self.overflowed = 0  # when the agent was failed: the bytes that would have waited (0: never)
        self._queue: deque[bytes] = deque()
        self._closed = False
        self._on_overflow = on_overflow
        self._wakeup = trio.lowlevel.ParkingLot()
        self._writing = trio.CancelScope()

    def put(self, data: bytes) -> None:
        """Queue `data` after what waits (a no-op once closed); past the limit the agent is failed instead."""
        if not data or self._closed:
            return
        waiting = self.waiting + len(data)
        if waiting > self.limit and self.waiting:
            self.overflowed = waiting
            self.drop()
            self._on_overflow()
            return
        self.waiting = waiting
        self._queue.append(data)
        self._wakeup.unpark_all()

    def close(self) -> None:
        """Nothing more will be put: `write_to` returns once what waits is written (the agent then gets EOF)."""
        self._closed = True
        self._wakeup.unpark_all()

    def drop(self) -> None:
        """Release what waits unwritten, at once, and take nothing more (the agent is gone, or going)."""
        self._closed = True
        self._queue.clear()
        self.waiting = 0
        self._writing.cancel()

    async def write_to(self, stream: trio.abc.SendStream) -> None:
        """Write what is put, in order, until closed and written, or dropped; raises what `stream` raises."""
        queue = self._queue
        with self._writing:
            while True:
                while not queue:
                    if self._closed:
                        return
                    await self._wakeup.park()
                data = queue[0]
                await stream.send_all(data)
                if queue:  # else it was dropped while the write completed
                    queue.popleft()
                    self.waiting -= len(data)


@dataclass(slots=True, frozen=True)
class TurnLimits:
    """What the driver needs of a profile: a turn's deadlines, and the grace a stopped agent gets."""

    timeout_secs: float
    idle_timeout_secs: float | None
    kill_grace_secs: float

    @classmethod
    def of(cls, profile: Profile) -> TurnLimits:
        return cls(profile.timeout_secs, profile.idle_timeout_secs, profile.kill_grace_secs)


class TurnDeadline:
    """A turn's wall and idle deadlines, kept on one cancel scope: what waits for the turn's end runs in `scope`.

    Output from the agent restarts the idle clock (`renew`); time the host spends
    handling that output (`hold`) is not the agent's silence.
    """

    __slots__ = ("scope", "wall", "idle_secs")

    def __init__(self, limits: TurnLimits, started: float) -> None:
        self.wall = started + limits.timeout_secs
        self.idle_secs = limits.idle_timeout_secs
        self.scope = trio.CancelScope(deadline=self.from_now(started))

    def from_now(self, now: float | None = None) -> float:
        """When the turn times out if the agent says nothing more after `now` (default: now)."""
        if self.idle_secs is None:
            return self.wall
        return min(self.wall, (trio.current_time() if now is None else now) + self.idle_secs)

    def hold(self) -> None:
        """The host handles the agent's output: only the wall deadline runs."""
        self.scope.deadline = self.wall

    def renew(self) -> None:
        """The agent said something (and the host handled it): the idle clock starts over."""
        self.scope.deadline = self.from_now()

    def which(self) -> Literal["wall", "idle"]:
        """Which deadline `scope` was cancelled by."""
        return "wall" if trio.current_time() >= self.wall else "idle"


class AgentIO:
    """One running agent's I/O and lifetime: its pipes' pumps, its stdin, its deadlines, its stop and reaping.

    A one-turn process is driven by `run()`. A long-lived one starts the pumps
    in its own nursery (`start_pumps`), waits for the exit (`wait_exited`),
    then `reap()`s and `drain()`s; each of its turns is armed with `begin_turn`.
    `on_not_reading` is called after an agent that left too much unread on its
    stdin was killed.
    """

    def __init__(
        self,
        plan: LaunchPlan,
        agent: AgentProcess,
        log: Logger,
        limits: TurnLimits,
        on_stderr: Callable[[bytes], None] | None = None,
        on_not_reading: Callable[[], None] | None = None,
    ) -> None:
        self.plan = plan
        self.agent = agent
        self.log = log
        self.limits = limits
        self.stdout = Reader(agent.stdout)
        self.stderr = Reader(agent.stderr)
        self.stderr_tail = StderrTail(on_stderr)
        # With a pidfd, stderr is read by the wait for the agent's exit, not by a task of its own.
        self._on_stderr = self._stderr_while_waiting if agent.reads_stderr_while_waiting else None
        # Only an agent whose stdin stays open is written to later.
        self.stdin_queue = StdinQueue(self._not_reading) if plan.stdin_open else None
        self._on_not_reading = on_not_reading
        self.deadline: TurnDeadline | None = None  # the turn in progress's, if any
        self.cancel_requested = False

    # ------------------------------------------------------------------ turns

    def begin_turn(self, started: float) -> TurnDeadline:
        """Arm a turn's deadlines from `started`: output restarts its idle clock until `end_turn`."""
        self.deadline = TurnDeadline(self.limits, started)
        return self.deadline

    def end_turn(self) -> None:
        self.deadline = None

    # ------------------------------------------------------------------ a one-turn process

    async def run(
        self,
        on_output: Callable[[bytes], Awaitable[None]],
        cancel: trio.Event | None,
        on_stopping: Callable[[], None] | None = None,
    ) -> Ending:
        """Pump the pipes until the agent has exited and its output is drained; `on_output` gets each stdout chunk.

        The turn must have begun (`begin_turn`). `on_stopping` is called once the
        agent exited or is being stopped (a timeout, a cancel): whatever waits on
        the host for this turn stops waiting.
        """
        others = self.agent.stdin is not None or cancel is not None
        async with trio.open_nursery() as nursery:
            self.start_pumps(nursery, on_output)
            if cancel is not None:
                nursery.start_soon(self.watch_cancel, cancel)
            ending = await self.wait_for_exit(on_stopping)
            await self.drain()
            if others:  # stdin, the host's cancel: the pipes are done, so these are no longer needed
                nursery.cancel_scope.cancel()
        return ending

    async def wait_for_exit(self, on_stopping: Callable[[], None] | None = None) -> Ending:
        """Wait for the agent's exit within the turn's deadlines, stopping it at one (or the host's cancel); reap."""
        deadline = self.deadline
        assert deadline is not None, "begin_turn first"
        with deadline.scope:
            await self.wait_exited()
        if on_stopping is not None:
            on_stopping()
        timeout = None
        if deadline.scope.cancelled_caught:
            if self.cancel_requested:
                self.log.info("turn cancelled by the host; interrupting the agent")
                await self.stop(signal.SIGINT)
            else:
                timeout = deadline.which()
                self.log.warning(
                    "turn timed out; terminating the agent",
                    timeout=timeout,
                    limit_secs=self.limits.timeout_secs if timeout == "wall" else self.limits.idle_timeout_secs,
                    in_result=True,
                )
                await self.stop(signal.SIGTERM)
        returncode = await self.reap()
        return Ending(
            returncode=returncode,
            timeout=timeout,
            cancelled=self.cancel_requested and timeout is None,
            unread=self.stdin_queue.overflowed if self.stdin_queue is not None else 0,
            limit=self.agent.exceeded,
        )

    async def watch_cancel(self, cancel: trio.Event) -> None:
        await cancel.wait()
        self.cancel_requested = True
        assert self.deadline is not None
        self.deadline.scope.cancel()

    async def abandon(self) -> None:
        """The host went away mid-turn: stop the agent as a host cancel, without reading further."""
        if self.agent.reaped:
            return
        self.agent.close_output()  # the host is gone: nobody reads any more
        await self.stop(signal.SIGINT)
        await self.reap()

    # ------------------------------------------------------------------ the pieces

    def start_pumps(self, nursery: trio.Nursery, on_output: Callable[[bytes], Awaitable[None]]) -> None:
        """Read stdout (each chunk to `on_output`) and stderr, and write stdin, in `nursery`'s tasks."""
        nursery.start_soon(self.pump_stdout, on_output)
        if self._on_stderr is None:
            nursery.start_soon(self.pump_stderr)
        if self.agent.stdin is not None:
            nursery.start_soon(self.feed_stdin)

    async def wait_exited(self) -> None:
        """Return once the agent has exited (unreaped); with a pidfd, stderr is read meanwhile."""
        await self.agent.wait_exited(self._on_stderr)

    async def drain(self) -> None:
        """The agent has exited: read what is left in its pipes, each for at most `DRAIN_SECS` spent waiting."""
        self.stdout.start_draining(DRAIN_SECS)
        self.stderr.start_draining(DRAIN_SECS)
        if self._on_stderr is not None and not self.stderr.done.is_set():  # the rest of stderr
            await self.pump_stderr()
        for reader in (self.stdout, self.stderr):
            if not reader.done.is_set():  # waiting on a set event would still cost a schedule point
                await reader.done.wait()
        if self.stdout.cut or self.stderr.cut:
            self.log.warning(
                "a process outside the agent's group still holds its output open; stopped reading",
                drain_secs=DRAIN_SECS,
            )

    async def stop(self, signum: int) -> None:
        """`signum` to the group; after `kill_grace_secs`, SIGKILL. Waits for the exit: call where nothing else does."""
        grace = self.limits.kill_grace_secs
        self.agent.signal_group(signum)
        with trio.move_on_after(grace):
            await self.wait_exited()
            return
        self.log.warning(
            "agent still running after the grace period; killing it",
            signal=signal.Signals(signum).name,
            grace_secs=grace,
        )
        self.agent.signal_group(signal.SIGKILL)
        await self.wait_exited()

    def kill(self) -> None:
        """SIGKILL to the group: whoever waits for the exit sees it soon."""
        self.agent.signal_group(signal.SIGKILL)

    async def reap(self) -> int:
        """Collect the exited agent (killing what is left in its group first), then what it left behind and was
        handed to us (only a subreaper is); returns its status as `AgentProcess.reap`."""
        returncode = self.agent.reap()
        await collect_orphans(trio.current_time() + REAP_SECS, self.agent.cgroup, self.agent.limit_groups)
        return returncode

    def send(self, data: bytes) -> None:
        """Write `data` to the agent's stdin after what was queued before (a no-op once stdin is closed)."""
        if self.stdin_queue is not None:
            self.stdin_queue.put(data)

    def stderr_text(self) -> str:
        return self.stderr_tail.text()

    def _not_reading(self) -> None:
        """The agent left more than its stdin queue's limit unread: it is killed, and fails the turn."""
        assert self.stdin_queue is not None
        self.log.warning(
            "the agent stopped reading its stdin; killing it",
            unread_bytes=self.stdin_queue.overflowed,
            limit_bytes=self.stdin_queue.limit,
            in_result=True,
        )
        self.kill()
        if self._on_not_reading is not None:
            self._on_not_reading()

    # ------------------------------------------------------------------ the pumps

    async def pump_stdout(self, on_output: Callable[[bytes], Awaitable[None]]) -> None:
        reader = self.stdout
        try:
            with reader.scope:
                while data := await reader.receive():
                    deadline = self.deadline
                    if deadline is None or deadline.idle_secs is None:
                        await on_output(data)
                    else:
                        deadline.hold()  # time spent in host callbacks is not the agent's silence
                        await on_output(data)
                        deadline.renew()
        finally:
            reader.done.set()

    async def pump_stderr(self) -> None:
        try:
            await self.stderr_tail.pump(self.stderr)
        finally:
            self.stderr.done.set()

    def _stderr_while_waiting(self, data: bytes) -> None:
        if data:
            self.stderr_tail.take(data)
        else:
            self.stderr.done.set()

    async def feed_stdin(self) -> None:
        """Write the handover, then (with `stdin_open`) whatever `send` queues until the agent exits; then EOF.

        Runs beside the readers, so neither side can deadlock on a full pipe.
        """
        stream = self.agent.stdin
        assert stream is not None
        try:
            if self.plan.stdin:
                await stream.send_all(self.plan.stdin)
            if self.stdin_queue is not None:
                await self.stdin_queue.write_to(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.log.info("agent closed stdin before reading all that was written to it")
        finally:
            if self.stdin_queue is not None:
                self.stdin_queue.drop()
            with trio.CancelScope(shield=True):
                await stream.aclose()
