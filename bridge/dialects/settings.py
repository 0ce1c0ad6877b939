"""What a profile may set for its dialect, under a key named after its protocol. Pure.

    protocol: codex-exec
    codex-exec:
      max_line_bytes: 33554432

Every dialect's settings class lives here, so validating a profile needs no
dialect module (and the profile cache knows when these rules changed). The
classes are plain frozen dataclasses: `bridge.profile.schema` checks the keys
and types of a profile's section against their fields, and `__post_init__`
refuses values out of range with a message that says what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

# JSON agents put whole tool inputs and outputs on one line: their lines may be
# megabytes. Bounded all the same, so memory is too whatever an agent writes.
JSON_MAX_LINE_BYTES = 16 * 1024 * 1024
_LINE_LIMITS = (4096, 256 * 1024 * 1024)


@dataclass(frozen=True, slots=True)
class NoSettings:
    """A family with nothing to set."""


@dataclass(frozen=True, slots=True)
class JsonSettings:
    """What every JSON family may set: the longest stdout line it reads (a longer one is cut and ignored)."""

    max_line_bytes: int = JSON_MAX_LINE_BYTES

    def __post_init__(self) -> None:
        low, high = _LINE_LIMITS
        if not low <= self.max_line_bytes <= high:
            raise ValueError(f"max_line_bytes must be between {low} and {high} bytes")


@dataclass(frozen=True, slots=True)
class ClaudeStreamSettings(JsonSettings):
    """claude-stream-json: `repeats_streamed_text` for agents that stream their text as assistant messages and
    then repeat it whole (cursor's `agent --stream-partial-output`): a repeat is not shown a second time."""

    repeats_streamed_text: bool = False
