"""Remembers validated profiles, so an unchanged profile loads without pydantic.

Like Python's own bytecode cache: an entry records a profile file's path and
exact content together with the validated values, and is used only when all
of them — and the validator itself — are unchanged. Anything unexpected (no
cache directory, a corrupt or foreign entry) is a miss, never an error: the
profile is then simply validated again.
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_FORMAT = 1
_VALIDATORS = tuple(Path(__file__).with_name(name) for name in ("schema.py", "argv_rules.py"))


def cache_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "agent-bridge", "profiles")


def lookup(path: str, content: bytes) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    """The validated (values, argv template) of this exact file, if remembered."""
    try:
        entry = json.loads(_entry_path(path, content).read_bytes())
        if (entry["validator"], entry["path"], entry["content"]) == (_validator_stamp(), path, _text(content)):
            return entry["values"], tuple(entry["argv_template"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def store(path: str, content: bytes, values: Mapping[str, Any], argv_template: tuple[str, ...]) -> None:
    """Remember a validation; best effort (a read-only home just means no cache)."""
    entry = {
        "validator": _validator_stamp(), "path": path, "content": _text(content),
        "values": dict(values), "argv_template": list(argv_template),
    }
    target = _entry_path(path, content)
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Profiles may hold secrets in `env`: entries are private to the user.
        handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".entry-")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                json.dump(entry, file)
            os.replace(temporary, target)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:
        pass


def _entry_path(path: str, content: bytes) -> Path:
    # crc32 only names the file; lookup() compares path and content in full.
    return cache_directory() / f"{zlib.crc32(path.encode()):08x}-{zlib.crc32(content):08x}.json"


def _validator_stamp() -> list[Any]:
    """Changes whenever the validating code does (a new release, or an edit in a checkout)."""
    stamp: list[Any] = [_FORMAT]
    for path in _VALIDATORS:
        stat = path.stat()
        stamp += [stat.st_mtime_ns, stat.st_size]
    return stamp


def _text(content: bytes) -> str:
    return content.decode("utf-8", "surrogateescape")
