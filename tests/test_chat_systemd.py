"""The systemd units of the platform pages (docs/chat-telegram.md, docs/chat-matrix.md) as tests: the command each
runs is an `agent-bridge connect` the real parser takes, of the config and profiles the page checks; the unit
stops `connect` the graceful way; and `systemd-analyze verify` accepts the unit where systemd is installed."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from readme_examples import Example, examples

from bridge.cli.main import build_parser
from bridge.host.runtime import DEFAULT_SHUTDOWN_GRACE

REPO = Path(__file__).resolve().parent.parent
PAGES = ("docs/chat-telegram.md", "docs/chat-matrix.md")
AGENT_BRIDGE = Path(sys.executable).parent / "agent-bridge"


def unit_of(page: str) -> tuple[Example, list[Example]]:
    """The page's unit file (its one `file *.service` block) and all its examples."""
    found = examples((REPO / page).read_text(), page)
    units = [example for example in found if example.mode == "file" and example.positional[0].endswith(".service")]
    assert len(units) == 1, f"{page} shows {len(units)} systemd units; it should show one"
    return units[0], found


def service_section(text: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd's keys are case-sensitive
    parser.read_string(text)
    return parser["Service"]


@pytest.mark.parametrize("page", PAGES)
def test_the_unit_runs_a_connect_the_parser_takes_of_the_pages_config(page: str) -> None:
    unit, found = unit_of(page)
    service = service_section(unit.text)
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == "agent-bridge", argv
    args = build_parser("connect").parse_args(argv[1:])  # exits 2, failing the test, on what connect refuses
    assert args.command == "connect"
    shown = {example.positional[0] for example in found if example.mode == "file"}
    assert Path(args.config).name in shown, f"the unit runs {args.config}, a config the page does not show"
    checks = " ".join(
        example.text for example in found if example.mode == "sh" and "agent-bridge check" in example.text
    )
    assert f"check {Path(args.config).name} --profiles {Path(args.profiles).name}/" in checks, (
        "the unit's config and profiles are not the ones the page checks"
    )
    # The token or password comes from a root-only file systemd reads, and the state lives in StateDirectory=.
    assert Path(service["EnvironmentFile"]).name in shown
    assert args.state is not None and args.state.startswith(f"%S/{service['StateDirectory']}/"), args.state


@pytest.mark.parametrize("page", PAGES)
def test_the_unit_stops_connect_gracefully_and_restarts_it_on_failure(page: str) -> None:
    unit, _ = unit_of(page)
    service = service_section(unit.text)
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed", "SIGTERM to connect alone: it lets the turns finish, then ends the agents"
    args = build_parser("connect").parse_args(shlex.split(service["ExecStart"])[1:])
    grace = DEFAULT_SHUTDOWN_GRACE if args.shutdown_grace is None else args.shutdown_grace
    # The grace, then the agents' own stop (their kill_grace_secs), before systemd kills what is left.
    assert float(service["TimeoutStopSec"]) >= grace + 10, "systemd must leave connect its grace"
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2", "a config connect refuses is not retried"


@pytest.mark.parametrize("page", PAGES)
def test_systemd_analyze_verifies_the_unit(page: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here: only the unit's command line was checked")
    unit, _ = unit_of(page)
    name = Path(unit.positional[0]).name
    # verify wants the program to exist: this checkout's agent-bridge stands in for the installed one.
    lines = [
        f"ExecStart={AGENT_BRIDGE} {line.split(' ', 1)[1]}" if line.startswith("ExecStart=") else line
        for line in unit.text.splitlines()
    ]
    (tmp_path / name).write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(tmp_path / name)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    problems = [line for line in done.stderr.splitlines() if name in line]
    assert not problems, "\n".join(problems)
