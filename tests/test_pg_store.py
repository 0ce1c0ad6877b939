"""The session store in PostgreSQL (`--state postgresql://…`): the SQLite store's rules, shared by many processes.

Against a real server (`pgserver`): each test has a database of its own. The
rules both stores keep are test_session_stores.py's, run against this one too;
here what only the server's store has (stamps, transactions, restarts), then the
turn queue across processes (advisory locks), then every command and the host
with `--state` naming a database.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import pytest
import trio
import trio.testing
from conftest import PROFILES, PYTHON, REPO, write_agent, write_profile
from conftest import turn_result as result
from hostkit import Lab, Started, max_overlap
from pgserver import PostgresServer
from test_sessions_cli import cli, env, session_of  # noqa: F401 - env: the fixture
from test_turn_queue import Bench, Proc, Serve, a_chat_takes_its_place_for_each_turn, queued

import bridge
from bridge import Outcome, StoreError, Turn, TurnResult
from bridge.cli import main
from bridge.errors import PostgresUnavailable
from bridge.host.file_turnlock import TurnLockError
from bridge.host.postgres.advisory_turnlock import PgPlace, PgTurnLocks, advisory_key
from bridge.host.postgres.pg_store import PostgresSessionStore, new_stamp, record_session
from bridge.host.sqlite_store import SessionStore
from bridge.host.state import open_store

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
STREAM = str(PROFILES / "stream.yaml")
DEADLINE = 10.0


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PostgresSessionStore]:
    with PostgresSessionStore(pg_dsn) as opened:
        yield opened


def closed_port() -> int:
    """A loopback port nothing listens on."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --------------------------------------------------------------------------- choosing the store


def test_a_postgres_url_selects_the_postgres_store_and_anything_else_a_file(pg_dsn: str, tmp_path: Path) -> None:
    for url in (pg_dsn, pg_dsn.replace("postgresql://", "postgres://", 1)):
        with open_store(url) as opened:
            assert isinstance(opened, PostgresSessionStore) and opened.dsn == url
    with open_store(tmp_path / "postgresql:" / "s.sqlite3") as opened:  # a path, whatever it looks like
        assert isinstance(opened, SessionStore)
    with open_store(str(tmp_path / "s.sqlite3")) as opened:
        assert isinstance(opened, SessionStore)


def test_importing_bridge_never_imports_psycopg() -> None:
    code = (
        "import sys, bridge, bridge.host, bridge.host.state, bridge.host.runtime, bridge.cli.main, "
        "bridge.cli.sessions, bridge.cli.serve; print('psycopg' in sys.modules)"
    )
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_without_psycopg_a_postgres_url_says_how_to_install_it() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["psycopg"] = None  # as if it were not installed
        from bridge.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    for command in (["sessions", "list"], ["run", str(PROFILES / "echo.yaml"), "--conversation", "k", "hi"]):
        done = subprocess.run(
            [PYTHON, "-c", code, *command, "--state", "postgresql://bridge@127.0.0.1/db"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "PostgreSQL needs psycopg 3: pip install 'agent-bridge[postgres]'" in done.stderr


# --------------------------------------------------------------------------- the store's own rules (the shared ones: test_session_stores.py)


def test_a_key_with_a_nul_is_refused_and_the_store_goes_on(store: PostgresSessionStore) -> None:
    store.record("p", "c", "default", result("x"))
    with pytest.raises(StoreError, match="NUL"):
        store.record("p", "nul\0key", "default", result("y"))
    assert store.get("p", "c") == "x", "the store goes on after a refused key"


def test_the_stamp_changes_with_every_record_and_lookup_returns_it_until_the_next(store: PostgresSessionStore) -> None:
    stamps = [store.record("p", "c", "default", result("s" if i == 0 else "")) for i in range(20)]
    assert len(set(stamps)) == 20
    assert store.lookup("p", "c") == ("s", stamps[-1])
    assert store.lookup("p", "c") == ("s", stamps[-1]), "reading does not change it"
    store.forget("p", "c")
    assert store.lookup("p", "c") == ("", "")
    # ISO 8601 time to the microsecond, then a random part: two machines in the same microsecond differ
    when, _, suffix = new_stamp().partition("~")
    assert datetime.fromisoformat(when).utcoffset() == timedelta(0) and len(when) == 32 and suffix


def test_sessions_survive_closing_and_reopening_and_live_in_bridge_sessions(pg_dsn: str) -> None:
    import psycopg

    with PostgresSessionStore(pg_dsn) as store:
        stamp = store.record("p", "c", "default", result("persisted"))
    with PostgresSessionStore(pg_dsn) as store:
        assert store.get("p", "c") == "persisted"
    with psycopg.connect(pg_dsn) as db:
        assert db.execute(
            "SELECT profile, conversation, session_name, session_id, stamp FROM bridge_sessions"
        ).fetchall() == [("p", "c", "default", "persisted", stamp)]


def test_repr_and_messages_never_show_the_password(postgres_server: PostgresServer) -> None:
    dsn = f"postgresql://bridge:s3cret@127.0.0.1:{postgres_server.port}/postgres"
    with PostgresSessionStore(dsn) as store:
        assert store.dsn == dsn
        assert repr(store) == f"PostgresSessionStore('postgresql://bridge@127.0.0.1:{postgres_server.port}/postgres')"
        assert store.location == f"postgresql://bridge@127.0.0.1:{postgres_server.port}/postgres"
        store.close()
        with pytest.raises(StoreError) as caught:
            store.get("p", "c")
    assert "s3cret" not in str(caught.value)


def test_record_session_writes_inside_the_callers_transaction(store: PostgresSessionStore, pg_dsn: str) -> None:
    import psycopg

    store.record("p", "c", "default", result("before"))
    with psycopg.connect(pg_dsn) as db:
        with db.transaction(force_rollback=True):
            record_session(db, store.namespace, "p", "c", "default", result("rolled back"), new_stamp())
            assert store.get("p", "c") == "before", "not visible before the caller commits"
        assert store.get("p", "c") == "before"
        stamp = new_stamp()
        with db.transaction():
            record_session(db, store.namespace, "p", "c", "default", result(""), stamp)  # no session line: the id stays
            record_session(db, store.namespace, "p", "new", "default", result("n"), stamp)
    assert store.lookup("p", "c") == ("before", stamp)
    assert store.get("p", "new") == "n"


# --------------------------------------------------------------------------- a server that goes away


def test_a_restarted_server_is_reconnected_transparently(
    store: PostgresSessionStore, postgres_server: PostgresServer
) -> None:
    store.record("p", "c", "default", result("before restart"))
    assert store.get("p", "c") == "before restart"  # both connections are open
    postgres_server.restart()  # fast shutdown: the server drops both connections
    assert store.get("p", "c") == "before restart"
    stamp = store.record("p", "c", "default", result("after restart"))
    assert store.lookup("p", "c") == ("after restart", stamp)
    postgres_server.restart(signal.SIGQUIT)  # a crash-like stop: no goodbye to the clients
    assert store.forget("p", "c") == 1
    assert store.list() == []


def test_a_server_that_stays_down_is_a_store_error_naming_it(
    store: PostgresSessionStore, postgres_server: PostgresServer
) -> None:
    store.record("p", "c", "default", result("x"))
    postgres_server.stop()
    try:
        with pytest.raises(StoreError) as caught:
            store.get("p", "c")
        assert f"127.0.0.1:{postgres_server.port}" in str(caught.value)
        assert "check that the server runs" in str(caught.value)
    finally:
        postgres_server.start()
    assert store.get("p", "c") == "x", "once it is back, the store works again"


def test_an_unreachable_server_names_host_and_port_without_the_password() -> None:
    port = closed_port()
    with pytest.raises(StoreError) as caught:
        PostgresSessionStore(f"postgresql://bot:hunter2@127.0.0.1:{port}/sessions")
    message = str(caught.value)
    assert f"postgresql://bot@127.0.0.1:{port}/sessions" in message
    assert "hunter2" not in message and "check that the server runs" in message


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://bot:hunter2@127.0.0.1:5432/db?bogus=1",
        "postgresql://bot:hunter2@[::1/db",
        "postgres://bot:hunter2@host%/db",
    ],
)
def test_a_bad_dsn_is_a_store_error_that_shows_the_form_without_the_password(dsn: str) -> None:
    with pytest.raises(StoreError) as caught:
        PostgresSessionStore(dsn)
    message = str(caught.value)
    assert "DSN is not valid" in message and "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE" in message
    assert "hunter2" not in message


# --------------------------------------------------------------------------- the turn queue across processes


def test_advisory_keys_are_signed_64_bit_and_keep_conversations_apart() -> None:
    keys = {
        advisory_key(namespace, profile, conversation, name)
        for namespace in ("serve", "bot2")
        for profile in ("p", "q")
        for conversation in ("a", "b", "a\0b")
        for name in ("default", "x")
    }
    assert len(keys) == 24
    assert all(-(1 << 63) <= key < 1 << 63 for key in keys)
    assert advisory_key("serve", "p", "a", "default") == advisory_key("serve", "p", "a", "default")


def test_a_place_held_elsewhere_waits_until_it_is_released(pg_dsn: str) -> None:
    one, two = PgTurnLocks(pg_dsn), PgTurnLocks(pg_dsn)  # two processes, as the server sees them
    try:
        held = one.join("p", "k", "default")
        assert held.try_wait()
        waiting = two.join("p", "k", "default")
        assert not waiting.try_wait() and not waiting.try_wait()
        other = two.join("p", "other", "default")  # other conversations and session names do not wait
        named = two.join("p", "k", "side")
        assert other.try_wait() and named.try_wait()
        held.release()
        held.release()  # idempotent
        waiter = threading.Thread(target=waiting.wait)
        waiter.start()
        waiter.join(timeout=DEADLINE)
        assert not waiter.is_alive() and waiting.try_wait()
        again = one.join("p", "k", "default")
        assert not again.try_wait()
        for place in (waiting, other, named, again):
            place.release()
        with one.join("p", "k", "default") as place:
            assert place.try_wait()
    finally:
        one.close()
        two.close()


def test_two_places_of_one_process_exclude_each_other(pg_dsn: str) -> None:
    """A session may take a lock it holds again: each place has a connection of its own."""
    locks = PgTurnLocks(pg_dsn)
    try:
        first = locks.join("p", "k", "default")
        second = locks.join("p", "k", "default")
        assert first.try_wait() and not second.try_wait() and not second.try_wait()
        first.release()
        deadline = time.monotonic() + DEADLINE
        while not second.try_wait():
            assert time.monotonic() < deadline
        second.release()
    finally:
        locks.close()


async def test_waiting_in_trio_lets_other_tasks_run_and_can_be_abandoned(pg_dsn: str) -> None:
    locks = PgTurnLocks(pg_dsn)
    held = locks.join("p", "k", "default")
    waiting = await locks.join_async("p", "k", "default")
    assert not waiting.try_wait()
    abandon = trio.Event()

    async def give_up() -> None:
        await trio.testing.wait_all_tasks_blocked()  # the waiter sleeps between tries; the loop runs others
        abandon.set()

    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(give_up)
            assert await waiting.wait_async(abandon) is False
        waiting.release()
        behind = await locks.join_async("p", "k", "default")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_release_when_blocked, held)
            assert await behind.wait_async() is True
        for _ in range(20):
            behind.release()  # in trio the unlock is sent from a worker thread; the next try waits for it
            behind = await locks.join_async("p", "k", "default")
            assert behind.try_wait(), "the next turn of this process found its own unlock not yet done"
        behind.release()
    locks.close()


async def _release_when_blocked(place: PgPlace) -> None:
    await trio.testing.wait_all_tasks_blocked()
    place.release()


HOLDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from bridge.host.postgres.advisory_turnlock import PgTurnLocks
    place = PgTurnLocks(sys.argv[1]).join("p", "k", "default")
    print("held" if place.try_wait() else "not held", flush=True)
    time.sleep(600)
""").format(repo=str(REPO))


def test_a_process_killed_while_holding_a_place_frees_it(pg_dsn: str) -> None:
    holder = subprocess.Popen([PYTHON, "-c", HOLDER, pg_dsn], stdout=subprocess.PIPE, text=True)
    locks = PgTurnLocks(pg_dsn)
    try:
        assert holder.stdout.readline() == "held\n"  # type: ignore[union-attr]
        place = locks.join("p", "k", "default")
        assert not place.try_wait()
        holder.kill()
        holder.wait(timeout=DEADLINE)
        waiter = threading.Thread(target=place.wait)  # the server drops the dead session's locks
        waiter.start()
        waiter.join(timeout=DEADLINE)
        assert not waiter.is_alive()
        place.release()
    finally:
        holder.kill()
        holder.wait(timeout=DEADLINE)
        holder.stdout.close()  # type: ignore[union-attr]
        locks.close()


def test_places_survive_a_server_restart_by_connecting_again(pg_dsn: str, postgres_server: PostgresServer) -> None:
    locks = PgTurnLocks(pg_dsn)
    try:
        locks.join("p", "k", "default").release()  # an idle connection is kept
        postgres_server.restart()
        place = locks.join("p", "k", "default")
        assert place.try_wait()
        place.release()
    finally:
        locks.close()


def test_turn_locks_on_a_server_out_of_reach_say_what_to_do() -> None:
    port = closed_port()
    with pytest.raises(TurnLockError, match=rf"bot@127\.0\.0\.1:{port}/db.*check that the server runs"):
        PgTurnLocks(f"postgresql://bot:hunter2@127.0.0.1:{port}/db")


# --------------------------------------------------------------------------- the host


@pytest.fixture
def lab(lab: Lab, pg_dsn: str) -> Lab:
    """conftest.py's, its sessions on the test's database."""
    lab.state = pg_dsn  # type: ignore[assignment]
    return lab


async def test_open_host_with_a_database_url_keeps_sessions_across_hosts(lab: Lab, pg_dsn: str) -> None:
    async with bridge.open_host(lab.profiles, state=pg_dsn) as host:
        assert isinstance(host.store, PostgresSessionStore)
        first = await host.submit("rec", "chat", Turn("tag=1 session=s-1"))
        second = await host.submit("rec", "chat", Turn("tag=2"))  # no session line: s-1 stays
    async with bridge.open_host(lab.profiles, state=pg_dsn) as host:
        third = await host.submit("rec", "chat", Turn("tag=3"))
    assert (first.ok, second.ok, third.ok) == (True, True, True)
    assert [(words[1], words[2]) for words in lab.lines() if words[0] == "start"] == [
        ("1", "-"),
        ("2", "s-1"),
        ("3", "s-1"),
    ]
    with PostgresSessionStore(pg_dsn) as store:
        [record] = store.list()
        assert (record.profile, record.conversation, record.session_id) == ("rec", "chat", "s-1")


async def test_two_hosts_on_one_database_never_run_a_conversation_twice_at_once(
    lab: Lab, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting = trio.Event()
    wait_async = PgPlace.wait_async

    async def watched(place: PgPlace, abandon: trio.Event | None = None) -> bool:
        waiting.set()
        return await wait_async(place, abandon)

    monkeypatch.setattr(PgPlace, "wait_async", watched)
    started = Started()
    results: dict[str, TurnResult] = {}
    gate = lab.gate()

    async def submit(host: bridge.Host, conversation: str, tag: str, message: str = "") -> None:
        results[tag] = await host.submit(
            "rec", conversation, Turn(f"tag={tag} {message}"), on_partial=started.callback(tag)
        )

    with trio.fail_after(DEADLINE):
        async with (
            bridge.open_host(lab.profiles, state=pg_dsn) as one,
            bridge.open_host(lab.profiles, state=pg_dsn) as two,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(submit, one, "k", "a", f"session=sa gate={gate}")
            await started.wait("a")
            nursery.start_soon(submit, two, "k", "b", "session=sb")
            await waiting.wait()  # b found the conversation held by the other host
            await submit(two, "other", "o")  # meanwhile another conversation runs on that host
            assert lab.events("end") == ["o"]
            await lab.release(gate)
    assert lab.events("start") == ["a", "o", "b"]
    assert max_overlap(lab.lines(), {"a", "b"}) == 1
    sessions = {words[1]: words[2] for words in lab.lines() if words[0] == "start"}
    assert sessions["b"] == "sa", "b resumed the session a stored"
    with PostgresSessionStore(pg_dsn) as store:
        assert store.get("rec", "k") == "sb"


# --------------------------------------------------------------------------- the commands


def test_run_with_a_database_resumes_the_conversation_run_after_run(
    pg_dsn: str, env: dict[str, str], tmp_path: Path
) -> None:
    first = cli(env, "run", STREAM, "--conversation", "c", "--state", pg_dsn, "hello there")
    assert first.returncode == 0, first.stderr
    assert "turn 1 of session" in first.stdout
    session = session_of(first.stdout)
    again = pg_dsn.replace("postgresql://", "postgres://", 1)  # both schemes name the database
    second = cli(env, "run", STREAM, "hello again", "--conversation", "c", "--state", again, "--json")
    assert second.returncode == 0, second.stderr
    reply = json.loads(second.stdout.splitlines()[-1])["reply"]
    assert f"turn 2 of session {session}" in reply and "last time you said: hello there" in reply
    fresh = cli(env, "run", STREAM, "--conversation", "c", "--state", pg_dsn, "--new", "anew")
    assert "turn 1 of session" in fresh.stdout and session_of(fresh.stdout) != session
    with PostgresSessionStore(pg_dsn) as store:
        assert store.get("stream", "c") == session_of(fresh.stdout)
    assert not (tmp_path / "xdg-state").exists(), "no SQLite file was made"


def test_run_with_a_namespace_keeps_the_session_in_that_bot_s_namespace(pg_dsn: str, env: dict[str, str]) -> None:
    done = cli(env, "run", STREAM, "--conversation", "c", "--state", pg_dsn, "--namespace", "alice", "hi")
    assert done.returncode == 0, done.stderr
    with PostgresSessionStore(pg_dsn, namespace="alice") as alice, PostgresSessionStore(pg_dsn) as default:
        assert (alice.get("stream", "c"), default.get("stream", "c")) == (session_of(done.stdout), "")


def test_run_with_a_database_out_of_reach_stops_before_the_agent_starts(tmp_path: Path, env: dict[str, str]) -> None:
    marker = tmp_path / "ran"
    agent = write_agent(tmp_path, "agent.sh", f"#!/bin/sh\ntouch {marker}\necho ran\n")
    profile = write_profile(tmp_path, f"command: {agent}\n")
    port = closed_port()
    done = cli(
        env,
        "run",
        str(profile),
        "--conversation",
        "k",
        "--state",
        f"postgresql://bot:hunter2@127.0.0.1:{port}/db",
        "hi",
    )
    assert done.returncode == 2
    assert f"postgresql://bot@127.0.0.1:{port}/db" in done.stderr and "hunter2" not in done.stderr
    assert not marker.exists() and done.stdout == ""


def test_sessions_list_show_and_forget_on_a_database(pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sessions", "list", "--state", pg_dsn]) == 0
    assert f"no stored sessions in {pg_dsn}" in capsys.readouterr().err
    with PostgresSessionStore(pg_dsn) as store:
        store.record("stream", "chat-1", "default", result("s-default"))
        store.record("stream", "chat-1", "work", result("s-work"))
        store.record("echo", "chat-1", "default", result("", exit_code=124, outcome=Outcome.TIMEOUT))
        store.record("stream", "chat-2", "default", result("s-two"))
    assert main(["sessions", "list", "--state", pg_dsn]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:4] for line in lines[1:]] == [
        ["stream", "chat-2", "default", "s-two"],
        ["echo", "chat-1", "default", "-"],
        ["stream", "chat-1", "work", "s-work"],
        ["stream", "chat-1", "default", "s-default"],
    ]
    assert lines[2].endswith("timeout (exit 124)")
    assert main(["sessions", "list", "--state", pg_dsn, "--profile", "stream", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["conversation"], r["session_name"]) for r in records] == [
        ("chat-2", "default"),
        ("chat-1", "work"),
        ("chat-1", "default"),
    ]
    assert main(["sessions", "show", STREAM, "chat-1", "--state", pg_dsn]) == 0
    out = capsys.readouterr().out
    assert "session id:    s-default" in out and "session id:    s-work" in out
    assert main(["sessions", "show", "stream", "nope", "--state", pg_dsn]) == 1
    assert f"no stored conversation 'nope' for profile stream in {pg_dsn}" in capsys.readouterr().err
    assert main(["sessions", "forget", "stream", "chat-1", "--session-name", "work", "--state", pg_dsn]) == 0
    assert "forgot session 'work'" in capsys.readouterr().out
    assert main(["sessions", "forget", "stream", "chat-1", "--state", pg_dsn]) == 0
    assert "(1 stored)" in capsys.readouterr().out
    with PostgresSessionStore(pg_dsn) as store:
        assert [(r.profile, r.conversation) for r in store.list()] == [("stream", "chat-2"), ("echo", "chat-1")]


def test_bots_with_the_same_profiles_and_conversation_keys_share_nothing_in_their_namespaces(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with PostgresSessionStore(pg_dsn, namespace="alice") as alice, PostgresSessionStore(pg_dsn, namespace="bob") as bob:
        alice.record("stream", "tg:42", "default", result("a-1"))
        assert (alice.get("stream", "tg:42"), bob.get("stream", "tg:42")) == ("a-1", "")
        bob.record("stream", "tg:42", "default", result("b-1"))
        assert bob.forget("stream", "tg:42") == 1 and alice.get("stream", "tg:42") == "a-1"
        assert [record.session_id for record in alice.list()] == ["a-1"] and bob.list() == []
        assert alice.lookup_in("bob", "stream", "tg:42") == ("", "")  # what a worker reads for bob's turns
        assert repr(alice).endswith("namespace='alice')")
    with pytest.raises(StoreError, match="namespace must be a non-empty string"):
        PostgresSessionStore(pg_dsn, namespace="")
    # the commands: --namespace picks the bot; without it, the default namespace ("serve")
    assert main(["sessions", "list", "--state", pg_dsn, "--namespace", "alice", "--json"]) == 0
    assert [json.loads(line)["session_id"] for line in capsys.readouterr().out.splitlines()] == ["a-1"]
    assert main(["sessions", "list", "--state", pg_dsn, "--json"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["sessions", "list", "--namespace", "alice"]) == 2  # a file is one bot's already
    assert "a namespace applies to a PostgreSQL session store" in capsys.readouterr().err


def test_conversations_of_different_namespaces_never_wait_for_each_other(pg_dsn: str) -> None:
    alice, bob, alice_too = (
        PgTurnLocks(pg_dsn, namespace="alice"),
        PgTurnLocks(pg_dsn, namespace="bob"),
        PgTurnLocks(pg_dsn, namespace="alice"),
    )
    try:
        with alice.join("p", "k", "default") as held, bob.join("p", "k", "default") as other:
            assert held.try_wait() and other.try_wait()
            with alice_too.join("p", "k", "default") as waiting:
                assert not waiting.try_wait()  # the same bot's conversation, from another process: it waits
    finally:
        for locks in (alice, bob, alice_too):
            locks.close()


def test_sessions_on_a_database_out_of_reach_exit_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    assert main(["sessions", "list", "--state", f"postgresql://bot:hunter2@127.0.0.1:{port}/db"]) == 2
    err = capsys.readouterr().err
    assert f"postgresql://bot@127.0.0.1:{port}/db" in err and "hunter2" not in err


def test_serve_with_a_database_runs_a_turn_and_stores_its_session(lab: Lab, pg_dsn: str) -> None:
    request = {"type": "turn", "id": "t1", "profile": "rec", "conversation": "k", "message": "tag=s session=from-serve"}
    done = subprocess.run(
        [AGENT_BRIDGE, "serve", "--profiles", str(lab.profiles), "--state", pg_dsn],
        input=json.dumps(request) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    [reply] = [json.loads(line) for line in done.stdout.splitlines() if json.loads(line)["type"] == "result"]
    assert (reply["id"], reply["exit_code"], reply["session_id"]) == ("t1", 0, "from-serve")
    with PostgresSessionStore(pg_dsn) as store:
        assert store.get("rec", "k") == "from-serve"


@pytest.fixture
def bench(lab: Lab) -> Iterator[Bench]:
    bench = Bench(lab)  # its runs and serves use --state lab.state: the database
    yield bench
    bench.close()


def test_runs_in_several_processes_never_overlap_and_chain_their_sessions(bench: Bench) -> None:
    first, gate = bench.holding_run()
    later = []
    for index in range(1, 4):
        run = bench.run(f"tag={index} session=s{index}")
        assert queued(run), f"run {index} did not wait for the running turn of its conversation: {run.output}"
        later.append(run)
    bench.release(gate)
    assert [run.finish() for run in (first, *later)] == [0] * 4, [run.err for run in later]
    starts = bench.starts()
    assert starts[0] == ("0", "-") and sorted(tag for tag, _ in starts) == ["0", "1", "2", "3"]
    # Waiters of several processes go in no set order; each resumed the session of the turn before it.
    assert [session for _, session in starts[1:]] == [f"s{tag}" for tag, _ in starts[:-1]]
    assert max_overlap(bench.lab.lines()) == 1


def test_a_run_waits_for_a_serve_turn_of_its_conversation_on_a_database(bench: Bench) -> None:
    serve = Serve(bench.lab)
    bench.procs.append(serve)
    gate = bench.gate()
    serve.turn("t1", f"tag=s1 session=from-serve gate={gate}")
    assert serve.expect("out", b'"started"'), serve.output
    run = bench.run("tag=c session=from-cli")
    assert queued(run), run.output
    bench.release(gate)
    assert serve.result("t1")["exit_code"] == 0
    assert run.finish() == 0
    serve.turn("t2", "tag=s2")
    assert serve.result("t2")["exit_code"] == 0
    assert serve.stop() == 0
    assert bench.starts() == [("s1", "-"), ("c", "from-serve"), ("s2", "from-cli")]
    assert max_overlap(bench.lab.lines()) == 1


def test_a_chat_on_a_database_takes_its_place_for_each_turn(bench: Bench) -> None:
    def and_its_session_is_stored_in_the_database(chat: Proc, lines: TextIO) -> None:
        lines.write("/session\n")
        lines.flush()
        assert chat.expect("err", f"stored in {bench.lab.state}".encode()), chat.output

    a_chat_takes_its_place_for_each_turn(bench, then=and_its_session_is_stored_in_the_database)


def test_a_process_stalled_while_it_connects_stops_no_other_from_connecting(pg_dsn: str) -> None:
    """Each connection checks the tables' version; a process paused (SIGSTOP, a debugger) in the middle of that
    check once held the lock that makes those checks take turns, and every new connection of every other
    process waited until it went on (a new worker never started). The lock is for creating the tables only."""
    import psycopg

    from bridge.host.postgres.db import SCHEMA_LOCK

    PostgresSessionStore(pg_dsn).close()  # the tables exist, as on any database in use
    with psycopg.connect(pg_dsn) as stalled, stalled.transaction():
        stalled.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))  # where the paused process stopped
        done = subprocess.run(
            [PYTHON, "-m", "bridge", "sessions", "list", "--state", pg_dsn],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_connection_stalled_inside_a_transaction_is_ended_by_the_server_and_its_locks_freed(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker paused or cut off in the middle of a transaction held its row locks until it went on (TCP takes
    the server hours to notice a peer gone), and the reaper could not take back its turns meanwhile."""
    import psycopg

    from bridge.host.postgres import db

    monkeypatch.setattr(db, "IDLE_IN_TRANSACTION_SECS", 0.3)
    stalled = db.connect(pg_dsn)
    try:
        stalled.execute("SELECT pg_advisory_xact_lock(4242)")  # a lock held, then silence, as a paused process
        pid = stalled.info.backend_pid
        with psycopg.connect(pg_dsn, autocommit=True) as other:
            deadline = time.monotonic() + 10
            while other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is not None:
                assert time.monotonic() < deadline, "the stalled session still holds its transaction after 10 s"
                time.sleep(0.05)
            assert other.execute("SELECT pg_try_advisory_lock(4242)").fetchone() == (True,)
    finally:
        stalled.close()

    def paused_mid_transaction(conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(4242)")
        time.sleep(1)  # the process stopped here, past the bound
        conn.execute("SELECT 1")

    async def resumed() -> None:
        pool = db.Database(pg_dsn)
        try:
            with pytest.raises(PostgresUnavailable):  # as for any lost connection: the caller may try again
                await pool.run(paused_mid_transaction)
            assert await pool.run(lambda conn: conn.execute("SELECT 2").fetchone()) == (2,)
        finally:
            pool.close()

    trio.run(resumed)
