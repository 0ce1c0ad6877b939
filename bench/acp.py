"""Row 29, the ACP door (issue 38): a turn through `agent-bridge acp` against the same turn through stdin/stdout serve.

`make bench` runs it in its workers (case `acp`); alone, from the repository:

    bench/.venv/bin/python bench/acp.py

- `turn`: one `serve --profiles` and one `acp PROFILE`, the echo agent (sample_agents/echo.sh) behind both, each
  with a store of its own; turn by turn, the order rotating, a `turn` request through serve and a `session/prompt`
  through acp (one ACP session for them all), each timed from writing the request to reading its end (serve's
  `result`, the prompt's response). Both clients are bare pipes here and do the same work: one `json.dumps` per
  request, one `json.loads` per line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from network import Serve, Stdio, turn_request  # noqa: E402  (bench/ is a directory of scripts)
from worker import ECHO_AGENT, check_echo, die_with_parent, expect  # noqa: E402

clock_ns = time.perf_counter_ns


class Acp(Stdio):
    """`agent-bridge acp PROFILE` on pipes, one session, its prompts one at a time."""

    def __init__(self, profile: str, state: str) -> None:
        argv = [sys.executable, "-m", "bridge", "acp", profile, "--state", state]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr, preexec_fn=die_with_parent
        )
        super().__init__(self)  # type: ignore[arg-type]  (Stdio needs only `.process`)
        self.rpc_id = 0
        self.call("initialize", {"protocolVersion": 1})
        self.session = self.call("session/new", {"cwd": "/", "mcpServers": []})["sessionId"]

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """Send a request; its result, once its response came (the notifications before it: the reply's text)."""
        self.rpc_id += 1
        self.send({"jsonrpc": "2.0", "id": self.rpc_id, "method": method, "params": params})
        self.text = ""
        deadline = time.monotonic() + 60
        while True:
            self.read(deadline)
            for message in self.parse():
                if message.get("id") == self.rpc_id:
                    expect("result" in message, f"acp answered an error: {message}")
                    return message["result"]
                self.text += message["params"]["update"]["content"]["text"]

    def prompt(self, text: str) -> str:
        stop = self.call("session/prompt", {"sessionId": self.session, "prompt": [{"type": "text", "text": text}]})
        expect(stop == {"stopReason": "end_turn"} and self.text == f"echo: {text}", f"wrong turn: {stop} {self.text!r}")
        return self.text

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(30)


def doors(directory: str) -> Iterator[tuple[Stdio, Acp]]:
    profiles = os.path.join(directory, "profiles")
    os.mkdir(profiles)
    profile = os.path.join(profiles, "agent.yaml")
    with open(profile, "w") as file:
        json.dump({"command": [ECHO_AGENT], "timeout_secs": 60, "max_reply_chars": None}, file)  # JSON is YAML
    serve = Serve(profiles, os.path.join(directory, "serve.sqlite3"), listen=False)
    try:
        acp = Acp(profile, os.path.join(directory, "acp.sqlite3"))
        try:
            yield Stdio(serve), acp
        finally:
            acp.stop()
    finally:
        serve.stop()


def turn(p: dict[str, Any]) -> dict[str, Any]:
    """Turns through serve and through acp, alternating, the order rotating each round."""
    times: dict[str, list[float]] = {"stdin": [], "acp": []}
    with tempfile.TemporaryDirectory() as directory:
        for serve, acp in doors(directory):
            for i in range(p["warmup"] + p["turns"]):
                order = ["stdin", "acp"] if (i + p["round"]) % 2 == 0 else ["acp", "stdin"]
                for name in order:
                    request_id = f"{name}-{i}"
                    began = clock_ns()
                    if name == "stdin":
                        check_echo(serve.result(turn_request(request_id, request_id)))
                    else:
                        acp.prompt(request_id)
                    elapsed = clock_ns() - began
                    if i >= p["warmup"]:
                        times[name].append(elapsed / 1e6)
    return {f"{name}_ms": values for name, values in times.items()}


if __name__ == "__main__":
    import statistics

    result = turn({"turns": 50, "warmup": 5, "round": 0})
    print({name: round(statistics.median(values), 3) for name, values in result.items()})
