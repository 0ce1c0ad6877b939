"""What every kind of host shares: its errors and its stats (the local `Host`, and the PostgreSQL gateway)."""

from __future__ import annotations

import dataclasses
import hmac
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import SessionIdRefused

# What a host does with a session id a turn names: "any" resumes it; "stored" only the conversation's own.
ClientSessionIds = Literal["any", "stored"]
CLIENT_SESSION_IDS: tuple[ClientSessionIds, ...] = ("any", "stored")


def check_client_session_ids(value: object) -> ClientSessionIds:
    if value not in CLIENT_SESSION_IDS:
        raise ValueError(f"client_session_ids must be 'any' or 'stored', not {value!r}")
    return value  # type: ignore[return-value]


def refuse_unless_stored(session_id: str, stored: str, profile: str, conversation: str, session_name: str) -> None:
    """Raise `SessionIdRefused` unless `session_id` is `stored`, the conversation's own session.

    The id is a bearer secret: compared in constant time, and what is stored is never said.
    """
    if not hmac.compare_digest(session_id.encode(), stored.encode()):
        raise SessionIdRefused(
            f"the turn's session_id is not the session stored for conversation {conversation!r} (profile "
            f"{profile!r}, session name {session_name!r}), and this host takes no other: leave session_id empty to "
            "resume the conversation's own session (a session id resumes whichever conversation's history it "
            "belongs to)"
        )


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
