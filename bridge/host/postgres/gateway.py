"""The gateway: a host whose turns run on workers elsewhere, through the PostgreSQL queue.

`RemoteHost` has the `Host` interface `serve` and bots use (`submit`,
`cancel`, `decide`, stats, shutdown), so `serve --postgres` speaks the same
JSON Lines protocol. A submit commits the turn to the queue, then waits for
it: events arrive by LISTEN (`bridge_events`), the result is read from the
table once a worker says it is done — or, should that notification be lost
(a reconnect), at the next poll.

Results are at-least-once: a turn's `delivered_at` is set only after its
result was handed to the client, so a gateway that stops in between sends it
again when the next one with the same `name` starts (`undelivered`). Clients
dedupe by turn id.
"""

from __future__ import annotations

import inspect
import json
import uuid
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any

import trio

from ...errors import BridgeError, TurnError
from ...log import get_logger
from ...permissions import Decision, PermissionRequest
from ...result import TurnResult
from ...runner import EventCallback, PartialCallback, PermissionCallback, _decision, _emitter
from ...supervisor import Emit
from ...turn import Turn, text_problem
from ..common import DuplicateTurn, HostClosed, HostStats
from ..scheduler import QueueFull
from . import queue
from .db import (
    CONTROL_CHANNEL,
    EVENTS_CHANNEL,
    Database,
    Notification,
    PostgresError,
    Reconnected,
    listen,
    notify_payloads,
)
from .records import event_from_dict, result_from_dict, turn_to_dict

DEFAULT_GATEWAY_NAME = "serve"
POLL_SECS = 30.0  # a waiting turn reads its row this often too, in case its notification was lost unnoticed
ENQUEUE_PATIENCE_SECS = 10.0  # a submit waits this long for an unreachable server before it is refused


class TurnDetached(BridgeError):
    """The gateway stopped waiting for a turn that still runs on a worker; its result waits in the queue."""

    code = "detached"


class RemoteTurnError(BridgeError):
    """A worker could not run the turn (unknown profile, a profile that does not load…); `code` says which."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class FleetStats(HostStats):
    """`HostStats` across every worker: `workers` lists each live one (id, host, pid, running, draining)."""

    workers: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        record = HostStats.to_dict(self)  # slots=True makes a new class: no zero-argument super()
        record["workers"] = list(self.workers)
        return record


@dataclass(slots=True)
class _Waiter:
    key: str
    emit: Emit | None  # the submitter's on_partial and on_event, as a local host calls them
    on_permission: PermissionCallback | None
    changed: trio.Event = field(default_factory=trio.Event)
    events: list[dict[str, Any]] = field(default_factory=list)
    asked: set[str] = field(default_factory=set)  # permission requests still waiting for an answer
    look: bool = True  # read the turn's row (not for a turn just queued: nothing can have happened yet)
    waiting: trio.CancelScope = field(default_factory=trio.CancelScope)  # cancelled: the gateway stops waiting


class RemoteHost:
    """Turns through the PostgreSQL queue; use it as `async with open_host(postgres=DSN) as host`."""

    remote = True  # serve passes the client's own ids along (`client_id`)

    def __init__(self, dsn: str, *, name: str = DEFAULT_GATEWAY_NAME, max_queued: int = 256,
                 shutdown_grace: float = 10.0) -> None:
        if not name or text_problem(name):
            raise ValueError("a gateway name must be a non-empty string")
        self.dsn = dsn
        self.name = name
        self.max_queued = max_queued
        self.shutdown_grace = shutdown_grace
        self._db = Database(dsn, size=8)
        self._waiters: dict[str, _Waiter] = {}
        self._closing = False
        self._refused = 0
        self._tasks: trio.Nursery | None = None
        self._tasks_manager: Any = None
        self._idle = trio.Event()
        self._idle.set()
        self._log = get_logger(component="gateway", gateway=name)

    # ------------------------------------------------------------------ lifetime

    async def __aenter__(self) -> RemoteHost:
        await trio.to_thread.run_sync(self._db.check)
        self._tasks_manager = trio.open_nursery()
        self._tasks = await self._tasks_manager.__aenter__()
        try:
            await self._tasks.start(partial(listen, self.dsn, (EVENTS_CHANNEL,), self._notified, log=self._log))
        except BaseException:
            self._tasks.cancel_scope.cancel()
            await self._tasks_manager.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        traceback: TracebackType | None) -> None:
        try:
            await self.aclose()
        finally:
            assert self._tasks is not None
            self._tasks.cancel_scope.cancel()
            await self._tasks_manager.__aexit__(None, None, None)
            self._db.close()

    def stop_accepting(self) -> None:
        self._closing = True

    @property
    def closing(self) -> bool:
        return self._closing

    async def aclose(self, grace: float | None = None) -> None:
        """Stop accepting; wait up to the grace for the results of turns in flight, then stop waiting
        (their submits raise `TurnDetached`; the turns run on, and their results wait in the queue)."""
        self.stop_accepting()
        with trio.move_on_after(self.shutdown_grace if grace is None else grace):
            await self._idle.wait()
        for waiter in self._waiters.values():
            waiter.waiting.cancel()
        with trio.CancelScope(shield=True):
            await self._idle.wait()  # each submit returns at once (or once its turn is queued: 10 s at most)

    def cancel_all(self) -> None:
        for key in list(self._waiters):
            self.cancel(key)

    # ------------------------------------------------------------------ turns

    async def submit(self, profile: str, conversation: str, turn: Turn, *,
                     on_partial: PartialCallback | None = None, on_event: EventCallback | None = None,
                     on_permission: PermissionCallback | None = None, turn_id: str | None = None,
                     task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
                     client_id: Any = None) -> TurnResult:
        """Queue the turn and wait for its result, as `Host.submit` (events stream from the worker).

        A `turn_id` the queue already knows is a resend: nothing new runs, and
        the submit returns that turn's result (at once, if it has one). Raises
        `QueueFull`, `HostClosed`, `DuplicateTurn` (the id is being waited for
        here already), `TurnError`, `PostgresError` (the server stayed
        unreachable); `RemoteTurnError` when no worker could run it.
        `client_id` is the id a client used for the turn (serve's request
        id), sent back with the result by a later gateway.
        """
        if self._closing:
            raise HostClosed("the gateway is shutting down and takes no new turns")
        if not isinstance(turn, Turn):
            raise TurnError(f"submit() needs a bridge.Turn, not {type(turn).__name__}")
        if not isinstance(conversation, str) or not conversation or text_problem(conversation):
            raise TurnError(f"the conversation key must be a non-empty string of text, not {conversation!r}")
        key = turn_id if turn_id is not None else f"turn-{uuid.uuid4().hex}"
        if key in self._waiters:
            raise DuplicateTurn(f"turn {key!r} is already in flight; give each turn its own id")
        waiter = self._wait_for(key, on_partial, on_event, on_permission)
        # With nobody to answer the agent's questions here, the worker denies them at once (as a local host does).
        record = {**turn_to_dict(turn), "answered": on_event is not None or on_permission is not None}
        try:
            with trio.move_on_after(ENQUEUE_PATIENCE_SECS) as patience:
                outcome = await self._db.run_retrying(
                    partial(queue.enqueue, key=key, request_id=key if client_id is None else client_id,
                            gateway=self.name, profile=profile, conversation=conversation,
                            session_name=turn.session_name, turn=record, max_queued=self.max_queued),
                    log=self._log, what="queueing a turn", atomic=False)
            if patience.cancelled_caught:
                raise PostgresError("PostgreSQL stayed unreachable; the turn was not queued", code="store_error")
            if outcome == "full":
                self._refused += 1
                raise QueueFull(f"the queue is full ({self.max_queued} turns wait); try again later")
            waiter.look = outcome == "resent"
            task_status.started(key)
            return await self._await_result(waiter)
        finally:
            self._forget(waiter)

    async def follow(self, key: str, *, on_event: EventCallback | None = None) -> TurnResult:
        """Wait for the result of a turn queued earlier (by a gateway that stopped): see `undelivered`."""
        waiter = self._wait_for(key, None, on_event, None)
        try:
            return await self._await_result(waiter)
        finally:
            self._forget(waiter)

    async def undelivered(self) -> list[tuple[str, Any]]:
        """(key, client's id) of this gateway name's turns whose result no client was sent yet."""
        return await self._db.run_retrying(lambda conn: queue.undelivered(conn, gateway=self.name),
                                           log=self._log, what="reading undelivered results")

    async def delivered(self, key: str) -> None:
        """The client has the turn's result: a later gateway will not send it again."""
        try:
            await self._db.run(lambda conn: queue.mark_delivered(conn, key=key), atomic=False)
        except PostgresError as err:
            self._log.warning("could not mark a result delivered; it may be sent again", error=str(err))

    def cancel(self, turn_id: str) -> bool:
        """Stop a turn this gateway waits for, queued or running on any worker; False when it waits for none."""
        if turn_id not in self._waiters or self._tasks is None:
            return False
        self._tasks.start_soon(self._send_cancel, turn_id)
        return True

    def in_flight(self, turn_id: str) -> bool:
        return turn_id in self._waiters

    def decide(self, turn_id: str, request_id: str, answer: Decision | bool) -> bool:
        """Answer a permission request of a turn this gateway waits for; False when it waits for none such."""
        waiter = self._waiters.get(turn_id)
        if waiter is None or request_id not in waiter.asked or self._tasks is None:
            return False
        waiter.asked.discard(request_id)
        decision = _decision(answer)
        order = {"decide": turn_id, "request_id": request_id, "allow": decision.allow, "always": decision.always,
                 "message": decision.message}
        self._tasks.start_soon(self._notify_control, order)
        return True

    def stats(self) -> HostStats:
        raise TypeError("a RemoteHost's stats come from the database: await host.current_stats()")

    async def current_stats(self) -> FleetStats:
        numbers = await self._db.run(queue.stats, atomic=False)
        return FleetStats(running=numbers["running"], queued=numbers["queued"], completed=numbers["completed"],
                          failed=numbers["failed"], refused=self._refused, store_errors=0,
                          outcomes=numbers["outcomes"], max_concurrent=numbers["max_concurrent"],
                          max_queued=self.max_queued, closing=self._closing, warm=0,
                          workers=tuple(numbers["workers"]))

    # ------------------------------------------------------------------ internals

    def _wait_for(self, key: str, on_partial: PartialCallback | None, on_event: EventCallback | None,
                  on_permission: PermissionCallback | None) -> _Waiter:
        waiter = _Waiter(key, _emitter(on_partial, on_event), on_permission)
        self._waiters[key] = waiter
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        return waiter

    def _forget(self, waiter: _Waiter) -> None:
        if self._waiters.get(waiter.key) is waiter:
            del self._waiters[waiter.key]
        if not self._waiters:
            self._idle.set()

    async def _await_result(self, waiter: _Waiter) -> TurnResult:
        with waiter.waiting:
            while True:
                waiter.changed = trio.Event()
                for record in waiter.events:
                    await self._deliver_event(waiter, record)
                waiter.events.clear()
                ending = None
                if waiter.look:
                    ending = await self._db.run_retrying(lambda conn: queue.ending(conn, key=waiter.key),
                                                         log=self._log, what="reading a turn's result", atomic=False)
                waiter.look = False
                if ending is not None and ending.state == "done":
                    for record in waiter.events:  # events that arrived while the row was read
                        await self._deliver_event(waiter, record)
                    if ending.error:
                        raise RemoteTurnError(ending.error.get("code", "internal_error"),
                                              ending.error.get("message", ""))
                    result = result_from_dict(ending.result)
                    if waiter.emit is not None and (pending := waiter.emit(result)) is not None:
                        await pending  # the result reaches on_event last, as from a local host
                    return result
                with trio.move_on_after(POLL_SECS) as poll:
                    await waiter.changed.wait()
                if poll.cancelled_caught:
                    waiter.look = True
        raise TurnDetached(f"turn {waiter.key!r} runs on; its result waits in the queue for the next gateway "
                           f"named {self.name!r}")

    async def _deliver_event(self, waiter: _Waiter, record: dict[str, Any]) -> None:
        if record.get("event") == "decide_failed":
            waiter.asked.discard(str(record.get("request_id")))
            return
        event = event_from_dict(record)
        if event is None:
            return
        if isinstance(event, PermissionRequest):
            waiter.asked.add(event.request_id)
        if waiter.emit is not None and (pending := waiter.emit(event)) is not None:
            await pending
        if isinstance(event, PermissionRequest) and waiter.on_permission is not None:
            answer = waiter.on_permission(event)
            if inspect.isawaitable(answer):
                answer = await answer
            self.decide(waiter.key, event.request_id, answer)  # type: ignore[arg-type]

    async def _send_cancel(self, key: str) -> None:
        try:
            state = await self._db.run_retrying(lambda conn: queue.request_cancel(conn, key=key), log=self._log,
                                                what="cancelling a turn")
            if state is not None:
                await self._notify_control({"cancel": key})
        except Exception as err:
            self._log.warning("the turn could not be cancelled", turn_id=key, error=str(err))

    async def _notify_control(self, order: dict[str, Any]) -> None:
        payload = notify_payloads(order, "message")[0]  # a decide's message is cut to what NOTIFY carries
        await self._db.run_retrying(
            lambda conn: conn.execute("SELECT pg_notify(%s, %s), pg_notify('bridge_work', '')",
                                      (CONTROL_CHANNEL, payload)).fetchall(),
            log=self._log, what="telling the workers")

    def _notified(self, note: Notification | Reconnected) -> None:
        if isinstance(note, Reconnected):
            self._db.drop_idle()  # the server went away: the pooled connections are most likely dead too
            for waiter in self._waiters.values():
                waiter.look = True  # read the rows again: a result may have been missed
                waiter.changed.set()
            return
        try:
            record = json.loads(note.payload)
            waiter = self._waiters.get(record.pop("t"))
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        if waiter is None:
            return
        record.pop("a", None)
        record.pop("n", None)
        if record.pop("done", False):
            waiter.look = True
        else:
            waiter.events.append(record)
        waiter.changed.set()
