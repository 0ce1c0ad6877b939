"""The session store in PostgreSQL: `SessionStore`'s interface and rules, shared by every machine that can reach it.

The same keys and the same rules as the SQLite store (docs/protocol.md §6): an empty new
session id keeps the stored one; `record` returns a stamp that `lookup` reads
back until the next record. The rows live in `bridge_sessions` (`db.SCHEMA`),
next to the turn queue's tables, so a queue worker can record a turn's
session in the transaction that writes its result (`record_session`).

Every key also has a namespace, the bot's: two bots using the same profile
names and conversation keys on one database share nothing. A store sees its
own namespace only; a gateway's is its name (`db.DEFAULT_NAMESPACE` says why
both default to "serve").

- reads and writes use two connections, each behind its own lock, as the
  SQLite store does: a `get` never queues behind a `record` that waits for a
  row another transaction holds;
- every operation is one statement in autocommit: nothing is held between calls;
- a connection the server dropped (a restart, a failover, an idle timeout) is
  replaced and the statement run again, once. Every operation is idempotent:
  a record runs again with the same stamp.

`last_used` is the server's clock, so sessions recorded from several machines
sort in the order they were recorded. Every failure is a `StoreError` that
names the server (never the password) and says what to do.
"""

from __future__ import annotations

import builtins
import secrets
import threading
from collections.abc import Callable
from datetime import UTC
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ...engine.result import TurnResult
from ...errors import PostgresError, StoreError
from ...turn import text_problem
from ..sqlite_store import SessionRecord, now_iso, session_key
from .db import DEFAULT_NAMESPACE, connect, first_line, require_psycopg, shown_dsn

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")
_TABLE = "bridge_sessions"
_COLUMNS = "profile, conversation, session_name, session_id, last_used, last_outcome, last_exit_code"
# An empty new id keeps the stored one (docs/protocol.md §6); everything else is the latest turn's.
_RECORD = f"""
INSERT INTO {_TABLE} AS stored (namespace, profile, conversation, session_name, session_id, last_used,
                                last_outcome, last_exit_code, stamp)
VALUES (%s, %s, %s, %s, %s, clock_timestamp(), %s, %s, %s)
ON CONFLICT (namespace, profile, conversation, session_name) DO UPDATE SET
    session_id = CASE WHEN excluded.session_id <> '' THEN excluded.session_id ELSE stored.session_id END,
    last_used = excluded.last_used,
    last_outcome = excluded.last_outcome,
    last_exit_code = excluded.last_exit_code,
    stamp = excluded.stamp
"""
_WHERE_KEY = "WHERE namespace = %s AND profile = %s AND conversation = %s AND session_name = %s"
# Ties sort by bytes, as SQLite sorts them, whatever the database's collation.
_ORDER = 'ORDER BY last_used DESC, profile COLLATE "C", conversation COLLATE "C", session_name COLLATE "C"'


def new_stamp() -> str:
    """A record's stamp: its time (ISO 8601, UTC, microseconds) and a random suffix, so two machines recording
    in the same microsecond still leave different stamps."""
    return f"{now_iso()}~{secrets.token_hex(4)}"


def record_session(
    conn: psycopg.Connection[Any],
    namespace: str,
    profile: str,
    conversation: str,
    session_name: str,
    result: TurnResult,
    stamp: str,
) -> None:
    """Remember how a turn ended, on `conn` and inside its caller's transaction (a queue worker writes a turn's
    result and its session together); a turn without a valid session line keeps the stored id. `stamp` is what
    `lookup` returns until the next record (`new_stamp()`)."""
    conn.execute(
        _RECORD,
        (
            *session_key(namespace, profile, conversation, session_name),
            result.session_id,
            str(result.outcome),
            int(result.exit_code),
            stamp,
        ),
    )


def stored_session(
    conn: psycopg.Connection[Any], namespace: str, profile: str, conversation: str, session_name: str
) -> tuple[str, str]:
    """The session id stored for the conversation and its record's stamp, on `conn`; `("", "")` when none."""
    row = conn.execute(
        f"SELECT session_id, stamp FROM {_TABLE} {_WHERE_KEY}",
        session_key(namespace, profile, conversation, session_name),
    ).fetchone()
    return (row[0], row[1]) if row else ("", "")


def check_namespace(namespace: object) -> str:
    """`namespace` if it can name a bot's sessions; else a `StoreError` saying what it must be."""
    if not isinstance(namespace, str) or not namespace or text_problem(namespace):
        raise StoreError(f"a session namespace must be a non-empty string of text (a bot's name), not {namespace!r}")
    return namespace


class PostgresSessionStore:
    """The session store in a PostgreSQL database. Methods are synchronous (each is one statement).

    It reads and writes the sessions of `namespace` only (a bot's name: see
    the module's docstring); `lookup_in` reads another's, for queue workers,
    which serve every bot.

    One object may be shared by several threads (a trio host calls it through
    `trio.to_thread.run_sync`): it holds a connection for reads and one for
    writes, each behind its own lock. Any number of processes, on any number
    of machines, may use the same database at once.

        with PostgresSessionStore("postgresql://bot@db.internal/bridge") as store:
            turn = Turn(message, session_id=store.get("stream", "chat-42"))
            store.record("stream", "chat-42", "default", await run_turn(profile, turn))
    """

    def __init__(self, dsn: str, *, namespace: str = DEFAULT_NAMESPACE) -> None:
        require_psycopg()
        self.dsn = dsn
        self.namespace = check_namespace(namespace)
        self.location = shown_dsn(dsn)  # the server and database, without the password
        # Both connect now: a bad DSN or a server out of reach stops the caller before any agent runs.
        self._writer = _Connection(dsn, self.location)
        try:
            self._reader = _Connection(dsn, self.location)
        except BaseException:
            self._writer.close()
            raise

    # ------------------------------------------------------------------ public

    def get(self, profile: str, conversation: str, session_name: str = "default") -> str:
        """The stored session id, `""` when there is none (the next turn starts a new session)."""
        return self.lookup(profile, conversation, session_name)[0]

    def lookup(self, profile: str, conversation: str, session_name: str = "default") -> tuple[str, str]:
        """The stored session id and the stamp of its last record (`record` returns it); `("", "")` when none.

        A changed stamp says another turn of the conversation was recorded
        since: the host's warm agent for it missed that turn and is not reused.
        """
        return self.lookup_in(self.namespace, profile, conversation, session_name)

    def lookup_in(
        self, namespace: str, profile: str, conversation: str, session_name: str = "default"
    ) -> tuple[str, str]:
        """`lookup` in another namespace (a queue worker reads the session of each turn's bot)."""
        return self._reader.run(lambda db: stored_session(db, namespace, profile, conversation, session_name))

    def record(self, profile: str, conversation: str, session_name: str, result: TurnResult) -> str:
        """Remember how a turn ended; a turn without a valid session line keeps the stored id. Returns the
        record's stamp (as `lookup` reads it)."""
        stamp = new_stamp()
        self._writer.run(
            lambda db: record_session(db, self.namespace, profile, conversation, session_name, result, stamp)
        )
        return stamp

    def forget(self, profile: str, conversation: str, session_name: str | None = None) -> int:
        """Drop a stored session (every session name of the conversation when None); rows removed."""
        if session_name is None:
            sql = f"DELETE FROM {_TABLE} WHERE namespace = %s AND profile = %s AND conversation = %s"
            params: tuple[str, ...] = session_key(self.namespace, profile, conversation)
        else:
            sql = f"DELETE FROM {_TABLE} {_WHERE_KEY}"
            params = session_key(self.namespace, profile, conversation, session_name)
        return self._writer.run(lambda db: db.execute(sql, params).rowcount)

    def list(self, profile: str | None = None, conversation: str | None = None) -> builtins.list[SessionRecord]:
        """Stored sessions, most recently used first; only `profile`'s (and `conversation`'s) when given."""
        filters = {"namespace": self.namespace, "profile": profile, "conversation": conversation}
        used = [(column, value) for column, value in filters.items() if value is not None]
        where = ("WHERE " + " AND ".join(f"{column} = %s" for column, _ in used)) if used else ""
        params = tuple(value for _, value in used)
        session_key(*(value for value in params if value))  # an empty filter matches nothing; odd text is refused
        rows = self._reader.run(
            lambda db: db.execute(f"SELECT {_COLUMNS} FROM {_TABLE} {where} {_ORDER}", params).fetchall()
        )
        return [
            SessionRecord(
                profile,
                conversation,
                session_name,
                session_id,
                last_used.astimezone(UTC),
                outcome,
                int(exit_code),
            )
            for profile, conversation, session_name, session_id, last_used, outcome, exit_code in rows
        ]

    def close(self) -> None:
        """Close both connections; a statement under way finishes first. Idempotent."""
        self._reader.close()
        self._writer.close()

    def __enter__(self) -> PostgresSessionStore:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.namespace == DEFAULT_NAMESPACE:
            return f"PostgresSessionStore({self.location!r})"
        return f"PostgresSessionStore({self.location!r}, namespace={self.namespace!r})"


class _Connection:
    """One connection, used by one thread at a time (`run` and `close` take its lock); replaced when it breaks."""

    def __init__(self, dsn: str, location: str) -> None:
        self._dsn = dsn
        self._location = location
        self._lock = threading.Lock()
        self._closed = False
        self._db: psycopg.Connection[Any] | None = self._connect()

    def run(self, operation: Callable[[psycopg.Connection[Any]], T]) -> T:
        """`operation(db)` in autocommit; once more on a new connection when the server dropped this one."""
        psycopg = require_psycopg()
        with self._lock:
            if self._closed:
                raise StoreError(f"session store {self._location} is closed")
            for attempt in (1, 2):
                if self._db is None or self._db.closed:
                    self._db = self._connect()
                db = self._db
                try:
                    return operation(db)
                except psycopg.OperationalError as err:
                    if db.broken or db.closed:
                        db.close()
                        self._db = None
                    if attempt == 2:
                        raise StoreError(
                            f"session store {self._location}: {first_line(err)}; check that the "
                            "server runs and accepts connections"
                        ) from None
                except psycopg.Error as err:
                    if db.broken:
                        db.close()
                        self._db = None
                    raise StoreError(
                        f"session store {self._location}: {first_line(err)}; {_advice(err, psycopg)}"
                    ) from None
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._db is not None:
                self._db.close()
                self._db = None

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return connect(self._dsn, autocommit=True)
        except PostgresError as err:
            raise StoreError(f"session store: {err}") from None


def _advice(err: Exception, psycopg: Any) -> str:
    """What to do about a statement PostgreSQL (or psycopg, before sending it) refused."""
    state = getattr(err, "sqlstate", None) or ""
    if state == "42501":
        return f"grant the user SELECT, INSERT, UPDATE and DELETE on {_TABLE}, or pass another DSN with --state"
    if state.startswith("53"):
        return "the server is out of resources (disk, memory or connections): see its log"
    if isinstance(err, psycopg.DataError):
        return "PostgreSQL cannot store this key or session id (its text may not hold NUL characters)"
    return "see the server's log, or pass another DSN with --state"
