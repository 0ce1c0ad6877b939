"""Files a warm agent asks the bridge for (bridge/agent_files.py): lines, limits, and the working directory's walls."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.agent_files import MAX_FILE_BYTES, FileRefused, serve_file_request
from bridge.dialects.events import FileRequest


def read(path: Path, root: Path, line: int | None = None, limit: int | None = None) -> str | None:
    return serve_file_request(FileRequest("r1", "read", str(path), line=line, limit=limit), str(root))


def test_line_and_limit_pick_lines_1_based(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("a\nb\nc\nd")
    assert read(tmp_path / "f.txt", tmp_path) == "a\nb\nc\nd"
    assert read(tmp_path / "f.txt", tmp_path, line=2) == "b\nc\nd"
    assert read(tmp_path / "f.txt", tmp_path, line=2, limit=2) == "b\nc\n"
    assert read(tmp_path / "f.txt", tmp_path, limit=1) == "a\n"
    assert read(tmp_path / "f.txt", tmp_path, line=9) == ""


def test_paths_must_be_absolute_and_stay_inside_after_resolving(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "out.txt").write_text("x")
    (root / "sub" / "in.txt").write_text("y")
    assert read(root / "sub" / ".." / "sub" / "in.txt", root) == "y"
    for path in ("sub/in.txt", str(root / ".." / "out.txt"), str(tmp_path / "rootish" / "x")):
        with pytest.raises(FileRefused):
            serve_file_request(FileRequest("r", "read", path), str(root))


def test_a_write_cannot_follow_a_symlink_out_and_a_huge_file_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside)
    with pytest.raises(FileRefused, match="outside"):
        serve_file_request(FileRequest("w", "write", str(root / "link"), content="owned"), str(root))
    assert not outside.exists()
    with open(root / "big", "wb") as big:
        big.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(FileRefused, match="MiB"):
        read(root / "big", root)
    assert serve_file_request(FileRequest("w", "write", str(root / "new.txt"), content="é"), str(root)) is None
    assert (root / "new.txt").read_text() == "é"
