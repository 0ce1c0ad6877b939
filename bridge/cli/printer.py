"""How a turn's events look to a person (`run`, `chat`) or to a program (`run --json`).

On a terminal, stdout and stderr usually share one screen. `HumanPrinter` is
the one writer to both while a turn runs — the agent's words, error replies
and notices, the agent's own stderr (`run --show-stderr`), log records, and the
status line — so it knows where the cursor is: whatever goes to stderr starts
on a line of its own, never in the middle of a streamed partial, and the
status line is drawn only at the start of an empty line and erased before
anything else is written.
"""

from __future__ import annotations

import codecs
import contextlib
import itertools
import json
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TextIO

import trio

from ..dialects import ActivityEvent, FileEvent
from ..engine.launch import withheld_credentials
from ..engine.result import Outcome, StreamedText, TurnResult, credentials_note
from ..files.outbox import human_size
from ..log import records_to, wants_color

if TYPE_CHECKING:
    from ..profile import Profile

SPINNER_DELAY = 0.25  # a turn that answers sooner never shows the status line
SPINNER_TICK = 0.1
STDERR_LINES = 5  # of the agent's stderr shown under a failed turn's generic error
STDERR_LINE_CHARS = 200

# SGR codes: red, yellow, dim.
ERROR, WARNING, DIM = "31", "33", "2"

# What a terminal obeys rather than shows: C0 controls but tab and newline, DEL, and C1 controls. An agent's
# (or a web page's it read) OSC 52 would write the user's clipboard, OSC 0 the window title, CSI hide text.
_SHOWN_AS = {code: f"^{chr(code ^ 0x40)}" for code in (*range(0x20), 0x7F) if chr(code) not in "\t\n"}
_SHOWN_AS |= dict.fromkeys(range(0x80, 0xA0), "\N{REPLACEMENT CHARACTER}")


def paint(text: str, style: str, color: bool) -> str:
    """`text` in `style` when `color` is on (see `bridge.log.wants_color`), else as it is."""
    return f"\x1b[{style}m{text}\x1b[0m" if color and text else text


def visible(text: str) -> str:
    """`text` for a terminal to show, not obey: control characters in caret notation (ESC is `^[`), C1 ones as �."""
    return text.replace("\r\n", "\n").translate(_SHOWN_AS)


def describe_activity(event: ActivityEvent) -> str:
    """What the agent is doing, in a few words for a status line."""
    if event.activity == "thinking":
        return "thinking…"
    if event.activity == "notice":
        return event.text
    if event.activity == "plan":
        done = sum(step.status == "completed" for step in event.plan)
        current = next((step.text for step in event.plan if step.status == "in_progress"), "")
        return f"plan {done}/{len(event.plan)}" + (f": {current}" if current else "")
    what = " ".join(part for part in (event.tool, event.title) if part) or "a tool"
    if event.tool and event.title:
        what = f"{event.tool}: {event.title}"
    return f"{what} ({event.status})" if event.status and event.status != "started" else what


def describe_file(event: FileEvent) -> str:
    """A file the agent left, as one line for a person: `file: PATH (SIZE, TYPE)`."""
    return f"file: {event.path} ({human_size(event.size)}, {event.media_type})"


def stderr_excerpt(tail: str, max_lines: int = STDERR_LINES, width: int = STDERR_LINE_CHARS) -> list[str]:
    """The last few non-blank lines of an agent's stderr tail, each cut to `width`; "…" first if some were left out."""
    lines = [line.rstrip() for line in tail.splitlines() if line.strip()]
    shown = [line if len(line) <= width else line[: width - 1] + "…" for line in lines[-max_lines:]]
    if len(lines) > max_lines or (tail.startswith("…") and shown):
        shown.insert(0, "…")
    return shown


class HumanPrinter:
    """Partials as they arrive, then the reply on stdout; the error reply and notices on stderr.

    `profile` tunes what is said about a turn: the stderr tail is not repeated
    when `include_stderr_in_reply` already put it in the error reply, and an
    empty reply from a `stdin: message` agent comes with a hint about `stdin: line`.
    With `status`, a status line on stderr shows the elapsed time while the
    agent is silent, and what it is doing when its dialect says (`live()` runs it).
    """

    def __init__(self, out: TextIO, err: TextIO, profile: Profile | None = None, *, status: bool = False) -> None:
        self.out = out
        self.err = err
        self.open_line = False  # partials left stdout mid-line
        self._err_open = False  # the agent's own stderr left stderr mid-line
        self._shared = _shared(out, err)  # one screen or one file: one stream's open line is the other's too
        self._out_tty, self._err_tty = _isatty(out), _isatty(err)  # what the agent says is shown, never obeyed
        self.color = wants_color(err)
        self._profile = profile
        self._tail_in_reply = profile is not None and profile.include_stderr_in_reply
        self._stdin_message = profile is not None and profile.stdin == "message"
        self._stderr_shown = False
        self._decoder: codecs.IncrementalDecoder | None = None
        self.spinner = Spinner(err, self) if status else None
        self._streamed = StreamedText()  # the partials shown, to print only what the reply adds

    # ------------------------------------------------------------------ the turn

    @contextlib.asynccontextmanager
    async def live(self) -> AsyncIterator[None]:
        """While a turn runs: log records go through this printer (on lines of their own), and the status line runs."""
        with records_to(self.write_log):
            if self.spinner is None:
                yield
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.spinner.run)
                try:
                    yield
                finally:
                    nursery.cancel_scope.cancel()
                    self.spinner.clear()

    def show(self, event: Any) -> None:
        if isinstance(event, TurnResult):
            self._show_result(event)
        elif isinstance(event, ActivityEvent):
            if event.activity == "notice":
                self.notice(event.text, DIM)
            elif self.spinner is not None:
                self.spinner.note(describe_activity(event))
        elif isinstance(event, FileEvent):
            self.notice(describe_file(event), DIM)
        elif event.kind == "partial" and event.text:
            self._write_out(event.text)
            self._streamed.add(event.text)

    def agent_stderr(self, data: bytes) -> None:
        """A chunk of the agent's own stderr, shown as it comes (`run --show-stderr`)."""
        if self._decoder is None:
            self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = self._on_err(self._decoder.decode(data))
        if text:
            self._stderr_shown = True
            self._write_err(text)

    def write_log(self, record: str) -> None:
        """A rendered log record (a whole line): on a line of its own."""
        if self._err_open:
            self._write_err("\n")
        self._write_err(record)

    def notice(self, text: str, style: str = WARNING) -> None:
        """A line of the bridge's own on stderr (not the agent's words)."""
        if self._err_open:
            self._write_err("\n")
        self._write_err(paint(self._on_err(text), style, self.color) + "\n")

    def prompt(self, text: str) -> None:
        """A question on stderr, the cursor left after it; the status line stays away until `answered()`."""
        if self._err_open:
            self._write_err("\n")
        # stderr's line stays open: no status line over it
        self._write_err(paint(self._on_err(text), WARNING, self.color))

    def answered(self, *, typed: bool) -> None:
        """The question is over: the person's Enter ended its line (`typed`), else it is ended here."""
        if typed:
            self._err_open = False
        else:
            self._write_err("\n")

    # ------------------------------------------------------------------ what is on screen

    @property
    def status_may_draw(self) -> bool:
        """The status line's row is free: stderr's cursor is at the start of a line nobody is writing."""
        return not self._err_open and not (self._shared and self.open_line)

    def _on_err(self, text: str) -> str:
        return visible(text) if self._err_tty else text

    def _write_out(self, *texts: str) -> None:
        if self._out_tty:
            texts = tuple(visible(text) for text in texts)
        self._clear_status()
        if self._err_open and self._shared:
            self._raw(self.err, "\n")  # on one screen, stderr's open line must end first
            self._err_open = False
        for text in texts:  # not joined: a long reply would be copied once more
            self.out.write(text)
        self.out.flush()
        self.open_line = not texts[-1].endswith("\n")

    def _write_err(self, text: str) -> None:
        self._clear_status()
        if self.open_line and self._shared:
            self._raw(self.out, "\n")  # on one screen, stdout's open line must end first
            self.open_line = False
        self._raw(self.err, text)
        self._err_open = not text.endswith("\n")

    def _clear_status(self) -> None:
        if self.spinner is not None:
            self.spinner.clear()

    @staticmethod
    def _raw(stream: TextIO, text: str) -> None:
        stream.write(text)
        stream.flush()

    def _show_result(self, result: TurnResult) -> None:
        if self._decoder is not None and (rest := self._decoder.decode(b"", final=True)):
            self._write_err(self._on_err(rest))
        reply, continues = self._streamed.unstreamed(result.reply)
        if self.open_line and not (reply and continues):
            self._write_out("\n")
        if reply:
            self._write_out(reply, "\n")
        if not result.ok:
            self.notice(result.error_reply or f"The turn failed: exit {result.exit_code} ({result.outcome}).", ERROR)
            if not result.error or result.outcome is Outcome.EXIT_NONZERO:  # the agent did not say why; stderr may
                self._show_stderr_tail(result.stderr_tail)
            self._show_credentials_note(result.error)
        elif not result.reply and not result.partials:
            hint = (
                "; a program that reads lines (bc, a REPL) needs `stdin: line` in its profile, so that the "
                "message ends with a newline"
                if self._stdin_message
                else ""
            )
            self.notice(f"agent-bridge: the agent exited 0 without printing a reply{hint}")
            self._show_stderr_tail(result.stderr_tail)

    def _show_credentials_note(self, error: str) -> None:
        """The credentials the agent did not get, when the result's error names them (see `TurnRecorder.finish`)."""
        if self._profile is None or not (held_back := withheld_credentials(self._profile, os.environ)):
            return
        if (note := credentials_note(self._profile, held_back)) in error:
            self.notice(f"agent-bridge: {note}")

    def _show_stderr_tail(self, tail: str) -> None:
        if self._tail_in_reply or self._stderr_shown:
            return
        lines = stderr_excerpt(tail)
        for index, line in enumerate(lines):
            self.notice(("  stderr: " if index == 0 else "          ") + line, DIM)


class JsonPrinter:
    """NDJSON: one object per event, the result last with every field of the result."""

    def __init__(self, out: TextIO, err: TextIO | None = None) -> None:
        self.out = out
        self.err = err
        self.spinner = None

    @contextlib.asynccontextmanager
    async def live(self) -> AsyncIterator[None]:
        yield

    def show(self, event: Any) -> None:
        record = {"event": "result", **event.to_dict()} if isinstance(event, TurnResult) else event.to_dict()
        self.out.write(json.dumps(record, ensure_ascii=False))
        self.out.write("\n")
        self.out.flush()

    def agent_stderr(self, data: bytes) -> None:
        """The agent's stderr as it comes, byte for byte (stdout stays NDJSON)."""
        if self.err is not None:
            self.err.flush()
            self.err.buffer.write(data)
            self.err.buffer.flush()


class Spinner:
    """Elapsed time on stderr while the agent says nothing, so a slow agent does not look hung,
    and what it is doing when its dialect says so (a tool it runs, thinking).

    Drawn only where the printer says the row is free (never over a partial),
    on one line, and erased before anything else is printed.
    """

    def __init__(self, err: TextIO, printer: HumanPrinter) -> None:
        self.err = err
        self.printer = printer
        self.drawn = 0  # width of what is on screen now
        self.activity = ""
        self.started: float | None = None  # when run() started
        self.frames = itertools.cycle("|/-\\")

    async def run(self) -> None:
        self.started = trio.current_time()
        await trio.sleep(SPINNER_DELAY)
        while True:
            self.draw()
            await trio.sleep(SPINNER_TICK)

    def note(self, activity: str) -> None:
        """Show what the agent is doing now, on the status line."""
        self.activity = " ".join(visible(activity).split())  # one line, shown not obeyed (stderr is a terminal)
        if self.started is not None and trio.current_time() - self.started >= SPINNER_DELAY:
            self.draw()

    def draw(self) -> None:
        if self.started is None or not self.printer.status_may_draw:
            return
        text = f"{next(self.frames)} {trio.current_time() - self.started:.1f} s"
        if self.activity:
            text += f"  {self.activity}"
        text = text[: _terminal_width(self.err) - 1]
        self.err.write("\r" + text.ljust(self.drawn))
        self.err.flush()
        self.drawn = max(self.drawn, len(text))

    def clear(self) -> None:
        if self.drawn:
            self.err.write("\r" + " " * self.drawn + "\r")
            self.err.flush()
            self.drawn = 0


def _shared(out: TextIO, err: TextIO) -> bool:
    """stdout and stderr end up together: two terminals (one screen), or one file or pipe (`2>&1`)."""
    if _isatty(out) and _isatty(err):
        return True
    try:
        mine, theirs = os.fstat(out.fileno()), os.fstat(err.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _terminal_width(stream: TextIO) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = 0
    return columns if columns > 0 else 80  # a terminal whose size was never set says 0
