"""The person at the terminal: lines they type (`chat`), and their answer when an agent asks to run a tool.

How lines are read. From a file descriptor with `trio.lowlevel.wait_readable`
then `os.read`, rather than `input()` in a worker thread:

- waiting for a line is an ordinary trio checkpoint, so Ctrl-C simply cancels
  it; a thread blocked in `input()` cannot be cancelled, and would hold on to
  (and later swallow) the next line typed;
- nothing is changed on the terminal: no `O_NONBLOCK` (that flag belongs to
  the open file shared with the shell, which would be left non-blocking if
  this process died), no raw mode. The kernel's line discipline does the
  editing (Backspace, Ctrl-U, Ctrl-W), only hands over complete lines, drops
  the half-typed line on Ctrl-C, and keeps lines typed while an agent runs
  for the next prompt;
- the same code reads a pipe or a file (`agent-bridge chat P < script.txt`).

The price is no history or arrow keys; `rlwrap agent-bridge chat …` adds them.

Asking. When a profile's `permissions` say ask, `run` and `chat` put the
question to the person at the terminal (`ask`): y allows once, a allows and
asks the agent to remember it, anything else denies. When the agent asks the
user to choose (`ask_question`: Claude Code's AskUserQuestion, a plan to
approve, Codex's questions), each question is shown with numbered options:
the person types a number (several, separated by commas, where more than one
may be chosen), or their own words where the agent takes them; an empty line
declines. A question the agent withdraws is dropped from the screen, with a
line saying so. Without a terminal to ask — piped input, `run --json` — the answer
is deny (or declined) at once, and a notice says so; a program that wants to
answer uses `serve` or the Python host.
"""

from __future__ import annotations

import os
import select
from collections import deque
from collections.abc import Awaitable, Callable

import trio

from ..dialects import MAX_LINE_BYTES, LineSplitter
from ..dialects.events import Question, QuestionRequest
from ..engine.run import TurnStream
from ..errors import AnswerRefused
from ..permissions import Decision, PermissionRequest
from .printer import DIM, WARNING, HumanPrinter, JsonPrinter

READ_CHUNK = 64 * 1024


async def ask(
    request: PermissionRequest, stream: TurnStream, printer: HumanPrinter | JsonPrinter, reader: LineReader | None
) -> None:
    """Ask whether the agent may run `request`'s tool, and answer the turn; deny when nobody can be asked.

    The question is withdrawn when the turn stops waiting for it: the
    profile's `permissions.timeout_secs` passed (the turn answered deny), or
    the turn ended (Ctrl-C cancelled it, the agent exited).
    """
    what = (
        f"{request.tool}: {request.title}"
        if request.title and request.title != request.tool
        else (request.tool or request.title or "a tool")
    )
    if reader is None or not isinstance(printer, HumanPrinter):
        if isinstance(printer, HumanPrinter):
            printer.notice(f"denied {what} (nobody at a terminal to ask)", DIM)
        stream.decide(request.request_id, Decision(allow=False, message="nobody was at a terminal to answer"))
        return
    earlier = reader.set_aside()  # lines typed before the question are no answer to it
    printer.prompt(f"the agent asks to run {what}. Allow? [y]es / [a]lways / [N]o ")
    answered = False

    async def read_answer(scope: trio.CancelScope) -> None:
        nonlocal answered
        line = await reader.readline()  # None: end of input, a deny
        answered = True
        scope.cancel()
        text = line[0].strip().lower() if line is not None else ""
        stream.decide(
            request.request_id, Decision(allow=text in ("y", "yes", "a", "always"), always=text in ("a", "always"))
        )

    try:
        await _while_waited_for(stream, request.request_id, read_answer)
    finally:
        reader.put_back(earlier)
        printer.answered(typed=answered)
    if not answered:
        printer.notice(_no_longer_waited("denied", stream, request.request_id), DIM)


async def ask_question(
    request: QuestionRequest, stream: TurnStream, printer: HumanPrinter | JsonPrinter, reader: LineReader | None
) -> None:
    """Put the agent's questions to the person at the terminal, one by one, and answer the turn; decline when
    nobody can be asked. Withdrawn, as `ask`'s question, when the turn stops waiting."""
    if reader is None or not isinstance(printer, HumanPrinter):
        if isinstance(printer, HumanPrinter):
            printer.notice("declined the agent's question (nobody at a terminal to ask)", DIM)
        stream.answer(request.request_id, None)
        return
    earlier = reader.set_aside()
    answers: dict[str, list[str]] = {}
    declined = False

    async def read_answers(scope: trio.CancelScope) -> None:
        nonlocal declined
        for question in request.questions:
            while True:
                printer.prompt(_numbered(question))
                line = await reader.readline()
                printer.answered(typed=line is not None)
                text = line[0].strip() if line is not None else ""
                if not text:
                    declined = True
                    scope.cancel()
                    return
                chosen = chosen_labels(question, text)
                if chosen is not None:
                    answers[question.id] = chosen
                    break
                printer.notice("type the number of an option" + (", or your own words" if question.free_text else ""))
        scope.cancel()

    try:
        await _while_waited_for(stream, request.request_id, read_answers)
    finally:
        reader.put_back(earlier)
    if declined or len(answers) == len(request.questions):
        try:
            stream.answer(request.request_id, None if declined else answers)
        except AnswerRefused as refused:  # too long, say: the agent is told the question was declined
            printer.notice(f"{refused}; declined", WARNING)
            stream.answer(request.request_id, None)
    else:
        printer.notice(_no_longer_waited("declined", stream, request.request_id), DIM)


def _no_longer_waited(outcome: str, stream: TurnStream, request_id: str) -> str:
    """What the person is told when the question on screen is gone before their answer."""
    if stream.withdrawn(request_id):
        return "the agent withdrew its question: nothing was answered"
    return f"the agent no longer waits for an answer: {outcome}"


async def _while_waited_for(
    stream: TurnStream, request_id: str, read: Callable[[trio.CancelScope], Awaitable[None]]
) -> None:
    """Run `read` (which cancels the scope it is given once it has the answer) until it does, or until the turn
    stops waiting for `request_id` (answered by the timeout, or the turn ended): then the reading stops."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read, nursery.cancel_scope)
        await stream.settled(request_id)
        nursery.cancel_scope.cancel()


def _numbered(question: Question) -> str:
    """A question and its options, numbered, as the prompt shows them."""
    lines = [f"{question.header}: {question.prompt}" if question.header else question.prompt]
    for number, option in enumerate(question.options, 1):
        lines.append(f"  {number}. {option.label}" + (f" — {option.description}" if option.description else ""))
    how = "numbers, separated by commas" if question.multi_select else "a number"
    if question.free_text:
        how += ", or your own words"
    lines.append(f"answer with {how} (an empty line declines): ")
    return "\n".join(lines)


def chosen_labels(question: Question, text: str) -> list[str] | None:
    """The labels `text` picks (option numbers), or the person's own words where the question takes them; None
    when it fits neither. Numbers are always option numbers: "7" of two options is asked again, not taken as words."""
    words = [word.strip() for word in text.split(",")] if question.multi_select else [text]
    if all(word.isdigit() for word in words):
        if all(1 <= int(word) <= len(question.options) for word in words):
            return [question.options[int(word) - 1].label for word in words]
        return None
    return [text] if question.free_text else None


class LineReader:
    """Lines from a file descriptor, waiting in trio (see the module docstring for why).

    Framed by `LineSplitter`, so a line is held to `MAX_LINE_BYTES` whatever is piped in.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lines = LineSplitter(MAX_LINE_BYTES)
        self.ready: deque[tuple[str, bool]] = deque()  # (line, cut at the limit)
        self.eof = False
        self.pollable = True

    async def readline(self) -> tuple[str, bool] | None:
        """The next line without its line ending, and whether it was cut; None at end of input."""
        while not self.ready:
            if self.eof:
                return None
            await self._readable()
            self._read()
        return self.ready.popleft()

    def set_aside(self) -> list[tuple[str, bool]]:
        """Take every complete line typed so far out of the way (the next message, typed while the agent
        worked), so that `readline` waits for a line typed from now on; `put_back` returns them."""
        while not self.eof and select.select([self.fd], [], [], 0)[0]:
            self._read()
        earlier = list(self.ready)
        self.ready.clear()
        return earlier

    def put_back(self, lines: list[tuple[str, bool]]) -> None:
        """Lines `set_aside` took, back in front of whatever was typed since."""
        self.ready.extendleft(reversed(lines))

    def _read(self) -> None:
        chunk = os.read(self.fd, READ_CHUNK)
        if chunk:
            batch = self.lines.feed(chunk)
        else:  # Ctrl-D after some text: that text is a line
            self.eof = True
            batch = self.lines.close()
        self.ready.extend((line, index in batch.cut) for index, line in enumerate(batch.text))

    def discard(self) -> None:
        """Forget a partial line (the terminal dropped it on Ctrl-C)."""
        self.lines.discard()

    async def _readable(self) -> None:
        if self.pollable:
            try:
                await trio.lowlevel.wait_readable(self.fd)
                return
            except PermissionError:  # epoll refuses regular files and /dev/null: reading them never blocks
                self.pollable = False
        await trio.lowlevel.checkpoint()
