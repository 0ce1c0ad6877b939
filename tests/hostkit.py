"""Helpers for the host runtime and serve tests: a profiles directory and an agent that keeps a diary.

The agent (`RECORDER`, plain sh so it starts in a millisecond) is driven by
words in its message:

    tag=T         its name in the diary
    gate=FIFO     wait until the test releases it (`Lab.release`), no timer involved
    session=ID    print `AGENT_SESSION:ID`
    exit=N        exit with N

It appends `start T SESSION_ID PID` when it starts and `end T` when it ends, one
O_APPEND write each, so the diary's line order is the real order in which the
agents started and ended; on SIGINT it writes `sigint T` and exits 130. It
prints the partial "started" first, so a test can wait for it to be running.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

import trio

RECORDER = r"""#!/bin/sh
tag=- gate= session= code=0
for word in $AGENT_MESSAGE; do
    case $word in
        tag=*) tag=${word#tag=} ;;
        gate=*) gate=${word#gate=} ;;
        session=*) session=${word#session=} ;;
        exit=*) code=${word#exit=} ;;
    esac
done
trap 'echo "sigint $tag" >> "$RECORD"; exit 130' INT
echo "start $tag ${AGENT_SESSION_ID:--} $$" >> "$RECORD"
echo 'AGENT_PARTIAL:"started"'
if [ -n "$session" ]; then echo "AGENT_SESSION:$session"; fi
if [ -n "$gate" ]; then
    cat "$gate" > /dev/null &
    wait $!
fi
echo "end $tag" >> "$RECORD"
echo "reply $tag ${MODE:-}"
exit $code
"""

# Long enough never to fire on a loaded machine; the tests release agents explicitly.
PROFILE = """\
command: "{{{{PROFILE_DIR}}}}/../recorder.sh"
timeout_secs: 60
kill_grace_secs: 0.2
env:
  RECORD: "{record}"
  MODE: "{mode}"
"""


@dataclass
class Lab:
    """A temp dir with `profiles/`, the recorder agent, its diary and a session store path."""

    root: Path

    def __post_init__(self) -> None:
        self.profiles = self.root / "profiles"
        self.profiles.mkdir()
        self.diary = self.root / "diary"
        self.diary.touch()
        self.state = self.root / "sessions.sqlite3"
        agent = self.root / "recorder.sh"
        agent.write_text(RECORDER)
        agent.chmod(0o755)
        self._gates = 0

    def profile(self, name: str = "rec", *, mode: str = "one", extra: str = "") -> Path:
        """Write (or rewrite) `profiles/<name>.yaml` running the recorder."""
        path = self.profiles / f"{name}.yaml"
        path.write_text(PROFILE.format(record=self.diary, mode=mode) + textwrap.dedent(extra))
        return path

    def gate(self) -> Path:
        self._gates += 1
        path = self.root / f"gate{self._gates}"
        os.mkfifo(path)
        return path

    async def release(self, gate: Path) -> None:
        """Let the agent waiting on `gate` go on (blocks until it opens the FIFO)."""

        def open_and_close() -> None:
            with open(gate, "w"):
                pass

        with trio.fail_after(10):
            await trio.to_thread.run_sync(open_and_close, abandon_on_cancel=True)

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.diary.read_text().splitlines()]

    def pid(self, tag: str) -> int:
        """The process id of the agent tagged `tag` (it leads its own process group)."""
        return next(int(words[3]) for words in self.lines() if words[:2] == ["start", tag])

    def events(self, what: str) -> list[str]:
        """Tags of the agents that wrote `what` (start, end, sigint), in diary order."""
        return [words[1] for words in self.lines() if words[0] == what]


def max_overlap(lines: list[list[str]], tags: set[str] | None = None) -> int:
    """The most agents (among `tags`) that were running at the same time, from diary order."""
    running = peak = 0
    for words in lines:
        if tags is not None and words[1] not in tags:
            continue
        if words[0] == "start":
            running += 1
            peak = max(peak, running)
        elif words[0] in ("end", "sigint"):
            running -= 1
    return peak


class Started:
    """An `on_partial` callback that sets an event per tag when its agent says "started"."""

    def __init__(self) -> None:
        self.events: dict[str, trio.Event] = {}

    def __getitem__(self, tag: str) -> trio.Event:
        return self.events.setdefault(tag, trio.Event())

    def callback(self, tag: str):  # type: ignore[no-untyped-def]
        def on_partial(text: str) -> None:
            if text == "started":
                self[tag].set()

        return on_partial

    async def wait(self, *tags: str) -> None:
        with trio.fail_after(10):
            for tag in tags:
                await self[tag].wait()
