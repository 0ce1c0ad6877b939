"""Remembers validated profiles, so an unchanged profile loads without pydantic.

Like Python's own bytecode cache: an entry records a profile file's path and
exact content together with the validated values, and is used only when all
of them — and the validator itself — are unchanged. Anything unexpected (no
cache directory, a corrupt or foreign entry) is a miss, never an error: the
profile is then simply validated again.

An entry says which command to run, so it is trusted only when no other user
could have written it, as ssh treats its files: the entry and the cache's own
directories must belong to the effective user, and every directory on the way
there (symlinks followed) to that user or root, none writable by group or
others — except a sticky directory such as /tmp, where nobody may rename or
remove what is ours. Otherwise the cache is not used at all — no lookup, no
store — and one warning per process names the culprit and the fix. The
verdict on the directory is taken once per process: a few `lstat`s.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

_FORMAT = 2
# What decides whether a profile is valid, and what validation produces: an edit to any of them validates afresh.
_VALIDATORS = (
    *(
        Path(__file__).with_name(name)
        for name in ("schema.py", "argv_rules.py", "argv_programs.py", "fields.py", "sections.py")
    ),
    # The other sections' types, which hold their defaults (see `sections.py`).
    *(
        Path(__file__).parent.parent / name
        for name in ("dialects/settings.py", "permissions.py", "confinement/sandbox.py", "confinement/limits.py")
    ),
)
_MAX_SYMLINKS = 40  # the kernel's own limit before ELOOP

_verdicts: dict[tuple[str, int], bool] = {}  # (cache directory, effective uid) -> trusted
_warned_entries: set[str] = set()


def cache_directory() -> Path:
    """`$XDG_CACHE_HOME/agent-bridge/profiles`, else `~/.cache/…` (an unset, empty or relative value is ignored)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "agent-bridge", "profiles")


def lookup(path: str, content: bytes) -> dict[str, Any] | None:
    """The validated values of this exact file, if remembered by a trusted cache."""
    directory = cache_directory()
    if not _trusted(directory):
        return None
    entry_path = _entry_path(directory, path, content)
    try:
        descriptor = os.open(entry_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(descriptor, "rb") as file:
            status = os.fstat(file.fileno())
            problem = trust_problem(status, os.geteuid(), must_be_ours=True)
            if problem is not None or not stat.S_ISREG(status.st_mode):
                if problem is not None and str(entry_path) not in _warned_entries:
                    _warned_entries.add(str(entry_path))
                    _warn(
                        str(entry_path),
                        problem,
                        "nothing to do: it is ignored, and replaced by a private entry once the profile is validated",
                    )
                return None
            entry = json.loads(file.read())
        if (entry["validator"], entry["path"], entry["content"]) == (_validator_stamp(), path, _text(content)):
            values: dict[str, Any] = entry["values"]
            return values
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def store(path: str, content: bytes, values: Mapping[str, Any]) -> None:
    """Remember a validation; best effort (a read-only home just means no cache)."""
    directory = cache_directory()
    if _verdicts.get(_verdict_key(directory)) is False:
        return
    entry = {
        "validator": _validator_stamp(),
        "path": path,
        "content": _text(content),
        "values": dict(values),
    }
    target = _entry_path(directory, path, content)
    try:
        make_private_directories(directory)
        if not _trusted(directory):
            return
        # Profiles may hold secrets in `env`: entries are private to the user.
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".entry-")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                json.dump(entry, file)
            os.replace(temporary, target)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError:
        pass


def trust_problem(status: os.stat_result, euid: int, *, must_be_ours: bool) -> str | None:
    """Why another user than `euid` could change this file or directory, or None when nobody could.

    The owner must be `euid` (or root, unless `must_be_ours`), and group and
    others must not be able to write — a sticky directory excepted, unless
    `must_be_ours`: there nobody may rename or remove what others own.
    """
    if status.st_uid != euid and (must_be_ours or status.st_uid != 0):
        return f"owned by uid {status.st_uid}, not by this user (uid {euid}){'' if must_be_ours else ' or root'}"
    sticky = stat.S_ISDIR(status.st_mode) and status.st_mode & stat.S_ISVTX
    if status.st_mode & 0o022 and (must_be_ours or not sticky):
        return f"writable by group or others (mode {stat.S_IMODE(status.st_mode):o})"
    return None


class Distrust(NamedTuple):
    """Why a cache directory is not trusted: which directory on its way, what is wrong with it, the fix."""

    path: str
    problem: str
    fix: str


def untrusted_directory(directory: str | os.PathLike[str], euid: int) -> Distrust | None:
    """The first directory on the way to `directory` that another user could change; None if none.

    Walks from / down, following symlinks, so every directory the path goes
    through is checked — the one holding a symlink as well as its target. The
    resolved directory and its parent (…/agent-bridge/profiles) must be
    `euid`'s own. Raises OSError when the path does not lead to a directory.
    """
    visited: dict[str, os.stat_result] = {"/": os.stat("/")}
    current = "/"
    # Not os.path.abspath: it would drop "x/.." lexically, and x may be a symlink.
    pending = list(reversed(Path(os.getcwd(), directory).parts[1:]))  # a stack: the next name last
    links = 0
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        status = os.lstat(candidate)
        if stat.S_ISLNK(status.st_mode):
            links += 1
            if links > _MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(directory))
            target = Path(os.readlink(candidate))
            if target.is_absolute():
                current = "/"
            pending.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
            continue
        if not stat.S_ISDIR(status.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), candidate)
        visited[candidate] = status
        current = candidate
    own = {current, os.path.dirname(current)}
    for path, status in visited.items():
        problem = trust_problem(status, euid, must_be_ours=path in own)
        if problem is None:
            continue
        if problem.startswith("writable"):
            fix = f"chmod go-w {path}"
        elif path in own:
            fix = f"remove {path} (it is created again, private)"
        else:
            fix = "point XDG_CACHE_HOME at a directory of your own"
        return Distrust(path, problem, fix)
    return None


def _trusted(directory: Path) -> bool:
    """Whether `directory` may hold entries; decided once per process (and warned about once)."""
    key = _verdict_key(directory)
    verdict = _verdicts.get(key)
    if verdict is None:
        try:
            distrust = untrusted_directory(directory, key[1])
        except OSError:
            return False  # not there (yet), or not a directory: a miss, and nothing to warn about
        verdict = _verdicts[key] = distrust is None
        if distrust is not None:
            _warn(distrust.path, distrust.problem, f"{distrust.fix}; until then every profile is validated afresh")
    return verdict


def _verdict_key(directory: Path) -> tuple[str, int]:
    return str(directory), os.geteuid()


def _warn(path: str, problem: str, fix: str) -> None:
    from ..log import get_logger  # only now: the cache sits on the CLI's start-up path

    get_logger(component="profile_cache").warning(
        "profile cache not trusted: another user could have written it", path=path, problem=problem, fix=fix
    )


def make_private_directories(directory: Path) -> None:
    """Create `directory` and its missing parents, each private to the user (mkdir -p would follow the umask).

    The profile cache's directories and the session store's (docs/profiles.md, docs/sessions.md: made 0700).
    Raises NotADirectoryError when it, or the nearest of its parents that exists, is not a directory."""
    missing = []
    existing = directory
    while not existing.exists():
        missing.append(existing)
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
    for each in reversed(missing):
        each.mkdir(mode=0o700, exist_ok=True)


def _entry_path(directory: Path, path: str, content: bytes) -> Path:
    # crc32 only names the file; lookup() compares path and content in full.
    return directory / f"{zlib.crc32(path.encode()):08x}-{zlib.crc32(content):08x}.json"


def _validator_stamp() -> list[Any]:
    """Changes whenever the validating code does (a new release, or an edit in a checkout)."""
    stamp: list[Any] = [_FORMAT]
    for path in _VALIDATORS:
        stat_result = path.stat()
        stamp += [stat_result.st_mtime_ns, stat_result.st_size]
    return stamp


def _text(content: bytes) -> str:
    return content.decode("utf-8", "surrogateescape")
