"""The MCP door's pure parts: a profile as an MCP tool, a tool call's arguments as a turn, a result as content.

Plain dicts in the MCP wire's shape (the SDK validates them): no I/O, no SDK import, so they are tested alone.

Rules:
- A tool's input is `message` (required), `conversation` (optional: the same agent session across calls; without
  it every call is a conversation of its own) and `attachments` (optional: URLs, or over stdio local paths too).
- A failed turn is a result with `isError: true` and the turn's error reply as its text.
- A file the agent left comes back embedded (text, or base64 for other files) when it is at most the embed limit,
  else as a `resource_link` to where it waits on this machine (deleted after the file time-to-live).
- An agent's question, for a client that can ask its user (`--elicit`), is an elicitation form: one field per
  question, a choice as an enum of its labels (an array of them where several may be chosen; no own words then),
  words as a string where the agent offered no options.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..dialects.events import Question, QuestionRequest
from ..engine.questions import QuestionAnswer
from ..engine.result import TurnResult
from ..errors import AttachmentRefused, TurnError
from ..files.fetch_policy import source_kind
from ..turn import Attachment, Turn, text_problem

MAX_MESSAGE_CHARS = 1024 * 1024  # as serve's request line (bridge.serving.requests.MAX_REQUEST_BYTES)
MAX_CONVERSATION_CHARS = 1024
MAX_ATTACHMENTS = 32
EMBED_MAX_BYTES = 1024 * 1024  # a file the agent left up to this size travels inside the result
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # what MCP clients accept as a tool name

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "what to ask the agent"},
        "conversation": {
            "type": "string",
            "description": "a name of your choice: calls with the same one go on with the same agent session "
            "(omit it for a new conversation each call)",
        },
        "attachments": {
            "type": "array",
            "items": {"type": "string"},
            "description": "files for the agent: https://, http:// or data: URLs (over stdio, local paths too)",
        },
    },
    "required": ["message"],
    "additionalProperties": False,
}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call's arguments, checked: the conversation's key (without a tenant's prefix) and the turn."""

    conversation: str
    turn: Turn


def tool_name_problem(name: str) -> str | None:
    """Why profile `name` cannot be an MCP tool's name, or None."""
    if _TOOL_NAME.match(name):
        return None
    return "an MCP tool's name is 1 to 128 letters, digits, '_', '-' or '.'; rename the profile (its `name` field)"


def tool_description(name: str, description: str | None) -> str:
    """The profile's own description, or one that says what calling it does."""
    if description and description.strip():
        return description.strip()
    return f"Ask the agent of profile {name!r} (run by agent-bridge); its reply is the result."


def tool_definition(name: str, description: str | None) -> dict[str, Any]:
    return {"name": name, "description": tool_description(name, description), "inputSchema": INPUT_SCHEMA}


def parse_call(arguments: Mapping[str, Any] | None, *, local_paths: bool) -> ToolCall:
    """The checked turn of a call's `arguments`; `TurnError` saying what to fix. `local_paths`: attachments may
    name files of this machine (a client on stdio is this machine's user; one over HTTP never is)."""
    arguments = arguments or {}
    unknown = sorted(set(arguments) - set(INPUT_SCHEMA["properties"]))
    if unknown:
        raise TurnError(f"unknown argument {unknown[0]!r}; the arguments are message, conversation and attachments")
    message = arguments.get("message")
    if not isinstance(message, str) or not message.strip():
        raise TurnError("the argument message is required: a non-empty string, what to ask the agent")
    if len(message) > MAX_MESSAGE_CHARS:
        raise TurnError(f"message is {len(message)} characters long; the limit is {MAX_MESSAGE_CHARS}")
    conversation = arguments.get("conversation")
    if conversation is None or conversation == "":
        conversation = f"mcp-{uuid.uuid4().hex}"
    elif not isinstance(conversation, str) or len(conversation) > MAX_CONVERSATION_CHARS:
        raise TurnError(f"conversation must be a string of at most {MAX_CONVERSATION_CHARS} characters")
    elif problem := text_problem(conversation):
        raise TurnError(f"conversation {problem}")
    attachments = arguments.get("attachments") or []
    if not isinstance(attachments, list) or not all(isinstance(item, str) and item for item in attachments):
        raise TurnError("attachments must be a list of URLs (strings)")
    if len(attachments) > MAX_ATTACHMENTS:
        raise TurnError(f"{len(attachments)} attachments; at most {MAX_ATTACHMENTS} travel with one message")
    return ToolCall(
        conversation, Turn(message, attachments=tuple(_attachment(item, local_paths) for item in attachments))
    )


def _attachment(spec: str, local_paths: bool) -> Attachment:
    try:
        kind = source_kind(spec)
    except AttachmentRefused as err:
        raise TurnError(f"attachment {spec[:200]!r}: {err}") from None
    if kind == "path" and not local_paths:
        raise TurnError(
            "an attachment over HTTP must be an https://, http:// or data: URL; a local path is only for a client "
            "on stdio"
        )
    return Attachment.parse(spec)


def result_content(result: TurnResult, files: list[dict[str, Any]]) -> dict[str, Any]:
    """A `CallToolResult` of the turn's `result`: its reply (or error reply, with `isError`), then its files
    (`files`: each `FileDeliveries.offer`'s record, with `data` when it came inline)."""
    text = result.reply if result.ok else (result.error_reply or result.error or f"the turn ended {result.outcome}")
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if result.files_note:
        content.append({"type": "text", "text": result.files_note})
    content.extend(file_content(record) for record in files)
    return {
        "content": content,
        "isError": not result.ok,
        "_meta": {"agent-bridge/outcome": str(result.outcome), "agent-bridge/session_id": result.session_id},
    }


def file_content(record: Mapping[str, Any]) -> dict[str, Any]:
    """A file the agent left: embedded when its bytes came with it (`data`), else a link to where it waits."""
    uri = "file://" + urllib.parse.quote(record["path"])
    media_type = record.get("media_type") or "application/octet-stream"
    data = record.get("data")
    if data is None:
        return {
            "type": "resource_link",
            "uri": uri,
            "name": record["name"],
            "mimeType": media_type,
            "size": record["size"],
        }
    if media_type.startswith("text/"):
        try:
            text = base64.b64decode(data).decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return {"type": "resource", "resource": {"uri": uri, "mimeType": media_type, "text": text}}
    return {"type": "resource", "resource": {"uri": uri, "mimeType": media_type, "blob": data}}


def question_form(request: QuestionRequest) -> tuple[str, dict[str, Any]]:
    """(message, requested schema) of an `elicitation/create` form asking `request`'s questions, each required."""
    properties = {question.id: _question_field(question) for question in request.questions}
    prompts = [question.prompt for question in request.questions]
    message = f"The agent asks: {prompts[0]}" if len(prompts) == 1 else "The agent asks: " + " / ".join(prompts)
    return message, {"type": "object", "properties": properties, "required": list(properties)}


def _question_field(question: Question) -> dict[str, Any]:
    labels = [option.label for option in question.options]
    field: dict[str, Any] = {"title": question.header or question.prompt, "description": question.prompt}
    if labels and question.multi_select:
        return field | {"type": "array", "items": {"type": "string", "enum": labels}}
    if labels:  # a form's choice takes only its options: the user's own words are for a question without any
        return field | {"type": "string", "enum": labels}
    return field | {"type": "string"}


def question_answer(request: QuestionRequest, content: Mapping[str, Any] | None) -> QuestionAnswer:
    """The host's answer to `request` from an accepted form's `content`: each question's id → the label (or labels,
    or words) the user gave; None (declined) when the form answered none of them."""
    answer: dict[str, str | list[str]] = {}
    for question in request.questions:
        value: Any = (content or {}).get(question.id)
        if _given(value):
            answer[question.id] = value
    return answer or None


def _given(value: object) -> bool:
    if isinstance(value, list):
        return bool(value) and all(isinstance(label, str) for label in value)
    return isinstance(value, str) and bool(value)
