"""Files an agent leaves for the user: the turn's outbox (docs/protocol.md §5).

The agent learns the directory from `AGENT_OUTBOX`; when the turn ends,
`collect` turns what it holds into `FileEvent`s, bounded in count and bytes.
The agent owns the directory's contents and may have planted anything there,
so nothing is followed: the directory is opened with `O_NOFOLLOW`, entries are
judged by `lstat` (only regular files count: no symlinks, devices, FIFOs or
sub-directories), and `read_file` opens a file with `O_NOFOLLOW` and checks
that what it opened is still the regular file collected.
"""

from __future__ import annotations

import dataclasses
import mimetypes
import os
import shutil
import stat
from dataclasses import dataclass
from typing import Any, BinaryIO

from .dialects.events import ActivityEvent, FileEvent
from .errors import OutboxError
from .profile import Profile
from .result import Outcome, TurnResult
from .turn_files import TurnFiles
from .turn_loop import Emit

DEFAULT_MAX_FILES = 20
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
_NAMES_IN_NOTE = 3  # skipped entries named in a note; more are counted


@dataclass(slots=True, frozen=True)
class Collected:
    """What a turn's outbox held: the files sent (by name), and a note for the user when some were not."""

    files: tuple[FileEvent, ...] = ()
    note: str = ""


def collect(directory: str, *, max_files: int = DEFAULT_MAX_FILES, max_bytes: int = DEFAULT_MAX_BYTES) -> Collected:
    """The regular files in `directory` (not below it), in name order, at most `max_files` totalling `max_bytes`.

    A missing or empty directory holds nothing. What is skipped — not a regular file, over the
    count, or over the bytes left — is named in `note`.
    """
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return Collected()
    except OSError as err:
        return Collected(note=f"the outbox could not be read ({err.strerror}); no files were sent")
    try:
        with os.scandir(fd) as listing:
            entries = sorted((entry.name, entry.stat(follow_symlinks=False)) for entry in listing)
    finally:
        os.close(fd)
    files: list[FileEvent] = []
    not_files: list[str] = []
    too_many: list[str] = []
    too_big: list[str] = []
    room = max_bytes
    for name, info in entries:
        if not stat.S_ISREG(info.st_mode):
            not_files.append(name)
        elif len(files) >= max_files:
            too_many.append(name)
        elif info.st_size > room:
            too_big.append(name)
        else:
            room -= info.st_size
            files.append(FileEvent(name, os.path.join(directory, name), info.st_size, media_type_of(name)))
    notes = []
    if too_many:
        notes.append(f"{_listed(too_many)} not sent: a turn sends at most {max_files} files")
    if too_big:
        notes.append(f"{_listed(too_big)} not sent: a turn sends at most {human_size(max_bytes)} in all")
    if not_files:
        notes.append(f"{_listed(not_files)} not sent: only regular files are (no links, directories or devices)")
    return Collected(tuple(files), "; ".join(notes))


async def hand_out(files: TurnFiles, profile: Profile, result: TurnResult, emit: Emit | None, log: Any) -> TurnResult:
    """The turn is over: `result` with the files of the turn's outbox, each emitted as a `FileEvent` (and what was
    left out as a `notice`) before the result. An outbox that holds nothing to send is removed beneath the
    descriptor `files` holds; one that does is the host's to remove (`remove_outbox`) once the files were
    delivered."""
    if result.outcome is Outcome.CANCELLED:  # nobody waits for what a cancelled turn made
        files.remove_outbox()
        return result
    collected = collect(files.outbox, max_files=profile.outbox_max_files, max_bytes=profile.outbox_max_bytes)
    if not collected.files:
        files.remove_outbox()
    if collected.note:
        log.warning("outbox files left out", note=collected.note)
    if emit is not None:
        for file in collected.files:
            await emit(file)
        if collected.note:
            await emit(ActivityEvent("notice", text=collected.note))
    if not collected.files and not collected.note:
        return result
    return dataclasses.replace(result, files=collected.files, files_note=collected.note)


async def hand_out_turn_files(
    files: TurnFiles, keep_attachments: bool, profile: Profile, result: TurnResult, emit: Emit | None, log: Any
) -> TurnResult:
    """The turn is over: its fetched attachments deleted (unless `keep_attachments`: the profile keeps them), its
    outbox handed out (`hand_out`), and its directories let go of (what is left in them is the host's)."""
    if not keep_attachments:
        files.remove_attachments()
    if files.remove_outbox_if_empty():  # as most are: nothing to read
        files.close()
        return result
    try:
        return await hand_out(files, profile, result, emit, log)  # the outbox stays while it holds files
    finally:
        files.close()


def read_file(file: FileEvent, max_bytes: int | None = None) -> bytes:
    """The bytes of a collected file, read without following a link; `OutboxError` when it is no longer the
    regular file of `file.size` bytes that was collected, or is over `max_bytes`."""
    if max_bytes is not None and file.size > max_bytes:
        raise OutboxError(f"the file {file.name!r} is {human_size(file.size)}, over {human_size(max_bytes)}")
    with open_collected(file) as handle:
        data = handle.read(file.size + 1)
    if len(data) != file.size:
        raise OutboxError(f"the file {file.name!r} changed after the turn ended; it is not sent")
    return data


def open_collected(file: FileEvent) -> BinaryIO:
    """A collected file open for reading, without following a link; `OutboxError` when it is no longer the
    regular file of `file.size` bytes that was collected. A reader that takes it in pieces checks that it got
    `file.size` bytes, no more."""
    try:
        fd = os.open(file.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise OutboxError(f"the file {file.name!r} cannot be read: {err.strerror}") from None
    handle = os.fdopen(fd, "rb")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size != file.size:
        handle.close()
        raise OutboxError(f"the file {file.name!r} changed after the turn ended; it is not sent")
    return handle


def remove_file(file: FileEvent) -> None:
    """Delete a collected file (gone already is fine)."""
    try:
        os.unlink(file.path)
    except FileNotFoundError:
        pass


def remove_outbox(directory: str) -> None:
    """Delete the outbox `directory` with whatever is in it."""
    try:
        os.rmdir(directory)  # most outboxes are left empty
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)


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
