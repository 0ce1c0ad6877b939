"""Structured logs to stderr, never stdout (docs/protocol.md §7).

stdout belongs to replies (and to `--json` NDJSON), so a log line there would
corrupt what a host parses. Hosts that configure structlog themselves keep
their configuration; otherwise the bridge installs a stderr default on first use.

A record that carries `in_result=True` says something the turn's result also
says to whoever ran the turn (its error reply: the agent could not be started,
it timed out). A command that shows the result to a person may leave such
records out (`configure_logging(hide_in_result=True)`), so a thing is said once.

structlog is imported only when a record is emitted at or above the active level
(~50 ms of the CLI's start-up): until then `get_logger` hands out a small
stand-in that drops the records below the level with one comparison. Once
structlog is imported (by a record, or by a host), every record goes through it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, Literal, Protocol, TextIO

LogFormat = Literal["auto", "console", "json"]
LEVELS = ("debug", "info", "warning", "error")
# The numbers of the standard library's levels, which structlog's filtering loggers use.
_NUMBERS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "exception": 40, "critical": 50}
IN_RESULT = "in_result"


class Logger(Protocol):
    """What the bridge calls on a logger: a structlog bound logger, or the stand-in `get_logger` hands out first."""

    def bind(self, **context: Any) -> Logger: ...
    def debug(self, event: str, *args: Any, **kw: Any) -> Any: ...
    def info(self, event: str, *args: Any, **kw: Any) -> Any: ...
    def warning(self, event: str, *args: Any, **kw: Any) -> Any: ...
    def error(self, event: str, *args: Any, **kw: Any) -> Any: ...
    def exception(self, event: str, *args: Any, **kw: Any) -> Any: ...


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
    structlog is configured now if it is already imported, else when the first record is emitted.
    """
    global _level, _pending
    _level = _NUMBERS[level.lower()]
    _pending = (level, log_format, hide_in_result)
    if "structlog" in sys.modules:
        _apply(*_pending)


_level = _NUMBERS["warning"]
# What `configure_logging` asked for, until structlog is configured with it.
_pending: tuple[str, LogFormat, bool] | None = None


def _apply(level: str, log_format: LogFormat, hide_in_result: bool) -> None:
    global _pending
    import structlog

    _pending = None
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=wants_color(sys.stderr))
        if log_format == "console"
        else structlog.processors.JSONRenderer()
    )

    def said_in_result(logger: Any, method: str, record: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
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
        wrapper_class=structlog.make_filtering_bound_logger(_NUMBERS[level.lower()]),
        # One write per record (PrintLogger writes the newline separately): whoever
        # receives it (see `records_to`) gets whole lines.
        # structlog types `file` as TextIO, but writes and flushes only: _CurrentStderr does both.
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


def _structlog_logger(context: dict[str, Any]) -> Logger:
    import structlog

    if not structlog.is_configured():
        _apply(*(_pending or ("warning", "auto", False)))
    logger: Logger = structlog.get_logger("bridge").bind(**context)
    return logger


class _Logger:
    """Stands in for a structlog bound logger until structlog is needed (see the module docstring)."""

    __slots__ = ("_context", "_real")

    def __init__(self, context: dict[str, Any]) -> None:
        self._context = context
        self._real: Logger | None = None

    def _logger(self) -> Logger:
        if self._real is None:
            self._real = _structlog_logger(self._context)
        return self._real

    def _below(self, number: int) -> bool:
        return number < _level and self._real is None and "structlog" not in sys.modules

    def bind(self, **context: Any) -> Logger:
        if self._real is not None:
            return self._real.bind(**context)
        return _Logger({**self._context, **context})

    def debug(self, event: str, *args: Any, **kw: Any) -> Any:
        return None if self._below(10) else self._logger().debug(event, *args, **kw)

    def info(self, event: str, *args: Any, **kw: Any) -> Any:
        return None if self._below(20) else self._logger().info(event, *args, **kw)

    def warning(self, event: str, *args: Any, **kw: Any) -> Any:
        return None if self._below(30) else self._logger().warning(event, *args, **kw)

    def error(self, event: str, *args: Any, **kw: Any) -> Any:
        return None if self._below(40) else self._logger().error(event, *args, **kw)

    def exception(self, event: str, *args: Any, **kw: Any) -> Any:
        return None if self._below(40) else self._logger().exception(event, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger(), name)


def get_logger(**context: Any) -> Logger:
    """The bridge's logger, bound to `context` (turn id, profile name…)."""
    if "structlog" in sys.modules:
        return _structlog_logger(context)
    return _Logger(context)
