"""The session store (docs/protocol.md §6): what a host keeps between turns, shared safely by several processes.

The SQLite file's own cases: the rules both stores keep are test_session_stores.py's, run against this one too."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import PYTHON, REPO
from conftest import turn_result as result
from hostkit import Lab, Started

import bridge
import bridge.host.sqlite_store
import bridge.log
from bridge import SessionStore, StoreError, Turn, TurnResult
from bridge.host.location import default_store_path
from bridge.host.sqlite_store import disk_full_reason


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    with SessionStore(tmp_path / "sessions.sqlite3") as opened:
        yield opened


def test_the_store_is_part_of_the_public_api_and_its_errors_are_bridge_errors() -> None:
    assert {"SessionStore", "SessionRecord", "StoreError"} <= set(bridge.__all__)
    assert issubclass(StoreError, bridge.BridgeError)


def test_default_path_follows_xdg_state_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert default_store_path() == tmp_path / "state" / "agent-bridge" / "sessions.sqlite3"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for ignored in ("", "relative/state"):  # the XDG spec: empty or relative values are ignored
        monkeypatch.setenv("XDG_STATE_HOME", ignored)
        assert default_store_path() == tmp_path / "home" / ".local" / "state" / "agent-bridge" / "sessions.sqlite3"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_store_path() == tmp_path / "home" / ".local" / "state" / "agent-bridge" / "sessions.sqlite3"


def test_no_path_opens_the_default_store_creating_its_directories(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "deep" / "state"))
    with SessionStore() as store:
        store.record("p", "c", "default", result("s1"))
    path = tmp_path / "deep" / "state" / "agent-bridge" / "sessions.sqlite3"
    assert store.path == path and path.is_file()
    assert path.stat().st_mode & 0o077 == 0, "session ids are the user's: the file is private"
    for made in (tmp_path / "deep", tmp_path / "deep" / "state", path.parent):
        assert made.stat().st_mode & 0o777 == 0o700, f"{made}: a directory the store made is the user's alone"
    with SessionStore(path) as again:
        assert again.get("p", "c") == "s1"


def test_sessions_survive_closing_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    with SessionStore(path) as store:
        store.record("p", "c", "default", result("persisted"))
    with SessionStore(str(path)) as store:
        assert store.get("p", "c") == "persisted"


# --------------------------------------------------------------------------- several processes

WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from bridge import Outcome, SessionStore, TurnResult

    path, me, count = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def result(session_id):
        return TurnResult("", session_id, "", "", 0, False, Outcome.OK, "", 1, 0, False)

    print("ready", flush=True)
    sys.stdin.readline()  # everyone starts together: opening a new file races too
    with SessionStore(path) as store:
        for i in range(count):
            store.record("p", f"{{me}}-{{i}}", "default", result(f"{{me}}:{{i}}"))
            # on the shared key, writer a gives ids and b only turns without a session line
            store.record("p", "shared", "default", result(f"a:{{i}}" if me == "a" else ""))
            store.get("p", "shared")
""").format(repo=str(REPO))


def test_processes_writing_one_file_at_once_lose_no_update_and_never_see_it_locked(tmp_path: Path) -> None:
    path = tmp_path / "new" / "sessions.sqlite3"  # not there yet: both processes create it
    count = 150
    writers = [
        subprocess.Popen(
            [PYTHON, "-c", WRITER, str(path), me, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in ("a", "b")
    ]
    for writer in writers:
        assert writer.stdout.readline() == "ready\n"
    for writer in writers:
        writer.stdin.write("go\n")
        writer.stdin.flush()
    for writer in writers:
        _, stderr = writer.communicate(timeout=120)
        assert writer.returncode == 0, stderr
        assert "locked" not in stderr
    with SessionStore(path) as store:
        records = {record.conversation: record.session_id for record in store.list()}
        assert store.get("p", "shared") == f"a:{count - 1}", "b's turns without a session line erased a's id"
    assert len(records) == 2 * count + 1
    for me in ("a", "b"):
        assert all(records[f"{me}-{i}"] == f"{me}:{i}" for i in range(count))
    assert _journal_mode(path) == "wal"


def _journal_mode(path: Path) -> str:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        db.close()


# --------------------------------------------------------------------------- a store that cannot be used


def test_a_corrupt_file_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    path.write_bytes(b"this is not a database at all\n" * 200)
    with pytest.raises(StoreError) as caught:
        SessionStore(path)
    assert str(path) in str(caught.value)
    assert "move it aside" in str(caught.value) and "--state" in str(caught.value)
    assert path.read_bytes().startswith(b"this is not"), "the file is left as it was, for the user to look at"


def test_a_database_of_something_else_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not an agent-bridge session store"):
        SessionStore(path)


def test_a_store_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    SessionStore(path).close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(StoreError, match="newer agent-bridge"):
        SessionStore(path)


def test_a_path_that_cannot_be_a_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "plain-file").write_text("")
    with pytest.raises(StoreError, match="is a file, not a directory"):
        SessionStore(tmp_path / "plain-file" / "sessions.sqlite3")
    with pytest.raises(StoreError, match="is a directory"):
        SessionStore(tmp_path)


UNWRITABLE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from bridge import Outcome, SessionStore, StoreError, TurnResult
    try:
        SessionStore(sys.argv[1]).record("p", "c", "default",
                                         TurnResult("", "s", "", "", 0, False, Outcome.OK, "", 1, 0, False))
    except StoreError as error:
        print(error)
        sys.exit(3)
""").format(repo=str(REPO))


def _without_root_powers() -> list[str]:
    """A command prefix under which file permissions apply, even when the tests run as root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permissions cannot be tested")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", "--bounding-set", caps, "--inh-caps", caps]


@pytest.mark.parametrize("case", ["new-file-in-read-only-dir", "file-in-read-only-dir", "read-only-file"])
def test_an_unwritable_store_is_a_clear_error(tmp_path: Path, case: str) -> None:
    directory = tmp_path / "locked"
    directory.mkdir()
    path = directory / "sessions.sqlite3"
    if case != "new-file-in-read-only-dir":
        SessionStore(path).close()
    if case == "read-only-file":
        path.chmod(0o444)
    else:
        directory.chmod(0o555)
    try:
        done = subprocess.run(
            [*_without_root_powers(), PYTHON, "-c", UNWRITABLE, str(path)], capture_output=True, text=True, timeout=60
        )
    finally:
        directory.chmod(0o755)
    assert done.returncode == 3, done.stderr
    assert str(path) in done.stdout and "writable" in done.stdout, done.stdout


def test_record_needs_no_database_lock_held_between_calls(tmp_path: Path) -> None:
    """Another process can write while a store is open but idle: no transaction is left open."""
    path = tmp_path / "s.sqlite3"
    with SessionStore(path) as store:
        store.record("p", "c", "default", result("mine"))
        store.get("p", "c")
        other = sqlite3.connect(path, timeout=0)
        other.execute("BEGIN IMMEDIATE")  # fails at once if our connection held the write lock
        other.execute("ROLLBACK")
        other.close()


# --------------------------------------------------------------------------- reads never wait behind a write

HOLDER = textwrap.dedent("""
    import sqlite3, sys
    db = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    db.execute("UPDATE sessions SET session_id = 'uncommitted'")
    print("holding", flush=True)
    sys.stdin.readline()
    db.execute("ROLLBACK")
""")


@contextlib.contextmanager
def another_process_holds_the_write_lock(path: Path) -> Iterator[None]:
    """Another process holds `BEGIN IMMEDIATE` on the store (with a change not committed) until the block ends."""
    holder = subprocess.Popen(
        [PYTHON, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "holding\n"
        yield
    finally:
        holder.communicate("release\n", timeout=10)
    assert holder.returncode == 0


class StoreProbe:
    """Says when a store call is under way, from the worker threads that make it (no sleeps needed).

    `in_sqlite` is set once a call holds its connection and runs SQLite (after `arm()`);
    `recording[conversation]` once a `record` of that conversation was called.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.in_sqlite = threading.Event()
        self.recording: dict[str, threading.Event] = collections.defaultdict(threading.Event)
        self._armed = False
        patiently, record = bridge.host.sqlite_store._patiently, SessionStore.record

        def watched_patiently(operation: Any) -> Any:
            if self._armed:
                self.in_sqlite.set()
            return patiently(operation)

        def watched_record(store: SessionStore, profile: str, conversation: str, *args: Any) -> None:
            self.recording[conversation].set()
            record(store, profile, conversation, *args)

        monkeypatch.setattr(bridge.host.sqlite_store, "_patiently", watched_patiently)
        monkeypatch.setattr(SessionStore, "record", watched_record)

    def arm(self) -> None:
        self._armed = True


def test_reads_go_on_while_a_write_waits_for_another_processs_lock(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.record("p", "a", "default", result("committed"))
    store.record("p", "b", "default", result("other"))
    probe = StoreProbe(monkeypatch)
    failures: list[BaseException] = []

    def record_in_the_background() -> None:
        try:
            store.record("p", "a", "default", result("new"))
        except BaseException as error:
            failures.append(error)

    read: dict[str, Any] = {}

    def read_meanwhile() -> None:
        started = time.monotonic()
        read["a"], read["b"] = store.get("p", "a"), store.get("p", "b")
        read["listed"] = sorted(record.session_id for record in store.list())
        read["seconds"] = time.monotonic() - started

    with another_process_holds_the_write_lock(store.path):
        probe.arm()
        writer = threading.Thread(target=record_in_the_background)
        writer.start()
        assert probe.in_sqlite.wait(5), "the record never reached SQLite"
        reader = threading.Thread(target=read_meanwhile)
        reader.start()
        reader.join(timeout=2)
        assert not reader.is_alive(), "a read waited behind a write that waits for another process"
        assert writer.is_alive(), "the record waits for the other process's lock"
    writer.join(timeout=10)
    reader.join(timeout=10)
    assert (read["a"], read["b"], read["listed"]) == ("committed", "other", ["committed", "other"])
    assert read["seconds"] < 0.2
    assert failures == [] and store.get("p", "a") == "new"


async def test_a_host_runs_other_conversations_while_one_waits_to_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's record waits for another process's lock; B's turn still starts and runs to its end meanwhile."""
    lab = Lab(tmp_path)
    lab.profile("rec")
    probe = StoreProbe(monkeypatch)
    started = Started()
    results: dict[str, TurnResult] = {}
    gate = lab.gate()

    async def submit(conversation: str, tag: str, message: str) -> None:
        results[tag] = await host.submit(
            "rec", conversation, Turn(f"tag={tag} {message}"), on_partial=started.callback(tag)
        )

    async def until(event: threading.Event) -> None:
        with trio.fail_after(2):
            await trio.to_thread.run_sync(event.wait, abandon_on_cancel=True)

    async with bridge.open_host(lab.profiles, state=lab.state) as host, trio.open_nursery() as nursery:
        nursery.start_soon(submit, "A", "a", f"gate={gate} session=sa")
        await started.wait("a")  # A's stored session was read; its agent runs
        with another_process_holds_the_write_lock(lab.state):
            probe.arm()
            await lab.release(gate)
            await until(probe.in_sqlite)  # A's record is under way, waiting for the other process
            nursery.start_soon(submit, "B", "b", "session=sb")
            await until(probe.recording["B"])  # B's turn ran to its end
            assert lab.events("end") == ["a", "b"]
            assert results == {}, "both records still wait for the lock"
    assert (results["a"].session_id, results["b"].session_id) == ("sa", "sb")
    with SessionStore(lab.state) as store:
        assert (store.get("rec", "A"), store.get("rec", "B")) == ("sa", "sb")


# --------------------------------------------------------------------------- a store other users can read


@pytest.fixture
def logged(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The bridge's log records (JSON on stderr) since the last call."""
    bridge.log.configure_logging("warning", "json")
    yield lambda: [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    bridge.log.configure_logging()


def test_a_store_other_users_can_read_is_opened_with_a_warning_naming_the_fix(
    tmp_path: Path, logged: Callable[[], list[dict[str, Any]]]
) -> None:
    path = tmp_path / "sessions.sqlite3"
    with SessionStore(path) as store:
        store.record("p", "c", "default", result("secret-session"))
    assert logged() == [], "a private store opens quietly"
    path.chmod(0o644)  # as another tool might have created it
    with SessionStore(path) as store:
        assert store.get("p", "c") == "secret-session"
    [warning] = logged()
    assert warning["level"] == "warning" and "other users" in warning["event"]
    assert (warning["path"], warning["mode"], warning["fix"]) == (str(path), "644", f"chmod 600 {path}")
    path.chmod(0o600)
    SessionStore(path).close()
    assert logged() == []


# --------------------------------------------------------------------------- a full disk


def _statvfs(
    *, free_blocks: int, free_inodes: int = 1000, inodes: int = 1000, root_free_blocks: int | None = None
) -> os.statvfs_result:
    # bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax
    bfree = free_blocks if root_free_blocks is None else root_free_blocks
    return os.statvfs_result((4096, 4096, 100_000, bfree, free_blocks, inodes, free_inodes, free_inodes, 0, 255))


def test_what_counts_as_a_full_disk() -> None:
    assert disk_full_reason(_statvfs(free_blocks=0), as_root=False) == "0 KiB free"
    assert disk_full_reason(_statvfs(free_blocks=3), as_root=False) == "12 KiB free"
    assert disk_full_reason(_statvfs(free_blocks=10_000), as_root=False) is None
    assert disk_full_reason(_statvfs(free_blocks=10_000, free_inodes=0), as_root=False) == "no free inodes"
    # a file system without a fixed number of inodes (btrfs) reports none at all
    assert disk_full_reason(_statvfs(free_blocks=10_000, free_inodes=0, inodes=0), as_root=False) is None
    # root may use the blocks reserved for it
    reserved_only = _statvfs(free_blocks=0, root_free_blocks=10_000)
    assert disk_full_reason(reserved_only, as_root=False) == "0 KiB free"
    assert disk_full_reason(reserved_only, as_root=True) is None


def test_an_io_error_on_a_disk_with_space_is_not_called_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statvfs check decides: the same SQLite error reads differently with and without space left."""
    with SessionStore(tmp_path / "s.sqlite3") as store:
        error = sqlite3.OperationalError("disk I/O error")
        error.sqlite_errorname = "SQLITE_IOERR_SHMSIZE"  # type: ignore[attr-defined]
        monkeypatch.setattr(os, "statvfs", lambda _path: _statvfs(free_blocks=10_000))
        assert "writable" in str(store._error(error)) and "full" not in str(store._error(error))
        monkeypatch.setattr(os, "statvfs", lambda _path: _statvfs(free_blocks=0))
        assert "the disk holding it is full (0 KiB free): free some space" in str(store._error(error))


FULL_DISK = textwrap.dedent("""
    import errno, os, sys
    sys.path.insert(0, {repo!r})
    from bridge import Outcome, SessionStore, StoreError, TurnResult

    directory, case, how = sys.argv[1:4]
    path = os.path.join(directory, "sessions.sqlite3")
    if case.startswith("existing"):
        SessionStore(path).close()
    if how == "tmpfs":  # a real full file system
        try:
            if case.endswith("inodes"):
                for i in range(10_000):
                    open(os.path.join(directory, f"filler{{i}}"), "x").close()
            else:
                filler = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT)
                while True:
                    os.write(filler, bytes(4096))
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
    else:  # no small file system to fill: writes really fail (EFBIG), and statvfs says the disk is full
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
        full = (1000, 0) if case.endswith("inodes") else (0, 1000)  # free blocks, free inodes
        os.statvfs = lambda _path: os.statvfs_result((4096, 4096, 1000, full[0], full[0], 1000, full[1],
                                                      full[1], 0, 255))
    try:
        SessionStore(path).record("p", "c", "default",
                                  TurnResult("", "s", "", "", 0, False, Outcome.OK, "", 1, 0, False))
    except StoreError as error:
        print(error)
        sys.exit(3)
""").format(repo=str(REPO))
SMALL_TMPFS = 'mount -t tmpfs -o size=64k,nr_inodes=64 tmpfs "$1" && exec "$2" -c "$3" "$1" "$4" tmpfs'


@pytest.fixture(scope="module")
def small_file_system(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, str], list[str]]:
    """How to run FULL_DISK: in a 64 KiB tmpfs of a private mount namespace when this kernel allows one
    (as root, or unprivileged through a user namespace), else emulated (see FULL_DISK)."""
    namespace = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", SMALL_TMPFS, "sh"]
    probe_directory = tmp_path_factory.mktemp("probe")
    try:
        usable = (
            subprocess.run(
                [*namespace, str(probe_directory), "true", "", ""], capture_output=True, timeout=30
            ).returncode
            == 0
        )
    except OSError:
        usable = False
    if usable:
        return lambda directory, case: [*namespace, str(directory), PYTHON, FULL_DISK, case]
    return lambda directory, case: [PYTHON, "-c", FULL_DISK, str(directory), case, "emulated"]


@pytest.mark.parametrize("case", ["new store", "existing store", "new store, no inodes", "existing store, no inodes"])
def test_a_full_disk_at_open_says_so_and_what_to_do(
    tmp_path: Path, case: str, small_file_system: Callable[[Path, str], list[str]]
) -> None:
    directory = tmp_path / "small"
    directory.mkdir()
    done = subprocess.run(small_file_system(directory, case), capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert f"session store {directory / 'sessions.sqlite3'}" in done.stdout
    assert "the disk holding it is full" in done.stdout, done.stdout
    assert "free some space there, or pass another file with --state PATH" in done.stdout
    assert "writable" not in done.stdout


def test_a_key_that_is_not_text_is_a_clear_error_on_the_command_line(tmp_path: Path) -> None:
    """A non-UTF-8 byte in a conversation key (Python makes it a lone surrogate, which SQLite cannot encode)
    is refused naming the key, exit 2, by every command that keys the store; the stored sessions are untouched."""
    state = tmp_path / "sessions.sqlite3"
    with SessionStore(state) as store:
        store.record("p", "chat", "default", result(session_id="kept"))
    profile = tmp_path / "echo.yaml"
    profile.write_text(json.dumps({"command": [PYTHON, "-c", "print('hi')"]}))
    bad = b"chat\xff"
    commands: list[list[str | bytes]] = [
        ["sessions", "forget", "--state", str(state), "p", bad],
        ["sessions", "show", "--state", str(state), "p", bad],
        ["run", str(profile), "--state", str(state), "--conversation", bad, "hi"],
    ]
    for command in commands:
        done = subprocess.run([PYTHON, "-m", "bridge", *command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and "key 'chat\\udcff' contains a lone surrogate" in done.stderr
    with SessionStore(state) as store:
        assert [record.session_id for record in store.list()] == ["kept"]
