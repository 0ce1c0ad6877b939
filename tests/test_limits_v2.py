"""cgroup v2 controllers for the controlled limits (issue 24): passing a controller down to the agents' groups.

This machine's v2 tree offers one controller, `hugetlb` (memory and pids are
bound to v1, where tests/test_limits.py holds agents to their limits). The
way a controller reaches an agent's v2 group does not depend on which one it
is, so it is shown here with `hugetlb`, with the kernel's own files: a bridge
that is the only process of a cgroup of the test's own moves itself (and its
keeper) into a leaf of its directory, passes the controller down to its
agents' groups, and its keeper undoes all of it after a kill -9. The
`memory.max` and `pids.max` files this kernel's v2 tree does not have are
covered by the pure decision (`plan_controller`).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PYTHON, assert_no_live_process, write_agent, write_profile
from fleetkit import eventually

from bridge.confinement.cgroups import CONTAINMENT, LEAF, ControllerPlan, cgroup2_mount, plan_controller, read_text
from bridge.confinement.limits import MIB, pids_max_while_joined, v2_settings

MOUNT = (cgroup2_mount(read_text("/proc/self/mountinfo")) or ("", ""))[0]
CONTROLLER = "hugetlb"
# One test at a time may pass hugetlb down from the v2 root, which is the machine's, and take it back after.
LOCK = "/tmp/agent-bridge-tests-v2-controller.lock"

HOST = f"""
import sys, bridge
from bridge.confinement.cgroups import CONTAINMENT, SPAWN_LOCK
from bridge.confinement.keeper import KEEPER
from bridge.confinement.limits import pass_down
quick, sleeper = map(bridge.load_profile, sys.argv[1:3])
assert bridge.run_turn_sync(quick, bridge.Turn("hi")).reply == "hi"  # the keeper now runs, in this cgroup
with SPAWN_LOCK:
    pass_down({CONTROLLER!r})
print(CONTAINMENT.directory, KEEPER.pid, flush=True)
bridge.run_turn_sync(sleeper, bridge.Turn("sleep"))
"""


def controllers(cgroup: Path, name: str = "cgroup.controllers") -> list[str]:
    return (cgroup / name).read_text().split()


def procs(cgroup: Path) -> list[int]:
    return [int(word) for word in (cgroup / "cgroup.procs").read_text().split()]


@pytest.fixture
def home() -> Iterator[Path]:
    """A v2 cgroup of the test's own, below the root, that is offered the controller: the bridge's home."""
    root = Path(MOUNT)
    assert CONTROLLER in controllers(root), f"this machine's cgroup v2 root offers no {CONTROLLER}"
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        passed_before = CONTROLLER in controllers(root, "cgroup.subtree_control")
        (root / "cgroup.subtree_control").write_text(f"+{CONTROLLER}")
        path = root / f"agent-bridge-test-{os.getpid()}-{secrets.token_hex(3)}"
        path.mkdir()
        try:
            yield path
        finally:
            (path / "cgroup.kill").write_text("1")
            eventually(lambda: "populated 0" in (path / "cgroup.events").read_text(), "the test's cgroup to empty")
            for leftover in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                leftover.rmdir()
            path.rmdir()
            if not passed_before:
                (root / "cgroup.subtree_control").write_text(f"-{CONTROLLER}")


def in_cgroup(cgroup: Path, argv: list[str]) -> list[str]:
    """`argv` run as a process of `cgroup` from its first instruction."""
    return ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh", *argv]


def test_the_bridge_moves_into_its_leaf_to_pass_a_controller_to_its_agents_and_its_keeper_undoes_it(
    home: Path, tmp_path: Path
) -> None:
    write_agent(tmp_path, "quick.sh", "#!/bin/sh\necho hi\n")
    write_agent(
        tmp_path,
        "sleeper.sh",
        f'#!/bin/sh\necho "$$ $(grep ^0:: /proc/self/cgroup | cut -c4-)" > {tmp_path / "agent"}\nexec sleep 600\n',
    )
    quick = write_profile(tmp_path, 'command: ["{{PROFILE_DIR}}/quick.sh"]\n', "quick.yaml")
    sleeper = write_profile(tmp_path, 'command: ["{{PROFILE_DIR}}/sleeper.sh"]\nkill_grace_secs: 0.3\n', "s.yaml")
    record = tmp_path / "agent"
    root_passed = controllers(Path(MOUNT), "cgroup.subtree_control")
    host = subprocess.Popen(
        in_cgroup(home, [PYTHON, "-c", HOST, str(quick), str(sleeper)]), stdout=subprocess.PIPE, text=True
    )
    try:
        directory_name, keeper = host.stdout.readline().split()  # type: ignore[union-attr]
        directory = Path(directory_name)
        assert directory.parent == home
        agent_pid, agent_cgroup = eventually(
            lambda: record.exists() and record.read_text().split(), "the agent to start"
        )
        agent_group = Path(MOUNT + agent_cgroup)
        assert agent_group.parent == directory
        assert CONTROLLER in controllers(agent_group)  # the controller reaches the agent's own group
        # The bridge and its keeper: the bridge goes back there once the agent is forked, which a loaded machine
        # may let the agent's first lines outrun.
        eventually(
            lambda: sorted(procs(directory / LEAF)) == sorted([host.pid, int(keeper)]), "the bridge back in its leaf"
        )
        assert procs(home) == []
        assert CONTROLLER in controllers(home, "cgroup.subtree_control")
        assert CONTROLLER in controllers(directory, "cgroup.subtree_control")
        assert procs(agent_group) == [int(agent_pid)]  # the bridge was there for the fork only
        host.kill()
        host.wait(timeout=5)
        assert_no_live_process([int(agent_pid)], within=4.0)
        eventually(lambda: not directory.exists(), "the keeper to remove the directory", within=6.0)
        assert CONTROLLER not in controllers(home, "cgroup.subtree_control")  # taken back: home as it was
        eventually(lambda: not procs(home), "the keeper to end")
        assert controllers(Path(MOUNT), "cgroup.subtree_control") == root_passed
    finally:
        host.kill()


def test_a_controller_is_not_passed_down_past_another_process(home: Path, tmp_path: Path) -> None:
    """Another process in the bridge's cgroup: the bridge may not move it, so it says why, and changes nothing."""
    other = subprocess.Popen(in_cgroup(home, ["sleep", "60"]))
    try:
        eventually(lambda: other.pid in procs(home), "the other process to join")
        script = (
            "import bridge.confinement.limits\nfrom bridge.confinement.cgroups import CONTAINMENT, SPAWN_LOCK\nfrom bridge.errors import "
            f"LaunchError\nprint(CONTAINMENT.plan({CONTROLLER!r}).reason)\n"
            f"with SPAWN_LOCK:\n    try:\n        bridge.confinement.limits.pass_down({CONTROLLER!r})\n"
            "    except LaunchError as err:\n        print(err)\n"
        )
        done = subprocess.run(in_cgroup(home, [PYTHON, "-c", script]), capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        reason, error = done.stdout.splitlines()
        assert reason.startswith(
            f"the {CONTROLLER} controller is not passed to {home}'s children and other processes live in {home} "
            f"(pids {other.pid}): run the bridge as the only process of its cgroup"
        )
        assert error.endswith(reason)
        assert controllers(home, "cgroup.subtree_control") == []
        assert sorted(procs(home)) == [other.pid]
        assert [path.name for path in home.iterdir() if path.is_dir()] == []  # nothing made
    finally:
        other.kill()
        other.wait()


def test_this_machine_s_v2_tree_does_not_offer_memory_and_pids() -> None:
    """So they stay with v1 here (tests/test_limits.py), and `check` says v1."""
    for controller in ("memory", "pids"):
        found = CONTAINMENT.plan(controller)
        assert found.reason.startswith(f"the {controller} controller is not offered to {CONTAINMENT.status().where}")


# --------------------------------------------------------------------------- the decision, from what was read

HOME = "/sys/fs/cgroup/system.slice/bot.service"
DIRECTORY = HOME + "/agent-bridge-7-abcdef"
OURS = frozenset({7, 8})


def plan(
    offered: set[str], passed: set[str] = frozenset(), procs: set[int] = frozenset(), root: bool = False
) -> ControllerPlan:
    return plan_controller(
        "memory",
        home=HOME,
        directory=DIRECTORY,
        root=root,
        offered=frozenset(offered),
        passed=frozenset(passed),
        procs=frozenset(procs),
        ours=OURS,
    )


def test_a_controller_home_passes_down_is_enabled_in_the_directory_alone() -> None:
    assert plan({"memory", "pids"}, passed={"memory"}, procs=set()) == ControllerPlan("memory", enable=(DIRECTORY,))
    assert plan({"memory"}, passed={"memory"}, root=True, procs={1, 7}) == ControllerPlan("memory", enable=(DIRECTORY,))


def test_a_controller_home_is_not_offered_cannot_be_had() -> None:
    for kwargs in ({"procs": {7}}, {"procs": set()}, {"root": True}):
        found = plan({"pids", "cpu"}, **kwargs)  # type: ignore[arg-type]
        assert (found.enable, found.move) == ((), False)
        assert found.reason.startswith(
            f"the memory controller is not offered to {HOME} (its cgroup.controllers: cpu pids)"
        )
    assert plan(set()).reason == (
        f"the memory controller is not offered to {HOME} (its cgroup.controllers: none): the cgroup above it keeps "
        "it; run the bridge under systemd with Delegate=yes, or give it a cgroup that has the controller"
    )
    assert plan({"hugetlb"}, root=True).reason == (
        f"the memory controller is not offered to {HOME} (its cgroup.controllers: hugetlb): it is bound to a cgroup "
        "v1 hierarchy, or not in this kernel"
    )


def test_the_root_and_an_empty_home_pass_it_down_without_a_move() -> None:
    """The root is exempt from the rule; a home without processes obeys it already."""
    assert plan({"memory"}, procs={1, 2, 7}, root=True) == ControllerPlan("memory", enable=(HOME, DIRECTORY))
    assert plan({"memory"}, procs=set()) == ControllerPlan("memory", enable=(HOME, DIRECTORY))


def test_a_home_holding_only_the_bridge_and_its_keeper_is_emptied_by_a_move_first() -> None:
    for ours in ({7}, {7, 8}):
        assert plan({"memory"}, procs=ours) == ControllerPlan("memory", enable=(HOME, DIRECTORY), move=True)


def test_another_process_in_home_keeps_the_controller_from_the_agents_and_is_named() -> None:
    found = plan({"memory"}, procs={7, 8, 99})
    assert (found.enable, found.move) == ((), False)
    assert found.reason == (
        f"the memory controller is not passed to {HOME}'s children and other processes live in {HOME} (pids 99): "
        "run the bridge as the only process of its cgroup (under systemd, a service with Delegate=yes), or write "
        f"+memory to {HOME}/cgroup.subtree_control once those processes are in a cgroup of their own below it"
    )
    many = plan({"memory"}, procs={7, *range(100, 110)})
    assert "(pids 100 101 102 103 104 …)" in many.reason


def test_the_files_an_agent_s_v2_group_gets_for_its_limits() -> None:
    assert v2_settings({"memory": 256, "pids": 64}, swap=True) == [
        ("memory.max", str(256 * MIB)),
        ("memory.swap.max", "0"),  # no swap: memory and swap together stay below 256 MiB, as v1's memsw
        ("pids.max", "64"),
    ]
    assert v2_settings({"memory": 256}, swap=False) == [("memory.max", str(256 * MIB))]  # a kernel without swap
    assert v2_settings({"pids": 8}, swap=True) == [("pids.max", "8")]
    assert pids_max_while_joined(8, threads=12) == 8 + 12 + 8  # the bridge's threads, and 8 it may start meanwhile
