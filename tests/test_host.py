"""The host runtime (bridge.open_host) with real agents: ordering, limits, sessions, reload, cancel, shutdown.

Agents are the diary-keeping recorder of `hostkit`: the diary's line order
shows which agents ran at the same time, and FIFO gates hold an agent running
until the test lets it go, so nothing here synchronises on sleeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hostkit import Lab, Started, max_overlap

import bridge
import bridge.host.registry
from bridge import DuplicateTurn, HostClosed, QueueFull, SessionIdRefused, Turn, TurnResult, UnknownProfile
from bridge.host.registry import ProfileRegistry
from bridge.host.runtime import Host
from bridge.host.scheduler import Ticket, TurnQueue
from bridge.host.sqlite_store import SessionStore, StoreError


def host_for(lab: Lab, **options: Any) -> Host:
    return bridge.open_host(lab.profiles, state=lab.state, **options)


async def submit_in_order(
    nursery: trio.Nursery,
    host: Host,
    results: dict[str, TurnResult],
    started: Started,
    conversation: str,
    tag: str,
    message: str = "",
    **options: Any,
) -> None:
    """Submit and return once the host accepted the turn, so arrival order is the order of these calls."""

    async def run(task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        results[tag] = await host.submit(
            "rec",
            conversation,
            Turn(f"tag={tag} {message}", **options),
            on_partial=started.callback(tag),
            turn_id=tag,
            task_status=task_status,
        )

    await nursery.start(run)


# --------------------------------------------------------------------------- ordering and parallelism


async def test_turns_of_one_conversation_never_overlap_and_run_in_arrival_order(lab: Lab) -> None:
    results: dict[str, TurnResult] = {}
    started = Started()
    gate = lab.gate()
    async with host_for(lab) as host, trio.open_nursery() as nursery:
        await submit_in_order(nursery, host, results, started, "chat", "t1", f"gate={gate}")
        for tag in ("t2", "t3", "t4", "t5"):
            await submit_in_order(nursery, host, results, started, "chat", tag)
        await started.wait("t1")
        assert host.stats().running == 1 and host.stats().queued == 4
        await lab.release(gate)
    assert lab.events("start") == ["t1", "t2", "t3", "t4", "t5"]
    assert max_overlap(lab.lines()) == 1
    assert [line[0] for line in lab.lines()] == ["start", "end"] * 5
    assert all(result.ok for result in results.values())


async def test_different_conversations_run_at_the_same_time(lab: Lab) -> None:
    # Each agent is held until *both* have started: run one after the other, they would deadlock.
    results: dict[str, TurnResult] = {}
    started = Started()
    gates = {"a": lab.gate(), "b": lab.gate()}
    async with host_for(lab) as host, trio.open_nursery() as nursery:
        for tag, conversation in (("a", "alice"), ("b", "bob")):
            await submit_in_order(nursery, host, results, started, conversation, tag, f"gate={gates[tag]}")
        await started.wait("a", "b")
        for gate in gates.values():
            await lab.release(gate)
    assert max_overlap(lab.lines()) == 2
    assert results["a"].reply == "reply a one" and results["b"].ok


async def test_session_names_are_separate_lanes(lab: Lab) -> None:
    results: dict[str, TurnResult] = {}
    started = Started()
    gates = {"main": lab.gate(), "side": lab.gate()}
    async with host_for(lab) as host, trio.open_nursery() as nursery:
        for name, gate in gates.items():
            await submit_in_order(nursery, host, results, started, "chat", name, f"gate={gate}", session_name=name)
        await started.wait("main", "side")
        for gate in gates.values():
            await lab.release(gate)
    assert max_overlap(lab.lines()) == 2


async def test_at_most_max_concurrent_turns_run_and_the_rest_start_as_slots_free(lab: Lab) -> None:
    results: dict[str, TurnResult] = {}
    started = Started()
    gates = {tag: lab.gate() for tag in ("a", "b", "c", "d")}
    async with host_for(lab, max_concurrent=2) as host, trio.open_nursery() as nursery:
        for tag, gate in gates.items():
            await submit_in_order(nursery, host, results, started, f"chat-{tag}", tag, f"gate={gate}")
        await started.wait("a", "b")
        assert (host.stats().running, host.stats().queued) == (2, 2)
        assert sorted(lab.events("start")) == ["a", "b"]  # c and d wait for a slot, not for a timer
        await lab.release(gates["b"])
        await started.wait("c")
        assert sorted(lab.events("start")) == ["a", "b", "c"]
        for tag in ("a", "c"):
            await lab.release(gates[tag])
        await started.wait("d")
        await lab.release(gates["d"])
    assert max_overlap(lab.lines()) == 2
    assert lab.events("start")[2:] == ["c", "d"]
    stats = host.stats()
    assert (stats.running, stats.queued, stats.completed, stats.failed) == (0, 0, 4, 0)
    assert stats.outcomes["ok"] == 4


async def test_a_freed_slot_goes_to_the_turn_that_arrived_first(lab: Lab) -> None:
    # a1 holds the only slot; then b1, a2, c1 arrive. a2 must wait for a1 (same
    # conversation); after that, arrival order decides: b1, a2, c1.
    results: dict[str, TurnResult] = {}
    started = Started()
    gate = lab.gate()
    async with host_for(lab, max_concurrent=1) as host, trio.open_nursery() as nursery:
        await submit_in_order(nursery, host, results, started, "a", "a1", f"gate={gate}")
        for conversation, tag in (("b", "b1"), ("a", "a2"), ("c", "c1")):
            await submit_in_order(nursery, host, results, started, conversation, tag)
        await started.wait("a1")
        await lab.release(gate)
    assert lab.events("start") == ["a1", "b1", "a2", "c1"]
    assert max_overlap(lab.lines()) == 1


async def test_a_full_queue_refuses_at_once_and_the_accepted_turns_still_run(lab: Lab) -> None:
    results: dict[str, TurnResult] = {}
    started = Started()
    gate = lab.gate()
    async with host_for(lab, max_concurrent=1, max_queued=2) as host, trio.open_nursery() as nursery:
        await submit_in_order(nursery, host, results, started, "a", "a", f"gate={gate}")
        await submit_in_order(nursery, host, results, started, "b", "b")
        await submit_in_order(nursery, host, results, started, "a", "a2")
        with pytest.raises(QueueFull, match="max_queued"):
            await host.submit("rec", "c", Turn("tag=c"))
        assert host.stats().refused == 1
        await started.wait("a")
        await lab.release(gate)
    assert sorted(results) == ["a", "a2", "b"] and all(result.ok for result in results.values())
    assert "c" not in lab.events("start")


async def test_a_busy_host_with_no_queue_refuses_what_cannot_start(lab: Lab) -> None:
    started = Started()
    gate = lab.gate()
    results: dict[str, TurnResult] = {}
    async with host_for(lab, max_concurrent=1, max_queued=0) as host, trio.open_nursery() as nursery:
        await submit_in_order(nursery, host, results, started, "a", "a", f"gate={gate}")
        with pytest.raises(QueueFull):
            await host.submit("rec", "b", Turn("tag=b"))
        await started.wait("a")
        await lab.release(gate)
    assert results["a"].ok


# --------------------------------------------------------------------------- sessions


async def test_the_stored_session_id_is_read_into_the_next_turn_of_the_conversation(lab: Lab) -> None:
    # t2 is queued while t1 runs, so it must read the id t1 stores, not the one stored when it arrived.
    results: dict[str, TurnResult] = {}
    started = Started()
    gate = lab.gate()
    async with host_for(lab) as host, trio.open_nursery() as nursery:
        await submit_in_order(nursery, host, results, started, "chat", "t1", f"gate={gate} session=s-1")
        await submit_in_order(nursery, host, results, started, "chat", "t2")  # prints no session line
        await started.wait("t1")
        await lab.release(gate)
    async with host_for(lab) as host:  # across restarts: the store is a file
        results["t3"] = await host.submit("rec", "chat", Turn("tag=t3"))
        results["other"] = await host.submit("rec", "another chat", Turn("tag=other"))
        results["named"] = await host.submit("rec", "chat", Turn("tag=named", session_name="side"))
        results["explicit"] = await host.submit("rec", "chat", Turn("tag=explicit", session_id="given"))
    sessions = {words[1]: words[2] for words in lab.lines() if words[0] == "start"}
    assert sessions == {"t1": "-", "t2": "s-1", "t3": "s-1", "other": "-", "named": "-", "explicit": "given"}
    assert results["t1"].session_id == "s-1" and results["t2"].session_id == ""
    with SessionStore(lab.state) as store:
        assert store.get("rec", "chat") == "s-1"  # a turn without a session line kept it
        assert store.get("rec", "another chat") == ""


async def test_client_session_ids_stored_refuses_any_session_but_the_conversations_own(lab: Lab) -> None:
    async with host_for(lab) as host:  # the default, "any": a turn resumes whatever session it names
        await host.submit("rec", "alice", Turn("tag=a1 session=s-alice"))
        await host.submit("rec", "bob", Turn("tag=b1 session=s-bob"))
        assert (await host.submit("rec", "bob", Turn("tag=b-any", session_id="s-alice"))).ok
    async with host_for(lab, client_session_ids="stored") as host:
        for conversation in ("bob", "carol"):  # carol has no stored session
            with pytest.raises(SessionIdRefused, match="leave session_id empty to resume"):
                await host.submit("rec", conversation, Turn("tag=refused", session_id="s-alice"))
        with pytest.raises(UnknownProfile):  # refused as such, not by the session check
            await host.submit("nope", "bob", Turn("tag=refused", session_id="s-bob"))
        own = await host.submit("rec", "alice", Turn("tag=a2", session_id="s-alice"))
        stored = await host.submit("rec", "bob", Turn("tag=b2"))
        assert host.stats().running == 0
    assert own.ok and stored.ok
    sessions = [(words[1], words[2]) for words in lab.lines() if words[0] == "start"]
    assert sessions == [("a1", "-"), ("b1", "-"), ("b-any", "s-alice"), ("a2", "s-alice"), ("b2", "s-bob")]


def test_client_session_ids_is_any_or_stored(lab: Lab) -> None:
    with pytest.raises(ValueError, match="'any' or 'stored'"):
        host_for(lab, client_session_ids="mine")


class BrokenStore:
    def __init__(self, fail_get: bool) -> None:
        self.fail_get = fail_get

    def get(self, profile: str, conversation: str, session_name: str = "default") -> str:
        if self.fail_get:
            raise StoreError("session store /x: disk I/O error")
        return ""

    def record(self, profile: str, conversation: str, session_name: str, result: TurnResult) -> None:
        raise StoreError("session store /x: disk I/O error")


async def test_a_store_that_cannot_record_still_delivers_the_result(lab: Lab) -> None:
    async with bridge.open_host(lab.profiles, state=BrokenStore(fail_get=False)) as host:
        result = await host.submit("rec", "chat", Turn("tag=x"))
        assert result.ok and result.reply == "reply x one"
        assert host.stats().store_errors == 1


async def test_a_store_that_cannot_be_read_fails_the_submit_and_runs_nothing(lab: Lab) -> None:
    async with bridge.open_host(lab.profiles, state=BrokenStore(fail_get=True)) as host:
        with pytest.raises(StoreError, match="disk I/O"):
            await host.submit("rec", "chat", Turn("tag=x"))
        assert host.stats().running == 0
        result = await host.submit("rec", "chat", Turn("tag=y", session_id="known"))  # no read needed
        assert result.ok
    assert lab.events("start") == ["y"]


# --------------------------------------------------------------------------- profiles


async def test_an_edited_profile_applies_to_the_next_turn_without_a_restart(lab: Lab) -> None:
    async with host_for(lab) as host:
        assert (await host.submit("rec", "chat", Turn("tag=1"))).reply == "reply 1 one"
        lab.profile("rec", mode="two")  # same size, same second: only the racy-stamp rule notices
        assert (await host.submit("rec", "chat", Turn("tag=2"))).reply == "reply 2 two"
        (lab.profiles / "rec.yaml").write_text("command: [unclosed\n")
        with pytest.raises(bridge.ProfileError, match=r"rec\.yaml:\d+: invalid YAML"):
            await host.submit("rec", "chat", Turn("tag=3"))
        lab.profile("rec", mode="three")
        assert (await host.submit("rec", "chat", Turn("tag=4"))).reply == "reply 4 three"
        (lab.profiles / "rec.yaml").unlink()
        with pytest.raises(UnknownProfile, match="no profile named 'rec'"):
            await host.submit("rec", "chat", Turn("tag=5"))
        lab.profile("later")  # added while the host runs
        assert (await host.submit("later", "chat", Turn("tag=6"))).ok


async def test_a_profile_is_asked_for_by_its_name_field_else_its_file_stem(lab: Lab) -> None:
    lab.profile("file-stem", extra="name: custom\n")
    (lab.profiles / "broken.yml").write_text("command: x\ntimout_secs: 3\n")
    (lab.profiles / ".hidden.yaml").write_text("command: x\n")
    async with host_for(lab) as host:
        assert (await host.submit("custom", "chat", Turn("tag=c"))).ok
        with pytest.raises(UnknownProfile, match=r"available: broken, custom, rec"):
            await host.submit("file-stem", "chat", Turn("tag=f"))
        with pytest.raises(bridge.ProfileError, match="did you mean 'timeout_secs'"):
            await host.submit("broken", "chat", Turn("tag=b"))
        assert (await host.submit("rec", "chat", Turn("tag=r"))).ok  # one bad file spoils nothing else


async def test_two_files_claiming_one_name_is_an_error_for_that_name(lab: Lab) -> None:
    lab.profile("other", extra="name: rec\n")
    async with host_for(lab) as host:
        with pytest.raises(bridge.ProfileError, match="claimed by several files"):
            await host.submit("rec", "chat", Turn("tag=x"))


def test_registry_reuses_unchanged_profiles_and_rereads_changed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bridge.host.registry, "RACY_SECS", 0)  # every stamp is conclusive at once
    (tmp_path / "a.yaml").write_text("command: a\n")
    registry = ProfileRegistry(tmp_path)
    first = registry.get("a")
    assert registry.get("a") is first  # unchanged: nothing re-read
    (tmp_path / "a.yaml").write_text("command: bb\n")
    assert registry.get("a").argv_template == ("bb",)


def test_a_missing_profiles_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(bridge.ProfileError, match="profiles directory cannot be read"):
        bridge.open_host(tmp_path / "nope", state=tmp_path / "s.sqlite3")


# --------------------------------------------------------------------------- cancel


async def test_cancel_stops_a_running_agent_with_sigint_and_the_submitter_gets_130(lab: Lab) -> None:
    results: dict[str, TurnResult] = {}
    started = Started()
    gate = lab.gate()
    async with host_for(lab) as host, trio.open_nursery() as nursery:
        await submit_in_order(nursery, host, results, started, "chat", "slow", f"gate={gate}")
        await submit_in_order(nursery, host, results, started, "chat", "queued")
        await submit_in_order(nursery, host, results, started, "chat", "next")
        await started.wait("slow")
        assert host.cancel("queued")  # leaves the queue without running
        assert host.cancel("slow")
        assert not host.cancel("no such turn")
    for tag in ("slow", "queued"):
        assert (results[tag].exit_code, results[tag].outcome) == (130, bridge.Outcome.CANCELLED)
    assert results["next"].ok  # the conversation goes on
    assert lab.events("sigint") == ["slow"]
    assert lab.events("start") == ["slow", "next"]
    assert host.stats().outcomes["cancelled"] == 2


async def test_cancelling_the_submitting_task_stops_the_agent_and_frees_the_conversation(lab: Lab) -> None:
    started = Started()
    gate = lab.gate()
    async with host_for(lab) as host:
        async with trio.open_nursery() as nursery:
            results: dict[str, TurnResult] = {}
            await submit_in_order(nursery, host, results, started, "chat", "abandoned", f"gate={gate}")
            await submit_in_order(nursery, host, results, started, "other", "waiting-elsewhere")
            await started.wait("abandoned")
            nursery.cancel_scope.cancel()
        assert host.stats().running == 0 and host.stats().queued == 0
        assert (await host.submit("rec", "chat", Turn("tag=after"))).ok
    assert lab.events("sigint") == ["abandoned"]


async def test_a_queued_submit_cancelled_by_its_task_leaves_the_queue(lab: Lab) -> None:
    started = Started()
    gate = lab.gate()
    results: dict[str, TurnResult] = {}
    async with host_for(lab, max_concurrent=1) as host, trio.open_nursery() as nursery:
        await submit_in_order(nursery, host, results, started, "a", "running", f"gate={gate}")
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as inner:
                await submit_in_order(inner, host, results, started, "b", "gives-up")
                assert host.stats().queued == 1
                scope.cancel()
        assert host.stats().queued == 0
        await submit_in_order(nursery, host, results, started, "c", "after")
        await started.wait("running")
        await lab.release(gate)
    assert lab.events("start") == ["running", "after"]


async def test_turn_ids_are_unique_in_flight(lab: Lab) -> None:
    started = Started()
    gate = lab.gate()
    results: dict[str, TurnResult] = {}
    async with host_for(lab) as host, trio.open_nursery() as nursery:
        await submit_in_order(nursery, host, results, started, "a", "same", f"gate={gate}")
        with pytest.raises(DuplicateTurn):
            await host.submit("rec", "b", Turn("tag=x"), turn_id="same")
        await started.wait("same")
        await lab.release(gate)
    async with host_for(lab) as host:
        assert (await host.submit("rec", "b", Turn("tag=x"), turn_id="same")).ok  # finished ids are free again


# --------------------------------------------------------------------------- shutdown


async def test_shutdown_lets_turns_in_flight_finish_within_the_grace(lab: Lab) -> None:
    started = Started()
    gate = lab.gate()
    results: dict[str, TurnResult] = {}
    async with host_for(lab, shutdown_grace=30) as host, trio.open_nursery() as nursery:
        await submit_in_order(nursery, host, results, started, "a", "running", f"gate={gate}")
        await submit_in_order(nursery, host, results, started, "a", "queued")
        await started.wait("running")
        nursery.start_soon(host.aclose)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(HostClosed):
            await host.submit("rec", "b", Turn("tag=late"))
        await lab.release(gate)
    assert results["running"].ok and results["queued"].ok
    assert lab.events("sigint") == []


async def test_shutdown_cancels_what_is_left_after_the_grace_and_every_turn_gets_a_result(lab: Lab) -> None:
    started = Started()
    gates = [lab.gate(), lab.gate()]
    results: dict[str, TurnResult] = {}
    async with trio.open_nursery() as nursery:
        async with host_for(lab, shutdown_grace=0.2, max_concurrent=2) as host:
            await submit_in_order(nursery, host, results, started, "a", "a", f"gate={gates[0]}")
            await submit_in_order(nursery, host, results, started, "b", "b", f"gate={gates[1]}")
            await submit_in_order(nursery, host, results, started, "c", "queued")
            await started.wait("a", "b")
        # leaving the block waited for the grace, then cancelled; every submitter has its result
        assert sorted(results) == ["a", "b", "queued"]
    for tag in ("a", "b", "queued"):
        assert (results[tag].exit_code, results[tag].outcome) == (130, bridge.Outcome.CANCELLED), tag
    assert sorted(lab.events("sigint")) == ["a", "b"]
    assert "queued" not in lab.events("start")


async def test_a_closed_host_refuses_turns(lab: Lab) -> None:
    host = host_for(lab)
    await host.aclose()
    with pytest.raises(HostClosed):
        await host.submit("rec", "chat", Turn("tag=x"))
    await host.aclose()  # idempotent


async def test_a_conversation_key_no_store_can_hold_is_refused_before_anything_runs(lab: Lab) -> None:
    async with host_for(lab) as host:
        for key in ("chat\0x", "chat\udc80"):
            with pytest.raises(bridge.TurnError, match="conversation key contains"):
                await host.submit("rec", key, Turn("tag=x"))
    assert lab.lines() == []


# --------------------------------------------------------------------------- callbacks and logs


async def test_events_reach_the_callbacks_and_the_result_comes_last(lab: Lab) -> None:
    seen: list[Any] = []
    partials: list[str] = []
    async with host_for(lab) as host:
        result = await host.submit(
            "rec", "chat", Turn("tag=x session=s"), on_event=seen.append, on_partial=partials.append
        )
    assert partials == ["started"]
    assert [type(event).__name__ for event in seen] == ["PartialEvent", "SessionEvent", "TurnResult"]
    assert seen[-1] is result


async def test_an_exception_in_a_callback_reaches_the_submitter_as_itself(lab: Lab) -> None:
    def on_partial(text: str) -> None:
        raise LookupError("the bot's own bug")

    async with host_for(lab) as host:
        with pytest.raises(LookupError, match="own bug"):
            await host.submit("rec", "chat", Turn("tag=x"), on_partial=on_partial)
        assert (await host.submit("rec", "chat", Turn("tag=y"))).ok  # the conversation is free again
    assert lab.events("start") == ["x", "y"]


async def test_the_agents_log_records_carry_the_hosts_turn_id(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    bridge.log.configure_logging("info", "json")
    try:
        async with host_for(lab) as host:
            await host.submit("rec", "chat", Turn("tag=x"), turn_id="msg-77")
    finally:
        bridge.log.configure_logging()
    records = [line for line in capsys.readouterr().err.splitlines() if '"turn finished"' in line]
    assert records and '"turn_id": "msg-77"' in records[0]


# --------------------------------------------------------------------------- the scheduler, without processes


def test_scheduler_gives_freed_slots_to_the_oldest_idle_lane() -> None:
    queue = TurnQueue(max_running=2, max_waiting=10)
    seq = iter(range(100))
    a1, b1, a2, c1, b2, d1 = (Ticket(key, next(seq)) for key in "abacbd")
    assert queue.admit(a1) and queue.admit(b1)
    assert not any(queue.admit(t) for t in (a2, c1, b2, d1))
    assert queue.release(b1) == [c1]  # a2 is behind a1; c1 arrived before b2
    assert queue.release(a1) == [a2]
    assert queue.release(c1) == [b2]
    queue.withdraw(d1)
    assert queue.release(a2) == []
    assert (queue.running, queue.waiting) == (1, 0)


def test_scheduler_withdrawing_a_lanes_head_lets_the_next_one_run() -> None:
    queue = TurnQueue(max_running=1, max_waiting=10)
    seq = iter(range(100))
    x1, a1, a2 = Ticket("x", next(seq)), Ticket("a", next(seq)), Ticket("a", next(seq))
    assert queue.admit(x1)
    assert not queue.admit(a1) and not queue.admit(a2)
    queue.withdraw(a1)
    assert queue.release(x1) == [a2]


def test_scheduler_refuses_beyond_the_queue_bound() -> None:
    queue = TurnQueue(max_running=1, max_waiting=1)
    assert queue.admit(Ticket("a", 0))
    assert not queue.admit(Ticket("a", 1))
    with pytest.raises(QueueFull):
        queue.admit(Ticket("b", 2))
    with pytest.raises(ValueError):
        TurnQueue(max_running=0, max_waiting=1)
