"""The agent's process as the turn sees it: pipes, deadlines, kill escalation and its end.

`AgentIO` knows nothing of what the agent says. It reads stdout and hands each
chunk to whoever drives the turn, keeps the stderr tail, writes to stdin as
often as asked (the handover, then any answers), enforces the turn's wall and
idle deadlines and the host's cancel — SIGTERM or SIGINT to the group, the
grace, SIGKILL — and reaps the agent and whatever it left behind. Every task
runs in one nursery and every deadline is a cancel scope; cleanup runs under
a shield, so no exit path can leave a process behind.
"""

from __future__ import annotations

import math
import os
import signal
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .launch import LaunchPlan
from .process import READ_CHUNK, AgentProcess, collect_orphans
from .profile import Profile
from .result import Ending

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
OUTBOX_LIMIT_BYTES = 64 * 1024 * 1024


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


class StderrTail:
    """An agent's stderr as it is read: each chunk to `on_chunk` (if any), the last few KiB kept for the result."""

    __slots__ = ("on_chunk", "_tail", "_total")

    def __init__(self, on_chunk: Callable[[bytes], None] | None = None) -> None:
        self.on_chunk = on_chunk
        self._tail = bytearray()
        self._total = 0

    async def pump(self, reader: _Reader) -> None:
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


class Outbox:
    """What the bridge writes to an agent's stdin, in order, bounded by bytes; `write_to` writes it.

    `put` never waits: it is called while the agent's output is being handled. What waits unwritten
    (queued, or being written) may exceed `limit` bytes only by one message put while nothing waited,
    so the largest answer reaches an agent that reads. Past that, the agent is not reading what it
    asked for: the outbox drops all it holds at once, takes nothing more, and calls `on_overflow`
    (once), whose engine kills the agent. Shared by the one-process and the warm engine.
    """

    __slots__ = ("limit", "waiting", "overflowed", "_queue", "_closed", "_on_overflow", "_wakeup", "_writing")

    def __init__(self, on_overflow: Callable[[], None], limit: int = OUTBOX_LIMIT_BYTES) -> None:
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


class AgentIO:
    """One running agent's I/O and lifetime; `run()` drives it to a reaped end."""

    def __init__(
        self,
        profile: Profile,
        plan: LaunchPlan,
        agent: AgentProcess,
        log: Any,
        started: float,
        on_stderr: Callable[[bytes], None] | None = None,
    ) -> None:
        self.profile = profile
        self.plan = plan
        self.agent = agent
        self.log = log
        self.stdout = _Reader(agent.stdout)
        self.stderr = _Reader(agent.stderr)
        self.stderr_tail = StderrTail(on_stderr)
        # With a pidfd, stderr is read by the wait for the agent's exit, not by a task of its own.
        self._on_stderr = self._stderr_while_waiting if agent.reads_stderr_while_waiting else None
        # Only an agent whose stdin stays open is answered later.
        self.outbox = Outbox(self._not_reading) if plan.stdin_open else None
        self.wall_deadline = started + profile.timeout_secs
        idle = profile.idle_timeout_secs
        self.exit_wait = trio.CancelScope(
            deadline=self.wall_deadline if idle is None else min(self.wall_deadline, started + idle)
        )
        self.cancel_requested = False

    async def run(
        self,
        on_output: Callable[[bytes], Awaitable[None]],
        cancel: trio.Event | None,
        on_stopping: Callable[[], None] | None = None,
    ) -> Ending:
        """Pump the pipes until the agent has exited and its output is drained; `on_output` gets each stdout chunk.

        `on_stopping` is called once the agent exited or is being stopped (a
        timeout, a cancel): whatever waits on the host for this turn stops waiting.
        """
        others = self.agent.stdin is not None or cancel is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.pump_stdout, on_output)
            if self._on_stderr is None:
                nursery.start_soon(self.pump_stderr)
            if self.agent.stdin is not None:
                nursery.start_soon(self.feed_stdin)
            if cancel is not None:
                nursery.start_soon(self.watch_cancel, cancel)
            ending = await self.wait_for_exit(on_stopping)
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
            if others:  # stdin, the host's cancel: the pipes are done, so these are no longer needed
                nursery.cancel_scope.cancel()
        return ending

    def send(self, data: bytes) -> None:
        """Write `data` to the agent's stdin after what was queued before (a no-op once stdin is closed)."""
        if self.outbox is not None:
            self.outbox.put(data)

    def _not_reading(self) -> None:
        """The agent let more than the outbox's limit wait unread on its stdin: it is killed, and fails the turn."""
        assert self.outbox is not None
        self.log.warning(
            "the agent stopped reading its stdin; killing it",
            unread_bytes=self.outbox.overflowed,
            limit_bytes=self.outbox.limit,
            in_result=True,
        )
        self.agent.signal_group(signal.SIGKILL)

    async def wait_for_exit(self, on_stopping: Callable[[], None] | None = None) -> Ending:
        with self.exit_wait:
            await self.agent.wait_exited(self._on_stderr)
        if on_stopping is not None:
            on_stopping()
        timeout = None
        if self.exit_wait.cancelled_caught:
            if self.cancel_requested:
                self.log.info("turn cancelled by the host; interrupting the agent")
                await self.stop(signal.SIGINT)
            else:
                timeout = "wall" if trio.current_time() >= self.wall_deadline else "idle"
                self.log.warning(
                    "turn timed out; terminating the agent",
                    timeout=timeout,
                    limit_secs=self.profile.timeout_secs if timeout == "wall" else self.profile.idle_timeout_secs,
                    in_result=True,
                )
                await self.stop(signal.SIGTERM)
        returncode = self.agent.reap()
        await self.reap_leftovers()
        return Ending(
            returncode=returncode,
            timeout=timeout,
            cancelled=self.cancel_requested and timeout is None,
            unread=self.outbox.overflowed if self.outbox is not None else 0,
        )

    async def stop(self, signum: int) -> None:
        """`signum` to the group; after `kill_grace_secs`, SIGKILL."""
        self.agent.signal_group(signum)
        with trio.move_on_after(self.profile.kill_grace_secs):
            await self.agent.wait_exited(self._on_stderr)
            return
        self.log.warning(
            "agent still running after the grace period; killing it",
            signal=signal.Signals(signum).name,
            grace_secs=self.profile.kill_grace_secs,
        )
        self.agent.signal_group(signal.SIGKILL)
        await self.agent.wait_exited(self._on_stderr)

    async def reap_leftovers(self) -> None:
        """Kill and reap what the agent left behind and was handed to us (only a subreaper is)."""
        await collect_orphans(trio.current_time() + REAP_SECS, self.agent.cgroup)

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

    async def pump_stdout(self, on_output: Callable[[bytes], Awaitable[None]]) -> None:
        reader = self.stdout
        idle = self.profile.idle_timeout_secs
        exit_wait = self.exit_wait
        try:
            with reader.scope:
                while data := await reader.receive():
                    if idle is None:
                        await on_output(data)
                    else:
                        # Time spent in host callbacks is not the agent's silence.
                        exit_wait.deadline = self.wall_deadline
                        await on_output(data)
                        exit_wait.deadline = min(self.wall_deadline, trio.current_time() + idle)
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

    def stderr_text(self) -> str:
        return self.stderr_tail.text()

    async def feed_stdin(self) -> None:
        """Write the handover, then (with `stdin_open`) whatever `send` queues until the agent exits; then EOF.

        Runs beside the readers, so neither side can deadlock on a full pipe.
        """
        stream = self.agent.stdin
        assert stream is not None
        try:
            if self.plan.stdin:
                await stream.send_all(self.plan.stdin)
            if self.outbox is not None:
                await self.outbox.write_to(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.log.info("agent closed stdin before reading all that was written to it")
        finally:
            if self.outbox is not None:
                self.outbox.drop()
            await stream.aclose()
