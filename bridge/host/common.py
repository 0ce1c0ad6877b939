"""What every kind of host shares: its errors and its stats (the local `Host`, and the PostgreSQL gateway)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import BridgeError


class HostClosed(BridgeError):
    """The host is shutting down (or shut down) and takes no new turns."""


class DuplicateTurn(BridgeError, ValueError):
    """A turn with this id is already queued or running; ids must be unique among turns in flight."""


class SessionIdRefused(BridgeError):
    """The turn names a session id that is not its conversation's stored one, and the host takes only that one
    (`client_session_ids="stored"`): a session id resumes whichever conversation's history it belongs to."""


@dataclass(frozen=True, slots=True)
class HostStats:
    """A snapshot of the host's load and history since it opened.

    `completed` counts every turn that produced a result (whatever its
    outcome), `failed` those of them whose exit code was not 0, `outcomes` the
    results by outcome. `refused` counts submits turned away because the queue
    was full; `store_errors` sessions that could not be read or recorded.
    """

    running: int
    queued: int
    completed: int
    failed: int
    refused: int
    store_errors: int
    outcomes: dict[str, int]
    max_concurrent: int
    max_queued: int
    closing: bool
    warm: int = 0  # warm agents alive (between turns or taking one)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
