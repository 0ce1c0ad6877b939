"""One client of serve's protocol, whatever carries it: its requests in, its responses out.

`ClientSession` is what `serve` on stdin/stdout, each WebSocket connection
and each token's HTTP requests share. Rules it keeps:

- A client's request ids are its own. The host's turn id is the client's
  `scope` followed by the request id, so two clients' turn 7 are two turns,
  and a client can name (cancel, decide, answer) only its own.
- A `Tenant` (a network token) sees only its profiles (another is an
  `unknown_profile`, as if it did not exist) and only its conversations (the
  host's key is the tenant's prefix followed by the client's conversation).
- Nothing of a turn is sent before its `accepted`; its `result` (or `error`)
  is the last thing sent for it.
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from ..dialects import ActivityEvent, PartialEvent, SessionEvent
from ..dialects.events import FileEvent, QuestionRequest, RequestWithdrawn
from ..engine.loop import HostEvent
from ..engine.result import TurnResult
from ..errors import (
    AnswerRefused,
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
from ..host.interface import BaseHost
from ..log import get_logger
from ..permissions import PermissionRequest
from .file_delivery import FileDeliveries
from .requests import (
    DETACHED,
    DUPLICATE_ID,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    PROFILE_INVALID,
    QUEUE_FULL,
    SESSION_ID_REFUSED,
    SHUTTING_DOWN,
    STORE_ERROR,
    TOO_MANY_TURNS,
    UNKNOWN_FILE,
    UNKNOWN_PROFILE,
    UNKNOWN_TURN,
    UNKNOWN_TYPE,
    TurnRequest,
    decode_request,
    echoed_id,
    parse_ack_file,
    parse_answer,
    parse_cancel,
    parse_decide,
    parse_stats,
    parse_turn,
    refuse_unless_waited_for,
    shown,
    turn_key,
)

Send = Callable[[dict[str, Any]], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who a network client is (its token's entry): the profiles it may use and the prefix of its conversations."""

    name: str
    profiles: frozenset[str] | None = None  # None: every profile
    conversation_prefix: str = ""

    def may_use(self, profile: str) -> bool:
        return self.profiles is None or profile in self.profiles


LOCAL = Tenant("local")  # serve's one client on stdin/stdout: every profile, conversations as given


def told_of_profile(tenant: Tenant, code: str, profile: str | None, said: str) -> str:
    """What `tenant` reads of a profile refused for `code` (`unknown_profile`, `profile_invalid`) where the loader
    or a worker `said` why: a network client learns nothing of the server's files (a path, a line of YAML) nor of
    other tenants' profiles, and reads that the server's log has the rest; serve's local client reads it all."""
    if tenant is LOCAL:
        return said
    named = "the turn's profile" if profile is None else f"profile {profile!r}"
    if code == UNKNOWN_PROFILE:
        return f"{named} is not served here" if profile is None else f"no profile named {profile!r}"
    return f"{named} does not load now; the server's log says why"


class ClientSession:
    """Handles one client's requests on `host`; its turns run in `turns`, its responses go through `send`."""

    def __init__(
        self,
        host: BaseHost,
        send: Send,
        files: FileDeliveries,
        turns: trio.Nursery,
        *,
        tenant: Tenant = LOCAL,
        scope: str = "",
        max_turns_in_flight: int | None = None,
        file_url: Callable[[str | int, str], str] | None = None,
        resend_unsent: bool = True,
    ) -> None:
        """`resend_unsent`: a result this client could not be sent waits for the next serve of the host's name
        (a gateway's results outlive it), as stdin serve's bot comes back; False for a client that never comes
        back for it (a network connection, whose ids are its own): such a result counts as delivered."""
        self.host = host
        self.send = send
        self.tenant = tenant
        self._files = files
        self._turns = turns
        self._scope = scope
        self._max_turns = max_turns_in_flight
        self._file_url = file_url  # the network door: where a `file` response's file is downloaded
        self._resend_unsent = resend_unsent
        self._mine: set[str] = set()  # host turn ids of this client's turns in flight
        self._log = get_logger(component="serve")

    def host_turn_id(self, request_id: str | int) -> str:
        """The host's id of this client's turn `request_id`."""
        return self._scope + turn_key(request_id)

    @property
    def turns_in_flight(self) -> int:
        return len(self._mine)

    def cancel_all(self) -> None:
        """The client is gone: cancel every turn it has in flight (each still ends with its result, unsent)."""
        for turn_id in list(self._mine):
            self.host.cancel(turn_id)

    async def handle_text(self, text: str) -> None:
        """Handle one request (a line, a WebSocket message); answers with an `error` response when it is refused."""
        if not text.strip():
            return  # blank lines are allowed (keep-alives)
        request_id: Any = None
        try:
            request = decode_request(text)
            request_id = echoed_id(request.get("id"))
            await self.handle(request)
        except RequestError as err:
            await self.error(request_id, err.code, err.message)
        except Exception as err:  # a bug must not take every other conversation down with it
            self._log.error("unexpected error handling a request", error=repr(err), traceback=traceback.format_exc())
            await self.error(request_id, INTERNAL_ERROR, f"internal error: {err}")

    async def handle(self, request: dict[str, Any]) -> None:
        """Handle one decoded request; raises `RequestError` when it is refused."""
        kind = request.get("type")
        if kind == "turn":
            turn = parse_turn(request)
            if self._max_turns is not None and len(self._mine) >= self._max_turns:
                raise RequestError(
                    TOO_MANY_TURNS,
                    f"this client has {self._max_turns} turns in flight, the most it may; wait for a result",
                )
            await self.start_turn(turn, self._turns, self.send)
        elif kind == "cancel":
            self.cancel(parse_cancel(request))
        elif kind == "decide":
            decide = parse_decide(request)
            self.decide(decide.id, decide.request_id, decide.decision)
        elif kind == "answer":
            answer = parse_answer(request)
            self.answer(answer.id, answer.request_id, answer.answers)
        elif kind == "ack_file":
            self.ack_file(*parse_ack_file(request))
        elif kind == "stats":
            parse_stats(request)
            stats = await self.host.current_stats()
            await self.send({"type": "stats", "id": echoed_id(request.get("id")), **stats.to_dict()})
        elif kind is None:
            raise RequestError(
                INVALID_REQUEST, 'a request needs a "type": turn, cancel, decide, answer, ack_file or stats'
            )
        else:
            raise RequestError(
                UNKNOWN_TYPE,
                f"unknown request type {shown(kind)}; expected turn, cancel, decide, answer, ack_file or stats",
            )

    def cancel(self, request_id: str | int) -> None:
        if not self.cancel_quietly(request_id):
            raise RequestError(UNKNOWN_TURN, f"no turn {request_id!r} is queued or running")

    def cancel_quietly(self, request_id: str | int) -> bool:
        """Cancel this client's turn `request_id`; whether one was in flight."""
        turn_id = self.host_turn_id(request_id)
        if self._scope and turn_id not in self._mine:
            return False  # a network client's turn ids are its own
        return self.host.cancel(turn_id)

    def decide(self, request_id: str | int, question: str, decision: Any) -> None:
        """Answer a `permission` a turn's agent asked: allowed or not (and `always`, to remember it)."""
        decided = self.host.decide(self._turn_in_flight(request_id), question, decision)
        refuse_unless_waited_for(decided, request_id, question)

    def answer(self, request_id: str | int, question: str, answers: Any) -> None:
        """Answer a `question` a turn's agent asked: each question's id → the labels chosen, or null to decline."""
        turn_id = self._turn_in_flight(request_id)
        try:
            answered = self.host.answer(turn_id, question, answers)
        except AnswerRefused as err:
            raise RequestError(INVALID_REQUEST, str(err)) from None
        refuse_unless_waited_for(answered, request_id, question)

    def ack_file(self, request_id: str | int, name: str) -> None:
        """The bot has read a file a `file` response named: it is deleted."""
        if not self._files.ack(self.host_turn_id(request_id), name):
            raise RequestError(
                UNKNOWN_FILE,
                f"turn {request_id!r} has no file {shown(name)} waiting: it was acknowledged already, its time "
                "ran out, or the turn left no such file",
            )

    def _turn_in_flight(self, request_id: str | int) -> str:
        """The host's id of the turn `request_id` names, or `unknown_turn` when none such is queued or running."""
        turn_id = self.host_turn_id(request_id)
        if turn_id not in self._mine or not self.host.in_flight(turn_id):
            raise RequestError(UNKNOWN_TURN, f"no turn {request_id!r} is queued or running")
        return turn_id

    async def start_turn(self, request: TurnRequest, nursery: trio.Nursery, send: Send) -> None:
        """Start `request` in `nursery` and send its `accepted`; raises `RequestError` when the host refuses it.

        Its later responses go through `send`, the last being its `result` or an `error`.
        """
        if not self.tenant.may_use(request.profile):
            raise RequestError(UNKNOWN_PROFILE, f"no profile named {request.profile!r}")
        accepted = trio.Event()  # nothing of a turn is written before its `accepted`
        try:
            await nursery.start(self._turn, request, accepted, send)
        except HostClosed:
            raise RequestError(SHUTTING_DOWN, "serve is shutting down and takes no new turns") from None
        except QueueFull as err:
            raise RequestError(QUEUE_FULL, str(err)) from None
        except DuplicateTurn:
            raise RequestError(
                DUPLICATE_ID, f"turn {request.id!r} is already in flight; give each turn its own id"
            ) from None
        except UnknownProfile as err:
            raise RequestError(
                UNKNOWN_PROFILE, told_of_profile(self.tenant, UNKNOWN_PROFILE, request.profile, str(err))
            ) from None
        except ProfileError as err:
            said = f"profile {request.profile!r} does not load: {err}"
            if self.tenant is not LOCAL:
                self._log.warning("a profile does not load", profile=request.profile, error=said)
            raise RequestError(
                PROFILE_INVALID, told_of_profile(self.tenant, PROFILE_INVALID, request.profile, said)
            ) from None
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
            await send({"type": "accepted", "id": request.id})
        finally:
            accepted.set()

    async def _turn(
        self,
        request: TurnRequest,
        accepted: trio.Event,
        send: Send,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        request_id = request.id
        turn_id = self.host_turn_id(request_id)
        status = _StartedFlag(task_status, lambda: self._mine.add(turn_id))
        files = self._files

        async def forward(event: HostEvent) -> None:
            if not accepted.is_set():
                await accepted.wait()
            if type(event) is PartialEvent:
                await send({"type": "partial", "id": request_id, "text": event.text})
            elif type(event) is SessionEvent:
                await send({"type": "session", "id": request_id, "session_id": event.session_id})
            elif (
                type(event) is ActivityEvent
                or type(event) is PermissionRequest
                or type(event) is QuestionRequest
                or type(event) is RequestWithdrawn
            ):
                record = event.to_dict()
                kind = record.pop("event")
                await send({"type": kind, "id": request_id, **record})
            elif type(event) is FileEvent:
                offered = files.offer(turn_id, event, request.inline_files_max_bytes)
                if self._file_url is not None and "data" not in offered:
                    offered["url"] = self._file_url(request_id, event.name)
                await send({"type": "file", "id": request_id, **offered})

        try:
            result = await self.host.submit(
                request.profile,
                self.tenant.conversation_prefix + request.conversation,
                request.turn,
                on_event=forward,
                turn_id=turn_id,
                task_status=status,
                client_id=request_id,
            )
        except Exception as err:
            if not status.started_once:
                raise  # refused: the caller answers with an error
            await accepted.wait()
            await self._turn_failed(turn_id, request_id, err, send, profile=request.profile)
            return
        finally:
            if status.started_once:
                self._mine.discard(turn_id)
        await accepted.wait()
        await self._deliver(turn_id, request_id, result, send)

    async def follow(self, turn_id: str, request_id: Any) -> None:
        """Send the result of a turn an earlier serve accepted (with PostgreSQL: at-least-once results), and the
        files the agent left first, as for a turn of this serve (by path: the turn's request is gone)."""
        files = self._files

        async def forward(event: HostEvent) -> None:
            if type(event) is FileEvent:
                await self.send({"type": "file", "id": request_id, **files.offer(turn_id, event, 0)})

        try:
            result = await self.host.follow(turn_id, on_event=forward)
        except Exception as err:
            await self._turn_failed(turn_id, request_id, err, self.send)
            return
        await self._deliver(turn_id, request_id, result, self.send)

    async def _deliver(self, turn_id: str, request_id: Any, result: TurnResult, send: Send) -> None:
        sent = await send({"type": "result", "id": request_id, **result.to_dict()})
        self._files.turn_over(result)
        if sent or not self._resend_unsent:
            await self.host.delivered(turn_id)

    async def _turn_failed(
        self, turn_id: str, request_id: Any, err: Exception, send: Send, profile: str | None = None
    ) -> None:
        """An accepted turn ended without a result: the stored session could not be read (the host logged
        why), or, through PostgreSQL, no worker could run it or serve stopped waiting for it."""
        code = err.code if isinstance(err, BridgeError) else None  # the PostgreSQL gateway's errors name theirs
        if code is None:
            code = STORE_ERROR if isinstance(err, StoreError) else INTERNAL_ERROR
        if code == INTERNAL_ERROR:
            self._log.error("unexpected error running a turn", error=repr(err), traceback=traceback.format_exc())
        message = str(err)
        if code in (UNKNOWN_PROFILE, PROFILE_INVALID) and self.tenant is not LOCAL:  # a worker's words
            self._log.warning("a worker refused a turn's profile", code=code, profile=profile, error=message)
            message = told_of_profile(self.tenant, code, profile, message)
        sent = await send({"type": "error", "id": request_id, "code": code, "message": message})
        if (sent or not self._resend_unsent) and code != DETACHED:
            await self.host.delivered(turn_id)  # the turn's end reached the client: a later serve need not send it

    async def error(self, request_id: Any, code: str, message: str) -> bool:
        return await self.send({"type": "error", "id": request_id, "code": code, "message": message})


class _StartedFlag(trio.TaskStatus[str]):
    """A task status that remembers whether the task reported itself started."""

    def __init__(self, inner: trio.TaskStatus[str], on_started: Callable[[], None]) -> None:
        self._inner = inner
        self._on_started = on_started
        self.started_once = False

    def started(self, value: str) -> None:
        self.started_once = True
        self._on_started()
        self._inner.started(value)
