"""What a profile may set for its dialect, under a key named after its protocol. Pure.

    protocol: codex-exec
    codex-exec:
      max_line_bytes: 33554432

Every dialect's settings class lives here, so validating a profile needs no
dialect module (and the profile cache knows when these rules changed). The
classes are plain frozen dataclasses: `bridge.profile.schema` checks the keys and
types of a profile's section against their `__init__`'s keyword arguments, and
`__init__` refuses values out of range with a message that says what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# JSON agents put whole tool inputs and outputs on one line: their lines may be
# megabytes. Bounded all the same, so memory is too whatever an agent writes.
JSON_MAX_LINE_BYTES = 16 * 1024 * 1024
_LINE_LIMITS = (4096, 256 * 1024 * 1024)


@dataclass(slots=True, frozen=True)
class NoSettings:
    """A family with nothing to set."""


@dataclass(slots=True, frozen=True)
class JsonSettings:
    """What every JSON family may set: the longest stdout line it reads (a longer one is cut and ignored)."""

    max_line_bytes: int = JSON_MAX_LINE_BYTES

    def __post_init__(self) -> None:
        low, high = _LINE_LIMITS
        if not low <= self.max_line_bytes <= high:
            raise ValueError(f"max_line_bytes must be between {low} and {high} bytes")


@dataclass(slots=True, frozen=True)
class ClaudeStreamSettings(JsonSettings):
    """claude-stream-json: `repeats_streamed_text` for agents that stream their text as assistant messages and
    then repeat it whole (cursor's `agent --stream-partial-output`): a repeat is not shown a second time."""

    repeats_streamed_text: bool = False


@dataclass(slots=True, frozen=True)
class AcpSettings(JsonSettings):
    """acp: what the bridge offers the agent besides the conversation.

    `mcp_servers`: MCP servers the agent connects to, each a mapping passed as
    is in ACP's own shape (`{name, command, args, env: [{name, value}]}` for
    stdio; `{type: http, name, url, headers: [...]}` where the agent supports
    it). `fs_read` / `fs_write`: the agent may ask the bridge to read / write
    text files (ACP `fs/read_text_file` / `fs/write_text_file`), confined to
    its working directory. Off by default: the agent uses its own tools, and
    the bridge's permission policy sees those. ACP's terminal capability is
    never offered: the bridge runs no commands on an agent's behalf.
    """

    mcp_servers: list[dict[str, Any]] | None = None
    fs_read: bool = False
    fs_write: bool = False

    def __post_init__(self) -> None:
        JsonSettings.__post_init__(self)  # not super(): a slots dataclass is a new class, which super() misses
        servers = self.mcp_servers
        if servers is None:
            return
        if not isinstance(servers, list) or not all(isinstance(server, Mapping) for server in servers):
            raise ValueError(
                "mcp_servers must be a list of mappings (each an MCP server in ACP's shape: name, command, args, env)"
            )
        for index, server in enumerate(servers):
            if not isinstance(server.get("name"), str) or not server.get("name"):
                raise ValueError(f"mcp_servers[{index}] needs a name (a non-empty string)")


THINKING_LEVELS = ("Disabled", "Enabled", "Deep", "Max")
"""Ante's `Thinking` values: how hard its model reasons."""


@dataclass(slots=True, frozen=True)
class AnteSettings(JsonSettings):
    """ante (`ante serve --stdio`): the session the bridge asks Ante to start (its StartSession fields).

    Left out (null), a field is Ante's own default. `model` and `provider` name
    the model as Ante's catalog does ("claude-sonnet-4-6", "anthropic");
    `policy` is Ante's tool approval mode; `system_prompt` replaces Ante's
    system prompt, `append_system_prompt` adds to it; `allowed_tools` keeps
    only these tools, `disallowed_tools` removes these; `thinking` is one of
    Disabled, Enabled, Deep, Max; `streaming: false` makes Ante send each
    message whole instead of in pieces. The working directory is the
    profile's `cwd`.
    """

    model: str | None = None
    provider: str | None = None
    policy: str | None = None
    streaming: bool = True
    system_prompt: str | None = None
    append_system_prompt: str | None = None
    allowed_tools: Sequence[str] | None = None
    disallowed_tools: Sequence[str] | None = None
    thinking: str | None = None

    def __post_init__(self) -> None:
        JsonSettings.__post_init__(self)
        for name in ("model", "provider", "policy"):
            if getattr(self, name) == "":
                raise ValueError(f"{name} is empty; name one, or leave it out for Ante's default")
        for name in ("allowed_tools", "disallowed_tools"):
            tools = getattr(self, name)
            if tools is None:
                continue
            if isinstance(tools, str) or not all(isinstance(tool, str) and tool for tool in tools):
                raise ValueError(f"{name} must be a list of tool names (e.g. [Read, Grep])")
            object.__setattr__(self, name, tuple(tools))  # frozen all the way down
        if self.thinking is not None and self.thinking not in THINKING_LEVELS:
            raise ValueError(f"thinking must be one of {', '.join(THINKING_LEVELS)} (or left out for Ante's default)")


APPROVAL_POLICIES = ("untrusted", "on-request", "never")
"""codex's `approvalPolicy`: when it asks before a command or an edit (`never`: it does not ask)."""
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")
"""codex's `sandbox`: what its commands may touch without asking."""


@dataclass(slots=True, frozen=True)
class CodexAppServerSettings(JsonSettings):
    """codex-app-server (`codex app-server`): the thread the bridge asks codex to start or resume.

    `approval_policy` (one of `APPROVAL_POLICIES`): when codex asks the bridge
    before a command or a file change; `sandbox` (one of `SANDBOX_MODES`) what
    it may do without asking; `model` the model's name. Left out (null),
    `sandbox` and `model` are codex's own configuration's (`config.toml`).
    `plan_mode: true` runs every turn in codex's Plan collaboration mode (an
    experimental part of its API), the one mode in which its model may ask the
    user questions (`request_user_input`).
    """

    approval_policy: str = "on-request"
    sandbox: str | None = None
    model: str | None = None
    plan_mode: bool = False

    def __post_init__(self) -> None:
        JsonSettings.__post_init__(self)
        if self.approval_policy not in APPROVAL_POLICIES:
            raise ValueError(f"approval_policy must be one of {', '.join(APPROVAL_POLICIES)}")
        if self.sandbox is not None and self.sandbox not in SANDBOX_MODES:
            raise ValueError(f"sandbox must be one of {', '.join(SANDBOX_MODES)} (or left out for codex's config)")
        if self.model == "":
            raise ValueError("model is empty; name one, or leave it out for codex's config")
