"""`sandbox:` (issue 24): the agent under bubblewrap, one-shot and warm, with the engine's guarantees unchanged.

Every case runs a real agent under the real `bwrap` (`make test` installs bubblewrap). The bridge's HOME is a fake
home of the test's own, holding a fake `~/.ssh/id_rsa`; the test's directory is made readable to the agent
(`read:`), so what hides the home is the sandbox's `hide_home`, not the private /tmp.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from agents_cache import CACHE, npm_binary
from conftest import (
    CLI_PROFILES,
    PYTHON,
    REPO,
    SAMPLE_AGENTS,
    TURN_DEADLINE,
    assert_no_live_process,
    process_state,
    run,
    without_cgroups,
    write_agent,
    write_profile,
)
from fake_clis import install_fake_clis
from fakes.openai_responses import OpenAIResponses, write_codex_home
from test_lifetime import read_json_until
from test_ready_profiles_others import READY, Ready

import bridge
from bridge import Turn
from bridge.confinement.cgroups import CONTAINMENT, own_cgroup
from bridge.engine.warm_agents import WarmAgent
from bridge.errors import ProfileError

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
BWRAP = shutil.which("bwrap")
SECRET = "-----BEGIN FAKE PRIVATE KEY----- not-a-real-key"
# What the tests' agents run on, wherever it is installed (a Python under the real home, as pyenv puts it, is hidden
# with that home unless it is readable): the repository with its venv, and the Python the venv was made from.
RUNTIME = [str(REPO), os.path.realpath(sys.base_prefix)]


def test_bubblewrap_is_installed():
    """`make test` installs it; every case below needs it, and none of them is skipped without it."""
    assert BWRAP is not None, "bwrap is not on PATH: install the bubblewrap package (make test does, as root)"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The bridge's HOME for the test: a fake one, with a fake private key in it."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


def sandboxed(tmp_path: Path, source: str, work: Path, *, cwd: str = "", **sandbox: Any) -> bridge.Profile:
    """A profile running the script `source` in `work` (or `cwd`), sandboxed; the test's directory and the
    repository (the venv's Python) are readable unless `read` says otherwise."""
    agents = tmp_path / "agents"
    agents.mkdir(exist_ok=True)
    name = f"agent-{uuid.uuid4().hex[:8]}.sh"
    write_agent(agents, name, source)
    section = {"read": [str(tmp_path), *RUNTIME], **sandbox}
    return bridge.Profile.from_mapping(
        {
            "command": [f"{{{{PROFILE_DIR}}}}/{name}"],
            "cwd": cwd or str(work),
            "sandbox": section,
            "kill_grace_secs": 0.5,
        },
        profile_dir=agents,
    )


def outcome(argv: str) -> str:
    """A shell line that prints "ok" or "refused" for the command `argv`."""
    return f"if {argv} 2>/dev/null; then echo ok; else echo refused; fi"


# --------------------------------------------------------------------------- what the agent can write and read


async def test_the_agent_writes_in_its_working_directory_and_nowhere_else(tmp_path, home, work):
    system_file = f"/var/tmp/agent-bridge-sandbox-{uuid.uuid4().hex}"
    profile = sandboxed(
        tmp_path,
        f"""
        #!/bin/sh
        echo "pid $$"
        {outcome("echo inside > inside.txt")}
        {outcome(f"echo outside > {tmp_path}/outside.txt")}
        {outcome(f"echo system > {system_file}")}
        {outcome("echo tmp > /tmp/private.txt")}
        {outcome('touch "$AGENT_OUTBOX/out.txt"')}
        """,
        work,
    )
    result = await run(profile)
    assert result.ok, (result.error, result.stderr_tail)
    # pid 2: bwrap's init is 1 in the agent's own PID namespace. The working directory and the turn's outbox are
    # writable, the test's directory (readable) and the system are not; /tmp is the sandbox's own.
    assert result.reply.split("\n") == ["pid 2", "ok", "refused", "refused", "ok", "ok"]
    assert (work / "inside.txt").read_text() == "inside\n"
    assert not (tmp_path / "outside.txt").exists() and not os.path.exists(system_file)
    assert not Path("/tmp/private.txt").exists() or Path("/tmp/private.txt").read_text() != "tmp\n"


async def test_a_new_session_s_agent_is_not_put_in_the_directory_of_every_session(tmp_path, home, work):
    """`cwd: work/{{SESSION_ID}}`: a new session has no id yet. Its agent ran in `work/` itself, writable in the
    sandbox: any stranger's first message reached every other conversation's directory, and could leave a link
    there (`work/<the id it prints> -> /etc`) that its next turn's sandbox bound writable."""
    other = work / "s-other"
    other.mkdir()
    (other / "notes.txt").write_text("another conversation's\n")
    profile = sandboxed(
        tmp_path,
        """
        #!/bin/sh
        echo "overwritten" > s-other/notes.txt
        ln -s /etc s-mine
        echo "AGENT_SESSION: s-mine"
        """,
        work,
        cwd=f"{work}/{{{{SESSION_ID}}}}",
    )
    result = await run(profile)
    assert (result.outcome, result.exit_code) == ("spawn_failed", 126), (result.reply, result.error_reply)
    assert "the session id cannot be used in cwd: it is empty (a new session has no id yet)" in result.error_reply
    assert "put {{SESSION_NAME}} in cwd" in result.error_reply
    assert (other / "notes.txt").read_text() == "another conversation's\n"
    assert not os.path.lexists(work / "s-mine")
    resumed = await run(profile, session_id="s-other")  # a session with an id still runs in its own directory
    assert resumed.ok, (resumed.error, resumed.stderr_tail)


async def test_the_kernel_s_settings_are_read_only_to_a_sandboxed_agent(tmp_path, home, work):
    """uid 0 needs no capability to write most of /proc/sys: with the bridge run as root (as here), bwrap 0.8 left
    it writable, and an agent could set `kernel.core_pattern` to `|<its script>`, which the kernel runs as root
    outside every namespace at the next crash. Asked with access(2), so nothing is written."""
    assert os.getuid() == 0, "the case is root's: as another user /proc/sys is read-only to the agent anyway"
    settings = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/hostname", "/proc/sys/vm/drop_caches"]
    profile = sandboxed(tmp_path, "#!/bin/sh\n" + "\n".join(outcome(f"test -w {path}") for path in settings), work)
    result = await run(profile)
    assert result.ok, (result.error, result.stderr_tail)
    assert result.reply.split("\n") == ["refused"] * len(settings)


@pytest.mark.parametrize("hide_home", [True, False], ids=["hidden", "shown"])
async def test_the_real_home_is_hidden_unless_the_profile_shows_it(tmp_path, home, work, hide_home):
    profile = sandboxed(
        tmp_path,
        f"""
        #!/bin/sh
        echo "HOME=$HOME"
        cat "$HOME/.ssh/id_rsa" {home}/.ssh/id_rsa 2>/dev/null
        ls -A "$HOME"
        """,
        work,
        hide_home=hide_home,
    )
    result = await run(profile)
    assert result.ok, (result.error, result.stderr_tail)
    lines = result.reply.split("\n")
    assert lines[0] == f"HOME={home}"  # the same path either way: `~` in read and write means what it says
    if hide_home:
        assert SECRET not in result.reply
        assert lines[1:] == [""] or lines[1:] == []  # an empty home
    else:  # the same agent reads it when the home is not hidden: the case above is the sandbox's doing
        assert SECRET in result.reply


async def test_a_write_path_in_a_home_reached_through_a_link_is_bound_in_the_hidden_home(
    tmp_path, home, work, monkeypatch
):
    """A home reached through a link (Fedora Silverblue's /home is one to /var/home) is hidden where the link
    leads; `~/.tool` was bound before it through the link, then covered: the agent saw an empty directory."""
    link = tmp_path / "home-link"
    link.symlink_to(home)
    monkeypatch.setenv("HOME", str(link))
    (home / ".tool").mkdir()
    (home / ".tool" / "config").write_text("setting\n")
    profile = sandboxed(
        tmp_path,
        """
        #!/bin/sh
        cat ~/.tool/config
        echo written > ~/.tool/state
        cat ~/.ssh/id_rsa 2>/dev/null || echo hidden
        """,
        work,
        write=["~/.tool"],
    )
    result = await run(profile)
    assert result.ok, (result.error, result.stderr_tail)
    assert result.reply.split("\n") == ["setting", "hidden"]
    assert (home / ".tool" / "state").read_text() == "written\n"


async def test_write_paths_are_writable_read_paths_only_readable(tmp_path, home, work):
    (home / ".tool").mkdir()
    (home / ".tool" / "config").write_text("setting\n")
    (home / ".logins").mkdir()
    profile = sandboxed(
        tmp_path,
        f"""
        #!/bin/sh
        cat ~/.tool/config
        {outcome("echo x > ~/.tool/new")}
        {outcome("echo token > ~/.logins/token")}
        """,
        work,
        read=[str(tmp_path), *RUNTIME, "~/.tool"],
        write=["~/.logins", "~/.missing"],
    )
    result = await run(profile)
    assert result.ok, (result.error, result.stderr_tail)
    assert result.reply.split("\n") == ["setting", "refused", "ok"]
    assert (home / ".logins" / "token").read_text() == "token\n" and not (home / ".tool" / "new").exists()


def tampering_source(profile: Path, work: Path, cache: Path) -> str:
    """An agent that tries every way to change its own profile, the directories that lead to it, and the profile
    cache; it prints its pid (2 in its sandbox's PID namespace), then one line per attempt."""
    ancestors = [
        str(directory) for directory in profile.parents if directory.is_relative_to(work) and directory != work
    ]
    ancestors.reverse()  # the outermost first: moved, it carries the others away
    return f"""
        #!{PYTHON}
        import os
        profile, ancestors = {str(profile)!r}, {ancestors!r}
        def attempt(name, action):
            try:
                action()
                print(name, "ok")
            except OSError:
                print(name, "refused")
        def replace():
            with open("replacement", "w") as file:
                file.write("command: sh\\n")
            os.replace("replacement", profile)
        def move_directories():
            for directory in ancestors:
                os.rename(directory, directory + "-moved")
        print("pid", os.getpid())
        attempt("overwrite", lambda: open(profile, "w").write("command: sh\\n"))
        attempt("truncate", lambda: os.truncate(profile, 0))
        attempt("replace", replace)
        attempt("rename", lambda: os.rename(profile, profile + ".old"))
        attempt("delete", lambda: os.unlink(profile))
        attempt("move its directories", move_directories)
        attempt("write the profile cache", lambda: open({str(cache / "entry.json")!r}, "w").write("{{}}"))
        """


@pytest.mark.parametrize("where", ["", "bridge/profiles"], ids=["in its working directory", "below it"])
async def test_a_sandboxed_agent_cannot_change_the_profile_that_confines_it(tmp_path, home, work, monkeypatch, where):
    """A profile kept where its agent works (the project it works on): rewritten, the next turn would run as the
    agent wrote it, without the sandbox. Its file, the directories on the way to it, and the profile cache (here
    in the working directory too) are read-only to the agent, and the next turn is still sandboxed."""
    cache = work / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    directory = work / where
    directory.mkdir(parents=True, exist_ok=True)
    profile_file = directory / "agent.yaml"
    agent = write_agent(tmp_path, "agent", tampering_source(profile_file, work, cache / "agent-bridge" / "profiles"))
    text = yaml.safe_dump(
        {"command": [str(agent)], "cwd": str(work), "sandbox": {"read": [str(tmp_path), *RUNTIME], "network": False}}
    )
    profile_file.write_text(text)
    expected = ["pid 2", *(f"{name} refused" for name in ("overwrite", "truncate", "replace", "rename", "delete"))]
    expected += ["move its directories ok" if not where else "move its directories refused"]
    expected += ["write the profile cache refused"]
    for _ in range(2):  # the next turn loads the profile again: still the one the author wrote
        result = await run(bridge.load_profile(profile_file))
        assert result.ok, (result.error, result.stderr_tail)
        assert result.reply.split("\n") == expected
        assert profile_file.read_text() == text
    if where:  # the directory that holds it is read-only: no new profile there for `serve --profiles` to serve
        assert sorted(os.listdir(directory)) == ["agent.yaml"]


@pytest.mark.parametrize("network", [True, False], ids=["network", "no network"])
async def test_network_false_cannot_reach_a_listener_on_loopback(tmp_path, home, work, network):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        profile = sandboxed(
            tmp_path,
            f"""
            #!{PYTHON}
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
                print("connected")
            except OSError as err:
                print("refused", err.errno)
            """,
            work,
            network=network,
        )
        result = await run(profile)
    assert result.ok, (result.error, result.stderr_tail)
    assert result.reply.split()[0] == ("connected" if network else "refused")


# --------------------------------------------------------------------------- every way a turn ends kills everything


def running(token: str) -> list[int]:
    """Host pids of live processes whose command line holds `token` (the agent's own pids are its namespace's)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if token.encode() in cmdline and process_state(int(entry)) not in (None, "Z", "X"):
                found.append(int(entry))
    return found


def escaping_source(token: str) -> str:
    """An agent that leaves a `setsid` sleeper (its command line marked with `token`) and says so."""
    return f"""
    #!/bin/sh
    setsid sh -c 'touch escaped; exec sleep {token}' < /dev/null > /dev/null 2>&1 &
    while [ ! -e escaped ]; do sleep 0.01; done
    echo 'AGENT_PARTIAL:"ready"'
    echo left one
    [ "$1" = stay ] && exec sleep 600
    exit 0
    """


@pytest.fixture
def token() -> Iterator[str]:
    """A sleep's duration no other test uses, to find its process by."""
    token = f"600.{uuid.uuid4().int % 10**9:09d}"
    yield token
    for pid in running(token):
        os.kill(pid, signal.SIGKILL)


async def test_a_setsid_escapee_inside_the_sandbox_dies_with_the_turn(tmp_path, home, work, token):
    profile = sandboxed(tmp_path, escaping_source(token), work)
    partials: list[str] = []
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("hi"), on_partial=partials.append)
    assert result.ok and result.reply == "left one", (result.error, result.stderr_tail)
    assert partials == ["ready"]  # the sleeper was running when the agent said so
    assert_no_live_process(running(token), within=4.0)


@pytest.mark.parametrize("cgroups", [True, False], ids=["contained", "without cgroups"])
def test_a_setsid_escapee_inside_the_sandbox_dies_with_a_sigkilled_serve(tmp_path, home, token, cgroups):
    """Without cgroups, what left the agent's group outlives a killed serve (tests/test_containment.py); in a
    sandbox it dies with bwrap, which dies with its parent, and its PID namespace with it."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    write_agent(profiles, "escape.sh", escaping_source(token))
    (tmp_path / "work").mkdir()
    write_profile(
        profiles,
        f"""
        command: ["{{{{PROFILE_DIR}}}}/escape.sh", stay]
        cwd: "{tmp_path / "work"}"
        kill_grace_secs: 0.3
        timeout_secs: 60
        sandbox: {{read: {json.dumps([str(tmp_path), *RUNTIME])}}}
        """,
        "escape.yaml",
    )
    argv = [AGENT_BRIDGE, "serve", "--profiles", str(profiles), "--state", str(tmp_path / "sessions.sqlite3")]
    serve = subprocess.Popen(
        argv if cgroups else without_cgroups(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        request = {"type": "turn", "id": 1, "profile": "escape", "conversation": "c", "message": "hi"}
        serve.stdin.write(json.dumps(request) + "\n")
        serve.stdin.flush()
        record = read_json_until(serve.stdout, lambda r: r["type"] in ("partial", "result", "error"), "ready")
        assert record["type"] == "partial", record
        escapees = running(token)
        assert escapees
        serve.kill()
        serve.wait(timeout=5)
        assert_no_live_process(escapees, within=4.0)
    finally:
        serve.kill()
        serve.wait(timeout=5)


async def test_a_sandboxed_agent_is_contained_by_its_pid_namespace_and_gets_no_cgroup_of_its_own(
    tmp_path, home, work, make_agent
):
    """The cases above show the PID namespace ends all an agent started; a cgroup of its own on top would cost
    every sandboxed turn ~0.25 ms (bench row 29). So it has none, where a bare agent has one (where the machine
    gives agents cgroups)."""
    reports_cgroup = "#!/bin/sh\ngrep '^0::' /proc/self/cgroup"
    sandboxed_result = await run(sandboxed(tmp_path, reports_cgroup, work))
    bare_result = await run(make_agent(reports_cgroup, cwd=str(work)))
    own = f"0::{own_cgroup(Path('/proc/self/cgroup').read_text())}"
    assert sandboxed_result.reply == own, (sandboxed_result.error, sandboxed_result.stderr_tail)
    assert bare_result.ok and (bare_result.reply != own) == CONTAINMENT.status().available


async def test_a_timed_out_sandboxed_turn_leaves_nothing(tmp_path, home, work, token):
    profile = sandboxed(tmp_path, escaping_source(token), work).replace(
        args=["stay"], timeout_secs=0.5, kill_grace_secs=0.2
    )
    partials: list[str] = []
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("hi"), on_partial=partials.append)
    assert result.outcome == "timeout", (result.error, result.stderr_tail)
    assert partials == ["ready"]  # the sleeper was running before the turn timed out
    assert_no_live_process(running(token), within=4.0)


# --------------------------------------------------------------------------- warm agents


async def test_a_warm_acp_agent_in_a_sandbox_keeps_its_session_across_turns(tmp_path, home, work):
    agents = tmp_path / "agents"
    agents.mkdir()
    profile = bridge.Profile.from_mapping(
        {
            "command": [PYTHON, str(SAMPLE_AGENTS / "acp_agent.py"), "--load", "--store", str(work / "sessions")],
            "protocol": "acp",
            "cwd": str(work),
            "kill_grace_secs": 1,
            "sandbox": {"read": RUNTIME, "network": False},
        },
        profile_dir=agents,
    )
    with trio.fail_after(3 * TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            pid = agent.pid
            results = [await agent.turn(Turn(message)) for message in ("one", "two", "three", "history")]
            assert agent.pid == pid  # one process for every turn
            await agent.close()
    assert all(result.ok for result in results), [(result.error, result.stderr_tail) for result in results]
    assert [result.reply for result in results] == ["echo: one", "echo: two", "echo: three", "one | two | three"]
    assert len({result.session_id for result in results}) == 1
    assert list((work / "sessions").iterdir())  # kept where the sandbox lets it write
    assert pid is not None
    assert_no_live_process([pid])


# --------------------------------------------------------------------------- the profile


def test_without_bwrap_a_sandboxed_profile_does_not_load_and_check_names_the_package(tmp_path, monkeypatch):
    profile = write_profile(tmp_path, f'command: ["{PYTHON}", "-c", "print(1)"]\nsandbox: {{network: false}}\n')
    assert bridge.load_profile(profile).sandbox is not None  # loaded once where bwrap is: now in the cache
    no_bwrap = tmp_path / "bin"
    no_bwrap.mkdir()
    monkeypatch.setenv("PATH", str(no_bwrap))
    for cache in (True, False):  # a cached profile is not trusted to find bwrap either
        with pytest.raises(ProfileError) as caught:
            bridge.load_profile(profile, cache=cache)
        assert "apt-get install bubblewrap" in str(caught.value) and "agent.yaml:2" in str(caught.value)
    done = subprocess.run(
        [AGENT_BRIDGE, "check", str(profile)], capture_output=True, text=True, timeout=30, env={"PATH": str(no_bwrap)}
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "bwrap is not installed" in done.stderr and "install the bubblewrap package" in done.stderr


async def test_a_bwrap_removed_after_the_profile_loaded_fails_the_turn_naming_the_package(
    tmp_path, home, work, monkeypatch
):
    """Where bwrap was found is remembered for the next launches; a bwrap that is no longer there is not run from
    memory: the turn fails to start and says what to install, and once it is back the next turn runs."""
    assert BWRAP is not None
    tools = tmp_path / "tools"
    tools.mkdir()
    shutil.copy2(BWRAP, tools / "bwrap")
    monkeypatch.setenv("PATH", str(tools))
    profile = sandboxed(tmp_path, "#!/bin/sh\necho sandboxed", work)
    assert (await run(profile)).reply == "sandboxed"
    (tools / "bwrap").unlink()
    gone = await run(profile)
    assert (gone.outcome, gone.exit_code) == ("spawn_failed", 127)
    assert "bwrap is not installed" in gone.error_reply and "install the bubblewrap package" in gone.error_reply
    shutil.copy2(BWRAP, tools / "bwrap")
    assert (await run(profile)).reply == "sandboxed"


def test_the_placeholder_rule_judges_the_program_the_sandbox_runs(tmp_path):
    for command in (
        'sh -c "{{MESSAGE}}"',
        'bwrap --ro-bind / / sh -c "{{MESSAGE}}"',
    ):  # a bwrap of its own is seen through
        with pytest.raises(ProfileError, match=r"\{\{MESSAGE\}\} is the code sh -c runs"):
            bridge.parse_profile(f"command: {command}\nsandbox: {{}}\n")
    for placeholder in ("{{SESSION_ID}}", "{{MESSAGE}}", "{{SESSION_NAME}}"):
        with pytest.raises(ProfileError, match="only {{PROFILE_DIR}} and ~ may stand in a sandbox path"):
            bridge.parse_profile(f'command: cat\nsandbox: {{write: ["/srv/{placeholder}"]}}\n')
    assert bridge.parse_profile('command: cat\nsandbox: {read: ["{{PROFILE_DIR}}/data", "~/x"]}\n').sandbox


async def test_a_working_directory_that_would_uncover_the_home_does_not_start(tmp_path, home):
    profile = sandboxed(tmp_path, "#!/bin/sh\necho hi\n", home)
    result = await run(profile)
    assert result.outcome == "spawn_failed" and "uncover the home directory" in result.error_reply


def test_check_prints_the_effective_sandbox(tmp_path, home):
    (home / ".codex").mkdir()
    (tmp_path / "work").mkdir()
    profile = write_profile(
        tmp_path,
        """
        command: cat
        cwd: work
        sandbox: {read: ["{{PROFILE_DIR}}/data"], write: ["~/.codex", "~/.gone"], network: false}
        """,
    )
    done = subprocess.run([AGENT_BRIDGE, "check", str(profile)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    user_home = pwd.getpwuid(os.getuid()).pw_dir
    assert done.stdout.splitlines() == [
        f"{profile}: ok",
        f"  sandbox: bubblewrap ({BWRAP}): the system read-only, a PID namespace of its own, ended with the bridge",
        f"  writable: {tmp_path / 'work'} (the working directory: the turn's attachments and outbox), "
        f"{home / '.codex'}, {home / '.gone'} (not there: not bound)",
        f"  readable too: {tmp_path / 'data'} (not there: not bound)",
        f"  private and empty: /tmp, {home} (a home directory), {user_home} (a home directory)",
        "  network: off (a network namespace of its own, with only its own loopback)",
    ]


def test_check_warns_that_a_sandbox_with_the_network_reaches_loopback_services(tmp_path):
    """A token-less door on loopback would run unsandboxed profiles for a sandboxed agent: check says so."""
    networked = write_profile(tmp_path, "command: cat\nsandbox: {}\n", name="networked.yaml")
    offline = write_profile(tmp_path, "command: cat\nsandbox: {network: false}\n", name="offline.yaml")
    unsandboxed = write_profile(tmp_path, "command: cat\n", name="plain.yaml")
    done = subprocess.run(
        [AGENT_BRIDGE, "check", str(networked), str(offline), str(unsandboxed)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [warning] = [line for line in done.stderr.splitlines() if "warning" in line]
    assert warning.startswith(f"{networked}: warning: sandbox with network: true — the agent reaches this machine's")
    assert "serve --listen` without tokens" in warning and "set `network: false`" in warning


def test_check_warns_that_a_sandboxed_agent_could_add_profiles_beside_its_own(tmp_path):
    """Its own file is read-only to the agent, but a directory it may write can take new profiles, which `serve
    --profiles` would serve without a sandbox: check says so. A directory below its working directory is read-only
    to the agent, one apart from it out of its reach: no warning."""
    (tmp_path / "work" / "profiles").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    inside = write_profile(tmp_path / "work", "command: cat\ncwd: .\nsandbox: {network: false}\n", name="inside.yaml")
    written = write_profile(
        tmp_path, "command: cat\ncwd: elsewhere\nsandbox: {network: false, write: ['{{PROFILE_DIR}}']}\n",
        name="written.yaml",
    )  # fmt: skip
    below = write_profile(
        tmp_path / "work" / "profiles", "command: cat\ncwd: ..\nsandbox: {network: false}\n", name="below.yaml"
    )
    apart = write_profile(tmp_path, "command: cat\ncwd: work\nsandbox: {network: false}\n", name="apart.yaml")
    done = subprocess.run(
        [AGENT_BRIDGE, "check", str(inside), str(written), str(below), str(apart)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "warning" in line]
    assert [line.partition(": warning: ")[0] for line in warnings] == [str(inside), str(written)]
    assert all("bound read-only for it, but it could add a profile there" in line for line in warnings)
    assert f"({tmp_path / 'work'} is writable" in warnings[0] and f"({tmp_path} is writable" in warnings[1]


# --------------------------------------------------------------------------- the ready profiles' sandbox lines


def sandbox_line(path: Path) -> dict[str, Any]:
    """The commented sandbox line a ready profile ends with, as it reads uncommented."""
    [line] = [line for line in path.read_text().splitlines() if line.startswith("# sandbox: {")]
    section = yaml.safe_load(line.removeprefix("# "))["sandbox"]
    assert isinstance(section, dict)
    return section


@pytest.mark.parametrize("path", sorted(CLI_PROFILES.glob("*.yaml")), ids=lambda path: path.stem)
def test_every_ready_profile_turns_its_sandbox_on_with_one_line(tmp_path, path):
    text = path.read_text()
    on = text.replace("\n# sandbox: {", "\nsandbox: {")
    assert len(on.splitlines()) == len(text.splitlines()) and on != text  # one line changed
    (tmp_path / path.name).write_text(on)
    profile = bridge.load_profile(tmp_path / path.name, cache=False)
    assert profile.sandbox is not None
    assert profile.to_dict()["sandbox"] == {"read": [], "network": True, "hide_home": True, **sandbox_line(path)}
    assert profile.sandbox.write[0].startswith("~/.")  # the CLI's own directory, writable
    assert profile.sandbox.network  # coding CLIs call their model's API


@pytest.mark.parametrize("ready", [*READY, Ready("aictrl", "aictrl", "")], ids=lambda ready: ready.profile)
async def test_a_ready_profile_runs_its_cli_in_its_sandbox_and_resumes(tmp_path, monkeypatch, ready):
    """The stand-ins keep their sessions where the CLIs do: the directory the sandbox line makes writable."""
    install_fake_clis(tmp_path, monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path = CLI_PROFILES / f"{ready.profile}.yaml"
    section = sandbox_line(path)
    for directory in section["write"]:
        Path(os.path.expanduser(directory)).mkdir(parents=True)  # the CLI was logged in
    # The stand-ins' launchers live in the test's directory (hidden by the private /tmp), the samples in the repo.
    profile = bridge.load_profile(path).replace(sandbox={**section, "read": [str(tmp_path / "bin"), *RUNTIME]})
    first = await run(profile, "-h use a tool")
    assert (first.exit_code, first.outcome) == (0, "ok"), (first.error_reply, first.stderr_tail)
    assert "turn 1" in first.reply and "you said: " in first.reply and "-h use a tool" in first.reply
    if ready.resumes:
        second = await run(profile, "again", session_id=first.session_id)
        assert (second.exit_code, second.outcome) == (0, "ok"), (second.error_reply, second.stderr_tail)
        assert "last time you said" in second.reply


def codex_in_its_sandbox(home: Path, work: Path, api: OpenAIResponses, mode: str = "read-only") -> bridge.Profile:
    """The ready codex profile with its sandbox line on; `mode` for codex's own sandbox (the profile's: read-only)."""
    binary = npm_binary("codex")
    path = CLI_PROFILES / "codex.yaml"
    write_codex_home(home / ".codex", api.base_url)  # where `codex login` would have left its config
    profile = bridge.load_profile(path, cache=False)
    return profile.replace(
        command=str(profile.command).replace("--sandbox read-only", f"--sandbox {mode}"),
        cwd=str(work),
        env={"PATH": f"{binary.parent}{os.pathsep}{os.environ['PATH']}"},
        sandbox={**sandbox_line(path), "read": [str(CACHE)]},  # the cached npm package, under the real home
    )


async def test_the_real_codex_answers_and_resumes_its_thread_in_its_ready_profiles_sandbox(tmp_path, home, work):
    with OpenAIResponses() as api:
        profile = codex_in_its_sandbox(home, work, api)
        with trio.fail_after(60):
            first = await bridge.run_turn(profile, Turn("say The first answer."))
            second = await bridge.run_turn(profile, Turn("what did you say?", session_id=first.session_id))
    assert first.ok and first.reply == "The first answer.", (first.error, first.stderr_tail)
    assert second.ok and second.session_id == first.session_id, (second.error, second.stderr_tail)
    assert list((home / ".codex" / "sessions").iterdir())  # its thread is kept where the sandbox lets it write


async def test_as_root_codex_runs_its_commands_in_the_bridges_sandbox_only_without_its_own(tmp_path, home, work):
    """codex's own command sandbox (bwrap again) cannot map root into a user namespace without the capability the
    bridge's sandbox drops; with `--sandbox danger-full-access` the bridge's sandbox is what confines its commands."""
    assert os.geteuid() == 0  # the suite runs as root (make test installs bubblewrap with apt-get)
    outside = f"/var/tmp/agent-bridge-sandbox-{uuid.uuid4().hex}"  # the system: read-only in the sandbox
    with OpenAIResponses() as api:
        nested = codex_in_its_sandbox(home, work, api)
        alone = codex_in_its_sandbox(home, work, api, "danger-full-access")
        with trio.fail_after(60):
            failed = await bridge.run_turn(nested, Turn("run echo ran-by-codex"))
            ran = await bridge.run_turn(alone, Turn("run echo ran-by-codex"))
            confined = await bridge.run_turn(alone, Turn(f"run touch {work / 'inside'} {outside}"))
    assert failed.ok and "bwrap: setting up uid map" in failed.reply
    assert ran.ok and ran.reply.startswith("ran: ") and ran.reply.endswith("ran-by-codex"), (ran.error, ran.reply)
    assert confined.ok, (confined.error, confined.stderr_tail)
    assert (work / "inside").exists() and not os.path.exists(outside)


OUTLIVES = """
import os, select, sys, threading, trio
from functools import partial
import bridge
from bridge.confinement.cgroups import CONTAINMENT
from bridge.engine.launch import plan_launch
from bridge.confinement.spawner import start

CONTAINMENT.turn_off()  # else the spawn is in one of trio's worker threads, which lasts 10 s: this one ends at once
profile = bridge.Profile.from_mapping(
    {"command": ["sleep", "600"], "cwd": sys.argv[1], "sandbox": {}, "kill_grace_secs": 0.2}, profile_dir=sys.argv[1]
)
plan = plan_launch(profile, bridge.Turn("hi"), os.environ)


def started_in_a_thread_that_ends():
    started = []
    thread = threading.Thread(target=lambda: started.append(trio.run(partial(start, plan, kill_grace_secs=0.2))))
    thread.start()
    thread.join()
    return started[0]


def alive(agent):
    pidfd = os.pidfd_open(agent.pid)
    readable, _, _ = select.select([pidfd], [], [], 0.5)  # readable once bwrap exited
    return not readable


# Alone, an agent is spawned by the thread that runs its event loop, which outlives it in any host (its turn, or
# its warm session, ends inside the loop): here that thread ends at once, and its agent with it.
first = started_in_a_thread_that_ends()
# Spawned while another agent runs, it is forked by a thread that lasts, not the one its event loop runs in.
second = started_in_a_thread_that_ends()
print("alive" if alive(second) else "died")
for agent in (first, second):
    agent.signal_group(9)
    agent.reap()
"""


def test_a_sandboxed_agent_spawned_beside_others_outlives_the_thread_that_started_it(home, work):
    """bwrap's --die-with-parent fires when the *thread* that forked it ends, and trio's worker threads end after a
    few idle seconds (a warm agent died with one): sandboxed agents spawned while others run are forked from a
    thread that lasts."""
    done = subprocess.run(
        [PYTHON, "-c", OUTLIVES, str(work)], capture_output=True, text=True, timeout=TURN_DEADLINE, cwd=work
    )
    assert (done.returncode, done.stdout) == (0, "alive\n"), done.stderr


async def test_a_sandboxed_agent_alone_is_forked_by_the_event_loop_s_thread_beside_others_by_the_lasting_one(
    tmp_path, home, work, spawning_threads
):
    """A turn alone spares the hop to a thread and back (bench row 29): its event loop's thread, which outlives
    the turn, forks bwrap. Beside another agent, whose events must not wait for the spawn, the spawner thread
    does, which lasts as long as the process."""
    echo = sandboxed(tmp_path, "#!/bin/sh\necho echoed\n", work)
    hangs = sandboxed(tmp_path, "#!/bin/sh\necho 'AGENT_PARTIAL:\"up\"'\nexec sleep 600\n", work)
    assert (await run(echo)).reply == "echoed"
    with trio.fail_after(TURN_DEADLINE):
        async with bridge.open_turn(hangs, Turn("x")) as events:
            async for _ in events:
                break  # the other agent is running
            assert (await run(echo)).reply == "echoed"
    loop = threading.current_thread().name
    assert spawning_threads == [loop, loop, "agent-bridge-spawner"]


async def test_a_stop_signal_reaches_the_sandboxed_agent_which_has_its_grace(tmp_path, home, work):
    """A stop goes to the agent's own group, not to bwrap (which would take the sandbox down): a timed-out agent
    gets SIGTERM, and its kill_grace_secs, alone."""
    agents = tmp_path / "agents"
    agents.mkdir(exist_ok=True)
    write_agent(
        agents,
        "graceful.sh",
        """#!/bin/sh
        trap 'sleep 0.3; echo "saved on TERM" > graceful.txt; exit 143' TERM
        echo 'AGENT_PARTIAL:"ready"'
        while :; do sleep 0.05; done
        """,
    )
    profile = bridge.Profile.from_mapping(
        {
            "command": ["{{PROFILE_DIR}}/graceful.sh"],
            "cwd": str(work),
            "sandbox": {"read": [str(tmp_path), *RUNTIME]},
            "timeout_secs": 0.5,
            "kill_grace_secs": 5,
        },
        profile_dir=agents,
    )
    result = await run(profile)
    assert result.outcome == "timeout", (result.error, result.stderr_tail)
    assert (work / "graceful.txt").read_text() == "saved on TERM\n"
