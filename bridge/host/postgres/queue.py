"""The durable turn queue: every statement the gateways and workers send, each a function of a connection.

Each function runs inside one transaction (`Database.run`) and is safe to run
again after a connection broke half-way: enqueue is idempotent by turn id,
claiming a turn twice is impossible (the second claim finds it running), and
a result is written only by the attempt that holds the turn (`attempt` fences
a lost worker's late result off a newer one).

A turn's life: `queued` → (`claim`) `running` → (`finish`) `done`, or back to
`queued` in its place (`hand_back`, a lost worker's turn with `retry`), and
`delivered_at` once its gateway sent the result to the client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ...result import Outcome, TurnResult
from .db import EVENTS_CHANNEL, WORK_CHANNEL
from .records import worker_lost_result

if TYPE_CHECKING:
    pass

Conn = Any  # psycopg.Connection, imported lazily

MAX_ATTEMPTS = 3  # a turn whose worker is lost this many times ends with worker_lost, whatever its profile says
RECLAIM_MARGIN_SECS = 1.0  # past a lapsed lease and the agent's kill grace, before another worker may take a turn


@dataclass(frozen=True, slots=True)
class ClaimedTurn:
    key: str
    request_id: Any
    profile: str
    conversation: str
    session_name: str
    turn: dict[str, Any]
    attempt: int

    @property
    def stamp(self) -> str:
        """The session record's stamp this attempt writes (the warm pool compares stamps)."""
        return f"{self.key}#{self.attempt}"


@dataclass(frozen=True, slots=True)
class TurnEnding:
    state: str
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    request_id: Any


def enqueue(conn: Conn, *, key: str, request_id: Any, gateway: str, profile: str, conversation: str,
            session_name: str, turn: dict[str, Any], max_queued: int) -> Literal["queued", "resent", "full"]:
    """Queue a turn; a key already known is a resend (nothing changes), and a full queue refuses it.

    One statement (queued and notified together), so it needs no transaction of its own."""
    row = conn.execute(
        """
        WITH queued AS (
            INSERT INTO bridge_turns (id, gateway, request_id, profile, conversation, session_name, turn)
            SELECT %s, %s, %s, %s, %s, %s, %s
            WHERE (SELECT count(*) FROM bridge_turns WHERE state = 'queued') < %s
            ON CONFLICT (id) DO NOTHING
            RETURNING seq)
        SELECT pg_notify(%s, '') FROM queued
        """,
        (key, gateway, json.dumps(request_id), profile, conversation, session_name, json.dumps(turn), max_queued,
         WORK_CHANNEL),
    ).fetchone()
    if row is not None:
        return "queued"
    if conn.execute("SELECT 1 FROM bridge_turns WHERE id = %s", (key,)).fetchone() is not None:
        return "resent"
    return "full"


def claim(conn: Conn, *, worker: str, lease_secs: float,
          settings: dict[str, tuple[float, str]]) -> ClaimedTurn | None:
    """Take the oldest queued turn of a conversation that has no turn running, or None. One statement.

    Turns locked by another worker's claim are skipped; so is every later
    turn of their conversation (the oldest one is still queued). Should two
    claims race past that anyway, the unique index on running turns refuses
    the second (an IntegrityError: the caller tries again). `settings` has,
    by profile name, what the reaper needs should this worker be lost: the
    agent's kill grace, and `retry` or `fail`.
    """
    row = conn.execute(
        """
        WITH candidate AS (
            SELECT t.id FROM bridge_turns t
            WHERE t.state = 'queued' AND NOT t.cancel_requested
              AND NOT EXISTS (SELECT 1 FROM bridge_turns r WHERE r.state = 'running' AND r.profile = t.profile
                              AND r.conversation = t.conversation AND r.session_name = t.session_name)
              AND NOT EXISTS (SELECT 1 FROM bridge_turns e WHERE e.state = 'queued' AND e.profile = t.profile
                              AND e.conversation = t.conversation AND e.session_name = t.session_name
                              AND e.seq < t.seq)
            ORDER BY t.seq
            LIMIT 1
            FOR UPDATE OF t SKIP LOCKED)
        UPDATE bridge_turns u SET state = 'running', attempt = u.attempt + 1, worker = %(worker)s,
            lease_until = now() + make_interval(secs => %(lease)s),
            kill_grace_secs = COALESCE((%(settings)s::jsonb -> u.profile ->> 0)::float8, 0),
            on_worker_lost = COALESCE(%(settings)s::jsonb -> u.profile ->> 1, 'retry'),
            started_at = now()
        FROM candidate WHERE u.id = candidate.id
        RETURNING u.id, u.request_id, u.profile, u.conversation, u.session_name, u.turn, u.attempt
        """,
        {"worker": worker, "lease": lease_secs, "settings": json.dumps(settings)},
    ).fetchone()
    return ClaimedTurn(*row) if row is not None else None


def finish(conn: Conn, *, key: str, attempt: int, worker: str, result: TurnResult | None = None,
           error: dict[str, Any] | None = None, record_session: Any = None) -> bool:
    """The turn's result (or error), its session and the gateways' notification: one transaction.

    False when the turn is no longer this attempt's (the worker lost it): nothing is written.
    """
    row = conn.execute(
        f"""
        UPDATE bridge_turns SET state = 'done', {_ENDING}, finished_at = now(), lease_until = NULL
        WHERE id = %s AND attempt = %s AND worker = %s AND state = 'running'
        RETURNING profile, conversation, session_name
        """,
        (*_ending(result.to_dict() if result is not None else None, error), key, attempt, worker),
    ).fetchone()
    if row is None:
        return False
    if result is not None and record_session is not None:
        record_session(conn, *row, result)
    _notify_done(conn, key)
    return True


_ENDING = "result = %s, error = %s, outcome = %s, exit_code = %s"


def _ending(result: dict[str, Any] | None, error: dict[str, Any] | None) -> tuple[Any, ...]:
    """The values of `_ENDING`: outcome and exit code have columns of their own, as PostgreSQL cannot read a
    field of a json value holding a NUL character (an agent's reply may)."""
    return (json.dumps(result) if result is not None else None, json.dumps(error) if error else None,
            result["outcome"] if result is not None else None, result["exit_code"] if result is not None else None)


def _notify_done(conn: Conn, key: str) -> None:
    conn.execute("SELECT pg_notify(%s, %s), pg_notify(%s, '')",
                 (EVENTS_CHANNEL, json.dumps({"t": key, "done": True}), WORK_CHANNEL))


def hand_back(conn: Conn, *, key: str, attempt: int, worker: str) -> bool:
    """Put a turn this worker holds back in its place in the queue (a draining worker could not finish it)."""
    row = conn.execute(
        """
        UPDATE bridge_turns SET state = 'queued', worker = NULL, lease_until = NULL
        WHERE id = %s AND attempt = %s AND worker = %s AND state = 'running'
        RETURNING id
        """, (key, attempt, worker)).fetchone()
    if row is not None:
        conn.execute("SELECT pg_notify(%s, '')", (WORK_CHANNEL,))
    return row is not None


def register(conn: Conn, *, worker: str, host: str, pid: int, max_concurrent: int) -> None:
    conn.execute(
        """
        INSERT INTO bridge_workers (id, host, pid, backend_pid, backend_start, max_concurrent)
        SELECT %s, %s, %s, pg_backend_pid(), backend_start, %s FROM pg_stat_activity WHERE pid = pg_backend_pid()
        ON CONFLICT (id) DO UPDATE SET backend_pid = excluded.backend_pid, backend_start = excluded.backend_start,
            seen_at = now()
        """, (worker, host, pid, max_concurrent))


def unregister(conn: Conn, *, worker: str) -> None:
    conn.execute("DELETE FROM bridge_workers WHERE id = %s", (worker,))


def set_draining(conn: Conn, *, worker: str) -> None:
    conn.execute("UPDATE bridge_workers SET draining = true WHERE id = %s", (worker,))


def renew(conn: Conn, *, worker: str, lease_secs: float, running: list[str]) -> dict[str, tuple[int, bool]]:
    """Extend the leases of the turns this worker still runs (`running`: a turn it gave up on must lapse);
    {key: (attempt, cancel requested)} of those it holds."""
    conn.execute("UPDATE bridge_workers SET seen_at = now() WHERE id = %s", (worker,))
    rows = conn.execute(
        """
        UPDATE bridge_turns SET lease_until = now() + make_interval(secs => %s)
        WHERE worker = %s AND state = 'running' AND id = ANY(%s)
        RETURNING id, attempt, cancel_requested
        """, (lease_secs, worker, running)).fetchall()
    return {key: (attempt, cancel) for key, attempt, cancel in rows}


def reap(conn: Conn) -> list[str]:
    """Find lost workers and put their turns back (or end them with worker_lost): the keys it touched.

    A worker is lost when its registration connection is gone while the
    server kept running (a server restart drops every connection: that is
    not a worker dying), or when its turns' leases lapsed. Its turns are
    taken only once their agents' kill grace has passed too: by then the
    lost worker (its lease watchdog, or its keeper process when it was
    killed) has stopped them.
    """
    conn.execute(
        """
        WITH lost AS (
            DELETE FROM bridge_workers w
            WHERE w.backend_start >= pg_postmaster_start_time()
              AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                              WHERE a.pid = w.backend_pid AND a.backend_start = w.backend_start)
            RETURNING w.id)
        UPDATE bridge_turns SET lease_until = LEAST(lease_until, now())
        WHERE state = 'running' AND worker IN (SELECT id FROM lost)
        """)
    rows = conn.execute(
        """
        SELECT id, attempt, on_worker_lost, EXTRACT(EPOCH FROM now() - started_at) * 1000
        FROM bridge_turns
        WHERE state = 'running'
          AND lease_until + make_interval(secs => kill_grace_secs + %s) < now()
        FOR UPDATE SKIP LOCKED
        """, (RECLAIM_MARGIN_SECS,)).fetchall()
    touched = []
    for key, attempt, on_lost, elapsed_ms in rows:
        if on_lost == "retry" and attempt < MAX_ATTEMPTS:
            conn.execute("UPDATE bridge_turns SET state = 'queued', worker = NULL, lease_until = NULL "
                         "WHERE id = %s", (key,))
        else:
            why = (f"its worker was lost {attempt} times" if on_lost == "retry"
                   else "its worker stopped before the turn finished, and the profile says on_worker_lost: fail")
            conn.execute(
                f"UPDATE bridge_turns SET state = 'done', {_ENDING}, finished_at = now(), lease_until = NULL "
                "WHERE id = %s", (*_ending(worker_lost_result(int(elapsed_ms or 0), why), None), key))
            _notify_done(conn, key)
        touched.append(key)
    if touched:
        conn.execute("SELECT pg_notify(%s, '')", (WORK_CHANNEL,))
    return touched


def request_cancel(conn: Conn, *, key: str) -> str | None:
    """Flag a queued or running turn cancelled; its state, or None when it is neither (unknown or done)."""
    row = conn.execute(
        "UPDATE bridge_turns SET cancel_requested = true WHERE id = %s AND state <> 'done' RETURNING state",
        (key,)).fetchone()
    return row[0] if row else None


def end_cancelled(conn: Conn, *, ending_of: Any) -> str | None:
    """End one queued turn that was cancelled, whatever runs in its conversation (it never runs): its key,
    or None. `ending_of(profile name)` gives its (result, error)."""
    row = conn.execute(
        "SELECT id, profile FROM bridge_turns WHERE state = 'queued' AND cancel_requested "
        "ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED").fetchone()
    if row is None:
        return None
    key, profile = row
    result, error = ending_of(profile)
    conn.execute(f"UPDATE bridge_turns SET state = 'done', {_ENDING}, finished_at = now() WHERE id = %s",
                 (*_ending(result.to_dict() if result is not None else None, error), key))
    _notify_done(conn, key)
    return key  # type: ignore[no-any-return]


def ending(conn: Conn, *, key: str) -> TurnEnding | None:
    row = conn.execute("SELECT state, result, error, request_id FROM bridge_turns WHERE id = %s",
                       (key,)).fetchone()
    return TurnEnding(*row) if row is not None else None


def undelivered(conn: Conn, *, gateway: str) -> list[tuple[str, Any]]:
    """(key, client's id) of this gateway's turns whose result the client has not been sent, oldest first."""
    return [(key, request_id) for key, request_id in conn.execute(
        "SELECT id, request_id FROM bridge_turns WHERE gateway = %s AND delivered_at IS NULL ORDER BY seq",
        (gateway,)).fetchall()]


def mark_delivered(conn: Conn, *, key: str) -> None:
    conn.execute("UPDATE bridge_turns SET delivered_at = now() WHERE id = %s AND state = 'done'", (key,))


def purge(conn: Conn, *, keep_secs: float) -> int:
    """Forget delivered turns older than `keep_secs` (a resend of their id is then a new turn)."""
    return int(conn.execute(
        "DELETE FROM bridge_turns WHERE state = 'done' AND delivered_at IS NOT NULL "
        "AND delivered_at < now() - make_interval(secs => %s)", (keep_secs,)).rowcount)


def stats(conn: Conn) -> dict[str, Any]:
    counts = dict(conn.execute("SELECT state, count(*) FROM bridge_turns GROUP BY state").fetchall())
    outcomes = dict(conn.execute(
        "SELECT outcome, count(*) FROM bridge_turns WHERE state = 'done' AND outcome IS NOT NULL "
        "GROUP BY 1").fetchall())
    failed = conn.execute(
        "SELECT count(*) FROM bridge_turns WHERE state = 'done' AND (error IS NOT NULL OR exit_code <> 0)"
    ).fetchone()[0]
    workers = [
        {"id": worker, "host": host, "pid": pid, "max_concurrent": limit, "draining": draining,
         "running": running}
        for worker, host, pid, limit, draining, running in conn.execute(
            """
            SELECT w.id, w.host, w.pid, w.max_concurrent, w.draining,
                   (SELECT count(*) FROM bridge_turns t WHERE t.worker = w.id AND t.state = 'running')
            FROM bridge_workers w ORDER BY w.started_at
            """).fetchall()]
    return {"running": counts.get("running", 0), "queued": counts.get("queued", 0),
            "completed": counts.get("done", 0), "failed": failed,
            "outcomes": {outcome.value: outcomes.get(outcome.value, 0) for outcome in Outcome},
            "max_concurrent": sum(worker["max_concurrent"] for worker in workers if not worker["draining"]),
            "workers": workers}
