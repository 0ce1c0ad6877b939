"""Many workers and gateways on one PostgreSQL database: the guarantees of one process, across processes.

Real processes throughout: `agent-bridge worker` and `agent-bridge serve
--postgres` against a throwaway PostgreSQL cluster, driving the recorder agent
of `hostkit`, whose diary shows when each agent started and ended.
"""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from attachment_files import left_in
from conftest import SAMPLE_AGENTS, process_state
from fake_anthropic import Conversation, tool_results, write_claude_profile
from fake_api import FakeApi
from fleetkit import Fleet, eventually, release, turn
from hostkit import Lab, Started, max_overlap
from pgserver import PostgresServer
from test_cli import agent_profile

import bridge
from bridge.host.postgres.worker import Worker


@pytest.fixture
def fleet(lab: Lab, pg_dsn: str) -> Iterator[Fleet]:
    fleet = Fleet(lab, pg_dsn)
    try:
        yield fleet
    finally:
        fleet.stop()


def test_a_turn_goes_through_the_gateway_to_a_worker_and_back_with_its_partials_and_session(
    fleet: Fleet, lab: Lab
) -> None:
    gateway = fleet.gateway()
    fleet.worker()
    gateway.send(turn("t1", "tag=a session=s-1"))
    responses = gateway.until("result", "t1")
    kinds = [response["type"] for response in responses]
    assert kinds == ["accepted", "partial", "session", "result"], responses
    result = responses[-1]
    assert (result["outcome"], result["reply"], result["session_id"]) == ("ok", "reply a one", "s-1")
    gateway.send(turn(2, "tag=b"))
    assert gateway.until("result", 2)[-1]["outcome"] == "ok"
    assert [words[:3] for words in lab.lines() if words[0] == "start"] == [["start", "a", "-"], ["start", "b", "s-1"]]
    assert gateway.close() == 0


def test_many_conversations_on_three_workers_keep_each_conversation_in_order_and_never_overlap(
    fleet: Fleet, lab: Lab
) -> None:
    gateway = fleet.gateway()
    fleet.start_workers(3, max_concurrent=4)
    ids = set()
    for index in range(30):
        conversation = f"c{index % 6}"
        request_id = f"t{index}"
        ids.add(request_id)
        gateway.send(
            turn(
                request_id,
                f"tag={conversation}-{index // 6} session={conversation}-{index // 6}",
                conversation=conversation,
            )
        )
    results = gateway.results(ids)
    assert all(result["outcome"] == "ok" for result in results.values()), results
    lines = lab.lines()
    for conversation in (f"c{index}" for index in range(6)):
        tags = [f"{conversation}-{n}" for n in range(5)]
        started = [words for words in lines if words[0] == "start" and words[1] in tags]
        assert [words[1] for words in started] == tags  # in order
        assert max_overlap(lines, set(tags)) == 1  # one at a time
        # each turn resumed the session the previous one made, whichever worker ran it
        assert [words[2] for words in started] == ["-", *tags[:-1]]
    served_by = {row[0] for row in fleet.query("SELECT DISTINCT worker FROM bridge_turns")}
    assert len(served_by) >= 2, served_by


def test_stats_count_every_worker(fleet: Fleet) -> None:
    gateway = fleet.gateway()
    fleet.worker(max_concurrent=3)
    fleet.worker(max_concurrent=5)
    gateway.send({"type": "stats", "id": "s"})
    stats = gateway.until("stats", "s")[-1]
    assert stats["max_concurrent"] == 8 and len(stats["workers"]) == 2
    assert {"running", "queued", "completed", "failed", "outcomes"} <= set(stats)


def started(lab: Lab, tag: str) -> list[int]:
    """Process ids of the agents tagged `tag` that started, in order."""
    return [int(words[3]) for words in lab.lines() if words[:2] == ["start", tag]]


def test_a_killed_worker_s_agents_die_with_it_and_its_turns_run_again_in_order_elsewhere(
    fleet: Fleet, lab: Lab
) -> None:
    gateway = fleet.gateway()
    doomed = fleet.worker()
    gate = lab.gate()
    gateway.send(turn("a", f"tag=a gate={gate}"))
    gateway.until("partial", "a")
    gateway.send(turn("b", "tag=b"))  # queued behind a, in the same conversation
    first = started(lab, "a")[0]
    fleet.worker()  # a second worker, idle: b must wait for a, wherever a runs
    doomed.kill()
    eventually(lambda: process_state(first) in (None, "Z"), "the killed worker's agent to die")
    eventually(lambda: len(started(lab, "a")) == 2, "turn a to run again on the other worker")
    release(gate)
    results = gateway.results({"a", "b"})
    assert results["a"]["outcome"] == results["b"]["outcome"] == "ok"
    assert [words[1] for words in lab.lines() if words[0] == "start"] == ["a", "a", "b"]
    assert fleet.query("SELECT attempt FROM bridge_turns WHERE turn_id = 'a'") == [(2,)]


def test_with_on_worker_lost_fail_a_killed_worker_s_turn_ends_visibly_and_the_next_one_runs(
    fleet: Fleet, lab: Lab
) -> None:
    lab.profile("once", extra="on_worker_lost: fail\n")
    gateway = fleet.gateway()
    doomed = fleet.worker()
    gate = lab.gate()
    gateway.send(turn("a", f"tag=a gate={gate}", profile="once"))
    gateway.until("partial", "a")
    gateway.send(turn("b", "tag=b", profile="once"))
    doomed.kill()
    fleet.worker()
    results = gateway.results({"a", "b"})
    assert (results["a"]["outcome"], results["a"]["exit_code"]) == ("worker_lost", 1)
    assert results["a"]["error_reply"]
    assert results["b"]["outcome"] == "ok"
    assert [words[1] for words in lab.lines() if words[0] == "start"] == ["a", "b"]  # a ran once: at most once


def test_two_of_three_workers_killed_lose_nothing(fleet: Fleet, lab: Lab) -> None:
    gateway = fleet.gateway()
    doomed = fleet.start_workers(2, max_concurrent=2)
    gates = {f"c{index}": lab.gate() for index in range(4)}
    for conversation, gate in gates.items():
        gateway.send(turn(f"{conversation}-1", f"tag={conversation}-1 gate={gate}", conversation=conversation))
        gateway.send(turn(f"{conversation}-2", f"tag={conversation}-2", conversation=conversation))
    eventually(lambda: len([w for w in lab.lines() if w[0] == "start"]) == 4, "four agents to run")
    survivor = fleet.worker(max_concurrent=4)
    for process in doomed:
        process.kill()
    eventually(lambda: len([w for w in lab.lines() if w[0] == "start"]) == 8, "the four turns to run again")
    for gate in gates.values():
        release(gate)
    ids = {f"{conversation}-{n}" for conversation in gates for n in (1, 2)}
    results = gateway.results(ids)
    assert all(result["outcome"] == "ok" for result in results.values()), results
    lines = lab.lines()
    for conversation in gates:
        tags = [words[1] for words in lines if words[0] == "start" and words[1].startswith(conversation)]
        assert tags == [f"{conversation}-1", f"{conversation}-1", f"{conversation}-2"]
    assert survivor.poll() is None


def test_a_resent_turn_id_runs_nothing_new_and_a_second_wait_for_it_is_refused(fleet: Fleet, lab: Lab) -> None:
    gateway = fleet.gateway()
    fleet.worker()
    gate = lab.gate()
    gateway.send(turn("a", f"tag=a gate={gate}"))
    gateway.until("partial", "a")
    gateway.send(turn("a", "tag=again"))  # this gateway already waits for it
    assert gateway.until("error", "a")[-1]["code"] == "duplicate_id"
    release(gate)
    assert gateway.until("result", "a")[-1]["reply"] == "reply a one"
    gateway.close()
    # A bot that lost track resends the id through a new gateway: the same turn's result, nothing runs again.
    again = fleet.gateway()
    again.send(turn("a", "tag=again"))
    responses = again.until("result", "a")
    assert [r["type"] for r in responses] == ["accepted", "result"] and responses[-1]["reply"] == "reply a one"
    assert [words[1] for words in lab.lines() if words[0] == "start"] == ["a"]


def test_past_max_queued_turns_are_refused_with_queue_full(fleet: Fleet) -> None:
    gateway = fleet.gateway("--max-queued", "2")  # no worker: everything stays queued
    for request_id in ("q1", "q2"):
        gateway.send(turn(request_id, "tag=x", conversation=request_id))
        gateway.until("accepted", request_id)
    gateway.send(turn("q3", "tag=x", conversation="q3"))
    assert gateway.until("error", "q3")[-1]["code"] == "queue_full"
    gateway.send({"type": "stats", "id": "s"})
    stats = gateway.until("stats", "s")[-1]
    assert (stats["queued"], stats["refused"]) == (2, 1)


def test_cancel_ends_a_queued_turn_without_running_it_and_stops_a_running_one(fleet: Fleet, lab: Lab) -> None:
    gateway = fleet.gateway()
    fleet.worker()
    gate = lab.gate()
    gateway.send(turn("running", f"tag=running gate={gate}"))
    gateway.until("partial", "running")
    gateway.send(turn("queued", "tag=queued"))  # behind "running", same conversation
    gateway.until("accepted", "queued")
    gateway.send({"type": "cancel", "id": "queued"})
    queued = gateway.until("result", "queued")[-1]
    assert (queued["outcome"], queued["exit_code"]) == ("cancelled", 130)
    gateway.send({"type": "cancel", "id": "running"})
    running = gateway.until("result", "running")[-1]
    assert (running["outcome"], running["exit_code"]) == ("cancelled", 130)
    assert lab.events("sigint") == ["running"] and "queued" not in lab.events("start")
    gateway.send({"type": "cancel", "id": "nothing"})
    assert gateway.until("error", "nothing")[-1]["code"] == "unknown_turn"


def test_results_a_killed_gateway_could_not_send_are_sent_by_the_next_one_with_the_client_s_ids(
    fleet: Fleet, lab: Lab
) -> None:
    gateway = fleet.gateway("--name", "bot1")
    fleet.worker()
    gate = lab.gate()
    gateway.send(turn(7, f"tag=a gate={gate}"))
    gateway.send(turn("b", "tag=b", conversation="other"))
    gateway.until("partial", 7)
    gateway.results({"b"})
    eventually(
        lambda: fleet.query("SELECT 1 FROM bridge_turns WHERE turn_id = 'b' AND delivered_at IS NOT NULL"),
        "b to be marked delivered",
    )  # right after the result was written: at-least-once, not exactly
    gateway.kill()  # kill -9: turn 7 runs on, and nobody is there for its result
    release(gate)
    eventually(
        lambda: fleet.query("SELECT 1 FROM bridge_turns WHERE turn_id = '7' AND state = 'done'"), "turn 7 to finish"
    )
    other = fleet.gateway("--name", "someone-else")
    successor = fleet.gateway("--name", "bot1")
    result = successor.until("result", 7)[-1]  # the number it was sent as
    assert result["reply"] == "reply a one"
    assert not [r for r in successor.seen if r.get("id") == "b"]  # delivered already: not sent twice
    other.send({"type": "stats", "id": "s"})
    assert [r["type"] for r in other.until("stats", "s")] == ["stats"]  # another gateway's results are not its own
    eventually(  # marked once written, as b was: the mark may land after the line is read
        lambda: fleet.query("SELECT 1 FROM bridge_turns WHERE turn_id = '7' AND delivered_at IS NOT NULL"),
        "7 to be marked delivered by the successor",
    )


def test_sigterm_drains_a_worker_turns_that_finish_in_the_grace_end_there_the_others_go_back_to_the_queue(
    fleet: Fleet, lab: Lab
) -> None:
    gateway = fleet.gateway()
    draining = fleet.worker("--shutdown-grace", "1")
    quick, slow = lab.gate(), lab.gate()
    gateway.send(turn("quick", f"tag=quick gate={quick}", conversation="c1"))
    gateway.send(turn("slow", f"tag=slow gate={slow}", conversation="c2"))
    eventually(lambda: set(lab.events("start")) == {"quick", "slow"}, "both turns to run")
    draining.send_signal(signal.SIGTERM)
    eventually(lambda: fleet.query("SELECT 1 FROM bridge_workers WHERE draining"), "the worker to drain")
    release(quick)
    assert gateway.results({"quick"})["quick"]["outcome"] == "ok"
    assert draining.wait(timeout=20) == 0  # "slow" went back to the queue after the grace
    assert fleet.query("SELECT state FROM bridge_turns WHERE turn_id = 'slow'") == [("queued",)]
    fleet.worker()
    eventually(lambda: lab.events("start").count("slow") == 2, "slow to run again on the next worker")
    release(slow)
    assert gateway.results({"slow"})["slow"]["outcome"] == "ok"


def test_a_profile_no_worker_has_is_an_error_after_accepted(fleet: Fleet) -> None:
    gateway = fleet.gateway()
    fleet.worker("--profile-wait-secs", "0.3")  # it ends once no live worker had it for this long
    gateway.send(turn("x", "hello", profile="nope"))
    responses = gateway.until("error", "x")
    assert [r["type"] for r in responses] == ["accepted", "error"] and responses[-1]["code"] == "unknown_profile"
    eventually(
        lambda: fleet.query("SELECT 1 FROM bridge_turns WHERE turn_id = 'x' AND delivered_at IS NOT NULL"),
        "the error to count as delivered",
    )
    gateway.close()
    successor = fleet.gateway()
    successor.send({"type": "stats", "id": "s"})
    assert [r["type"] for r in successor.until("stats", "s")] == ["stats"]  # the error is not sent again


def test_a_second_sigterm_hands_the_turns_back_at_once(fleet: Fleet, lab: Lab) -> None:
    gateway = fleet.gateway()
    draining = fleet.worker("--shutdown-grace", "60")
    gate = lab.gate()
    gateway.send(turn("slow", f"tag=slow gate={gate}"))
    gateway.until("partial", "slow")
    draining.send_signal(signal.SIGTERM)
    eventually(lambda: fleet.query("SELECT 1 FROM bridge_workers WHERE draining"), "the worker to drain")
    draining.send_signal(signal.SIGTERM)
    assert draining.wait(timeout=10) == 0
    assert lab.events("sigint") == ["slow"]
    assert fleet.query("SELECT state FROM bridge_turns WHERE turn_id = 'slow'") == [("queued",)]


@pytest.mark.parametrize("command", [["worker", "--profiles", "."], ["serve"]])
def test_a_database_out_of_reach_at_start_is_exit_2_naming_it_without_the_password(command: list[str]) -> None:
    dsn = "postgresql://bot:s3cret@127.0.0.1:1/bridge"
    done = subprocess.run(
        [sys.executable, "-m", "bridge", *command[:1], "--postgres", dsn, *command[1:]],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert "127.0.0.1" in done.stderr and "s3cret" not in done.stderr and "Traceback" not in done.stderr


def test_the_server_restarted_under_load_loses_and_repeats_nothing(
    fleet: Fleet, lab: Lab, postgres_server: PostgresServer
) -> None:
    gateway = fleet.gateway()
    fleet.start_workers(2, lease_secs=8.0)  # a lease longer than the restart: the workers keep their turns through it
    conversations = [f"c{index}" for index in range(6)]

    def send(round_: int) -> set[str]:
        ids = set()
        for conversation in conversations:
            request_id = f"{conversation}-{round_}"
            gateway.send(turn(request_id, f"tag={request_id}", conversation=conversation))
            ids.add(request_id)
        return ids

    early = send(0) | send(1)
    gateway.results(set(list(early)[:4]))
    postgres_server.restart()
    late = send(2) | send(3)
    results = gateway.results(early | late, within=40)
    assert all(result.get("outcome") == "ok" for result in results.values()), [
        result for result in results.values() if result.get("outcome") != "ok"
    ]
    assert fleet.query("SELECT count(*), count(DISTINCT turn_id) FROM bridge_turns WHERE state = 'done'") == [(24, 24)]
    lines = lab.lines()
    for conversation in conversations:
        tags = [words[1] for words in lines if words[0] == "start" and words[1].startswith(conversation + "-")]
        assert tags == [f"{conversation}-{n}" for n in range(4)]  # each ran once, in order
        assert max_overlap(lines, set(tags)) == 1
    assert all(process.poll() is None for process in fleet.workers)


def test_an_agent_s_question_reaches_the_bot_and_its_decide_reaches_the_worker(fleet: Fleet, lab: Lab) -> None:
    (lab.profiles / "ap4.yaml").write_text(
        textwrap.dedent(f"""\
        protocol: agentproc-0.4
        command: [{sys.executable!r}, {str(SAMPLE_AGENTS / "wire04_agent.py")!r}]
        env: {{STREAM_DELAY: "0", TMPDIR: {str(lab.root)!r}}}
        permissions: {{ask: [Read], timeout_secs: 10}}
    """)
    )
    gateway = fleet.gateway()
    fleet.worker()
    gateway.send(turn("p1", "hi tool=Read", profile="ap4"))
    asked = gateway.until("permission", "p1")[-1]
    assert (asked["tool"], asked["title"]) == ("Read", "count the 2 word(s) of your message")
    gateway.send({"type": "decide", "id": "p1", "request_id": "q-nope", "allow": True})
    assert gateway.until("error", "p1")[-1]["code"] == "unknown_request"
    gateway.send({"type": "decide", "id": "p1", "request_id": asked["request_id"], "allow": True})
    responses = gateway.until("result", "p1")
    tool = next(r for r in responses if r["type"] == "activity" and r["activity"] == "tool")
    assert (tool["tool"], tool["status"]) == ("Read", "allowed")
    assert responses[-1]["outcome"] == "ok"


def test_an_agent_s_choice_reaches_the_bot_and_its_answer_reaches_the_worker(fleet: Fleet, lab: Lab) -> None:
    """Claude Code's AskUserQuestion, from a worker's agent to the bot at the gateway and the answer back."""
    with FakeApi(Conversation()) as api:
        write_claude_profile(lab.profiles / "claude.yaml", api, lab.root)
        gateway = fleet.gateway()
        fleet.worker()
        gateway.send(turn("q1", "ask colour", profile="claude"))
        asked = gateway.until("question", "q1", within=60)[-1]
        assert [option["label"] for option in asked["questions"][0]["options"]] == ["Red", "Blue"]
        gateway.send({"type": "answer", "id": "q1", "request_id": asked["request_id"], "answers": {"nope": "Red"}})
        assert gateway.until("error", "q1")[-1]["code"] == "invalid_request"  # checked at the gateway
        gateway.send({"type": "answer", "id": "q1", "request_id": asked["request_id"], "answers": {"q1": "Blue"}})
        responses = gateway.until("result", "q1", within=60)
        gateway.send({"type": "answer", "id": "q1", "request_id": asked["request_id"], "answers": {"q1": "Red"}})
        assert gateway.until("error", "q1")[-1]["code"] == "unknown_turn"
    assert responses[-1]["outcome"] == "ok", responses[-1]
    answered = [results for post in api.posts("/v1/messages") if (results := tool_results(post))]
    assert '"Which colour?"="Blue"' in answered[-1][0]["content"]


async def test_open_host_with_postgres_is_the_python_gateway(pg_dsn: str, lab: Lab) -> None:
    (lab.profiles / "long.yaml").write_text(
        textwrap.dedent(f"""\
        command: [{sys.executable!r}, "-c",
                  "import json; print('AGENT_PARTIAL:' + json.dumps('é' * 20000)); print('done')"]
        max_reply_chars: null
    """)
    )
    worker = Worker(pg_dsn, lab.profiles, max_concurrent=2, lease_secs=2.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        async with bridge.open_host(postgres=pg_dsn) as host:
            partials: list[str] = []
            result = await host.submit("long", "c", bridge.Turn("hi"), on_partial=partials.append)
            assert (result.outcome, result.reply) == (bridge.Outcome.OK, "done")
            assert "".join(partials) == "é" * 20000 and len(partials) > 1  # cut to fit NOTIFY, nothing lost
            (lab.profiles / "nul.yaml").write_text(f"command: [{sys.executable!r}, -c, 'print(\"a\\x00b\")']\n")
            assert (await host.submit("nul", "c", bridge.Turn("hi"))).reply == "a\x00b"  # jsonb would refuse it
            shown: list[str] = []
            seen: list[Any] = []
            result = await host.submit(
                "rec", "c", bridge.Turn("tag=x session=s-9"), on_partial=shown.append, on_event=seen.append
            )
            assert shown == ["started"] and seen[-1] == result  # both callbacks, the result last: as a local host
            again = await host.submit("rec", "c", bridge.Turn("tag=y"))
            assert (result.session_id, again.exit_code) == ("s-9", 0)
            stats = await host.current_stats()
            assert (stats.completed, stats.max_concurrent, len(stats.workers)) == (4, 2, 1)
            (lab.profiles / "ap4.yaml").write_text(
                textwrap.dedent(f"""\
                protocol: agentproc-0.4
                command: [{sys.executable!r}, {str(SAMPLE_AGENTS / "wire04_agent.py")!r}]
                env: {{STREAM_DELAY: "0", TMPDIR: {str(lab.root)!r}}}
                permissions: {{ask: [Read], timeout_secs: 20}}
            """)
            )
            for answer, status in [(lambda request: True, "allowed"), (None, "denied")]:
                events: list[Any] = []
                with trio.fail_after(10):  # no callback: denied at once, not after the 20 s timeout
                    await host.submit(
                        "ap4",
                        f"ask-{status}",
                        bridge.Turn("hi tool=Read"),
                        on_permission=answer,
                        on_event=events.append if answer else None,
                    )
                tools = [e for e in events if isinstance(e, bridge.ActivityEvent) and e.activity == "tool"]
                assert not answer or [e.status for e in tools][-1] == status
        worker.drain()
    assert [words[2] for words in lab.lines() if words[0] == "start"] == ["-", "s-9"]


def test_a_worker_that_cannot_renew_its_lease_stops_its_agents_before_anyone_may_take_the_turn(
    fleet: Fleet, lab: Lab, postgres_server: PostgresServer
) -> None:
    gateway = fleet.gateway()
    fleet.worker(lease_secs=0.5)  # what the test waits out, PostgreSQL gone, before the worker stops its agent
    gate = lab.gate()
    gateway.send(turn("a", f"tag=a gate={gate}"))
    gateway.until("partial", "a")
    postgres_server.stop()  # longer than the lease: the worker cannot prove the turn is still its own
    eventually(lambda: lab.events("sigint") == ["a"], "the worker to stop its agent")
    postgres_server.start()
    eventually(lambda: lab.events("start") == ["a", "a"], "the turn to run again")
    release(gate)
    assert gateway.results({"a"}, within=30)["a"]["outcome"] == "ok"
    assert fleet.query("SELECT attempt FROM bridge_turns WHERE turn_id = 'a'") == [(2,)]


def test_a_worker_paused_past_its_lease_stops_its_agent_when_resumed_and_writes_nothing(fleet: Fleet, lab: Lab) -> None:
    """A paused worker (SIGSTOP) cannot stop its agent, which runs on while another worker takes the turn (what
    docs/fleet.md says of pausing one); resumed, it stops that agent at once and its result is never written."""
    gateway = fleet.gateway()
    paused = fleet.worker(lease_secs=0.5)
    gate = lab.gate()
    gateway.send(turn("a", f"tag=a gate={gate}"))
    gateway.until("partial", "a")
    first = started(lab, "a")[0]
    paused.send_signal(signal.SIGSTOP)
    try:
        fleet.worker()
        eventually(lambda: len(started(lab, "a")) == 2, "the other worker to run the turn again")
        assert process_state(first) not in (None, "Z"), "the paused worker's agent runs on: nothing can stop it"
    finally:
        paused.send_signal(signal.SIGCONT)
    eventually(lambda: process_state(first) in (None, "Z"), "the resumed worker to stop its agent")
    release(gate)
    results = gateway.results({"a"})
    assert results["a"]["outcome"] == "ok"
    assert fleet.query("SELECT attempt, worker FROM bridge_turns WHERE turn_id = 'a'") == [(2, "w2")]
    assert "stopping a turn this worker no longer holds" in fleet.log("w1")


async def test_a_turn_claimed_while_a_lease_renewal_is_under_way_stays_this_workers(
    pg_dsn: str, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal's answer cannot list a turn claimed after it read the leases; that turn is not lost."""
    from bridge.host.postgres import queue

    worker = Worker(pg_dsn, lab.profiles, max_concurrent=2, lease_secs=10.0)
    may_return, returned = threading.Event(), threading.Event()
    renew = queue.renew

    def slow_first_renewal(conn: Any, **options: Any) -> dict[str, tuple[int, bool]]:
        holding = renew(conn, **options)
        if not returned.is_set():
            may_return.wait(10)
            returned.set()
        return holding

    monkeypatch.setattr(queue, "renew", slow_first_renewal)
    gate = lab.gate()
    started = Started()
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        async with bridge.open_host(postgres=pg_dsn) as host:
            async with trio.open_nursery() as turns:

                async def submit() -> None:
                    with trio.fail_after(10):
                        result = await host.submit(
                            "rec", "c", bridge.Turn(f"tag=a gate={gate}"), on_partial=started.callback("a")
                        )
                    assert (result.outcome, result.reply) == (bridge.Outcome.OK, "reply a one")

                turns.start_soon(submit)
                with trio.fail_after(10):
                    await started["a"].wait()  # claimed after the first renewal read the leases
                may_return.set()
                await trio.to_thread.run_sync(returned.wait)
                await trio.sleep(0.2)  # the worker judges the renewal's answer
                await lab.release(gate)
        worker.drain()
    assert lab.events("sigint") == []


def test_a_gateway_shutting_down_detaches_turns_still_running_and_the_next_one_sends_their_results(
    fleet: Fleet, lab: Lab
) -> None:
    gateway = fleet.gateway("--shutdown-grace", "0.2")
    fleet.worker()
    gate = lab.gate()
    gateway.send(turn("long", f"tag=long gate={gate}"))
    gateway.until("partial", "long")
    assert gateway.close() == 0  # EOF: serve stops waiting after its grace; the turn runs on
    assert [(r["type"], r.get("code")) for r in gateway.rest()] == [("error", "detached")]
    release(gate)
    assert fleet.gateway().until("result", "long")[-1]["reply"] == "reply long one"


# ---------------------------------------------------------------------------- files the agent leaves

BIG = bytes(range(256)) * 10_000  # 2.5 MB: more than two pieces of fleet_files.CHUNK_BYTES
MAKES_FILES = """
import os, pathlib
outbox = pathlib.Path(os.environ["AGENT_OUTBOX"])
(outbox / "report.txt").write_text("two lines\\nof report\\n")
(outbox / "big.bin").write_bytes(bytes(range(256)) * 10_000)
(outbox / "empty.txt").write_bytes(b"")
print("done")
"""


def maker(lab: Lab, tmp_path: Path, **fields: Any) -> None:
    """Profile `maker`: an agent that leaves three files in its outbox (its working directory: `tmp_path/work`)."""
    (tmp_path / "work").mkdir(exist_ok=True)
    agent_profile(lab.profiles, MAKES_FILES, name="maker", cwd=str(tmp_path / "work"), **fields)


def test_the_agent_s_files_reach_the_bot_through_the_gateway_with_their_bytes(
    fleet: Fleet, lab: Lab, tmp_path: Path
) -> None:
    maker(lab, tmp_path)
    gateway = fleet.gateway()
    fleet.worker()
    gateway.send(turn("t1", "go", profile="maker", inline_files_max_bytes=100))
    responses = gateway.until("result", "t1")
    assert [response["type"] for response in responses] == ["accepted", "file", "file", "file", "result"], responses
    big, empty, report = responses[1:4]
    assert [file["name"] for file in responses[-1]["files"]] == ["big.bin", "empty.txt", "report.txt"]
    assert (big["size"], big["media_type"], "data" in big) == (len(BIG), "application/octet-stream", False)
    assert Path(big["path"]).read_bytes() == BIG
    assert not Path(big["path"]).is_relative_to(tmp_path)  # the gateway's own copy, not the worker's outbox
    assert base64.b64decode(report["data"]) == b"two lines\nof report\n"  # small enough to travel inline
    assert (empty["size"], base64.b64decode(empty["data"])) == (0, b"")
    eventually(lambda: not left_in(tmp_path / "work"), "the worker to remove its outbox (the bytes are stored)")
    # The gateway took them: it deletes the rows once the result is marked delivered, just after sending it.
    eventually(lambda: fleet.query("SELECT count(*) FROM bridge_turn_files") == [(0,)], "the stored files to go")
    gateway.send({"type": "ack_file", "id": "t1", "file": "big.bin"})
    # The file goes, then the directory it was the last in: waiting for the file alone raced the second step.
    eventually(lambda: not Path(big["path"]).parent.exists(), "the acknowledged file and its directory to be deleted")

    gateway.send(turn("t2", "go", profile="maker", conversation="other"))
    kept = gateway.until("result", "t2")[1]
    assert Path(kept["path"]).exists()
    assert gateway.close() == 0
    assert not Path(kept["path"]).parent.exists()  # nothing the bot did not take outlives the gateway


def test_the_profile_s_outbox_limits_bound_what_travels(fleet: Fleet, lab: Lab, tmp_path: Path) -> None:
    maker(lab, tmp_path, outbox_max_files=2, outbox_max_bytes=1000)
    gateway = fleet.gateway()
    fleet.worker()
    gateway.send(turn("t1", "go", profile="maker"))
    responses = gateway.until("result", "t1")
    result = responses[-1]
    assert [file["name"] for file in result["files"]] == ["empty.txt", "report.txt"]
    assert "'big.bin' not sent" in result["files_note"]
    notices = [response for response in responses if response["type"] == "activity"]
    assert notices and "'big.bin' not sent" in notices[0]["text"]
    offered = [response for response in responses if response["type"] == "file"]
    assert base64.b64decode(offered[0]["data"]) == b""  # an empty file is always inline
    assert Path(offered[1]["path"]).read_bytes() == b"two lines\nof report\n"
    eventually(lambda: not left_in(tmp_path / "work"), "what was left out to go with the worker's outbox")
    assert gateway.close() == 0
    assert not Path(offered[1]["path"]).parent.exists()


def test_a_result_sent_again_by_the_next_gateway_brings_its_files(fleet: Fleet, lab: Lab, tmp_path: Path) -> None:
    gate = lab.gate()
    (tmp_path / "work").mkdir(exist_ok=True)
    agent_profile(
        lab.profiles,
        f"import os, pathlib; open({str(gate)!r}).read()\n"
        "pathlib.Path(os.environ['AGENT_OUTBOX'], 'late.txt').write_text('made late')\nprint('done')\n",
        name="late",
        cwd=str(tmp_path / "work"),
    )
    gateway = fleet.gateway("--shutdown-grace", "0.2")
    fleet.worker()
    gateway.send(turn("t1", "go", profile="late"))
    gateway.until("accepted", "t1")
    assert gateway.close() == 0  # the turn runs on; its result waits for the next gateway of the name
    assert [(r["type"], r.get("code")) for r in gateway.rest()] == [("error", "detached")]
    release(gate)
    responses = fleet.gateway().until("result", "t1")
    [file] = [r for r in responses if r["type"] == "file"]
    assert responses[-1]["outcome"] == "ok" and [f["name"] for f in responses[-1]["files"]] == ["late.txt"]
    assert file["name"] == "late.txt" and Path(file["path"]).read_text() == "made late"
    eventually(lambda: fleet.query("SELECT count(*) FROM bridge_turn_files") == [(0,)], "the delivered rows gone")
