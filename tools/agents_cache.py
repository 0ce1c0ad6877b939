"""Where the tests find the real coding agents `make test-agents` installed (a cache outside the repo)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE = Path(os.environ.get("AGENT_BRIDGE_TEST_CACHE") or Path.home() / ".cache" / "agent-bridge-tests")


def npm_binary(name: str) -> Path:
    """The executable `name` of an npm package in the cache; fails (never skips) when it is missing."""
    path = CACHE / "npm" / "node_modules" / ".bin" / name
    assert path.exists(), (
        f"{path} is missing: run `make test-agents` (make test does) to install the real agents the tests drive"
    )
    return path
