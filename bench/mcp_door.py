"""Row 35, the MCP door (issue 38): a tool call to `agent-bridge mcp` on stdio against the same turn through
stdin/stdout `agent-bridge serve`, the echo agent behind both, measured in the same run.

`make bench` runs this sample in its workers (case `mcp`); alone, from the repository:

    bench/.venv/bin/python bench/mcp_door.py

- `turn`: one `serve --profiles` and one `mcp --profiles` on pipes, the same profile (sample_agents/echo.sh);
  turn by turn, the order rotating, a serve `turn` request and an MCP `tools/call`, each timed from writing the
  request to reading its result. Both clients are bare pipes: one `json.dumps` per request, one `json.loads` per
  line read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from network import Client, Serve, Stdio, clock_ns, turn_request  # noqa: E402  (bench/: scripts)
from worker import ECHO_AGENT, check_echo, die_with_parent, expect  # noqa: E402


class McpStdio(Client):
    """`agent-bridge mcp` on its stdin and stdout: initialized once, then `tools/call` of the profile `agent`."""

    def __init__(self, profiles: str, state: str) -> None:
        super().__init__()
        argv = [sys.executable, "-m", "bridge", "mcp", "--profiles", profiles, "--state", state]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr, preexec_fn=die_with_parent
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in, self._out = self.process.stdin.fileno(), self.process.stdout.fileno()
        initialize = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"},
        }
        self.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": initialize})
        self.read_response()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def fd(self) -> int:
        return self._out

    def send(self, request: dict[str, Any]) -> None:
        os.write(self._in, json.dumps(request).encode() + b"\n")

    def parse(self) -> Any:
        buffer = self.buffer
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            yield json.loads(line)

    def read_response(self) -> dict[str, Any]:
        while True:
            self.read(time.monotonic() + 60)
            for message in self.parse():
                if "id" in message:
                    return dict(message)

    def call(self, request_id: str, message: str) -> dict[str, Any]:
        params = {"name": "agent", "arguments": {"message": message, "conversation": "chat"}}
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
        response = self.read_response()
        expect(response.get("id") == request_id, f"the response to another call: {response}")
        return response

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def turn(p: dict[str, Any]) -> dict[str, Any]:
    """Turns through stdin/stdout serve and MCP tool calls over stdio, one after another in rotating order."""
    with tempfile.TemporaryDirectory() as directory:
        profiles = os.path.join(directory, "profiles")
        os.mkdir(profiles)
        with open(os.path.join(profiles, "agent.yaml"), "w") as file:
            json.dump({"command": [ECHO_AGENT], "timeout_secs": 60, "max_reply_chars": None}, file)  # JSON is YAML
        plain = Serve(profiles, os.path.join(directory, "stdio.sqlite3"), listen=False)
        mcp = McpStdio(profiles, os.path.join(directory, "mcp.sqlite3"))
        try:
            stdin = Stdio(plain)
            times: dict[str, list[float]] = {"stdin": [], "mcp": []}
            for i in range(p["warmup"] + p["turns"]):
                for name in ["stdin", "mcp"] if (i + p["round"]) % 2 == 0 else ["mcp", "stdin"]:
                    request_id = f"{name}-{i}"
                    began = clock_ns()
                    if name == "stdin":
                        result = stdin.result(turn_request(request_id, request_id))
                        elapsed = clock_ns() - began
                        check_echo(result)
                    else:
                        response = mcp.call(request_id, request_id)
                        elapsed = clock_ns() - began
                        text = response["result"]["content"][0]["text"]
                        expect(text == f"echo: {request_id}", f"wrong result: {response}")
                    if i >= p["warmup"]:
                        times[name].append(elapsed / 1e6)
        finally:
            mcp.stop()
            plain.stop()
    return {f"{name}_ms": values for name, values in times.items()}


if __name__ == "__main__":
    import statistics

    found = turn({"turns": 30, "warmup": 5, "round": 0})
    for name, values in found.items():
        print(f"{name}: median {statistics.median(values):.2f} ms over {len(values)}")
