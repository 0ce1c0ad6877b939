"""The `agent-bridge` command (docs/protocol.md §8): its parser, and the dispatch to each command's module.

Exit codes: a turn's own exit code for `run`; 2 for a bad profile or bad
arguments, with a message that says what to fix. `--help` of the turn
commands ends with examples and their exit codes.

A command's code lives in the cli module named for it (`run`, `chat`, `check`, `schema`, `init`, `sessions`,
`serve`, `connect`, `worker`, `acp`, `mcp`), imported only when that command runs: `run` pays for no other.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import TYPE_CHECKING

from ..errors import BridgeError
from ..log import configure_logging, wants_color
from ..version import __version__
from .options import (
    EXIT_USAGE,
    NAMESPACE_HELP,
    STATE_HELP,
    CommandStopped,
    Parser,
    add_attachment_hosts_option,
    add_conversation_options,
    add_log_options,
    add_shutdown_grace_option,
    attachment,
    count,
    seconds,
    session_id,
)
from .printer import ERROR, paint

if TYPE_CHECKING:
    from ..host.file_turnlock import Place

__all__ = ["COMMANDS", "EXIT_USAGE", "build_parser", "main"]


def main(argv: Sequence[str] | None = None, *, early_place: Place | None = None) -> int:
    """The `agent-bridge` command; `early_place`: the queue place `run` took before loading (`bridge.command`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # A command line that starts with its command is parsed by that command's parser alone, so the others
    # are not made: argparse looks up its gettext translations for every parser it makes, and all of them
    # cost a `run` ~15 M instructions, as much as the turn. Options before the command, --help, --version
    # or a mistyped command get the whole parser.
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    # argparse binds an optional positional (run's MESSAGE) as soon as it meets
    # the first one, so in `run PROFILE --json "hi"` the message is left over.
    if (len(extra) == 1 and getattr(args, "message", "") is None and not extra[0].startswith("-")) or extra == ["-"]:
        args.message = extra.pop()
    if extra:
        hint = ""
        if args.command == "run" and args.message is None and extra[0].startswith("-"):
            import shlex

            hint = (
                f"; a message that starts with '-' goes last, after --: agent-bridge run PROFILE [OPTIONS] -- "
                f"{shlex.join(extra)}"
            )
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    # A person reading `run` or `chat` sees the turn's error reply; a log record saying the same is
    # shown only at a higher verbosity (info, debug) or to a program (--json).
    hide_in_result = (
        args.command in ("run", "chat") and not getattr(args, "json", False) and args.log_level not in ("debug", "info")
    )
    configure_logging(args.log_level, args.log_format, hide_in_result=hide_in_result)
    args.early_place = early_place
    try:
        return int(_handler(args.command)(args))
    except BridgeError as err:
        print(f"agent-bridge: {paint(str(err), ERROR, wants_color(sys.stderr))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except CommandStopped as stopped:
        return stopped.code
    except BrokenPipeError:
        # Whoever read stdout went away (`agent-bridge run … | head`): end quietly, as
        # in a pipeline; the turn was cancelled and its agent stopped on the way out.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _handler(command: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs `command`: `<command>_command` of the cli module of that name."""
    module = import_module(f".{command}", __package__)
    handler: Callable[[argparse.Namespace], int] = getattr(module, f"{command}_command")
    return handler


RUN_EPILOG = """\
examples:
  agent-bridge run profiles/echo.yaml "hello"
  agent-bridge run profiles/stream.yaml --conversation dev "hello there"   # resumed next time
  printf 'shout this' | agent-bridge run profiles/upper.yaml               # the message from stdin
  agent-bridge run profiles/echo.yaml -- -la        # a message that starts with '-': after --

exit codes:
  0        the agent replied
  N        the agent's own exit code when it failed (the error reply is on stderr)
  124      timed out (timeout_secs, idle_timeout_secs or --timeout)
  130      cancelled (Ctrl-C or SIGTERM; a second Ctrl-C kills the agent at once)
  126, 127 the agent could not be started (127: the command was not found)
  2        a bad profile or bad arguments; the message says what to fix
"""

CHAT_EPILOG = """\
examples:
  agent-bridge chat profiles/stream.yaml
  agent-bridge chat profiles/stream.yaml --conversation dev   # continued by the next chat or run --conversation dev
  agent-bridge chat profiles/echo.yaml < script.txt          # one turn per line, no prompts

exit codes:
  0        left with /exit or Ctrl-D; with piped input, every turn succeeded
  N        piped input: the exit code of the last turn that failed
  129, 143 the terminal closed (SIGHUP), or SIGTERM
  2        a bad profile, bad arguments, or a session store that cannot be used
"""

SERVE_EPILOG = """\
examples:
  agent-bridge serve --profiles profiles/
  agent-bridge serve --profiles profiles/ --state bot.sqlite3 --max-concurrent 8
  echo '{"type": "turn", "id": 1, "profile": "echo", "conversation": "c", "message": "hi"}' \\
    | agent-bridge serve --profiles profiles/
  agent-bridge serve --postgres postgresql://bridge@db/bridge --name bot1   # a gateway to workers

exit codes:
  0        shut down (EOF on stdin, SIGTERM or SIGINT) once every accepted turn had its result
  1        whoever read stdout went away; the turns still running were cancelled
  2        bad arguments, or the profiles directory or the session store cannot be used
"""

CONNECT_EPILOG = """\
examples:
  agent-bridge connect bot.yaml --profiles profiles/ --state bot.sqlite3
  agent-bridge connect bot.yaml --postgres postgresql://bridge@db/bridge --name bot1   # turns on the workers

exit codes:
  0        shut down (SIGTERM or SIGINT) once the turns in flight were over
  2        bad arguments, a config that does not load, a bot another process serves, a refused token
"""

CHECK_EPILOG = """\
examples:
  agent-bridge check profiles/echo.yaml profiles/stream.yaml
  agent-bridge check bot.yaml --profiles profiles/      # a chat config and the profiles it names

exit codes:
  0        every file is valid (warnings, on stderr, do not change it)
  2        a file does not load, or a profile asks for limits this machine cannot hold
"""

WORKER_EPILOG = """\
examples:
  agent-bridge worker --postgres postgresql://bridge@db/bridge --profiles profiles/
  agent-bridge worker --postgres "$DSN" --profiles profiles/ --max-concurrent 8 --lease-secs 5

exit codes:
  0        drained after SIGTERM or SIGINT (turns still running went back to the queue)
  2        bad arguments, the profiles directory cannot be read, or PostgreSQL cannot be used
"""

INIT_EPILOG = """\
examples:
  agent-bridge init my-agent                 # my-agent.sh and my-agent.yaml here
  agent-bridge init helper --lang python --dir agents/
then:
  agent-bridge check my-agent.yaml
  agent-bridge run my-agent.yaml "hello"
"""


COMMANDS = ("run", "chat", "init", "sessions", "check", "schema", "serve", "connect", "worker", "acp", "mcp")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; given a `command`, with that command's parser only (see `main`)."""
    parser = Parser(
        prog="agent-bridge",
        description="Run any agent executable from a YAML profile, one process per message.",
    )
    add_log_options(parser, level="warning", log_format="auto")
    # Each command takes them too, without defaults: `agent-bridge --log-level info run …` stands
    # unless `run --log-level …` comes later. (Options of a `parents=` parser are shared objects, so the
    # two sets must be separate: a default set on one would be every command's, overwriting the first.)
    common = Parser(add_help=False)
    add_log_options(common, level=argparse.SUPPRESS, log_format=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"agent-bridge {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    explained = argparse.RawDescriptionHelpFormatter  # keeps the epilog's examples as they are written

    if command in (None, "run"):
        run = commands.add_parser(
            "run",
            parents=[common],
            help="run one turn of an agent",
            formatter_class=explained,
            epilog=RUN_EPILOG,
            description="Run one turn: MESSAGE from the argument, or from stdin when it is '-'\n"
            "or omitted and stdin is not a terminal. A message that starts with '-' goes\n"
            "after --: agent-bridge run PROFILE -- -la",
        )
        run.add_argument("profile", metavar="PROFILE", help="the profile's YAML file")
        run.add_argument(
            "message",
            metavar="MESSAGE",
            nargs="?",
            help="the user's message ('-': read stdin; one that starts with '-': put -- before it)",
        )
        run.add_argument(
            "--session-id",
            type=session_id,
            help="resume this session (default: a new session, or the stored one with --conversation)",
        )
        run.add_argument("--session-name", default="default", help="the session's name (default: default)")
        run.add_argument("--from-user", default="", help="who sent the message")
        run.add_argument(
            "--attach",
            metavar="PATH_OR_URL",
            action="append",
            default=[],
            type=attachment,
            help="a file for the agent: a local path, an https/http URL or a data: URI, fetched before the agent "
            "starts (an agentproc-0.1 agent gets URLs as given, unless its profile says attachments: {fetch: true}); "
            "its type comes from its name, or write TYPE=URL (image, file, audio, video); repeatable",
        )
        run.add_argument(
            "--timeout", metavar="SECS", type=seconds(zero_ok=False), help="override the profile's timeout_secs"
        )
        run.add_argument("--no-stream", action="store_true", help="ignore partials (AGENT_STREAMING=0)")
        run.add_argument("--json", action="store_true", help="print NDJSON events on stdout, the result last")
        run.add_argument(
            "--show-stderr",
            action="store_true",
            help="show the agent's stderr as it writes it (by default only its last lines, under a "
            "failed turn's error)",
        )
        add_conversation_options(run)
        run.set_defaults(command_parser=run)

    if command in (None, "chat"):
        chat = commands.add_parser(
            "chat",
            parents=[common],
            help="talk to an agent, one turn per line",
            formatter_class=explained,
            epilog=CHAT_EPILOG,
            description="An interactive session with an agent: one turn per line, the session\n"
            "kept across turns. /help lists the commands; Ctrl-C stops a running turn,\n"
            "Ctrl-D leaves.",
        )
        chat.add_argument("profile", metavar="PROFILE", help="the profile's YAML file")
        chat.add_argument(
            "--session-id", type=session_id, help="resume this session (default: a new one, or the stored one)"
        )
        chat.add_argument("--session-name", default="default", help="the session's name (default: default)")
        chat.add_argument("--from-user", default="", help="who sends the messages")
        chat.add_argument(
            "--timeout", metavar="SECS", type=seconds(zero_ok=False), help="override the profile's timeout_secs"
        )
        chat.add_argument("--no-stream", action="store_true", help="ignore partials (AGENT_STREAMING=0)")
        add_conversation_options(chat)
        chat.set_defaults(command_parser=chat)

    if command in (None, "init"):
        init = commands.add_parser(
            "init",
            parents=[common],
            help="write a starter agent and its profile",
            formatter_class=explained,
            epilog=INIT_EPILOG,
            description="Write NAME.sh (or NAME.py) — a commented agent that answers — and\n"
            "NAME.yaml, its profile. Existing files are never overwritten.",
        )
        init.add_argument("name", metavar="NAME", help="the agent's name: letters, digits, '.', '_' and '-'")
        init.add_argument(
            "--lang",
            choices=("sh", "python"),
            default="sh",
            help="write the agent as a shell script (default) or in Python",
        )
        init.add_argument("--dir", metavar="DIR", default=".", help="where to write the files (default: here)")
        init.set_defaults(command_parser=init)

    if command in (None, "sessions"):
        sessions = commands.add_parser(
            "sessions",
            parents=[common],
            help="inspect and reset stored sessions",
            description="The session store: what --conversation remembers between runs.",
        )
        actions = sessions.add_subparsers(dest="action", required=True, metavar="ACTION")
        state = Parser(add_help=False)
        state.add_argument("--state", metavar="PATH", help=STATE_HELP)
        state.add_argument("--namespace", metavar="NAME", help=NAMESPACE_HELP)
        listing = actions.add_parser("list", parents=[common, state], help="list stored sessions, latest first")
        listing.add_argument("--profile", metavar="NAME", help="only this profile's sessions")
        listing.add_argument("--json", action="store_true", help="one JSON object per line")
        listing.set_defaults(command_parser=listing)
        for action, text in (
            ("show", "show a conversation's stored sessions"),
            ("forget", "forget a conversation's sessions: its next turn starts afresh"),
        ):
            sub = actions.add_parser(action, parents=[common, state], help=text)
            sub.add_argument("profile", metavar="PROFILE", help="the profile's name (or its YAML file)")
            sub.add_argument("conversation", metavar="CONVERSATION", help="the conversation key")
            sub.add_argument("--session-name", help="only this session name (default: all of them)")
            if action == "show":
                sub.add_argument("--json", action="store_true", help="one JSON object per line")
            sub.set_defaults(command_parser=sub)

    if command in (None, "check"):
        check = commands.add_parser(
            "check",
            parents=[common],
            help="validate profiles and chat configs",
            description="Validate profiles, and chat configs (a file whose top-level keys name a platform:\n"
            "telegram:, matrix:); exit 0 if all are valid, else 2. With --profiles, a chat\n"
            "config's profiles must be in that directory and valid too.",
            formatter_class=explained,
            epilog=CHECK_EPILOG,
        )
        check.add_argument("profiles", metavar="FILE", nargs="+", help="a profile or a chat config (YAML)")
        check.add_argument(
            "--profiles",
            dest="profiles_dir",
            metavar="DIR",
            help="the directory `connect --profiles` will be given: every profile a chat config names must be "
            "there and valid",
        )
        check.set_defaults(command_parser=check)

    if command in (None, "schema"):
        schema = commands.add_parser(
            "schema", parents=[common], help="print the JSON Schema of a profile (or of a chat config), for editors"
        )
        schema.add_argument(
            "of",
            metavar="OF",
            nargs="?",
            choices=("profile", "chat"),
            default="profile",
            help="profile (the default), or chat: the config of `agent-bridge connect`",
        )
        schema.set_defaults(command_parser=schema)

    if command in (None, "serve"):
        serve = commands.add_parser(
            "serve",
            parents=[common],
            help="run turns for a bot over JSON Lines on stdin/stdout",
            formatter_class=explained,
            epilog=SERVE_EPILOG,
            description="The host runtime as a sidecar: one JSON request per line on stdin, one\n"
            "JSON response per line on stdout (see the README). EOF, SIGTERM or SIGINT\n"
            "shut down gracefully; a second signal cancels every turn at once.",
        )
        serve.add_argument(
            "--profiles",
            metavar="DIR",
            help="directory of profiles, each asked for by name (<name>.yaml); edits apply to new turns "
            "(required, but for a gateway: --postgres)",
        )
        serve.add_argument("--state", metavar="PATH", help=STATE_HELP)
        serve.add_argument("--namespace", metavar="NAME", help=NAMESPACE_HELP + "; with --postgres it is --name")
        # Defaults live in bridge.host (not imported here: other commands must not pay for it).
        serve.add_argument(
            "--max-concurrent", metavar="N", type=count(1), help="turns that may run at once (default: 32)"
        )
        serve.add_argument(
            "--max-queued",
            metavar="N",
            type=count(0),
            help="turns that may wait for a slot; more are refused with queue_full (default: 256)",
        )
        add_shutdown_grace_option(serve)
        serve.add_argument(
            "--postgres",
            metavar="DSN",
            help="be a gateway: queue turns in this PostgreSQL database for `agent-bridge worker`s "
            "(postgresql://user@host/db); results not yet delivered are sent again at start",
        )
        serve.add_argument(
            "--name",
            metavar="NAME",
            default="serve",
            help="with --postgres: this gateway's name, its bot's namespace (its turn ids and "
            "sessions are apart from other gateways'); one live gateway per name; the next serve of "
            "that name sends the results this one could not (default: serve)",
        )
        serve.add_argument(
            "--session-ids",
            choices=("stored", "any"),
            default="stored",
            help="stored: refuse a turn whose session_id is not its conversation's stored session "
            "(session_id_refused); any: resume whatever session a turn names (default: stored)",
        )
        serve.add_argument(
            "--file-ttl",
            metavar="SECS",
            type=seconds(zero_ok=False),
            help="how long a file an agent left waits for the bot's ack_file before it is deleted (default: 600)",
        )
        add_attachment_hosts_option(serve)
        door = serve.add_argument_group(
            "the network door", "serve over HTTP and WebSocket instead of stdin/stdout (docs/network.md)"
        )
        door.add_argument(
            "--listen",
            metavar="HOST:PORT",
            help="listen here for WebSocket (/v1/ws), HTTP (/v1/turns) and OpenAI-compatible clients; without "
            "--tokens only a loopback address (port 0: any free port, named in the log)",
        )
        door.add_argument(
            "--tokens",
            metavar="FILE",
            help="YAML mapping each bearer token to its name, profiles and conversation prefix; every endpoint "
            "but /healthz and /readyz then needs one",
        )
        door.add_argument("--certfile", metavar="PEM", help="serve TLS with this certificate chain (needs --keyfile)")
        door.add_argument("--keyfile", metavar="PEM", help="the certificate's private key")
        door.add_argument(
            "--max-connections",
            metavar="N",
            type=count(1),
            help="WebSocket connections and turn streams open at once; more are refused (default: 2048)",
        )
        door.add_argument(
            "--max-turns-per-connection",
            metavar="N",
            type=count(1),
            help="turns one WebSocket connection may have in flight (default: 32)",
        )
        door.add_argument(
            "--send-timeout",
            metavar="SECS",
            type=seconds(zero_ok=False),
            help="a client that takes no response for this long is dropped and its turns cancelled (default: 30)",
        )
        door.add_argument(
            "--body-timeout",
            metavar="SECS",
            type=seconds(zero_ok=False),
            help="a request's body must come whole within this long of its headers, else 408 and the connection "
            "is closed (default: 30)",
        )
        serve.set_defaults(command_parser=serve)

    if command in (None, "connect"):
        connect = commands.add_parser(
            "connect",
            parents=[common],
            help="answer in Telegram or Matrix: the chat platforms a config names, over one host",
            formatter_class=explained,
            epilog=CONNECT_EPILOG,
            description="Runs the bots CONFIG names (telegram:, matrix:; docs/chat.md) over one host. SIGTERM or\n"
            "SIGINT stop polling and let the turns in flight finish; a second signal cancels them.",
        )
        connect.add_argument("config", metavar="CONFIG", help="the chat config (YAML; docs/chat.md)")
        connect.add_argument("--profiles", metavar="DIR", help="directory of profiles, as for serve")
        connect.add_argument("--state", metavar="PATH", help=STATE_HELP + "; the chat store is PATH.chat beside it")
        connect.add_argument(
            "--postgres",
            metavar="DSN",
            help="run the turns on the fleet's workers, through a gateway on this PostgreSQL database",
        )
        connect.add_argument(
            "--name", metavar="NAME", default="connect", help="with --postgres: the gateway's name (default: connect)"
        )
        add_shutdown_grace_option(connect)
        connect.add_argument(
            "--metrics",
            metavar="HOST:PORT",
            help="serve /metrics (the bots' and the host's), /healthz and /readyz here, as worker --metrics does",
        )
        connect.add_argument("--metrics-tokens", metavar="FILE", help="as for worker: /metrics then needs a token")
        connect.set_defaults(command_parser=connect)

    if command in (None, "worker"):
        worker = commands.add_parser(
            "worker",
            parents=[common],
            help="run turns from a PostgreSQL queue (many workers, many machines)",
            formatter_class=explained,
            epilog=WORKER_EPILOG,
            description="Claims turns that `serve --postgres` gateways queued, runs them with the profiles in DIR,\n"
            "and writes their results back. SIGTERM or SIGINT drain: no new turns; those in flight finish\n"
            "within the shutdown grace, the rest go back to the queue in their place.",
        )
        worker.add_argument("--postgres", metavar="DSN", required=True, help="the queue's database (postgresql://…)")
        worker.add_argument("--profiles", metavar="DIR", required=True, help="directory of profiles, as for serve")
        worker.add_argument(
            "--max-concurrent",
            metavar="N",
            type=count(1),
            default=32,
            help="turns this worker runs at once (default: 32)",
        )
        worker.add_argument(
            "--lease-secs",
            metavar="SECS",
            type=seconds(zero_ok=False, finite="a worker whose lease never ends is never taken for lost"),
            default=10.0,
            help="a turn's lease: renewed every third of it; a worker silent this long (plus the "
            "agent's kill grace) is taken for lost and its turns go to others (default: 10)",
        )
        worker.add_argument(
            "--shutdown-grace",
            metavar="SECS",
            type=seconds(zero_ok=True),
            default=10.0,
            help="on SIGTERM, how long turns in flight may finish before they go back to the queue (default: 10)",
        )
        worker.add_argument(
            "--name", metavar="NAME", help="this worker's id in stats and logs (default: host:pid:random)"
        )
        worker.add_argument(
            "--profile-wait-secs",
            metavar="SECS",
            type=seconds(zero_ok=True),
            default=30.0,
            help="how long a queued turn waits while no live worker has its profile as it was "
            "queued (that name, the same file); then it ends with unknown_profile or "
            "profile_mismatch (default: 30)",
        )
        add_attachment_hosts_option(worker)
        worker.add_argument(
            "--metrics",
            metavar="HOST:PORT",
            help="serve this worker's /metrics (Prometheus), /healthz and /readyz here; without --metrics-tokens "
            "only a loopback address (port 0: any free port, named in the log; docs/metrics.md)",
        )
        worker.add_argument(
            "--metrics-tokens",
            metavar="FILE",
            help="serve's tokens file: /metrics then needs one of its bearer tokens, and --metrics may be any address",
        )
        worker.set_defaults(command_parser=worker)

    if command in (None, "acp"):
        acp = commands.add_parser(
            "acp",
            parents=[common],
            help="be an ACP agent for an editor (Zed, JetBrains, acpx) on stdin/stdout",
            description="Speaks the Agent Client Protocol on stdin/stdout; every prompt is a turn of PROFILE, every\n"
            "ACP session a conversation of the store (docs/editors.md). Logs go to stderr.",
            formatter_class=explained,
        )
        acp.add_argument(
            "profile", metavar="PROFILE", help="the profile's YAML file (a name with --profiles/--postgres)"
        )
        acp.add_argument("--profiles", metavar="DIR", help="take PROFILE by name from this directory of profiles")
        acp.add_argument("--state", metavar="PATH", help=STATE_HELP)
        acp.add_argument("--namespace", metavar="NAME", help=NAMESPACE_HELP)
        acp.add_argument(
            "--postgres", metavar="DSN", help="run the prompts on the fleet's workers, as serve --postgres"
        )
        acp.add_argument(
            "--name", metavar="NAME", default="acp", help="with --postgres: the gateway's name (default: acp)"
        )
        acp.set_defaults(command_parser=acp)
    if command in (None, "mcp"):
        from .mcp import add_mcp_parser

        add_mcp_parser(commands, common, STATE_HELP)
    return parser
