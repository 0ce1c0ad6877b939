"""One client's responses, written whole and in order by one writer task, whatever transport carries them."""

from __future__ import annotations

import json
import select
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import trio

HANG_UP_POLL_SECS = 0.2

Message = TypeVar("Message")  # what the transport writes: a line of bytes, a WebSocket text, an SSE frame


def json_bytes(response: dict[str, Any]) -> bytes:
    """A response as one line of JSON in UTF-8 (without the newline), encoded once."""
    try:
        return json.dumps(response, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in a client's string: escape it rather than fail
        return json.dumps(response).encode("ascii")


def json_text(response: dict[str, Any]) -> str:
    """A response as one line of JSON text, for a transport that encodes it itself (a WebSocket text message)."""
    text = json.dumps(response, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: the transport could not encode it
        text = json.dumps(response)
    return text


def json_line(response: dict[str, Any]) -> bytes:
    """A response as one JSON line, as serve writes it on stdout."""
    return json_bytes(response) + b"\n"


class _Pending(Generic[Message]):
    __slots__ = ("message", "done", "written")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.done = trio.Event()
        self.written = False


class Output(Generic[Message]):
    """Writes responses, whole and in order, whoever sends them.

    One writer task (`run`) writes every response through `write`. `send`
    hands it one and waits until it is written; a sender cancelled before the
    writer took its response sends nothing, and one cancelled after leaves the
    writer to finish it. So a turn's deadline or cancel never cuts a response
    in two, and a client that stops reading makes senders wait with their one
    response each: nothing piles up.

    When the client is gone (a write fails), or takes longer than
    `stall_secs` to take one response (a network client that stopped reading),
    responses are dropped from then on and `on_broken` is called once: nobody
    is left to answer. `hung_up()` says so too, for a caller watching the
    transport.
    """

    def __init__(
        self,
        write: Callable[[Message], Awaitable[object]],
        encode: Callable[[dict[str, Any]], Message],
        on_broken: Callable[[], object],
        *,
        stall_secs: float = float("inf"),
    ) -> None:
        self._write = write
        self._encode = encode
        self._on_broken = on_broken
        self._stall_secs = stall_secs
        self._handoff, self._taken = trio.open_memory_channel[_Pending[Message]](0)
        self._ended = trio.Event()
        self._current: _Pending[Message] | None = None  # the response being written
        self.broken = False

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write the responses handed over until `close()`; run it in a nursery of its own lifetime."""
        try:
            task_status.started()
            async for pending in self._taken:
                if not self.broken:
                    self._current = pending
                    if await self._write_watched(pending.message):
                        pending.written = True
                    else:
                        self.hung_up()
                    self._current = None
                pending.done.set()
        finally:
            self._ended.set()

    async def _write_watched(self, message: Message) -> bool:
        """Write one response; past `stall_secs` the client is hung up on even while the write goes on.

        A transport may shield its socket writes from cancellation (hypercorn does,
        so a frame is never cut), so the stall is noticed beside the write, not by
        cancelling it: the client's turns are cancelled at once, and the write ends
        when the transport gives up on the connection.
        """
        async with trio.open_nursery() as watch:
            if self._stall_secs != float("inf"):
                watch.start_soon(self._hang_up_after, self._stall_secs)
            try:
                await self._write(message)
                return True
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return False
            finally:
                watch.cancel_scope.cancel()

    async def _hang_up_after(self, secs: float) -> None:
        await trio.sleep(secs)
        self.hung_up()

    async def send(self, response: dict[str, Any]) -> bool:
        """Write `response`; whether it reached the client (False: the client is gone)."""
        if self.broken:
            return False
        pending = _Pending(self._encode(response))
        try:
            await self._handoff.send(pending)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False  # the writer has stopped: the client's session is ending
        await pending.done.wait()
        return pending.written

    async def close(self) -> None:
        """No more responses: returns once the writer has written every one it took (or given up on the client)."""
        self._handoff.close()
        await self._ended.wait()

    def hung_up(self) -> None:
        """The client is gone: drop every later response and call `on_broken` (once).

        Senders waiting for the writer are let go at once (their responses unsent).
        """
        if not self.broken:
            self.broken = True
            if self._current is not None:
                self._current.done.set()
            self._handoff.close()
            self._on_broken()


async def watch_for_hang_up(fd: int, output: Output[Any]) -> None:
    """Notice the client closing its end of `fd` (a stdio door's stdout) even while nothing is written to it.

    A write would fail at once, but a turn may run for minutes without a word;
    its agent should not run on for nobody. POLLERR and POLLHUP are reported
    without being asked for (a regular file or /dev/null reports neither).
    """
    poller = select.poll()
    poller.register(fd, 0)
    while not poller.poll(0):  # noqa: ASYNC110 - no event says "hung up": trio waits only for readable/writable
        await trio.sleep(HANG_UP_POLL_SECS)
    output.hung_up()
