"""The agent side of the Agent Client Protocol, as `agent-bridge acp` speaks it to an editor. Sans-I/O.

`AcpAgentSide` takes the editor's JSON-RPC messages one line at a time and
the host's turn events as they come, and says what to do: messages to write
(`Send`), turns to start (`StartPrompt`), to cancel (`CancelPrompt`), and
answers to give the agent (`Decide`, `Answer`). It holds the state of one
client (the editor at the other end of stdin/stdout): whether it said
`initialize`, the sessions it made or loaded, the prompt running in each and
what of its reply was streamed, and the requests sent to it awaiting an
answer. It does no I/O and reads no clock; new session ids come from the
`new_session_id` it is given.

An ACP session is a conversation of the bridge's session store: its id is
the conversation's key, so `session/load` in a later process goes on with
it. Ids are unguessable (the runner makes them with `secrets`), and a
session is this client's only once it made or loaded it: a prompt naming any
other id is refused as an unknown session.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..dialects import ActivityEvent, PartialEvent, Usage
from ..dialects.acp import PROTOCOL_VERSION, RESOURCE_NOT_FOUND
from ..dialects.events import FileEvent, Question, QuestionRequest, RequestWithdrawn
from ..dialects.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, valid_id
from ..engine.result import Outcome, TurnResult
from ..errors import AcpRefused, TurnError
from ..permissions import TOOL_KINDS, Decision, PermissionRequest
from ..turn import Attachment, Turn
from ..version import __version__

PARSE_ERROR = -32700
SESSION_ID = re.compile(r"acp-[A-Za-z0-9_-]{16,64}")
# The stop reasons an agent's failed turn names at the end of its error (bridge.dialects.acp's words).
_STOPS_IN_ERRORS = ("max_tokens", "max_turn_requests", "refusal")
_ACP_TOOL_KINDS = {kind: kind for kind in TOOL_KINDS} | {"exec": "execute"}
_PERMISSION_OPTIONS = (
    {"optionId": "allow_once", "name": "Allow", "kind": "allow_once"},
    {"optionId": "allow_always", "name": "Always allow", "kind": "allow_always"},
    {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
)
_DECISIONS = {
    "allow_once": Decision(allow=True),
    "allow_always": Decision(allow=True, always=True),
    "reject_once": Decision(allow=False),
}
_DECLINE = "decline"


@dataclass(frozen=True, slots=True)
class Send:
    """Write this JSON-RPC message to the editor."""

    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StartPrompt:
    """Run `turn` in session `session_id` (the conversation of that key); `finished()` with its result."""

    session_id: str
    turn: Turn


@dataclass(frozen=True, slots=True)
class CancelPrompt:
    """Cancel the prompt running in session `session_id`."""

    session_id: str


@dataclass(frozen=True, slots=True)
class Decide:
    """Answer the agent's permission request `request_id` in session `session_id`."""

    session_id: str
    request_id: str
    decision: Decision


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the agent's question `request_id` in session `session_id` (None declines)."""

    session_id: str
    request_id: str
    answers: dict[str, list[str]] | None


Action = Send | StartPrompt | CancelPrompt | Decide | Answer


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What `initialize` says the profile can do (see `serving.acp.capabilities_of`)."""

    load_session: bool
    images: bool


@dataclass(slots=True)
class _Prompt:
    rpc_id: Any
    streamed: list[str] = field(default_factory=list)  # the partials sent, to send only what the reply adds
    tools: set[str] = field(default_factory=set)  # tool call ids announced with `tool_call`


@dataclass(frozen=True, slots=True)
class _Asked:
    """A `session/request_permission` we sent: for a permission, or for a question (its id and choices)."""

    session_id: str
    request_id: str
    question: Question | None = None


class AcpAgentSide:
    """One editor's ACP connection (see the module docstring)."""

    def __init__(self, capabilities: Capabilities, new_session_id: Callable[[], str]) -> None:
        self._capabilities = capabilities
        self._new_session_id = new_session_id
        self._initialized = False
        self._sessions: dict[str, _Prompt | None] = {}  # this client's sessions → the prompt running in each
        self._asked: dict[int, _Asked] = {}  # our request id → what it asked
        self._next_id = 0

    # ------------------------------------------------------------------ the editor's messages

    def receive(self, line: str) -> list[Action]:
        """The actions one line from the editor calls for; a line that is not a request gets an error, never raises."""
        if not line.strip():
            return []
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as err:
            return [_error(None, PARSE_ERROR, f"the line is not JSON: {str(err)[:200]}")]
        if not isinstance(message, dict):
            return [_error(None, INVALID_REQUEST, "a message must be a JSON object (batches are not supported)")]
        method = message.get("method")
        rpc_id = message.get("id")
        if method is None:
            return self._response(message)
        if not isinstance(method, str):
            return [_error(rpc_id if valid_id(rpc_id) else None, INVALID_REQUEST, "method must be a string")]
        if "id" not in message:
            return self._notification(method, message.get("params"))
        if not valid_id(rpc_id):
            return [_error(None, INVALID_REQUEST, "id must be a string or a whole number")]
        try:
            return self._request(rpc_id, method, _params(message.get("params")))
        except AcpRefused as err:
            return [_error(rpc_id, err.rpc_code, err.message)]

    def _request(self, rpc_id: Any, method: str, params: Mapping[str, Any]) -> list[Action]:
        if method == "initialize":
            self._initialized = True
            return [_result(rpc_id, self._initialize_result())]
        if method == "authenticate":
            return [_result(rpc_id, {})]
        if method not in ("session/new", "session/load", "session/prompt"):
            raise AcpRefused(METHOD_NOT_FOUND, f"agent-bridge acp does not offer {method[:80]!r}")
        if not self._initialized:
            raise AcpRefused(INVALID_REQUEST, f"{method} before initialize: send initialize first")
        if method == "session/new":
            _cwd(params)
            session_id = self._new_session_id()
            self._sessions[session_id] = None
            return [_result(rpc_id, {"sessionId": session_id})]
        if method == "session/load":
            return self._load(rpc_id, params)
        return self._prompt(rpc_id, params)

    def _initialize_result(self) -> dict[str, Any]:
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": self._capabilities.load_session,
                "promptCapabilities": {
                    "image": self._capabilities.images,
                    "audio": False,
                    "embeddedContext": True,
                },
                "mcpCapabilities": {"http": False, "sse": False},
            },
            "authMethods": [],
            "agentInfo": {"name": "agent-bridge", "title": "agent-bridge", "version": __version__},
        }

    def _load(self, rpc_id: Any, params: Mapping[str, Any]) -> list[Action]:
        if not self._capabilities.load_session:
            raise AcpRefused(METHOD_NOT_FOUND, "this profile's sessions do not resume: use session/new")
        _cwd(params)
        session_id = params.get("sessionId")
        if not isinstance(session_id, str) or not SESSION_ID.fullmatch(session_id):
            raise AcpRefused(RESOURCE_NOT_FOUND, "no such session: pass a sessionId session/new gave")
        if self._sessions.get(session_id) is not None:
            raise AcpRefused(INVALID_REQUEST, "a prompt is running in this session; wait for it or cancel it")
        self._sessions[session_id] = None
        return [_result(rpc_id, {})]

    def _prompt(self, rpc_id: Any, params: Mapping[str, Any]) -> list[Action]:
        session_id = self._own_session(params)
        if self._sessions[session_id] is not None:
            raise AcpRefused(INVALID_REQUEST, "a prompt is already running in this session; wait for it or cancel it")
        turn = turn_of(params.get("prompt"), images=self._capabilities.images)
        self._sessions[session_id] = _Prompt(rpc_id)
        return [StartPrompt(session_id, turn)]

    def _own_session(self, params: Mapping[str, Any]) -> str:
        session_id = params.get("sessionId")
        if not isinstance(session_id, str) or session_id not in self._sessions:
            raise AcpRefused(
                RESOURCE_NOT_FOUND,
                "unknown session: this client did not create or load it (session/new, session/load)",
            )
        return session_id

    def _notification(self, method: str, params: Any) -> list[Action]:
        if method != "session/cancel" or not isinstance(params, dict):
            return []  # unknown notifications are ignored, as JSON-RPC asks
        session_id = params.get("sessionId")
        if isinstance(session_id, str) and self._sessions.get(session_id) is not None:
            return [CancelPrompt(session_id)]
        return []

    def _response(self, message: Mapping[str, Any]) -> list[Action]:
        rpc_id = message.get("id")
        asked = self._asked.pop(rpc_id, None) if type(rpc_id) is int else None
        if asked is None:
            return []  # an answer to nothing we asked (or asked already): nothing to do
        result = message.get("result")
        outcome = result.get("outcome") if isinstance(result, dict) else None
        chosen = outcome.get("optionId") if isinstance(outcome, dict) and outcome.get("outcome") == "selected" else ""
        if asked.question is not None:
            labels = [option.label for option in asked.question.options]
            picked = {asked.question.id: [chosen]} if chosen in labels else None
            return [Answer(asked.session_id, asked.request_id, picked)]
        decision = _DECISIONS.get(chosen if isinstance(chosen, str) else "", Decision(allow=False))
        return [Decide(asked.session_id, asked.request_id, decision)]

    # ------------------------------------------------------------------ the turn's events

    def event(self, session_id: str, event: object, file_uri: str = "") -> list[Action]:
        """What the editor is told of one event of the prompt running in `session_id` (`file_uri`: a FileEvent's)."""
        prompt = self._sessions.get(session_id)
        if prompt is None:
            return []
        if type(event) is PartialEvent:
            prompt.streamed.append(event.text)
            return [_update(session_id, _chunk("agent_message_chunk", event.text))]
        if type(event) is ActivityEvent:
            return self._activity(session_id, prompt, event)
        if type(event) is PermissionRequest:
            return [self._ask(session_id, event.request_id, _tool_call(event), _PERMISSION_OPTIONS)]
        if type(event) is QuestionRequest:
            return self._question(session_id, event)
        if type(event) is RequestWithdrawn:
            return self._withdraw(session_id, event.request_id)
        if type(event) is FileEvent:
            return [_update(session_id, {"sessionUpdate": "agent_message_chunk", "content": _link(event, file_uri)})]
        return []

    def _activity(self, session_id: str, prompt: _Prompt, event: ActivityEvent) -> list[Action]:
        if event.activity == "thinking" and event.text:
            return [_update(session_id, _chunk("agent_thought_chunk", event.text))]
        if event.activity == "plan":
            entries = [{"content": step.text, "priority": "medium", "status": step.status} for step in event.plan]
            return [_update(session_id, {"sessionUpdate": "plan", "entries": entries})]
        if event.activity != "tool" or not event.call_id:
            return []
        status = {"started": "in_progress", "completed": "completed", "failed": "failed"}.get(event.status, "")
        update: dict[str, Any] = {"toolCallId": event.call_id}
        if status:
            update["status"] = status
        if event.text:
            update["content"] = [{"type": "content", "content": {"type": "text", "text": event.text}}]
        if event.call_id in prompt.tools:
            return [_update(session_id, {"sessionUpdate": "tool_call_update", **update})]
        prompt.tools.add(event.call_id)
        title = event.title or event.tool or "tool"
        return [_update(session_id, {"sessionUpdate": "tool_call", "title": title, "kind": "other", **update})]

    def _question(self, session_id: str, event: QuestionRequest) -> list[Action]:
        """A question with one choice to make is asked as a permission whose options are its choices; any other
        (several questions, several choices, only words) is declined: ACP has no message to ask it."""
        if len(event.questions) != 1 or event.questions[0].multi_select or not event.questions[0].options:
            return [Answer(session_id, event.request_id, None)]
        question = event.questions[0]
        options = [
            {"optionId": option.label, "name": option.label, "kind": "allow_once"} for option in question.options
        ]
        options.append({"optionId": _DECLINE, "name": "Decline to answer", "kind": "reject_once"})
        tool_call = {
            "toolCallId": event.request_id,
            "title": question.prompt,
            "kind": "other",
            "status": "pending",
            "rawInput": question.to_dict(),
        }
        return [self._ask(session_id, event.request_id, tool_call, options, question)]

    def _ask(
        self,
        session_id: str,
        request_id: str,
        tool_call: dict[str, Any],
        options: Any,
        question: Question | None = None,
    ) -> Send:
        rpc_id = self._next_id
        self._next_id += 1
        self._asked[rpc_id] = _Asked(session_id, request_id, question)
        params = {"sessionId": session_id, "toolCall": tool_call, "options": list(options)}
        return Send({"jsonrpc": "2.0", "id": rpc_id, "method": "session/request_permission", "params": params})

    def _withdraw(self, session_id: str, request_id: str) -> list[Action]:
        for rpc_id, asked in list(self._asked.items()):
            if asked.session_id == session_id and asked.request_id == request_id:
                del self._asked[rpc_id]
                return [Send({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": rpc_id}})]
        return []

    def finished(self, session_id: str, result: TurnResult) -> list[Action]:
        """The prompt of `session_id` ended with `result`: the rest of its reply, then the prompt's response."""
        prompt = self._sessions.get(session_id)
        if prompt is None:
            return []
        self._sessions[session_id] = None
        self._forget_asked(session_id)
        actions: list[Action] = []
        rest = unsent_reply(result.reply, "".join(prompt.streamed))
        if rest:
            actions.append(_update(session_id, _chunk("agent_message_chunk", rest)))
        actions.append(self._prompt_response(prompt.rpc_id, result))
        return actions

    def failed(self, session_id: str, code: int, message: str) -> list[Action]:
        """The prompt of `session_id` was refused or ended without a result: its response is this error."""
        prompt = self._sessions.get(session_id)
        if prompt is None:
            return []
        self._sessions[session_id] = None
        self._forget_asked(session_id)
        return [_error(prompt.rpc_id, code, message)]

    def _forget_asked(self, session_id: str) -> None:
        for rpc_id in [rpc_id for rpc_id, asked in self._asked.items() if asked.session_id == session_id]:
            del self._asked[rpc_id]

    def _prompt_response(self, rpc_id: Any, result: TurnResult) -> Send:
        stop = stop_reason(result)
        if stop is None:
            data = {"outcome": str(result.outcome), "error": result.error, "exitCode": result.exit_code}
            message = result.error_reply or result.error or f"the turn failed ({result.outcome})"
            return Send(
                {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": INTERNAL_ERROR, "message": message, "data": data}}
            )
        response: dict[str, Any] = {"stopReason": stop}
        if result.usage is not None and (usage := _usage(result.usage)) is not None:
            response["usage"] = usage
        return _result(rpc_id, response)

    def running(self) -> list[str]:
        """The sessions with a prompt running."""
        return [session_id for session_id, prompt in self._sessions.items() if prompt is not None]


def stop_reason(result: TurnResult) -> str | None:
    """ACP's stop reason for a turn's result; None for a failed turn (answered with an error)."""
    if result.outcome is Outcome.OK:
        return "end_turn"
    if result.outcome is Outcome.CANCELLED:
        return "cancelled"
    for stop in _STOPS_IN_ERRORS:
        if result.outcome is Outcome.AGENT_ERROR and result.error.endswith(f"({stop})"):
            return stop
    return None


def unsent_reply(reply: str, streamed: str) -> str:
    """What of `reply` the partials did not show: all of it without partials, the rest when it goes on from them,
    else nothing (the partials were the reply, said otherwise: the editor has it)."""
    if not streamed:
        return reply
    return reply[len(streamed) :] if reply.startswith(streamed) else ""


def turn_of(prompt: Any, *, images: bool) -> Turn:
    """The turn a `session/prompt`'s content blocks make: text joined, images and embedded resources attached."""
    if not isinstance(prompt, list) or not prompt:
        raise AcpRefused(INVALID_PARAMS, "prompt must be a non-empty list of content blocks")
    texts: list[str] = []
    attachments: list[Attachment] = []
    for index, block in enumerate(prompt):
        if not isinstance(block, dict):
            raise AcpRefused(INVALID_PARAMS, f"prompt[{index}] must be a content block (an object)")
        kind = block.get("type")
        if kind == "text":
            texts.append(_string(block, "text", index))
        elif kind == "image" and images:
            attachments.append(_image(block, index))
        elif kind == "resource":
            attachments.append(_resource(block.get("resource"), index))
        elif kind == "resource_link":
            texts.append(_mention(block, index))
        else:
            raise AcpRefused(INVALID_PARAMS, f"prompt[{index}]: this agent takes no {str(kind)[:40]!r} blocks")
    try:
        return Turn(message="\n\n".join(texts), attachments=tuple(attachments))
    except TurnError as err:
        raise AcpRefused(INVALID_PARAMS, str(err)) from None


def _image(block: Mapping[str, Any], index: int) -> Attachment:
    data, media_type = _string(block, "data", index), _string(block, "mimeType", index)
    extension = mimetypes.guess_extension(media_type) or ""
    return Attachment(type="image", url=f"data:{media_type};base64,{data}", name=f"image-{index}{extension}")


def _resource(resource: Any, index: int) -> Attachment:
    """An embedded resource (a file the editor read for the user) as an attachment named after its URI."""
    if not isinstance(resource, dict):
        raise AcpRefused(INVALID_PARAMS, f"prompt[{index}].resource must be an object")
    uri = _string(resource, "uri", index)
    name = posixpath.basename(uri.split("?", 1)[0].rstrip("/")) or f"resource-{index}"
    media_type = resource.get("mimeType") if isinstance(resource.get("mimeType"), str) else ""
    if isinstance(resource.get("text"), str):
        data = base64.b64encode(resource["text"].encode("utf-8", "replace")).decode("ascii")
        media_type = media_type or "text/plain"
    else:
        data = _string(resource, "blob", index)
        media_type = media_type or "application/octet-stream"
    return Attachment(type="file", url=f"data:{media_type};base64,{data}", name=name)


def _mention(block: Mapping[str, Any], index: int) -> str:
    """A resource link stays a link, in the message: the agent reads what its profile lets it read."""
    uri = _string(block, "uri", index)
    name = block.get("name") if isinstance(block.get("name"), str) else ""
    return f"[{name}]({uri})" if name else uri


def _string(block: Mapping[str, Any], key: str, index: int) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise AcpRefused(INVALID_PARAMS, f"prompt[{index}] needs {key!r} (a string)")
    return value


def _cwd(params: Mapping[str, Any]) -> None:
    cwd = params.get("cwd")
    if not isinstance(cwd, str) or not posixpath.isabs(cwd):
        raise AcpRefused(INVALID_PARAMS, "cwd must be an absolute path (the agent runs where its profile says)")


def _params(params: Any) -> Mapping[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise AcpRefused(INVALID_PARAMS, "params must be an object")
    return params


def _tool_call(request: PermissionRequest) -> dict[str, Any]:
    return {
        "toolCallId": request.request_id,
        "title": request.title or request.tool,
        "kind": _ACP_TOOL_KINDS.get(request.kind, "other"),
        "status": "pending",
        "rawInput": dict(request.input),
    }


def _link(file: FileEvent, uri: str) -> dict[str, Any]:
    return {
        "type": "resource_link",
        "uri": uri or f"file://{file.path}",
        "name": file.name,
        "mimeType": file.media_type,
        "size": file.size,
    }


def _usage(usage: Usage) -> dict[str, int] | None:
    if usage.input_tokens is None or usage.output_tokens is None:
        return None
    total = usage.total_tokens if usage.total_tokens is not None else usage.input_tokens + usage.output_tokens
    record = {"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens, "totalTokens": total}
    if usage.reasoning_tokens is not None:
        record["thoughtTokens"] = usage.reasoning_tokens
    if usage.cached_input_tokens is not None:
        record["cachedReadTokens"] = usage.cached_input_tokens
    return record


def _chunk(kind: str, text: str) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def _update(session_id: str, update: dict[str, Any]) -> Send:
    return Send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session_id, "update": update}})


def _result(rpc_id: Any, result: Any) -> Send:
    return Send({"jsonrpc": "2.0", "id": rpc_id, "result": result})


def _error(rpc_id: Any, code: int, message: str) -> Send:
    return Send({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}})


__all__ = [
    "AcpAgentSide",
    "Action",
    "Answer",
    "CancelPrompt",
    "Capabilities",
    "Decide",
    "Send",
    "StartPrompt",
    "stop_reason",
    "turn_of",
    "unsent_reply",
]
