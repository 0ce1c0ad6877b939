"""One turn's events, from the agent's output to the host: the loop every kind of agent shares.

`TurnLoop` feeds each chunk of the agent's stdout to the profile's dialect,
records the events by the turn's rules (`TurnRecorder`), answers the agent's
permission requests by the profile's policy (asking the host when it says
ask), writes what the dialect wants written to the agent's stdin, and hands
the rest to the host's `Emit`. A one-process turn (`one_process`) and a warm
agent's turn (`warm_agents`) both run their events through it; `finish_turn`
builds and logs the result for both. The result is returned, never emitted:
the caller delivers it when it is ready to (a host stores the session first).

A host's callbacks (`on_partial`, `on_event`, `on_permission`) may each be
sync or async; `emit_to` makes them one `Emit`, the plain async callable the
loop awaits for every event. An async `on_event` alone is one already and is
used as it is, so a partial goes from the dialect to the host's code with
nothing in between.

While a question waits for the host, the loop keeps reading the agent (given
`read`): what the agent says meanwhile waits in `held` for its turn, in
order, but a withdrawal of a waiting request (`RequestWithdrawn`) closes it at
once, so the host's late answer is refused and nothing is written to the
agent. Whoever feeds the loop hands `held` on once its own events are done.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio

from ..dialects import ActivityEvent, AgentInput, ErrorEvent, Event, PartialEvent, SessionEvent
from ..dialects.events import FileEvent, QuestionRequest, RequestWithdrawn
from ..log import Logger, get_logger
from ..permissions import Decision, PermissionPolicy, PermissionRequest
from ..profile import Profile
from .questions import OpenQuestion, QuestionAnswer, Questions
from .result import Ending, TurnRecorder, TurnResult

HostEvent = (
    PartialEvent
    | SessionEvent
    | ErrorEvent
    | ActivityEvent
    | PermissionRequest
    | QuestionRequest
    | RequestWithdrawn
    | FileEvent
) | TurnResult
# Delivers one event to the host, in order: the turn waits until it returns.
Emit = Callable[[HostEvent], Awaitable[None]]
# A host's callbacks, each sync or async (see `emit_to`).
PartialCallback = Callable[[str], Awaitable[None] | None]
EventCallback = Callable[[HostEvent], Awaitable[None] | None]
PermissionCallback = Callable[[PermissionRequest], "Decision | bool | Awaitable[Decision | bool]"]
QuestionCallback = Callable[[QuestionRequest], "QuestionAnswer | Awaitable[QuestionAnswer]"]

__all__ = [
    "Emit",
    "EventCallback",
    "HostEvent",
    "PartialCallback",
    "PermissionCallback",
    "QuestionAnswer",
    "QuestionCallback",
    "TurnLoop",
    "as_decision",
    "emit_to",
    "finish_turn",
    "turn_logger",
]


# Events that go to the host as they are (the others are acted on here).
_FOR_THE_HOST = (PartialEvent, SessionEvent, ErrorEvent, ActivityEvent)
# What the loop reads of the agent while a question waits before it stops reading (and the agent, once its pipe
# is full, waits too): enough for any withdrawal, bounded against an agent that floods meanwhile.
READ_WHILE_ASKING_BYTES = 1024 * 1024


class TurnLoop:
    """Feeds the agent's output to its dialect and carries out the events, in order.

    `send` writes to the agent's stdin (a turn's process, or a warm agent's);
    `questions` holds what waits for the host's answer. `read` gives the agent's
    next stdout chunk (b"" at its end), to read while a question waits; its
    events wait in `held`.
    """

    __slots__ = (
        "dialect",
        "recorder",
        "policy",
        "emit",
        "log",
        "send",
        "questions",
        "read",
        "held",
        "_told",
        "_withdrawn_unasked",
    )

    def __init__(
        self,
        dialect: Any,
        recorder: TurnRecorder,
        policy: PermissionPolicy,
        emit: Emit | None,
        log: Logger,
        send: Callable[[bytes], None],
        questions: Questions,
        read: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        self.dialect = dialect
        self.recorder = recorder
        self.policy = policy
        self.emit = emit
        self.log = log
        self.send = send
        self.questions = questions
        self.read = read
        self.held: list[Event] = []  # what the agent said while a question waited, not handled yet
        self._told: set[str] = set()  # the requests the host was asked and not told the end of
        # Requests withdrawn while another waited, before they were asked (one batch asked both): never asked.
        self._withdrawn_unasked: set[str] = set()

    async def on_output(self, data: bytes) -> None:
        """One chunk of the agent's stdout, then whatever was read while a question of it waited."""
        await self.handle(self.dialect.feed(data))
        while self.held:
            events, self.held = self.held, []
            await self.handle(events)

    async def handle(self, events: list[Event]) -> None:
        """Record `events` and carry out what the recorder passes on."""
        emit = self.emit
        for event in self.recorder.record(events):
            if isinstance(event, _FOR_THE_HOST):  # the bulk of a stream, first
                if emit is not None:
                    await emit(event)
            elif isinstance(event, PermissionRequest):
                if not self._withdrawn_before_asked(event.request_id, events):
                    await self.answer(event)
            elif isinstance(event, QuestionRequest):
                if not self._withdrawn_before_asked(event.request_id, events):
                    await self.ask(event)
            elif isinstance(event, RequestWithdrawn):
                if event.request_id in self._told:  # else the host never saw it, or saw its answer
                    self._told.discard(event.request_id)
                    if emit is not None:
                        await emit(event)
            elif isinstance(event, AgentInput):
                self.send(event.data)
            else:
                self.log.warning(event.message)

    async def answer(self, request: PermissionRequest) -> None:
        """Decide by the profile's policy (asking the host when it says ask), tell the agent, show the host."""
        decision = self.policy.decide(request)
        asked = decision is None
        if decision is None:
            decision = await self._ask(request)
            if decision is None:
                return
        self.log.info(
            "the agent asked to run a tool", tool=request.tool, kind=request.kind, allowed=decision.allow, asked=asked
        )
        self.send(self.dialect.answer(request, decision))
        if self.emit is not None:
            status = "allowed" if decision.allow else "denied"
            await self.emit(
                ActivityEvent("tool", tool=request.tool, title=request.title, status=status, call_id=request.request_id)
            )

    async def ask(self, request: QuestionRequest) -> None:
        """The agent's question goes to the host; its answer (or a decline: nobody there, nobody answered within
        `permissions.timeout_secs`, the turn ended) goes back to the agent."""
        answers = None
        why = "nobody is there to answer"
        if self.emit is not None and self.questions.hears_questions:
            with self.questions.asking(request.request_id, self.policy.timeout_secs, request) as question:
                await self._wait_for_host(request, question)
            if question.withdrawn:
                self.log.info("the agent withdrew its question", tool=request.tool)
                return
            answers, why = question.answers, question.why
        self.log.info("the agent asked the user", tool=request.tool, answered=answers is not None)
        self.send(self.dialect.answer_question(request, answers, why))
        if self.emit is not None:
            status = "answered" if answers is not None else "declined"
            await self.emit(ActivityEvent("tool", tool=request.tool, status=status, call_id=request.request_id))

    async def _ask(self, request: PermissionRequest) -> Decision | None:
        """The host's decision; None when the agent withdrew the request first."""
        if self.emit is None or not self.questions.listening:  # nobody hears questions: no answer can come
            return Decision(allow=False, message="nobody is there to answer")
        with self.questions.asking(request.request_id, self.policy.timeout_secs) as question:
            await self._wait_for_host(request, question)
        if question.withdrawn:
            self.log.info("the agent withdrew its permission request", tool=request.tool, kind=request.kind)
            return None
        return self.questions.result(question)

    async def _wait_for_host(self, request: PermissionRequest | QuestionRequest, question: OpenQuestion) -> None:
        """Tell the host of `request` and wait for its answer, reading the agent meanwhile (see `held`)."""
        assert self.emit is not None
        self._told.add(request.request_id)
        try:
            async with trio.open_nursery() as reading:
                if self.read is not None:
                    reading.start_soon(self._read_while_waiting)
                await self.emit(request)
                await question.answer()
                reading.cancel_scope.cancel()
        finally:
            if not question.withdrawn:  # the host hears of its end from its answer's outcome
                self._told.discard(request.request_id)

    async def _read_while_waiting(self) -> None:
        """Feed what the agent says to its dialect, into `held`; a withdrawal closes its question now."""
        assert self.read is not None
        budget = READ_WHILE_ASKING_BYTES
        while budget > 0 and (data := await self.read()):
            budget -= len(data)
            events = self.dialect.feed(data)
            self.held.extend(events)
            for event in events:
                if type(event) is not RequestWithdrawn or self.questions.withdraw(event.request_id):
                    continue
                if event.request_id not in self._told:  # not the one that waits, answered just before
                    self._withdrawn_unasked.add(event.request_id)

    def _withdrawn_before_asked(self, request_id: str, batch: list[Event]) -> bool:
        """The agent withdrew `request_id` before it could be asked — in the batch that asks it, or while another
        request waited: nobody is asked, and nothing answers it."""
        withdrawn = request_id in self._withdrawn_unasked or any(
            type(event) is RequestWithdrawn and event.request_id == request_id for event in batch
        )
        if withdrawn:
            self._withdrawn_unasked.discard(request_id)
            self.log.info("the agent withdrew a request before it was asked")
        return withdrawn


def turn_logger(profile: Profile, turn_id: str | None) -> Any:
    """The logger of one turn: its records carry the turn's id (`turn_id`, else a random one) and the profile."""
    return get_logger(turn_id=turn_id or os.urandom(6).hex(), profile=profile.label)


def finish_turn(
    recorder: TurnRecorder, ending: Ending, stderr_tail: str, started: float, log: Logger, **fields: Any
) -> TurnResult:
    """The turn's result by the recorder's rules, logged with `fields`."""
    duration_ms = round((trio.current_time() - started) * 1000)
    result = recorder.finish(ending, stderr_tail=stderr_tail, duration_ms=duration_ms)
    log.info(
        "turn finished",
        outcome=result.outcome.value,
        exit_code=result.exit_code,
        duration_ms=duration_ms,
        partials=result.partials,
        **fields,
    )
    return result


def as_decision(answer: Decision | bool) -> Decision:
    """A host's answer to a `PermissionRequest`: a `Decision`, or True/False for allow/deny."""
    return answer if isinstance(answer, Decision) else Decision(allow=bool(answer))


def emit_to(
    on_partial: PartialCallback | None,
    on_event: EventCallback | None,
    on_permission: PermissionCallback | None = None,
    questions: Questions | None = None,
    on_question: QuestionCallback | None = None,
) -> Emit | None:
    """One `Emit` for a host's callbacks (None when there are none): `on_event` sees every event, then
    `on_partial` a partial's text, `on_permission` answers each `PermissionRequest` and `on_question` each
    `QuestionRequest`, through `questions`."""
    answers = on_permission if questions is not None else None
    replies = on_question if questions is not None else None
    if on_partial is None and on_event is None and answers is None and replies is None:
        return None
    if on_partial is None and answers is None and replies is None and inspect.iscoroutinefunction(on_event):
        return cast(Emit, on_event)  # already an Emit: nothing need stand between the engine and it

    async def emit(event: HostEvent) -> None:
        if on_event is not None:
            pending = on_event(event)
            if pending is not None and inspect.isawaitable(pending):  # an async callback
                await pending
        if type(event) is PartialEvent:
            if on_partial is not None:
                pending = on_partial(event.text)
                if pending is not None and inspect.isawaitable(pending):
                    await pending
        elif answers is not None and questions is not None and type(event) is PermissionRequest:
            answer = answers(event)
            if inspect.isawaitable(answer):
                answer = await answer
            questions.decide(event.request_id, as_decision(answer))
        elif replies is not None and questions is not None and type(event) is QuestionRequest:
            reply = replies(event)
            if inspect.isawaitable(reply):
                reply = await reply
            questions.answer(event.request_id, reply)

    return emit
