"""The `agent-bridge` command (docs/protocol.md §8).

Exit codes: a turn's own exit code for `run`; 2 for a bad profile or bad
arguments, with a message that says what to fix. `--help` of the turn
commands ends with examples and their exit codes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, cast

import trio

from ..dialects import session_id_problem
from ..dialects.events import QuestionRequest
from ..engine.result import TurnResult
from ..engine.run import TurnStream, open_turn
from ..errors import BridgeError, ProfileError
from ..log import LEVELS, configure_logging, get_logger, wants_color
from ..permissions import PermissionRequest
from ..profile import Profile, json_schema, load_profile
from ..turn import Attachment, Turn
from ..version import __version__
from .printer import ERROR, WARNING, HumanPrinter, JsonPrinter, paint
from .terminal import LineReader, ask, ask_question

if TYPE_CHECKING:
    from ..host.file_turnlock import Place
    from .sessions import Conversation

EXIT_USAGE = 2


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
        return int(args.handler(args))
    except BridgeError as err:
        print(f"agent-bridge: {paint(str(err), ERROR, wants_color(sys.stderr))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except _Stopped as stopped:
        return stopped.code
    except BrokenPipeError:
        # Whoever read stdout went away (`agent-bridge run … | head`): end quietly, as
        # in a pipeline; the turn was cancelled and its agent stopped on the way out.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


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


class _Parser(argparse.ArgumentParser):
    """argparse, with its error in colour on a terminal."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: {paint('error:', ERROR, wants_color(sys.stderr))} {message}\n")


COMMANDS = ("run", "chat", "init", "sessions", "check", "schema", "serve", "connect", "worker", "acp", "mcp")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; given a `command`, with that command's parser only (see `main`)."""
    parser = _Parser(
        prog="agent-bridge",
        description="Run any agent executable from a YAML profile, one process per message.",
    )
    _add_log_options(parser, level="warning", log_format="auto")
    # Each command takes them too, without defaults: `agent-bridge --log-level info run …` stands
    # unless `run --log-level …` comes later. (Options of a `parents=` parser are shared objects, so the
    # two sets must be separate: a default set on one would be every command's, overwriting the first.)
    common = _Parser(add_help=False)
    _add_log_options(common, level=argparse.SUPPRESS, log_format=argparse.SUPPRESS)
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
            type=_session_id,
            help="resume this session (default: a new session, or the stored one with --conversation)",
        )
        run.add_argument("--session-name", default="default", help="the session's name (default: default)")
        run.add_argument("--from-user", default="", help="who sent the message")
        run.add_argument(
            "--attach",
            metavar="PATH_OR_URL",
            action="append",
            default=[],
            type=_attachment,
            help="a file for the agent: a local path, an https/http URL or a data: URI, fetched before the agent "
            "starts (an agentproc-0.1 agent gets URLs as given, unless its profile says attachments: {fetch: true}); "
            "its type comes from its name, or write TYPE=URL (image, file, audio, video); repeatable",
        )
        run.add_argument(
            "--timeout", metavar="SECS", type=_seconds(zero_ok=False), help="override the profile's timeout_secs"
        )
        run.add_argument("--no-stream", action="store_true", help="ignore partials (AGENT_STREAMING=0)")
        run.add_argument("--json", action="store_true", help="print NDJSON events on stdout, the result last")
        run.add_argument(
            "--show-stderr",
            action="store_true",
            help="show the agent's stderr as it writes it (by default only its last lines, under a "
            "failed turn's error)",
        )
        _add_conversation_options(run)
        run.set_defaults(handler=_run_command, command_parser=run)

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
            "--session-id", type=_session_id, help="resume this session (default: a new one, or the stored one)"
        )
        chat.add_argument("--session-name", default="default", help="the session's name (default: default)")
        chat.add_argument("--from-user", default="", help="who sends the messages")
        chat.add_argument(
            "--timeout", metavar="SECS", type=_seconds(zero_ok=False), help="override the profile's timeout_secs"
        )
        chat.add_argument("--no-stream", action="store_true", help="ignore partials (AGENT_STREAMING=0)")
        _add_conversation_options(chat)
        chat.set_defaults(handler=_chat_command, command_parser=chat)

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
        init.set_defaults(handler=_init_command, command_parser=init)

    if command in (None, "sessions"):
        sessions = commands.add_parser(
            "sessions",
            parents=[common],
            help="inspect and reset stored sessions",
            description="The session store: what --conversation remembers between runs.",
        )
        actions = sessions.add_subparsers(dest="action", required=True, metavar="ACTION")
        state = _Parser(add_help=False)
        state.add_argument("--state", metavar="PATH", help=_STATE_HELP)
        state.add_argument("--namespace", metavar="NAME", help=_NAMESPACE_HELP)
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
        sessions.set_defaults(handler=_sessions_command)

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
        check.set_defaults(handler=_check_command, command_parser=check)

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
        schema.set_defaults(handler=_schema_command, command_parser=schema)

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
        serve.add_argument("--state", metavar="PATH", help=_STATE_HELP)
        serve.add_argument("--namespace", metavar="NAME", help=_NAMESPACE_HELP + "; with --postgres it is --name")
        # Defaults live in bridge.host (not imported here: other commands must not pay for it).
        serve.add_argument(
            "--max-concurrent", metavar="N", type=_count(1), help="turns that may run at once (default: 32)"
        )
        serve.add_argument(
            "--max-queued",
            metavar="N",
            type=_count(0),
            help="turns that may wait for a slot; more are refused with queue_full (default: 256)",
        )
        serve.add_argument(
            "--shutdown-grace",
            metavar="SECS",
            type=_seconds(zero_ok=True),
            help="on shutdown, how long turns in flight may finish before they are cancelled (default: 10)",
        )
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
            type=_seconds(zero_ok=False),
            help="how long a file an agent left waits for the bot's ack_file before it is deleted (default: 600)",
        )
        _add_attachment_hosts_option(serve)
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
            type=_count(1),
            help="WebSocket connections and turn streams open at once; more are refused (default: 2048)",
        )
        door.add_argument(
            "--max-turns-per-connection",
            metavar="N",
            type=_count(1),
            help="turns one WebSocket connection may have in flight (default: 32)",
        )
        door.add_argument(
            "--send-timeout",
            metavar="SECS",
            type=_seconds(zero_ok=False),
            help="a client that takes no response for this long is dropped and its turns cancelled (default: 30)",
        )
        door.add_argument(
            "--body-timeout",
            metavar="SECS",
            type=_seconds(zero_ok=False),
            help="a request's body must come whole within this long of its headers, else 408 and the connection "
            "is closed (default: 30)",
        )
        serve.set_defaults(handler=_serve_command, command_parser=serve)

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
        connect.add_argument("--state", metavar="PATH", help=_STATE_HELP + "; the chat store is PATH.chat beside it")
        connect.add_argument(
            "--postgres",
            metavar="DSN",
            help="run the turns on the fleet's workers, through a gateway on this PostgreSQL database",
        )
        connect.add_argument(
            "--name", metavar="NAME", default="connect", help="with --postgres: the gateway's name (default: connect)"
        )
        connect.add_argument(
            "--shutdown-grace",
            metavar="SECS",
            type=_seconds(zero_ok=True),
            help="on shutdown, how long turns in flight may finish before they are cancelled (default: 10)",
        )
        connect.add_argument(
            "--metrics",
            metavar="HOST:PORT",
            help="serve /metrics (the bots' and the host's), /healthz and /readyz here, as worker --metrics does",
        )
        connect.add_argument("--metrics-tokens", metavar="FILE", help="as for worker: /metrics then needs a token")
        connect.set_defaults(handler=_connect_command, command_parser=connect)

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
            type=_count(1),
            default=32,
            help="turns this worker runs at once (default: 32)",
        )
        worker.add_argument(
            "--lease-secs",
            metavar="SECS",
            type=_seconds(zero_ok=False),
            default=10.0,
            help="a turn's lease: renewed every third of it; a worker silent this long (plus the "
            "agent's kill grace) is taken for lost and its turns go to others (default: 10)",
        )
        worker.add_argument(
            "--shutdown-grace",
            metavar="SECS",
            type=_seconds(zero_ok=True),
            default=10.0,
            help="on SIGTERM, how long turns in flight may finish before they go back to the queue (default: 10)",
        )
        worker.add_argument(
            "--name", metavar="NAME", help="this worker's id in stats and logs (default: host:pid:random)"
        )
        worker.add_argument(
            "--profile-wait-secs",
            metavar="SECS",
            type=_seconds(zero_ok=True),
            default=30.0,
            help="how long a queued turn waits while no live worker has its profile as it was "
            "queued (that name, the same file); then it ends with unknown_profile or "
            "profile_mismatch (default: 30)",
        )
        _add_attachment_hosts_option(worker)
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
        worker.set_defaults(handler=_worker_command, command_parser=worker)

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
        acp.add_argument("--state", metavar="PATH", help=_STATE_HELP)
        acp.add_argument("--namespace", metavar="NAME", help=_NAMESPACE_HELP)
        acp.add_argument(
            "--postgres", metavar="DSN", help="run the prompts on the fleet's workers, as serve --postgres"
        )
        acp.add_argument(
            "--name", metavar="NAME", default="acp", help="with --postgres: the gateway's name (default: acp)"
        )
        acp.set_defaults(handler=_acp_command, command_parser=acp)
    if command in (None, "mcp"):
        from .mcp import add_mcp_parser

        add_mcp_parser(commands, common, _STATE_HELP)
    return parser


def _add_log_options(parser: argparse.ArgumentParser, *, level: str, log_format: str) -> None:
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        default=level,
        help="least severe log record to print on stderr (default: warning)",
    )
    parser.add_argument(
        "--log-format",
        choices=("auto", "console", "json"),
        default=log_format,
        help="console for people, json for machines; auto picks by whether stderr is a terminal",
    )


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


def _session_id(text: str) -> str:
    if text and (problem := session_id_problem(text)) is not None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a session id: {problem}; a session id is what the agent printed after "
            "AGENT_SESSION: — up to 512 characters, without whitespace or control characters"
        )
    return text


def _attachment(spec: str) -> Attachment:
    try:
        return Attachment.parse(spec)
    except BridgeError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _seconds(*, zero_ok: bool) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if zero_ok and not 0 <= value < float("inf"):
            raise argparse.ArgumentTypeError("must be 0 or more")
        if not zero_ok and not value > 0:
            raise argparse.ArgumentTypeError("must be greater than 0")
        return value

    return parse


_STATE_HELP = (
    "session store: a file (default: $XDG_STATE_HOME/agent-bridge/sessions.sqlite3), or a PostgreSQL "
    "database as postgresql://USER@HOST/DB (needs agent-bridge[postgres]; in a checkout: make install EXTRAS=postgres)"
)
_NAMESPACE_HELP = (
    "with a PostgreSQL --state: the bot whose sessions these are; bots sharing a database need a "
    "namespace each (default: serve, as the default gateway name)"
)


def _add_conversation_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--conversation",
        metavar="KEY",
        help="keep the session in the store under this key: resumed next time, with this profile",
    )
    parser.add_argument("--new", action="store_true", help="with --conversation: forget the stored session first")
    parser.add_argument("--state", metavar="PATH", help=_STATE_HELP)
    parser.add_argument("--namespace", metavar="NAME", help=_NAMESPACE_HELP)


# --------------------------------------------------------------------------- run


def _run_command(args: argparse.Namespace) -> int:
    profile = _load_for_turns(args)
    turn = Turn(
        message=_read_message(args.message),
        session_id=args.session_id or "",
        session_name=args.session_name,
        from_user=args.from_user,
        attachments=tuple(args.attach),
    )
    conversation = _open_conversation(args, profile)
    if conversation is None:
        return _run_now(args, profile, turn).exit_code
    place = None
    try:
        with _signals_end_the_command():  # no agent runs yet: Ctrl-C or SIGTERM simply ends the command
            place = conversation.join(args.early_place)
            if not place.try_wait():
                get_logger(profile=profile.label, conversation=conversation.key).info(
                    "turn waits for an earlier turn of its conversation"
                )
                place.wait()
        # Only now, with the turn before it over: what it stored is what this turn resumes (or forgets).
        if args.new:
            conversation.forget()
        if args.session_id is None:
            turn = turn.replace(session_id=conversation.session_id)
        result = _run_now(args, profile, turn)
        conversation.record(result)
        return result.exit_code
    finally:
        if place is not None:
            place.release()
        conversation.close()


def _run_now(args: argparse.Namespace, profile: Profile, turn: Turn) -> TurnResult:
    from ..confinement.orphans import become_subreaper

    become_subreaper()  # this process is ours: killed grandchildren get reaped here
    # The interpreter's own stdout, a TextIOWrapper; sys's stub types it as the TextIO protocol.
    cast(io.TextIOWrapper, sys.stdout).reconfigure(errors="replace")
    printer: HumanPrinter | JsonPrinter
    if args.json:
        printer = JsonPrinter(sys.stdout, sys.stderr)
    else:
        # The elapsed time only where a person watches both streams: piped or redirected, nothing extra.
        status = sys.stdout.isatty() and sys.stderr.isatty()
        printer = HumanPrinter(sys.stdout, sys.stderr, profile, status=status)
    return trio.run(_run_turn, profile, turn, printer, args.show_stderr)


class _Stopped(BaseException):
    """A signal ended the command before any agent ran; `code` is its exit code (128 + N)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def _signals_end_the_command() -> Iterator[None]:
    def stop(signum: int, frame: object) -> None:
        raise _Stopped(128 + signum)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _load_for_turns(args: argparse.Namespace) -> Profile:
    """The profile with the command line's --timeout and --no-stream applied."""
    profile = load_profile(args.profile)
    overrides: dict[str, Any] = {}
    if args.timeout is not None:
        overrides["timeout_secs"] = args.timeout
    if args.no_stream:
        overrides["streaming"] = False
    return profile.replace(**overrides) if overrides else profile


def _open_conversation(args: argparse.Namespace, profile: Profile) -> Conversation | None:
    """The stored session of --conversation KEY, if given (only then is the store, SQLite or psycopg, loaded)."""
    if args.conversation is None:
        if args.new:
            raise BridgeError("--new needs --conversation KEY (without one, every run starts a new session)")
        return None
    from .sessions import Conversation

    return Conversation(args.state, profile.label, args.conversation, args.session_name, namespace=args.namespace)


def _chat_command(args: argparse.Namespace) -> int:
    from .chat import run_chat

    profile = _load_for_turns(args)
    conversation = _open_conversation(args, profile)
    session_id = args.session_id
    if args.new and conversation is not None:
        conversation.forget()
        if session_id is None:
            session_id = ""  # the first turn starts afresh, whatever another process stores meanwhile
    return run_chat(
        profile, conversation, session_id=session_id, session_name=args.session_name, from_user=args.from_user
    )


def _sessions_command(args: argparse.Namespace) -> int:
    from .sessions import sessions_command

    return sessions_command(args)


def _read_message(message: str | None) -> str:
    if message is not None and message != "-":
        return message
    if message is None and sys.stdin.isatty():
        raise BridgeError("no message: pass MESSAGE as an argument, or pipe it on stdin")
    return sys.stdin.buffer.read().decode("utf-8", "replace").rstrip("\r\n")


async def _run_turn(
    profile: Profile, turn: Turn, printer: HumanPrinter | JsonPrinter, show_stderr: bool = False
) -> TurnResult:
    on_stderr = printer.agent_stderr if show_stderr else None
    # The person at the terminal answers the agent's questions; with no terminal on stdin, nobody can.
    reader = LineReader(0) if isinstance(printer, HumanPrinter) and sys.stdin.isatty() else None
    async with open_turn(profile, turn, on_stderr=on_stderr) as stream, printer.live(), trio.open_nursery() as nursery:
        nursery.start_soon(_cancel_on_signals, stream, printer)
        async for event in stream:
            if type(event) is PermissionRequest or type(event) is QuestionRequest:
                if isinstance(printer, JsonPrinter):
                    printer.show(event)
                if isinstance(event, PermissionRequest):
                    await ask(event, stream, printer, reader)
                else:
                    await ask_question(event, stream, printer, reader)
            else:
                printer.show(event)
        nursery.cancel_scope.cancel()
    return stream.result


async def _cancel_on_signals(stream: TurnStream, printer: HumanPrinter | JsonPrinter) -> None:
    """Ctrl-C (or SIGTERM) stops the agent as a host cancel (SIGINT, `kill_grace_secs`, SIGKILL); a second one
    kills it at once. Either way the turn ends with its result (130)."""
    from ..confinement.process import kill_agents_now

    person = printer if isinstance(printer, HumanPrinter) else None  # --json: a program, told by the log
    interrupted = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if not interrupted:
                interrupted = True
                stream.cancel()
                if person is not None:
                    person.notice("agent-bridge: stopping the agent; press Ctrl-C again to kill it at once")
            else:
                kill_agents_now()
                if person is not None:
                    person.notice("agent-bridge: interrupted again: the agent was killed at once (SIGKILL)")
                else:
                    get_logger().warning("interrupted again: the agent was killed at once (SIGKILL)")


# --------------------------------------------------------------------------- check, schema


def _check_command(args: argparse.Namespace) -> int:
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
        status = max(status, _report_profile(path, profile, color=color))
    containment = CONTAINMENT.status()
    if not containment.available:
        print(paint(f"note: {containment.describe()}", WARNING, color), file=sys.stderr)
    return status


def _report_profile(label: str, profile: Profile, *, color: bool, indent: str = "") -> int:
    """Print what `check` says of a profile that loads (its warnings; `ok` and how it is confined, or the limits
    this machine cannot hold); returns the exit status it earns."""
    from ..confinement.limits import LIMIT_GROUPS, ResourceLimits

    for warning in (
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


def _init_command(args: argparse.Namespace) -> int:
    import shlex

    from .starter import write_starter

    written = write_starter(args.name, lang=args.lang, directory=args.dir)
    for path in written:
        print(f"wrote {path}")
    profile = written[-1]
    print(
        f'next: agent-bridge run {shlex.quote(str(profile))} "hello"   (or: agent-bridge chat '
        f"{shlex.quote(str(profile))})"
    )
    return 0


def _add_attachment_hosts_option(parser: argparse.ArgumentParser) -> None:
    """The host's exceptions to the attachments' address rule (serve, worker)."""
    parser.add_argument(
        "--allow-attachment-host",
        metavar="HOST_OR_CIDR",
        action="append",
        default=[],
        dest="attachment_hosts",
        help="a host name, address or CIDR network (127.0.0.1, 10.0.0.0/8, files.internal) turns' attachments "
        "may be fetched from although it is not public; repeatable; on top of each profile's "
        "attachments.allow_hosts (default: only public addresses)",
    )


def _serve_command(args: argparse.Namespace) -> int:
    from .serve import run_serve  # lazily: the other commands never pay for the host runtime

    if args.profiles is None and args.postgres is None:
        args.command_parser.error("serve needs --profiles DIR (or --postgres DSN, to be a gateway to workers)")
    if args.postgres is not None and args.namespace is not None:
        args.command_parser.error("a gateway's namespace is its --name: use --name instead of --namespace")
    if args.postgres is not None and args.attachment_hosts:
        args.command_parser.error(
            "a gateway fetches no attachments, its workers do: give --allow-attachment-host to agent-bridge worker"
        )
    door_options = (
        "tokens",
        "certfile",
        "keyfile",
        "max_connections",
        "max_turns_per_connection",
        "send_timeout",
        "body_timeout",
    )
    if args.listen is None and (given := [name for name in door_options if getattr(args, name) is not None]):
        args.command_parser.error(f"--{given[0].replace('_', '-')} is an option of the network door: add --listen")
    limits = {
        name: value
        for name in ("max_concurrent", "max_queued", "shutdown_grace", "file_ttl")
        if (value := getattr(args, name)) is not None
    }
    if args.listen is not None:
        limits["door"] = {name: value for name in door_options if (value := getattr(args, name)) is not None} | {
            "listen": args.listen
        }
    return run_serve(
        args.profiles,
        state=args.state,
        postgres=args.postgres,
        name=args.name,
        namespace=args.namespace,
        session_ids=args.session_ids,
        attachment_hosts=tuple(args.attachment_hosts),
        **limits,
    )


def _connect_command(args: argparse.Namespace) -> int:
    from .connect import check_connect_options, run_connect  # lazily: only connect pays for the chat kit

    if problem := check_connect_options(args.profiles, args.postgres):
        args.command_parser.error(problem)
    options: dict[str, Any] = {"shutdown_grace": args.shutdown_grace} if args.shutdown_grace is not None else {}
    options.update(metrics=args.metrics, metrics_tokens=args.metrics_tokens)
    return run_connect(args.config, args.profiles, state=args.state, postgres=args.postgres, name=args.name, **options)


def _acp_command(args: argparse.Namespace) -> int:
    from .acp import run_acp  # lazily: only acp pays for the host runtime

    if args.postgres is not None and args.namespace is not None:
        args.command_parser.error("a gateway's namespace is its --name: use --name instead of --namespace")
    options = {"namespace": args.namespace} if args.postgres is None else {}
    return run_acp(
        args.profile, profiles=args.profiles, state=args.state, postgres=args.postgres, name=args.name, **options
    )


def _worker_command(args: argparse.Namespace) -> int:
    from ..host.postgres.worker import run_worker

    metrics: dict[str, Any] = {}
    if args.metrics is not None:
        from ..network.extra import require_http_extra

        require_http_extra("--metrics")  # before worker_metrics, which imports the extra's libraries
        from ..network.worker_metrics import worker_metrics

        door = worker_metrics(args.metrics, args.metrics_tokens)
        metrics = {"observer": door.metrics, "beside": door.serve}
    elif args.metrics_tokens is not None:
        args.command_parser.error("--metrics-tokens is an option of --metrics: add --metrics HOST:PORT")
    return run_worker(
        args.postgres,
        args.profiles,
        max_concurrent=args.max_concurrent,
        lease_secs=args.lease_secs,
        shutdown_grace=args.shutdown_grace,
        name=args.name,
        profile_wait_secs=args.profile_wait_secs,
        attachment_hosts=tuple(args.attachment_hosts),
        **metrics,
    )


def _schema_command(args: argparse.Namespace) -> int:
    if args.of == "chat":
        from ..chat.config import chat_json_schema

        print(json.dumps(chat_json_schema(), indent=2, ensure_ascii=False))
        return 0
    print(json.dumps(json_schema(), indent=2, ensure_ascii=False))
    return 0
