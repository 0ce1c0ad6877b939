"""`make install`: after the set-up commands, `agent-bridge` runs from any new shell, as the README's examples need."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import PROFILES, REPO

VENV = sys.prefix  # the venv running the tests: `make test` built it


def make(*args: str, home: Path, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home)}
    if path is not None:
        env["PATH"] = path
    # -o: the venv is up to date (the tests run in it); never rebuild it from here.
    return subprocess.run(
        ["make", "-s", "-C", str(REPO), "-o", f"{VENV}/.installed", f"VENV={VENV}", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_make_install_puts_the_command_on_path_for_a_fresh_shell(tmp_path: Path) -> None:
    installed = make("install", home=tmp_path, path="/usr/bin:/bin")
    assert installed.returncode == 0, installed.stderr
    link = tmp_path / ".local" / "bin" / "agent-bridge"
    assert link.is_symlink() and Path(os.readlink(link)) == Path(VENV, "bin", "agent-bridge")
    assert "is not on your PATH: add it" in installed.stdout  # and says what to do when the login does not
    fresh = subprocess.run(
        [
            "env",
            "-i",
            f"HOME={tmp_path}",
            f"PATH={link.parent}:/usr/bin:/bin",
            "sh",
            "-c",
            f"cd / && agent-bridge run {PROFILES / 'echo.yaml'} hello",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (fresh.returncode, fresh.stdout) == (0, "echo: hello\n"), fresh.stderr
    again = make("install", home=tmp_path, path=f"{link.parent}:/usr/bin:/bin")
    assert again.returncode == 0 and "not on your PATH" not in again.stdout  # idempotent


def test_make_install_never_replaces_a_file_it_did_not_make_and_uninstall_removes_only_its_link(tmp_path: Path) -> None:
    bindir = tmp_path / ".local" / "bin"
    bindir.mkdir(parents=True)
    theirs = bindir / "agent-bridge"
    theirs.write_text("#!/bin/sh\necho another agent-bridge\n")
    refused = make("install", home=tmp_path)
    assert refused.returncode != 0 and "exists and is not a link to" in refused.stderr
    assert theirs.read_text() == "#!/bin/sh\necho another agent-bridge\n"
    assert "nothing to remove" in make("uninstall", home=tmp_path).stdout and theirs.exists()
    theirs.unlink()
    assert make("install", home=tmp_path).returncode == 0
    assert make("uninstall", home=tmp_path).returncode == 0 and not os.path.lexists(theirs)


def test_make_run_says_how_to_get_the_command_on_path(tmp_path: Path) -> None:
    without = make("run", home=tmp_path, path="/usr/bin:/bin")
    assert without.returncode == 0, without.stderr
    assert without.stdout.startswith("echo: hello\n") and "'make install' puts it on your PATH" in without.stdout
    with_it = make("run", home=tmp_path, path=f"{Path(VENV, 'bin')}:/usr/bin:/bin")
    assert with_it.stdout == "echo: hello\n"
