"""protocol: aictrl-ndjson — `aictrl run --format json`, from transcripts and through `profiles/clis/aictrl.yaml`.

aictrl cannot be installed here (its npm package is not published). The
transcripts in `transcripts/aictrl/` are reconstructed from its 0.4.1 source
(`text`, `tool-use`, `auth-error`, `invocation-error`: see
/work/notes/transcripts/README.md) and from the examples of the older EVENTS.md
seed (`seed-schema`: no invocation events, `cost` as an object, a sub-agent).
The profile runs against `sample_agents/aictrl_like.py`, which speaks 0.4.1's
events.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from conftest import CLI_PROFILES, TURN_DEADLINE
from fake_clis import TRANSCRIPTS, decode, install_fake_clis, of_type

import bridge
from bridge import Turn
from bridge.dialects import (
    ActivityEvent,
    ErrorEvent,
    LineCut,
    PartialEvent,
    ProtocolWarning,
    ReplyEvent,
    SessionEvent,
    Usage,
    UsageEvent,
)

AICTRL = TRANSCRIPTS / "aictrl"
SESSION = "ses_1f2e3d4c5b6aZyXwVuTsRqPo"


def transcript(name: str) -> bytes:
    return (AICTRL / f"{name}.jsonl").read_bytes()


def test_a_text_turn_gives_the_session_the_text_as_partial_and_reply_and_the_messages_usage():
    events = decode("aictrl-ndjson", transcript("text"))
    assert events == [
        SessionEvent(SESSION),
        PartialEvent("Hello there."),
        UsageEvent(
            Usage(
                input_tokens=120,
                output_tokens=6,
                cached_input_tokens=0,
                reasoning_tokens=0,
                total_tokens=126,
                cost_usd=0.0004,
            ),
            replace=False,
        ),  # step_finish is not counted again
        ReplyEvent("Hello there."),  # the last text part, when the stream ends
    ]


def test_a_tool_turn_reports_the_permission_and_the_call_and_adds_up_each_messages_usage():
    events = decode("aictrl-ndjson", transcript("tool-use"))
    assert of_type(events, ActivityEvent) == [
        ActivityEvent("tool", tool="bash", title="echo hi", status="allowed", call_id="call_1"),
        ActivityEvent("tool", text="hi", tool="bash", title="echo hi", status="completed", call_id="call_1"),
    ]
    assert [event.usage.total_tokens for event in of_type(events, UsageEvent)] == [330, 350]
    assert of_type(events, ReplyEvent) == [ReplyEvent("It printed hi.")]
    assert not of_type(events, ErrorEvent)


def test_an_auth_failure_is_one_error_with_the_providers_message():
    events = decode("aictrl-ndjson", transcript("auth-error"))
    # session_error and the raw error say the same thing: reported once. The usage was not reported (tokens null).
    assert of_type(events, ErrorEvent) == [ErrorEvent("Incorrect API key provided")]
    assert of_type(events, SessionEvent) == [SessionEvent(SESSION)]
    assert not of_type(events, UsageEvent) and not of_type(events, ReplyEvent)


def test_a_run_refused_before_any_session_says_why_and_names_no_session():
    events = decode("aictrl-ndjson", transcript("invocation-error"))
    assert events == [ErrorEvent("Invocation failed during validation (INVOCATION_EMPTY_INPUT)")]


def test_the_older_seed_schema_maps_too_and_a_subagent_never_becomes_the_session():
    events = decode("aictrl-ndjson", transcript("seed-schema"))
    assert of_type(events, SessionEvent) == [SessionEvent("session_01abc")]  # not the sub-agent's session_01xyz
    assert of_type(events, ActivityEvent) == [
        ActivityEvent("thinking", text="Let me think about this..."),
        ActivityEvent("tool", text="src", tool="bash", title="ls", status="completed"),  # the sub-agent's call
        ActivityEvent("tool", tool="bash", title="rm -rf /", status="denied", call_id="call_01xyz"),
        ActivityEvent(
            "tool", text="permission rejected", tool="bash", title="rm -rf /", status="failed", call_id="call_01xyz"
        ),
    ]
    assert not of_type(events, ErrorEvent)  # the sub-agent's error is not the turn's
    first, second = (event.usage for event in of_type(events, UsageEvent))
    assert first == Usage(
        input_tokens=1024 + 8800 + 1024,
        output_tokens=512,
        cached_input_tokens=8800,
        reasoning_tokens=0,
        total_tokens=1024 + 8800 + 1024 + 512,
        cost_usd=pytest.approx(0.015),
    )
    assert (second.output_tokens, second.reasoning_tokens, second.cost_usd) == (60, 10, pytest.approx(0.003))
    assert of_type(events, ReplyEvent) == [ReplyEvent("Here is the result...")]


@pytest.mark.parametrize("name", ["text", "tool-use", "auth-error", "invocation-error", "seed-schema"])
def test_any_split_of_the_stream_gives_the_same_events(name):
    whole = decode("aictrl-ndjson", transcript(name))
    assert decode("aictrl-ndjson", transcript(name), chunk=1) == whole
    assert decode("aictrl-ndjson", transcript(name), chunk=7) == whole


def test_a_stream_without_session_complete_did_not_finish_its_turn():
    cut = b"".join(
        line
        for line in transcript("text").splitlines(keepends=True)
        if b"session_complete" not in line and b"invocation_complete" not in line
    )
    events = decode("aictrl-ndjson", cut)
    assert of_type(events, ReplyEvent) == [ReplyEvent("Hello there.")]
    assert events[-1] == ErrorEvent(
        "aictrl ended without finishing its turn (no session_complete event)", unfinished=True
    )


def test_garbage_is_counted_an_overlong_line_is_cut_and_the_rest_still_decoded():
    long_text = b'{"type":"text","sessionID":"s1","part":{"type":"text","text":"' + b"x" * 5000 + b'"}}\n'
    data = (
        b'{"type":"session_start","sessionID":"s1","schemaVersion":"1","permissions":[]}\n'
        b"Warning: not json\n[1, 2]\n"
        + long_text
        + b'{"type":"text","sessionID":"s1","part":{"type":"text","text":"short"}}\n'
        b'{"type":"session_complete","sessionID":"s1","durationMs":1,"error":null}\n'
        b'{"type":"text","sessionID":"s1","part":{"type":"text","text":"cut off mid-li'
    )
    events = decode("aictrl-ndjson", data, max_line_bytes=4096)
    assert of_type(events, SessionEvent) == [SessionEvent("s1")]
    assert len(of_type(events, LineCut)) == 1
    assert of_type(events, ReplyEvent) == [ReplyEvent("short")]  # the unterminated last line is not JSON
    warnings = [event.message for event in of_type(events, ProtocolWarning)]
    assert warnings == ["ignored 3 stdout line(s) that were not JSON objects"]
    assert not of_type(events, ErrorEvent)


def test_a_subagents_text_is_not_the_reply_and_its_error_not_the_turns():
    data = (
        b'{"type":"session_start","sessionID":"main","permissions":[]}\n'
        b'{"type":"text","sessionID":"main","part":{"type":"text","text":"mine","sessionID":"main"}}\n'
        b'{"type":"text","sessionID":"main","part":{"type":"text","text":"theirs","sessionID":"child"}}\n'
        b'{"type":"error","sessionID":"main","error":{"name":"X","data":{"message":"child broke"}},'
        b'"sourceSessionID":"child"}\n'
        b'{"type":"session_complete","sessionID":"main","durationMs":1,"error":null}\n'
    )
    events = decode("aictrl-ndjson", data)
    assert of_type(events, ReplyEvent) == [ReplyEvent("mine")]
    assert not of_type(events, ErrorEvent)


def test_unknown_types_and_fields_are_ignored():
    data = (
        b'{"type":"session_start","sessionID":"s1","permissions":[],"brandNew":true}\n'
        b'{"type":"skill_loaded","sessionID":"s1","name":"commit"}\n'
        b'{"type":"something_new","sessionID":"s1"}\n'
        b'{"type":"session_complete","sessionID":"s1","durationMs":1,"error":null}\n'
    )
    assert decode("aictrl-ndjson", data) == [SessionEvent("s1")]


# --------------------------------------------------------------------------- through profiles/clis/aictrl.yaml


@pytest.fixture
def aictrl_on_path(tmp_path, monkeypatch) -> Path:
    return install_fake_clis(tmp_path, monkeypatch)


async def test_the_profile_runs_a_turn_and_resumes_its_session(aictrl_on_path):
    profile = bridge.load_profile(CLI_PROFILES / "aictrl.yaml")
    seen: list[object] = []
    with trio.fail_after(TURN_DEADLINE):
        first = await bridge.run_turn(profile, Turn("-v run a tool"), on_event=seen.append)
        second = await bridge.run_turn(profile, Turn("again", session_id=first.session_id))
    assert (first.exit_code, first.outcome) == (0, "ok"), first.error_reply
    assert first.session_id.startswith("ses_")
    assert first.reply == f'turn 1 of {first.session_id}: you said: "-v run a tool"'  # aictrl quotes spaced words
    assert [event.status for event in seen if isinstance(event, ActivityEvent)] == ["allowed", "completed"]
    assert first.usage == Usage(
        input_tokens=220,
        output_tokens=40,
        cached_input_tokens=20,
        reasoning_tokens=0,
        total_tokens=260,
        cost_usd=pytest.approx(0.002),
    )
    assert (second.exit_code, second.session_id) == (0, first.session_id)
    assert second.reply.endswith('last time you said: "-v run a tool"')


async def test_the_profile_turns_aictrls_errors_into_the_turns_error(aictrl_on_path):
    profile = bridge.load_profile(CLI_PROFILES / "aictrl.yaml")
    with trio.fail_after(TURN_DEADLINE):
        failed = await bridge.run_turn(profile, Turn("please fail"))
        crashed = await bridge.run_turn(profile, Turn("crash now"))
        unknown = await bridge.run_turn(profile, Turn("hi", session_id="ses_nobody"))
    assert (failed.exit_code, failed.outcome, failed.reply) == (1, "agent_error", "")
    assert failed.error_reply == "Incorrect API key provided"
    assert (crashed.exit_code, crashed.outcome, crashed.reply) == (1, "agent_error", "")  # aictrl exited 0
    assert crashed.error == "aictrl ended without finishing its turn (no session_complete event)"
    assert unknown.exit_code == 1
    assert unknown.error == "Invocation failed during session (INVOCATION_SESSION_CREATE_FAILED)"
