"""Wire dialects: how each agent family talks, as sans-I/O objects — bytes in, events (and bytes) out.

A profile picks one with `protocol:`. Each is a module here with one class;
the turn engine drives every one the same way, so a new agent family is one
module and one line in `PROTOCOLS`, never a new engine:

1. `bridge/dialects/<family>.py`: a class on `base.JsonLinesDialect` (a
   process per turn; the `base.Dialect` shape) or on `warm.WarmDialect` (a
   process per conversation), with its `name`, its `handlers` table (message
   type → method), and `finish` for what the end of the output means. It
   keeps tool calls in `coding_agents.ToolCalls` and text in
   `coding_agents.Paragraphs`, as every family does;
2. its line in `PROTOCOLS`: the module, the class, its settings class, a
   one-line summary, and `warm=True` for a warm family.

A family with settings of its own declares their class in `settings.py`, with
every family's: a profile is checked without loading any dialect module.
tests/test_dialect_registry.py holds each line to its class. Modules load on
first use: a turn pays only for the dialect it speaks.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, NamedTuple

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
from .base import Dialect, DialectContext, Handover, JsonLinesDialect, JsonLinesReader
from .events import (
    ActivityEvent,
    AgentInput,
    BodyLine,
    ErrorEvent,
    Event,
    FileEvent,
    LineCut,
    Option,
    PartialEvent,
    PlanStep,
    ProtocolWarning,
    Question,
    QuestionRequest,
    Ready,
    ReplyEvent,
    RequestWithdrawn,
    SessionEvent,
    SessionGone,
    SteerOutcome,
    TurnEnd,
    Usage,
    UsageEvent,
)
from .framing import LineSplitter

if TYPE_CHECKING:
    from .warm import WarmDialect  # imported with the warm protocols' modules, not with every profile

from .settings import (
    AcpSettings,
    AnteSettings,
    ClaudeStreamSettings,
    CodexAppServerSettings,
    JsonSettings,
    NoSettings,
)


class ProtocolInfo(NamedTuple):
    """What the rest of the bridge knows of a protocol without loading its module."""

    module: str
    dialect: str  # the class in `module`
    settings: type  # its settings class (see `settings`)
    message_on_stdin: bool = False  # its handover always writes the message to the agent's stdin
    summary: str = ""
    warm: bool = False  # one process per conversation, many turns (a `warm.WarmDialect`), not one per turn
    fetches_attachments: bool = True  # the default of the profile's `attachments.fetch` (docs/attachments.md)


DEFAULT_PROTOCOL = "agentproc-0.1"
PROTOCOLS: dict[str, ProtocolInfo] = {
    "agentproc-0.1": ProtocolInfo(
        "agentproc01",
        "AgentProc01",
        NoSettings,
        fetches_attachments=False,  # the contract hands the agent the URLs themselves
        summary="AGENT_* environment in, AGENT_PARTIAL:/AGENT_SESSION:/AGENT_ERROR: lines and the reply body out",
    ),
    "agentproc-0.4": ProtocolInfo(
        "agentproc04",
        "AgentProc04",
        JsonSettings,
        message_on_stdin=True,
        summary="agentproc wire 0.4: one JSON turn line on stdin; partial/result/error "
        "JSON lines out; permission requests answered by the profile's permissions",
    ),
    "aictrl-ndjson": ProtocolInfo(
        "aictrl",
        "AictrlNdjson",
        JsonSettings,
        summary="`aictrl run --format json`: session from the envelope's sessionID, the "
        "last text part is the reply, message_complete usage, session_complete ends",
    ),
    "opencode-json": ProtocolInfo(
        "opencode",
        "OpencodeJson",
        JsonSettings,
        summary="`opencode run --format json`: sessionID, text parts (the last is the "
        "reply), tool_use, step_finish usage, error",
    ),
    "grok-streaming-json": ProtocolInfo(
        "grok",
        "GrokStreamingJson",
        JsonSettings,
        summary="`grok -p … --output-format streaming-json`: text deltas are the "
        "reply, end carries sessionId and usage",
    ),
    "kimi-stream-json": ProtocolInfo(
        "kimi",
        "KimiStreamJson",
        JsonSettings,
        summary="`kimi --print --output-format=stream-json`: role/content messages, the "
        "last assistant text is the reply; the session is the one passed with --session",
    ),
    "pi-json": ProtocolInfo(
        "pi",
        "PiJson",
        JsonSettings,
        summary="`pi --mode json`: session header, text deltas, the last assistant message is "
        "the reply, agent_end ends",
    ),
    "dsh-json": ProtocolInfo(
        "dsh",
        "DshJson",
        JsonSettings,
        summary="`dsh --profile headless --json`: session frame, text frames, final is the reply, per-step usage",
    ),
    "deepseek-stream-json": ProtocolInfo(
        "deepseek",
        "DeepseekStreamJson",
        JsonSettings,
        summary="`deepseek exec --output-format stream-json`: content deltas are "
        "the reply, session_capture, metadata usage and status, done ends",
    ),
    "claude-stream-json": ProtocolInfo(
        "claude_stream",
        "ClaudeStream",
        ClaudeStreamSettings,
        summary="Claude Code's `-p --output-format stream-json --verbose` (and "
        "codebuddy's, qwen-code's, cursor agent's): system/init → session, text "
        "deltas or assistant text → partials, tool_use → activity, result → reply or "
        "error, usage and cost",
    ),
    "claude-sdk": ProtocolInfo(
        "claude_sdk",
        "ClaudeSdk",
        JsonSettings,
        warm=True,
        summary="Claude Code as its Agent SDKs drive it (`-p --input-format stream-json --output-format "
        "stream-json --verbose --permission-prompt-tool stdio --replay-user-messages`), one process per "
        "conversation: initialize; user lines → stream-json output → result; can_use_tool ↔ permissions and "
        "questions (AskUserQuestion, ExitPlanMode); interrupt; steering; --resume",
    ),
    "gemini-stream-json": ProtocolInfo(
        "gemini_stream",
        "GeminiStream",
        JsonSettings,
        summary="Gemini CLI's `--output-format stream-json`: init → session, "
        "assistant message deltas → partials and the reply, tool_use/tool_result → "
        "activity, result → error or usage",
    ),
    "codex-exec": ProtocolInfo(
        "codex_exec",
        "CodexExec",
        JsonSettings,
        summary="`codex exec --json`: the message in argv, stdin closed at once; thread id, "
        "agent messages, reasoning, commands, file changes, plan, usage and errors out",
    ),
    "acp": ProtocolInfo(
        "acp",
        "Acp",
        AcpSettings,
        warm=True,
        summary="the Agent Client Protocol (JSON-RPC over stdio; codex-acp, claude-agent-acp, "
        "gemini --acp): one process per conversation; session/new, load or resume; message "
        "chunks are the reply; thoughts, tool calls and plans are activity; permission requests "
        "answered by the profile's permissions",
    ),
    "codex-app-server": ProtocolInfo(
        "codex_app_server",
        "CodexAppServer",
        CodexAppServerSettings,
        warm=True,
        summary="`codex app-server` (JSON-RPC over stdio), one process per conversation: thread/start or "
        "thread/resume, turn/start → message deltas, reasoning, commands, file changes and plans → "
        "turn/completed; command and file-change approvals and Plan mode's questions answered; "
        "turn/interrupt cancels, turn/steer steers",
    ),
    "aionrs": ProtocolInfo(
        "aionrs",
        "Aionrs",
        JsonSettings,
        warm=True,
        summary="`aionrs --json-stream`, one process per conversation: ready → message → "
        "stream_start, text_delta, thinking, tool_request ↔ tool_approve/tool_deny, tool "
        "activity → stream_end; stop cancels; the session resumes with --resume",
    ),
    "ante": ProtocolInfo(
        "ante",
        "Ante",
        AnteSettings,
        warm=True,
        summary="Ante's `serve --stdio`, kept warm per conversation: StartSession/ResumeSession, "
        "UserInput → MessageDelta… → TurnEnd; tool approvals (TurnPause ↔ ApprovalResponse), "
        "Interrupt, Shutdown; a resumed session's replayed history is dropped",
    ),
}


def dialect_class(protocol: str) -> type[Dialect] | type[WarmDialect]:
    """The dialect class of `protocol` (a `KeyError` for a name not in `PROTOCOLS`): a `WarmDialect` for the
    protocols that keep one process per conversation (`ProtocolInfo.warm`), else a one-turn `Dialect`."""
    if protocol == DEFAULT_PROTOCOL:
        return AgentProc01
    info = PROTOCOLS[protocol]
    found: type[Dialect] | type[WarmDialect] = getattr(import_module(f".{info.module}", __name__), info.dialect)
    return found


__all__ = [
    "DEFAULT_PROTOCOL",
    "ERROR_PREFIX",
    "MAX_LINE_BYTES",
    "MAX_SESSION_ID_CHARS",
    "PARTIAL_PREFIX",
    "PROTOCOLS",
    "SESSION_PREFIX",
    "ActivityEvent",
    "AgentInput",
    "AgentProc01",
    "AnteSettings",
    "BodyLine",
    "ClaudeStreamSettings",
    "CodexAppServerSettings",
    "Dialect",
    "DialectContext",
    "ErrorEvent",
    "Event",
    "FileEvent",
    "Handover",
    "JsonLinesDialect",
    "JsonLinesReader",
    "JsonSettings",
    "LineCut",
    "LineDecoder",
    "LineSplitter",
    "NoSettings",
    "Option",
    "PartialEvent",
    "PlanStep",
    "ProtocolInfo",
    "ProtocolWarning",
    "Question",
    "QuestionRequest",
    "Ready",
    "ReplyEvent",
    "RequestWithdrawn",
    "SessionEvent",
    "SessionGone",
    "SteerOutcome",
    "TurnEnd",
    "Usage",
    "UsageEvent",
    "decode_payload",
    "dialect_class",
    "session_id_problem",
]
