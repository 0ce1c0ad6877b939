#!/usr/bin/env python3
"""A streaming agent that remembers its conversation.

- Partials (`AGENT_PARTIAL:` + a JSON string) reach the user while we work.
- The session id we print (`AGENT_SESSION:`) comes back next turn in
  AGENT_SESSION_ID, so we can pick the conversation up where it stopped.
- Whatever else we print is the final reply.
"""

import json
import os
import sys
import time
import uuid
from pathlib import Path

STATE_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "agent-bridge-sample-sessions"


def say(prefix: str, text: str) -> None:
    print(prefix + json.dumps(text), flush=True)


def main() -> int:
    message = os.environ.get("AGENT_MESSAGE", "")
    session_id = os.environ.get("AGENT_SESSION_ID", "")
    delay = float(os.environ.get("STREAM_DELAY", "0.05"))

    if not session_id:
        session_id = uuid.uuid4().hex
    state = STATE_DIR / f"{session_id}.json"
    history: list[str] = json.loads(state.read_text()) if state.exists() else []

    # The session line may come at any point; the last one printed wins.
    print(f"AGENT_SESSION:{session_id}", flush=True)

    words = message.split() or ["(silence)"]
    for word in words:
        say("AGENT_PARTIAL:", word + " ")
        time.sleep(delay)

    history.append(message)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps(history))

    print(f"turn {len(history)} of session {session_id}")
    if len(history) > 1:
        print(f"last time you said: {history[-2]}")
    print(f"you said: {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
