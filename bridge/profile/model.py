"""Profiles: how to launch one agent (docs/protocol.md §1).

`Profile` is the validated, immutable profile the rest of the bridge reads.
Validation is pydantic's job (`bridge.profile.schema`), loaded only when a
profile is actually validated: `load_profile` remembers the profiles it has
validated (see `bridge.profile.cache`), so running an unchanged profile does not pay for
pydantic's model machinery — which costs more start-up than all of the bridge.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, cast

from ..confinement.limits import ResourceLimits
from ..confinement.programs import BWRAP, PRLIMIT, find_tool, needs_prlimit
from ..confinement.sandbox import SandboxSettings
from ..dialects import PROTOCOLS, DialectContext, dialect_class
from ..errors import Problem, ProfileError
from ..permissions import PermissionPolicy
from . import cache as profile_cache
from .fields import FIELD_NAMES
from .sections import DEFAULT_OUTBOX, AttachmentsSettings, OutboxSettings

if TYPE_CHECKING:
    from ..dialects import Dialect
    from ..dialects.warm import WarmDialect


class Profile:
    """A validated profile; every field of docs/protocol.md §1 (see `bridge.profile.schema.ProfileModel` for the rules).

    Build one with `load_profile(path)`, `parse_profile(text)`, `Profile(**fields)`
    or `Profile.from_mapping(fields, profile_dir=...)` — all of them validate.
    Immutable, so one profile can serve many concurrent turns; `replace()`
    makes a changed copy.
    """

    __slots__ = (
        *FIELD_NAMES,
        "argv_template",
        "resume_argv_template",
        "protocol_settings",
        "settings",
        "dialect",
        "dialect_context",
        "permission_policy",
        "profile_dir",
        "file",
    )

    command: str | tuple[str, ...]
    args: tuple[str, ...]
    protocol: str
    resume_args: tuple[str, ...]
    new_session_args: tuple[str, ...]
    permissions: PermissionPolicy | None
    attachments: AttachmentsSettings | None
    sandbox: SandboxSettings | None
    limits: ResourceLimits | None
    keep_warm_secs: float
    max_warm: int
    start_timeout_secs: float
    on_busy: Literal["queue", "steer", "interrupt"]
    on_resume_failure: Literal["new_session", "fail"]
    on_worker_lost: Literal["retry", "fail"]
    stdin: Literal["none", "message", "line"]
    cwd: str | None
    env: Mapping[str, str]
    env_allowlist: tuple[str, ...] | None
    env_inherit: Literal["minimal", "all"]
    timeout_secs: float
    idle_timeout_secs: float | None
    kill_grace_secs: float
    max_reply_chars: int | None
    truncation_suffix: str
    outbox: OutboxSettings | None
    outbox_max_files: int
    outbox_max_bytes: int
    include_stderr_in_reply: bool
    send_error_reply: bool
    streaming: bool
    session_line_prefix: str
    name: str | None
    description: str | None
    argv_template: tuple[str, ...]
    """A new session's argv: `command` split into words, `new_session_args`, `args`; placeholders not substituted."""
    resume_argv_template: tuple[str, ...]
    """A resumed session's argv: `command` split into words, `resume_args`, `args`."""
    protocol_settings: Mapping[str, Any]
    """The profile's section named after its protocol, as written (defaults left out)."""
    settings: object
    """The protocol's settings object (its class in `bridge.dialects.settings`): `protocol_settings` over its
    defaults."""
    dialect: type[Dialect] | type[WarmDialect]
    """The protocol's dialect class: a `WarmDialect` when `warm`, else a one-turn `Dialect`."""
    dialect_context: DialectContext
    """What the protocol's dialect is told of this profile."""
    permission_policy: PermissionPolicy
    """How the agent's requests to run a tool are answered (`permissions`; deny when absent)."""
    profile_dir: str
    """The directory `{{PROFILE_DIR}}` and a relative `cwd` refer to."""
    file: str | None
    """The file it was loaded from, where its links lead (None: made from text or a mapping); a sandbox binds it
    read-only when it lies where the agent may write (`bridge.confinement.sandbox`)."""

    def __init__(self, **fields: Any) -> None:
        """Validate `fields`; relative paths resolve against the current directory."""
        from .schema import validate_mapping

        self._assign(validate_mapping(fields), os.getcwd(), None)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, profile_dir: str | os.PathLike[str] | None = None) -> Profile:
        """Validate `data` as a profile whose relative paths resolve against `profile_dir`."""
        return cls._from_mapping(data, os.path.abspath(profile_dir or os.getcwd()), None)

    @classmethod
    def _from_mapping(cls, data: Mapping[str, Any], profile_dir: str, file: str | None) -> Profile:
        from .schema import validate_mapping

        return cls._trusted(validate_mapping(data), profile_dir, file)

    @classmethod
    def _trusted(cls, values: Mapping[str, Any], profile_dir: str, file: str | None) -> Profile:
        """A profile from values that were already validated (see `schema.ProfileModel.values`)."""
        profile = cls.__new__(cls)
        profile._assign(values, profile_dir, file)
        return profile

    def _assign(self, values: Mapping[str, Any], profile_dir: str, file: str | None) -> None:
        for name in FIELD_NAMES:
            value = values[name]
            if name in _SECTIONS:
                value = None if value is None else _section(_SECTIONS[name], value)
            elif isinstance(value, list):
                value = tuple(value)
            elif isinstance(value, dict):
                value = MappingProxyType(dict(value))
            object.__setattr__(self, name, value)
        object.__setattr__(self, "argv_template", tuple(values["argv_template"]))
        object.__setattr__(self, "resume_argv_template", tuple(values["resume_argv_template"]))
        settings = dict(values["protocol_settings"])
        object.__setattr__(self, "protocol_settings", MappingProxyType(settings))
        object.__setattr__(self, "settings", PROTOCOLS[self.protocol].settings(**settings))
        object.__setattr__(self, "dialect", dialect_class(self.protocol))
        object.__setattr__(
            self,
            "dialect_context",
            DialectContext(
                settings=self.settings,
                session_line_prefix=self.session_line_prefix,
                stdin_message=self.stdin != "none",
                stdin_line=self.stdin == "line",
                permissions=self.permissions is not None,
            ),
        )
        object.__setattr__(self, "permission_policy", self.permissions or PermissionPolicy())
        object.__setattr__(self, "profile_dir", profile_dir)
        object.__setattr__(self, "file", file)

    @property
    def tell_agent_outbox(self) -> str:
        """How the agent is told its outbox (`outbox.tell_agent`): session, every_turn or never."""
        return (self.outbox or DEFAULT_OUTBOX).tell_agent

    @property
    def warm(self) -> bool:
        """Its protocol keeps one agent process for many turns (ACP, aionrs, Ante): see `bridge.engine.warm_agents`."""
        return PROTOCOLS[self.protocol].warm

    @property
    def turn_dialect(self) -> type[Dialect]:
        """`dialect`, for a protocol that runs one process per turn (not `warm`)."""
        if self.warm:
            raise TypeError(f"protocol {self.protocol} keeps its agent warm: its dialect is `warm_dialect`")
        return cast("type[Dialect]", self.dialect)  # PROTOCOLS says which kind, where the class is named

    @property
    def warm_dialect(self) -> type[WarmDialect]:
        """`dialect`, for a protocol that keeps one process per conversation (`warm`)."""
        if not self.warm:
            raise TypeError(f"protocol {self.protocol} runs one process per turn: its dialect is `turn_dialect`")
        return cast("type[WarmDialect]", self.dialect)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Profile is immutable; use profile.replace({name}=...)")

    def replace(self, **changes: Any) -> Profile:
        """A validated copy with `changes` applied, resolving paths as this profile does, from the same file."""
        return Profile._from_mapping({**self.to_dict(), **changes}, self.profile_dir, self.file)

    def to_dict(self) -> dict[str, Any]:
        """Every field, as plain JSON-ready values."""
        values: dict[str, Any] = {}
        for name in FIELD_NAMES:
            value = getattr(self, name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, MappingProxyType):
                value = dict(value)
            elif name in _SECTIONS and value is not None:
                value = _section_values(value)
            values[name] = value
        if self.protocol_settings:
            values[self.protocol] = dict(self.protocol_settings)
        return values

    @property
    def label(self) -> str:
        """The profile's name — `name` (a file's stem unless set), else the program's base name.

        Logs carry it, and the CLI stores sessions under it."""
        return self.name or os.path.basename(self.argv_template[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Profile):
            return NotImplemented
        # The file too: a sandbox binds it read-only, so a warm agent started for one file cannot serve another's.
        return (self.profile_dir, self.file) == (other.profile_dir, other.file) and self.to_dict() == other.to_dict()

    # Unhashable, as Python makes a class that defines __eq__ alone; said here so that mypy knows it too. object's
    # stub types __hash__ as a method, so the idiom (typeshed's own for list and dict) needs the ignore.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Profile(name={self.name!r}, command={self.command!r})"


_Section = PermissionPolicy | AttachmentsSettings | OutboxSettings | SandboxSettings | ResourceLimits
_SECTIONS: Mapping[str, type[_Section]] = {
    "permissions": PermissionPolicy,
    "attachments": AttachmentsSettings,
    "outbox": OutboxSettings,
    "sandbox": SandboxSettings,
    "limits": ResourceLimits,
}
"""The sections of a profile, by field name: each a frozen dataclass that holds its defaults."""


def _section(kind: type[_Section], values: Mapping[str, Any]) -> _Section:
    """A section from its validated values (lists become tuples; a key left out keeps its default)."""
    typed: dict[str, Any] = {key: tuple(value) if isinstance(value, list) else value for key, value in values.items()}
    return kind(**typed)


def _section_values(section: _Section) -> dict[str, Any]:
    """Every key of a section with its value, as the schema writes them (tuples become lists)."""
    return {
        field.name: list(value) if isinstance(value := getattr(section, field.name), tuple) else value
        for field in dataclasses.fields(section)
    }


def load_profile(path: str | os.PathLike[str], *, cache: bool = True) -> Profile:
    """Read and validate a profile file; raises `ProfileError` listing every problem as `file:line: message`.

    With `cache`, a file whose content was validated before is not validated
    again (the cache is keyed by its path and exact content).
    """
    where = str(path)
    try:
        resolved = Path(path).resolve()
        content = resolved.read_bytes()
    except FileNotFoundError:
        raise ProfileError([Problem("no such profile file", where)]) from None
    except IsADirectoryError:
        raise ProfileError([Problem("is a directory, not a profile file", where)]) from None
    except OSError as err:
        raise ProfileError([Problem(f"cannot be read: {err.strerror}", where)]) from None
    profile_dir = str(resolved.parent)
    if cache:
        remembered = profile_cache.lookup(str(resolved), content)
        if remembered is not None and _lacks_a_tool(remembered):
            remembered = None  # validated where the tool was: validating again says what to install
        if remembered is not None:
            try:
                return Profile._trusted(remembered, profile_dir, str(resolved))
            except (KeyError, TypeError, ValueError):
                pass  # an entry from another version of the bridge: validate afresh
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProfileError([Problem(f"is not UTF-8 text ({err.reason} at byte {err.start})", where)]) from None
    from .schema import validate_text

    values = validate_text(text, where, Path(path).stem)
    if cache:
        profile_cache.store(str(resolved), content, values)
    return Profile._trusted(values, profile_dir, str(resolved))


def _lacks_a_tool(remembered: Mapping[str, Any]) -> bool:
    """Whether a profile validated earlier needs bwrap or prlimit (`tools`) and this machine lacks it now."""
    if remembered.get("sandbox") is not None and find_tool(BWRAP) is None:
        return True
    return needs_prlimit(remembered.get("limits")) and find_tool(PRLIMIT) is None


def parse_profile(text: str, *, source: str | os.PathLike[str] | None = None) -> Profile:
    """Validate profile YAML; `source` names the file in errors and anchors relative paths."""
    from .schema import validate_text

    where = str(source) if source is not None else "<profile>"
    values = validate_text(text, where, Path(source).stem if source is not None else None)
    profile_dir = str(Path(source).resolve().parent) if source is not None else os.getcwd()
    return Profile._trusted(values, profile_dir, None)


def json_schema() -> dict[str, Any]:
    """The profile's JSON Schema, for YAML editors (yaml-language-server and friends)."""
    from .schema import json_schema

    return json_schema()
