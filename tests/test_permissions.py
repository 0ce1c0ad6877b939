"""The `permissions:` policy on its own: which list a tool request matches, by name (any case) or by kind."""

from __future__ import annotations

import pytest

from bridge.permissions import PermissionPolicy, PermissionRequest


def answer(policy: dict[str, object], tool: str, kind: str = "") -> str:
    decision = PermissionPolicy.from_mapping(policy).decide(PermissionRequest("r1", tool, kind))
    return "ask" if decision is None else "allow" if decision.allow else "deny"


@pytest.mark.parametrize("tool", ["Bash", "bash", "BASH", "bAsH"])
@pytest.mark.parametrize("entry", ["Bash", "bash", "BASH", "b*", "B?SH", "[Bb]ash", "*SH"])
def test_a_deny_entry_stops_the_tool_whatever_the_case_of_either(entry: str, tool: str) -> None:
    assert answer({"default": "allow", "deny": [entry]}, tool) == "deny"


@pytest.mark.parametrize(
    ("policy", "tool", "expected"),
    [
        ({"default": "deny", "allow": ["read"]}, "READ", "allow"),
        ({"default": "deny", "allow": ["mcp__docs__*"]}, "MCP__Docs__search", "allow"),
        ({"default": "deny", "ask": ["edit"]}, "Edit", "ask"),
        ({"default": "allow", "allow": ["BASH"], "deny": ["bash"]}, "Bash", "deny"),  # deny wins over allow
        ({"default": "allow", "allow": ["bash"], "ask": ["Bash"]}, "BASH", "allow"),  # allow wins over ask
        ({"default": "deny", "allow": ["Bash"]}, "Bashful", "deny"),  # a name is the whole name, not a prefix
    ],
)
def test_every_list_compares_names_case_insensitively_and_keeps_its_precedence(policy, tool, expected) -> None:
    assert answer(policy, tool) == expected


def test_a_kind_entry_matches_the_requests_kind_and_a_name_entry_only_names() -> None:
    assert answer({"default": "allow", "deny": ["exec"]}, "run_shell", kind="exec") == "deny"
    assert answer({"default": "deny", "allow": ["Read"]}, "cat_file", kind="read") == "deny"
    assert answer({"default": "allow", "deny": ["exec"]}, "", kind="exec") == "deny"
    assert answer({"default": "deny", "allow": ["*"]}, "", kind="") == "deny"  # no name: no name pattern matches
