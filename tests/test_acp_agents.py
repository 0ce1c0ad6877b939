"""`protocol: acp` against real ACP agents: the official Python SDK's (`sample_agents/acp_agent.py`) and codex-acp.

The test plays the engine with `acp_harness.AcpProcess` (a process, the pure
dialect, a loop): what passes here is real ACP both ways. Every step has a
deadline (`acp_harness.DEADLINE`); codex-acp runs against the fake OpenAI
server, offline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acp_harness import AcpProcess
from agents_cache import npm_binary
from attachment_files import PNG, fetched
from conftest import CLI_PROFILES, SAMPLE_AGENTS
from fake_gemini import TEXT_PIECES, TEXT_REPLY, fake_gemini, gemini_env, gemini_home, prompts
from fakes.openai_responses import OpenAIResponses, write_codex_home

import bridge
from bridge.dialects.events import (
    ActivityEvent,
    ErrorEvent,
    FileRequest,
    PartialEvent,
    PlanStep,
    Ready,
    ReplyEvent,
    SessionGone,
    TurnEnd,
)
from bridge.dialects.settings import AcpSettings
from bridge.permissions import Decision, PermissionRequest
from bridge.turn import Attachment, Turn

SAMPLE = [sys.executable, str(SAMPLE_AGENTS / "acp_agent.py")]
AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
GEMINI_DEADLINE = 30  # gemini's node start-up takes a few seconds on a loaded machine


def sample(*flags: str, store: Path) -> list[str]:
    return [*SAMPLE, *flags, "--store", str(store)]


def of(kind: type, events: list[Any]) -> list[Any]:
    return [event for event in events if isinstance(event, kind)]


async def turn(agent: AcpProcess, message: str, **fields: Any) -> list[Any]:
    await agent.send(agent.dialect.prompt(Turn(message, **fields)))
    return await agent.until(TurnEnd)


# ---------------------------------------------------------------------- the SDK's agent


async def test_the_sdk_agent_streams_thinks_plans_and_runs_a_tool(tmp_path):
    async with AcpProcess.start(sample(store=tmp_path / "s"), cwd=str(tmp_path)) as agent:
        [ready] = await agent.until(Ready)
        assert ready.session_id.startswith("sess-")
        events = await turn(agent, "work the plan")
        assert events == [
            ActivityEvent("thinking", text="Thinking about the plan"),
            ActivityEvent("plan", plan=(PlanStep("Look around", "in_progress"), PlanStep("Answer", "pending"))),
            ActivityEvent("tool", tool="execute", title="ls -la", status="started", call_id="tool-1"),
            ActivityEvent("tool", text="total 0", tool="execute", title="ls -la", status="completed", call_id="tool-1"),
            PartialEvent("did:"),
            PartialEvent(" the"),
            PartialEvent(" pla"),
            PartialEvent("n"),
            ReplyEvent("did: the plan"),
            TurnEnd("end_turn"),
        ]
        events = await turn(agent, "look", attachments=(Attachment("file", "https://x.test/notes.txt"),))
        assert of(ReplyEvent, events) == [ReplyEvent("echo: look [https://x.test/notes.txt]")]


@pytest.mark.parametrize("images", [True, False])
async def test_the_sdk_agent_gets_a_fetched_image_as_an_image_block_only_when_it_takes_images(tmp_path, images):
    shot, notes = fetched(tmp_path, "a shot.png")
    attachments = (shot, notes, Attachment("file", "https://x.test/later.txt"))  # the last not fetched: its URL
    flags = ("--images",) if images else ()
    async with AcpProcess.start(sample(*flags, store=tmp_path / "s"), cwd=str(tmp_path)) as agent:
        await agent.until(Ready)
        [reply] = of(ReplyEvent, await turn(agent, "blocks", attachments=attachments))
    shot_uri, notes_uri = Path(shot.path).as_uri(), Path(notes.path).as_uri()
    assert "%20" in shot_uri  # a path is quoted in its URI
    first = f"image image/png {len(PNG)} bytes {shot_uri}" if images else f"link {shot_uri} image/png {len(PNG)}"
    assert reply.text.splitlines() == [
        first,
        f"link {notes_uri} text/plain 5",
        "link https://x.test/later.txt None None",
    ]


async def test_the_sdk_agent_gets_the_profiles_mcp_servers(tmp_path):
    servers = [
        {"name": "docs", "command": "/bin/true", "args": [], "env": []},
        {"name": "other", "command": "/bin/true", "args": ["--x"], "env": [{"name": "A", "value": "1"}]},
    ]
    async with AcpProcess.start(
        sample(store=tmp_path / "s"), cwd=str(tmp_path), settings=AcpSettings(mcp_servers=servers)
    ) as agent:
        await agent.until(Ready)
        assert of(ReplyEvent, await turn(agent, "mcp")) == [ReplyEvent("docs,other")]


@pytest.mark.parametrize(
    ("decision", "reply"),
    [
        (Decision(allow=True, always=True), "ran rm -rf build (allow_always-id)"),
        (Decision(allow=False), "did not run rm -rf build (reject_once-id)"),
    ],
)
async def test_the_sdk_agent_asks_permission_and_hears_the_answer(tmp_path, decision, reply):
    async with AcpProcess.start(sample(store=tmp_path / "s"), cwd=str(tmp_path)) as agent:
        await agent.until(Ready)
        await agent.send(agent.dialect.prompt(Turn("ask rm -rf build")))
        request = (await agent.until(PermissionRequest))[-1]
        assert (request.tool, request.kind, request.title, dict(request.input)) == (
            "Bash",
            "exec",
            "rm -rf build",
            {"command": "rm -rf build"},
        )
        await agent.send(agent.dialect.answer(request, decision))
        events = await agent.until(TurnEnd)
        assert events[-2:] == [ReplyEvent(reply), TurnEnd("end_turn")]
        [finished] = of(ActivityEvent, events)
        assert (finished.tool, finished.status) == ("Bash", "completed" if decision.allow else "failed")


async def test_a_cancel_answers_every_pending_question_and_ends_the_turn_cancelled(tmp_path):
    async with AcpProcess.start(sample(store=tmp_path / "s"), cwd=str(tmp_path)) as agent:
        await agent.until(Ready)
        await agent.send(agent.dialect.prompt(Turn("ask2 make deploy")))
        await agent.until(PermissionRequest)
        await agent.until(PermissionRequest)
        await agent.send(agent.dialect.cancel())
        events = await agent.until(TurnEnd)
        assert events[-1] == TurnEnd("cancelled") and not of(ErrorEvent, events)
        assert of(ReplyEvent, await turn(agent, "still there?")) == [ReplyEvent("echo: still there?")]


async def test_a_turn_waiting_on_the_model_is_cancelled(tmp_path):
    async with AcpProcess.start(sample(store=tmp_path / "s"), cwd=str(tmp_path)) as agent:
        await agent.until(Ready)
        await agent.send(agent.dialect.prompt(Turn("hang")))
        assert await agent.until(PartialEvent) == [PartialEvent("waiting ")]
        await agent.send(agent.dialect.cancel())
        assert await agent.until(TurnEnd) == [TurnEnd("cancelled")]


@pytest.mark.parametrize(
    ("message", "error", "stop"),
    [
        ("refuse", "the agent refused to continue (refusal)", "refusal"),
        ("fail the model is down", "the model is down", "error"),
    ],
)
async def test_a_turn_the_sdk_agent_fails_is_an_error_and_the_next_turn_works(tmp_path, message, error, stop):
    async with AcpProcess.start(sample(store=tmp_path / "s"), cwd=str(tmp_path)) as agent:
        await agent.until(Ready)
        events = await turn(agent, message)
        assert events[-2:] == [ErrorEvent(error), TurnEnd(stop)]
        assert of(ReplyEvent, await turn(agent, "next")) == [ReplyEvent("echo: next")]


async def test_an_agent_that_dies_mid_turn_leaves_an_unfinished_turn(tmp_path):
    async with AcpProcess.start(sample(store=tmp_path / "s"), cwd=str(tmp_path)) as agent:
        await agent.until(Ready)
        await agent.send(agent.dialect.prompt(Turn("crash")))
        with pytest.raises(AssertionError, match="ended before a TurnEnd"):
            await agent.until(TurnEnd)
        assert PartialEvent("partial ") in agent.events
        [error] = of(ErrorEvent, agent.events)
        assert error.unfinished and "ended in the middle of the turn" in error.text
        assert await agent.process.wait() == 3


async def test_a_request_for_a_terminal_is_refused_and_the_agent_carries_on(tmp_path):
    async with AcpProcess.start(
        sample(store=tmp_path / "s"), cwd=str(tmp_path), settings=AcpSettings(fs_read=True, fs_write=True)
    ) as agent:
        await agent.until(Ready)
        assert of(ReplyEvent, await turn(agent, "terminal")) == [ReplyEvent("no terminal: -32601")]


async def test_file_requests_the_profile_grants_are_served_by_whoever_plays_the_engine(tmp_path):
    (tmp_path / "notes.txt").write_text("remember the milk\n")
    async with AcpProcess.start(
        sample(store=tmp_path / "s"), cwd=str(tmp_path), settings=AcpSettings(fs_read=True, fs_write=True)
    ) as agent:
        await agent.until(Ready)
        await agent.send(agent.dialect.prompt(Turn(f"read {tmp_path}/notes.txt")))
        [read] = of(FileRequest, await agent.until(FileRequest))
        assert (read.operation, read.path) == ("read", f"{tmp_path}/notes.txt")
        await agent.send(agent.dialect.file_reply(read.request_id, content=Path(read.path).read_text()))
        assert of(ReplyEvent, await agent.until(TurnEnd)) == [ReplyEvent("remember the milk\n")]
        await agent.send(agent.dialect.prompt(Turn(f"write {tmp_path}/out.txt hello")))
        [write] = of(FileRequest, await agent.until(FileRequest))
        assert (write.operation, write.content) == ("write", "hello")
        await agent.send(agent.dialect.file_reply(write.request_id))
        assert of(ReplyEvent, await agent.until(TurnEnd)) == [ReplyEvent(f"wrote {tmp_path}/out.txt")]


async def test_without_the_grant_a_file_request_is_refused(tmp_path):
    async with AcpProcess.start(sample(store=tmp_path / "s"), cwd=str(tmp_path)) as agent:
        await agent.until(Ready)
        events = await turn(agent, f"read {tmp_path}/notes.txt")
        # The SDK agent fails its turn with the bridge's refusal (its tool call raised it).
        assert events[-2:] == [ErrorEvent("agent-bridge does not offer fs/read_text_file"), TurnEnd("error")]


@pytest.mark.parametrize("flags", [("--load",), ("--resume",)])
async def test_a_new_process_picks_the_session_up_and_shows_nothing_of_its_history(tmp_path, flags):
    store = tmp_path / "s"
    async with AcpProcess.start(sample(*flags, store=store), cwd=str(tmp_path)) as agent:
        [ready] = await agent.until(Ready)
        await turn(agent, "first question")
        await turn(agent, "second question")
        agent.process.send_signal(signal.SIGKILL)
    async with AcpProcess.start(sample(*flags, store=store), cwd=str(tmp_path), session_id=ready.session_id) as agent:
        assert await agent.until(Ready) == [Ready(ready.session_id)]
        events = await turn(agent, "history")
        assert events == [
            *(PartialEvent(piece) for piece in ("firs", "t qu", "esti", "on |", " sec", "ond ", "ques", "tion")),
            ReplyEvent("first question | second question"),
            TurnEnd("end_turn"),
        ]


async def test_a_session_the_agent_no_longer_has_is_reported_gone(tmp_path):
    async with AcpProcess.start(
        sample("--load", store=tmp_path / "s"), cwd=str(tmp_path), session_id="sess-forgotten"
    ) as agent:
        assert await agent.until(SessionGone) == [SessionGone("Resource not found")]  # the SDK's words for -32002


# ---------------------------------------------------------------------- codex-acp


@pytest.fixture(scope="module")
def codex_acp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], dict[str, str], OpenAIResponses]]:
    binary = npm_binary("codex-acp")
    with OpenAIResponses() as api:
        home = write_codex_home(tmp_path_factory.mktemp("codex-acp") / "home", api.base_url)
        env = {"PATH": os.environ["PATH"], "HOME": str(home.parent), "CODEX_HOME": str(home), "LANG": "C.UTF-8"}
        yield [str(binary)], env, api


async def test_codex_acp_streams_asks_runs_the_tool_it_was_allowed_and_stops_when_denied(codex_acp, tmp_path):
    argv, env, api = codex_acp
    async with AcpProcess.start(argv, cwd=str(tmp_path), env=env, stderr=subprocess.DEVNULL) as agent:
        await agent.until(Ready)
        events = await turn(agent, "say one two three four five")
        assert of(PartialEvent, events) == [PartialEvent("one two three "), PartialEvent("four five")]
        assert events[-2:] == [ReplyEvent("one two three four five"), TurnEnd("end_turn")]
        await agent.send(agent.dialect.prompt(Turn("escalate echo allowed")))
        request = (await agent.until(PermissionRequest))[-1]
        assert (request.kind, request.title) == ("exec", "echo allowed")
        await agent.send(agent.dialect.answer(request, Decision(allow=True)))
        events = await agent.until(TurnEnd)
        assert events[-2:] == [ReplyEvent("ran: allowed"), TurnEnd("end_turn")]
        await agent.send(agent.dialect.prompt(Turn("escalate touch denied")))
        request = (await agent.until(PermissionRequest))[-1]
        await agent.send(agent.dialect.answer(request, Decision(allow=False)))
        events = await agent.until(TurnEnd)
        assert events[-1] == TurnEnd("cancelled") and "touch denied was denied" in of(ErrorEvent, events)[0].text
        assert not (tmp_path / "denied").exists()


async def test_codex_acp_loads_its_session_in_a_new_process_after_the_old_one_was_killed(codex_acp, tmp_path):
    argv, env, api = codex_acp
    async with AcpProcess.start(argv, cwd=str(tmp_path), env=env, stderr=subprocess.DEVNULL) as agent:
        [ready] = await agent.until(Ready)
        await turn(agent, "say remember the number 42")
        agent.kill()
    async with AcpProcess.start(
        argv, cwd=str(tmp_path), env=env, session_id=ready.session_id, stderr=subprocess.DEVNULL
    ) as agent:
        assert await agent.until(Ready) == [Ready(ready.session_id)]
        assert b'"method":"session/load"' in b"".join(event.data for event in agent.events if hasattr(event, "data"))
        events = await turn(agent, "say what was it")
        assert events == [PartialEvent("what was it"), ReplyEvent("what was it"), TurnEnd("end_turn")]
    last = api.responses_requests()[-1]
    assert "say remember the number 42" in last.user_texts() and "remember the number 42" in last.assistant_texts()


# ---------------------------------------------------------------------- gemini --acp, and the ready profiles


async def test_gemini_in_acp_mode_streams_and_a_session_it_cannot_load_goes_on_in_a_new_one(tmp_path):
    """A session id gemini never made (a conversation whose agent state was lost): session/load fails, the dialect
    warns and starts a new session, and the conversation goes on."""
    argv, env, work = gemini_acp(tmp_path)
    with fake_gemini("text") as api:
        env = {**env, **gemini_env(api, str(tmp_path / "home"))}
        async with AcpProcess.start(argv, cwd=str(work), env=env, stderr=subprocess.DEVNULL) as agent:
            [ready] = await agent.until(Ready, deadline=GEMINI_DEADLINE)
            events = await agent_turn(agent, "first question")
            assert events == [
                *(PartialEvent(piece) for piece in TEXT_PIECES),
                ReplyEvent(TEXT_REPLY),
                TurnEnd("end_turn"),
            ]
        lost = "0b9a6c1e-5d2f-4c3a-9e8b-7f6a5d4c3b2a"
        async with AcpProcess.start(argv, cwd=str(work), env=env, session_id=lost, stderr=subprocess.DEVNULL) as agent:
            warning, fresh = await agent.until(Ready, deadline=GEMINI_DEADLINE)
            assert warning.message == (
                "the agent could not load the stored session (JSON-RPC error -32603); a new session was started"
            )
            assert fresh.session_id not in (lost, ready.session_id)
            assert of(ReplyEvent, await agent_turn(agent, "second question")) == [ReplyEvent(TEXT_REPLY)]
        assert prompts(api.posts("streamGenerateContent")[-1])[-1] == "second question"


async def test_gemini_in_acp_mode_goes_on_after_a_kill_whether_or_not_it_loads_its_session(tmp_path):
    """Gemini CLI 0.61.0 advertises loadSession, but on session/load a new process first records the session
    afresh and then reads it back: when the new record wins, it answers "No previous sessions found for this
    project" (the usual outcome here), when the old one does, it loads (seen in CI). Either way the
    conversation goes on, in the loaded session or, with a warning, in a new one.

    When it loads, it answers before its replay of the history is written (its loadSession does not wait for
    it), so the test waits for the replayed answer before the next prompt, which would take the rest of the
    replay for its own output."""
    argv, env, work = gemini_acp(tmp_path)
    with fake_gemini("text") as api:
        env = {**env, **gemini_env(api, str(tmp_path / "home"))}
        async with AcpProcess.start(argv, cwd=str(work), env=env, stderr=subprocess.DEVNULL) as agent:
            [ready] = await agent.until(Ready, deadline=GEMINI_DEADLINE)
            await agent_turn(agent, "first question")
            agent.kill()
        async with AcpProcess.start(
            argv, cwd=str(work), env=env, session_id=ready.session_id, stderr=subprocess.DEVNULL
        ) as agent:
            *warnings, resumed = await agent.until(Ready, deadline=GEMINI_DEADLINE)
            if resumed.session_id == ready.session_id:
                assert warnings == []
                await agent.until_output(TEXT_REPLY.encode(), deadline=GEMINI_DEADLINE)
            else:
                assert [warning.message for warning in warnings] == [
                    "the agent could not load the stored session (JSON-RPC error -32603); a new session was started"
                ]
            assert of(ReplyEvent, await agent_turn(agent, "second question")) == [ReplyEvent(TEXT_REPLY)]
        assert prompts(api.posts("streamGenerateContent")[-1])[-1] == "second question"


def gemini_acp(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """The gemini-acp profile's command on the cached gemini, its environment without the API's, a work dir."""
    profile = bridge.load_profile(CLI_PROFILES / "gemini-acp.yaml", cache=False)
    work = tmp_path / "work"
    work.mkdir()
    gemini_home(str(tmp_path / "home"))
    return [str(npm_binary("gemini")), *profile.argv_template[1:]], {"PATH": os.environ["PATH"], **profile.env}, work


async def agent_turn(agent: AcpProcess, message: str) -> list[Any]:
    await agent.send(agent.dialect.prompt(Turn(message)))
    return await agent.until(TurnEnd, deadline=GEMINI_DEADLINE)


def test_check_accepts_the_ready_acp_profiles(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("codex-acp", "gemini"):
        (bin_dir / name).symlink_to(npm_binary(name))
    stand_in = bin_dir / "claude-agent-acp"  # not installed here: a stand-in, for check's "is it on PATH"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    paths = [str(CLI_PROFILES / f"{name}.yaml") for name in ("codex-acp", "gemini-acp", "claude-agent-acp")]
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([AGENT_BRIDGE, "check", *paths], capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "".join(f"{path}: ok\n" for path in paths), "")
