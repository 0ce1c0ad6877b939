"""The network door's state: who may come in, how many at once, and each tenant's turns (docs/network.md).

Rules, all here:
- With tokens, every request but `/healthz` and `/readyz` needs a valid bearer
  token (else 401), and is served as that token's `Tenant`. Without tokens
  there is one tenant, `local`, and the door listens on loopback only (the
  listener refuses any other address before it binds).
- A tenant's HTTP turns share one `ClientSession` (scope `<name>/http/`), so
  `POST /v1/turns/{id}/cancel` reaches them and nothing of another tenant's;
  each WebSocket connection is a client of its own (scope `<name>/ws<n>/`).
  Tenant names cannot hold "/", so no scope is a prefix of another's.
- At most `max_connections` WebSocket connections and streaming HTTP requests
  at once (more get 503 / close code 1013), each WebSocket connection at most
  `max_turns_per_connection` turns in flight. At most `max_sockets` TCP
  connections at all (the listener closes one more unread): so connections
  still sending a request, whose headers must come within the keep-alive
  timeout and whose body within `body_secs` (else 408), are bounded too.
- A client that does not take a response within `stall_secs` is dropped, and
  its turns are cancelled: a slow reader holds one response, never a queue.
- `/metrics` needs a token as the turn endpoints do, and shows the whole
  server's numbers whichever tenant asks (docs/metrics.md).
- No client of the door comes back for a result it was not sent (its ids are
  its connection's, or its request's): behind a fleet gateway such a result
  counts as delivered, not left for the next serve of the gateway's name.
  Results an earlier gateway of the name could not send are left for a serve
  on stdin/stdout of that name, which sends them; the door says how many wait
  (`serve_network`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from urllib.parse import quote

import trio

from ..dialects.events import FileEvent
from ..host.interface import BaseHost
from ..serving.file_delivery import DEFAULT_FILE_TTL, FileDeliveries
from ..serving.requests import MAX_REQUEST_BYTES
from ..serving.session import ClientSession, Send, Tenant
from .metrics import Metrics
from .tokens import Tokens, bearer_token

DEFAULT_MAX_CONNECTIONS = 2048
DEFAULT_MAX_TURNS_PER_CONNECTION = 32
DEFAULT_STALL_SECS = 30.0
DEFAULT_BODY_SECS = 30.0
# TCP connections the listener holds beyond `max_connections`: room for requests being read and short answers,
# including the 503 and close code 1013 that tell a client past `max_connections` why.
SOCKETS_BEYOND_CONNECTIONS = 256

LOOPBACK_TENANT = Tenant("local")  # no tokens: the loopback clients, every profile, conversations as given


@dataclass(frozen=True, slots=True)
class DoorLimits:
    max_body_bytes: int = MAX_REQUEST_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_turns_per_connection: int = DEFAULT_MAX_TURNS_PER_CONNECTION
    stall_secs: float = DEFAULT_STALL_SECS
    file_ttl: float = DEFAULT_FILE_TTL
    body_secs: float = DEFAULT_BODY_SECS

    @property
    def max_sockets(self) -> int:
        """TCP connections open at once, whatever they are doing; a new one past them is closed unread."""
        return self.max_connections + SOCKETS_BEYOND_CONNECTIONS


def _scope(tenant: Tenant, client: str) -> str:
    """The start of the host's turn ids of a tenant's client (`http`, or a WebSocket connection's `ws<n>`)."""
    return f"{tenant.name}/{client}/"


def _file_url(client: str) -> Callable[[str | int, str], str]:
    """Where a client downloads a file its turn's agent left (docs/network.md, "Files")."""

    def url(request_id: str | int, name: str) -> str:
        return f"/v1/files/{client}/{quote(str(request_id), safe='')}/{quote(name, safe='')}"

    return url


async def _nobody(response: dict[str, object]) -> bool:
    """Where a tenant's HTTP session sends what no turn's stream carries: nowhere (each turn has its own)."""
    return False


@dataclass
class Door:
    """One listening serve: its host, its tenants, and what it holds open."""

    host: BaseHost
    tokens: Tokens | None
    limits: DoorLimits = field(default_factory=DoorLimits)
    connections: int = 0
    _http_sessions: dict[str, ClientSession] = field(default_factory=dict)
    _connection_numbers: count[int] = field(default_factory=lambda: count(1))
    _nursery: trio.Nursery | None = None
    files: FileDeliveries | None = None
    metrics: Metrics = field(default_factory=Metrics)

    def open(self, nursery: trio.Nursery) -> None:
        """Start: the files agents leave and every tenant's HTTP turns live in `nursery` (the door's lifetime);
        the host's turns are counted in `metrics`."""
        self._nursery = nursery
        self.files = FileDeliveries(nursery, self.limits.file_ttl)
        self.host.observer = self.metrics

    def close(self) -> None:
        if self.host.observer is self.metrics:
            self.host.observer = None
        if self.files is not None:
            self.files.close()

    @property
    def ready(self) -> bool:
        return self._nursery is not None and not self.host.closing

    def tenant_of(self, authorization: str | None) -> Tenant | None:
        """The tenant a request's `Authorization` header names; None: refuse it with 401."""
        if self.tokens is None:
            return LOOPBACK_TENANT
        return self.tokens.tenant_of(bearer_token(authorization))

    def http_session(self, tenant: Tenant) -> ClientSession:
        """The tenant's client for HTTP turns (one per tenant: its turn ids are its own)."""
        session = self._http_sessions.get(tenant.name)
        if session is None:
            assert self._nursery is not None and self.files is not None, "the door is not open"
            session = ClientSession(
                self.host,
                _nobody,
                self.files,
                self._nursery,
                tenant=tenant,
                scope=_scope(tenant, "http"),
                file_url=_file_url("http"),
                resend_unsent=False,
            )
            self._http_sessions[tenant.name] = session
        return session

    def connection_session(self, tenant: Tenant, send: Send, turns: trio.Nursery) -> ClientSession:
        """A new WebSocket connection's own client."""
        assert self.files is not None, "the door is not open"
        number = next(self._connection_numbers)
        return ClientSession(
            self.host,
            send,
            self.files,
            turns,
            tenant=tenant,
            scope=_scope(tenant, f"ws{number}"),
            file_url=_file_url(f"ws{number}"),
            max_turns_in_flight=self.limits.max_turns_per_connection,
            resend_unsent=False,
        )

    def waiting_file(self, tenant: Tenant, client: str, request_id: str, name: str) -> FileEvent | None:
        """A file the tenant's client (`http`, `ws<n>`) was offered and has not acknowledged."""
        assert self.files is not None, "the door is not open"
        return self.files.waiting(_scope(tenant, client) + request_id, name)

    def acknowledge_file(self, tenant: Tenant, client: str, request_id: str, name: str) -> bool:
        assert self.files is not None, "the door is not open"
        return self.files.ack(_scope(tenant, client) + request_id, name)

    def take_connection(self) -> bool:
        """Count one more open connection; False (and nothing counted) when `max_connections` are open."""
        if self.connections >= self.limits.max_connections:
            return False
        self.connections += 1
        return True

    def give_back_connection(self) -> None:
        self.connections -= 1
