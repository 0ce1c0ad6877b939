"""The names a profile is made of (its fields and its placeholders) and the defaults of its `attachments:` section."""

from __future__ import annotations

import re

MIB = 1024 * 1024
# Defaults a chat platform fits: Telegram's bots download up to 20 MB, Discord's uploads are 10-25 MB and a message
# carries at most 10 files, Slack's 10 per message too; a minute is ample for that much on any link the bridge runs on.
DEFAULT_MAX_FILE_BYTES = 25 * MIB
DEFAULT_MAX_TURN_BYTES = 100 * MIB
DEFAULT_MAX_COUNT = 10
DEFAULT_TIMEOUT_SECS = 60.0

PLACEHOLDERS = ("MESSAGE", "SESSION_ID", "SESSION_NAME", "PROFILE_DIR", "NEW_SESSION_ID")
NEW_SESSION_ID = "{{NEW_SESSION_ID}}"
"""A fresh id the bridge makes up for a turn that starts a session (only in `new_session_args`)."""
PLACEHOLDER_PATTERN = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")
FIELD_NAMES = (
    "command",
    "args",
    "protocol",
    "resume_args",
    "new_session_args",
    "permissions",
    "attachments",
    "sandbox",
    "limits",
    "keep_warm_secs",
    "max_warm",
    "start_timeout_secs",
    "on_busy",
    "on_resume_failure",
    "on_worker_lost",
    "stdin",
    "cwd",
    "env",
    "env_allowlist",
    "env_inherit",
    "timeout_secs",
    "idle_timeout_secs",
    "kill_grace_secs",
    "max_reply_chars",
    "truncation_suffix",
    "outbox",
    "outbox_max_files",
    "outbox_max_bytes",
    "include_stderr_in_reply",
    "send_error_reply",
    "streaming",
    "session_line_prefix",
    "name",
    "description",
)
