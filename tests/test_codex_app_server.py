"""`protocol: codex-app-server` with the real, pinned codex (`codex app-server`) against the fake OpenAI server.

Through the engine (`WarmAgent`, `run_turn`) with profiles/clis/codex-app-server.yaml as shipped (the cached
binary, a CODEX_HOME pointing at the fake): two turns on one process, approvals allowed, declined and allowed for
the session, a file change approved, Plan mode's question answered, an interrupt while an approval is pending,
a process killed between turns, a failed turn. Steering and a gone thread are checked on the dialect with the real
process (`acp_harness`), and through `WarmAgent.steer` and `on_resume_failure`. Every turn has a deadline.
"""

from __future__ import annotations

import base64
import os
import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from acp_harness import AcpProcess
from agents_cache import npm_binary
from attachment_files import PNG, TURN_FILES, sent
from conftest import CLI_PROFILES, assert_no_live_process
from fakes.openai_responses import OpenAIResponses, write_codex_home

import bridge
from bridge import Turn
from bridge.dialects.events import QuestionRequest, Ready, SessionGone, SteerOutcome, TurnEnd
from bridge.dialects.settings import CodexAppServerSettings
from bridge.engine.questions import Questions
from bridge.engine.warm_agents import WarmAgent
from bridge.permissions import Decision, PermissionRequest

DEADLINE = 30  # codex's start-up is ~0.3 s; a loaded machine with other suites running is slower


@pytest.fixture(scope="module")
def codex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, OpenAIResponses]]:
    npm_binary("codex")
    with OpenAIResponses() as api:
        yield write_codex_home(tmp_path_factory.mktemp("codex-app-server") / "home" / ".codex", api.base_url), api


def profile(home: Path, work: Path, **settings: Any) -> bridge.Profile:
    """profiles/clis/codex-app-server.yaml as shipped, run by the cached codex in `work` against the fake server."""
    work.mkdir(exist_ok=True)
    shipped = bridge.load_profile(CLI_PROFILES / "codex-app-server.yaml", cache=False)
    changes: dict[str, Any] = {}
    if settings:
        changes["codex-app-server"] = {**shipped.protocol_settings, **settings}
    return shipped.replace(
        command=[str(npm_binary("codex")), "app-server"],
        cwd=str(work),
        kill_grace_secs=2,
        env={"CODEX_HOME": str(home), "HOME": str(home.parent)},
        **changes,
    )


def answering(decide: Callable[[PermissionRequest], Decision | None]) -> tuple[Questions, Callable[[Any], None]]:
    """A turn's questions and an on_event that answers each permission request with `decide` (None: no answer)."""
    questions = Questions()

    def on_event(event: Any) -> None:
        if isinstance(event, PermissionRequest):
            decision = decide(event)
            if decision is not None:
                questions.decide(event.request_id, decision)

    return questions, on_event


async def turn(
    agent: WarmAgent, message: str, decide: Callable[[PermissionRequest], Decision | None] | None = None, **options: Any
) -> bridge.TurnResult:
    questions, on_event = answering(decide or (lambda request: Decision(allow=False)))
    with trio.fail_after(DEADLINE):
        return await agent.turn(Turn(message), on_event, questions=questions, **options)


async def test_two_turns_on_one_process_stream_and_keep_the_thread(codex, tmp_path):
    home, _ = codex
    partials: list[str] = []
    async with trio.open_nursery() as nursery:
        agent = WarmAgent(profile(home, tmp_path / "work"))
        with trio.fail_after(DEADLINE):
            await agent.start(nursery)
        pid = agent.pid
        first = await turn(agent, "say one two three four five")
        with trio.fail_after(DEADLINE):
            second = await agent.turn(Turn("say six"), lambda event: partials.append(getattr(event, "text", "")))
        assert agent.pid == pid
        await agent.close()
    assert (first.ok, first.reply) == (True, "one two three four five"), (first.error, first.stderr_tail)
    assert (second.ok, second.reply, second.session_id) == (True, "six", first.session_id)
    assert first.usage is not None and second.usage is not None
    assert (first.usage.total_tokens, second.usage.total_tokens) == (120, 240)  # the thread's total goes on
    assert_no_live_process([pid])


async def test_codex_gets_the_users_messages_as_sent_and_its_outbox_in_developer_instructions(codex, tmp_path):
    home, api = codex
    async with trio.open_nursery() as nursery:
        agent = WarmAgent(profile(home, tmp_path / "work"))
        with trio.fail_after(DEADLINE):
            await agent.start(nursery)
        first = await turn(agent, "say one")
        second = await turn(agent, "say two")
        await agent.close()
    assert (first.reply, second.reply) == ("one", "two"), (first.error, second.error)
    body = api.responses_requests()[-1].body
    messages = [
        (item["role"], "".join(part.get("text", "") for part in item["content"]))
        for item in body["input"]
        if item.get("type") == "message"
    ]
    said = [text for role, text in messages if role == "user" and not text.startswith("<")]
    assert said == ["say one", "say two"]  # byte for byte: nothing added to the user's words
    outbox = re.escape(str(tmp_path / "work" / ".agent-bridge" / "outbox"))
    told = [text for role, text in messages if role == "developer" and "Files for the user" in text]
    assert told and re.search(rf"Files for the user: write them to {outbox}/session-[0-9a-f]+ \(", told[0]), messages


async def test_approvals_allowed_declined_and_allowed_for_the_session(codex, tmp_path):
    home, _ = codex
    work = tmp_path / "work"
    asked: list[PermissionRequest] = []

    def decide(request: PermissionRequest) -> Decision:
        asked.append(request)
        title = request.title
        return Decision(allow="declined" not in title, always="always" in title)

    async with trio.open_nursery() as nursery:
        agent = WarmAgent(profile(home, work))
        with trio.fail_after(DEADLINE):
            await agent.start(nursery)
        results = [
            await turn(agent, f"escalate touch {work}/{name}", decide)
            for name in ("accepted", "declined", "always", "always")
        ]
        patched = await turn(agent, "patch notes.txt hello from the patch", decide)
        await agent.close()
    assert all(result.ok for result in results), [(result.error, result.stderr_tail) for result in results]
    assert (work / "accepted").exists() and not (work / "declined").exists() and (work / "always").exists()
    assert [(request.kind, request.title) for request in asked] == [
        ("exec", f"touch {work}/accepted"),
        ("exec", f"touch {work}/declined"),
        ("exec", f"touch {work}/always"),  # allowed for the session: the same command again is not asked
        ("edit", f"add {work}/notes.txt"),
    ]
    assert patched.ok and patched.reply.startswith("patched: ")
    assert (work / "notes.txt").read_text() == "hello from the patch\n"


async def test_a_question_in_plan_mode_is_asked_of_the_host_and_its_answer_reaches_the_model(codex, tmp_path):
    home, _ = codex
    questions = Questions()
    seen: list[QuestionRequest] = []

    def on_event(event: Any) -> None:
        if isinstance(event, QuestionRequest):
            seen.append(event)
            questions.answer(event.request_id, {"color": ("Blue",)})

    result = None
    async with trio.open_nursery() as nursery:
        agent = WarmAgent(profile(home, tmp_path / "work", plan_mode=True))
        with trio.fail_after(DEADLINE):
            await agent.start(nursery)
            result = await agent.turn(Turn("ask color Which color?|Red|Blue"), on_event, questions=questions)
        await agent.close()
    assert result.ok, (result.error, result.stderr_tail)
    assert [question.prompt for question in seen[0].questions] == ["Which color?"]
    assert result.reply == 'answered: {"answers":{"color":{"answers":["Blue"]}}}'


async def test_an_interrupt_while_an_approval_is_pending_cancels_the_turn_and_the_process_takes_the_next(
    codex, tmp_path
):
    home, _ = codex
    work = tmp_path / "work"
    cancel = trio.Event()

    def hold(request: PermissionRequest) -> None:
        cancel.set()  # nobody answers: the host cancels while codex waits for the approval
        return None

    async with trio.open_nursery() as nursery:
        agent = WarmAgent(profile(home, work))
        with trio.fail_after(DEADLINE):
            await agent.start(nursery)
        pid = agent.pid
        cancelled = await turn(agent, f"escalate touch {work}/never", hold, cancel=cancel)
        after = await turn(agent, "say still here")
        assert agent.pid == pid
        await agent.close()
    assert cancelled.outcome == "cancelled", (cancelled.error, cancelled.stderr_tail)
    assert not (work / "never").exists()
    assert (after.ok, after.reply) == (True, "still here"), after.error


async def test_a_process_killed_between_turns_is_replaced_by_one_that_resumes_the_thread(codex, tmp_path):
    home, api = codex
    prof = profile(home, tmp_path / "work")
    async with trio.open_nursery() as nursery:
        agent = WarmAgent(prof)
        with trio.fail_after(DEADLINE):
            await agent.start(nursery)
        first = await turn(agent, "say remember the number 42")
        killed = agent.pid
        assert killed is not None
        os.killpg(killed, signal.SIGKILL)
        await agent.close()
    with trio.fail_after(DEADLINE):
        after = await bridge.run_turn(prof, Turn("say what was it", session_id=first.session_id))
    assert first.ok and (after.ok, after.reply, after.session_id) == (True, "what was it", first.session_id)
    assert after.usage is not None and after.usage.total_tokens == 240  # the resumed thread's total
    history = api.responses_requests()[-1].assistant_texts()
    assert "remember the number 42" in history  # the model saw the earlier turn


async def test_a_failed_turn_fails_with_codexs_error_and_the_next_turn_on_the_process_works(codex, tmp_path):
    home, _ = codex
    async with trio.open_nursery() as nursery:
        agent = WarmAgent(profile(home, tmp_path / "work"))
        with trio.fail_after(DEADLINE):
            await agent.start(nursery)
        failed = await turn(agent, "fail 401 bad key")
        after = await turn(agent, "say after failure")
        await agent.close()
    assert not failed.ok and "401" in failed.error and "bad key" in failed.error
    assert (after.ok, after.reply) == (True, "after failure")


# ---------------------------------------------------------------------- the dialect with the real process


def harness(home: Path, work: Path, **options: Any) -> Any:
    work.mkdir(exist_ok=True)
    return AcpProcess.start(
        [str(npm_binary("codex")), "app-server"],
        cwd=str(work),
        env={"PATH": os.environ["PATH"], "CODEX_HOME": str(home), "HOME": str(home.parent)},
        protocol="codex-app-server",
        settings=CodexAppServerSettings(sandbox="read-only"),
        **options,
    )


async def test_a_message_steered_into_a_turn_waiting_for_an_approval_is_folded_into_it(codex, tmp_path):
    home, _ = codex
    work = tmp_path / "work"
    async with harness(home, work) as agent:
        await agent.until(Ready)
        await agent.send(agent.dialect.prompt(Turn(f"escalate touch {work}/steered")))
        [*_, request] = await agent.until(PermissionRequest)
        await agent.send(agent.dialect.steer(Turn("say steered"), "s1"))
        await agent.send(agent.dialect.answer(request, Decision(allow=True)))
        events = await agent.until(TurnEnd)
    assert [event for event in events if isinstance(event, SteerOutcome)] == [SteerOutcome("s1", folded=True)]
    assert events[-1] == TurnEnd("end_turn") and (work / "steered").exists()


async def test_resuming_a_thread_codex_does_not_have_is_proof_the_session_is_gone(codex, tmp_path):
    home, _ = codex
    async with harness(home, tmp_path / "work", session_id="01a2177e-0000-7000-8000-000000000000") as agent:
        events = await agent.until(SessionGone)
    assert "no rollout found for thread id" in events[-1].detail
    assert not [event for event in events if isinstance(event, Ready)]


# ---------------------------------------------------------------------- the engine's steer and on_resume_failure


async def test_warm_agent_steers_a_message_into_the_turn_waiting_for_an_approval(codex, tmp_path):
    home, _ = codex
    work = tmp_path / "work"
    questions = Questions()
    asked = trio.Event()
    folded: list[bool] = []
    request_ids: list[str] = []

    def on_event(event: Any) -> None:
        if isinstance(event, PermissionRequest):
            request_ids.append(event.request_id)
            asked.set()

    async with trio.open_nursery() as nursery:
        agent = WarmAgent(profile(home, work))
        with trio.fail_after(DEADLINE):
            await agent.start(nursery)

        async def steer_then_allow() -> None:
            await asked.wait()
            async with trio.open_nursery() as steering:
                steering.start_soon(lambda: _steer(agent, folded))
                await trio.sleep(0.2)  # turn/steer is written before the approval's answer
                questions.decide(request_ids[0], Decision(allow=True))

        nursery.start_soon(steer_then_allow)
        with trio.fail_after(DEADLINE):
            result = await agent.turn(Turn(f"escalate touch {work}/steered"), on_event, questions=questions)
        await agent.close()
    assert folded == [True]
    assert (result.ok, result.reply) == (True, "steered"), result.error
    assert (work / "steered").exists()


async def _steer(agent: WarmAgent, folded: list[bool]) -> None:
    folded.append(await agent.steer(Turn("say steered")))


@pytest.mark.parametrize("on_resume_failure", ["new_session", "fail"])
async def test_a_stored_thread_codex_no_longer_has_starts_a_new_one_or_fails(codex, tmp_path, on_resume_failure):
    home, _ = codex
    gone = "01a2177e-0000-7000-8000-000000000000"
    prof = profile(home, tmp_path / "work").replace(on_resume_failure=on_resume_failure)
    with trio.fail_after(DEADLINE):
        result = await bridge.run_turn(prof, Turn("say fresh", session_id=gone))
    if on_resume_failure == "fail":
        assert not result.ok and "no rollout found for thread id" in result.error_reply
        return
    assert (result.ok, result.reply) == (True, "fresh"), result.error
    assert result.session_id not in ("", gone)


async def test_a_fetched_image_reaches_the_model_and_a_fetched_file_is_named_by_its_path(codex, tmp_path):
    home, api = codex
    sources = tmp_path / "sources"
    sources.mkdir()
    turn = Turn("what is in the picture?", attachments=sent(sources))
    with trio.fail_after(DEADLINE):
        result = await bridge.run_turn(profile(home, tmp_path / "work"), turn)
    assert result.ok, (result.error, result.stderr_tail)
    request = api.responses_requests()[-1]
    assert request.input_images() == ["data:image/png;base64," + base64.b64encode(PNG).decode()]
    turn_files = rf"{tmp_path}/work/{TURN_FILES}"
    assert re.search(
        rf"what is in the picture\?\n\nAttached files:\n- {turn_files}/notes\.txt \(file, text/plain\)", request.prompt
    ), request.prompt
