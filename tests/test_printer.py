"""How the CLI shows a turn to a person: the pure parts, without a process or a terminal.

stdout and stderr on one terminal share the cursor; these tests use streams
that say they are terminals and record what each was given, in order.
"""

from __future__ import annotations

import io
import re

import pytest
import structlog
import trio
import trio.testing

from bridge import Outcome, PartialEvent, TurnResult
from bridge.cli.printer import HumanPrinter, stderr_excerpt
from bridge.log import configure_logging, get_logger


@pytest.fixture(autouse=True)
def _no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")


class Screen:
    """One terminal: both streams write into one transcript."""

    def __init__(self) -> None:
        self.transcript: list[tuple[str, str]] = []

    def stream(self, name: str, tty: bool = True) -> io.StringIO:
        screen = self

        class Stream(io.StringIO):
            def write(self, text: str) -> int:
                screen.transcript.append((name, text))
                return super().write(text)

            def isatty(self) -> bool:
                return tty

        return Stream()

    def text(self) -> str:
        return "".join(text for _, text in self.transcript)


def result(
    reply: str = "",
    exit_code: int = 0,
    error_reply: str = "",
    stderr_tail: str = "",
    partials: int = 0,
    error: str = "",
) -> TurnResult:
    outcome = Outcome.OK if exit_code == 0 else Outcome.EXIT_NONZERO
    return TurnResult(
        reply=reply,
        session_id="",
        error=error,
        error_reply=error_reply,
        exit_code=exit_code,
        timed_out=False,
        outcome=outcome,
        stderr_tail=stderr_tail,
        duration_ms=1,
        partials=partials,
        truncated=False,
    )


def test_the_stderr_excerpt_is_the_last_few_lines_bounded_in_width() -> None:
    assert stderr_excerpt("one\n\ntwo\n") == ["one", "two"]
    assert stderr_excerpt("".join(f"{n}\n" for n in range(9))) == ["…", "4", "5", "6", "7", "8"]
    assert stderr_excerpt("…cut at a line boundary\nlast\n") == ["…", "…cut at a line boundary", "last"]
    assert stderr_excerpt("x" * 500) == ["x" * 199 + "…"]
    assert stderr_excerpt("  \n") == []


def test_on_one_terminal_what_goes_to_stderr_starts_on_a_line_of_its_own() -> None:
    screen = Screen()
    printer = HumanPrinter(screen.stream("out"), screen.stream("err"))
    printer.show(PartialEvent("working on it… "))
    printer.write_log("2026-01-01T00:00:00Z [warning ] something happened\n")
    printer.show(PartialEvent("still "))
    printer.show(result(reply="done", partials=2))
    assert screen.text() == ("working on it… \n2026-01-01T00:00:00Z [warning ] something happened\nstill \ndone\n")


def test_with_stdout_elsewhere_its_content_is_untouched_by_what_goes_to_the_terminal() -> None:
    screen = Screen()
    out = screen.stream("out", tty=False)
    printer = HumanPrinter(out, screen.stream("err"))
    printer.show(PartialEvent("working "))
    printer.write_log("a record\n")
    printer.show(result(reply="done", partials=1))
    assert out.getvalue() == "working \ndone\n"


def test_an_agents_control_characters_are_shown_on_a_terminal_and_passed_on_as_they_are_elsewhere() -> None:
    """On a terminal an escape sequence is text (`^[`), never obeyed; piped, a program gets the agent's bytes."""
    said = "\x1b]52;c;aGk=\x07one\r\ntwo\x9b2J\tend"
    screen = Screen()
    terminal, piped = screen.stream("out"), screen.stream("piped", tty=False)
    HumanPrinter(terminal, screen.stream("err")).show(result(reply=said))
    HumanPrinter(piped, screen.stream("err")).show(result(reply=said))
    assert terminal.getvalue() == "^[]52;c;aGk=^Gone\ntwo\N{REPLACEMENT CHARACTER}2J\tend\n"
    assert piped.getvalue() == said + "\n"


def test_the_agents_stderr_and_stdout_do_not_tear_each_others_lines() -> None:
    screen = Screen()
    printer = HumanPrinter(screen.stream("out"), screen.stream("err"))
    printer.agent_stderr(b"progress: 50%")
    printer.show(PartialEvent("answer "))
    printer.agent_stderr(b"\xc3")  # half a character: held until the rest comes
    printer.agent_stderr(b"\xa9 done\n")
    printer.show(
        result(
            reply="body",
            partials=1,
            exit_code=3,
            error_reply="The agent exited with code 3.",
            stderr_tail="progress: 50%é done\n",
        )
    )
    assert screen.text() == ("progress: 50%\nanswer \né done\nbody\nThe agent exited with code 3.\n")


def test_a_reply_after_the_agents_unfinished_stderr_line_starts_on_a_line_of_its_own() -> None:
    screen = Screen()
    printer = HumanPrinter(screen.stream("out"), screen.stream("err"))
    printer.agent_stderr(b"working")
    printer.show(result(reply="the reply"))
    assert screen.text() == "working\nthe reply\n"


def test_the_status_line_waits_for_an_empty_line_and_is_erased_before_anything_else() -> None:
    async def main() -> None:
        screen = Screen()
        printer = HumanPrinter(screen.stream("out"), screen.stream("err"), status=True)
        spinner = printer.spinner
        assert spinner is not None
        async with printer.live():
            await trio.sleep(0.4)  # past the delay: drawn
            stream, drawing = screen.transcript[-1]
            assert stream == "err" and re.fullmatch(r"\r[|/\\-] 0\.[34] s", drawing)  # the elapsed time, in place
            printer.show(PartialEvent("partial"))
            assert screen.transcript[-2][1].strip() == "" and screen.transcript[-2][1].startswith("\r")
            drawn = len(screen.transcript)
            spinner.draw()  # mid-line: nothing is drawn over the partial
            assert len(screen.transcript) == drawn

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_log_records_go_through_the_printer_while_a_turn_runs() -> None:
    async def main() -> str:
        screen = Screen()
        printer = HumanPrinter(screen.stream("out"), screen.stream("err"))
        async with printer.live():
            printer.show(PartialEvent("half a line"))
            get_logger().warning("a record")
        return screen.text()

    configure_logging("warning", "console")
    try:
        shown = trio.run(main)
    finally:
        structlog.reset_defaults()
    assert shown.startswith("half a line\n") and "a record" in shown.splitlines()[1]


def test_records_said_in_the_result_are_left_out_when_asked() -> None:
    err = io.StringIO()

    async def main() -> None:
        printer = HumanPrinter(io.StringIO(), err)
        async with printer.live():
            get_logger().warning("agent could not be started", in_result=True)
            get_logger().warning("something else")

    for hide in (True, False):
        configure_logging("warning", "json", hide_in_result=hide)
        try:
            trio.run(main)
        finally:
            structlog.reset_defaults()
        assert ("agent could not be started" in err.getvalue()) is not hide
        assert "something else" in err.getvalue() and "in_result" not in err.getvalue()
        err.truncate(0)
