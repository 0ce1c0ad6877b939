"""The programs the bridge puts in front of an agent's command: bwrap for `sandbox:`, prlimit for `limits:`.

Each is looked up on the bridge's PATH. A profile that needs one the machine lacks does not load (and `check`
says so), naming the package to install: an agent is never run without the confinement its profile asks for.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Tool:
    program: str
    package: str
    needed_for: str
    """What in a profile needs it, as the error names it: "a sandboxed agent"."""
    without: str
    """What to remove from the profile to run the agent without it."""


BWRAP = Tool("bwrap", "bubblewrap", "a sandboxed agent", "the sandbox section")
PRLIMIT = Tool("prlimit", "util-linux", "an agent with cpu_secs, file_size_mb or open_files", "those limits")
PRLIMIT_LIMITS = ("cpu_secs", "file_size_mb", "open_files")
"""The limits that are rlimits, which prlimit sets as the agent starts (`bridge.confinement.limits`)."""


def needs_prlimit(limits: Mapping[str, Any] | None) -> bool:
    """Whether a profile's `limits:` section sets an rlimit."""
    return limits is not None and any(limits.get(name) is not None for name in PRLIMIT_LIMITS)


def find_tool(tool: Tool, path: str | None = None) -> str | None:
    """The tool's path on `path` (the bridge's PATH by default), or None.

    Every sandboxed or limited launch asks (bench rows 29 and 30), so where it was found is remembered for each
    PATH, as a shell's hash table does, and checked with one `access` instead of a walk of PATH; a tool that is
    no longer there is looked up afresh."""
    path = path if path is not None else os.environ.get("PATH", os.defpath)
    key = (tool.program, path)
    found = _found.get(key)
    if found is not None and os.access(found, os.X_OK):
        return found
    found = shutil.which(tool.program, path=path)
    if found is None:
        _found.pop(key, None)
    else:
        if len(_found) >= 64:  # a host passing ever new PATHs: forget, rather than grow
            _found.clear()
        _found[key] = found
    return found


_found: dict[tuple[str, str], str] = {}


def missing_tool(tool: Tool) -> str:
    """What to do when a profile needs `tool` on a machine without it."""
    return (
        f"{tool.program} is not installed (or not on the bridge's PATH), and {tool.needed_for} never runs "
        f"unconfined; install the {tool.package} package (Debian, Ubuntu: apt-get install {tool.package}; "
        f"Fedora: dnf install {tool.package}), or remove {tool.without}"
    )
