"""The turn queue's statements against a real PostgreSQL: ordering, exclusivity, fencing, the lost and the found."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import turn_result

from bridge.dialects.events import FileEvent
from bridge.engine.result import TurnResult
from bridge.files.outbox import collect, remove_outbox
from bridge.host.postgres import fleet_files, queue
from bridge.host.postgres.db import SCHEMA_VERSION, connect

TURN = {"message": "hi", "session_id": "", "session_name": "default", "from_user": "", "attachments": []}


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with connect(pg_dsn, autocommit=True) as conn:
        yield conn


def enqueue(conn: Any, key: str, conversation: str = "c", max_queued: int = 100) -> str:
    """Queue turn `key` (its key and the bot's id alike) of gateway "g"."""
    return queue.enqueue(
        conn,
        key=key,
        turn_id=key,
        request_id=key,
        gateway="g",
        profile="p",
        conversation=conversation,
        session_name="default",
        turn=TURN,
        max_queued=max_queued,
    ).outcome


def claim(conn: Any, worker: str = "w", grace: float = 0.0, on_lost: str = "retry") -> queue.ClaimedTurn | None:
    return queue.claim(conn, worker=worker, lease_secs=30, settings={"p": (grace, on_lost, "sha")})


def ok(reply: str) -> TurnResult:
    return turn_result("s", reply=reply)


def state(conn: Any, key: str) -> tuple[Any, ...]:
    return conn.execute("SELECT state, attempt, worker FROM bridge_turns WHERE key = %s", (key,)).fetchone()


def test_enqueue_is_idempotent_by_id_and_refuses_past_max_queued(conn: Any) -> None:
    assert enqueue(conn, "a", max_queued=2) == "queued"
    assert enqueue(conn, "a", max_queued=2) == "resent"
    assert enqueue(conn, "b", max_queued=2) == "queued"
    assert enqueue(conn, "c", max_queued=2) == "full"
    assert enqueue(conn, "a", max_queued=2) == "resent"  # a resend is never refused as full
    assert conn.execute("SELECT count(*) FROM bridge_turns").fetchone() == (2,)


def test_a_turn_is_its_gateway_s_the_same_id_from_another_gateway_is_another_turn(conn: Any) -> None:
    def queue_as(gateway: str, key: str, max_queued: int = 100) -> queue.Enqueued:
        return queue.enqueue(
            conn,
            key=key,
            turn_id="7",
            request_id=7,
            gateway=gateway,
            profile="p",
            conversation="tg:42",
            session_name="default",
            turn=TURN,
            max_queued=max_queued,
        )

    assert queue_as("alice", "ka") == queue.Enqueued("queued", "ka", None, 0)
    assert queue_as("bob", "kb", max_queued=1).outcome == "queued"  # alice's queue is not bob's either
    assert queue_as("alice", "other") == queue.Enqueued("resent", "ka")
    assert queue.request_cancel(conn, gateway="bob", key="ka") is None  # bob cannot touch alice's turn
    assert queue.ending(conn, gateway="bob", key="ka") is None
    assert {claim(conn, "w1").key, claim(conn, "w2").key} == {"ka", "kb"}  # one conversation key, two bots: both run
    assert queue.finish(conn, key="kb", attempt=1, worker="w2", result=ok("bob's"))
    queue.mark_delivered(conn, gateway="alice", turn_id="7")  # alice's is not done: nothing is marked
    assert [turn_id for turn_id, _, _ in queue.undelivered(conn, gateway="bob")] == ["7"]
    assert queue.request_cancel(conn, gateway="alice", key="ka") == "running"


def test_claims_take_the_oldest_turn_of_conversations_with_nothing_running(conn: Any) -> None:
    for key, conversation in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
        enqueue(conn, key, conversation)
    first, second = claim(conn), claim(conn)
    assert (first.key, second.key) == ("a1", "b1")  # a2 waits for a1, though older than nothing else
    assert claim(conn) is None
    assert queue.finish(conn, key="a1", attempt=1, worker="w", result=ok("one"))
    assert claim(conn).key == "a2"


def test_two_workers_claiming_at_once_never_take_the_same_conversation(pg_dsn: str, conn: Any) -> None:
    for key, conversation in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
        enqueue(conn, key, conversation)
    with connect(pg_dsn) as one, connect(pg_dsn) as two:
        first = claim(one, "w1")  # its transaction still open: a1 is locked and running, not yet committed
        second = claim(two, "w2")
        one.commit()
        two.commit()
    assert (first.key, second.key) == ("a1", "b1")  # w2 skipped a1 and did not take a2 instead


def test_postgresql_itself_refuses_a_second_running_turn_of_a_conversation(conn: Any) -> None:
    enqueue(conn, "a1")
    enqueue(conn, "a2")
    claim(conn)
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("UPDATE bridge_turns SET state = 'running' WHERE key = 'a2'")


def test_a_late_result_of_an_older_attempt_is_fenced_off(conn: Any) -> None:
    enqueue(conn, "t")
    claim(conn, "w1")
    conn.execute("UPDATE bridge_turns SET state = 'queued', worker = NULL WHERE key = 't'")  # w1 was taken for lost
    assert claim(conn, "w2").attempt == 2
    assert not queue.finish(conn, key="t", attempt=1, worker="w1", result=ok("late"))
    assert queue.finish(conn, key="t", attempt=2, worker="w2", result=ok("newer"))
    assert not queue.finish(conn, key="t", attempt=1, worker="w1", result=ok("later still"))
    assert conn.execute("SELECT result->>'reply' FROM bridge_turns WHERE key = 't'").fetchone() == ("newer",)


def test_a_worker_presumed_lost_that_reclaims_its_own_turn_cannot_finish_the_older_attempt(conn: Any) -> None:
    """The attempt alone fences: the same worker holds the turn again, so its id cannot tell the attempts apart."""
    enqueue(conn, "t")
    assert claim(conn, "w").attempt == 1
    conn.execute("UPDATE bridge_turns SET state = 'queued', worker = NULL WHERE key = 't'")  # w was taken for lost
    assert claim(conn, "w").attempt == 2  # and claimed it again
    assert not queue.finish(conn, key="t", attempt=1, worker="w", result=ok("stale"))
    assert state(conn, "t") == ("running", 2, "w")
    assert queue.finish(conn, key="t", attempt=2, worker="w", result=ok("current"))
    assert conn.execute("SELECT result->>'reply' FROM bridge_turns WHERE key = 't'").fetchone() == ("current",)


def test_the_result_and_the_session_are_one_transaction(conn: Any) -> None:
    enqueue(conn, "t")
    claimed = claim(conn)
    written = []

    def record_session(
        c: Any, namespace: str, profile: str, conversation: str, session_name: str, result: TurnResult
    ) -> None:
        written.append((namespace, profile, conversation, session_name, result.reply))
        raise RuntimeError("the session write fails")

    with pytest.raises(RuntimeError), conn.transaction():
        queue.finish(conn, key="t", attempt=claimed.attempt, worker="w", result=ok("r"), record_session=record_session)
    assert written == [("g", "p", "c", "default", "r")]  # in its gateway's namespace
    assert state(conn, "t") == ("running", 1, "w")  # rolled back together


def test_a_handed_back_turn_keeps_its_place_in_its_conversation(conn: Any) -> None:
    enqueue(conn, "a1")
    enqueue(conn, "a2")
    claimed = claim(conn)
    assert queue.hand_back(conn, key="a1", attempt=claimed.attempt, worker="w")
    assert claim(conn).key == "a1"


def register_dead_worker(conn: Any, worker: str, *, before_server_start: bool = False) -> None:
    """A worker row whose registration connection does not exist (a pid no backend has)."""
    started = "pg_postmaster_start_time() - interval '1 hour'" if before_server_start else "now()"
    conn.execute(
        f"INSERT INTO bridge_workers (id, host, pid, backend_pid, backend_start, max_concurrent) "
        f"VALUES (%s, 'h', 1, 2147483647, {started}, 1)",
        (worker,),
    )


def test_a_worker_whose_connection_is_gone_is_lost_and_its_turn_goes_back_in_its_place(conn: Any) -> None:
    enqueue(conn, "a1")
    enqueue(conn, "a2")
    claim(conn, "dead")
    register_dead_worker(conn, "dead")
    queue.reap(conn)
    assert conn.execute("SELECT count(*) FROM bridge_workers").fetchone() == (0,)
    # its agents get their kill grace (and a margin) before anyone may run the turn again
    assert state(conn, "a1") == ("running", 1, "dead")
    conn.execute("UPDATE bridge_turns SET lease_until = now() - interval '5 seconds' WHERE key = 'a1'")
    assert queue.reap(conn) == ["a1"]
    assert state(conn, "a1") == ("queued", 1, None)
    assert claim(conn, "alive").key == "a1"


def test_a_server_restart_is_not_taken_for_every_worker_dying(conn: Any) -> None:
    enqueue(conn, "t")
    claim(conn, "w")
    register_dead_worker(conn, "w", before_server_start=True)  # its connection died with the old server
    assert queue.reap(conn) == []
    assert conn.execute("SELECT id FROM bridge_workers").fetchall() == [("w",)]
    assert state(conn, "t") == ("running", 1, "w")


@pytest.mark.parametrize(
    ("on_lost", "attempts", "expected"),
    [("fail", 1, "done"), ("retry", 1, "queued"), ("retry", queue.MAX_ATTEMPTS, "done")],
)
def test_a_lapsed_lease_retries_or_fails_as_the_profile_says_and_never_forever(
    conn: Any, on_lost: str, attempts: int, expected: str
) -> None:
    enqueue(conn, "t")
    claim(conn, "w", on_lost=on_lost)
    conn.execute("UPDATE bridge_turns SET attempt = %s, lease_until = now() - interval '5 seconds'", (attempts,))
    assert queue.reap(conn) == ["t"]
    assert state(conn, "t")[0] == expected
    if expected == "done":
        result = json.loads(conn.execute("SELECT result::text FROM bridge_turns").fetchone()[0])
        assert (result["outcome"], result["exit_code"]) == ("worker_lost", 1) and result["error_reply"]


def test_only_delivered_results_are_purged(conn: Any) -> None:
    for key in ("delivered", "undelivered"):
        enqueue(conn, key, conversation=key)
        claimed = claim(conn)
        queue.finish(conn, key=claimed.key, attempt=1, worker="w", result=ok(key))
    queue.mark_delivered(conn, gateway="g", turn_id="delivered")
    assert queue.undelivered(conn, gateway="g") == [("undelivered", "undelivered", "undelivered")]
    assert queue.purge(conn, keep_secs=0) == 1
    assert [key for (key,) in conn.execute("SELECT key FROM bridge_turns").fetchall()] == ["undelivered"]


# Version 1's tables, as agent-bridge created them before turns were keyed per gateway (db.SCHEMA then).
SCHEMA_V1 = """
CREATE TABLE bridge_meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE bridge_sessions (
    profile text NOT NULL, conversation text NOT NULL, session_name text NOT NULL,
    session_id text NOT NULL DEFAULT '', last_used timestamptz NOT NULL, last_outcome text NOT NULL,
    last_exit_code integer NOT NULL, stamp text NOT NULL,
    PRIMARY KEY (profile, conversation, session_name));
CREATE TABLE bridge_workers (
    id text PRIMARY KEY, host text NOT NULL, pid integer NOT NULL, backend_pid integer NOT NULL,
    backend_start timestamptz NOT NULL, max_concurrent integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(), seen_at timestamptz NOT NULL DEFAULT now(),
    draining boolean NOT NULL DEFAULT false);
CREATE TABLE bridge_turns (
    id text PRIMARY KEY, seq bigint GENERATED ALWAYS AS IDENTITY, gateway text NOT NULL,
    request_id jsonb NOT NULL, profile text NOT NULL, conversation text NOT NULL, session_name text NOT NULL,
    turn jsonb NOT NULL,
    state text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done')),
    attempt integer NOT NULL DEFAULT 0, worker text, lease_until timestamptz,
    kill_grace_secs double precision NOT NULL DEFAULT 0, on_worker_lost text NOT NULL DEFAULT 'retry',
    cancel_requested boolean NOT NULL DEFAULT false, result json, error json, outcome text, exit_code integer,
    enqueued_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz, finished_at timestamptz,
    delivered_at timestamptz);
CREATE UNIQUE INDEX bridge_turns_one_running
    ON bridge_turns (profile, conversation, session_name) WHERE state = 'running';
CREATE INDEX bridge_turns_queued ON bridge_turns (profile, conversation, session_name, seq) WHERE state = 'queued';
CREATE INDEX bridge_turns_by_worker ON bridge_turns (worker) WHERE state = 'running';
CREATE INDEX bridge_turns_undelivered ON bridge_turns (gateway) WHERE delivered_at IS NULL;
CREATE INDEX bridge_turns_done ON bridge_turns (finished_at) WHERE state = 'done';
INSERT INTO bridge_meta VALUES ('schema_version', '1');
"""


def test_version_1_tables_upgrade_in_place_and_lose_no_turn_result_or_session(pg_dsn: str) -> None:
    from bridge.host.postgres.pg_store import PostgresSessionStore

    with psycopg.connect(pg_dsn, autocommit=True) as old:
        old.execute(SCHEMA_V1)
        old.execute("INSERT INTO bridge_sessions VALUES ('p', 'c', 'default', 'sid-1', now(), 'ok', 0, 'st')")
        turn = json.dumps(TURN)
        for turn_id, gateway, request_id, state in [
            ("q1", "bot1", '"q1"', "queued"),
            ("d1", "bot1", "7", "done"),
            ("q1-serve", "serve", '"x"', "queued"),
        ]:
            old.execute(
                "INSERT INTO bridge_turns (id, gateway, request_id, profile, conversation, session_name, "
                "turn, state, result, outcome, exit_code) VALUES (%s, %s, %s, 'p', %s, 'default', %s, %s, "
                "%s, %s, %s)",
                (
                    turn_id,
                    gateway,
                    request_id,
                    turn_id,
                    turn,
                    state,
                    json.dumps({"reply": "kept"}) if state == "done" else None,
                    "ok" if state == "done" else None,
                    0 if state == "done" else None,
                ),
            )
    with connect(pg_dsn, autocommit=True) as conn:  # the first connection of the new version upgrades
        assert conn.execute("SELECT value FROM bridge_meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),
        )
        # every turn kept, under a key of its own; the undelivered result is still bot1's to send, with its id
        assert queue.undelivered(conn, gateway="bot1") == [("q1", "v1-1", "q1"), ("d1", "v1-2", 7)]
        assert queue.ending(conn, gateway="bot1", key="v1-2").result == {"reply": "kept"}
        assert queue.ending(conn, gateway="serve", key="v1-2") is None  # another gateway's turn
        resent = queue.enqueue(
            conn,
            key="new",
            turn_id="d1",
            request_id=7,
            gateway="bot1",
            profile="p",
            conversation="c",
            session_name="default",
            turn=TURN,
            max_queued=10,
        )
        assert (resent.outcome, resent.key) == ("resent", "v1-2")
        assert (
            queue.enqueue(
                conn,
                key="new",
                turn_id="d1",
                request_id=7,
                gateway="bot2",
                profile="p",
                conversation="c",
                session_name="default",
                turn=TURN,
                max_queued=10,
            ).outcome
            == "queued"
        )
        claimed = [claim(conn, "w").key for _ in range(3)]
        assert sorted(claimed) == ["new", "v1-1", "v1-3"]  # the old queued turns run, and bot2's own "d1"
    # the session was every bot's in version 1: the default namespace and each gateway the turns name keep it
    for namespace, expected in [("serve", "sid-1"), ("bot1", "sid-1"), ("someone-else", "")]:
        with PostgresSessionStore(pg_dsn, namespace=namespace) as store:
            assert store.get("p", "c") == expected
    with connect(pg_dsn, autocommit=True) as again:  # the next connection finds the current version: nothing changes
        assert again.execute("SELECT count(*) FROM bridge_sessions").fetchone() == (2,)


def with_files(*files: FileEvent) -> TurnResult:
    return dataclasses.replace(ok("r"), files=files)


def test_a_file_changed_after_the_turn_is_left_out_and_rows_stay_until_the_result_is_delivered(
    conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    kept, changed = outbox / "kept.txt", outbox / "changed.txt"
    kept.write_bytes(b"kept")
    changed.write_bytes(b"before")
    files = collect(str(outbox)).files  # held, as a turn's end holds its outbox
    changed.write_bytes(b"after, and longer")
    enqueue(conn, "k1")
    with conn.transaction():
        stored = fleet_files.store(conn, "k1", with_files(*files))
    remove_outbox(str(outbox))
    assert [file.name for file in stored.files] == ["kept.txt"]
    assert "'changed.txt' changed after the turn ended" in stored.files_note
    with conn.transaction():
        received, problem = fleet_files.load(conn, "k1", stored)
    assert problem == "" and Path(received.files[0].path).read_bytes() == b"kept"
    shutil.rmtree(Path(received.files[0].path).parent)
    with conn.transaction():
        resent, problem = fleet_files.load(conn, "k1", stored)  # another gateway, after one stopped before its bot
    assert problem == "" and Path(resent.files[0].path).read_bytes() == b"kept"  # the rows wait for delivery
    shutil.rmtree(Path(resent.files[0].path).parent)
    conn.execute("UPDATE bridge_turns SET state = 'done' WHERE key = 'k1'")
    turn_id = conn.execute("SELECT turn_id FROM bridge_turns WHERE key = 'k1'").fetchone()[0]
    gateway = conn.execute("SELECT gateway FROM bridge_turns WHERE key = 'k1'").fetchone()[0]
    with conn.transaction():
        queue.mark_delivered(conn, gateway=gateway, turn_id=turn_id)
    assert conn.execute("SELECT count(*) FROM bridge_turn_files").fetchone() == (0,)
    with conn.transaction():
        again, problem = fleet_files.load(conn, "k1", stored)  # delivered: nothing is sent twice
    assert again.files == () and "'kept.txt' not sent: no longer stored" in problem
    assert problem in again.files_note and stored.files_note in again.files_note
    odd = dataclasses.replace(stored, files=(dataclasses.replace(files[1], name="../kept.txt"),))
    with conn.transaction():
        assert fleet_files.load(conn, "k1", odd)[0].files == ()  # not a name an outbox holds: written nowhere
    with conn.transaction():
        fleet_files.store(conn, "k1", with_files(files[1]))
    conn.execute("DELETE FROM bridge_turns WHERE key = 'k1'")
    assert conn.execute("SELECT count(*) FROM bridge_turn_files").fetchone() == (0,)  # they go with the turn
