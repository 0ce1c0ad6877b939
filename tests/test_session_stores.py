"""The session store's rules (docs/protocol.md §6), one suite run against both stores: the SQLite file and
PostgreSQL (`--state postgresql://…`, a database of its own per test from `pgserver`).

What only one store has lives with it: the file's locking, permissions and full disk in test_store.py; the
server's stamps, transactions, restarts and advisory locks in test_pg_store.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio
from conftest import turn_result as result

from bridge import Outcome, SessionRecord, SessionStore, StoreError
from bridge.host.postgres.pg_store import PostgresSessionStore

Store = SessionStore | PostgresSessionStore
THREAD_DEADLINE = 10.0


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each store, new and empty; PostgreSQL's cluster starts only for the tests that take this one."""
    opened: Store
    if request.param == "sqlite":
        opened = SessionStore(tmp_path / "sessions.sqlite3")
    else:
        opened = PostgresSessionStore(request.getfixturevalue("pg_dsn"))
    with opened:
        yield opened


def test_a_conversation_without_a_stored_session_starts_a_new_one(store: Store) -> None:
    assert store.get("stream", "chat-1") == ""
    assert store.lookup("stream", "chat-1") == ("", "")
    assert store.list() == []


def test_the_last_turns_session_id_is_kept_per_profile_conversation_and_session_name(store: Store) -> None:
    store.record("stream", "chat-1", "default", result("a"))
    store.record("stream", "chat-1", "default", result("b"))
    store.record("stream", "chat-1", "work", result("w"))
    store.record("stream", "chat-2", "default", result("c"))
    store.record("other", "chat-1", "default", result("o"))
    assert store.get("stream", "chat-1") == "b"
    assert store.get("stream", "chat-1", "work") == "w"
    assert store.get("stream", "chat-2") == "c"
    assert store.get("other", "chat-1") == "o"
    assert store.get("other", "chat-2") == ""


def test_a_turn_without_a_session_line_keeps_the_stored_id_but_records_how_it_ended(store: Store) -> None:
    before = datetime.now(UTC)
    store.record("stream", "chat-1", "default", result("kept"))
    store.record("stream", "chat-1", "default", result("", exit_code=124, outcome=Outcome.TIMEOUT))
    assert store.get("stream", "chat-1") == "kept"
    [record] = store.list()
    assert record == SessionRecord("stream", "chat-1", "default", "kept", record.last_used, "timeout", 124)
    assert record.last_used.tzinfo is UTC and record.last_used.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= record.last_used <= datetime.now(UTC) + timedelta(seconds=1)


def test_a_first_turn_without_a_session_line_is_recorded_with_no_id(store: Store) -> None:
    store.record("echo", "chat-1", "default", result("", exit_code=3, outcome=Outcome.EXIT_NONZERO))
    assert store.get("echo", "chat-1") == ""
    [record] = store.list()
    assert (record.session_id, record.last_outcome, record.last_exit_code) == ("", "exit_nonzero", 3)


def test_forget_drops_one_session_name_or_every_one_and_says_how_many(store: Store) -> None:
    for name in ("default", "work", "play"):
        store.record("stream", "chat-1", name, result(f"id-{name}"))
    store.record("stream", "chat-2", "default", result("other"))
    assert store.forget("stream", "chat-1", "work") == 1
    assert store.forget("stream", "chat-1", "work") == 0
    assert store.get("stream", "chat-1", "work") == ""
    assert store.get("stream", "chat-1", "play") == "id-play"
    assert store.forget("stream", "chat-1") == 2
    assert [record.conversation for record in store.list()] == ["chat-2"]


def test_list_shows_the_most_recently_used_first_and_filters_by_profile(store: Store) -> None:
    store.record("a", "one", "default", result("1"))
    store.record("b", "two", "default", result("2"))
    store.record("a", "three", "default", result("3"))
    assert [record.conversation for record in store.list()] == ["three", "two", "one"]
    assert [record.conversation for record in store.list("a")] == ["three", "one"]
    assert [record.conversation for record in store.list("a", "one")] == ["one"]
    assert store.list("nobody") == []
    latest = store.list()[0]
    assert latest.to_dict() == {
        "profile": "a",
        "conversation": "three",
        "session_name": "default",
        "session_id": "3",
        "last_used": latest.last_used.isoformat(),
        "last_outcome": "ok",
        "last_exit_code": 0,
    }
    assert latest.to_dict()["last_used"].endswith("+00:00")


def test_keys_may_hold_any_text_but_not_be_empty(store: Store) -> None:
    odd = "tg:-100123/thread 7\n'; DROP TABLE sessions; DROP TABLE bridge_sessions; --"
    store.record("p", odd, "dé fault", result("x"))
    assert store.get("p", odd, "dé fault") == "x"
    for profile, conversation in (("", "c"), ("p", "")):
        with pytest.raises(StoreError, match="non-empty"):
            store.get(profile, conversation)


def test_a_closed_store_says_so(store: Store) -> None:
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.get("p", "c")
    with pytest.raises(StoreError, match="closed"):
        store.record("p", "c", "default", result("x"))


def test_one_store_object_is_safe_to_share_between_threads(store: Store) -> None:
    errors: list[BaseException] = []
    turns = 50 if isinstance(store, SessionStore) else 25  # a server's round trips cost more

    def work(worker: int) -> None:
        try:
            for i in range(turns):
                store.record("p", f"t{worker}-{i}", "default", result(f"{worker}:{i}"))
                assert store.get("p", f"t{worker}-{i}") == f"{worker}:{i}"
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=THREAD_DEADLINE)
    assert errors == [] and not any(thread.is_alive() for thread in threads)
    assert len(store.list()) == 8 * turns


async def test_a_trio_host_can_call_it_from_worker_threads(store: Store) -> None:
    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(trio.to_thread.run_sync, store.record, "p", f"c{i}", "default", result(f"s{i}"))
    assert sorted(record.session_id for record in store.list()) == sorted(f"s{i}" for i in range(20))
