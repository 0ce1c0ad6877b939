"""A profile's sections (`permissions`, `attachments`, `outbox`, `sandbox`, `limits`) are typed, immutable objects
with every default filled in — whether the profile was validated or remembered from the cache — and the JSON
Schema's defaults are theirs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import bridge
from bridge.confinement.limits import ResourceLimits
from bridge.confinement.sandbox import SandboxSettings
from bridge.permissions import PermissionPolicy
from bridge.profile.sections import AttachmentsSettings, OutboxSettings

EVERY_SECTION = """\
command: agent
protocol: agentproc-0.4
permissions: {allow: [read], timeout_secs: 5}
attachments: {max_count: 3, allow_hosts: [10.0.0.0/8]}
outbox: {tell_agent: never}
sandbox: {write: ["~/.agent"], network: false}
limits: {memory_mb: 64}
"""
SECTION_TYPES = {
    "permissions": (PermissionPolicy, "PermissionsModel"),
    "attachments": (AttachmentsSettings, "AttachmentsModel"),
    "outbox": (OutboxSettings, "OutboxModel"),
    "sandbox": (SandboxSettings, "SandboxModel"),
    "limits": (ResourceLimits, "LimitsModel"),
}


def test_each_section_is_read_by_attribute_with_its_defaults_filled_in() -> None:
    profile = bridge.parse_profile(EVERY_SECTION)
    assert profile.permissions == PermissionPolicy(allow=("read",), timeout_secs=5)
    assert profile.attachments == AttachmentsSettings(max_count=3, allow_hosts=("10.0.0.0/8",))
    assert profile.attachments.max_file_bytes == 25 * 1024 * 1024 and profile.attachments.fetch is None
    assert profile.outbox == OutboxSettings(tell_agent="never") and profile.tell_agent_outbox == "never"
    assert profile.sandbox == SandboxSettings(write=("~/.agent",), network=False)
    assert profile.sandbox.hide_home and profile.sandbox.read == ()
    assert profile.limits == ResourceLimits(memory_mb=64) and profile.limits.items() == [("memory_mb", 64)]
    assert profile.permission_policy is profile.permissions


def test_an_absent_section_is_none_and_its_users_get_the_defaults() -> None:
    profile = bridge.parse_profile("command: agent\n")
    assert (profile.permissions, profile.attachments, profile.outbox, profile.sandbox, profile.limits) == (None,) * 5
    assert profile.permission_policy == PermissionPolicy() and profile.permission_policy.default == "deny"
    assert profile.tell_agent_outbox == "session"


def test_a_section_cannot_be_changed_in_place() -> None:
    profile = bridge.parse_profile(EVERY_SECTION)
    for name in SECTION_TYPES:
        section = getattr(profile, name)
        field = dataclasses.fields(section)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(section, field, getattr(section, field))


def test_a_remembered_profile_has_the_same_typed_sections(tmp_path: Path) -> None:
    path = tmp_path / "every.yaml"
    path.write_text(EVERY_SECTION)
    fresh = bridge.load_profile(path, cache=False)
    bridge.load_profile(path)
    remembered = bridge.load_profile(path)
    for name, (kind, _) in SECTION_TYPES.items():
        assert type(getattr(remembered, name)) is kind
        assert getattr(remembered, name) == getattr(fresh, name)
    assert remembered.to_dict() == fresh.to_dict()


def test_to_dict_and_replace_give_each_section_back_as_the_schema_writes_it() -> None:
    profile = bridge.parse_profile(EVERY_SECTION)
    values = profile.to_dict()
    assert values["sandbox"] == {"read": [], "write": ["~/.agent"], "network": False, "hide_home": True}
    assert values["limits"] == dict.fromkeys(("memory_mb", "cpu_secs", "processes", "file_size_mb", "open_files")) | {
        "memory_mb": 64
    }
    changed = profile.replace(limits={"memory_mb": 32})
    assert changed.limits == ResourceLimits(memory_mb=32) and changed.sandbox == profile.sandbox


@pytest.mark.parametrize("name", SECTION_TYPES)
def test_the_schema_defaults_are_the_typed_sections_defaults(name: str) -> None:
    kind, model = SECTION_TYPES[name]
    properties = bridge.profile.json_schema()["$defs"][model]["properties"]
    defaults = {
        field.name: list(default) if isinstance(default := field.default, tuple) else default
        for field in dataclasses.fields(kind)
    }
    assert set(properties) == set(defaults)
    assert {key: properties[key].get("default") for key in properties} == defaults


def test_the_dialect_is_a_turn_dialect_or_a_warm_one_as_the_protocol_says() -> None:
    from bridge.dialects.warm import WarmDialect

    one_turn = bridge.parse_profile("command: agent\n")
    assert one_turn.turn_dialect is one_turn.dialect and not issubclass(one_turn.dialect, WarmDialect)
    with pytest.raises(TypeError, match="one process per turn"):
        one_turn.warm_dialect  # noqa: B018
    warm = bridge.parse_profile("command: agent\nprotocol: acp\n")
    assert warm.warm_dialect is warm.dialect and issubclass(warm.dialect, WarmDialect)
    with pytest.raises(TypeError, match="keeps its agent warm"):
        warm.turn_dialect  # noqa: B018
