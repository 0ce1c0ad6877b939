"""The profile's `attachments:` and `outbox:` as typed, immutable objects — the one place their defaults are written.

Every section of a profile is such an object (None when the profile has no such section), each where the code
that reads it lives: `attachments` and `outbox` here, `sandbox` a `bridge.confinement.sandbox.SandboxSettings`,
`limits` a `bridge.confinement.limits.ResourceLimits`, `permissions` a `bridge.permissions.PermissionPolicy`.
The pydantic schema (`bridge.profile.schema`) takes its defaults from them, and a profile remembered by the
cache builds them from its validated values without pydantic (a plain constructor call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .fields import DEFAULT_MAX_COUNT, DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_TURN_BYTES, DEFAULT_TIMEOUT_SECS


@dataclass(frozen=True, slots=True)
class AttachmentsSettings:
    """`attachments:` — how a turn's attachments are fetched (docs/attachments.md)."""

    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_turn_bytes: int = DEFAULT_MAX_TURN_BYTES
    max_count: int = DEFAULT_MAX_COUNT
    timeout_secs: float = DEFAULT_TIMEOUT_SECS
    allow_hosts: tuple[str, ...] = ()
    """Host names (exact, any case) and addresses or CIDR networks that may be fetched from although not public."""
    keep: bool = False
    """Leave the turn's attachments in place when the turn ends (for debugging an agent)."""
    fetch: bool | None = None
    """Fetch the attachments before the agent starts; False hands the agent their URLs as sent (pass-through);
    None: the protocol's default (`ProtocolInfo.fetches_attachments`)."""


@dataclass(frozen=True, slots=True)
class OutboxSettings:
    """`outbox:` — how the agent is told where its files for the user go (docs/attachments-out.md)."""

    tell_agent: Literal["session", "every_turn", "never"] = "session"


DEFAULT_OUTBOX = OutboxSettings()
