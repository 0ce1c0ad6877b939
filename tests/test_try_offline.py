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

from conftest import REPO

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
