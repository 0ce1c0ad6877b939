"""Profiles: how to launch one agent (docs/protocol.md §1) — the immutable `Profile`, loading, validation and its cache.

- `model`: `Profile`, `load_profile`, `parse_profile` (no pydantic unless a profile is validated);
- `sections`: the typed sections (`attachments`, `outbox`, `sandbox`, `limits`), the one home of their defaults;
- `schema`: the pydantic model, file:line errors (imported only to validate);
- `argv_rules`: where a placeholder from the user may stand (pure), walking argv with `argv_programs`' table;
- `cache`: remembers validated profiles, trusting only the user's own files;
- `fields`: the names of fields and placeholders.
"""

from .fields import FIELD_NAMES, PLACEHOLDER_PATTERN, PLACEHOLDERS
from .model import Profile, json_schema, load_profile, parse_profile

__all__ = [
    "FIELD_NAMES",
    "PLACEHOLDERS",
    "PLACEHOLDER_PATTERN",
    "Profile",
    "json_schema",
    "load_profile",
    "parse_profile",
]
