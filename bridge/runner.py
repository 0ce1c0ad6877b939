"""The Python API for running turns (docs/protocol.md §8): a call, a stream, and a blocking call."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from .dialects import PartialEvent
from .errors import ProtocolMisuse
from .permissions import Decision, PermissionRequest
from .profile import Profile
from .questions import Questions
from .result import TurnResult
from .supervisor import Emit, HostEvent, drive_turn
from .turn import Turn

if TYPE_CHECKING:
    from .warm_agent import WarmAgent

# Events a slow consumer of `open_turn` may fall behind by before the agent's
# output is back-pressured (bounded memory instead of an unbounded queue).
EVENT_BUFFER = 16

PartialCallback = Callable[[str], Awaitable[None] | None]
EventCallback = Callable[[HostEvent], Awaitable[None] | None]
PermissionCallback = Callable[[PermissionRequest], "Decision | bool | Awaitable[Decision | bool]"]


async def run_turn(
    profile: Profile,
    turn: Turn,
    *,
    on_partial: PartialCallback | None = None,
    on_event: EventCallback | None = None,
    on_permission: PermissionCallback | None = None,
) -> TurnResult:
    """Run one turn and return its result.

    `on_partial(text)` is called for each forwarded chunk as it arrives;
    `on_event(event)` for every event (`PartialEvent`, `SessionEvent`,
    `ErrorEvent`, `ActivityEvent`, and the `TurnResult` last). Either may be
    sync or async. When the profile's `permissions` say ask, `on_permission(request)`
    answers: a `Decision`, or True/False (sync or async); without it the answer is deny.
    Cancelling the calling task stops the agent (SIGINT, grace, SIGKILL)
    before `Cancelled` propagates.
    """
    questions = Questions(listening=on_permission is not None)
    with _ungrouped():
        return await drive_turn(
            profile, turn, _emitter(on_partial, on_event, on_permission, questions), questions=questions
        )


def run_turn_sync(
    profile: Profile,
    turn: Turn,
    *,
    on_partial: Callable[[str], None] | None = None,
    on_event: Callable[[HostEvent], None] | None = None,
    on_permission: Callable[[PermissionRequest], Decision | bool] | None = None,
) -> TurnResult:
    """`run_turn` for code that does not run trio; blocks until the turn ends."""
    return trio.run(
        partial(run_turn, profile, turn, on_partial=on_partial, on_event=on_event, on_permission=on_permission)
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
        return self._questions.decide(request_id, _decision(answer))

    async def settled(self, request_id: str) -> None:
        """Return once `request_id` waits for no answer (answered, timed out, or the turn ended)."""
        await self._questions.settled(request_id)

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
                await agent.turn(turn, deliver, cancel=cancel, questions=questions, on_stderr=on_stderr)
            else:
                await drive_turn(profile, turn, deliver, cancel=cancel, on_stderr=on_stderr, questions=questions)

    with _ungrouped():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            try:
                yield stream
            finally:
                if stream._result is None:
                    cancel.set()
                receive.close()


class _Ungrouped:
    """Let a lone exception out of the bridge's own nurseries as itself, not as an ExceptionGroup.

    The nurseries are an implementation detail: a host whose callback (or
    `open_turn` block) raises LookupError must be able to catch LookupError.
    Several exceptions at once stay grouped. (A class, not @contextmanager:
    it is on every turn's path, and a generator costs more.)
    """

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, group: BaseException | None, traceback: Any) -> bool:
        if not isinstance(group, BaseExceptionGroup):
            return False
        error: BaseException = group
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        if error is group:
            return False
        context = error.__context__
        try:
            raise error
        finally:
            error.__context__ = context  # not the group it came in


_UNGROUPED = _Ungrouped()


def _ungrouped() -> _Ungrouped:
    return _UNGROUPED


def _decision(answer: Decision | bool) -> Decision:
    return answer if isinstance(answer, Decision) else Decision(allow=bool(answer))


def _emitter(
    on_partial: PartialCallback | None,
    on_event: EventCallback | None,
    on_permission: PermissionCallback | None = None,
    questions: Questions | None = None,
) -> Emit | None:
    """One `Emit` for the callbacks. Sync callbacks cost a plain call per event; only an
    awaitable a callback returns is handed back to be awaited, so events stay in order."""
    if on_permission is not None and questions is not None:
        on_event = _answering(on_event, on_permission, questions)
    if on_partial is None and on_event is None:
        return None
    if on_event is None:  # the common case for a chat bot, and a call less per partial
        return partial(_emit_partial, on_partial)

    def emit(event: HostEvent) -> Awaitable[None] | None:
        pending = on_event(event)
        if pending is not None and inspect.isawaitable(pending):
            return _then_partial(pending, on_partial, event)
        return _emit_partial(on_partial, event) if on_partial is not None else None

    return emit


def _emit_partial(on_partial: PartialCallback, event: HostEvent) -> Awaitable[None] | None:
    """`on_partial` with a partial's text; what it returns only when that must be awaited."""
    if type(event) is PartialEvent:
        pending = on_partial(event.text)
        if pending is not None and inspect.isawaitable(pending):
            return pending  # type: ignore[return-value]
    return None


def _answering(
    on_event: EventCallback | None, on_permission: PermissionCallback, questions: Questions
) -> EventCallback:
    """`on_event`, and `on_permission` answering each `PermissionRequest`."""

    def event_and_answer(event: HostEvent) -> Awaitable[None] | None:
        pending = on_event(event) if on_event is not None else None
        if type(event) is not PermissionRequest:
            return pending
        return _answer(pending, on_permission, event, questions)

    return event_and_answer


async def _answer(
    pending: Awaitable[None] | None, on_permission: PermissionCallback, request: PermissionRequest, questions: Questions
) -> None:
    if pending is not None and inspect.isawaitable(pending):
        await pending
    answer = on_permission(request)
    if inspect.isawaitable(answer):
        answer = await answer
    questions.decide(request.request_id, _decision(answer))  # type: ignore[arg-type]


async def _then_partial(pending: Awaitable[Any], on_partial: PartialCallback | None, event: HostEvent) -> None:
    await pending
    if on_partial is not None and type(event) is PartialEvent:
        more = on_partial(event.text)
        if more is not None and inspect.isawaitable(more):
            await more
