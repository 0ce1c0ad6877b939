"""STAND-IN until the runtime engineer's platform.py is merged from main: the shared interface, values only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class IncomingFile:
    file_ref: str
    name: str
    media_type: str
    size: int


@dataclass(frozen=True)
class Incoming:
    update_id: str
    chat: str
    thread: str
    user: str
    user_name: str
    text: str
    is_group: bool
    mentioned: bool
    reply_to_bot: bool
    files: tuple[IncomingFile, ...] = ()


@dataclass(frozen=True)
class ButtonPress:
    update_id: str
    chat: str
    thread: str
    user: str
    message_key: str
    data: str


@dataclass(frozen=True)
class Choice:
    label: str
    data: str


@dataclass(frozen=True)
class Batch:
    items: tuple[Incoming | ButtonPress, ...]
    position: str


class Platform(Protocol):
    name: str

    async def start(self, position: str | None) -> None: ...
    async def poll(self) -> Batch: ...
    async def acknowledge(self, position: str) -> None: ...
