"""Every example in the README runs, as a user would run it, so the README cannot drift from the program.

How each fenced block is run is written in an HTML comment before it (see
`readme_examples` for the modes). `README_UNDER_TEST=path/to/README.md` runs
another copy's examples (a draft, before it replaces the README).
"""

from __future__ import annotations

import os
import select
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO
from readme_examples import Example, examples, lines_match, synopsis_commands, transcript_steps, value_matches
from terminal import Terminal, screen_lines

README = Path(os.environ.get("README_UNDER_TEST") or REPO / "README.md")
EXAMPLES = examples(README.read_text())
RUN = [example for example in EXAMPLES if not example.problem and example.mode not in ("illustration", "file")]
DEADLINE = 60  # seconds for one command of an example; they take well under one


def test_every_fenced_block_says_how_it_is_tested() -> None:
    problems = [f"{README}:{example.line}: {example.problem}" for example in EXAMPLES if example.problem]
    assert not problems, "\n".join(problems)
    assert len(RUN) >= 10, "the README's examples are found"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's home where `make install` has put `agent-bridge` on PATH (~/.local/bin)."""
    home = tmp_path_factory.mktemp("home")
    venv = sys.prefix
    done = subprocess.run(
        ["make", "-s", "-C", str(REPO), "-o", f"{venv}/.installed", f"VENV={venv}", "install"],
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0, done.stderr
    assert (home / ".local" / "bin" / "agent-bridge").exists()
    return home


@dataclass
class Place:
    """Where an example runs: its own directory and the environment of a fresh shell."""

    dir: Path
    env: dict[str, str]

    def run(self, command: str, *, cwd: Path | None = None, merged: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["sh", "-c", command],
            cwd=cwd or self.dir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            text=True,
            timeout=DEADLINE,
        )


def fresh_shell(home: Path, directory: Path) -> dict[str, str]:
    """The user's environment in a new terminal: PATH as their login made it (not the test's venv) plus ~/.local/bin."""
    venv_bin = Path(sys.prefix, "bin").resolve()
    path = [entry for entry in os.environ.get("PATH", "").split(":") if entry and Path(entry).resolve() != venv_bin]
    environ = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("AGENT_") and name not in ("VIRTUAL_ENV", "NO_COLOR")
    }
    for name in ("state", "cache", "tmp"):
        (directory / ".env" / name).mkdir(parents=True)
    # The README shows programs' messages in English (ls: cannot access …): the C locale, whatever the machine's.
    return {
        **environ,
        "HOME": str(home),
        "PATH": ":".join([str(home / ".local" / "bin"), *path]),
        "TERM": "dumb",
        "LC_ALL": "C",
        "LANG": "C",
        "XDG_STATE_HOME": str(directory / ".env" / "state"),
        "XDG_CACHE_HOME": str(directory / ".env" / "cache"),
        "TMPDIR": str(directory / ".env" / "tmp"),
    }


@pytest.fixture
def place(home: Path, tmp_path: Path) -> Place:
    for name in ("profiles", "sample_agents"):
        shutil.copytree(REPO / name, tmp_path / name)
    for example in EXAMPLES:
        if example.mode == "file" and not example.problem:
            path = tmp_path / example.positional[0]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(example.text)
    return Place(tmp_path, fresh_shell(home, tmp_path))


@pytest.mark.parametrize("example", RUN, ids=lambda example: example.name)
def test_the_readme_example_runs_as_written(example: Example, place: Place) -> None:
    RUNNERS[example.mode](example, place)


# --------------------------------------------------------------------------- the modes


def run_sh(example: Example, place: Place) -> None:
    options = example.options
    cwd = REPO if options.get("cwd") == "repo" else None
    placeholder, _, value = options.get("subst", "").partition("=")
    shown = ""
    for line in example.text.splitlines():
        command = line.strip()
        if not command or command.startswith("#"):
            continue
        if placeholder:
            command = command.replace(placeholder, value)
        if (dry := options.get("dry")) and command.startswith(dry):
            command = "make -n " + command.removeprefix("make ")
        done = place.run(command, cwd=cwd)
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        shown += done.stdout + done.stderr
    assert options.get("expect", "") in shown, shown


def run_transcript(example: Example, place: Place) -> None:
    for command, shown in transcript_steps(example.text):
        done = place.run(command, merged=True)
        problem = lines_match(shown, done.stdout.splitlines())
        assert not problem, f"$ {command}\n{problem}"


def run_chat(example: Example, place: Place) -> None:
    [(command, shown)] = transcript_steps(example.text)
    program, *args = shlex.split(command)
    found = shutil.which(program, path=place.env["PATH"])
    assert found, f"{program} is not on PATH"
    terminal = Terminal(*args, env=place.env, program=found, cwd=str(place.dir))
    try:
        for line in shown:
            if line.startswith("you> "):
                terminal.expect(b"you> ")
                typed = line.removeprefix("you> ")
                terminal.send(b"\x04" if typed == "^D" else typed.encode() + b"\n")
        assert terminal.exit_code() == 0
    finally:
        terminal.close()
    expected = ["you> " if line == "you> ^D" else line for line in shown]  # Ctrl-D is not echoed
    problem = lines_match(expected, screen_lines(terminal.output))
    assert not problem, problem


def run_serve(example: Example, place: Place) -> None:
    import json

    vary = frozenset(example.options.get("vary", "").split())
    command = shlex.split(example.options.get("command", "agent-bridge serve --profiles profiles/"))
    steps = [(line[:1], line[1:].strip()) for line in example.text.splitlines() if line[:1] in ("→", "←")]
    with open(place.dir / "serve.log", "w") as log:
        proc = subprocess.Popen(
            command, cwd=place.dir, env=place.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
        )
    assert proc.stdin is not None and proc.stdout is not None
    responses = _Lines(proc.stdout.fileno())
    pending: list[dict[str, object]] = []

    def receive_all() -> None:
        while pending:
            response = json.loads(responses.next())
            mine = [expected for expected in pending if expected.get("id") == response.get("id")]
            assert mine, f"a response the README does not show: {response}"
            assert value_matches(mine[0], response, vary), f"README: {mine[0]}\nactual: {response}"
            pending.remove(mine[0])

    try:
        previous = ""
        for arrow, line in steps:
            if arrow == "→":
                if previous == "←":
                    receive_all()  # the README's request comes after these responses
                proc.stdin.write(line.encode() + b"\n")
                proc.stdin.flush()
            else:
                pending.append(json.loads(line))
            previous = arrow
        receive_all()
        proc.stdin.close()  # EOF: serve finishes and exits 0
        assert proc.wait(timeout=DEADLINE) == 0
        rest = responses.rest()
        assert not rest, f"responses the README does not show: {rest}"
    finally:
        proc.kill()
        proc.wait()


class _Lines:
    """Lines from a pipe, each within the deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def next(self) -> str:
        deadline = time.monotonic() + DEADLINE
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self.fd, 65536) if ready else b""
            assert chunk, f"serve said nothing more; the README expects more responses (so far: {self.buffer!r})"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def rest(self) -> bytes:
        while chunk := os.read(self.fd, 65536):
            self.buffer += chunk
        return self.buffer


def run_python(example: Example, place: Place) -> None:
    program = place.dir / "example.py"
    program.write_text(example.text)
    done = subprocess.run(
        [sys.executable, str(program)],
        cwd=place.dir,
        env=place.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0, done.stderr
    assert example.options.get("expect", "") in done.stdout, done.stdout


def run_agent(example: Example, place: Place) -> None:
    agent = place.dir / "agent"
    agent.write_text(example.text)
    agent.chmod(0o755)
    (place.dir / "agent.yaml").write_text(f"command: [{str(agent)!r}]\n")
    done = place.run(f"agent-bridge run agent.yaml {shlex.quote(example.options.get('message', 'hi'))}")
    assert (done.returncode, done.stdout) == (0, example.options["reply"] + "\n"), done.stderr


def run_profile(example: Example, place: Place) -> None:
    first = example.text.splitlines()[0]
    name = example.positional[0] if example.positional else first.removeprefix("#").strip()
    path = place.dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(example.text)
    done = place.run(f"agent-bridge check {shlex.quote(name)}")
    assert (done.returncode, done.stdout) == (0, f"{name}: ok\n"), done.stderr


def run_synopsis(example: Example, place: Place) -> None:
    commands = synopsis_commands(example.text)
    assert commands, "no agent-bridge command in the synopsis"
    for path, options in commands:
        done = place.run(f"agent-bridge {' '.join(path)} --help")
        assert done.returncode == 0, (path, done.stderr)
        words = set(done.stdout.replace(",", " ").replace("[", " ").replace("]", " ").split())
        missing = [option for option in options if option not in words]
        assert not missing, f"agent-bridge {' '.join(path)} has no {', '.join(missing)}"


RUNNERS: dict[str, Callable[[Example, Place], None]] = {
    "sh": run_sh,
    "transcript": run_transcript,
    "chat": run_chat,
    "serve": run_serve,
    "python": run_python,
    "agent": run_agent,
    "profile": run_profile,
    "synopsis": run_synopsis,
}


def test_the_rules_that_match_the_readme_to_the_output() -> None:
    from readme_examples import line_matches, text_matches

    assert text_matches("turn 1 of session 3dc0…", "turn 1 of session " + "a" * 32)
    assert text_matches(
        "stream   dev   3dc091b7ddd74f1bbda1a76c4ec25cb8  2025-05-02 09:14:03  ok",
        "stream   dev   " + "b" * 32 + "  2026-11-22 11:28:00  ok",
    )
    assert text_matches("working on it… ", "working on it… ") and not text_matches("hello", "hello there")
    assert line_matches('{"a": 1, "duration_ms": 181}', '{"a": 1, "duration_ms": 7}')
    assert not line_matches('{"a": 1}', '{"a": 1, "usage": null}'), "a field the README does not show"
    assert not line_matches('{"a": 1}', '{"a": 2}')
    [marked, unmarked, wrong] = examples(
        "<!-- example: sh expect='a b' -->\n```sh\nx\n```\n\n```\ny\n```\n<!-- example: nonsense -->\n```\nz\n```\n"
    )
    assert (marked.mode, marked.options, marked.text) == ("sh", {"expect": "a b"}, "x\n")
    assert "no <!-- example" in unmarked.problem and "mode must be one of" in wrong.problem
