"""What every kind of host shares (the local `Host`, and the PostgreSQL gateway `RemoteHost`): the interface a bot
holds (`BaseHost`), its stats, and the rule for session ids a turn names."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import hmac
from collections import Counter
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol, Self

import trio

from ..dialects.events import PartialEvent
from ..engine.loop import Emit, EventCallback, HostEvent, PartialCallback, PermissionCallback, emit_to
from ..engine.questions import QuestionAnswer, Questions
from ..engine.result import TurnResult
from ..engine.run import require_trio
from ..errors import DuplicateTurn, HostClosed, ProtocolMisuse, SessionIdRefused, TurnError
from ..log import Logger
from ..permissions import Decision
from ..turn import Turn, text_problem

# What a host does with a session id a turn names: "any" resumes it; "stored" only the conversation's own.
ClientSessionIds = Literal["any", "stored"]
CLIENT_SESSION_IDS: tuple[ClientSessionIds, ...] = ("any", "stored")


def check_client_session_ids(value: object) -> ClientSessionIds:
    if value not in CLIENT_SESSION_IDS:
        raise ValueError(f"client_session_ids must be 'any' or 'stored', not {value!r}")
    return value


def refuse_unless_stored(session_id: str, stored: str, profile: str, conversation: str, session_name: str) -> None:
    """Raise `SessionIdRefused` unless `session_id` is `stored`, the conversation's own session.

    The id is a bearer secret: compared in constant time, and what is stored is never said.
    """
    if not hmac.compare_digest(session_id.encode(), stored.encode()):
        raise SessionIdRefused(
            f"the turn's session_id is not the session stored for conversation {conversation!r} (profile "
            f"{profile!r}, session name {session_name!r}), and this host takes no other: leave session_id empty to "
            "resume the conversation's own session (a session id resumes whichever conversation's history it "
            "belongs to)"
        )


@dataclass(frozen=True, slots=True)
class HostStats:
    """A snapshot of the host's load and history since it opened.

    `completed` counts every turn that produced a result (whatever its
    outcome), `failed` those of them whose exit code was not 0, `outcomes` the
    results by outcome. `refused` counts submits turned away because the queue
    was full; `store_errors` sessions that could not be read or recorded.
    `questions_waiting` counts the agents' permission requests and questions
    that wait for an answer now; `fleet_queued` the turns waiting in the
    PostgreSQL queue for any worker (None, and left out of `to_dict`, for a
    host without one).
    """

    running: int
    queued: int
    completed: int
    failed: int
    refused: int
    store_errors: int
    outcomes: dict[str, int]
    max_concurrent: int
    max_queued: int
    closing: bool
    warm: int = 0  # warm agents alive (between turns or taking one)
    questions_waiting: int = 0
    fleet_queued: int | None = None

    def to_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        if self.fleet_queued is None:
            del record["fleet_queued"]
        return record


class TurnObserver(Protocol):
    """Told of each turn a host runs, as it goes (the network door's metrics implement it).

    Set as a host's `observer`; a host without one calls nothing. Times are in seconds from the moment the
    host accepted the turn, so they include a wait in the queue. The calls are synchronous and must not block.
    """

    def first_partial(self, profile: str, seconds: float) -> None:
        """The turn's first partial reached the host."""

    def turn_ended(self, profile: str, outcome: str, seconds: float) -> None:
        """The turn has its result, with this outcome."""


def observed(observer: TurnObserver, profile: str, started: float, emit: Emit | None) -> Emit:
    """`emit` (or nothing), telling `observer` when the turn accepted at `started` (trio's clock) has its first
    partial."""
    seen = False

    async def observing(event: HostEvent) -> None:
        nonlocal seen
        if not seen and type(event) is PartialEvent:
            seen = True
            observer.first_partial(profile, trio.current_time() - started)
        if emit is not None:
            await emit(event)

    return observing


def check_submitted(conversation: object, turn: object) -> None:
    """Raise `TurnError` unless `submit` may take this turn in this conversation (as every store can key it)."""
    if not isinstance(turn, Turn):
        raise TurnError(f"submit() needs a bridge.Turn, not {type(turn).__name__}")
    if not isinstance(conversation, str) or not conversation:
        raise TurnError(f"the conversation key must be a non-empty string, not {conversation!r}")
    if problem := text_problem(conversation):
        raise TurnError(f"the conversation key {problem}")
    if not turn.session_name:
        raise TurnError("the turn's session_name must not be empty (the default is 'default')")


@dataclass(slots=True)
class Submitted:
    """A turn `submit` checked and gave an id, as a host's `_run_submitted` gets it."""

    profile: str
    conversation: str
    turn: Turn
    turn_id: str
    client_id: str | int | None
    on_partial: PartialCallback | None
    on_event: EventCallback | None
    on_permission: PermissionCallback | None
    observer: TurnObserver | None
    started: float = field(default_factory=trio.current_time)  # trio's clock, when submit accepted it
    emit: Emit | None = None  # set by `callbacks`: the result reaches it last

    def callbacks(self, questions: Questions | None = None) -> Emit | None:
        """The one `Emit` for the submitter's callbacks, as `emit_to` makes it (answering the agent's requests
        through `questions`, when given), telling the host's observer of the first partial; kept to send the
        result."""
        emit = emit_to(self.on_partial, self.on_event, self.on_permission, questions)
        if self.observer is not None:
            emit = observed(self.observer, self.profile, self.started, emit)
        self.emit = emit
        return emit


class BaseHost(abc.ABC):
    """What a bot holds to run turns for many conversations, whichever host `open_host` built.

    `Host` runs the turns in this process; `RemoteHost` (`open_host(postgres=…)`) queues them in PostgreSQL
    for `agent-bridge worker`s to run. Both are used as `async with open_host(...) as host`, which runs the
    host's own tasks (the warm pool's, the gateway's listener) and shuts the host down on the way out.

    A base class rather than a `typing.Protocol`: the two share behaviour, not only signatures (the
    `async with` lifetime, shutdown's first step, the checks of their settings), and a host is built by
    `open_host`, never written by a user, so nothing is gained by matching hosts by shape.
    """

    def __init__(self, *, shutdown_grace: float, client_session_ids: ClientSessionIds, log: Logger) -> None:
        if not shutdown_grace >= 0:
            raise ValueError("shutdown_grace must be at least 0 seconds")
        self.shutdown_grace = shutdown_grace
        self._log = log
        self._outcomes: Counter[str] = Counter()  # the results of submit, by outcome
        self._failed = 0  # of them, those whose exit code was not 0
        self.client_session_ids = check_client_session_ids(client_session_ids)
        self._closing = False
        self.observer: TurnObserver | None = None  # told of each turn (metrics), when set
        self._lifetime: contextlib.AsyncExitStack | None = None  # while `async with` runs the host's tasks

    # ------------------------------------------------------------------ turns

    async def submit(
        self,
        profile: str,
        conversation: str,
        turn: Turn,
        *,
        on_partial: PartialCallback | None = None,
        on_event: EventCallback | None = None,
        on_permission: PermissionCallback | None = None,
        turn_id: str | None = None,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
        client_id: str | int | None = None,
    ) -> TurnResult:
        """Run `turn` with the profile named `profile` in `conversation`, in its turn, and return the result.

        Turns of one conversation run one at a time, in order; `nursery.start(host.submit, ...)` returns the
        turn id once the turn was accepted. `client_id` is the client's own id for the turn (serve's
        request id), given back by `undelivered()` should the host stop before the client has the result.
        `on_partial(text)` / `on_event(event)` see the turn's events as in `run_turn`; the `TurnResult` reaches
        `on_event` last.

        Refused at once, before anything runs: `HostClosed`, `TurnError` (not a `Turn`, a conversation key
        no store can hold, an empty session name), `DuplicateTurn` (`turn_id` is in flight), and with
        `client_session_ids="stored"` `SessionIdRefused` (`turn.session_id` is set and is not the
        conversation's stored one). Each host adds its own (see `Host.submit`, `RemoteHost.submit`).
        """
        require_trio(f"{type(self).__name__}.submit")
        self._refuse_if_closed()
        check_submitted(conversation, turn)
        if turn.session_id and self.client_session_ids == "stored":
            stored = await self._stored_session(profile, conversation, turn.session_name)
            try:
                refuse_unless_stored(turn.session_id, stored, profile, conversation, turn.session_name)
            except SessionIdRefused:
                self._log.warning("turn refused: its session_id is not the conversation's stored one", profile=profile)
                raise
            self._refuse_if_closed()  # shutdown may have begun while the store was read
        if turn_id is None:
            turn_id = self._new_turn_id()
        elif self.in_flight(turn_id):
            raise DuplicateTurn(f"turn {turn_id!r} is already in flight; give each turn its own id")
        submitted = Submitted(
            profile, conversation, turn, turn_id, client_id, on_partial, on_event, on_permission, self.observer
        )
        result = await self._run_submitted(submitted, task_status)
        self._outcomes[result.outcome.value] += 1
        if not result.ok:
            self._failed += 1
        if submitted.observer is not None:
            submitted.observer.turn_ended(profile, result.outcome.value, trio.current_time() - submitted.started)
        if submitted.emit is not None:
            await submitted.emit(result)  # last, once the host is done with the turn (its session is stored)
        return result

    def _refuse_if_closed(self) -> None:
        """Raise what `submit` raises once this host takes no new turns (`HostClosed`)."""
        if self._closing:
            raise HostClosed("the host is shutting down and takes no new turns")

    @abc.abstractmethod
    def _new_turn_id(self) -> str:
        """An id for a turn submitted without one, that no turn in flight has."""

    @abc.abstractmethod
    async def _stored_session(self, profile: str, conversation: str, session_name: str) -> str:
        """The session id stored for the conversation ("" for none), for `client_session_ids="stored"`."""

    @abc.abstractmethod
    async def _run_submitted(self, submitted: Submitted, task_status: trio.TaskStatus[str]) -> TurnResult:
        """How this host runs a turn `submit` checked: `task_status.started(turn_id)` once it is accepted,
        then its result (which `submit` counts and emits)."""

    @abc.abstractmethod
    def cancel(self, turn_id: str) -> bool:
        """Stop turn `turn_id`; its submitter gets a cancelled result. False when no such turn is in flight."""

    @abc.abstractmethod
    def in_flight(self, turn_id: str) -> bool:
        """True while turn `turn_id` is queued or running."""

    @abc.abstractmethod
    def decide(self, turn_id: str, request_id: str, answer: Decision | bool) -> bool:
        """Answer permission request `request_id` of turn `turn_id`; False when that question waits for nothing."""

    @abc.abstractmethod
    def answer(self, turn_id: str, request_id: str, answer: QuestionAnswer) -> bool:
        """Answer question `request_id` of turn `turn_id` (a `QuestionRequest` its `on_event` saw): each question's
        id → the labels chosen (a plain label when it asked one), or None to decline. `AnswerRefused` when the answer
        does not fit the question; False when that question waits for nothing."""

    @abc.abstractmethod
    async def current_stats(self) -> HostStats:
        """A snapshot of the host's load and history since it opened."""

    async def profile_names(self) -> list[str] | None:
        """The names of the profiles that load now, sorted; None when this host cannot tell (the PostgreSQL
        gateway: its workers have the profiles)."""
        return None

    # ------------------------------------------------------------------ results a client was not sent

    async def undelivered(self) -> list[tuple[str, Any]]:
        """(turn id, client id) of the turns an earlier host of this name accepted whose result no client was
        sent. Only a host whose results outlive it (the gateway's wait in the queue) has any."""
        return []

    async def follow(self, turn_id: str, *, on_event: EventCallback | None = None) -> TurnResult:
        """Wait for the result of a turn `undelivered()` listed."""
        raise ProtocolMisuse(f"turn {turn_id!r} was not listed by undelivered(): this host's results end with it")

    async def delivered(self, turn_id: str) -> None:
        """The client has the turn's result: a later host will not send it again (when results outlive hosts)."""
        return None  # a host whose results end with it has nothing to mark

    # ------------------------------------------------------------------ shutdown

    @property
    def closing(self) -> bool:
        """True once shutdown began: `submit` raises `HostClosed`."""
        return self._closing

    def stop_accepting(self) -> None:
        """Begin shutdown: from now on `submit` raises `HostClosed`; turns in flight carry on."""
        self._closing = True

    @abc.abstractmethod
    def cancel_all(self) -> None:
        """Cancel every turn in flight."""

    @abc.abstractmethod
    async def aclose(self, grace: float | None = None) -> None:
        """Shut down: stop accepting, give turns in flight `grace` seconds (default `shutdown_grace`), then
        stop them (or, for a gateway, stop waiting for them)."""

    @abc.abstractmethod
    def _running(self) -> AbstractAsyncContextManager[None]:
        """The host's own tasks, for as long as `async with` runs; on the way out, `aclose()`, then their end."""

    async def __aenter__(self) -> Self:
        require_trio(f"a {type(self).__name__}")
        if self._lifetime is not None or self._closing:
            raise ProtocolMisuse(f"a {type(self).__name__} is entered once (`async with open_host(...) as host`)")
        lifetime = contextlib.AsyncExitStack()
        await lifetime.enter_async_context(self._running())
        self._lifetime = lifetime
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        assert self._lifetime is not None
        # Closed as after a clean exit: the body's own exception, if any, propagates as itself (not wrapped in
        # the exception group of the nursery running the host's tasks).
        await self._lifetime.aclose()
