"""The ready profiles of grok-build, kimi-code, opencode, pi, dsh, deepseek, agy, aider (and aictrl), run unchanged.

None of these CLIs can be installed here, so `sample_agents/coding_clis.py`
stands in for each, on PATH under the CLI's own name: it parses arguments as
that CLI does (an option it does not know fails the turn) and writes the output
the CLI documents. Each profile runs a first turn — the message starts with
'-', so it must reach the CLI as the message, not as an option — and, where the
CLI can resume, a second turn in the same session.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from conftest import CLI_PROFILES, TURN_DEADLINE
from fake_clis import install_fake_clis

import bridge
from bridge import Turn
from bridge.dialects import ActivityEvent, PartialEvent

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")


@dataclass(frozen=True)
class Ready:
    profile: str
    cli: str
    error: str  # the turn's error when the provider fails ("" for plain-text CLIs: they exit non-zero)
    resumes: bool = True
    streams: bool = True
    names_session: bool = True  # the CLI prints its session id (else the bridge made it up)
    quotes: bool = False  # the CLI wraps a message word that holds a space in double quotes (opencode does)

    def said(self, message: str) -> str:
        return f'"{message}"' if self.quotes and " " in message else message


READY = [
    Ready("grok-build", "grok", "Rate limit exceeded, try again later"),
    Ready(
        "kimi-code",
        "kimi",
        "Error code: 401 - {'error': {'message': 'Invalid Authentication', 'type': 'invalid_authentication_error'}}",
        names_session=False,
    ),
    Ready("opencode", "opencode", "Invalid API key", quotes=True),
    Ready("pi", "pi", "401 invalid x-api-key"),
    Ready("dsh", "dsh", "missing credential: DEEPSEEK_API_KEY"),
    Ready("deepseek", "deepseek", "API error 401: Authentication Fails, your api key is invalid"),
    Ready("agy", "agy", "", streams=False, names_session=False),
    Ready("aider", "aider", "", resumes=False, streams=False),
]


@pytest.fixture
def clis_on_path(tmp_path, monkeypatch) -> Path:
    return install_fake_clis(tmp_path, monkeypatch)


def test_check_accepts_every_ready_profile_without_a_warning(clis_on_path):
    paths = [str(CLI_PROFILES / f"{ready.profile}.yaml") for ready in READY] + [str(CLI_PROFILES / "aictrl.yaml")]
    done = subprocess.run([AGENT_BRIDGE, "check", *paths], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{path}: ok" for path in paths]
    assert done.stderr == ""  # no option-injection warning, and every command is found


@pytest.mark.parametrize("ready", READY, ids=lambda ready: ready.profile)
async def test_the_profile_answers_and_continues_its_session(clis_on_path, ready):
    profile = bridge.load_profile(CLI_PROFILES / f"{ready.profile}.yaml")
    seen: list[object] = []
    with trio.fail_after(TURN_DEADLINE):
        first = await bridge.run_turn(profile, Turn("-h use a tool"), on_event=seen.append)
    assert (first.exit_code, first.outcome) == (0, "ok"), (first.error_reply, first.stderr_tail)
    assert f"{ready.cli} turn 1: you said: {ready.said('-h use a tool')}" in first.reply
    assert any(isinstance(event, PartialEvent) for event in seen) == ready.streams
    if ready.streams:  # the JSON families report what the stand-in did: a tool call, or thinking
        assert any(isinstance(event, ActivityEvent) for event in seen)
    if not ready.resumes:
        assert first.session_id == ""
        return
    assert first.session_id
    with trio.fail_after(TURN_DEADLINE):
        second = await bridge.run_turn(profile, Turn("again", session_id=first.session_id))
    assert (second.exit_code, second.outcome) == (0, "ok"), (second.error_reply, second.stderr_tail)
    assert f"{ready.cli} turn 2: you said: again\nlast time you said: {ready.said('-h use a tool')}" in second.reply
    # A CLI that names its session restates it; for the others the stored id stays (no session line).
    assert second.session_id == (first.session_id if ready.names_session else "")


@pytest.mark.parametrize("ready", READY, ids=lambda ready: ready.profile)
async def test_a_failing_provider_fails_the_turn_with_the_clis_own_words(clis_on_path, ready):
    profile = bridge.load_profile(CLI_PROFILES / f"{ready.profile}.yaml")
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("please fail"))
    assert result.exit_code != 0 and result.reply == ""
    if ready.error:
        assert (result.outcome, result.error, result.error_reply) == ("agent_error", ready.error, ready.error)
    else:
        assert (result.outcome, result.error_reply) == ("exit_nonzero", "The agent exited with code 1.")
        assert result.stderr_tail  # what the CLI said is kept for the host's logs
