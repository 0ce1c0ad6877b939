"""`agent-bridge acp PROFILE`: one profile as an Agent Client Protocol agent on stdin/stdout, for an editor.

The host is serve's (`open_host`): the profile's directory with `--state`, or a gateway to the fleet's
workers with `--postgres` and `--name`. docs/editors.md is the user's page.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import trio

from ..dialects import DEFAULT_PROTOCOL, PROTOCOLS
from ..engine.run import ungrouped
from ..host.runtime import open_host
from ..log import get_logger
from ..profile import Profile, load_profile


def capabilities_of(profile: Profile | None) -> tuple[bool, bool]:
    """(`loadSession`, `promptCapabilities.image`) for `profile`; None (a gateway's, on its workers): both.

    A session loads where the agent can go on with its own: a warm protocol resumes it, a process per turn is
    handed it (the default protocol's `AGENT_SESSION_ID`, or the profile's `resume_args`). Images reach every
    profile: each takes attachments as the turn's files.
    """
    if profile is None:
        return True, True
    info = PROTOCOLS.get(profile.protocol)
    resumes = profile.protocol == DEFAULT_PROTOCOL or bool(profile.resume_args) or (info is not None and info.warm)
    return resumes, True


def resolve_profile(profile: str, profiles: str | None, postgres: str | None) -> tuple[str | None, str, Profile | None]:
    """(profiles directory, profile name, the profile when it is here) for the PROFILE argument: a YAML file,
    or a name in `--profiles DIR`, or, with `--postgres`, a name the workers know."""
    if postgres is not None:
        return None, profile, None
    if profiles is not None:
        from ..host.registry import ProfileRegistry

        return profiles, profile, ProfileRegistry(profiles).get(profile)
    path = Path(profile)
    loaded = load_profile(path)
    return str(path.resolve().parent), loaded.name or path.stem, loaded


def run_acp(
    profile: str,
    *,
    profiles: str | None = None,
    state: str | os.PathLike[str] | None = None,
    postgres: str | None = None,
    name: str = "acp",
    namespace: str | None = None,
) -> int:
    """`agent-bridge acp`: returns the exit code (0 when the editor closed stdin)."""
    from ..confinement.orphans import become_subreaper, log_containment
    from ..serving.acp import serve_acp_stdio
    from ..serving.acp_protocol import Capabilities

    directory, profile_name, loaded = resolve_profile(profile, profiles, postgres)
    load_session, images = capabilities_of(loaded)
    become_subreaper()
    log_containment(get_logger(component="acp"))

    async def main() -> int:
        host = open_host(directory, state=state, postgres=postgres, gateway_name=name, namespace=namespace)
        async with host:
            return await serve_acp_stdio(host, profile_name, Capabilities(load_session=load_session, images=images))

    with ungrouped():
        return trio.run(main)


def acp_command(args: argparse.Namespace) -> int:
    if args.postgres is not None and args.namespace is not None:
        args.command_parser.error("a gateway's namespace is its --name: use --name instead of --namespace")
    options = {"namespace": args.namespace} if args.postgres is None else {}
    return run_acp(
        args.profile, profiles=args.profiles, state=args.state, postgres=args.postgres, name=args.name, **options
    )
