"""Warm protocols' outbox: `AGENT_OUTBOX` at start names the session's outbox, one path for all its turns; the agent
is told it once per session (`outbox.tell_agent`), the user's message reaching it as sent; the files left there come
back as for a one-process turn (`run_turn`, the host, `agent-bridge run`), each turn's moved aside when it ends.

The agent is the official ACP SDK's (`sample_agents/acp_agent.py`, its `files` command); how every other warm family
names the outbox is checked on its dialect, sans-I/O.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from attachment_files import left_in
from conftest import SAMPLE_AGENTS

import bridge
from bridge import FileEvent, Turn
from bridge.dialects import DialectContext, dialect_class
from bridge.dialects.base import outbox_named
from bridge.dialects.claude_stream import with_system_prompt_appended
from bridge.dialects.warm import WarmState
from bridge.files.outbox import remove_outbox

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
DEADLINE = 20  # a turn starts a Python agent that imports the SDK (~1 s)
OUTBOX = "/work/.agent-bridge/outbox/warm-1a2b3c4d"


def acp_profile(tmp_path: Path, work: Path, tell_agent: str | None = None) -> Path:
    """The SDK's sample agent working in `work`, its sessions under tmp_path/sessions."""
    directory = tmp_path / "profiles"
    directory.mkdir(exist_ok=True)
    command = [sys.executable, str(SAMPLE_AGENTS / "acp_agent.py"), "--load", "--store", str(tmp_path / "sessions")]
    path = directory / "acp.yaml"
    path.write_text(f"command: {command!r}\nprotocol: acp\ncwd: {str(work)!r}\nkill_grace_secs: 2\n")
    if tell_agent is not None:
        path.write_text(path.read_text() + f"outbox: {{tell_agent: {tell_agent}}}\n")
    return path


def session_outbox_in(reply: str, work: Path) -> str:
    """The session's outbox the sample agent says it left files in (its `AGENT_OUTBOX`)."""
    outbox = reply.rpartition(" in ")[2]
    assert os.path.dirname(outbox) == str(work / ".agent-bridge" / "outbox")
    assert os.path.basename(outbox).startswith("session-")
    return outbox


def outbox_of(files: tuple[FileEvent, ...]) -> str:
    (directory,) = {os.path.dirname(file.path) for file in files}
    return directory


async def test_a_warm_agent_leaves_two_files_seen_by_run_turn_in_order_before_the_result(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    profile = bridge.load_profile(acp_profile(tmp_path, work), cache=False)
    events: list[Any] = []
    with trio.fail_after(DEADLINE):
        result = await bridge.run_turn(profile, Turn("files report.txt:all-good data.csv:a,b"), on_event=events.append)
    assert result.ok, (result.error, result.stderr_tail)
    outbox = outbox_of(result.files)
    assert os.path.dirname(outbox) == str(work / ".agent-bridge" / "outbox")
    assert result.reply.startswith("left report.txt, data.csv in ")
    assert session_outbox_in(result.reply, work) != outbox  # moved aside when the turn ended
    assert [(f.name, f.size, f.media_type) for f in result.files] == [
        ("data.csv", 3, "text/csv"),
        ("report.txt", 8, "text/plain"),
    ]
    assert [Path(f.path).read_text() for f in result.files] == ["a,b", "all-good"]
    assert [event for event in events if isinstance(event, FileEvent)] == list(result.files)
    assert result.files_note == ""
    assert not (work / ".agent-bridge" / "attachments" / os.path.basename(outbox)).exists()
    remove_outbox(outbox)
    assert left_in(work) == []


async def test_one_warm_agent_writes_every_turn_to_one_outbox_and_each_turn_sends_its_own_files(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    acp_profile(tmp_path, work)
    with trio.fail_after(2 * DEADLINE):
        async with bridge.open_host(tmp_path / "profiles", state=tmp_path / "state.sqlite3") as host:
            first = await host.submit("acp", "chat", Turn("files one.txt:1 same.txt:first"))
            nothing = await host.submit("acp", "chat", Turn("hello"))
            second = await host.submit("acp", "chat", Turn("files two.txt:22 three.md:333 same.txt:second"))
            history = await host.submit("acp", "chat", Turn("history"))
    assert first.ok and nothing.ok and second.ok, (first.error, nothing.error, second.error)
    assert first.session_id == second.session_id == history.session_id  # one session (and one process, the pool's)
    assert session_outbox_in(first.reply, work) == session_outbox_in(second.reply, work)
    # The first turn's files wait for delivery while the second writes the same name: each turn sends its own.
    assert [(f.name, Path(f.path).read_text()) for f in first.files] == [("one.txt", "1"), ("same.txt", "first")]
    assert [(f.name, Path(f.path).read_text()) for f in second.files] == [
        ("same.txt", "second"),
        ("three.md", "333"),
        ("two.txt", "22"),
    ]
    assert outbox_of(first.files) != outbox_of(second.files)
    assert (nothing.reply, nothing.files) == ("echo: hello", ())  # the user's message as sent; the outbox aside
    assert history.reply == "files one.txt:1 same.txt:first | hello | files two.txt:22 three.md:333 same.txt:second"
    remove_outbox(outbox_of(first.files))
    remove_outbox(outbox_of(second.files))
    assert left_in(work) == []  # the turns without files left nothing behind


async def test_a_warm_turn_over_the_outbox_bounds_sends_what_fits_and_says_what_not(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    path = acp_profile(tmp_path, work)
    path.write_text(path.read_text() + "outbox_max_files: 1\n")
    profile = bridge.load_profile(path, cache=False)
    with trio.fail_after(DEADLINE):
        result = await bridge.run_turn(profile, Turn("files a.txt:1 b.txt:2"))
    assert [f.name for f in result.files] == ["a.txt"]
    assert result.files_note == "'b.txt' not sent: a turn sends at most 1 files"
    remove_outbox(outbox_of(result.files))


async def prompt_texts(tmp_path: Path, tell_agent: str | None, turns: int = 2) -> tuple[list[list[str]], str]:
    """The text blocks the sample ACP agent received in each of `turns` turns of one session, and its outbox."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    acp_profile(tmp_path, work, tell_agent)
    received = []
    with trio.fail_after(2 * DEADLINE):
        async with bridge.open_host(tmp_path / "profiles", state=tmp_path / "state.sqlite3") as host:
            for _ in range(turns):
                result = await host.submit("acp", "chat", Turn("texts"))
                assert result.ok, result.error
                received.append(json.loads(result.reply))
            told = await host.submit("acp", "chat", Turn("files x.txt:1"))
    remove_outbox(outbox_of(told.files))
    return received, session_outbox_in(told.reply, work)


async def test_by_default_a_warm_agent_gets_the_users_message_as_sent_and_its_outbox_once(tmp_path):
    # ACP has no channel for standing instructions: the session's first message carries the outbox, once.
    received, outbox = await prompt_texts(tmp_path, None)
    assert received == [["texts", outbox_named(outbox)], ["texts"]]


async def test_tell_agent_every_turn_names_the_outbox_after_every_message(tmp_path):
    received, outbox = await prompt_texts(tmp_path, "every_turn")
    assert received == [["texts", outbox_named(outbox)], ["texts", outbox_named(outbox)]]


async def test_tell_agent_never_leaves_every_message_as_sent(tmp_path):
    received, _ = await prompt_texts(tmp_path, "never")
    assert received == [["texts"], ["texts"]]


async def test_the_bridge_marks_its_state_directory_ignored_by_git(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    profile = bridge.load_profile(acp_profile(tmp_path, work), cache=False)
    with trio.fail_after(DEADLINE):
        result = await bridge.run_turn(profile, Turn("hello"))
    assert result.ok, result.error
    assert (work / ".agent-bridge" / ".gitignore").read_text() == "*\n"
    subprocess.run(["git", "-C", str(work), "init", "-q"], capture_output=True, timeout=DEADLINE, check=True)
    check = subprocess.run(
        ["git", "-C", str(work), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=True,
    )
    assert check.stdout == ""


def test_agent_bridge_run_json_prints_a_warm_agents_files_before_the_result(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        [AGENT_BRIDGE, "run", str(acp_profile(tmp_path, work)), "--json", "files notes.txt:hi"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in map(json.loads, done.stdout.splitlines()) if line["event"] in ("file", "result")]
    assert [(line["event"], line.get("name")) for line in lines] == [("file", "notes.txt"), ("result", None)]
    assert Path(lines[0]["path"]).read_text() == "hi"
    assert [file["name"] for file in lines[1]["files"]] == ["notes.txt"]


# ---------------------------------------------------------------------- each family names the outbox (sans-I/O)


def prompt_of(family: str, turn: Turn, outbox: str) -> Any:
    """What starts `turn` in `family` once its session is ready (each family's handshake is tested in its own file)."""
    context = DialectContext()
    dialect = dialect_class(family)(context, session_id="s1", cwd="/work")
    dialect.open()
    dialect.state = WarmState.READY
    return json.loads(dialect.prompt(turn, outbox))


def test_acp_names_the_outbox_in_a_text_block_after_the_users_message():
    prompt = prompt_of("acp", Turn("hello"), OUTBOX)["params"]["prompt"]
    assert prompt == [{"type": "text", "text": "hello"}, {"type": "text", "text": outbox_named(OUTBOX)}]
    assert prompt_of("acp", Turn("hello"), "")["params"]["prompt"] == [{"type": "text", "text": "hello"}]


def test_codex_app_server_names_the_outbox_in_an_input_item_after_the_users_message():
    items = prompt_of("codex-app-server", Turn("hello"), OUTBOX)["params"]["input"]
    assert items[-1] == {"type": "text", "text": outbox_named(OUTBOX)}
    assert items[0]["text"] == "hello"


@pytest.mark.parametrize("family", ["aionrs", "ante", "claude-sdk"])
def test_the_families_whose_turn_is_one_text_name_the_outbox_after_the_message(family):
    sent = json.dumps(prompt_of(family, Turn("hello"), OUTBOX))
    assert json.dumps(f"hello\n\n{outbox_named(OUTBOX)}")[1:-1] in sent
    assert OUTBOX not in json.dumps(prompt_of(family, Turn("hello"), ""))


def test_outbox_named_says_nothing_without_an_outbox():
    assert outbox_named("") == ""
    assert outbox_named(OUTBOX).startswith(f"Files for the user: write them to {OUTBOX} ")


# ---------------------------------------------------------------------- standing instructions (sans-I/O)


def test_claude_codes_system_prompt_gets_the_instructions_after_the_profiles_own():
    note = outbox_named(OUTBOX)
    assert with_system_prompt_appended(["claude", "-p", "--", "hi"], 0, note) == (
        "claude",
        "--append-system-prompt",
        note,
        "-p",
        "--",
        "hi",
    )
    assert with_system_prompt_appended(["bwrap", "claude", "--append-system-prompt", "Be brief."], 1, note) == (
        "bwrap",
        "claude",
        "--append-system-prompt",
        f"Be brief.\n\n{note}",
    )
    assert with_system_prompt_appended(["claude", "--append-system-prompt=Be brief."], 0, note) == (
        "claude",
        f"--append-system-prompt=Be brief.\n\n{note}",
    )
    # After `--` a word is the message, whatever it says.
    assert with_system_prompt_appended(["claude", "--", "--append-system-prompt"], 0, note)[1:3] == (
        "--append-system-prompt",
        note,
    )
    # Another program speaking the protocol (a script run by its interpreter): the flag after its words, so the
    # interpreter does not take it for its own option.
    assert with_system_prompt_appended(["python3", "agent.py", "--", "x"], 0, note) == (
        "python3",
        "agent.py",
        "--append-system-prompt",
        note,
        "--",
        "x",
    )
    assert with_system_prompt_appended(["python3", "agent.py"], 0, note)[2:] == ("--append-system-prompt", note)


def started(family: str, session_id: str = "") -> Any:
    return dialect_class(family)(DialectContext(), session_id=session_id, cwd="/work")


def test_codex_app_server_gives_the_instructions_to_thread_start_and_thread_resume():
    for session_id, method in (("", "thread/start"), ("t1", "thread/resume")):
        dialect = started("codex-app-server", session_id)
        assert dialect.tell_standing("standing words")
        dialect.open()
        [handshake] = dialect.feed(b'{"id": 0, "result": {}}\n')
        [_, request] = [json.loads(line) for line in handshake.data.splitlines()]
        assert (request["method"], request["params"]["developerInstructions"]) == (method, "standing words")


def test_ante_appends_the_instructions_to_a_new_sessions_system_prompt_and_a_resumed_one_says_them_in_a_turn():
    dialect = started("ante")
    assert dialect.tell_standing("standing words")
    assert json.loads(dialect.open())["op"]["StartSession"]["append_system_prompt"] == "standing words"
    assert not started("ante", "ses_1").tell_standing("standing words")


@pytest.mark.parametrize("family", ["acp", "aionrs"])
def test_the_families_without_a_channel_for_standing_instructions_say_so(family):
    assert not started(family).tell_standing("standing words")


async def test_a_warm_agent_that_cannot_start_leaves_no_session_outbox(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    path = tmp_path / "missing.yaml"
    path.write_text(f"command: [{str(tmp_path / 'no-such-agent')!r}]\nprotocol: acp\ncwd: {str(work)!r}\n")
    with trio.fail_after(DEADLINE):
        result = await bridge.run_turn(bridge.load_profile(path, cache=False), Turn("hello"))
    assert not result.ok
    assert left_in(work) == []
