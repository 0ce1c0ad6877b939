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
- a turn: `session/prompt` (the message as a text block; a fetched image as
  an `image` block, base64, when the agent's `promptCapabilities.image` says
  it takes them; any other fetched file as a resource link to its local file,
  `file://` + its path; an attachment not fetched as a link to its URL:
  resource links are what every ACP agent must accept); `session/update`
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
  answered "method not found", so the agent never waits for an answer.
  `$/cancel_request` of a permission request still waiting withdraws it:
  `RequestWithdrawn`, the request is answered with error -32800 at once, and
  the host's later answer writes nothing;
- `cancel()`: `session/cancel`, and every permission still pending answered
  `cancelled`, as the spec requires (so is a question the engine closes with
  `permissions.CANCELLED`). Closing stdin is the goodbye.

Preference when an agent can both load and resume: load (the older,
universally implemented method, whose replay is dropped here). Unknown
notifications, fields and update kinds are ignored (forward compatible).
"""

from __future__ import annotations

import pathlib
import posixpath
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from ..permissions import CANCELLED, TOOL_KINDS, Decision, PermissionRequest
from ..turn import Attachment, Turn
from ..version import __version__
from .agentproc01 import session_id_problem
from .base import DialectContext, Handler, number, outbox_named, shorten, text_of
from .coding_agents import (
    OUTPUT_CHARS,
    THINKING_CHARS,
    TITLE_CHARS,
    Paragraphs,
    ToolCall,
    ToolCalls,
    image_data,
    tool_title,
)
from .events import (
    ActivityEvent,
    AgentInput,
    ErrorEvent,
    Event,
    FileRequest,
    PlanStep,
    ProtocolWarning,
    ReplyEvent,
    RequestWithdrawn,
    SessionGone,
    Usage,
    UsageEvent,
)
from .jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, Wire, error_text, request_key, valid_id
from .settings import AcpSettings
from .warm import WarmDialect, WarmState

PROTOCOL_VERSION = 1
# ACP's "authentication required" and "resource not found" (JSON-RPC's own codes: `jsonrpc`).
AUTH_REQUIRED = -32000
RESOURCE_NOT_FOUND = -32002
REQUEST_CANCELLED = -32800  # the answer to a request its sender withdrew (`$/cancel_request`)

# ACP's tool kinds in the policy's words (permissions.TOOL_KINDS): only `execute` differs.
_KINDS = {kind: kind for kind in TOOL_KINDS} | {"execute": "exec"}
_FAILED_STOPS = {
    "max_tokens": "the agent stopped: the reply reached the model's token limit (max_tokens)",
    "max_turn_requests": "the agent stopped: the turn reached its limit of model requests (max_turn_requests)",
    "refusal": "the agent refused to continue (refusal)",
}
_PLAN_STATUSES = ("pending", "in_progress", "completed")


class Acp(WarmDialect):
    """One ACP agent process: its session and its turns, one at a time (see the module docstring)."""

    name: ClassVar[str] = "acp"
    Settings: ClassVar[type] = AcpSettings

    def __init__(self, context: DialectContext, *, session_id: str, cwd: str) -> None:
        if not posixpath.isabs(cwd):
            raise ValueError(f"an ACP session's cwd must be an absolute path, not {cwd!r}")
        super().__init__(context, session_id=session_id, cwd=cwd)
        self._settings = context.settings if isinstance(context.settings, AcpSettings) else AcpSettings()
        self._stored_session = session_id
        self._cwd = cwd
        self._images = False  # the agent takes image blocks in a prompt (promptCapabilities.image)
        self._rpc = Wire()
        self._session_id = ""
        self._cancelling = False
        self._denied = ""  # "<tool> was denied…" this turn, for the agent that then stops the turn
        self._text = Paragraphs(keep=True)  # the message chunks, joined: the reply
        self._tools = ToolCalls()  # this turn's
        self._asked: dict[str, tuple[Any, tuple[Mapping[str, Any], ...]]] = {}  # request id → (JSON-RPC id, options)
        self._files: dict[str, tuple[Any, str]] = {}  # request id → (JSON-RPC id, read | write)
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

    def start_turn(self, turn: Turn, outbox: str) -> bytes:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": turn.message}]
        blocks.extend(_attachment_block(attachment, self._images) for attachment in turn.attachments)
        if outbox:  # a block of its own, after the user's: the message stays as sent
            blocks.append({"type": "text", "text": outbox_named(outbox)})
        self._text = Paragraphs(keep=True)
        self._tools = ToolCalls()
        self._cancelling = False
        self._denied = ""
        return self._request("session/prompt", {"sessionId": self._session_id, "prompt": blocks})

    def cancel(self) -> bytes:
        if self.state is not WarmState.IN_TURN or self._cancelling:
            return b""
        self._cancelling = True
        data = self._rpc.notification("session/cancel", {"sessionId": self._session_id})
        for rpc_id, _ in self._asked.values():
            data += self._rpc.result(rpc_id, {"outcome": {"outcome": "cancelled"}})
        self._asked.clear()
        return data

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes:
        asked = self._asked.pop(request.request_id, None)
        if asked is None or self.state is WarmState.CLOSED:
            return b""  # answered already (cancelled, say), or never asked
        rpc_id, options = asked
        if decision == CANCELLED:  # the engine closed the question because the turn is being cancelled
            return self._rpc.result(rpc_id, {"outcome": {"outcome": "cancelled"}})
        if not decision.allow:
            self._denied = f"{request.title or request.tool} was denied" + (
                f": {decision.message}" if decision.message else ""
            )
        option = _choose(options, decision)
        outcome = (
            {"outcome": "selected", "optionId": option} if option is not None else {"outcome": "cancelled"}
        )  # the agent offered no option of the kind: nothing else is valid
        return self._rpc.result(rpc_id, {"outcome": outcome})

    def file_reply(self, request_id: str, content: str | None = None, error: str | None = None) -> bytes:
        """The answer to a `FileRequest`: the text read (`content`; nothing for a write done), or an `error`."""
        pending = self._files.pop(request_id, None)
        if pending is None or self.state is WarmState.CLOSED:
            return b""
        rpc_id, operation = pending
        if error is not None:
            return self._rpc.error(rpc_id, INTERNAL_ERROR, error)
        return self._rpc.result(rpc_id, {"content": content or ""} if operation == "read" else {})

    # ------------------------------------------------------------------ what the agent writes

    def finish(self) -> list[Event]:
        events = self.ended_early("the agent", "its ACP session")
        events.extend(self._rpc.stray_warnings())
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
        """A JSON-RPC message: a request or notification by its method (`requests`, `notifications`), a response by
        the method of the request it answers (`results`)."""
        method = message.get("method")
        if isinstance(method, str):
            if "id" in message:
                return self._on_request(message["id"], method, message.get("params"))
            notification = self.notifications.get(method)
            # Other notifications (vendor extensions such as _kiro.dev/…): nothing to show.
            return notification(self, message.get("params")) if notification is not None else []
        response = self._rpc.response(message)
        if response is None:
            return []
        method, result, error = response
        return self._on_error(method, error) if error is not None else self._on_result(method, result)

    # ------------------------------------------------------------------ responses to our requests

    def _on_result(self, method: str, result: Any) -> list[Event]:
        handler = self.results.get(method)
        return handler(self, result if isinstance(result, dict) else {}) if handler is not None else []

    def _session_created(self, result: Mapping[str, Any]) -> list[Event]:
        session_id = result.get("sessionId")
        if not isinstance(session_id, str) or (problem := session_id_problem(session_id)) is not None:
            problem = "it is missing" if not isinstance(session_id, str) else problem
            return [
                ErrorEvent(
                    f"the agent's session/new answered no usable session id ({problem}); it cannot "
                    "be resumed, so the bridge does not use it"
                )
            ]
        return self._session_ready(session_id)

    def _session_resumed(self, result: Mapping[str, Any]) -> list[Event]:
        return self._session_ready(self._stored_session)

    def _on_error(self, method: str, error: Mapping[str, Any]) -> list[Event]:
        code = number(error.get("code"))
        said = error_text(error)
        if method in ("session/load", "session/resume"):
            if code == RESOURCE_NOT_FOUND:  # the agent says it has no such session: the engine decides what follows
                return [SessionGone(said or f"JSON-RPC error {code}")]
            return [
                ProtocolWarning(
                    f"the agent could not {method.removeprefix('session/')} the stored session "
                    f"(JSON-RPC error {code}); a new session was started"
                ),
                AgentInput(self._new_session()),
            ]
        if method == "session/prompt":
            self._asked.clear()
            self._files.clear()
            if self._cancelling:  # an agent whose cancelled work raised: the turn was cancelled all the same
                return [self.turn_over("cancelled")]
            return [ErrorEvent(said or f"the agent failed the turn (JSON-RPC error {code})"), self.turn_over("error")]
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
        prompt_capabilities = capabilities.get("promptCapabilities")
        self._images = isinstance(prompt_capabilities, dict) and prompt_capabilities.get("image") is True
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
        return [self.session_ready(session_id)]

    def _turn_ended(self, result: Mapping[str, Any]) -> list[Event]:
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
            events.append(self.turn_over("cancelled"))
            return events
        if reason in _FAILED_STOPS:
            events += [ErrorEvent(_FAILED_STOPS[reason]), self.turn_over(reason)]
            return events
        if reason != "end_turn":
            events.append(
                ProtocolWarning(
                    f"the agent ended the turn with an unknown stop reason "
                    f"({shorten(str(reason), 40)}); taken as end_turn"
                )
            )
        events += [ReplyEvent(self._text.text), self.turn_over("end_turn")]
        self._text = Paragraphs(keep=True)
        return events

    # ------------------------------------------------------------------ the agent's notifications

    def _on_update(self, params: Any) -> list[Event]:
        if self.state is not WarmState.IN_TURN or not isinstance(params, dict):
            return []  # outside a turn: a load's replayed history, or late news of a finished turn
        if params.get("sessionId") != self._session_id:
            self._foreign_updates += 1
            return []
        update = params.get("update")
        if not isinstance(update, dict):
            return []
        kind = update.get("sessionUpdate")
        handler = self.updates.get(kind) if type(kind) is str else None
        # user_message_chunk, available_commands_update, usage_update, current_mode_update…: nothing to show.
        return handler(self, update) if handler is not None else []

    def _message_chunk(self, update: Mapping[str, Any]) -> list[Event]:
        text = _text(update.get("content"))
        return [self._text.add(text)] if text else []

    def _thought_chunk(self, update: Mapping[str, Any]) -> list[Event]:
        text = _text(update.get("content"))
        return [ActivityEvent("thinking", text=text[:THINKING_CHARS])] if text.strip() else []

    def _tool(self, update: Mapping[str, Any]) -> list[Event]:
        call_id = text_of(update.get("toolCallId"))
        known = self._tools.get(call_id)
        tool, kind, title = self._describe(update, known)
        status = update.get("status")
        if status in ("completed", "failed"):
            self._tools.forget(call_id)
            output = _tool_output(update.get("content"))
            return [ActivityEvent("tool", text=output, tool=tool, title=title, status=status, call_id=call_id)]
        self._tools.remember(call_id, ToolCall(tool, title, kind))  # a later update may name it better
        if known is not None:
            return []  # pending → in_progress: shown once, as started
        return [ActivityEvent("tool", tool=tool, title=title, status="started", call_id=call_id)]

    def _describe(self, tool_call: Mapping[str, Any], known: ToolCall | None) -> tuple[str, str, str]:
        """The call's (tool, kind, title): its own fields, else what an earlier update of the call said."""
        old_tool, old_kind, old_title = (known.tool, known.kind, known.title) if known is not None else ("", "", "")
        acp_kind = text_of(tool_call.get("kind"))
        kind = _KINDS.get(acp_kind, "other" if acp_kind else old_kind)
        tool = _tool_name(tool_call.get("_meta")) or old_tool or shorten(acp_kind, TITLE_CHARS) or "tool"
        title = (
            shorten(text_of(tool_call.get("title")), TITLE_CHARS) or old_title or tool_title(tool_call.get("rawInput"))
        )
        return tool, kind, title

    def _plan(self, update: Mapping[str, Any]) -> list[Event]:
        entries = update.get("entries")
        if not isinstance(entries, list):
            return []
        steps = tuple(
            PlanStep(
                shorten(entry["content"], TITLE_CHARS),
                entry["status"] if entry.get("status") in _PLAN_STATUSES else "pending",
            )
            for entry in entries
            if isinstance(entry, dict) and isinstance(entry.get("content"), str)
        )
        return [ActivityEvent("plan", plan=steps)]

    # ------------------------------------------------------------------ the agent's requests

    def _on_request(self, rpc_id: Any, method: str, params: Any) -> list[Event]:
        refused = self._rpc.refusal(rpc_id, method, self.requests)
        if refused is not None:
            return [AgentInput(refused)] if refused else []
        handler = self.requests[method]
        return handler(self, rpc_id, params if isinstance(params, dict) else {})

    def _permission(self, rpc_id: Any, params: Mapping[str, Any]) -> list[Event]:
        if self.state is not WarmState.IN_TURN or self._cancelling:
            # Nobody can answer outside a turn, and a cancelled turn's questions are answered cancelled.
            return [AgentInput(self._rpc.result(rpc_id, {"outcome": {"outcome": "cancelled"}}))]
        tool_call = params.get("toolCall")
        options = params.get("options")
        if not isinstance(tool_call, dict) or not isinstance(options, list) or not options:
            return [
                AgentInput(self._rpc.error(rpc_id, INVALID_PARAMS, "a permission request needs a toolCall and options"))
            ]
        request_id = request_key(rpc_id)
        call_id = text_of(tool_call.get("toolCallId"))
        tool, kind, title = self._describe(tool_call, self._tools.get(call_id))
        if call_id in self._tools:  # its end is reported with the name the question gave
            self._tools.remember(call_id, ToolCall(tool, title, kind))
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

    def _cancel_request(self, params: Any) -> list[Event]:
        """`$/cancel_request`: the agent withdraws a permission request still waiting for its answer. The spec wants
        every request answered, so it is, at once, with the cancellation error; the host's late answer writes
        nothing."""
        rpc_id = params.get("requestId") if isinstance(params, dict) else None
        if not valid_id(rpc_id):
            return []
        request_id = request_key(rpc_id)
        if self._asked.pop(request_id, None) is None:
            return []  # answered already, never asked, or a file request (answered as soon as it is served)
        return [
            RequestWithdrawn(request_id),
            AgentInput(self._rpc.error(rpc_id, REQUEST_CANCELLED, "request cancelled")),
        ]

    def _read_file(self, rpc_id: Any, params: Mapping[str, Any]) -> list[Event]:
        if not self._settings.fs_read:
            return [AgentInput(self._rpc.not_offered(rpc_id, "fs/read_text_file"))]
        return self._file(rpc_id, "read", params)

    def _write_file(self, rpc_id: Any, params: Mapping[str, Any]) -> list[Event]:
        if not self._settings.fs_write:
            return [AgentInput(self._rpc.not_offered(rpc_id, "fs/write_text_file"))]
        return self._file(rpc_id, "write", params)

    def _file(self, rpc_id: Any, operation: Literal["read", "write"], params: Mapping[str, Any]) -> list[Event]:
        path = params.get("path")
        path = path if isinstance(path, str) else ""
        content = params.get("content")
        line, limit = params.get("line"), params.get("limit")
        valid = (
            posixpath.isabs(path)
            and "\0" not in path
            and (operation == "read" or isinstance(content, str))
            and all(value is None or (number(value) is not None and value >= 1) for value in (line, limit))
        )
        if not valid or self.state is not WarmState.IN_TURN:
            why = "a path must be absolute and content a string" if not valid else "no turn is in progress"
            return [AgentInput(self._rpc.error(rpc_id, INVALID_PARAMS, f"cannot serve this {operation}: {why}"))]
        request_id = request_key(rpc_id)
        self._files[request_id] = (rpc_id, operation)
        return [
            FileRequest(
                request_id=request_id,
                operation=operation,
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
        return self._rpc.request(method, params)

    # ------------------------------------------------------------------ the tables

    requests: ClassVar[Mapping[str, Callable[[Any, Any, Mapping[str, Any]], list[Event]]]] = {
        "session/request_permission": _permission,
        "fs/read_text_file": _read_file,
        "fs/write_text_file": _write_file,
    }
    """The agent's requests the bridge serves: method → the method that answers (given the JSON-RPC id and params);
    any other is answered "method not found"."""
    notifications: ClassVar[Mapping[str, Callable[[Any, Any], list[Event]]]] = {
        "session/update": _on_update,
        "$/cancel_request": _cancel_request,
    }
    results: ClassVar[Mapping[str, Handler]] = {
        "initialize": _initialized,
        "session/new": _session_created,
        "session/load": _session_resumed,
        "session/resume": _session_resumed,
        "session/prompt": _turn_ended,
    }
    """The responses to the bridge's own requests, by the method of the request."""
    updates: ClassVar[Mapping[str, Handler]] = {
        "agent_message_chunk": _message_chunk,
        "agent_thought_chunk": _thought_chunk,
        "tool_call": _tool,
        "tool_call_update": _tool,
        "plan": _plan,
    }
    """`session/update`s by their `sessionUpdate` kind."""


# ---------------------------------------------------------------------- ACP's answers


def _choose(options: tuple[Mapping[str, Any], ...], decision: Decision) -> str | None:
    """The agent's option for `decision`: allow_always when `always` (and offered), else allow_once; deny alike.

    An agent that offers only the other form of the answer gets that form: its
    tool asks once for the session, or every time.
    """
    side = "allow" if decision.allow else "reject"
    preferred = (f"{side}_always", f"{side}_once") if decision.always else (f"{side}_once", f"{side}_always")
    for kind in preferred:
        for option in options:
            option_id = option.get("optionId")
            if option.get("kind") == kind and isinstance(option_id, str):
                return option_id
    return None


def _attachment_block(attachment: Attachment, images: bool) -> dict[str, Any]:
    """An attachment as a prompt block: a fetched image as an `image` block (base64) when the agent takes them, any
    other fetched file as a resource link to its local file (`file://`), one not fetched as a link to its URL."""
    if not attachment.path:
        return {"type": "resource_link", "uri": attachment.url, "name": attachment.name or attachment.url}
    if images and (data := image_data(attachment)) is not None:
        return {"type": "image", "mimeType": attachment.media_type, "data": data, "uri": _file_uri(attachment.path)}
    link: dict[str, Any] = {"type": "resource_link", "uri": _file_uri(attachment.path), "name": attachment.name}
    if attachment.media_type:
        link["mimeType"] = attachment.media_type
    if attachment.size is not None:
        link["size"] = attachment.size
    return link


def _file_uri(path: str) -> str:
    return pathlib.PurePosixPath(path).as_uri()


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
