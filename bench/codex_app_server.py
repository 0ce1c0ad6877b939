"""Rows 20, 21 and 22 for `protocol: codex-app-server`: the pinned codex (the tests' npm cache) against the tests'
fake OpenAI server on loopback, which answers at once, so a turn costs what codex and the bridge cost.

`make bench` runs these samples in its workers (case `codex-app-server`); alone, from the repository, one of each:

    AGENT_BRIDGE_TEST_CACHE=~/.cache/agent-bridge-tests bench/.venv/bin/python bench/codex_app_server.py

- `turn`: alternating turn by turn (the order rotating with the round), a warm turn through the bridge
  (`WarmAgent.turn` on profiles/clis/codex-app-server.yaml, from the call to the result) and one of
  `codex app-server` driven directly by the least a client must do (`Direct`: from writing `turn/start` to reading
  `turn/completed`, every line parsed); each side has its own warm process and thread.
- `latency`: one warm process through the bridge whose stdout passes through agents/stamp_relay.py, which stamps
  each chunk as it writes it on the bridge's pipe; turns streaming a reply in many deltas, and turns whose command
  asks for approval (the profile says ask; the host allows). Partial latency: from the stamp of the chunk holding a
  delta to the host's callback receiving its partial; approval latency: the same for the chunk holding codex's
  approval request and the callback receiving the `PermissionRequest`.
"""

from __future__ import annotations

import json
import os
import subprocess
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

MESSAGE = "say one two three four five six seven eight nine ten"  # four deltas
WORDS = 60  # the latency case's streaming turns: "say" 60 words, a few words a delta


class Direct:
    """`codex app-server` driven by the least a client must do: initialize, start a thread, start turns."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self.buffer = b""
        self.next_id = 0

    async def call(self, method: str, params: dict[str, Any], until: str) -> dict[str, Any]:
        """Send a request; read codex's messages up to the first whose method is `until` (or our response)."""
        assert self.process.stdin is not None
        self.next_id += 1
        line = json.dumps({"id": self.next_id, "method": method, "params": params}) + "\n"
        await self.process.stdin.send_all(line.encode())
        return await self.read_until(until)

    async def read_until(self, method: str) -> dict[str, Any]:
        """Each line parsed, as any client must; the first message with `method` (or the response to our last
        request when `method` is "")."""
        assert self.process.stdout is not None
        while True:
            newline = self.buffer.find(b"\n")
            while newline >= 0:
                line, self.buffer = self.buffer[:newline], self.buffer[newline + 1 :]
                message: dict[str, Any] = json.loads(line)
                if message.get("method") == method if method else message.get("id") == self.next_id:
                    return message
                newline = self.buffer.find(b"\n")
            chunk = await self.process.stdout.receive_some(65536)
            if not chunk:
                raise RuntimeError("codex app-server ended")
            self.buffer += chunk


async def start_direct(codex: str, env: dict[str, str], work: str) -> tuple[Direct, str]:
    import trio

    process = await trio.lowlevel.open_process(
        [codex, "app-server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=work,
        start_new_session=True,
    )
    direct = Direct(process)
    await direct.call("initialize", {"clientInfo": {"name": "bench", "version": "0"}}, "")
    assert process.stdin is not None
    await process.stdin.send_all(b'{"method":"initialized"}\n')
    params = {"cwd": work, "approvalPolicy": "on-request", "sandbox": "read-only"}
    started = await direct.call("thread/start", params, "")
    return direct, started["result"]["thread"]["id"]


@contextmanager
def codex_setup(prefix: list[str] | None = None, **fields: Any) -> Iterator[tuple[str, dict[str, str], Path, Any]]:
    """The fake OpenAI server (a process of its own, agents/fake_server.py: in ours, its thread would hold the GIL as
    the bridge wakes to read), and the cached codex against it: its path, env, a work dir, and the ready profile as
    shipped running it (after `prefix`, a relay) with `fields` replaced."""
    from agents_cache import npm_binary
    from fakes.openai_responses import OpenAIResponses, write_codex_home

    import bridge

    codex = str(npm_binary("codex"))
    with tempfile.TemporaryDirectory() as scratch, OpenAIResponses() as api:
        home = write_codex_home(Path(scratch) / "home" / ".codex", api.base_url)
        work = Path(scratch) / "work"
        work.mkdir()
        env = {"CODEX_HOME": str(home), "HOME": str(home.parent)}
        profile = bridge.load_profile(ROOT / "profiles" / "clis" / "codex-app-server.yaml", cache=False)
        profile = profile.replace(command=[*(prefix or []), codex, "app-server"], cwd=str(work), env=env, **fields)
        yield codex, {"PATH": os.environ["PATH"], **env}, work, profile


def turn(p: dict[str, Any]) -> dict[str, Any]:
    """Warm turns through the bridge against turns of codex app-server driven directly, alternating."""
    import trio
    from worker import clock_ns, expect

    from bridge import Turn
    from bridge.engine.warm_agents import WarmAgent

    with codex_setup() as (codex, env, work, profile):

        async def main() -> dict[str, list[float]]:
            times: dict[str, list[float]] = {"bridge_ms": [], "direct_ms": []}
            async with trio.open_nursery() as nursery:
                agent = WarmAgent(profile)
                await agent.start(nursery)
                direct, thread = await start_direct(codex, env, str(work))
                try:
                    for index in range(p["warmup"] + p["turns"]):
                        for name in ("bridge", "direct")[:: 1 if (index + p["round"]) % 2 else -1]:
                            began = clock_ns()
                            if name == "bridge":
                                result = await agent.turn(Turn(MESSAGE))
                                elapsed = clock_ns() - began
                                expect(
                                    result.ok and result.reply == MESSAGE.removeprefix("say "),
                                    f"bridge codex turn is wrong: {result.outcome} {result.reply!r} {result.error}",
                                )
                            else:
                                turn_start = {"threadId": thread, "input": [{"type": "text", "text": MESSAGE}]}
                                done = await direct.call("turn/start", turn_start, "turn/completed")
                                elapsed = clock_ns() - began
                                status = done["params"]["turn"]["status"]
                                expect(status == "completed", f"direct codex turn ended {status}")
                            if index >= p["warmup"]:
                                times[f"{name}_ms"].append(elapsed / 1e6)
                finally:
                    direct.process.kill()
                    await agent.close()
            return times

        return trio.run(main)


def latency(p: dict[str, Any]) -> dict[str, Any]:
    """Partial and approval latency of a warm codex app-server, from the relay's stamps to the host's callback."""
    from claude_sdk import timed_warm_turns
    from stamp_relay import Arrivals

    from bridge.dialects.codex_app_server import CodexAppServer

    with tempfile.TemporaryDirectory() as logs:
        arrivals = Arrivals(CodexAppServer, os.path.join(logs, "stamps"))
        words = " ".join(f"w{index}" for index in range(WORDS))
        with codex_setup(arrivals.command_prefix(), permissions={"default": "ask"}) as (_, _, work, profile):

            def round_of(index: int) -> list[tuple[str, Callable[[Any], bool]]]:
                marker = work / f"made-{index}"
                return [
                    (f"say {words}", lambda result: result.reply == words),
                    (f"escalate touch {marker}", lambda result: marker.exists()),
                ]

            return timed_warm_turns(profile, arrivals, p, round_of, partials_per_round=10)


def main() -> None:
    from claude_sdk import show

    began = time.monotonic()
    show("codex-app-server", turn({"turns": 20, "warmup": 3, "round": 0}))
    show("codex-app-server", latency({"turns": 10, "warmup": 1, "round": 0}))
    print(f"({time.monotonic() - began:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
