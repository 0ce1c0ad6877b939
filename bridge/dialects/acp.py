"""The Agent Client Protocol (`protocol: acp`): JSON-RPC 2.0 over stdio, one agent per conversation. Sans-I/O.

ACP is how editors drive coding agents (codex-acp, Claude Code's and Gemini
CLI's ACP modes, goose, Kiro…). The bridge is the ACP *client*; one process
holds one session for many turns:

- handshake: `initialize` (protocol version 1; no file system or terminal
  capability unless the profile grants `fs_read`/`fs_write`; terminal never),
  then `session/load` (the agent advertises `loadSession`) or `session/resume`
  (`sessionCapabilities.resume`) for a stored session, else `session/new`
  (`cwd`, the profile's `mcp_servers`). A load or resume the agent refuses
  falls back to `session/new`: the conversation goes on in a new session, and
  `Ready` names it. The history a load replays arrives before the load's
  response and is dropped, never shown as a turn's output;
- a turn: `session/prompt` (the message as a text block, attachments as
  resource links, which every ACP agent must accept); `session/update`
  notifications: `agent_message_chunk` text is streamed and, joined, is the
  reply; `agent_thought_chunk` is thinking, `tool_call`/`tool_call_update`
  tool activity, `plan` a plan; every other kind is ignored. The prompt's
  response ends the turn with its `stopReason`: `end_turn` is success,
  `max_tokens`, `max_turn_requests` and `refusal` fail it, `cancelled` ends
  it after our `session/cancel`; an error response fails it with its message;
- the agent's requests: `session/request_permission` becomes one
  `PermissionRequest` (the policy or the host decides; `answer` picks the
  agent's option of that kind); `fs/read_text_file`/`fs/write_text_file`
  become `FileRequest`s when the profile granted them; anything else is
  answered "method not found", so the agent never waits for an answer;
- `cancel()`: `session/cancel`, and every permission still pending answered
  `cancelled`, as the spec requires (so is a question the engine closes with
  `permissions.CANCELLED`). Closing stdin is the goodbye.

Preference when an agent can both load and resume: load (the older,
universally implemented method, whose replay is dropped here). Unknown
notifications, fields and update kinds are ignored (forward compatible).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any, ClassVar

from .. import __version__
from ..permissions import CANCELLED, TOOL_KINDS, Decision, PermissionRequest
from ..turn import Attachment, Turn
from .agentproc01 import session_id_problem
from .base import DialectContext, JsonLinesDialect, number, shorten, text_of
from .coding_agents import CALL_ID_CHARS, OUTPUT_CHARS, TEXT_BOUND, THINKING_CHARS, TITLE_CHARS, tool_title
from .events import (
    ActivityEvent,
    AgentInput,
    ErrorEvent,
    Event,
    FileRequest,
    PartialEvent,
    PlanStep,
    ProtocolWarning,
    Ready,
    ReplyEvent,
    TurnEnd,
    Usage,
    UsageEvent,
)
from .settings import AcpSettings

PROTOCOL_VERSION = 1
# JSON-RPC 2.0's own error codes, and ACP's "authentication required".
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
AUTH_REQUIRED = -32000

# ACP's tool kinds in the policy's words (permissions.TOOL_KINDS): only `execute` differs.
_KINDS = {kind: kind for kind in TOOL_KINDS} | {"execute": "exec"}
_FAILED_STOPS = {
    "max_tokens": "the agent stopped: the reply reached the model's token limit (max_tokens)",
    "max_turn_requests": "the agent stopped: the turn reached its limit of model requests (max_turn_requests)",
    "refusal": "the agent refused to continue (refusal)",
}
_PLAN_STATUSES = ("pending", "in_progress", "completed")
_OPEN_CALLS = 10_000  # tool calls remembered per turn; more than any agent keeps in flight


class Acp(JsonLinesDialect):
    """One ACP agent process: its session and its turns, one at a time (see the module docstring)."""

    name: ClassVar[str] = "acp"
    Settings: ClassVar[type] = AcpSettings

    def __init__(self, context: DialectContext, *, session_id: str, cwd: str) -> None:
        if not posixpath.isabs(cwd):
            raise ValueError(f"an ACP session's cwd must be an absolute path, not {cwd!r}")
        super().__init__(context, Turn())
        self._settings = context.settings if isinstance(context.settings, AcpSettings) else AcpSettings()
        self._stored_session = session_id
        self._cwd = cwd
        self._next_id = 0
        self._calls: dict[int, str] = {}  # our requests awaiting a response: id → method
        self._session_id = ""
        self._ready = False
        self._prompt_id: int | None = None  # the turn in progress: its session/prompt's id
        self._cancelling = False
        self._denied = ""  # "<tool> was denied…" this turn, for the agent that then stops the turn
        self._pieces: list[str] = []
        self._reply_chars = 0
        self._tools: dict[str, tuple[str, str, str]] = {}  # call id → (tool, kind, title), this turn
        self._asked: dict[str, tuple[Any, tuple[Mapping[str, Any], ...]]] = {}  # request id → (JSON-RPC id, options)
        self._files: dict[str, tuple[Any, str]] = {}  # request id → (JSON-RPC id, read | write)
        self._stray = 0  # JSON-RPC messages the bridge was not waiting for
        self._foreign_updates = 0

    # ------------------------------------------------------------------ what the engine writes

    def open(self) -> bytes:
        capabilities = {
            "fs": {"readTextFile": self._settings.fs_read, "writeTextFile": self._settings.fs_write},
            "terminal": False,
        }
        return self._request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": capabilities,
                "clientInfo": {"name": "agent-bridge", "title": "agent-bridge", "version": __version__},
            },
        )

    def prompt(self, turn: Turn) -> bytes:
        if not self._ready or self._closed:
            raise RuntimeError("prompt() before the session is ready (wait for Ready)")
        if self._prompt_id is not None:
            raise RuntimeError("prompt() while a turn is in progress (wait for TurnEnd)")
        blocks: list[dict[str, Any]] = [{"type": "text", "text": turn.message}]
        blocks.extend(_resource_link(attachment) for attachment in turn.attachments)
        self._pieces = []
        self._reply_chars = 0
        self._tools = {}
        self._cancelling = False
        self._denied = ""
        data = self._request("session/prompt", {"sessionId": self._session_id, "prompt": blocks})
        self._prompt_id = self._next_id - 1
        return data

    def cancel(self) -> bytes:
        if self._prompt_id is None or self._cancelling or self._closed:
            return b""
        self._cancelling = True
        data = _encode({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": self._session_id}})
        for rpc_id, _ in self._asked.values():
            data += _result(rpc_id, {"outcome": {"outcome": "cancelled"}})
        self._asked.clear()
        return data

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes:
        asked = self._asked.pop(request.request_id, None)
        if asked is None or self._closed:
            return b""  # answered already (cancelled, say), or never asked
        rpc_id, options = asked
        if decision == CANCELLED:  # the engine closed the question because the turn is being cancelled
            return _result(rpc_id, {"outcome": {"outcome": "cancelled"}})
        if not decision.allow:
            self._denied = f"{request.title or request.tool} was denied" + (
                f": {decision.message}" if decision.message else ""
            )
        option = _choose(options, decision)
        outcome = (
            {"outcome": "selected", "optionId": option} if option is not None else {"outcome": "cancelled"}
        )  # the agent offered no option of the kind: nothing else is valid
        return _result(rpc_id, {"outcome": outcome})

    def file_reply(self, request_id: str, content: str | None = None, error: str | None = None) -> bytes:
        """The answer to a `FileRequest`: the text read (`content`; nothing for a write done), or an `error`."""
        pending = self._files.pop(request_id, None)
        if pending is None or self._closed:
            return b""
        rpc_id, operation = pending
        if error is not None:
            return _error(rpc_id, INTERNAL_ERROR, error)
        return _result(rpc_id, {"content": content or ""} if operation == "read" else {})

    def shutdown(self) -> bytes:
        return b""  # closing stdin is ACP's goodbye

    # ------------------------------------------------------------------ what the agent writes

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self._prompt_id is not None:
            self._prompt_id = None
            events.append(
                ErrorEvent(
                    "the agent's output ended in the middle of the turn (the agent exited or "
                    "closed its stdout); its stderr may say why",
                    unfinished=True,
                )
            )
        elif not self._ready:
            events.append(
                ErrorEvent(
                    "the agent's output ended before its ACP session was ready; its stderr may say why", unfinished=True
                )
            )
        if self._stray:
            events.append(ProtocolWarning(f"ignored {self._stray} JSON-RPC message(s) the bridge was not waiting for"))
        if self._foreign_updates:
            events.append(ProtocolWarning(f"ignored {self._foreign_updates} session/update(s) of another session"))
        return events

    def on_other_line(self, line: str) -> list[Event]:
        super().on_other_line(line)  # counted: one warning at the end says how many
        if self._ignored == 1:
            return [
                ProtocolWarning(
                    "the agent wrote a stdout line that is no JSON-RPC message; ignored (so are any "
                    "more: their number is logged at the end)"
                )
            ]
        return []

    def on_object(self, message: Mapping[str, Any]) -> list[Event]:
        return self._on_message(message)

    def _on_message(self, message: Mapping[str, Any]) -> list[Event]:
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:
                return self._on_request(message["id"], method, message.get("params"))
            if method == "session/update":
                return self._on_update(message.get("params"))
            return []  # other notifications (vendor extensions such as _kiro.dev/…): nothing to show
        rpc_id = message.get("id")
        method = self._calls.pop(rpc_id, None) if isinstance(rpc_id, int) and not isinstance(rpc_id, bool) else None
        if method is None:
            self._stray += 1
            return []
        error = message.get("error")
        if isinstance(error, dict) or "result" not in message:
            return self._on_error(method, error if isinstance(error, dict) else {})
        return self._on_result(method, message.get("result"))

    # ------------------------------------------------------------------ responses to our requests

    def _on_result(self, method: str, result: Any) -> list[Event]:
        result = result if isinstance(result, dict) else {}
        if method == "initialize":
            return self._initialized(result)
        if method == "session/new":
            session_id = result.get("sessionId")
            problem = session_id_problem(session_id) if isinstance(session_id, str) else "it is missing"
            if problem is not None:
                return [
                    ErrorEvent(
                        f"the agent's session/new answered no usable session id ({problem}); it cannot "
                        "be resumed, so the bridge does not use it"
                    )
                ]
            return self._session_ready(session_id)
        if method in ("session/load", "session/resume"):
            return self._session_ready(self._stored_session)
        if method == "session/prompt":
            return self._turn_ended(result)
        return []

    def _on_error(self, method: str, error: Mapping[str, Any]) -> list[Event]:
        code = number(error.get("code"))
        said = _error_text(error)
        if method in ("session/load", "session/resume"):
            return [
                ProtocolWarning(
                    f"the agent could not {method.removeprefix('session/')} the stored session "
                    f"(JSON-RPC error {code}); a new session was started"
                ),
                AgentInput(self._new_session()),
            ]
        if method == "session/prompt":
            self._prompt_id = None
            self._asked.clear()
            self._files.clear()
            if self._cancelling:  # an agent whose cancelled work raised: the turn was cancelled all the same
                return [TurnEnd("cancelled")]
            return [ErrorEvent(said or f"the agent failed the turn (JSON-RPC error {code})"), TurnEnd("error")]
        if code == AUTH_REQUIRED:
            return [
                ErrorEvent(
                    f"the agent needs to be logged in before it takes a session ({said or 'auth required'}"
                    "); log in with the agent's own command once, as the user the bridge runs as, or "
                    "give it an API key in the profile's env"
                )
            ]
        return [ErrorEvent(f"the agent refused ACP {method}: {said or f'JSON-RPC error {code}'}")]

    def _initialized(self, result: Mapping[str, Any]) -> list[Event]:
        version = result.get("protocolVersion")
        if version != PROTOCOL_VERSION:
            return [
                ErrorEvent(
                    f"the agent speaks ACP version {version!r}; agent-bridge speaks version "
                    f"{PROTOCOL_VERSION}: use a version of the agent that supports it"
                )
            ]
        capabilities = result.get("agentCapabilities")
        capabilities = capabilities if isinstance(capabilities, dict) else {}
        if not self._stored_session:
            return [AgentInput(self._new_session())]
        params = {"sessionId": self._stored_session, **self._session_params()}
        if capabilities.get("loadSession") is True:
            return [AgentInput(self._request("session/load", params))]
        session_capabilities = capabilities.get("sessionCapabilities")
        if isinstance(session_capabilities, dict) and session_capabilities.get("resume") is not None:
            return [AgentInput(self._request("session/resume", params))]
        return [
            ProtocolWarning(
                "the agent can neither load nor resume a session (it advertises neither "
                "loadSession nor sessionCapabilities.resume); a new session was started"
            ),
            AgentInput(self._new_session()),
        ]

    def _session_ready(self, session_id: str) -> list[Event]:
        self._session_id = session_id
        self._ready = True
        return [Ready(session_id)]

    def _turn_ended(self, result: Mapping[str, Any]) -> list[Event]:
        self._prompt_id = None
        self._asked.clear()
        self._files.clear()
        events: list[Event] = []
        usage = _usage(result.get("usage"))
        if usage is not None:
            events.append(UsageEvent(usage))
        reason = result.get("stopReason")
        if reason == "cancelled":
            if self._denied and not self._cancelling:  # codex-acp's "reject" aborts the turn
                events.append(
                    ErrorEvent(f"the agent stopped the turn when permission for {self._denied} (stop reason cancelled)")
                )
            elif not self._cancelling:
                events.append(ErrorEvent("the agent cancelled the turn by itself (stop reason cancelled)"))
            events.append(TurnEnd("cancelled"))
            return events
        if reason in _FAILED_STOPS:
            events += [ErrorEvent(_FAILED_STOPS[reason]), TurnEnd(reason)]
            return events
        if reason != "end_turn":
            events.append(
                ProtocolWarning(
                    f"the agent ended the turn with an unknown stop reason "
                    f"({shorten(str(reason), 40)}); taken as end_turn"
                )
            )
        events += [ReplyEvent("".join(self._pieces)), TurnEnd("end_turn")]
        self._pieces = []
        return events

    # ------------------------------------------------------------------ the agent's notifications

    def _on_update(self, params: Any) -> list[Event]:
        if self._prompt_id is None or not isinstance(params, dict):
            return []  # outside a turn: a load's replayed history, or late news of a finished turn
        if params.get("sessionId") != self._session_id:
            self._foreign_updates += 1
            return []
        update = params.get("update")
        kind = update.get("sessionUpdate") if isinstance(update, dict) else None
        if kind == "agent_message_chunk":
            text = _text(update.get("content"))
            if not text:
                return []
            if self._reply_chars < TEXT_BOUND:
                self._pieces.append(text)
                self._reply_chars += len(text)
            return [PartialEvent(text)]
        if kind == "agent_thought_chunk":
            text = _text(update.get("content"))
            return [ActivityEvent("thinking", text=text[:THINKING_CHARS])] if text.strip() else []
        if kind in ("tool_call", "tool_call_update"):
            return self._tool(update)
        if kind == "plan":
            return self._plan(update.get("entries"))
        return []  # user_message_chunk, available_commands_update, usage_update, current_mode_update…

    def _tool(self, update: Mapping[str, Any]) -> list[Event]:
        call_id = text_of(update.get("toolCallId"))
        known = self._tools.get(call_id)
        tool, kind, title = self._describe(update, known)
        status = update.get("status")
        if status in ("completed", "failed"):
            self._tools.pop(call_id, None)
            output = _tool_output(update.get("content"))
            return [ActivityEvent("tool", text=output, tool=tool, title=title, status=status, call_id=call_id)]
        if known is not None:
            self._tools[call_id] = (tool, kind, title)  # a later update may name it better
            return []  # pending → in_progress: shown once, as started
        if len(call_id) <= CALL_ID_CHARS and len(self._tools) < _OPEN_CALLS:
            self._tools[call_id] = (tool, kind, title)
        return [ActivityEvent("tool", tool=tool, title=title, status="started", call_id=call_id)]

    def _describe(self, tool_call: Mapping[str, Any], known: tuple[str, str, str] | None) -> tuple[str, str, str]:
        """The call's (tool, kind, title): its own fields, else what an earlier update of the call said."""
        old_tool, old_kind, old_title = known or ("", "", "")
        acp_kind = text_of(tool_call.get("kind"))
        kind = _KINDS.get(acp_kind, "other" if acp_kind else old_kind)
        tool = _tool_name(tool_call.get("_meta")) or old_tool or shorten(acp_kind, TITLE_CHARS) or "tool"
        title = (
            shorten(text_of(tool_call.get("title")), TITLE_CHARS) or old_title or tool_title(tool_call.get("rawInput"))
        )
        return tool, kind, title

    def _plan(self, entries: Any) -> list[Event]:
        if not isinstance(entries, list):
            return []
        steps = tuple(
            PlanStep(
                shorten(entry["content"], TITLE_CHARS),
                entry.get("status") if entry.get("status") in _PLAN_STATUSES else "pending",
            )
            for entry in entries
            if isinstance(entry, dict) and isinstance(entry.get("content"), str)
        )
        return [ActivityEvent("plan", plan=steps)]

    # ------------------------------------------------------------------ the agent's requests

    def _on_request(self, rpc_id: Any, method: str, params: Any) -> list[Event]:
        if not _valid_id(rpc_id):
            self._stray += 1
            return []  # no id to answer to
        params = params if isinstance(params, dict) else {}
        if method == "session/request_permission":
            return self._permission(rpc_id, params)
        operation = {"fs/read_text_file": "read", "fs/write_text_file": "write"}.get(method)
        if operation is not None and (self._settings.fs_read if operation == "read" else self._settings.fs_write):
            return self._file(rpc_id, operation, params)
        return [AgentInput(_error(rpc_id, METHOD_NOT_FOUND, f"agent-bridge does not offer {shorten(method, 80)}"))]

    def _permission(self, rpc_id: Any, params: Mapping[str, Any]) -> list[Event]:
        if self._prompt_id is None or self._cancelling:
            # Nobody can answer outside a turn, and a cancelled turn's questions are answered cancelled.
            return [AgentInput(_result(rpc_id, {"outcome": {"outcome": "cancelled"}}))]
        tool_call = params.get("toolCall")
        options = params.get("options")
        if not isinstance(tool_call, dict) or not isinstance(options, list) or not options:
            return [AgentInput(_error(rpc_id, INVALID_PARAMS, "a permission request needs a toolCall and options"))]
        request_id = _request_key(rpc_id)
        call_id = text_of(tool_call.get("toolCallId"))
        tool, kind, title = self._describe(tool_call, self._tools.get(call_id))
        if call_id in self._tools:
            self._tools[call_id] = (tool, kind, title)  # its end is reported with the name the question gave
        raw_input = tool_call.get("rawInput")
        self._asked[request_id] = (rpc_id, tuple(option for option in options if isinstance(option, dict)))
        return [
            PermissionRequest(
                request_id=request_id,
                tool=tool,
                kind=kind,
                title=title,
                input=raw_input if isinstance(raw_input, dict) else {},
            )
        ]

    def _file(self, rpc_id: Any, operation: str, params: Mapping[str, Any]) -> list[Event]:
        path = params.get("path")
        content = params.get("content")
        line, limit = params.get("line"), params.get("limit")
        valid = (
            isinstance(path, str)
            and posixpath.isabs(path)
            and "\0" not in path
            and (operation == "read" or isinstance(content, str))
            and all(value is None or (number(value) is not None and value >= 1) for value in (line, limit))
        )
        if not valid or self._prompt_id is None:
            why = "a path must be absolute and content a string" if not valid else "no turn is in progress"
            return [AgentInput(_error(rpc_id, INVALID_PARAMS, f"cannot serve this {operation}: {why}"))]
        request_id = _request_key(rpc_id)
        self._files[request_id] = (rpc_id, operation)
        return [
            FileRequest(
                request_id=request_id,
                operation=operation,  # type: ignore[arg-type]
                path=path,
                content=content if operation == "write" else None,
                line=line,
                limit=limit,
            )
        ]

    # ------------------------------------------------------------------ helpers

    def _new_session(self) -> bytes:
        return self._request("session/new", self._session_params())

    def _session_params(self) -> dict[str, Any]:
        return {"cwd": self._cwd, "mcpServers": list(self._settings.mcp_servers or [])}

    def _request(self, method: str, params: Mapping[str, Any]) -> bytes:
        rpc_id = self._next_id
        self._next_id += 1
        self._calls[rpc_id] = method
        return _encode({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})


# ---------------------------------------------------------------------- JSON-RPC in ACP's words


def _encode(message: Mapping[str, Any]) -> bytes:
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "replace")


def _result(rpc_id: Any, result: Any) -> bytes:
    return _encode({"jsonrpc": "2.0", "id": rpc_id, "result": result})


def _error(rpc_id: Any, code: int, message: str) -> bytes:
    return _encode({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}})


def _valid_id(rpc_id: Any) -> bool:
    return isinstance(rpc_id, str) or (isinstance(rpc_id, int) and not isinstance(rpc_id, bool))


def _request_key(rpc_id: Any) -> str:
    """The agent's JSON-RPC id (a string or a number) as the bridge's request id."""
    return rpc_id if isinstance(rpc_id, str) else str(rpc_id)


def _choose(options: tuple[Mapping[str, Any], ...], decision: Decision) -> str | None:
    """The agent's option for `decision`: allow_always when `always` (and offered), else allow_once; deny alike.

    An agent that offers only the other form of the answer gets that form: its
    tool asks once for the session, or every time.
    """
    side = "allow" if decision.allow else "reject"
    preferred = (f"{side}_always", f"{side}_once") if decision.always else (f"{side}_once", f"{side}_always")
    for kind in preferred:
        for option in options:
            if option.get("kind") == kind and isinstance(option.get("optionId"), str):
                return option["optionId"]
    return None


def _error_text(error: Mapping[str, Any]) -> str:
    """A JSON-RPC error as a person reads it: its message and, where the agent gave one, its detail.

    Agents built on the SDKs answer a generic "Internal error" and put what went
    wrong in `data` (codex-acp: `data.message`; gemini: `data.details`).
    """
    message = text_of(error.get("message")).strip()
    data = error.get("data")
    detail = (
        data
        if isinstance(data, str)
        else text_of(data.get("message")) or text_of(data.get("details"))
        if isinstance(data, dict)
        else ""
    )
    detail = detail.strip()
    return shorten(f"{message}: {detail}" if message and detail else message or detail, 500)


def _resource_link(attachment: Attachment) -> dict[str, Any]:
    return {"type": "resource_link", "uri": attachment.url, "name": attachment.name or attachment.url}


def _text(content: Any) -> str:
    """The text of a content block (images, audio and resources in a reply are not text: nothing)."""
    if isinstance(content, dict) and content.get("type") == "text":
        return text_of(content.get("text"))
    return ""


def _tool_output(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    texts = [_text(item.get("content")) for item in content if isinstance(item, dict) and item.get("type") == "content"]
    return shorten(" ".join(text for text in texts if text), OUTPUT_CHARS)


def _tool_name(meta: Any) -> str:
    """The tool's own name where the agent puts one in `_meta` (Claude Code's adapter: `claudeCode.toolName`)."""
    if not isinstance(meta, dict):
        return ""
    for value in meta.values():
        if isinstance(value, dict) and isinstance(value.get("toolName"), str) and value["toolName"]:
            return shorten(value["toolName"], TITLE_CHARS)
    return ""


def _usage(usage: Any) -> Usage | None:
    """ACP's (unstable) per-turn `usage` of a prompt response."""
    if not isinstance(usage, dict):
        return None
    values = Usage(
        input_tokens=number(usage.get("inputTokens")),
        output_tokens=number(usage.get("outputTokens")),
        cached_input_tokens=number(usage.get("cachedReadTokens")),
        reasoning_tokens=number(usage.get("thoughtTokens")),
        total_tokens=number(usage.get("totalTokens")),
    )
    return values if values != Usage() else None
