"""From (profile, turn) to exactly what the OS is asked to run. Pure: no I/O.

Everything a spawn needs is decided here — argv, environment, working
directory and stdin bytes — so the rules of docs/protocol.md §1–§2 are tested without a
process, and the one-process turn only executes a finished plan.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..confinement.exec_limits import MAX_ARG_STRLEN, byte_size, too_long
from ..confinement.limits import ResourceLimits, prlimit_words
from ..confinement.programs import BWRAP, PRLIMIT, find_tool, missing_tool
from ..confinement.sandbox import SandboxView, sandbox_view
from ..dialects import PROTOCOLS, Handover
from ..errors import LaunchError
from ..profile import PLACEHOLDER_PATTERN, Profile
from ..profile.cache import cache_directory, make_private_directories
from ..profile.fields import NEW_SESSION_ID
from ..turn import Turn

PROTOCOL_VERSION = "0.1"
INFRA_VARIABLES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "TMPDIR", "TZ"})
# The protocol's own variables: never inherited and never set by a profile, so
# they always describe this turn and nothing else.
PROTOCOL_VARIABLES = frozenset(
    {
        "AGENT_MESSAGE",
        "AGENT_SESSION_ID",
        "AGENT_SESSION_NAME",
        "AGENT_FROM_USER",
        "AGENT_STREAMING",
        "AGENT_PROTOCOL_VERSION",
        "AGENT_ATTACHMENTS",
        "AGENT_IMAGE_URL",
        "AGENT_FILE_URL",
        "AGENT_IMAGE_PATH",
        "AGENT_FILE_PATH",
        "AGENT_OUTBOX",
    }
)

_TEMPLATE = re.compile(PLACEHOLDER_PATTERN.pattern + r"|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Names that usually hold what an agent logs in with: ANTHROPIC_API_KEY, GH_TOKEN, AWS_SECRET_ACCESS_KEY,
# GOOGLE_APPLICATION_CREDENTIALS… A whole word after "_" (or the whole name), so TOKENIZERS_PARALLELISM is not one.
_CREDENTIAL_NAME = re.compile(
    r"(?:^|_)(?:API_?KEY|TOKEN|SECRET|SECRET_KEY|ACCESS_KEY|ACCESS_KEY_ID|PASSWORD|CREDENTIALS)$", re.IGNORECASE
)


@dataclass(slots=True, frozen=True)
class LaunchPlan:
    """What to execute for one turn. `notes` are warnings for the log (they never hold values)."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str | None
    stdin: bytes | None
    notes: tuple[str, ...] = ()
    stdin_open: bool = False
    """stdin stays a pipe after `stdin` was written, for answers to the agent (its dialect's handover)."""
    new_session_id: str = ""
    """The id the bridge made up for this new session (`{{NEW_SESSION_ID}}`); it is the turn's session id."""
    sandboxed: bool = False
    """argv starts with bwrap's words (the profile's `sandbox`): bwrap dies with the thread that spawns it."""
    limits: ResourceLimits | None = None
    """The profile's `limits:` (`bridge.confinement.limits`), set on the agent as it starts."""
    command_at: int = 0
    """Where the profile's own command starts in argv, after the bridge's programs in front of it (bwrap, prlimit)."""
    shown_cwd: str | None = None
    """`cwd` as errors name it, `{{MESSAGE}}` standing for the message text in it (None: `cwd` itself)."""


def plan_launch(profile: Profile, turn: Turn, environ: Mapping[str, str]) -> LaunchPlan:
    """Build the launch plan of `turn`'s agent; raises `LaunchError` (126) when the OS could not accept it."""
    return _plan(profile, environ, turn.session_id, turn.session_name, turn)


def plan_warm_launch(profile: Profile, environ: Mapping[str, str], *, session_id: str, session_name: str) -> LaunchPlan:
    """Build the launch plan of a warm agent, whose process outlives turns: no message is in it (its dialect
    writes every prompt to stdin), only the session it resumes. Raises as `plan_launch`."""
    return _plan(profile, environ, session_id, session_name, None)


def turn_working_directory(profile: Profile, turn: Turn) -> str | None:
    """The working directory `plan_launch` gives the turn's agent (None: the bridge's own), without planning the
    rest; raises `LaunchError` as it does when a value cannot be put into `cwd`."""
    return _working_directory(profile, _values(profile, turn.session_id, turn.session_name, turn, ""))


def _values(
    profile: Profile, session_id: str, session_name: str, turn: Turn | None, new_session_id: str
) -> dict[str, str]:
    return {
        "MESSAGE": turn.message if turn is not None else "",
        "SESSION_ID": session_id,
        "SESSION_NAME": session_name,
        "PROFILE_DIR": profile.profile_dir,
        "NEW_SESSION_ID": new_session_id,
    }


def _plan(
    profile: Profile, environ: Mapping[str, str], session_id: str, session_name: str, turn: Turn | None
) -> LaunchPlan:
    new_session_id = _new_session_id(profile, session_id)
    values = _values(profile, session_id, session_name, turn, new_session_id)
    notes: list[str] = []
    if turn is None or profile.warm:  # a long-lived agent: its dialect writes to stdin for the whole session
        handover = Handover(keep_open=True)
    else:
        handover = profile.turn_dialect.handover(turn, profile.dialect_context)
    # The prompt as the protocol hands it (the message with its fetched files named) fills argv and env; cwd keeps
    # the message as sent, whose rules (one path component) a list of paths could never meet.
    given = values if handover.message is None else {**values, "MESSAGE": handover.message}
    argv = _argv(profile, given, session_id, handover.options)
    env = _base_environment(profile, environ)
    for name, value_template in profile.env.items():
        if name not in PROTOCOL_VARIABLES:
            env[name] = _render(value_template, given, environ, profile.env_allowlist, notes, name)
    env.update(_protocol_variables(profile, session_id, session_name, turn))
    _fit_the_message(profile, env, notes)
    _check_environment_sizes(env)
    cwd = _working_directory(profile, values)
    # The bridge's own programs in front of the profile's command: bwrap, then prlimit inside the sandbox.
    sandbox = effective_sandbox(profile, environ, cwd)
    before = sandbox.argv() if sandbox is not None else []
    if sandbox is not None and "TMPDIR" in env and "TMPDIR" not in profile.env:
        env["TMPDIR"] = "/tmp"  # the bridge's own temporary directory is not in the sandbox's private /tmp
    limits = ResourceLimits.of(profile.limits)
    before += _prlimit_words(limits, environ)
    return LaunchPlan(
        argv=(*before, *argv),
        env=env,
        cwd=cwd,
        stdin=handover.stdin,
        notes=tuple(notes),
        stdin_open=handover.keep_open,
        new_session_id=new_session_id,
        sandboxed=sandbox is not None,
        limits=limits,
        command_at=len(before),
        shown_cwd=_shown_working_directory(profile, values, cwd),
    )


def _new_session_id(profile: Profile, session_id: str) -> str:
    """A fresh id for a turn that starts a session under a profile that names it (`{{NEW_SESSION_ID}}`), else ""."""
    if session_id or not any(NEW_SESSION_ID in word for word in profile.new_session_args):
        return ""
    import uuid  # only profiles that name new sessions pay for the module

    return str(uuid.uuid4())


def _argv(profile: Profile, given: Mapping[str, str], session_id: str, options: tuple[str, ...]) -> tuple[str, ...]:
    """The profile's argv rendered, with the dialect's `options` after the command's own words."""
    template = profile.resume_argv_template if session_id else profile.argv_template
    argv = tuple(_render(word, given) for word in template)
    if options:
        after_command = len(template) - len(profile.resume_args if session_id else profile.new_session_args)
        after_command -= len(profile.args)
        argv = (*argv[:after_command], *options, *argv[after_command:])
    for index, word in enumerate(argv):
        if too_long(word):
            raise LaunchError(
                126,
                f"argument {index} is {byte_size(word)} bytes, over the OS limit of {MAX_ARG_STRLEN} "
                "bytes for one argument; pass the message in AGENT_MESSAGE or with `stdin: message`",
            )
    return argv


def _fit_the_message(profile: Profile, env: dict[str, str], notes: list[str]) -> None:
    """A message too long for AGENT_MESSAGE is cut there when stdin has all of it; else `LaunchError`."""
    message = env["AGENT_MESSAGE"]
    if not too_long("AGENT_MESSAGE=" + message):
        return
    if not (profile.stdin != "none" or PROTOCOLS[profile.protocol].message_on_stdin):
        raise LaunchError(
            126,
            f"the message is {byte_size(message)} bytes, over the OS limit of {MAX_ARG_STRLEN} "
            "bytes for one environment variable; set `stdin: message` in the profile so long "
            "messages reach the agent on stdin",
        )
    env["AGENT_MESSAGE"] = _cut_to_bytes(message, MAX_ARG_STRLEN - len("AGENT_MESSAGE=") - 1)
    notes.append("the message is too long for AGENT_MESSAGE; it holds a truncated copy, stdin has all of it")


def _check_environment_sizes(env: Mapping[str, str]) -> None:
    """`LaunchError` for a variable over the OS's limit, saying what to shorten."""
    for name, value in env.items():
        if (len(name) + len(value)) * 4 + 2 > MAX_ARG_STRLEN and too_long(f"{name}={value}"):
            raise LaunchError(
                126,
                f"environment variable {name} is {byte_size(value)} bytes, over the OS limit of "
                f"{MAX_ARG_STRLEN} bytes for one variable; {_what_to_shorten(name)}",
            )


def _prlimit_words(limits: ResourceLimits | None, environ: Mapping[str, str]) -> list[str]:
    """prlimit's words that set the rlimits among `limits` on the agent (none: no words); `LaunchError` without it."""
    rlimits = limits.rlimits() if limits is not None else ()
    if not rlimits:
        return []
    prlimit = find_tool(PRLIMIT, environ.get("PATH", os.defpath))
    if prlimit is None:
        raise LaunchError(127, missing_tool(PRLIMIT))
    return prlimit_words(prlimit, rlimits)


_TURN_FIELD_OF = {
    "AGENT_SESSION_ID": "session id",
    "AGENT_SESSION_NAME": "session name",
    "AGENT_FROM_USER": "from_user",
}


def _what_to_shorten(variable: str) -> str:
    """What to do about environment variable `variable` being over the OS's limit."""
    if variable == "AGENT_ATTACHMENTS":
        return (
            "send fewer attachments, or with shorter names, or run the agent with protocol agentproc-0.4, "
            "which hands them over on stdin"
        )
    if variable in _TURN_FIELD_OF:
        return f"the turn's {_TURN_FIELD_OF[variable]} is too long for the agent's environment: send a shorter one"
    return (
        "the profile's env sets it: keep what it expands to shorter ({{MESSAGE}} there takes the whole message: "
        "let the agent read it on stdin instead, with `stdin: message`)"
    )


def effective_sandbox(profile: Profile, environ: Mapping[str, str], cwd: str | None) -> SandboxView | None:
    """The sandbox the profile's agent gets working in `cwd` (None: the bridge's), or None when it has none.

    Looks bwrap up on the bridge's PATH; raises `LaunchError` when it is not there (127, naming the package), or
    when the working directory would uncover what the sandbox hides (126)."""
    if profile.sandbox is None:
        return None
    bwrap = find_tool(BWRAP, environ.get("PATH", os.defpath))
    if bwrap is None:
        raise LaunchError(127, missing_tool(BWRAP))
    try:
        view = sandbox_view(
            profile.sandbox,
            bwrap=bwrap,
            cwd=cwd or os.getcwd(),
            home=environ.get("HOME"),
            profile_dir=profile.profile_dir,
            profile_file=profile.file,
            profile_cache=str(cache_directory()),
        )
    except ValueError as err:
        raise LaunchError(126, str(err)) from None
    if os.path.realpath(cache_directory()) in view.guarded:
        try:  # there to be bound read-only: else the agent could make it, and write entries the bridge trusts
            make_private_directories(cache_directory())
        except OSError as err:
            raise LaunchError(
                126,
                f"the profile cache {cache_directory()} lies where the sandboxed agent may write, and cannot be "
                f"made to be bound read-only ({err.strerror or err}); point XDG_CACHE_HOME elsewhere",
            ) from None
    return view


def _base_environment(profile: Profile, environ: Mapping[str, str]) -> dict[str, str]:
    if profile.env_inherit == "all":
        return {name: value for name, value in environ.items() if name not in PROTOCOL_VARIABLES}
    # Look values up only for the names kept.
    return {name: environ[name] for name in environ if name in INFRA_VARIABLES or name.startswith("LC_")}


def looks_like_credential(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential (`*_API_KEY`, `*_TOKEN`, `*_SECRET`…)."""
    return _CREDENTIAL_NAME.search(name) is not None


def withheld_credentials(profile: Profile, environ: Mapping[str, str]) -> list[str]:
    """The credential-like variables of `environ` the agent does not get, sorted: held back by `env_inherit:
    minimal`, and neither set by the profile's `env` nor expanded (`${NAME}`) in one of its values."""
    if profile.env_inherit == "all":
        return []
    passed = set(profile.env)
    for template in profile.env.values():
        passed.update(match.group(2) for match in _TEMPLATE.finditer(template) if match.group(2))
    return sorted(name for name in environ if name not in passed and looks_like_credential(name))


def _protocol_variables(profile: Profile, session_id: str, session_name: str, turn: Turn | None) -> dict[str, str]:
    variables = {
        "AGENT_MESSAGE": turn.message if turn is not None else "",
        "AGENT_SESSION_ID": session_id,
        "AGENT_SESSION_NAME": session_name,
        "AGENT_FROM_USER": turn.from_user if turn is not None else "",
        "AGENT_STREAMING": "1" if profile.streaming else "0",
        "AGENT_PROTOCOL_VERSION": PROTOCOL_VERSION,
    }
    if turn is not None and turn.attachments:
        entries = [attachment.to_dict() for attachment in turn.attachments]
        listed = json.dumps(entries, ensure_ascii=False)
        if too_long("AGENT_ATTACHMENTS=" + listed):
            # A `data:` URI carries the file itself: a few of them pass the OS's limit for one variable. The
            # bridge holds each fetched file at its `path`, which the URL then names instead.
            for entry in entries:
                if "path" in entry:
                    entry["url"] = file_url(entry["path"])
            listed = json.dumps(entries, ensure_ascii=False)
        variables["AGENT_ATTACHMENTS"] = listed
        if len(turn.attachments) == 1:
            only = turn.attachments[0]
            if only.type in ("image", "file"):
                kind = only.type.upper()
                over = only.path and too_long(f"AGENT_{kind}_URL={only.url}")
                variables[f"AGENT_{kind}_URL"] = file_url(only.path) if over else only.url
                if only.path:
                    variables[f"AGENT_{kind}_PATH"] = only.path
    return variables


def file_url(path: str) -> str:
    """The `file://` URL of an absolute path."""
    return "file://" + urllib.parse.quote(path, safe="/")


def _working_directory(profile: Profile, values: Mapping[str, str]) -> str | None:
    if profile.cwd is None:
        return None
    # `~` is the author's: expanded before substituting, so a session id `~root` stays a plain name.
    template = os.path.expanduser(profile.cwd)
    if "{{" in template:
        for component in template.split("/"):
            for match in PLACEHOLDER_PATTERN.finditer(component):
                _check_path_component(match.group(1), values[match.group(1)])
            _check_named(component, values)
    return os.path.join(profile.profile_dir, _render(template, values))  # join keeps an absolute path as it is


def _check_named(component: str, values: Mapping[str, str]) -> None:
    """A path component of cwd holding values from the user must still name a directory: an empty session id (a
    new session has none yet) made `work/{{SESSION_ID}}` the directory above every session's."""
    if _render(component, values) not in ("", ".", ".."):
        return
    placeholders = (match.group(1) for match in PLACEHOLDER_PATTERN.finditer(component))
    placeholder = next((name for name in placeholders if name in _CWD_VALUE_NAMES and not values[name]), None)
    if placeholder is None:  # the author's own, `{{PROFILE_DIR}}/..`
        return
    noun = _CWD_VALUE_NAMES[placeholder]
    empty = " (a new session has no id yet)" if placeholder == "SESSION_ID" else ""
    instead = "; put {{SESSION_NAME}} in cwd, which every turn has" if placeholder == "SESSION_ID" else ""
    raise LaunchError(
        126,
        f"the {noun} cannot be used in cwd: it is empty{empty}, so the agent would run in the directory above the "
        f"one it names; a value put into cwd must be a single path component, not nothing{instead}",
    )


def _shown_working_directory(profile: Profile, values: Mapping[str, str], cwd: str | None) -> str | None:
    """`cwd` as errors name it, which the log keeps: `{{MESSAGE}}` in place of the message text."""
    if profile.cwd is None or "{{MESSAGE}}" not in profile.cwd:
        return cwd
    return _working_directory(profile, {**values, "MESSAGE": "{{MESSAGE}}"})


# What each placeholder from the user is called in errors; only these can move the agent.
_CWD_VALUE_NAMES = {"SESSION_ID": "session id", "SESSION_NAME": "session name", "MESSAGE": "message"}


def _check_path_component(placeholder: str, value: str) -> None:
    """A value from the user may name one directory inside cwd, never lead out of it."""
    noun = _CWD_VALUE_NAMES.get(placeholder)
    if noun is None or ("/" not in value and value not in (".", "..")):
        return
    shown = f"the {noun}" if placeholder == "MESSAGE" else f"the {noun} {value!r}"  # message text stays out of logs
    why = "it contains '/'" if "/" in value else f"it is {value!r}"
    raise LaunchError(
        126,
        f"{shown} cannot be used in cwd: {why}; a value put into cwd must be a single path "
        "component (no '/', not '.' or '..'), so that it cannot move the agent to another directory",
    )


def _render(
    template: str,
    values: Mapping[str, str],
    environ: Mapping[str, str] | None = None,
    allowlist: Collection[str] | None = None,
    notes: list[str] | None = None,
    variable: str = "",
) -> str:
    """Substitute placeholders (and, for env values, `${VAR}`) in one pass.

    One pass matters: text that came from a substitution is never scanned
    again, so a message containing `{{SESSION_ID}}` or `${SECRET}` stays inert.
    """
    if "{{" not in template and (environ is None or "${" not in template):
        return template

    def substitute(match: re.Match[str]) -> str:
        placeholder, reference = match.group(1), match.group(2)
        if placeholder is not None:
            return values[placeholder]
        if environ is None:
            return match.group(0)
        assert notes is not None
        if allowlist is not None and reference not in allowlist:
            notes.append(f"env {variable}: ${{{reference}}} is not in env_allowlist; it expands to empty")
            return ""
        if reference not in environ:
            notes.append(
                f"env {variable}: ${{{reference}}} is not set in the bridge's environment; it expands to empty"
            )
            return ""
        return environ[reference]

    return _TEMPLATE.sub(substitute, template)


def _cut_to_bytes(text: str, limit: int) -> str:
    return text.encode("utf-8", "surrogateescape")[:limit].decode("utf-8", "ignore")
