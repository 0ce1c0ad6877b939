"""protocol: claude-sdk against a one-shot claude-stream-json turn, with the real Claude Code and a fake server.

Not wired into `make bench` yet. Run from the repository, after `make test-agents`:

    .venv/bin/python bench/claude_sdk.py [--turns 20]

The fake Anthropic server (tests/fake_anthropic.py) answers at once, so a turn
costs what the CLI and the bridge cost. Alternating in one run: a warm turn on
one long-lived `claude-sdk` process (profiles/clis/claude-sdk.yaml) and a cold
one-shot turn through `claude-stream-json` (profiles/clis/claude-code.yaml) of
the same answer; medians of each, and their ratio. Also, on the warm process:

- partial latency: from the bridge reading a chunk of the CLI's stdout to the
  host's callback receiving the partial it held (the bridge's share of it);
- permission latency: from the bridge reading the CLI's `can_use_tool` to the
  host's callback receiving the `PermissionRequest`.

Both are p50 and p99 over every event of the run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

from agents_cache import npm_binary  # noqa: E402
from fake_anthropic import Conversation, claude_env  # noqa: E402
from fake_api import FakeApi  # noqa: E402

import bridge  # noqa: E402
from bridge import Turn  # noqa: E402
from bridge.dialects import PartialEvent  # noqa: E402
from bridge.permissions import Decision, PermissionRequest  # noqa: E402
from bridge.questions import Questions  # noqa: E402
from bridge.warm_agent import WarmAgent  # noqa: E402


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def main(turns: int) -> None:
    with FakeApi(Conversation()) as api, tempfile.TemporaryDirectory() as scratch:
        home, work = Path(scratch) / "home", Path(scratch) / "work"
        home.mkdir()
        work.mkdir()
        claude = str(npm_binary("claude"))
        env = claude_env(api, str(home))
        warm_profile = bridge.load_profile(ROOT / "profiles/clis/claude-sdk.yaml", cache=False)
        warm_profile = warm_profile.replace(
            command=[claude, *warm_profile.command[1:]], env=env, cwd=str(work), permissions={"default": "ask"}
        )
        cold_profile = bridge.load_profile(ROOT / "profiles/clis/claude-code.yaml", cache=False)
        cold_profile = cold_profile.replace(command=[claude], env=env, cwd=str(work))
        read_at = 0.0
        partial_ms: list[float] = []
        permission_ms: list[float] = []
        warm_ms: list[float] = []
        cold_ms: list[float] = []
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(warm_profile)
            on_output = agent._on_output  # the chunk's arrival, timed where the bridge reads it

            async def timed(data: bytes) -> None:
                nonlocal read_at
                read_at = trio.current_time()
                await on_output(data)

            agent._on_output = timed  # type: ignore[method-assign]
            await agent.start(nursery)
            for index in range(turns):
                questions = Questions()

                def on_event(event: Any, questions: Questions = questions) -> None:
                    now = trio.current_time()
                    if isinstance(event, PartialEvent):
                        partial_ms.append((now - read_at) * 1000)
                    elif isinstance(event, PermissionRequest):
                        permission_ms.append((now - read_at) * 1000)
                        questions.decide(event.request_id, Decision(allow=True))

                message = f"run touch made-{index}" if index % 2 else f"hello {index}"
                started = trio.current_time()
                warm = await agent.turn(Turn(message), on_event, questions=questions)
                if not index % 2:  # the same answer as the cold turn's
                    warm_ms.append((trio.current_time() - started) * 1000)
                started = trio.current_time()
                cold = await bridge.run_turn(cold_profile, Turn(f"hello {index}"))
                cold_ms.append((trio.current_time() - started) * 1000)
                assert warm.ok and cold.ok, (warm.error, cold.error)
            await agent.close()
    warm_median, cold_median = statistics.median(warm_ms), statistics.median(cold_ms)
    print(f"turns: {turns} warm (every other one with a Bash call asked of the host), {turns} cold")
    print(f"warm claude-sdk text turn, median:       {warm_median:8.1f} ms")
    print(f"cold claude-stream-json turn, median:    {cold_median:8.1f} ms")
    print(f"warm / cold:                             {warm_median / cold_median:8.3f}")
    print(
        f"partial latency (bridge), p50 / p99:     {percentile(partial_ms, 0.5):8.3f} / "
        f"{percentile(partial_ms, 0.99):.3f} ms over {len(partial_ms)}"
    )
    print(
        f"can_use_tool → host callback, p50 / p99: {percentile(permission_ms, 0.5):8.3f} / "
        f"{percentile(permission_ms, 0.99):.3f} ms over {len(permission_ms)}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    trio.run(main, parser.parse_args().turns)
