"""What a long-lived agent's dialect is: one process, one session, many turns. Sans-I/O.

ACP, aionrs and Ante agents stay alive for a whole conversation. Their dialect
is made once per process, told the session to resume (or "" for a new one),
and then drives the conversation in the family's own words:

- `open()`: the first bytes of the handshake (ACP `initialize`, Ante
  `StartSession`/`ResumeSession`; b"" when the agent speaks first, as
  aionrs's `ready` does). Later handshake steps come out of `feed()` as
  `AgentInput` events, answering what the agent said;
- `feed(data)`: events, as for every dialect, plus `Ready(session_id)` once
  the session takes turns, `TurnEnd` when a turn is over (the process stays),
  and `AgentInput` for anything the dialect must write by itself (the next
  handshake step, an error answer to a request the host does not serve).
  Events that are not part of a turn — a resumed session's replayed history,
  the handshake's own noise — are the dialect's to drop: `feed` reports
  only what belongs to the turn in progress (or to the handshake);
- `prompt(turn)`: the bytes that start a turn; `cancel()`: the bytes that ask
  the agent to stop it (pending permission requests answered as cancelled);
  `answer(request, decision)`: the bytes of a permission answer;
  `shutdown()`: a graceful goodbye (b"" when closing stdin is the goodbye);
- `close()`: the agent's stdout ended; a turn in progress did not finish.

The turn engine (`bridge.warm_agent`) owns the process, the deadlines and the
policy; a warm dialect only speaks. Every rule is tested from transcripts.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from ..permissions import Decision, PermissionRequest
from ..turn import Turn
from .base import DialectContext
from .events import Event


class WarmDialect(Protocol):
    """The shape of every long-lived agent's dialect (see the module docstring)."""

    name: ClassVar[str]
    Settings: ClassVar[type]

    def __init__(self, context: DialectContext, *, session_id: str, cwd: str) -> None:
        """`session_id`: the stored session to resume ("" for a new one); `cwd`: the agent's working directory."""

    def open(self) -> bytes: ...

    def feed(self, data: bytes) -> list[Event]: ...

    def close(self) -> list[Event]: ...

    def prompt(self, turn: Turn) -> bytes: ...

    def cancel(self) -> bytes: ...

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes: ...

    def shutdown(self) -> bytes: ...
