#!/usr/bin/env python3
"""An echo agent that speaks agentproc wire 0.4 by hand (no SDK), for `protocol: agentproc-0.4`.

- stdin: one `{"type":"turn",...}` line; with `"permission": true` stdin
  stays open and `permission_response` lines follow.
- stdout: a thinking partial, the reply streamed word by word as partials,
  then one `result` with the whole reply and its usage. Every line carries
  the session id, so the host can resume it: the id comes back in the next
  turn line, and the agent remembers what was said before.
- With `"permission": true` it first asks permission to use a tool (`Bash`
  unless the message has a word `tool=NAME`) and says in the reply what the
  host decided. It never runs anything: the tool is make-believe.
- An empty message is an `error` (exit 1), as the reference hub bridges do.
"""

import json
import os
import sys
import time
import uuid
from pathlib import Path

STATE_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "agent-bridge-wire04-sessions"


def send(event: dict) -> None:
    sys.stdout.write(json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def read_turn() -> dict:
    line = sys.stdin.readline()
    try:
        turn = json.loads(line) if line else {}
    except ValueError:
        turn = {}
    return turn if isinstance(turn, dict) else {}


def string(turn: dict, key: str, default: str = "") -> str:
    value = turn.get(key)
    return value if isinstance(value, str) else default


def ask_permission(session_id: str, tool: str, words: int) -> tuple[bool, str]:
    """Ask to use `tool`; wait for the answer to this request (others are skipped); EOF is a deny."""
    request_id = "req-" + uuid.uuid4().hex[:8]
    send(
        {
            "type": "permission_request",
            "request_id": request_id,
            "tool_name": tool,
            "input": {"command": "wc -w"},
            "description": f"count the {words} word(s) of your message",
            "session_id": session_id,
        }
    )
    for line in sys.stdin:
        try:
            response = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(response, dict)
            and response.get("type") == "permission_response"
            and response.get("request_id") == request_id
        ):
            return response.get("behavior") == "allow", string(response, "message")
    return False, "nobody answered"


def main() -> int:
    turn = read_turn()
    message = string(turn, "message")
    session_id = string(turn, "session_id")
    if not session_id.isalnum() or not session_id.isascii():  # not one of ours: it names no file of ours either
        session_id = uuid.uuid4().hex
    delay = float(os.environ.get("STREAM_DELAY", "0.05"))
    if not message.strip() and not turn.get("attachments"):
        send({"type": "error", "message": "the message is empty: say something", "session_id": session_id})
        return 1

    state = STATE_DIR / f"{session_id}.json"
    history = json.loads(state.read_text()) if state.exists() else []
    send({"type": "partial", "text": f"reading turn {len(history) + 1}", "role": "thinking", "session_id": session_id})

    notes = []
    if turn.get("permission") is True:
        tool = next((word[len("tool=") :] for word in message.split() if word.startswith("tool=")), "Bash")
        allowed, why = ask_permission(session_id, tool, len(message.split()))
        notes.append(f"({tool} was {'allowed' if allowed else 'denied'}{': ' + why if why else ''})")

    reply_words = ["You", "said:", *message.split()]
    for index, word in enumerate(reply_words):
        send({"type": "partial", "text": word if index == 0 else " " + word, "session_id": session_id})
        time.sleep(delay)
    if history:
        notes.append(f"(last time you said: {history[-1]})")
    reply = "\n".join([f"You said: {message}", *notes])

    history.append(message)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps(history))

    words_in, words_out = len(message.split()), len(reply.split())
    send(
        {
            "type": "result",
            "text": reply,
            "session_id": session_id,
            "usage": {"input_tokens": words_in, "output_tokens": words_out, "total_tokens": words_in + words_out},
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
