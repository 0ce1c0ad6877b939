"""The gateway: a host whose turns run on workers elsewhere, through the PostgreSQL queue.

`RemoteHost` implements `BaseHost`, the interface `serve` and bots use
(`submit`, `cancel`, `decide`, stats, shutdown), so `serve --postgres` speaks
the same JSON Lines protocol. A submit commits the turn to the queue, then waits for
it: events arrive by LISTEN on this gateway's own channel
(`db.events_channel(name)`), the result is read from the table once a worker
says it is done — or, should that notification be lost (a reconnect), at the
next poll.

A gateway's name is its bot's namespace: the bot's turn ids, conversations
and sessions are apart from every other gateway's. One gateway per name: it
holds the name's advisory lock on its listening connection for its whole
life, and a second one with a name in use refuses to start
(`GatewayNameTaken`). Should the lock be lost with the connection and taken
by another gateway before this one is back, this one takes no new turns.

Results are at-least-once: a turn's `delivered_at` is set only after its
result was handed to the client, so a gateway that stops in between sends it
again when the next one with the same `name` starts (`undelivered`). Clients
dedupe by turn id.

What waits for the client is bounded (`MAX_BUFFERED_EVENT_BYTES`): past it,
partials are dropped (a preview: the result has the whole reply), and a turn
whose question or activity does not fit is cancelled and ends with the
error `events_overflow`.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import socket
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from ...dialects import ActivityEvent
from ...dialects.events import QuestionRequest, RequestWithdrawn
from ...engine.loop import Emit, EventCallback, PermissionCallback, as_decision, emit_to
from ...engine.questions import QuestionAnswer, check_answers
from ...engine.result import TurnResult
from ...errors import (
    GatewayNameTaken,
    PostgresError,
    QueueFull,
    RemoteTurnError,
    TurnDetached,
)
from ...log import get_logger
from ...permissions import Decision, PermissionRequest
from ...turn import text_problem
from ..interface import BaseHost, ClientSessionIds, HostStats, Submitted
from . import fleet_files, queue
from .db import (
    CONTROL_CHANNEL,
    DEFAULT_NAMESPACE,
    WORK_CHANNEL,
    Database,
    Notification,
    Reconnected,
    events_channel,
    listen,
    notify_payloads,
)
from .json_codec import event_from_dict, result_from_dict, turn_to_dict
from .pg_store import stored_session

DEFAULT_GATEWAY_NAME = DEFAULT_NAMESPACE
POLL_SECS = 30.0  # a waiting turn reads its row this often too, in case its notification was lost unnoticed
ENQUEUE_PATIENCE_SECS = 10.0  # a submit waits this long for an unreachable server before it is refused
# Events a client has not taken yet (its stdout not read, a slow callback), across every turn, in bytes.
MAX_BUFFERED_EVENT_BYTES = 8 * 1024 * 1024
# After a reconnect, how long the name's lock may still be held by this gateway's own broken connection.
NAME_RETAKE_SECS = 10.0
EVENTS_OVERFLOW = "events_overflow"
KEEP_FILE_DIRECTORIES = 1000  # directories of delivered files remembered before those gone are forgotten


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
    turn_id: str  # the bot's id, this gateway's only
    key: str  # the turn's key in the queue: what its events and orders name
    emit: Emit | None  # the submitter's on_partial and on_event, as a local host calls them
    on_permission: PermissionCallback | None
    changed: trio.Event = field(default_factory=trio.Event)
    events: deque[tuple[int, dict[str, Any]]] = field(default_factory=deque)  # (bytes, event) not yet delivered
    asked: set[str] = field(default_factory=set)  # permission requests still waiting for an answer
    questions: dict[str, QuestionRequest] = field(default_factory=dict)  # questions still waiting for an answer
    look: bool = True  # read the turn's row: it may have changed without a notification reaching this gateway
    waiting: trio.CancelScope = field(default_factory=trio.CancelScope)  # cancelled: the gateway stops waiting
    dropped: int = 0  # partials dropped: the client took events slower than the turn made them
    overflowed: bool = False  # a question or activity did not fit: the turn was cancelled and fails


class RemoteHost(BaseHost):
    """Turns through the PostgreSQL queue; use it as `async with open_host(postgres=DSN) as host`.

    Its results outlive it: one no client was sent waits in the queue for the next gateway of the same name
    (`undelivered`, `follow`, `delivered`). Its `submit` queues the turn and waits for its result (events stream
    from the worker). A `turn_id` this gateway's name already queued is a resend: nothing new runs, and the submit
    returns that turn's result (at once, if it has one). Ids are the bot's: another gateway's turn of the same id is
    another turn. Raises `QueueFull`, `HostClosed`, `DuplicateTurn` (the id is being waited for here already),
    `TurnError`, `SessionIdRefused`, `PostgresError` (the server stayed unreachable, or this gateway lost its name);
    `RemoteTurnError` when no worker could run it. `client_id` is the id a client used for the turn (serve's request
    id), sent back with the result by a later gateway.
    """

    def __init__(
        self,
        dsn: str,
        *,
        name: str = DEFAULT_GATEWAY_NAME,
        max_queued: int = 256,
        shutdown_grace: float = 10.0,
        client_session_ids: ClientSessionIds = "any",
    ) -> None:
        if not isinstance(name, str) or not name or text_problem(name):
            raise ValueError("a gateway name must be a non-empty string")
        super().__init__(
            shutdown_grace=shutdown_grace,
            client_session_ids=client_session_ids,
            log=get_logger(component="gateway", gateway=name),
        )
        self.dsn = dsn
        self.name = name  # also the namespace of its turns' sessions
        self.max_queued = max_queued
        self._db = Database(dsn, size=8)
        self._waiters: dict[str, _Waiter] = {}  # by the bot's turn id
        self._by_key: dict[str, _Waiter] = {}  # the same, by the turn's key
        self._resumable: dict[str, str] = {}  # key by turn id, of the turns `undelivered` listed
        self._buffered_bytes = 0  # of every waiter's `events`
        self._definitions_logged: set[tuple[str, str | None]] = set()
        self._name_holder: queue.NameHolder | None = None  # this gateway, holding its name's lock
        self._name_lost: GatewayNameTaken | None = None
        self._refused = 0
        self._tasks: trio.Nursery | None = None  # while `async with` runs the listener
        self._idle = trio.Event()
        self._idle.set()
        self._file_directories: set[str] = set()  # where the files of the turns it delivered are (fleet_files)

    # ------------------------------------------------------------------ lifetime

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        await trio.to_thread.run_sync(self._db.check)
        refused: Exception | None = None
        try:
            async with trio.open_nursery() as tasks:
                self._tasks = tasks
                try:
                    await tasks.start(
                        partial(
                            listen,
                            self.dsn,
                            (events_channel(self.name),),
                            self._notified,
                            log=self._log,
                            prepare=self._hold_name,
                        )
                    )
                except Exception as err:  # raised below, once the nursery is closed: as itself, not in a group
                    refused = err
                else:
                    try:
                        yield
                    finally:
                        try:
                            await self.aclose()
                        finally:
                            tasks.cancel_scope.cancel()
            if refused is not None:
                raise refused
        finally:
            self._db.close()
            for directory in self._file_directories:
                shutil.rmtree(directory, ignore_errors=True)

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
        for turn_id in list(self._waiters):
            self.cancel(turn_id)

    # ------------------------------------------------------------------ turns

    def _refuse_if_closed(self) -> None:
        if self._name_lost is not None:
            raise self._name_lost
        super()._refuse_if_closed()

    def _new_turn_id(self) -> str:
        return f"turn-{uuid.uuid4().hex}"

    async def _stored_session(self, profile: str, conversation: str, session_name: str) -> str:
        """The conversation's stored session, in this gateway's namespace (as the workers would resume it)."""
        with trio.move_on_after(ENQUEUE_PATIENCE_SECS) as patience:
            stored, _ = await self._db.run_retrying(
                partial(
                    stored_session,
                    namespace=self.name,
                    profile=profile,
                    conversation=conversation,
                    session_name=session_name,
                ),
                log=self._log,
                what="reading a stored session",
                atomic=False,
            )
        if patience.cancelled_caught:
            raise PostgresError(
                "PostgreSQL stayed unreachable; the turn's session_id could not be checked, and the "
                "turn was not queued",
                code="store_error",
            )
        return str(stored)

    async def _run_submitted(self, submitted: Submitted, task_status: trio.TaskStatus[str]) -> TurnResult:
        """Queue the turn (`QueueFull` when this gateway's share is full), then wait for its result."""
        # Waited for under its key before it is queued: a worker may start it before the insert returns here.
        waiter = self._wait_for(submitted.turn_id, uuid.uuid4().hex, submitted.callbacks(), submitted.on_permission)
        waiter.look = False  # nothing can have happened to a turn not queued yet: until a notification says so
        try:
            enqueued = await self._enqueue(submitted, waiter.key)
            if enqueued.outcome == "full":
                self._refused += 1
                raise QueueFull(f"this gateway's queue is full ({self.max_queued} turns wait); try again later")
            if enqueued.outcome == "resent":
                assert enqueued.key is not None
                self._rekey(waiter, enqueued.key)
                waiter.look = True  # not `look = False` otherwise: the turn may have ended while the insert returned
            else:
                self._note_definitions(submitted.profile, enqueued)
            task_status.started(submitted.turn_id)
            return await self._await_result(waiter)
        finally:
            self._forget(waiter)

    async def _enqueue(self, submitted: Submitted, key: str) -> queue.Enqueued:
        """Insert the turn in the queue, waiting a while for an unreachable server (then `PostgresError`)."""
        turn = submitted.turn
        # With nobody to answer the agent's questions here, the worker denies them at once (as a local host does).
        record = {
            **turn_to_dict(turn),
            "answered": submitted.on_event is not None or submitted.on_permission is not None,
        }
        with trio.move_on_after(ENQUEUE_PATIENCE_SECS) as patience:
            enqueued: queue.Enqueued = await self._db.run_retrying(
                partial(
                    queue.enqueue,
                    key=key,
                    turn_id=submitted.turn_id,
                    request_id=submitted.turn_id if submitted.client_id is None else submitted.client_id,
                    gateway=self.name,
                    profile=submitted.profile,
                    conversation=submitted.conversation,
                    session_name=turn.session_name,
                    turn=record,
                    max_queued=self.max_queued,
                ),
                log=self._log,
                what="queueing a turn",
                atomic=False,
            )
        if patience.cancelled_caught:
            raise PostgresError("PostgreSQL stayed unreachable; the turn was not queued", code="store_error")
        return enqueued

    async def follow(self, turn_id: str, *, on_event: EventCallback | None = None) -> TurnResult:
        """Wait for the result of a turn queued earlier under this gateway's name (by a gateway that stopped):
        see `undelivered`."""
        key = self._resumable.pop(turn_id, None)
        if key is None:
            key = await self._db.run_retrying(
                partial(queue.key_of, gateway=self.name, turn_id=turn_id),
                log=self._log,
                what="finding a turn",
                atomic=False,
            )
        if key is None:
            raise RemoteTurnError("unknown_turn", f"the queue knows no turn {turn_id!r} of gateway {self.name!r}")
        emit = emit_to(None, on_event)
        waiter = self._wait_for(turn_id, key, emit, None)
        try:
            result = await self._await_result(waiter)
        finally:
            self._forget(waiter)
        if emit is not None:
            await emit(result)
        return result

    async def undelivered(self) -> list[tuple[str, Any]]:
        """(turn id, client's id) of this gateway name's turns whose result no client was sent yet."""
        rows = await self._db.run_retrying(
            partial(queue.undelivered, gateway=self.name), log=self._log, what="reading undelivered results"
        )
        self._resumable.update((turn_id, key) for turn_id, key, _ in rows)
        return [(turn_id, request_id) for turn_id, _, request_id in rows]

    async def delivered(self, turn_id: str) -> None:
        """The client has the turn's result: a later gateway will not send it again."""
        try:
            await self._db.run(partial(queue.mark_delivered, gateway=self.name, turn_id=turn_id), atomic=True)
        except PostgresError as err:
            self._log.warning("could not mark a result delivered; it may be sent again", error=str(err))

    def cancel(self, turn_id: str) -> bool:
        """Stop a turn this gateway waits for, queued or running on any worker; False when it waits for none."""
        waiter = self._waiters.get(turn_id)
        if waiter is None or self._tasks is None:
            return False
        self._tasks.start_soon(self._send_cancel, waiter.key, turn_id)
        return True

    def in_flight(self, turn_id: str) -> bool:
        return turn_id in self._waiters

    def decide(self, turn_id: str, request_id: str, answer: Decision | bool) -> bool:
        """Answer a permission request of a turn this gateway waits for; False when it waits for none such."""
        waiter = self._waiters.get(turn_id)
        if waiter is None or request_id not in waiter.asked or self._tasks is None:
            return False
        waiter.asked.discard(request_id)
        decision = as_decision(answer)
        order = {
            "decide": waiter.key,
            "request_id": request_id,
            "allow": decision.allow,
            "always": decision.always,
            "message": decision.message,
        }
        self._tasks.start_soon(self._notify_control, order)
        return True

    def answer(self, turn_id: str, request_id: str, answer: QuestionAnswer) -> bool:
        """Answer a question of a turn this gateway waits for; False when it waits for none such. `AnswerRefused`
        when the answer does not fit the question."""
        waiter = self._waiters.get(turn_id)
        request = waiter.questions.get(request_id) if waiter is not None else None
        if waiter is None or request is None or self._tasks is None:
            return False
        answers = check_answers(request, answer) if answer is not None else None
        del waiter.questions[request_id]
        order = {
            "answer": waiter.key,
            "request_id": request_id,
            "answers": {question: list(labels) for question, labels in answers.items()}
            if answers is not None
            else None,
        }
        self._tasks.start_soon(self._notify_control, order)
        return True

    def stats(self) -> HostStats:
        raise TypeError("a RemoteHost's stats come from the database: await host.current_stats()")

    async def current_stats(self) -> FleetStats:
        numbers = await self._db.run(queue.stats, atomic=False)
        return FleetStats(
            running=numbers["running"],
            queued=numbers["queued"],
            completed=numbers["completed"],
            failed=numbers["failed"],
            refused=self._refused,
            store_errors=0,
            outcomes=numbers["outcomes"],
            max_concurrent=numbers["max_concurrent"],
            max_queued=self.max_queued,
            closing=self._closing,
            warm=0,
            questions_waiting=sum(len(waiter.asked) + len(waiter.questions) for waiter in self._waiters.values()),
            fleet_queued=numbers["queued"],
            workers=tuple(numbers["workers"]),
        )

    # ------------------------------------------------------------------ internals

    def _wait_for(
        self,
        turn_id: str,
        key: str,
        emit: Emit | None,
        on_permission: PermissionCallback | None,
    ) -> _Waiter:
        waiter = _Waiter(turn_id, key, emit, on_permission)
        self._waiters[turn_id] = waiter
        self._by_key[key] = waiter
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        return waiter

    def _rekey(self, waiter: _Waiter, key: str) -> None:
        """The turn was queued before under another key (a resend): wait for that one."""
        self._by_key.pop(waiter.key, None)
        waiter.key = key
        self._by_key[key] = waiter

    def _forget(self, waiter: _Waiter) -> None:
        if self._waiters.get(waiter.turn_id) is waiter:
            del self._waiters[waiter.turn_id]
        if self._by_key.get(waiter.key) is waiter:
            del self._by_key[waiter.key]
        self._buffered_bytes -= sum(size for size, _ in waiter.events)
        waiter.events.clear()
        if not self._waiters:
            self._idle.set()

    def _note_definitions(self, profile: str, enqueued: queue.Enqueued) -> None:
        """Say, once per profile and choice, that the live workers disagree about a profile's file."""
        if enqueued.definitions <= 1 or (profile, enqueued.profile_hash) in self._definitions_logged:
            return
        self._definitions_logged.add((profile, enqueued.profile_hash))
        self._log.warning(
            "the live workers have different files for a profile; its turns go to the workers with "
            "the file most of them have (a tie: the one advertised last) — give every worker the "
            "same file",
            profile=profile,
            definitions=enqueued.definitions,
            chosen=(enqueued.profile_hash or "")[: queue.SHOWN_HASH_CHARS],
        )

    async def _await_result(self, waiter: _Waiter) -> TurnResult:
        with waiter.waiting:
            while True:
                waiter.changed = trio.Event()
                await self._deliver_events(waiter)
                ending = None
                if waiter.look:
                    ending = await self._db.run_retrying(
                        partial(queue.ending, gateway=self.name, key=waiter.key),
                        log=self._log,
                        what="reading a turn's result",
                        atomic=False,
                    )
                waiter.look = False
                if ending is not None and ending.state == "done":
                    await self._deliver_events(waiter)  # events that arrived while the row was read
                    if waiter.overflowed:
                        raise RemoteTurnError(EVENTS_OVERFLOW, self._overflow_message(waiter))
                    if ending.error:
                        raise RemoteTurnError(
                            ending.error.get("code", "internal_error"), ending.error.get("message", "")
                        )
                    assert ending.result is not None  # a turn done without an error has its result
                    result, problem = await self._receive_files(waiter, result_from_dict(ending.result))
                    if waiter.emit is not None:
                        for file in result.files:
                            await waiter.emit(file)
                        if problem:
                            await waiter.emit(ActivityEvent("notice", text=problem))
                    return result
                with trio.move_on_after(POLL_SECS) as poll:
                    await waiter.changed.wait()
                if poll.cancelled_caught:
                    waiter.look = True
        raise TurnDetached(
            f"turn {waiter.turn_id!r} runs on; its result waits in the queue for the next gateway named {self.name!r}"
        )

    async def _receive_files(self, waiter: _Waiter, result: TurnResult) -> tuple[TurnResult, str]:
        """`result` with the files its worker stored, now in a directory of this gateway's (removed when it
        closes, should the client not have taken them by then), and what could not be sent."""
        if not result.files:
            return result, ""
        try:
            received, problem = await self._db.run_retrying(
                partial(fleet_files.load, key=waiter.key, result=result), log=self._log, what="reading a turn's files"
            )
        except OSError as err:
            problem = f"the turn's files could not be written on the gateway ({err.strerror}); none were sent"
            self._log.error("a turn's files could not be written", turn_id=waiter.turn_id, error=str(err))
            note = "; ".join(part for part in (result.files_note, problem) if part)
            return dataclasses.replace(result, files=(), files_note=note), problem
        if problem:
            self._log.warning("a turn's files were not all sent", turn_id=waiter.turn_id, problem=problem)
        if len(self._file_directories) >= KEEP_FILE_DIRECTORIES:  # forget those the client took (and serve removed)
            known = set(self._file_directories)
            self._file_directories -= await trio.to_thread.run_sync(
                lambda: {path for path in known if not os.path.isdir(path)}
            )
        self._file_directories.update(os.path.dirname(file.path) for file in received.files)
        return received, problem

    async def _deliver_events(self, waiter: _Waiter) -> None:
        while waiter.events:
            size, record = waiter.events.popleft()
            self._buffered_bytes -= size
            if not waiter.overflowed:
                await self._deliver_event(waiter, record)
        if waiter.dropped:
            self._log.warning(
                "partials were dropped: the client took this gateway's events slower than the turns made them",
                turn_id=waiter.turn_id,
                dropped=waiter.dropped,
                limit_bytes=MAX_BUFFERED_EVENT_BYTES,
            )
            waiter.dropped = 0

    def _overflow_message(self, waiter: _Waiter) -> str:
        return (
            f"turn {waiter.turn_id!r} was cancelled: its questions and activity outran their reader (the bot "
            f"reading this gateway's responses, or its callbacks) by more than {MAX_BUFFERED_EVENT_BYTES} "
            "bytes; read responses as they come"
        )

    async def _deliver_event(self, waiter: _Waiter, record: dict[str, Any]) -> None:
        if record.get("event") == "decide_failed":
            waiter.asked.discard(str(record.get("request_id")))
            waiter.questions.pop(str(record.get("request_id")), None)
            return
        event = event_from_dict(record)
        if event is None:
            return
        if isinstance(event, PermissionRequest):
            waiter.asked.add(event.request_id)
        elif isinstance(event, QuestionRequest):
            waiter.questions[event.request_id] = event
        elif isinstance(event, RequestWithdrawn):  # an answer to it is now an unknown request's
            waiter.asked.discard(event.request_id)
            waiter.questions.pop(event.request_id, None)
        if waiter.emit is not None:
            await waiter.emit(event)
        if isinstance(event, PermissionRequest) and waiter.on_permission is not None:
            answer = waiter.on_permission(event)
            if inspect.isawaitable(answer):
                answer = await answer
            self.decide(waiter.turn_id, event.request_id, answer)

    async def _send_cancel(self, key: str, turn_id: str) -> None:
        try:
            state = await self._db.run_retrying(
                partial(queue.request_cancel, gateway=self.name, key=key), log=self._log, what="cancelling a turn"
            )
            if state is not None:
                await self._notify_control({"cancel": key})
        except Exception as err:
            self._log.warning("the turn could not be cancelled", turn_id=turn_id, error=str(err))

    async def _notify_control(self, order: dict[str, Any]) -> None:
        payload = notify_payloads(order, "message")[0]  # a decide's message is cut to what NOTIFY carries
        await self._db.run_retrying(
            lambda conn: conn.execute(
                "SELECT pg_notify(%s, %s), pg_notify(%s, '')", (CONTROL_CHANNEL, payload, WORK_CHANNEL)
            ).fetchall(),
            log=self._log,
            what="telling the workers",
        )

    def _hold_name(self, conn: Any) -> None:
        """`listen`'s `prepare`, in a worker thread: take this gateway's name on the listening connection, for
        as long as it lives. After a reconnect the server may not have noticed yet that this gateway's old
        connection broke: that one is ended, and the lock taken again."""
        deadline = time.monotonic() + NAME_RETAKE_SECS
        while True:
            taken, holder = queue.take_gateway_name(conn, name=self.name, host=socket.gethostname(), pid=os.getpid())
            if taken:
                self._name_holder = holder
                return
            mine = self._name_holder
            ours = holder is None or (
                mine is not None
                and (holder.backend_pid, holder.backend_start) == (mine.backend_pid, mine.backend_start)
            )
            if not ours or time.monotonic() > deadline:
                raise GatewayNameTaken(self.name, holder, lost=mine is not None)
            if holder is not None:
                conn.execute("SELECT pg_terminate_backend(%s)", (holder.backend_pid,))
            time.sleep(0.05)  # until the server has let go of the lock

    def _notified(self, note: Notification | Reconnected) -> None:
        if isinstance(note, Reconnected):
            self._db.drop_idle()  # the server went away: the pooled connections are most likely dead too
            if isinstance(note.problem, GatewayNameTaken) and self._name_lost is None:
                self._name_lost = note.problem
                self.stop_accepting()
                self._log.error(
                    "this gateway lost its name to another gateway and takes no new turns; stop one of them",
                    problem=str(note.problem),
                )
            for waiting in self._waiters.values():
                waiting.look = True  # read the rows again: a result may have been missed
                waiting.changed.set()
            return
        try:
            record = json.loads(note.payload)
            waiter = self._by_key.get(record.pop("t"))
        except (ValueError, KeyError, TypeError, AttributeError):
            return
        if waiter is None:
            return
        record.pop("a", None)
        record.pop("n", None)
        if record.pop("done", False):
            waiter.look = True
        elif not waiter.overflowed:
            self._buffer(waiter, record, len(note.payload.encode()))
        waiter.changed.set()

    def _buffer(self, waiter: _Waiter, record: dict[str, Any], size: int) -> None:
        """Keep an event for the waiter until its client takes it, within `MAX_BUFFERED_EVENT_BYTES`."""
        if self._buffered_bytes + size <= MAX_BUFFERED_EVENT_BYTES:
            waiter.events.append((size, record))
            self._buffered_bytes += size
        elif record.get("event") == "partial":
            waiter.dropped += 1  # a preview: the result has the whole reply
        else:
            waiter.overflowed = True
            self._log.error(
                "a turn's question or activity found no room: the client takes events too slowly; cancelling the turn",
                turn_id=waiter.turn_id,
                limit_bytes=MAX_BUFFERED_EVENT_BYTES,
            )
            if self._tasks is not None:
                self._tasks.start_soon(self._send_cancel, waiter.key, waiter.turn_id)
