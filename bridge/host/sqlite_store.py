"""Where session ids live between turns (docs/protocol.md §6): one SQLite file, shared safely.

A host keys sessions by (profile name, conversation key, session name) and
keeps, for each, the agent's last valid session id, when it was last used and
how its last turn ended. The store is embedded (SQLite through the standard
library, nothing to run) and several bridge processes may share one file:

- WAL journal, so readers never wait for a writer and a writer never waits
  for readers; in this process too: reads and writes use two connections,
  each behind its own lock, so a `get` never queues behind a `record` that
  waits for another process's write lock;
- every write is one short `BEGIN IMMEDIATE` transaction: the write lock is
  taken up front, so two writers queue on `busy_timeout` instead of one of
  them failing half-way with "database is locked";
- `synchronous=NORMAL`: with WAL a crash of the process or the machine never
  corrupts the file; a power cut may roll back the last few commits, which
  costs a session at worst, never a turn.

Every failure of the file itself — corrupt, not SQLite, unreadable,
unwritable, on a full disk, locked for too long — is a `StoreError` that names
the file and says what to do. Nothing is dropped silently: a host that cannot
record a session learns it at once. The file is created private to the user
(0600); opening one that other users can read logs a warning with the fix.
"""

from __future__ import annotations

import builtins
import errno
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from ..engine.result import TurnResult
from ..errors import StoreError
from ..log import get_logger
from ..profile.cache import make_private_directories
from ..turn import text_problem
from .location import store_path

# How long a writer waits for another process's transaction before giving up.
# Transactions last well under a millisecond; only a stuck process holds one this long.
BUSY_TIMEOUT_SECS = 10.0
SCHEMA_VERSION = 1
# Below this much free space an I/O error is taken for a full disk: opening a store
# alone needs a 32 KiB -shm file and a few WAL pages.
_FULL_BELOW_BYTES = 256 * 1024
_TABLE = "sessions"
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {_TABLE} (
    profile        TEXT    NOT NULL,
    conversation   TEXT    NOT NULL,
    session_name   TEXT    NOT NULL,
    session_id     TEXT    NOT NULL DEFAULT '',
    last_used      TEXT    NOT NULL,  -- ISO 8601, UTC: readable with the sqlite3 shell, sorts as time
    last_outcome   TEXT    NOT NULL,
    last_exit_code INTEGER NOT NULL,
    PRIMARY KEY (profile, conversation, session_name)
) WITHOUT ROWID
"""
# An empty new id keeps the stored one (docs/protocol.md §6); everything else is the latest turn's.
_RECORD = f"""
INSERT INTO {_TABLE} (profile, conversation, session_name, session_id, last_used, last_outcome, last_exit_code)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (profile, conversation, session_name) DO UPDATE SET
    session_id = CASE WHEN excluded.session_id != '' THEN excluded.session_id ELSE session_id END,
    last_used = excluded.last_used,
    last_outcome = excluded.last_outcome,
    last_exit_code = excluded.last_exit_code
"""
T = TypeVar("T")


def in_write_transaction(db: sqlite3.Connection, operation: Callable[[sqlite3.Connection], T]) -> T:
    """`operation(db)` in a transaction that holds the write lock from its start (`BEGIN IMMEDIATE`: no upgrade
    that could fail half-way), committed when it returns and rolled back when it raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        value = operation(db)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return value


_COLUMNS = "profile, conversation, session_name, session_id, last_used, last_outcome, last_exit_code"


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """One stored session. `last_outcome` is an `Outcome` value (`ok`, `timeout`…)."""

    profile: str
    conversation: str
    session_name: str
    session_id: str  # "" when no turn of this session has printed a valid id yet
    last_used: datetime  # timezone-aware, UTC
    last_outcome: str
    last_exit_code: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "conversation": self.conversation,
            "session_name": self.session_name,
            "session_id": self.session_id,
            "last_used": self.last_used.isoformat(),
            "last_outcome": self.last_outcome,
            "last_exit_code": self.last_exit_code,
        }


class SessionStore:
    """The session store. Methods are synchronous (each is one sub-millisecond statement).

    One object may be shared by several threads (a trio host calls it through
    `trio.to_thread.run_sync`): it holds a connection for reads and one for
    writes, each behind its own lock, so `get` and `list` go on while a
    `record` or `forget` waits for another process's lock. Several processes
    may open the same file at once.

        with SessionStore() as store:
            turn = Turn(message, session_id=store.get("stream", "chat-42"))
            store.record("stream", "chat-42", "default", await run_turn(profile, turn))
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = store_path(path)
        mode = self._create_file()
        if mode & 0o066:
            get_logger(component="store").warning(
                "the session store can be read or written by other users: they could resume its conversations",
                path=str(self.path),
                mode=f"{mode & 0o777:o}",
                fix=f"chmod 600 {self.path}",
            )
        # The writer first: it switches the file to WAL and checks the schema the reader relies on.
        self._writer = _Connection(self._connect(self._prepare), self.path)
        try:
            self._reader = _Connection(self._connect(self._prepare_reader), self.path)
        except BaseException:
            self._writer.close()
            raise

    # ------------------------------------------------------------------ public

    def get(self, profile: str, conversation: str, session_name: str = "default") -> str:
        """The stored session id, `""` when there is none (the next turn starts a new session)."""
        rows = self._run(
            self._reader,
            lambda db: db.execute(
                f"SELECT session_id FROM {_TABLE} WHERE profile = ? AND conversation = ? AND session_name = ?",
                session_key(profile, conversation, session_name),
            ).fetchall(),  # fetched to the end, so the read transaction ends with the call
        )
        return rows[0][0] if rows else ""

    def lookup(self, profile: str, conversation: str, session_name: str = "default") -> tuple[str, str]:
        """The stored session id and the stamp of its last record (`record` returns it); `("", "")` when none.

        A changed stamp says another turn of the conversation was recorded
        since: the host's warm agent for it missed that turn and is not reused.
        """
        rows = self._run(
            self._reader,
            lambda db: db.execute(
                f"SELECT session_id, last_used FROM {_TABLE} WHERE profile = ? AND conversation = ? "
                "AND session_name = ?",
                session_key(profile, conversation, session_name),
            ).fetchall(),
        )
        return (rows[0][0], rows[0][1]) if rows else ("", "")

    def record(self, profile: str, conversation: str, session_name: str, result: TurnResult) -> str:
        """Remember how a turn ended; a turn without a valid session line keeps the stored id. Returns the
        record's stamp (its `last_used`, as `lookup` reads it)."""
        stamp = now_iso()
        values = (
            *session_key(profile, conversation, session_name),
            result.session_id,
            stamp,
            str(result.outcome),
            int(result.exit_code),
        )
        self._write(lambda db: db.execute(_RECORD, values))
        return stamp

    def forget(self, profile: str, conversation: str, session_name: str | None = None) -> int:
        """Drop a stored session (every session name of the conversation when None); rows removed."""
        if session_name is None:
            sql = f"DELETE FROM {_TABLE} WHERE profile = ? AND conversation = ?"
            params: tuple[str, ...] = session_key(profile, conversation)
        else:
            sql = f"DELETE FROM {_TABLE} WHERE profile = ? AND conversation = ? AND session_name = ?"
            params = session_key(profile, conversation, session_name)
        return int(self._write(lambda db: db.execute(sql, params).rowcount))

    def list(self, profile: str | None = None, conversation: str | None = None) -> builtins.list[SessionRecord]:
        """Stored sessions, most recently used first; only `profile`'s (and `conversation`'s) when given."""
        filters = {"profile": profile, "conversation": conversation}
        used = [(column, value) for column, value in filters.items() if value is not None]
        where = ("WHERE " + " AND ".join(f"{column} = ?" for column, _ in used)) if used else ""
        params = tuple(value for _, value in used)
        session_key(*(value for value in params if value))  # an empty filter matches nothing; odd text is refused
        rows = self._run(
            self._reader,
            lambda db: db.execute(
                f"SELECT {_COLUMNS} FROM {_TABLE} {where} ORDER BY last_used DESC, profile, conversation, session_name",
                params,
            ).fetchall(),
        )
        return [_record(row) for row in rows]

    def close(self) -> None:
        """Close the file; a write under way finishes first. Idempotent."""
        self._reader.close()
        self._writer.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SessionStore({str(self.path)!r})"

    @property
    def location(self) -> str:
        """Where the sessions are, for messages: the file's path."""
        return str(self.path)

    # ------------------------------------------------------------------ internals

    def _create_file(self) -> int:
        """Make the directory and an empty file (an empty file is an empty database), private to the user.

        Returns the file's mode."""
        directory = self.path.parent
        try:
            make_private_directories(directory)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(
                f"cannot create session store {self.path}: {directory} (or a parent) is a file, "
                "not a directory; pass another path with --state PATH"
            ) from None
        except OSError as err:
            advice = (
                _full_disk_advice()
                if err.errno == errno.ENOSPC
                else f"create {directory} writable by this user, or pass another path with --state PATH"
            )
            raise StoreError(
                f"cannot create the directory of session store {self.path}: {err.strerror or err}; {advice}"
            ) from None
        try:
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except IsADirectoryError:
            raise StoreError(
                f"session store {self.path} is a directory; pass the path of a file (e.g. --state DIR/sessions.sqlite3)"
            ) from None
        except OSError as err:
            advice = (
                _full_disk_advice()
                if err.errno == errno.ENOSPC
                else "make it and its directory readable and writable by this user, or pass another file "
                "with --state PATH"
            )
            raise StoreError(f"cannot open session store {self.path}: {err.strerror or err}; {advice}") from None
        try:
            return os.fstat(descriptor).st_mode
        finally:
            os.close(descriptor)

    def _connect(self, prepare: Callable[[sqlite3.Connection], None]) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECS, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as err:
            raise self._error(err) from None
        try:
            _patiently(lambda: prepare(db))
        except sqlite3.Error as err:
            db.close()
            raise self._error(err) from None
        except BaseException:
            db.close()
            raise
        return db

    def _prepare(self, db: sqlite3.Connection) -> None:
        """WAL, the busy timeout, and the schema: idempotent, and safe when processes race to do it."""
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECS * 1000)}")
        # Reading the mode first: switching an existing WAL file again would need
        # a lock other processes may hold, and the mode is stored in the file.
        if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower()
            if mode != "wal":
                raise StoreError(
                    f"session store {self.path}: SQLite cannot use WAL mode there (got {mode}); "
                    "put the store on a local file system with --state PATH"
                )
        db.execute("PRAGMA synchronous = NORMAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"session store {self.path} was written by a newer agent-bridge (schema "
                f"{version}); upgrade agent-bridge, or use another file with --state PATH"
            )
        in_write_transaction(db, self._create_schema)

    def _create_schema(self, db: sqlite3.Connection) -> None:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if db.execute("PRAGMA user_version").fetchone()[0] == 0 and tables - {_TABLE}:
            raise StoreError(
                f"{self.path} is an SQLite database of something else (tables: "
                f"{', '.join(sorted(tables))}), not an agent-bridge session store; "
                "pass another file with --state PATH"
            )
        db.execute(_SCHEMA)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @staticmethod
    def _prepare_reader(db: sqlite3.Connection) -> None:
        """The reading connection: the file is WAL and its schema checked already (by the writer)."""
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECS * 1000)}")
        db.execute("PRAGMA query_only = ON")  # it never takes the write lock, so it never waits for it

    def _run(self, connection: _Connection, operation: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return connection.run(operation)
        except sqlite3.Error as err:
            raise self._error(err) from None

    def _write(self, operation: Any) -> Any:
        return self._run(self._writer, lambda db: in_write_transaction(db, operation))

    def _error(self, err: sqlite3.Error) -> StoreError:
        """Turn SQLite's terse message into one that says what to do."""
        code = getattr(err, "sqlite_errorname", "") or ""
        full = None
        if code.startswith(_CODES_OF_A_FULL_DISK):
            try:
                full = disk_full_reason(os.statvfs(self.path.parent), as_root=os.geteuid() == 0)
            except OSError:
                pass
        return StoreError(f"session store {self.path}: {err}: {_advice(code, full)}")


class _Connection:
    """One SQLite connection, used by one thread at a time: `run` and `close` take its lock."""

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db: sqlite3.Connection | None = db
        self._path = path
        self._lock = threading.Lock()

    def run(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        """`operation(db)`, retried while the file is busy (see `_patiently`)."""
        with self._lock:
            db = self._db
            if db is None:
                raise StoreError(f"session store {self._path} is closed")
            return _patiently(lambda: operation(db))

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


# What SQLite reports when a write, or creating the -wal or -shm file, fails for want of space.
_CODES_OF_A_FULL_DISK = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN")


def _full_disk_advice(reason: str | None = None) -> str:
    because = f" ({reason})" if reason else ""
    return f"the disk holding it is full{because}: free some space there, or pass another file with --state PATH"


def disk_full_reason(space: os.statvfs_result, *, as_root: bool) -> str | None:
    """Why the file system described by `space` counts as full ("12 KiB free", "no free inodes"), else None.

    Root may also use the blocks a file system reserves for it; a file system
    without a fixed number of inodes reports 0 of them.
    """
    free_bytes = (space.f_bfree if as_root else space.f_bavail) * space.f_frsize
    if free_bytes < _FULL_BELOW_BYTES:
        return f"{free_bytes // 1024} KiB free"
    if space.f_files and (space.f_ffree if as_root else space.f_favail) == 0:
        return "no free inodes"
    return None


def _advice(code: str, full: str | None) -> str:
    """What to do about SQLite error `code` (an extended name); `full`: why the disk is full, if it is."""
    if full is not None or code.startswith("SQLITE_FULL"):
        return _full_disk_advice(full)
    if code.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
        return (
            "it is damaged or not an SQLite file; move it aside (its sessions are lost: "
            "conversations start afresh) or pass another file with --state PATH"
        )
    if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return (
            f"another process kept it locked for more than {BUSY_TIMEOUT_SECS:g} s; "
            "find the stuck process (fuser FILE) or pass another file with --state PATH"
        )
    if code.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH", "SQLITE_IOERR")):
        return (
            "make the file, its -wal and -shm companions and its directory writable by this user, "
            "or pass another file with --state PATH"
        )
    return "check the file, or pass another one with --state PATH"


def _patiently(operation: Callable[[], T]) -> T:
    """Run `operation`, retrying it while SQLite reports the file busy, for up to BUSY_TIMEOUT_SECS.

    `busy_timeout` covers ordinary lock waits, but SQLite returns SQLITE_BUSY
    without waiting in a few WAL corners: while another connection recovers
    the WAL index, or switches a new file to WAL, or deletes the WAL as the
    last one to close. They last microseconds; retrying the whole statement or
    transaction (each is idempotent) is what SQLite's documentation advises.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECS
    pause = 0.001
    while True:
        try:
            return operation()
        except sqlite3.OperationalError as err:
            if (
                not (getattr(err, "sqlite_errorname", "") or "").startswith("SQLITE_BUSY")
                or time.monotonic() + pause > deadline
            ):
                raise
        time.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(pause * 2, 0.05)


def session_key(*parts: str) -> tuple[str, ...]:
    """A stored session's key (its parts as given); raises `StoreError` unless each is a non-empty string of text
    (no NUL, no lone surrogate: what a command line's non-UTF-8 bytes become, which SQLite cannot encode)."""
    for part in parts:
        if not isinstance(part, str) or not part:
            raise StoreError(f"session store keys must be non-empty strings, not {part!r}")
        if problem := text_problem(part):
            raise StoreError(f"the session store key {part!r} {problem}")
    return parts


def now_iso() -> str:
    """Now, in UTC, as the stores write it (ISO 8601, to the microsecond)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _record(row: tuple[Any, ...]) -> SessionRecord:
    profile, conversation, session_name, session_id, last_used, outcome, exit_code = row
    return SessionRecord(
        profile, conversation, session_name, session_id, datetime.fromisoformat(last_used), outcome, int(exit_code)
    )
