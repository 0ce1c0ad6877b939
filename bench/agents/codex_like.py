"""A `codex exec --json`-shaped agent for the JSON-dialect benchmarks (protocol: codex-exec).

    codex_like.py file MEGABYTES PATH      write one long codex turn of about MEGABYTES to PATH (for `cat`),
                                           then print what a correct bridge must make of it, as JSON
    codex_like.py tick SECONDS INTERVAL_MS play a codex turn live: every INTERVAL_MS a command_execution
                                           item, then an agent_message whose text is CLOCK_MONOTONIC ns at
                                           the moment its line is written (a system-wide clock on Linux)

The lines are the shapes codex 0.169.0 prints (tests/transcripts/codex/):
`thread.started`, then per step, in shuffled order, a reasoning item, a
command's `item.started`/`item.completed` (its output up to 2 KB, the bulk of
real streams), an agent message, and now and then a todo_list update; the
turn ends with `turn.completed` and its usage.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

THREAD_ID = "0199a213-5f07-7c72-9a3e-bench0000001"
USAGE = {
    "input_tokens": 123456,
    "cached_input_tokens": 100000,
    "cache_write_input_tokens": 0,
    "output_tokens": 6543,
    "reasoning_output_tokens": 2100,
}
WORDS = [
    "the",
    "agent",
    "looks",
    "at",
    "the",
    "file",
    "and",
    "runs",
    "the",
    "tests",
    "before",
    "it",
    "changes",
    "a",
    "line",
    "of",
    "code",
    "about",
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "café",
    "naïve",
    "“quoted”",
    "über",
    "`code`",
    "path/to/module.py",
]


def line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def item(event: str, item_id: int, **fields: Any) -> bytes:
    return line({"type": event, "item": {"id": f"item_{item_id}", **fields}})


def prose(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))


def command_items(rng: random.Random, item_id: int) -> tuple[bytes, bytes]:
    command = f"/bin/bash -lc 'rg -n {rng.choice(WORDS)} src/ | head -{rng.randint(5, 40)}'"
    output = (
        "\n".join(
            f"src/{rng.choice(WORDS)}.py:{rng.randint(1, 999)}: {prose(rng, 3, 12)}" for _ in range(rng.randint(2, 30))
        )[:2000]
        + "\n"
    )
    started = item(
        "item.started",
        item_id,
        type="command_execution",
        command=command,
        aggregated_output="",
        exit_code=None,
        status="in_progress",
    )
    completed = item(
        "item.completed",
        item_id,
        type="command_execution",
        command=command,
        aggregated_output=output,
        exit_code=0,
        status="completed",
    )
    return started, completed


def write_file(megabytes: float, path: str) -> dict[str, Any]:
    target = int(megabytes * 1_000_000)
    rng = random.Random(9)
    parts = [line({"type": "thread.started", "thread_id": THREAD_ID}), line({"type": "turn.started"})]
    size = sum(map(len, parts))
    item_id = messages = activities = 0
    last_message = ""
    kinds = ["reasoning", "command", "message"]
    while size < target:
        rng.shuffle(kinds)
        for kind in kinds + (["todo"] if rng.random() < 0.1 else []):
            if kind == "reasoning":
                new = [
                    item(
                        "item.completed",
                        item_id,
                        type="reasoning",
                        text=f"**{prose(rng, 2, 5)}**\n\n{prose(rng, 15, 60)}",
                    )
                ]
                activities += 1
            elif kind == "command":
                new = list(command_items(rng, item_id))
                activities += 2
            elif kind == "todo":
                steps = [{"text": prose(rng, 3, 8), "completed": rng.random() < 0.5} for _ in range(4)]
                new = [item("item.updated", item_id, type="todo_list", items=steps)]
                activities += 1
            else:
                last_message = prose(rng, 10, 80) + "\n\n- " + prose(rng, 5, 15) + "\n- " + prose(rng, 5, 15)
                new = [item("item.completed", item_id, type="agent_message", text=last_message)]
                messages += 1
            item_id += 1
            parts += new
            size += sum(map(len, new))
    parts.append(line({"type": "turn.completed", "usage": USAGE}))
    data = b"".join(parts)
    with open(path, "wb") as out:
        out.write(data)
    return {
        "file": path,
        "bytes": len(data),
        "lines": len(parts),
        "agent_messages": messages,
        "activities": activities,
        "last_message": last_message,
        "thread_id": THREAD_ID,
        "input_tokens": USAGE["input_tokens"],
    }


def tick(seconds: float, interval_ms: float) -> None:
    """Absolute schedule (no drift), each line straight to fd 1 (no buffering)."""
    rng = random.Random(5)
    write, clock = os.write, time.monotonic_ns
    write(1, line({"type": "thread.started", "thread_id": THREAD_ID}) + line({"type": "turn.started"}))
    interval_ns = int(interval_ms * 1_000_000)
    start = clock()
    end, due, item_id = start + int(seconds * 1e9), start, 0
    while due < end:
        wait = due - clock()
        if wait > 0:
            time.sleep(wait / 1e9)
        write(1, command_items(rng, item_id)[1])
        write(
            1,
            b'{"type":"item.completed","item":{"id":"item_%d","type":"agent_message","text":"%d"}}\n'
            % (item_id + 1, clock()),
        )
        item_id += 2
        due += interval_ns
    write(1, line({"type": "turn.completed", "usage": USAGE}))


if __name__ == "__main__":
    if sys.argv[1] == "file":
        print(json.dumps(write_file(float(sys.argv[2]), sys.argv[3])))
    else:
        tick(float(sys.argv[2]), float(sys.argv[3]))
