"""`protocol: acp` through the public API: `run_turn`, `open_host`, `WarmAgent`, `agent-bridge run`, real agents.

The agents are the official Python SDK's (`sample_agents/acp_agent.py`, which
keeps its sessions on disk so a new process can load or resume them) and
codex-acp against the fake OpenAI server. Every turn has a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from agents_cache import npm_binary
from conftest import CLI_PROFILES, SAMPLE_AGENTS, assert_no_live_process
from fakes.openai_responses import OpenAIResponses, write_codex_home

import bridge
from bridge import Turn
from bridge.dialects import ActivityEvent
from bridge.permissions import Decision, PermissionRequest
from bridge.warm import WarmAgent

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
DEADLINE = 20  # a turn here starts a Python agent that imports the SDK (~1 s), or codex-acp


def acp_profile(tmp_path: Path, *flags: str, permissions: str = "", name: str = "acp") -> Path:
    """A profile running the SDK's sample agent, its sessions under tmp_path/sessions."""
    directory = tmp_path / "profiles"
    directory.mkdir(exist_ok=True)
    command = [sys.executable, str(SAMPLE_AGENTS / "acp_agent.py"), *flags, "--store", str(tmp_path / "sessions")]
    path = directory / f"{name}.yaml"
    path.write_text(f"command: {command!r}\nprotocol: acp\nkill_grace_secs: 2\n" + textwrap.dedent(permissions))
    return path


async def run(profile: bridge.Profile, message: str, session_id: str = "", **callbacks: Any) -> bridge.TurnResult:
    with trio.fail_after(DEADLINE):
        return await bridge.run_turn(profile, Turn(message, session_id=session_id), **callbacks)


@pytest.mark.parametrize("flags", [("--load",), ("--resume",)])
async def test_run_turn_streams_shows_activity_and_the_next_turn_reopens_the_session(tmp_path, flags):
    profile = bridge.load_profile(acp_profile(tmp_path, *flags), cache=False)
    partials: list[str] = []
    events: list[Any] = []
    first = await run(profile, "work the plan", on_partial=partials.append, on_event=events.append)
    assert first.ok, (first.error, first.stderr_tail)
    assert first.reply == "did: the plan" and "".join(partials) == first.reply
    assert first.session_id.startswith("sess-")
    assert [(event.activity, event.status) for event in events if isinstance(event, ActivityEvent)] == [
        ("thinking", ""), ("plan", ""), ("tool", "started"), ("tool", "completed")]
    second = await run(profile, "history", first.session_id)
    assert (second.ok, second.reply, second.session_id) == (True, "work the plan", first.session_id)


async def test_many_conversations_at_once_each_keep_their_own_session(tmp_path):
    acp_profile(tmp_path, "--load")
    results: dict[str, list[bridge.TurnResult]] = {}

    async def conversation(host: Any, name: str) -> None:
        first = await host.submit("acp", name, Turn(f"remember {name}"))
        second = await host.submit("acp", name, Turn("history"))
        results[name] = [first, second]

    names = [f"chat-{number}" for number in range(6)]
    with trio.fail_after(3 * DEADLINE):
        async with bridge.open_host(tmp_path / "profiles", state=tmp_path / "state.sqlite3",
                                    max_concurrent=6) as host:
            async with trio.open_nursery() as nursery:
                for name in names:
                    nursery.start_soon(conversation, host, name)
    for name in names:
        first, second = results[name]
        assert first.ok and second.ok, (first.error, second.error)
        assert second.reply == f"remember {name}" and second.session_id == first.session_id
    assert len({results[name][0].session_id for name in names}) == len(names)


async def test_a_turn_whose_agent_dies_fails_and_the_next_one_reopens_the_session(tmp_path):
    profile = bridge.load_profile(acp_profile(tmp_path, "--load"), cache=False)
    first = await run(profile, "first")
    crashed = await run(profile, "crash", first.session_id)
    assert not crashed.ok and crashed.exit_code == 3 and crashed.reply == ""
    after = await run(profile, "history", first.session_id)
    assert (after.ok, after.reply, after.session_id) == (True, "first", first.session_id)


async def test_a_warm_agent_killed_between_turns_is_replaced_by_one_that_loads_the_session(tmp_path):
    profile = bridge.load_profile(acp_profile(tmp_path, "--load"), cache=False)
    with trio.fail_after(3 * DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            first = await agent.turn(Turn("one"))
            second = await agent.turn(Turn("two"))
            killed = agent.pid
            assert killed is not None
            os.killpg(killed, signal.SIGKILL)
            await agent.close()
            dead = await agent.turn(Turn("three"))
            replacement = WarmAgent(profile, session_id=second.session_id)
            await replacement.start(nursery)
            after = await replacement.turn(Turn("history"))
            await replacement.close()
    assert first.ok and second.ok and first.session_id == second.session_id
    assert not dead.ok
    assert (after.ok, after.reply, after.session_id) == (True, "one | two", first.session_id)
    assert replacement.pid != killed
    assert_no_live_process([killed, replacement.pid])


PERMISSIONS = {
    "allow": "permissions: {default: allow}\n",
    "deny Bash by name": "permissions: {default: allow, deny: [Bash]}\n",
    "allow exec by kind": "permissions: {default: deny, allow: [exec]}\n",
    "ask": "permissions: {default: ask, timeout_secs: 5}\n",
    # The agent calls its tool Bash: a list names a tool in any case, wildcards included.
    "deny bash in lower case": "permissions: {default: allow, deny: [bash]}\n",
    "deny B?SH, a wildcard in upper case": "permissions: {default: allow, deny: [B?SH]}\n",
    "allow BASH in upper case": "permissions: {default: deny, allow: [BASH]}\n",
    "deny wins over allow whatever the case": "permissions: {default: allow, allow: [Bash], deny: [bASH]}\n",
}


@pytest.mark.parametrize(("policy", "answer", "reply"), [
    ("allow", None, "ran rm -rf build (allow_once-id)"),
    ("deny Bash by name", None, "did not run rm -rf build (reject_once-id)"),
    ("allow exec by kind", None, "ran rm -rf build (allow_once-id)"),
    ("deny bash in lower case", None, "did not run rm -rf build (reject_once-id)"),
    ("deny B?SH, a wildcard in upper case", None, "did not run rm -rf build (reject_once-id)"),
    ("allow BASH in upper case", None, "ran rm -rf build (allow_once-id)"),
    ("deny wins over allow whatever the case", None, "did not run rm -rf build (reject_once-id)"),
    ("ask", Decision(allow=True, always=True), "ran rm -rf build (allow_always-id)"),
    ("ask", False, "did not run rm -rf build (reject_once-id)"),
])
async def test_the_profiles_policy_or_the_host_answers_the_agents_permission_request(tmp_path, policy, answer,
                                                                                      reply):
    profile = bridge.load_profile(acp_profile(tmp_path, permissions=PERMISSIONS[policy]), cache=False)
    asked: list[PermissionRequest] = []

    def on_permission(request: PermissionRequest) -> Any:
        asked.append(request)
        return answer

    events: list[Any] = []
    result = await run(profile, "ask rm -rf build", on_event=events.append,
                       on_permission=on_permission if answer is not None else None)
    assert (result.ok, result.reply) == (True, reply), (result.error, result.stderr_tail)
    if answer is not None:
        assert [(request.tool, request.kind, request.title) for request in asked] == [("Bash", "exec", "rm -rf build")]
    finished = [event for event in events if isinstance(event, ActivityEvent) and event.status != "started"]
    assert [event.status for event in finished][-1] == ("failed" if "did not" in reply else "completed")


async def test_an_open_turn_sees_the_agents_question_and_decides_it(tmp_path):
    profile = bridge.load_profile(acp_profile(tmp_path, permissions=PERMISSIONS["ask"]), cache=False)
    seen: list[Any] = []
    with trio.fail_after(DEADLINE):
        async with bridge.open_turn(profile, Turn("ask make deploy")) as events:
            async for event in events:
                seen.append(event)
                if isinstance(event, PermissionRequest):
                    assert events.decide(event.request_id, Decision(allow=False, message="not today"))
    assert events.result.reply == "did not run make deploy (reject_once-id)"
    assert [(event.tool, event.status) for event in seen if isinstance(event, ActivityEvent)] == [
        ("execute", "started"), ("Bash", "denied"), ("Bash", "failed")]


async def test_cancelling_a_turn_that_waits_for_an_answer_answers_it_cancelled(tmp_path):
    profile = bridge.load_profile(acp_profile(tmp_path, "--load", permissions=PERMISSIONS["ask"]), cache=False)
    with trio.fail_after(DEADLINE):
        async with bridge.open_turn(profile, Turn("ask make deploy")) as events:
            async for event in events:
                if isinstance(event, PermissionRequest):
                    events.cancel()
    result = events.result
    assert (result.outcome, result.exit_code, result.reply) == ("cancelled", 130, "")
    assert result.duration_ms < 2000  # the agent stopped at once: no kill after kill_grace_secs
    after = await run(profile, "history", result.session_id)
    assert (after.ok, after.reply) == (True, "(no history)")  # the cancelled turn left nothing in the session


def test_agent_bridge_run_takes_an_acp_turn_and_resumes_the_conversations_session(tmp_path):
    profile = acp_profile(tmp_path, "--resume")
    state = str(tmp_path / "state.sqlite3")

    def agent_bridge_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([AGENT_BRIDGE, "run", "--conversation", "c1", "--state", state, str(profile), *args],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)

    first = agent_bridge_run("hello there")
    assert (first.returncode, first.stdout) == (0, "echo: hello there\n"), first.stderr
    second = agent_bridge_run("--", "history")
    assert (second.returncode, second.stdout) == (0, "hello there\n"), second.stderr


# ---------------------------------------------------------------------- codex-acp, the ready profile


@pytest.fixture(scope="module")
def codex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, OpenAIResponses]]:
    npm_binary("codex-acp")
    with OpenAIResponses() as api:
        yield write_codex_home(tmp_path_factory.mktemp("codex-acp") / "home", api.base_url), api


def codex_profile(home: Path, work: Path, **changes: Any) -> bridge.Profile:
    """profiles/clis/codex-acp.yaml as shipped, run by the cached codex-acp in `work`, against the fake server."""
    work.mkdir(exist_ok=True)
    profile = bridge.load_profile(CLI_PROFILES / "codex-acp.yaml", cache=False)
    return profile.replace(command=[str(npm_binary("codex-acp"))], cwd=str(work), kill_grace_secs=0.5,
                           env={"CODEX_HOME": str(home)}, **changes)


async def test_codex_acp_streams_its_reply_through_the_ready_profile(codex, tmp_path):
    home, _ = codex
    partials: list[str] = []
    result = await run(codex_profile(home, tmp_path / "work"), "say one two three four five",
                       on_partial=partials.append)
    assert (result.ok, result.reply) == (True, "one two three four five"), (result.error, result.stderr_tail)
    assert partials == ["one two three ", "four five"]


async def test_codex_acp_asks_before_a_command_which_runs_when_allowed_and_ends_the_turn_when_denied(codex, tmp_path):
    home, _ = codex
    profile = codex_profile(home, tmp_path / "work")  # the ready policy: exec is asked of the host
    asked: list[PermissionRequest] = []

    def allow_first(request: PermissionRequest) -> bool:
        asked.append(request)
        return len(asked) == 1

    allowed = await run(profile, "escalate touch allowed-file", on_permission=allow_first)
    assert (allowed.ok, allowed.reply) == (True, "ran: "), (allowed.error, allowed.stderr_tail)
    assert (tmp_path / "work" / "allowed-file").exists()
    denied = await run(profile, "escalate touch denied-file", allowed.session_id, on_permission=allow_first)
    assert not denied.ok and "touch denied-file was denied" in denied.error
    assert not (tmp_path / "work" / "denied-file").exists()
    assert [(request.kind, request.title) for request in asked] == [("exec", "touch allowed-file"),
                                                                     ("exec", "touch denied-file")]


async def test_codex_acp_loads_its_session_after_its_process_was_killed(codex, tmp_path):
    home, api = codex
    profile = codex_profile(home, tmp_path / "work")
    with trio.fail_after(3 * DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            first = await agent.turn(Turn("say remember the number 42"))
            killed = agent.pid
            assert killed is not None
            os.killpg(killed, signal.SIGKILL)
            await agent.close()
    assert first.ok, (first.error, first.stderr_tail)
    after = await run(profile, "say what was it", first.session_id)
    assert (after.ok, after.reply, after.session_id) == (True, "what was it", first.session_id)
    last = api.responses_requests()[-1]
    assert "say remember the number 42" in last.user_texts() and "remember the number 42" in last.assistant_texts()
    assert_no_live_process([killed])


async def test_files_the_profile_grants_are_served_inside_the_working_directory_only(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "secret.txt").write_text("not for agents")
    (work / "escape").symlink_to(tmp_path / "secret.txt")
    path = acp_profile(tmp_path, permissions=f"cwd: {str(work)!r}\nacp: {{fs_read: true, fs_write: true}}\n")
    profile = bridge.load_profile(path, cache=False)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            read = await agent.turn(Turn(f"read {work / 'notes.txt'}"))
            wrote = await agent.turn(Turn(f"write {work / 'new.txt'} fresh text"))
            outside = await agent.turn(Turn(f"read {tmp_path / 'secret.txt'}"))
            through_link = await agent.turn(Turn(f"read {work / 'escape'}"))
            missing = await agent.turn(Turn(f"read {work / 'nope.txt'}"))
            await agent.close()
    assert read.ok and read.reply == "one\ntwo\nthree\n"
    assert wrote.ok and (work / "new.txt").read_text() == "fresh text"
    for refused in (outside, through_link):
        assert not refused.ok and "outside the session's working directory" in refused.error, refused
        assert "not for agents" not in refused.error + refused.reply
    assert not missing.ok and "no such file" in missing.error


async def test_without_the_grant_the_agent_is_told_the_bridge_has_no_file_system(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    profile = bridge.load_profile(acp_profile(tmp_path, permissions=f"cwd: {str(tmp_path)!r}\n"), cache=False)
    result = await run(profile, f"read {tmp_path / 'notes.txt'}")
    assert not result.ok and "hello" not in result.reply
