"""`agent-bridge chat`, driven through a pseudo-terminal the way a developer uses it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from attachment_files import left_in
from conftest import PROFILES, PYTHON, SAMPLE_AGENTS, assert_no_live_process, read_pids, write_agent, write_profile
from fake_anthropic import Conversation, result_text, tool_results, write_claude_profile
from fake_api import FakeApi
from terminal import AGENT_BRIDGE, Terminal

from bridge import SessionStore

PROMPT = b"you> "


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if not name.startswith("AGENT_")}
    return {**environ, "TMPDIR": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "xdg-state"), "TERM": "dumb"}


@pytest.fixture
def chat(env: dict[str, str]):  # type: ignore[no-untyped-def]
    terminals: list[Terminal] = []

    def start(*args: str) -> Terminal:
        terminal = Terminal("chat", *args, env=env)
        terminals.append(terminal)
        terminal.expect(PROMPT)
        return terminal

    yield start
    for terminal in terminals:
        terminal.close()


def session_of(text: bytes) -> bytes:
    return re.search(rb"turn \d+ of session (\w+)", text).group(1)  # type: ignore[union-attr]


def test_turns_keep_their_session_and_new_starts_another(chat) -> None:  # type: ignore[no-untyped-def]
    terminal = chat(str(PROFILES / "stream.yaml"))
    terminal.send(b"hello there\n")
    shown = terminal.expect(PROMPT)
    assert b"hello there \r\nturn 1 of session " in shown, "the partials, then the reply on a line of its own"
    session = session_of(shown)

    terminal.send(b"again\n")
    shown = terminal.expect(PROMPT)
    assert b"turn 2 of session " + session in shown and b"last time you said: hello there" in shown

    terminal.send(b"/session\n")
    assert b"session: " + session in terminal.expect(PROMPT)

    terminal.send(b"/new\n")
    terminal.expect(PROMPT)
    terminal.send(b"/session\n")
    assert b"session: none yet" in terminal.expect(PROMPT)
    terminal.send(b"fresh\n")
    shown = terminal.expect(PROMPT)
    assert b"turn 1 of session" in shown and session_of(shown) != session

    terminal.send(b"/bogus\n")
    assert b"unknown command /bogus" in terminal.expect(PROMPT)
    terminal.send(b"/help\n")
    assert b"/exit" in terminal.expect(PROMPT)
    terminal.send(b"/exit\n")
    assert terminal.exit_code() == 0


def test_partials_show_while_the_agent_works_and_a_spinner_while_it_is_silent(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    go, finish = tmp_path / "go", tmp_path / "finish"
    os.mkfifo(go)
    os.mkfifo(finish)
    agent = write_agent(
        tmp_path,
        "agent",
        f"""\
        #!{PYTHON}
        open({str(go)!r}).read()  # silent until the test says go
        print('AGENT_PARTIAL:"thinking… "', flush=True)
        open({str(finish)!r}).read()
        print("done thinking")
    """,
    )
    terminal = chat(str(write_profile(tmp_path, f"command: {agent}\n")))
    terminal.send(b"think\n")
    terminal.expect(re.compile(rb"\r[|/\\-] \d+\.\d s"))  # elapsed time, since stderr is a terminal
    with open(go, "w"):
        pass
    terminal.expect(b"thinking\xe2\x80\xa6 ")  # shown before the agent has finished
    with open(finish, "w"):
        pass
    assert b"done thinking" in terminal.expect(PROMPT)
    terminal.send(b"\x04")  # Ctrl-D at an empty prompt
    assert terminal.exit_code() == 0


def test_the_status_line_shows_what_the_agent_is_doing(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An agentproc-0.4 agent thinks, then asks to read a file: both show on the status line, never in the reply."""
    thought, asked = tmp_path / "thought", tmp_path / "asked"
    os.mkfifo(thought)
    os.mkfifo(asked)
    agent = write_agent(
        tmp_path,
        "agent",
        f"""\
        #!{PYTHON}
        import json, sys
        def send(**event):
            print(json.dumps(event), flush=True)
        sys.stdin.readline()
        send(type="partial", text="which file?", role="thinking")
        open({str(thought)!r}).read()  # until the test has seen it
        send(type="permission_request", request_id="r1", tool_name="Read", input={{"file_path": "notes.txt"}})
        answer = json.loads(sys.stdin.readline())
        open({str(asked)!r}).read()
        send(type="result", text="read it: " + answer["behavior"])
    """,
    )
    profile = write_profile(
        tmp_path,
        f"""\
        protocol: agentproc-0.4
        command: {agent}
        permissions: {{allow: [Read]}}
    """,
    )
    terminal = chat(str(profile))
    terminal.send(b"look\n")
    terminal.expect(re.compile(rb"\r[|/\\-] \d+\.\d s  thinking\xe2\x80\xa6"))
    with open(thought, "w"):
        pass
    terminal.expect(re.compile(rb"\r[|/\\-] \d+\.\d s  Read: notes\.txt \(allowed\)"))
    with open(asked, "w"):
        pass
    shown = terminal.expect(PROMPT)
    assert b"read it: allow\r\n" in shown and b"which file" not in shown
    terminal.send(b"/exit\n")
    assert terminal.exit_code() == 0


def test_ctrl_c_cancels_the_running_turn_and_the_chat_goes_on(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(
        tmp_path,
        f"""\
        command: {PROFILES.parent / "sample_agents" / "hang.sh"}
        timeout_secs: 60
        kill_grace_secs: 0.2
    """,
    )
    terminal = chat(str(profile))
    terminal.send(b"wait forever\n")
    terminal.expect(b"working on it")  # the turn is running
    terminal.send(b"\x03")
    shown = terminal.expect(PROMPT)
    assert b"[exit 130: cancelled" in shown

    terminal.send(b"\x03")  # Ctrl-C at the prompt: a fresh prompt, not the end
    terminal.expect(PROMPT)
    terminal.send(b"half a line\x03")  # the half-typed line is dropped
    terminal.expect(PROMPT)
    terminal.send(b"/session\n")
    assert b"session: none yet" in terminal.expect(PROMPT)
    terminal.send(b"/exit\n")
    assert terminal.exit_code() == 0


def test_a_conversation_survives_a_restart(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = str(tmp_path / "sessions.sqlite3")
    options = (str(PROFILES / "stream.yaml"), "--conversation", "dev", "--state", state)
    first = chat(*options)
    first.send(b"remember me\n")
    session = session_of(first.expect(PROMPT))
    first.send(b"\x04")
    assert first.exit_code() == 0
    with SessionStore(state) as store:
        assert store.get("stream", "dev") == session.decode()

    second = chat(*options)
    second.send(b"/session\n")
    shown = second.expect(PROMPT)
    assert b"session: " + session in shown and b"conversation 'dev' of stream" in shown
    second.send(b"again\n")
    assert b"turn 2 of session " + session in second.expect(PROMPT)
    second.send(b"/new\n")
    second.expect(PROMPT)
    with SessionStore(state) as store:
        assert store.get("stream", "dev") == "", "/new forgets the stored session too"
    second.send(b"/exit\n")
    assert second.exit_code() == 0


def test_sigterm_stops_the_running_turn_and_the_chat(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(
        tmp_path,
        f"""\
        command: {PROFILES.parent / "sample_agents" / "hang.sh"}
        kill_grace_secs: 0.2
    """,
    )
    terminal = chat(str(profile))
    terminal.send(b"wait\n")
    terminal.expect(b"working on it")
    os.kill(terminal.pid, signal.SIGTERM)
    assert terminal.exit_code() == 128 + signal.SIGTERM
    assert b"[exit 130: cancelled" in terminal.output


def test_closing_the_terminal_stops_the_running_agent_and_the_chat(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pid_file = tmp_path / "pids"
    agent = write_agent(
        tmp_path,
        "agent",
        f"""\
        #!{PYTHON}
        import os, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        print('AGENT_PARTIAL:"started "', flush=True)
        time.sleep(60)
    """,
    )
    terminal = chat(str(write_profile(tmp_path, f"command: {agent}\nkill_grace_secs: 0.2\n")))
    terminal.send(b"go\n")
    terminal.expect(b"started")
    os.close(terminal.fd)  # the window closes: the kernel hangs up the session (SIGHUP)
    terminal.fd = os.open(os.devnull, os.O_RDONLY)  # for close()
    _, status = os.waitpid(terminal.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGHUP
    assert_no_live_process(read_pids(pid_file))


def test_piped_input_is_a_script_of_turns(env: dict[str, str]) -> None:
    done = subprocess.run(
        [AGENT_BRIDGE, "chat", str(PROFILES / "echo.yaml")],
        input="hello\n\n//slash\n/exit\nnot sent\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "echo: hello\necho: /slash\n"
    assert "you>" not in done.stderr, "no prompt when nobody types"


def test_piped_input_exits_with_the_code_of_the_last_turn_that_failed(env: dict[str, str], tmp_path: Path) -> None:
    """A script of turns is a script: a failure is not reported as success. (A person leaving exits 0.)"""
    agent = write_agent(
        tmp_path,
        "agent",
        f"""\
        #!{PYTHON}
        import os, sys
        message = os.environ["AGENT_MESSAGE"]
        print(f"got {{message}}")
        sys.exit(int(message) if message.isdigit() else 0)
    """,
    )
    profile = str(write_profile(tmp_path, f"command: {agent}\n"))
    codes = {
        script: subprocess.run(
            [AGENT_BRIDGE, "chat", profile], input=script, capture_output=True, text=True, timeout=60, env=env
        ).returncode
        for script in ("ok\nfine\n", "3\nok\n", "3\n4\nok\n", "5\n/exit\nnot sent\n")
    }
    assert codes == {"ok\nfine\n": 0, "3\nok\n": 3, "3\n4\nok\n": 4, "5\n/exit\nnot sent\n": 5}


def test_a_failed_turn_shows_what_the_agent_said_on_stderr(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    agent = write_agent(tmp_path, "agent", "#!/bin/sh\necho 'jq: error: bad input' >&2\nexit 5\n")
    terminal = chat(str(write_profile(tmp_path, f"command: {agent}\n")))
    terminal.send(b"go\n")
    shown = terminal.expect(PROMPT)
    assert b"The agent exited with code 5.\r\n  stderr: jq: error: bad input\r\n[exit 5: exit_nonzero" in shown
    terminal.send(b"/exit\n")
    assert terminal.exit_code() == 0


def test_a_piped_line_over_the_limit_is_refused_and_the_chat_goes_on(env: dict[str, str]) -> None:
    """Input is framed like everything else the bridge reads: one line is held to 1 MiB, never more."""
    script = "x" * (3 * 1024 * 1024) + "\nhello\n"
    done = subprocess.run(
        [AGENT_BRIDGE, "chat", str(PROFILES / "echo.yaml")],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "echo: hello\n"
    assert "not sent: the line is longer than 1048576 bytes" in done.stderr


def ante_profile(tmp_path: Path, permissions: str = "{default: deny, allow: [read]}") -> str:
    """The make-believe Ante (a warm protocol), each of its processes' pid written to `pids`."""
    return str(
        write_profile(
            tmp_path,
            f"""\
        protocol: ante
        command: [sh, -c, 'echo $$ >> {tmp_path / "pids"}; exec {PYTHON} {SAMPLE_AGENTS / "ante_like.py"} serve --stdio']
        env: {{HOME: {str(tmp_path)!r}}}
        permissions: {permissions}
        kill_grace_secs: 2
    """,
            "ante.yaml",
        )
    )


def test_a_warm_profile_keeps_one_agent_for_the_chat_and_new_starts_another(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    terminal = chat(ante_profile(tmp_path))
    terminal.send(b"hello\n")
    assert b"You said: hello." in terminal.expect(PROMPT)
    terminal.send(b"again\n")
    assert b"I remember 1 earlier message(s); the last was: hello." in terminal.expect(PROMPT)
    assert len(read_pids(tmp_path / "pids")) == 1  # both turns on one process

    terminal.send(b"/new\n")
    terminal.expect(PROMPT)
    terminal.send(b"fresh\n")
    shown = terminal.expect(PROMPT)
    assert b"You said: fresh." in shown and b"remember" not in shown
    assert len(read_pids(tmp_path / "pids")) == 2  # a new session, a new process
    terminal.send(b"/exit\n")
    assert terminal.exit_code() == 0
    assert_no_live_process(read_pids(tmp_path / "pids"))  # goodbye to the agent before the chat ends


def test_a_tool_the_profile_asks_about_is_asked_at_the_prompt(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    terminal = chat(ante_profile(tmp_path, "{default: deny, ask: [exec]}"))
    terminal.send(b"use the tool\n")
    assert b"the agent asks to run Bash: ls -la. Allow? [y]es / [a]lways / [N]o " in terminal.expect(b"[N]o ")
    terminal.send(b"y\n")
    assert b"Bash: ran." in terminal.expect(PROMPT)
    terminal.send(b"the tool again\n")
    terminal.expect(b"[N]o ")
    terminal.send(b"\n")  # Enter alone is no
    assert b"Bash: skipped." in terminal.expect(PROMPT)
    terminal.send(b"/exit\n")
    assert terminal.exit_code() == 0


def test_run_asks_the_person_at_the_terminal_and_piped_chat_denies_saying_why(
    env: dict[str, str], tmp_path: Path
) -> None:
    profile = ante_profile(tmp_path, "{default: deny, ask: [exec]}")
    terminal = Terminal("run", profile, "use the tool", env=env)
    try:
        terminal.expect(b"Allow? [y]es / [a]lways / [N]o ")
        terminal.send(b"a\n")
        assert b"Bash: ran." in terminal.expect(b"Bash: ran.")
        assert terminal.exit_code() == 0
    finally:
        terminal.close()
    done = subprocess.run(
        [AGENT_BRIDGE, "chat", profile], input="use the tool\n", capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "Bash: skipped." in done.stdout and "denied Bash: ls -la (nobody at a terminal to ask)" in done.stderr


async def test_lines_typed_before_a_question_are_no_answer_and_come_back_after_it() -> None:
    from bridge.cli.terminal import LineReader

    read_end, write_end = os.pipe()
    try:
        reader = LineReader(read_end)
        os.write(write_end, b"my next message\n")  # typed while the agent worked
        earlier = reader.set_aside()
        os.write(write_end, b"y\n")  # typed once the question showed
        assert await reader.readline() == ("y", False)
        reader.put_back(earlier)
        assert await reader.readline() == ("my next message", False)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_an_agents_question_is_put_with_numbered_options_and_an_empty_line_declines(
    chat, env: dict[str, str], tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Claude Code's AskUserQuestion (the real CLI, a fake model server) at chat's prompt, then at run's."""
    with FakeApi(Conversation()) as api:
        profile = str(write_claude_profile(tmp_path / "claude.yaml", api, tmp_path))
        terminal = chat(profile)
        terminal.send(b"ask colour\n")
        asked = terminal.expect(b"(an empty line declines): ")
        assert b"Colour: Which colour?" in asked and b"1. Red \xe2\x80\x94 warm" in asked and b"2. Blue" in asked
        terminal.send(b"7\n")  # no such option: asked again
        assert b"type the number of an option, or your own words" in terminal.expect(b"(an empty line declines): ")
        terminal.send(b"2\n")
        assert b'"Which colour?"="Blue"' in terminal.expect(PROMPT)
        terminal.send(b"/exit\n")
        assert terminal.exit_code() == 0
    with FakeApi(Conversation()) as api:
        profile = str(write_claude_profile(tmp_path / "claude.yaml", api, tmp_path))
        ran = Terminal("run", profile, "ask colour", env=env)
        try:
            ran.expect(b"(an empty line declines): ")
            ran.send(b"\n")
            assert ran.exit_code() == 0
        finally:
            ran.close()
    [declined] = [results for post in api.posts("/v1/messages") if (results := tool_results(post))]
    assert "Blue" not in result_text(declined[0]) and "declined" in result_text(declined[0])


def test_attach_gives_the_next_message_a_file(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    agent = write_agent(
        tmp_path,
        "reads.sh",
        """\
        #!/bin/sh
        if [ -n "$AGENT_FILE_PATH" ]; then echo "got $(cat "$AGENT_FILE_PATH") as $(basename "$AGENT_FILE_PATH")"
        else echo "no file"; fi
        """,
    )
    (tmp_path / "work").mkdir()
    (tmp_path / "notes.txt").write_text("the notes")
    profile = write_profile(tmp_path, f"command: {str(agent)!r}\ncwd: {str(tmp_path / 'work')!r}\n")
    terminal = chat(str(profile))
    terminal.send(f"/attach {tmp_path / 'notes.txt'}\n".encode())
    terminal.expect(PROMPT)
    terminal.send(b"read it\n")
    assert b"got the notes as notes.txt" in terminal.expect(PROMPT)
    terminal.send(b"and now\n")
    assert b"no file" in terminal.expect(PROMPT)  # for the next message only
    terminal.send(b"/attach /no/such/file\n")
    terminal.expect(PROMPT)
    terminal.send(b"this one\n")
    assert b"/no/such/file" in terminal.expect(PROMPT)  # the turn fails, saying which attachment
    terminal.send(b"/exit\n")
    assert terminal.exit_code() == 0
    assert left_in(tmp_path / "work") == []  # the turn's files are gone with it


def test_an_agents_escape_sequences_reach_the_terminal_as_visible_text(chat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An agent (or what it read) cannot set the title, write the clipboard (OSC 52), hide text or move the cursor."""
    agent = write_agent(
        tmp_path,
        "agent",
        f"""\
        #!{PYTHON}
        import os, sys
        if "fail" in os.environ["AGENT_MESSAGE"]:
            print("tool failed \\x1b]0;from stderr\\x07", file=sys.stderr)
            sys.exit(3)
        print('AGENT_PARTIAL:"\\\\u001b]0;owned title\\\\u0007partial "', flush=True)
        print("\\x1b]52;c;cm0gLXJmIH4=\\x07reply \\x1b[8mhidden\\x1b[2K\\x9b2J")
    """,
    )
    terminal = chat(str(write_profile(tmp_path, f"command: {agent}\n")))
    terminal.send(b"go\n")
    shown = terminal.expect(PROMPT)
    assert b"\x1b" not in shown and "\x9b".encode() not in shown, shown
    assert b"^[]0;owned title^Gpartial " in shown
    assert b"^[]52;c;cm0gLXJmIH4=^Greply ^[[8mhidden^[[2K" in shown
    terminal.send(b"fail\n")
    shown = terminal.expect(PROMPT)
    assert b"\x1b" not in shown, shown
    assert b"stderr: tool failed ^[]0;from stderr^G" in shown
    terminal.send(b"/exit\n")
    assert terminal.exit_code() == 0
