"""Structured logs to stderr, never stdout (SPEC §7).

stdout belongs to replies (and to `--json` NDJSON), so a log line there would
corrupt what a host parses. Hosts that configure structlog themselves keep
their configuration; otherwise the bridge installs a stderr default on first use.

A record that carries `in_result=True` says something the turn's result also
says to whoever ran the turn (its error reply: the agent could not be started,
it timed out). A command that shows the result to a person may leave such
records out (`configure_logging(hide_in_result=True)`), so a thing is said once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, Literal, TextIO

import structlog

LogFormat = Literal["auto", "console", "json"]
LEVELS = ("debug", "info", "warning", "error")
IN_RESULT = "in_result"


def wants_color(stream: TextIO) -> bool:
    """Whether to colour what goes to `stream`: a terminal, unless `NO_COLOR` is set (no-color.org) or TERM=dumb."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def configure_logging(level: str = "warning", log_format: LogFormat = "auto", *, hide_in_result: bool = False) -> None:
    """Send the bridge's logs to stderr: human-readable on a terminal, JSON lines otherwise.

    With `hide_in_result`, records marked `in_result=True` are left out (see the module docstring).
    """
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=wants_color(sys.stderr))
        if log_format == "console"
        else structlog.processors.JSONRenderer()
    )

    def said_in_result(logger: Any, method: str, record: dict[str, Any]) -> dict[str, Any]:
        if record.pop(IN_RESULT, False) and hide_in_result:
            raise structlog.DropEvent
        return record

    structlog.configure(
        processors=[
            said_in_result,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # One write per record (PrintLogger writes the newline separately): whoever
        # receives it (see `records_to`) gets whole lines.
        logger_factory=structlog.WriteLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


_record_writer: Callable[[str], None] | None = None


@contextlib.contextmanager
def records_to(writer: Callable[[str], None]) -> Iterator[None]:
    """Hand each rendered record (a whole line, newline included) to `writer` instead of stderr, for a while.

    A command that draws on the terminal uses it to start every record on a line of its own.
    """
    global _record_writer
    previous, _record_writer = _record_writer, writer
    try:
        yield
    finally:
        _record_writer = previous


class _CurrentStderr:
    """Writes to whatever `sys.stderr` is at the time of the record (or to the `records_to` writer).

    Binding the stream object at configure time would keep writing to a stream
    a host (or pytest's capture) has since replaced, or closed.
    """

    def write(self, text: str) -> None:
        if _record_writer is not None:
            _record_writer(text)
        else:
            sys.stderr.write(text)

    def flush(self) -> None:
        if _record_writer is None:
            sys.stderr.flush()


def get_logger(**context: Any) -> Any:
    """The bridge's logger, bound to `context` (turn id, profile name…)."""
    if not structlog.is_configured():
        configure_logging()
    return structlog.get_logger("bridge").bind(**context)
