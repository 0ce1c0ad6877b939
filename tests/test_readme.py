"""Every example in the README and in docs/ runs, as a user would run it, so the pages cannot drift from the
program; and the pages hold together: every link between them leads somewhere, every page is in mkdocs.yml's
navigation, the README stays a front page, and the code cites the project's own contract (docs/protocol.md).

How each fenced block is run is written in an HTML comment before it (see
`readme_examples` for the modes). `DOCS_UNDER_TEST=path` runs the examples of
another copy of one page, or of every page under a directory (a draft, before
it replaces the page).
"""

from __future__ import annotations

import os
import re
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
import yaml
from conftest import REPO
from readme_examples import (
    Example,
    examples,
    heading_anchors,
    lines_match,
    relative_links,
    synopsis_commands,
    transcript_steps,
    value_matches,
)
from terminal import Terminal, screen_lines


def pages_under(root: Path) -> list[Path]:
    """The README and every page of docs/ (or, under test, the draft named)."""
    if (draft := os.environ.get("DOCS_UNDER_TEST")) is not None:
        path = Path(draft)
        return sorted(path.rglob("*.md")) if path.is_dir() else [path]
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def page_name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


PAGES = pages_under(REPO)
EXAMPLES = [example for page in PAGES for example in examples(page.read_text(), page_name(page))]
RUN = [example for example in EXAMPLES if not example.problem and example.mode not in ("illustration", "file")]
FILES = [example for example in EXAMPLES if example.mode == "file" and not example.problem]
DEADLINE = 60  # seconds for one command of an example; they take well under one
README_MAX_LINES = 400  # a front page: what it is, install, the commands, a tour, the paths onward


def test_every_fenced_block_says_how_it_is_tested() -> None:
    problems = [f"{example.page}:{example.line}: {example.problem}" for example in EXAMPLES if example.problem]
    assert not problems, "\n".join(problems)
    assert len(RUN) >= 10, "the pages' examples are found"


def test_pages_that_show_the_same_file_show_the_same_text() -> None:
    shown: dict[str, Example] = {}
    for example in FILES:
        first = shown.setdefault(example.positional[0], example)
        assert first.text == example.text, f"{example.name} and {first.name} show {example.positional[0]} differently"


@pytest.mark.skipif("DOCS_UNDER_TEST" in os.environ, reason="checks the repository's pages")
def test_every_relative_link_leads_to_a_file_and_a_heading_of_it() -> None:
    problems = []
    for page in PAGES:
        for line, target in relative_links(page.read_text()):
            path, _, anchor = target.partition("#")
            destination = (page.parent / path).resolve() if path else page
            if not destination.exists() or not destination.is_relative_to(REPO):
                problems.append(f"{page_name(page)}:{line}: {target}: no such file in the repository")
            elif anchor and destination.suffix == ".md" and anchor not in heading_anchors(destination.read_text()):
                problems.append(f"{page_name(page)}:{line}: {target}: {page_name(destination)} has no such heading")
    assert not problems, "\n".join(problems)


def navigation_pages(entries: object) -> list[str]:
    """The pages mkdocs.yml's `nav` names, in order."""
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in navigation_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in navigation_pages(value)]
    return []


@pytest.mark.skipif("DOCS_UNDER_TEST" in os.environ, reason="checks the repository's pages")
def test_the_navigation_names_every_page_of_docs_once() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    named = navigation_pages(config["nav"])
    on_disk = sorted(str(path.relative_to(REPO / "docs")) for path in (REPO / "docs").rglob("*.md"))
    assert sorted(named) == on_disk, "mkdocs.yml's nav and the pages of docs/ differ"
    assert named[0] == "index.md"


@pytest.mark.skipif("DOCS_UNDER_TEST" in os.environ, reason="checks the repository's pages")
def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for command in ("agent-bridge run", "agent-bridge serve"):
        assert command in readme


def test_the_code_cites_the_projects_own_contract() -> None:
    """No citation of the original SPEC (the project states its own contract); every "protocol §N" or
    "docs/protocol.md §N" names a section there."""
    spec = "SPEC"  # spelt apart, so this test does not find itself
    sections = set(re.findall(r"^## (\d+)\. ", (REPO / "docs" / "protocol.md").read_text(), re.M))
    problems = []
    for path in sorted([*REPO.glob("bridge/**/*.py"), *REPO.glob("tests/*.py")]):
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{path.relative_to(REPO)}:{number}"
            if f"{spec} §" in line or f"{spec}'s" in line:
                problems.append(f"{where}: cites SPEC; cite docs/protocol.md's section instead")
            for cited in re.findall(r"protocol(?:\.md)? (§[\d–, §-]+)", line):
                for section in re.findall(r"\d+", cited):
                    if section not in sections:
                        problems.append(f"{where}: docs/protocol.md has no §{section}")
    assert not problems, "\n".join(problems)


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
    # The pages show programs' messages in English (ls: cannot access …): the C locale, whatever the machine's.
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
    for example in FILES:
        if True:
            path = tmp_path / example.positional[0]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(example.text)
    return Place(tmp_path, fresh_shell(home, tmp_path))


# An example may be a whole session of commands (docs/coding-clis.md runs nineteen turns): more than the 30 s
# a single test gets, on a machine busy with the rest of the suite.
@pytest.mark.timeout(120)
@pytest.mark.parametrize("example", RUN, ids=lambda example: example.name)
def test_the_example_runs_as_written(example: Example, place: Place) -> None:
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
            assert mine, f"a response the page does not show: {response}"
            assert value_matches(mine[0], response, vary), f"page:   {mine[0]}\nactual: {response}"
            pending.remove(mine[0])

    try:
        previous = ""
        for arrow, line in steps:
            if arrow == "→":
                if previous == "←":
                    receive_all()  # the page's request comes after these responses
                proc.stdin.write(line.encode() + b"\n")
                proc.stdin.flush()
            else:
                pending.append(json.loads(line))
            previous = arrow
        receive_all()
        proc.stdin.close()  # EOF: serve finishes and exits 0
        assert proc.wait(timeout=DEADLINE) == 0
        rest = responses.rest()
        assert not rest, f"responses the page does not show: {rest}"
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
            assert chunk, f"serve said nothing more; the page expects more responses (so far: {self.buffer!r})"
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
    assert not line_matches('{"a": 1}', '{"a": 1, "usage": null}'), "a field the page does not show"
    assert not line_matches('{"a": 1}', '{"a": 2}')
    [marked, unmarked, wrong] = examples(
        "<!-- example: sh expect='a b' -->\n```sh\nx\n```\n\n```\ny\n```\n<!-- example: nonsense -->\n```\nz\n```\n"
    )
    assert (marked.mode, marked.options, marked.text) == ("sh", {"expect": "a b"}, "x\n")
    assert "no <!-- example" in unmarked.problem and "mode must be one of" in wrong.problem
    assert marked.name == "README.md:2 (sh)"


def test_the_rules_that_check_links_between_pages() -> None:
    page = (
        "# Running on several machines\n## What `serve` does, and why\n## Notes\n## Notes\n"
        "See [the guide](guide.md#exit-codes), ![plot](../bench/results.png), [up](#notes-1), "
        "[a site](https://example.com) and `[not a link](x.md)`.\n```\n[in code](y.md)\n# not a heading\n```\n"
    )
    assert relative_links(page) == [(5, "guide.md#exit-codes"), (5, "../bench/results.png"), (5, "#notes-1")]
    assert heading_anchors(page) == {"running-on-several-machines", "what-serve-does-and-why", "notes", "notes-1"}
