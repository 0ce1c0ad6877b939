"""`agent-bridge mcp`: every profile of a directory a tool for other agents, over MCP (docs/mcp.md)."""

from __future__ import annotations

import argparse
import os
from typing import Any

import trio

from ..errors import ListenError, ProfileError
from ..log import get_logger
from .options import add_shutdown_grace_option

MCP_EPILOG = """\
examples:
  agent-bridge mcp --profiles profiles/                          # MCP on stdin/stdout: every profile a tool
  agent-bridge mcp --profiles profiles/ --profile echo --state mcp.sqlite3
  agent-bridge mcp --profiles profiles/ --listen 127.0.0.1:8765  # Streamable HTTP at /mcp
  claude mcp add bridge -- agent-bridge mcp --profiles ~/agents   # Claude Code calls them

exit codes:
  0        the client closed stdin, or SIGTERM/SIGINT (--listen)
  2        bad arguments, a profile that does not load, the mcp extra not installed
"""

MCP_EXTRA_HINT = "pip install 'agent-bridge[mcp]' (in a checkout of agent-bridge: make install EXTRAS=mcp)"


def add_mcp_parser(commands: Any, common: argparse.ArgumentParser, state_help: str) -> None:
    mcp = commands.add_parser(
        "mcp",
        parents=[common],
        help="serve profiles as MCP tools (stdio, or Streamable HTTP with --listen)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=MCP_EPILOG,
        description="An MCP server: each profile is a tool taking a message (and optionally a conversation and\n"
        "attachments); the agent's reply is the result. Logs go to stderr; stdout carries only MCP.",
    )
    mcp.add_argument("--profiles", metavar="DIR", required=True, help="directory of profiles, as for serve")
    mcp.add_argument(
        "--profile", metavar="NAME", action="append", default=[], help="only this profile is a tool; repeatable"
    )
    mcp.add_argument("--state", metavar="PATH", help=state_help)
    mcp.add_argument("--postgres", metavar="DSN", help="run the calls on the fleet's workers, as serve --postgres")
    mcp.add_argument("--name", metavar="NAME", default="mcp", help="with --postgres: the gateway's name (default: mcp)")
    mcp.add_argument(
        "--elicit",
        action="store_true",
        help="ask the MCP client's user (elicitation) when the profile's permissions say ask, where the client "
        "can; without it such a request is denied (a tool call has nobody to ask)",
    )
    mcp.add_argument(
        "--listen", metavar="HOST:PORT", help="serve Streamable HTTP at /mcp here; without --tokens only loopback"
    )
    mcp.add_argument("--tokens", metavar="FILE", help="serve's tokens file: every request then needs a bearer token")
    add_shutdown_grace_option(mcp)
    mcp.set_defaults(command_parser=mcp)


def mcp_command(args: argparse.Namespace) -> int:
    if args.tokens is not None and args.listen is None:
        args.command_parser.error("--tokens is an option of the HTTP door: add --listen")
    if args.state is not None and args.postgres is not None:
        args.command_parser.error("with --postgres the workers keep the sessions: leave out --state")
    try:
        import mcp  # noqa: F401
    except ImportError as err:
        raise ListenError(f"agent-bridge mcp needs {err.name}, which is not installed: {MCP_EXTRA_HINT}") from None
    listening: dict[str, Any] = {}
    if args.listen is not None:
        from ..network.extra import require_http_extra
        from ..network.listen import check_listen, parse_address
        from ..network.tokens import load_tokens

        require_http_extra()
        address = parse_address(args.listen)
        tokens = load_tokens(args.tokens) if args.tokens else None
        check_listen(address, tokens)
        listening = {"address": address, "tokens": tokens}
    tools = _tools(args.profiles, args.profile)
    return run_mcp(
        tools,
        args.profiles,
        state=args.state,
        postgres=args.postgres,
        name=args.name,
        elicit=args.elicit,
        shutdown_grace=args.shutdown_grace,
        **listening,
    )


def _tools(directory: str, names: list[str]) -> dict[str, str | None]:
    """The tools' names and descriptions: the profiles `names` says, or every profile of `directory` that loads."""
    from ..host.registry import ProfileRegistry
    from ..serving.mcp_tools import tool_name_problem

    if not os.path.isdir(directory):
        raise ListenError(f"--profiles {directory!r} is not a directory")
    registry = ProfileRegistry(directory)
    tools: dict[str, str | None] = {}
    for name in names or registry.names():
        try:
            profile = registry.get(name)
        except ProfileError as err:
            if names:
                raise
            get_logger(component="mcp").warning("a profile does not load; it is no tool", profile=name, error=str(err))
            continue
        if problem := tool_name_problem(name):
            raise ListenError(f"profile {name!r} cannot be an MCP tool: {problem}")
        tools[name] = profile.description
    return tools


def run_mcp(
    tools: dict[str, str | None],
    profiles: str,
    *,
    state: str | None = None,
    postgres: str | None = None,
    name: str = "mcp",
    elicit: bool = False,
    address: Any = None,
    tokens: Any = None,
    shutdown_grace: float | None = None,
) -> int:
    """Serve `tools` over stdio (or at `address` over HTTP) on a host of `profiles`; returns the exit code.

    On SIGTERM or SIGINT the calls in flight get `shutdown_grace` seconds (default: the host's) to finish."""
    from ..confinement.orphans import become_subreaper, sweep_orphans_on_sigchld
    from ..engine.run import ungrouped
    from ..host.runtime import DEFAULT_SHUTDOWN_GRACE, open_host
    from ..serving.file_delivery import FileDeliveries
    from ..serving.mcp import McpDoor, run_stdio

    become_subreaper()

    async def main() -> int:
        host = open_host(
            profiles,
            state=state,
            postgres=postgres,
            gateway_name=name,
            shutdown_grace=DEFAULT_SHUTDOWN_GRACE if shutdown_grace is None else shutdown_grace,
        )
        async with host, trio.open_nursery() as nursery:
            await nursery.start(sweep_orphans_on_sigchld)
            files = FileDeliveries(nursery)
            try:
                if address is None:
                    await run_stdio(McpDoor(host, tools, files, local_paths=True, elicit=elicit))
                else:
                    from ..network.mcp import serve_mcp_http, tenant_lookup

                    door = McpDoor(
                        host, tools, files, local_paths=False, elicit=elicit, tenant_of=tenant_lookup(tokens)
                    )
                    await serve_mcp_http(door, address, tokens=tokens)
            finally:
                files.close()
            nursery.cancel_scope.cancel()
        return 0

    with ungrouped():
        return trio.run(main)
