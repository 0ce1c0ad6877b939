"""What the pages say about the program holds, where no example runs to show it:

- every option a page writes after an `agent-bridge` command is one that command takes (its --help lists it),
  and a default a page gives an option is the one its --help gives;
- the tables of a profile's fields give the defaults of the profile's schema (`agent-bridge schema`);
- every Python name a page writes (`bridge.open_host`, `bridge.host.interface.TurnObserver`) can be imported;
- every file of the repository a page names in code (`tests/test_first_hour.py`, `profiles/clis/`) is there;
- docs/index.md, the docs' front page on GitHub, leads to every page, and the guide's table of what an agent
  gets names every variable the contract gives it.

tests/test_readme.py runs the pages' examples (and checks a `synopsis` block's options); these check every other
piece of code a page shows — inline spans of the prose, illustrations, transcripts — and the defaults the prose
quotes. A page is the README or any page of docs/ (DOCS_UNDER_TEST as in test_readme).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from readme_examples import relative_links
from test_readme import PAGES, page_name

import bridge

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# A command's options are those its usage lists; a default is what an option's help ends with, "(default: 32)".
HELP_OPTION = re.compile(r"^  (--[a-z][a-z0-9-]*)(.*?)(?=^  -|^\S|\Z)", re.M | re.S)
HELP_DEFAULT = re.compile(r"\(default: ([^)]*)\)")
# An option a page gives a default: "`--file-ttl` seconds (default 600)".
PAGE_DEFAULT = re.compile(r"`(--[a-z][a-z0-9-]*)`[^.;`(]{0,40}\(default:? ([0-9][0-9.]*)")


def help_of(*command: str) -> str:
    done = subprocess.run([AGENT_BRIDGE, *command, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def listed(help_text: str, heading: str) -> list[str]:
    """The commands (or actions) a help text lists under `heading` (`COMMAND`, `ACTION`)."""
    block = help_text.split(f"  {heading}\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^    ([a-z]+)\b", block, re.M)


def commands() -> dict[str, str]:
    """Each command (and `sessions ACTION`) and its --help, read at once: each costs an interpreter start-up."""
    names = [(name,) for name in listed(help_of(), "COMMAND")]
    names += [("sessions", action) for action in listed(help_of("sessions"), "ACTION")]
    running = [
        (name, subprocess.Popen([AGENT_BRIDGE, *name, "--help"], stdout=subprocess.PIPE, text=True)) for name in names
    ]
    helps = {}
    for name, process in running:
        helps[" ".join(name)], _ = process.communicate(timeout=60)
        assert process.returncode == 0, name
    return helps


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    return commands()


def usage_options(help_text: str) -> set[str]:
    return {"--help", *OPTION.findall(help_text.split("\n\n", 1)[0])}


def defaults(help_text: str) -> dict[str, str]:
    found = {}
    for option, text in HELP_OPTION.findall(help_text):
        if default := HELP_DEFAULT.search(" ".join(text.split())):
            found[option] = default.group(1)
    return found


def code_of(markdown: str) -> Iterator[tuple[int, str]]:
    """Each line of a fenced block (a shell's `\\` continuation joined) and each inline code span of the prose, with
    its line number."""
    fenced, held = False, ""
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and line.endswith("\\"):
            held += line[:-1]
        elif fenced:
            yield number, held + line
            held = ""
        else:
            for span in re.findall(r"`([^`]+)`", line):
                yield number, span


def command_lines(code: str, names: set[str]) -> Iterator[tuple[str, str]]:
    """Each command of `names` a piece of code runs, and the words that follow it: `agent-bridge serve --listen …`,
    or a span that is a command and its options alone (`worker --metrics`). Pipes, `;`, `&&` and a shell comment
    end a command."""
    spoken = "|".join(sorted(names, key=len, reverse=True))
    for part in re.split(r"\||;|&&|\$\(| #", code):
        part = part.strip().removeprefix("$ ")
        if found := re.search(rf"\bagent-bridge\s+(?:--log-\S+\s+\S+\s+)*({spoken})\b", part):
            yield found.group(1), part[found.end() :]
        elif found := re.match(rf"({spoken})\s+--", part):
            yield found.group(1), part[found.end(1) :]


def unknown_options(pages: list[Path], helps: dict[str, str]) -> list[str]:
    taken = {name: usage_options(text) for name, text in helps.items()}
    problems = []
    for page in pages:
        for line, code in code_of(page.read_text()):
            for name, rest in command_lines(code, set(taken)):
                for option in OPTION.findall(rest):
                    if option not in taken[name]:
                        problems.append(f"{page_name(page)}:{line}: agent-bridge {name} takes no {option}")
    return problems


def wrong_defaults(pages: list[Path], helps: dict[str, str]) -> list[str]:
    given: dict[str, set[str]] = {}
    for text in helps.values():
        for option, default in defaults(text).items():
            given.setdefault(option, set()).add(default)
    problems = []
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for option, default in PAGE_DEFAULT.findall(line):
                if default not in given.get(option, set()):
                    problems.append(
                        f"{page_name(page)}:{number}: {option} (default {default}): --help says "
                        + (", ".join(sorted(given[option])) if option in given else "no default")
                    )
    return problems


def test_every_option_a_page_writes_after_a_command_is_one_the_command_takes(helps: dict[str, str]) -> None:
    assert {"run", "serve", "worker", "sessions forget"} <= set(helps), "the commands are found"
    problems = unknown_options(PAGES, helps)
    assert not problems, "\n".join(problems)


def test_a_default_a_page_gives_an_option_is_the_one_its_help_gives(helps: dict[str, str]) -> None:
    assert defaults(helps["serve"])["--max-concurrent"] == "32", "the defaults are read"
    problems = wrong_defaults(PAGES, helps)
    assert not problems, "\n".join(problems)


def test_the_checks_find_a_drifted_page(helps: dict[str, str], tmp_path: Path) -> None:
    page = tmp_path / "drifted.md"
    page.write_text(
        "Run `agent-bridge worker --postgres DSN --state x.sqlite3`, or `serve --listn 127.0.0.1:0`.\n"
        "A file waits `--file-ttl` seconds (default 300).\n"
        "```sh\n$ agent-bridge --log-level info run profiles/echo.yaml --jsn hi   # not --state either\n"
        "agent-bridge connect bot.yaml \\\n    --profiles profiles/ --max-concurrent 8\n```\n"
    )
    assert unknown_options([page], helps) == [
        f"{page}:1: agent-bridge worker takes no --state",
        f"{page}:1: agent-bridge serve takes no --listn",
        f"{page}:4: agent-bridge run takes no --jsn",
        f"{page}:6: agent-bridge connect takes no --max-concurrent",
    ]
    assert wrong_defaults([page], helps) == [f"{page}:2: --file-ttl (default 300): --help says 600"]


# The pages whose tables give a profile's fields and their defaults, and the section of the profile each describes.
FIELD_TABLES = {"profiles.md": "", "sandbox.md": "sandbox", "attachments.md": "attachments"}
TABLE_ROW = re.compile(r"^\| `(\w+)` \| ([^|]*) \|", re.M)


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    done = subprocess.run([AGENT_BRIDGE, "schema"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = json.loads(done.stdout)
    return loaded


def fields_of(schema: dict[str, Any], section: str) -> dict[str, Any]:
    """The properties of the profile's top level, or of one of its sections (`sandbox`)."""
    if not section:
        return dict(schema["properties"])
    refs = [choice["$ref"] for choice in schema["properties"][section]["anyOf"] if "$ref" in choice]
    return dict(schema["$defs"][refs[0].rsplit("/", 1)[1]]["properties"])


def default_tables(markdown: str) -> Iterator[tuple[int, str, str]]:
    """Each row of a table whose second column is `default`: its line, the field and the default's cell."""
    in_table = False
    for number, line in enumerate(markdown.splitlines(), 1):
        if re.match(r"^\| \w+ \| default \|", line):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and (row := TABLE_ROW.match(line)):
            yield number, row.group(1), row.group(2).strip()


def documented_default(cell: str) -> tuple[bool, Any]:
    """What a default's cell says, when it says a value: `600`, `"AGENT_SESSION:"`, 26214400 (25 MiB), absent."""
    if written := re.match(r"`([^`]*)`", cell):
        return True, yaml.safe_load(written.group(1))
    if number := re.match(r"(\d+)\b", cell):
        return True, int(number.group(1))
    return cell.startswith("absent"), None


def wrong_field_defaults(page: Path, fields: dict[str, Any]) -> list[str]:
    problems = []
    for line, field, cell in default_tables(page.read_text()):
        says, value = documented_default(cell)
        if field not in fields:
            problems.append(f"{page_name(page)}:{line}: the profile has no field {field}")
        elif says and fields[field].get("default") != value:
            problems.append(
                f"{page_name(page)}:{line}: {field} defaults to {fields[field].get('default')!r}, not {cell}"
            )
    return problems


@pytest.mark.skipif("DOCS_UNDER_TEST" in os.environ, reason="checks the repository's pages")
def test_the_tables_of_a_profiles_fields_give_the_schemas_defaults(schema: dict[str, Any]) -> None:
    problems = []
    for name, section in FIELD_TABLES.items():
        problems += wrong_field_defaults(REPO / "docs" / name, fields_of(schema, section))
    assert not problems, "\n".join(problems)
    rows = {field for _, field, _ in default_tables((REPO / "docs" / "profiles.md").read_text())}
    undocumented = set(schema["properties"]) - set(bridge.dialects.PROTOCOLS) - rows
    assert not undocumented, f"docs/profiles.md's table has no row for {sorted(undocumented)}"


def test_the_field_check_finds_a_drifted_default(schema: dict[str, Any], tmp_path: Path) -> None:
    page = tmp_path / "drifted.md"
    page.write_text(
        "| field | default | meaning |\n|---|---|---|\n| `timeout_secs` | `600` | … |\n| `kill_grace_secs` | `5` | … |\n"
        "| `idle_timeout_secs` | `60` | … |\n| `cwd` | absent | … |\n| `timout_secs` | 3 | … |\n"
    )
    assert wrong_field_defaults(page, fields_of(schema, "")) == [
        f"{page}:3: timeout_secs defaults to 1800.0, not `600`",
        f"{page}:5: idle_timeout_secs defaults to None, not `60`",
        f"{page}:7: the profile has no field timout_secs",
    ]
    assert fields_of(schema, "sandbox")["hide_home"]["default"] is True


PYTHON_NAME = re.compile(r"(?<![\w./-])bridge(?:\.[A-Za-z_]\w*)+")


def importable(dotted: str) -> bool:
    """Whether `bridge.x.y` is a module, or an attribute of the longest module it starts with."""
    parts = dotted.split(".")
    for known in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:known]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[known:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def missing_names(pages: list[Path]) -> list[str]:
    problems = []
    for page in pages:
        if page.name == "changelog.md":  # it names what was renamed, as it was then
            continue
        for line, code in code_of(page.read_text()):
            for name in PYTHON_NAME.findall(code):
                if not name.endswith(".py") and not importable(name):
                    problems.append(f"{page_name(page)}:{line}: {name} cannot be imported")
    return problems


def test_every_python_name_a_page_writes_can_be_imported() -> None:
    problems = missing_names(PAGES)
    assert not problems, "\n".join(problems)


def test_the_name_check_finds_a_drifted_name(tmp_path: Path) -> None:
    page = tmp_path / "drifted.md"
    page.write_text("Call `bridge.open_host(...)`, then `bridge.serving.ClientSession` and `bridge.host.nope.Thing`.\n")
    assert missing_names([page]) == [
        f"{page}:1: bridge.serving.ClientSession cannot be imported",
        f"{page}:1: bridge.host.nope.Thing cannot be imported",
    ]


# A file or directory of this repository, in a span or a block: a name with an extension, or a directory ending in
# `/`. Paths the build makes and .gitignore names (bench/results/, .venv/) are not the repository's.
REPO_PATH = re.compile(r"(?<![\w./~$-])(?:bridge|tests|tools|bench|profiles|sample_agents|docs)/[\w./-]*(?:\.\w+|/)")
MADE_BY_THE_BUILD = ("bench/results/", "bench/.venv", ".venv/")


def missing_paths(pages: list[Path], root: Path) -> list[str]:
    problems = []
    for page in pages:
        if page.name == "changelog.md":  # it names what was moved, as it was then
            continue
        for line, code in code_of(page.read_text()):
            written = re.match(r"# (\S+)", code)  # a block that is the file it names, which its example writes
            for path in REPO_PATH.findall(code):
                if written and written.group(1) == path or path.startswith(MADE_BY_THE_BUILD):
                    continue
                if not (root / path).exists():
                    problems.append(f"{page_name(page)}:{line}: {path}: no such file in the repository")
    return problems


@pytest.mark.skipif("DOCS_UNDER_TEST" in os.environ, reason="checks the repository's pages")
def test_every_file_of_the_repository_a_page_names_is_there() -> None:
    problems = missing_paths(PAGES, REPO)
    assert not problems, "\n".join(problems)


def test_the_path_check_finds_a_moved_file(tmp_path: Path) -> None:
    page = tmp_path / "drifted.md"
    page.write_text(
        "`tests/test_first_hour.py` and `bridge/agent_io.py` run; `bench/results/` is made; `tools/call` is MCP's;\n"
        "```sh\nprofiles/clis/\nsample_agents/echo.py\n```\n```yaml\n# profiles/mine.yaml\ncommand: tools/nope.sh\n```\n"
    )
    assert missing_paths([page], REPO) == [
        f"{page}:1: bridge/agent_io.py: no such file in the repository",
        f"{page}:4: sample_agents/echo.py: no such file in the repository",
        f"{page}:8: tools/nope.sh: no such file in the repository",
    ]


@pytest.mark.skipif("DOCS_UNDER_TEST" in os.environ, reason="checks the repository's pages")
def test_the_docs_front_page_leads_to_every_page() -> None:
    docs = REPO / "docs"
    linked = {
        (docs / target.partition("#")[0]).resolve() for _, target in relative_links((docs / "index.md").read_text())
    }
    unlinked = sorted(str(page.relative_to(docs)) for page in docs.rglob("*.md") if page.resolve() not in linked)
    assert unlinked == ["index.md"], f"docs/index.md has no link to {unlinked}"


def agent_variables(markdown: str) -> set[str]:
    """The `AGENT_*` variables the first column of a page's tables names."""
    return {
        name for cell in re.findall(r"^\| ([^|]*) \|", markdown, re.M) for name in re.findall(r"`(AGENT_\w+)`", cell)
    }


@pytest.mark.skipif("DOCS_UNDER_TEST" in os.environ, reason="checks the repository's pages")
def test_the_guide_tells_an_agent_every_variable_the_contract_gives_it() -> None:
    contract = agent_variables((REPO / "docs" / "protocol.md").read_text())
    assert {"AGENT_MESSAGE", "AGENT_OUTBOX"} <= contract, "the contract's table is read"
    missing = contract - agent_variables((REPO / "docs" / "guide.md").read_text())
    assert not missing, f"docs/guide.md's table of what the agent gets has no {sorted(missing)}"
