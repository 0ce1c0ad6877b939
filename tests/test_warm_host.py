"""The host's warm agents (bridge/host/pool.py): one live agent per conversation, reused while it fits.

Driven with `tests/warm_echo.py`: its replies say the turn number of the
session and the pid of the process that answered, so a test sees which
process took a turn and whether it knew the conversation.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import warm_echo
from conftest import TURN_DEADLINE, assert_no_live_process, process_state, write_agent, write_profile

import bridge
from bridge import Turn
from bridge.host.sqlite_store import SessionStore


@dataclass
class Lab:
    profiles: Path
    state: Path
    agent: Path
    tmp: Path

    def profile(self, name: str = "warm", env: str = "", **fields: object) -> None:
        lines = [
            f"command: [{self.agent}]",
            "protocol: test-warm",
            "kill_grace_secs: 0.5",
            f"env: {{STATE: {self.tmp}{', ' + env if env else ''}}}",
        ]
        lines += [f"{field}: {value}" for field, value in fields.items()]
        write_profile(self.profiles, "\n".join(lines) + "\n", f"{name}.yaml")

    def host(self) -> bridge.Host:
        return bridge.open_host(self.profiles, state=self.state)


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    warm_echo.register(monkeypatch)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    lab = Lab(profiles, tmp_path / "sessions.sqlite3", write_agent(tmp_path, "warm-agent", warm_echo.AGENT), tmp_path)
    lab.profile()
    return lab


def served_by(result: bridge.TurnResult) -> tuple[int, int]:
    """(turn number in the session, pid) from the test agent's reply."""
    match = re.search(r"\(turn (\d+), pid (\d+)\)", result.reply)
    assert match, result
    return int(match[1]), int(match[2])


async def wait_gone(pid: int, within: float = 2.0) -> None:
    """Return once `pid` has exited; fail on an assertion if it still runs `within` seconds later.

    A process still running is killed first, so the host's shutdown does not wait for it and the test
    fails at once.
    """
    try:
        exited = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with trio.move_on_after(within):
            await trio.lowlevel.wait_readable(exited)
            return
    finally:
        os.close(exited)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"process {pid} still ran {within} s after it should have been shut down")


async def wait_for_live_agents(host: bridge.Host, count: int, within: float = 2.0) -> None:
    """Until the pool counts `count` live agents (it notices a death when it reaps the process)."""
    with trio.move_on_after(within):
        while host.stats().warm != count:
            await trio.sleep(0.01)
    assert host.stats().warm == count, f"the pool counts {host.stats().warm} live agents, not {count}"


async def test_turns_of_a_conversation_run_on_one_live_agent_and_the_host_says_goodbye(lab: Lab) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            first = await host.submit("warm", "chat-1", Turn("one"))
            second = await host.submit("warm", "chat-1", Turn("two"))
            other = await host.submit("warm", "chat-2", Turn("three"))
            stats = host.stats()
    assert (first.ok, second.ok, other.ok) == (True, True, True)
    (n1, pid1), (n2, pid2), (n3, pid3) = map(served_by, (first, second, other))
    assert (n1, n2, n3) == (1, 2, 1)
    assert pid1 == pid2 != pid3  # the conversation's agent stayed; another conversation has its own
    assert first.session_id == second.session_id != other.session_id
    assert stats.warm == 2
    assert_no_live_process([pid1, pid3])  # shutdown ended them


async def test_with_client_session_ids_stored_a_live_conversation_refuses_another_ones_session(lab: Lab) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with bridge.open_host(lab.profiles, state=lab.state, client_session_ids="stored") as host:
            alice = await host.submit("warm", "alice", Turn("one"))
            bob = await host.submit("warm", "bob", Turn("one"))
            with pytest.raises(bridge.SessionIdRefused):
                await host.submit("warm", "bob", Turn("two", session_id=alice.session_id))
            again = await host.submit("warm", "bob", Turn("two", session_id=bob.session_id))
        async with lab.host() as host:  # "any": bob's turn takes alice's session, history and all
            foreign = await host.submit("warm", "bob", Turn("three", session_id=alice.session_id))
    assert served_by(again)[0] == 2 and again.session_id == bob.session_id != alice.session_id
    assert served_by(foreign)[0] == 2 and foreign.session_id == alice.session_id


async def test_an_idle_agent_leaves_after_keep_warm_secs_and_the_next_turn_resumes_the_session(lab: Lab) -> None:
    lab.profile(keep_warm_secs=0.2)
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            first = await host.submit("warm", "chat-1", Turn("one"))
            await wait_gone(served_by(first)[1])
            assert host.stats().warm == 0
            second = await host.submit("warm", "chat-1", Turn("two"))
    assert served_by(second)[0] == 2 and served_by(second)[1] != served_by(first)[1]
    assert second.session_id == first.session_id


async def test_at_most_max_warm_agents_stay_and_the_least_recently_used_goes(lab: Lab) -> None:
    lab.profile(max_warm=2)
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            a = await host.submit("warm", "a", Turn("hi"))
            b = await host.submit("warm", "b", Turn("hi"))
            again_a = await host.submit("warm", "a", Turn("hi"))  # a is now the most recently used
            c = await host.submit("warm", "c", Turn("hi"))  # b goes
            await wait_gone(served_by(b)[1])
            assert host.stats().warm == 2
            assert process_state(served_by(a)[1]) not in (None, "Z")
            again_b = await host.submit("warm", "b", Turn("hi"))
    assert served_by(again_a)[1] == served_by(a)[1]
    assert served_by(again_b)[0] == 2 and served_by(again_b)[1] not in (served_by(b)[1], served_by(c)[1])


async def test_an_edited_profile_gets_a_new_agent_that_resumes_the_session(lab: Lab) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            first = await host.submit("warm", "chat", Turn("one"))
            lab.profile(timeout_secs=30)
            second = await host.submit("warm", "chat", Turn("two"))
            await wait_gone(served_by(first)[1])
    assert served_by(second)[0] == 2 and served_by(second)[1] != served_by(first)[1]


async def test_a_turn_recorded_by_another_process_means_the_warm_agent_missed_it(lab: Lab) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            first = await host.submit("warm", "chat", Turn("one"))
            with SessionStore(lab.state) as elsewhere:  # as `agent-bridge run` would, in its own process
                elsewhere.record("warm", "chat", "default", first)
            second = await host.submit("warm", "chat", Turn("two"))
            third = await host.submit("warm", "chat", Turn("three"))
    assert served_by(second)[1] != served_by(first)[1]
    assert served_by(third)[1] == served_by(second)[1]


async def test_a_forgotten_session_starts_a_new_one_on_a_new_agent(lab: Lab) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            first = await host.submit("warm", "chat", Turn("one"))
            with SessionStore(lab.state) as store:
                store.forget("warm", "chat")
            second = await host.submit("warm", "chat", Turn("two"))
    assert served_by(second)[0] == 1 and second.session_id != first.session_id


async def test_an_agent_that_crashed_is_replaced_by_one_that_resumes(lab: Lab) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            first = await host.submit("warm", "chat", Turn("one"))
            crashed = await host.submit("warm", "chat", Turn("crash"))
            after = await host.submit("warm", "chat", Turn("two"))
    assert crashed.exit_code == 7 and "crash" not in crashed.reply
    assert served_by(after)[0] == 2 and served_by(after)[1] != served_by(first)[1]


async def test_cancel_stops_the_turn_with_130_and_the_agent_stays_warm(lab: Lab) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            first = await host.submit("warm", "chat", Turn("one"))
            started = trio.Event()

            def on_event(event: object) -> None:
                if isinstance(event, bridge.SessionEvent):
                    started.set()

            async with trio.open_nursery() as nursery:
                turn_id = await nursery.start(
                    lambda task_status: host.submit(
                        "warm", "chat", Turn("hang"), on_event=on_event, task_status=task_status
                    )
                )
                await started.wait()
                assert host.cancel(turn_id)
            after = await host.submit("warm", "chat", Turn("two"))
    assert served_by(after) == (2, served_by(first)[1])
    assert host.stats().outcomes["cancelled"] == 1


async def test_permissions_are_answered_by_on_permission_or_by_decide(lab: Lab) -> None:
    lab.profile(permissions="{default: ask}")
    asked: list[str] = []

    def on_permission(request: bridge.PermissionRequest) -> bool:
        asked.append(request.tool)
        return request.tool == "Read"

    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            allowed = await host.submit("warm", "chat", Turn("ask Read"), on_permission=on_permission)
            denied = await host.submit("warm", "chat", Turn("ask Bash"), on_permission=on_permission)

            def on_event(event: object) -> None:
                if isinstance(event, bridge.PermissionRequest):
                    assert not host.decide("turn-x", event.request_id, True)  # no such turn
                    assert host.decide("t1", event.request_id, bridge.Decision(allow=True))
                    assert not host.decide("t1", event.request_id, True)  # answered already

            decided = await host.submit("warm", "chat", Turn("ask Write"), on_event=on_event, turn_id="t1")
            unheard = await host.submit("warm", "chat", Turn("ask Write"))  # nobody hears: deny at once
    assert asked == ["Read", "Bash"]
    assert allowed.reply.startswith("allowed") and denied.reply.startswith("denied")
    assert decided.reply.startswith("allowed") and unheard.reply.startswith("denied")


async def test_a_host_not_entered_runs_nothing_and_says_to_enter_it(lab: Lab) -> None:
    host = lab.host()
    with trio.fail_after(TURN_DEADLINE), pytest.raises(bridge.ProtocolMisuse, match="async with open_host"):
        await host.submit("warm", "chat", Turn("one"))
    assert not lab.state.exists()  # its store opens when it is entered
    await host.aclose()


async def test_an_agent_that_cannot_start_fails_the_turn_and_the_next_turn_tries_again(lab: Lab) -> None:
    lab.profile(start_timeout_secs=0.3, env="SLOW_START: '1'")
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            failed = await host.submit("warm", "chat", Turn("one"))
            lab.profile()
            after = await host.submit("warm", "chat", Turn("two"))
    assert failed.outcome == "spawn_failed" and "within 0.3 s" in failed.error_reply
    assert after.ok and served_by(after)[0] == 1


async def test_an_error_in_the_body_leaves_as_itself_and_the_agents_are_gone(lab: Lab) -> None:
    pids = []
    with trio.fail_after(TURN_DEADLINE), pytest.raises(KeyError):
        async with lab.host() as host:
            pids.append(served_by(await host.submit("warm", "chat", Turn("one")))[1])
            raise KeyError("the bot's own bug")
    assert_no_live_process(pids)


async def test_an_agent_that_dies_between_turns_is_not_counted_and_the_next_turn_resumes(lab: Lab) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            first = await host.submit("warm", "chat", Turn("one"))
            os.kill(served_by(first)[1], signal.SIGKILL)
            await wait_gone(served_by(first)[1])
            await wait_for_live_agents(host, 0)  # its pipes' task notices the exit and reaps it
            after = await host.submit("warm", "chat", Turn("two"))
    assert served_by(after)[0] == 2 and served_by(after)[1] != served_by(first)[1]


async def test_an_agent_dead_between_turns_does_not_count_against_max_warm_a_live_one_stays(lab: Lab) -> None:
    lab.profile(max_warm=2)
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            a = await host.submit("warm", "a", Turn("hi"))
            b = await host.submit("warm", "b", Turn("hi"))  # b is the most recently used, a the least
            os.kill(served_by(b)[1], signal.SIGKILL)
            await wait_gone(served_by(b)[1])
            await wait_for_live_agents(host, 1)
            await host.submit("warm", "c", Turn("hi"))  # room for c: b's dead agent goes, not a's live one
            again_a = await host.submit("warm", "a", Turn("hi"))
    assert served_by(again_a) == (2, served_by(a)[1]), "a live conversation's agent was shut down for max_warm"


async def test_a_turn_that_names_another_session_runs_on_an_agent_that_resumes_it(lab: Lab) -> None:
    with trio.fail_after(TURN_DEADLINE):
        async with lab.host() as host:
            other = await host.submit("warm", "elsewhere", Turn("one"))
            first = await host.submit("warm", "chat", Turn("one"))
            named = await host.submit("warm", "chat", Turn("two", session_id=other.session_id))
    assert named.session_id == other.session_id != first.session_id, (
        "the conversation's warm agent took a turn that names another session"
    )
    assert served_by(named)[0] == 2  # the second turn of the session it named
    assert served_by(named)[1] not in (served_by(first)[1], served_by(other)[1])
