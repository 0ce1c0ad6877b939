"""Wire dialects: how each agent family talks, as sans-I/O objects — bytes in, events (and bytes) out.

A profile picks one with `protocol:`. Each is a module here with one class
(see `base.Dialect`); the supervisor drives every one the same way, so a new
agent family is a new module and a line in `PROTOCOLS`, never a new supervisor.
Modules load on first use: a turn pays only for the dialect it speaks.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, NamedTuple

from .agentproc01 import (
    ERROR_PREFIX,
    MAX_LINE_BYTES,
    MAX_SESSION_ID_CHARS,
    PARTIAL_PREFIX,
    SESSION_PREFIX,
    AgentProc01,
    LineDecoder,
    decode_payload,
    session_id_problem,
)
from .base import Dialect, DialectContext, Handover, JsonLinesDialect
from .events import (
    ActivityEvent,
    BodyLine,
    ErrorEvent,
    Event,
    LineCut,
    PartialEvent,
    PlanStep,
    ProtocolWarning,
    ReplyEvent,
    SessionEvent,
    Usage,
    UsageEvent,
)
from .framing import LineSplitter
from .settings import JsonSettings, NoSettings


class ProtocolInfo(NamedTuple):
    """What the rest of the bridge knows of a protocol without loading its module."""

    module: str
    dialect: str  # the class in `module`
    settings: type  # its settings class (see `settings`)
    message_on_stdin: bool = False  # its handover always writes the message to the agent's stdin
    summary: str = ""


DEFAULT_PROTOCOL = "agentproc-0.1"
PROTOCOLS: dict[str, ProtocolInfo] = {
    "agentproc-0.1": ProtocolInfo("agentproc01", "AgentProc01", NoSettings,
                                  summary="AGENT_* environment in, AGENT_PARTIAL:/AGENT_SESSION:/AGENT_ERROR: lines "
                                  "and the reply body out"),
    "codex-exec": ProtocolInfo("codex_exec", "CodexExec", JsonSettings,
                               summary="`codex exec --json`: the message in argv, stdin closed at once; thread id, "
                               "agent messages, reasoning, commands, file changes, plan, usage and errors out"),
}


def dialect_class(protocol: str) -> Any:
    """The dialect class of `protocol` (a `KeyError` for a name not in `PROTOCOLS`)."""
    if protocol == DEFAULT_PROTOCOL:
        return AgentProc01
    info = PROTOCOLS[protocol]
    return getattr(import_module(f".{info.module}", __name__), info.dialect)


__all__ = [
    "DEFAULT_PROTOCOL",
    "ERROR_PREFIX",
    "MAX_LINE_BYTES",
    "MAX_SESSION_ID_CHARS",
    "PARTIAL_PREFIX",
    "PROTOCOLS",
    "JsonSettings",
    "NoSettings",
    "ProtocolInfo",
    "SESSION_PREFIX",
    "ActivityEvent",
    "AgentProc01",
    "BodyLine",
    "Dialect",
    "DialectContext",
    "ErrorEvent",
    "Event",
    "Handover",
    "JsonLinesDialect",
    "LineCut",
    "LineDecoder",
    "LineSplitter",
    "PartialEvent",
    "PlanStep",
    "ProtocolWarning",
    "ReplyEvent",
    "SessionEvent",
    "Usage",
    "UsageEvent",
    "decode_payload",
    "dialect_class",
    "session_id_problem",
]
