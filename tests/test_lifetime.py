"""No agent outlives its bridge, and nothing an agent leaves behind outlives its turn (issue 7, items 2 and 3).

A bridge killed with SIGKILL runs no cleanup of its own: the keeper (a small
sh process in a session of its own) sees the bridge's pipe close and stops
every agent group the bridge was running — SIGTERM, then SIGKILL after the
profile's grace. A bridge that is a child subreaper (the CLI, serve) kills and
reaps every process it is handed that is not a live agent's.

Agents here record their pids (and their children's) in a file, and print a
partial once they run, so a test kills the bridge at a known moment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    PYTHON,
    assert_no_live_process,
    process_state,
    read_pids,
    without_cgroups,
    write_agent,
    write_profile,
)

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")

# Runs until killed. Its child ignores SIGTERM; the agent ends on SIGTERM, killing the child, unless
# STUBBORN=1, when it only notes the SIGTERM and runs on until SIGKILL.
HANGING_AGENT = """#!/bin/sh
echo $$ >> "$PID_FILE"
if [ "$STUBBORN" = 1 ]; then
    trap 'echo term >> "$PID_FILE.signals"' TERM
else
    trap 'echo term >> "$PID_FILE.signals"; kill -9 $child; exit 143' TERM
fi
(trap '' TERM; exec sleep 600) &
child=$!
echo $child >> "$PID_FILE"
echo 'AGENT_PARTIAL:"ready"'
while kill -0 $child 2>/dev/null; do wait $child; done
"""

# Leaves processes behind, none holding a pipe of ours: one that escaped the group and the session
# (setsid), one orphaned inside the group by an intermediate that exits at once, and one that both
# escaped and was orphaned. Pids in that order.
ESCAPING_AGENT = f"""#!{PYTHON}
import os

def record(pid):
    with open(os.environ["PID_FILE"], "a") as pids:
        pids.write(f"{{pid}}\\n")

def sleeper(escape):
    pid = os.fork()
    if pid == 0:
        if escape:
            os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.execvp("sleep", ["sleep", "600"])
    return pid

def orphan(escape):
    intermediate = os.fork()
    if intermediate == 0:
        record(sleeper(escape))
        os._exit(0)
    os.waitpid(intermediate, 0)

record(sleeper(escape=True))
orphan(escape=False)
orphan(escape=True)
print("left three behind")
"""


def hanging_profile(directory: Path, *, grace: float = 0.5, stubborn: bool = False) -> Path:
    write_agent(directory, "hang.sh", HANGING_AGENT)
    return write_profile(
        directory,
        f"""
        command: ["{{{{PROFILE_DIR}}}}/hang.sh"]
        kill_grace_secs: {grace}
        env:
          PID_FILE: "{directory / "pids"}"
          STUBBORN: "{1 if stubborn else 0}"
    """,
        "hang.yaml",
    )


def escaping_profile(directory: Path) -> Path:
    write_agent(directory, "escape.sh", ESCAPING_AGENT)
    return write_profile(
        directory,
        f"""
        command: ["{{{{PROFILE_DIR}}}}/escape.sh"]
        env:
          PID_FILE: "{directory / "pids"}"
    """,
        "escape.yaml",
    )


def read_json_until(stream, predicate, what: str) -> dict:
    """Read NDJSON lines until one satisfies `predicate` (the bridge's own timeouts bound each test)."""
    while True:
        line = stream.readline()
        assert line, f"the bridge ended before {what}"
        record = json.loads(line)
        if predicate(record):
            return record


def kill_and_time(process: subprocess.Popen, pids: list[int], within: float) -> float:
    """SIGKILL `process`; seconds until every pid in `pids` is gone."""
    started = time.monotonic()
    process.kill()
    process.wait(timeout=5)
    assert_no_live_process(pids, within=within)
    return time.monotonic() - started


def children_of(pid: int) -> set[int]:
    children: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        children.update(int(word) for word in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return children


def keeper_of(pid: int) -> int:
    """The keeper child of `pid`. A process that is still finishing its exec shows an empty command
    line for a moment, so this looks again for up to a second."""
    deadline = time.monotonic() + 1.0
    while True:
        keepers = [
            child for child in children_of(pid) if b"agent-bridge-keeper" in Path(f"/proc/{child}/cmdline").read_bytes()
        ]
        if keepers or time.monotonic() > deadline:
            [keeper] = keepers
            return keeper
        time.sleep(0.01)


# --------------------------------------------------------------------------- a killed bridge


def test_sigkilled_cli_run_takes_its_agent_and_the_agents_group_with_it(tmp_path: Path) -> None:
    profile = hanging_profile(tmp_path)
    run = subprocess.Popen([AGENT_BRIDGE, "run", "--json", str(profile), "hi"], stdout=subprocess.PIPE, text=True)
    try:
        read_json_until(run.stdout, lambda r: r.get("text") == "ready", "the agent ran")
        pids = read_pids(tmp_path / "pids")
        assert len(pids) == 2 and all(process_state(pid) not in (None, "Z") for pid in pids)
        kill_and_time(run, pids, within=3.0)
    finally:
        run.kill()
    assert (tmp_path / "pids.signals").read_text().split() == ["term"]  # stopped gracefully first


def test_an_agent_ignoring_sigterm_is_killed_after_its_grace_when_the_bridge_dies(tmp_path: Path) -> None:
    profile = hanging_profile(tmp_path, grace=0.6, stubborn=True)
    run = subprocess.Popen([AGENT_BRIDGE, "run", "--json", str(profile), "hi"], stdout=subprocess.PIPE, text=True)
    try:
        read_json_until(run.stdout, lambda r: r.get("text") == "ready", "the agent ran")
        pids = read_pids(tmp_path / "pids")
        elapsed = kill_and_time(run, pids, within=4.0)
    finally:
        run.kill()
    assert elapsed >= 0.55  # SIGKILL came only after the grace
    assert "term" in (tmp_path / "pids.signals").read_text()


def test_sigkilled_serve_takes_every_agent_in_flight_with_it(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    hanging_profile(profiles, grace=0.3)
    serve = subprocess.Popen(
        [AGENT_BRIDGE, "serve", "--profiles", str(profiles), "--state", str(tmp_path / "sessions.sqlite3")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for index in range(20):
            serve.stdin.write(
                json.dumps(
                    {"type": "turn", "id": index, "profile": "hang", "conversation": f"c{index}", "message": "hi"}
                )
                + "\n"
            )
        serve.stdin.flush()
        ready: set[int] = set()
        while len(ready) < 20:
            record = read_json_until(serve.stdout, lambda r: r["type"] in ("partial", "result", "error"), "ready")
            assert record["type"] == "partial", record
            ready.add(record["id"])
        pids = read_pids(profiles / "pids")
        assert len(pids) == 40
        kill_and_time(serve, pids, within=4.0)
    finally:
        serve.kill()


HOST_SCRIPT = """
import sys, bridge
from bridge.confinement.keeper import KEEPER
profile = bridge.load_profile(sys.argv[1])
bridge.run_turn_sync(profile, bridge.Turn("first"), on_partial=lambda text: None)
print(KEEPER.pid, flush=True)
sys.stdin.readline()
bridge.run_turn_sync(profile, bridge.Turn("second"), on_partial=lambda text: print(text, flush=True))
"""

QUICK_THEN_HANGING_AGENT = """#!/bin/sh
if [ "$AGENT_MESSAGE" = first ]; then echo done; exit 0; fi
exec "$(dirname "$0")/hang.sh"
"""


def quick_then_hanging_profile(directory: Path) -> Path:
    hanging_profile(directory)
    write_agent(directory, "agent.sh", QUICK_THEN_HANGING_AGENT)
    return write_profile(
        directory,
        f"""
        command: ["{{{{PROFILE_DIR}}}}/agent.sh"]
        kill_grace_secs: 0.3
        env:
          PID_FILE: "{directory / "pids"}"
    """,
    )


def test_a_library_host_is_guarded_too_and_a_killed_keeper_is_replaced(tmp_path: Path) -> None:
    """A Python host (not a subreaper) killed mid-turn; its keeper had been killed before that turn."""
    host = subprocess.Popen(
        [PYTHON, "-c", HOST_SCRIPT, str(quick_then_hanging_profile(tmp_path))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first_keeper = int(host.stdout.readline())
        assert first_keeper == keeper_of(host.pid)
        os.kill(first_keeper, signal.SIGKILL)
        assert_no_live_process([first_keeper])  # dead, not just signalled: its pipe is closed
        host.stdin.write("go\n")
        host.stdin.flush()
        assert host.stdout.readline() == "ready\n"
        second_keeper = keeper_of(host.pid)
        assert second_keeper != first_keeper
        kill_and_time(host, read_pids(tmp_path / "pids"), within=3.0)
    finally:
        host.kill()


def test_the_keeper_leaves_when_the_bridge_ends_normally(tmp_path: Path) -> None:
    host = subprocess.Popen(
        [PYTHON, "-c", HOST_SCRIPT, str(quick_then_hanging_profile(tmp_path))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        keeper = int(host.stdout.readline())
        host.kill()  # between turns: nothing to stop, the keeper just goes
        host.wait(timeout=5)
        assert_no_live_process([keeper], within=2.0)
    finally:
        host.kill()


# --------------------------------------------------------------------------- escapees and zombies


def test_serve_kills_escapees_and_leaves_no_zombie_whatever_agents_do(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    escaping_profile(profiles)
    serve = subprocess.Popen(
        [AGENT_BRIDGE, "serve", "--profiles", str(profiles), "--state", str(tmp_path / "sessions.sqlite3")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        turns = 25
        for index in range(turns):
            serve.stdin.write(
                json.dumps(
                    {"type": "turn", "id": index, "profile": "escape", "conversation": f"c{index % 5}", "message": "hi"}
                )
                + "\n"
            )
        serve.stdin.flush()
        for _ in range(turns):
            result = read_json_until(serve.stdout, lambda r: r["type"] in ("result", "error"), "every result")
            assert result["type"] == "result" and result["reply"] == "left three behind", result
        pids = read_pids(profiles / "pids")
        assert len(pids) == 3 * turns
        assert_no_live_process(pids, within=3.0)
        keeper = keeper_of(serve.pid)
        deadline = time.monotonic() + 3.0
        while (left := children_of(serve.pid) - {keeper}) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not left, {pid: process_state(pid) for pid in left}  # no zombie, nothing alive
        serve.stdin.close()
        assert serve.wait(timeout=10) == 0
    finally:
        serve.kill()


def test_cli_run_kills_what_its_agent_left_behind(tmp_path: Path) -> None:
    done = subprocess.run(
        [AGENT_BRIDGE, "run", str(escaping_profile(tmp_path)), "hi"], capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout) == (0, "left three behind\n")
    pids = read_pids(tmp_path / "pids")
    assert len(pids) == 3
    assert_no_live_process(pids, within=2.0)


LIBRARY_HOST = """
import json, subprocess, sys, bridge, bridge.confinement.orphans
if sys.argv[2] == "subreaper":
    assert bridge.confinement.orphans.become_subreaper()
own = subprocess.Popen(["sleep", "600"])                             # the host's own child, in its session
apart = subprocess.Popen(["sleep", "600"], start_new_session=True)  # the host's own, in a session apart
result = bridge.run_turn_sync(bridge.load_profile(sys.argv[1]), bridge.Turn("hi"))
print(json.dumps({"reply": result.reply, "own": own.pid, "apart": apart.pid,
                  "own_alive": own.poll() is None, "apart_alive": apart.poll() is None}), flush=True)
own.kill(); apart.kill()
"""


@pytest.mark.parametrize("kind", ["subreaper", "plain", "plain, without cgroups"])
def test_what_a_library_host_gets(tmp_path: Path, kind: str) -> None:
    """A host that called become_subreaper(): escapees are killed, its own children in its session are not
    (one in a session of its own counts as an orphan). A plain host: escapees are killed with the agent's cgroup;
    where it cannot have cgroups, they run on, adopted elsewhere."""
    argv = [PYTHON, "-c", LIBRARY_HOST, str(escaping_profile(tmp_path)), kind.split(",")[0]]
    done = subprocess.run(
        without_cgroups(argv) if "without cgroups" in kind else argv, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["reply"] == "left three behind" and report["own_alive"]
    escaped, in_group, escaped_orphan = read_pids(tmp_path / "pids")
    escapees = [escaped, escaped_orphan]
    assert_no_live_process([in_group])  # killed with the agent's group either way
    try:
        if kind == "subreaper":
            assert not report["apart_alive"]
            assert_no_live_process(escapees)
        elif kind == "plain":
            assert report["apart_alive"]  # the host's own child in a session apart is not an agent's
            assert_no_live_process(escapees)
        else:
            assert report["apart_alive"]
            assert all(process_state(pid) not in (None, "Z", "X") for pid in escapees)
    finally:
        for pid in escapees:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_keepers_registry_holds_exactly_the_guarded_groups_and_reuses_freed_slots() -> None:
    from bridge.confinement.keeper import Keeper

    keeper = Keeper()
    keeper.guard(101, 5.0)
    keeper.guard(202, 0.25)
    keeper.guard(303, 0)
    keeper.release(202)
    keeper.guard(404, 1.5)  # takes the slot 202 freed
    keeper.release(999)  # not guarded: nothing happens
    keeper.contain("/sys/fs/cgroup/agent-bridge-1-abc")
    registry = keeper.registry()
    header, slots = registry[:4096], registry[4096:].decode().splitlines()
    assert header == b"/sys/fs/cgroup/agent-bridge-1-abc" + b"\n" * (4096 - 33)
    assert [line.split() for line in slots] == [["101", "5000"], ["404", "1500"], ["303", "0"]]
    assert all(len(line) == 31 for line in slots)
    assert keeper.pid is None  # guarding needs no keeper process yet: the next start() guards them all
