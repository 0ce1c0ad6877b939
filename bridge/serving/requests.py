"""serve's protocol: the requests a client may send, checked, and the error codes it gets back (docs/serve.md).

Every front door speaks it — `serve` on stdin/stdout, and the network door's
WebSocket and HTTP endpoints — so a request is refused the same way, with the
same code and message, whichever way it came.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..dialects import MAX_SESSION_ID_CHARS, session_id_problem
from ..errors import AttachmentRefused, RequestError, TurnError
from ..files.fetch_policy import shown_url, source_kind
from ..permissions import Decision
from ..turn import ATTACHMENT_TYPES, Attachment, Turn, text_problem
from .file_delivery import MAX_INLINE_FILE_BYTES

MAX_REQUEST_BYTES = 1024 * 1024

# Length limits of request fields, in characters (docs/serve.md lists them). The message and
# attachments are bounded only by the request line.
MAX_ID_CHARS = 256
MAX_PROFILE_CHARS = 256
MAX_CONVERSATION_CHARS = 1024
MAX_SESSION_NAME_CHARS = 256
MAX_FROM_USER_CHARS = 1024
MIN_INT_ID, MAX_INT_ID = -(2**63), 2**63 - 1

# Stable error codes (docs/serve.md lists them); clients may branch on these.
BAD_JSON = "bad_json"
REQUEST_TOO_LARGE = "request_too_large"
INVALID_REQUEST = "invalid_request"
UNKNOWN_TYPE = "unknown_type"
DUPLICATE_ID = "duplicate_id"
UNKNOWN_PROFILE = "unknown_profile"
PROFILE_INVALID = "profile_invalid"
QUEUE_FULL = "queue_full"
SHUTTING_DOWN = "shutting_down"
UNKNOWN_TURN = "unknown_turn"
UNKNOWN_REQUEST = "unknown_request"
UNKNOWN_FILE = "unknown_file"
STORE_ERROR = "store_error"
SESSION_ID_REFUSED = "session_id_refused"  # --session-ids stored: not the conversation's stored session
DETACHED = "detached"  # serve --postgres stopped before the result came; the next one sends it
INTERNAL_ERROR = "internal_error"
TOO_MANY_TURNS = "too_many_turns"  # the network door: a connection has its most turns in flight
TOO_MANY_CONNECTIONS = "too_many_connections"  # the network door: it has its most connections open
UNAUTHORIZED = "unauthorized"  # the network door: no valid bearer token
FORBIDDEN = "forbidden"  # the network door without tokens: a request of a web page
REQUEST_TIMEOUT = "request_timeout"  # the network door: a request's body did not come within --body-timeout

# The HTTP status each code gets over the network door (docs/network.md).
_STATUS = {
    BAD_JSON: 400,
    INVALID_REQUEST: 400,
    UNKNOWN_TYPE: 400,
    REQUEST_TOO_LARGE: 413,
    UNKNOWN_PROFILE: 404,
    UNKNOWN_TURN: 404,
    UNKNOWN_REQUEST: 404,
    UNKNOWN_FILE: 404,
    DUPLICATE_ID: 409,
    SESSION_ID_REFUSED: 409,
    PROFILE_INVALID: 422,
    QUEUE_FULL: 429,
    TOO_MANY_TURNS: 429,
    UNAUTHORIZED: 401,
    FORBIDDEN: 403,
    REQUEST_TIMEOUT: 408,
    TOO_MANY_CONNECTIONS: 503,
    SHUTTING_DOWN: 503,
    STORE_ERROR: 503,
    DETACHED: 503,
}


def status_of(code: str) -> int:
    """The HTTP status an error code gets over the network door; 500 for `internal_error` and any not listed."""
    return _STATUS.get(code, 500)


_TURN_FIELDS = {
    "type",
    "id",
    "profile",
    "conversation",
    "message",
    "from_user",
    "session_name",
    "session_id",
    "attachments",
    "inline_files_max_bytes",
}
_ATTACHMENT_FIELDS = {"type", "url", "name"}
_DECIDE_FIELDS = {"type", "id", "request_id", "allow", "always", "message"}
_ANSWER_FIELDS = {"type", "id", "request_id", "answers"}
_ACK_FILE_FIELDS = {"type", "id", "file"}
MAX_DECIDE_MESSAGE_CHARS = 4096


@dataclass(frozen=True, slots=True)
class TurnRequest:
    id: str | int
    profile: str
    conversation: str
    turn: Turn
    inline_files_max_bytes: int = 0


def decode_request(line: str) -> dict[str, Any]:
    """The request object a line holds; raises `RequestError` when it holds none."""
    try:
        request = json.loads(line)
    except ValueError as err:  # also numbers over Python's digit limit
        raise RequestError(BAD_JSON, f"the line is not valid JSON: {err}") from None
    except RecursionError:
        raise RequestError(BAD_JSON, "the line nests arrays or objects too deeply to be read") from None
    if not isinstance(request, dict):
        raise RequestError(INVALID_REQUEST, f"a request must be a JSON object, not {_json_type(request)}")
    return request


def parse_turn(request: dict[str, Any]) -> TurnRequest:
    """Validate a `turn` request; raises `RequestError` naming what is wrong."""
    only_fields(request, _TURN_FIELDS)
    request_id = _request_id(request, required=True)
    assert request_id is not None
    profile = _string(request, "profile", required=True, non_empty=True, max_chars=MAX_PROFILE_CHARS)
    conversation = _string(request, "conversation", required=True, non_empty=True, max_chars=MAX_CONVERSATION_CHARS)
    message = _string(request, "message", required=True, check_text=False)  # Turn checks it, once
    session_id = _string(request, "session_id", max_chars=MAX_SESSION_ID_CHARS)
    if session_id and (problem := session_id_problem(session_id)):
        raise RequestError(
            INVALID_REQUEST,
            f"session_id is not a usable session id: {problem}; pass one an agent "
            "printed, or leave it out to resume the stored session",
        )
    attachments = request.get("attachments", [])
    if not isinstance(attachments, list):
        raise RequestError(INVALID_REQUEST, "attachments must be a list of {type, url, name} objects")
    try:
        turn = Turn(
            message=message,
            session_id=session_id,
            session_name=_string(request, "session_name", non_empty=True, max_chars=MAX_SESSION_NAME_CHARS)
            or "default",
            from_user=_string(request, "from_user", max_chars=MAX_FROM_USER_CHARS),
            attachments=tuple(_attachment(item) for item in attachments),
        )
    except TurnError as err:
        raise RequestError(INVALID_REQUEST, str(err)) from None
    inline = request.get("inline_files_max_bytes", 0)
    if type(inline) is not int or not 0 <= inline <= MAX_INLINE_FILE_BYTES:
        raise RequestError(
            INVALID_REQUEST,
            f"inline_files_max_bytes must be a whole number of bytes from 0 to {MAX_INLINE_FILE_BYTES}, "
            f"not {shown(inline)}",
        )
    return TurnRequest(request_id, profile, conversation, turn, inline)


def only_fields(request: dict[str, Any], fields: set[str]) -> None:
    unknown = sorted(set(request) - fields)
    if unknown:
        raise RequestError(
            INVALID_REQUEST,
            f"unknown field {shown(unknown[0])} in a {request.get('type')} request "
            f"(fields: {', '.join(sorted(fields))})",
        )


def _request_id(request: dict[str, Any], *, required: bool) -> str | int | None:
    value = request.get("id")
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise RequestError(INVALID_REQUEST, "id must be a non-empty string or an integer")
    if isinstance(value, int):
        if not MIN_INT_ID <= value <= MAX_INT_ID:
            raise RequestError(
                INVALID_REQUEST,
                "id must fit in a signed 64-bit integer when it is a number; use a string for larger ids",
            )
    else:
        _check_text("id", value, MAX_ID_CHARS)
    return value


def _string(
    request: dict[str, Any],
    field: str,
    *,
    required: bool = False,
    non_empty: bool = False,
    max_chars: int | None = None,
    check_text: bool = True,
) -> str:
    if field not in request:
        if required:
            raise RequestError(INVALID_REQUEST, f"a {request.get('type')} request needs {field!r}")
        return ""
    value = request[field]
    if not isinstance(value, str):
        raise RequestError(INVALID_REQUEST, f"{field} must be a string, not {_json_type(value)}")
    if non_empty and not value:
        raise RequestError(INVALID_REQUEST, f"{field} must not be empty")
    if check_text:
        _check_text(field, value, max_chars)
    return value


def _check_text(field: str, value: str, max_chars: int | None = None) -> None:
    """Refuse a string no agent, environment or session store can take, naming `field`."""
    if max_chars is not None and len(value) > max_chars:
        raise RequestError(INVALID_REQUEST, f"{field} is {len(value)} characters long; the limit is {max_chars}")
    if problem := text_problem(value):
        raise RequestError(INVALID_REQUEST, f"{field} {problem}")


def _attachment(item: Any) -> Attachment:
    if not isinstance(item, dict):
        raise RequestError(
            INVALID_REQUEST, f"an attachment must be an object {{type, url, name}}, not {_json_type(item)}"
        )
    unknown = sorted(set(item) - _ATTACHMENT_FIELDS)
    if unknown:
        raise RequestError(
            INVALID_REQUEST, f"unknown field {shown(unknown[0])} in an attachment (fields: name, type, url)"
        )
    kind, url, name = item.get("type"), item.get("url"), item.get("name", "")
    if kind not in ATTACHMENT_TYPES:
        raise RequestError(
            INVALID_REQUEST, f"attachment type must be one of {', '.join(ATTACHMENT_TYPES)}, not {shown(kind)}"
        )
    if not isinstance(url, str) or not url:
        raise RequestError(INVALID_REQUEST, "an attachment needs a url (a non-empty string)")
    if not isinstance(name, str):
        raise RequestError(INVALID_REQUEST, f"attachment name must be a string, not {_json_type(name)}")
    _check_text("attachment url", url)
    _check_text("attachment name", name)
    try:
        source = source_kind(url)
    except AttachmentRefused as err:
        raise RequestError(INVALID_REQUEST, f"attachment url {shown_url(url)!r}: {err}") from None
    if source == "path":
        raise RequestError(
            INVALID_REQUEST,
            "an attachment's url must be an https://, http:// or data: URL; a local path is for the host's own "
            "code and the CLI, never a serve client",
        )
    return Attachment(type=kind, url=url, name=name)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def shown(value: Any, max_chars: int = 40) -> str:
    """A client's value for an error message: a string quoted and shortened, anything else by its type.

    A request line may hold a megabyte of string, or of nested lists, and the message should not.
    """
    if not isinstance(value, str):
        return _json_type(value)
    return repr(value) if len(value) <= max_chars else repr(value[:max_chars]) + "…"


def echoed_id(value: Any) -> Any:
    """The id to tag an error with: the request's, when it is a string, number or boolean; else null.

    A list or object id is refused anyway, and echoing it could nest deeper than the encoder goes.
    """
    if isinstance(value, (str, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return None


def refuse_unless_waited_for(answered: bool, request_id: str | int, question: str) -> None:
    """`unknown_request` for an answer (a decide, an answer) the turn was not waiting for."""
    if not answered:
        raise RequestError(
            UNKNOWN_REQUEST,
            f"turn {request_id!r} waits for no answer to {shown(question)}: "
            "it was answered already, nobody answered in time, or it never asked",
        )


def turn_key(request_id: str | int) -> str:
    """The host's turn id for a request id (7 and "7" are the same turn)."""
    return request_id if isinstance(request_id, str) else str(request_id)


@dataclass(frozen=True, slots=True)
class DecideRequest:
    id: str | int
    request_id: str
    decision: Decision


@dataclass(frozen=True, slots=True)
class AnswerRequest:
    id: str | int
    request_id: str
    answers: Any  # checked against the question by the host (`AnswerRefused`)


def parse_cancel(request: dict[str, Any]) -> str | int:
    """The id of the turn a `cancel` request names."""
    only_fields(request, {"type", "id"})
    request_id = _request_id(request, required=True)
    assert request_id is not None
    return request_id


def parse_stats(request: dict[str, Any]) -> None:
    only_fields(request, {"type", "id"})
    _request_id(request, required=False)


def parse_decide(request: dict[str, Any]) -> DecideRequest:
    """A `decide` request: a `permission` a turn's agent asked, allowed or not (and `always`, to remember it)."""
    only_fields(request, _DECIDE_FIELDS)
    request_id = _request_id(request, required=True)
    assert request_id is not None
    question = _string(request, "request_id", required=True, non_empty=True, max_chars=MAX_ID_CHARS)
    allow, always = request.get("allow"), request.get("always", False)
    if not isinstance(allow, bool) or not isinstance(always, bool):
        raise RequestError(
            INVALID_REQUEST, "a decide request needs allow: true or false (and always, if given, true or false)"
        )
    message = _string(request, "message", max_chars=MAX_DECIDE_MESSAGE_CHARS)
    return DecideRequest(request_id, question, Decision(allow=allow, always=always, message=message))


def parse_answer(request: dict[str, Any]) -> AnswerRequest:
    """An `answer` request: each question's id → the labels chosen, or null to decline."""
    only_fields(request, _ANSWER_FIELDS)
    request_id = _request_id(request, required=True)
    assert request_id is not None
    question = _string(request, "request_id", required=True, non_empty=True, max_chars=MAX_ID_CHARS)
    if "answers" not in request:
        raise RequestError(
            INVALID_REQUEST,
            "an answer request needs answers: each question's id → the labels chosen (or a label), or null to decline",
        )
    return AnswerRequest(request_id, question, request["answers"])


def parse_ack_file(request: dict[str, Any]) -> tuple[str | int, str]:
    """An `ack_file` request: the turn's id and the file's name."""
    only_fields(request, _ACK_FILE_FIELDS)
    request_id = _request_id(request, required=True)
    assert request_id is not None
    return request_id, _string(request, "file", required=True, non_empty=True)
