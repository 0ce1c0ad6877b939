"""Tool approvals the host answers (`permissions: {default: ask}`), through every way a Python host has.

The agent is the bundled wire-0.4 sample: it asks before it uses a tool and
says in its reply what it was told. A question is answered by the host, or
deny after the profile's timeout, or cancelled when the turn ends — never
left hanging.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from conftest import PROFILES, TURN_DEADLINE

import bridge
from bridge import Decision, PermissionRequest, Turn
from bridge.engine.questions import Questions


def asking_profile(tmp_path: Path, **permissions: object) -> bridge.Profile:
    profile = bridge.load_profile(PROFILES / "agentproc-echo.yaml")
    return profile.replace(
        permissions={"default": "ask", **permissions}, env={**profile.env, "STREAM_DELAY": "0", "TMPDIR": str(tmp_path)}
    )


async def test_on_permission_answers_the_agents_question(tmp_path: Path) -> None:
    asked: list[PermissionRequest] = []

    def answer(request: PermissionRequest) -> bool:
        asked.append(request)
        return request.tool == "Read"

    profile = asking_profile(tmp_path)
    with trio.fail_after(TURN_DEADLINE):
        allowed = await bridge.run_turn(profile, Turn("hi tool=Read"), on_permission=answer)
        denied = await bridge.run_turn(profile, Turn("hi tool=Bash"), on_permission=answer)
    assert "(Read was allowed)" in allowed.reply and "(Bash was denied)" in denied.reply
    assert [(request.tool, request.title) for request in asked] == [
        ("Read", "count the 2 word(s) of your message"),
        ("Bash", "count the 2 word(s) of your message"),
    ]


async def test_an_open_turn_sees_the_question_as_an_event_and_decides_it(tmp_path: Path) -> None:
    profile = asking_profile(tmp_path)
    seen = []
    with trio.fail_after(TURN_DEADLINE):
        async with bridge.open_turn(profile, Turn("hi tool=Edit")) as events:
            async for event in events:
                seen.append(event)
                if isinstance(event, PermissionRequest):
                    assert events.decide(event.request_id, Decision(allow=False, message="not today"))
                    assert not events.decide(event.request_id, True)  # answered already
    assert "(Edit was denied: not today)" in events.result.reply
    assert [type(event).__name__ for event in seen if not isinstance(event, bridge.PartialEvent)] == [
        "SessionEvent",
        "ActivityEvent",
        "PermissionRequest",
        "ActivityEvent",
        "TurnResult",
    ]
    assert seen[3].status == "denied" and seen[3].tool == "Edit"


async def test_a_question_nobody_answers_is_denied_after_the_timeout(tmp_path: Path) -> None:
    """`permissions: timeout_secs`, timed from the question: a question left waiting fails fast, not at a deadline."""
    timeout_secs, leeway_secs = 0.2, 1.5
    profile = asking_profile(tmp_path, timeout_secs=timeout_secs)
    asked, finished = trio.Event(), trio.Event()
    results: list[bridge.TurnResult] = []

    async def never_answer(request: PermissionRequest) -> bool:
        asked.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def take_turn() -> None:
        results.append(await bridge.run_turn(profile, Turn("hi"), on_permission=never_answer))
        finished.set()

    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take_turn)
            await asked.wait()
            with trio.move_on_after(timeout_secs + leeway_secs):
                await finished.wait()
            nursery.cancel_scope.cancel()  # a question left waiting: end the turn, then fail below
    assert finished.is_set(), (
        f"the question still waited {timeout_secs + leeway_secs} s after it was asked; "
        f"permissions: timeout_secs ({timeout_secs} s) was not applied"
    )
    assert results[0].ok and "(Bash was denied: nobody answered in time)" in results[0].reply
    assert results[0].duration_ms >= timeout_secs * 1000  # it waited for the host first


async def test_with_nobody_listening_the_answer_is_deny_at_once(tmp_path: Path) -> None:
    profile = asking_profile(tmp_path, timeout_secs=60)
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("hi"))
        seen_only = await bridge.run_turn(profile, Turn("hi"), on_event=lambda event: None)  # sees, cannot answer
    assert "(Bash was denied: nobody is there to answer)" in result.reply
    assert "(Bash was denied: nobody is there to answer)" in seen_only.reply


async def test_allow_deny_and_ask_lists_decide_before_the_default(tmp_path: Path) -> None:
    profile = asking_profile(tmp_path, allow=["Read"], deny=["Bash"], ask=["Edit"])
    asked: list[str] = []

    def answer(request: PermissionRequest) -> bool:
        asked.append(request.tool)
        return True

    with trio.fail_after(TURN_DEADLINE):
        replies = [
            (await bridge.run_turn(profile, Turn(f"hi tool={tool}"), on_permission=answer)).reply
            for tool in ("Read", "Bash", "Edit", "Write")
        ]
    assert ["was allowed" in reply for reply in replies] == [True, False, True, True]  # Write: the default, ask
    assert asked == ["Edit", "Write"]


async def test_cancelling_a_turn_while_it_asks_ends_it_at_once_not_at_the_timeout(tmp_path: Path) -> None:
    profile = asking_profile(tmp_path, timeout_secs=60)
    with trio.fail_after(TURN_DEADLINE):
        async with bridge.open_turn(profile, Turn("hi")) as events:
            async for event in events:
                if isinstance(event, PermissionRequest):
                    events.cancel()
    assert events.result.outcome == "cancelled" and events.result.duration_ms < 5000


async def test_an_answer_callback_still_thinking_when_the_turn_ends_is_interrupted(tmp_path: Path) -> None:
    """The host may take its time to answer, but not past the end of the turn (here: its wall timeout)."""
    profile = asking_profile(tmp_path, timeout_secs=60).replace(timeout_secs=0.5, kill_grace_secs=0.2)

    async def slow(request: PermissionRequest) -> bool:
        await trio.sleep(60)
        return True

    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("hi"), on_permission=slow)
    assert result.outcome == "timeout" and result.duration_ms < 5000


async def test_questions_close_answers_what_is_open_and_refuses_what_comes_later() -> None:
    questions = Questions()
    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            results = []

            async def ask(request_id: str) -> None:
                with questions.asking(request_id, 60) as question:
                    await question.answer()
                results.append((request_id, questions.result(question)))

            nursery.start_soon(ask, "a")
            await trio.testing.wait_all_tasks_blocked()
            assert questions.waiting == ["a"]
            questions.close()
        with questions.asking("b", 60) as question:
            await question.answer()  # cancelled at once: the turn is over
    assert results == [("a", bridge.permissions.CANCELLED)]
    assert questions.result(question) == bridge.permissions.CANCELLED
    assert not questions.decide("a", Decision(allow=True))


@pytest.mark.parametrize("default", ["allow", "deny"])
async def test_without_ask_the_host_is_never_asked(tmp_path: Path, default: str) -> None:
    profile = asking_profile(tmp_path, default=default)
    asked = []
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("hi"), on_permission=asked.append)
    assert not asked and ("(Bash was allowed)" in result.reply) == (default == "allow")
