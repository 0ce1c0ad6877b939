"""The network door's endpoints, as Starlette applications over a `Door` (docs/network.md).

- `GET /healthz`, `GET /readyz`: liveness and readiness, without a token;
  every other route is behind a `TenantGate` (auth.py), its handler given the
  tenant the request's token names.
- `GET /metrics`: Prometheus' text format, the whole server's (docs/metrics.md).
- `GET /v1/ws`: a WebSocket speaking serve's protocol, one request or
  response per text message; the connection is the client (its own ids).
- `POST /v1/turns`: a turn request as the body; its responses as Server-Sent
  Events (`event: <type>`, `data: <the response>`), or its `result` alone as
  JSON when the client accepts `application/json` and not `text/event-stream`.
- `POST /v1/turns/{id}/cancel|decide|answer`, `GET /v1/stats`.
- `GET|DELETE /v1/files/{client}/{id}/{name}`: a file a turn's agent left,
  as its `file` response's `url` names it (`client`: `http`, or the WebSocket
  connection's `ws<n>`, id and name percent-encoded and routed on the raw
  path, so an id may hold "/"); GET streams the collected inode from its
  outbox's descriptor (410 when the agent changed it); DELETE is `ack_file`.

A turn's fate is its client's: a WebSocket that closes, an event stream the
client drops or stops reading for `stall_secs`, cancel every turn that came
through it. Starlette and hypercorn are imported here, so only `--listen` pays.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, BinaryIO
from urllib.parse import quote, unquote_to_bytes
from uuid import uuid4

import trio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import Receive, Scope
from starlette.types import Send as AsgiSend
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..dialects.events import FileEvent
from ..errors import OutboxError, RequestError
from ..files.outbox import open_collected
from ..log import get_logger
from ..serving.output import Output, json_bytes, json_text
from ..serving.requests import (
    BAD_JSON,
    FORBIDDEN,
    INVALID_REQUEST,
    REQUEST_TIMEOUT,
    REQUEST_TOO_LARGE,
    TOO_MANY_CONNECTIONS,
    UNAUTHORIZED,
    UNKNOWN_FILE,
    TurnRequest,
    decode_request,
    parse_answer,
    parse_decide,
    parse_turn,
    status_of,
)
from ..serving.session import ClientSession, Tenant
from .auth import LocalCallersOnly, TenantGate, tenant_of
from .door import Door
from .metrics import healthz, metrics_response, readyz_response

WS_TRY_AGAIN_LATER = 1013  # RFC 6455 close codes
WS_POLICY_VIOLATION = 1008
_FILE_CHUNK_BYTES = 64 * 1024


def serve_app(door: Door, *, extra_routes: list[Any] | None = None) -> Starlette:
    """serve's endpoints over `door` (and `extra_routes`), behind a `TenantGate`: a request without a valid token
    gets serve's `unauthorized` error, 401; without tokens, a web page's gets `forbidden`, 403."""
    app = Starlette(
        routes=[
            Route("/metrics", _metrics, methods=["GET"]),
            Route("/v1/stats", _stats, methods=["GET"]),
            Route("/v1/turns", _turns, methods=["POST"]),
            Route("/v1/turns/{id}/cancel", _cancel, methods=["POST"]),
            Route("/v1/turns/{id}/decide", _decide, methods=["POST"]),
            Route("/v1/turns/{id}/answer", _answer, methods=["POST"]),
            Route("/v1/files/{rest:path}", _file, methods=["GET", "DELETE"]),
            WebSocketRoute("/v1/ws", _websocket),
            *(extra_routes or []),
        ],
        middleware=[
            *local_callers_only(door, web_page_refused),
            Middleware(TenantGate, tenant_of=door.tenant_of, refusal=unauthorized),
        ],
    )
    app.state.door = door
    return app


def local_callers_only(door: Door, refusal: Callable[[], Response]) -> list[Middleware]:
    """A door without tokens serves no web page (`LocalCallersOnly`), which gets `refusal()`."""
    return [] if door.tokens else [Middleware(LocalCallersOnly, refusal=refusal)]


def health_routes() -> list[Route]:
    """Liveness and readiness: for anyone, without a token."""
    return [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", _readyz, methods=["GET"])]


def door_of(request: Request | WebSocket) -> Door:
    door: Door = request.app.state.door
    return door


def error_response(code: str, message: str, *, request_id: Any = None, status: int | None = None) -> JSONResponse:
    """serve's `error` response as an HTTP error, its status from its code."""
    response = JSONResponse(
        {"type": "error", "id": request_id, "code": code, "message": message},
        status_code=status or status_of(code),
    )
    if code == REQUEST_TIMEOUT:  # the rest of the body may still come: the connection cannot carry another request
        response.headers["connection"] = "close"
    return response


def unauthorized() -> JSONResponse:
    response = error_response(UNAUTHORIZED, "a valid bearer token is needed: Authorization: Bearer <token>")
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


def web_page_refused(tokens_option: str = "--tokens", program: str = "serve") -> JSONResponse:
    """A door without tokens (`program`'s `tokens_option`), asked by a web page (`auth.LocalCallersOnly`)."""
    return error_response(
        FORBIDDEN,
        f"this door has no {tokens_option}, so it serves the programs of this machine and no web page: the request "
        "came from a page of another site (Origin) or for a name that is not loopback (Host); send neither, or "
        f"start {program} with {tokens_option} FILE",
    )


async def read_json_body(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object, read no further than the door's limit, nor for longer than its
    `body_secs`; raises `RequestError`."""
    limits = door_of(request).limits
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(REQUEST_TOO_LARGE, f"the body is longer than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(limits.body_secs) as reading:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(REQUEST_TOO_LARGE, f"the body is longer than {limit} bytes")
            chunks.append(chunk)
    if reading.cancelled_caught:
        raise RequestError(REQUEST_TIMEOUT, f"the body did not come whole within {limits.body_secs:g} s")
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError(BAD_JSON, "the body is not UTF-8 text") from None
    return decode_request(text)


# ---------------------------------------------------------------------------- health and stats


async def _readyz(request: Request) -> Response:
    door = door_of(request)
    return await readyz_response(door.host, accepting=door.ready)


async def _metrics(request: Request) -> Response:
    door = door_of(request)
    return await metrics_response(door.metrics, door.host, accepting=door.ready)


async def _stats(request: Request) -> Response:
    stats = await door_of(request).host.current_stats()
    return JSONResponse({"type": "stats", **stats.to_dict()})


# ---------------------------------------------------------------------------- HTTP turns


async def _turns(request: Request) -> Response:
    tenant = tenant_of(request)
    try:
        body = await read_json_body(request)
        body.setdefault("type", "turn")
        body.setdefault("id", uuid4().hex)
        if body["type"] != "turn":
            raise RequestError(INVALID_REQUEST, 'the body of POST /v1/turns is a turn request ("type": "turn")')
        turn = parse_turn(body)
    except RequestError as err:
        return error_response(err.code, err.message)
    accept = request.headers.get("accept", "")
    as_json = "application/json" in accept and "text/event-stream" not in accept
    return TurnResponse(door_of(request), door_of(request).http_session(tenant), turn, as_json=as_json)


class TurnStream(Response):
    """One turn, run for the length of its HTTP response; subclasses say how its responses reach the client.

    It counts as one of the door's connections while it runs. `run_turn` starts
    the turn on the tenant's session and hands each of its responses, encoded,
    to `write` through one `Output`: the client hanging up, or not taking a
    response within the door's `stall_secs`, cancels the turn.
    """

    def __init__(self, door: Door, session: ClientSession, turn: TurnRequest) -> None:
        super().__init__()
        self.door = door
        self.session = session
        self.turn = turn

    async def __call__(self, scope: Scope, receive: Receive, send: AsgiSend) -> None:
        door = self.door
        if not door.take_connection():
            refusal = RequestError(TOO_MANY_CONNECTIONS, "the server has all the connections it takes; try again")
            await self.refused(refusal)(scope, receive, send)
            return
        try:
            await self.respond(scope, receive, send)
        finally:
            door.give_back_connection()

    def refused(self, err: RequestError) -> Response:
        """The HTTP error for a turn refused before it was accepted: serve's `error` response."""
        return error_response(err.code, err.message, request_id=self.turn.id)

    async def respond(self, scope: Scope, receive: Receive, send: AsgiSend) -> None:
        raise NotImplementedError

    async def run_turn(
        self,
        receive: Receive,
        write: Callable[[bytes], Awaitable[object]],
        encode: Callable[[dict[str, Any]], bytes],
    ) -> bool:
        """Run the turn to its end; False when the client went away or stalled (the turn was cancelled).

        Raises `RequestError` when the turn was refused: nothing was written then.
        """
        session, turn = self.session, self.turn
        output: Output[bytes] = Output(
            write, encode, lambda: session.cancel_quietly(turn.id), stall_secs=self.door.limits.stall_secs
        )
        async with trio.open_nursery() as system:
            await system.start(output.run)
            system.start_soon(_hang_up_on_disconnect, receive, output)
            refused: RequestError | None = None
            async with trio.open_nursery() as turns:
                try:
                    await session.start_turn(turn, turns, output.send)
                except RequestError as err:
                    refused = err
            await output.close()
            system.cancel_scope.cancel()
        if refused is not None:
            raise refused
        return not output.broken


class TurnResponse(TurnStream):
    """`POST /v1/turns`: the turn's responses as Server-Sent Events, or its result alone as JSON.

    A refusal (before `accepted`) is an HTTP error with serve's code. Once
    accepted the status is 200 and the turn's end is in the body: a `result`,
    or an `error` response.
    """

    def __init__(self, door: Door, session: ClientSession, turn: TurnRequest, *, as_json: bool) -> None:
        super().__init__(door, session, turn)
        self._as_json = as_json

    async def respond(self, scope: Scope, receive: Receive, send: AsgiSend) -> None:
        started = False
        final: dict[str, Any] | None = None
        file_urls: dict[str, str] = {}  # the `file` responses' URLs, by name: the JSON result's files carry them too

        async def write(frame: bytes) -> None:
            nonlocal started
            if self._as_json:
                return
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": event_stream_headers()})
            await send({"type": "http.response.body", "body": frame, "more_body": True})

        def encode(response: dict[str, Any]) -> bytes:
            nonlocal final
            if response["type"] in ("result", "error"):
                final = response
            elif response["type"] == "file" and "url" in response:
                file_urls[response["name"]] = response["url"]
            kind: str = response["type"]
            return b"event: " + kind.encode() + b"\ndata: " + json_bytes(response) + b"\n\n"

        try:
            if not await self.run_turn(receive, write, encode):
                return
        except RequestError as err:
            await self.refused(err)(scope, receive, send)
            return
        if self._as_json:
            assert final is not None
            for file in final.get("files") or ():
                if file.get("name") in file_urls:
                    file["url"] = file_urls[file["name"]]
            status = 200 if final["type"] == "result" else status_of(final["code"])
            await JSONResponse(final, status_code=status)(scope, receive, send)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def event_stream_headers() -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store")]


async def _hang_up_on_disconnect(receive: Receive, output: Output[bytes]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            output.hung_up()
            return


async def _act_on_turn(request: Request, act: Callable[[ClientSession, str, dict[str, Any]], None]) -> Response:
    tenant = tenant_of(request)
    request_id = request.path_params["id"]
    try:
        body = await read_json_body(request) if await _has_body(request) else {}
        act(door_of(request).http_session(tenant), request_id, body)
    except RequestError as err:
        return error_response(err.code, err.message, request_id=request_id)
    return JSONResponse({"type": "done", "id": request_id})


async def _has_body(request: Request) -> bool:
    return request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers


async def _cancel(request: Request) -> Response:
    return await _act_on_turn(request, lambda session, turn_id, body: session.cancel(turn_id))


async def _decide(request: Request) -> Response:
    def act(session: ClientSession, turn_id: str, body: dict[str, Any]) -> None:
        decide = parse_decide({**body, "type": "decide", "id": turn_id})
        session.decide(turn_id, decide.request_id, decide.decision)

    return await _act_on_turn(request, act)


async def _answer(request: Request) -> Response:
    def act(session: ClientSession, turn_id: str, body: dict[str, Any]) -> None:
        answer = parse_answer({**body, "type": "answer", "id": turn_id})
        session.answer(turn_id, answer.request_id, answer.answers)

    return await _act_on_turn(request, act)


async def _file(request: Request) -> Response:
    """GET: the file's bytes (it waits on until DELETE or its time runs out); DELETE: the bot has it, delete it."""
    tenant = tenant_of(request)
    door = door_of(request)
    parts = file_url_parts(request.scope)
    if parts is None:
        return error_response(UNKNOWN_FILE, "a file's URL is /v1/files/{client}/{id}/{name}, as its `file` names it")
    client, request_id, name = parts
    if request.method == "DELETE":
        if door.acknowledge_file(tenant, client, request_id, name):
            return JSONResponse({"type": "done", "id": request_id})
    elif (file := door.waiting_file(tenant, client, request_id, name)) is not None:
        try:
            handle = open_collected(file)
        except OutboxError as err:  # the agent changed it after the turn: what is there now is not what was sent
            return error_response(UNKNOWN_FILE, str(err), request_id=request_id, status=410)
        return _streamed(handle, file)
    return error_response(
        UNKNOWN_FILE,
        f"turn {request_id!r} has no file {name!r} waiting: it was acknowledged already, its time ran out, or "
        "the turn left no such file",
        request_id=request_id,
    )


def file_url_parts(scope: Scope) -> tuple[str, str, str] | None:
    """(client, id, name) of a file's URL, each percent-decoded from the raw path: an id may hold "/"."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    segments = raw.split(b"?", 1)[0].split(b"/")
    if len(segments) != 6 or segments[:3] != [b"", b"v1", b"files"]:
        return None
    try:
        client, request_id, name = (unquote_to_bytes(segment).decode("utf-8") for segment in segments[3:])
    except UnicodeDecodeError:
        return None
    return client, request_id, name


def _streamed(handle: BinaryIO, file: FileEvent) -> Response:
    """The open file's `file.size` bytes at most, read from its descriptor (never reopened by path)."""

    async def body() -> AsyncIterator[bytes]:
        try:
            left = file.size
            while left > 0:
                chunk = await trio.to_thread.run_sync(handle.read, min(_FILE_CHUNK_BYTES, left))
                if not chunk:
                    break
                left -= len(chunk)
                yield chunk
        finally:
            handle.close()

    quoted = quote(file.name)
    disposition = (
        f"attachment; filename*=utf-8''{quoted}" if quoted != file.name else f'attachment; filename="{file.name}"'
    )
    # No Content-Length: an agent that truncates the file while it is sent ends the body early, not the connection.
    return StreamingResponse(body(), media_type=file.media_type, headers={"content-disposition": disposition})


# ---------------------------------------------------------------------------- WebSocket


async def _websocket(websocket: WebSocket) -> None:
    door = door_of(websocket)
    tenant = tenant_of(websocket)
    if not door.take_connection():
        await websocket.accept()  # closed before its accept, the client would see an HTTP 403, not the code
        await websocket.close(WS_TRY_AGAIN_LATER, "the server has all the connections it takes; try again")
        return
    try:
        await websocket.accept()
        await _serve_websocket(door, tenant, websocket)
    finally:
        door.give_back_connection()


async def _serve_websocket(door: Door, tenant: Tenant, websocket: WebSocket) -> None:
    log = get_logger(component="network", tenant=tenant.name)

    async def write(text: str) -> None:
        try:
            await websocket.send_text(text)
        except (WebSocketDisconnect, RuntimeError) as err:  # closed under us: the client is gone
            raise trio.BrokenResourceError from err

    session: ClientSession | None = None

    def gone() -> None:
        if session is not None:
            session.cancel_all()

    output: Output[str] = Output(write, json_text, gone, stall_secs=door.limits.stall_secs)
    async with trio.open_nursery() as system:
        await system.start(output.run)
        async with trio.open_nursery() as turns:
            session = door.connection_session(tenant, output.send, turns)
            try:
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        break
                    text = message.get("text")
                    if text is None:
                        await session.error(None, INVALID_REQUEST, "send each request as a text message of JSON")
                        continue
                    await session.handle_text(text)
            except Exception as err:  # the connection broke: its turns are cancelled below
                log.info("a WebSocket connection ended", error=type(err).__name__)  # never what the client sent
            finally:
                output.hung_up()
        await output.close()
        system.cancel_scope.cancel()
