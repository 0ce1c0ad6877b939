"""Warm agents: one long-lived process per conversation, many turns, one at a time.

ACP, aionrs and Ante agents keep their session in a process that stays up
between messages. `WarmAgent` is that process as the bridge sees it:

- `start(nursery)` spawns it (in its own process group, guarded by the keeper
  like every agent), runs its pumps in `nursery` — the host's pool, or a
  caller's for one turn — and lets its dialect set the session up (a new one,
  or the stored one resumed) within the profile's `start_timeout_secs`;
- `turn(...)` sends a message and returns the turn's result. Every rule of a
  turn holds as for a one-process turn: the recorder's caps and precedence,
  the wall and idle deadlines (per turn), a host cancel, permission requests
  answered by the profile's policy or asked of the host. A deadline or a
  cancel first asks the agent to stop (the protocol's cancel); if the turn is
  not over after `kill_grace_secs`, the process group is killed and the agent
  is not reused. A process that dies mid-turn fails that turn;
- `close()` says goodbye (the protocol's shutdown, then end of file on its
  stdin), waits `kill_grace_secs`, then kills the group and reaps it.

Whatever the agent says between turns — a resumed session's replay, a late
notification — belongs to no turn and is dropped (its dialect drops most of
it already). `run_warm_turn` is one turn on a fresh agent: how `run_turn`
and `agent-bridge run` drive a warm protocol.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from collections.abc import Callable
from typing import Any

import trio

from .agent_files import FileRefused, FileRoot, serve_file_request
from .agent_io import Outbox, StderrTail, _Reader
from .dialects import ErrorEvent, Event, ProtocolWarning, Ready, SessionEvent, TurnEnd
from .dialects.events import AgentInput, FileRequest
from .errors import BridgeError, LaunchError
from .launch import plan_launch
from .log import get_logger
from .process import AgentProcess, collect_orphans, start
from .profile import Profile
from .questions import Questions
from .result import Ending, TurnRecorder, TurnResult
from .supervisor import Emit, _TurnLoop
from .turn import Turn

# After the process exits, what is still in its pipes is read for at most this long.
DRAIN_SECS = 1.0


class WarmStartError(BridgeError):
    """The agent could not be started, or its session not set up; `exit_code` as for a spawn failure."""

    def __init__(self, exit_code: int, message: str, stderr_tail: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message
        self.stderr_tail = stderr_tail

    def result(self, profile: Profile, log: Any, duration_ms: int = 0) -> TurnResult:
        """The turn that could not run, as its result (a spawn failure)."""
        log.warning("agent could not be started", reason=self.message, exit_code=self.exit_code, in_result=True)
        return TurnRecorder(profile).finish(
            Ending(spawn_failure=(self.exit_code, self.message)), stderr_tail=self.stderr_tail, duration_ms=duration_ms
        )


class WarmAgent:
    """One long-lived agent: its process, its dialect, and the turn in progress (at most one)."""

    def __init__(
        self, profile: Profile, *, session_id: str = "", session_name: str = "default", log: Any = None
    ) -> None:
        self.profile = profile
        self.session_name = session_name
        self.session_id = session_id  # the stored one, until the agent says which it is (`Ready`)
        self.log = log if log is not None else get_logger(profile=profile.label, agent="warm")
        self.turns = 0
        self.stamp = ""  # what the session store said when it recorded this agent's last turn ("": cannot tell)
        self.returncode: int | None = None
        self._process: AgentProcess | None = None
        self._dialect: Any = None
        self._cwd = ""
        self._files: FileRoot | None = None  # the working directory, held open while the agent lives
        self._file_request: trio.CancelScope | None = None  # the file request being served
        self._file_threads = trio.CapacityLimiter(1)  # an abandoned request's thread keeps its token until it ends
        self._outbox: Outbox | None = None
        self._ready = trio.Event()
        self._dead = trio.Event()
        self._reaped = trio.Event()
        self._start_error = ""
        self._stderr = StderrTail()  # this turn's (or, before the first, the start-up's)
        # The turn in progress.
        self._loop: _TurnLoop | None = None
        self._wake: trio.Event | None = None  # set when the turn is over, failed in a callback, or the agent died
        self._turn_over = False
        self._turn_error: BaseException | None = None  # a host callback raised while the pumps ran the turn
        self._turn_wait: trio.CancelScope | None = None
        self._idle_secs: float | None = None
        self._wall_deadline = math.inf

    # ------------------------------------------------------------------ state

    @property
    def alive(self) -> bool:
        """The process runs: it takes turns (now, or once the current one is over)."""
        return self._process is not None and not self._dead.is_set()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def unfit_for(self, profile: Profile, session_id: str, stamp: str = "") -> str | None:
        """Why this agent cannot take a turn of `profile` that resumes `session_id` as if it had just resumed it;
        None when it can. `stamp` is the session store's now (see `SessionStore.lookup`): another one than
        `self.stamp` means some other process took a turn of the conversation, which this agent missed."""
        if not self.alive:
            return "its process is gone"
        if self.profile != profile:
            return "its profile changed"
        if self.session_id != session_id:
            return "the turn resumes another session"
        if self.stamp and stamp != self.stamp:
            return "another process took a turn of the conversation since"
        return None

    # ------------------------------------------------------------------ lifetime

    async def start(self, nursery: trio.Nursery) -> None:
        """Spawn the agent and set its session up; raises `WarmStartError` when either fails."""
        profile = self.profile
        try:
            plan = plan_launch(
                profile, Turn("", session_id=self.session_id, session_name=self.session_name), os.environ
            )
            self._cwd = plan.cwd or os.getcwd()
            with contextlib.suppress(OSError):  # then spawn says what is wrong with the directory
                self._files = FileRoot(self._cwd)  # held before the agent runs: it has moved nothing yet
            self._process = await start(plan, kill_grace_secs=profile.kill_grace_secs)
        except LaunchError as err:
            raise WarmStartError(err.exit_code, err.message) from None
        finally:
            if self._process is None and self._files is not None:
                self._files.close()
        self._dialect = profile.dialect(profile.dialect_context, session_id=self.session_id, cwd=self._cwd)
        self.log = self.log.bind(pid=self._process.pid)
        self.log.info("warm agent started", program=plan.argv[0], resuming=bool(self.session_id))
        self._outbox = outbox = Outbox(self._not_reading)
        await nursery.start(self._run)
        self._send(self._dialect.open())
        try:
            with trio.move_on_after(profile.start_timeout_secs):
                await _first_of(self._ready, self._dead)
        except BaseException:  # the caller went away while the session was being set up
            await self.close(grace=0)
            raise
        if self._ready.is_set():
            return
        if self._dead.is_set():
            await self._reaped.wait()
            reason = self._start_error or f"it exited ({self._exit_text()}) while setting its session up"
            if outbox.overflowed:
                reason = "it stopped reading its stdin, so it was killed"
        else:
            reason = self._start_error or f"it did not set its session up within {profile.start_timeout_secs:g} s"
        await self.close(grace=0)
        raise WarmStartError(126, f"the agent could not start its session: {reason}", self._stderr.text())

    async def close(self, grace: float | None = None) -> None:
        """Say goodbye, give the agent `grace` (default `kill_grace_secs`) to exit, then kill its group."""
        process = self._process
        if process is None:
            return
        grace = self.profile.kill_grace_secs if grace is None else grace
        with trio.CancelScope(shield=True):
            if not self._dead.is_set():
                if grace > 0 and self._dialect is not None:
                    self._send(self._dialect.shutdown())
                if self._outbox is not None:
                    self._outbox.close()  # end of file on its stdin, once what was queued is written
                with trio.move_on_after(grace):
                    await self._dead.wait()
                if not self._dead.is_set():
                    self.log.info("warm agent did not leave in time; killing it", grace_secs=grace)
                    process.signal_group(signal.SIGKILL)
            await self._reaped.wait()

    async def _run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The agent's pumps until it is gone; then it is reaped (whatever ends this task, the group is killed)."""
        process = self._process
        assert process is not None
        try:
            async with trio.open_nursery() as pumps:
                pumps.start_soon(self._pump_stdout, _Reader(process.stdout))
                pumps.start_soon(self._stderr.pump, _Reader(process.stderr))
                pumps.start_soon(self._feed_stdin)
                task_status.started()
                await process.wait_exited()
                self._dead.set()
                self._wake_turn()
                if self._outbox is not None:
                    self._outbox.drop()  # nobody will read it
                # What is still in the pipes is read, for a bounded time (a stray process may hold them).
                pumps.cancel_scope.deadline = trio.current_time() + DRAIN_SECS
        except Exception as err:  # a dialect's bug: what the agent says cannot be read any more
            self.log.error("the warm agent's output could not be read; killing it", error=repr(err))
            if self._wake is not None:
                self._turn_error = (
                    err.exceptions[0] if isinstance(err, ExceptionGroup) and len(err.exceptions) == 1 else err
                )
        finally:
            with trio.CancelScope(shield=True):
                self._dead.set()
                self.returncode = process.reap()  # kills whatever is left in its group first
                await collect_orphans(trio.current_time() + 1.0, process.cgroup)
                process.close()
                if self._files is not None:
                    self._files.close()
                self.log.info("warm agent ended", returncode=self.returncode, turns=self.turns)
                self._reaped.set()
                self._wake_turn()

    # ------------------------------------------------------------------ pipes

    def _send(self, data: bytes) -> None:
        if self._outbox is not None:
            self._outbox.put(data)

    def _not_reading(self) -> None:
        """More than the outbox's limit waited unread on the agent's stdin: the agent is killed, its turn fails."""
        assert self._outbox is not None and self._process is not None
        self.log.warning(
            "the warm agent stopped reading its stdin; killing it",
            unread_bytes=self._outbox.overflowed,
            limit_bytes=self._outbox.limit,
        )
        self._process.signal_group(signal.SIGKILL)
        self._loop = None  # the turn takes no more events
        self._wake_turn()

    async def _feed_stdin(self) -> None:
        process, outbox = self._process, self._outbox
        assert process is not None and process.stdin is not None and outbox is not None
        stream = process.stdin
        try:
            await outbox.write_to(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.log.info("the warm agent closed its stdin")
        finally:
            outbox.drop()
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _pump_stdout(self, reader: _Reader) -> None:
        with reader.scope:
            while data := await reader.receive():
                waiting = self._turn_wait
                if waiting is None or self._idle_secs is None:
                    await self._route(self._dialect.feed(data))
                    continue
                # Time spent in host callbacks (a question waiting for its answer) is not the agent's silence.
                waiting.deadline = self._wall_deadline
                await self._route(self._dialect.feed(data))
                waiting.deadline = min(self._wall_deadline, trio.current_time() + self._idle_secs)
        await self._route(self._dialect.close())

    async def _route(self, events: list[Event]) -> None:
        """The turn gets its events; the session keeps its own (ready, input to write); the rest is dropped."""
        batch: list[Event] = []
        for event in events:
            kind = type(event)
            if kind is Ready:
                self.session_id = event.session_id  # type: ignore[union-attr]
                self._ready.set()
            elif kind is AgentInput:
                self._send(event.data)  # type: ignore[union-attr]
            elif kind is FileRequest:
                await self._serve_file(event)  # type: ignore[arg-type]
            elif kind is TurnEnd:
                await self._hand_over(batch)
                batch = []
                if self._wake is not None:  # a turn is in progress (its loop may be gone: a callback raised)
                    self._turn_over = True
                    self._wake_turn()
            elif self._loop is not None:
                batch.append(event)
            elif kind is ProtocolWarning:
                self.log.warning(event.message)  # type: ignore[union-attr]
            elif kind is ErrorEvent and not self._ready.is_set():
                self._start_error = event.text  # type: ignore[union-attr]
        if batch:
            await self._hand_over(batch)

    async def _serve_file(self, request: FileRequest) -> None:
        """A file the agent asks the bridge to read or write (the profile granted it), beneath its cwd.

        A request never holds the turn up: when the turn stops (its deadline, a cancel) or the request takes longer
        than the agent may stay silent, the agent is told it failed, and its worker thread is abandoned."""
        content: str | None = None
        error: str | None = None
        deadline = self._wall_deadline
        if self._idle_secs is not None:
            deadline = min(deadline, trio.current_time() + self._idle_secs)
        with trio.CancelScope(deadline=deadline) as scope:
            self._file_request = scope
            try:
                if self._files is None:
                    raise FileRefused(f"the bridge could not open the session's working directory ({self._cwd})")
                content = await trio.to_thread.run_sync(
                    serve_file_request, request, self._files, abandon_on_cancel=True, limiter=self._file_threads
                )
            except FileRefused as refused:
                error = str(refused)
            finally:
                self._file_request = None
        if scope.cancelled_caught:
            error = (
                f"the bridge stopped waiting for this {request.operation}: the turn stopped, or it took longer "
                "than the agent may stay silent"
            )
            if request.operation == "write":
                error += " (the write may still happen)"
        if error is not None:
            self.log.info("a file request of the agent was refused", operation=request.operation)
            self._send(self._dialect.file_reply(request.request_id, error=error))
        else:
            self._send(self._dialect.file_reply(request.request_id, content=content))

    async def _hand_over(self, events: list[Event]) -> None:
        """Events to the turn's loop. A host callback that raises ends the turn for the host (it runs in the
        pumps' task, not the host's): the error is kept for `turn()` to raise where the host awaits it."""
        loop = self._loop
        if loop is None or not events:
            return
        try:
            await loop.handle(events)
        except Exception as err:
            self._turn_error = err
            self._loop = None  # the turn takes no more events
            self._wake_turn()

    def _wake_turn(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _exit_text(self) -> str:
        code = self.returncode
        if code is None:
            return "exit status unknown"
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    # ------------------------------------------------------------------ turns

    async def turn(
        self,
        turn: Turn,
        emit: Emit | None = None,
        *,
        cancel: trio.Event | None = None,
        questions: Questions | None = None,
        log: Any = None,
        on_stderr: Callable[[bytes], None] | None = None,
    ) -> TurnResult:
        """One turn on this agent; its result as for any turn. One at a time; the agent must have started."""
        if self._wake is not None:
            raise RuntimeError("a warm agent takes one turn at a time")
        profile = self.profile
        log = log if log is not None else self.log
        started = trio.current_time()
        recorder = TurnRecorder(profile)
        questions = questions if questions is not None else Questions()
        loop = _TurnLoop(self._dialect, recorder, profile.permission_policy, emit, log, self._send, questions)
        self._stderr.clear()
        self._stderr.on_chunk = on_stderr
        self.turns += 1
        self._wake = trio.Event()
        self._turn_over = False
        self._turn_error = None
        self._wall_deadline = started + profile.timeout_secs
        self._idle_secs = profile.idle_timeout_secs
        try:
            if not self.alive:
                ending = Ending(spawn_failure=(126, "the warm agent is not running"))
            else:
                if self.session_id:
                    await loop.handle([SessionEvent(self.session_id)])
                self._loop = loop
                self._send(self._dialect.prompt(turn))
                ending = await self._wait_for_turn(questions, cancel, log)
        finally:
            self._loop = None
            self._wake = None
            self._turn_wait = None
            self._stderr.on_chunk = None
            questions.close()
        if self._turn_error is not None:
            error, self._turn_error = self._turn_error, None
            raise error
        duration_ms = round((trio.current_time() - started) * 1000)
        result = recorder.finish(ending, stderr_tail=self._stderr.text(), duration_ms=duration_ms)
        log.info(
            "turn finished",
            outcome=result.outcome.value,
            exit_code=result.exit_code,
            duration_ms=duration_ms,
            partials=result.partials,
            warm=True,
        )
        if emit is not None and (pending := emit(result)) is not None:
            await pending
        return result

    async def _wait_for_turn(self, questions: Questions, cancel: trio.Event | None, log: Any) -> Ending:
        wake = self._wake
        assert wake is not None
        idle = self._idle_secs
        deadline = self._wall_deadline if idle is None else min(self._wall_deadline, trio.current_time() + idle)
        try:
            with trio.CancelScope(deadline=deadline) as waiting:
                self._turn_wait = waiting
                await _first_of(wake, cancel)
        except BaseException:  # the host's task is cancelled: stop the turn as a host cancel, then let it go
            with trio.CancelScope(shield=True):
                await self._stop_turn(questions, log, "the host went away")
            raise
        finally:
            self._turn_wait = None
        unread = self._outbox.overflowed if self._outbox is not None else 0
        if unread:  # whatever else the agent said: it was killed
            await self._reaped.wait()
            return Ending(returncode=self.returncode, unread=unread)
        if self._turn_over:
            return Ending(returncode=0)
        if self._turn_error is not None:
            await self._stop_turn(questions, log, "a host callback raised")
            return Ending(returncode=0, cancelled=True)
        if self._dead.is_set():
            await self._reaped.wait()
            log.warning("the warm agent ended during the turn", returncode=self.returncode)
            return Ending(returncode=self.returncode if self.returncode else 1)
        if waiting.cancelled_caught:
            timeout = "wall" if trio.current_time() >= self._wall_deadline else "idle"
            log.warning("turn timed out; asking the warm agent to stop it", timeout=timeout)
            await self._stop_turn(questions, log, "timed out")
            return Ending(returncode=0, timeout=timeout)
        log.info("turn cancelled by the host; asking the warm agent to stop it")
        await self._stop_turn(questions, log, "cancelled")
        return Ending(returncode=0, cancelled=True)

    async def _stop_turn(self, questions: Questions, log: Any, why: str) -> None:
        """The protocol's cancel; after `kill_grace_secs` without the turn over, the group is killed."""
        questions.close()  # whatever waits for the host stops waiting
        if self._file_request is not None:
            self._file_request.cancel()
        if self._dead.is_set() or self._turn_over:
            return
        self._send(self._dialect.cancel())
        wake = trio.Event()
        self._wake = wake
        with trio.move_on_after(self.profile.kill_grace_secs):
            while not (self._turn_over or self._dead.is_set()):
                await wake.wait()
                wake = self._wake = trio.Event()
        if not (self._turn_over or self._dead.is_set()):
            log.warning(
                "the warm agent did not stop the turn in time; killing it",
                why=why,
                grace_secs=self.profile.kill_grace_secs,
            )
            if self._process is not None:
                self._process.signal_group(signal.SIGKILL)
            await self._reaped.wait()


async def _first_of(*events: trio.Event | None) -> None:
    """Return once any of `events` is set (None stands for one that never is)."""
    present = [event for event in events if event is not None]
    if any(event.is_set() for event in present):
        return
    if len(present) == 1:
        await present[0].wait()
        return
    async with trio.open_nursery() as waiters:
        for event in present:
            waiters.start_soon(_wait_then_cancel, event, waiters.cancel_scope)


async def _wait_then_cancel(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def run_warm_turn(
    profile: Profile,
    turn: Turn,
    emit: Emit | None = None,
    *,
    cancel: trio.Event | None = None,
    turn_id: str | None = None,
    questions: Questions | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
) -> TurnResult:
    """One turn of a warm protocol on a fresh agent that resumes `turn.session_id`; then goodbye."""
    log = get_logger(turn_id=turn_id or os.urandom(6).hex(), profile=profile.label)
    agent = WarmAgent(profile, session_id=turn.session_id, session_name=turn.session_name, log=log)
    async with trio.open_nursery() as nursery:
        try:
            try:
                await agent.start(nursery)
            except WarmStartError as err:
                result = err.result(profile, log)
                if emit is not None and (pending := emit(result)) is not None:
                    await pending
                return result
            return await agent.turn(turn, emit, cancel=cancel, questions=questions, log=log, on_stderr=on_stderr)
        finally:
            await agent.close()
