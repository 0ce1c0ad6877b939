"""`agent-bridge run`: one turn of an agent, its events printed as they come (docs/protocol.md §8)."""

from __future__ import annotations

import argparse
import contextlib
import io
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import trio

from ..dialects.events import QuestionRequest
from ..engine.result import TurnResult
from ..engine.run import TurnStream, open_turn
from ..errors import BridgeError
from ..log import get_logger
from ..permissions import PermissionRequest
from ..profile import Profile, load_profile
from ..turn import Turn
from .options import CommandStopped
from .printer import HumanPrinter, JsonPrinter
from .terminal import LineReader, ask, ask_question

if TYPE_CHECKING:
    from .sessions import Conversation


def run_command(args: argparse.Namespace) -> int:
    profile = load_for_turns(args)
    turn = Turn(
        message=_read_message(args.message),
        session_id=args.session_id or "",
        session_name=args.session_name,
        from_user=args.from_user,
        attachments=tuple(args.attach),
    )
    conversation = open_conversation(args, profile)
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


@contextlib.contextmanager
def _signals_end_the_command() -> Iterator[None]:
    def stop(signum: int, frame: object) -> None:
        raise CommandStopped(128 + signum)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def load_for_turns(args: argparse.Namespace) -> Profile:
    """The profile with the command line's --timeout and --no-stream applied."""
    profile = load_profile(args.profile)
    overrides: dict[str, Any] = {}
    if args.timeout is not None:
        overrides["timeout_secs"] = args.timeout
    if args.no_stream:
        overrides["streaming"] = False
    return profile.replace(**overrides) if overrides else profile


def open_conversation(args: argparse.Namespace, profile: Profile) -> Conversation | None:
    """The stored session of --conversation KEY, if given (only then is the store, SQLite or psycopg, loaded)."""
    if args.conversation is None:
        if args.new:
            raise BridgeError("--new needs --conversation KEY (without one, every run starts a new session)")
        return None
    from .sessions import Conversation

    return Conversation(args.state, profile.label, args.conversation, args.session_name, namespace=args.namespace)


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
