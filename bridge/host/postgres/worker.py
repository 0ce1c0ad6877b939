"""`agent-bridge worker`: runs turns from the PostgreSQL queue on this machine with the host runtime.

A worker claims a turn only when it has a free slot (`max_concurrent`), the
turn's conversation has no turn running anywhere, and it has the turn's
profile as the turn was queued: under that name, with the same file (the
sha256 of its bytes, which each worker advertises in `bridge_workers` and a
gateway records with each turn). A turn of a profile no live worker has as
queued waits `profile_wait_secs`, then ends with `unknown_profile` or
`profile_mismatch`. The worker runs the turn through a local `Host`
(profiles, warm agents, limits, kill escalation), streams its events to the
turn's gateway with NOTIFY (on that gateway's channel only), and writes the
result, the session (in the gateway's namespace) and the "done" notification
in one transaction. Workers serve every gateway's turns.

Its turns are leased. A renewal every third of the lease says which turns
this worker still holds; a turn it no longer holds (another worker took it
after this one was presumed lost) is stopped at once, and its result is
never written. When no renewal succeeds for a whole lease (the server is
unreachable), every agent is stopped: the others may take its turns once the
lease and the agents' kill grace have passed. SIGTERM drains: no new claims,
turns in flight finish within the shutdown grace, the rest go back to the
queue in their place.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import socket
import traceback
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from ...dialects.events import FileEvent
from ...engine.loop import HostEvent
from ...engine.result import TurnResult, cancelled_result
from ...errors import (
    AnswerRefused,
    BridgeError,
    HostClosed,
    PostgresUnavailable,
    ProfileError,
    StoreError,
    TurnError,
    UnknownProfile,
)
from ...files.outbox import remove_outbox
from ...log import Logger, get_logger
from ...permissions import Decision
from ...profile import Profile
from ..interface import HostStats, TurnObserver
from ..registry import ProfileRegistry
from ..runtime import DEFAULT_SHUTDOWN_GRACE, Host
from . import fleet_files, queue
from .db import (
    CONTROL_CHANNEL,
    MAX_NOTIFY_BYTES,
    WORK_CHANNEL,
    Database,
    Notification,
    Reconnected,
    connect,
    events_channel,
    listen,
    notify_payloads,
    require_psycopg,
)
from .json_codec import turn_from_dict
from .pg_store import PostgresSessionStore, record_session

DEFAULT_LEASE_SECS = 10.0
# A queued turn that no live worker can run (its profile missing, or another file) waits this long, then ends.
DEFAULT_PROFILE_WAIT_SECS = 30.0
POLL_SECS = 1.0  # claims are also tried this often, in case a notification was lost
PURGE_EVERY_SECS = 60.0
KEEP_DELIVERED_SECS = 3600.0  # a resent id within this long is a resend, not a new turn
# Events not yet sent, in bytes: past this, partials are dropped, and a turn whose question or activity does
# not fit any more is stopped and ends with the error events_overflow (PostgreSQL takes them too slowly), as
# is one whose question does not fit in a notification.
MAX_PENDING_EVENT_BYTES = 8 * 1024 * 1024
EVENTS_OVERFLOW = "events_overflow"


@dataclass(slots=True)
class _Held:
    """A turn this worker runs."""

    claimed: queue.ClaimedTurn
    lost: bool = False  # another worker may have it now: its result must not be written
    handed_back: bool = False  # draining: it goes back to the queue instead of getting a result
    overflowed: str = ""  # why an event of its could not be sent: it was stopped and ends with events_overflow


def local_conversation(namespace: str, conversation: str) -> str:
    """The conversation key the worker's own host uses: the bot's namespace is part of it, so two bots'
    conversations of the same key never share a warm agent, a place in line or a session."""
    return json.dumps([namespace, conversation], ensure_ascii=False)


def split_local_conversation(key: str) -> tuple[str, str]:
    """(namespace, conversation) of a `local_conversation` key."""
    namespace, conversation = json.loads(key)
    return namespace, conversation


class _ClaimedSessions:
    """The session store as the worker's host sees it: reads from PostgreSQL, writes nothing.

    The worker writes a turn's session in the transaction that writes its
    result (`queue.finish`); `record` only returns the stamp that transaction
    will write, so the warm pool knows its agent saw the latest turn. The
    host's conversation keys are `local_conversation`s: each turn's session
    is read in its bot's namespace.
    """

    def __init__(self, dsn: str) -> None:
        self._store = PostgresSessionStore(dsn)
        self.stamps: dict[tuple[str, str, str], str] = {}

    def lookup(self, profile: str, conversation: str, session_name: str = "default") -> tuple[str, str]:
        namespace, key = split_local_conversation(conversation)
        try:
            return self._store.lookup_in(namespace, profile, key, session_name)
        except StoreError as err:
            raise PostgresUnavailable(str(err)) from None  # the turn goes back to the queue

    def get(self, profile: str, conversation: str, session_name: str = "default") -> str:
        return self.lookup(profile, conversation, session_name)[0]

    def record(self, profile: str, conversation: str, session_name: str, result: TurnResult) -> str:
        return self.stamps.get((profile, conversation, session_name), "")

    def close(self) -> None:
        self._store.close()


class _Publisher:
    """Events of the running turns, sent to their gateways in order, many per statement.

    What waits to be sent is bounded by `MAX_PENDING_EVENT_BYTES`: a partial
    past it is dropped (the result carries the whole reply), and any other
    event past it (a question, activity: never silently lost), or too large
    for a notification, makes `overflowed(key, why)` stop its turn, which
    then ends with an error.
    """

    def __init__(self, db: Database, log: Logger, overflowed: Callable[[str, str], None]) -> None:
        self._db = db
        self._log = log
        self._overflowed = overflowed
        self._pending: deque[tuple[str, str]] = deque()  # (channel, payload)
        self._pending_bytes = 0  # of the payloads queued or being sent
        self._wake = trio.Event()
        self._queued = itertools.count(1)
        self._last_queued = 0
        self._sent = 0
        self._sent_changed = trio.Event()
        self.dropped = 0

    def publish(self, gateway: str, key: str, attempt: int, record: dict[str, Any]) -> None:
        kind = record.get("event")
        # A partial's or an activity's text may travel in pieces (an activity's is a piece of the agent's anyway).
        text_field = "text" if kind in ("partial", "activity") and record.get("text") else None
        payloads = notify_payloads({"t": key, "a": attempt, "n": 0, **record}, text_field)
        sizes = [len(payload.encode()) for payload in payloads]
        if max(sizes) > MAX_NOTIFY_BYTES:
            self._overflowed(
                key,
                f"one of its events ({kind}) is larger than a PostgreSQL notification carries "
                f"({MAX_NOTIFY_BYTES} bytes)",
            )
            return
        if self._pending_bytes + sum(sizes) > MAX_PENDING_EVENT_BYTES:
            if kind == "partial":
                self.dropped += 1
            else:
                self._overflowed(key, f"more than {MAX_PENDING_EVENT_BYTES} bytes of events waited for PostgreSQL")
            return
        channel = events_channel(gateway)
        for payload in payloads:
            # PostgreSQL delivers identical notifications of one transaction once: a number makes each unique.
            self._last_queued = next(self._queued)
            self._pending.append((channel, payload.replace('"n":0,', f'"n":{self._last_queued},', 1)))
        self._pending_bytes += sum(sizes)
        self._wake.set()

    async def flushed(self) -> None:
        """Returns once everything published before the call was sent (or could not be)."""
        target = self._last_queued
        while self._sent < target:
            await self._sent_changed.wait()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._pending:
                batch = list(self._pending)
                self._pending.clear()
                channels = [channel for channel, _ in batch]
                payloads = [payload for _, payload in batch]
                try:
                    await self._db.run_retrying(
                        atomic=False,
                        operation=functools.partial(_notify_all, channels=channels, payloads=payloads),
                        log=self._log,
                        what="streaming events",
                    )
                except Exception as err:  # never let events stop the worker
                    self._log.warning("events could not be sent to the gateways", error=str(err), lost=len(batch))
                self._pending_bytes -= sum(len(payload.encode()) for payload in payloads)
                self._sent += len(batch)
                if self.dropped:
                    self._log.warning(
                        "partials were dropped: PostgreSQL took them slower than the agents wrote them",
                        dropped=self.dropped,
                    )
                    self.dropped = 0
                self._sent_changed.set()
                self._sent_changed = trio.Event()


class Worker:
    """One worker process's engine; `await Worker(...).run()` until `drain()` (SIGTERM) completes."""

    def __init__(
        self,
        dsn: str,
        profiles: str | os.PathLike[str],
        *,
        max_concurrent: int = 32,
        lease_secs: float = DEFAULT_LEASE_SECS,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        name: str | None = None,
        profile_wait_secs: float = DEFAULT_PROFILE_WAIT_SECS,
        attachment_hosts: tuple[str, ...] = (),
        observer: TurnObserver | None = None,
    ) -> None:
        if not lease_secs > 0:
            raise ValueError("lease_secs must be more than 0")
        if not profile_wait_secs >= 0:
            raise ValueError("profile_wait_secs must be 0 or more")
        self.dsn = dsn
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.max_concurrent = max_concurrent
        self.lease_secs = lease_secs
        self.shutdown_grace = shutdown_grace
        self.profile_wait_secs = profile_wait_secs
        self.attachment_hosts = attachment_hosts  # exceptions to the attachments' address rule (the turns fetch here)
        self.observer = observer  # told of each turn this worker runs (metrics), when set
        self.registry = ProfileRegistry(profiles)
        self._advertised: dict[str, str] = {}  # the profiles' hashes bridge_workers has of this worker
        self._skips_logged: set[tuple[str, str, str]] = set()  # (profile, queued hash, this worker's hash)
        self._broken_logged: set[str] = set()  # the problems of the profile files that do not load
        self._db = Database(dsn, size=8)
        self._sessions = _ClaimedSessions(dsn)
        self._held: dict[str, _Held] = {}
        self._slots = trio.Semaphore(max_concurrent)
        self._work = trio.Event()  # set by a notification: there may be a turn to claim
        self._cancels_seen = True  # a turn was cancelled: queued ones are ended before the next claim
        self._drain_requested = trio.Event()
        self._grace = trio.CancelScope()  # the shutdown grace, once draining
        self._last_renewal = 0.0
        self._renewed = trio.Event()
        self._log = get_logger(component="worker", worker=self.id)
        self._publisher = _Publisher(self._db, self._log, self._events_overflowed)
        self._host: Host | None = None
        self._idle = trio.Event()  # set whenever no turn is held
        self._idle.set()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self._db.check)
        presence = await trio.to_thread.run_sync(lambda: connect(self.dsn, autocommit=True))
        try:
            await trio.to_thread.run_sync(self._register, presence, self._profile_digests())
            self._last_renewal = trio.current_time()
            host = Host(
                self.registry,
                self._sessions,
                max_concurrent=self.max_concurrent,
                max_queued=self.max_concurrent,
                shutdown_grace=self.shutdown_grace,
                attachment_hosts=self.attachment_hosts,
            )
            host.observer = self.observer
            self._host = host
            async with host, trio.open_nursery() as nursery:
                await nursery.start(
                    partial(listen, self.dsn, (WORK_CHANNEL, CONTROL_CHANNEL), self._notified, log=self._log)
                )
                nursery.start_soon(self._publisher.run)
                nursery.start_soon(self._keep_leases, presence)
                nursery.start_soon(self._watch_lease)
                nursery.start_soon(self._reap)
                async with trio.open_nursery() as turns:
                    task_status.started()
                    self._log.info("worker ready", max_concurrent=self.max_concurrent, lease_secs=self.lease_secs)
                    await self._claim_until_drained(turns)
                    await self._drain(turns)
                await self._publisher.flushed()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await trio.to_thread.run_sync(lambda: queue.unregister(presence, worker=self.id))
                except Exception as err:
                    self._log.warning("could not unregister; the others will find this worker gone", error=str(err))
                presence.close()
                self._sessions.close()
                self._db.close()

    @property
    def closing(self) -> bool:
        """True until the worker runs, and once it drains: it claims no turns then."""
        return self._host is None or self._drain_requested.is_set()

    async def current_stats(self) -> HostStats:
        """The stats of the turns this worker runs, and `fleet_queued`: the turns waiting in the queue for any
        worker, read from PostgreSQL (`PostgresError` when it cannot be). `HostClosed` before the worker runs."""
        host = self._host
        if host is None:
            raise HostClosed("the worker is not running yet")
        fleet_queued = await self._db.run(queue.queued_count, atomic=False)
        return dataclasses.replace(host.stats(), fleet_queued=fleet_queued)

    def drain(self) -> None:
        """Stop claiming; turns in flight finish within the shutdown grace, then go back to the queue.
        Called again: the grace is over now."""
        if self._drain_requested.is_set():
            self._grace.cancel()
        self._drain_requested.set()

    # ------------------------------------------------------------------ claiming

    async def _claim_until_drained(self, turns: trio.Nursery) -> None:
        psycopg = require_psycopg()
        async with trio.open_nursery() as waiting:
            waiting.start_soon(self._stop_claiming_on_drain, waiting.cancel_scope)
            while True:
                await self._slots.acquire()
                claimed = None
                try:
                    while claimed is None:
                        self._work = trio.Event()
                        # The registry is not thread-safe: the statements get a snapshot of its immutable profiles.
                        profiles = self.registry.loaded()
                        digests = self.registry.digests()
                        settings = {
                            name: (profile.kill_grace_secs, profile.on_worker_lost, digests[name])
                            for name, profile in profiles.items()
                        }
                        try:
                            if self._cancels_seen:
                                self._cancels_seen = False
                                await self._db.run(partial(_end_cancelled, profiles))
                            claimed = await self._db.run(
                                partial(queue.claim, worker=self.id, lease_secs=self.lease_secs, settings=settings),
                                atomic=False,
                            )
                        except psycopg.IntegrityError:
                            continue  # another worker's claim raced this one to the conversation: look again
                        except PostgresUnavailable as err:
                            self._log.warning("cannot claim turns: PostgreSQL unavailable", error=str(err))
                        except psycopg.Error as err:  # refused, not unreachable: say so, and try again later
                            self._log.error("claiming a turn failed", error=repr(err))
                        if claimed is None:
                            with trio.move_on_after(POLL_SECS):
                                await self._work.wait()
                except BaseException:
                    self._slots.release()
                    raise
                held = self._held[claimed.key] = _Held(claimed)
                if self._idle.is_set():
                    self._idle = trio.Event()
                turns.start_soon(self._run_claimed, held)

    async def _stop_claiming_on_drain(self, scope: trio.CancelScope) -> None:
        await self._drain_requested.wait()
        scope.cancel()

    # ------------------------------------------------------------------ one turn

    async def _run_claimed(self, held: _Held) -> None:
        claimed = held.claimed
        log = self._log.bind(
            turn_id=claimed.key,
            gateway=claimed.gateway,
            profile=claimed.profile,
            conversation=claimed.conversation,
            attempt=claimed.attempt,
        )
        ran: TurnResult | None = None  # the agent's result: its outbox is removed once the result was written
        try:
            try:
                result, error = await self._outcome(held, log)
                ran = result
            except Exception as err:  # a bug must not take the worker and every other turn down with it
                log.error("unexpected error running a turn", error=repr(err), traceback=traceback.format_exc())
                result, error = None, {"code": "internal_error", "message": f"internal error: {err}"}
            if held.overflowed and not held.handed_back:
                result, error = (
                    None,
                    {
                        "code": EVENTS_OVERFLOW,
                        "message": (
                            f"the turn was stopped, as its questions and activity could not be sent to its gateway: "
                            f"{held.overflowed}"
                        ),
                    },
                )
            await self._publisher.flushed()  # the gateways see every event before the result
            try:
                await self._record(held, result, error, log)
            except Exception as err:  # left to its lease: the reaper ends or retries it
                log.error("the turn's result could not be written", error=repr(err), traceback=traceback.format_exc())
        finally:
            if ran is not None:  # its files' bytes are in the database now, or never will be
                for outbox in {os.path.dirname(file.path) for file in ran.files}:
                    remove_outbox(outbox)
            # A turn handed back may be claimed again by this worker before this attempt is over here.
            if self._held.get(claimed.key) is held:
                del self._held[claimed.key]
            if not self._held:
                self._idle.set()
            stamp_key = (claimed.profile, _local(claimed), claimed.session_name)
            if self._sessions.stamps.get(stamp_key) == claimed.stamp:
                del self._sessions.stamps[stamp_key]
            self._slots.release()

    async def _outcome(self, held: _Held, log: Logger) -> tuple[TurnResult | None, dict[str, Any] | None]:
        assert self._host is not None
        claimed = held.claimed
        try:
            self._host.profile(claimed.profile)
        except ProfileError as err:
            return None, _profile_refusal(claimed.profile, err, log)
        try:
            turn = turn_from_dict(claimed.turn)
        except (TurnError, KeyError, TypeError) as err:
            return None, {"code": "invalid_request", "message": f"the queued turn cannot be read: {err}"}
        conversation = _local(claimed)
        self._sessions.stamps[(claimed.profile, conversation, claimed.session_name)] = claimed.stamp
        gateway, key, attempt = claimed.gateway, claimed.key, claimed.attempt

        def forward(event: HostEvent) -> None:
            # A file's path is on this machine: its bytes travel with the result, and the gateway says where it is.
            if not isinstance(event, TurnResult | FileEvent):
                self._publisher.publish(gateway, key, attempt, event.to_dict())

        nobody_answers = None if claimed.turn.get("answered", True) else _deny
        try:
            result = await self._host.submit(
                claimed.profile, conversation, turn, on_event=forward, on_permission=nobody_answers, turn_id=key
            )
        except PostgresUnavailable as err:
            # The stored session could not be read, so the agent did not start: the turn goes back to the queue.
            log.warning("the turn could not start: PostgreSQL unavailable; handing it back", error=str(err))
            held.handed_back = True
            return None, None
        except ProfileError as err:  # its file changed since the look above
            return None, _profile_refusal(claimed.profile, err, log)
        except BridgeError as err:
            log.error("the turn could not run", error=str(err))
            return None, {"code": "store_error", "message": str(err)}
        return result, None

    async def _record(self, held: _Held, result: TurnResult | None, error: dict[str, Any] | None, log: Logger) -> None:
        claimed = held.claimed
        stamp = claimed.stamp

        def write(conn: Any) -> bool:
            if held.handed_back:
                return queue.hand_back(conn, key=claimed.key, attempt=claimed.attempt, worker=self.id)
            return queue.finish(
                conn,
                key=claimed.key,
                attempt=claimed.attempt,
                worker=self.id,
                result=result,
                error=error,
                record_session=functools.partial(record_session, stamp=stamp),
                store_files=fleet_files.store,
            )

        while not held.lost:
            try:
                written = await self._db.run(write)
            except PostgresUnavailable as err:
                log.warning("cannot write the turn's result yet: PostgreSQL unavailable", error=str(err))
                await trio.sleep(min(1.0, self.lease_secs / 4))
                continue
            if not written:
                log.warning("the turn's result was not written: another worker holds the turn now")
            elif held.handed_back:
                log.info("turn handed back to the queue")
            return
        log.warning("the turn's result was dropped: this worker lost its lease")

    # ------------------------------------------------------------------ leases, the lost, notifications

    async def _keep_leases(self, presence: Any) -> None:
        """Renew every third of the lease; stop what this worker no longer holds, or everything once the lease
        lapsed without a renewal."""
        psycopg = require_psycopg()
        interval = self.lease_secs / 3
        while True:
            sent = trio.current_time()
            # A turn claimed while the renewal is under way is missing from its answer, yet this worker's: only
            # turns held before it was sent are judged by it. A turn given up on is not renewed: it must lapse.
            judged = [(key, held) for key, held in self._held.items() if not held.lost]
            running = [key for key, _ in judged]
            try:
                holding = await trio.to_thread.run_sync(
                    functools.partial(
                        queue.renew, presence, worker=self.id, lease_secs=self.lease_secs, running=running
                    )
                )
            except (psycopg.OperationalError, PostgresUnavailable) as err:
                self._log.warning("cannot renew the leases: PostgreSQL unavailable", error=str(err).strip())
                presence = await self._reconnect(presence)
                holding = None
            if holding is not None:
                self._last_renewal = sent
                self._renewed.set()
                for key, held in judged:
                    if self._held.get(key) is not held:
                        continue  # finished meanwhile
                    mine = holding.get(key)
                    if mine is None or mine[0] != held.claimed.attempt:
                        self._lose(held, "another worker took the turn")
                    elif mine[1]:
                        assert self._host is not None  # run made it before starting this task
                        self._host.cancel(key)
            await trio.sleep(interval)

    async def _watch_lease(self) -> None:
        """Stop every agent once a whole lease passed without a renewal, even while a renewal hangs."""
        while True:
            self._renewed = trio.Event()
            with trio.move_on_at(self._last_renewal + self.lease_secs):
                await self._renewed.wait()
                continue
            for held in list(self._held.values()):
                self._lose(held, "the lease lapsed: PostgreSQL could not be reached")
            await self._renewed.wait()

    async def _reconnect(self, presence: Any) -> Any:
        psycopg = require_psycopg()
        presence.close()
        try:
            fresh = await trio.to_thread.run_sync(lambda: connect(self.dsn, autocommit=True))
        except BridgeError:
            return presence  # closed: the next renewal fails fast and tries again
        try:
            await trio.to_thread.run_sync(self._register, fresh, self._profile_digests())
        except psycopg.Error:
            fresh.close()
            return presence
        return fresh

    def _register(self, presence: Any, digests: dict[str, str]) -> None:
        queue.register(
            presence,
            worker=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            max_concurrent=self.max_concurrent,
            profiles=digests,
        )
        self._advertised = digests

    def _profile_digests(self) -> dict[str, str]:
        """{name: sha256 of its file} of the profiles that load now (the registry re-reads edited files)."""
        self.registry.refresh()
        return self.registry.digests()

    def _say_broken(self) -> None:
        """Log each profile file that does not load, once while it stays so: the client whose turn asked for it
        reads that this log says why."""
        problems = {str(error) for error in self.registry.broken()}
        for problem in sorted(problems - self._broken_logged):
            self._log.warning(
                "a profile does not load; this worker leaves its turns to others until it is fixed", problem=problem
            )
        self._broken_logged = problems

    def _say_skipped(self, mismatched: list[tuple[str, str]], digests: dict[str, str]) -> None:
        """Log once per (profile, queued file, own file) that this worker leaves such turns to others."""
        for profile, wanted in mismatched:
            mine = digests.get(profile, "")
            if (profile, wanted, mine) in self._skips_logged:
                continue
            self._skips_logged.add((profile, wanted, mine))
            shown = queue.SHOWN_HASH_CHARS
            self._log.warning(
                "skipping queued turns of a profile: they were queued for another file of it than this worker "
                f"has; they wait for a worker with that file, or end after {self.profile_wait_secs:g} s",
                profile=profile,
                queued_sha256=wanted[:shown],
                this_worker_sha256=mine[:shown],
                profiles=str(self.registry.directory),
            )

    def _events_overflowed(self, key: str, why: str) -> None:
        held = self._held.get(key)
        if held is None or held.overflowed or self._host is None:
            return
        held.overflowed = why
        self._log.error(
            "a turn's question or activity cannot be sent to its gateway; stopping the turn", turn_id=key, why=why
        )
        self._host.cancel(key)

    def _lose(self, held: _Held, why: str) -> None:
        if held.lost:
            return
        held.lost = True
        self._log.warning("stopping a turn this worker no longer holds", turn_id=held.claimed.key, why=why)
        assert self._host is not None  # a turn is held only while run's host is
        self._host.cancel(held.claimed.key)

    async def _reap(self) -> None:
        last_purge = trio.current_time()
        while True:
            try:
                profiles = self.registry.loaded()
                digests = self.registry.digests()
                self._say_broken()
                changed = digests != self._advertised
                round_ = await self._db.run(
                    partial(_reaper_round, profiles, digests, changed, self.profile_wait_secs, self.id)
                )
                if changed:
                    self._advertised = digests
                if round_.taken_back:
                    self._log.warning("turns of a lost worker were taken back", turns=len(round_.taken_back))
                    self._work.set()
                if round_.unrunnable:
                    self._log.warning(
                        "turns no live worker could run ended after the profile wait",
                        turns=len(round_.unrunnable),
                        wait_secs=self.profile_wait_secs,
                    )
                self._say_skipped(round_.mismatched, digests)
                if trio.current_time() - last_purge > PURGE_EVERY_SECS:
                    await self._db.run(lambda conn: queue.purge(conn, keep_secs=KEEP_DELIVERED_SECS))
                    last_purge = trio.current_time()
            except PostgresUnavailable:
                pass  # the lease keeper says so already
            except Exception as err:  # a bug here must not stop this worker's turns: the others reap too
                self._log.error("reaping lost workers failed", error=repr(err), traceback=traceback.format_exc())
            await trio.sleep(max(0.2, self.lease_secs / 4))

    def _notified(self, note: Notification | Reconnected) -> None:
        if isinstance(note, Reconnected):
            self._db.drop_idle()  # the server went away: the pooled connections are most likely dead too
        if isinstance(note, Reconnected) or note.channel == WORK_CHANNEL:
            self._work.set()
            return
        try:
            order = json.loads(note.payload)
        except ValueError:
            return
        if "cancel" in order:
            self._cancels_seen = True
            self._work.set()
        key = order.get("cancel") or order.get("decide") or order.get("answer")
        if not isinstance(key, str) or key not in self._held or self._host is None:
            return
        if "cancel" in order:
            self._host.cancel(key)
        elif "answer" in order:
            try:
                answered = self._host.answer(key, str(order.get("request_id")), order.get("answers"))
            except AnswerRefused:  # the gateway checked it against the question: a newer gateway's, say
                answered = False
            if not answered:
                self._answer_failed(key, order.get("request_id"))
        else:
            decision = Decision(
                allow=bool(order.get("allow")),
                always=bool(order.get("always")),
                message=str(order.get("message") or ""),
            )
            if not self._host.decide(key, str(order.get("request_id")), decision):
                self._answer_failed(key, order.get("request_id"))

    def _answer_failed(self, key: str, request_id: Any) -> None:
        """The gateway's answer reached no open question (answered already, timed out, its turn over): say so, so
        the gateway stops offering it."""
        claimed = self._held[key].claimed
        self._publisher.publish(
            claimed.gateway, key, claimed.attempt, {"event": "decide_failed", "request_id": request_id}
        )

    # ------------------------------------------------------------------ draining

    async def _drain(self, turns: trio.Nursery) -> None:
        self._log.info(
            "draining: no new turns; finishing those in flight", running=len(self._held), grace_secs=self.shutdown_grace
        )
        try:
            await self._db.run(lambda conn: queue.set_draining(conn, worker=self.id))
        except PostgresUnavailable:
            pass
        with self._grace:
            self._grace.deadline = trio.current_time() + self.shutdown_grace
            await self._idle.wait()
        assert self._host is not None  # run made it before draining
        for held in list(self._held.values()):
            held.handed_back = True
            self._host.cancel(held.claimed.key)
        if self._held:
            self._log.warning(
                "shutdown grace over; handing the turns still running back to the queue", turns=len(self._held)
            )


def _deny(request: Any) -> Decision:
    return Decision(allow=False, message="nobody is there to answer")


def _profile_refusal(name: str, err: ProfileError, log: Logger) -> dict[str, Any]:
    """The error a turn gets whose profile this worker cannot run; the gateway words it for a network client."""
    if isinstance(err, UnknownProfile):
        return {"code": "unknown_profile", "message": str(err)}
    said = f"profile {name!r} does not load: {err}"
    log.warning("the turn's profile does not load", error=said)
    return {"code": "profile_invalid", "message": said}


@dataclass(frozen=True, slots=True)
class _ReaperRound:
    taken_back: list[str]  # keys of lost workers' turns
    unrunnable: list[str]  # keys of turns ended as no live worker could run them
    mismatched: list[tuple[str, str]]  # (profile, hash) of queued turns this worker skips for its other file


def _reaper_round(
    profiles: dict[str, Profile], digests: dict[str, str], advertise: bool, wait_secs: float, worker: str, conn: Any
) -> _ReaperRound:
    """The reaper's round, one transaction: this worker's profiles' hashes advertised (when they changed),
    lost workers' turns taken back, queued turns that were cancelled ended even while every slot of this
    worker is taken, turns no live worker could run for `wait_secs` ended, and the turns this worker skips for
    having another file of their profile found."""
    if advertise:
        queue.advertise(conn, worker=worker, profiles=digests)
    taken_back = queue.reap(conn)
    _end_cancelled(profiles, conn)
    unrunnable = queue.end_unrunnable(conn, wait_secs=wait_secs)
    mismatched = queue.mismatched(conn, profiles=digests) if digests else []
    return _ReaperRound(taken_back, unrunnable, mismatched)


def _local(claimed: queue.ClaimedTurn) -> str:
    return local_conversation(claimed.gateway, claimed.conversation)


def _end_cancelled(profiles: dict[str, Profile], conn: Any) -> None:
    """End every queued turn that was cancelled (they never run), whatever runs in their conversations."""
    while queue.end_cancelled(conn, ending_of=partial(_cancelled_ending, profiles)):
        pass


def _notify_all(conn: Any, *, channels: list[str], payloads: list[str]) -> None:
    """Send each payload to its channel, in order, in one statement."""
    conn.execute(
        "SELECT pg_notify(c, p) FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS x(c, p, n) ORDER BY n",
        (channels, payloads),
    ).fetchall()


def _cancelled_ending(profiles: dict[str, Profile], name: str) -> tuple[TurnResult | None, dict[str, Any] | None]:
    """The end of a turn cancelled while queued: the 130 result its profile gives, as a host's would."""
    profile = profiles.get(name)
    if profile is None:
        return None, {"code": "unknown_profile", "message": f"no profile named {name!r} loads on this worker"}
    return cancelled_result(profile), None


def run_worker(
    dsn: str,
    profiles: str | os.PathLike[str],
    *,
    beside: Callable[..., Awaitable[Any]] | None = None,
    **options: Any,
) -> int:
    """`agent-bridge worker`: returns the exit code (0 after a drain). `beside(worker, task_status=)` is started
    before the worker (its metrics' server: a port that cannot be had refuses the worker) and runs as long as it."""
    import signal

    from ...confinement.orphans import become_subreaper, log_containment, sweep_orphans_on_sigchld

    become_subreaper()
    worker = Worker(dsn, profiles, **options)
    log_containment(worker._log)

    async def main() -> int:
        async with trio.open_nursery() as nursery:
            await nursery.start(sweep_orphans_on_sigchld)

            async def on_signals(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    task_status.started()
                    async for signum in signals:
                        worker._log.info("signal received; draining", signal=signal.Signals(signum).name)
                        worker.drain()

            await nursery.start(on_signals)
            if beside is not None:
                await nursery.start(beside, worker)
            await worker.run()
            nursery.cancel_scope.cancel()
        return 0

    from ...engine.run import ungrouped

    with ungrouped():  # a BridgeError (PostgreSQL unreachable at start…) reaches the CLI as itself
        return trio.run(main)
