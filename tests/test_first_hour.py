"""The first hour of a new user (issue 20, section 6), through the CLI as real processes: each mistake a
newcomer makes is explained by a message that says what to fix, without secrets or message text."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from agents_cache import npm_binary
from conftest import PYTHON, REPO, process_state, read_pids, write_agent, write_profile

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
VENV = sys.prefix


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT_BRIDGE, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=cwd,
    )


def last_result(stdout: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(stdout.splitlines()[-1])
    assert result["event"] == "result"
    return result


def python_agent(directory: Path, source: str, name: str = "agent", **fields: Any) -> Path:
    write_agent(directory, f"{name}.py", f"#!{PYTHON}\n" + textwrap.dedent(source))
    data = {"command": [f"{{{{PROFILE_DIR}}}}/{name}.py"], **fields}
    return write_profile(directory, yaml.safe_dump(data), f"{name}.yaml")


# --------------------------------------------------------------------------- credentials held back

NEEDS_A_KEY = """
import os
if os.environ.get("VENDOR_API_KEY") == "sk-secret-value" and os.environ.get("VENDOR_TOKEN"):
    print("logged in")
else:
    print('AGENT_ERROR:"Not logged in · Please run /login"')
"""
CREDENTIALS = {"VENDOR_API_KEY": "sk-secret-value", "VENDOR_TOKEN": "tok-secret-value"}
PASSING_LINE = 'env: {VENDOR_API_KEY: "${VENDOR_API_KEY}", VENDOR_TOKEN: "${VENDOR_TOKEN}"}'


def test_a_failed_turn_names_the_credentials_env_inherit_held_back_and_the_profile_line_that_passes_them(
    tmp_path: Path,
) -> None:
    profile = python_agent(tmp_path, NEEDS_A_KEY)
    env = {**os.environ, **CREDENTIALS}
    human = cli("run", str(profile), "hi", env=env)
    as_json = cli("run", str(profile), "hi", "--json", env=env)
    assert human.returncode == as_json.returncode == 1
    assert human.stderr.splitlines() == [
        "Not logged in · Please run /login",
        "agent-bridge: the agent did not get VENDOR_API_KEY, VENDOR_TOKEN from the bridge's environment "
        "(env_inherit: minimal holds back all but PATH, HOME and the like); if it needs them, add to the profile: "
        + PASSING_LINE,
    ]
    result = last_result(as_json.stdout)
    assert result["error"].startswith("Not logged in · Please run /login; the agent did not get VENDOR_API_KEY")
    assert result["error"].endswith(PASSING_LINE)
    assert result["error_reply"] == "Not logged in · Please run /login"  # the chat user is not told the bot's set-up
    for shown in (human.stdout, human.stderr, as_json.stdout, as_json.stderr):
        assert "secret-value" not in shown

    # The line it suggests is the fix.
    fixed = profile.read_text() + PASSING_LINE + "\n"
    profile.write_text(fixed)
    assert (cli("run", str(profile), "hi", env=env).stdout, cli("check", str(profile), env=env).returncode) == (
        "logged in\n",
        0,
    )


def test_serve_results_and_generic_failures_name_them_too_and_only_when_they_were_held_back(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    python_agent(profiles, "import sys; sys.exit(3)", name="exits")
    python_agent(profiles, "import sys; sys.exit(3)", name="inherits", env_inherit="all")
    python_agent(profiles, "import sys; sys.exit(3)", name="passes", env={"KEY": "${VENDOR_API_KEY}"})
    requests = "".join(
        json.dumps({"type": "turn", "id": name, "profile": name, "conversation": "c", "message": "hi"}) + "\n"
        for name in ("exits", "inherits", "passes")
    )
    served = subprocess.run(
        [AGENT_BRIDGE, "serve", "--profiles", str(profiles), "--state", str(tmp_path / "state.sqlite3")],
        input=requests,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "VENDOR_API_KEY": "sk-secret-value"},
    )
    assert served.returncode == 0, served.stderr
    results = {
        response["id"]: response
        for response in map(json.loads, served.stdout.splitlines())
        if response["type"] == "result"
    }
    assert results["exits"]["error"] == (
        "the agent exited with code 3; the agent did not get VENDOR_API_KEY from the bridge's environment "
        "(env_inherit: minimal holds back all but PATH, HOME and the like); if it needs it, add to the profile: "
        'env: {VENDOR_API_KEY: "${VENDOR_API_KEY}"}'
    )
    assert results["exits"]["error_reply"] == "The agent exited with code 3."
    assert results["inherits"]["error"] == results["passes"]["error"] == ""
    assert "secret-value" not in served.stdout + served.stderr

    # In the CLI, a generic failure shows the note after the error and the agent's stderr as before.
    human = cli("run", str(profiles / "exits.yaml"), "hi", env={**os.environ, "GH_TOKEN": "x", "HF_TOKEN": "y"})
    assert human.stderr.splitlines()[0] == "The agent exited with code 3."
    assert "the agent did not get GH_TOKEN, HF_TOKEN" in human.stderr.splitlines()[1]


# --------------------------------------------------------------------------- a generic failure says why


def test_an_agent_that_ends_without_finishing_says_why_with_its_last_stderr_line(tmp_path: Path) -> None:
    """As Gemini without auth: no result line, exit 41, and the reason only on stderr (in colour)."""
    profile = python_agent(
        tmp_path,
        """
        import sys
        sys.stderr.write("Loaded cached credentials.\\n")
        sys.stderr.write("\\x1b[31mPlease set an Auth method\\x07 in settings.json\\x1b[0m\\n\\n")
        sys.exit(41)
        """,
        protocol="gemini-stream-json",
    )
    human = cli("run", str(profile), "hi")
    as_json = cli("run", str(profile), "hi", "--json")
    expected = (
        "the agent ended without finishing its turn (its output has no result line); "
        "its stderr ends: Please set an Auth method in settings.json"
    )
    assert (human.returncode, human.stderr) == (41, expected + "\n")
    result = last_result(as_json.stdout)
    assert (result["exit_code"], result["error"], result["error_reply"]) == (41, expected, expected)


def test_the_last_stderr_line_is_bounded(tmp_path: Path) -> None:
    profile = python_agent(
        tmp_path, "import sys; sys.stderr.write('x' * 5000 + '\\n'); sys.exit(41)", protocol="gemini-stream-json"
    )
    error = last_result(cli("run", str(profile), "hi", "--json").stdout)["error"]
    said = error.split("its stderr ends: ")[1]
    assert len(said) == 200 and said.endswith("x…")


def test_real_gemini_without_auth_says_what_it_needs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    profile = write_profile(
        tmp_path,
        f"command: {npm_binary('gemini')}\nprotocol: gemini-stream-json\n"
        'args: [--output-format, stream-json, --skip-trust, "--prompt={{MESSAGE}}"]\n'
        'env: {GEMINI_CLI_NO_RELAUNCH: "true"}\ntimeout_secs: 60\n',
        "gemini.yaml",
    )
    done = cli("run", str(profile), "hi", env={**os.environ, "HOME": str(home), "GEMINI_API_KEY": "not-passed"})
    assert done.returncode == 41
    assert "its stderr ends: Please set an Auth method" in done.stderr
    assert 'add under its env: GEMINI_API_KEY: "${GEMINI_API_KEY}"' in done.stderr
    assert "not-passed" not in done.stderr


# --------------------------------------------------------------------------- mistakes in the profile and the script


def test_an_unquoted_placeholder_value_says_to_quote_it(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "description: mine\ncommand: {{PROFILE_DIR}}/a.sh\n", "unquoted.yaml")
    ran, checked = cli("run", str(profile), "hi"), cli("check", str(profile))
    assert ran.returncode == checked.returncode == 2
    hint = (
        'a value that starts with {{ must be in quotes, or YAML reads it as a mapping: write "{{PROFILE_DIR}}/a.sh" '
        "(line 2)"
    )
    assert hint in ran.stderr and hint in checked.stderr
    quoted = write_profile(tmp_path, 'command: ["a {{MESSAGE}}", [x\n', "other.yaml")
    assert "must be in quotes" not in cli("check", str(quoted)).stderr  # a quoted one is not the problem


def test_a_script_with_windows_line_endings_says_so_and_how_to_convert_it(tmp_path: Path) -> None:
    write_agent(tmp_path, "crlf.sh", "#!/bin/sh\r\necho hi\r\n")
    profile = write_profile(tmp_path, 'command: "{{PROFILE_DIR}}/crlf.sh"\n', "crlf.yaml")
    done = cli("run", str(profile), "hi")
    assert done.returncode == 126
    assert "has Windows line endings (CRLF)" in done.stderr
    assert f"sed -i 's/\\r$//' {tmp_path}/crlf.sh (or dos2unix {tmp_path}/crlf.sh)" in done.stderr
    subprocess.run(["sed", "-i", "s/\\r$//", str(tmp_path / "crlf.sh")], check=True)
    assert cli("run", str(profile), "hi").stdout == "hi\n"  # the advice works


def test_a_relative_command_not_found_suggests_profile_dir(tmp_path: Path) -> None:
    write_agent(tmp_path, "agent.sh", "#!/bin/sh\necho hi\n")
    profile = write_profile(tmp_path, "command: ./agent.sh\n", "relative.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran, checked = cli("run", str(profile), "hi", cwd=elsewhere), cli("check", str(profile), cwd=elsewhere)
    assert ran.returncode == 127
    assert ran.stderr == (
        f"The agent could not be started: command './agent.sh' not found (relative to {elsewhere}, the agent's "
        'working directory); for a file next to the profile, write "{{PROFILE_DIR}}/agent.sh".\n'
    )
    assert checked.returncode == 0  # it may run elsewhere: a warning
    assert (
        'does not exist (relative to the directory the bridge runs in); for a file next to the profile, write "{{PROFILE_DIR}}/agent.sh"'
        in (checked.stderr)
    )


# --------------------------------------------------------------------------- said once


def test_a_warm_agent_that_cannot_start_is_reported_once_like_a_one_shot_one(tmp_path: Path) -> None:
    write_agent(tmp_path, "dies.sh", "#!/bin/sh\necho 'no credentials found' >&2\nexit 1\n")
    warm = write_profile(
        tmp_path, 'protocol: aionrs\ncommand: ["{{PROFILE_DIR}}/dies.sh", "--json-stream"]\n', "w.yaml"
    )
    plain, louder, as_json = (
        cli("run", str(warm), "hi"),
        cli("run", str(warm), "hi", "--log-level", "info"),
        cli("run", str(warm), "hi", "--json"),
    )
    assert plain.returncode == louder.returncode == as_json.returncode == 126
    said, tail = plain.stderr.splitlines()  # no log record before them
    assert said.startswith("The agent could not be started: the agent could not start its session: aionrs ended")
    assert tail == "  stderr: no credentials found"
    for record in (louder.stderr, as_json.stderr):  # the record, at a higher verbosity, and for programs
        assert "agent could not be started" in record and "exit_code" in record


# --------------------------------------------------------------------------- Ctrl-C, check, make install


def test_a_second_ctrl_c_kills_the_agent_at_once_and_says_so(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    profile = python_agent(
        tmp_path,
        """
        import os, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stubborn agent: the grace period would be spent whole
        with open(os.environ["PID_FILE"], "w") as out:
            out.write(f"{os.getpid()}\\n")
        print('AGENT_PARTIAL:"ready"', flush=True)
        time.sleep(600)
        """,
        kill_grace_secs=60,
        env={"PID_FILE": str(pid_file)},
    )
    with subprocess.Popen(
        [AGENT_BRIDGE, "run", str(profile), "hi"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(5) == "ready"
        proc.send_signal(signal.SIGINT)
        assert proc.stderr.readline() == "agent-bridge: stopping the agent; press Ctrl-C again to kill it at once\n"
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        proc.wait(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - started < 10  # not the 60 s of grace
    assert rest.splitlines() == [
        "agent-bridge: interrupted again: the agent was killed at once (SIGKILL)",
        "The agent was cancelled.",
    ]
    assert all(process_state(pid) is None for pid in read_pids(pid_file))


def test_check_warns_about_an_unset_variable_as_run_does(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path, 'command: [sh, -c, "echo $X"]\nenv: {X: "${NOT_SET_ANYWHERE}", Y: "${HOME}"}\n', "unset.yaml"
    )
    checked = cli("check", str(profile))
    ran = cli("run", str(profile), "hi", "--log-format", "console")
    warning = "env X: ${NOT_SET_ANYWHERE} is not set in the bridge's environment; it expands to empty"
    assert checked.returncode == 0 and checked.stderr.count("warning: ") == 1
    assert f"{profile}: warning: {warning}" in checked.stderr
    assert warning in ran.stderr


def test_make_install_takes_extras_and_the_psycopg_hint_says_how_from_a_checkout(tmp_path: Path) -> None:
    planned = subprocess.run(
        ["make", "-n", "-C", str(REPO), "-o", f"{VENV}/.installed", f"VENV={VENV}", "install", "EXTRAS=postgres"],
        env={**os.environ, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert planned.returncode == 0, planned.stderr
    assert f"{VENV}/bin/python -m pip install -q -e '.[postgres]'" in planned.stdout
    code = "import sys; sys.modules['psycopg'] = None; from bridge.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [PYTHON, "-c", code, "sessions", "list", "--state", "postgresql://bridge@127.0.0.1/db"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "pip install 'agent-bridge[postgres]' (in a checkout of agent-bridge: make install EXTRAS=postgres)" in (
        done.stderr
    )


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "SSH_AUTH_SOCK", "KEYBOARD", "PGPASSFILE"])
def test_names_that_are_not_credentials_are_never_named(tmp_path: Path, name: str) -> None:
    profile = python_agent(tmp_path, "import sys; sys.exit(2)")
    result = last_result(cli("run", str(profile), "hi", "--json", env={**os.environ, name: "1"}).stdout)
    assert result["error"] == ""
