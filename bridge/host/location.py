"""Where the session store file is: for `SessionStore`, and for `agent-bridge run`, which takes its place in the
conversation's queue next to it before the rest of the bridge loads (`bridge.command`). Imports nothing heavy."""

from __future__ import annotations

import os
from pathlib import Path


def default_store_path() -> Path:
    """`$XDG_STATE_HOME/agent-bridge/sessions.sqlite3`, else `~/.local/state/agent-bridge/…`.

    Per the XDG spec an unset, empty or relative `XDG_STATE_HOME` is ignored.
    """
    state_home = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state_home) if os.path.isabs(state_home) else Path.home() / ".local" / "state"
    return base / "agent-bridge" / "sessions.sqlite3"


def store_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The file a `SessionStore(path)` uses: `path` (`~` expanded), else the default."""
    return Path(os.path.expanduser(path)) if path is not None else default_store_path()
