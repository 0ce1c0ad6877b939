"""What the OS takes in one exec: each argument and environment string at most `MAX_ARG_STRLEN` bytes."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..turn import Attachment

# Linux refuses any single argv or environment string longer than this
# (MAX_ARG_STRLEN, 32 pages), counting "NAME=" and the terminating NUL.
MAX_ARG_STRLEN = 32 * 4096


def attachments_fit(attachments: Sequence[Attachment]) -> bool:
    """Whether `AGENT_ATTACHMENTS` listing `attachments` as they are fits the OS's limit for one variable."""
    listed = json.dumps([attachment.to_dict() for attachment in attachments], ensure_ascii=False)
    return not too_long("AGENT_ATTACHMENTS=" + listed)


def byte_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def too_long(text: str) -> bool:
    # A character is at most 4 bytes in UTF-8, so short strings skip the encode.
    return len(text) * 4 + 1 > MAX_ARG_STRLEN and byte_size(text) + 1 > MAX_ARG_STRLEN
