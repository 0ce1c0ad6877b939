"""The exception hierarchy: everything the bridge raises derives from `BridgeError`.

A host can catch `BridgeError` to handle every bridge failure in one place, or a
subclass to react to one kind. Messages are written for the person who has to
fix the problem: they say what is wrong and, where possible, what to do. Every
exception class of the package is defined here; the modules that raise them
re-export theirs, so `bridge.host.sqlite_store.StoreError` and the like still import.

    BridgeError
    ├── ProfileError (ValueError)          a profile does not load; `problems` lists why
    │   ├── UnknownProfile (LookupError)   no profile has the name a turn asked for
    │   └── ChatConfigError                `agent-bridge connect`'s config does not load; `problems` lists why
    ├── TurnError (ValueError)             a turn's input cannot be sent to an agent
    ├── AnswerRefused (ValueError)         an answer to an agent's question names no option it offered
    ├── ProtocolMisuse (RuntimeError)      a dialect, warm agent, turn stream or host used out of order
    ├── LaunchError                        the agent could not be started (`exit_code` 126 or 127)
    ├── WarmStartError                     a warm agent could not start, or its session not be set up
    ├── FileRefused                        an agent's file request is refused (the message is its answer)
    ├── AttachmentRefused                  an attachment cannot be fetched, or is not what it says
    ├── AttachmentFailed                   a turn ends before its agent starts: an attachment failed (or a cancel)
    ├── OutboxError                        a turn's outbox cannot be made, or a file in it read
    ├── HostClosed                         the host is shutting down and takes no new turns
    ├── QueueFull                          every slot is busy and the queue is full
    │   └── OutboxFull                     a chat's outbox (bridge.chat.pacing) holds as many messages as allowed
    ├── DuplicateTurn (ValueError)         a turn with this id is already in flight
    ├── SessionIdRefused                   the turn names a session that is not its conversation's
    ├── StoreError                         the SQLite session store's file cannot be used
    ├── TurnLockError                      the queue directory next to the session store cannot be used
    ├── PostgresError                      PostgreSQL refused or could not be reached; `code` for serve
    │   ├── PostgresUnavailable            the server cannot be reached right now: worth trying again
    │   └── GatewayNameTaken               another live gateway holds this gateway's name
    ├── RemoteTurnError                    no worker could run the turn; `code` says why
    ├── TurnDetached                       the gateway stopped waiting for a turn that runs on
    ├── RequestError                       a serve request that gets an `error` response (`code`)
    │   └── ChatRefused                    a chat completion the OpenAI endpoint does not take (`param`)
    ├── AcpRefused                         an ACP request `agent-bridge acp` answers with an error (`rpc_code`)
    ├── ListenError                        the network door cannot start: its tokens, address or extra
    └── ChatError                          a chat platform (Telegram, Matrix) cannot be used as asked
        ├── PlatformConflict               another process polls the same bot
        ├── PlatformRefused                the platform refused a request for good (the message says why)
        └── PlatformUnavailable            the platform cannot be reached right now: worth trying again
            └── PlatformRateLimited        it asked to wait (a 429): the pacer holds and tries again

An error whose `code` is set names the error code `agent-bridge serve` answers with.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


class BridgeError(Exception):
    """Root of every error agent-bridge raises."""

    code: str | None = None
    """The error code `agent-bridge serve` answers with, for an error that names its own (PostgreSQL's, the
    gateway's, a refused request's); None: serve picks one by the error's class."""


@dataclass(slots=True, frozen=True)
class Problem:
    """One thing wrong with a profile, located as precisely as the input allows."""

    message: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        if self.file is None:
            return self.message
        if self.line is None:
            return f"{self.file}: {self.message}"
        return f"{self.file}:{self.line}: {self.message}"


class ProfileError(BridgeError, ValueError):
    """A profile could not be loaded; `problems` lists every reason, one per line."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


class TurnError(BridgeError, ValueError):
    """A turn's input (message, session id, attachments…) cannot be sent to an agent."""


class AnswerRefused(BridgeError, ValueError):
    """An answer to an agent's `QuestionRequest` does not fit it (an unknown question id, a label not among the
    options of a question that takes no words of the user's own, several labels where one is asked for)."""


class ProtocolMisuse(BridgeError, RuntimeError):
    """A dialect, warm agent, turn stream or host was used out of order: a bug in the caller, not in the agent.

    Also a `RuntimeError`, which is what these raised before.
    """


class LaunchError(BridgeError):
    """The agent could not be started; `exit_code` is 127 (not found) or 126 (cannot run).

    `run_turn` never raises this: it becomes a result with outcome
    `spawn_failed`. It is public for callers of `plan_launch`.
    """

    def __init__(self, exit_code: int, message: str) -> None:
        self.exit_code = exit_code
        self.message = message
        super().__init__(message)


class UnknownProfile(ProfileError, LookupError):
    """No profile in the directory has the name a turn asked for."""


class ChatConfigError(ProfileError):
    """The config of `agent-bridge connect` (bridge.chat.config) does not load; `problems` lists every reason."""


class WarmStartError(BridgeError):
    """The agent could not be started, or its session not set up; `exit_code` as for a spawn failure."""

    def __init__(self, exit_code: int, message: str, stderr_tail: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message
        self.stderr_tail = stderr_tail


class FileRefused(BridgeError):
    """The request cannot be served; the message is the error the agent gets."""


# ---------------------------------------------------------------------------- the host


class AttachmentRefused(BridgeError):
    """An attachment cannot be fetched or is not what it says; the message is the reason, safe to show and log."""


class AttachmentFailed(BridgeError):
    """A turn ends before its agent starts: an attachment failed (the message names it and why), or the host
    cancelled the turn while its attachments were fetched (`cancelled`)."""

    def __init__(self, message: str, *, cancelled: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.cancelled = cancelled


class OutboxError(BridgeError):
    """A turn's outbox cannot be made, or a file the agent left in it read as it was collected."""


class HostClosed(BridgeError):
    """The host is shutting down (or shut down) and takes no new turns."""


class QueueFull(BridgeError):
    """Every slot is busy and the queue holds as many turns as allowed; try again later."""


class OutboxFull(QueueFull):
    """A chat's outbox (or all of them) holds as many messages as allowed: this one is refused, not dropped
    unseen, so the connector can log it and count it as undelivered."""


class DuplicateTurn(BridgeError, ValueError):
    """A turn with this id is already queued or running; ids must be unique among turns in flight."""


class SessionIdRefused(BridgeError):
    """The turn names a session id that is not its conversation's stored one, and the host takes only that one
    (`client_session_ids="stored"`): a session id resumes whichever conversation's history it belongs to."""


class StoreError(BridgeError):
    """The session store's file cannot be used; the message names it and says what to do."""


class TurnLockError(BridgeError):
    """The queue directory next to the session store cannot be used; the message says what to do."""


# ---------------------------------------------------------------------------- PostgreSQL


class PostgresError(BridgeError):
    """PostgreSQL refused or could not be reached; the message says which server and what to do."""

    code: str

    def __init__(self, message: str, *, code: str = "store_error") -> None:
        super().__init__(message)
        self.code = code  # serve's error code


class PostgresUnavailable(PostgresError):
    """The server cannot be reached right now (down, restarting, network): worth trying again."""


class _NameHolder(Protocol):
    """What `GatewayNameTaken` says of a name's holder (`bridge.host.postgres.queue.NameHolder` is the real one)."""

    @property
    def backend_pid(self) -> int: ...
    @property
    def host(self) -> str | None: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def since(self) -> datetime | None: ...


class GatewayNameTaken(PostgresError):
    """Another live gateway holds this gateway's name; the message names it and says what to do."""

    def __init__(self, name: str, holder: _NameHolder | None, *, lost: bool = False) -> None:
        if holder is not None and holder.pid is not None:
            since = f", since {holder.since:%Y-%m-%d %H:%M:%S %Z}" if holder.since is not None else ""
            who = f"a live gateway: pid {holder.pid} on host {holder.host}{since}"
        elif holder is not None:
            who = f"another connection (PostgreSQL backend pid {holder.backend_pid}) that recorded nothing of itself"
        else:
            who = "another gateway"
        if lost:
            message = (
                f"this gateway lost its name {name!r} while its connection to PostgreSQL was down, and it "
                f"is held now by {who}; this gateway takes no new turns. Stop one of the two"
            )
        else:
            message = (
                f"gateway name {name!r} is held by {who}. A name is one bot's (its turns, results and "
                "sessions): stop that gateway first, or give this one another --name"
            )
        super().__init__(message, code="shutting_down")  # serve refuses turns with this code once it is lost
        self.name = name
        self.holder = holder


class RemoteTurnError(BridgeError):
    """A worker could not run the turn (unknown profile, a profile that does not load…); `code` says which."""

    code: str

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class TurnDetached(BridgeError):
    """The gateway stopped waiting for a turn that still runs on a worker; its result waits in the queue."""

    code = "detached"


# ---------------------------------------------------------------------------- serve


class RequestError(BridgeError):
    """A request that gets an `error` response; serve carries on."""

    code: str

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class AcpRefused(BridgeError):
    """A JSON-RPC request `agent-bridge acp` answers with an error (its JSON-RPC `code`); the door carries on."""

    def __init__(self, rpc_code: int, message: str) -> None:
        super().__init__(message)
        self.rpc_code = rpc_code
        self.message = message


class ChatRefused(RequestError):
    """A chat completion request the OpenAI-compatible endpoint does not take; `param` names the field at fault."""

    def __init__(self, code: str, message: str, param: str | None) -> None:
        super().__init__(code, message)
        self.param = param


class ListenError(BridgeError):
    """`serve --listen` (or `worker --metrics`) cannot start: a tokens file that does not load, a public address
    without tokens, a certificate that does not load, or the `http` extra not installed."""


# ---------------------------------------------------------------------------- chat platforms


class ChatError(BridgeError):
    """A chat platform's connector (`agent-bridge connect`) cannot do what it was asked."""


class PlatformConflict(ChatError):
    """Another process is polling the same bot (Telegram's 409 on getUpdates): only one may; stop the other."""


class PlatformRefused(ChatError):
    """The platform refused a request for good (a wrong token, a file over its limit, a message it will not take);
    trying again as is will not help."""


class PlatformUnavailable(ChatError):
    """The platform cannot be reached right now, or answered with a server error: worth trying again later."""


class PlatformRateLimited(PlatformUnavailable):
    """The platform asked the bot to wait `seconds` before its next request (a 429); the connector's pacer holds
    the chat, or every chat, that long and tries again."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the platform asked to wait {seconds:g} s before the next request")
        self.seconds = seconds
