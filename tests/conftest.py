"""Shared fixtures: agents written to a temp dir, and checks that no process outlived its turn."""

from __future__ import annotations

import os
import select
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from cgroup_leaks import CgroupLeakWatch
from hostkit import Lab
from procfs import process_state

import bridge
from bridge.confinement.cgroups import CONTAINMENT
from bridge.engine.launch import looks_like_credential

pytest_plugins = ["pgserver"]  # postgres_server, pg_dsn: a throwaway PostgreSQL cluster

REPO = Path(__file__).resolve().parent.parent
# The fake model servers, the agents' cache and the PostgreSQL cluster: shared with `make try-*`, `make fleet-db`.
sys.path.insert(0, str(REPO / "tools"))
PROFILES = REPO / "profiles"
CLI_PROFILES = PROFILES / "clis"  # ready profiles of coding CLIs
SAMPLE_AGENTS = REPO / "sample_agents"
PYTHON = sys.executable
# A turn in a test that is not about timing ends well within this; a hang fails in seconds, not at a 600 s limit.
TURN_DEADLINE = 10
# Every field of a turn's result, as `run --json`, serve and TurnResult.to_dict() give it (docs/protocol.md §5).
RESULT_FIELDS = frozenset(
    {
        "reply",
        "session_id",
        "error",
        "error_reply",
        "exit_code",
        "timed_out",
        "outcome",
        "stderr_tail",
        "duration_ms",
        "partials",
        "truncated",
        "usage",
        "folded_into",
        "files",
        "files_note",
    }
)


def turn_result(
    session_id: str = "", exit_code: int = 0, outcome: bridge.Outcome = bridge.Outcome.OK, **fields: Any
) -> bridge.TurnResult:
    """A finished turn's result: its session id and how it ended, any other field in `fields`, the rest empty."""
    values: dict[str, Any] = {
        "reply": "",
        "session_id": session_id,
        "error": "",
        "error_reply": "",
        "exit_code": exit_code,
        "timed_out": False,
        "outcome": outcome,
        "stderr_tail": "",
        "duration_ms": 1,
        "partials": 0,
        "truncated": False,
    }
    return bridge.TurnResult(**(values | fields))


async def run(
    profile: bridge.Profile, message: str = "hello", *, deadline: float = TURN_DEADLINE, **turn_and_callbacks: Any
) -> bridge.TurnResult:
    """One turn through `bridge.run_turn`, failing after `deadline` seconds; keywords named `on_…` are its
    callbacks, the others the Turn's fields."""
    callbacks = {name: value for name, value in turn_and_callbacks.items() if name.startswith("on_")}
    fields = {name: value for name, value in turn_and_callbacks.items() if name not in callbacks}
    with trio.fail_after(deadline):
        return await bridge.run_turn(profile, bridge.Turn(message, **fields), **callbacks)


async def run_collecting(
    profile: bridge.Profile, message: str = "hello", *, deadline: float = TURN_DEADLINE, **turn: Any
) -> tuple[bridge.TurnResult, list[Any]]:
    """`run`, and the events the turn reported on the way."""
    events: list[Any] = []
    result = await run(profile, message, deadline=deadline, on_event=events.append, **turn)
    return result, events


def write_agent(directory: Path, name: str, source: str) -> Path:
    """Write an executable agent script; `source` starts with its #! line."""
    path = directory / name
    path.write_text(textwrap.dedent(source).lstrip())
    path.chmod(0o755)
    return path


def write_profile(directory: Path, yaml_text: str, name: str = "agent.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(yaml_text).lstrip())
    return path


@pytest.fixture
def make_agent(tmp_path: Path) -> Callable[..., bridge.Profile]:
    """make_agent(source, **profile_fields) -> Profile running that script.

    A source starting with `#!` is used as is; otherwise it is Python run by
    the test's interpreter, so agents need nothing installed.
    """
    counter = iter(range(1_000_000))

    def make(source: str, **fields: object) -> bridge.Profile:
        source = textwrap.dedent(source).lstrip()
        if not source.startswith("#!"):
            source = f"#!{PYTHON}\n" + source
        script = write_agent(tmp_path, f"agent{next(counter)}", source)
        return bridge.Profile.from_mapping({"command": [str(script)], **fields}, profile_dir=tmp_path)

    return make


@pytest.fixture
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Lab:
    """A Lab (tests/hostkit.py) with a recorder profile for each name in the test module's LAB_PROFILES
    (default: just `rec`)."""
    lab = Lab(tmp_path)
    for name in getattr(request.module, "LAB_PROFILES", ("rec",)):
        lab.profile(name)
    return lab


def assert_no_live_process(pids: list[int], within: float = 2.0) -> None:
    """Every pid is gone or a zombie awaiting its (foreign) parent: nothing runs on.

    A process SIGKILLed as a turn ended may still be finishing its exit (state R)
    for a moment; each gets up to `within` seconds, waited on its pidfd.
    """
    deadline = time.monotonic() + within
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))  # readable once it exited
        finally:
            os.close(pidfd)
    alive = {pid: state for pid in pids if (state := process_state(pid)) not in (None, "Z", "X")}
    assert not alive, f"processes outlived the turn: {alive}"


def without_cgroups(argv: list[str]) -> list[str]:
    """`argv` run where no cgroup v2 file system is mounted (a mount namespace of its own, every cgroup2 mount
    taken away): the bridge there cannot contain agents in cgroups, as on a machine or container without them."""
    if os.geteuid() != 0:
        pytest.skip("a mount namespace without cgroups needs root (unshare --mount)")
    unmount = 'for m in $(findmnt -rn -t cgroup2 -o TARGET); do umount -l "$m" || exit 125; done; exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", unmount, "sh", *argv]


@pytest.fixture
def spawning_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread that spawns each agent of the test, in order."""
    import threading

    import bridge.confinement.spawner

    names: list[str] = []
    real_spawn = bridge.confinement.spawner.spawn

    def spawn(plan: Any, **options: Any) -> Any:
        names.append(threading.current_thread().name)
        return real_spawn(plan, **options)

    monkeypatch.setattr(bridge.confinement.spawner, "spawn", spawn)
    return names


def read_pids(path: Path) -> list[int]:
    return [int(word) for word in path.read_text().split()] if path.exists() else []


@pytest.fixture(autouse=True)
def _no_inherited_agent_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Tests see the environment a user would, whatever ran pytest, and never write to the real ~/.cache.

    Credentials of whoever ran pytest are removed too: a failed turn's error names those its agent did not get."""
    for name in list(os.environ):
        if name.startswith("AGENT_") or looks_like_credential(name):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


# Python agents made by `make_recorded_agent` start with this: they log their own
# pid, and call record_pid(child.pid) for every process they start, so a test can
# prove that none of them outlived the turn.
RECORD_PIDS = """
import os
def record_pid(pid):
    with open(os.environ["PID_FILE"], "a") as out:
        out.write(f"{pid}\\n")
record_pid(os.getpid())
"""


@pytest.fixture
def pid_file(tmp_path: Path) -> Path:
    return tmp_path / "pids"


@pytest.fixture
def make_recorded_agent(make_agent: Callable[..., bridge.Profile], pid_file: Path) -> Callable[..., bridge.Profile]:
    """make_agent for a Python agent that records its pids in `pid_file` (read them with read_pids)."""

    def make(source: str, **fields: object) -> bridge.Profile:
        env = {"PID_FILE": str(pid_file), **fields.pop("env", {})}  # type: ignore[dict-item]
        return make_agent(RECORD_PIDS + textwrap.dedent(source), env=env, **fields)

    return make


# --------------------------------------------------------------------------- the session's guard against leftover cgroups

_CGROUP_LEAK_WATCH: list[CgroupLeakWatch] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    """The session's bridges' cgroup directories are watched from here (in xdist's controller: its workers are
    below it), so that one left behind fails the session (tests/cgroup_leaks.py)."""
    if hasattr(session.config, "workerinput"):
        return
    containment = CONTAINMENT.status()
    if containment.available:
        _CGROUP_LEAK_WATCH.append(CgroupLeakWatch(Path(containment.where)))
        _CGROUP_LEAK_WATCH[0].start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _CGROUP_LEAK_WATCH:
        return
    leftovers = _CGROUP_LEAK_WATCH.pop().leftovers()
    if leftovers:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.ensure_newline()
        reporter.write_sep("=", f"{len(leftovers)} agent cgroup directories outlived their bridges", red=True)
        for path, owner in sorted(leftovers.items()):
            reporter.write_line(f"{path}: pid {owner.pid} in {owner.cwd}: {owner.command[:300]}")
