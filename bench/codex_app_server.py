"""A warm codex-app-server turn through the bridge against `codex app-server` driven directly; not in `make bench`.

    AGENT_BRIDGE_TEST_CACHE=~/.cache/agent-bridge-tests .venv/bin/python bench/codex_app_server.py [TURNS]

Both sides run the pinned codex (the tests' npm cache) against the tests' fake OpenAI server on loopback, which
answers at once, each with a warm process and a thread of its own; their turns alternate. Prints:

- the median turn: the bridge's (`WarmAgent.turn`, from the call to the result) and the direct client's (a
  minimal JSON-RPC client: from writing `turn/start` to reading `turn/completed`), and their difference;
- p99 partial latency: from the moment the dialect is handed the chunk of codex's stdout that holds a delta to
  the host's callback receiving its partial (what the bridge adds between codex's pipe and the host);
- p99 approval latency: the same from the chunk holding codex's approval request to the host's callback asked
  for a decision (the profile says ask).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the fake model server and the agents' cache, test helpers both

from agents_cache import npm_binary  # noqa: E402
from fakes.openai_responses import OpenAIResponses, write_codex_home  # noqa: E402

import bridge  # noqa: E402
from bridge import Turn  # noqa: E402
from bridge.dialects.codex_app_server import CodexAppServer  # noqa: E402
from bridge.dialects.events import PartialEvent  # noqa: E402
from bridge.permissions import Decision, PermissionRequest  # noqa: E402
from bridge.questions import Questions  # noqa: E402
from bridge.warm_agent import WarmAgent  # noqa: E402

MESSAGE = "say one two three four five six seven eight nine ten"  # four deltas


class Direct:
    """`codex app-server` driven by the least a client must do: initialize, start a thread, start turns."""

    def __init__(self, process: trio.Process) -> None:
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
                message = json.loads(line)
                if message.get("method") == method if method else message.get("id") == self.next_id:
                    return message
                newline = self.buffer.find(b"\n")
            chunk = await self.process.stdout.receive_some(65536)
            if not chunk:
                raise RuntimeError("codex app-server ended")
            self.buffer += chunk


async def start_direct(codex: str, env: dict[str, str], work: str) -> tuple[Direct, str]:
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
    thread = started["result"]["thread"]["id"]
    return direct, thread


async def main(turns: int) -> None:
    codex = str(npm_binary("codex"))
    fed: list[float] = []  # when the dialect was last handed a chunk of codex's stdout
    real_feed = CodexAppServer.feed

    def timed_feed(self: CodexAppServer, data: bytes) -> list[Any]:
        fed.append(trio.current_time())
        return real_feed(self, data)

    CodexAppServer.feed = timed_feed  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as scratch, OpenAIResponses() as api:
        home = write_codex_home(Path(scratch) / "home" / ".codex", api.base_url)
        work = Path(scratch) / "work"
        work.mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": str(home.parent), "CODEX_HOME": str(home)}
        profile = bridge.load_profile(ROOT / "profiles" / "clis" / "codex-app-server.yaml", cache=False).replace(
            command=[codex, "app-server"], cwd=str(work), env={"CODEX_HOME": str(home), "HOME": str(home.parent)}
        )
        bridged: list[float] = []
        direct_times: list[float] = []
        partial_lag: list[float] = []
        approval_lag: list[float] = []
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            direct, thread = await start_direct(codex, env, str(work))

            def on_event(event: Any) -> None:
                if type(event) is PartialEvent:
                    partial_lag.append(trio.current_time() - fed[-1])

            for number in range(turns + 3):
                started = trio.current_time()
                result = await agent.turn(Turn(MESSAGE), on_event)
                took = trio.current_time() - started
                assert result.ok, result.error
                started = trio.current_time()
                turn_start = {"threadId": thread, "input": [{"type": "text", "text": MESSAGE}]}
                await direct.call("turn/start", turn_start, "turn/completed")
                direct_took = trio.current_time() - started
                if number >= 3:  # the first turns warm both up
                    bridged.append(took)
                    direct_times.append(direct_took)

            for number in range(max(turns // 2, 5)):
                questions = Questions()

                def asked(event: Any, questions: Questions = questions) -> None:
                    if isinstance(event, PermissionRequest):
                        approval_lag.append(trio.current_time() - fed[-1])
                        questions.decide(event.request_id, Decision(allow=True))

                result = await agent.turn(Turn(f"escalate touch {work}/f{number}"), asked, questions=questions)
                assert result.ok, result.error
            await agent.close()
            direct.process.kill()
    CodexAppServer.feed = real_feed  # type: ignore[method-assign]

    def ms(value: float) -> str:
        return f"{value * 1000:.2f} ms"

    def p99(values: list[float]) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

    bridge_median, direct_median = statistics.median(bridged), statistics.median(direct_times)
    print(f"turns: {len(bridged)} each, alternating; partials: {len(partial_lag)}; approvals: {len(approval_lag)}")
    print(f"median warm turn   bridge {ms(bridge_median)}   direct {ms(direct_median)}", end="")
    print(f"   difference {ms(bridge_median - direct_median)}")
    print(f"partial latency    p99 {ms(p99(partial_lag))}   median {ms(statistics.median(partial_lag))}")
    print(f"approval latency   p99 {ms(p99(approval_lag))}   median {ms(statistics.median(approval_lag))}")


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 30)
