"""The files a turn's agent left, carried from its worker to its gateway in PostgreSQL (docs/fleet.md, "Files").

A worker's outbox is on the worker's disk; the bot talks to the gateway. So
the worker writes each file's bytes into `bridge_turn_files` (pieces of
`CHUNK_BYTES`, so neither side holds a whole file in memory) in the
transaction that writes the turn's result: a gateway that sees the result
sees its files. What was collected is already bounded by the profile's
`outbox_max_files` and `outbox_max_bytes` on the worker. The gateway that
delivers the result writes the files into a directory of its own, deletes
the rows in the same transaction, and hands the bot `FileEvent`s with its
local paths, as serve does for a turn it ran itself. The rows also go with
the turn's row (`ON DELETE CASCADE`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any, BinaryIO

from ...dialects.events import FileEvent
from ...engine.result import TurnResult
from ...errors import OutboxError
from ...files.outbox import FileIdentity, HeldOutbox, hold, identity_of, open_collected

Conn = Any  # psycopg.Connection, imported lazily

CHUNK_BYTES = 1024 * 1024
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def store(conn: Conn, key: str, result: TurnResult) -> TurnResult:
    """Write the bytes of `result.files` as the turn `key`'s rows (inside the caller's transaction): `result`
    with the files stored, and a note naming any that could not be read (changed after the turn ended)."""
    conn.execute("DELETE FROM bridge_turn_files WHERE key = %s", (key,))
    stored: list[FileEvent] = []
    problems: list[str] = []
    for file in result.files:
        try:
            with conn.transaction():  # a savepoint: a file that fails half-way leaves no piece behind
                _store_one(conn, key, len(stored), file)
        except OutboxError as err:
            problems.append(str(err))
            continue
        stored.append(file)
    if not problems:
        return result
    note = "; ".join(note for note in (result.files_note, *problems) if note)
    return dataclasses.replace(result, files=tuple(stored), files_note=note)


def _store_one(conn: Conn, key: str, place: int, file: FileEvent) -> None:
    with open_collected(file) as handle:
        left, chunk = file.size, 0
        while True:
            data = handle.read(min(CHUNK_BYTES, left + 1))
            if len(data) > left:
                raise OutboxError(f"the file {file.name!r} changed after the turn ended; it is not sent")
            if data or chunk == 0:  # an empty file still has its one (empty) piece
                conn.execute(
                    "INSERT INTO bridge_turn_files (key, file, chunk, data) VALUES (%s, %s, %s, %s)",
                    (key, place, chunk, data),
                )
            left -= len(data)
            chunk += 1
            if not data or not left:
                break
    if left:
        raise OutboxError(f"the file {file.name!r} changed after the turn ended; it is not sent")


def load(conn: Conn, key: str, result: TurnResult) -> tuple[TurnResult, str]:
    """The turn `key`'s stored files written into a new temporary directory of the gateway's: `result` with
    `FileEvent`s of their paths there, and what could not be sent (a file whose rows are gone: its result was
    delivered before), also in its `files_note`. The rows stay until the result is delivered
    (`queue.mark_delivered`), so a gateway that stops before its bot has the result leaves them for the next
    one. The directory is held as a turn's outbox is (`bridge.files.outbox.HeldOutbox`), and removed again when it
    holds nothing, or the loading fails."""
    directory = tempfile.mkdtemp(prefix="agent-bridge-files-")
    parent_path, directory_name = os.path.split(directory)
    parent = os.open(parent_path, _DIRECTORY_FLAGS)
    outbox = -1
    files: list[FileEvent] = []
    identities: dict[str, FileIdentity] = {}
    missing: list[str] = []
    try:
        outbox = os.open(directory_name, _DIRECTORY_FLAGS, dir_fd=parent)
        for place, file in enumerate(result.files):
            name = os.path.basename(file.name)
            if name in ("", ".", "..") or name != file.name:
                missing.append(file.name)  # not a name an outbox can hold: never written anywhere
                continue
            written, identity = _load_one(conn, key, place, outbox, name)
            if written == file.size and identity is not None:
                files.append(dataclasses.replace(file, path=os.path.join(directory, name)))
                identities[name] = identity
                continue
            if written >= 0:
                os.unlink(name, dir_fd=outbox)
            missing.append(name)
    except BaseException:
        shutil.rmtree(directory_name, dir_fd=parent, ignore_errors=True)
        for descriptor in (outbox, parent):
            if descriptor >= 0:
                os.close(descriptor)
        raise
    if files:
        hold(HeldOutbox(parent, directory_name, outbox, directory, identities))
    else:
        shutil.rmtree(directory_name, dir_fd=parent, ignore_errors=True)
        os.close(outbox)
        os.close(parent)
    if not missing:
        return dataclasses.replace(result, files=tuple(files)), ""
    problem = f"{', '.join(repr(name) for name in missing)} not sent: no longer stored (delivered before)"
    note = "; ".join(part for part in (result.files_note, problem) if part)
    return dataclasses.replace(result, files=tuple(files), files_note=note), problem


def _load_one(conn: Conn, key: str, place: int, directory: int, name: str) -> tuple[int, FileIdentity | None]:
    """Write file `place`'s pieces to `name` in `directory`: the bytes written and the file's identity once
    written; (-1, None) and no file when it has none stored."""
    written = -1
    identity: FileIdentity | None = None
    handle: BinaryIO | None = None
    try:
        # A named cursor fetches a few pieces at a time, not the whole file.
        with conn.cursor(name=f"bridge_file_{place}") as cursor:
            cursor.itersize = 4
            cursor.execute(
                "SELECT data FROM bridge_turn_files WHERE key = %s AND file = %s ORDER BY chunk", (key, place)
            )
            for (data,) in cursor:
                if handle is None:
                    handle = os.fdopen(os.open(name, _FILE_FLAGS, 0o600, dir_fd=directory), "wb")
                    written = 0
                handle.write(data)
                written += len(data)
        if handle is not None:
            handle.flush()
            identity = identity_of(os.fstat(handle.fileno()))
    finally:
        if handle is not None:
            handle.close()
    return written, identity
