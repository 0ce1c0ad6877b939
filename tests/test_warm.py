"""The warm engine (bridge/engine/warm_agents.py): one process, many turns, every rule of a turn, no process left behind.

Driven with `tests/warm_echo.py`, a tiny warm protocol made for these tests, so
the engine is tested apart from any family's dialect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import warm_echo
from attachment_files import left_in
from conftest import TURN_DEADLINE, assert_no_live_process, write_agent

import bridge
from bridge import Turn
from bridge.engine.warm_agents import WarmAgent


@pytest.fixture
def warm_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    warm_echo.register(monkeypatch)
    agent = write_agent(tmp_path, "warm-agent", warm_echo.AGENT)

    def make(**fields: object) -> bridge.Profile:
        env = {"STATE": str(tmp_path), **fields.pop("env", {})}  # type: ignore[dict-item]
        return bridge.Profile.from_mapping(
            {"command": [str(agent)], "protocol": "test-warm", "env": env, "kill_grace_secs": 0.5, **fields},
            profile_dir=tmp_path,
        )

    return make


@asynccontextmanager
async def warm_agent(profile: bridge.Profile) -> AsyncIterator[WarmAgent]:
    """`profile`'s agent, started for the block's turns and closed after them, all within the turn deadline."""
    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            yield agent
            await agent.close()


async def test_one_process_takes_many_turns_in_one_session(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile()
    partials: list[str] = []
    async with warm_agent(profile) as agent:
        first = await agent.turn(
            Turn("hello there"),
            lambda event: partials.append(event.text) if isinstance(event, bridge.PartialEvent) else None,
        )
        second = await agent.turn(Turn("again"))
        pid = agent.pid
    assert first.ok and first.reply.startswith("hello there (turn 1, pid ")
    assert second.ok and second.reply.startswith("again (turn 2, pid ")
    assert f"pid {pid})" in first.reply and f"pid {pid})" in second.reply  # one process
    assert first.session_id == second.session_id == agent.session_id and len(agent.session_id) == 32
    assert partials[:2] == ["hello ", "there "]
    assert "an old message" not in first.reply  # what the agent said before the turn is nobody's output
    assert_no_live_process([pid])


async def test_run_turn_on_a_warm_protocol_starts_the_agent_resumes_the_session_and_says_goodbye(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile()
    with trio.fail_after(TURN_DEADLINE):
        first = await bridge.run_turn(profile, Turn("one"))
        second = await bridge.run_turn(profile, Turn("two", session_id=first.session_id))
    assert first.ok and second.ok and first.session_id == second.session_id
    assert "(turn 2," in second.reply  # the new process resumed the stored session
    pids = [int(result.reply.rsplit("pid ", 1)[1].rstrip(")")) for result in (first, second)]
    assert pids[0] != pids[1]
    assert_no_live_process(pids)


async def test_a_timeout_asks_the_agent_to_stop_and_the_agent_stays_warm(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile(timeout_secs=0.3)
    async with warm_agent(profile) as agent:
        stopped = await agent.turn(Turn("hang"))
        after = await agent.turn(Turn("still there"))
    assert (stopped.outcome, stopped.exit_code, stopped.timed_out) == ("timeout", 124, True)
    assert "timed out after 0.3 s" in stopped.error_reply
    assert after.ok and after.reply.startswith("still there")


async def test_an_agent_that_ignores_the_cancel_is_killed_after_the_grace_and_not_reused(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile(timeout_secs=0.3, kill_grace_secs=0.3)
    async with warm_agent(profile) as agent:
        pid = agent.pid
        result = await agent.turn(Turn("hang hard"))
        assert not agent.alive
        dead = await agent.turn(Turn("anyone?"))
    assert (result.outcome, result.exit_code) == ("timeout", 124) and result.duration_ms >= 550
    assert dead.outcome == "spawn_failed"
    assert_no_live_process([pid])


async def test_a_host_cancel_stops_the_turn_with_130(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile()
    cancel = trio.Event()
    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            nursery.start_soon(lambda: trio.sleep(0.2))

            async def cancel_soon() -> None:
                await trio.sleep(0.2)
                cancel.set()

            nursery.start_soon(cancel_soon)
            result = await agent.turn(Turn("hang"), cancel=cancel)
            assert agent.alive
            await agent.close()
    assert (result.outcome, result.exit_code) == ("cancelled", 130)


async def test_a_crash_mid_turn_fails_the_turn_and_the_agent_is_gone(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile()
    async with warm_agent(profile) as agent:
        result = await agent.turn(Turn("crash"))
    assert (result.outcome, result.exit_code) == ("agent_error", 7)
    assert result.error == "the agent ended without finishing its turn"
    assert not agent.alive


async def test_a_turn_the_agent_reports_failed_is_an_agent_error_and_the_agent_stays(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile()
    async with warm_agent(profile) as agent:
        failed = await agent.turn(Turn("fail"))
        fine = await agent.turn(Turn("fine"))
    assert (failed.outcome, failed.exit_code, failed.error_reply) == ("agent_error", 1, "the model refused")
    assert fine.ok


async def test_questions_go_to_the_host_and_its_answer_to_the_agent(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile(permissions={"default": "ask"})
    questions = bridge.engine.questions.Questions()
    asked = []

    def on_event(event: object) -> None:
        if isinstance(event, bridge.PermissionRequest):
            asked.append(event.tool)
            questions.decide(event.request_id, bridge.Decision(allow=event.tool == "Read"))

    async with warm_agent(profile) as agent:
        allowed = await agent.turn(Turn("ask Read"), on_event, questions=questions)
        questions = bridge.engine.questions.Questions()
        denied = await agent.turn(Turn("ask Bash"), on_event, questions=questions)
    assert asked == ["Read", "Bash"]
    assert allowed.reply.startswith("allowed") and denied.reply.startswith("denied")


async def test_a_host_callback_that_raises_reaches_the_host_and_the_turn_is_stopped(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile()

    def explode(event: object) -> None:
        if isinstance(event, bridge.PartialEvent):
            raise LookupError("the host's own bug")

    async with warm_agent(profile) as agent:
        with pytest.raises(LookupError):
            await agent.turn(Turn("hello"), explode)
        after = await agent.turn(Turn("next"))  # the agent itself is fine
    assert after.ok


@pytest.mark.parametrize(
    "env, start_timeout_secs, reason",
    [  # an agent that says why it failed has time to say it on a busy machine; one that hangs, a short time
        ({"FAIL_START": "1"}, 5, "no session for you"),
        ({"SLOW_START": "1"}, 0.3, "did not set its session up within 0.3 s"),
    ],
)
async def test_an_agent_that_cannot_set_its_session_up_is_a_clear_spawn_failure(  # type: ignore[no-untyped-def]
    warm_profile, env, start_timeout_secs, reason
) -> None:
    profile = warm_profile(env=env, start_timeout_secs=start_timeout_secs)
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("hi"))
    assert result.outcome == "spawn_failed" and reason in result.error_reply


async def test_a_missing_command_is_127_as_for_any_agent(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile().replace(command=["/nonexistent/warm-agent"])
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("hi"))
    assert (result.outcome, result.exit_code) == ("spawn_failed", 127)


def test_a_warm_profile_refuses_the_message_in_argv_and_per_turn_profiles_refuse_warm_fields(
    warm_profile, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(bridge.ProfileError, match="MESSAGE.*cannot be in the argv of protocol test-warm"):
        warm_profile(args=["{{MESSAGE}}"])
    with pytest.raises(bridge.ProfileError, match="keep_warm_secs is for the warm protocols"):
        bridge.Profile(command="agent", keep_warm_secs=5)
    assert warm_profile(resume_args=["--resume", "{{SESSION_ID}}"])  # a CLI that resumes by flag


async def test_a_question_waiting_for_the_host_is_not_the_agents_silence(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile(idle_timeout_secs=0.2, permissions={"default": "ask"})
    questions = bridge.engine.questions.Questions()

    async def on_event(event: object) -> None:
        if isinstance(event, bridge.PermissionRequest):
            await trio.sleep(0.5)  # the person thinks it over for longer than the idle timeout
            questions.decide(event.request_id, bridge.Decision(allow=True))

    async with warm_agent(profile) as agent:
        result = await agent.turn(Turn("ask Read"), on_event, questions=questions)
        silent = await agent.turn(Turn("hang"))  # the idle timeout itself still holds
    assert result.ok and result.reply.startswith("allowed")
    assert silent.outcome == "timeout" and "without output" in silent.error_reply


async def test_output_rearms_the_idle_deadline_so_an_agent_writing_often_is_not_idle(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile(idle_timeout_secs=0.3, timeout_secs=5)
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("trickle 6 0.1"))  # 0.6 s, never 0.3 s silent
    assert result.ok, f"an agent writing every 0.1 s timed out on idle_timeout_secs 0.3: {result.error_reply}"
    assert result.reply == "0 1 2 3 4 5 "


async def test_silence_after_output_times_out_on_idle_before_the_wall(warm_profile) -> None:  # type: ignore[no-untyped-def]
    profile = warm_profile(idle_timeout_secs=0.3, timeout_secs=1.5)
    partials: list[str] = []
    async with warm_agent(profile) as agent:
        silent = await agent.turn(
            Turn("talk then hang"),
            lambda event: partials.append(event.text) if isinstance(event, bridge.PartialEvent) else None,
        )
    assert partials == ["talking "]  # it did write before it went silent
    assert (silent.outcome, silent.error_reply) == ("timeout", "The agent timed out after 0.3 s without output."), (
        f"silence after output did not time out on idle_timeout_secs: {silent.error_reply}"
    )


async def test_warm_turns_that_never_reach_their_end_leave_no_turn_directory(warm_profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    work = tmp_path / "work"
    work.mkdir()
    profile = warm_profile(cwd=str(work), attachments={"fetch": True})
    refused = Turn("look", attachments=[bridge.Attachment("file", "http://127.0.0.1:9/notes.txt")])
    async with warm_agent(profile) as agent:
        not_fetched = await agent.turn(refused)  # its directories were made, then the fetch was refused
        with trio.CancelScope() as host_gone:  # the host's task is cancelled in the middle of a turn
            await agent.turn(
                Turn("talk then hang"),
                lambda event: host_gone.cancel() if isinstance(event, bridge.PartialEvent) else None,
            )
        after = await agent.turn(Turn("still there"))
    assert not_fetched.outcome == "attachment_failed" and "loopback" in not_fetched.error
    assert host_gone.cancelled_caught
    assert after.ok
    assert left_in(work) == []
