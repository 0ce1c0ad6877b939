"""A minimal ACP agent for the warm benchmarks: JSON-RPC 2.0 on stdio, one session, an echo per prompt.

initialize → version 1, no capabilities; session/new → a session id; each
session/prompt → one `agent_message_chunk` notification ("reply: <text>", the
prompt's first text block: the message; the bridge names the turn's outbox in a block of its own),
then the response `{"stopReason": "end_turn"}`. Exits at end of input. Written
by hand rather than with the SDK, so a turn costs the bridge's work and a
few microseconds of the agent's, and a cold start is one small interpreter.
"""

import json
import os
import sys


def main() -> None:
    out = sys.stdout
    session = f"bench-{os.getpid()}"
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if method == "initialize":
            result = {"protocolVersion": 1, "agentCapabilities": {}, "authMethods": []}
        elif method == "session/new":
            result = {"sessionId": session}
        elif method == "session/prompt":
            text = next((block["text"] for block in message["params"]["prompt"] if block.get("type") == "text"), "")
            update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "reply: " + text}}
            out.write(
                json.dumps(
                    {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": update}}
                )
                + "\n"
            )
            result = {"stopReason": "end_turn"}
        elif request_id is None:
            continue  # a notification (session/cancel): nothing runs long enough to cancel
        else:
            out.write(
                json.dumps(
                    {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": f"no method {method}"}}
                )
                + "\n"
            )
            out.flush()
            continue
        out.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
