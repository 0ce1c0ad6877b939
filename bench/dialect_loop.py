"""In memory, no process: what the supervisor does with a JSON agent's stdout, fed a file's bytes in 64 KiB chunks.

    PYTHONPATH=. python bench/dialect_loop.py FILE [PROTOCOL] [REPEATS]   # MB/s of each repeat, then the median

The turn loop of bridge/engine/loop.py as a turn runs it — the dialect, the turn recorder, the host's `on_event`
(taking every event, doing nothing) — without the pipe, trio and the process. CPU time, not wall time: the
machine is shared. Run it under cProfile, pyinstrument or py-spy to see where the time goes.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from bridge import Profile, Turn
from bridge.engine.loop import TurnLoop, emit_to
from bridge.engine.questions import Questions
from bridge.engine.result import Ending, TurnRecorder
from bridge.log import get_logger

CHUNK = 64 * 1024


def ignore(event: Any) -> None:
    """The host: takes each event and does nothing with it."""


def run_sync(coroutine: Any) -> None:
    """A turn-loop step that never waits (nothing here returns an awaitable) runs to its end on the first send."""
    try:
        coroutine.send(None)
    except StopIteration:
        return
    raise RuntimeError("the turn loop waited")


def one_turn(profile: Profile, data: bytes, dialect_class: Any = None) -> float:
    """MB/s of CPU time for one turn of `data`, through the profile's dialect or `dialect_class`."""
    began = time.process_time()
    dialect = (dialect_class or profile.dialect)(profile.dialect_context, Turn("hello"))
    recorder = TurnRecorder(profile)
    loop = TurnLoop(
        dialect,
        recorder,
        profile.permission_policy,
        emit_to(None, ignore),
        get_logger(),
        lambda data: None,
        Questions(),
    )
    for start in range(0, len(data), CHUNK):
        run_sync(loop.on_output(data[start : start + CHUNK]))
    run_sync(loop.handle(dialect.close()))
    result = recorder.finish(Ending(returncode=0))
    elapsed = time.process_time() - began
    assert result.ok, result
    return len(data) / 1e6 / elapsed


def main(argv: list[str]) -> int:
    path = argv[1]
    protocol = argv[2] if len(argv) > 2 else "agentproc-0.4"
    repeats = int(argv[3]) if len(argv) > 3 else 5
    with open(path, "rb") as f:
        data = f.read()
    profile = Profile.from_mapping({"command": ["cat"], "protocol": protocol, "max_reply_chars": None})
    speeds = [one_turn(profile, data) for _ in range(repeats)]
    print(" ".join(f"{s:.1f}" for s in speeds), f"median {statistics.median(speeds):.1f}, best {max(speeds):.1f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
