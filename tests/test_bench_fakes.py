"""The benchmark's fake model servers start: `make bench` runs the tests' fakes (tools/) in processes of their own
(bench/agents/fake_server.py), and nothing else in the suite would notice the day they cannot be imported — the
fakes once moved from tests/ to tools/ and the bench's Claude Code case failed every sample until a full run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

FAKE_SERVER = REPO / "bench" / "agents" / "fake_server.py"


@pytest.mark.parametrize(("kind", "path"), [("anthropic", ""), ("openai", "/v1")])
def test_the_benchs_fake_model_server_prints_its_url_and_stops_when_its_stdin_ends(kind: str, path: str) -> None:
    server = subprocess.Popen(
        [sys.executable, str(FAKE_SERVER), kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = server.communicate("", timeout=10)
    finally:
        server.kill()
    assert server.returncode == 0, err
    assert out.startswith("http://127.0.0.1:") and out.strip().endswith(path), out
