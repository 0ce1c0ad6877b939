"""The host runtime: one object a bot holds for its lifetime to run turns for many conversations.

    async with bridge.open_host(profiles="profiles/", state="sessions.sqlite3") as host:
        result = await host.submit("stream", "chat-42", bridge.Turn("hello"), on_partial=send)

It owns what every chat host would otherwise re-invent (docs/protocol.md §6): where session
ids live, keeping two turns of one conversation from running at once, how many
agents run together, a bounded queue, picking up edited profiles, and stopping
cleanly.

A turn runs in the task that submitted it; the host only decides *when* it may
start (see `scheduler`). So a submit is cancelled like any trio call (the agent
is stopped as a host cancel, then `Cancelled` propagates), and the host needs
no task of its own. `cancel(turn_id)` instead stops a turn and still returns
its result (exit 130), which is what a bot relaying a user's "stop" wants.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import trio

from ..engine.driver import DRAIN_SECS, REAP_SECS
from ..engine.loop import as_decision
from ..engine.one_process import drive_turn
from ..engine.questions import QuestionAnswer, Questions
from ..engine.result import Outcome, TurnResult, cancelled_result, folded_result
from ..engine.run import ungrouped
from ..engine.warm_agents import WarmAgent, start_failure_result
from ..errors import BridgeError, DuplicateTurn, HostClosed, ProtocolMisuse, QueueFull, SessionIdRefused, WarmStartError
from ..log import Logger, get_logger
from ..permissions import Decision
from ..profile import Profile
from .file_turnlock import Place, TurnLocks
from .interface import BaseHost, ClientSessionIds, HostStats, Submitted
from .pool import Key, WarmPool
from .registry import ProfileRegistry
from .scheduler import Ticket, TurnQueue

if TYPE_CHECKING:
    from .postgres.advisory_turnlock import PgPlace, PgTurnLocks

DEFAULT_MAX_CONCURRENT = 32
DEFAULT_MAX_QUEUED = 256
DEFAULT_SHUTDOWN_GRACE = 10.0


class SessionStoreLike(Protocol):
    """What the host needs of a session store (`SessionStore` and `PostgresSessionStore` are the real ones)."""

    def get(self, profile: str, conversation: str, session_name: str = "default") -> str: ...

    def record(self, profile: str, conversation: str, session_name: str, result: TurnResult) -> str | None:
        """Store the result's session; may return a stamp of the record (see `pool`)."""


@dataclass(frozen=True, slots=True)
class OpenedStore:
    """A host's session store and the queues other processes sharing it use; `owned`: the host closes it."""

    store: SessionStoreLike
    turn_locks: TurnLocks | PgTurnLocks | None
    owned: bool

    def close(self) -> None:
        if self.owned:
            close = getattr(self.store, "close", None)
            if close is not None:
                close()
        if self.turn_locks is not None:
            self.turn_locks.close()


StoreOpener = Callable[[], OpenedStore]  # opens a host's store when the host is entered


class _Flight(Ticket):
    """A submitted turn in the host: its ticket, the request (`submitted`) with the profile it loaded, the
    callbacks it reports to (`emit`) and its log, and what the host needs to stop it and answer its questions."""

    __slots__ = ("turn_id", "submitted", "profile", "log", "questions", "emit", "agent", "cancel", "wake")
    key: Key  # (profile name, conversation, session name)

    def __init__(self, seq: int, submitted: Submitted, profile: Profile, log: Logger) -> None:
        super().__init__((submitted.profile, submitted.conversation, submitted.turn.session_name), seq)
        self.turn_id = submitted.turn_id
        self.submitted = submitted
        self.profile = profile
        self.log = log
        self.questions = Questions(  # the agent's requests to run a tool that wait for the host
            listening=submitted.on_event is not None or submitted.on_permission is not None,
            hears_questions=submitted.on_event is not None,
        )
        self.emit = submitted.callbacks(self.questions)
        self.agent: WarmAgent | None = None  # the warm agent running the turn, while it does
        self.cancel = trio.Event()  # set: stop the agent as a host cancel; the result says 130
        self.wake = trio.Event()  # set: the ticket left the queue (started, or withdrawn)


def open_host(
    profiles: str | os.PathLike[str] | None = None,
    *,
    state: str | os.PathLike[str] | SessionStoreLike | None = None,
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    max_queued: int = DEFAULT_MAX_QUEUED,
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
    postgres: str | None = None,
    gateway_name: str = "serve",
    namespace: str | None = None,
    client_session_ids: ClientSessionIds = "any",
    attachment_hosts: Sequence[str] = (),
) -> BaseHost:
    """A host for the profiles in directory `profiles`; use it as `async with open_host(...) as host`.

    `state` is the session store: a file path, a `postgresql://` URL (a database that hosts on many machines
    may share; needs the postgres extra), `None` for the default file
    (`$XDG_STATE_HOME/agent-bridge/sessions.sqlite3`), or a store object the caller owns (anything with `get`
    and `record`, such as a `SessionStore`). It opens when the host is entered, not here (a store that cannot
    open raises there). With a `SessionStore` or a `PostgresSessionStore` (named, or given), turns also queue
    with those of other processes using the same store (CLI runs, other hosts): in `<store file>.turns/` (see
    `turnlock`), or with the database's advisory locks (see `postgres.advisory_turnlock`). `namespace` is the
    bot whose sessions a `postgresql://` `state` holds (default: "serve", as the default gateway name): bots
    sharing a database need one each. `max_concurrent` turns run at once; `max_queued` more may wait, then
    `submit` raises `QueueFull`. On shutdown, turns in flight get `shutdown_grace` seconds to finish before
    they are cancelled. `client_session_ids="stored"` refuses a turn whose `session_id` is set and is not its
    conversation's stored one (`SessionIdRefused`); "any" (the default) runs a turn on whatever session it
    names. `attachment_hosts`: host names, addresses and CIDR networks the turns' attachments may be fetched
    from although they are not public (loopback, a private network), on top of each profile's
    `attachments.allow_hosts`.

    With `postgres="postgresql://…"` the host is a gateway (`RemoteHost`): turns go to the PostgreSQL queue
    and run on `agent-bridge worker`s, which have the profiles (`profiles` and `state` are not used;
    `max_concurrent` is the workers'). `gateway_name` names this gateway's turns and is its bot's namespace:
    one live gateway per name; results not yet delivered are sent again by the next gateway of that name.
    """
    hosts = _attachment_hosts(attachment_hosts)
    if postgres is not None:
        return _gateway(postgres, gateway_name, namespace, hosts, max_queued, shutdown_grace, client_session_ids)
    if profiles is None:
        raise TypeError("open_host() needs a profiles directory (or postgres= for a gateway)")
    registry = ProfileRegistry(profiles)
    for error in registry.broken():
        get_logger(component="host").warning(
            "a profile does not load; turns asking for it will fail until it is fixed", problem=str(error)
        )
    return Host(
        registry,
        open_store=_store_opener(state, namespace),
        max_concurrent=max_concurrent,
        max_queued=max_queued,
        shutdown_grace=shutdown_grace,
        client_session_ids=client_session_ids,
        attachment_hosts=hosts,
    )


def _attachment_hosts(attachment_hosts: Sequence[str]) -> tuple[str, ...]:
    hosts = tuple(attachment_hosts)
    if not all(isinstance(host, str) and host for host in hosts):
        raise TypeError("attachment_hosts are host names, addresses or CIDR networks (non-empty strings)")
    return hosts


def _gateway(
    postgres: str,
    name: str,
    namespace: str | None,
    attachment_hosts: tuple[str, ...],
    max_queued: int,
    shutdown_grace: float,
    client_session_ids: ClientSessionIds,
) -> BaseHost:
    from .postgres.gateway import RemoteHost

    if attachment_hosts:
        raise TypeError(
            "a gateway fetches no attachments: its workers do (agent-bridge worker --allow-attachment-host)"
        )
    if namespace is not None and namespace != name:
        raise TypeError("a gateway's namespace is its name: pass gateway_name= instead of namespace=")
    return RemoteHost(
        postgres, name=name, max_queued=max_queued, shutdown_grace=shutdown_grace, client_session_ids=client_session_ids
    )


def _store_opener(state: str | os.PathLike[str] | SessionStoreLike | None, namespace: str | None) -> StoreOpener:
    """What opens `state` (and the queues other processes sharing it use) when the host is entered."""
    from .state import check_namespace_applies, open_store, open_turn_locks

    if state is not None and not isinstance(state, (str, os.PathLike)):
        if namespace is not None:
            raise TypeError(
                "namespace= is for a store open_host opens (state= a postgresql:// URL); a store object has its own"
            )
        given = state
        return lambda: OpenedStore(given, open_turn_locks(given), owned=False)
    path = state
    check_namespace_applies(path, namespace)  # a mistake in the arguments is refused at once; the store opens later

    def opened() -> OpenedStore:
        store = open_store(path, namespace=namespace)
        try:
            return OpenedStore(store, open_turn_locks(store), owned=True)
        except BaseException:
            store.close()
            raise

    return opened


class Host(BaseHost):
    """Runs turns for many conversations with ordering, limits, sessions and a clean shutdown, in this process.

    Build it with `open_host`. One host belongs to one trio run. How its `submit` runs a turn:

    Turns of the same (profile, conversation, session name) run one at a time in the order they were submitted; with
    a store file or database, a turn that may start also waits for the conversation's turns in other processes
    sharing it (it counts as running meanwhile). When `turn.session_id` is empty, the stored session id is used, and
    the result's id is stored for the next turn (no valid session line keeps the stored one).

    `on_partial(text)` / `on_event(event)` see the turn's events as in `run_turn`; the `TurnResult` reaches
    `on_event` last, once the session is stored and the next turn of the conversation may start. When the profile's
    `permissions` say ask, `on_permission(request)` answers the agent's request to run a tool, as in `run_turn`;
    without it, the `PermissionRequest` reaches `on_event` and `decide(turn_id, ...)` answers it (with neither, the
    answer is deny). A `QuestionRequest` (the agent asks the user to choose) reaches `on_event`, and
    `answer(turn_id, ...)` answers it (without `on_event`, it is declined).

    A warm profile's turn runs on its conversation's live agent when there is one that fits (see `bridge.host.pool`)
    — only inside `async with`, which runs the pool; otherwise a fresh agent resumes the stored session for the
    turn.

    Refused at once, before anything runs: `HostClosed`, `QueueFull`, `UnknownProfile` / `ProfileError` (the profile
    is missing or does not load), `DuplicateTurn` (`turn_id` is in flight), `TurnError`, and with
    `client_session_ids="stored"` `SessionIdRefused` (`turn.session_id` is set and is not the conversation's stored
    one, as read at submit). `nursery.start(host.submit, ...)` returns the turn id once the turn was accepted.
    `StoreError` when the stored session cannot be read, and `TurnLockError` when the conversation's queue cannot be
    used (the turn does not run: resuming the wrong session would be worse). `client_id` is not kept: a result does
    not outlive this host.
    """

    def __init__(
        self,
        registry: ProfileRegistry,
        store: SessionStoreLike | None = None,
        *,
        open_store: StoreOpener | None = None,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        max_queued: int = DEFAULT_MAX_QUEUED,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        client_session_ids: ClientSessionIds = "any",
        attachment_hosts: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            shutdown_grace=shutdown_grace, client_session_ids=client_session_ids, log=get_logger(component="host")
        )
        self.registry = registry
        self.attachment_hosts = attachment_hosts  # exceptions to the attachments' address rule, for every profile
        if (store is None) == (open_store is None):
            raise TypeError("a Host needs a session store, or what opens one when it is entered (not both)")
        self._open_store = open_store
        self._opened = OpenedStore(store, None, owned=False) if store is not None else None  # once open
        self._queue: TurnQueue[_Flight] = TurnQueue(max_concurrent, max_queued)
        self._flights: dict[str, _Flight] = {}
        self._arrivals = itertools.count()  # arrival order of admitted turns
        self._ids = itertools.count(1)  # for turns submitted without an id
        self._closed = trio.Event()  # aclose() finished
        self._idle: trio.Event | None = None  # set when the last flight ends
        self._refused = 0
        self._store_errors = 0
        self._pool: WarmPool | None = None  # warm agents by conversation, while `async with` runs it

    # ------------------------------------------------------------------ turns

    def _new_turn_id(self) -> str:
        turn_id = f"turn-{next(self._ids)}"
        while turn_id in self._flights:  # the caller chose an id of this shape
            turn_id = f"turn-{next(self._ids)}"
        return turn_id

    async def _stored_session(self, profile: str, conversation: str, session_name: str) -> str:
        self.registry.get(profile)  # an unknown profile is refused as such, before the store is read
        log = self._log.bind(profile=profile, conversation=conversation)
        stored, _ = await self._read_session((profile, conversation, session_name), log)
        return stored

    async def _run_submitted(self, submitted: Submitted, task_status: trio.TaskStatus[str]) -> TurnResult:
        """Admit the turn to the queue (`QueueFull` when it is full), then run it in its turn."""
        self._open()  # a host not entered has no store to read the conversation's session from
        loaded = self.registry.get(submitted.profile)
        log = self._log.bind(turn_id=submitted.turn_id, profile=submitted.profile, conversation=submitted.conversation)
        flight = _Flight(next(self._arrivals), submitted, loaded, log)
        runs_now = self._admit(flight)
        task_status.started(submitted.turn_id)
        try:
            if not runs_now and loaded.on_busy == "steer" and (steered := await self._steer(flight)):
                running_id, session_id = steered
                duration_ms = max(0, round((trio.current_time() - submitted.started) * 1000))
                return folded_result(loaded, running_id, session_id, duration_ms)
            if not runs_now:
                await self._wait_for_slot(flight)
            if flight.state == Ticket.WITHDRAWN:
                return _cancelled_result(loaded, submitted.started)
            return await self._run(flight)
        finally:
            self._land(flight)

    def _admit(self, flight: _Flight) -> bool:
        """Put the flight in the queue: True when it runs now; `QueueFull` when there is no room. A
        conversation whose profile says `on_busy: interrupt` has its running turn stopped for it, and the turns
        waiting before it withdrawn: each would be interrupted by it the moment it started."""
        log = flight.log
        try:
            runs_now = self._queue.admit(flight)
        except QueueFull:
            self._refused += 1
            log.warning("turn refused: the queue is full", running=self._queue.running, queued=self._queue.waiting)
            raise
        self._flights[flight.turn_id] = flight
        if not runs_now:
            log.info("turn queued", queued=self._queue.waiting)
            if flight.profile.on_busy == "interrupt":
                self._interrupt_for(flight)
        return runs_now

    def _interrupt_for(self, flight: _Flight) -> None:
        """`on_busy: interrupt`: stop the conversation's running turn and withdraw those waiting before `flight`."""
        for other in list(self._flights.values()):
            if other is not flight and other.key == flight.key and other.state in (Ticket.RUNNING, Ticket.WAITING):
                flight.log.info(
                    "a turn of the conversation is stopped for a newer message", stopped=other.turn_id, was=other.state
                )
                self._stop(other)

    def cancel(self, turn_id: str) -> bool:
        """Stop turn `turn_id` as a host cancel (SIGINT, grace, SIGKILL); its submitter gets a 130 result.

        A queued turn leaves the queue without running. Returns False when no
        such turn is in flight (unknown, or already finished).
        """
        flight = self._flights.get(turn_id)
        if flight is None:
            return False
        self._stop(flight)
        return True

    def in_flight(self, turn_id: str) -> bool:
        """True while turn `turn_id` is queued or running."""
        return turn_id in self._flights

    def decide(self, turn_id: str, request_id: str, answer: Decision | bool) -> bool:
        """Answer request `request_id` of turn `turn_id` (a `PermissionRequest` its `on_event` saw):
        a `Decision`, or True/False. Returns False when that question waits for nothing (unknown turn or
        request, answered already, timed out, or its turn ended)."""
        flight = self._flights.get(turn_id)
        return flight is not None and flight.questions.decide(request_id, as_decision(answer))

    def answer(self, turn_id: str, request_id: str, answer: QuestionAnswer) -> bool:
        """Answer question `request_id` of turn `turn_id` (a `QuestionRequest` its `on_event` saw): each question's
        id → the labels chosen (a plain label when it asked one), or None to decline. `AnswerRefused` when the
        answer does not fit; False when that question waits for nothing (as for `decide`)."""
        flight = self._flights.get(turn_id)
        return flight is not None and flight.questions.answer(request_id, answer)

    def stats(self) -> HostStats:
        return HostStats(
            running=self._queue.running,
            queued=self._queue.waiting,
            completed=sum(self._outcomes.values()),
            failed=self._failed,
            refused=self._refused,
            store_errors=self._store_errors,
            outcomes={
                outcome.value: self._outcomes[outcome.value]
                for outcome in Outcome
                if outcome is not Outcome.WORKER_LOST
            },  # only workers of a PostgreSQL queue lose turns
            max_concurrent=self._queue.max_running,
            max_queued=self._queue.max_waiting,
            closing=self._closing,
            warm=self._pool.size if self._pool is not None else 0,
            questions_waiting=sum(len(flight.questions.waiting) for flight in self._flights.values()),
        )

    async def current_stats(self) -> HostStats:
        """`stats()`, through the interface every host has (the PostgreSQL gateway has to ask its database)."""
        return self.stats()

    async def profile_names(self) -> list[str] | None:
        return sorted(self.registry.loaded())

    def profile(self, name: str) -> Profile:
        """The current profile called `name` (re-read if its file changed); raises like `submit`."""
        return self.registry.get(name)

    def _running_turn(self, key: Hashable) -> _Flight | None:
        """The turn of `key`'s conversation that runs now, if one does."""
        return next(
            (flight for flight in self._flights.values() if flight.key == key and flight.state == Ticket.RUNNING),
            None,
        )

    async def _steer(self, flight: _Flight) -> tuple[str, str] | None:
        """`on_busy: steer`: give the conversation's running turn this message. The id of the turn that took it
        in (which answers it) and its session; None when it waits for its own turn (the running agent cannot
        steer, refused it, or its turn ended first). The flight keeps its place in the queue meanwhile."""
        running = self._running_turn(flight.key)
        agent = running.agent if running is not None else None
        if running is None or agent is None or not agent.can_steer:
            flight.log.info("on_busy is steer, but the running turn cannot be steered: the message queues")
            return None
        try:
            folded = await agent.steer(flight.submitted.turn)
        except BaseException:
            if flight.state == Ticket.WAITING:  # the submitter went away
                self._queue.withdraw(flight)
            raise
        if not folded:
            return None
        if flight.state == Ticket.WAITING:
            self._queue.withdraw(flight)
        flight.log.info("message steered into the running turn", folded_into=running.turn_id)
        return running.turn_id, agent.session_id

    async def _wait_for_slot(self, flight: _Flight) -> None:
        try:
            await flight.wake.wait()
        except BaseException:
            if flight.state == Ticket.WAITING:  # the submitter went away while queued
                self._queue.withdraw(flight)
            raise

    async def _run(self, flight: _Flight) -> TurnResult:
        turn_locks = self._open().turn_locks
        if turn_locks is None:
            return await self._run_in_place(flight)
        place = await self._take_place(turn_locks, flight)
        if place is None:  # cancelled while another process ran a turn of the conversation
            return _cancelled_result(flight.profile, trio.current_time())
        try:
            return await self._run_in_place(flight)
        finally:
            place.release()

    async def _take_place(self, turn_locks: TurnLocks | PgTurnLocks, flight: _Flight) -> Place | PgPlace | None:
        """The conversation's place across processes, once our own queue let the turn start; None if the
        turn was cancelled while waiting. Waiting polls (no thread to abandon), and only while another
        process runs a turn of the conversation."""
        log = flight.log
        try:
            place = await turn_locks.join_async(*flight.key)
            try:
                if not place.try_wait():
                    log.info("turn waits for an earlier turn of its conversation, in another process")
                    if not await place.wait_async(abandon=flight.cancel):
                        place.release()
                        return None
            except BaseException:
                place.release()
                raise
        except BridgeError as err:
            self._store_errors += 1
            log.error("the conversation's queue cannot be used; the turn does not run", error=str(err))
            raise
        return place

    async def _run_in_place(self, flight: _Flight) -> TurnResult:
        profile, turn, emit, log, key = flight.profile, flight.submitted.turn, flight.emit, flight.log, flight.key
        pool = self._pool if profile.warm else None
        if self._pool is not None and pool is None:
            self._pool.discard(key)  # the profile stopped being warm: its old agent would miss this turn
        stamp = ""
        if not turn.session_id or pool is not None:
            stored, stamp = await self._read_session(key, log)
            if stored and not turn.session_id:
                turn = turn.replace(session_id=stored)
        if flight.cancel.is_set():  # cancelled before the agent started: do not start it
            return _cancelled_result(profile, trio.current_time())

        log.debug("turn started", resumed=bool(turn.session_id))
        agent: WarmAgent | None = None
        try:
            # The result reaches the submitter's callbacks later (see submit), once its session is stored.
            with ungrouped():  # a callback's exception reaches the submitter as itself
                if pool is None:
                    result = await drive_turn(
                        profile,
                        turn,
                        emit,
                        cancel=flight.cancel,
                        turn_id=flight.turn_id,
                        questions=flight.questions,
                        allow_hosts=self.attachment_hosts,
                    )
                else:
                    started = trio.current_time()
                    try:
                        agent = await pool.checkout(key, profile, turn.session_id, stamp, log)
                    except WarmStartError as err:
                        result = start_failure_result(err, profile, log, round((trio.current_time() - started) * 1000))
                    else:
                        flight.agent = agent
                        result = await agent.turn(
                            turn,
                            emit,
                            cancel=flight.cancel,
                            questions=flight.questions,
                            log=log,
                            allow_hosts=self.attachment_hosts,
                        )
                        flight.agent = None
            stamp = await self._record_session(key, result, log, stamp)
        finally:
            if agent is not None:
                assert pool is not None  # the agent came from it
                pool.checkin(key, stamp)
        return result

    # The store is called in worker threads. A call takes microseconds (get ~5 µs, record ~20 µs,
    # a thread hop ~100 µs), but a record can wait: for another process's write lock (up to the
    # store's busy timeout), for a WAL checkpoint's fsync, or for another record of this store
    # (reads have a connection of their own and never wait). None of that may freeze every
    # other conversation's output.
    async def _read_session(self, key: Key, log: Logger) -> tuple[str, str]:
        """`_lookup` in a worker thread; `StoreError` (counted and logged) when the store cannot be read."""
        try:
            return await trio.to_thread.run_sync(self._lookup, key)
        except BridgeError as err:
            self._store_errors += 1
            log.error("the stored session cannot be read; the turn does not run", error=str(err))
            raise

    async def _record_session(self, key: Key, result: TurnResult, log: Logger, stamp: str) -> str:
        """Store the result's session; the record's stamp, or `stamp` (the one read) when it could not be stored."""
        try:
            recorded = await trio.to_thread.run_sync(self.store.record, *key, result)
        except BridgeError as err:
            # The turn happened and its result stands; only the session link is lost.
            self._store_errors += 1
            log.error("the turn's session could not be stored; the next turn may start a new session", error=str(err))
            return stamp
        return recorded or ""

    def _lookup(self, key: Key) -> tuple[str, str]:
        """The stored session id and its record's stamp ("" when the store cannot tell: see `pool`)."""
        # Not in SessionStoreLike, as a store the caller owns may lack it; where there, it has this signature.
        lookup: Callable[[str, str, str], tuple[str, str]] | None = getattr(self.store, "lookup", None)
        if lookup is not None:
            return lookup(*key)
        return self.store.get(*key), ""

    def _land(self, flight: _Flight) -> None:
        """The flight is over: free its place and wake whoever may start now."""
        del self._flights[flight.turn_id]
        if flight.state == Ticket.RUNNING:
            for ticket in self._queue.release(flight):
                ticket.wake.set()
        if not self._flights and self._idle is not None:
            self._idle.set()

    def _stop(self, flight: _Flight) -> None:
        if flight.state == Ticket.WAITING:
            self._queue.withdraw(flight)
            flight.wake.set()
        flight.cancel.set()

    # ------------------------------------------------------------------ shutdown

    def stop_accepting(self) -> None:
        """Begin shutdown: from now on `submit` raises `HostClosed`; turns in flight carry on."""
        if not self._closing:
            super().stop_accepting()
            self._log.info("host shutting down", running=self._queue.running, queued=self._queue.waiting)

    def cancel_all(self) -> None:
        """Cancel every turn in flight: queued ones leave the queue, running agents get SIGINT."""
        for flight in list(self._flights.values()):
            self._stop(flight)

    async def aclose(self, grace: float | None = None) -> None:
        """Shut down: stop accepting, let turns in flight finish for `grace` seconds
        (default `shutdown_grace`), then cancel the rest. Returns once every
        submitted turn has its result. Cancelling this call cuts the grace short.
        """
        if self._closed.is_set():
            return
        self.stop_accepting()
        grace = self.shutdown_grace if grace is None else grace
        with trio.move_on_after(grace):
            await self._drained()
        if self._flights:
            self._log.warning(
                "shutdown grace over; cancelling the turns still in flight",
                grace_secs=grace,
                running=self._queue.running,
                queued=self._queue.waiting,
            )
            self.cancel_all()
        # The agents get SIGINT, then SIGKILL after their grace: this wait is bounded.
        bound = max((flight.profile.kill_grace_secs for flight in self._flights.values()), default=0.0)
        with trio.CancelScope(shield=True), trio.move_on_after(bound + DRAIN_SECS + REAP_SECS + 5.0):
            await self._drained()
        if self._flights:
            self._log.error("turns outlived the shutdown; their callbacks may be stuck", left=len(self._flights))
        if self._pool is not None:
            await self._pool.aclose()  # goodbye to every warm agent; each is reaped before this returns
        if self._opened is not None and not self._closed.is_set():
            self._opened.close()
        self._closed.set()

    async def _drained(self) -> None:
        while self._flights:
            if self._idle is None or self._idle.is_set():
                self._idle = trio.Event()
            await self._idle.wait()

    @property
    def store(self) -> SessionStoreLike:
        """The session store, once the host is open (`ProtocolMisuse` before `async with`)."""
        return self._open().store

    def _open(self) -> OpenedStore:
        if self._opened is None:
            raise ProtocolMisuse(
                "the host's session store opens when the host is entered: use `async with open_host(...) as host`"
            )
        return self._opened

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        if self._open_store is not None:
            # In a thread: opening a file may wait for another process's lock, and a database for the network.
            self._opened = await trio.to_thread.run_sync(self._open_store)
            self._open_store = None
        async with trio.open_nursery() as pool_tasks:
            self._pool = WarmPool(pool_tasks, self._log)
            try:
                yield
            finally:
                await self.aclose()  # the pool's tasks end with its agents


def _cancelled_result(profile: Profile, started: float) -> TurnResult:
    return cancelled_result(profile, max(0, round((trio.current_time() - started) * 1000)))


__all__ = [
    "DuplicateTurn",
    "Host",
    "HostClosed",
    "HostStats",
    "QueueFull",
    "SessionIdRefused",
    "SessionStoreLike",
    "open_host",
]
