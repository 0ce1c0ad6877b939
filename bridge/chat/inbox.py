"""The chat bridge's durable state: one SQLite file holding every update until its reply is delivered.

An update's life: `queued` (stored, in the same transaction as the platform position that acknowledges it)
→ `running` (its turn started) → `answered` (the reply is stored, not yet delivered) → `delivered`. After a
crash, `queued` and `running` updates run again (a turn that was cut off never replied), `answered` ones
are delivered, `delivered` ones never come back; an update id seen again is ignored. Beside them: the
platform's acknowledged position, each conversation's profile, per-user daily usage, when each chat was
last refused and the chats the platform moved to a new id. The files of a reply wait beside the store
(`<store>.files/`) until delivered.

Every write is one `BEGIN IMMEDIATE` transaction in WAL mode with `synchronous=NORMAL`: once a call returns, its
change survives a `kill -9` (it is in the log, which the kernel holds); `sync()` puts the log on the disk, so it
also survives a power cut — the runtime calls it before it acknowledges a batch to the platform. Calls are
synchronous (sub-millisecond, `sync` the time of one fsync, and of a checkpoint once the log has grown; no other
call ever waits for the disk); the runtime makes `sync` in a worker thread, the writes on a turn's path on trio's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import threading
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, TypeVar

from ..errors import StoreError
from ..host.sqlite_store import in_write_transaction
from .platform import ButtonPress, Incoming, IncomingFile

SCHEMA_VERSION = 2  # 2: chat_moves (a version 1 store gains the table as it opens)
BUSY_TIMEOUT_SECS = 10.0
# Delivered updates are kept only to recognise one the platform sends again (a batch polled again after a
# crash before its acknowledgement): the latest this many per platform are plenty, and the file stays small.
KEEP_DELIVERED = 10_000
CHECKPOINT_LOG_BYTES = 4 * 1024 * 1024  # SQLite's own default: a checkpoint once the log holds 1000 pages
T = TypeVar("T")
State = Literal["queued", "running", "answered", "delivered"]
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS chat_updates (
        platform  TEXT NOT NULL,
        update_id TEXT NOT NULL,
        seq       INTEGER NOT NULL,
        item      TEXT NOT NULL,  -- the Incoming or ButtonPress, as JSON
        state     TEXT NOT NULL,
        reply     TEXT,           -- the reply to deliver, once answered
        PRIMARY KEY (platform, update_id)
    )""",
    "CREATE INDEX IF NOT EXISTS chat_updates_pending ON chat_updates (platform, state, seq)",
    "CREATE TABLE IF NOT EXISTS chat_positions (platform TEXT PRIMARY KEY, position TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS chat_conversations (
        platform TEXT NOT NULL, conversation TEXT NOT NULL, profile TEXT NOT NULL,
        generation INTEGER NOT NULL DEFAULT 0,  -- /new moves the chat to a fresh host conversation
        PRIMARY KEY (platform, conversation))""",
    """CREATE TABLE IF NOT EXISTS chat_usage (
        platform TEXT NOT NULL, user TEXT NOT NULL, day TEXT NOT NULL,
        turns INTEGER NOT NULL DEFAULT 0, cost_usd REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (platform, user, day))""",
    """CREATE TABLE IF NOT EXISTS chat_refusals (
        platform TEXT NOT NULL, chat TEXT NOT NULL, refused_at REAL NOT NULL,
        PRIMARY KEY (platform, chat))""",
    # The bot each platform's rows belong to: update ids and positions are one bot's, meaningless to another.
    "CREATE TABLE IF NOT EXISTS chat_bots (platform TEXT PRIMARY KEY, bot TEXT NOT NULL)",
    # Chats the platform moved to a new id (a Telegram group become a supergroup): the conversation keeps the old.
    """CREATE TABLE IF NOT EXISTS chat_moves (
        platform TEXT NOT NULL, old_chat TEXT NOT NULL, new_chat TEXT NOT NULL,
        PRIMARY KEY (platform, old_chat))""",
)


@dataclass(frozen=True, slots=True)
class Stored:
    """An update as the inbox holds it."""

    update_id: str
    item: Incoming | ButtonPress
    state: State
    reply: str | None


def encode(item: Incoming | ButtonPress) -> str:
    kind = "press" if isinstance(item, ButtonPress) else "message"
    return json.dumps({"kind": kind, **asdict(item)}, ensure_ascii=False)


def decode(text: str) -> Incoming | ButtonPress:
    values: dict[str, Any] = json.loads(text)
    if values.pop("kind") == "press":
        return ButtonPress(**values)
    values["files"] = tuple(IncomingFile(**file) for file in values["files"])
    return Incoming(**values)


class Inbox:
    """The chat bridge's store (see the module's docstring); one file may serve several platforms."""

    def __init__(self, path: str | os.PathLike[str], *, keep_delivered: int = KEEP_DELIVERED) -> None:
        self.path = Path(path)
        self.keep_delivered = keep_delivered
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
            self._db = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_SECS, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as err:
            raise StoreError(
                f"cannot open the chat store {self.path}: {err}; make its directory writable by this user, "
                "or pass another --state"
            ) from None
        self._db_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._run(self._prepare)

    def _prepare(self, db: sqlite3.Connection) -> None:
        db.execute("PRAGMA journal_mode = WAL")
        # Not FULL, an fsync at every commit (~5 ms on a VM's disk, four of them in a turn's path): row 32 of
        # `make bench` (a Telegram turn within 3 ms of serve's) measured +25 ms with them. One fsync per polled batch,
        # `sync()` before its acknowledgement, keeps what must survive a power cut: the updates acknowledged.
        db.execute("PRAGMA synchronous = NORMAL")
        # No checkpoint at a commit (the runtime commits on trio's thread, which a checkpoint's fsync would block):
        # `sync()`, in a worker thread, checkpoints once the log has grown.
        db.execute("PRAGMA wal_autocheckpoint = 0")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"chat store {self.path} was written by a newer agent-bridge; upgrade agent-bridge")
        in_write_transaction(db, _create_schema)

    # ------------------------------------------------------------------ updates

    def claim(self, platform: str, bot: str) -> str | None:
        """Make the store `bot`'s on `platform` (the first bot to claim it keeps it); the bot it belongs to when that
        is another (None: it is `bot`'s)."""

        def claim(db: sqlite3.Connection) -> str | None:
            db.execute("INSERT OR IGNORE INTO chat_bots (platform, bot) VALUES (?, ?)", (platform, bot))
            (owner,) = db.execute("SELECT bot FROM chat_bots WHERE platform = ?", (platform,)).fetchone()
            return None if owner == bot else str(owner)

        return self._write(claim)

    def store_batch(self, platform: str, items: Sequence[Incoming | ButtonPress], position: str) -> list[Stored]:
        """Store a poll's items (those not seen before) and the position acknowledging them, in one transaction;
        the new ones, in order."""

        def store(db: sqlite3.Connection) -> list[Stored]:
            (seq,) = db.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM chat_updates WHERE platform = ?", (platform,)
            ).fetchone()
            new: list[Stored] = []
            for item in items:
                seq += 1
                inserted = db.execute(
                    "INSERT OR IGNORE INTO chat_updates (platform, update_id, seq, item, state) "
                    "VALUES (?, ?, ?, ?, 'queued')",
                    (platform, item.update_id, seq, encode(item)),
                ).rowcount
                if inserted:
                    new.append(Stored(item.update_id, item, "queued", None))
            db.execute(
                "DELETE FROM chat_updates WHERE platform = ? AND state = 'delivered' AND seq <= ?",
                (platform, seq - self.keep_delivered),
            )
            db.execute(
                "INSERT INTO chat_positions (platform, position) VALUES (?, ?) "
                "ON CONFLICT (platform) DO UPDATE SET position = excluded.position",
                (platform, position),
            )
            return new

        return self._write(store)

    def sync(self) -> None:
        """Put every change made so far on the disk (an fsync of the write-ahead log): past a power cut too."""
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            descriptor = os.open(wal, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # nothing written since the log was checkpointed into the file, which SQLite synced
        except OSError as err:
            raise StoreError(f"chat store {self.path}: cannot sync its log: {err}; check the disk") from None
        try:
            os.fsync(descriptor)
            grown = os.fstat(descriptor).st_size > CHECKPOINT_LOG_BYTES
        finally:
            os.close(descriptor)
        if grown:
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Copy the log into the file, without waiting for the writes going on (a connection of its own)."""
        try:
            with self._checkpoint_lock, closing(sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECS)) as db:
                db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as err:
            raise StoreError(f"chat store {self.path}: cannot checkpoint its log: {err}; check the disk") from None

    def position(self, platform: str) -> str | None:
        """The last position stored with a batch; None before the first."""
        row = self._run(
            lambda db: db.execute("SELECT position FROM chat_positions WHERE platform = ?", (platform,)).fetchone()
        )
        return None if row is None else str(row[0])

    def unfinished(self, platform: str) -> list[Stored]:
        """The updates whose reply was not delivered, in arrival order (what a restart picks up)."""
        rows = self._run(
            lambda db: db.execute(
                "SELECT update_id, item, state, reply FROM chat_updates "
                "WHERE platform = ? AND state != 'delivered' ORDER BY seq",
                (platform,),
            ).fetchall()
        )
        return [Stored(update_id, decode(item), state, reply) for update_id, item, state, reply in rows]

    def mark(self, platform: str, update_id: str, state: State, reply: str | None = None) -> None:
        """Move an update on; `reply` is stored with `answered`."""
        self._write(
            lambda db: db.execute(
                "UPDATE chat_updates SET state = ?, reply = COALESCE(?, reply) WHERE platform = ? AND update_id = ?",
                (state, reply, platform, update_id),
            )
        )

    def begin_turn(
        self, platform: str, update_id: str, user: str, day: str, conversation: str
    ) -> tuple[str, int] | None:
        """Mark the update `running` and count a turn in `user`'s usage of `day`, in one transaction; what
        `conversation()` gives. One call where three were: each is a hop to a worker thread and back on a turn's path
        (row 32 of `make bench`)."""

        def begin(db: sqlite3.Connection) -> tuple[str, int] | None:
            db.execute(
                "UPDATE chat_updates SET state = 'running' WHERE platform = ? AND update_id = ?",
                (platform, update_id),
            )
            _add_usage(db, platform, user, day, turns=1, cost_usd=0.0)
            row = db.execute(
                "SELECT profile, generation FROM chat_conversations WHERE platform = ? AND conversation = ?",
                (platform, conversation),
            ).fetchone()
            return None if row is None else (str(row[0]), int(row[1]))

        return self._write(begin)

    def state_of(self, platform: str, update_id: str) -> State | None:
        row = self._run(
            lambda db: db.execute(
                "SELECT state FROM chat_updates WHERE platform = ? AND update_id = ?", (platform, update_id)
            ).fetchone()
        )
        return None if row is None else row[0]

    # ------------------------------------------------------------------ conversations, access, budgets

    def conversation(self, platform: str, conversation: str) -> tuple[str, int] | None:
        """The profile a chat switched to and its generation (see `/new`); None while it has the defaults."""
        row = self._run(
            lambda db: db.execute(
                "SELECT profile, generation FROM chat_conversations WHERE platform = ? AND conversation = ?",
                (platform, conversation),
            ).fetchone()
        )
        return None if row is None else (str(row[0]), int(row[1]))

    def set_conversation(self, platform: str, conversation: str, profile: str, generation: int) -> None:
        self._write(
            lambda db: db.execute(
                "INSERT INTO chat_conversations (platform, conversation, profile, generation) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (platform, conversation) DO UPDATE SET profile = excluded.profile, "
                "generation = excluded.generation",
                (platform, conversation, profile, generation),
            )
        )

    def moved_chats(self, platform: str) -> dict[str, str]:
        """The chats `platform` moved: old id -> new id (see `Platform.follow_moved_chats`)."""
        rows = self._run(
            lambda db: db.execute(
                "SELECT old_chat, new_chat FROM chat_moves WHERE platform = ?", (platform,)
            ).fetchall()
        )
        return {str(old): str(new) for old, new in rows}

    def chat_moved(self, platform: str, old_chat: str, new_chat: str) -> None:
        self._write(
            lambda db: db.execute(
                "INSERT INTO chat_moves (platform, old_chat, new_chat) VALUES (?, ?, ?) "
                "ON CONFLICT (platform, old_chat) DO UPDATE SET new_chat = excluded.new_chat",
                (platform, old_chat, new_chat),
            )
        )

    def usage(self, platform: str, user: str, day: str) -> tuple[int, float]:
        """(turns, cost in USD) of `user` on `day`."""
        row = self._run(
            lambda db: db.execute(
                "SELECT turns, cost_usd FROM chat_usage WHERE platform = ? AND user = ? AND day = ?",
                (platform, user, day),
            ).fetchone()
        )
        return (0, 0.0) if row is None else (int(row[0]), float(row[1]))

    def add_usage(self, platform: str, user: str, day: str, *, turns: int = 0, cost_usd: float = 0.0) -> None:
        self._write(lambda db: _add_usage(db, platform, user, day, turns=turns, cost_usd=cost_usd))

    def claim_refusal(self, platform: str, chat: str, now: float, interval: float) -> bool:
        """True (and `now` recorded) when `chat` was last refused more than `interval` seconds ago, or never."""

        def claim(db: sqlite3.Connection) -> bool:
            row = db.execute(
                "SELECT refused_at FROM chat_refusals WHERE platform = ? AND chat = ?", (platform, chat)
            ).fetchone()
            if row is not None and now - float(row[0]) < interval:
                return False
            db.execute(
                "INSERT INTO chat_refusals (platform, chat, refused_at) VALUES (?, ?, ?) "
                "ON CONFLICT (platform, chat) DO UPDATE SET refused_at = excluded.refused_at",
                (platform, chat, now),
            )
            return True

        return self._write(claim)

    # ------------------------------------------------------------------ a reply's files

    def files_directory(self, platform: str, update_id: str) -> Path:
        """Where the files of an update's reply wait until delivered: beside the store, private to this user."""
        digest = hashlib.sha256(f"{platform}\0{update_id}".encode()).hexdigest()[:32]
        return self.path.with_name(self.path.name + ".files") / digest

    def keep_file(self, platform: str, update_id: str, number: int, source: BinaryIO) -> str:
        """Copy `source` durably (synced, as the store's writes) to the update's file `number`; its path."""
        directory = self.files_directory(platform, update_id)
        path = directory / str(number)
        try:
            for folder in (directory.parent, directory):
                if not folder.is_dir():
                    folder.mkdir(mode=0o700)
                    _sync_directory(folder.parent)
            with open(path, "wb", opener=_private) as target:
                shutil.copyfileobj(source, target)
                target.flush()
                os.fsync(target.fileno())
            _sync_directory(directory)
        except OSError as err:
            raise StoreError(f"cannot keep a reply's file in {directory}: {err}; check its disk and rights") from None
        return str(path)

    def drop_files(self, platform: str, update_id: str) -> None:
        """Forget the update's files (delivered)."""
        shutil.rmtree(self.files_directory(platform, update_id), ignore_errors=True)

    # ------------------------------------------------------------------ the file

    def close(self) -> None:
        with self._db_lock:
            self._db.close()

    def _run(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        with self._db_lock:
            try:
                return operation(self._db)
            except sqlite3.Error as err:
                raise StoreError(f"chat store {self.path}: {err}; check the file and its disk") from None

    def _write(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        return self._run(lambda db: in_write_transaction(db, operation))


def _private(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_CLOEXEC, 0o600)


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _add_usage(db: sqlite3.Connection, platform: str, user: str, day: str, *, turns: int, cost_usd: float) -> None:
    db.execute(
        "INSERT INTO chat_usage (platform, user, day, turns, cost_usd) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (platform, user, day) DO UPDATE SET turns = turns + excluded.turns, "
        "cost_usd = cost_usd + excluded.cost_usd",
        (platform, user, day, turns, cost_usd),
    )


def _create_schema(db: sqlite3.Connection) -> None:
    for statement in _SCHEMA:
        db.execute(statement)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


__all__ = ["Inbox", "State", "Stored"]
