"""Agents in cgroups of their own (issue 19, item 4): what leaves an agent's group still ends with it.

An agent here starts a child that leaves its process group and session
(`setsid`) and records its pid, then runs on. A signal to the agent's group
cannot reach that child; the agent's cgroup can. So:

- a bridge killed with SIGKILL (serve, a worker, a warm agent's host) leaves
  nothing: its keeper kills the bridge's whole cgroup directory;
- the end of a turn or of a warm agent kills what its agent left, even in a
  host that is not a subreaper;
- where the bridge cannot make cgroups (here: a mount namespace without a
  cgroup v2 file system), it says so and behaves as before — the escapee
  outlives a killed bridge, which is what the other cases rule out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from conftest import (
    PROFILES,
    PYTHON,
    SAMPLE_AGENTS,
    assert_no_live_process,
    process_state,
    read_pids,
    without_cgroups,
    write_agent,
    write_profile,
)
from fleetkit import Fleet, eventually, turn
from hostkit import Lab
from test_lifetime import keeper_of, read_json_until

import bridge
from bridge.confinement.cgroups import (
    CONTAINMENT,
    LEFTOVER_AFTER_SECS,
    AgentCgroup,
    cgroup2_mount,
    directory_owner,
    own_cgroup,
)
from bridge.confinement.orphans import collect_orphans

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
CONTAINED = CONTAINMENT.status()
needs_cgroups = pytest.mark.skipif(
    not CONTAINED.available, reason=f"this machine cannot give agents cgroups: {CONTAINED.reason}"
)

# Leaves a sleeper in a session of its own (the background job is not a group leader, so `setsid` needs no
# fork and $! is the sleeper), records its pid and its own (one line, one write), says it is ready, and runs
# until killed.
ESCAPING_AGENT = """#!/bin/sh
setsid sleep 600 < /dev/null > /dev/null 2>&1 &
echo "$! $$" >> "$PID_FILE"
echo 'AGENT_PARTIAL:"ready"'
exec sleep 600
"""

# The official SDK's ACP agent, after leaving such a sleeper behind.
ESCAPING_ACP_AGENT = f"""#!/bin/sh
setsid sleep 600 < /dev/null > /dev/null 2>&1 &
echo $! >> "$PID_FILE"
exec {PYTHON} {SAMPLE_AGENTS / "acp_agent.py"} --store "$STORE"
"""


def escaping_profile(directory: Path, name: str = "escape", timeout_secs: float = 60) -> Path:
    write_agent(directory, f"{name}.sh", ESCAPING_AGENT)
    return write_profile(
        directory,
        f"""
        command: ["{{{{PROFILE_DIR}}}}/{name}.sh"]
        kill_grace_secs: 0.3
        timeout_secs: {timeout_secs}
        env:
          PID_FILE: "{directory / "pids"}"
    """,
        f"{name}.yaml",
    )


def escaping_acp_profile(directory: Path) -> Path:
    write_agent(directory, "escape-acp.sh", ESCAPING_ACP_AGENT)
    return write_profile(
        directory,
        f"""
        command: ["{{{{PROFILE_DIR}}}}/escape-acp.sh"]
        protocol: acp
        kill_grace_secs: 0.3
        env:
          PID_FILE: "{directory / "pids"}"
          STORE: "{directory / "sessions"}"
    """,
        "escape-acp.yaml",
    )


def escaped(pids: list[int]) -> bool:
    """Each of `pids` runs in a session of its own (once `setsid` got there): no signal to its agent's group
    reaches it."""
    return bool(eventually(lambda: all(os.getsid(pid) == pid for pid in pids), "the escapes", within=5.0))


def serve_turns(
    tmp_path: Path, profile: str, count: int, message: str, *, cgroups: bool = True
) -> subprocess.Popen[str]:
    """`serve` on `tmp_path/profiles`, sent `count` turns of `profile`, one conversation each."""
    argv = [
        AGENT_BRIDGE,
        "serve",
        "--profiles",
        str(tmp_path / "profiles"),
        "--state",
        str(tmp_path / "sessions.sqlite3"),
    ]
    serve = subprocess.Popen(
        argv if cgroups else without_cgroups(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    for index in range(count):
        serve.stdin.write(
            json.dumps(
                {"type": "turn", "id": index, "profile": profile, "conversation": f"c{index}", "message": message}
            )
            + "\n"
        )
    serve.stdin.flush()
    return serve


@pytest.fixture
def strays() -> Iterator[list[int]]:
    """Pids a test may leave running on purpose (the uncontained cases): killed at the end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --------------------------------------------------------------------------- a bridge killed with SIGKILL


@needs_cgroups
@pytest.mark.parametrize("cgroups", [True, False], ids=["contained", "without cgroups"])
def test_a_sigkilled_serve_leaves_nothing_its_agents_started(tmp_path: Path, cgroups: bool, strays: list[int]) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    escaping_profile(profiles)
    serve = serve_turns(tmp_path, "escape", 5, "hi", cgroups=cgroups)
    try:
        for _ in range(5):
            record = read_json_until(serve.stdout, lambda r: r["type"] in ("partial", "result", "error"), "ready")
            assert record["type"] == "partial", record
        pids = read_pids(profiles / "pids")
        escapees = pids[0::2]
        strays.extend(escapees)
        assert len(pids) == 10 and escaped(escapees)
        serve.kill()
        serve.wait(timeout=5)
        if cgroups:
            assert_no_live_process(pids, within=4.0)
        else:  # the agents' groups are killed; what left them runs on
            assert_no_live_process(pids[1::2], within=4.0)
            assert all(process_state(pid) not in (None, "Z", "X") for pid in escapees)
    finally:
        serve.kill()


@needs_cgroups
def test_a_sigkilled_serve_leaves_nothing_its_warm_agents_started(tmp_path: Path) -> None:
    """A warm agent lives between turns, and so would what it left behind."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    escaping_acp_profile(profiles)
    serve = serve_turns(tmp_path, "escape-acp", 3, "hello")
    try:
        for _ in range(3):
            record = read_json_until(serve.stdout, lambda r: r["type"] in ("result", "error"), "the results")
            assert record["type"] == "result" and record["reply"] == "echo: hello", record
        escapees = read_pids(profiles / "pids")
        assert len(escapees) == 3 and escaped(escapees)
        assert all(process_state(pid) not in (None, "Z", "X") for pid in escapees)  # warm: alive between turns
        serve.kill()
        serve.wait(timeout=5)
        assert_no_live_process(escapees, within=4.0)
    finally:
        serve.kill()


@needs_cgroups
def test_a_sigkilled_worker_leaves_nothing_its_agents_started(tmp_path: Path, pg_dsn: str) -> None:
    lab = Lab(tmp_path)
    escaping_profile(lab.profiles)
    fleet = Fleet(lab, pg_dsn)
    try:
        worker = fleet.worker()
        gateway = fleet.gateway()
        gateway.send(turn("a", "hi", profile="escape"))
        gateway.until("partial", "a")
        escapee, agent = read_pids(lab.profiles / "pids")
        assert escaped([escapee])
        worker.kill()
        worker.wait(timeout=5)
        assert_no_live_process([agent, escapee], within=4.0)
    finally:
        fleet.stop()


# --------------------------------------------------------------------------- the end of a turn, of a warm agent


@needs_cgroups
async def test_the_end_of_a_warm_agent_ends_what_it_left_behind_in_a_plain_host(tmp_path: Path) -> None:
    """This test's process is not a subreaper: only the agent's cgroup reaches the escapee."""
    profile = bridge.load_profile(escaping_acp_profile(tmp_path))
    with trio.fail_after(30):
        result = await bridge.run_turn(profile, bridge.Turn("hello"))
    assert result.reply == "echo: hello"
    [escapee] = read_pids(tmp_path / "pids")
    assert_no_live_process([escapee])


@needs_cgroups
def test_no_cgroup_is_left_behind(tmp_path: Path) -> None:
    host = subprocess.Popen(
        [
            PYTHON,
            "-c",
            """
import sys, bridge
from bridge.confinement.cgroups import CONTAINMENT
profile = bridge.load_profile(sys.argv[1])
for _ in range(3):
    bridge.run_turn_sync(profile, bridge.Turn("hi"))
print(CONTAINMENT.directory, flush=True)
sys.stdin.readline()
""",
            str(escaping_profile(tmp_path, timeout_secs=0.2)),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        directory = Path(host.stdout.readline().strip())
        assert directory.parent == Path(CONTAINED.where) and directory.name.startswith(f"agent-bridge-{host.pid}-")
        eventually(
            lambda: not [path for path in directory.iterdir() if path.is_dir()],
            "the agents' cgroups to be removed",
            within=3.0,
        )
        assert_no_live_process(read_pids(tmp_path / "pids"))
        host.stdin.close()
        assert host.wait(timeout=5) == 0
        eventually(lambda: not directory.exists(), "the keeper to remove the host's directory", within=3.0)
    finally:
        host.kill()


@needs_cgroups
def test_a_bridge_stopped_with_its_keeper_by_one_sigterm_leaves_no_cgroup(tmp_path: Path) -> None:
    """A supervisor that stops a whole process tree (acpx closing its agent, systemd stopping a service) sends
    SIGTERM to the keeper too: it must outlive the bridge to remove the bridge's cgroup directory."""
    (tmp_path / "profiles").mkdir()
    escaping_profile(tmp_path / "profiles", timeout_secs=0.5)  # serve lets the turn in flight end: soon
    serve = serve_turns(tmp_path, "escape", 1, "hi")
    try:
        read_json_until(serve.stdout, lambda record: record["type"] == "partial", "the agent ran")
        [directory] = Path(CONTAINED.where).glob(f"agent-bridge-{serve.pid}-*")
        keeper = keeper_of(serve.pid)
        for pid in (serve.pid, keeper):
            os.kill(pid, signal.SIGTERM)
        serve.wait(timeout=10)
        eventually(lambda: not directory.exists(), "the keeper to remove the bridge's directory", within=3.0)
        assert_no_live_process([keeper, *read_pids(tmp_path / "profiles" / "pids")])
    finally:
        serve.kill()


# A subreaper that adopts the orphans of the bridge it starts, SIGKILLs the bridge, and reaps the bridge's agent only
# at its end, as a slow init would: meanwhile the agent, killed by the keeper, is a zombie. Prints how long the
# bridge's directory stayed after the bridge died.
SLOW_REAPER = """
import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
bridge_argv, pid_file, where = sys.argv[1:4]
bridge = subprocess.Popen(json.loads(bridge_argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
deadline = time.monotonic() + 10
while not open(pid_file).read().strip():  # the agent runs once it wrote its pid
    assert time.monotonic() < deadline, "the agent did not start"
    time.sleep(0.01)
[agent] = [int(pid) for pid in open(pid_file).read().split()]
[directory] = [name for name in os.listdir(where) if name.startswith(f"agent-bridge-{bridge.pid}-")]
os.kill(bridge.pid, signal.SIGKILL)
bridge.wait()
died = time.monotonic()
while os.path.isdir(os.path.join(where, directory)) and time.monotonic() - died < 10:
    time.sleep(0.01)
stayed = time.monotonic() - died
zombie = open(f"/proc/{agent}/stat").read().rpartition(") ")[2].split()[0] == "Z"
os.waitpid(agent, 0)
print(json.dumps({"stayed": stayed, "zombie_meanwhile": zombie}), flush=True)
"""


@needs_cgroups
def test_a_killed_bridges_keeper_does_not_wait_out_the_grace_for_an_agent_that_is_only_a_zombie(tmp_path: Path) -> None:
    """An agent killed after its bridge died is a zombie until an init or subreaper reaps it; the keeper took it
    for alive (`kill -0`) and waited out its whole grace. acpx, which SIGKILLs whatever of its agent's process tree
    still runs 1.5 s after its SIGTERM, then killed the keeper in that wait, and the directory stayed."""
    (tmp_path / "pids").touch()
    agent = write_agent(tmp_path, "agent.sh", '#!/bin/sh\necho $$ > "$PID_FILE"\nexec sleep 60\n')
    profile = write_profile(
        tmp_path, f"command: ['{agent}']\nkill_grace_secs: 5\nenv: {{PID_FILE: '{tmp_path / 'pids'}'}}\n"
    )
    argv = json.dumps([AGENT_BRIDGE, "run", str(profile), "hi"])
    done = subprocess.run(
        [PYTHON, "-c", SLOW_REAPER, argv, str(tmp_path / "pids"), CONTAINED.where],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["zombie_meanwhile"], said  # else this test shows nothing here
    assert said["stayed"] < 2.5, said  # not the agent's 5 s of grace


def leftover(pid: int, suffix: str, *, made_secs_ago: float, groups: tuple[str, ...] = ()) -> Path:
    """A bridge's directory of agent cgroups as one killed together with its keeper leaves it (the test removes it)."""
    directory = Path(CONTAINED.where) / f"agent-bridge-{pid}-{suffix}"
    directory.mkdir()
    for group in groups:
        (directory / group).mkdir()
    made = time.time() - made_secs_ago
    os.utime(directory, (made, made))
    return directory


def remove_cgroup_tree(directory: Path) -> None:
    for group in directory.iterdir():
        if group.is_dir():
            group.rmdir()
    directory.rmdir()


@needs_cgroups
def test_a_bridge_removes_leftovers_of_dead_bridges_beside_its_own_at_its_first_agent(tmp_path: Path) -> None:
    """`kill -9` of a bridge and its keeper together leaves the bridge's directory: the next bridge to start an
    agent there removes it — never the directory of a live process, one made lately, or a group still in use."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "600"])
    long_ago = LEFTOVER_AFTER_SECS + 60
    stale = leftover(dead.pid, "0aa0aa", made_secs_ago=long_ago, groups=("1", "bridge"))
    kept = [
        leftover(alive.pid, "0bb0bb", made_secs_ago=long_ago, groups=("1",)),
        leftover(dead.pid, "0cc0cc", made_secs_ago=5, groups=("1",)),
        leftover(dead.pid, "0dd0dd", made_secs_ago=long_ago, groups=("1",)),
    ]
    in_use = kept[2] / "1"
    busy = subprocess.Popen(["sleep", "600"])
    (in_use / "cgroup.procs").write_text(str(busy.pid))
    try:
        done = subprocess.run([AGENT_BRIDGE, "run", str(PROFILES / "echo.yaml"), "hi"], capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert not stale.exists()
        assert all(directory.exists() for directory in kept) and in_use.exists()
    finally:
        for process in (alive, busy):
            process.kill()
            process.wait()
        eventually(lambda: not (in_use / "cgroup.procs").read_text().split(), "the sleeper to leave its group")
        for directory in [stale, *kept]:
            if directory.exists():
                remove_cgroup_tree(directory)


@needs_cgroups
def test_a_bridge_whose_directory_was_taken_for_a_leftover_makes_another(tmp_path: Path) -> None:
    """A bridge in another PID namespace sees this one's pid as dead, and may remove its directory between
    turns: the next agent gets a cgroup in a new one, which the keeper removes when the bridge ends."""
    host = subprocess.Popen(
        [
            PYTHON,
            "-c",
            """
import sys, bridge
from bridge.confinement.cgroups import CONTAINMENT
profile = bridge.load_profile(sys.argv[1])
for _ in sys.stdin:
    print(bridge.run_turn_sync(profile, bridge.Turn("hi")).exit_code, CONTAINMENT.directory, flush=True)
""",
            str(PROFILES / "echo.yaml"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def one_turn() -> Path:
        host.stdin.write("turn\n")
        host.stdin.flush()
        exit_code, directory = host.stdout.readline().split()
        assert exit_code == "0"
        return Path(directory)

    try:
        first = one_turn()
        eventually(lambda: not [path for path in first.iterdir() if path.is_dir()], "the agent's cgroup to go")
        first.rmdir()
        second = one_turn()
        assert second != first and second.is_dir()
        host.stdin.close()
        assert host.wait(timeout=5) == 0
        eventually(lambda: not second.exists(), "the keeper to remove the new directory", within=3.0)
    finally:
        host.kill()


def test_only_a_bridges_directory_names_an_owner() -> None:
    assert directory_owner("agent-bridge-4242-9f3a1c") == 4242
    for name in ("agent-bridge-4242-9f3a1", "agent-bridge-4242-9F3A1C", "agent-bridge-x-9f3a1c", "bridge", "1"):
        assert directory_owner(name) is None


class ExitingGroup(AgentCgroup):
    """An ended agent's cgroup whose last process has begun to exit: `cgroup.procs` lists nobody, yet the kernel
    refuses to remove the cgroup (EBUSY) until that process has left it, a moment later."""

    def __init__(self, busy_for: int) -> None:
        super().__init__("")
        self.busy_for = busy_for  # removals refused before one succeeds
        self.removed = False

    def remove(self) -> bool:
        self.busy_for -= 1
        self.removed = self.busy_for < 0
        return self.removed

    def kill(self) -> None:
        pass

    def pids(self) -> list[int]:
        return []


async def test_an_ended_agents_cgroup_held_only_by_an_exiting_process_is_removed_once_it_has_left() -> None:
    group = ExitingGroup(busy_for=5)
    CONTAINMENT.end(group)  # refused twice: kept, to be removed later
    with trio.fail_after(5):
        await collect_orphans(trio.current_time() + 1.0, group)
    assert group.removed
    assert CONTAINMENT.still_in(group) is None


# --------------------------------------------------------------------------- saying which


def test_check_and_serve_say_when_agents_cannot_be_contained(tmp_path: Path) -> None:
    profile = escaping_profile(tmp_path)
    done = subprocess.run(
        without_cgroups([AGENT_BRIDGE, "check", str(profile)]), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{profile}: ok\n"
    assert (
        "note: agents are not contained in cgroups: no cgroup v2 file system is mounted; a process that leaves "
        "its agent's process group is stopped only by a subreaper bridge"
    ) in done.stderr
    served = subprocess.run(
        without_cgroups(
            [AGENT_BRIDGE, "serve", "--profiles", str(tmp_path), "--log-level", "info", "--log-format", "json"]
        ),
        input="",
        capture_output=True,
        text=True,
        timeout=30,
    )
    said = [json.loads(line) for line in served.stderr.splitlines() if "contain" in line]
    assert [(record["event"], record["reason"]) for record in said] == [
        ("agents are not contained in cgroups", "no cgroup v2 file system is mounted")
    ]


@needs_cgroups
def test_serve_says_where_its_agents_cgroups_are(tmp_path: Path) -> None:
    served = subprocess.run(
        [AGENT_BRIDGE, "serve", "--profiles", str(tmp_path), "--log-level", "info", "--log-format", "json"],
        input="",
        capture_output=True,
        text=True,
        timeout=30,
    )
    said = [json.loads(line) for line in served.stderr.splitlines() if "cgroup" in line]
    assert [(record["event"], record["below"]) for record in said] == [
        ("each agent runs in a cgroup of its own", CONTAINED.where)
    ]
    checked = subprocess.run(
        [AGENT_BRIDGE, "check", str(escaping_profile(tmp_path))], capture_output=True, text=True, timeout=30
    )
    assert checked.stderr == ""  # contained: nothing to warn about


# --------------------------------------------------------------------------- the pure parts


def test_the_cgroup2_mount_and_the_process_s_cgroup_are_read_from_proc() -> None:
    hybrid = (
        "25 30 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
        "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw\n"
        "27 25 0:24 / /sys/fs/cgroup/memory rw shared:11 - cgroup cgroup rw,memory\n"
    )
    assert cgroup2_mount(hybrid) == ("/sys/fs/cgroup/unified", "/")
    delegated = "40 1 0:30 /system.slice/bot.service /mnt/my\\040cgroups rw master:3 - cgroup2 cgroup2 rw\n"
    assert cgroup2_mount(delegated) == ("/mnt/my cgroups", "/system.slice/bot.service")
    assert cgroup2_mount(hybrid.splitlines()[2]) is None
    assert own_cgroup("9:name=systemd:/\n4:memory:/x\n0::/system.slice/bot.service\n") == "/system.slice/bot.service"
    assert own_cgroup("4:memory:/x\n") is None
