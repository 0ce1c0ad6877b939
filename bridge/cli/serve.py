"""`agent-bridge serve`: the host runtime as a sidecar speaking JSON Lines on stdin/stdout.

A bot in any language starts one `serve` process and writes one JSON request
per line; every response is one JSON line tagged with the request's id. The
protocol is documented in docs/serve.md.

`Server` speaks the protocol over any pair of trio streams, so it is tested in
process; `serve_stdio` wires it to the process's stdin/stdout and signals.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import stat
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from ..dialects import MAX_SESSION_ID_CHARS, ActivityEvent, LineSplitter, PartialEvent, SessionEvent, session_id_problem
from ..dialects.events import FileEvent, QuestionRequest
from ..errors import (
    AnswerRefused,
    AttachmentRefused,
    BridgeError,
    DuplicateTurn,
    HostClosed,
    ProfileError,
    QueueFull,
    RequestError,
    SessionIdRefused,
    StoreError,
    TurnError,
    UnknownProfile,
)
from ..fetch_policy import shown_url, source_kind
from ..host.common import BaseHost, ClientSessionIds
from ..host.runtime import DEFAULT_MAX_CONCURRENT, DEFAULT_MAX_QUEUED, DEFAULT_SHUTDOWN_GRACE, open_host
from ..log import get_logger
from ..permissions import Decision, PermissionRequest
from ..process import sweep_orphans_on_sigchld
from ..turn import ATTACHMENT_TYPES, Attachment, Turn, text_problem
from ..turn_loop import HostEvent
from .file_delivery import DEFAULT_FILE_TTL, MAX_INLINE_FILE_BYTES, FileDeliveries

MAX_REQUEST_BYTES = 1024 * 1024
READ_CHUNK = 64 * 1024
HANG_UP_POLL_SECS = 0.2

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
    _only_fields(request, _TURN_FIELDS)
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
            f"not {_shown(inline)}",
        )
    return TurnRequest(request_id, profile, conversation, turn, inline)


def _only_fields(request: dict[str, Any], fields: set[str]) -> None:
    unknown = sorted(set(request) - fields)
    if unknown:
        raise RequestError(
            INVALID_REQUEST,
            f"unknown field {_shown(unknown[0])} in a {request.get('type')} request "
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
            INVALID_REQUEST, f"unknown field {_shown(unknown[0])} in an attachment (fields: name, type, url)"
        )
    kind, url, name = item.get("type"), item.get("url"), item.get("name", "")
    if kind not in ATTACHMENT_TYPES:
        raise RequestError(
            INVALID_REQUEST, f"attachment type must be one of {', '.join(ATTACHMENT_TYPES)}, not {_shown(kind)}"
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


def _shown(value: Any, max_chars: int = 40) -> str:
    """A client's value for an error message: a string quoted and shortened, anything else by its type.

    A request line may hold a megabyte of string, or of nested lists, and the message should not.
    """
    if not isinstance(value, str):
        return _json_type(value)
    return repr(value) if len(value) <= max_chars else repr(value[:max_chars]) + "…"


def _echoed_id(value: Any) -> Any:
    """The id to tag an error with: the request's, when it is a string, number or boolean; else null.

    A list or object id is refused anyway, and echoing it could nest deeper than the encoder goes.
    """
    if isinstance(value, (str, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return None


def _refuse_unless_waited_for(answered: bool, request_id: str | int, question: str) -> None:
    """`unknown_request` for an answer (a decide, an answer) the turn was not waiting for."""
    if not answered:
        raise RequestError(
            UNKNOWN_REQUEST,
            f"turn {request_id!r} waits for no answer to {_shown(question)}: "
            "it was answered already, nobody answered in time, or it never asked",
        )


def _turn_key(request_id: str | int) -> str:
    """The host's turn id for a request id (7 and "7" are the same turn)."""
    return request_id if isinstance(request_id, str) else str(request_id)


class _Line:
    __slots__ = ("data", "done", "written")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.done = trio.Event()
        self.written = False


class Output:
    """Writes responses, one JSON line each, whole and in order, whoever sends them.

    One writer task (`run`) writes every line. `send` hands it a line and
    waits until it is written; a sender cancelled before the writer took its
    line sends nothing, and one cancelled after leaves the writer to finish it.
    So a turn's deadline or cancel never cuts a line in two (the next
    response would run into it), and a client that stops reading makes
    senders wait with their one line each: nothing piles up.

    When the client stops reading (its end of the pipe closed), responses are
    dropped and `on_broken` is called once: nobody is left to answer. A failed
    write notices that, and so does `hung_up()`, for a caller watching the pipe.
    """

    def __init__(self, stream: trio.abc.SendStream, on_broken: Callable[[], None]) -> None:
        self._stream = stream
        self._on_broken = on_broken
        self._handoff, self._taken = trio.open_memory_channel[_Line](0)
        self._ended = trio.Event()
        self.broken = False

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write the lines handed over until `close()`; run it in a nursery of its own lifetime."""
        try:
            task_status.started()
            async for line in self._taken:
                if not self.broken:
                    try:
                        await self._stream.send_all(line.data)
                        line.written = True
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        self.hung_up()
                line.done.set()
        finally:
            self._ended.set()

    async def send(self, response: dict[str, Any]) -> bool:
        """Write `response` as one line; whether it reached the client's pipe (False: the client is gone)."""
        try:
            data = (json.dumps(response, ensure_ascii=False) + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate in a client's string: escape it rather than fail
            data = (json.dumps(response) + "\n").encode("ascii")
        if self.broken:
            return False
        line = _Line(data)
        try:
            await self._handoff.send(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False  # the writer has stopped: serve is ending
        await line.done.wait()
        return line.written

    async def close(self) -> None:
        """No more lines: returns once the writer has written every line it took."""
        await self._handoff.aclose()
        await self._ended.wait()

    def hung_up(self) -> None:
        """The client closed its end: drop every later response and call `on_broken` (once)."""
        if not self.broken:
            self.broken = True
            self._on_broken()


class Server:
    """One serve session: reads requests from `input`, runs turns on `host`, answers on `output`."""

    def __init__(
        self,
        host: BaseHost,
        input: trio.abc.ReceiveStream,
        output: trio.abc.SendStream,
        *,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        file_ttl: float = DEFAULT_FILE_TTL,
    ) -> None:
        self.host = host
        self._file_ttl = file_ttl
        self._files: FileDeliveries | None = None
        self._input = input
        self.output = Output(output, self._client_gone)
        self._max_request_bytes = max_request_bytes
        self._turns: trio.Nursery | None = None
        self._receive_scope: trio.CancelScope | None = None
        self._stop_reading = False
        self._shutdown_started = False
        self._shutdown_done = trio.Event()
        self._system: trio.Nursery | None = None
        self._log = get_logger(component="serve")

    async def run(self) -> None:
        """Serve until EOF on input (or `request_shutdown()`), then shut down gracefully.

        Returns once every accepted turn has been answered with its result.
        """
        async with trio.open_nursery() as system:
            self._system = system
            self._files = FileDeliveries(system, self._file_ttl)
            await system.start(self.output.run)
            try:
                async with trio.open_nursery() as turns:
                    self._turns = turns
                    for turn_id, request_id in await self.host.undelivered():  # accepted by a serve that stopped
                        turns.start_soon(self._follow, turn_id, request_id)
                    await self._read_requests()
                    self._begin_shutdown()
                    await self._shutdown_done.wait()
                await self.output.close()
            finally:
                self._files.close()  # the bot is gone: no file it did not take is left behind
            system.cancel_scope.cancel()

    def request_shutdown(self) -> None:
        """Stop taking turns, finish (or, after the grace, cancel) those in flight, then stop reading.

        Requests keep being read meanwhile: a client may still cancel a turn
        or ask for stats. Calling it again cancels every turn at once.
        """
        if self._shutdown_started:
            self._log.warning("asked again to shut down; cancelling every turn now")
            self.host.cancel_all()
            return
        self._begin_shutdown()

    def _begin_shutdown(self) -> None:
        if self._shutdown_started:
            return
        self._shutdown_started = True
        self.host.stop_accepting()
        assert self._system is not None
        self._system.start_soon(self._shut_down)

    async def _shut_down(self) -> None:
        try:
            await self.host.aclose()
        finally:
            self._stop_reading = True
            if self._receive_scope is not None:
                self._receive_scope.cancel()
            self._shutdown_done.set()

    def _client_gone(self) -> None:
        self._log.warning("the client stopped reading responses; cancelling every turn")
        self._begin_shutdown()
        self.host.cancel_all()

    async def _read_requests(self) -> None:
        lines = LineSplitter(self._max_request_bytes)
        while not self._stop_reading:
            with trio.CancelScope() as scope:
                self._receive_scope = scope
                try:
                    data = await self._input.receive_some(READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as err:
                    self._log.warning("cannot read requests; shutting down", error=str(err))
                    data = b""
            self._receive_scope = None
            if scope.cancelled_caught:
                return
            batch = lines.feed(data) if data else lines.close()
            for index, line in enumerate(batch.text):
                if index in batch.cut:
                    await self._error(
                        None,
                        REQUEST_TOO_LARGE,
                        f"a request line is longer than {self._max_request_bytes} bytes; it was discarded",
                    )
                else:
                    await self._handle_line(line)
            if not data:
                return

    async def _handle_line(self, line: str) -> None:
        if not line.strip():
            return  # blank lines are allowed (keep-alives)
        request_id: Any = None
        try:
            request = decode_request(line)
            request_id = _echoed_id(request.get("id"))
            kind = request.get("type")
            if kind == "turn":
                await self._start_turn(parse_turn(request))
            elif kind == "cancel":
                self._cancel(request)
            elif kind == "decide":
                self._decide(request)
            elif kind == "answer":
                self._answer(request)
            elif kind == "ack_file":
                self._ack_file(request)
            elif kind == "stats":
                _only_fields(request, {"type", "id"})
                _request_id(request, required=False)
                stats = await self.host.current_stats()
                await self.output.send({"type": "stats", "id": request_id, **stats.to_dict()})
            elif kind is None:
                raise RequestError(
                    INVALID_REQUEST, 'a request needs a "type": turn, cancel, decide, answer, ack_file or stats'
                )
            else:
                raise RequestError(
                    UNKNOWN_TYPE,
                    f"unknown request type {_shown(kind)}; expected turn, cancel, decide, answer, ack_file or stats",
                )
        except RequestError as err:
            await self._error(request_id, err.code, err.message)
        except Exception as err:  # a bug must not take every other conversation down with it
            self._log.error("unexpected error handling a request", error=repr(err), traceback=traceback.format_exc())
            await self._error(request_id, INTERNAL_ERROR, f"internal error: {err}")

    def _cancel(self, request: dict[str, Any]) -> None:
        _only_fields(request, {"type", "id"})
        request_id = _request_id(request, required=True)
        assert request_id is not None
        if not self.host.cancel(_turn_key(request_id)):
            raise RequestError(UNKNOWN_TURN, f"no turn {request_id!r} is queued or running")

    def _decide(self, request: dict[str, Any]) -> None:
        """Answer a `permission` a turn's agent asked: allowed or not (and `always`, to remember it)."""
        _only_fields(request, _DECIDE_FIELDS)
        request_id = _request_id(request, required=True)
        assert request_id is not None
        question = _string(request, "request_id", required=True, non_empty=True, max_chars=MAX_ID_CHARS)
        allow, always = request.get("allow"), request.get("always", False)
        if not isinstance(allow, bool) or not isinstance(always, bool):
            raise RequestError(
                INVALID_REQUEST, "a decide request needs allow: true or false (and always, if given, true or false)"
            )
        message = _string(request, "message", max_chars=MAX_DECIDE_MESSAGE_CHARS)
        turn_id = self._turn_in_flight(request_id)
        decided = self.host.decide(turn_id, question, Decision(allow=allow, always=always, message=message))
        _refuse_unless_waited_for(decided, request_id, question)

    def _answer(self, request: dict[str, Any]) -> None:
        """Answer a `question` a turn's agent asked: each question's id → the labels chosen, or null to decline."""
        _only_fields(request, _ANSWER_FIELDS)
        request_id = _request_id(request, required=True)
        assert request_id is not None
        question = _string(request, "request_id", required=True, non_empty=True, max_chars=MAX_ID_CHARS)
        if "answers" not in request:
            raise RequestError(
                INVALID_REQUEST,
                "an answer request needs answers: each question's id → the labels chosen (or a label), or null to "
                "decline",
            )
        turn_id = self._turn_in_flight(request_id)
        try:
            answered = self.host.answer(turn_id, question, request["answers"])
        except AnswerRefused as err:
            raise RequestError(INVALID_REQUEST, str(err)) from None
        _refuse_unless_waited_for(answered, request_id, question)

    def _turn_in_flight(self, request_id: str | int) -> str:
        """The host's id of the turn `request_id` names, or `unknown_turn` when none such is queued or running."""
        turn_id = _turn_key(request_id)
        if not self.host.in_flight(turn_id):
            raise RequestError(UNKNOWN_TURN, f"no turn {request_id!r} is queued or running")
        return turn_id

    def _ack_file(self, request: dict[str, Any]) -> None:
        """The bot has read a file a `file` response named: it is deleted."""
        _only_fields(request, _ACK_FILE_FIELDS)
        request_id = _request_id(request, required=True)
        assert request_id is not None and self._files is not None
        name = _string(request, "file", required=True, non_empty=True)
        if not self._files.ack(_turn_key(request_id), name):
            raise RequestError(
                UNKNOWN_FILE,
                f"turn {request_id!r} has no file {_shown(name)} waiting: it was acknowledged already, its time "
                "ran out, or the turn left no such file",
            )

    async def _start_turn(self, request: TurnRequest) -> None:
        accepted = trio.Event()  # nothing of a turn is written before its `accepted`
        assert self._turns is not None
        try:
            await self._turns.start(self._turn, request, accepted)
        except HostClosed:
            raise RequestError(SHUTTING_DOWN, "serve is shutting down and takes no new turns") from None
        except QueueFull as err:
            raise RequestError(QUEUE_FULL, str(err)) from None
        except DuplicateTurn:
            raise RequestError(
                DUPLICATE_ID, f"turn {request.id!r} is already in flight; give each turn its own id"
            ) from None
        except UnknownProfile as err:
            raise RequestError(UNKNOWN_PROFILE, str(err)) from None
        except ProfileError as err:
            raise RequestError(PROFILE_INVALID, f"profile {request.profile!r} does not load: {err}") from None
        except TurnError as err:
            raise RequestError(INVALID_REQUEST, str(err)) from None
        except SessionIdRefused as err:
            raise RequestError(SESSION_ID_REFUSED, f"{err}; or start serve with --session-ids any") from None
        except StoreError as err:  # read to check the turn's session_id
            raise RequestError(STORE_ERROR, str(err)) from None
        except BridgeError as err:
            if err.code is None:  # only the PostgreSQL gateway's refusals name their own code
                raise
            raise RequestError(err.code, str(err)) from None
        try:
            await self.output.send({"type": "accepted", "id": request.id})
        finally:
            accepted.set()

    async def _turn(
        self, request: TurnRequest, accepted: trio.Event, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        status = _StartedFlag(task_status)
        request_id = request.id
        send = self.output.send
        files = self._files

        async def forward(event: HostEvent) -> None:
            if not accepted.is_set():
                await accepted.wait()
            if type(event) is PartialEvent:
                await send({"type": "partial", "id": request_id, "text": event.text})
            elif type(event) is SessionEvent:
                await send({"type": "session", "id": request_id, "session_id": event.session_id})
            elif type(event) is ActivityEvent or type(event) is PermissionRequest or type(event) is QuestionRequest:
                record = event.to_dict()
                kind = record.pop("event")
                await send({"type": kind, "id": request_id, **record})
            elif type(event) is FileEvent:
                assert files is not None
                offered = files.offer(_turn_key(request_id), event, request.inline_files_max_bytes)
                await send({"type": "file", "id": request_id, **offered})

        try:
            result = await self.host.submit(
                request.profile,
                request.conversation,
                request.turn,
                on_event=forward,
                turn_id=_turn_key(request_id),
                task_status=status,
                client_id=request_id,
            )
        except Exception as err:
            if not status.started_once:
                raise  # refused: the reader answers with an error
            await accepted.wait()
            await self._turn_failed(_turn_key(request_id), request_id, err)
            return
        await accepted.wait()
        sent = await send({"type": "result", "id": request_id, **result.to_dict()})
        if files is not None:
            files.turn_over(result)
        if sent:
            await self.host.delivered(_turn_key(request_id))

    async def _follow(self, turn_id: str, request_id: Any) -> None:
        """Send the result of a turn an earlier serve accepted (with PostgreSQL: at-least-once results), and the
        files the agent left first, as for a turn of this serve (by path: the turn's request is gone)."""
        files = self._files

        async def forward(event: HostEvent) -> None:
            if type(event) is FileEvent and files is not None:
                await self.output.send({"type": "file", "id": request_id, **files.offer(turn_id, event, 0)})

        try:
            result = await self.host.follow(turn_id, on_event=forward)
        except Exception as err:
            await self._turn_failed(turn_id, request_id, err)
            return
        sent = await self.output.send({"type": "result", "id": request_id, **result.to_dict()})
        if files is not None:
            files.turn_over(result)
        if sent:
            await self.host.delivered(turn_id)

    async def _turn_failed(self, turn_id: str, request_id: Any, err: Exception) -> None:
        """An accepted turn ended without a result: the stored session could not be read (the host logged
        why), or, through PostgreSQL, no worker could run it or serve stopped waiting for it."""
        code = err.code if isinstance(err, BridgeError) else None  # the PostgreSQL gateway's errors name theirs
        if code is None:
            code = STORE_ERROR if isinstance(err, StoreError) else INTERNAL_ERROR
        if code == INTERNAL_ERROR:
            self._log.error("unexpected error running a turn", error=repr(err), traceback=traceback.format_exc())
        if await self._error(request_id, code, str(err)) and code != DETACHED:
            await self.host.delivered(turn_id)  # the turn's end reached the client: a later serve need not send it

    async def _error(self, request_id: Any, code: str, message: str) -> bool:
        return await self.output.send({"type": "error", "id": request_id, "code": code, "message": message})


class _StartedFlag(trio.TaskStatus[str]):
    """A task status that remembers whether the task reported itself started."""

    def __init__(self, inner: trio.TaskStatus[str]) -> None:
        self._inner = inner
        self.started_once = False

    def started(self, value: str) -> None:
        self.started_once = True
        self._inner.started(value)


async def serve_stdio(host: BaseHost, *, file_ttl: float = DEFAULT_FILE_TTL) -> int:
    """Serve on this process's stdin/stdout until EOF, SIGTERM or SIGINT; returns the exit code.

    File descriptor 1 is pointed at stderr once the protocol has its own copy
    of it, so nothing but protocol lines can reach the client's stdout.
    """
    protocol_out = os.dup(1)
    os.dup2(2, 1)
    stdin = _input_stream(os.dup(0))
    # FdStream makes the descriptions non-blocking; both ends are the client's pipes (stderr,
    # which may share a terminal with them, must stay apart from stdout for the protocol anyway).
    stdout = trio.lowlevel.FdStream(protocol_out)
    server = Server(host, stdin, stdout, file_ttl=file_ttl)
    async with stdin, stdout, trio.open_nursery() as nursery:
        await nursery.start(_shut_down_on_signals, server)  # handlers in place before any agent starts
        await nursery.start(sweep_orphans_on_sigchld)
        nursery.start_soon(_watch_for_hang_up, protocol_out, server.output)
        await server.run()
        nursery.cancel_scope.cancel()
    return 1 if server.output.broken else 0


def _input_stream(fd: int) -> trio.abc.ReceiveStream:
    """A pipe, socket or terminal is read through trio's I/O loop; a file (`serve < requests.jsonl`),
    which epoll cannot watch, by blocking reads in a worker thread."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd):
        return trio.lowlevel.FdStream(fd)
    return _FileStream(fd)


class _FileStream(trio.abc.ReceiveStream):
    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._fd < 0:
            raise trio.ClosedResourceError
        return await trio.to_thread.run_sync(os.read, self._fd, max_bytes or READ_CHUNK, abandon_on_cancel=True)

    async def aclose(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        await trio.lowlevel.checkpoint()


async def _watch_for_hang_up(fd: int, output: Output) -> None:
    """Notice the client closing its end of our stdout even while nothing is written to it.

    A write would fail at once, but a turn may run for minutes without a word;
    its agent should not run on for nobody. POLLERR and POLLHUP are reported
    without being asked for (a regular file or /dev/null reports neither).
    """
    poller = select.poll()
    poller.register(fd, 0)
    while not poller.poll(0):  # noqa: ASYNC110 - no event says "hung up": trio waits only for readable/writable
        await trio.sleep(HANG_UP_POLL_SECS)
    output.hung_up()


async def _shut_down_on_signals(server: Server, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """SIGTERM or SIGINT: graceful shutdown; a second one cancels every turn at once."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            get_logger(component="serve").info("signal received; shutting down", signal=signal.Signals(signum).name)
            server.request_shutdown()


def run_serve(
    profiles: str | os.PathLike[str] | None,
    *,
    state: str | os.PathLike[str] | None = None,
    max_concurrent: int = DEFAULT_MAX_CONCURRENT,
    max_queued: int = DEFAULT_MAX_QUEUED,
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
    postgres: str | None = None,
    name: str = "serve",
    namespace: str | None = None,
    session_ids: ClientSessionIds = "stored",
    file_ttl: float = DEFAULT_FILE_TTL,
    attachment_hosts: tuple[str, ...] = (),
) -> int:
    """`agent-bridge serve`: returns the exit code (0 after a graceful shutdown).

    A profiles directory that cannot be read or a store that cannot be opened
    raises a `BridgeError` before anything is read. With `postgres`, serve is
    a gateway to the workers of that database (`name`: see `RemoteHost`);
    else `namespace` is that of a PostgreSQL `state`. `session_ids`: the
    host's `client_session_ids`. `file_ttl`: seconds a file an agent left waits for the bot's `ack_file`.
    `attachment_hosts`: the host's exceptions to the attachments' address rule.
    """
    from ..process import become_subreaper, log_containment

    become_subreaper()  # this process is ours: killed grandchildren get reaped here
    log_containment(get_logger(component="serve"))

    async def main() -> int:
        host = open_host(
            profiles,
            state=state,
            max_concurrent=max_concurrent,
            max_queued=max_queued,
            shutdown_grace=shutdown_grace,
            postgres=postgres,
            gateway_name=name,
            namespace=namespace,
            client_session_ids=session_ids,
            attachment_hosts=attachment_hosts,
        )
        async with host:
            return await serve_stdio(host, file_ttl=file_ttl)

    return trio.run(main)
