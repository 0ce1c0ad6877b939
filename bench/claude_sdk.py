"""Rows 19, 21 and 22 for `protocol: claude-sdk`: the real Claude Code (the tests' npm cache) against the tests' fake
Anthropic server on loopback, which answers at once, so a turn costs what the CLI and the bridge cost.

`make bench` runs these samples in its workers (case `claude-sdk`); alone, from the repository, one of each:

    AGENT_BRIDGE_TEST_CACHE=~/.cache/agent-bridge-tests bench/.venv/bin/python bench/claude_sdk.py

- `turn`: alternating turn by turn (the order rotating with the round), a warm turn on one long-lived `claude-sdk`
  process (profiles/clis/claude-sdk.yaml) and a cold one-shot turn of the same answer through
  `claude-stream-json` (profiles/clis/claude-code.yaml); each timed from the call to its result.
The fake server runs in a process of its own (agents/fake_server.py: in ours, its thread would hold the GIL
as the bridge wakes to read).

- `latency`: one warm process whose stdout passes through agents/stamp_relay.py, which stamps each chunk as it
  writes it on the bridge's pipe; turns streaming twenty text deltas, and turns whose Bash call asks the host (the
  profile says ask; the host allows). Partial latency: from the stamp of the chunk holding a delta to the host's
  callback receiving its partial; permission latency: the same for the chunk holding `can_use_tool` and the
  callback receiving the `PermissionRequest`.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "tools"), str(HERE / "agents")]  # the fake model server and the CLIs' cache; the relay

DELTAS = 20  # text deltas in each of the latency case's streaming turns


@contextmanager
def claude_setup() -> Iterator[tuple[Any, dict[str, str], Path]]:
    """The fake Anthropic server (a process of its own, agents/fake_server.py), and what runs the cached Claude Code
    against it: its path, env and a work dir."""
    from types import SimpleNamespace

    from agents_cache import npm_binary
    from fake_anthropic import claude_env
    from fake_server import serving

    with serving("anthropic") as url, tempfile.TemporaryDirectory() as scratch:
        home, work = Path(scratch) / "home", Path(scratch) / "work"
        home.mkdir()
        work.mkdir()
        yield str(npm_binary("claude")), claude_env(SimpleNamespace(url=url), str(home)), work


def warm_profile(claude: str, env: dict[str, str], work: Path, prefix: list[str] | None = None, **fields: Any) -> Any:
    """The ready claude-sdk profile as shipped, running `claude` (after `prefix`, a relay) in `work` with `env`."""
    import bridge

    profile = bridge.load_profile(ROOT / "profiles/clis/claude-sdk.yaml", cache=False)
    command = [*(prefix or []), claude, *profile.command[1:]]
    return profile.replace(command=command, env=env, cwd=str(work), **fields)


def turn(p: dict[str, Any]) -> dict[str, Any]:
    """Warm claude-sdk turns against cold claude-stream-json turns of the same answer, alternating."""
    import trio
    from worker import clock_ns, expect

    import bridge
    from bridge import Turn
    from bridge.engine.warm_agents import WarmAgent

    with claude_setup() as (claude, env, work):
        warm_fields = warm_profile(claude, env, work)
        cold_fields = bridge.load_profile(ROOT / "profiles/clis/claude-code.yaml", cache=False)
        cold_fields = cold_fields.replace(command=[claude], env=env, cwd=str(work))

        async def main() -> dict[str, list[float]]:
            times: dict[str, list[float]] = {"warm_ms": [], "cold_ms": []}
            async with trio.open_nursery() as nursery:
                agent = WarmAgent(warm_fields)
                await agent.start(nursery)
                pid = agent.pid
                for index in range(p["warmup"] + p["turns"]):
                    message = Turn(f"hello {index}")
                    results = {}
                    for name in ("warm", "cold")[:: 1 if (index + p["round"]) % 2 else -1]:
                        began = clock_ns()
                        if name == "warm":
                            results[name] = await agent.turn(message)
                        else:
                            results[name] = await bridge.run_turn(cold_fields, message)
                        elapsed = clock_ns() - began
                        if index >= p["warmup"]:
                            times[f"{name}_ms"].append(elapsed / 1e6)
                    for name, result in results.items():
                        expect(
                            result.ok and result.reply == f"reply to hello {index}",
                            f"{name} Claude Code turn is wrong: {result.outcome} {result.reply!r} {result.error}",
                        )
                expect(agent.pid == pid, "the warm claude-sdk process was replaced")
                await agent.close()
            return times

        return trio.run(main)


def latency(p: dict[str, Any]) -> dict[str, Any]:
    """Partial and permission latency of a warm claude-sdk process, from the relay's stamps to the host's callback."""
    from stamp_relay import Arrivals

    from bridge.dialects.claude_sdk import ClaudeSdk

    with claude_setup() as (claude, env, work):
        arrivals = Arrivals(ClaudeSdk, str(work.parent / "stamps"))
        profile = warm_profile(claude, env, work, arrivals.command_prefix(), permissions={"default": "ask"})

        def round_of(index: int) -> list[tuple[str, Callable[[Any], bool]]]:
            streamed = [str(n) for n in range(DELTAS)]
            return [
                (f"count {DELTAS}", lambda result: result.reply.split() == streamed),
                (f"run touch made-{index}", lambda result: (work / f"made-{index}").exists()),
            ]

        return timed_warm_turns(profile, arrivals, p, round_of, partials_per_round=DELTAS)


def timed_warm_turns(
    profile: Any,
    arrivals: Any,
    p: dict[str, Any],
    round_of: Callable[[int], list[tuple[str, Callable[[Any], bool]]]],
    partials_per_round: int,
) -> dict[str, Any]:
    """Rows 21 and 22's sample, for any warm CLI: `p["warmup"] + p["turns"]` rounds of turns on one agent of
    `profile` (its command behind the relay of `arrivals`); `round_of(index)` gives each round's (message, check of
    the result) — one turn streams, one asks permission for a tool, which the host allows. Every partial and
    permission request of a counted round is timed."""
    import trio
    from worker import expect

    from bridge import Turn
    from bridge.dialects.events import PartialEvent
    from bridge.engine.questions import Questions
    from bridge.engine.warm_agents import WarmAgent
    from bridge.permissions import Decision, PermissionRequest

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            for index in range(p["warmup"] + p["turns"]):
                counted = index >= p["warmup"]
                for message, check in round_of(index):
                    questions = Questions()  # one turn's: closed when its turn ends

                    def on_event(event: Any, questions: Questions = questions, counted: bool = counted) -> None:
                        if type(event) is PartialEvent:
                            arrivals.arrived("partial", counted)
                        elif type(event) is PermissionRequest:
                            arrivals.arrived("permission", counted)
                            questions.decide(event.request_id, Decision(allow=True))

                    result = await agent.turn(Turn(message), on_event, questions=questions)
                    expect(
                        result.ok and check(result), f"{message!r}: {result.outcome} {result.reply!r} {result.error}"
                    )
            await agent.close()

    trio.run(main)
    delays = arrivals.delays_ms()
    partials, permissions = delays.get("partial", []), delays.get("permission", [])
    expect(len(partials) >= p["turns"] * partials_per_round, f"only {len(partials)} partials were timed")
    expect(len(permissions) == p["turns"], f"{len(permissions)} permission requests timed")
    expect(min(partials + permissions) > 0, "an event before its chunk's stamp: offsets disagree")
    return {"delay_ms": partials, "permission_ms": permissions}


def show(name: str, values: dict[str, list[float]]) -> None:
    """One line per measure of a standalone run: median, p99 and count."""
    from report import stats

    for measure, numbers in values.items():
        st = stats(numbers)
        print(f"{name} {measure}: median {st['median']:.3f}, p99 {st['p99']:.3f} over {st['n']}")


def main() -> None:
    began = time.monotonic()
    show("claude-sdk", turn({"turns": 10, "warmup": 2, "round": 0}))
    show("claude-sdk", latency({"turns": 10, "warmup": 1, "round": 0}))
    print(f"({time.monotonic() - began:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
