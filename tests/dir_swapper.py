"""Swap two names for ever: `python dir_swapper.py A B` exchanges A and B atomically, in a tight loop.

What an agent that attacks the bridge's file requests would run beside itself:
with A a directory inside its working directory and B a symlink beside it to
a directory outside, a path through A names, from one moment to the next, a
file inside or the same-named file outside. `renameat2(RENAME_EXCHANGE)`, so
A and B always both exist. Writes "swapping" on stdout once the first
exchange is done, then swaps until it is killed.

`RaceTree` builds such a pair of trees for a test and runs the swapper on it.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

AT_FDCWD = -100
RENAME_EXCHANGE = 2
# Directories between the swapped one and the file: resolving them takes time, which is the window a check
# by name (realpath, then open) leaves open; deep, that window is hit often enough for a test to see it.
DEPTH = 12
INSIDE = "inside\n"
OUTSIDE = "OUTSIDE\n"


def main() -> None:
    first, second = (os.fsencode(path) for path in sys.argv[1:3])
    renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    if renameat2(AT_FDCWD, first, AT_FDCWD, second, RENAME_EXCHANGE) != 0:
        sys.exit(f"dir_swapper: renameat2: {os.strerror(ctypes.get_errno())}")
    print("swapping", flush=True)
    while True:
        renameat2(AT_FDCWD, first, AT_FDCWD, second, RENAME_EXCHANGE)


class RaceTree:
    """`work/swap/d0/…/file.txt` (INSIDE), and `outside/d0/…/file.txt` (OUTSIDE) that `work/gate` links to.

    While `swapping()`, `work/swap` and `work/gate` trade places: `path` is
    then, moment to moment, the file inside or the file outside.
    """

    def __init__(self, base: Path) -> None:
        self.work = base / "work"
        self.outside = base / "outside"
        below = [f"d{level}" for level in range(DEPTH)]
        for top, text in ((self.work / "swap", INSIDE), (self.outside, OUTSIDE)):
            top.joinpath(*below).mkdir(parents=True)
            top.joinpath(*below, "file.txt").write_text(text)
        (self.work / "gate").symlink_to(self.outside)
        self.path = self.work.joinpath("swap", *below, "file.txt")
        self.outside_file = self.outside.joinpath(*below, "file.txt")

    @contextmanager
    def swapping(self) -> Iterator[None]:
        process = subprocess.Popen(
            [sys.executable, __file__, str(self.work / "swap"), str(self.work / "gate")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None and process.stderr is not None
            started = process.stdout.readline()  # bounded: the swapper writes it, or exits
            assert started == "swapping\n", process.stderr.read()
            yield
        finally:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
