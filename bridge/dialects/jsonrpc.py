"""JSON-RPC over stdio, one message per line, as the bridge speaks it to a warm agent. Pure.

ACP (`acp.py`) and `codex app-server` (`codex_app_server.py`) are both
JSON-RPC: the bridge sends requests and matches their responses by id, and
answers the agent's own requests. `Wire` is that bookkeeping and encoding,
with or without the `"jsonrpc": "2.0"` member (ACP requires it; codex neither
sends nor needs it). The agent's request ids are its own id space: they may
equal ours at the same moment, so a message with a `method` is the agent's
request or notification whatever its id, and only a message without one is a
response to us.
"""

from __future__ import annotations

import json
from collections.abc import Container, Mapping
from typing import Any

from .base import shorten, text_of
from .events import ProtocolWarning

# JSON-RPC 2.0's own error codes.
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class Wire:
    """One connection's JSON-RPC: our requests' ids and the methods they await, and every message encoded."""

    __slots__ = ("_head", "_next_id", "_calls", "stray")

    def __init__(self, *, version: bool = True) -> None:
        """`version`: every message carries `"jsonrpc": "2.0"`."""
        self._head: dict[str, Any] = {"jsonrpc": "2.0"} if version else {}
        self._next_id = 0
        self._calls: dict[int, str] = {}  # our requests awaiting a response: id → method
        self.stray = 0  # messages the bridge was not waiting for: responses to nothing asked, requests without an id

    @property
    def next_id(self) -> int:
        """The id the next request gets (to tell its response from the others')."""
        return self._next_id

    def request(self, method: str, params: Mapping[str, Any]) -> bytes:
        rpc_id = self._next_id
        self._next_id += 1
        self._calls[rpc_id] = method
        return encode({**self._head, "id": rpc_id, "method": method, "params": params})

    def notification(self, method: str, params: Mapping[str, Any] | None = None) -> bytes:
        message = {**self._head, "method": method}
        if params is not None:
            message["params"] = params
        return encode(message)

    def result(self, rpc_id: Any, result: Any) -> bytes:
        return encode({**self._head, "id": rpc_id, "result": result})

    def error(self, rpc_id: Any, code: int, message: str) -> bytes:
        return encode({**self._head, "id": rpc_id, "error": {"code": code, "message": message}})

    def not_offered(self, rpc_id: Any, method: str) -> bytes:
        """The answer to a request the bridge does not serve: the agent must not wait for one that never comes."""
        return self.error(rpc_id, METHOD_NOT_FOUND, f"agent-bridge does not offer {shorten(method, 80)}")

    def stray_warnings(self) -> list[ProtocolWarning]:
        """What the end of the output says of the messages the bridge was not waiting for (once, counted)."""
        if not self.stray:
            return []
        return [ProtocolWarning(f"ignored {self.stray} JSON-RPC message(s) the bridge was not waiting for")]

    def refusal(self, rpc_id: Any, method: str, served: Container[str]) -> bytes | None:
        """None when the agent's request is the dialect's to serve (`method` is in `served`); else what answers it:
        "method not found", or b"" for a request without a usable id (nothing can answer it; counted in `stray`)."""
        if not valid_id(rpc_id):
            self.stray += 1
            return b""
        return None if method in served else self.not_offered(rpc_id, method)

    def response(self, message: Mapping[str, Any]) -> tuple[str, Any, Mapping[str, Any] | None] | None:
        """A message without a method, as a response to one of our requests: (that request's method, the result,
        the error — a mapping when the request failed); None when it answers nothing we asked (or asked already),
        counted in `stray`."""
        method = self.answered(message.get("id"))
        if method is None:
            self.stray += 1
            return None
        error = message.get("error")
        if isinstance(error, dict) or "result" not in message:
            return method, None, error if isinstance(error, dict) else {}
        return method, message.get("result"), None

    def answered(self, rpc_id: Any) -> str | None:
        """The method of our request that a response with `rpc_id` answers (once), or None: not ours."""
        return self._calls.pop(rpc_id, None) if isinstance(rpc_id, int) and not isinstance(rpc_id, bool) else None


def encode(message: Mapping[str, Any]) -> bytes:
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "replace")


def valid_id(rpc_id: Any) -> bool:
    """A request id JSON-RPC allows (a string or a whole number; 0 is one)."""
    return isinstance(rpc_id, str) or (isinstance(rpc_id, int) and not isinstance(rpc_id, bool))


def request_key(rpc_id: Any) -> str:
    """The agent's JSON-RPC id (a string or a number) as the bridge's request id."""
    return rpc_id if isinstance(rpc_id, str) else str(rpc_id)


def error_text(error: Mapping[str, Any]) -> str:
    """A JSON-RPC error as a person reads it: its message and, where the agent gave one, its detail.

    Agents built on the SDKs answer a generic "Internal error" and put what went
    wrong in `data` (codex-acp: `data.message`; gemini: `data.details`).
    """
    message = text_of(error.get("message")).strip()
    data = error.get("data")
    detail = (
        data
        if isinstance(data, str)
        else text_of(data.get("message")) or text_of(data.get("details"))
        if isinstance(data, dict)
        else ""
    )
    detail = detail.strip()
    return shorten(f"{message}: {detail}" if message and detail else message or detail, 500)
