"""Turns of one conversation queue across processes sharing a PostgreSQL store (docs/protocol.md §6): advisory locks.

What `bridge.host.file_turnlock` does with files next to an SQLite store, for
processes on any machines that share a database: a turn holds its
conversation's session-level advisory lock, keyed by a 64-bit hash of
(namespace, profile, conversation, session name), for as long as it runs:
the conversations of different bots (namespaces) never wait for each other. The server
drops a session's locks when its connection ends, so a process that dies —
SIGKILL, a lost machine — frees its conversations at once.

Each place has a connection of its own while it waits or holds (taken from a
few idle ones kept per `PgTurnLocks`): a session may take again a lock it
holds already, so two places on one connection would not exclude each other.

Waiting polls `pg_try_advisory_lock`, from 2 ms up to 50 ms apart like the
file queue; in trio each try is one statement in a worker thread, so no
thread waits on the server for as long as another process's turn runs.
Unlike the file queue, the waiters of several processes are not served in
arrival order: whichever asks first once the holder is done goes next.
Releasing never waits for the server in a trio run (the unlock is sent from
a worker thread), so a slow network cannot stall the host's other turns; the
next try of the same conversation in this process waits for that unlock first,
so it does not find its own process in the way.

A connection that breaks while its place holds the lock loses the lock (the
server drops it with the session): that turn runs on unprotected, and a
warning says so when it ends.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from ...errors import PostgresError, TurnLockError
from ...log import get_logger
from ..file_turnlock import POLL_FIRST_SECS, POLL_MAX_SECS, poll_until
from .db import DEFAULT_NAMESPACE, connect, first_line, require_psycopg, shown_dsn

if TYPE_CHECKING:
    from types import TracebackType

    import outcome
    import psycopg

# Idle connections kept for the next places; a host that ran more turns at once connects again for the extra ones.
MAX_IDLE = 4
# A try waits this long at most for an unlock of its conversation this process sent: one statement's round trip.
UNLOCK_WAIT_SECS = 5.0


def advisory_key(namespace: str, profile: str, conversation: str, session_name: str) -> int:
    """The conversation's advisory lock: a signed 64-bit integer, as `pg_try_advisory_lock(bigint)` takes."""
    text = json.dumps([namespace, profile, conversation, session_name])  # unambiguous whatever the strings hold
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)


class PgTurnLocks:
    """The conversations' queues of one PostgreSQL store's namespace; `join` one to get a `PgPlace`.

    One object serves a whole process (a host) or a single turn (a CLI run);
    it may be used from several threads.
    """

    def __init__(self, dsn: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        require_psycopg()
        self.dsn = dsn
        self.namespace = namespace
        self.location = shown_dsn(dsn)
        self._lock = threading.Lock()
        self._idle: list[psycopg.Connection[Any]] = []
        self._closed = False
        self._unlocking: dict[int, threading.Event] = {}  # keys whose unlock a worker thread is sending
        self._give_back(self._connect())  # now: a server out of reach stops the caller before any agent runs

    def join(self, profile: str, conversation: str, session_name: str) -> PgPlace:
        """A place in the conversation's queue; already ours when no other process holds it (one statement)."""
        place = PgPlace(self, advisory_key(self.namespace, profile, conversation, session_name))
        try:
            place._joined = not place._try()
        except BaseException:
            place.release()
            raise
        return place

    async def join_async(self, profile: str, conversation: str, session_name: str) -> PgPlace:
        """`join` with its statement in a worker thread."""
        place = PgPlace(self, advisory_key(self.namespace, profile, conversation, session_name))
        try:
            place._joined = not await trio.to_thread.run_sync(place._try)
        except BaseException:
            place.release()  # cancelled meanwhile: the place may hold the lock already
            raise
        return place

    def close(self) -> None:
        """Close the idle connections; those of places still held close when they are released. Idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for db in idle:
            db.close()

    def _take(self) -> psycopg.Connection[Any]:
        with self._lock:
            if self._closed:
                raise TurnLockError(f"the turn queues of {self.location} are closed")
            while self._idle:
                db = self._idle.pop()
                if not db.closed:
                    return db
        return self._connect()

    def _give_back(self, db: psycopg.Connection[Any]) -> None:
        with self._lock:
            if not self._closed and not db.closed and len(self._idle) < MAX_IDLE:
                self._idle.append(db)
                return
        db.close()

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return connect(self.dsn, autocommit=True)
        except PostgresError as err:
            raise TurnLockError(f"cannot queue the conversation's turns: {err}") from None


class PgPlace:
    """One turn's place in its conversation's queue: wait for it, run the turn, then `release()`.

    Used by one task or thread at a time; also a context manager that releases on exit.
    """

    def __init__(self, locks: PgTurnLocks, key: int) -> None:
        self.key = key
        self._locks = locks
        self._db: psycopg.Connection[Any] | None = None
        self._held = False
        self._joined = False  # join tried the lock and found it taken: the first try_wait need not ask again

    def try_wait(self) -> bool:
        """Without waiting: True when the place is ours. Right after `join` it does not ask the server again."""
        if self._held:
            return True
        if self._joined:
            self._joined = False
            return False
        return self._try()

    def wait(self) -> None:
        """Block until every other process's turn of the conversation is over (signals interrupt it as usual)."""
        delay = POLL_FIRST_SECS
        while not self.try_wait():
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_SECS)

    async def wait_async(self, abandon: trio.Event | None = None) -> bool:
        """`wait` without blocking the trio loop; False (still waiting) as soon as `abandon` is set."""
        self._joined = False
        return await poll_until(partial(trio.to_thread.run_sync, self._try), abandon)

    def release(self) -> None:
        """Leave the queue (the turn is over, or will not run): the next turn may start. Never raises."""
        db, held = self._db, self._held
        self._db, self._held, self._joined = None, False, False
        if db is None:
            return
        if not held:
            self._locks._give_back(db)
        elif trio.lowlevel.in_trio_run():
            sent = threading.Event()
            with self._locks._lock:
                self._locks._unlocking[self.key] = sent

            def unlock() -> None:
                try:
                    self._unlock(db)
                finally:
                    with self._locks._lock:
                        if self._locks._unlocking.get(self.key) is sent:
                            del self._locks._unlocking[self.key]
                    sent.set()

            trio.lowlevel.start_thread_soon(unlock, _ignore)
        else:
            self._unlock(db)

    def _try(self) -> bool:
        """One `pg_try_advisory_lock`; on a connection the server dropped, once more on a new one."""
        psycopg = require_psycopg()
        if self._held:
            return True
        with self._locks._lock:
            unlocking = self._locks._unlocking.get(self.key)
        if unlocking is not None:
            unlocking.wait(UNLOCK_WAIT_SECS)
        for attempt in (1, 2):
            if self._db is None:
                # Once the server dropped a connection, the idle ones are likely gone too.
                self._db = self._locks._take() if attempt == 1 else self._locks._connect()
            db = self._db
            try:
                row = db.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
            except psycopg.Error as err:
                self._db = None
                db.close()
                if attempt == 2 or not isinstance(err, psycopg.OperationalError):
                    raise TurnLockError(
                        f"cannot queue the conversation's turns in {self._locks.location}: "
                        f"{first_line(err)}; check that the server runs and accepts "
                        "connections"
                    ) from None
                continue
            self._held = bool(row and row[0])
            return self._held
        raise AssertionError("unreachable")

    def _unlock(self, db: psycopg.Connection[Any]) -> None:
        psycopg = require_psycopg()
        try:
            row = db.execute("SELECT pg_advisory_unlock(%s)", (self.key,)).fetchone()
            problem = "" if row and row[0] else "the lock was not held any more"
        except psycopg.Error as err:
            problem = first_line(err)
        if problem:
            get_logger(component="turnlock").warning(
                "the connection holding a conversation's turn lock broke while its turn ran: a turn of the "
                "conversation in another process may have run at the same time",
                server=self._locks.location,
                error=problem,
            )
            db.close()
            return
        self._locks._give_back(db)

    def __enter__(self) -> PgPlace:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()


def _ignore(result: outcome.Outcome[None]) -> None:
    """The unlock never raises; this is where `start_thread_soon` hands its outcome."""
