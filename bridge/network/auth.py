"""Who comes in through the network door: one gate in front of every route that needs a token (docs/network.md).

`TenantGate` is ASGI middleware: an HTTP request or a WebSocket reaches an
application behind it only as the tenant its `Authorization: Bearer` header
names, else it gets the application's 401 before any handler runs. A handler
reads its tenant with `tenant_of(request)`. Only the paths a gate names as
public (health and readiness) pass without a token; a new route behind a gate
needs one whether its handler thinks of it or not. `OwnPaths` mounts an
application that answers only its own routes' paths, so several applications,
each behind its own gate, share the door's URL space. `LocalCallersOnly` stands in
front of a door without tokens: a web page is no local caller, though the
browser that shows it is (see `web_page_problem`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import Response
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from ..serving.session import Tenant

TENANT_KEY = "agent_bridge.tenant"  # where the gate leaves the tenant in the request's scope

TenantOf = Callable[[str | None], Tenant | None]  # the Authorization header's tenant; None: refuse it


class TenantGate:
    """ASGI middleware: every request but those to `public` paths is its token's tenant's, or gets `refusal()`.

    A WebSocket refused gets the refusal as its handshake's HTTP response.
    """

    def __init__(
        self, app: ASGIApp, *, tenant_of: TenantOf, refusal: Callable[[], Response], public: Collection[str] = ()
    ) -> None:
        self.app = app
        self.tenant_of = tenant_of
        self.refusal = refusal
        self.public = frozenset(public)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.public:
            await self.app(scope, receive, send)
            return
        tenant = self.tenant_of(Headers(scope=scope).get("authorization"))
        if tenant is None:
            await refuse(scope, receive, send, self.refusal())
            return
        scope[TENANT_KEY] = tenant  # this request's own scope: never shared with another request
        await self.app(scope, receive, send)


async def refuse(scope: Scope, receive: Receive, send: Send, refusal: Response) -> None:
    """`refusal` as the answer to a request no application saw (a WebSocket's: its handshake's). Its body is left
    unread, so its connection cannot carry another request: the answer says so (`Connection: close`), else a
    client that sent its next request on that connection would find it closed under the request."""
    if scope["type"] == "websocket":
        await WebSocket(scope, receive, send).send_denial_response(refusal)
        return
    refusal.headers["connection"] = "close"
    await refusal(scope, receive, send)


def tenant_of(request: HTTPConnection) -> Tenant:
    """The tenant `TenantGate` let `request` in as."""
    tenant = request.scope.get(TENANT_KEY)
    assert isinstance(tenant, Tenant), f"{request.url.path} is served without a TenantGate in front of it"
    return tenant


class OwnPaths(Mount):
    """A mounted application that takes only the paths its own routes have; any other is the next route's.

    A plain `Mount` takes every path under its prefix, so of two applications mounted at one prefix the
    second would never be reached.
    """

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is Match.NONE:
            return match, child_scope
        inner: dict[str, Any] = {**scope, **child_scope}
        if any(route.matches(inner)[0] is not Match.NONE for route in self.routes):
            return match, child_scope
        return Match.NONE, {}


class LocalCallersOnly:
    """ASGI middleware for a door without tokens: a request that `web_page_problem` finds came from a web page gets
    `refusal()` (a WebSocket's handshake is refused with it) before anything else sees it."""

    def __init__(self, app: ASGIApp, *, refusal: Callable[[], Response]) -> None:
        self.app = app
        self.refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = Headers(scope=scope)
            if web_page_problem(headers.get("host"), headers.get("origin")) is not None:
                await refuse(scope, receive, send, self.refusal())
                return
        await self.app(scope, receive, send)


def web_page_problem(host: str | None, origin: str | None) -> str | None:
    """Why a request to a loopback door without tokens came from a web page, not a program of this machine; None
    when it did not.

    A browser on this machine reaches loopback for any page it shows: a page of another site can post a turn
    (a form, a `fetch` the CORS rules let through unread) or open a WebSocket (no CORS at all), and one whose name
    its DNS points at 127.0.0.1 (DNS rebinding) reads the answers too. A browser always names the page's site in
    `Origin` on such requests, and the rebound name in `Host`; the programs the door serves send neither, or a
    loopback one. Names are never resolved: resolving is what the rebinding attack controls.
    """
    if host is not None and not _loopback_name(_host_of_authority(host)):
        return "its Host is not a loopback address (a web page's name rebound to this machine)"
    if origin is not None and not _loopback_name(urlsplit(origin).hostname or ""):
        return "it comes from a web page of another site (its Origin)"
    return None


def _host_of_authority(authority: str) -> str:
    """The host of a `Host` header's `host[:port]` (`[::1]:8080` → `::1`)."""
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


def _loopback_name(host: str) -> bool:
    name = host.lower()
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: loopback, and browsers never ask DNS
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
