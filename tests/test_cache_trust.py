"""The profile cache trusts only files no other user could have written: an entry says which command runs.

The attack: someone who can write in the cache directory (a shared or
pre-created XDG_CACHE_HOME) plants an entry for a profile, and the next
`agent-bridge run` of that profile — perhaps as root — runs their command.
Each case here plants a well-formed entry that *would* run `planted.sh`, and
checks that the profile's own `own.sh` runs instead.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import write_agent, write_profile

import bridge.log
import bridge.profile.cache
from bridge import load_profile
from bridge.profile.cache import trust_problem, untrusted_directory

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
NOBODY = 65534


class Planted:
    """A profile running `own.sh`, and an entry in the cache at `cache_home` that says to run `planted.sh`."""

    def __init__(self, root: Path, cache_home: Path) -> None:
        self.cache_home = cache_home
        self.own = write_agent(root, "own.sh", "#!/bin/sh\necho own\n")
        self.planted = write_agent(root, "planted.sh", "#!/bin/sh\necho planted\n")
        self.profile = write_profile(root, f"command: [{json.dumps(str(self.own))}]\n", name="victim.yaml")
        os.environ["XDG_CACHE_HOME"] = str(cache_home)  # restored by conftest's monkeypatch
        assert load_profile(self.profile).argv_template == (str(self.own),)  # validated and remembered
        [self.entry] = self.profiles.glob("*.json")
        entry = json.loads(self.entry.read_text())
        values = entry["values"]
        values["command"] = values["argv_template"][0] = values["resume_argv_template"][0] = str(self.planted)
        self.entry.write_text(json.dumps(entry))
        assert load_profile(self.profile).argv_template == (str(self.planted),), (
            "the planted entry is well-formed: trusted, it would run"
        )

    @property
    def profiles(self) -> Path:
        return self.cache_home / "agent-bridge" / "profiles"

    def run(self) -> subprocess.CompletedProcess[str]:
        """`agent-bridge run` of the profile, in a new process (so with a new verdict on the cache)."""
        env = {**os.environ, "XDG_CACHE_HOME": str(self.cache_home)}
        done = subprocess.run(
            [AGENT_BRIDGE, "run", str(self.profile), "hi", "--log-format", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        return done

    def entry_is_planted(self) -> bool:
        return str(self.planted) in self.entry.read_text()


def warnings_in(stderr: str) -> list[dict[str, Any]]:
    return [record for line in stderr.splitlines() if (record := json.loads(line))["level"] == "warning"]


@pytest.fixture
def logged(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The warnings logged in this process since the last call."""
    bridge.log.configure_logging("warning", "json")
    yield lambda: warnings_in(capsys.readouterr().err)
    bridge.log.configure_logging()


# --------------------------------------------------------------------------- what others could write is not used


@pytest.mark.parametrize("case", ["its own directory", "XDG_CACHE_HOME", "the directory holding a symlink"])
def test_a_cache_directory_others_can_write_is_not_used(tmp_path: Path, case: str) -> None:
    """(More places on the way, symlink targets among them, in the walk's test below.)"""
    if case == "the directory holding a symlink":  # XDG_CACHE_HOME is a link; the cache lives where it points
        real, link_home = tmp_path / "real", tmp_path / "links"
        real.mkdir(mode=0o700)
        link_home.mkdir(mode=0o700)
        (link_home / "cache").symlink_to(real)
        planted = Planted(tmp_path, link_home / "cache")
        culprit = link_home
    else:
        planted = Planted(tmp_path, tmp_path / "cache")
        culprit = planted.profiles if case == "its own directory" else planted.cache_home
    culprit.chmod(0o777)

    done = planted.run()
    assert done.stdout == "own\n", "the profile's own command runs, not the planted one"
    [warning] = warnings_in(done.stderr)
    assert warning["path"] == str(culprit) and "writable by group or others" in warning["problem"]
    assert warning["fix"].startswith(f"chmod go-w {culprit};")
    assert planted.entry_is_planted() and len(list(planted.profiles.glob("*"))) == 1, "nothing is stored there"


def test_an_entry_others_can_write_is_ignored_and_replaced(tmp_path: Path) -> None:
    planted = Planted(tmp_path, tmp_path / "cache")
    planted.entry.chmod(0o666)

    done = planted.run()
    assert done.stdout == "own\n"
    [warning] = warnings_in(done.stderr)
    assert warning["path"] == str(planted.entry) and "writable by group or others (mode 666)" in warning["problem"]
    assert not planted.entry_is_planted() and stat.S_IMODE(planted.entry.stat().st_mode) == 0o600
    again = planted.run()
    assert (again.stdout, warnings_in(again.stderr)) == ("own\n", []), "the private entry replacing it is used"


def test_a_cache_owned_by_another_user_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged: Callable[[], list[dict[str, Any]]]
) -> None:
    planted = Planted(tmp_path, tmp_path / "cache")
    if os.geteuid() == 0:  # root can really hand the directory to another user
        os.chown(planted.profiles, NOBODY, NOBODY)
        done = planted.run()
        assert done.stdout == "own\n"
        [warning] = warnings_in(done.stderr)
        assert warning["path"] == str(planted.profiles)
        assert warning["problem"] == f"owned by uid {NOBODY}, not by this user (uid 0)"
        assert warning["fix"].startswith(f"remove {planted.profiles} ")
    else:  # a user cannot: this process is made to see every file as another user's
        monkeypatch.setenv("XDG_CACHE_HOME", str(planted.cache_home))
        monkeypatch.setattr(os, "geteuid", lambda: NOBODY)
        assert load_profile(planted.profile).argv_template == (str(planted.own),)
        [warning] = logged()
        assert "owned by uid" in warning["problem"]
    assert planted.entry_is_planted()


def test_one_warning_per_process_and_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged: Callable[[], list[dict[str, Any]]]
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    shared.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared / "cache"))
    for name in ("one", "two"):
        path = write_profile(tmp_path, f"command: {name}\n", name=f"{name}.yaml")
        assert load_profile(path).command == name
        assert load_profile(path).command == name
    [warning] = logged()
    assert warning["path"] == str(shared) and warning["fix"].startswith(f"chmod go-w {shared};")
    assert list(shared.rglob("*.json")) == [], "nothing is stored there"


# --------------------------------------------------------------------------- what is trusted


def test_a_cache_below_a_sticky_directory_like_tmp_is_used(
    tmp_path: Path, logged: Callable[[], list[dict[str, Any]]]
) -> None:
    """Others may create files in a sticky directory but not rename or remove ours: it is like /tmp."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    Planted(tmp_path, sticky / "cache")  # which checks that its entry, being trusted, is used
    assert logged() == []


def test_new_cache_directories_are_private_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged: Callable[[], list[dict[str, Any]]]
) -> None:
    """`mkdir -p` would make the parents group-writable under umask 002, and the next run distrust them."""
    cache_home = tmp_path / "new" / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    path = write_profile(tmp_path, "command: agent\n")
    old_umask = os.umask(0o002)
    try:
        load_profile(path)
    finally:
        os.umask(old_umask)
    for directory in (cache_home, cache_home / "agent-bridge", cache_home / "agent-bridge" / "profiles"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert len(list((cache_home / "agent-bridge" / "profiles").glob("*.json"))) == 1
    assert logged() == []


def test_the_verdict_is_taken_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    walk = bridge.profile.cache.untrusted_directory
    monkeypatch.setattr(
        bridge.profile.cache,
        "untrusted_directory",
        lambda directory, euid: calls.append(str(directory)) or walk(directory, euid),
    )
    path = write_profile(tmp_path, "command: agent\n")
    load_profile(path)  # a miss (no cache directory yet), then the validated profile is stored
    assert calls and set(calls) == {str(bridge.profile.cache.cache_directory())}
    calls.clear()
    for _ in range(3):
        load_profile(path)
    assert calls == []


# --------------------------------------------------------------------------- the rule, with any owner


def status(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((mode, 1, 1, 1, uid, 0, 0, 0, 0, 0))


def test_who_may_own_and_write_what() -> None:
    me, other = 1000, 1001
    directory, file = stat.S_IFDIR, stat.S_IFREG
    assert trust_problem(status(directory | 0o700, me), me, must_be_ours=True) is None
    assert trust_problem(status(directory | 0o755, 0), me, must_be_ours=False) is None  # /, /home: root's
    assert (
        trust_problem(status(directory | 0o755, 0), me, must_be_ours=True)
        == "owned by uid 0, not by this user (uid 1000)"
    )
    assert (
        trust_problem(status(directory | 0o700, other), me, must_be_ours=False)
        == "owned by uid 1001, not by this user (uid 1000) or root"
    )
    assert (
        trust_problem(status(directory | 0o770, me), me, must_be_ours=False) == "writable by group or others (mode 770)"
    )
    assert trust_problem(status(directory | 0o1777, 0), me, must_be_ours=False) is None  # /tmp
    assert trust_problem(status(directory | 0o1777, me), me, must_be_ours=True) is not None
    assert trust_problem(status(directory | 0o1777, other), me, must_be_ours=False) is not None
    assert trust_problem(status(file | 0o600, me), me, must_be_ours=True) is None
    assert trust_problem(status(file | 0o644, me), me, must_be_ours=True) is None
    assert trust_problem(status(file | 0o620, me), me, must_be_ours=True) == "writable by group or others (mode 620)"
    assert trust_problem(status(file | 0o1666, 0), me, must_be_ours=True) is not None  # sticky means nothing here


def test_the_walk_checks_every_directory_on_the_way_with_any_owner(tmp_path: Path) -> None:
    me = os.geteuid()
    cache = tmp_path / "home" / "agent-bridge" / "profiles"
    cache.mkdir(parents=True, mode=0o700)
    assert untrusted_directory(cache, me) is None
    # as someone else, the first directory on the way that is neither theirs nor root's is named
    stranger = me + 4242
    found = untrusted_directory(cache, stranger)
    assert found is not None and f"not by this user (uid {stranger})" in found.problem
    assert Path(found.path).stat().st_uid == me and (cache.is_relative_to(found.path))
    # a symlink is followed; the directory holding it counts as much as the target
    links = tmp_path / "links"
    links.mkdir(mode=0o700)
    (links / "cache").symlink_to(cache.parent.parent)
    via_link = links / "cache" / "agent-bridge" / "profiles"
    assert untrusted_directory(via_link, me) is None
    links.chmod(0o777)
    assert untrusted_directory(via_link, me) == (
        str(links),
        "writable by group or others (mode 777)",
        f"chmod go-w {links}",
    )
    links.chmod(0o700)
    (cache.parent.parent).chmod(0o770)
    assert untrusted_directory(via_link, me).path == str(cache.parent.parent)  # type: ignore[union-attr]
    # "link/.." is the link target's parent, not the link's
    assert untrusted_directory(links / "cache" / ".." / "home" / "agent-bridge" / "profiles", me).path == str(
        cache.parent.parent
    )  # type: ignore[union-attr]
    with pytest.raises(OSError):
        untrusted_directory(tmp_path / "missing", me)
