"""Tool approvals: an agent asks before it runs a tool, and a profile's policy answers. Pure.

Every agent family that can ask (agentproc wire 0.4, ACP, aionrs, Ante…) asks
in its own words; its dialect turns the question into one `PermissionRequest`
and the answer, a `Decision`, back into its own words. The policy in between
is the same for all of them: the profile's `permissions:` section.

    permissions:
      default: deny            # allow | deny | ask: what a tool not listed below gets
      allow: [Read, Grep, "mcp__docs__*", read]
      deny: [Bash, exec]
      ask: [Edit, edit]        # the host decides (a chat user, a bot); unanswered after timeout_secs: deny
      timeout_secs: 120

An entry is a tool name as the agent calls it (shell-style wildcards allowed;
names compare case-insensitively, so `deny: [bash]` stops `Bash` and `BASH`)
or a tool kind (`read`, `edit`, `delete`, `move`, `search`, `exec`, `think`,
`fetch`, `other`) when the agent says what kind its tool is. `deny` wins over
`allow`, `allow` over `ask`; no list matching, `default` decides. Asking means
`decide()` returns None: the turn engine then asks the host, and a question
nobody answers in `timeout_secs` is answered deny, so it never hangs a turn.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

TOOL_KINDS = ("read", "edit", "delete", "move", "search", "exec", "think", "fetch", "other")


@dataclass(slots=True, frozen=True)
class PermissionRequest:
    """An agent asks whether it may run a tool.

    `request_id` is the dialect's handle for its answer; `tool` the tool's name
    as the agent calls it; `kind` one of `TOOL_KINDS` when the agent says so
    (else ""); `title` what a person reads ("ls -la", "Edit README.md");
    `input` the tool's arguments, as the agent sent them.
    """

    request_id: str
    tool: str
    kind: str = ""
    title: str = ""
    input: Mapping[str, Any] = field(default_factory=dict)

    kind_of_event: ClassVar[str] = "permission"

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.kind_of_event,
            "request_id": self.request_id,
            "tool": self.tool,
            "kind": self.kind,
            "title": self.title,
            "input": dict(self.input),
        }


@dataclass(slots=True, frozen=True)
class Decision:
    """The answer to a `PermissionRequest`. `always` asks the agent to remember it (where it can)."""

    allow: bool
    always: bool = False
    message: str = ""


DENIED = Decision(allow=False)
ALLOWED = Decision(allow=True)


@dataclass(slots=True, frozen=True)
class PermissionPolicy:
    """A profile's `permissions:` section, typed: its defaults are the schema's (`bridge.profile.schema`)."""

    default: Literal["allow", "deny", "ask"] = "deny"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    timeout_secs: float = 120.0

    def decide(self, request: PermissionRequest) -> Decision | None:
        """The profile's answer, or None when the host is to be asked."""
        if _matches(self.deny, request):
            return Decision(allow=False, message=f"{request.tool or 'this tool'} is not allowed by the profile")
        if _matches(self.allow, request):
            return ALLOWED
        if _matches(self.ask, request) or self.default == "ask":
            return None
        if self.default == "allow":
            return ALLOWED
        return Decision(allow=False, message=f"{request.tool or 'this tool'} is not in the profile's allow list")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> PermissionPolicy:
        """The policy of a validated `permissions:` section (lists become tuples; a key left out keeps its
        default); None: the defaults (deny)."""
        typed: dict[str, Any] = {
            key: tuple(value) if isinstance(value, list) else value for key, value in (values or {}).items()
        }
        return cls(**typed)


UNANSWERED = Decision(allow=False, message="nobody answered in time")
CANCELLED = Decision(allow=False, message="the turn was cancelled")


def _matches(patterns: tuple[str, ...], request: PermissionRequest) -> bool:
    # An agent's tool names differ in case from the names an operator writes (bash, Bash, BASH are one tool to
    # a person): a deny list that compared them exactly let a differently cased name through.
    tool = request.tool.casefold()
    for pattern in patterns:
        if pattern in TOOL_KINDS and request.kind == pattern:
            return True
        if tool and fnmatch.fnmatchcase(tool, pattern.casefold()):
            return True
    return False
