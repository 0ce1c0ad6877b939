"""Profiles found by name in a directory, re-read when their file changes.

A host that runs for months must pick up an edited profile without a restart,
yet looking one up sits on every turn's path. So a lookup only stats: the
directory (its listing is re-read when it changed) and each profile file (a
file is re-parsed when its device, inode, size, mtime or ctime changed). No
polling loop, no watcher thread.

File systems stamp times with a coarse clock, so a file rewritten twice within
one tick can keep its stamp. A file (or the directory) changed less than
`RACY_SECS` before it was read is therefore not trusted: it is re-read at every
lookup until its stamp is old enough to be conclusive (git's "racily clean"
rule).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import Problem, ProfileError, UnknownProfile
from ..profile import Profile, load_profile

SUFFIXES = (".yaml", ".yml")
RACY_SECS = 1.0

_Stamp = tuple[int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class _Entry:
    """One profile file as last read: the profile, or why it does not load."""

    file: str
    stamp: _Stamp
    trusted: bool
    profile: Profile | None
    error: ProfileError | None
    digest: str = ""  # sha256 of the file's bytes as read, when it loads: which definition of the profile this is

    @property
    def name(self) -> str:
        """The name a host asks for: the profile's `name`, or, when it does not load, the file's stem."""
        return self.profile.label if self.profile is not None else os.path.splitext(self.file)[0]


class ProfileRegistry:
    """The profiles of one directory (`<name>.yaml` or `<name>.yml`, not hidden files), by name.

    A profile's name is its `name` field, defaulting to the file's stem. Not
    thread-safe: one host (one trio loop) owns a registry.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(os.path.expanduser(directory))
        self._dir_stamp: _Stamp | None = None
        self._dir_trusted = False
        self._files: list[str] = []
        self._entries: dict[str, _Entry] = {}
        self._by_name: dict[str, list[_Entry]] = {}
        self.refresh()

    def get(self, name: str) -> Profile:
        """The current profile called `name`.

        Raises `UnknownProfile` when no file declares it, and `ProfileError`
        when its file does not load or two files claim the name.
        """
        self.refresh()
        claims = self._by_name.get(name, [])
        if len(claims) == 1:
            entry = claims[0]
            if entry.error is not None:
                raise entry.error
            assert entry.profile is not None
            return entry.profile
        if claims:
            files = ", ".join(str(self.directory / entry.file) for entry in claims)
            raise ProfileError(
                [
                    Problem(
                        f"profile name {name!r} is claimed by several files ({files}); "
                        "give each profile a distinct `name` or file name",
                        str(self.directory),
                    )
                ]
            )
        raise UnknownProfile([Problem(self._unknown_name_reason(name), str(self.directory))])

    def _unknown_name_reason(self, name: str) -> str:
        """What to do about a name no file declares; a file name given for a profile name is the usual slip."""
        available = ", ".join(self.names()) or "none"
        stem, dot, suffix = name.rpartition(".")
        if dot and stem and suffix.lower() in ("yaml", "yml"):
            if stem in self._by_name:
                return f"no profile named {name!r}: a profile is named without its file's .{suffix}; use {stem!r}"
            return (
                f"no profile named {name!r} (available: {available}); a profile is named without its file's "
                f".{suffix}: add {stem}.yaml there and use {stem!r}, or use one of the available names"
            )
        return f"no profile named {name!r} (available: {available}); add {name}.yaml there, or use one of them"

    def loaded(self) -> dict[str, Profile]:
        """Every profile that loads, by name, as of a refresh now (immutable: safe to hand to other threads)."""
        self.refresh()
        # Every entry _loading gives has a profile; the test says so to mypy.
        return {entry.name: entry.profile for entry in self._loading() if entry.profile is not None}

    def digests(self) -> dict[str, str]:
        """{name: sha256 of its file's bytes} of the profiles `loaded()` gives, as of the last refresh: what a
        queue worker advertises, so that it runs only turns queued for the same definition."""
        return {entry.name: entry.digest for entry in self._loading()}

    def _loading(self) -> list[_Entry]:
        """The entry of each name that one file alone claims and that loads."""
        return [claims[0] for claims in self._by_name.values() if len(claims) == 1 and claims[0].profile is not None]

    def names(self) -> list[str]:
        """The names profiles can be asked for, as of the last refresh, sorted."""
        return sorted(self._by_name)

    def broken(self) -> list[ProfileError]:
        """The files that do not load, as of the last refresh."""
        return [entry.error for entry in self._entries.values() if entry.error is not None]

    def refresh(self) -> None:
        """Re-read what changed on disk since the last call."""
        now = time.time_ns()
        try:
            dir_stat = os.stat(self.directory)
        except OSError as err:
            raise ProfileError(
                [Problem(f"the profiles directory cannot be read: {err.strerror or err}", str(self.directory))]
            ) from None
        dir_stamp = _stamp(dir_stat)
        changed = False
        if dir_stamp != self._dir_stamp or not self._dir_trusted:
            try:
                listing = sorted(
                    name for name in os.listdir(self.directory) if name.endswith(SUFFIXES) and not name.startswith(".")
                )
            except OSError as err:
                raise ProfileError(
                    [Problem(f"the profiles directory cannot be listed: {err.strerror or err}", str(self.directory))]
                ) from None
            self._dir_stamp = dir_stamp
            self._dir_trusted = _conclusive(dir_stat, now)
            if listing != self._files:
                self._files = listing
                changed = True
        for file in self._files:
            entry = self._entries.get(file)
            path = self.directory / file
            try:
                file_stat = os.stat(path)
            except FileNotFoundError:  # removed since the listing; the directory's stamp will say so next time
                if self._entries.pop(file, None) is not None:
                    changed = True
                continue
            except OSError as err:  # a dangling or looping symlink, say
                error = ProfileError([Problem(f"cannot be read: {err.strerror or err}", str(path))])
                self._entries[file] = _Entry(file, (0, 0, 0, 0, 0), False, None, error)
                changed = True
                continue
            stamp = _stamp(file_stat)
            if entry is not None and entry.stamp == stamp and entry.trusted:
                continue
            self._entries[file] = _load(path, file, stamp, _conclusive(file_stat, now))
            changed = True
        if changed:
            for file in [file for file in self._entries if file not in self._files]:
                del self._entries[file]
            by_name: dict[str, list[_Entry]] = {}
            for entry in self._entries.values():
                by_name.setdefault(entry.name, []).append(entry)
            self._by_name = by_name


def _load(path: Path, file: str, stamp: _Stamp, trusted: bool) -> _Entry:
    # Read before the profile: a change in between leaves a new stamp, so the next refresh reads both again.
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        digest, trusted = "", False  # load_profile says what is wrong; should it load after all, read it again
    try:
        return _Entry(file, stamp, trusted, load_profile(path), None, digest)
    except ProfileError as err:
        return _Entry(file, stamp, trusted, None, err)


def _stamp(stat: os.stat_result) -> _Stamp:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _conclusive(stat: os.stat_result, now_ns: int) -> bool:
    """Whether the stamp is old enough that a later change within the same clock tick is impossible."""
    return now_ns - max(stat.st_mtime_ns, stat.st_ctime_ns) > RACY_SECS * 1e9
