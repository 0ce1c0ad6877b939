"""Each command of `agent-bridge` lives in the cli module named for it, and a command loads no other's (issue 37).

`run` is the command whose start-up is measured (bench row 6): what it imports before the agent starts is the
floor every turn from a shell pays, so another command's code must not ride along.
"""

from __future__ import annotations

import subprocess

from conftest import PROFILES, PYTHON

# Loaded by any command: the package, the parser and what it shares, and `run`'s printer and terminal.
SHARED = {"bridge.cli", "bridge.cli.main", "bridge.cli.options", "bridge.cli.printer", "bridge.cli.terminal"}
PROBE = (
    "import sys\nfrom bridge.cli import main\ncode = main(sys.argv[1:])\n"
    "print(' '.join(sorted(name for name in sys.modules if name.startswith('bridge.cli'))))\n"
    "raise SystemExit(code)"
)


def cli_modules_after(*args: str) -> tuple[int, set[str], str]:
    done = subprocess.run(
        [PYTHON, "-c", PROBE, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    return done.returncode, set(done.stdout.splitlines()[-1].split()), done.stdout


def test_run_loads_its_own_module_and_no_other_commands() -> None:
    code, modules, stdout = cli_modules_after("run", str(PROFILES / "echo.yaml"), "hi")
    assert code == 0 and stdout.startswith("echo: hi\n")
    assert modules - SHARED == {"bridge.cli.run"}


def test_schema_and_check_load_their_own_modules_and_not_runs() -> None:
    code, modules, _ = cli_modules_after("schema")
    assert code == 0 and modules - SHARED == {"bridge.cli.schema"}
    code, modules, stdout = cli_modules_after("check", str(PROFILES / "echo.yaml"))
    assert code == 0 and "echo.yaml: ok" in stdout
    assert "bridge.cli.check" in modules and "bridge.cli.run" not in modules and "bridge.cli.serve" not in modules
