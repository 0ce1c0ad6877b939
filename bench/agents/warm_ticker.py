"""A warm agent for the partial-latency benchmark of the warm JSON dialects.

    warm_ticker.py tick PROTOCOL SECONDS INTERVAL_MS

It speaks just enough of its protocol to hold a session — ACP (JSON-RPC: initialize, session/new, session/prompt),
aionrs's `--json-stream` (ready, then message → stream_start … stream_end) or Ante's `serve --stdio` (StartSession
→ SessionStart; UserInput → TurnStart … TurnEnd) — and answers a prompt by streaming, every INTERVAL_MS for
SECONDS, a piece of text that is CLOCK_MONOTONIC ns at the moment its line is written (a system-wide clock on
Linux), then ends the turn. It exits at end of input. Written by hand, so a piece costs the agent a few
microseconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from dialect_like import ticks  # beside this script

SESSION = f"bench-{os.getpid()}"


def write(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message, separators=(",", ":")) + "\n").encode())


def acp(message: dict[str, Any], tick: Callable[[], Iterator[str]]) -> None:
    method, request_id = message.get("method"), message.get("id")
    if method == "initialize":
        result: dict[str, Any] = {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}
    elif method == "session/new":
        result = {"sessionId": SESSION}
    elif method == "session/prompt":
        for text in tick():
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
            write({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": SESSION, "update": update}})
        result = {"stopReason": "end_turn"}
    elif request_id is None:
        return  # a notification
    else:
        write({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}})
        return
    write({"jsonrpc": "2.0", "id": request_id, "result": result})


def aionrs(message: dict[str, Any], tick: Callable[[], Iterator[str]]) -> None:
    if message.get("type") != "message":
        return
    msg_id = message.get("msg_id")
    write({"type": "stream_start", "msg_id": msg_id})
    for text in tick():
        write({"type": "text_delta", "text": text, "msg_id": msg_id})
    write({"type": "stream_end", "msg_id": msg_id, "usage": {"input_tokens": 10, "output_tokens": 10}})


def ante(message: dict[str, Any], tick: Callable[[], Iterator[str]]) -> None:
    op, op_id = message.get("op"), message.get("id")
    name = op if isinstance(op, str) else next(iter(op)) if isinstance(op, dict) and op else ""

    def emit(event: Any) -> None:
        write(
            {
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "id": f"evt_{time.time_ns()}",
                "event": event,
                "parent": op_id,
            }
        )

    if name == "StartSession":
        emit(
            {
                "SessionStart": {
                    "model": {"name": "ticker", "max_tokens": 8192},
                    "provider": "local",
                    "session_id": SESSION,
                    "cwd": os.getcwd(),
                }
            }
        )
    elif name == "UserInput":
        emit({"TurnStart": {"turn_id": f"step_{time.time_ns()}"}})
        for text in tick():
            emit({"MessageDelta": text})
        emit({"TurnEnd": {"status": "Completed", "steps": 1}})
    elif name == "Shutdown":
        emit("SessionEnd")
        emit("Goodbye")
        sys.exit(0)


def main() -> None:
    protocol, seconds, interval_ms = sys.argv[2], float(sys.argv[3]), float(sys.argv[4])  # after "tick"
    answer = {"acp": acp, "aionrs": aionrs, "ante": ante}[protocol]
    if protocol == "aionrs":
        write({"type": "ready", "version": "0.2.10", "session_id": SESSION, "capabilities": {"tool_approval": True}})

    def stamps() -> Iterator[str]:
        for _ in ticks(seconds, interval_ms):
            yield str(time.monotonic_ns())

    for line in sys.stdin:
        answer(json.loads(line), stamps)


if __name__ == "__main__":
    main()
