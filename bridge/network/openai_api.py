"""The network door's OpenAI-compatible endpoints: `POST /v1/chat/completions`, `GET /v1/models` (docs/openai.md).

A chat completion is one turn of serve's protocol, run through the tenant's
HTTP `ClientSession` like `POST /v1/turns` (the same ids, tenants, limits and
cancellation). Rules, all here:

- `model` is a profile's name; a profile the tenant may not use, or none
  such, is `404 model_not_found`. `/v1/models` lists the profiles that load
  and that the tenant may use.
- The conversation is the `X-Conversation-Id` header, else the `user` field;
  without either each request is a conversation of its own (its completion id).
- The turn's message is the last `user` message: text parts joined by
  newlines, `image_url` parts as image attachments. Earlier messages are not
  sent: the agent keeps its own history in its session.
- Unknown fields are ignored; `n` > 1, tools and function calling are a 400.
- A permission request or a question is declined at once: nobody can answer
  through this endpoint.
- Not streaming: a `chat.completion`, or, when the turn fails, an OpenAI error
  with `x-should-retry: false` (a retry would run the agent again). Streaming:
  `chat.completion.chunk`s, then `data: [DONE]`; a failed turn ends the stream
  with `data: {"error": …}`, which the OpenAI SDKs raise.
- Usage is the agent's, in OpenAI's names; zeros when the agent reports none.
- Files the agent leaves wait for download where the tenant's HTTP turns' do
  (their `url`), listed in the completion's (or last chunk's) `files`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope
from starlette.types import Send as AsgiSend

from ..engine.result import Outcome, StreamedText
from ..errors import ChatRefused, RequestError
from ..permissions import Decision
from ..serving.output import json_bytes
from ..serving.requests import (
    FORBIDDEN,
    INVALID_REQUEST,
    UNAUTHORIZED,
    UNKNOWN_PROFILE,
    TurnRequest,
    parse_turn,
    status_of,
)
from ..serving.session import ClientSession
from .app import TurnStream, door_of, event_stream_headers, local_callers_only, read_json_body
from .auth import TenantGate, tenant_of
from .door import Door

CONVERSATION_HEADER = "x-conversation-id"
OWNER = "agent-bridge"
NOBODY_ANSWERS = "nobody can answer through the OpenAI-compatible endpoint"

# A failed turn's HTTP status by its outcome; any other failure is 502 (the agent behind the model failed).
_FAILED_STATUS = {Outcome.TIMEOUT.value: 504, Outcome.ATTACHMENT_FAILED.value: 400}
# serve's error codes under OpenAI's names, where OpenAI has one.
_OPENAI_CODES = {UNKNOWN_PROFILE: "model_not_found", UNAUTHORIZED: "invalid_api_key"}
# Fields that ask for what an agent behind a profile does not do; absent, null, empty, "none" or "auto" is no ask.
_TOOL_FIELDS = ("tools", "functions", "tool_choice", "function_call")


def openai_app(door: Door) -> Starlette:
    """The OpenAI-compatible endpoints, as the application `listen.door_app` mounts beside serve's: a request without
    a valid token gets OpenAI's 401 (`invalid_api_key`), which the SDKs raise as `AuthenticationError`; without
    tokens, a web page's gets 403 (`forbidden`)."""
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", _chat_completions, methods=["POST"]),
            Route("/v1/models", _models, methods=["GET"]),
            Route("/v1/models/{model:path}", _model, methods=["GET"]),
        ],
        middleware=[
            *local_callers_only(door, _web_page_refused),
            Middleware(TenantGate, tenant_of=door.tenant_of, refusal=_unauthorized),
        ],
    )
    app.state.door = door
    return app


def openai_error(
    status: int, message: str, *, code: str | None = None, param: str | None = None, retry: bool = True
) -> JSONResponse:
    """An error in OpenAI's shape; `retry=False` tells the OpenAI SDKs not to retry (the turn may have run)."""
    response = JSONResponse({"error": _error_body(status, message, code=code, param=param)}, status_code=status)
    if not retry:
        response.headers["x-should-retry"] = "false"
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    if status == 408:  # the body did not come whole: the connection cannot carry another request
        response.headers["connection"] = "close"
    return response


def _error_body(status: int, message: str, *, code: str | None, param: str | None = None) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"message": message, "type": kind, "param": param, "code": code}


def _refusal(err: RequestError, *, param: str | None = None) -> JSONResponse:
    """serve's refusal of a request as an OpenAI error: its status, its code (OpenAI's name for it, if any)."""
    return openai_error(status_of(err.code), err.message, code=_OPENAI_CODES.get(err.code, err.code), param=param)


def _unauthorized() -> JSONResponse:
    return openai_error(
        401, "a valid bearer token is needed: Authorization: Bearer <token> (the SDKs' api_key)", code="invalid_api_key"
    )


def _web_page_refused() -> JSONResponse:
    return openai_error(
        403,
        "this server has no --tokens, so it serves the programs of this machine and no web page: the request came "
        "from a page of another site (Origin) or for a name that is not loopback (Host)",
        code=FORBIDDEN,
    )


def _model_not_found(model: str) -> JSONResponse:
    return openai_error(404, f"no model (profile) named {model!r}", code="model_not_found", param="model")


# ---------------------------------------------------------------------------- models


async def _profiles_of(request: Request) -> list[str] | Response:
    """The profile names the request's tenant may use, or the error response."""
    tenant = tenant_of(request)
    names = await door_of(request).host.profile_names()
    if names is None:
        return openai_error(
            501,
            "this server cannot list its profiles (serve --postgres: its workers have them); name one as the model",
            code="not_implemented",
        )
    return [name for name in names if tenant.may_use(name)]


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": OWNER}


async def _models(request: Request) -> Response:
    names = await _profiles_of(request)
    if isinstance(names, Response):
        return names
    return JSONResponse({"object": "list", "data": [_model_object(name) for name in names]})


async def _model(request: Request) -> Response:
    names = await _profiles_of(request)
    if isinstance(names, Response):
        return names
    model = request.path_params["model"]
    if model not in names:
        return _model_not_found(model)
    return JSONResponse(_model_object(model))


# ---------------------------------------------------------------------------- chat completions


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A chat completion request, as the turn it is."""

    turn: TurnRequest
    stream: bool
    include_usage: bool


def parse_chat(body: dict[str, Any], conversation: str | None, completion_id: str) -> ChatRequest:
    """The turn a chat completion request asks for; raises `ChatRefused`, or `RequestError` from `parse_turn`.

    `conversation` is the `X-Conversation-Id` header; `completion_id` is the turn's id (and, without a
    conversation, the conversation's).
    """
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ChatRefused(INVALID_REQUEST, "model must be the name of a profile (GET /v1/models lists them)", "model")
    n = body.get("n")
    if n is not None and n != 1:
        raise ChatRefused(INVALID_REQUEST, "n must be 1: an agent gives one reply per turn", "n")
    for field in _TOOL_FIELDS:
        if body.get(field) not in (None, [], "none", "auto"):
            raise ChatRefused(
                INVALID_REQUEST,
                f"{field} is not supported: the agent behind a profile uses its own tools, and function "
                "calling is not offered",
                field,
            )
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise ChatRefused(INVALID_REQUEST, "stream must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ChatRefused(INVALID_REQUEST, "stream_options must be an object", "stream_options")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ChatRefused(INVALID_REQUEST, "user must be a string", "user")
    message, attachments = _last_user_message(body.get("messages"))
    request: dict[str, Any] = {
        "type": "turn",
        "id": completion_id,
        "profile": model,
        "conversation": conversation or user or completion_id,
        "message": message,
        "attachments": attachments,
    }
    if user:
        request["from_user"] = user
    return ChatRequest(parse_turn(request), bool(stream), options.get("include_usage") is True)


def _last_user_message(messages: Any) -> tuple[str, list[dict[str, str]]]:
    """The last `user` message's text and image attachments."""
    if not isinstance(messages, list) or not all(isinstance(message, dict) for message in messages):
        raise ChatRefused(INVALID_REQUEST, "messages must be a list of {role, content} objects", "messages")
    last = next((message for message in reversed(messages) if message.get("role") == "user"), None)
    if last is None:
        raise ChatRefused(INVALID_REQUEST, "messages holds no user message: its last one is the turn", "messages")
    content = last.get("content")
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise ChatRefused(
            INVALID_REQUEST, "a user message's content must be a string or a list of content parts", "messages"
        )
    texts: list[str] = []
    attachments: list[dict[str, str]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise ChatRefused(INVALID_REQUEST, "a text part needs text (a string)", "messages")
            texts.append(part["text"])
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str):
                raise ChatRefused(
                    INVALID_REQUEST, "an image_url part needs image_url.url (an https, http or data: URL)", "messages"
                )
            attachments.append({"type": "image", "url": url})
        else:
            raise ChatRefused(
                INVALID_REQUEST,
                f"content part type {kind!r} is not supported: send text and image_url parts",
                "messages",
            )
    return "\n".join(texts), attachments


async def _chat_completions(request: Request) -> Response:
    tenant = tenant_of(request)
    completion_id = f"chatcmpl-{uuid4().hex}"
    try:
        body = await read_json_body(request)
        chat = parse_chat(body, request.headers.get(CONVERSATION_HEADER), completion_id)
    except ChatRefused as err:
        return _refusal(err, param=err.param)
    except RequestError as err:
        return _refusal(err)
    door = door_of(request)
    return ChatCompletionResponse(door, door.http_session(tenant), chat)


class ChatCompletionResponse(TurnStream):
    """One chat completion: the turn's reply as a `chat.completion`, or streamed as `chat.completion.chunk`s."""

    def __init__(self, door: Door, session: ClientSession, chat: ChatRequest) -> None:
        super().__init__(door, session, chat.turn)
        self._chat = chat
        self._id = str(chat.turn.id)
        self._model = chat.turn.profile
        self._created = int(time.time())
        self._streamed = StreamedText()
        self._streamed_any = False
        self._final: dict[str, Any] | None = None
        self._files: list[dict[str, Any]] = []  # the files the agent left: where each waits for the client

    def refused(self, err: RequestError) -> Response:
        if err.code == UNKNOWN_PROFILE:
            return _model_not_found(self._model)
        return _refusal(err)

    async def respond(self, scope: Scope, receive: Receive, send: AsgiSend) -> None:
        started = False

        async def write(frame: bytes) -> None:
            nonlocal started
            if not frame:
                return
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": event_stream_headers()})
            await send({"type": "http.response.body", "body": frame, "more_body": True})

        try:
            if not await self.run_turn(receive, write, self._frame):
                return
        except RequestError as err:
            await self.refused(err)(scope, receive, send)
            return
        if self._chat.stream:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        assert self._final is not None
        await self._completion(self._final)(scope, receive, send)

    def _frame(self, response: dict[str, Any]) -> bytes:
        """What the client gets for one of the turn's responses: a streamed chunk or nothing (then the end)."""
        kind = response["type"]
        if kind in ("permission", "question"):
            self._decline(response)
        elif kind == "file":
            self._files.append({field: response[field] for field in ("name", "size", "media_type", "url")})
        elif kind in ("result", "error"):
            self._final = response
        if not self._chat.stream:
            return b""
        if kind == "accepted":
            return self._chunk({"role": "assistant", "content": ""})
        if kind == "partial" and response["text"]:
            self._streamed.add(response["text"])
            self._streamed_any = True
            return self._chunk({"content": response["text"]})
        if kind in ("result", "error"):
            return self._last_chunks(response)
        return b""

    def _decline(self, response: dict[str, Any]) -> None:
        """Nobody can answer through this endpoint: decline at once rather than let the question wait its time."""
        try:
            if response["type"] == "permission":
                self.session.decide(self.turn.id, response["request_id"], Decision(allow=False, message=NOBODY_ANSWERS))
            else:
                self.session.answer(self.turn.id, response["request_id"], None)
        except RequestError:
            pass  # answered already, or it stopped waiting: nothing left to decline

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        return _event({**self._header("chat.completion.chunk"), "choices": [choice], **extra})

    def _header(self, kind: str) -> dict[str, Any]:
        return {"id": self._id, "object": kind, "created": self._created, "model": self._model}

    def _last_chunks(self, final: dict[str, Any]) -> bytes:
        failure = _failure(final)
        if failure is not None:
            return _event({"error": _error_body(failure[0], failure[1], code=failure[2])})
        rest, continues = self._streamed.unstreamed(final["reply"])
        if rest and self._streamed_any and not continues:
            rest = "\n\n" + rest  # the partials were not the reply: it follows them as a paragraph of its own
        frames = [self._chunk({"content": rest})] if rest else []
        frames.append(self._chunk({}, _finish_reason(final), **({"files": self._files} if self._files else {})))
        if self._chat.include_usage:
            frames.append(_event({**self._header("chat.completion.chunk"), "choices": [], "usage": usage_of(final)}))
        frames.append(b"data: [DONE]\n\n")
        return b"".join(frames)

    def _completion(self, final: dict[str, Any]) -> Response:
        failure = _failure(final)
        if failure is not None:
            status, text, code = failure
            return openai_error(status, text, code=code, retry=False)
        message = {"role": "assistant", "content": final["reply"], "refusal": None}
        choice = {"index": 0, "message": message, "finish_reason": _finish_reason(final), "logprobs": None}
        completion: dict[str, Any] = {**self._header("chat.completion"), "choices": [choice], "usage": usage_of(final)}
        if self._files:
            completion["files"] = self._files
        return JSONResponse(completion)


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json_bytes(data) + b"\n\n"


def _failure(final: dict[str, Any]) -> tuple[int, str, str] | None:
    """(HTTP status, message for the chat's user, code) of a turn that failed; None when it did not."""
    if final["type"] == "error":
        return status_of(final["code"]), final["message"], final["code"]
    if final["outcome"] == Outcome.OK.value:
        return None
    outcome = final["outcome"]
    message = final["error_reply"] or f"The agent's turn failed ({outcome})."
    return _FAILED_STATUS.get(outcome, 502), message, outcome


def _finish_reason(result: dict[str, Any]) -> str:
    return "length" if result["truncated"] else "stop"


def usage_of(result: dict[str, Any]) -> dict[str, Any]:
    """The result's usage in OpenAI's names; a count the agent did not report is 0."""
    usage = result.get("usage") or {}
    prompt = usage.get("input_tokens") or 0
    completion = usage.get("output_tokens") or 0
    total = usage.get("total_tokens")
    record: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion if total is None else total,
    }
    if usage.get("cached_input_tokens") is not None:
        record["prompt_tokens_details"] = {"cached_tokens": usage["cached_input_tokens"]}
    if usage.get("reasoning_tokens") is not None:
        record["completion_tokens_details"] = {"reasoning_tokens": usage["reasoning_tokens"]}
    return record
