"""Files an agent leaves for the user: the turn's outbox (docs/protocol.md §5).

The agent learns the directory from `AGENT_OUTBOX`; when the turn ends,
`collect` turns what it holds into `FileEvent`s, bounded in count and bytes.
The agent owns the directory's contents and may have planted anything there,
or change it after the turn — swap a file for a link to a secret, move the
outbox aside and put a link to the user's home in its place — so nothing is
done by path. Collecting an outbox holds it (`HeldOutbox`): a descriptor of
the outbox and of the directory it is in, opened without following a link,
and the identity (device, inode, size, times) of each regular file collected
(by `lstat`: no symlinks, devices, FIFOs or sub-directories). Reading a file
(`open_collected`, `read_file`) opens its name beneath the outbox's descriptor
with `O_NOFOLLOW` and checks that it is still that inode; removing one
(`remove_file`) unlinks its name beneath that descriptor only while it is;
removing the outbox (`remove_outbox`) empties the directory the descriptor
holds and removes its name only while that is still the outbox. The outbox is
let go of (its descriptors closed) when it is removed.
"""

from __future__ import annotations

import itertools
import mimetypes
import os
import resource
import stat
import threading
from dataclasses import dataclass
from typing import BinaryIO

from ..dialects.events import FileEvent
from ..errors import OutboxError
from ..log import get_logger
from .turn_directory import STATE_DIRECTORY, delete_beneath, remove_directory_beneath

DEFAULT_MAX_FILES = 20
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
# Entries of an outbox looked at, in the directory's order: they are sorted in memory, and an agent may leave millions.
MAX_ENTRIES = 10_000
_NAMES_IN_NOTE = 3  # skipped entries named in a note; more are counted
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(slots=True, frozen=True)
class Collected:
    """What a turn's outbox held: the files sent (by name), and a note for the user when some were not."""

    files: tuple[FileEvent, ...] = ()
    note: str = ""


def collect(directory: str, *, max_files: int = DEFAULT_MAX_FILES, max_bytes: int = DEFAULT_MAX_BYTES) -> Collected:
    """The regular files in `directory` (not below it), in name order, at most `max_files` totalling `max_bytes`;
    the outbox is held (`HeldOutbox`) while they wait. The last component of `directory` is not followed.

    A missing or empty directory holds nothing. What is skipped — not a regular file, over the
    count, or over the bytes left — is named in `note`. Only `MAX_ENTRIES` entries are looked at (the first
    the directory lists), and the note says so when it holds more.
    """
    parent_path, name = os.path.split(os.path.normpath(directory))
    try:
        parent = os.open(parent_path or ".", _DIRECTORY_FLAGS)
    except FileNotFoundError:
        return Collected()
    except OSError as err:
        return Collected(note=f"the outbox could not be read ({err.strerror}); no files were sent")
    return collect_beneath(parent, name, directory, max_files=max_files, max_bytes=max_bytes)


def collect_beneath(
    parent: int, name: str, directory: str, *, max_files: int = DEFAULT_MAX_FILES, max_bytes: int = DEFAULT_MAX_BYTES
) -> Collected:
    """As `collect`, for the outbox `name` in the directory of the descriptor `parent` (which this takes over and
    closes, or keeps in the `HeldOutbox`); `directory` is the outbox's path, for the `FileEvent`s."""
    try:
        fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        os.close(parent)
        return Collected()
    except OSError as err:
        os.close(parent)
        return Collected(note=f"the outbox could not be read ({err.strerror}); no files were sent")
    try:
        with os.scandir(fd) as listing:
            entries = sorted(
                (entry.name, entry.stat(follow_symlinks=False)) for entry in itertools.islice(listing, MAX_ENTRIES + 1)
            )
    except OSError as err:
        os.close(fd)
        os.close(parent)
        return Collected(note=f"the outbox could not be read ({err.strerror}); no files were sent")
    unread = len(entries) > MAX_ENTRIES
    del entries[MAX_ENTRIES:]
    files: list[FileEvent] = []
    identities: dict[str, FileIdentity] = {}
    not_files: list[str] = []
    too_many: list[str] = []
    too_big: list[str] = []
    room = max_bytes
    for entry_name, info in entries:
        if not stat.S_ISREG(info.st_mode):
            not_files.append(entry_name)
        elif len(files) >= max_files:
            too_many.append(entry_name)
        elif info.st_size > room:
            too_big.append(entry_name)
        else:
            room -= info.st_size
            files.append(
                FileEvent(entry_name, os.path.join(directory, entry_name), info.st_size, media_type_of(entry_name))
            )
            identities[entry_name] = identity_of(info)
    if files:
        hold(HeldOutbox(parent, name, fd, directory, identities))
    else:
        os.close(fd)
        os.close(parent)
    notes = []
    if unread:
        notes.append(f"the outbox holds over {MAX_ENTRIES} entries: only {MAX_ENTRIES} of them were looked at")
    if too_many:
        notes.append(f"{_listed(too_many)} not sent: a turn sends at most {max_files} files")
    if too_big:
        notes.append(f"{_listed(too_big)} not sent: a turn sends at most {human_size(max_bytes)} in all")
    if not_files:
        notes.append(f"{_listed(not_files)} not sent: only regular files are (no links, directories or devices)")
    return Collected(tuple(files), "; ".join(notes))


FileIdentity = tuple[int, int, int, int, int]  # device, inode, size, mtime and ctime (ns): a rewrite changes times


def identity_of(info: os.stat_result) -> FileIdentity:
    """What a held file must still be: its device, inode, size and times."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


class HeldOutbox:
    """An outbox whose collected files wait for delivery, held by descriptors: `parent` (the directory it is in)
    and `outbox` (its own, opened beneath `parent` without following a link), and each collected file's identity
    by name. Whatever the agent does to the paths afterwards, reads and removals reach only these inodes."""

    def __init__(self, parent: int, name: str, outbox: int, path: str, files: dict[str, FileIdentity]) -> None:
        self.path = path
        self._parent = parent
        self._name = name
        self._outbox = outbox
        self._files = files
        self._lock = threading.Lock()  # a fleet worker stores files in a thread of its own

    def open(self, name: str) -> BinaryIO:
        """File `name` open for reading, if it is still the inode collected; else `OutboxError`."""
        expected = self._files.get(name)
        with self._lock:
            if expected is None or self._outbox < 0:
                raise OutboxError(f"the file {name!r} is no longer waiting to be sent")
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._outbox)
            except OSError as err:
                raise OutboxError(f"the file {name!r} cannot be read: {err.strerror}") from None
        handle = os.fdopen(fd, "rb")
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or identity_of(info) != expected:
            handle.close()
            raise OutboxError(f"the file {name!r} changed after the turn ended; it is not sent")
        return handle

    def remove(self, name: str) -> None:
        """Unlink file `name` beneath the outbox's descriptor, if it is still the inode collected."""
        with self._lock:
            expected = self._files.pop(name, None)
            if expected is not None and self._outbox >= 0:
                _unlink_if(self._outbox, name, expected[:2])

    def remove_all(self) -> None:
        """Delete what the outbox holds, then its name if that is still the outbox; let go of it. Once."""
        with self._lock:
            if self._outbox < 0:
                return
            remove_directory_beneath(self._parent, self._name, self._outbox)
            self._close()

    def release(self) -> None:
        """Let go of the outbox and leave it as it is."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._outbox >= 0:
            os.close(self._outbox)
            os.close(self._parent)
            self._outbox = self._parent = -1
        self._files.clear()


def _unlink_if(directory: int, name: str, inode: tuple[int, int]) -> None:
    """Unlink `name` in `directory` while it is the file `inode` (device, inode); anything else stays."""
    try:
        if identity_of(os.stat(name, dir_fd=directory, follow_symlinks=False))[:2] == inode:
            os.unlink(name, dir_fd=directory)
    except OSError:
        pass


MAX_HELD_OUTBOXES = 4096  # two descriptors each, and at most a quarter of the process's descriptors
_held: dict[str, HeldOutbox] = {}  # by path, the oldest first
_held_lock = threading.Lock()


def hold(outbox: HeldOutbox) -> None:
    """Keep `outbox` until it is removed (`remove_outbox`), by its path. Beyond `held_bound()` outboxes the oldest
    is let go of: its files are no longer sent, and go only with the outbox (`remove_outbox`, as one not held)."""
    with _held_lock:
        replaced = _held.pop(outbox.path, None)
        _held[outbox.path] = outbox
        evicted = [_held.pop(next(iter(_held))) for _ in range(len(_held) - held_bound())]
    if replaced is not None:
        replaced.release()
    for old in evicted:
        get_logger(component="outbox").warning(
            "too many outboxes wait for their files to be delivered; the oldest is let go of, its files no longer sent",
            outbox=old.path,
            held=len(_held),
        )
        old.release()


def held_bound() -> int:
    """How many outboxes are held at most: `MAX_HELD_OUTBOXES`, fewer where the descriptors allowed are few."""
    allowed, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if allowed == resource.RLIM_INFINITY:
        return MAX_HELD_OUTBOXES
    return max(16, min(MAX_HELD_OUTBOXES, allowed // 8))


def held(directory: str) -> HeldOutbox | None:
    """The held outbox whose path is `directory`."""
    with _held_lock:
        return _held.get(directory)


def read_file(file: FileEvent, max_bytes: int | None = None) -> bytes:
    """The bytes of a collected file, read beneath its outbox's descriptor without following a link;
    `OutboxError` when it is no longer the regular file collected, or is over `max_bytes`."""
    if max_bytes is not None and file.size > max_bytes:
        raise OutboxError(f"the file {file.name!r} is {human_size(file.size)}, over {human_size(max_bytes)}")
    with open_collected(file) as handle:
        data = handle.read(file.size + 1)
    if len(data) != file.size:
        raise OutboxError(f"the file {file.name!r} changed after the turn ended; it is not sent")
    return data


def open_collected(file: FileEvent) -> BinaryIO:
    """A collected file open for reading, beneath its held outbox's descriptor and without following a link;
    `OutboxError` when it is no longer the inode collected (or its outbox is no longer held). A reader that takes
    it in pieces checks that it got `file.size` bytes, no more."""
    outbox = held(os.path.dirname(file.path))
    if outbox is None:
        raise OutboxError(f"the file {file.name!r} is no longer waiting to be sent")
    return outbox.open(file.name)


def remove_file(file: FileEvent) -> None:
    """Delete a collected file beneath its outbox's descriptor, while it is the inode collected (gone already, or
    something else now, is left alone)."""
    outbox = held(os.path.dirname(file.path))
    if outbox is not None:
        outbox.remove(file.name)


def remove_outbox(directory: str) -> None:
    """Delete the outbox `directory` with whatever is in it: a held outbox beneath its descriptors (its name only
    while it is still the outbox); another (not collected by this process, or let go of) beneath its directory, a
    turn's `.agent-bridge/outbox` reached from the working directory without following a link."""
    with _held_lock:
        outbox = _held.pop(directory, None)
    if outbox is not None:
        outbox.remove_all()
        return
    parent_path, name = os.path.split(os.path.normpath(directory))
    try:
        parent = _outboxes_directory(parent_path or ".")
    except OSError:
        return
    try:
        delete_beneath(parent, name)
    finally:
        os.close(parent)


def _outboxes_directory(path: str) -> int:
    """A descriptor of the directory `path`; when it is a working directory's `.agent-bridge/outbox` (the agent's
    own), those two reached without following a link, the working directory as its path says (the operator's)."""
    above, last = os.path.split(path)
    cwd, state = os.path.split(above)
    if (state, last) != (STATE_DIRECTORY, "outbox"):
        return os.open(path, _DIRECTORY_FLAGS)
    descriptor = os.open(cwd or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for name in (STATE_DIRECTORY, "outbox"):
        try:
            inner = os.open(name, _DIRECTORY_FLAGS, dir_fd=descriptor)
        finally:
            os.close(descriptor)
        descriptor = inner
    return descriptor


def media_type_of(name: str) -> str:
    """The media type a file's name says, `application/octet-stream` when it says none."""
    guessed, _ = mimetypes.guess_type(name, strict=False)
    return guessed or "application/octet-stream"


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:_NAMES_IN_NOTE])
    more = len(names) - _NAMES_IN_NOTE
    return shown + (f" and {more} more" if more > 0 else "")


def human_size(size: int) -> str:
    """`size` bytes for a person: `512 bytes`, `1.5 KiB`, `50.0 MiB`."""
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"
