"""serve's delivery of the files agents leave (docs/serve.md, "Files").

A `file` response names the file's path; the bot reads it and sends
`ack_file`, and the file is deleted. A turn request may ask for small files
inline (`inline_files_max_bytes`): those travel base64 in the response and are
deleted at once. A file never acknowledged is deleted `ttl_secs` after it was
offered, and every file still waiting when serve ends is deleted then: none
outlives the bot going away. A turn's outbox directory goes once its last file
has. Reading and deleting go through `bridge.files.outbox`, beneath the descriptors
of the outbox held since its files were collected, never by the paths the bot
is shown (the agent may have changed what they lead to).
"""

from __future__ import annotations

import base64
import dataclasses
import os
from typing import Any

import trio

from ..dialects.events import FileEvent
from ..engine.result import TurnResult
from ..errors import OutboxError
from ..files.outbox import read_file, remove_file, remove_outbox
from ..log import get_logger

DEFAULT_FILE_TTL = 600.0
MAX_INLINE_FILE_BYTES = 8 * 1024 * 1024  # a base64 body is a third larger, on one response line


class FileDeliveries:
    """The files offered to the bot and not yet acknowledged, by (turn key, file name)."""

    def __init__(self, nursery: trio.Nursery, ttl_secs: float = DEFAULT_FILE_TTL) -> None:
        self._nursery = nursery
        self._ttl = ttl_secs
        self._waiting: dict[tuple[str, str], tuple[FileEvent, trio.CancelScope]] = {}
        self._per_outbox: dict[str, int] = {}  # files waiting in each outbox directory
        self._turn_over: set[str] = set()  # outboxes whose turn delivered its result: nothing more comes
        self._log = get_logger(component="serve")

    def offer(self, turn: str, file: FileEvent, inline_max_bytes: int) -> dict[str, Any]:
        """The `file` response's fields for `file`: with `data` (and deleted) when it is at most
        `inline_max_bytes`, else its path, waiting for `ack_file`."""
        record: dict[str, Any] = dataclasses.asdict(file)
        if file.size <= inline_max_bytes:
            try:
                record["data"] = base64.b64encode(read_file(file, inline_max_bytes)).decode("ascii")
            except OutboxError as err:
                self._log.warning("an outbox file could not be read inline; offered by path", error=str(err))
            else:
                remove_file(file)
                return record
        key = (turn, file.name)
        if key in self._waiting:  # the id of a finished turn was used again: the older file is not waited for
            self._forget(key)
        scope = trio.CancelScope()
        self._waiting[key] = (file, scope)
        outbox = os.path.dirname(file.path)
        self._per_outbox[outbox] = self._per_outbox.get(outbox, 0) + 1
        self._nursery.start_soon(self._expire, key, scope)
        return record

    def turn_over(self, result: TurnResult) -> None:
        """The turn's result was sent: its outbox goes once its waiting files have (now, when none wait)."""
        for outbox in {os.path.dirname(file.path) for file in result.files}:
            if self._per_outbox.get(outbox):
                self._turn_over.add(outbox)
            else:
                remove_outbox(outbox)

    def waiting(self, turn: str, name: str) -> FileEvent | None:
        """File `name` of turn `turn`, while it waits for the bot."""
        entry = self._waiting.get((turn, name))
        return entry[0] if entry is not None else None

    def ack(self, turn: str, name: str) -> bool:
        """The bot has file `name` of turn `turn`: delete it. False when no such file waits."""
        if (turn, name) not in self._waiting:
            return False
        self._forget((turn, name))
        return True

    def close(self) -> None:
        """serve ends: every file still waiting is deleted."""
        outboxes = set(self._per_outbox)
        for key in list(self._waiting):
            self._forget(key)
        for outbox in outboxes:
            remove_outbox(outbox)

    async def _expire(self, key: tuple[str, str], scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep(self._ttl)
            self._log.info("an outbox file was not acknowledged in time; deleted", file=key[1])
            self._forget(key)

    def _forget(self, key: tuple[str, str]) -> None:
        file, scope = self._waiting.pop(key)
        scope.cancel()
        remove_file(file)
        outbox = os.path.dirname(file.path)
        left = self._per_outbox[outbox] - 1
        if left:
            self._per_outbox[outbox] = left
            return
        del self._per_outbox[outbox]
        if outbox in self._turn_over:
            self._turn_over.discard(outbox)
            remove_outbox(outbox)
