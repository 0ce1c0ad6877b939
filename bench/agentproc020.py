"""agentproc 0.20's own runner (the reference for wire 0.4), one sample: `agentproc020.py CONTENDER PARAMS_JSON`.

Runs in bench/.venv-ap020, which `make bench` builds with agentproc==0.20.0 alone: bench/.venv holds agentproc
0.4.2 for the wire-0.1 cases, and one venv cannot hold two versions of a package. worker.py starts this script
in a subprocess and relays the JSON object it prints, in the same shape as its own samples.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

import agentproc
from agentproc.runner import RunOptions, run
from agentproc.yaml import parse_yaml

HERE = os.path.dirname(os.path.abspath(__file__))
AGENTS = os.path.join(HERE, "agents")


def throughput(p: dict[str, Any]) -> dict[str, Any]:
    """`cat` of the wire-0.4 file; the partial callback takes every partial (text and role) and does nothing."""
    profile = {"command": "cat", "args": [p["file"]], "timeout_secs": 600}
    roles: dict[str, int] = {}

    def count(text: str, role: str | None) -> None:
        roles[role or ""] = roles.get(role or "", 0) + 1

    def ignore(text: str, role: str | None) -> None:
        pass

    result = run(profile, RunOptions(message="hello", on_partial=count))
    if (
        result.exit_code != 0
        or result.session_id != p["session_id"]
        or roles.get("thinking") != p["activities"]
        or sum(roles.values()) != p["activities"] + p["partials"]
        or result.usage is None
        or result.usage.get("input_tokens") != p["input_tokens"]
    ):
        return {
            "invalid": f"agentproc 0.20 throughput turn is wrong: exit {result.exit_code}, partials {roles}, "
            f"session {result.session_id!r}"
        }
    times = []
    for _ in range(p["turns"]):
        began = time.perf_counter_ns()
        result = run(profile, RunOptions(message="hello", on_partial=ignore))
        times.append(time.perf_counter_ns() - began)
        if result.exit_code != 0 or result.session_id != p["session_id"]:
            return {"invalid": "agentproc 0.20 throughput turn failed"}
    return {"mb_per_s": [p["bytes"] / 1e6 / (t / 1e9) for t in times], "seconds": [t / 1e9 for t in times]}


def hub(p: dict[str, Any]) -> dict[str, Any]:
    """A coding CLI's JSON (a file dialect_like.py wrote) the way agentproc 0.20 reads it: through the CLI's hub
    profile, shipped in its wheel, whose bridge script (a second process) runs the CLI and translates what it prints
    into wire 0.4 for the runner. The CLI is a stand-in on PATH that prints the file (and, asked for `--help`, the
    usage line dsh's bridge probes for)."""
    name, command = p["hub_profile"]
    profile_dir = os.path.join(os.path.dirname(agentproc.__file__), "hub_data", name)
    with open(os.path.join(profile_dir, "profile.yaml")) as f:
        profile = parse_yaml(f.read())["agentproc"]
    bin_dir = tempfile.mkdtemp(prefix="bench-hub-")
    stand_in = os.path.join(bin_dir, command)
    with open(stand_in, "w") as f:
        f.write(
            f'#!/bin/sh\ncase " $* " in *" --help "*) echo "usage: {command} [--json] [--session-id ID]";; '
            f"*) exec cat {p['file']};; esac\n"
        )
    os.chmod(stand_in, 0o755)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ["PATH"]
    partials = 0

    def count(text: str, role: str | None) -> None:
        nonlocal partials
        partials += 1

    def ignore(text: str, role: str | None) -> None:
        pass

    result = run(profile, RunOptions(message="hello", profile_dir=profile_dir, on_partial=count))
    if result.exit_code != 0 or not (partials or result.reply):
        return {
            "invalid": f"agentproc 0.20's {name} profile read nothing: exit {result.exit_code}, {partials} "
            f"partials, error {result.error!r}"
        }
    times = []
    for _ in range(p["turns"]):
        began = time.perf_counter_ns()
        result = run(profile, RunOptions(message="hello", profile_dir=profile_dir, on_partial=ignore))
        times.append(time.perf_counter_ns() - began)
        if result.exit_code != 0:
            return {"invalid": f"agentproc 0.20's {name} profile failed a turn"}
    return {"seconds": [t / 1e9 for t in times], "partials": [partials]}


def latency(p: dict[str, Any]) -> dict[str, Any]:
    """From dialect_like.py writing an output partial to the callback (as worker.py's latency cases)."""
    delays: list[int] = []
    now = time.monotonic_ns

    def on_partial(text: str, role: str | None) -> None:
        arrived = now()
        if role == "output":
            delays.append(arrived - int(text))

    ticker = [
        os.path.join(AGENTS, "dialect_like.py"),
        "tick",
        "agentproc-0.4",
        str(p["seconds"]),
        str(p["interval_ms"]),
    ]
    profile = {"command": sys.executable, "args": ["-S", *ticker], "timeout_secs": 60}
    result = run(profile, RunOptions(message="hello", on_partial=on_partial))
    expected = int(p["seconds"] * 1000 / p["interval_ms"])
    if result.exit_code != 0 or len(delays) < expected * 0.9:
        return {"invalid": f"agentproc 0.20 ticker turn failed: exit {result.exit_code}, {len(delays)} partials"}
    return {"delay_ms": [d / 1e6 for d in delays[p["skip"] :]]}


if __name__ == "__main__":
    sample = {"throughput": throughput, "latency": latency, "hub": hub}[sys.argv[1]](json.loads(sys.argv[2]))
    print(json.dumps(sample))
    sys.exit(3 if "invalid" in sample else 0)
