"""protocol: claude-sdk with the real Claude Code (the pinned npm version) against tools/fake_anthropic.py.

profiles/clis/claude-sdk.yaml as shipped, its `claude` replaced by the cached
binary, in a fresh HOME and working directory; the fake server's
`Conversation` answers by prompt (`run CMD` → a Bash call, `ask colour` → an
AskUserQuestion call, `slow` → held until the test releases it). Turns go
through `WarmAgent`, as the pool runs them. Every wait is an event, never a
sleep; every turn has a deadline.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from agents_cache import npm_binary
from attachment_files import PNG, TURN_FILES, sent
from conftest import CLI_PROFILES
from fake_anthropic import Conversation, claude_env, user_texts
from fake_api import FakeApi

import bridge
from bridge import Turn
from bridge.dialects import ActivityEvent, DialectContext, QuestionRequest, SessionGone, dialect_class
from bridge.engine.questions import Questions
from bridge.engine.warm_agents import WarmAgent
from bridge.errors import WarmStartError
from bridge.permissions import Decision, PermissionRequest

DEADLINE = 30


@contextmanager
def fake_claude(
    tmp_path: Path, permissions: dict[str, Any] | None = None
) -> Iterator[tuple[Conversation, FakeApi, Any]]:
    conversation = Conversation()
    with FakeApi(conversation) as api:
        home, work = tmp_path / "home", tmp_path / "work"
        home.mkdir(exist_ok=True)
        work.mkdir(exist_ok=True)
        profile = bridge.load_profile(CLI_PROFILES / "claude-sdk.yaml", cache=False)
        profile = profile.replace(
            command=[str(npm_binary("claude")), *profile.command[1:]],
            env=claude_env(api, str(home)),
            cwd=str(work),
            permissions=permissions or {"default": "allow"},
            kill_grace_secs=5,
        )
        try:
            yield conversation, api, profile
        finally:
            conversation.release.set()


@asynccontextmanager
async def started_agent(profile: bridge.Profile) -> AsyncIterator[tuple[WarmAgent, trio.Nursery]]:
    """A started warm agent of `profile` (and the nursery running it), said goodbye to on the way out."""
    async with trio.open_nursery() as nursery:
        agent = WarmAgent(profile)
        with trio.fail_after(DEADLINE):
            await agent.start(nursery)
        try:
            yield agent, nursery
        finally:
            await agent.close()


async def answering(agent: WarmAgent, message: str, decide: Any = None, cancel: trio.Event | None = None) -> Any:
    """One turn; `decide(request)` answers each PermissionRequest or QuestionRequest the host is asked."""
    questions = Questions()
    asked: list[Any] = []

    def on_event(event: Any) -> None:
        if isinstance(event, PermissionRequest):
            asked.append(event)
            questions.decide(event.request_id, decide(event))
        elif isinstance(event, QuestionRequest):
            asked.append(event)
            questions.answer(event.request_id, decide(event))

    with trio.fail_after(DEADLINE):
        result = await agent.turn(Turn(message), on_event, questions=questions, cancel=cancel)
    return result, asked


async def test_two_turns_run_on_one_process_in_one_session(tmp_path):
    with fake_claude(tmp_path) as (_, api, profile):
        async with started_agent(profile) as (agent, nursery):
            pid = agent.pid
            partials: list[str] = []
            with trio.fail_after(DEADLINE):
                first = await agent.turn(Turn("hello"), lambda e: partials.append(getattr(e, "text", "")))
                second = await agent.turn(Turn("again"))
            assert agent.pid == pid and agent.alive
    assert first.ok and second.ok, (first.error, second.error)
    assert (first.reply, second.reply) == ("reply to hello", "reply to again")
    assert "".join(partials).endswith("reply to hello")
    assert first.session_id and second.session_id == first.session_id == agent.session_id
    assert first.usage is not None and first.usage.cost_usd and first.usage.cost_usd > 0
    assert user_texts(api.posts("/v1/messages")[-1]) == ["hello", "again"]


async def test_claude_code_gets_the_users_messages_as_sent_and_its_outbox_in_the_system_prompt(tmp_path):
    with fake_claude(tmp_path) as (_, api, profile):
        async with started_agent(profile) as (agent, _):
            with trio.fail_after(DEADLINE):
                first = await agent.turn(Turn("hello"))
                second = await agent.turn(Turn("again"))
    assert first.ok and second.ok, (first.error, second.error)
    request = api.posts("/v1/messages")[-1].body
    written = [
        block["text"]
        for message in request["messages"]
        if message["role"] == "user"
        for block in ([{"type": "text", "text": message["content"]}] if isinstance(message["content"], str) else [])
        + [b for b in message["content"] if isinstance(message["content"], list) and b.get("type") == "text"]
        if not block["text"].startswith("<system-reminder>")
    ]
    assert written == ["hello", "again"]  # byte for byte: nothing added to the user's words
    system = request["system"]
    system_text = system if isinstance(system, str) else "\n".join(block.get("text", "") for block in system)
    outbox = re.escape(str(tmp_path / "work" / ".agent-bridge" / "outbox"))
    assert re.search(rf"Files for the user: write them to {outbox}/session-[0-9a-f]+ \(", system_text), system_text


@pytest.mark.parametrize(
    ("permissions", "made"), [({"default": "allow"}, True), ({"default": "allow", "deny": ["Bash"]}, False)]
)
async def test_a_tool_runs_when_allowed_and_not_when_denied(tmp_path, permissions, made):
    with fake_claude(tmp_path, permissions) as (_, api, profile):
        async with started_agent(profile) as (agent, nursery):
            result, _ = await answering(agent, "run touch marker")
    assert result.ok, result.error
    assert (tmp_path / "work" / "marker").exists() == made
    assert result.reply.startswith("The tool said:")
    if not made:
        assert "Bash is not allowed by the profile" in result.reply


async def test_always_is_remembered_for_the_session_only_and_never_written_to_the_project(tmp_path):
    marker = tmp_path / "work" / "marker"
    with fake_claude(tmp_path, {"default": "ask", "timeout_secs": 10}) as (_, api, profile):
        async with started_agent(profile) as (agent, nursery):
            first, asked_first = await answering(agent, "run touch marker", lambda _: Decision(allow=True, always=True))
            assert marker.exists()
            marker.unlink()
            second, asked_second = await answering(agent, "run touch marker", lambda _: Decision(allow=False))
    assert first.ok and second.ok, (first.error, second.error)
    assert [request.title for request in asked_first] == ["touch marker"]
    assert asked_second == [] and marker.exists()  # the second call really happened, and was not asked
    assert len([p for p in api.posts("/v1/messages") if p.body.get("stream")]) == 4
    assert not (tmp_path / "work" / ".claude" / "settings.local.json").exists()


async def test_ask_user_question_is_answered_and_the_model_gets_the_answer(tmp_path):
    with fake_claude(tmp_path) as (_, api, profile):
        async with started_agent(profile) as (agent, nursery):
            result, asked = await answering(agent, "ask colour", lambda _: {"q1": ("Blue",)})
    assert result.ok, result.error
    [question] = asked
    assert [option.label for option in question.questions[0].options] == ["Red", "Blue"]
    assert '"Which colour?"="Blue"' in result.reply


async def test_an_interrupt_mid_request_cancels_the_turn_and_the_process_takes_the_next(tmp_path):
    with fake_claude(tmp_path) as (conversation, api, profile):
        async with started_agent(profile) as (agent, nursery):
            pid = agent.pid
            cancel = trio.Event()

            async def cancel_when_asked() -> None:
                await trio.to_thread.run_sync(conversation.started.wait, DEADLINE)
                cancel.set()

            nursery.start_soon(cancel_when_asked)
            stopped, _ = await answering(agent, "slow", cancel=cancel)
            conversation.release.set()
            after, _ = await answering(agent, "next")
            assert agent.pid == pid
    assert stopped.outcome.value == "cancelled" and not stopped.reply, (stopped.outcome, stopped.error)
    assert after.ok and after.reply == "reply to next", after.error


async def test_a_process_killed_between_turns_is_replaced_by_one_that_resumes_the_session(tmp_path):
    with fake_claude(tmp_path) as (_, api, profile):
        async with started_agent(profile) as (agent, nursery):
            first, _ = await answering(agent, "remember me")
            killed = agent.pid
            assert killed is not None
            # Claude Code writes the turn to its session file after the result: a kill before its reply is there
            # loses the reply (the resumed session then ends on the question, and Claude Code asks to continue).
            with trio.fail_after(DEADLINE):
                while not any(
                    '"type":"assistant"' in path.read_text()
                    for path in (tmp_path / "home").glob(f".claude/projects/*/{first.session_id}.jsonl")
                ):
                    await trio.sleep(0.01)
            os.killpg(killed, signal.SIGKILL)
            replacement = WarmAgent(profile, session_id=first.session_id)
            with trio.fail_after(DEADLINE):
                await replacement.start(nursery)
            after, _ = await answering(replacement, "and now")
            assert replacement.pid != killed
            await replacement.close()
    assert after.ok and after.session_id == first.session_id, after.error
    resumed = user_texts(api.posts("/v1/messages")[-1])
    # The history came back (under load Claude Code may add to the first message's text what it noticed then).
    assert len(resumed) == 2 and resumed[0].startswith("remember me") and resumed[1] == "and now", resumed


async def test_a_deleted_session_starts_a_new_one_and_the_host_is_told(tmp_path):
    gone = "00000000-0000-4000-8000-000000000000"
    seen: list[Any] = []
    with fake_claude(tmp_path) as (_, api, profile):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile, session_id=gone)
            with trio.fail_after(DEADLINE):
                await agent.start(nursery)
                result = await agent.turn(Turn("hello again"), seen.append)
            await agent.close()
    notices = [event.text for event in seen if isinstance(event, ActivityEvent) and event.activity == "notice"]
    assert notices == [
        f"the stored session {gone} is gone (No conversation found with session ID: {gone}); a new session was started"
    ]
    assert result.ok and result.session_id not in ("", gone), result.error
    assert user_texts(api.posts("/v1/messages")[-1]) == ["hello again"]  # the message was sent, to the new session


async def test_a_deleted_session_with_on_resume_failure_fail_does_not_start(tmp_path):
    gone = "00000000-0000-4000-8000-000000000000"
    with fake_claude(tmp_path) as (_, _api, profile):
        profile = profile.replace(on_resume_failure="fail")
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile, session_id=gone)
            with trio.fail_after(DEADLINE), pytest.raises(WarmStartError) as failed:
                await agent.start(nursery)
        assert f"no longer has the stored session {gone} (No conversation found" in failed.value.message
        # The same start, read by the dialect alone: the CLI's error result is the proof.
        sdk = dialect_class("claude-sdk")(DialectContext(), session_id=gone, cwd=profile.cwd)
        argv = [*profile.command, f"--resume={gone}"]
        env = {**profile.env, "PATH": os.environ["PATH"]}
        done = subprocess.run(
            argv, input=sdk.open(), capture_output=True, env=env, cwd=profile.cwd, timeout=DEADLINE, check=False
        )
    events = sdk.feed(done.stdout) + sdk.close()
    assert done.returncode == 1
    assert events[0] == SessionGone(f"No conversation found with session ID: {gone}")


async def test_a_fetched_image_reaches_the_model_as_an_image_block_and_a_file_by_its_path(tmp_path):
    sources = tmp_path / "sources"
    sources.mkdir()
    turn = Turn("what is this?", attachments=sent(sources))
    with fake_claude(tmp_path) as (_, api, profile):
        async with started_agent(profile) as (agent, _):
            with trio.fail_after(DEADLINE):
                result = await agent.turn(turn)
    assert result.ok, result.error
    [message] = [m for m in api.posts("/v1/messages")[-1].body["messages"] if m["role"] == "user"][-1:]
    blocks = [block for block in message["content"] if block.get("type") in ("image", "text")]
    image = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()}
    assert {"type": "image", "source": image} in [{"type": b["type"], "source": b.get("source")} for b in blocks]
    # The file the engine fetched into the turn's directory, named by its path.
    notes = rf"what is this\?\n\nAttached files:\n- {tmp_path}/work/{TURN_FILES}/notes\.txt"
    assert [
        b["text"] for b in blocks if b["type"] == "text" and re.fullmatch(notes + r" \(file, text/plain\)", b["text"])
    ]
