"""The profile's sections as typed, immutable objects — the one place their defaults are written.

`Profile.attachments`, `.outbox`, `.sandbox` and `.limits` are these (or None when the profile has no such
section); `.permissions` is a `bridge.permissions.PermissionPolicy`, which is that section's type. The pydantic
schema (`bridge.profile.schema`) takes its defaults from here, and a profile loaded from the cache builds them
from its validated values without pydantic: `from_values` is a plain constructor call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self

from ..fetch_policy import DEFAULT_MAX_COUNT, DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_TURN_BYTES, DEFAULT_TIMEOUT_SECS


class _Section:
    """What every section shares: built from validated values, given back as plain JSON-ready values."""

    __slots__ = ()

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Self:
        """The section of validated values (lists become tuples; a key left out keeps its default)."""
        return cls(**{key: tuple(value) if isinstance(value, list) else value for key, value in values.items()})

    def to_values(self) -> dict[str, Any]:
        """Every key with its value, as the schema writes it (tuples become lists)."""
        return {
            field.name: list(value) if isinstance(value := getattr(self, field.name), tuple) else value
            for field in dataclasses.fields(self)  # type: ignore[arg-type]
        }


@dataclass(frozen=True, slots=True)
class AttachmentsSettings(_Section):
    """`attachments:` — how a turn's attachments are fetched (docs/attachments.md)."""

    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_turn_bytes: int = DEFAULT_MAX_TURN_BYTES
    max_count: int = DEFAULT_MAX_COUNT
    timeout_secs: float = DEFAULT_TIMEOUT_SECS
    allow_hosts: tuple[str, ...] = ()
    keep: bool = False
    fetch: bool | None = None
    """None: the protocol's default (`ProtocolInfo.fetches_attachments`)."""


@dataclass(frozen=True, slots=True)
class OutboxSettings(_Section):
    """`outbox:` — how the agent is told where its files for the user go (docs/attachments-out.md)."""

    tell_agent: Literal["session", "every_turn", "never"] = "session"


@dataclass(frozen=True, slots=True)
class SandboxSettings(_Section):
    """`sandbox:` — what the agent sees under bubblewrap beyond the system and its working directory
    (docs/sandbox.md); `read` and `write` as written, before `~` and `{{PROFILE_DIR}}` are expanded."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    network: bool = True
    hide_home: bool = True


@dataclass(frozen=True, slots=True)
class LimitsSettings(_Section):
    """`limits:` — how much the agent may take (docs/sandbox.md, "Limits"); None leaves that one unlimited."""

    memory_mb: int | None = None
    cpu_secs: int | None = None
    processes: int | None = None
    file_size_mb: int | None = None
    open_files: int | None = None

    def items(self) -> list[tuple[str, int]]:
        """(name, value) of each limit set, in the order of the fields."""
        return [
            (field.name, value)
            for field in dataclasses.fields(self)
            if (value := getattr(self, field.name)) is not None
        ]


DEFAULT_OUTBOX = OutboxSettings()
