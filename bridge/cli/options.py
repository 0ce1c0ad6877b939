"""What the commands' parsers share: option types, help texts, the parser class and the exit codes."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from ..dialects import session_id_problem
from ..errors import BridgeError
from ..log import LEVELS, wants_color
from ..turn import Attachment
from .printer import ERROR, paint

EXIT_USAGE = 2


class Parser(argparse.ArgumentParser):
    """argparse, with its error in colour on a terminal."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: {paint('error:', ERROR, wants_color(sys.stderr))} {message}\n")


class CommandStopped(BaseException):
    """A signal ended the command before any agent ran; `code` is its exit code (128 + N)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def add_log_options(parser: argparse.ArgumentParser, *, level: str, log_format: str) -> None:
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


def count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


def session_id(text: str) -> str:
    if text and (problem := session_id_problem(text)) is not None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a session id: {problem}; a session id is what the agent printed after "
            "AGENT_SESSION: — up to 512 characters, without whitespace or control characters"
        )
    return text


def attachment(spec: str) -> Attachment:
    try:
        return Attachment.parse(spec)
    except BridgeError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def seconds(*, zero_ok: bool, finite: str = "") -> Any:
    """A number of seconds: above 0 (or 0 too, `zero_ok`); where `finite` says why an endless one would defeat
    the option, `inf` is refused with it."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if zero_ok and not 0 <= value < float("inf"):
            raise argparse.ArgumentTypeError("must be 0 or more")
        if not zero_ok and not value > 0:
            raise argparse.ArgumentTypeError("must be greater than 0")
        if finite and value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be finite: {finite}")
        return value

    return parse


STATE_HELP = (
    "session store: a file (default: $XDG_STATE_HOME/agent-bridge/sessions.sqlite3), or a PostgreSQL "
    "database as postgresql://USER@HOST/DB (needs agent-bridge[postgres]; in a checkout: make install EXTRAS=postgres)"
)
NAMESPACE_HELP = (
    "with a PostgreSQL --state: the bot whose sessions these are; bots sharing a database need a "
    "namespace each (default: serve, as the default gateway name)"
)


def add_shutdown_grace_option(parser: argparse.ArgumentParser) -> None:
    """`--shutdown-grace`, for the commands that serve until a signal: serve, connect and mcp."""
    parser.add_argument(
        "--shutdown-grace",
        metavar="SECS",
        type=seconds(zero_ok=True),
        help="on shutdown, how long turns in flight may finish before they are cancelled (default: 10)",
    )


def add_conversation_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--conversation",
        metavar="KEY",
        help="keep the session in the store under this key: resumed next time, with this profile",
    )
    parser.add_argument("--new", action="store_true", help="with --conversation: forget the stored session first")
    parser.add_argument("--state", metavar="PATH", help=STATE_HELP)
    parser.add_argument("--namespace", metavar="NAME", help=NAMESPACE_HELP)


def add_attachment_hosts_option(parser: argparse.ArgumentParser) -> None:
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
