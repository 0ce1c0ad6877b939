"""The Python API for running turns (docs/protocol.md §8): a call, a stream, and a blocking call.

A host's callbacks may each be sync or async; `loop.emit_to` makes them
one `Emit`, the plain async callable the turn engine awaits for every event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import TYPE_CHECKING

import trio

from ..dialects.events import QuestionRequest
from ..errors import ProtocolMisuse
from ..permissions import Decision, PermissionRequest
from ..profile import Profile
from ..turn import Turn
from .loop import (
    EventCallback,
    HostEvent,
    PartialCallback,
    PermissionCallback,
    QuestionCallback,
    as_decision,
    emit_to,
)
from .one_process import drive_turn
from .questions import QuestionAnswer, Questions
from .result import TurnResult

if TYPE_CHECKING:
    from .warm_agents import WarmAgent

# Events a slow consumer of `open_turn` may fall behind by before the agent's
# output is back-pressured (bounded memory instead of an unbounded queue).
EVENT_BUFFER = 16


async def run_turn(
    profile: Profile,
    turn: Turn,
    *,
    on_partial: PartialCallback | None = None,
    on_event: EventCallback | None = None,
    on_permission: PermissionCallback | None = None,
    on_question: QuestionCallback | None = None,
) -> TurnResult:
    """Run one turn and return its result.

    `on_partial(text)` is called for each forwarded chunk as it arrives;
    `on_event(event)` for every event (`PartialEvent`, `SessionEvent`,
    `ErrorEvent`, `ActivityEvent`, and the `TurnResult` last). Either may be
    sync or async. When the profile's `permissions` say ask, `on_permission(request)`
    answers: a `Decision`, or True/False (sync or async); without it the answer is deny.
    When the agent asks the user to choose (a `QuestionRequest`), `on_question(request)`
    answers: each question's id → the labels chosen (a plain label when there is one
    question), or None to decline; without it the question is declined.
    Cancelling the calling task stops the agent (SIGINT, grace, SIGKILL)
    before `Cancelled` propagates.
    """
    require_trio("bridge.run_turn")
    questions = Questions(listening=on_permission is not None, hears_questions=on_question is not None)
    emit = emit_to(on_partial, on_event, on_permission, questions, on_question)
    with ungrouped():
        result = await drive_turn(profile, turn, emit, questions=questions)
        if emit is not None:
            await emit(result)
    return result


def run_turn_sync(
    profile: Profile,
    turn: Turn,
    *,
    on_partial: Callable[[str], None] | None = None,
    on_event: Callable[[HostEvent], None] | None = None,
    on_permission: Callable[[PermissionRequest], Decision | bool] | None = None,
    on_question: Callable[[QuestionRequest], QuestionAnswer] | None = None,
) -> TurnResult:
    """`run_turn` for code that does not run trio; blocks until the turn ends."""
    return trio.run(
        partial(
            run_turn,
            profile,
            turn,
            on_partial=on_partial,
            on_event=on_event,
            on_permission=on_permission,
            on_question=on_question,
        )
    )


class TurnStream:
    """The events of one running turn, in order, ending with its `TurnResult`."""

    def __init__(
        self, receive: trio.MemoryReceiveChannel[HostEvent], cancel: trio.Event, questions: Questions | None = None
    ) -> None:
        self._receive = receive
        self._cancel = cancel
        self._questions = questions if questions is not None else Questions()
        self._result: TurnResult | None = None

    def __aiter__(self) -> TurnStream:
        return self

    async def __anext__(self) -> HostEvent:
        if self._result is not None:
            raise StopAsyncIteration
        try:
            event = await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None
        if isinstance(event, TurnResult):
            self._result = event
        return event

    def cancel(self) -> None:
        """Stop the agent as a host cancel (SIGINT, grace, SIGKILL); the stream still ends with a result (130)."""
        self._cancel.set()

    def decide(self, request_id: str, answer: Decision | bool) -> bool:
        """Answer the agent's `PermissionRequest` `request_id`; False when it waits for no answer (any more)."""
        return self._questions.decide(request_id, as_decision(answer))

    def answer(self, request_id: str, answer: QuestionAnswer) -> bool:
        """Answer the agent's `QuestionRequest` `request_id`: each question's id → the labels chosen (a plain label
        when it asked one question), or None to decline. `AnswerRefused` when the answer does not fit the
        question; False when it waits for no answer (any more)."""
        return self._questions.answer(request_id, answer)

    async def settled(self, request_id: str) -> None:
        """Return once `request_id` waits for no answer (answered, timed out, or the turn ended)."""
        await self._questions.settled(request_id)

    def withdrawn(self, request_id: str) -> bool:
        """The agent withdrew `request_id` before it was answered (the stream has a `RequestWithdrawn` for it)."""
        return self._questions.was_withdrawn(request_id)

    @property
    def result(self) -> TurnResult:
        """The turn's result, once the stream has delivered it."""
        if self._result is None:
            raise ProtocolMisuse("the turn has not finished; iterate the stream to its end first")
        return self._result


@asynccontextmanager
async def open_turn(
    profile: Profile, turn: Turn, *, on_stderr: Callable[[bytes], None] | None = None, agent: WarmAgent | None = None
) -> AsyncIterator[TurnStream]:
    """Run a turn in the background and iterate its events.

    Leaving the block before the result arrives cancels the turn; the agent is
    stopped and reaped before the block is left. `on_stderr(data)`, if given,
    sees each chunk of the agent's stderr as it is read (e.g. to show it live).
    `agent`, a started `WarmAgent` of a warm profile, takes the turn instead of
    a new process (chat keeps one for its conversation).
    """
    require_trio("bridge.open_turn")
    send, receive = trio.open_memory_channel[HostEvent](EVENT_BUFFER)
    cancel = trio.Event()
    questions = Questions()
    stream = TurnStream(receive, cancel, questions)

    async def deliver(event: HostEvent) -> None:
        try:
            await send.send(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the consumer left; the turn still runs to a clean end

    async def produce() -> None:
        async with send:
            if agent is not None:
                result = await agent.turn(turn, deliver, cancel=cancel, questions=questions, on_stderr=on_stderr)
            else:
                result = await drive_turn(
                    profile, turn, deliver, cancel=cancel, on_stderr=on_stderr, questions=questions
                )
            await deliver(result)

    with ungrouped():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            try:
                yield stream
            finally:
                if stream._result is None:
                    cancel.set()
                receive.close()


def require_trio(what: str) -> None:
    """Refuse a caller not running under trio (asyncio: most bot frameworks) saying what to call instead, where
    trio's own words would be "must be called from async context"."""
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        raise ProtocolMisuse(
            f"{what} runs under trio (trio.run), not asyncio: from asyncio code, run the blocking "
            "bridge.run_turn_sync in a thread (await asyncio.to_thread(bridge.run_turn_sync, profile, turn)), "
            "or start `agent-bridge serve` and speak its protocol (docs/serve.md)"
        ) from None


@contextmanager
def ungrouped() -> Iterator[None]:
    """Let a lone exception out of the bridge's own nurseries as itself, not as an ExceptionGroup.

    The nurseries are an implementation detail: a host whose callback (or
    `open_turn` block) raises LookupError must be able to catch LookupError.
    Several exceptions at once stay grouped.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        error: BaseException = group
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        if error is group:
            raise
        context = error.__context__
        try:
            raise error
        finally:
            error.__context__ = context  # not the group it came in
