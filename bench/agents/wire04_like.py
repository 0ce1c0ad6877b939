"""An agentproc wire-0.4 agent's stdout for the bench, in the shapes the agentproc 0.20 SDK writes.

    wire04_like.py file MEGABYTES PATH   write one long turn to PATH; print what a correct run yields (JSON)
    wire04_like.py tick SECONDS INTERVAL_MS  play a turn live: every INTERVAL_MS a thinking partial, then an
                                             output partial whose text is CLOCK_MONOTONIC ns; then a result

Lines are compact JSON with `ensure_ascii=False`, as `AgentContext.send_partial` writes them, each stamped with
the session id (as sample_agents/wire04_agent.py does). The long turn: reasoning (`role: thinking`), the reply
streamed as `role: output` deltas of a few words, tool steps reported as `role: tool` partials (a command, then
up to 2 KB of its output), and one `result` with the whole answer and its usage. No permission requests: they
need a stdin exchange, which `cat` of a file cannot hold.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

SESSION_ID = "3f0c9a52-7d1e-4b8e-9a51-0c4d2b6e8f10"
USAGE = {"input_tokens": 182344, "output_tokens": 9120, "cache_read_input_tokens": 150112, "cost_usd": 0.4521}
WORDS = ("the agent reads the file and answers with a short line of text about lorem ipsum dolor sit amet "
         "caf\u00e9 na\u00efve \u201cquoted\u201d \u00fcber tokens stream one by one, then runs `pytest -q` "
         "and fixes {braces} \"quotes\" \\ backslashes").split()
COMMANDS = ("ls -la src/", "pytest -q tests/test_parser.py", "git diff --stat", "rg -n 'def feed' bridge/",
            "cat pyproject.toml")


def line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def partial(text: str, role: str) -> bytes:
    return line({"type": "partial", "text": text, "role": role, "session_id": SESSION_ID})


def prose(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))


def write_file(megabytes: float, path: str) -> dict[str, Any]:
    rng = random.Random(12)
    target = int(megabytes * 1_000_000)
    parts: list[bytes] = []
    size = thinking = outputs = tools = 0
    answer: list[str] = []
    while size < target:
        step = rng.random()
        if step < 0.25:
            chunk = partial(prose(rng, 4, 12) + " ", "thinking")
            thinking += 1
        elif step < 0.9:
            text = prose(rng, 1, 4) + " "
            chunk = partial(text, "output")
            answer.append(text)
            outputs += 1
        else:
            output = "\n".join(prose(rng, 6, 14) for _ in range(rng.randint(1, 20)))[:2048]
            chunk = partial(f"$ {rng.choice(COMMANDS)}", "tool") + partial(output, "tool")
            tools += 2
        parts.append(chunk)
        size += len(chunk)
    reply = "".join(answer[-200:]).strip()  # the result is the final answer, not the whole stream
    parts.append(line({"type": "result", "text": reply, "usage": USAGE, "session_id": SESSION_ID}))
    data = b"".join(parts)
    with open(path, "wb") as out:
        out.write(data)
    return {"file": path, "bytes": len(data), "lines": data.count(b"\n"), "thinking": thinking,
            "outputs": outputs + tools, "reply": reply, "session_id": SESSION_ID,
            "input_tokens": USAGE["input_tokens"]}


def tick(seconds: float, interval_ms: float) -> None:
    """Absolute schedule (no drift), each line straight to fd 1 (no buffering)."""
    rng = random.Random(5)
    write, clock = os.write, time.monotonic_ns
    interval_ns = int(interval_ms * 1_000_000)
    start = clock()
    end, due = start + int(seconds * 1e9), start
    while due < end:
        wait = due - clock()
        if wait > 0:
            time.sleep(wait / 1e9)
        write(1, partial(prose(rng, 4, 12), "thinking"))
        write(1, b'{"type":"partial","text":"%d","role":"output","session_id":"%s"}\n'
              % (clock(), SESSION_ID.encode()))
        due += interval_ns
    write(1, line({"type": "result", "text": "ticked", "usage": USAGE, "session_id": SESSION_ID}))


if __name__ == "__main__":
    if sys.argv[1] == "file":
        print(json.dumps(write_file(float(sys.argv[2]), sys.argv[3])))
    else:
        tick(float(sys.argv[2]), float(sys.argv[3]))
