"""Files a warm agent asks the bridge for (bridge/files/agent_requests.py): lines, limits, and the working directory's walls.

The walls hold against an agent that changes the directory while the bridge
works in it (`dir_swapper.py` swaps a directory for a symlink out, for real),
and only regular files are served: a FIFO, socket, device or /proc file is
refused at once, never waited on.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from dir_swapper import INSIDE, OUTSIDE, RaceTree

from bridge.dialects.events import FileRequest
from bridge.errors import BridgeError
from bridge.files.agent_requests import (
    MAX_FILE_BYTES,
    MAX_PATH_BYTES,
    MAX_SYMLINKS,
    FileRefused,
    FileRoot,
    serve_file_request,
)

BOUND = 5.0  # seconds any one request may take here: a request that blocks fails the test instead of hanging it


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """tmp_path/root, a working directory with a file `in.txt` ("in") in `sub`; tmp_path/out.txt ("out") beside."""
    (tmp_path / "root" / "sub").mkdir(parents=True)
    (tmp_path / "root" / "sub" / "in.txt").write_text("in")
    (tmp_path / "out.txt").write_text("out")
    yield tmp_path / "root"


def serve(operation: str, path: Path | str, root: Path | FileRoot, **fields: object) -> str | None:
    """One request, in a thread that must finish within BOUND."""
    request = FileRequest("r1", operation, str(path), **fields)  # type: ignore[arg-type]
    outcome: list[str | BaseException | None] = []

    def run(held: FileRoot) -> None:
        try:
            outcome.append(serve_file_request(request, held))
        except BaseException as err:
            outcome.append(err)

    held = root if isinstance(root, FileRoot) else FileRoot(str(root))
    try:
        thread = threading.Thread(target=run, args=(held,), daemon=True)
        thread.start()
        thread.join(BOUND)
        assert outcome, f"the {operation} of {path} did not finish within {BOUND} s"
    finally:
        if held is not root:
            held.close()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def read(path: Path | str, root: Path | FileRoot, **fields: object) -> str | None:
    return serve("read", path, root, **fields)


def write(path: Path | str, root: Path | FileRoot, content: str) -> str | None:
    return serve("write", path, root, content=content)


def refused(operation: str, path: Path | str, root: Path | FileRoot, match: str, **fields: object) -> None:
    with pytest.raises(FileRefused, match=match):
        serve(operation, path, root, **fields)


def test_line_and_limit_pick_lines_1_based(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("a\nb\nc\nd")
    assert read(tmp_path / "f.txt", tmp_path) == "a\nb\nc\nd"
    assert read(tmp_path / "f.txt", tmp_path, line=2) == "b\nc\nd"
    assert read(tmp_path / "f.txt", tmp_path, line=2, limit=2) == "b\nc\n"
    assert read(tmp_path / "f.txt", tmp_path, limit=1) == "a\n"
    assert read(tmp_path / "f.txt", tmp_path, line=9) == ""


def test_paths_must_be_absolute_and_dot_dot_never_climbs_above_the_root(root: Path) -> None:
    assert read(root / "sub" / ".." / "sub" / "." / "in.txt", root) == "in"
    refused("read", "sub/in.txt", root, "must be absolute")
    refused("read", root / ".." / "out.txt", root, r"outside the session's working directory .*'\.\.' climbs")
    refused("read", root / ".." / root.name / "sub" / "in.txt", root, "outside")  # out, then back: still refused
    refused("write", root / ".." / "out.txt", root, "outside", content="owned")
    assert (root.parent / "out.txt").read_text() == "out"


def test_a_sibling_whose_name_starts_with_the_roots_is_outside(root: Path) -> None:
    rootish = root.parent / f"{root.name}ish"  # /x/rootish: a bare prefix check would take it for /x/root/…
    rootish.mkdir()
    (rootish / "secret.txt").write_text("secret")
    refused("read", rootish / "secret.txt", root, "outside the session's working directory")
    refused("write", rootish / "secret.txt", root, "outside", content="owned")
    refused("write", rootish / "new.txt", root, "outside", content="owned")
    assert (rootish / "secret.txt").read_text() == "secret" and not (rootish / "new.txt").exists()


def test_symlinks_that_stay_inside_are_followed_relative_and_absolute(root: Path) -> None:
    alias = root.parent / "alias"  # the working directory as the profile names it: through a symlink
    alias.symlink_to(root)
    (root / "relative").symlink_to("sub/in.txt")
    (root / "absolute").symlink_to(root / "sub" / "in.txt")
    (root / "by-alias").symlink_to(alias / "sub" / "in.txt")
    (root / "dir").symlink_to("sub")
    (root / "sub" / "up").symlink_to("../relative")  # a chain: up -> ../relative -> sub/in.txt
    (root / "dangling").symlink_to("sub/created.txt")
    with FileRoot(str(alias)) as held:  # known by both names: as the profile gave it, and resolved
        for base in (root, alias):
            for name in ("sub/in.txt", "relative", "absolute", "by-alias", "dir/in.txt", "sub/up", "dir/up"):
                assert read(base / name, held) == "in", (base, name)
    refused("read", alias / "sub" / "in.txt", root, "outside")  # a third name of the directory is not one of them
    assert write(alias / "dir" / "up", alias, "through the links") is None
    assert (root / "sub" / "in.txt").read_text() == "through the links"
    assert write(root / "dangling", root, "made") is None  # a write creates the file a dangling link names
    assert (root / "sub" / "created.txt").read_text() == "made" and (root / "dangling").is_symlink()


def test_without_proc_the_root_is_still_known_by_its_resolved_name(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The root's resolved name is the kernel's, read from /proc/self/fd; where /proc is not mounted, it is
    worked out from the path."""
    alias = root.parent / "alias"
    alias.symlink_to(root)

    readlink = os.readlink

    def no_proc(path: str) -> str:
        if path.startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return readlink(path)

    monkeypatch.setattr(os, "readlink", no_proc)
    with FileRoot(str(alias)) as held:
        for base in (root, alias):
            assert read(base / "sub" / "in.txt", held) == "in", base


def test_symlinks_that_lead_out_are_refused_and_a_loop_ends(root: Path) -> None:
    outside = root.parent
    (root / "absolute").symlink_to(outside / "out.txt")
    (root / "relative").symlink_to("../out.txt")
    (root / "in-and-out").symlink_to(f"../{root.name}/sub/in.txt")  # the kernel's RESOLVE_BENEATH refuses it too
    (root / "up").symlink_to("..")
    (root / "new-outside").symlink_to(outside / "new.txt")
    (root / "loop").symlink_to("loop")
    for name in ("absolute", "relative", "in-and-out", "up/out.txt"):
        refused("read", root / name, root, "outside the session's working directory")
    for name in ("absolute", "relative", "new-outside"):
        refused("write", root / name, root, "outside", content="owned")
    assert (outside / "out.txt").read_text() == "out" and not (outside / "new.txt").exists()
    refused("read", root / "loop", root, f"more than {MAX_SYMLINKS} symlinks")


def test_the_working_directory_is_held_so_replacing_its_path_redirects_nothing(root: Path) -> None:
    with FileRoot(str(root)) as held:
        root.rename(root.parent / "moved")
        root.symlink_to(root.parent)  # the path now leads to the parent, where out.txt is
        refused("read", root / "out.txt", held, "no such file")  # looked for in the held directory
        assert read(root / "sub" / "in.txt", held) == "in"
        assert write(root / "out.txt", held, "written") is None
    assert (root.parent / "out.txt").read_text() == "out"
    assert (root.parent / "moved" / "out.txt").read_text() == "written"


def test_a_fifo_a_socket_a_device_or_a_proc_file_is_refused_at_once(root: Path) -> None:
    os.mkfifo(root / "fifo")
    short = tempfile.mkdtemp()  # a socket's path must fit in 108 bytes: bound there, then moved in
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(f"{short}/s")
        os.rename(f"{short}/s", root / "socket")
        os.rmdir(short)
        for operation in ("read", "write"):
            refused(
                operation,
                root / "fifo",
                root,
                "it is a FIFO; the bridge reads and writes regular files only",
                content="x",
            )
            refused(operation, root / "socket", root, "it is a socket", content="x")
            refused(operation, root / "sub", root, "it is a directory", content="x")
            refused(operation, root, root, "it is a directory", content="x")
            refused(operation, "/dev/null", "/dev", "it is a device", content="x")
    refused("read", "/dev/zero", "/dev", "it is a device")
    refused("read", "/proc/self/status", "/proc", "it is a file of proc, a kernel pseudo file system")
    refused("read", "/proc/self/environ", "/", "proc")  # the bridge's own environment, had it been read


def test_a_write_never_goes_to_a_file_with_other_hard_links(root: Path) -> None:
    os.link(root.parent / "out.txt", root / "linked.txt")  # one file, one name inside and one outside
    refused("write", root / "linked.txt", root, "other hard links", content="owned")
    assert (root.parent / "out.txt").read_text() == "out"
    assert read(root / "linked.txt", root) == "out"  # a read: the agent could read the file itself by either name


def test_every_failure_is_a_file_refused_never_another_exception(root: Path) -> None:
    assert issubclass(FileRefused, BridgeError)
    (root / "file").write_text("x")
    with FileRoot(str(root)) as held:
        for operation, path, match in [
            ("read", root / "nope", "no such file"),
            ("write", root / "no-dir" / "new", "no such file"),
            ("read", root / "file" / "below", "not a directory"),
            ("read", f"{root}/sub/", "names a directory"),
            ("read", f"{root}/a\0b", "NUL"),
            ("read", f"{root}/\ud800", "not valid text"),
            ("read", f"{root}/{'x' * 300}", "File name too long"),
            ("read", f"{root}/{'x/' * (MAX_PATH_BYTES // 2)}", f"over {MAX_PATH_BYTES} bytes"),
            ("write", root / "huge", f"over {MAX_FILE_BYTES // (1024 * 1024)} MiB"),
        ]:
            content = "x" * (MAX_FILE_BYTES + 1) if path == root / "huge" else "x"
            refused(operation, path, held, match, content=content)
    with open(root / "big", "wb") as big:
        big.truncate(MAX_FILE_BYTES + 1)
    refused("read", root / "big", root, "MiB")
    refused("read", root / "file", held, "the agent's session is over")  # closed: requests end, none is served
    assert write(root / "new.txt", root, "é") is None
    assert (root / "new.txt").read_text() == "é"


def test_a_directory_swapped_for_a_symlink_out_mid_request_never_leads_out(tmp_path: Path) -> None:
    tree = RaceTree(tmp_path)
    texts: Counter[str | None] = Counter()  # what each read returned; "refused"; or the exception that escaped
    with FileRoot(str(tree.work)) as held, tree.swapping():
        number = 0
        # 2000 requests, and on until each outcome was met (a read, a write, a refusal): a swapper the machine starves
        # only delays it, and one that wins every write's race only makes the writes take longer to get through.
        while number < 2000 or not (texts[INSIDE] and texts[None] and texts["refused"]):
            assert number < 100_000, texts
            request = (
                FileRequest("w", "write", str(tree.path), content=INSIDE)
                if number % 4 == 3
                else FileRequest("r", "read", str(tree.path))
            )
            try:
                texts[serve_file_request(request, held)] += 1
            except FileRefused:
                texts["refused"] += 1
            except Exception as err:
                texts[type(err).__name__] += 1
            number += 1
    assert tree.outside_file.read_text() == OUTSIDE
    assert OUTSIDE not in texts, texts
    assert set(texts) == {INSIDE, None, "refused"}, texts  # read, written, refused: no other exception
