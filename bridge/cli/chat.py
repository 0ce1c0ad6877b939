"""`agent-bridge chat PROFILE`: talk to an agent in a terminal, one turn per line.

What the developer types goes to the agent as one turn per line; partials
print as they arrive, then the reply. The agent's words go to stdout;
everything else (prompt, spinner, notices, error replies) goes to stderr, as
with `agent-bridge run`. The session id each turn prints is sent with the
next turn; with `--conversation KEY` it is also kept in the session store, so
a restarted chat picks the conversation up again.

Lines are read from fd 0 by `terminal.LineReader` (no thread, nothing changed
on the terminal: see `bridge.cli.terminal`). When the profile's `permissions`
say ask, the question is put to the person at the prompt (`terminal.ask`).

A warm profile (ACP, aionrs, Ante) keeps one agent process for the chat: each
line is a turn on it; it is replaced by one that resumes the session when the
session changes (/new, another process moved the conversation on), and says
goodbye when the chat ends.

Signals. One trio signal receiver lives as long as the REPL. SIGINT while a
turn runs is a host cancel (`TurnStream.cancel()`: SIGINT to the agent, or
the warm protocol's cancel; grace; SIGKILL; the turn ends with exit 130 and
the REPL carries on); at the prompt it abandons the line. SIGTERM and SIGHUP
(the terminal went away) stop a running turn the same way and end the chat
with 128+N.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO, cast

import trio

from ..dialects import MAX_LINE_BYTES
from ..dialects.events import QuestionRequest
from ..engine.result import TurnResult
from ..engine.run import TurnStream, open_turn
from ..engine.warm_agents import WarmAgent, start_failure_result
from ..errors import BridgeError, WarmStartError
from ..log import get_logger, wants_color
from ..permissions import PermissionRequest
from ..profile import Profile
from ..turn import Attachment, Turn
from .printer import DIM, WARNING, HumanPrinter, paint
from .run import load_for_turns, open_conversation
from .terminal import LineReader, ask, ask_question

if TYPE_CHECKING:
    from ..host.file_turnlock import Place
    from ..host.postgres.advisory_turnlock import PgPlace
    from .sessions import Conversation

PROMPT = "you> "
HELP = """\
  /new       forget the session: the next message starts a new one
  /session   show the session id (and where it is stored)
  /attach X  attach a file (a local path or an https/http URL) to the next message
  /help      this list
  /exit      leave (so does Ctrl-D at an empty prompt)
Ctrl-C stops a running turn. To send a message that starts with /, type // instead."""


def run_chat(
    profile: Profile,
    conversation: Conversation | None,
    *,
    session_id: str | None = None,
    session_name: str = "default",
    from_user: str = "",
) -> int:
    """Run the REPL on this process's stdin/stdout/stderr until /exit, EOF or a signal; the exit code."""
    from ..confinement.orphans import become_subreaper

    become_subreaper()  # this process is ours: killed grandchildren get reaped here
    # The interpreter's own stdout, a TextIOWrapper; sys's stub types it as the TextIO protocol.
    cast(io.TextIOWrapper, sys.stdout).reconfigure(errors="replace")
    chat = Chat(profile, conversation, session_id=session_id, session_name=session_name, from_user=from_user)
    try:
        return trio.run(chat.run)
    finally:
        if conversation is not None:
            conversation.close()


class Chat:
    """The REPL's state: the profile, the current session, and what is running now."""

    def __init__(
        self,
        profile: Profile,
        conversation: Conversation | None,
        *,
        session_id: str | None = None,
        session_name: str = "default",
        from_user: str = "",
        stdin_fd: int = 0,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.profile = profile
        self.conversation = conversation
        # With a conversation, each turn resumes what the store holds once it is that turn's turn (another
        # process may have moved the conversation on), unless the session was chosen here: --session-id, /new.
        self._pinned = session_id is not None
        if session_id is None:
            session_id = conversation.session_id if conversation is not None else ""
        self.session_id = session_id
        self.session_name = session_name
        self.from_user = from_user
        self._attachments: list[Attachment] = []  # /attach: for the next message
        self.stdin_fd = stdin_fd
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.interactive = os.isatty(stdin_fd)
        self.spin = self.err.isatty()
        self.color = wants_color(self.err)
        self._failed_code = 0  # the exit code of the last turn that failed: piped input ends with it
        self._stream: TurnStream | None = None
        self._idle: trio.CancelScope | None = None  # waiting for a line, our place, an answer: a signal cancels it
        self._quit: int | None = None  # the exit code, once a signal asked us to leave
        self._reader = LineReader(stdin_fd)
        self._nursery: trio.Nursery | None = None
        self._warm: WarmAgent | None = None  # a warm profile's agent, kept for the chat
        self._stamp = ""  # the store's stamp of the conversation, read with its session id

    async def run(self) -> int:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._watch_signals)
            try:
                return await self._loop(self._reader)
            except OSError:
                if self._quit is None:
                    raise
                return self._quit  # SIGHUP: the terminal is gone, and writing to it fails
            finally:
                if self._warm is not None:
                    await self._warm.close()  # shielded: goodbye, grace, then its group is killed
                nursery.cancel_scope.cancel()

    async def _loop(self, reader: LineReader) -> int:
        if self.interactive:
            self._say(
                f"chatting with {self.profile.label}, {self._session_text()}. /help lists commands, Ctrl-D leaves."
            )
        while self._quit is None:
            if self.interactive:
                self._write_err(PROMPT)
            with trio.CancelScope() as scope:
                self._idle = scope
                line = await reader.readline()
            self._idle = None
            if scope.cancelled_caught:  # Ctrl-C: the terminal dropped the line; start a fresh one
                reader.discard()
                self._write_err("\n")
                continue
            if line is None:  # EOF: Ctrl-D, or the end of piped input
                if self.interactive:
                    self._write_err("\n")
                return self._end_code()
            if line[1]:
                self._say(f"not sent: the line is longer than {MAX_LINE_BYTES} bytes", WARNING)
                continue
            text = line[0].strip()
            if text.startswith("/") and not text.startswith("//"):
                if not self._command(text):
                    return self._end_code()
            elif text:
                await self._turn(text[1:] if text.startswith("//") else text)
        return self._quit

    def _end_code(self) -> int:
        """A person leaving ends well; a script of turns ends with the code of its last failed turn, if any."""
        return 0 if self.interactive else self._failed_code

    def _command(self, text: str) -> bool:
        """Handle a /command; False means leave."""
        name = text.split(maxsplit=1)[0].lower()
        if name in ("/exit", "/quit"):
            return False
        if name == "/new":
            self.session_id = ""
            self._pinned = True
            if self.conversation is not None:
                self._store(self.conversation.forget)
            self._say("new session: the next message starts one")
        elif name == "/session":
            self._say(f"session: {self.session_id or 'none yet (the next message starts one)'}")
            if self.conversation is not None:
                self._say(
                    f"conversation {self.conversation.key!r} of {self.conversation.profile}, "
                    f"stored in {self.conversation.store.location}"
                )
        elif name == "/attach":
            spec = text.split(maxsplit=1)[1] if len(text.split(maxsplit=1)) > 1 else ""
            try:
                self._attachments.append(Attachment.parse(spec))
            except BridgeError as error:
                self._say(f"not attached: {error}", WARNING)
            else:
                self._say(f"attached to the next message: {self._attachments[-1].name or spec}")
        elif name in ("/help", "/?"):
            self._say(HELP)
        else:
            self._say(f"unknown command {name}; /help lists them", WARNING)
        return True

    async def _turn(self, message: str) -> None:
        try:
            turn = Turn(
                message, session_name=self.session_name, from_user=self.from_user, attachments=tuple(self._attachments)
            )
            self._attachments = []
        except BridgeError as error:
            self._say(f"not sent: {error}", WARNING)
            return
        conversation = self.conversation
        place = None
        if conversation is not None:
            place = await self._take_place(conversation)
            if place is None:
                return
        try:
            try:
                if conversation is not None and not self._pinned:
                    # read only now that the turn before is over
                    self.session_id, self._stamp = conversation.lookup()
                self._pinned = False
                turn = turn.replace(session_id=self.session_id)
            except BridgeError as error:
                self._say(f"not sent: {error}", WARNING)
                return
            await self._run(turn)
        finally:
            if place is not None:
                place.release()

    async def _take_place(self, conversation: Conversation) -> Place | PgPlace | None:
        """Our place in the conversation's queue, once every earlier turn (in any process) is over;
        None when it cannot be had, or a signal gave up waiting."""
        try:
            place = await conversation.join_async()
        except BridgeError as error:
            self._say(f"not sent: {error}", WARNING)
            return None
        try:
            if place.try_wait():
                return place
            self._say(f"waiting: a turn of conversation {conversation.key!r} is running elsewhere (Ctrl-C gives up)")
            with trio.CancelScope() as scope:
                self._idle = scope
                try:
                    await place.wait_async()
                finally:
                    self._idle = None
        except BridgeError as error:
            place.release()
            self._say(f"not sent: {error}", WARNING)
            return None
        except BaseException:
            place.release()
            raise
        if scope.cancelled_caught or self._quit is not None:
            place.release()
            self._say("not sent: gave up waiting", WARNING)
            return None
        return place

    async def _run(self, turn: Turn) -> None:
        printer = HumanPrinter(self.out, self.err, self.profile, status=self.spin)
        agent = None
        if self.profile.warm:
            agent = await self._warm_agent(turn, printer)
            if agent is None:
                return
        async with open_turn(self.profile, turn, agent=agent) as stream:
            self._stream = stream
            if self._quit is not None:  # a signal came between the line and the turn
                stream.cancel()
            try:
                async with printer.live():
                    async for event in stream:
                        if type(event) is PermissionRequest or type(event) is QuestionRequest:
                            await self._ask(event, stream, printer)
                        else:
                            printer.show(event)
            finally:
                self._stream = None
        self._finished(stream.result)

    async def _warm_agent(self, turn: Turn, printer: HumanPrinter) -> WarmAgent | None:
        """The chat's live agent if it can take `turn`, else a new one that resumes the turn's session;
        None when it could not start (the failure is shown as the turn's) or a signal stopped it."""
        agent = self._warm
        if agent is not None:
            if agent.unfit_for(self.profile, turn.session_id, self._stamp) is None:
                return agent
            self._warm = None
            await agent.close()
        assert self._nursery is not None
        agent = WarmAgent(
            self.profile,
            session_id=turn.session_id,
            session_name=self.session_name,
            log=get_logger(profile=self.profile.label, agent="warm"),
        )
        with trio.CancelScope() as scope:
            self._idle = scope
            try:
                async with printer.live():
                    await agent.start(self._nursery)
            except WarmStartError as error:
                result = start_failure_result(error, self.profile, agent.log)
                printer.show(result)
                self._finished(result)
                return None
            finally:
                self._idle = None
        if scope.cancelled_caught or self._quit is not None:
            await agent.close(grace=0)
            self._say("not sent: stopped while the agent started", WARNING)
            return None
        self._warm = agent
        return agent

    async def _ask(
        self, request: PermissionRequest | QuestionRequest, stream: TurnStream, printer: HumanPrinter
    ) -> None:
        """The agent asks to run a tool (and the profile says ask), or asks the user to choose: the person at the
        prompt answers."""
        reader = self._reader if self.interactive else None
        with trio.CancelScope() as scope:
            self._idle = scope  # Ctrl-C withdraws the question (and cancels the turn)
            try:
                if isinstance(request, PermissionRequest):
                    await ask(request, stream, printer, reader)
                else:
                    await ask_question(request, stream, printer, reader)
            finally:
                self._idle = None
        if scope.cancelled_caught:
            self._reader.discard()

    def _finished(self, result: TurnResult) -> None:
        if result.session_id:
            self.session_id = result.session_id
        if self.conversation is not None:
            conversation = self.conversation
            self._store(lambda: self._recorded(conversation.record(result)))
        if not result.ok:
            self._failed_code = result.exit_code
            self._say(f"[exit {result.exit_code}: {result.outcome}, after {result.duration_ms / 1000:.1f} s]", DIM)

    def _recorded(self, stamp: str) -> None:
        self._stamp = stamp
        if self._warm is not None:
            self._warm.stamp = stamp  # the agent took that turn: it is up to date with the store

    def _store(self, operation: Callable[[], object]) -> None:
        """A store that fails is reported, and the chat goes on with the session in memory."""
        try:
            operation()
        except BridgeError as error:
            self._say(f"agent-bridge: {error}", WARNING)

    async def _watch_signals(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            task_status.started()
            async for signum in signals:
                if signum != signal.SIGINT:
                    self._quit = 128 + signum
                if self._stream is not None:
                    self._stream.cancel()
                if self._idle is not None:
                    self._idle.cancel()

    def _session_text(self) -> str:
        if self.session_id:
            return f"session {self.session_id}"
        return "no session yet (the next message starts one)"

    def _say(self, text: str, style: str = "") -> None:
        self._write_err((paint(text, style, self.color) if style else text) + "\n")

    def _write_err(self, text: str) -> None:
        self.err.write(text)
        self.err.flush()


def chat_command(args: argparse.Namespace) -> int:
    profile = load_for_turns(args)
    conversation = open_conversation(args, profile)
    session_id = args.session_id
    if args.new and conversation is not None:
        conversation.forget()
        if session_id is None:
            session_id = ""  # the first turn starts afresh, whatever another process stores meanwhile
    return run_chat(
        profile, conversation, session_id=session_id, session_name=args.session_name, from_user=args.from_user
    )
