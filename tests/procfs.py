"""What /proc says of a process, for the tests: its state letter and its line of ancestors."""

from __future__ import annotations

from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold anything), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()


def process_state(pid: int) -> str | None:
    """The /proc state letter of `pid` (R, S, Z…), or None when it no longer exists."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def ancestors(pid: int) -> list[int]:
    """`pid`'s parent, its parent's parent, … up to init, from /proc; as far as it goes when one of them is gone."""
    found = []
    while pid > 1 and (fields := _stat_fields(pid)):
        pid = int(fields[1])
        found.append(pid)
    return found
