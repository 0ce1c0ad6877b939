"""Connections to PostgreSQL, the schema, and LISTEN without a thread.

psycopg's async API needs asyncio; the bridge is trio. So psycopg's blocking
API runs in trio's worker threads, and what that costs was measured (`make
bench`, row 14, and bench/PROFILING.md): a loopback `SELECT 1` takes 30–160 µs
blocking (by whether client and server share a CPU), and the thread hop adds
55–250 µs on top — more than the statement itself. Hence one hop per
*transaction* (`Database.run`: a function that runs whole in a worker thread
on a pooled connection), single statements where one suffices, and
notifications read without any thread: the listening connection's socket is
watched with `trio.lowlevel.wait_readable` and drained with libpq's own
`consume_input`/`notifies`. Driving every statement that way too would save
the hop, but only by re-implementing psycopg's protocol handling; a turn
costs a handful of hops, next to an agent's start-up of milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from ...errors import BridgeError, PostgresError, PostgresUnavailable
from ...log import Logger, get_logger

if TYPE_CHECKING:
    import psycopg
    from psycopg import Connection

T = TypeVar("T")
SCHEMA_VERSION = 3
CONNECT_TIMEOUT_SECS = 5
# The server ends a session of ours that sits this long inside a transaction, sending nothing: its process paused
# (SIGSTOP, a frozen machine) or cut off mid-transaction, where TCP would take the server hours to notice. Its row
# locks would otherwise keep the reaper from taking back its turns for as long. Our transactions send their
# statements back to back; the slowest wait between two is reading a result's files (a few seconds at most).
IDLE_IN_TRANSACTION_SECS = 60.0
# Workers tell each gateway what its turns do on a channel of its own (`events_channel`); gateways and
# workers tell workers there is work, and gateways tell them to cancel a turn or answer its question.
WORK_CHANNEL = "bridge_work"
CONTROL_CHANNEL = "bridge_control"
MAX_NOTIFY_BYTES = 7900  # PostgreSQL refuses payloads of 8000 bytes or more
SCHEMA_LOCK = 0x61_67_62_72  # an advisory lock id ("agbr"): processes racing to create the schema take turns
# A bot's sessions and turns are kept apart from other bots' by its namespace: a gateway's is its name, and
# this is both the default gateway name and the session store's default namespace, so a bot that moves
# from `serve --profiles --state DSN` to a gateway (or `sessions list --state DSN` beside one) sees the same
# sessions; version 1's sessions migrate into it.
DEFAULT_NAMESPACE = "serve"

SCHEMA = """
CREATE TABLE IF NOT EXISTS bridge_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE IF NOT EXISTS bridge_sessions (
    namespace      text        NOT NULL,  -- the bot's: its gateway's name, or the session store's namespace
    profile        text        NOT NULL,
    conversation   text        NOT NULL,
    session_name   text        NOT NULL,
    session_id     text        NOT NULL DEFAULT '',
    last_used      timestamptz NOT NULL,
    last_outcome   text        NOT NULL,
    last_exit_code integer     NOT NULL,
    stamp          text        NOT NULL,  -- changes with every record: a warm agent that missed one is retired
    PRIMARY KEY (namespace, profile, conversation, session_name)
);
CREATE TABLE IF NOT EXISTS bridge_workers (
    id             text        PRIMARY KEY,
    host           text        NOT NULL,
    pid            integer     NOT NULL,
    backend_pid    integer     NOT NULL,  -- its registration connection: gone while the server runs = dead
    backend_start  timestamptz NOT NULL,
    max_concurrent integer     NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT now(),
    seen_at        timestamptz NOT NULL DEFAULT now(),
    draining       boolean     NOT NULL DEFAULT false,
    profiles       jsonb       NOT NULL DEFAULT '{}',  -- {name: sha256 of its file} of the profiles that load
    profiles_at    timestamptz NOT NULL DEFAULT now()  -- when `profiles` last changed
);
CREATE TABLE IF NOT EXISTS bridge_gateways (
    name          text        PRIMARY KEY,  -- held by a live gateway's advisory lock (queue.gateway_lock_key)
    host          text        NOT NULL,
    pid           integer     NOT NULL,
    backend_pid   integer     NOT NULL,  -- the connection holding the lock
    backend_start timestamptz NOT NULL,
    since         timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS bridge_turns (
    key              text        PRIMARY KEY,  -- the turn's own: events, orders and results name it
    seq              bigint      GENERATED ALWAYS AS IDENTITY,  -- arrival order; a retried turn keeps its place
    gateway          text        NOT NULL,  -- the gateway's name, which is also the namespace of its sessions
    turn_id          text        NOT NULL,  -- the gateway's key of the client's id: unique per gateway only
    request_id       jsonb       NOT NULL,  -- the client's id as sent (a string or a number)
    profile          text        NOT NULL,
    profile_hash     text,  -- the definition the live workers advertised at enqueue; only it may run the turn
    unmatched_since  timestamptz,  -- queued, and no live worker has the profile as queued: since when
    conversation     text        NOT NULL,
    session_name     text        NOT NULL,
    turn             jsonb       NOT NULL,
    state            text        NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done')),
    attempt          integer     NOT NULL DEFAULT 0,  -- fences a lost worker's late result off a newer attempt
    worker           text,
    lease_until      timestamptz,
    kill_grace_secs  double precision NOT NULL DEFAULT 0,
    on_worker_lost   text        NOT NULL DEFAULT 'retry',
    cancel_requested boolean     NOT NULL DEFAULT false,
    result           json,  -- json, not jsonb: a reply may hold a NUL character, which jsonb refuses
    error            json,
    outcome          text,  -- the result's, apart: PostgreSQL cannot read fields of a json value with a NUL
    exit_code        integer,
    enqueued_at      timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    delivered_at     timestamptz,
    CONSTRAINT bridge_turns_gateway_turn_id_key UNIQUE (gateway, turn_id)
);
-- Never two running turns of one conversation, whatever a worker does: PostgreSQL refuses the second.
CREATE UNIQUE INDEX IF NOT EXISTS bridge_turns_one_running
    ON bridge_turns (gateway, profile, conversation, session_name) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS bridge_turns_queued
    ON bridge_turns (gateway, profile, conversation, session_name, seq) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS bridge_turns_by_worker ON bridge_turns (worker) WHERE state = 'running';
CREATE INDEX IF NOT EXISTS bridge_turns_undelivered ON bridge_turns (gateway) WHERE delivered_at IS NULL;
CREATE INDEX IF NOT EXISTS bridge_turns_done ON bridge_turns (finished_at) WHERE state = 'done';
-- The files a turn's agent left (its result's `files`, by place), written with the result, in pieces of at most
-- `fleet_files.CHUNK_BYTES`; the gateway that reads them deletes them.
CREATE TABLE IF NOT EXISTS bridge_turn_files (
    key   text    NOT NULL REFERENCES bridge_turns (key) ON DELETE CASCADE,
    file  integer NOT NULL,  -- the file's place in the result's `files`
    chunk integer NOT NULL,
    data  bytea   NOT NULL,
    PRIMARY KEY (key, file, chunk)
);
"""


def _migrate_1_to_2(conn: psycopg.Connection[Any]) -> None:
    """Version 1 keyed turns by the bot's id alone and sessions by (profile, conversation, session name) for
    every bot. Every row is kept: a turn's key becomes `v1-<seq>` (unique, as seq is); each session is kept
    in the default namespace and copied into the namespace of every gateway the turns name, since version 1
    shared it with all of them."""
    conn.execute("ALTER TABLE bridge_turns RENAME COLUMN id TO turn_id")
    conn.execute("ALTER TABLE bridge_turns DROP CONSTRAINT bridge_turns_pkey")
    conn.execute(
        "ALTER TABLE bridge_turns ADD COLUMN key text, ADD COLUMN profile_hash text, "
        "ADD COLUMN unmatched_since timestamptz"
    )
    conn.execute("UPDATE bridge_turns SET key = 'v1-' || seq")
    conn.execute(
        "ALTER TABLE bridge_turns ALTER COLUMN key SET NOT NULL, ADD PRIMARY KEY (key), "
        "ADD CONSTRAINT bridge_turns_gateway_turn_id_key UNIQUE (gateway, turn_id)"
    )
    conn.execute("DROP INDEX bridge_turns_one_running, bridge_turns_queued")  # SCHEMA makes them per gateway
    conn.execute("ALTER TABLE bridge_sessions DROP CONSTRAINT bridge_sessions_pkey, ADD COLUMN namespace text")
    conn.execute(
        """
        INSERT INTO bridge_sessions (namespace, profile, conversation, session_name, session_id, last_used,
                                     last_outcome, last_exit_code, stamp)
        SELECT g.gateway, s.profile, s.conversation, s.session_name, s.session_id, s.last_used, s.last_outcome,
               s.last_exit_code, s.stamp
        FROM bridge_sessions s CROSS JOIN (SELECT DISTINCT gateway FROM bridge_turns WHERE gateway <> %s) g
        """,
        (DEFAULT_NAMESPACE,),
    )
    conn.execute("UPDATE bridge_sessions SET namespace = %s WHERE namespace IS NULL", (DEFAULT_NAMESPACE,))
    conn.execute(
        "ALTER TABLE bridge_sessions ALTER COLUMN namespace SET NOT NULL, "
        "ADD PRIMARY KEY (namespace, profile, conversation, session_name)"
    )
    conn.execute(
        "ALTER TABLE bridge_workers ADD COLUMN profiles jsonb NOT NULL DEFAULT '{}', "
        "ADD COLUMN profiles_at timestamptz NOT NULL DEFAULT now()"
    )


# Each takes the tables from its version to the next, inside the transaction that creates the schema.
def _migrate_2_to_3(conn: psycopg.Connection[Any]) -> None:
    """Version 3 adds `bridge_turn_files`, which SCHEMA creates; nothing else changed."""


MIGRATIONS: dict[int, Callable[[psycopg.Connection[Any]], None]] = {1: _migrate_1_to_2, 2: _migrate_2_to_3}


def events_channel(gateway: str) -> str:
    """The channel a gateway LISTENs on for its own turns' events: one per name, so one bot's partials are never
    sent to another bot's gateway. A hash, as a channel is an identifier of at most 63 bytes."""
    return "bridge_events_" + hashlib.sha256(gateway.encode()).hexdigest()[:32]


def require_psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise PostgresError(
            "PostgreSQL needs psycopg 3: pip install 'agent-bridge[postgres]' "
            "(in a checkout of agent-bridge: make install EXTRAS=postgres)"
        ) from None
    return psycopg


def is_postgres_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


def shown_dsn(dsn: str) -> str:
    """The DSN without its password, for messages and logs."""
    psycopg = require_psycopg()
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(an unreadable DSN)"
    host, port, name = params.get("host", "localhost"), params.get("port", "5432"), params.get("dbname", "")
    return f"postgresql://{params.get('user', '')}@{host}:{port}/{name}"


def connect(dsn: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A connection with the schema in place; `PostgresUnavailable` / `PostgresError` say what went wrong."""
    psycopg = require_psycopg()
    try:
        # Keepalives: a server that vanished without closing the connection is noticed in seconds, not hours.
        conn: Connection[Any] = psycopg.connect(
            dsn,
            autocommit=autocommit,
            connect_timeout=CONNECT_TIMEOUT_SECS,
            application_name="agent-bridge",
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
        )
    except psycopg.OperationalError as err:
        raise PostgresUnavailable(
            f"cannot connect to {shown_dsn(dsn)}: {first_line(err)}; check that the "
            "server runs and the DSN (host, port, user, database) is right"
        ) from None
    except psycopg.ProgrammingError as err:
        raise PostgresError(
            f"the PostgreSQL DSN is not valid: {_without_password(first_line(err))}; write it "
            "as postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        ) from None
    try:
        _ensure_schema(conn, dsn)
    except BaseException:
        conn.close()
        raise
    return conn


def _ensure_schema(conn: psycopg.Connection[Any], dsn: str) -> None:
    psycopg = require_psycopg()
    try:
        with conn.transaction():
            conn.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                (str(round(IDLE_IN_TRANSACTION_SECS * 1000)),),
            )
            current = _schema_version(conn) == SCHEMA_VERSION
        # Only making or upgrading the tables takes the lock: a process stalled holding it (SIGSTOP, a debugger)
        # would hold up every other process's new connections.
        if not current:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                _make_schema(conn, dsn, _schema_version(conn))
    except psycopg.OperationalError as err:
        raise PostgresUnavailable(f"{shown_dsn(dsn)}: {first_line(err)}") from None
    except psycopg.Error as err:
        raise PostgresError(
            f"cannot set up agent-bridge's tables in {shown_dsn(dsn)}: {first_line(err)} "
            "(the user needs CREATE on the database's public schema)"
        ) from None
    if not conn.autocommit:
        conn.rollback()


def _schema_version(conn: psycopg.Connection[Any]) -> int | None:
    """The version of agent-bridge's tables in the database, None before they are made."""
    exists = conn.execute("SELECT to_regclass('bridge_meta') IS NOT NULL").fetchone()
    if not (exists and exists[0]):
        return None
    row = conn.execute("SELECT value FROM bridge_meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else None


def _make_schema(conn: psycopg.Connection[Any], dsn: str, version: int | None) -> None:
    """Make the tables, or upgrade them from `version`, holding the schema lock."""
    if version is not None and version > SCHEMA_VERSION:
        raise PostgresError(
            f"database {shown_dsn(dsn)} was set up by a newer agent-bridge (schema "
            f"{version}); upgrade agent-bridge on this machine"
        )
    if version == SCHEMA_VERSION:
        return
    for step in range(version or SCHEMA_VERSION, SCHEMA_VERSION):
        MIGRATIONS[step](conn)
    conn.execute(SCHEMA)
    conn.execute(
        "INSERT INTO bridge_meta VALUES ('schema_version', %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (str(SCHEMA_VERSION),),
    )
    if version is not None:
        get_logger(component="postgres").warning(
            "agent-bridge's tables were upgraded in place",
            database=shown_dsn(dsn),
            from_version=version,
            to_version=SCHEMA_VERSION,
        )


def first_line(err: BaseException) -> str:
    """An error's message, first line only (PostgreSQL's add a detail and a hint below); its type if it has none."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


# libpq quotes a URI it cannot parse whole, password included.
_URI_PASSWORD = re.compile(r"(://[^:/@\s\"]*):[^\s\"/]*@")
_KEYWORD_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")


def _without_password(text: str) -> str:
    return _KEYWORD_PASSWORD.sub(r"\1***", _URI_PASSWORD.sub(r"\1:***@", text))


def backoff() -> Iterator[float]:
    """Pauses between tries at a server that cannot be reached: from 50 ms, doubling up to 2 s, jittered so
    that many processes which lost it together do not all come back at the same instant."""
    delay = 0.05
    while True:
        yield delay * (0.5 + random.random())
        delay = min(delay * 2, 2.0)


class Database:
    """A few pooled connections; `run(operation)` is one transaction in a worker thread.

    A connection that breaks is dropped, and the call raises
    `PostgresUnavailable`; the next call connects again. Callers decide
    whether to retry (every operation of the queue is safe to retry).
    """

    def __init__(self, dsn: str, *, size: int = 4) -> None:
        require_psycopg()
        self.dsn = dsn
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._slots = trio.Semaphore(size)
        self._closed = False

    def check(self) -> None:
        """Connect once now (creating the tables if needed): a bad DSN fails here, before any work."""
        conn = connect(self.dsn, autocommit=True)
        with self._lock:
            self._idle.append(conn)

    async def run(self, operation: Callable[[psycopg.Connection[Any]], T], *, atomic: bool = True) -> T:
        """`operation(conn)` in a worker thread: in one transaction, or, with `atomic=False` (one statement,
        or statements that need not commit together), each statement on its own: a round trip less."""
        async with self._slots:
            return await trio.to_thread.run_sync(self._run, operation, atomic)

    async def run_retrying(
        self,
        operation: Callable[[psycopg.Connection[Any]], T],
        *,
        log: Logger | None = None,
        what: str = "",
        atomic: bool = True,
    ) -> T:
        """`run`, again and again while the server cannot be reached (backing off up to 2 s)."""
        pauses = backoff()
        while True:
            try:
                return await self.run(operation, atomic=atomic)
            except PostgresUnavailable as err:
                if log is not None:
                    log.warning("PostgreSQL unavailable; trying again", doing=what, error=str(err))
                await trio.sleep(next(pauses))

    def _run(self, operation: Callable[[psycopg.Connection[Any]], T], atomic: bool) -> T:
        psycopg = require_psycopg()
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed:
            conn = connect(self.dsn, autocommit=True)
        try:
            if atomic:
                with conn.transaction():
                    value = operation(conn)
            else:
                value = operation(conn)
        except psycopg.OperationalError as err:
            conn.close()
            raise PostgresUnavailable(f"{shown_dsn(self.dsn)}: {first_line(err)}") from None
        except psycopg.Error as err:
            if not conn.broken:
                with self._lock:
                    self._idle.append(conn)
                raise
            conn.close()  # the server ended the session (IDLE_IN_TRANSACTION_SECS): nothing of it was committed
            raise PostgresUnavailable(f"{shown_dsn(self.dsn)}: {first_line(err)}") from None
        except BaseException:
            if conn.broken:
                conn.close()
            else:
                with self._lock:
                    self._idle.append(conn)
            raise
        with self._lock:
            if self._closed:
                conn.close()
            else:
                self._idle.append(conn)
        return value

    def drop_idle(self) -> None:
        """Close the idle connections (the next calls connect afresh)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True  # a connection in use now is closed when its call returns
        self.drop_idle()


@dataclass(frozen=True, slots=True)
class Notification:
    channel: str
    payload: str
    sender: int  # the backend pid of the connection that notified


@dataclass(frozen=True, slots=True)
class Reconnected:
    """The listener lost its connection and has a new one: notifications in between were lost. `problem`: what
    `listen`'s `prepare` refused on the new connection (the listening goes on without it)."""

    problem: BridgeError | None = None


async def listen(
    dsn: str,
    channels: tuple[str, ...],
    deliver: Callable[[Notification | Reconnected], None],
    *,
    log: Logger,
    prepare: Callable[[psycopg.Connection[Any]], None] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Hand every notification of `channels` to `deliver`, forever; when the connection breaks, connect again
    and deliver `Reconnected` (what was notified in between is lost: the caller reads the tables again).

    `prepare(conn)` runs in a worker thread on every new connection, before
    its LISTEN: what it takes on the connection (a session-level advisory
    lock) is held for as long as the connection lives. A `BridgeError` it
    raises on the first connection ends `listen`, so `nursery.start` raises
    it; on a later one it is delivered as `Reconnected(problem)`.

    Reported started once the first LISTEN is in place.
    """
    psycopg = require_psycopg()
    pauses = backoff()
    first = True
    while True:
        try:
            conn = await trio.to_thread.run_sync(lambda: connect(dsn, autocommit=True))
        except PostgresUnavailable as err:
            log.warning("PostgreSQL unavailable; listening again soon", error=str(err))
            await trio.sleep(next(pauses))
            continue
        try:
            problem = None
            if prepare is not None:
                try:
                    await trio.to_thread.run_sync(prepare, conn)
                except BridgeError as err:
                    if first:
                        raise
                    problem = err
            for channel in channels:
                conn.execute(f"LISTEN {channel}")
            pauses = backoff()
            if first:
                first = False
                task_status.started()
            else:
                deliver(Reconnected(problem))
            pgconn = conn.pgconn
            while True:
                await trio.lowlevel.wait_readable(conn.fileno())
                pgconn.consume_input()  # raises OperationalError once the server is gone
                while (note := pgconn.notifies()) is not None:
                    deliver(Notification(note.relname.decode(), note.extra.decode(), note.be_pid))
        except (psycopg.OperationalError, OSError) as err:
            log.warning("the listening connection to PostgreSQL broke; reconnecting", error=first_line(err))
        finally:
            conn.close()


def notify_payloads(record: dict[str, Any], text_field: str | None = None) -> list[str]:
    """`record` as one or more NOTIFY payloads: a long `text_field` is cut into pieces that each fit."""
    payload = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    if len(payload.encode()) <= MAX_NOTIFY_BYTES or text_field is None:
        return [payload]
    text = record[text_field]
    rest = len(json.dumps({**record, text_field: ""}).encode())
    if rest >= MAX_NOTIFY_BYTES:
        return [payload]  # no piece of the text would fit: the caller finds it too large
    # A character takes at most 6 bytes in the payload (a \uXXXX escape, or up to 4 bytes of UTF-8).
    room = max(1, (MAX_NOTIFY_BYTES - rest) // 6)
    return [
        json.dumps({**record, text_field: text[start : start + room]}, ensure_ascii=False, separators=(",", ":"))
        for start in range(0, len(text), room)
    ]
