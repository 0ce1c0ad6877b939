"""A profile's `limits:` (issue 24): each limit stops a real agent that goes over it, and the turn says which.

On these machines `memory_mb` and `processes` are held by cgroup v1 groups
(memory, pids) made for each agent, `cpu_secs`, `file_size_mb` and
`open_files` by rlimits set before the agent's exec. What a limit cannot be
held by keeps the agent from starting (a mount namespace without the v1
hierarchies shows it). No group outlives its agent, nor a bridge killed with
SIGKILL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import warm_echo
from conftest import (
    PYTHON,
    TURN_DEADLINE,
    assert_no_live_process,
    read_pids,
    write_agent,
    write_profile,
)
from fleetkit import eventually
from test_containment import ESCAPING_AGENT, serve_turns
from test_lifetime import read_json_until

import bridge
from bridge import Turn
from bridge.confinement.limits import LIMIT_GROUPS, MIB, ResourceLimits, exceeded
from bridge.engine.result import Ending, Outcome, TurnRecorder
from bridge.engine.warm_agents import WarmAgent

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
HOMES = {controller: hierarchy.home for controller, hierarchy in LIMIT_GROUPS.hierarchies().items()}
LIMIT_DEADLINE = 30  # a CPU-time limit counts CPU seconds, which a loaded machine hands out slowly

# Unmounts every cgroup v1 hierarchy in a mount namespace of its own, then runs the command: a machine
# without the v1 controllers (cgroup v2 alone, whose controllers the bridge does not use yet).
WITHOUT_V1 = 'for m in $(findmnt -rn -t cgroup -o TARGET); do umount -l "$m" || exit 125; done; exec "$@"'


def without_v1_controllers(argv: list[str]) -> list[str]:
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", WITHOUT_V1, "sh", *argv]


def agent_directories(pid: int) -> list[Path]:
    """The directories of agent groups process `pid` made in the memory and pids hierarchies."""
    return [path for home in HOMES.values() for path in Path(home).glob(f"agent-bridge-{pid}-*")]


async def run(make_agent: Callable[..., bridge.Profile], source: str, limits: dict[str, int]) -> bridge.TurnResult:
    profile = make_agent(source, limits=limits, timeout_secs=LIMIT_DEADLINE)
    with trio.fail_after(LIMIT_DEADLINE + 5):
        return await bridge.run_turn(profile, Turn("go"))


def test_the_memory_and_pids_hierarchies_are_there_to_hold_limits() -> None:
    """These machines' layout: the tests below rely on it, so a machine without it fails here, by name."""
    assert all(HOMES.values()), LIMIT_GROUPS.hierarchies()


# --------------------------------------------------------------------------- each limit, with a real agent


async def test_a_1_gib_allocation_under_256_mb_ends_the_turn_over_its_memory_limit(
    make_agent: Callable[..., bridge.Profile],
) -> None:
    result = await run(make_agent, "data = b'x' * (1 << 30)\nprint('allocated')", {"memory_mb": 256})
    assert (result.outcome, result.exit_code) == (Outcome.LIMIT_EXCEEDED, 137)
    assert result.reply == ""
    assert result.error_reply == (
        "The agent went over its memory limit (memory_mb: 256): the out-of-memory killer stopped it."
    )


async def test_the_same_allocation_without_the_limit_succeeds(make_agent: Callable[..., bridge.Profile]) -> None:
    result = await run(make_agent, "data = b'x' * (300 << 20)\nprint('allocated')", {"open_files": 64})
    assert result.ok and result.reply == "allocated"


async def test_a_fork_loop_under_64_processes_is_stopped(make_agent: Callable[..., bridge.Profile]) -> None:
    # Bounded: 200 tries at most, and every child sleeps; the agent's cgroup kills them all at the end.
    source = """
        import subprocess, sys
        started = []
        try:
            for _ in range(200):
                started.append(subprocess.Popen(["sleep", "60"]))
        except OSError as err:
            sys.exit(f"started {len(started)}: {err.strerror}")
    """
    result = await run(make_agent, source, {"processes": 64})
    assert (result.outcome, result.exit_code) == (Outcome.LIMIT_EXCEEDED, 1)
    assert result.error_reply == (
        "The agent went over its process limit (processes: 64): it could not start another process."
    )
    assert result.stderr_tail == "started 63: Resource temporarily unavailable\n"  # the agent itself is the 64th


async def test_a_100_mb_write_under_10_mb_fails(make_agent: Callable[..., bridge.Profile], tmp_path: Path) -> None:
    written = tmp_path / "big"
    source = f"#!/bin/sh\nexec head -c 100000000 /dev/zero > {written}\n"
    result = await run(make_agent, source, {"file_size_mb": 10})
    assert (result.outcome, result.exit_code) == (Outcome.LIMIT_EXCEEDED, 128 + 25)
    assert result.error_reply == (
        "The agent went over its file size limit (file_size_mb: 10): a write past it was stopped with SIGXFSZ."
    )
    assert written.stat().st_size == 10 * MIB


async def test_a_python_agent_writing_past_file_size_mb_ends_over_its_limit(
    make_agent: Callable[..., bridge.Profile], tmp_path: Path
) -> None:
    """CPython ignores SIGXFSZ: its write fails with EFBIG and it exits 1, which is still the limit, not its own fault."""
    written = tmp_path / "big"
    source = f"""
        with open({str(written)!r}, "wb") as file:
            file.write(b"x" * (20 << 20))
    """
    result = await run(make_agent, source, {"file_size_mb": 10})
    assert (result.outcome, result.exit_code) == (Outcome.LIMIT_EXCEEDED, 1), result.stderr_tail
    assert result.error_reply == (
        "The agent went over its file size limit (file_size_mb: 10): "
        'a write past it failed (EFBIG, "File too large") and it exited.'
    )
    assert written.stat().st_size == 10 * MIB


async def test_a_python_agent_failing_otherwise_under_file_size_mb_is_its_own_failure(
    make_agent: Callable[..., bridge.Profile],
) -> None:
    result = await run(make_agent, "raise SystemExit('no such thing')", {"file_size_mb": 10})
    assert (result.outcome, result.exit_code) == (Outcome.EXIT_NONZERO, 1)


async def test_cpu_secs_1_stops_a_busy_loop(make_agent: Callable[..., bridge.Profile]) -> None:
    result = await run(make_agent, "while True:\n    pass", {"cpu_secs": 1})
    assert (result.outcome, result.exit_code) == (Outcome.LIMIT_EXCEEDED, 128 + 24)
    assert result.error_reply == "The agent went over its CPU time limit (cpu_secs: 1): it was stopped with SIGXCPU."
    assert result.duration_ms < LIMIT_DEADLINE * 1000


async def test_open_files_stops_an_agent_opening_too_many(make_agent: Callable[..., bridge.Profile]) -> None:
    source = """
        import os
        opened = []
        try:
            for _ in range(100):
                opened.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as err:
            print(f"opened up to descriptor {opened[-1]}: {err.strerror}")
    """
    result = await run(make_agent, source, {"open_files": 20})
    assert result.ok
    assert result.reply == "opened up to descriptor 19: Too many open files"


# --------------------------------------------------------------------------- a warm agent: one process, its limits

HOLDING_AGENT = f"""#!{PYTHON}
import json, os, sys, uuid
held = []
def say(**event):
    sys.stdout.write(json.dumps(event) + "\\n"); sys.stdout.flush()
for line in sys.stdin:
    message = json.loads(line)
    if message["op"] == "hello":
        say(ev="ready", session=message["session"] or uuid.uuid4().hex)
    elif message["op"] == "prompt":
        held.append(b"x" * (int(message["text"]) << 20))
        say(ev="delta", text=f"{{os.getpid()}} holds {{sum(map(len, held)) >> 20}} MiB")
        say(ev="done", reason="end_turn")
    elif message["op"] == "bye":
        sys.exit(0)
"""


async def test_a_warm_agent_s_limits_hold_its_process_across_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory held in one turn counts in the next: the limit is the process's, not a turn's."""
    warm_echo.register(monkeypatch)
    agent = write_agent(tmp_path, "holding-agent", HOLDING_AGENT)
    profile = bridge.Profile.from_mapping(
        {"command": [str(agent)], "protocol": "test-warm", "limits": {"memory_mb": 256, "processes": 16}},
        profile_dir=tmp_path,
    )
    with trio.fail_after(TURN_DEADLINE * 2):
        async with trio.open_nursery() as nursery:
            warm = WarmAgent(profile)
            await warm.start(nursery)
            first = await warm.turn(Turn("100"))
            second = await warm.turn(Turn("100"))
            pid = warm.pid
            assert pid is not None
            groups = [line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
            third = await warm.turn(Turn("100"))
            await warm.close()
    assert first.reply == f"{pid} holds 100 MiB" and second.reply == f"{pid} holds 200 MiB"
    assert sum("/agent-bridge-" in group for group in groups) == 3  # its memory, pids and cgroup v2 groups
    assert (third.outcome, third.exit_code) == (Outcome.LIMIT_EXCEEDED, 137)
    assert "memory_mb: 256" in third.error_reply
    assert_no_live_process([pid])
    assert not [path for directory in LIMIT_GROUPS.directories for path in Path(directory).iterdir() if path.is_dir()]


# --------------------------------------------------------------------------- nothing left behind


def test_no_limit_group_is_left_behind(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "forking.sh", "#!/bin/sh\nsleep 60 & sleep 60 & echo started\n")
    profile = write_profile(tmp_path, f'command: ["{agent}"]\nlimits: {{memory_mb: 64, processes: 8, cpu_secs: 5}}\n')
    host = subprocess.Popen(
        [
            PYTHON,
            "-c",
            """
import sys, bridge
from bridge.confinement.limits import LIMIT_GROUPS
profile = bridge.load_profile(sys.argv[1])
for _ in range(3):
    assert bridge.run_turn_sync(profile, bridge.Turn("hi")).reply == "started"
print("\\n".join(LIMIT_GROUPS.directories), flush=True)
sys.stdin.readline()
""",
            str(profile),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        directories = [Path(host.stdout.readline().strip()), Path(host.stdout.readline().strip())]
        assert sorted(directory.parent for directory in directories) == sorted(map(Path, HOMES.values()))
        assert all(directory.name.startswith(f"agent-bridge-{host.pid}-") for directory in directories)
        assert not [path for directory in directories for path in directory.iterdir() if path.is_dir()]
        host.stdin.close()
        assert host.wait(timeout=5) == 0
        eventually(lambda: not any(d.exists() for d in directories), "the keeper to remove them", within=3.0)
    finally:
        host.kill()


def test_a_sigkilled_serve_leaves_no_limit_group(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    write_agent(profiles, "escape.sh", ESCAPING_AGENT)
    write_profile(
        profiles,
        f"""
        command: ["{{{{PROFILE_DIR}}}}/escape.sh"]
        limits: {{memory_mb: 64, processes: 8}}
        kill_grace_secs: 0.3
        env:
          PID_FILE: "{profiles / "pids"}"
        """,
        "escape.yaml",
    )
    serve = serve_turns(tmp_path, "escape", 3, "hi")
    try:
        for _ in range(3):
            record = read_json_until(serve.stdout, lambda r: r["type"] in ("partial", "result", "error"), "ready")
            assert record["type"] == "partial", record
        directories = agent_directories(serve.pid)
        assert len(directories) == 2
        assert sum(1 for directory in directories for path in directory.iterdir() if path.is_dir()) == 6
        serve.kill()
        serve.wait(timeout=5)
        assert_no_live_process(read_pids(profiles / "pids"), within=4.0)
        eventually(lambda: not any(d.exists() for d in directories), "the keeper to remove them", within=4.0)
    finally:
        serve.kill()


# --------------------------------------------------------------------------- saying how, and refusing


def test_check_prints_each_limit_and_how_it_is_held(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path,
        "command: [cat]\nlimits: {memory_mb: 256, cpu_secs: 10, processes: 64, file_size_mb: 10, open_files: 100}\n",
    )
    done = subprocess.run([AGENT_BRIDGE, "check", str(profile)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{profile}: ok",
        f"  limit memory_mb: 256 by cgroup v1 memory.limit_in_bytes in a group of its own below {HOMES['memory']}",
        "  limit cpu_secs: 10 by RLIMIT_CPU (set by prlimit as the agent starts), per process of the agent",
        f"  limit processes: 64 by cgroup v1 pids.max in a group of its own below {HOMES['pids']}",
        "  limit file_size_mb: 10 by RLIMIT_FSIZE (set by prlimit as the agent starts), per process of the agent",
        "  limit open_files: 100 by RLIMIT_NOFILE (set by prlimit as the agent starts), per process of the agent",
    ]


def test_a_limit_that_cannot_be_held_keeps_the_agent_from_starting(tmp_path: Path) -> None:
    started = tmp_path / "started"
    agent = write_agent(tmp_path, "agent.sh", f"#!/bin/sh\ntouch {started}\necho hi\n")
    profile = write_profile(tmp_path, f'command: ["{agent}"]\nlimits: {{memory_mb: 256, cpu_secs: 10}}\n')
    checked = subprocess.run(
        without_v1_controllers([AGENT_BRIDGE, "check", str(profile)]), capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 2
    assert f"{profile}: error: limit memory_mb: 256 cannot be enforced here (no cgroup v1 memory hierarchy" in (
        checked.stderr
    )
    assert checked.stdout == ""  # no "ok": the profile would not run
    ran = subprocess.run(
        without_v1_controllers([AGENT_BRIDGE, "run", str(profile), "hi", "--json"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    result = json.loads(ran.stdout.splitlines()[-1])
    assert (result["outcome"], result["exit_code"]) == ("spawn_failed", 126)
    assert result["error_reply"].startswith(
        "The agent could not be started: its limits cannot all be enforced here: memory_mb (no cgroup v1 memory "
        "hierarchy is mounted"
    )
    assert not started.exists()


def test_a_profile_with_rlimits_needs_prlimit_and_names_its_package(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # a machine without util-linux's prlimit
    with pytest.raises(bridge.ProfileError, match="prlimit is not installed.*install the util-linux package"):
        bridge.parse_profile("command: cat\nlimits: {open_files: 64}\n")
    controlled = bridge.parse_profile("command: cat\nlimits: {memory_mb: 64}\n")  # needs no prlimit
    assert ResourceLimits.of(controlled.limits) == ResourceLimits(memory_mb=64)


@pytest.mark.parametrize("confined", [{"limits": {"open_files": 64}}, {"sandbox": {}}], ids=["prlimit", "bwrap"])
async def test_a_missing_command_behind_the_bridge_s_programs_is_reported_as_for_a_bare_agent(
    tmp_path: Path, confined: dict[str, object]
) -> None:
    """prlimit or bwrap would start and then not find the agent: the bridge says so before, as for a bare one."""
    profile = bridge.Profile.from_mapping(
        {"command": ["no-such-agent-program-xyz"], "cwd": str(tmp_path), **confined}, profile_dir=tmp_path
    )
    result = await bridge.run_turn(profile, Turn("go"))
    assert (result.outcome, result.exit_code) == (Outcome.SPAWN_FAILED, 127)
    assert (
        result.error_reply == "The agent could not be started: command 'no-such-agent-program-xyz' not found on PATH."
    )


# --------------------------------------------------------------------------- the pure parts


def test_limits_are_validated() -> None:
    with pytest.raises(bridge.ProfileError, match="limits.memory_mb: must be greater than 0"):
        bridge.parse_profile("command: cat\nlimits: {memory_mb: 0}\n")
    with pytest.raises(bridge.ProfileError, match="unknown key 'memory' in limits"):
        bridge.parse_profile("command: cat\nlimits: {memory: 5}\n")
    with pytest.raises(bridge.ProfileError, match="limits.cpu_secs: expected a whole number"):
        bridge.parse_profile("command: cat\nlimits: {cpu_secs: 1.5}\n")
    assert ResourceLimits.of(bridge.parse_profile("command: cat\nlimits: {}\n").limits) is None
    assert ResourceLimits.of(bridge.parse_profile("command: cat\n").limits) is None


def test_which_limit_a_failed_agent_ran_into() -> None:
    limits = ResourceLimits(cpu_secs=1, file_size_mb=1)
    assert exceeded(limits, -24, []) == "cpu_secs"
    assert exceeded(limits, -25, []) == "file_size_mb"
    assert exceeded(limits, 128 + 25, []) == "file_size_mb"  # a shell's (or bwrap's) word for its child's death
    assert exceeded(limits, -9, ["memory_mb"]) == "memory_mb"
    assert exceeded(limits, 0, ["memory_mb"]) == ""  # it coped: a child was killed, the agent succeeded
    assert exceeded(ResourceLimits(memory_mb=5), -24, []) == ""  # SIGXCPU from elsewhere names no limit of its
    assert exceeded(None, -24, []) == ""


def test_efbig_in_a_failed_agent_s_stderr_names_file_size_mb_only_when_it_is_set() -> None:
    for words in (
        "OSError: [Errno 27] File too large",  # Python
        "Error: EFBIG: file too large, write",  # Node
        "write big: file too large",  # Go
        "sh: echo: write error: File too large",
    ):
        result = TurnRecorder(bridge.Profile(command="cat", limits={"file_size_mb": 1})).finish(
            Ending(returncode=1), stderr_tail=f"Traceback\n{words}\n"
        )
        assert result.outcome is Outcome.LIMIT_EXCEEDED, words
    unlimited = TurnRecorder(bridge.Profile(command="cat", limits={"open_files": 10}))
    assert unlimited.finish(Ending(returncode=1), stderr_tail="File too large\n").outcome is Outcome.EXIT_NONZERO
    coped = TurnRecorder(bridge.Profile(command="cat", limits={"file_size_mb": 1}))
    assert coped.finish(Ending(returncode=0), stderr_tail="File too large\n").outcome is Outcome.OK


def test_a_limit_exceeded_outranks_the_agent_s_own_error_but_not_a_timeout() -> None:
    profile = bridge.Profile(command="cat", limits={"cpu_secs": 1})
    recorder = TurnRecorder(profile)
    recorder.record([bridge.ErrorEvent("killed")])
    result = recorder.finish(Ending(returncode=-24, limit="cpu_secs"))
    assert (result.outcome, result.exit_code, result.error) == (
        Outcome.LIMIT_EXCEEDED,
        152,
        "the agent went over its CPU time limit (cpu_secs: 1): it was stopped with SIGXCPU",
    )
    timed_out = TurnRecorder(profile).finish(Ending(returncode=-24, limit="cpu_secs", timeout="wall"))
    assert timed_out.outcome is Outcome.TIMEOUT


def test_rlimits_are_set_with_a_second_s_grace_for_cpu_time() -> None:
    import resource

    rlimits = ResourceLimits(cpu_secs=3, file_size_mb=2, open_files=50, memory_mb=100).rlimits()
    assert rlimits == (
        (resource.RLIMIT_CPU, 3, 4),
        (resource.RLIMIT_FSIZE, 2 * MIB, 2 * MIB),
        (resource.RLIMIT_NOFILE, 50, 50),
    )
    assert os.geteuid() == 0 or all(hard <= resource.getrlimit(which)[1] for which, _, hard in rlimits)


async def test_a_sandboxed_agent_is_held_by_its_limits_too(
    make_agent: Callable[..., bridge.Profile], tmp_path: Path
) -> None:
    """bwrap passes its agent's death on as 128+N, and the agent in its PID namespace is still in its groups."""
    source = "#!/bin/sh\nhead -c 100000000 /dev/zero > big\n"
    profile = make_agent(source, limits={"file_size_mb": 10, "memory_mb": 64}, sandbox={}, cwd=str(tmp_path))
    with trio.fail_after(LIMIT_DEADLINE):
        result = await bridge.run_turn(profile, Turn("go"))
    assert (result.outcome, result.exit_code) == (Outcome.LIMIT_EXCEEDED, 128 + 25)
    assert "file_size_mb: 10" in result.error_reply
    assert (tmp_path / "big").stat().st_size == 10 * MIB
    hungry = make_agent(
        "#!/usr/bin/python3\ndata = b'x' * (1 << 30)\n", limits={"memory_mb": 64}, sandbox={}, cwd=str(tmp_path)
    )
    with trio.fail_after(LIMIT_DEADLINE):
        result = await bridge.run_turn(hungry, Turn("go"))
    assert (result.outcome, result.exit_code) == (Outcome.LIMIT_EXCEEDED, 128 + 9)
    assert "memory_mb: 64" in result.error_reply
