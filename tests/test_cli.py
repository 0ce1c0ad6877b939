"""The `agent-bridge` command (docs/protocol.md §7, §8), run as a real subprocess, and the bundled profiles."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import IO, Any

import pytest
import yaml
from attachment_files import TURN_FILES
from conftest import (
    CLI_PROFILES,
    PROFILES,
    PYTHON,
    REPO,
    RESULT_FIELDS,
    assert_no_live_process,
    process_state,
    read_pids,
    write_agent,
    write_profile,
)
from terminal import Terminal, screen_lines

import bridge
from bridge import Turn

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
# Written out, not imported from bridge.profile.fields: this is the list users were promised, so a field added
# to or dropped from the profile must fail here until the docs and this list say so too.
SPEC_FIELDS = {
    "command",
    "args",
    "attachments",
    "sandbox",
    "limits",
    "protocol",
    "resume_args",
    "new_session_args",
    "permissions",
    "keep_warm_secs",
    "max_warm",
    "start_timeout_secs",
    "on_busy",
    "on_resume_failure",
    "on_worker_lost",
    "stdin",
    "cwd",
    "env",
    "env_allowlist",
    "env_inherit",
    "timeout_secs",
    "idle_timeout_secs",
    "kill_grace_secs",
    "max_reply_chars",
    "truncation_suffix",
    "outbox",
    "outbox_max_files",
    "outbox_max_bytes",
    "include_stderr_in_reply",
    "send_error_reply",
    "streaming",
    "session_line_prefix",
    "name",
    "description",
}
BUNDLED = sorted(PROFILES.rglob("*.yaml"))  # the samples and the ready profiles of coding CLIs


def cli(
    *args: str, stdin: Any = subprocess.DEVNULL, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENT_BRIDGE, *args], stdin=stdin, capture_output=True, text=True, timeout=60, env=env)


def cli_at_once(*invocations: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Run independent CLI invocations concurrently (each costs an interpreter start-up)."""
    procs = [
        subprocess.Popen(
            [AGENT_BRIDGE, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for args in invocations
    ]
    done = []
    for args, proc in zip(invocations, procs):
        out, err = proc.communicate(timeout=60)
        done.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    return done


def read_past(stream: IO[bytes], needle: bytes, closed_before: str) -> bytes:
    """What `stream` gave, as it came, until `needle` was in it; `closed_before` says what was missed if it ended."""
    seen = b""
    while needle not in seen:
        chunk = os.read(stream.fileno(), 100)
        assert chunk, f"{closed_before}: {seen!r}"
        seen += chunk
    return seen


def ndjson(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def agent_profile(directory: Path, source: str, name: str = "agent", **fields: Any) -> Path:
    """A Python agent and a profile YAML file running it; returns the profile's path."""
    write_agent(directory, f"{name}.py", f"#!{PYTHON}\n" + textwrap.dedent(source))
    data = {"command": [f"{{{{PROFILE_DIR}}}}/{name}.py"], **fields}
    return write_profile(directory, yaml.safe_dump(data, allow_unicode=True), f"{name}.yaml")


ENV_DUMP = """
import json, os
print('AGENT_PARTIAL:"a partial"')
print(json.dumps({name: value for name, value in os.environ.items() if name.startswith("AGENT_")}))
"""

WAITS_FOR_SIGINT = """
import os, signal, subprocess, sys, time
with open(os.environ["PID_FILE"], "a") as out:
    out.write(f"{os.getpid()}\\n{subprocess.Popen(['sleep', '600']).pid}\\n")
def on_sigint(signum, frame):
    with open(os.environ["MARKER"], "w") as out:
        out.write("SIGINT")
    sys.exit(0)
signal.signal(signal.SIGINT, on_sigint)
print('AGENT_PARTIAL:"ready"', flush=True)
while True:
    time.sleep(3600)
"""


# --------------------------------------------------------------------------- output modes


def test_human_mode_prints_partials_then_the_reply(tmp_path):
    profile = agent_profile(
        tmp_path,
        """
        print('AGENT_PARTIAL:"Hel"')
        print('AGENT_PARTIAL:"lo"')
        print("AGENT_SESSION:s1")
        print("the reply")
        print("second line")
    """,
    )
    done = cli("run", str(profile), "hi", "--log-level", "debug")
    assert (done.returncode, done.stdout) == (0, "Hello\nthe reply\nsecond line\n")
    assert "turn finished" in done.stderr  # logs, even at debug, only ever on stderr


JSON_STREAMER = """
import json, sys
message = json.loads(sys.stdin.readline())["message"]
def say(**event):
    print(json.dumps(event), flush=True)
if message == "streams its reply":
    say(type="partial", text="The answer")
    say(type="partial", text=" is 42.")
    say(type="result", text="The answer is 42.")
elif message == "streams the start":
    say(type="partial", text="The answer")
    say(type="result", text="The answer is 42.")
else:
    say(type="partial", text="Let me look.")
    say(type="partial", text="\\n\\nFound it.")
    say(type="result", text="Found it.")
"""


@pytest.mark.parametrize(
    "message, stdout",
    [
        ("streams its reply", "The answer is 42.\n"),
        ("streams the start", "The answer is 42.\n"),
        ("streams messages, the reply is the last", "Let me look.\n\nFound it.\n"),
    ],
)
def test_human_mode_prints_a_reply_the_agent_streamed_once(tmp_path, message, stdout):
    """JSON families stream the reply itself: run shows what the partials did not already show."""
    profile = agent_profile(tmp_path, JSON_STREAMER, protocol="agentproc-0.4")
    done = cli("run", str(profile), message)
    assert (done.returncode, done.stdout) == (0, stdout), done.stderr


def test_human_mode_sends_the_error_reply_to_stderr_with_the_turns_exit_code():
    done = cli("run", str(PROFILES / "fail.yaml"), "x")
    assert done.returncode == 1
    assert done.stdout == "looking that up… \n"
    assert "The upstream service is rate limited. Try again in a minute.\n" in done.stderr
    assert "discarded" not in done.stdout + done.stderr


def test_exit_code_is_the_turns_and_the_error_reply_says_why(tmp_path):
    exits_3 = agent_profile(tmp_path, "import sys; print('body'); sys.exit(3)")
    missing = write_profile(tmp_path, "command: no-such-agent-program-xyz\n", "missing.yaml")
    own, spawn = cli_at_once(
        ("run", str(exits_3), "x", "--log-level", "error"), ("run", str(missing), "x", "--log-level", "error")
    )
    assert (own.returncode, own.stdout, own.stderr) == (3, "", "The agent exited with code 3.\n")
    assert (spawn.returncode, spawn.stdout) == (127, "")
    assert "could not be started: command 'no-such-agent-program-xyz' not found on PATH" in spawn.stderr


def test_partials_are_printed_live(tmp_path):
    fifo = tmp_path / "ack"
    os.mkfifo(fifo)
    profile = agent_profile(
        tmp_path,
        """
        import os, sys
        fifo = os.open(sys.argv[1], os.O_RDWR)
        print('AGENT_PARTIAL:"one"', flush=True)
        os.read(fifo, 1)  # until the test has seen "one" on the CLI's stdout
        print("reply")
    """,
        args=[str(fifo)],
        timeout_secs=20,
    )
    with subprocess.Popen(
        [AGENT_BRIDGE, "run", str(profile), "x"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None
        seen = read_past(proc.stdout, b"one", "stdout closed before the partial")
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO here: the agent is gone
        os.write(fd, b"k")
        os.close(fd)
        rest, _ = proc.communicate(timeout=30)
    assert (proc.returncode, seen + rest) == (0, b"one\nreply\n")


def test_json_mode_prints_one_event_per_line_and_the_result_last(tmp_path):
    profile = agent_profile(
        tmp_path,
        r"""
        import sys
        sys.stdout.buffer.write(b"AGENT_PARTIAL:\xff\nbody \xc3(\n")
        print('AGENT_PARTIAL:"p1"')
        print("AGENT_SESSION:bad id")
        print("AGENT_SESSION:sess-1")
        print("body")
        print('AGENT_ERROR:"first"')
        print('AGENT_PARTIAL:"dropped after the error"')
        print('AGENT_ERROR:"second"')
    """,
    )
    done = cli("run", str(profile), "x", "--json")
    events = ndjson(done.stdout)
    assert events[:-1] == [
        {"event": "partial", "text": "\ufffd"},  # invalid UTF-8 cannot break the NDJSON
        {"event": "partial", "text": "p1"},
        {"event": "session", "session_id": "sess-1"},
        {"event": "error", "text": "first"},
        {"event": "error", "text": "second"},
    ]
    result = events[-1]
    assert result.pop("event") == "result"
    assert set(result) == RESULT_FIELDS
    assert result == {
        **result,
        "reply": "",
        "session_id": "sess-1",
        "error": "second",
        "error_reply": "second",
        "exit_code": 1,
        "timed_out": False,
        "outcome": "agent_error",
        "stderr_tail": "",
        "partials": 2,
        "truncated": False,
    }
    assert isinstance(result["duration_ms"], int)
    assert done.returncode == 1


def test_json_mode_prints_what_the_agent_does_as_activity_and_its_usage_on_the_result(tmp_path):
    """agentproc-0.4 (the bundled profile): thinking and an answered tool request are activity lines."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # where the sample agent keeps its sessions
    asks = ("run", str(PROFILES / "agentproc-echo.yaml"), "--json", "--timeout", "20")
    allowed, denied = (
        subprocess.run(
            [AGENT_BRIDGE, *asks, message],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        for message in ("hi tool=Read", "hi")
    )
    events = ndjson(allowed.stdout)
    session, thinking, tool = events[:3]
    assert session == {"event": "session", "session_id": events[-1]["session_id"]}
    assert thinking == {"event": "activity", "activity": "thinking", "text": "reading turn 1"}
    assert tool.pop("call_id").startswith("req-")
    assert tool == {
        "event": "activity",
        "activity": "tool",
        "tool": "Read",
        "status": "allowed",
        "title": "count the 2 word(s) of your message",
    }
    assert [event["text"] for event in events[3:-1]] == ["You", " said:", " hi", " tool=Read"]
    result = events[-1]
    assert (allowed.returncode, result["reply"]) == (0, "You said: hi tool=Read\n(Read was allowed)")
    assert result["usage"] == {"input_tokens": 2, "output_tokens": 7, "total_tokens": 9}
    assert [event.get("status") for event in ndjson(denied.stdout) if event["event"] == "activity"] == [None, "denied"]
    assert ndjson(denied.stdout)[-1]["usage"]["input_tokens"] == 1
    echo = cli("run", str(PROFILES / "echo.yaml"), "x", "--json")
    assert ndjson(echo.stdout)[-1]["usage"] is None  # an agent that reports no usage


# --------------------------------------------------------------------------- input and options


def test_message_from_the_argument_from_dash_and_from_piped_stdin():
    echo = str(PROFILES / "echo.yaml")
    runs = [
        (("run", echo, "from the argument"), None),
        (("run", echo, "-"), "from dash\nsecond line\n"),
        (("run", echo), "piped"),
    ]
    procs = [
        subprocess.Popen([AGENT_BRIDGE, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for args, _ in runs
    ]
    outputs = [proc.communicate(stdin_text, timeout=60)[0] for proc, (_, stdin_text) in zip(procs, runs)]
    assert outputs == ["echo: from the argument\n", "echo: from dash\nsecond line\n", "echo: piped\n"]


def test_the_message_may_come_after_the_options():
    echo = str(PROFILES / "echo.yaml")
    after, dash, two = cli_at_once(
        ("run", echo, "--session-name", "work", "after the options"),
        ("run", echo, "--json", "-"),
        ("run", echo, "--json", "one", "two"),
    )
    assert (after.returncode, after.stdout) == (0, "echo: after the options\n"), after.stderr
    assert (dash.returncode, ndjson(dash.stdout)[-1]["reply"]) == (0, "echo: "), dash.stderr
    assert two.returncode == 2 and "unrecognized arguments: one two" in two.stderr


def test_stdin_none_gives_the_agent_an_empty_stdin_even_when_the_bridges_stdin_is_an_open_pipe(tmp_path):
    """The bridge's stdin is a pipe its writer keeps open: an agent inheriting it would wait forever."""
    profile = agent_profile(tmp_path, "import sys\nprint(repr(sys.stdin.buffer.read()))\n", timeout_secs=5)
    proc = subprocess.Popen(
        [AGENT_BRIDGE, "run", str(profile), "hi"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:  # not communicate(): it would close the pipe, which is the point of the test
        out, err = proc.stdout.read(), proc.stderr.read()  # an inheriting agent ends only at the 5 s timeout
        proc.wait(timeout=20)
    finally:
        proc.kill()
        proc.stdin.close()
    assert (proc.returncode, out) == (0, "b''\n"), err


def test_no_message_and_a_terminal_on_stdin_is_a_usage_error():
    controller, terminal = pty.openpty()
    try:
        done = cli("run", str(PROFILES / "echo.yaml"), stdin=terminal)
    finally:
        os.close(controller)
        os.close(terminal)
    assert done.returncode == 2
    assert "no message" in done.stderr and done.stdout == ""


def test_every_run_option_reaches_the_agent(tmp_path):
    profile = agent_profile(tmp_path, ENV_DUMP)
    (tmp_path / "cat.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(8))
    (tmp_path / "doc.pdf").write_bytes(b"%PDF-1.7")
    done = cli(
        "run",
        str(profile),
        "the message",
        "--json",
        "--session-id",
        "sid-1",
        "--session-name",
        "work",
        "--from-user",
        "alice",
        "--attach",
        str(tmp_path / "cat.png"),
        "--attach",
        f"file={tmp_path / 'doc.pdf'}",
        "--no-stream",
    )
    assert done.returncode == 0, done.stderr
    events = ndjson(done.stdout)
    assert [event["event"] for event in events] == ["result"]  # --no-stream: the partial is ignored
    env = json.loads(events[0]["reply"])
    assert env == {
        "AGENT_MESSAGE": "the message",
        "AGENT_SESSION_ID": "sid-1",
        "AGENT_SESSION_NAME": "work",
        "AGENT_FROM_USER": "alice",
        "AGENT_STREAMING": "0",
        "AGENT_PROTOCOL_VERSION": "0.1",
        "AGENT_ATTACHMENTS": env["AGENT_ATTACHMENTS"],
        "AGENT_OUTBOX": env["AGENT_OUTBOX"],
    }
    assert re.search(r"/\.agent-bridge/outbox/[\w-]+$", env["AGENT_OUTBOX"])
    fetched = [(item.pop("path"), item) for item in json.loads(env["AGENT_ATTACHMENTS"])]
    assert [item for _, item in fetched] == [
        {"type": "image", "url": str(tmp_path / "cat.png"), "name": "cat.png", "media_type": "image/png", "size": 16},
        {
            "type": "file",
            "url": str(tmp_path / "doc.pdf"),
            "name": "doc.pdf",
            "media_type": "application/pdf",
            "size": 8,
        },
    ]
    assert all(re.search(rf"{TURN_FILES}/{re.escape(item['name'])}$", path) for path, item in fetched)


def test_bad_profiles_and_bad_arguments_exit_2_saying_what_is_wrong(tmp_path):
    typo = write_profile(tmp_path, "command: echo\ntimout_secs: 3\n", "typo.yaml")
    missing, echo = str(tmp_path / "missing.yaml"), str(PROFILES / "echo.yaml")
    cases = {
        ("run", missing, "x"): f"{missing}: no such profile file",
        ("run", str(typo), "x"): f"{typo}:2: unknown key 'timout_secs'; did you mean 'timeout_secs'?",
        ("run", echo, "x", "--timeout", "soon"): "'soon' is not a number of seconds",
        ("run", echo, "x", "--attach", "sticker=https://x/y"): "attachment type 'sticker' is not one of",
        ("run", echo, "x", "--no-such-option"): "unrecognized arguments",
        (
            "worker",
            "--postgres",
            "postgresql://nobody@127.0.0.1:9/x",
            "--profiles",
            str(tmp_path),
            "--lease-secs",
            "inf",
        ): ("must be finite"),
    }
    for (args, complaint), done in zip(cases.items(), cli_at_once(*cases)):
        assert (done.returncode, done.stdout) == (2, ""), args
        assert complaint in done.stderr, (args, done.stderr)


# --------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_interrupts_the_agent_and_exits_130(tmp_path):
    marker, pid_file = tmp_path / "marker", tmp_path / "pids"
    profile = agent_profile(
        tmp_path,
        WAITS_FOR_SIGINT,
        kill_grace_secs=0.2,
        timeout_secs=60,
        env={"MARKER": str(marker), "PID_FILE": str(pid_file)},
    )
    with subprocess.Popen(
        [AGENT_BRIDGE, "run", str(profile), "x", "--json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {"event": "partial", "text": "ready"}
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    result = json.loads(rest.splitlines()[-1])
    assert (result["exit_code"], result["outcome"]) == (130, "cancelled")
    assert marker.read_text() == "SIGINT"
    pids = read_pids(pid_file)
    assert len(pids) == 2
    assert all(process_state(pid) is None for pid in pids)  # killed and reaped (the CLI is a subreaper)


def test_a_reader_that_goes_away_ends_the_cli_quietly_and_stops_the_agent(tmp_path):
    fifo, pid_file = tmp_path / "ack", tmp_path / "pids"
    os.mkfifo(fifo)
    profile = agent_profile(
        tmp_path,
        """
        import os, subprocess, sys, time
        with open(os.environ["PID_FILE"], "a") as out:
            out.write(f"{os.getpid()}\\n{subprocess.Popen(['sleep', '600']).pid}\\n")
        fifo = os.open(sys.argv[1], os.O_RDWR)
        print('AGENT_PARTIAL:"one"', flush=True)
        os.read(fifo, 1)  # until the reader of the CLI's stdout has gone
        print('AGENT_PARTIAL:"two"', flush=True)
        while True:
            time.sleep(3600)
    """,
        args=[str(fifo)],
        env={"PID_FILE": str(pid_file)},
        kill_grace_secs=0.2,
        timeout_secs=60,
    )
    with subprocess.Popen(
        [AGENT_BRIDGE, "run", str(profile), "x"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(3) == "one"
        proc.stdout.close()  # like `agent-bridge run … | head -c 3`
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"k")
        os.close(fd)
        stderr = proc.stderr.read()
        proc.wait(timeout=30)
    assert proc.returncode == 128 + signal.SIGPIPE
    assert "Traceback" not in stderr
    assert_no_live_process(read_pids(pid_file))


# --------------------------------------------------------------------------- logs


def test_log_options_work_before_and_after_the_command_and_the_later_one_wins():
    echo = str(PROFILES / "echo.yaml")
    runs = cli_at_once(
        ("--log-level", "info", "--log-format", "json", "run", echo, "hi"),
        ("run", "--log-level", "info", "--log-format", "json", echo, "hi"),
        ("--log-level", "info", "--log-format", "console", "run", "--log-level", "error", echo, "hi"),
        (
            "--log-level",
            "error",
            "--log-format",
            "console",
            "run",
            echo,
            "hi",
            "--log-level",
            "info",
            "--log-format",
            "json",
        ),
        ("--log-level", "info", "--log-format", "console", "run", echo, "hi"),
    )
    assert [done.returncode for done in runs] == [0] * 5
    top, sub, top_then_quieter, top_then_louder, console = (done.stderr.splitlines() for done in runs)
    for lines in (top, sub, top_then_louder):
        assert "turn finished" in [json.loads(line)["event"] for line in lines]
    assert top_then_quieter == []
    assert any("turn finished" in line for line in console) and not any(line.startswith("{") for line in console)


def test_a_run_that_logs_nothing_does_not_import_structlog(tmp_path):
    probe = (
        "import sys\nfrom bridge.cli import main\ncode = main(sys.argv[1:])\n"
        "print('structlog' in sys.modules)\nraise SystemExit(code)"
    )
    echo, missing = str(PROFILES / "echo.yaml"), str(write_profile(tmp_path, "command: [/nonexistent/agent]"))
    quiet, louder, warned = (
        subprocess.run(
            [PYTHON, "-c", probe, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
        )
        for args in (("run", echo, "hi"), ("run", echo, "hi", "--log-level", "info"), ("run", missing, "x", "--json"))
    )
    assert quiet.stdout.splitlines() == ["echo: hi", "False"] and quiet.stderr == ""
    assert louder.stdout.splitlines()[-1] == "True" and "turn finished" in louder.stderr
    # A record at the active level still comes out, bound context and all.
    record = json.loads(warned.stderr.splitlines()[0])
    assert warned.stdout.splitlines()[-1] == "True" and record["level"] == "warning" and record["profile"] == "agent"


def test_logs_go_to_stderr_so_json_stdout_parses_even_at_debug(tmp_path):
    profile = agent_profile(
        tmp_path,
        """
        print("AGENT_SESSION:has a space")
        print("x" * (2 * 1024 * 1024))
        print('AGENT_PARTIAL:"p"')
    """,
        max_reply_chars=10,
    )
    done = cli("run", str(profile), "x", "--json", "--log-level", "debug")
    events = ndjson(done.stdout)  # every stdout line is an event
    assert [event["event"] for event in events] == ["partial", "result"]
    records = [json.loads(line) for line in done.stderr.splitlines()]  # not a terminal: JSON records
    assert any(record["level"] == "warning" and "session" in record["event"] for record in records)
    turn_records = [record for record in records if "turn_id" in record]
    assert turn_records and all(record["profile"] == "agent" for record in turn_records)
    assert len({record["turn_id"] for record in turn_records}) == 1


def test_logs_on_a_terminal_are_for_people():
    controller, terminal = pty.openpty()
    try:
        done = subprocess.run(
            [AGENT_BRIDGE, "run", str(PROFILES / "echo.yaml"), "hi", "--log-level", "info"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
            timeout=60,
            env={**os.environ, "NO_COLOR": "1"},
        )
        os.close(terminal)
        logged = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the writer side is closed and everything was read
                break
            if not chunk:
                break
            logged += chunk
    finally:
        os.close(controller)
    assert done.stdout == "echo: hi\n"
    lines = logged.decode().splitlines()
    finished = [line for line in lines if "turn finished" in line]
    assert finished and not finished[0].lstrip().startswith("{")  # console lines, not JSON
    assert "turn_id=" in finished[0] and "profile=echo" in finished[0]


def test_message_text_and_env_values_stay_out_of_logs_above_debug(tmp_path):
    profile = agent_profile(
        tmp_path,
        """
        print("AGENT_SESSION:bad session")
        print("reply")
    """,
        env={"TOKEN": "${BRIDGE_TEST_SECRET}", "OTHER": "${BRIDGE_TEST_UNSET}"},
    )
    env = {**os.environ, "BRIDGE_TEST_SECRET": "value-of-the-secret"}
    env.pop("BRIDGE_TEST_UNSET", None)
    done = cli("run", str(profile), "private message text", "--json", "--log-level", "info", env=env)
    assert done.returncode == 0
    assert "BRIDGE_TEST_UNSET" in done.stderr  # the warning names the variable…
    assert "turn finished" in done.stderr
    assert "private message text" not in done.stderr  # …but never carries the message
    assert "value-of-the-secret" not in done.stderr  # …or an env value


# --------------------------------------------------------------------------- check, schema, python -m


def test_check_accepts_every_bundled_profile():
    done = cli("check", *map(str, BUNDLED))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{path}: ok" for path in BUNDLED]


def test_check_reports_every_problem_as_file_line_message(tmp_path):
    bad = write_profile(
        tmp_path,
        """
        command: ["agent"]
        timout_secs: 3
        stdin: sometimes
        streaming: "yes"
    """,
        "bad.yaml",
    )
    injection = write_profile(
        tmp_path,
        """
        command: sh -c 'echo {{MESSAGE}}'
    """,
        "injection.yaml",
    )
    done = cli("check", str(PROFILES / "echo.yaml"), str(bad), str(injection))
    assert done.returncode == 2
    assert f"{PROFILES / 'echo.yaml'}: ok" in done.stdout
    problems = done.stderr.splitlines()
    assert f"{bad}:2: unknown key 'timout_secs'; did you mean 'timeout_secs'?" in problems
    assert any(line.startswith(f"{bad}:3: stdin") for line in problems)
    assert any(line.startswith(f"{bad}:4: streaming") for line in problems)
    assert any(
        line.startswith(f"{injection}:1: command: {{{{MESSAGE}}}} is inside the inline code run by sh")
        for line in problems
    )


def test_check_warns_where_a_message_could_become_options_and_shows_the_fix(tmp_path):
    unguarded = write_profile(tmp_path, "command: ls -1 {{MESSAGE}}\n", "unguarded.yaml")
    guarded = write_profile(
        tmp_path, "command: ls -1 -- {{MESSAGE}}\nargs: ['--color={{SESSION_NAME}}']\n", "guarded.yaml"
    )
    done = cli("check", str(unguarded), str(guarded))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{unguarded}: ok", f"{guarded}: ok"]
    assert done.stderr.splitlines() == [
        f"{unguarded}: warning: {{{{MESSAGE}}}} is not preceded by --, so a message starting with '-' would reach "
        "ls as options; end the options first: ls -1 -- {{MESSAGE}} (or, if it is an option's value, write "
        "--option={{MESSAGE}})"
    ]


def test_check_warns_about_the_argv_of_a_resumed_session_too(tmp_path):
    both = write_profile(
        tmp_path, "command: some-cli\nresume_args: ['--resume={{SESSION_ID}}']\nargs: ['{{MESSAGE}}']\n", "both.yaml"
    )
    done = cli("check", str(both))
    warnings = [line for line in done.stderr.splitlines() if "not preceded by --" in line]
    assert len(warnings) == 1 and "some-cli -- {{MESSAGE}}" in warnings[0]  # about args: said once, not twice
    resumed_only = write_profile(
        tmp_path,
        "command: some-cli\nresume_args: [--resume, '{{SESSION_ID}}']\nargs: [--, '{{MESSAGE}}']\n",
        "resumed-only.yaml",
    )
    done = cli("check", str(resumed_only))
    [warning] = [line for line in done.stderr.splitlines() if "not preceded by --" in line]
    assert "warning: in a resumed session: {{SESSION_ID}} is not preceded by --" in warning
    only_resumed = write_profile(tmp_path, "command: some-cli\nresume_args: [--resume, '{{SESSION_ID}}']\n", "o.yaml")
    [warning] = [line for line in cli("check", str(only_resumed)).stderr.splitlines() if "not preceded" in line]
    assert "warning: in a resumed session: {{SESSION_ID}} is not preceded by --" in warning


def test_a_session_id_cannot_move_the_agent_out_of_its_cwd(tmp_path):
    (tmp_path / "work" / "s-1").mkdir(parents=True)
    ran = tmp_path / "ran"
    profile = agent_profile(
        tmp_path,
        f"""
        import os
        open({str(ran)!r}, "a").write(os.getcwd() + "\\n")
        print(os.getcwd())
    """,
        cwd="{{PROFILE_DIR}}/work/{{SESSION_ID}}",
    )
    escape, json_escape, fine = cli_at_once(
        ("run", str(profile), "hi", "--session-id", "../..", "--log-level", "error"),
        ("run", str(profile), "hi", "--session-id", "../..", "--json", "--log-level", "error"),
        ("run", str(profile), "hi", "--session-id", "s-1"),
    )
    assert (escape.returncode, escape.stdout) == (126, "")
    assert "could not be started: the session id '../..' cannot be used in cwd: it contains '/'" in escape.stderr, (
        escape.stderr
    )
    [result] = ndjson(json_escape.stdout)
    assert (result["outcome"], result["exit_code"], json_escape.returncode) == ("spawn_failed", 126, 126)
    assert (fine.returncode, fine.stdout) == (0, f"{tmp_path.resolve() / 'work' / 's-1'}\n")
    assert ran.read_text().splitlines() == [str(tmp_path.resolve() / "work" / "s-1")]  # the refused turns never ran


def test_a_working_directory_made_of_the_message_is_not_logged_with_it(tmp_path):
    """`cwd: work/{{MESSAGE}}` naming no directory: the reason logged at warning named the path, message and all."""
    (tmp_path / "work").mkdir()
    profile = agent_profile(tmp_path, "print('ran')", cwd="{{PROFILE_DIR}}/work/{{MESSAGE}}")
    done = cli("run", str(profile), "my secret plan", "--log-level", "info")
    assert done.returncode == 126, done.stderr
    assert "secret" not in done.stderr, done.stderr
    assert f"the working directory '{tmp_path}/work/{{{{MESSAGE}}}}' does not exist" in done.stderr, done.stderr


def test_schema_is_a_json_schema_of_every_profile_field(tmp_path):
    done = cli("schema")
    assert done.returncode == 0
    schema = json.loads(done.stdout)
    assert schema["type"] == "object"
    assert set(schema["properties"]) == SPEC_FIELDS | set(bridge.dialects.PROTOCOLS)  # and each protocol's settings
    assert schema["required"] == ["command"]
    assert schema["additionalProperties"] is False
    for name in SPEC_FIELDS:
        assert schema["properties"][name].get("description"), name
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.validators.validator_for(schema)(schema)  # as jsonschema.validate, the schema checked once
    for path in BUNDLED:
        validator.validate(yaml.safe_load(path.read_text()))
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"command": "x", "timout_secs": 3})


def test_make_run_command_answers_and_python_dash_m_bridge_is_the_same_command():
    script, module = (
        subprocess.Popen(
            [*command, "run", "profiles/echo.yaml", "hello"],
            cwd=REPO,
            text=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        for command in ([AGENT_BRIDGE], [sys.executable, "-m", "bridge"])
    )
    for proc in (script, module):
        assert proc.communicate(timeout=60)[0] == "echo: hello\n"
        assert proc.returncode == 0


def test_bundled_hang_profile_times_out_at_the_timeout_option():
    done = cli("run", str(PROFILES / "hang.yaml"), "x", "--timeout", "0.3", "--json")  # the profile says 2 s
    result = ndjson(done.stdout)[-1]
    assert (done.returncode, result["outcome"]) == (124, "timeout")
    assert result["error_reply"].startswith("The agent timed out after 0.3 s.")


async def test_bundled_echo_fail_and_upper_profiles():
    echo = await bridge.run_turn(bridge.load_profile(PROFILES / "echo.yaml"), Turn("hi"))
    assert (echo.exit_code, echo.reply) == (0, "echo: hi")
    fail = await bridge.run_turn(bridge.load_profile(PROFILES / "fail.yaml"), Turn("hi"))
    assert (fail.exit_code, fail.outcome, fail.reply, fail.partials) == (1, "agent_error", "", 1)
    assert fail.error_reply == "The upstream service is rate limited. Try again in a minute."
    upper = await bridge.run_turn(bridge.load_profile(PROFILES / "upper.yaml"), Turn("shout this, ünïcode"))
    assert (upper.exit_code, upper.reply) == (0, "SHOUT THIS, ÜNÏCODE")


async def test_bundled_fork_profile_ends_at_once_and_its_child_is_killed():
    result = await bridge.run_turn(bridge.load_profile(PROFILES / "fork.yaml"), Turn("hi"))
    assert result.exit_code == 0 and result.duration_ms < 5000
    child = int(result.reply.split("(pid ")[1].split(")")[0])
    assert_no_live_process([child])


async def test_bundled_stream_profile_streams_and_resumes_its_session(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the sample keeps its sessions
    profile = bridge.load_profile(PROFILES / "stream.yaml").replace(env={"STREAM_DELAY": "0"})
    partials: list[str] = []
    first = await bridge.run_turn(profile, Turn("hello there"), on_partial=partials.append)
    assert first.exit_code == 0 and first.session_id
    assert partials == ["hello ", "there "]
    second = await bridge.run_turn(profile, Turn("again", session_id=first.session_id))
    assert second.session_id == first.session_id
    assert f"turn 2 of session {first.session_id}" in second.reply
    assert "last time you said: hello there" in second.reply


# --------------------------------------------------------------------------- what a person sees: failures explain themselves


def test_a_failed_turn_shows_the_last_lines_of_the_agents_stderr_under_the_generic_error(tmp_path):
    """Wrapping a CLI (jq, ls) whose own error goes to stderr: the user sees why, not only the exit code."""
    like_jq = agent_profile(
        tmp_path,
        """
        import sys
        sys.stderr.write("reading input\\n" + "".join(f"noise {n}\\n" for n in range(10)))
        sys.stderr.write("jq: error (at <stdin>:0): Cannot index number with \\"foo\\"\\n")
        sys.exit(5)
    """,
        name="like_jq",
    )
    done = cli("run", str(like_jq), "x")
    assert (done.returncode, done.stdout) == (5, "")
    assert done.stderr.splitlines() == [
        "The agent exited with code 5.",
        "  stderr: …",  # more came before: a few lines, bounded
        "          noise 6",
        "          noise 7",
        "          noise 8",
        "          noise 9",
        '          jq: error (at <stdin>:0): Cannot index number with "foo"',
    ]
    as_json = cli("run", str(like_jq), "x", "--json")
    assert ndjson(as_json.stdout)[-1]["stderr_tail"].endswith('Cannot index number with "foo"\n')
    assert "stderr:" not in as_json.stderr, "--json is unchanged: the tail is in the result"


def test_the_stderr_tail_is_not_shown_when_the_agent_explained_itself_or_the_reply_has_it(tmp_path):
    explained = agent_profile(
        tmp_path,
        """
        import sys
        sys.stderr.write("debug noise\\n")
        print('AGENT_ERROR:"The service is down."')
    """,
        name="explained",
    )
    in_reply = agent_profile(
        tmp_path,
        """
        import sys
        sys.stderr.write("the cause\\n")
        sys.exit(3)
    """,
        name="in_reply",
        include_stderr_in_reply=True,
    )
    own, included = cli_at_once(("run", str(explained), "x"), ("run", str(in_reply), "x"))
    assert (own.returncode, own.stderr) == (1, "The service is down.\n")
    assert included.returncode == 3
    assert included.stderr.count("the cause") == 1  # said once, in the error reply


def test_an_empty_reply_gets_a_notice_and_stdin_message_a_hint_about_stdin_line(tmp_path):
    silent = agent_profile(tmp_path, "import sys; sys.stderr.write('nothing to say\\n')", name="silent")
    reads_lines = agent_profile(tmp_path, "import sys; sys.stdin.read()", name="reads_lines", stdin="message")
    quiet, on_stdin, as_json = cli_at_once(
        ("run", str(silent), "x"), ("run", str(reads_lines), "2^10"), ("run", str(silent), "x", "--json")
    )
    assert (quiet.returncode, quiet.stdout) == (0, "")
    assert quiet.stderr.splitlines() == [
        "agent-bridge: the agent exited 0 without printing a reply",
        "  stderr: nothing to say",
    ]
    assert (on_stdin.returncode, on_stdin.stdout) == (0, "")
    assert "without printing a reply; a program that reads lines (bc, a REPL) needs `stdin: line`" in on_stdin.stderr
    assert (as_json.returncode, as_json.stderr) == (0, "")


def test_show_stderr_streams_the_agents_stderr_live_and_the_tail_is_not_repeated(tmp_path):
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    profile = agent_profile(
        tmp_path,
        """
        import sys
        sys.stderr.write("step 1: fetching\\n")
        sys.stderr.flush()
        open(sys.argv[1]).read()  # until the test has seen step 1 on the CLI's stderr
        sys.stderr.write("step 2: it broke\\n")
        sys.exit(4)
    """,
        args=[str(fifo)],
        timeout_secs=20,
    )
    with subprocess.Popen(
        [AGENT_BRIDGE, "run", str(profile), "x", "--show-stderr"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stderr is not None
        seen = read_past(proc.stderr, b"step 1: fetching\n", "stderr closed before the agent's first line")
        with open(fifo, "w"):
            pass
        out, rest = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (4, b"")
    assert (seen + rest).decode().splitlines() == [
        "step 1: fetching",
        "step 2: it broke",
        "The agent exited with code 4.",
    ]


def test_show_stderr_with_json_passes_the_agents_stderr_through_and_stdout_stays_ndjson(tmp_path):
    profile = agent_profile(tmp_path, "import sys; sys.stderr.write('to stderr\\n'); print('body')")
    done = cli("run", str(profile), "x", "--json", "--show-stderr")
    assert (done.returncode, done.stderr) == (0, "to stderr\n")
    assert ndjson(done.stdout)[-1]["reply"] == "body"


# --------------------------------------------------------------------------- what a person sees: said once, on its own line


def test_a_spawn_failure_is_said_once_and_the_log_record_only_when_asked_for(tmp_path):
    missing = write_profile(tmp_path, "command: no-such-agent-program-xyz\n", "missing.yaml")
    plain, louder, as_json = cli_at_once(
        ("run", str(missing), "x"),
        ("run", str(missing), "x", "--log-level", "info"),
        ("run", str(missing), "x", "--json"),
    )
    assert plain.returncode == louder.returncode == as_json.returncode == 127
    assert plain.stderr == "The agent could not be started: command 'no-such-agent-program-xyz' not found on PATH.\n"
    assert "agent could not be started" in louder.stderr  # the record too, at a higher verbosity
    assert "agent could not be started" in as_json.stderr  # and for programs, which read the log


def terminal_env() -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if not name.startswith("AGENT_")}
    return {**environ, "TERM": "dumb", "NO_COLOR": ""}


def test_on_a_terminal_a_log_record_starts_on_a_line_of_its_own_never_inside_a_partial():
    terminal = Terminal(
        "run", str(PROFILES / "hang.yaml"), "x", "--timeout", "0.5", "--log-level", "info", env=terminal_env()
    )
    try:
        assert terminal.exit_code() == 124
    finally:
        terminal.close()
    lines = screen_lines(terminal.output)
    assert "working on it… " in lines  # the partial's line ends before anything else is written
    record = next(line for line in lines if "turn timed out" in line)
    assert record.startswith("20") and "[warning" in record, lines  # a whole record: timestamp first
    assert lines.count("The agent timed out after 0.5 s.") == 1


def test_on_a_terminal_a_timeout_is_said_once():
    terminal = Terminal("run", str(PROFILES / "hang.yaml"), "x", "--timeout", "0.5", env=terminal_env())
    try:
        assert terminal.exit_code() == 124
    finally:
        terminal.close()
    shown = terminal.output.decode()
    assert "The agent timed out after 0.5 s." in shown and "turn timed out" not in shown


# --------------------------------------------------------------------------- what a person sees: a silent agent is not hung


def silent_agent(tmp_path: Path) -> tuple[Path, Path]:
    """A profile whose agent says nothing until the test writes to the FIFO it returns."""
    go = tmp_path / "go"
    os.mkfifo(go)
    return agent_profile(
        tmp_path,
        """
        import sys
        open(sys.argv[1]).read()
        print("done thinking")
    """,
        args=[str(go)],
        timeout_secs=20,
    ), go


def test_run_on_a_terminal_shows_the_elapsed_time_while_the_agent_is_silent_then_erases_it(tmp_path):
    profile, go = silent_agent(tmp_path)
    terminal = Terminal("run", str(profile), "think", env=terminal_env())
    try:
        terminal.expect(re.compile(rb"\r[|/\\-] \d+\.\d s"))
        with open(go, "w"):
            pass
        assert terminal.exit_code() == 0
    finally:
        terminal.close()
    assert re.search(rb"\r +\rdone thinking\r\n$", terminal.output), terminal.output  # erased before the reply
    assert screen_lines(terminal.output)[-2:] == ["done thinking", ""]


@pytest.mark.parametrize("terminal_stream", ["stdout", "stderr"])
def test_run_shows_no_elapsed_time_unless_both_stdout_and_stderr_are_terminals(tmp_path, terminal_stream):
    profile = agent_profile(tmp_path, "import time; time.sleep(0.8); print('done')")  # well past the 0.25 s delay
    controller, tty = pty.openpty()
    try:
        streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, terminal_stream: tty}
        done = subprocess.run(
            [AGENT_BRIDGE, "run", str(profile), "x"],
            stdin=subprocess.DEVNULL,
            timeout=60,
            env=terminal_env(),
            **streams,
        )
        os.close(tty)
        on_terminal = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:
                break
            if not chunk:
                break
            on_terminal += chunk
    finally:
        os.close(controller)
    assert done.returncode == 0
    shown = on_terminal + (done.stdout or b"") + (done.stderr or b"")
    assert shown.replace(b"\r\n", b"\n") == b"done\n"


# --------------------------------------------------------------------------- what a person sees: help, options, colour


def test_a_message_that_starts_with_a_dash_goes_after_double_dash_and_the_error_says_so():
    echo = str(PROFILES / "echo.yaml")
    after, refused, helped = cli_at_once(("run", echo, "--", "-la"), ("run", echo, "-la"), ("run", "--help"))
    assert (after.returncode, after.stdout) == (0, "echo: -la\n")
    assert refused.returncode == 2
    assert (
        "unrecognized arguments: -la; a message that starts with '-' goes last, after --: "
        "agent-bridge run PROFILE [OPTIONS] -- -la"
    ) in refused.stderr
    assert "agent-bridge run PROFILE -- -la" in helped.stdout


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
def test_help_ends_with_examples_and_the_exit_codes(command):
    done = cli(command, "--help")
    assert done.returncode == 0
    examples = done.stdout.split("\nexamples:\n", 1)[1]
    commands, codes = examples.split("\nexit codes:\n")
    assert commands.count(f"agent-bridge {command} ") >= 2
    assert "  0 " in codes and "  2 " in codes and done.stdout.endswith("\n")


def test_the_examples_in_run_help_run(tmp_path):
    """Help that teaches must not teach what fails: each example of `run --help` runs from the repository."""
    help_text = cli("run", "--help").stdout
    examples = help_text.split("\nexamples:\n", 1)[1].split("\nexit codes:\n")[0]
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "PATH": f"{Path(AGENT_BRIDGE).parent}:{os.environ['PATH']}",
    }
    for example in examples.strip().splitlines():
        done = subprocess.run(
            ["sh", "-c", example.strip()],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (done.returncode, done.stderr) == (0, ""), example
        assert done.stdout, example


def test_session_ids_the_protocol_forbids_are_refused_with_the_rule():
    echo = str(PROFILES / "echo.yaml")
    spaced, chatting, empty = cli_at_once(
        ("run", echo, "--session-id", "a b", "hi"),
        ("chat", echo, "--session-id", "x" * 513),
        ("run", echo, "--session-id", "", "hi"),
    )
    for done in (spaced, chatting):
        assert (done.returncode, done.stdout) == (2, "")
        assert "without whitespace or control characters" in done.stderr and "512" in done.stderr
    assert "'a b' is not a session id: it contains whitespace" in spaced.stderr
    assert (empty.returncode, empty.stdout) == (0, "echo: hi\n")  # "": a new session, as the protocol says


@pytest.mark.parametrize(
    "args", [("run", str(PROFILES / "fail.yaml"), "x"), ("check", "unguarded.yaml"), ("run", "--no-such-option")]
)
def test_errors_and_warnings_are_in_colour_on_a_terminal_unless_no_color_is_set(tmp_path, args):
    unguarded = write_profile(tmp_path, "command: ls -1 {{MESSAGE}}\n", "unguarded.yaml")
    args = tuple(str(unguarded) if arg == "unguarded.yaml" else arg for arg in args)

    def stderr_on_a_terminal(args: tuple[str, ...], **env: str) -> bytes:
        controller, tty = pty.openpty()
        try:
            subprocess.run(
                [AGENT_BRIDGE, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=tty,
                timeout=60,
                env={**terminal_env(), "TERM": "xterm", **env},
            )
            os.close(tty)
            shown = b""
            while True:
                try:
                    chunk = os.read(controller, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                shown += chunk
        finally:
            os.close(controller)
        return shown

    coloured = stderr_on_a_terminal(args)
    assert b"\x1b[31m" in coloured or b"\x1b[33m" in coloured, args
    assert b"\x1b[" not in stderr_on_a_terminal(args, NO_COLOR="1"), args
    assert "\x1b[" not in cli(*args).stderr, args  # not a terminal


def test_check_names_what_a_warm_cli_protocol_cannot_work_without(tmp_path):
    claude = write_profile(
        tmp_path, "command: [claude, -p, --output-format, stream-json]\nprotocol: claude-sdk\n", "c.yaml"
    )
    codex = write_profile(
        tmp_path, "command: [codex, app-server, --listen, 'ws://127.0.0.1:1']\nprotocol: codex-app-server\n", "x.yaml"
    )
    done = cli("check", str(claude), str(codex))
    assert done.returncode == 0, done.stderr
    for missing in (
        "--input-format stream-json",
        "--verbose",
        "--permission-prompt-tool stdio",
        "--replay-user-messages",
    ):
        assert f"c.yaml: warning: the command lacks `{missing}`" in done.stderr
    assert "--output-format stream-json" not in done.stderr  # it is there
    assert "x.yaml: warning: --listen ws://127.0.0.1:1: the bridge speaks to codex over stdio" in done.stderr
    shipped = cli("check", str(CLI_PROFILES / "claude-sdk.yaml"), str(CLI_PROFILES / "codex-app-server.yaml"))
    assert "lacks" not in shipped.stderr and "--listen" not in shipped.stderr


def test_check_warns_that_the_protocols_agent_variables_cannot_be_set_in_env(tmp_path):
    profile = write_profile(
        tmp_path,
        """
        command: echo
        env:
          AGENT_MESSAGE: overridden?
          AGENT_OWN_SETTING: fine
    """,
        "env.yaml",
    )
    done = cli("check", str(profile))
    assert (done.returncode, done.stdout) == (0, f"{profile}: ok\n")
    assert done.stderr.splitlines() == [
        f"{profile}: warning: env.AGENT_MESSAGE is ignored: the bridge sets AGENT_MESSAGE for every turn (the "
        "protocol's AGENT_* variables always describe the turn); give your variable another name"
    ]


# --------------------------------------------------------------------------- init


@pytest.mark.parametrize("lang", ["sh", "python"])
def test_init_writes_a_starter_agent_that_check_accepts_and_run_answers(tmp_path, lang):
    made = cli("init", "my-agent", "--lang", lang, "--dir", str(tmp_path / "agents"))
    agent = tmp_path / "agents" / f"my-agent.{'py' if lang == 'python' else 'sh'}"
    profile = tmp_path / "agents" / "my-agent.yaml"
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[:2] == [f"wrote {agent}", f"wrote {profile}"]
    assert os.access(agent, os.X_OK)
    for part in ("AGENT_MESSAGE", "AGENT_SESSION_ID", "AGENT_SESSION:", "AGENT_PARTIAL:", "AGENT_ERROR:", "Exit 0"):
        assert part in agent.read_text(), f"the starter explains {part}"

    checked, first, empty = cli_at_once(
        ("check", str(profile)), ("run", str(profile), "--json", "hello"), ("run", str(profile), "")
    )
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, f"{profile}: ok\n", "")
    events = ndjson(first.stdout)
    assert [event["event"] for event in events] == ["session", "partial", "result"]
    result = events[-1]
    assert (result["exit_code"], result["reply"]) == (0, "you said: hello (turn 1 of this conversation)")
    again = cli("run", str(profile), "--session-id", result["session_id"], "again")
    assert again.returncode == 0 and "(turn 2 of this conversation)" in again.stdout  # the session came back
    assert (empty.returncode, empty.stderr) == (1, "Say something, and I will answer.\n")


def test_init_never_overwrites_and_refuses_a_bad_name(tmp_path):
    (tmp_path / "taken.yaml").write_text("mine\n")
    taken, bad, fine = cli_at_once(
        ("init", "taken", "--dir", str(tmp_path)),
        ("init", "../up", "--dir", str(tmp_path)),
        ("init", "here.yaml", "--dir", str(tmp_path)),
    )
    assert taken.returncode == 2 and "already exists; init never overwrites" in taken.stderr
    assert (tmp_path / "taken.yaml").read_text() == "mine\n" and not (tmp_path / "taken.sh").exists()
    assert bad.returncode == 2 and "cannot name an agent" in bad.stderr
    assert fine.returncode == 0 and (tmp_path / "here.yaml").exists() and (tmp_path / "here.sh").exists()


def test_a_command_line_that_starts_with_its_command_gets_the_same_parser_alone():
    from bridge.cli.main import COMMANDS, build_parser

    def subparsers(parser: Any) -> Any:
        return next(action for action in parser._actions if action.dest == "command")

    whole = build_parser()
    assert tuple(subparsers(whole).choices) == COMMANDS
    for command in COMMANDS:
        alone = build_parser(command)
        assert tuple(subparsers(alone).choices) == (command,)
        assert alone.format_usage() == whole.format_usage()
        assert subparsers(alone).choices[command].format_help() == subparsers(whole).choices[command].format_help()
    run = cli("run", str(PROFILES / "echo.yaml"), "--bogus")
    assert run.returncode == 2 and run.stderr.startswith("usage: agent-bridge run ") and "--bogus" in run.stderr
    listing = cli("--help")
    assert listing.returncode == 0 and all(command in listing.stdout for command in COMMANDS)
