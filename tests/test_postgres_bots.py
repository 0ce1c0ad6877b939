"""Bots that share one PostgreSQL database never see each other (issue 19).

Each bot has its own gateway (`RemoteHost`, what `serve --postgres --name
NAME` runs); workers serve them all. The bots here use the same turn ids,
profile names and conversation keys on purpose: a turn is (gateway name, the
bot's id), results, events and orders reach only the gateway that queued the
turn, sessions live in the gateway's namespace, one live gateway holds a
name, and a worker runs only the turns of profiles it has, as queued.
In-process gateways and workers (as `test_postgres_fleet`'s
`test_open_host_with_postgres_is_the_python_gateway`), against a throwaway
cluster (`pgserver`).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from conftest import SAMPLE_AGENTS
from hostkit import Lab, Started

import bridge
from bridge.host.postgres import gateway, queue, worker
from bridge.host.postgres.db import connect, events_channel
from bridge.host.postgres.gateway import GatewayNameTaken, RemoteHost, RemoteTurnError
from bridge.host.postgres.pg_store import PostgresSessionStore
from bridge.host.postgres.worker import Worker

DEADLINE = 10.0
POLL = 0.01  # a bounded wait for something no event announces (another process's row, a log line)


@pytest.fixture
def logged(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[[], str]]:
    """Every log line (JSON on stderr) so far, as one text."""
    bridge.log.configure_logging("info", "json")
    seen: list[str] = []

    def read() -> str:
        seen.append(capsys.readouterr().err)
        return "".join(seen)

    yield read
    bridge.log.configure_logging()


def ask_profile(lab: Lab) -> None:
    """`ap4`: the wire-0.4 sample agent, which asks before it uses a tool."""
    (lab.profiles / "ap4.yaml").write_text(
        textwrap.dedent(f"""\
        protocol: agentproc-0.4
        command: [{sys.executable!r}, {str(SAMPLE_AGENTS / "wire04_agent.py")!r}]
        env: {{STREAM_DELAY: "0", TMPDIR: {str(lab.root)!r}}}
        permissions: {{ask: [Read], timeout_secs: 10}}
    """)
    )


async def until(check: Callable[[], Any], what: str) -> Any:
    with trio.fail_after(DEADLINE):
        while not (value := check()):
            await trio.sleep(POLL)
    return value


def digest(lab: Lab, name: str = "rec") -> str:
    """How log lines and errors show the hash of a lab's profile file."""
    return hashlib.sha256((lab.profiles / f"{name}.yaml").read_bytes()).hexdigest()[: queue.SHOWN_HASH_CHARS]


def skips(log: str) -> list[dict[str, Any]]:
    """The log records of workers saying they skip queued turns queued for another file of a profile."""
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    return [record for record in records if record.get("event", "").startswith("skipping queued turns")]


def query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


# --------------------------------------------------------------------------- turns, events and sessions


async def test_two_bots_with_the_same_turn_ids_and_keys_get_only_their_own_results_partials_and_sessions(
    pg_dsn: str, lab: Lab
) -> None:
    overheard: list[str] = []  # what reaches alice's channel: none of it may be bob's
    listener = connect(pg_dsn, autocommit=True)
    listener.add_notify_handler(lambda note: overheard.append(note.payload))
    listener.execute(f"LISTEN {events_channel('alice')}")
    partials: dict[str, list[str]] = {"alice": [], "bob": []}
    started = Started()

    def seen(bot: str, tag: str) -> Callable[[str], None]:
        def on_partial(text: str) -> None:
            partials[bot].append(text)
            started.callback(tag)(text)

        return on_partial

    async with trio.open_nursery() as nursery:
        runner = Worker(pg_dsn, lab.profiles, max_concurrent=4, lease_secs=2.0)
        await nursery.start(runner.run)
        async with RemoteHost(pg_dsn, name="alice") as alice, RemoteHost(pg_dsn, name="bob") as bob:
            gate = lab.gate()
            results: dict[str, bridge.TurnResult] = {}

            async def alice_seven() -> None:
                results["a7"] = await alice.submit(
                    "rec",
                    "tg:42",
                    bridge.Turn(f"tag=a7 gate={gate} session=sa"),
                    turn_id="7",
                    on_partial=seen("alice", "a7"),
                )

            async with trio.open_nursery() as turns:
                turns.start_soon(alice_seven)
                await started.wait("a7")
                # bob's 7, in the same profile and conversation, while alice's 7 runs: his own turn, at once
                with trio.fail_after(DEADLINE):
                    results["b7"] = await bob.submit(
                        "rec", "tg:42", bridge.Turn("tag=b7 session=sb"), turn_id="7", on_partial=seen("bob", "b7")
                    )
                await lab.release(gate)
            with trio.fail_after(DEADLINE):
                results["a8"] = await alice.submit(
                    "rec", "tg:42", bridge.Turn("tag=a8"), turn_id="8", on_partial=seen("alice", "a8")
                )
                results["b8"] = await bob.submit(
                    "rec", "tg:42", bridge.Turn("tag=b8"), turn_id="8", on_partial=seen("bob", "b8")
                )
        runner.drain()
    assert {tag: result.reply for tag, result in results.items()} == {
        "a7": "reply a7 one",
        "b7": "reply b7 one",
        "a8": "reply a8 one",
        "b8": "reply b8 one",
    }
    assert partials == {"alice": ["started", "started"], "bob": ["started", "started"]}
    # each bot's next turn resumed its own session, never the other's
    assert [words[:3] for words in lab.lines() if words[0] == "start"] == [
        ["start", "a7", "-"],
        ["start", "b7", "-"],
        ["start", "a8", "sa"],
        ["start", "b8", "sb"],
    ]
    listener.execute("SELECT 1")  # hands the notifications that arrived to the handler
    alice_keys = {key for (key,) in query(pg_dsn, "SELECT key FROM bridge_turns WHERE gateway = 'alice'")}
    assert overheard and {json.loads(payload)["t"] for payload in overheard} <= alice_keys
    listener.close()
    with PostgresSessionStore(pg_dsn, namespace="alice") as store:
        assert store.get("rec", "tg:42") == "sa"
    with PostgresSessionStore(pg_dsn, namespace="bob") as store:
        assert store.get("rec", "tg:42") == "sb"
    with PostgresSessionStore(pg_dsn) as store:
        assert store.list() == []  # the default namespace ("serve") is a third bot's


async def test_a_gateway_with_client_session_ids_stored_takes_only_the_conversations_own_session(
    pg_dsn: str, lab: Lab
) -> None:
    async with trio.open_nursery() as nursery:
        runner = Worker(pg_dsn, lab.profiles, max_concurrent=2, lease_secs=2.0)
        await nursery.start(runner.run)
        async with RemoteHost(pg_dsn, name="bot", client_session_ids="stored") as host:
            with trio.fail_after(DEADLINE):
                alice = await host.submit("rec", "alice", bridge.Turn("tag=a1 session=s-alice"))
                with pytest.raises(bridge.SessionIdRefused, match="leave session_id empty"):
                    await host.submit("rec", "bob", bridge.Turn("tag=b1", session_id=alice.session_id))
                with pytest.raises(bridge.SessionIdRefused):  # nothing stored for bob: no id is his
                    await host.submit("rec", "bob", bridge.Turn("tag=b2", session_id="s-bob"))
                own = await host.submit("rec", "alice", bridge.Turn("tag=a2", session_id=alice.session_id))
        runner.drain()
    assert alice.session_id == "s-alice" and own.ok
    assert [words[:3] for words in lab.lines() if words[0] == "start"] == [
        ["start", "a1", "-"],
        ["start", "a2", "s-alice"],
    ]
    assert query(pg_dsn, "SELECT count(*) FROM bridge_turns WHERE conversation = 'bob'") == [(0,)]  # never queued


async def test_one_bot_s_questions_decisions_and_cancels_never_reach_another_bot_s_turn(pg_dsn: str, lab: Lab) -> None:
    ask_profile(lab)
    questions: dict[str, list[bridge.PermissionRequest]] = {"alice": [], "bob": []}
    tools: dict[str, list[str]] = {"alice": [], "bob": []}
    asked = {"alice": trio.Event(), "bob": trio.Event()}

    def on_event(bot: str) -> Callable[[Any], None]:
        def handle(event: Any) -> None:
            if isinstance(event, bridge.PermissionRequest):
                questions[bot].append(event)
                asked[bot].set()
            elif isinstance(event, bridge.ActivityEvent) and event.activity == "tool":
                tools[bot].append(event.status)

        return handle

    async with trio.open_nursery() as nursery:
        runner = Worker(pg_dsn, lab.profiles, max_concurrent=4, lease_secs=2.0)
        await nursery.start(runner.run)
        async with RemoteHost(pg_dsn, name="alice") as alice, RemoteHost(pg_dsn, name="bob") as bob:
            results: dict[str, Any] = {}

            async def ask(bot: str, host: RemoteHost) -> None:
                results[bot] = await host.submit(
                    "ap4", "tg:42", bridge.Turn("hi tool=Read"), turn_id="p1", on_event=on_event(bot)
                )

            with trio.fail_after(DEADLINE):
                async with trio.open_nursery() as turns:
                    turns.start_soon(ask, "alice", alice)
                    turns.start_soon(ask, "bob", bob)
                    await asked["alice"].wait()
                    await asked["bob"].wait()
                    [alice_question], [bob_question] = questions["alice"], questions["bob"]
                    assert not bob.decide("p1", alice_question.request_id, True)  # not a question bob was asked
                    assert bob.decide("p1", bob_question.request_id, True)
                    await until(lambda: tools["bob"], "bob's tool to be allowed")
                    assert tools["alice"] == []  # alice's question still waits for alice
                    assert alice.decide("p1", alice_question.request_id, False)
            assert (tools["alice"], tools["bob"]) == (["denied"], ["allowed"])

            gates = {"alice": lab.gate(), "bob": lab.gate()}
            started = Started()
            ended: dict[str, bridge.TurnResult] = {}

            async def run(bot: str, host: RemoteHost) -> None:
                ended[bot] = await host.submit(
                    "rec",
                    "tg:42",
                    bridge.Turn(f"tag={bot} gate={gates[bot]}"),
                    turn_id="c1",
                    on_partial=started.callback(bot),
                )

            with trio.fail_after(DEADLINE):
                async with trio.open_nursery() as turns:
                    turns.start_soon(run, "alice", alice)
                    turns.start_soon(run, "bob", bob)
                    await started.wait("alice", "bob")
                    assert bob.cancel("c1")
                    await until(lambda: "bob" in ended, "bob's turn to end")
                    await lab.release(gates["alice"])
        runner.drain()
    assert (ended["bob"].outcome, ended["alice"].outcome) == (bridge.Outcome.CANCELLED, bridge.Outcome.OK)
    assert lab.events("sigint") == ["bob"]


# --------------------------------------------------------------------------- one live gateway per name


async def test_a_second_gateway_with_a_live_name_refuses_to_start_naming_the_holder(pg_dsn: str) -> None:
    async with RemoteHost(pg_dsn, name="bot1"):
        with pytest.raises(GatewayNameTaken) as caught:
            async with RemoteHost(pg_dsn, name="bot1"):
                pass
        message = str(caught.value)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in message and "--name" in message
        async with RemoteHost(pg_dsn, name="bot2"):  # another name is another bot
            pass
        dsn = pg_dsn.replace("bridge@", "bridge:s3cret@", 1)
        done = await trio.to_thread.run_sync(
            lambda: subprocess.run(
                [sys.executable, "-m", "bridge", "serve", "--postgres", dsn, "--name", "bot1"],
                capture_output=True,
                text=True,
                timeout=30,
                stdin=subprocess.DEVNULL,
            )
        )
        assert done.returncode == 2, done.stderr
        assert f"gateway name 'bot1' is held by a live gateway: pid {os.getpid()}" in done.stderr
        assert "Traceback" not in done.stderr and "s3cret" not in done.stderr
    async with RemoteHost(pg_dsn, name="bot1"):  # free again once the first stopped
        pass


async def test_a_gateway_takes_its_name_again_after_a_reconnect_and_takes_no_turns_once_another_holds_it(
    pg_dsn: str,
) -> None:
    def holder() -> int:
        return int(query(pg_dsn, "SELECT backend_pid FROM bridge_gateways WHERE name = 'bot'")[0][0])

    async with RemoteHost(pg_dsn, name="bot") as host:
        first = holder()
        query(pg_dsn, "SELECT pg_terminate_backend(%s)", first)  # the listening connection breaks
        second = await until(lambda: holder() != first and holder(), "the name to be taken again")
        assert not host.closing
        rival = connect(pg_dsn, autocommit=True)
        try:
            # The rival queues for the name's lock first, so it has it the moment the gateway's connection ends.
            queued = trio.Event()

            def wait_for_the_name() -> None:
                trio.from_thread.run_sync(queued.set)
                rival.execute("SELECT pg_advisory_lock(%s)", (queue.gateway_lock_key("bot"),))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.to_thread.run_sync, wait_for_the_name)
                await queued.wait()
                await until(
                    lambda: query(pg_dsn, "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"),
                    "the rival to wait for the lock",
                )
                query(pg_dsn, "SELECT pg_terminate_backend(%s)", second)
            await until(lambda: host.closing, "the gateway to stop taking turns")
            with pytest.raises(GatewayNameTaken, match="lost its name 'bot'"):
                await host.submit("rec", "c", bridge.Turn("hi"))
        finally:
            rival.close()


def test_after_a_reconnect_a_gateway_ends_its_own_stale_connection_to_take_its_name_again(pg_dsn: str) -> None:
    """The server may not have noticed yet that the gateway's old connection is gone: that one still holds
    the lock. The gateway ends it (the same role may), not mistaking itself for another gateway."""
    host = RemoteHost(pg_dsn, name="bot")
    with connect(pg_dsn, autocommit=True) as old, connect(pg_dsn, autocommit=True) as new:
        host._hold_name(old)
        host._hold_name(new)  # as after a reconnect, while `old` lives on
        [(backend,)] = query(pg_dsn, "SELECT backend_pid FROM bridge_gateways WHERE name = 'bot'")
        assert backend == new.info.backend_pid
        with pytest.raises(psycopg.OperationalError):
            old.execute("SELECT 1")
        other = RemoteHost(pg_dsn, name="bot")
        with connect(pg_dsn, autocommit=True) as third, pytest.raises(GatewayNameTaken):
            other._hold_name(third)  # another gateway ends nobody's connection
        new.execute("SELECT 1")


# --------------------------------------------------------------------------- workers and their profiles


async def test_workers_with_different_profile_directories_run_only_turns_of_profiles_they_have(
    pg_dsn: str, tmp_path: Path
) -> None:
    for directory in ("a", "b"):
        (tmp_path / directory).mkdir()
    alphas, betas = Lab(tmp_path / "a"), Lab(tmp_path / "b")
    alphas.profile("alpha")
    betas.profile("beta")
    async with trio.open_nursery() as nursery:
        first = Worker(pg_dsn, alphas.profiles, max_concurrent=2, lease_secs=2.0, name="has-alpha")
        await nursery.start(first.run)
        async with RemoteHost(pg_dsn, name="bot") as host:
            async with trio.open_nursery() as turns:
                beta: dict[str, bridge.TurnResult] = {}

                async def submit_beta(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
                    beta["b"] = await host.submit("beta", "c1", bridge.Turn("tag=b"), task_status=task_status)

                await turns.start(submit_beta)
                with trio.fail_after(DEADLINE):  # queued after beta's turn: the worker passed beta's by
                    alpha = await host.submit("alpha", "c2", bridge.Turn("tag=a"))
                assert alpha.reply == "reply a one" and "b" not in beta
                second = Worker(pg_dsn, betas.profiles, max_concurrent=2, lease_secs=2.0, name="has-beta")
                await nursery.start(second.run)
            assert beta["b"].reply == "reply b one"
        first.drain()
        second.drain()
    assert sorted(query(pg_dsn, "SELECT profile, worker FROM bridge_turns")) == [
        ("alpha", "has-alpha"),
        ("beta", "has-beta"),
    ]


async def test_a_worker_with_another_file_of_a_profile_leaves_its_turns_to_one_with_the_file_and_says_so(
    pg_dsn: str, tmp_path: Path, logged: Callable[[], str]
) -> None:
    for directory in ("ours", "theirs"):
        (tmp_path / directory).mkdir()
    ours, theirs = Lab(tmp_path / "ours"), Lab(tmp_path / "theirs")
    ours.profile(mode="one")
    theirs.profile(mode="two")  # "rec" too, another file: another agent behind the same name
    async with trio.open_nursery() as nursery:
        other = Worker(pg_dsn, theirs.profiles, max_concurrent=2, lease_secs=1.0, name="other-file")
        await nursery.start(other.run)
        # Advertised last, so its file is what turns are queued for (one worker each: the later one wins).
        matching = Worker(pg_dsn, ours.profiles, max_concurrent=1, lease_secs=1.0, name="same-file")
        await nursery.start(matching.run)
        async with RemoteHost(pg_dsn, name="bot") as host:
            gate = ours.gate()
            started = Started()
            results: dict[str, bridge.TurnResult] = {}

            async def submit(tag: str, message: str, conversation: str) -> None:
                results[tag] = await host.submit(
                    "rec", conversation, bridge.Turn(message), on_partial=started.callback(tag)
                )

            with trio.fail_after(DEADLINE):
                async with trio.open_nursery() as turns:
                    turns.start_soon(submit, "busy", f"tag=busy gate={gate}", "c0")
                    await started.wait("busy")  # the matching worker's only slot is taken
                    turns.start_soon(submit, "x", "tag=x", "c1")
                    await until(lambda: skips(logged()), "the other worker to say it skips the turn")
                    assert "x" not in results and ours.events("start") == ["busy"]
                    await ours.release(gate)
        other.drain()
        matching.drain()
    assert (results["busy"].reply, results["x"].reply) == ("reply busy one", "reply x one")
    assert query(pg_dsn, "SELECT DISTINCT worker FROM bridge_turns") == [("same-file",)]
    [skipped] = skips(logged())
    assert (skipped["profile"], skipped["worker"]) == ("rec", "other-file")
    assert skipped["queued_sha256"] == digest(ours) and skipped["this_worker_sha256"] == digest(theirs)


async def test_a_turn_no_live_worker_can_run_as_queued_ends_after_the_profile_wait_naming_what_they_have(
    pg_dsn: str, lab: Lab, logged: Callable[[], str]
) -> None:
    async with trio.open_nursery() as nursery:
        runner = Worker(pg_dsn, lab.profiles, max_concurrent=1, lease_secs=1.0, name="w", profile_wait_secs=0.3)
        await nursery.start(runner.run)
        async with RemoteHost(pg_dsn, name="bot") as host:
            gate = lab.gate()
            started = Started()
            outcome: dict[str, Any] = {}

            async def busy() -> None:
                outcome["busy"] = await host.submit(
                    "rec", "c0", bridge.Turn(f"tag=busy gate={gate}"), on_partial=started.callback("busy")
                )

            async def queued(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
                try:
                    await host.submit("rec", "c1", bridge.Turn("tag=x"), task_status=task_status)
                except RemoteTurnError as err:
                    outcome["x"] = err

            with trio.fail_after(DEADLINE):
                async with trio.open_nursery() as turns:
                    turns.start_soon(busy)
                    await started.wait("busy")
                    await turns.start(queued)  # queued for the file the worker has now
                    lab.profile(mode="two")  # then the file is edited: the worker reloads it
                    await lab.release(gate)
        runner.drain()
    error = outcome["x"]
    assert error.code == "profile_mismatch", str(error)
    assert f"w has sha256:{digest(lab)}" in str(error) and "profile 'rec' was queued for its definition" in str(error)
    assert "waited 0.3 s" in str(error) and "x" not in lab.events("start")
    [skipped] = skips(logged())  # the worker said so once, though it skipped the turn round after round
    assert skipped["this_worker_sha256"] == digest(lab)
    assert outcome["busy"].reply == "reply busy one"


# --------------------------------------------------------------------------- what a gateway and a worker hold


async def test_a_question_the_client_has_no_room_for_cancels_its_turn_clearly(
    pg_dsn: str, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    ask_profile(lab)
    monkeypatch.setattr(gateway, "MAX_BUFFERED_EVENT_BYTES", 200)  # a question takes more: it never fits
    async with trio.open_nursery() as nursery:
        runner = Worker(pg_dsn, lab.profiles, max_concurrent=1, lease_secs=2.0)
        await nursery.start(runner.run)
        async with RemoteHost(pg_dsn, name="bot") as host:
            with trio.fail_after(DEADLINE), pytest.raises(RemoteTurnError) as caught:
                await host.submit("ap4", "c", bridge.Turn("hi tool=Read"), on_event=lambda event: None)
        runner.drain()
    assert caught.value.code == "events_overflow" and "read responses as they come" in str(caught.value)


async def test_a_worker_whose_events_wait_past_its_bound_drops_partials_and_fails_a_turn_whose_question_would_be_lost(
    pg_dsn: str, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    ask_profile(lab)
    monkeypatch.setattr(worker, "MAX_PENDING_EVENT_BYTES", 0)  # nothing fits: as if PostgreSQL took nothing
    async with trio.open_nursery() as nursery:
        runner = Worker(pg_dsn, lab.profiles, max_concurrent=1, lease_secs=2.0)
        await nursery.start(runner.run)
        async with RemoteHost(pg_dsn, name="bot") as host:
            seen: list[Any] = []
            with trio.fail_after(DEADLINE):
                result = await host.submit("rec", "c", bridge.Turn("tag=a"), on_event=seen.append)
                assert result.reply == "reply a one" and seen == [result]  # its partial dropped, nothing else
                with pytest.raises(RemoteTurnError) as caught:
                    await host.submit("ap4", "c", bridge.Turn("hi tool=Read"), on_event=seen.append)
        runner.drain()
    assert caught.value.code == "events_overflow" and "could not be sent to its gateway" in str(caught.value)


async def test_an_event_larger_than_a_notification_arrives_in_pieces_or_fails_its_turn_never_lost_in_silence(
    pg_dsn: str, lab: Lab
) -> None:
    agent = lab.root / "big_agent.py"
    agent.write_text(
        textwrap.dedent("""\
        import json, sys
        turn = json.loads(sys.stdin.readline())
        def send(event):
            print(json.dumps({**event, "session_id": "s1"}), flush=True)
        send({"type": "partial", "text": "é" * 5000, "role": "thinking"})
        send({"type": "permission_request", "request_id": "r1", "tool_name": "Read",
              "input": {"path": "x" * 9000}, "description": "read a long path"})
        sys.stdin.readline()
        send({"type": "result", "text": "done"})
    """)
    )
    (lab.profiles / "big.yaml").write_text(
        textwrap.dedent(f"""\
        protocol: agentproc-0.4
        command: [{sys.executable!r}, {str(agent)!r}]
        permissions: {{ask: [Read], timeout_secs: 10}}
    """)
    )
    thoughts: list[str] = []

    def on_event(event: Any) -> None:
        if isinstance(event, bridge.ActivityEvent) and event.activity == "thinking":
            thoughts.append(event.text)

    async with trio.open_nursery() as nursery:
        runner = Worker(pg_dsn, lab.profiles, max_concurrent=1, lease_secs=2.0)
        await nursery.start(runner.run)
        async with RemoteHost(pg_dsn, name="bot") as host:
            with trio.fail_after(DEADLINE), pytest.raises(RemoteTurnError) as caught:
                await host.submit("big", "c", bridge.Turn("hi"), on_event=on_event)
        runner.drain()
    assert "".join(thoughts) == "é" * 5000 and len(thoughts) > 1
    assert caught.value.code == "events_overflow"
    assert "(permission) is larger than a PostgreSQL notification carries" in str(caught.value)


async def test_a_profile_that_breaks_after_the_workers_check_is_refused_as_profile_invalid_not_a_store_error(
    pg_dsn: str, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with trio.open_nursery() as nursery:
        runner = Worker(pg_dsn, lab.profiles, max_concurrent=1, lease_secs=2.0)
        await nursery.start(runner.run)
        async with RemoteHost(pg_dsn, name="bot") as host:
            looked = bridge.host.runtime.Host.profile

            def look_then_break(self: bridge.host.runtime.Host, name: str) -> bridge.Profile:
                """The file breaks between the worker's look at the profile and the turn's start."""
                profile = looked(self, name)
                (lab.profiles / "rec.yaml").write_text("command: [\n")
                return profile

            monkeypatch.setattr(bridge.host.runtime.Host, "profile", look_then_break)
            with trio.fail_after(DEADLINE), pytest.raises(RemoteTurnError) as caught:
                await host.submit("rec", "c", bridge.Turn("tag=a"), on_event=lambda event: None)
        runner.drain()
    assert caught.value.code == "profile_invalid", caught.value
