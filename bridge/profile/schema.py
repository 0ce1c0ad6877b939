"""Validating profiles with pydantic: the schema of docs/protocol.md §1 and errors that point at a line.

This is the slow path, imported only when a profile is actually validated:
pydantic's model machinery costs more to load than the rest of the bridge.
`bridge.profile.model` calls in here and remembers what it validated.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import shlex
import typing
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..confinement.limits import ResourceLimits
from ..confinement.programs import BWRAP, PRLIMIT, find_tool, missing_tool, needs_prlimit
from ..confinement.sandbox import SandboxSettings
from ..dialects import DEFAULT_PROTOCOL, PROTOCOLS
from ..errors import Problem, ProfileError
from ..permissions import TOOL_KINDS, PermissionPolicy
from .argv_rules import argv_problem, environment_problem, stdin_problem
from .fields import PLACEHOLDER_PATTERN, PLACEHOLDERS
from .sections import AttachmentsSettings, OutboxSettings

_ENV_NAME = re.compile(r"[^=\0]+")
_Template = tuple[tuple[str, ...], tuple[tuple[str | int, ...], ...]]
"""An argv template's words, and where in the profile each comes from (("command",), ("args", 0), …)."""
# The sections' defaults are written once, in their typed classes (`bridge.profile.sections`, `PermissionPolicy`).
_PERMISSIONS = PermissionPolicy()
_ATTACHMENTS = AttachmentsSettings()
_OUTBOX = OutboxSettings()
_SANDBOX = SandboxSettings()
_LIMITS = ResourceLimits()


class PermissionsModel(BaseModel):
    """How the tools an agent asks to run are answered (for protocols whose agents ask)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    default: Literal["allow", "deny", "ask"] = Field(
        default=_PERMISSIONS.default,
        description="What a tool that neither list names gets: allow, deny (the default), or ask "
        "(the host decides: a chat user, a bot through serve's decide request, a Python callback).",
    )
    allow: list[Annotated[str, Field(min_length=1)]] = Field(
        default=list(_PERMISSIONS.allow),
        description="Tools to allow: names as the agent calls them, in any case (wildcards * ? [...] "
        f"allowed), or kinds ({', '.join(TOOL_KINDS)}).",
    )
    deny: list[Annotated[str, Field(min_length=1)]] = Field(
        default=list(_PERMISSIONS.deny), description="Tools to deny, written like allow; deny wins over allow."
    )
    ask: list[Annotated[str, Field(min_length=1)]] = Field(
        default=list(_PERMISSIONS.ask),
        description="Tools the host decides, written like allow (deny and allow win over ask).",
    )
    timeout_secs: Annotated[float, Field(gt=0)] = Field(
        default=_PERMISSIONS.timeout_secs,
        description="How long a question may wait for the host's answer; then the answer is deny.",
    )


class AttachmentsModel(BaseModel):
    """How a turn's attachments are fetched (docs/attachments.md): limits, and the hosts allowed although not public."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    max_file_bytes: Annotated[int, Field(gt=0)] = Field(
        default=_ATTACHMENTS.max_file_bytes, description="The largest attachment, in bytes (25 MiB by default)."
    )
    max_turn_bytes: Annotated[int, Field(gt=0)] = Field(
        default=_ATTACHMENTS.max_turn_bytes, description="The most a turn's attachments may bring together (100 MiB)."
    )
    max_count: Annotated[int, Field(ge=0)] = Field(
        default=_ATTACHMENTS.max_count, description="The most attachments one turn may have (10)."
    )
    timeout_secs: Annotated[float, Field(gt=0)] = Field(
        default=_ATTACHMENTS.timeout_secs, description="How long fetching all of a turn's attachments may take (60 s)."
    )
    allow_hosts: list[Annotated[str, Field(min_length=1)]] = Field(
        default=list(_ATTACHMENTS.allow_hosts),
        description="Host names, addresses and CIDR networks that may be fetched from although they are loopback, "
        "private or link-local (refused by default: a chat user's URL must not reach the bridge's own network).",
    )
    keep: bool = Field(
        default=_ATTACHMENTS.keep,
        description="Leave each turn's attachments (.agent-bridge/attachments/<turn id>/ in the agent's working "
        "directory) when the turn ends, instead of removing them.",
    )
    fetch: bool | None = Field(
        default=_ATTACHMENTS.fetch,
        description="Fetch each attachment before the agent starts (true: the agent gets its file's path too), or "
        "hand the agent the URLs as sent (false: nothing is fetched, and a URL the bridge could not fetch does not "
        "fail the turn). Absent: the protocol's default, false for agentproc-0.1 (its contract passes URLs "
        "through), true for every other protocol.",
    )


class OutboxModel(BaseModel):
    """How the agent learns where its files for the user go (docs/attachments-out.md)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    tell_agent: Literal["session", "every_turn", "never"] = Field(
        default=_OUTBOX.tell_agent,
        description="How the agent is told its outbox: session (once per agent session, through the protocol's "
        "channel for standing instructions, the user's message untouched), every_turn (a sentence after every "
        "message) or never (only the AGENT_OUTBOX variable).",
    )


class SandboxModel(BaseModel):
    """The agent under bubblewrap (docs/sandbox.md): what it sees beyond the system (read-only) and its working
    directory (writable)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    read: list[Annotated[str, Field(min_length=1)]] = Field(
        default=list(_SANDBOX.read),
        description="More paths the agent may read (bound read-only where they exist): ~ and {{PROFILE_DIR}} are "
        "expanded, a relative path is relative to the profile's directory.",
    )
    write: list[Annotated[str, Field(min_length=1)]] = Field(
        default=list(_SANDBOX.write),
        description="More paths the agent may write, written like read: a coding CLI's config and log-in "
        "directory (~/.codex, ~/.claude).",
    )
    network: bool = Field(
        default=_SANDBOX.network, description="false: a network namespace of its own, with only its own loopback."
    )
    hide_home: bool = Field(
        default=_SANDBOX.hide_home,
        description="The real home directory is hidden under an empty private one at the same path ($HOME); "
        "false leaves it visible (read-only).",
    )

    @field_validator("read", "write")
    @classmethod
    def _only_the_authors_placeholders(cls, paths: list[str]) -> list[str]:
        for path in paths:
            for match in PLACEHOLDER_PATTERN.finditer(path):
                if match.group(1) != "PROFILE_DIR":
                    raise PydanticCustomError(
                        "sandbox_path",
                        "{reason}",
                        {
                            "reason": f"{path!r}: only {{{{PROFILE_DIR}}}} and ~ may stand in a sandbox path; a "
                            f"value that comes from a chat ({match.group(0)}) must never choose what the agent can see"
                        },
                    )
        return paths


class LimitsModel(BaseModel):
    """How much the agent may take (docs/sandbox.md, "Limits"); each unset limit is no limit."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    memory_mb: Annotated[int, Field(gt=0)] | None = Field(
        default=_LIMITS.memory_mb,
        description="Memory of all the agent's processes together, in MiB (a cgroup memory controller); over it, "
        "the kernel's out-of-memory killer stops a process of the agent.",
    )
    cpu_secs: Annotated[int, Field(gt=0)] | None = Field(
        default=_LIMITS.cpu_secs,
        description="CPU time of each of the agent's processes, in seconds (RLIMIT_CPU): over it, SIGXCPU stops it. "
        "A warm agent's process counts across all its turns.",
    )
    processes: Annotated[int, Field(gt=0)] | None = Field(
        default=_LIMITS.processes,
        description="Processes and threads the agent may have at once (a cgroup pids controller): a fork over it "
        "fails.",
    )
    file_size_mb: Annotated[int, Field(gt=0)] | None = Field(
        default=_LIMITS.file_size_mb,
        description="The largest file the agent may write, in MiB (RLIMIT_FSIZE): SIGXFSZ past it.",
    )
    open_files: Annotated[int, Field(gt=0)] | None = Field(
        default=_LIMITS.open_files,
        description="Descriptors each of the agent's processes may have open (RLIMIT_NOFILE): opening one more fails.",
    )


class ProfileModel(BaseModel):
    """How to launch one agent executable: every field of docs/protocol.md §1, its type, default and meaning."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        title="agent-bridge profile",
        json_schema_extra={"$schema": "https://json-schema.org/draft/2020-12/schema"},
    )

    command: str | list[str] = Field(
        description="argv[0..]. A string is split into words with POSIX shell-word rules "
        "(quotes group words; nothing is expanded, no shell runs). A list is taken as argv verbatim.",
    )
    args: list[str] = Field(default=[], description="Appended to the split command, one token each, never split.")
    protocol: str = Field(
        default=DEFAULT_PROTOCOL,
        description="How the agent talks: "
        + "; ".join(f"{name}: {info.summary}" for name, info in PROTOCOLS.items())
        + ". Settings of the protocol go under a key named after it.",
    )
    resume_args: list[str] = Field(
        default=[],
        description="Put between the command's words and args only when the turn resumes a session "
        "(its session id is not empty), e.g. [--resume, '{{SESSION_ID}}'].",
    )
    new_session_args: list[str] = Field(
        default=[],
        description="Put between the command's words and args only when the turn starts a new session. "
        "{{NEW_SESSION_ID}} here is a fresh UUID the bridge makes up and reports as the turn's session id, for CLIs "
        "that take the id of a new session from their caller (e.g. [--session, '{{NEW_SESSION_ID}}']).",
    )
    permissions: PermissionsModel | None = Field(
        default=None,
        description="Answers to the agent's requests to run a tool (agentproc-0.4 and the warm "
        "protocols). Present: requests are answered by these rules; absent: the agent is told nobody answers.",
    )
    attachments: AttachmentsModel | None = Field(
        default=None,
        description="Whether the turn's attachments are fetched into its directory (fetch), and how: limits, allowed "
        "hosts, keep.",
    )
    sandbox: SandboxModel | None = Field(
        default=None,
        description="Run the agent under bubblewrap (bwrap): the system read-only, its working directory "
        "writable, a private /tmp, the real home hidden, a PID namespace of its own. Absent: no sandbox.",
    )
    limits: LimitsModel | None = Field(
        default=None,
        description="How much the agent may take: memory_mb, cpu_secs, processes, file_size_mb, open_files; a "
        "limit that cannot be enforced on the machine keeps the agent from starting.",
    )
    keep_warm_secs: Annotated[float, Field(gt=0)] = Field(
        default=600.0,
        description="Warm protocols: an agent idle this long is shut down; the next turn of its "
        "conversation starts a new process that resumes the stored session.",
    )
    max_warm: Annotated[int, Field(ge=1)] = Field(
        default=16,
        description="Warm protocols: live processes of this profile at most; starting one more shuts "
        "the least recently used down.",
    )
    start_timeout_secs: Annotated[float, Field(gt=0)] = Field(
        default=60.0,
        description="Warm protocols: how long starting the agent and its session may take.",
    )
    on_busy: Literal["queue", "steer", "interrupt"] = Field(
        default="queue",
        description="A message of a conversation whose turn is still running: queue runs it next; steer delivers it "
        "into the running turn (claude-sdk, codex-app-server; other protocols queue it, and check says so), and its "
        "result says which turn it was folded into; interrupt stops the running turn and runs it next.",
    )
    on_resume_failure: Literal["new_session", "fail"] = Field(
        default="new_session",
        description="Warm protocols: when the agent proves the stored session to resume is gone (deleted, expired, "
        "another machine's), new_session starts a fresh one and tells the host; fail fails the turn.",
    )
    on_worker_lost: Literal["retry", "fail"] = Field(
        default="retry",
        description="Workers sharing a PostgreSQL queue: when the worker running a turn dies, "
        "retry puts the turn back in its place in the queue (the agent may run twice: at-least-once); fail ends it "
        "with a worker_lost result (at-most-once).",
    )
    stdin: Literal["none", "message", "line"] = Field(
        default="none",
        description="none: stdin is empty (EOF at once). message: the message is written to stdin, then EOF. "
        "line: the message and a newline (for programs that read lines: bc, a REPL), then EOF.",
    )
    cwd: str | None = Field(
        default=None,
        description="Working directory; ~ is expanded and a relative path is relative to the profile's directory. "
        "Default: the bridge's working directory.",
    )
    env: dict[str, str] = Field(
        default={},
        description="Extra variables. ${VAR} expands from the bridge's environment (unknown: empty, with a warning).",
    )
    env_allowlist: list[str] | None = Field(
        default=None,
        description="When present, ${VAR} for names not listed expands to empty, with a warning.",
    )
    env_inherit: Literal["minimal", "all"] = Field(
        default="minimal",
        description="minimal: only PATH, HOME, USER, LOGNAME, SHELL, LANG, LC_*, TERM, TMPDIR, TZ are passed on. "
        "all: the bridge's whole environment.",
    )
    timeout_secs: Annotated[float, Field(gt=0)] = Field(
        default=1800.0, description="Wall-clock limit of the whole turn, from spawn."
    )
    idle_timeout_secs: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Optional limit on silence: seconds without a byte on stdout."
    )
    kill_grace_secs: Annotated[float, Field(ge=0)] = Field(
        default=5.0, description="Seconds between SIGTERM (or SIGINT) and SIGKILL."
    )
    max_reply_chars: Annotated[int, Field(gt=0)] | None = Field(
        default=8000,
        description="Cap on the reply body, and on the cumulative text of forwarded partials; null = no cap.",
    )
    truncation_suffix: str = Field(default="\n\n…(truncated)", description="Appended once where the cap cut text.")
    outbox: OutboxModel | None = Field(
        default=None,
        description="How the agent is told where its files for the user go (tell_agent; session by default).",
    )
    outbox_max_files: Annotated[int, Field(ge=0)] = Field(
        default=20, description="At most this many files the agent leaves in its outbox are sent; more are noted."
    )
    outbox_max_bytes: Annotated[int, Field(ge=0)] = Field(
        default=50 * 1024 * 1024, description="The files sent from the outbox total at most this many bytes."
    )
    include_stderr_in_reply: bool = Field(
        default=False, description="Append the tail of the agent's stderr to what the user is sent."
    )
    send_error_reply: bool = Field(default=True, description="On a failed turn, produce a user-facing error text.")
    streaming: bool = Field(
        default=True,
        description="Forward AGENT_PARTIAL: chunks live; when false they are ignored and AGENT_STREAMING=0.",
    )
    session_line_prefix: Annotated[str, Field(min_length=1)] = Field(
        default="AGENT_SESSION:",
        description="The session marker; lets a profile wrap a CLI that prints its own session line.",
    )
    name: str | None = Field(default=None, description="Metadata; defaults to the profile file's stem.")
    description: str | None = Field(default=None, description="Metadata: what this agent is for.")

    _argv_template: tuple[str, ...] = PrivateAttr(default=())
    _resume_argv_template: tuple[str, ...] = PrivateAttr(default=())

    @field_validator("command", mode="before")
    @classmethod
    def _command_type(cls, value: Any) -> Any:
        if isinstance(value, str) or (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            return value
        raise PydanticCustomError("command_type", "expected a string or a list of strings")

    @field_validator("protocol")
    @classmethod
    def _known_protocol(cls, protocol: str) -> str:
        if protocol in PROTOCOLS:
            return protocol
        close = difflib.get_close_matches(protocol, list(PROTOCOLS), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(PROTOCOLS)})"
        raise PydanticCustomError(
            "protocol", "unknown protocol {protocol}{hint}", {"protocol": repr(protocol), "hint": hint}
        )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name):
                raise PydanticCustomError("env_name", "{name!r} is not a valid variable name", {"name": name})
            if "\0" in value:
                raise PydanticCustomError("env_value", "the value of {name} contains a NUL character", {"name": name})
        return env

    @model_validator(mode="after")
    def _build_argv_template(self) -> ProfileModel:
        templates = self._argv_templates()
        for text, location in self._templated_fields(templates.values()):
            _check_placeholders(text, location)
        for name, value in self.env.items():
            reason = environment_problem(name, value)
            if reason is not None:
                raise _located_error(("env", name), "{reason}", reason=reason)
        self._check_protocol_fields()
        if PROTOCOLS[self.protocol].warm:
            self._check_no_message_in_warm_argv(templates.values())
        message_on_stdin = self.stdin != "none" or PROTOCOLS[self.protocol].message_on_stdin
        for argv, locations in templates.values():
            problem = argv_problem(argv)
            if problem is not None:
                raise _located_error(locations[problem.index], "{reason}", reason=problem.message)
            if message_on_stdin and (reason := stdin_problem(argv)) is not None:
                where = ("stdin",) if self.stdin != "none" else ("protocol",)
                raise _located_error(where, "{reason}", reason=reason)
        if self.sandbox is not None and find_tool(BWRAP) is None:
            raise _located_error(("sandbox",), "{reason}", reason=missing_tool(BWRAP))
        if self.limits is not None and needs_prlimit(self.limits.model_dump()) and find_tool(PRLIMIT) is None:
            raise _located_error(("limits",), "{reason}", reason=missing_tool(PRLIMIT))
        self._argv_template = templates["new_session_args"][0]
        self._resume_argv_template = templates["resume_args"][0]
        return self

    def _argv_templates(self) -> dict[str, _Template]:
        """A new session's and a resumed session's argv (by the field that makes them differ), with where in the
        profile each word comes from."""
        if isinstance(self.command, str):
            try:
                words = shlex.split(self.command, posix=True)
            except ValueError as err:  # shlex says "No closing quotation" / "No escaped character"
                raise _located_error(
                    ("command",), "cannot split it into words: {reason}", reason=str(err).lower()
                ) from None
            word_locations: list[tuple[str | int, ...]] = [("command",)] * len(words)
        else:
            words = list(self.command)
            word_locations = [("command", index) for index in range(len(words))]
        if not words or not words[0]:
            raise _located_error(("command",), "it is empty; it must name the program to run")
        args = [("args", index) for index in range(len(self.args))]
        templates = {}
        for kind, extra in (("new_session_args", self.new_session_args), ("resume_args", self.resume_args)):
            locations = (*word_locations, *((kind, index) for index in range(len(extra))), *args)
            templates[kind] = ((*words, *extra, *self.args), locations)
        return templates

    def _check_no_message_in_warm_argv(self, templates: Iterable[_Template]) -> None:
        for argv, locations in templates:
            for word, location in zip(argv, locations, strict=True):
                if "{{MESSAGE}}" in word:
                    raise _located_error(
                        location,
                        "{{{{MESSAGE}}}} cannot be in the argv of protocol {protocol}: "
                        "its agent starts before any message and keeps running for the whole "
                        "conversation; the messages reach it through the protocol (remove it)",
                        protocol=self.protocol,
                    )

    def _check_protocol_fields(self) -> None:
        """Fields that mean something to some protocols only are refused with the others."""
        defaults = type(self).model_fields
        if not PROTOCOLS[self.protocol].warm:
            # By value: see below.
            for field in ("keep_warm_secs", "max_warm", "start_timeout_secs", "on_resume_failure"):
                if getattr(self, field) != defaults[field].default:
                    raise _located_error(
                        (field,),
                        "{field} is for the warm protocols (one process per "
                        "conversation); {protocol} runs one process per turn (remove it)",
                        field=field,
                        protocol=self.protocol,
                    )
        if self.protocol == DEFAULT_PROTOCOL:
            return
        if self.stdin != "none":
            raise _located_error(
                ("stdin",),
                "stdin: {mode} is for protocol agentproc-0.1; {protocol} hands the "
                "turn to the agent itself (remove stdin)",
                mode=self.stdin,
                protocol=self.protocol,
            )
        # By value, as stdin: `Profile.replace()` passes every field back, defaults included.
        if self.session_line_prefix != defaults["session_line_prefix"].default:
            raise _located_error(
                ("session_line_prefix",),
                "session_line_prefix is for protocol agentproc-0.1; "
                "{protocol} agents report their session in their own messages (remove it)",
                protocol=self.protocol,
            )

    def _templated_fields(self, templates: Iterable[_Template]) -> Iterator[tuple[str, tuple[str | int, ...]]]:
        for argv, locations in templates:
            yield from zip(argv, locations, strict=True)
        if self.cwd is not None:
            yield self.cwd, ("cwd",)
        for name, value in self.env.items():
            yield value, ("env", name)

    def values(self) -> dict[str, Any]:
        """The validated fields, plus the argv templates of a new and of a resumed session."""
        values = self.model_dump()
        values["argv_template"] = self._argv_template
        values["resume_argv_template"] = self._resume_argv_template
        return values


def json_schema() -> dict[str, Any]:
    """The profile's JSON Schema, for YAML editors (yaml-language-server and friends)."""
    schema = ProfileModel.model_json_schema()
    for protocol, info in PROTOCOLS.items():
        settings = _settings_model(info.settings).model_json_schema()
        settings["description"] = f"Settings of protocol {protocol} (only with protocol: {protocol})."
        schema["properties"][protocol] = settings
    return schema


def validate_mapping(data: Mapping[str, Any]) -> dict[str, Any]:
    """Validate profile fields given in code: every field's value and the argv templates, or `ProfileError`."""
    return _validate(dict(data), {}, None)


def validate_text(text: str, where: str, default_name: str | None = None) -> dict[str, Any]:
    """Validate profile YAML; every problem is reported as `where:line: message`."""
    data, lines, problems = read_yaml(text, where)
    if data is not None and "name" not in data and default_name is not None:
        data["name"] = default_name
    if data is None or problems:
        raise ProfileError(sorted(problems, key=lambda problem: problem.line or 0))
    return _validate(data, lines, where)


def _validate(data: dict[str, Any], lines: Mapping[tuple[Any, ...], int], where: str | None) -> dict[str, Any]:
    sections = {key: data.pop(key) for key in list(data) if key in PROTOCOLS}
    problems: list[Problem] = []
    try:
        model = ProfileModel.model_validate(data)
    except ValidationError as err:
        problems.extend(explain(err, lines, where))
        model = None
    protocol = model.protocol if model is not None else data.get("protocol", DEFAULT_PROTOCOL)
    settings: dict[str, Any] = {}
    for key, section in sections.items():
        if key != protocol:
            problems.append(
                Problem(
                    f"{key}: these are settings of protocol {key}, but the profile's protocol is "
                    f"{protocol}; set protocol: {key}, or remove them",
                    where,
                    lines.get((key,)),
                )
            )
            continue
        try:
            settings = _validate_settings(PROTOCOLS[key].settings, section)
        except ValidationError as err:
            keys = [field.name for field in dataclasses.fields(PROTOCOLS[key].settings)]
            problems.extend(explain(err, lines, where, prefix=(key,), keys=keys))
    if problems or model is None:
        raise ProfileError(sorted(problems, key=lambda problem: problem.line or 0))
    values = model.values()
    values["protocol_settings"] = settings
    return values


@cache
def _settings_model(settings: type) -> type[BaseModel]:
    """A strict pydantic model of a dialect's settings class (its keys, types and defaults)."""
    hints = typing.get_type_hints(settings)
    defaults = inspect.signature(settings).parameters
    fields: dict[str, Any] = {
        name: (hints[name], defaults[name].default) for name in (field.name for field in dataclasses.fields(settings))
    }
    return create_model(
        f"{settings.__name__}Model",
        __config__=ConfigDict(strict=True, extra="forbid"),
        __doc__=settings.__doc__,
        **fields,
    )


def _validate_settings(settings: type, section: Any) -> dict[str, Any]:
    """The section's values (defaults left out) once its keys, types and ranges are right."""
    if section is None:
        section = {}
    model = _settings_model(settings).model_validate(section)
    values = model.model_dump(exclude_unset=True)
    try:
        settings(**values)
    except (ValueError, TypeError) as err:
        raise ValidationError.from_exception_data(
            settings.__name__,
            [{"type": PydanticCustomError("settings", "{reason}", {"reason": str(err)}), "loc": (), "input": section}],
        ) from None
    return values


# --------------------------------------------------------------------------- YAML with line numbers


def read_yaml(
    text: str, where: str, *, what: str = "profile", needs: str = "at least `command:`"
) -> tuple[dict[str, Any] | None, dict[tuple[Any, ...], int], list[Problem]]:
    """Parse YAML into data plus the line of every key, so errors can point at it. `what` the file is (a
    profile; the chat config of bridge.chat.config) and what it `needs` name it in the errors."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}, [Problem(f"the {what} is empty; it needs {needs}", where, 1)]
        if (expanding := _expanding_value(node, where)) is not None:
            return None, {}, [expanding]
        lines: dict[tuple[Any, ...], int] = {}
        problems: list[Problem] = []
        _index_lines(node, (), lines, problems, where)
        if not isinstance(node, yaml.MappingNode):
            return (
                None,
                lines,
                [Problem(f"a {what} must be a mapping of keys to values", where, node.start_mark.line + 1)],
            )
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as err:
        if err.context_mark is not None and "quoted scalar" in (err.context or ""):
            opened = err.context_mark
            return (
                None,
                {},
                [
                    Problem(
                        f"invalid YAML: a quote is probably unclosed: the {text[opened.index]} opened at line "
                        f"{opened.line + 1}, column {opened.column + 1} has no closing {text[opened.index]} "
                        f"(YAML: {err.problem or 'syntax error'})",
                        where,
                        opened.line + 1,
                    )
                ],
            )
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        reason = err.problem or err.context or "syntax error"
        marked = [m.line for m in (err.problem_mark, err.context_mark) if m is not None]
        return None, {}, [Problem(f"invalid YAML: {reason}{_unquoted_braces_hint(text, marked)}", where, line)]
    except yaml.YAMLError as err:
        return None, {}, [Problem(f"invalid YAML: {err}", where)]
    finally:
        loader.dispose()
    bad_keys = [key for key in data if not isinstance(key, str)]
    for key in bad_keys:
        problems.append(Problem(f"key {key!r} is not a string", where, lines.get((key,))))
    return data, lines, problems


_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# A plain value that starts with "{" opens a YAML mapping: `command: {{PROFILE_DIR}}/a.sh` does not parse.
_UNQUOTED_BRACES = re.compile(r"(?:^|(?<=[\s\[,]))\{\{[^\s,\]]*")


def _unquoted_braces_hint(text: str, marked_lines: list[int]) -> str:
    """For a YAML error: "; … must be quoted" when a value starts with `{{` (the lines YAML marked first)."""
    lines = text.splitlines()
    for index in [*marked_lines, *range(len(lines))]:
        if index >= len(lines):
            continue
        line = lines[index].split(" #", 1)[0]
        for match in _UNQUOTED_BRACES.finditer(line):
            if line[: match.start()].count('"') % 2 == 0 and line[: match.start()].count("'") % 2 == 0:
                return (
                    f"; a value that starts with {{{{ must be in quotes, or YAML reads it as a mapping: "
                    f'write "{match.group(0)}" (line {index + 1})'
                )
    return ""


MAX_VALUES = 100_000  # values a file may hold once its YAML aliases are expanded: far above any real one


def _expanding_value(node: yaml.Node, where: str) -> Problem | None:
    """A Problem at the first value that YAML aliases (`*name`) make hold itself, or expand beyond MAX_VALUES,
    which every later step would walk value by value (a file of a kilobyte can spell billions); None for any other.
    Walked without recursion, so that no nesting is too deep for it."""
    sizes: dict[int, int] = {}  # id of a node walked -> its values, aliases expanded (at most MAX_VALUES + 1)
    opened: set[int] = set()  # the nodes whose values are being walked: the current one's ancestors
    waiting = [node]
    while waiting:
        current = waiting[-1]
        children = _children(current)
        if id(current) in sizes:
            waiting.pop()
        elif id(current) not in opened:
            opened.add(id(current))
            if any(id(child) in opened for child in children):
                return Problem(
                    "this value holds itself through a YAML alias (*name): write it out", where, _line(current)
                )
            waiting.extend(child for child in children if id(child) not in sizes)
        else:
            opened.discard(id(current))
            sizes[id(current)] = min(1 + sum(sizes[id(child)] for child in children), MAX_VALUES + 1)
            waiting.pop()
            if sizes[id(current)] > MAX_VALUES:
                return Problem(
                    f"this value expands to more than {MAX_VALUES:,} values through YAML aliases (*name): write "
                    "out what it needs instead",
                    where,
                    _line(current),
                )
    return None


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _index_lines(
    node: yaml.Node, path: tuple[Any, ...], lines: dict[tuple[Any, ...], int], problems: list[Problem], where: str
) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            line = key_node.start_mark.line + 1
            if key in seen:
                problems.append(Problem(f"duplicate key {key!r}", where, line))
            seen.add(key)
            lines[(*path, key)] = line
            _index_lines(value_node, (*path, key), lines, problems, where)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index_lines(item, (*path, index), lines, problems, where)


# --------------------------------------------------------------------------- error messages

_TYPE_WORDS = {
    "float_type": "expected a number",
    "int_type": "expected a whole number",
    "string_type": "expected a string",
    "bool_type": "expected true or false",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "literal_error": "expected {expected}",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "string_too_short": "must not be empty",
    "missing": "is required",
}


def _located_error(loc: tuple[str | int, ...], message: str, **context: Any) -> PydanticCustomError:
    """An error from a whole-model check that still points at the field it is about."""
    return PydanticCustomError("located", message, {**context, "loc": loc})


def explain(
    err: ValidationError,
    lines: Mapping[tuple[Any, ...], int],
    where: str | None,
    prefix: tuple[str, ...] = (),
    keys: typing.Iterable[str] | typing.Callable[[tuple[str | int, ...]], typing.Iterable[str]] | None = None,
) -> list[Problem]:
    """Problems as people read them; `keys` are the valid keys a misspelt one is compared with (or, called with
    the location of the mapping it is in, gives them: the chat config's sections have keys of their own)."""
    if keys is None:
        keys = [*ProfileModel.model_fields, *PROTOCOLS]
    problems = []
    for detail in err.errors(include_url=False):
        loc = tuple(part for part in detail["loc"] if isinstance(part, (str, int)))
        kind = detail["type"]
        if not loc and "loc" in detail.get("ctx", {}):
            loc = detail["ctx"]["loc"]
        loc = (*prefix, *loc)
        if kind == "extra_forbidden":
            key = str(loc[-1])
            parent = ".".join(str(part) for part in loc[:-1])
            message = f"unknown key {key!r}" + (f" in {parent}" if parent else "")
            candidates = keys(loc[:-1]) if callable(keys) else keys
            close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
            if close:
                message += f"; did you mean {close[0]!r}?"
        else:
            template = _TYPE_WORDS.get(kind)
            context = {
                key: f"{value:g}" if isinstance(value, float) else value for key, value in detail.get("ctx", {}).items()
            }
            reason = template.format(**context) if template else detail["msg"]
            field = ".".join(str(part) for part in loc) or "profile"
            message = f"{field}: {reason}"
            if kind.endswith("_type") and not isinstance(detail["input"], (dict, list)):
                message += f", got {detail['input']!r}"
        problems.append(Problem(message, where, line_of(loc, lines)))
    return problems


def line_of(loc: tuple[Any, ...], lines: Mapping[tuple[Any, ...], int]) -> int | None:
    for end in range(len(loc), -1, -1):
        line = lines.get(loc[:end])
        if line is not None:
            return line
    return None


# --------------------------------------------------------------------------- placeholder rules


def _check_placeholders(text: str, location: tuple[str | int, ...]) -> None:
    if "{{" not in text:
        return
    for match in PLACEHOLDER_PATTERN.finditer(text):
        name = match.group(1)
        if name == "NEW_SESSION_ID" and location[0] != "new_session_args":
            raise _located_error(
                location,
                "{reason}",
                reason=(
                    "{{NEW_SESSION_ID}} may stand only in new_session_args: it is a fresh id the bridge makes up for a "
                    "turn that starts a new session (a resumed turn has its id in {{SESSION_ID}}, e.g. "
                    "resume_args: [--session, '{{SESSION_ID}}'])"
                ),
            )
        if name in PLACEHOLDERS:
            continue
        close = difflib.get_close_matches(name.upper(), PLACEHOLDERS, n=1, cutoff=0.6)
        hint = (
            f"; did you mean {{{{{close[0]}}}}}?"
            if close
            else f" (known: {', '.join('{{' + p + '}}' for p in PLACEHOLDERS)})"
        )
        raise _located_error(location, "unknown placeholder {found}{hint}", found=match.group(0), hint=hint)
