"""The durable turn queue: every statement the gateways and workers send, each a function of a connection.

Each function runs inside one transaction (`Database.run`) and is safe to run
again after a connection broke half-way: enqueue is idempotent by (gateway,
turn id), claiming a turn twice is impossible (the second claim finds it
running), and a result is written only by the attempt that holds the turn
(`attempt` fences a lost worker's late result off a newer one).

A turn's identity is a key of its own (`key`): the bot's id is unique per
gateway only, as bots choose their ids. Events, cancel and decide orders and
"done" notifications name the key, and a gateway learns only the keys of its
own turns, so it can never address another bot's turn; its statements also
name the gateway. A gateway's name is its bot's namespace: its turns'
conversations and sessions are apart from every other gateway's.

A turn's life: `queued` → (`claim`) `running` → (`finish`) `done`, or back to
`queued` in its place (`hand_back`, a lost worker's turn with `retry`), and
`delivered_at` once its gateway sent the result to the client.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ...engine.result import Outcome, TurnResult
from .db import WORK_CHANNEL, events_channel
from .json_codec import worker_lost_result

Conn = Any  # psycopg.Connection, imported lazily

MAX_ATTEMPTS = 3  # a turn whose worker is lost this many times ends with worker_lost, whatever its profile says
RECLAIM_MARGIN_SECS = 1.0  # past a lapsed lease and the agent's kill grace, before another worker may take a turn


# By profile name, what a worker claims with: the agent's kill grace, `retry` or `fail` (what the reaper needs
# should the worker be lost), and the sha256 of the profile's file (only turns queued for it are claimed).
ProfileTerms = tuple[float, Literal["retry", "fail"], str]
# Shown of a profile's hash in messages: enough to tell two definitions apart.
SHOWN_HASH_CHARS = 12


@dataclass(frozen=True, slots=True)
class ClaimedTurn:
    key: str
    gateway: str  # also the namespace of the turn's session
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
class Enqueued:
    outcome: Literal["queued", "resent", "full"]
    key: str | None  # the turn's: the new one's, or, for a resend, the turn the gateway queued before
    profile_hash: str | None = None  # the definition of the profile recorded for the turn (None: any)
    definitions: int = 0  # how many different definitions of the profile the live workers advertised


@dataclass(frozen=True, slots=True)
class TurnEnding:
    state: str
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    request_id: Any


def enqueue(
    conn: Conn,
    *,
    key: str,
    turn_id: str,
    request_id: Any,
    gateway: str,
    profile: str,
    conversation: str,
    session_name: str,
    turn: dict[str, Any],
    max_queued: int,
) -> Enqueued:
    """Queue a turn under `key`; a `turn_id` this gateway queued before is a resend (nothing changes, and the
    earlier turn's key comes back), and a gateway with `max_queued` turns waiting refuses it.

    The turn records the definition of its profile the live workers
    advertise: the one most of them have, a tie going to the one advertised
    last. One statement (queued and notified together), so it needs no
    transaction of its own."""
    row = conn.execute(
        """
        WITH advertised AS (
            SELECT w.profiles ->> %(profile)s AS hash, count(*) AS workers, max(w.profiles_at) AS latest
            FROM bridge_workers w WHERE NOT w.draining AND w.profiles ->> %(profile)s IS NOT NULL
            GROUP BY 1),
        queued AS (
            INSERT INTO bridge_turns (key, gateway, turn_id, request_id, profile, profile_hash, conversation,
                                      session_name, turn)
            SELECT %(key)s, %(gateway)s, %(turn_id)s, %(request_id)s, %(profile)s,
                   (SELECT hash FROM advertised ORDER BY workers DESC, latest DESC LIMIT 1),
                   %(conversation)s, %(session_name)s, %(turn)s
            WHERE (SELECT count(*) FROM bridge_turns WHERE state = 'queued' AND gateway = %(gateway)s)
                  < %(max_queued)s
            ON CONFLICT (gateway, turn_id) DO NOTHING
            RETURNING profile_hash)
        SELECT profile_hash, (SELECT count(*) FROM advertised), pg_notify(%(work)s, '') FROM queued
        """,
        {
            "key": key,
            "gateway": gateway,
            "turn_id": turn_id,
            "request_id": json.dumps(request_id),
            "profile": profile,
            "conversation": conversation,
            "session_name": session_name,
            "turn": json.dumps(turn),
            "max_queued": max_queued,
            "work": WORK_CHANNEL,
        },
    ).fetchone()
    if row is not None:
        return Enqueued("queued", key, row[0], int(row[1]))
    earlier = key_of(conn, gateway=gateway, turn_id=turn_id)
    return Enqueued("resent", earlier) if earlier is not None else Enqueued("full", None)


def key_of(conn: Conn, *, gateway: str, turn_id: str) -> str | None:
    """The key of the turn `gateway` queued as `turn_id`, if the queue still knows it."""
    row = conn.execute(
        "SELECT key FROM bridge_turns WHERE gateway = %s AND turn_id = %s", (gateway, turn_id)
    ).fetchone()
    return row[0] if row is not None else None


def claim(conn: Conn, *, worker: str, lease_secs: float, settings: dict[str, ProfileTerms]) -> ClaimedTurn | None:
    """Take the oldest queued turn of a conversation that has no turn running, or None. One statement.

    Only turns of profiles in `settings` are taken, and of those only turns
    queued for the same definition (their `profile_hash` is the file's hash
    in `settings`, or none was recorded). Turns locked by another worker's
    claim are skipped; so is every later turn of their conversation (the
    oldest one is still queued). Should two claims race past that anyway,
    the unique index on running turns refuses the second (an IntegrityError:
    the caller tries again).
    """
    row = conn.execute(
        """
        WITH candidate AS (
            SELECT t.key FROM bridge_turns t
            WHERE t.state = 'queued' AND NOT t.cancel_requested
              AND %(settings)s::jsonb -> t.profile ->> 2
                  = COALESCE(t.profile_hash, %(settings)s::jsonb -> t.profile ->> 2)
              AND NOT EXISTS (SELECT 1 FROM bridge_turns r WHERE r.state = 'running' AND r.gateway = t.gateway
                              AND r.profile = t.profile AND r.conversation = t.conversation
                              AND r.session_name = t.session_name)
              AND NOT EXISTS (SELECT 1 FROM bridge_turns e WHERE e.state = 'queued' AND e.gateway = t.gateway
                              AND e.profile = t.profile AND e.conversation = t.conversation
                              AND e.session_name = t.session_name AND e.seq < t.seq)
            ORDER BY t.seq
            LIMIT 1
            FOR UPDATE OF t SKIP LOCKED)
        UPDATE bridge_turns u SET state = 'running', attempt = u.attempt + 1, worker = %(worker)s,
            lease_until = now() + make_interval(secs => %(lease)s),
            kill_grace_secs = COALESCE((%(settings)s::jsonb -> u.profile ->> 0)::float8, 0),
            on_worker_lost = COALESCE(%(settings)s::jsonb -> u.profile ->> 1, 'retry'),
            started_at = now(), unmatched_since = NULL
        FROM candidate WHERE u.key = candidate.key
        RETURNING u.key, u.gateway, u.profile, u.conversation, u.session_name, u.turn, u.attempt
        """,
        {"worker": worker, "lease": lease_secs, "settings": json.dumps(settings)},
    ).fetchone()
    return ClaimedTurn(*row) if row is not None else None


def finish(
    conn: Conn,
    *,
    key: str,
    attempt: int,
    worker: str,
    result: TurnResult | None = None,
    error: dict[str, Any] | None = None,
    record_session: Callable[[Conn, str, str, str, str, TurnResult], None] | None = None,
    store_files: Callable[[Conn, str, TurnResult], TurnResult] | None = None,
) -> bool:
    """The turn's result (or error), its session, its files and its gateway's notification: one transaction.

    `record_session(conn, namespace, profile, conversation, session_name,
    result)` writes the session; `store_files(conn, key, result)` the bytes
    of `result.files`, returning the result as stored. False when the turn is
    no longer this attempt's (the worker lost it): nothing is written.
    """
    if result is not None and result.files and store_files is not None:
        held = conn.execute(
            "SELECT 1 FROM bridge_turns WHERE key = %s AND attempt = %s AND worker = %s AND state = 'running' "
            "FOR UPDATE",
            (key, attempt, worker),
        ).fetchone()
        if held is None:
            return False
        result = store_files(conn, key, result)
    row = conn.execute(
        f"""
        UPDATE bridge_turns SET state = 'done', {_ENDING}, finished_at = now(), lease_until = NULL
        WHERE key = %s AND attempt = %s AND worker = %s AND state = 'running'
        RETURNING gateway, profile, conversation, session_name
        """,
        (*_ending(result.to_dict() if result is not None else None, error), key, attempt, worker),
    ).fetchone()
    if row is None:
        return False
    gateway, profile, conversation, session_name = row
    if result is not None and record_session is not None:
        record_session(conn, gateway, profile, conversation, session_name, result)
    _notify_done(conn, gateway, key)
    return True


_ENDING = "result = %s, error = %s, outcome = %s, exit_code = %s"


def _ending(result: dict[str, Any] | None, error: dict[str, Any] | None) -> tuple[Any, ...]:
    """The values of `_ENDING`: outcome and exit code have columns of their own, as PostgreSQL cannot read a
    field of a json value holding a NUL character (an agent's reply may)."""
    return (
        json.dumps(result) if result is not None else None,
        json.dumps(error) if error else None,
        result["outcome"] if result is not None else None,
        result["exit_code"] if result is not None else None,
    )


def _notify_done(conn: Conn, gateway: str, key: str) -> None:
    conn.execute(
        "SELECT pg_notify(%s, %s), pg_notify(%s, '')",
        (events_channel(gateway), json.dumps({"t": key, "done": True}), WORK_CHANNEL),
    )


def hand_back(conn: Conn, *, key: str, attempt: int, worker: str) -> bool:
    """Put a turn this worker holds back in its place in the queue (a draining worker could not finish it)."""
    row = conn.execute(
        """
        UPDATE bridge_turns SET state = 'queued', worker = NULL, lease_until = NULL
        WHERE key = %s AND attempt = %s AND worker = %s AND state = 'running'
        RETURNING key
        """,
        (key, attempt, worker),
    ).fetchone()
    if row is not None:
        conn.execute("SELECT pg_notify(%s, '')", (WORK_CHANNEL,))
    return row is not None


def register(conn: Conn, *, worker: str, host: str, pid: int, max_concurrent: int, profiles: dict[str, str]) -> None:
    """Say this worker is alive, on the connection whose end says it died, with the profiles it has
    ({name: sha256 of its file})."""
    conn.execute(
        """
        INSERT INTO bridge_workers (id, host, pid, backend_pid, backend_start, max_concurrent, profiles)
        SELECT %s, %s, %s, pg_backend_pid(), backend_start, %s, %s FROM pg_stat_activity
        WHERE pid = pg_backend_pid()
        ON CONFLICT (id) DO UPDATE SET backend_pid = excluded.backend_pid, backend_start = excluded.backend_start,
            seen_at = now(), profiles = excluded.profiles,
            profiles_at = CASE WHEN bridge_workers.profiles = excluded.profiles THEN bridge_workers.profiles_at
                               ELSE now() END
        """,
        (worker, host, pid, max_concurrent, json.dumps(profiles)),
    )


def advertise(conn: Conn, *, worker: str, profiles: dict[str, str]) -> None:
    """The profiles this worker has now ({name: sha256 of its file}), as its registry re-read them."""
    conn.execute(
        "UPDATE bridge_workers SET profiles = %s, profiles_at = now() WHERE id = %s AND profiles <> %s",
        (json.dumps(profiles), worker, json.dumps(profiles)),
    )


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
        WHERE worker = %s AND state = 'running' AND key = ANY(%s)
        RETURNING key, attempt, cancel_requested
        """,
        (lease_secs, worker, running),
    ).fetchall()
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
        """
    )
    rows = conn.execute(
        """
        SELECT key, gateway, attempt, on_worker_lost, EXTRACT(EPOCH FROM now() - started_at) * 1000
        FROM bridge_turns
        WHERE state = 'running'
          AND lease_until + make_interval(secs => kill_grace_secs + %s) < now()
        FOR UPDATE SKIP LOCKED
        """,
        (RECLAIM_MARGIN_SECS,),
    ).fetchall()
    touched = []
    for key, gateway, attempt, on_lost, elapsed_ms in rows:
        if on_lost == "retry" and attempt < MAX_ATTEMPTS:
            conn.execute(
                "UPDATE bridge_turns SET state = 'queued', worker = NULL, lease_until = NULL WHERE key = %s", (key,)
            )
        else:
            why = (
                f"its worker was lost {attempt} times"
                if on_lost == "retry"
                else "its worker stopped before the turn finished, and the profile says on_worker_lost: fail"
            )
            conn.execute(
                f"UPDATE bridge_turns SET state = 'done', {_ENDING}, finished_at = now(), lease_until = NULL "
                "WHERE key = %s",
                (*_ending(worker_lost_result(int(elapsed_ms or 0), why), None), key),
            )
            _notify_done(conn, gateway, key)
        touched.append(key)
    if touched:
        conn.execute("SELECT pg_notify(%s, '')", (WORK_CHANNEL,))
    return touched


def end_unrunnable(conn: Conn, *, wait_secs: float) -> list[str]:
    """End the queued turns no live worker could run for `wait_secs`: the keys ended.

    A queued turn is unrunnable while no live worker (not draining) has its
    profile as it was queued: under that name, with the recorded hash if
    there is one. The first round that finds it so stamps `unmatched_since`;
    a worker that has it clears the stamp. Past the wait, the turn ends with
    `unknown_profile` (no live worker has a profile of that name) or
    `profile_mismatch` (some have another definition), naming what they have.
    """
    conn.execute(
        """
        WITH changed AS (
            SELECT t.key FROM bridge_turns t
            WHERE t.state = 'queued' AND NOT t.cancel_requested
              AND (t.unmatched_since IS NULL) = NOT EXISTS (
                  SELECT 1 FROM bridge_workers w WHERE NOT w.draining
                  AND w.profiles ->> t.profile = COALESCE(t.profile_hash, w.profiles ->> t.profile))
            FOR UPDATE OF t SKIP LOCKED)
        UPDATE bridge_turns t SET unmatched_since = CASE WHEN t.unmatched_since IS NULL THEN now() END
        FROM changed WHERE t.key = changed.key
        """
    )
    rows = conn.execute(
        """
        SELECT key, gateway, profile, profile_hash FROM bridge_turns
        WHERE state = 'queued' AND NOT cancel_requested AND unmatched_since < now() - make_interval(secs => %s)
        FOR UPDATE SKIP LOCKED
        """,
        (wait_secs,),
    ).fetchall()
    if not rows:
        return []
    workers = conn.execute("SELECT id, profiles FROM bridge_workers WHERE NOT draining ORDER BY id").fetchall()
    for key, gateway, profile, profile_hash in rows:
        conn.execute(
            "UPDATE bridge_turns SET state = 'done', error = %s, finished_at = now() WHERE key = %s",
            (json.dumps(_unrunnable(profile, profile_hash, workers, wait_secs)), key),
        )
        _notify_done(conn, gateway, key)
    return [key for key, *_ in rows]


def _unrunnable(
    profile: str, profile_hash: str | None, workers: list[tuple[str, dict[str, str]]], wait_secs: float
) -> dict[str, str]:
    """The error of a turn no live worker could run: what they have instead, and what to do."""
    others = [(worker, profiles[profile]) for worker, profiles in workers if profile in profiles]
    waited = f"the turn waited {wait_secs:g} s"
    if not others:
        names = sorted({name for _, profiles in workers for name in profiles})
        shown = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        return {
            "code": "unknown_profile",
            "message": f"no live worker has a profile named {profile!r} (they have: {shown or 'none'}); "
            f"{waited}. Add {profile}.yaml to the workers' profiles directories, or use one of "
            "those names",
        }
    have = "; ".join(f"{worker} has sha256:{digest[:SHOWN_HASH_CHARS]}" for worker, digest in others[:10])
    wanted = (profile_hash or "")[:SHOWN_HASH_CHARS]
    return {
        "code": "profile_mismatch",
        "message": f"profile {profile!r} was queued for its definition sha256:{wanted}, which no live worker "
        f"has ({have}); {waited}. Give every worker the same {profile}.yaml",
    }


def mismatched(conn: Conn, *, profiles: dict[str, str]) -> list[tuple[str, str]]:
    """(profile, hash) of the queued turns this worker skips only because it has another definition of their
    profile ({name: sha256} of its own)."""
    return [
        (profile, digest)
        for profile, digest in conn.execute(
            """
        SELECT DISTINCT profile, profile_hash FROM bridge_turns
        WHERE state = 'queued' AND profile_hash IS NOT NULL AND %(mine)s::jsonb ->> profile <> profile_hash
        """,
            {"mine": json.dumps(profiles)},
        ).fetchall()
    ]


def request_cancel(conn: Conn, *, gateway: str, key: str) -> str | None:
    """Flag a queued or running turn of `gateway` cancelled; its state, or None when it is neither."""
    row = conn.execute(
        "UPDATE bridge_turns SET cancel_requested = true WHERE key = %s AND gateway = %s AND state <> 'done' "
        "RETURNING state",
        (key, gateway),
    ).fetchone()
    return row[0] if row else None


def end_cancelled(conn: Conn, *, ending_of: Any) -> str | None:
    """End one queued turn that was cancelled, whatever runs in its conversation (it never runs): its key,
    or None. `ending_of(profile name)` gives its (result, error)."""
    row = conn.execute(
        "SELECT key, gateway, profile FROM bridge_turns WHERE state = 'queued' AND cancel_requested "
        "ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED"
    ).fetchone()
    if row is None:
        return None
    key: str  # a text column
    key, gateway, profile = row
    result, error = ending_of(profile)
    conn.execute(
        f"UPDATE bridge_turns SET state = 'done', {_ENDING}, finished_at = now() WHERE key = %s",
        (*_ending(result.to_dict() if result is not None else None, error), key),
    )
    _notify_done(conn, gateway, key)
    return key


def ending(conn: Conn, *, gateway: str, key: str) -> TurnEnding | None:
    row = conn.execute(
        "SELECT state, result, error, request_id FROM bridge_turns WHERE key = %s AND gateway = %s", (key, gateway)
    ).fetchone()
    return TurnEnding(*row) if row is not None else None


def undelivered(conn: Conn, *, gateway: str) -> list[tuple[str, str, Any]]:
    """(turn id, key, client's id) of this gateway's turns whose result the client has not been sent, oldest
    first."""
    return [
        (turn_id, key, request_id)
        for turn_id, key, request_id in conn.execute(
            "SELECT turn_id, key, request_id FROM bridge_turns"
            " WHERE gateway = %s AND delivered_at IS NULL ORDER BY seq",
            (gateway,),
        ).fetchall()
    ]


def mark_delivered(conn: Conn, *, gateway: str, turn_id: str) -> None:
    """The bot has the turn's result: it is not sent again, and the files stored with it are no longer needed."""
    conn.execute(
        "DELETE FROM bridge_turn_files WHERE key = "
        "(SELECT key FROM bridge_turns WHERE gateway = %s AND turn_id = %s AND state = 'done')",
        (gateway, turn_id),
    )
    conn.execute(
        "UPDATE bridge_turns SET delivered_at = now() WHERE gateway = %s AND turn_id = %s AND state = 'done'",
        (gateway, turn_id),
    )


def purge(conn: Conn, *, keep_secs: float) -> int:
    """Forget delivered turns older than `keep_secs` (a resend of their id is then a new turn)."""
    return int(
        conn.execute(
            "DELETE FROM bridge_turns WHERE state = 'done' AND delivered_at IS NOT NULL "
            "AND delivered_at < now() - make_interval(secs => %s)",
            (keep_secs,),
        ).rowcount
    )


# ---------------------------------------------------------------------------- gateway names


@dataclass(frozen=True, slots=True)
class NameHolder:
    """Who holds a gateway name: the connection holding its lock, and what that gateway recorded of itself
    (None where it recorded nothing, or another connection holds the lock)."""

    backend_pid: int
    backend_start: datetime | None
    host: str | None
    pid: int | None
    since: datetime | None


def gateway_lock_key(name: str) -> int:
    """The advisory lock a live gateway named `name` holds: 64 bits of a hash, apart from conversations'."""
    digest = hashlib.sha256(b"agent-bridge gateway name\0" + name.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def take_gateway_name(conn: Conn, *, name: str, host: str, pid: int) -> tuple[bool, NameHolder | None]:
    """Take gateway name `name`'s advisory lock on `conn` (a session lock: held until the connection ends)
    and record this gateway in `bridge_gateways`: (True, this one). When another connection holds it:
    (False, that holder), or (False, None) if it let go meanwhile (try again)."""
    key = gateway_lock_key(name)
    if conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
        row = conn.execute(
            """
            INSERT INTO bridge_gateways AS g (name, host, pid, backend_pid, backend_start)
            SELECT %s, %s, %s, pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
            ON CONFLICT (name) DO UPDATE SET host = excluded.host, pid = excluded.pid,
                backend_pid = excluded.backend_pid, backend_start = excluded.backend_start, since = now()
            RETURNING backend_pid, backend_start, host, pid, since
            """,
            (name, host, pid),
        ).fetchone()
        return True, NameHolder(*row)
    unsigned = key & ((1 << 64) - 1)
    row = conn.execute(
        """
        SELECT l.pid, a.backend_start, g.host, g.pid, g.since FROM pg_locks l
        LEFT JOIN pg_stat_activity a ON a.pid = l.pid
        LEFT JOIN bridge_gateways g ON g.name = %s AND g.backend_pid = l.pid
                                   AND g.backend_start IS NOT DISTINCT FROM a.backend_start
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        """,
        (name, unsigned >> 32, unsigned & 0xFFFFFFFF),
    ).fetchone()
    return False, (NameHolder(*row) if row is not None else None)


def queued_count(conn: Conn) -> int:
    """The turns waiting in the queue for a worker, every gateway's."""
    count: int = conn.execute("SELECT count(*) FROM bridge_turns WHERE state = 'queued'").fetchone()[0]
    return count


def stats(conn: Conn) -> dict[str, Any]:
    counts = dict(conn.execute("SELECT state, count(*) FROM bridge_turns GROUP BY state").fetchall())
    outcomes = dict(
        conn.execute(
            "SELECT outcome, count(*) FROM bridge_turns WHERE state = 'done' AND outcome IS NOT NULL GROUP BY 1"
        ).fetchall()
    )
    failed = conn.execute(
        "SELECT count(*) FROM bridge_turns WHERE state = 'done' AND (error IS NOT NULL OR exit_code <> 0)"
    ).fetchone()[0]
    workers = [
        {"id": worker, "host": host, "pid": pid, "max_concurrent": limit, "draining": draining, "running": running}
        for worker, host, pid, limit, draining, running in conn.execute(
            """
            SELECT w.id, w.host, w.pid, w.max_concurrent, w.draining,
                   (SELECT count(*) FROM bridge_turns t WHERE t.worker = w.id AND t.state = 'running')
            FROM bridge_workers w ORDER BY w.started_at
            """
        ).fetchall()
    ]
    return {
        "running": counts.get("running", 0),
        "queued": counts.get("queued", 0),
        "completed": counts.get("done", 0),
        "failed": failed,
        "outcomes": {outcome.value: outcomes.get(outcome.value, 0) for outcome in Outcome},
        "max_concurrent": sum(worker["max_concurrent"] for worker in workers if not worker["draining"]),
        "workers": workers,
    }
