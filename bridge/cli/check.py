"""`agent-bridge check`: profiles and chat configs validated, and what would stop them here, before they run."""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys

from ..errors import ProfileError
from ..log import wants_color
from ..profile import Profile, load_profile
from ..turn import Turn
from .options import EXIT_USAGE
from .printer import ERROR, WARNING, paint


def check_command(args: argparse.Namespace) -> int:
    from ..confinement.cgroups import CONTAINMENT
    from .check_chat import check_chat_config, is_chat_config

    color = wants_color(sys.stderr)
    status = 0
    chat_configs = [path for path in args.profiles if is_chat_config(path)]
    if args.profiles_dir is not None and not chat_configs:
        print(paint("warning: --profiles is for a chat config; no file given is one", WARNING, color), file=sys.stderr)
    for path in args.profiles:
        if path in chat_configs:
            report = functools.partial(_report_profile, color=color)
            status = max(status, check_chat_config(path, args.profiles_dir, report, color=color))
            continue
        try:
            profile = load_profile(path, cache=False)
        except ProfileError as err:
            for problem in err.problems:
                print(paint(str(problem), ERROR, color), file=sys.stderr)
            status = EXIT_USAGE
            continue
        status = max(status, _report_profile(path, profile, color=color, source=path))
    containment = CONTAINMENT.status()
    if not containment.available:
        print(paint(f"note: {containment.describe()}", WARNING, color), file=sys.stderr)
    return status


def _report_profile(label: str, profile: Profile, *, color: bool, indent: str = "", source: str | None = None) -> int:
    """Print what `check` says of a profile that loads (its warnings; `ok` and how it is confined, or the limits
    this machine cannot hold); returns the exit status it earns. `source`: the profile's file."""
    from ..confinement.limits import LIMIT_GROUPS, ResourceLimits

    for warning in (
        *(_own_file_warnings(source, profile) if source is not None else ()),
        *_environment_warnings(profile),
        *_attachment_warnings(profile),
        *_unset_variable_warnings(profile),
        *_ignored_env_warnings(profile),
        *_option_injection_warnings(profile),
        *_protocol_warnings(profile),
        *_sandbox_warnings(profile),
        *_codex_helper_warnings(profile),
    ):
        print(paint(f"{label}: warning: {warning}", WARNING, color), file=sys.stderr)
    limits = ResourceLimits.of(profile.limits)
    described = LIMIT_GROUPS.describe(limits) if limits is not None else []
    if not all(holds for _, holds in described):
        for line, holds in described:
            if not holds:
                print(paint(f"{label}: error: {line}", ERROR, color), file=sys.stderr)
        return EXIT_USAGE
    print(f"{indent}{label}: ok")
    for line in _confinement_lines(profile):
        print(f"{indent}  {line}")
    for line, _ in described:
        print(f"{indent}  {line}")
    return 0


def _confinement_lines(profile: Profile) -> list[str]:
    """What the agent will be confined to, one line each, for the operator to read: its sandbox (binds, network)."""
    from ..engine.launch import effective_sandbox, plan_launch
    from ..errors import LaunchError

    if profile.sandbox is None:
        return []
    try:
        sandbox = effective_sandbox(profile, os.environ, plan_launch(profile, Turn("hello"), os.environ).cwd)
    except LaunchError as err:
        return [f"sandbox: cannot start here: {err.message}"]
    return sandbox.describe() if sandbox is not None else []


def _own_file_warnings(source: str, profile: Profile) -> list[str]:
    """A sandboxed agent that may write the directory of its profile's file (its working directory or a `write`
    path): its own file is bound read-only, but it can add profiles there, or rewrite the others."""
    from ..confinement.sandbox import within
    from ..engine.launch import effective_sandbox, plan_launch
    from ..errors import LaunchError

    if profile.sandbox is None:
        return []
    try:
        sandbox = effective_sandbox(profile, os.environ, plan_launch(profile, Turn("hello"), os.environ).cwd)
    except LaunchError:
        return []
    if sandbox is None:
        return []
    directory = os.path.dirname(os.path.realpath(source))
    holders = [path for path in reversed(sandbox.writable) if within(directory, path)]  # the working directory first
    if not holders or any(within(directory, guarded) for guarded in sandbox.guarded):
        return []
    return [
        f"the sandboxed agent may write this profile's directory ({holders[0]} is writable in its sandbox): its own "
        "file is bound read-only for it, but it could add a profile there, or rewrite another, which would run "
        "without its sandbox if `serve --profiles` serves this directory; keep profiles outside the agent's "
        "working directory and `write` paths (or in a directory below its working directory, which is bound "
        "read-only)"
    ]


def _sandbox_warnings(profile: Profile) -> list[str]:
    """A sandbox that leaves the agent the network leaves it this machine's loopback services too."""
    if profile.sandbox is None or not profile.sandbox.network:
        return []
    return [
        "sandbox with network: true — the agent reaches this machine's services on loopback too: an "
        "`agent-bridge serve --listen` without tokens there runs any of its profiles, unsandboxed ones included, "
        "for the agent; set `network: false` in its sandbox unless it needs the network (a coding agent calling "
        "its model's API does: then give every door on this machine tokens)"
    ]


def _codex_helper_warnings(profile: Profile) -> list[str]:
    """Codex makes the helper its own command sandbox runs (codex-linux-sandbox) under its home, and makes none when
    that home is inside the temporary directory: then every sandboxed command fails, inside a turn that ends ok."""
    from ..engine.launch import plan_launch
    from ..errors import LaunchError

    program = os.path.basename(profile.argv_template[0])
    if not program.startswith("codex") or profile.protocol_settings.get("sandbox") == "danger-full-access":
        return []
    try:
        env = plan_launch(profile, Turn("hello"), os.environ).env
    except LaunchError:
        return []
    codex_home = env.get("CODEX_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".codex")
    temporary = env.get("TMPDIR") or "/tmp"
    home_path, temporary_path = os.path.realpath(codex_home), os.path.realpath(temporary)
    if os.path.commonpath([home_path, temporary_path]) != temporary_path:
        return []
    return [
        f"codex's home {codex_home} is inside the temporary directory {temporary}: codex then makes no "
        "codex-linux-sandbox helper, and every command it runs in its own sandbox fails (bwrap: execvp "
        "codex-linux-sandbox: No such file or directory) inside a turn that ends ok; give it a CODEX_HOME (or "
        "HOME) outside it, or another TMPDIR, in `env`"
    ]


def _protocol_warnings(profile: Profile) -> list[str]:
    """What the profile's protocol cannot work without on its command line, and an `on_busy` it cannot honour."""
    dialect = profile.dialect
    warnings = list(dialect.argv_problems(profile.argv_template)) if hasattr(dialect, "argv_problems") else []
    if profile.on_busy == "steer" and not getattr(dialect, "can_steer", False):
        warnings.append(
            f"on_busy: steer — protocol {profile.protocol} cannot give a running turn another message, so a "
            "message that comes while its conversation's turn runs is queued (as on_busy: queue)"
        )
    return warnings


def _attachment_warnings(profile: Profile) -> list[str]:
    """An `attachments` section whose settings nothing uses: the protocol passes URLs through (agentproc-0.1's
    default), so a profile written for fetched files (limits, allow_hosts, keep) gets URLs instead."""
    from ..dialects import PROTOCOLS

    section = profile.attachments
    if section is None or section.fetch is not None or PROTOCOLS[profile.protocol].fetches_attachments:
        return []
    return [
        f"attachments: protocol {profile.protocol} hands the agent attachment URLs as sent and fetches nothing, "
        "so this section's allow_hosts and limits hardly apply; add `fetch: true` to it if the agent reads files "
        "(AGENT_IMAGE_PATH, AGENT_FILE_PATH, `path` in AGENT_ATTACHMENTS), or `fetch: false` if it takes the URLs"
    ]


def _option_injection_warnings(profile: Profile) -> list[str]:
    """A new session's argv, then what a resumed session's argv adds (its `resume_args`)."""
    from ..profile.argv_rules import option_injection_warnings

    words = len(profile.argv_template) - len(profile.new_session_args) - len(profile.args)
    resume_args = range(words, words + len(profile.resume_args))
    return [
        *option_injection_warnings(profile.argv_template),
        *(
            f"in a resumed session: {warning}"
            for warning in option_injection_warnings(profile.resume_argv_template, only=resume_args)
        ),
    ]


def _unset_variable_warnings(profile: Profile) -> tuple[str, ...]:
    """What `run` would warn about the environment it runs in: a `${VAR}` in `env` that is unset (or not allowed)."""
    from ..engine.launch import plan_launch
    from ..errors import LaunchError

    try:
        return plan_launch(profile, Turn("hello"), os.environ).notes
    except LaunchError:
        return ()  # an environment variable over the OS's limit: run says so


def _ignored_env_warnings(profile: Profile) -> list[str]:
    """`env` entries the bridge overrides: the protocol's AGENT_* variables always describe the turn."""
    from ..engine.launch import PROTOCOL_VARIABLES

    return [
        f"env.{name} is ignored: the bridge sets {name} for every turn (the protocol's AGENT_* variables "
        "always describe the turn); give your variable another name"
        for name in profile.env
        if name in PROTOCOL_VARIABLES
    ]


def _environment_warnings(profile: Profile) -> list[str]:
    """What would stop this profile from starting on this machine (not errors: it may run elsewhere)."""
    program = profile.argv_template[0].replace("{{PROFILE_DIR}}", profile.profile_dir)
    if "{{" in program:
        return []
    warnings = []
    cwd = None
    if profile.cwd is not None and "{{" not in profile.cwd.replace("{{PROFILE_DIR}}", ""):
        cwd = os.path.join(
            profile.profile_dir, os.path.expanduser(profile.cwd.replace("{{PROFILE_DIR}}", profile.profile_dir))
        )
        if not os.path.isdir(cwd):
            warnings.append(f"cwd {cwd} does not exist")
    if "/" in program:
        path = os.path.join(cwd or os.getcwd(), program)
        if not os.path.isfile(path):
            relative = "" if os.path.isabs(program) else f" (relative to {cwd or 'the directory the bridge runs in'})"
            hint = (
                f'; for a file next to the profile, write "{{{{PROFILE_DIR}}}}/{program.removeprefix("./")}"'
                if relative
                else ""
            )
            warnings.append(f"command {program} does not exist{relative}{hint}")
        elif not os.access(path, os.X_OK):
            warnings.append(f"command {program} is not executable")
    elif shutil.which(program) is None:
        warnings.append(f"command {program!r} is not on PATH")
    return warnings
