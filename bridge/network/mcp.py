"""`agent-bridge mcp --listen HOST:PORT`: the MCP door over Streamable HTTP at `/mcp`, on hypercorn under trio.

The same rules as `serve --listen` (bridge.network.listen): without `--tokens`, only a loopback address; with
them, every request needs `Authorization: Bearer <token>` (else 401, before the SDK sees it), and a token's
tenant sees only its profiles as tools and only its conversations (its prefix). hypercorn runs through
`serve_app`, so one connection's error ends that connection alone and request heads are bounded; a request's
body must come whole within the door's `body_secs` (else 408), as on `serve --listen`. With tokens, a tenant
holds at most `MAX_SESSIONS_PER_TENANT` MCP sessions open (`SessionShares`), so one token holder cannot take
every session the SDK keeps.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import trio

from ..network.door import DEFAULT_BODY_SECS, DoorLimits
from ..network.listen import (
    Address,
    SocketBudget,
    check_listen,
    hypercorn_config,
    serve_app,
    sockets_within_descriptors,
)
from ..network.tokens import Tokens, bearer_token
from ..serving.mcp import CLIENT_GONE, McpDoor, shut_down_on_signals
from ..serving.session import LOCAL, Tenant

MCP_PATH = "/mcp"
SESSION_IDLE_SECS = 30 * 60.0
"""A session that has had no request in flight for this long is ended (the SDK's default, given to it
explicitly: `SessionShares` counts a session as open no longer than the SDK keeps it)."""
MAX_SESSIONS_PER_TENANT = 100
"""MCP sessions one tenant (the tokens of one name) may hold open at once. The SDK keeps 10,000 in all, each
until it has been idle for 30 min, and refuses everyone a new one past that: a tenant's share of 1% leaves room
for every other tenant unless a hundred of them fill theirs, and is far more than the MCP clients one bot or one
person runs at once (a client holds one session)."""
TENANT_NAME = "agent_bridge.tenant_name"  # the ASGI scope's key for the name of a request's tenant, with tokens


def tenant_lookup(tokens: Tokens | None) -> Any:
    """Who an HTTP request is: its token's tenant, `LOCAL` without tokens, None for a missing or wrong token."""

    def tenant_of(request: Any) -> Tenant | None:
        if tokens is None:
            return LOCAL
        headers = getattr(request, "headers", None)
        return tokens.tenant_of(bearer_token(headers.get("authorization") if headers is not None else None))

    return tenant_of


class RequireToken:
    """ASGI middleware: with tokens, a request without a valid one gets 401 and reaches nothing else. Each request
    that passes carries an event in its scope (`CLIENT_GONE`), set when its client disconnects, which cancels a
    call still running for it, and its tenant as the SDK's authenticated user: the SDK binds an MCP session to the
    user that opened it, so another token naming its id (to read its stream, cancel its calls, answer what it
    asks) gets 404, as for a session that does not exist."""

    def __init__(self, app: Any, tokens: Tokens | None, *, body_secs: float = DEFAULT_BODY_SECS) -> None:
        self.app = app
        self.tokens = tokens
        self.body_secs = body_secs

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.tokens is not None:
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
            tenant = self.tokens.tenant_of(bearer_token(headers.get("authorization")))
            if tenant is None:
                message = "give Authorization: Bearer <token>, a token of the tokens file"
                await _refuse(send, 401, "unauthorized", message, (b"www-authenticate", b"Bearer"))
                return
            scope = {**scope, "user": _session_owner(tenant), TENANT_NAME: tenant.name}
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await _body_within(receive, self.body_secs)
        if body is None:  # the rest of the body may still come: the connection cannot carry another request
            message = f"the body did not come whole within {self.body_secs:g} s"
            await _refuse(send, 408, "request_timeout", message, (b"connection", b"close"))
            return
        gone = trio.Event()

        async def receive_noting_disconnect() -> Any:
            nonlocal body
            if body is not None:  # the body, read already, once
                message, body = body, None
                return message
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            return message

        await self.app({**scope, CLIENT_GONE: gone}, receive_noting_disconnect, send)


async def _refuse(send: Any, status: int, error: str, message: str, *header: tuple[bytes, bytes]) -> None:
    headers = [(b"content-type", b"application/json"), *header]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps({"error": error, "message": message}).encode()})


@dataclass
class _Session:
    in_flight: int  # its requests being served, an open GET stream included
    idle_since: float  # trio.current_time() when its last request ended


class SessionShares:
    """ASGI middleware behind `RequireToken`: a tenant holds at most `most` MCP sessions open, and a request that
    would open one more gets 429 `too_many_sessions` before the SDK sees it; other tenants are unaffected.

    A session is counted from the answer that gives its id (a request still opening one counts too) until its
    client ends it (DELETE), the SDK answers 404 for its id (it forgot it), or it has had no request in flight
    for `idle_secs`, the SDK's idle timeout, which ends it there too."""

    def __init__(self, app: Any, *, most: int = MAX_SESSIONS_PER_TENANT, idle_secs: float = SESSION_IDLE_SECS) -> None:
        self.app = app
        self.most = most
        self.idle_secs = idle_secs
        self._sessions: dict[str, dict[str, _Session]] = {}  # tenant name → its open sessions by id
        self._opening: dict[str, int] = {}  # tenant name → its requests without a session id being served

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        tenant = scope.get(TENANT_NAME)
        if scope["type"] != "http" or tenant is None:
            await self.app(scope, receive, send)
            return
        sessions = self._sessions.setdefault(tenant, {})
        session_id = _header(scope, b"mcp-session-id")
        if session_id is None:
            await self._open(tenant, sessions, scope, receive, send)
        else:
            await self._use(sessions, session_id, scope, receive, send)

    async def _open(self, tenant: str, sessions: dict[str, _Session], scope: Any, receive: Any, send: Any) -> None:
        now = trio.current_time()
        for session_id, session in list(sessions.items()):
            if session.in_flight == 0 and now - session.idle_since >= self.idle_secs:
                del sessions[session_id]
        if len(sessions) + self._opening.get(tenant, 0) >= self.most:
            message = (
                f"this token's tenant has {self.most} MCP sessions open, the most it may: reuse one, or end one it "
                f"no longer uses (DELETE {MCP_PATH} with its Mcp-Session-Id); a session unused for "
                f"{self.idle_secs / 60:g} min ends by itself"
            )
            await _refuse(send, 429, "too_many_sessions", message)
            return
        opened: list[str] = []

        async def note_session(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                given = dict(message.get("headers", [])).get(b"mcp-session-id")
                if given is not None:
                    opened.append(given.decode("latin-1"))
                    sessions[opened[0]] = _Session(in_flight=1, idle_since=trio.current_time())
            await send(message)

        self._opening[tenant] = self._opening.get(tenant, 0) + 1
        try:
            await self.app(scope, receive, note_session)
        finally:
            self._opening[tenant] -= 1
            if opened and opened[0] in sessions:
                sessions[opened[0]].in_flight -= 1
                sessions[opened[0]].idle_since = trio.current_time()

    async def _use(self, sessions: dict[str, _Session], session_id: str, scope: Any, receive: Any, send: Any) -> None:
        session = sessions.get(session_id)  # None: another tenant's, or one the SDK no longer has (it answers 404)
        if session is None:
            await self.app(scope, receive, send)
            return
        answered: list[int] = []

        async def note_status(message: Any) -> None:
            if message["type"] == "http.response.start":
                answered.append(message["status"])
            await send(message)

        session.in_flight += 1
        try:
            await self.app(scope, receive, note_status)
        finally:
            session.in_flight -= 1
            session.idle_since = trio.current_time()
            ended = scope["method"] == "DELETE" and answered and answered[0] < 400
            if ended or answered == [404]:
                sessions.pop(session_id, None)


def _header(scope: Any, name: bytes) -> str | None:
    """The value of a request's header `name` (lower case), if it has one."""
    for key, value in scope["headers"]:
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


async def _body_within(receive: Any, secs: float) -> dict[str, Any] | None:
    """The request's body as one ASGI message, read within `secs` (None: it did not come whole), or the client's
    disconnect. Read no further than the SDK's limit: past it the SDK answers 413 to what was read."""
    from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE

    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(secs):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return dict(message)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if not message.get("more_body") or size > DEFAULT_MAX_REQUEST_BODY_SIZE:
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
    return None


def _gated(app: Any, tokens: Tokens | None, body_secs: float) -> Any:
    """`app` behind `RequireToken`; without tokens, behind `LocalCallersOnly` too (the SDK checks `Origin` and
    `Host` itself only on 127.0.0.1, localhost and ::1, not on the rest of loopback)."""
    from starlette.responses import JSONResponse

    from .auth import LocalCallersOnly

    def web_page_refused() -> JSONResponse:
        message = "this server has no --tokens, so it serves the programs of this machine and no web page"
        return JSONResponse({"error": "forbidden", "message": message}, status_code=403)

    gated = RequireToken(SessionShares(app), tokens, body_secs=body_secs)
    return gated if tokens is not None else LocalCallersOnly(gated, refusal=web_page_refused)


def _session_owner(tenant: Tenant) -> Any:
    """The SDK's user for `tenant`: its name is all the SDK compares (the tokens of one name are one tenant)."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    return AuthenticatedUser(AccessToken(token="", client_id=tenant.name, scopes=[]))  # never the bearer token


async def serve_mcp_http(
    door: McpDoor,
    address: Address,
    *,
    tokens: Tokens | None,
    limits: DoorLimits | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `door` at `/mcp` on `address` until SIGTERM or SIGINT; `task_status` gets the URLs."""
    from hypercorn.trio import serve

    check_listen(address, tokens)
    limits = limits or DoorLimits()
    config = hypercorn_config(address, certfile=None, keyfile=None, limits=limits)
    config.socket_budget = SocketBudget(sockets_within_descriptors(limits.max_sockets))
    server = door.server()
    app = server.streamable_http_app(
        streamable_http_path=MCP_PATH, host=address.host, session_idle_timeout=SESSION_IDLE_SECS
    )
    stop_listening = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(shut_down_on_signals, door.host, stop_listening)
        # Ends once hypercorn has closed its connections: the answers of calls whose turns ended within the
        # shutdown grace are sent first.
        async with trio.open_nursery() as server:
            gated = _gated(app, tokens, limits.body_secs)
            urls: list[str] = await server.start(serve_app, serve, gated, config, stop_listening.wait)
            urls = [f"{url.rstrip('/')}{MCP_PATH}" for url in urls]
            who = f"{len(tokens)} tokens" if tokens else "no tokens: loopback clients only"
            print(f"agent-bridge mcp: listening on {' '.join(urls)} ({who})", file=sys.stderr, flush=True)
            task_status.started(urls)
        nursery.cancel_scope.cancel()
