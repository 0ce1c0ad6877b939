"""STAND-IN until pacing.py is merged from main: the interface, one op at a time, no limits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PaceLimits:
    per_chat_interval: float
    group_per_minute: int
    global_per_second: int


MATRIX_LIMITS = PaceLimits(per_chat_interval=0.0, group_per_minute=10_000, global_per_second=10_000)


@dataclass(frozen=True, eq=False)
class Send:
    chat: str
    payload: Any


@dataclass(frozen=True, eq=False)
class Edit:
    chat: str
    message_key: str
    payload: Any


@dataclass(frozen=True, eq=False)
class Delete:
    chat: str
    message_key: str


Op = Send | Edit | Delete


class Pacer:
    def __init__(self, limits: PaceLimits) -> None:
        self._pending: list[Op] = []
        self._not_before = 0.0

    def submit(self, op: Op, now: float) -> None:
        self._pending.append(op)

    def next(self, now: float) -> tuple[Op | None, float]:
        if not self._pending:
            return None, math.inf
        if now < self._not_before:
            return None, self._not_before - now
        return self._pending.pop(0), 0.0

    def done(self, op: Op, now: float) -> None:
        pass

    def retry_after(self, op: Op, seconds: float, now: float) -> None:
        self._pending.insert(0, op)
        self._not_before = now + seconds

    def is_group(self, chat: str, group: bool) -> None:
        pass
