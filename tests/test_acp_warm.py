"""`protocol: acp` through the public API: `run_turn`, `open_host`, `WarmAgent`, `agent-bridge run`, real agents.

The agents are the official Python SDK's (`sample_agents/acp_agent.py`, which
keeps its sessions on disk so a new process can load or resume them) and
codex-acp against the fake OpenAI server. Every turn has a deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from agents_cache import npm_binary
from attachment_files import PNG, TURN_FILES, left_in, sent
from conftest import CLI_PROFILES, SAMPLE_AGENTS, assert_no_live_process
from conftest import run as run_within
from dir_swapper import INSIDE, OUTSIDE, RaceTree
from fakes.openai_responses import OpenAIResponses, write_codex_home

import bridge
from bridge import Turn
from bridge.dialects import ActivityEvent
from bridge.engine.warm_agents import WarmAgent
from bridge.permissions import Decision, PermissionRequest

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


def files_profile(tmp_path: Path, work: Path, more: str = "") -> bridge.Profile:
    """The sample agent working in `work`, which the profile lets it read and write through the bridge."""
    permissions = f"cwd: {str(work)!r}\nacp: {{fs_read: true, fs_write: true}}\n{more}"
    return bridge.load_profile(acp_profile(tmp_path, permissions=permissions), cache=False)


async def run(profile: bridge.Profile, message: str, session_id: str = "", **callbacks: Any) -> bridge.TurnResult:
    return await run_within(profile, message, deadline=DEADLINE, session_id=session_id, **callbacks)


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
        ("thinking", ""),
        ("plan", ""),
        ("tool", "started"),
        ("tool", "completed"),
    ]
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
        async with bridge.open_host(tmp_path / "profiles", state=tmp_path / "state.sqlite3", max_concurrent=6) as host:
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


@pytest.mark.parametrize(
    ("policy", "answer", "reply"),
    [
        ("allow", None, "ran rm -rf build (allow_once-id)"),
        ("deny Bash by name", None, "did not run rm -rf build (reject_once-id)"),
        ("allow exec by kind", None, "ran rm -rf build (allow_once-id)"),
        ("deny bash in lower case", None, "did not run rm -rf build (reject_once-id)"),
        ("deny B?SH, a wildcard in upper case", None, "did not run rm -rf build (reject_once-id)"),
        ("allow BASH in upper case", None, "ran rm -rf build (allow_once-id)"),
        ("deny wins over allow whatever the case", None, "did not run rm -rf build (reject_once-id)"),
        ("ask", Decision(allow=True, always=True), "ran rm -rf build (allow_always-id)"),
        ("ask", False, "did not run rm -rf build (reject_once-id)"),
    ],
)
async def test_the_profiles_policy_or_the_host_answers_the_agents_permission_request(tmp_path, policy, answer, reply):
    profile = bridge.load_profile(acp_profile(tmp_path, permissions=PERMISSIONS[policy]), cache=False)
    asked: list[PermissionRequest] = []

    def on_permission(request: PermissionRequest) -> Any:
        asked.append(request)
        return answer

    events: list[Any] = []
    result = await run(
        profile, "ask rm -rf build", on_event=events.append, on_permission=on_permission if answer is not None else None
    )
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
        ("execute", "started"),
        ("Bash", "denied"),
        ("Bash", "failed"),
    ]


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
        return subprocess.run(
            [AGENT_BRIDGE, "run", "--conversation", "c1", "--state", state, str(profile), *args],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

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
    """profiles/clis/codex-acp.yaml as shipped, run by the cached codex-acp in `work`, against the fake server.
    HOME is the test's too: the login shell codex runs commands in reads no profile of this machine's."""
    work.mkdir(exist_ok=True)
    profile = bridge.load_profile(CLI_PROFILES / "codex-acp.yaml", cache=False)
    return profile.replace(
        command=[str(npm_binary("codex-acp"))],
        cwd=str(work),
        kill_grace_secs=0.5,
        env={"CODEX_HOME": str(home), "HOME": str(home.parent)},
        **changes,
    )


async def test_codex_acp_streams_its_reply_through_the_ready_profile(codex, tmp_path):
    home, _ = codex
    partials: list[str] = []
    result = await run(
        codex_profile(home, tmp_path / "work"), "say one two three four five", on_partial=partials.append
    )
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
    assert [(request.kind, request.title) for request in asked] == [
        ("exec", "touch allowed-file"),
        ("exec", "touch denied-file"),
    ]


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
    # The first turn's message is in the history, followed by the sentence that named that turn's outbox.
    assert any(text.startswith("say remember the number 42") for text in last.user_texts())
    assert "remember the number 42" in last.assistant_texts()
    assert_no_live_process([killed])


async def test_files_the_profile_grants_are_served_inside_the_working_directory_only(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "secret.txt").write_text("not for agents")
    (work / "escape").symlink_to(tmp_path / "secret.txt")
    profile = files_profile(tmp_path, work)
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


async def test_an_agent_swapping_a_directory_for_a_symlink_out_never_gets_the_bridge_outside(tmp_path):
    tree = RaceTree(tmp_path)
    profile = files_profile(tmp_path, tree.work)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            with tree.swapping():
                reads = await agent.turn(Turn(f"read-many 1200 {tree.path}"))
                writes = await agent.turn(Turn(f"write-many 400 {tree.path} owned"))
            await agent.close()
    assert tree.outside_file.read_text() == OUTSIDE
    assert reads.ok and writes.ok, (reads.error, writes.error)  # every failure was the agent's error: turns go on
    read = json.loads(reads.reply)
    assert OUTSIDE not in read["texts"], read
    assert read["texts"][INSIDE] and read["refused"], read  # the race ran: both sides were met
    assert json.loads(writes.reply)["wrote"], writes.reply


def descriptors_of(directory: Path) -> int:
    """How many of this process's file descriptors are open on `directory`."""
    count = 0
    for descriptor in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{descriptor}") == str(directory)
        except OSError:
            pass  # closed since the listing
    return count


async def test_the_working_directory_is_held_while_the_agent_lives_so_moving_it_redirects_nothing(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("notes")
    (tmp_path / "secret.txt").write_text("not for agents")
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(files_profile(tmp_path, work))
            await agent.start(nursery)
            held = descriptors_of(work)
            work.rename(tmp_path / "moved")
            work.symlink_to(tmp_path)  # the directory's path now leads to its parent, where secret.txt is
            secret = await agent.turn(Turn(f"try-read {work / 'secret.txt'}"))
            notes = await agent.turn(Turn(f"try-read {work / 'notes.txt'}"))
            await agent.close()
    assert secret.ok and secret.reply.startswith("refused: ") and "no such file" in secret.reply, secret.reply
    assert (notes.ok, notes.reply) == (True, "notes")
    assert held == 1 and descriptors_of(tmp_path / "moved") == 0  # held from the start, closed at the end


async def test_a_fifo_or_a_socket_is_refused_at_once_and_the_agent_goes_on(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("notes")
    os.mkfifo(work / "fifo")  # opened as the old bridge did, it blocked the turn for ever
    short = tempfile.mkdtemp()  # a socket's path must fit in 108 bytes: bound there, then moved in
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(f"{short}/s")
        os.rename(f"{short}/s", work / "socket")
        os.rmdir(short)
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                agent = WarmAgent(files_profile(tmp_path, work))
                await agent.start(nursery)
                results = [
                    await agent.turn(Turn(message))
                    for message in (
                        f"try-read {work / 'fifo'}",
                        f"try-write {work / 'fifo'} text",
                        f"try-read {work / 'socket'}",
                        f"try-write {work / 'socket'} text",
                        f"read {work / 'notes.txt'}",
                    )
                ]
                pid = agent.pid
                await agent.close()
    assert all(result.ok for result in results), [result.error for result in results]
    replies = [result.reply for result in results]
    assert [reply.startswith("refused: ") for reply in replies] == [True] * 4 + [False], replies
    assert ["it is a FIFO;" in reply for reply in replies[:2]] == [True, True], replies
    assert ["it is a socket;" in reply for reply in replies[2:4]] == [True, True], replies
    assert replies[-1] == "notes"
    assert pid is not None
    assert_no_live_process([pid])


BLOCKED_SECS = 10.0  # how long the stand-in for a stuck file system holds a request, at most


@pytest.mark.parametrize("stop", ["cancel", "timeout", "idle", "agent killed"])
async def test_a_file_request_that_never_returns_holds_up_neither_the_turn_nor_the_agent(tmp_path, monkeypatch, stop):
    """A read stuck in the kernel (a hung network or FUSE mount; a FIFO, before) is given up when the turn is
    cancelled or times out, or when it takes longer than the agent may stay silent: the agent takes the next turn.
    An agent killed meanwhile is reaped at once."""
    entered = trio.Event()
    release = threading.Event()

    def stuck(request: Any, root: Any) -> str:
        trio.from_thread.run_sync(entered.set)
        release.wait(BLOCKED_SECS)  # bounded: a turn that waits for it fails the test rather than hanging it
        return "read after all"

    monkeypatch.setattr("bridge.engine.warm_agents.serve_file_request", stuck)
    work = tmp_path / "work"
    work.mkdir()
    limits = {"timeout": "timeout_secs: 1\n", "idle": "idle_timeout_secs: 0.5\n"}.get(stop, "")
    cancel = trio.Event()

    async def stop_once_the_request_is_stuck(pid: int) -> None:
        await entered.wait()
        if stop == "cancel":
            cancel.set()
        else:
            os.killpg(pid, signal.SIGKILL)

    try:
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                agent = WarmAgent(files_profile(tmp_path, work, limits))
                await agent.start(nursery)
                pid = agent.pid
                assert pid is not None
                if stop in ("cancel", "agent killed"):
                    nursery.start_soon(stop_once_the_request_is_stuck, pid)
                started = trio.current_time()
                stuck_turn = await agent.turn(Turn(f"try-read {work / 'notes.txt'}"), cancel=cancel)
                took = trio.current_time() - started
                after = await agent.turn(Turn("hello"))
                await agent.close()
    finally:
        release.set()
    assert entered.is_set(), "the read was stuck before the turn stopped"
    assert took < BLOCKED_SECS / 2, took
    assert_no_live_process([pid])
    if stop == "agent killed":
        assert not stuck_turn.ok and not after.ok
        return
    if stop == "idle":
        assert stuck_turn.ok and stuck_turn.reply.startswith("refused: "), (stuck_turn.error, stuck_turn.reply)
        assert "the bridge stopped waiting for this read" in stuck_turn.reply
    else:
        assert stuck_turn.outcome == ("cancelled" if stop == "cancel" else "timeout"), stuck_turn.error
    assert (after.ok, after.reply) == (True, "echo: hello"), after.error  # the same agent: it was not killed


async def test_without_the_grant_the_agent_is_told_the_bridge_has_no_file_system(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    profile = bridge.load_profile(acp_profile(tmp_path, permissions=f"cwd: {str(tmp_path)!r}\n"), cache=False)
    result = await run(profile, f"read {tmp_path / 'notes.txt'}")
    assert not result.ok and "hello" not in result.reply


# ---------------------------------------------------------------------- a stored session the agent no longer has


async def test_a_session_the_agent_no_longer_has_starts_a_new_one_and_the_host_is_told(tmp_path):
    acp_profile(tmp_path, "--load")
    events: list[Any] = []
    with trio.fail_after(2 * DEADLINE):
        async with bridge.open_host(tmp_path / "profiles", state=tmp_path / "state.sqlite3") as host:
            first = await host.submit(
                "acp", "chat", Turn("remember me", session_id="sess-forgotten"), on_event=events.append
            )
            second = await host.submit("acp", "chat", Turn("history"))
    notices = [event.text for event in events if isinstance(event, ActivityEvent) and event.activity == "notice"]
    assert notices == ["the stored session sess-forgotten is gone (Resource not found); a new session was started"]
    assert first.ok and first.session_id.startswith("sess-") and first.session_id != "sess-forgotten"
    assert (second.ok, second.reply, second.session_id) == (True, "remember me", first.session_id)


async def test_on_resume_failure_fail_fails_the_turn_with_the_agents_words(tmp_path):
    profile = bridge.load_profile(acp_profile(tmp_path, "--load", permissions="on_resume_failure: fail\n"), cache=False)
    result = await run(profile, "hello", "sess-forgotten")
    assert (result.ok, result.session_id, result.outcome.value) == (False, "", "spawn_failed")
    assert "no longer has the stored session sess-forgotten (Resource not found)" in result.error_reply
    assert "on_resume_failure: fail" in result.error_reply


async def test_run_turn_fetches_the_attachments_and_the_agent_gets_the_image_as_an_image_block(tmp_path):
    work, sources = tmp_path / "work", tmp_path / "sources"
    work.mkdir()
    sources.mkdir()
    profile = bridge.load_profile(acp_profile(tmp_path, "--images", permissions=f"cwd: {str(work)!r}\n"), cache=False)
    with trio.fail_after(DEADLINE):
        result = await bridge.run_turn(profile, Turn("blocks", attachments=sent(sources)))
    assert result.ok, (result.error, result.stderr_tail)
    turn_files = rf"file://{work}/{TURN_FILES}"
    assert re.fullmatch(
        rf"image image/png {len(PNG)} bytes {turn_files}/shot\.png\nlink {turn_files}/notes\.txt text/plain 5",
        result.reply,
    ), result.reply
    assert left_in(work) == []
