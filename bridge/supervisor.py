"""Run one turn under trio: launch the agent, feed its output to its dialect, carry out what the dialect asks.

`drive_turn` is the turn engine every front door uses. It plans the launch,
spawns the agent, and lets `AgentIO` (the process's pipes, deadlines and end)
run it, while `_TurnLoop` feeds each chunk of stdout to the profile's dialect,
records the events by the turn's rules, answers the agent's permission
requests by the profile's policy, and delivers the rest to the host. Every
dialect is driven the same way: a new agent family never touches this module.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .agent_io import DRAIN_SECS, REAP_SECS, AgentIO
from .dialects import (
    ActivityEvent,
    AgentInput,
    ErrorEvent,
    Event,
    PartialEvent,
    ProtocolWarning,
    SessionEvent,
)
from .errors import LaunchError
from .launch import LaunchPlan, plan_launch
from .log import get_logger
from .permissions import Decision, PermissionPolicy, PermissionRequest
from .process import start
from .profile import Profile
from .questions import Questions
from .result import Ending, TurnRecorder, TurnResult
from .turn import Turn

HostEvent = PartialEvent | SessionEvent | ErrorEvent | ActivityEvent | PermissionRequest | TurnResult
# Delivers one event to the host; returns an awaitable only when there is something to await.
Emit = Callable[[HostEvent], Awaitable[None] | None]

__all__ = ["DRAIN_SECS", "REAP_SECS", "Emit", "HostEvent", "drive_turn"]


async def drive_turn(
    profile: Profile,
    turn: Turn,
    emit: Emit | None = None,
    *,
    cancel: trio.Event | None = None,
    turn_id: str | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
    questions: Questions | None = None,
) -> TurnResult:
    """Run one turn to its end and return the result; `emit` sees every host event, the result last.

    Setting `cancel` stops the agent the way a host cancel must (SIGINT, grace,
    SIGKILL) and still returns a result (exit 130). A trio cancellation of the
    caller does the same cleanup, then lets `Cancelled` propagate. `turn_id`
    tags the turn's log records (default: a random id). `on_stderr` is given
    each chunk of the agent's stderr as it is read (the tail is kept anyway).
    When the profile's `permissions` say ask, `emit` gets the `PermissionRequest`
    and the host answers it through `questions` (see `bridge.questions`).
    """
    if profile.warm:  # a long-lived agent, started for this one turn
        from .warm_agent import run_warm_turn

        return await run_warm_turn(
            profile, turn, emit, cancel=cancel, turn_id=turn_id, questions=questions, on_stderr=on_stderr
        )
    started = trio.current_time()
    plan: LaunchPlan | None = None
    try:
        plan = plan_launch(profile, turn, os.environ)
        agent = await start(plan, kill_grace_secs=profile.kill_grace_secs)  # first: what follows overlaps its start
    except LaunchError as err:
        log = _turn_logger(profile, turn_id, plan)
        log.warning("agent could not be started", reason=err.message, exit_code=err.exit_code, in_result=True)
        ending = Ending(spawn_failure=(err.exit_code, err.message))
        return await _finish(TurnRecorder(profile), ending, "", started, emit, log)

    log = _turn_logger(profile, turn_id, plan)
    recorder = TurnRecorder(profile)
    io = AgentIO(profile, plan, agent, log, started, on_stderr)
    questions = questions if questions is not None else Questions()
    loop = _TurnLoop(
        profile.dialect(profile.dialect_context, turn),
        recorder,
        profile.permission_policy,
        emit,
        log,
        io.send,
        questions,
    )
    log.info("agent started", pid=agent.pid, program=plan.argv[0])
    try:
        if plan.new_session_id:  # the profile let the bridge name the new session: that is the turn's session
            await loop.handle([SessionEvent(plan.new_session_id)])
        ending = await io.run(loop.on_output, cancel, questions.close)
        await loop.handle(loop.dialect.close())
    except BaseException:
        with trio.CancelScope(shield=True):
            await io.abandon()
        log.info("turn abandoned by the host; agent stopped", exit_code=130)
        raise
    finally:
        agent.close()
    return await _finish(recorder, ending, io.stderr_text(), started, emit, log)


def _turn_logger(profile: Profile, turn_id: str | None, plan: LaunchPlan | None) -> Any:
    log = get_logger(turn_id=turn_id or os.urandom(6).hex(), profile=profile.label)
    for note in plan.notes if plan is not None else ():
        log.warning(note)
    return log


async def _finish(
    recorder: TurnRecorder, ending: Ending, stderr_tail: str, started: float, emit: Emit | None, log: Any
) -> TurnResult:
    duration_ms = round((trio.current_time() - started) * 1000)
    result = recorder.finish(ending, stderr_tail=stderr_tail, duration_ms=duration_ms)
    log.info(
        "turn finished",
        outcome=result.outcome.value,
        exit_code=result.exit_code,
        duration_ms=duration_ms,
        partials=result.partials,
    )
    if emit is not None and (pending := emit(result)) is not None:
        await pending
    return result


# Events that go to the host as they are (every other kind is acted on here first).
_FOR_THE_HOST = frozenset({PartialEvent, ActivityEvent, SessionEvent, ErrorEvent})


class _TurnLoop:
    """Feeds the agent's output to its dialect and carries out the events, in order.

    Shared by both kinds of agent: `send` writes to the agent's stdin (a
    turn's process, or a warm agent's), `questions` holds what waits for the host.
    """

    __slots__ = ("dialect", "recorder", "policy", "emit", "log", "send", "questions", "feed")

    def __init__(
        self,
        dialect: Any,
        recorder: TurnRecorder,
        policy: PermissionPolicy,
        emit: Emit | None,
        log: Any,
        send: Callable[[bytes], None],
        questions: Questions,
    ) -> None:
        self.dialect = dialect
        self.recorder = recorder
        self.policy = policy
        self.emit = emit
        self.log = log
        self.send = send
        self.questions = questions
        self.feed = dialect.feed

    async def on_output(self, data: bytes) -> None:
        await self.handle(self.feed(data))

    async def handle(self, events: list[Event]) -> None:
        emit = self.emit
        for event in self.recorder.record(events):
            if type(event) in _FOR_THE_HOST:  # the bulk of a stream, first
                if emit is not None and (pending := emit(event)) is not None:
                    await pending
            elif isinstance(event, ProtocolWarning):
                self.log.warning(event.message)
            elif isinstance(event, PermissionRequest):
                await self.answer(event)
            elif type(event) is AgentInput:
                self.send(event.data)
            elif emit is not None and (pending := emit(event)) is not None:
                await pending

    async def answer(self, request: PermissionRequest) -> None:
        """Decide by the profile's policy (asking the host when it says ask), tell the agent, show the host."""
        decision = self.policy.decide(request)
        asked = decision is None
        if decision is None:
            decision = await self._ask(request)
        self.log.info(
            "the agent asked to run a tool", tool=request.tool, kind=request.kind, allowed=decision.allow, asked=asked
        )
        self.send(self.dialect.answer(request, decision))
        if self.emit is not None:
            status = "allowed" if decision.allow else "denied"
            activity = ActivityEvent(
                "tool", tool=request.tool, title=request.title, status=status, call_id=request.request_id
            )
            if (pending := self.emit(activity)) is not None:
                await pending

    async def _ask(self, request: PermissionRequest) -> Decision:
        if self.emit is None or not self.questions.listening:  # nobody hears questions: no answer can come
            return Decision(allow=False, message="nobody is there to answer")
        with self.questions.asking(request.request_id, self.policy.timeout_secs) as question:
            if (pending := self.emit(request)) is not None:
                await pending
            await question.answer()
        return self.questions.result(question)
