"""The one-command tries of the first hour (issue 35, section 3): `make fleet-db`'s throwaway PostgreSQL, and
`make try-claude` / `make try-codex`'s chat with a real coding CLI against a fake model server, run as a user
runs them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from agents_cache import CACHE, npm_binary
from conftest import PYTHON, REPO
from terminal import Terminal

WAIT_SECS = 30


def test_make_fleet_db_runs_the_script_that_is_tested_here() -> None:
    planned = subprocess.run(["make", "-n", "fleet-db"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert planned.returncode == 0, planned.stderr
    assert f"{Path('.venv/bin/python')} tools/fleet_db.py" in planned.stdout


def test_fleet_db_prints_a_dsn_that_connects_and_stops_on_ctrl_c_leaving_nothing() -> None:
    import psycopg

    process = subprocess.Popen(
        [sys.executable, str(REPO / "tools" / "fleet_db.py")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        said = []
        for line in process.stdout:  # a server that cannot start ends the output: the loop ends, the test fails
            said.append(line)
            if line.startswith("Ctrl-C stops"):
                break
        text = "".join(said)
        dsn = re.search(r"^DSN: (\S+)$", text, re.MULTILINE)
        data = re.search(r"its data in (\S+),", text)
        assert dsn and data, text
        assert f"agent-bridge worker --postgres {dsn[1]} --profiles " in text
        assert f"agent-bridge serve --postgres {dsn[1]} --name mybot" in text
        with psycopg.connect(dsn[1], connect_timeout=5) as connection:
            assert connection.execute("select 1").fetchone() == (1,)
        postmaster = int((Path(data[1]) / "data" / "postmaster.pid").read_text().split()[0])
        process.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert process.wait(WAIT_SECS) == 0
        assert process.stdout.read().strip() == "fleet-db: stopped; its data is removed"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not Path(data[1]).exists()
    try:
        os.kill(postmaster, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"the server (pid {postmaster}) still runs")


def test_make_try_claude_and_try_codex_run_the_script_tested_here() -> None:
    planned = subprocess.run(
        ["make", "-n", "try-claude", "try-codex"], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert planned.returncode == 0, planned.stderr
    assert "tools/try_cli.py claude" in planned.stdout and "tools/try_cli.py codex" in planned.stdout


def try_cli(cli: str) -> Terminal:
    """`make try-CLI`'s command in a terminal, as a person runs it; its instructions read up to the first prompt."""
    npm_binary(cli)
    return Terminal(str(REPO / "tools" / "try_cli.py"), cli, env={**os.environ, "TERM": "xterm"}, program=PYTHON)


def left_behind(cli: str) -> list[Path]:
    return sorted(CACHE.glob(f"try-{cli}-*"))


def test_try_claude_shows_an_approval_and_a_question_for_the_words_it_suggests() -> None:
    before = left_behind("claude")
    terminal = try_cli("claude")
    try:
        words = terminal.expect(b"you> ").decode()
        assert "  run touch hello.txt " in words and "  ask colour " in words
        terminal.send(b"run touch hello.txt\n")
        terminal.expect(b"the agent asks to run Bash: touch hello.txt. Allow? [y]es / [a]lways / [N]o")
        terminal.send(b"y\n")
        terminal.expect(b"The tool said: (Bash completed with no output)")
        terminal.expect(b"you> ")
        terminal.send(b"ask colour\n")
        asked = terminal.expect(b"an empty line declines): ").decode()
        assert "Which colour?" in asked and "1. Red" in asked and "2. Blue" in asked
        terminal.send(b"2\n")
        terminal.expect(b'"Which colour?"="Blue"')
        terminal.expect(b"you> ")
        terminal.send(b"\x04")
        assert terminal.exit_code() == 0
    finally:
        terminal.close()
    assert left_behind("claude") == before  # its home, working directory and sessions are removed


def test_try_codex_shows_an_approval_and_a_question_for_the_words_it_suggests() -> None:
    before = left_behind("codex")
    terminal = try_cli("codex")
    try:
        words = terminal.expect(b"you> ").decode()
        assert "  escalate touch hello.txt " in words and "  ask colour Which colour?|Red|Blue\r\n" in words
        terminal.send(b"escalate touch hello.txt\n")
        terminal.expect(b"the agent asks to run command_execution: touch hello.txt. Allow? [y]es / [a]lways / [N]o")
        terminal.send(b"y\n")
        terminal.expect(b"you> ")
        terminal.send(b"ask colour Which colour?|Red|Blue\n")
        asked = terminal.expect(b"an empty line declines): ").decode()
        assert "Which colour?" in asked and "1. Red" in asked and "2. Blue" in asked
        terminal.send(b"2\n")
        terminal.expect(b'answered: {"answers":{"colour":{"answers":["Blue"]}}}')
        terminal.expect(b"you> ")
        terminal.send(b"run ls\n")  # codex's own sandbox runs it: the approved command made the file
        terminal.expect(b"ran: hello.txt")
        terminal.expect(b"you> ")
        terminal.send(b"\x04")
        assert terminal.exit_code() == 0
    finally:
        terminal.close()
    assert left_behind("codex") == before
