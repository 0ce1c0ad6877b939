"""The Python API for running turns (SPEC §8): a call, a stream, and a blocking call."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from .dialects import PartialEvent
from .profile import Profile
from .result import TurnResult
from .supervisor import Emit, HostEvent, drive_turn
from .turn import Turn

# Events a slow consumer of `open_turn` may fall behind by before the agent's
# output is back-pressured (bounded memory instead of an unbounded queue).
EVENT_BUFFER = 16

PartialCallback = Callable[[str], Awaitable[None] | None]
EventCallback = Callable[[HostEvent], Awaitable[None] | None]


async def run_turn(profile: Profile, turn: Turn, *, on_partial: PartialCallback | None = None,
                   on_event: EventCallback | None = None) -> TurnResult:
    """Run one turn and return its result.

    `on_partial(text)` is called for each forwarded chunk as it arrives;
    `on_event(event)` for every event (`PartialEvent`, `SessionEvent`,
    `ErrorEvent`, and the `TurnResult` last). Either may be sync or async.
    Cancelling the calling task stops the agent (SIGINT, grace, SIGKILL)
    before `Cancelled` propagates.
    """
    with _ungrouped():
        return await drive_turn(profile, turn, _emitter(on_partial, on_event))


def run_turn_sync(profile: Profile, turn: Turn, *, on_partial: Callable[[str], None] | None = None,
                  on_event: Callable[[HostEvent], None] | None = None) -> TurnResult:
    """`run_turn` for code that does not run trio; blocks until the turn ends."""
    return trio.run(partial(run_turn, profile, turn, on_partial=on_partial, on_event=on_event))


class TurnStream:
    """The events of one running turn, in order, ending with its `TurnResult`."""

    def __init__(self, receive: trio.MemoryReceiveChannel[HostEvent], cancel: trio.Event) -> None:
        self._receive = receive
        self._cancel = cancel
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

    @property
    def result(self) -> TurnResult:
        """The turn's result, once the stream has delivered it."""
        if self._result is None:
            raise RuntimeError("the turn has not finished; iterate the stream to its end first")
        return self._result


@asynccontextmanager
async def open_turn(profile: Profile, turn: Turn, *,
                    on_stderr: Callable[[bytes], None] | None = None) -> AsyncIterator[TurnStream]:
    """Run a turn in the background and iterate its events.

    Leaving the block before the result arrives cancels the turn; the agent is
    stopped and reaped before the block is left. `on_stderr(data)`, if given,
    sees each chunk of the agent's stderr as it is read (e.g. to show it live).
    """
    send, receive = trio.open_memory_channel[HostEvent](EVENT_BUFFER)
    cancel = trio.Event()
    stream = TurnStream(receive, cancel)

    async def deliver(event: HostEvent) -> None:
        try:
            await send.send(event)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the consumer left; the turn still runs to a clean end

    async def produce() -> None:
        async with send:
            await drive_turn(profile, turn, deliver, cancel=cancel, on_stderr=on_stderr)

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


def _emitter(on_partial: PartialCallback | None, on_event: EventCallback | None) -> Emit | None:
    """One `Emit` for both callbacks. Sync callbacks cost a plain call per event; only an
    awaitable a callback returns is handed back to be awaited, so events stay in order."""
    if on_partial is None and on_event is None:
        return None

    def emit(event: HostEvent) -> Awaitable[None] | None:
        if on_event is not None:
            pending = on_event(event)
            if pending is not None and inspect.isawaitable(pending):
                return _then_partial(pending, on_partial, event)
        if on_partial is not None and type(event) is PartialEvent:
            pending = on_partial(event.text)
            if pending is not None and inspect.isawaitable(pending):
                return pending  # type: ignore[return-value]
        return None

    return emit


async def _then_partial(pending: Awaitable[Any], on_partial: PartialCallback | None, event: HostEvent) -> None:
    await pending
    if on_partial is not None and type(event) is PartialEvent:
        more = on_partial(event.text)
        if more is not None and inspect.isawaitable(more):
            await more
