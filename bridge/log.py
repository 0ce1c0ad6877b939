"""Structured logs to stderr, never stdout (SPEC §7).

stdout belongs to replies (and to `--json` NDJSON), so a log line there would
corrupt what a host parses. Hosts that configure structlog themselves keep
their configuration; otherwise the bridge installs a stderr default on first use.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

LogFormat = Literal["auto", "console", "json"]
LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "warning", log_format: LogFormat = "auto") -> None:
    """Send the bridge's logs to stderr: human-readable on a terminal, JSON lines otherwise."""
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False)
        if log_format == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=True,
    )


class _CurrentStderr:
    """Writes to whatever `sys.stderr` is at the time of the record.

    Binding the stream object at configure time would keep writing to a stream
    a host (or pytest's capture) has since replaced, or closed.
    """

    def write(self, text: str) -> None:
        sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def get_logger(**context: Any) -> Any:
    """The bridge's logger, bound to `context` (turn id, profile name…)."""
    if not structlog.is_configured():
        configure_logging()
    return structlog.get_logger("bridge").bind(**context)
