"""Warm agents: one long-lived process per conversation, many turns, one at a time.

Claude Code (claude-sdk), codex app-server, ACP, aionrs and Ante agents keep
their session in a process that stays up between messages. `WarmAgent` is that process as the bridge sees it, driven
by the same `AgentIO` as a one-turn process (pipes, outbox, drain, reaping)
and taking its turns through the same `TurnLoop`:

- `start(nursery)` spawns it (in its own process group, guarded by the keeper
  like every agent), runs its pumps in `nursery` — the host's pool, or a
  caller's for one turn — and lets its dialect set the session up (a new one,
  or the stored one resumed) within the profile's `start_timeout_secs`;
- when the agent proves the stored session gone, `start` starts it again on
  a new session (the host is told at the next turn) or fails, as the
  profile's `on_resume_failure` says;
- `turn(...)` sends a message and returns the turn's result; `steer(...)`
  gives the turn in progress another message (`on_busy: steer`). Every rule of a
  turn holds as for a one-process turn: the recorder's caps and precedence,
  the wall and idle deadlines (armed per turn: `AgentIO.begin_turn`), a host
  cancel, permission requests answered by the profile's policy or asked of
  the host. A deadline or a cancel first asks the agent to stop (the
  protocol's cancel); if the turn is not over after `kill_grace_secs`, the
  process group is killed and the agent is not reused. A process that dies
  mid-turn fails that turn;
- `close()` says goodbye (the protocol's shutdown, then end of file on its
  stdin), waits `kill_grace_secs`, then kills the group and reaps it.

Whatever the agent says between turns — a resumed session's replay, a late
notification — belongs to no turn and is dropped (its dialect drops most of
it already). `run_warm_turn` is one turn on a fresh agent: how `run_turn`
and `agent-bridge run` drive a warm protocol.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from typing import Any

import trio

from ..confinement.spawner import start
from ..dialects import ActivityEvent, ErrorEvent, Event, ProtocolWarning, Ready, SessionEvent, TurnEnd
from ..dialects.base import outbox_named
from ..dialects.events import AgentInput, FileRequest, SessionGone, SteerOutcome
from ..dialects.warm import WarmDialect, WarmState
from ..errors import FileRefused, LaunchError, ProtocolMisuse, WarmStartError
from ..files.agent_requests import FileRoot, serve_file_request
from ..files.turn_directory import SessionOutbox
from ..log import Logger, get_logger
from ..profile import Profile
from ..turn import Turn
from .driver import AgentIO, TurnDeadline, TurnLimits
from .launch import LaunchPlan, plan_warm_launch
from .loop import Emit, EventCallback, TurnLoop, emit_to, finish_turn, turn_logger
from .questions import Questions
from .result import Ending, TurnRecorder, TurnResult
from .turn_setup import TurnSetup, turn_set_up


def start_failure_result(error: WarmStartError, profile: Profile, log: Logger, duration_ms: int = 0) -> TurnResult:
    """The turn that could not run because its agent did not start (`error`), as its result (a spawn failure)."""
    log.warning("agent could not be started", reason=error.message, exit_code=error.exit_code, in_result=True)
    return TurnRecorder(profile).finish(
        Ending(spawn_failure=(error.exit_code, error.message)), stderr_tail=error.stderr_tail, duration_ms=duration_ms
    )


class WarmAgent:
    """One long-lived agent: its process, its dialect, and the turn in progress (at most one)."""

    def __init__(
        self, profile: Profile, *, session_id: str = "", session_name: str = "default", log: Logger | None = None
    ) -> None:
        self.profile = profile
        self.session_name = session_name
        self.session_id = session_id  # the stored one, until the agent says which it is (`Ready`)
        self.log = log if log is not None else get_logger(profile=profile.label, agent="warm")
        self.turns = 0
        self.stamp = ""  # what the session store said when it recorded this agent's last turn ("": cannot tell)
        self.returncode: int | None = None
        self._io: AgentIO | None = None  # the process, once spawned
        self._dialect: Any = None
        self._cwd = ""
        self._files: FileRoot | None = None  # the working directory, held open while the agent lives
        self._outbox: SessionOutbox | None = None  # the session's outbox, one path for all the process's turns
        self._outbox_due = ""  # the outbox to name in the next message (`tell_agent: session`, no other channel)
        self._file_request: trio.CancelScope | None = None  # the file request being served
        self._file_threads = trio.CapacityLimiter(1)  # an abandoned request's thread keeps its token until it ends
        self._ready = trio.Event()
        self._dead = trio.Event()
        self._reaped = trio.Event()
        self._gone = trio.Event()  # the agent proved the stored session gone (`SessionGone`) while starting
        self._gone_detail = ""
        self._start_error = ""
        self.session_lost = ""  # for the next turn's host: the stored session was gone, a new one was started
        self._steers: dict[str, _Steer] = {}  # messages steered into the turn in progress, by steer id
        # The turn in progress.
        self._loop: TurnLoop | None = None
        self._wake: trio.Event | None = None  # set when the turn is over, failed in a callback, or the agent died
        self._turn_over = False
        self._turn_error: BaseException | None = None  # a host callback raised while the pumps ran the turn
        self._told_session = ""  # the session id the turn's host was given: the agent may say it again

    # ------------------------------------------------------------------ state

    @property
    def alive(self) -> bool:
        """The process runs: it takes turns (now, or once the current one is over)."""
        return self._io is not None and not self._dead.is_set()

    @property
    def pid(self) -> int | None:
        return self._io.agent.pid if self._io is not None else None

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
        """Spawn the agent and set its session up; raises `WarmStartError` when either fails.

        When the agent proves the stored session is gone (`SessionGone`), the profile's `on_resume_failure` says
        what follows: `new_session` starts the agent again on a new session, and the next turn tells the host
        (an activity notice); `fail` raises `WarmStartError` with the agent's words.
        """
        gone = await self._launch(nursery)
        if gone is None:
            return
        stored = self.session_id
        await self.close(grace=0)
        if self.profile.on_resume_failure == "fail":
            raise WarmStartError(
                126,
                f"the agent no longer has the stored session {stored} ({gone}); the profile says "
                "on_resume_failure: fail (new_session would start a new one)",
            )
        self.log.warning("the stored session is gone; starting a new one", detail=gone)
        self._forget_process()
        self.session_id = ""
        self.session_lost = f"the stored session {stored} is gone ({gone}); a new session was started"
        gone = await self._launch(nursery)
        if gone is not None:  # a new session cannot be gone: the dialect is wrong
            await self.close(grace=0)
            raise WarmStartError(126, f"the agent could not start a new session: {gone}")

    def _forget_process(self) -> None:
        """Ready for another process after this one was closed (and reaped)."""
        self._io = None
        self._dialect = None
        self._files = None
        self._ready = trio.Event()
        self._dead = trio.Event()
        self._reaped = trio.Event()
        self._gone = trio.Event()
        self._gone_detail = ""
        self._start_error = ""
        self.returncode = None

    async def _launch(self, nursery: trio.Nursery) -> str | None:
        """One process and its session; the agent's words when it proves the stored session gone, else None."""
        profile = self.profile
        process = None
        try:
            plan = plan_warm_launch(profile, os.environ, session_id=self.session_id, session_name=self.session_name)
            self._cwd = plan.cwd or os.getcwd()
            dialect = profile.warm_dialect(profile.dialect_context, session_id=self.session_id, cwd=self._cwd)
            plan = self._with_outbox(plan, dialect)
            with contextlib.suppress(OSError):  # then spawn says what is wrong with the directory
                self._files = FileRoot(self._cwd)  # held before the agent runs: it has moved nothing yet
            process = await start(plan, kill_grace_secs=profile.kill_grace_secs)
        except LaunchError as err:
            raise WarmStartError(err.exit_code, err.message) from None
        finally:
            if process is None:
                self._drop_outbox()
                if self._files is not None:
                    self._files.close()
        self._dialect = dialect
        self.log = self.log.bind(pid=process.pid)
        self.log.info("warm agent started", program=plan.argv[0], resuming=bool(self.session_id))
        self._io = io = AgentIO(plan, process, self.log, TurnLimits.of(profile), on_not_reading=self._not_reading)
        await nursery.start(self._run)
        io.send(self._dialect.open())
        try:
            with trio.move_on_after(profile.start_timeout_secs):
                await _first_of(self._ready, self._dead, self._gone)
        except BaseException:  # the caller went away while the session was being set up
            await self.close(grace=0)
            raise
        if self._gone.is_set():
            return self._gone_detail
        if self._ready.is_set():
            return None
        if self._dead.is_set():
            await self._reaped.wait()
            reason = self._start_error or f"it exited ({self._exit_text()}) while setting its session up"
            if io.stdin_queue is not None and io.stdin_queue.overflowed:
                reason = "it stopped reading its stdin, so it was killed"
        else:
            reason = self._start_error or f"it did not set its session up within {profile.start_timeout_secs:g} s"
        await self.close(grace=0)
        raise WarmStartError(126, f"the agent could not start its session: {reason}", io.stderr_text())

    def _with_outbox(self, plan: LaunchPlan, dialect: Any) -> LaunchPlan:
        """`plan` with the session's outbox made and named in `AGENT_OUTBOX`, and told to the agent as the profile's
        `outbox.tell_agent` says: `session`, through the protocol's channel for standing instructions (`dialect`'s),
        or else in the first message; `every_turn`, in every message (`turn`); `never`, not at all."""
        self._drop_outbox()
        try:
            self._outbox = SessionOutbox(self._cwd)
        except FileRefused as err:  # a read-only working directory costs the agent its outbox, not its session
            self.log.warning("the session's outbox cannot be made; the agent gets none", reason=str(err))
            return plan
        plan = dataclasses.replace(plan, env={**plan.env, "AGENT_OUTBOX": self._outbox.path})
        if self.profile.tell_agent_outbox != "session":
            return plan
        # A dialect of its own making (a plugin's, a test's) that is no WarmDialect has no channel of its own.
        if isinstance(dialect, WarmDialect) and dialect.tell_standing(outbox_named(self._outbox.path)):
            return dataclasses.replace(plan, argv=dialect.command_line(plan.argv, plan.command_at))
        self._outbox_due = self._outbox.path
        return plan

    def _outbox_to_name(self) -> str:
        """The outbox the next message names ("" for none), as the profile's `outbox.tell_agent` says."""
        if self._outbox is None:
            return ""
        if self.profile.tell_agent_outbox == "every_turn":
            return self._outbox.path
        due, self._outbox_due = self._outbox_due, ""
        return due

    def _drop_outbox(self) -> None:
        """Remove the session's outbox, once its process's turns are over."""
        if self._outbox is not None:
            self._outbox.remove()
            self._outbox = None
        self._outbox_due = ""

    async def close(self, grace: float | None = None) -> None:
        """Say goodbye, give the agent `grace` (default `kill_grace_secs`) to exit, then kill its group."""
        io = self._io
        if io is None:
            return
        grace = self.profile.kill_grace_secs if grace is None else grace
        with trio.CancelScope(shield=True):
            if not self._dead.is_set():
                if grace > 0 and self._dialect is not None:
                    io.send(self._dialect.shutdown())
                if io.stdin_queue is not None:
                    io.stdin_queue.close()  # end of file on its stdin, once what was queued is written
                with trio.move_on_after(grace):
                    await self._dead.wait()
                if not self._dead.is_set():
                    self.log.info("warm agent did not leave in time; killing it", grace_secs=grace)
                    io.kill()
            await self._reaped.wait()

    async def _run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The agent's pumps until it is gone; then it is reaped (whatever ends this task, the group is killed)."""
        io = self._io
        assert io is not None
        try:
            async with trio.open_nursery() as pumps:
                io.start_pumps(pumps, self._on_output)
                task_status.started()
                await io.wait_exited()
                self._dead.set()
                self._wake_turn()
                if self._file_request is not None:
                    self._file_request.cancel()  # nobody is there to read its answer
                if io.stdin_queue is not None:
                    io.stdin_queue.drop()  # nobody will read it
                self.returncode = await io.reap()  # its group killed first, so only a stray process holds the pipes
                await io.drain()
                pumps.cancel_scope.cancel()
            await self._route(self._dialect.close())
        except Exception as err:  # a dialect's bug: what the agent says cannot be read any more
            self.log.error("the warm agent's output could not be read; killing it", error=repr(err))
            if self._wake is not None:
                self._turn_error = (
                    err.exceptions[0] if isinstance(err, ExceptionGroup) and len(err.exceptions) == 1 else err
                )
        finally:
            with trio.CancelScope(shield=True):
                self._dead.set()
                if self.returncode is None:
                    self.returncode = await io.reap()
                io.agent.close()
                if self._files is not None:
                    self._files.close()
                if self._wake is None:  # else the turn in progress hands its files over first
                    self._drop_outbox()
                self.log.info("warm agent ended", returncode=self.returncode, turns=self.turns)
                self._reaped.set()
                self._wake_turn()

    # ------------------------------------------------------------------ what the agent says

    def _not_reading(self) -> None:
        """The driver killed the agent for leaving its stdin unread: its turn takes no more events and ends."""
        self._loop = None
        self._wake_turn()

    async def _on_output(self, data: bytes) -> None:
        loop = self._loop
        await self._route(self._dialect.feed(data))
        while loop is not None and loop.held:  # what the agent said while a question of the turn waited
            events, loop.held = loop.held, []
            await self._route(events)

    async def _route(self, events: list[Event]) -> None:
        """The turn gets its events; the session keeps its own (ready, input to write); the rest is dropped."""
        batch: list[Event] = []
        for event in events:
            if isinstance(event, FileRequest):
                await self._serve_file(event)
            elif isinstance(event, TurnEnd):
                await self._hand_over(batch)
                batch = []
                if self._wake is not None:  # a turn is in progress (its loop may be gone: a callback raised)
                    self._turn_over = True
                    self._wake_turn()
            elif isinstance(event, (Ready, SessionGone, SteerOutcome, AgentInput)):
                said = self._keep_session_event(event)
                if said is not None:
                    batch.append(said)
            elif self._loop is not None:
                if self._is_news_to_the_turn(event):
                    batch.append(event)
            elif isinstance(event, ProtocolWarning):
                self.log.warning(event.message)
            elif isinstance(event, ErrorEvent) and not self._ready.is_set():
                self._start_error = event.text
        if batch:
            await self._hand_over(batch)

    def _keep_session_event(self, event: Ready | SessionGone | SteerOutcome | AgentInput) -> Event | None:
        """What the session keeps of an event of its own; what the turn in progress is to be told of it, if any."""
        assert self._io is not None
        if isinstance(event, Ready):
            self.session_id = event.session_id
            self._ready.set()
        elif isinstance(event, SessionGone):
            if not self._ready.is_set():
                self._gone_detail = event.detail
                self._gone.set()
            elif self._loop is not None:
                return ErrorEvent(f"the agent no longer has the session: {event.detail}")
        elif isinstance(event, SteerOutcome):
            steer = self._steers.get(event.steer_id)
            if steer is not None:
                steer.settle(event.folded)
        else:
            self._io.send(event.data)
        return None

    def _is_news_to_the_turn(self, event: Event) -> bool:
        """Whether the turn in progress is to see `event`: all but a session it was told of already."""
        if type(event) is SessionEvent:  # a family that names a new session in its first turn (claude-sdk)
            self.session_id = event.session_id
            if event.session_id == self._told_session:
                return False
            self._told_session = event.session_id
        return True

    async def _serve_file(self, request: FileRequest) -> None:
        """A file the agent asks the bridge to read or write (the profile granted it), beneath its cwd.

        A request never holds the turn up: when the turn stops (its deadline, a cancel), the agent exits, or the
        request takes longer than the agent may stay silent, the agent is told it failed, and its worker thread is
        abandoned."""
        io = self._io
        assert io is not None
        content: str | None = None
        error: str | None = None
        # Between turns (nothing should ask then), a request gets the bounds a turn starting now would have.
        turn = io.deadline if io.deadline is not None else TurnDeadline(io.limits, trio.current_time())
        with trio.CancelScope(deadline=turn.from_now()) as scope:
            self._file_request = scope
            if self._dead.is_set():  # asked as it exited: nobody is there to read the answer
                scope.cancel()
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
            io.send(self._dialect.file_reply(request.request_id, error=error))
        else:
            io.send(self._dialect.file_reply(request.request_id, content=content))

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
        on_event: EventCallback | None = None,
        *,
        cancel: trio.Event | None = None,
        questions: Questions | None = None,
        log: Logger | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        allow_hosts: tuple[str, ...] = (),
    ) -> TurnResult:
        """One turn on this agent; its result as for any turn. One at a time; the agent must have started.
        `allow_hosts`: the host's exceptions to the attachments' address rule, on top of the profile's.

        `on_event` (sync or async) sees each event of the turn, as `run_turn`'s does, but not the result: that is
        returned."""
        if self._wake is not None:
            raise ProtocolMisuse("a warm agent takes one turn at a time")
        log = log if log is not None else self.log
        started = trio.current_time()
        recorder = TurnRecorder(self.profile, os.environ)
        self.turns += 1
        questions = questions if questions is not None else Questions()
        io = self._io
        try:
            if io is None or not self.alive:
                ending = Ending(spawn_failure=(126, "the warm agent is not running"))
                return finish_turn(recorder, ending, "", started, log, warm=True)
            # the agent runs in its working directory: it is one (unless it was removed)
            async with turn_set_up(
                self.profile, turn, self._cwd, "warm", log, allow_hosts=allow_hosts, cancel=cancel
            ) as setup:
                if setup.ending is not None:
                    return finish_turn(recorder, setup.ending, "", started, log, warm=True)
                emit = emit_to(None, on_event)
                loop = TurnLoop(
                    self._dialect, recorder, self.profile.permission_policy, emit, log, io.send, questions,
                    io.stdout.receive,
                )  # fmt: skip
                ending = await self._run_turn(io, loop, setup, on_stderr, cancel, started)
                result = finish_turn(recorder, ending, io.stderr_text(), started, log, warm=True)
                self._move_outbox_files(setup)
                return await setup.hand_out(self.profile, result, emit)
        finally:
            questions.close()  # a turn that did not start too: whoever waits on a question is answered

    async def _run_turn(
        self,
        io: AgentIO,
        loop: TurnLoop,
        setup: TurnSetup,
        on_stderr: Callable[[bytes], None] | None,
        cancel: trio.Event | None,
        started: float,
    ) -> Ending:
        """The turn's prompt given to the agent, and how the turn ended once the agent said so (or did not)."""
        io.stderr_tail.clear()
        io.stderr_tail.on_chunk = on_stderr
        self._wake = trio.Event()
        self._turn_over = False
        self._turn_error = None
        self._told_session = self.session_id
        try:
            if self.session_id:
                await loop.handle([SessionEvent(self.session_id)])
            if self.session_lost:
                notice, self.session_lost = self.session_lost, ""
                await loop.handle([ActivityEvent("notice", text=notice)])
            self._loop = loop
            deadline = io.begin_turn(started)
            io.send(self._dialect.prompt(setup.turn, self._outbox_to_name() if setup.files is not None else ""))
            ending = await self._wait_for_turn(io, deadline, loop.questions, cancel, loop.log)
            self._raise_turn_error()
        except BaseException:
            self._move_outbox_files(setup)  # what the session's outbox holds goes with the turn's
            raise
        finally:
            self._loop = None
            self._wake = None
            io.end_turn()
            io.stderr_tail.on_chunk = None
            loop.questions.close()
            for steer in self._steers.values():  # the dialect said nothing of them: they run as turns of their own
                steer.settle(False)
        return ending

    def _move_outbox_files(self, setup: TurnSetup) -> None:
        """The turn is over: what the session's outbox holds moves to the turn's, to be sent from there."""
        if self._outbox is not None and setup.files is not None:
            self._outbox.hand_over(setup.files)
            if self._dead.is_set():  # the process is gone: no turn writes there any more
                self._drop_outbox()

    @property
    def can_steer(self) -> bool:
        """A turn is in progress and the agent's protocol can give it another message (`steer`)."""
        return self._wake is not None and self.alive and self._dialect.can_steer

    async def steer(self, turn: Turn) -> bool:
        """Give the turn in progress `turn`'s message (`on_busy: steer`). True once the agent took it into that
        turn; False when it is to run as a turn of its own (no turn in progress, the protocol cannot steer, the
        agent refused it or the turn ended first)."""
        io = self._io
        if io is None or not self.can_steer or self._dialect.state is not WarmState.IN_TURN:
            return False
        steer_id = os.urandom(6).hex()
        steer = self._steers[steer_id] = _Steer()
        try:
            io.send(self._dialect.steer(turn, steer_id))
            await steer.settled.wait()
        finally:
            del self._steers[steer_id]
        self.log.info("a message was steered into the running turn", folded=steer.folded)
        return steer.folded

    def _raise_turn_error(self) -> None:
        """A host callback raised while the pumps ran the turn: raise it here, where the host awaits the turn."""
        if self._turn_error is not None:
            error, self._turn_error = self._turn_error, None
            raise error

    async def _wait_for_turn(
        self, io: AgentIO, deadline: TurnDeadline, questions: Questions, cancel: trio.Event | None, log: Logger
    ) -> Ending:
        wake = self._wake
        assert wake is not None
        deadline.renew()  # the idle clock runs from the prompt
        try:
            with deadline.scope:
                await _first_of(wake, cancel)
        except BaseException:  # the host's task is cancelled: stop the turn as a host cancel, then let it go
            with trio.CancelScope(shield=True):
                await self._stop_turn(io, questions, log, "the host went away")
            raise
        unread = io.stdin_queue.overflowed if io.stdin_queue is not None else 0
        if unread:  # whatever else the agent said: it was killed
            await self._reaped.wait()
            return Ending(returncode=self.returncode, unread=unread)
        if self._turn_over:
            return Ending(returncode=0)
        if self._turn_error is not None:
            await self._stop_turn(io, questions, log, "a host callback raised")
            return Ending(returncode=0, cancelled=True)
        if self._dead.is_set():
            await self._reaped.wait()
            log.warning("the warm agent ended during the turn", returncode=self.returncode)
            return Ending(returncode=self.returncode if self.returncode else 1, limit=io.agent.exceeded)
        if deadline.scope.cancelled_caught:
            timeout = deadline.which()
            log.warning("turn timed out; asking the warm agent to stop it", timeout=timeout)
            await self._stop_turn(io, questions, log, "timed out")
            return Ending(returncode=0, timeout=timeout)
        log.info("turn cancelled by the host; asking the warm agent to stop it")
        await self._stop_turn(io, questions, log, "cancelled")
        return Ending(returncode=0, cancelled=True)

    async def _stop_turn(self, io: AgentIO, questions: Questions, log: Logger, why: str) -> None:
        """The protocol's cancel; after `kill_grace_secs` without the turn over, the group is killed."""
        questions.close()  # whatever waits for the host stops waiting
        if self._file_request is not None:
            self._file_request.cancel()
        if self._dead.is_set() or self._turn_over:
            return
        io.send(self._dialect.cancel())
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
            io.kill()
            await self._reaped.wait()


class _Steer:
    """A message steered into the running turn: settled once the agent says whether it took it in."""

    __slots__ = ("settled", "folded")

    def __init__(self) -> None:
        self.settled = trio.Event()
        self.folded = False

    def settle(self, folded: bool) -> None:
        if not self.settled.is_set():
            self.folded = folded
            self.settled.set()


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
    allow_hosts: tuple[str, ...] = (),
) -> TurnResult:
    """One turn of a warm protocol on a fresh agent that resumes `turn.session_id`; then goodbye. Its result is
    returned, not emitted."""
    log = turn_logger(profile, turn_id)
    agent = WarmAgent(profile, session_id=turn.session_id, session_name=turn.session_name, log=log)
    async with trio.open_nursery() as nursery:
        try:
            try:
                await agent.start(nursery)
            except WarmStartError as err:
                return start_failure_result(err, profile, log)
            return await agent.turn(
                turn, emit, cancel=cancel, questions=questions, log=log, on_stderr=on_stderr, allow_hosts=allow_hosts
            )
        finally:
            await agent.close()
