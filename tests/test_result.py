"""The pure turn rules and result builder (docs/protocol.md §3–§5)."""

from __future__ import annotations

import pytest
from conftest import RESULT_FIELDS

from bridge import Outcome, Profile
from bridge.dialects import BodyLine, ErrorEvent, LineCut, PartialEvent, ProtocolWarning, SessionEvent
from bridge.engine.result import HARD_REPLY_LIMIT, Ending, TurnRecorder

SUFFIX = "…cut"


def recorder(**fields: object) -> TurnRecorder:
    return TurnRecorder(Profile.from_mapping({"command": "agent", "truncation_suffix": SUFFIX, **fields}))


def feed(turn: TurnRecorder, *events: object) -> list[object]:
    """What the host is sent: the recorder's output without the warnings (which are logged)."""
    return [event for event in turn.record(list(events)) if not isinstance(event, ProtocolWarning)]  # type: ignore[arg-type]


def test_success_joins_body_lines() -> None:
    turn = recorder()
    assert feed(turn, BodyLine("one"), BodyLine(""), BodyLine("three")) == []
    result = turn.finish(Ending(returncode=0), duration_ms=12)
    assert (result.reply, result.exit_code, result.outcome, result.ok, result.duration_ms) == (
        "one\n\nthree",
        0,
        Outcome.OK,
        True,
        12,
    )
    assert result.error_reply == "" and not result.truncated and not result.timed_out


def test_partials_sessions_and_errors_are_forwarded_in_order() -> None:
    turn = recorder()
    events = [SessionEvent("a"), PartialEvent("x"), ErrorEvent("bad"), SessionEvent("b"), ErrorEvent("worse")]
    assert feed(turn, *events) == [
        SessionEvent("a"),
        PartialEvent("x"),
        ErrorEvent("bad"),
        SessionEvent("b"),
        ErrorEvent("worse"),
    ]
    result = turn.finish(Ending(returncode=0))
    assert (result.session_id, result.error, result.partials) == ("b", "worse", 1)


def test_no_partial_is_forwarded_after_an_error() -> None:
    turn = recorder()
    assert feed(turn, PartialEvent("before"), ErrorEvent("e"), PartialEvent("after")) == [
        PartialEvent("before"),
        ErrorEvent("e"),
    ]


def test_streaming_off_ignores_partials() -> None:
    turn = recorder(streaming=False)
    assert feed(turn, PartialEvent("x"), SessionEvent("s")) == [SessionEvent("s")]
    assert turn.finish(Ending(returncode=0)).partials == 0


def test_warnings_are_passed_on_in_order_to_be_logged() -> None:
    warning = ProtocolWarning("odd")
    assert recorder().record([PartialEvent("a"), warning, "body"]) == [PartialEvent("a"), warning]


@pytest.mark.parametrize(
    ("ending", "code", "outcome"),
    [
        (Ending(returncode=0), 1, Outcome.AGENT_ERROR),
        (Ending(returncode=7), 7, Outcome.AGENT_ERROR),
        (Ending(returncode=-9), 137, Outcome.AGENT_ERROR),
        (Ending(returncode=0, cancelled=True), 130, Outcome.CANCELLED),
        (Ending(returncode=-15, timeout="wall", cancelled=True), 124, Outcome.TIMEOUT),
        (Ending(returncode=-9, timeout="wall", unread=70 << 20), 124, Outcome.TIMEOUT),
        (Ending(returncode=-9, cancelled=True, unread=70 << 20), 130, Outcome.CANCELLED),
    ],
)
def test_error_precedence(ending: Ending, code: int, outcome: Outcome) -> None:
    turn = recorder()
    feed(turn, BodyLine("discarded"), ErrorEvent("Rate limited."))
    result = turn.finish(ending)
    assert (result.exit_code, result.outcome, result.reply) == (code, outcome, "")
    assert result.error == "Rate limited." and result.error_reply == "Rate limited."


def test_an_agent_killed_for_not_reading_fails_with_the_bridges_reason_not_its_own_error() -> None:
    turn = recorder()
    feed(turn, BodyLine("discarded"), ErrorEvent("Rate limited."))
    result = turn.finish(Ending(returncode=-9, unread=65 << 20))
    assert (result.exit_code, result.outcome, result.reply) == (1, Outcome.NOT_READING, "")
    assert result.error.startswith("the agent stopped reading its stdin (65.0 MiB written to it")
    assert result.error_reply == "The" + result.error[3:] + "."


@pytest.mark.parametrize(
    ("ending", "code", "outcome", "error_reply"),
    [
        (Ending(returncode=3), 3, Outcome.EXIT_NONZERO, "The agent exited with code 3."),
        (Ending(returncode=-9), 137, Outcome.EXIT_NONZERO, "The agent was killed by signal 9 (SIGKILL)."),
        (Ending(returncode=-15), 143, Outcome.EXIT_NONZERO, "The agent was killed by signal 15 (SIGTERM)."),
        (Ending(returncode=-2), 130, Outcome.EXIT_NONZERO, "The agent was killed by signal 2 (SIGINT)."),
        (Ending(returncode=0, timeout="wall"), 124, Outcome.TIMEOUT, "The agent timed out after 600 s."),
        (
            Ending(returncode=-9, timeout="idle"),
            124,
            Outcome.TIMEOUT,
            "The agent timed out after 0.25 s without output.",
        ),
        (Ending(returncode=-2, cancelled=True), 130, Outcome.CANCELLED, "The agent was cancelled."),
        (
            Ending(spawn_failure=(127, "command 'x' not found on PATH")),
            127,
            Outcome.SPAWN_FAILED,
            "The agent could not be started: command 'x' not found on PATH.",
        ),
        (
            Ending(returncode=-9, unread=70 << 20),
            1,
            Outcome.NOT_READING,
            "The agent stopped reading its stdin (70.0 MiB "
            "written to it would have waited unread, over the bridge's limit), so it was killed.",
        ),
    ],
)
def test_failures_and_their_generic_messages(ending: Ending, code: int, outcome: Outcome, error_reply: str) -> None:
    turn = recorder(timeout_secs=600, idle_timeout_secs=0.25)
    feed(turn, BodyLine("discarded"), PartialEvent("kept"))
    result = turn.finish(ending)
    assert (result.exit_code, result.outcome, result.error_reply, result.reply) == (code, outcome, error_reply, "")
    assert result.timed_out == (outcome is Outcome.TIMEOUT)
    assert result.partials == 1  # forwarded partials are never retracted


def test_agent_own_exit_code_124_is_not_a_timeout() -> None:
    result = recorder().finish(Ending(returncode=124))
    assert (result.exit_code, result.outcome, result.timed_out) == (124, Outcome.EXIT_NONZERO, False)


def test_empty_error_text_falls_back_to_the_generic_message() -> None:
    turn = recorder()
    feed(turn, ErrorEvent(""))
    assert turn.finish(Ending(returncode=0)).error_reply == "The agent reported an error."


def test_send_error_reply_false() -> None:
    turn = recorder(send_error_reply=False)
    feed(turn, ErrorEvent("bad"))
    result = turn.finish(Ending(returncode=0))
    assert (result.error, result.error_reply, result.exit_code) == ("bad", "", 1)


def test_body_is_cut_at_the_cap_with_the_suffix_once() -> None:
    turn = recorder(max_reply_chars=10)
    feed(turn, BodyLine("12345"), BodyLine("67890"), BodyLine("more"), BodyLine("and more"))
    result = turn.finish(Ending(returncode=0))
    assert (result.reply, result.truncated) == ("12345\n6789" + SUFFIX, True)


def test_body_exactly_at_the_cap_is_not_truncated() -> None:
    turn = recorder(max_reply_chars=11)
    feed(turn, BodyLine("12345"), BodyLine("67890"))
    result = turn.finish(Ending(returncode=0))
    assert (result.reply, result.truncated) == ("12345\n67890", False)


def test_partials_are_capped_cumulatively() -> None:
    turn = recorder(max_reply_chars=6)
    forwarded = feed(turn, PartialEvent("abc"), PartialEvent("def"), PartialEvent("g"), PartialEvent("h"))
    assert forwarded == [PartialEvent("abc"), PartialEvent("def"), PartialEvent(SUFFIX)]
    result = turn.finish(Ending(returncode=0))
    assert (result.partials, result.truncated) == (3, True)

    turn = recorder(max_reply_chars=5)
    assert feed(turn, PartialEvent("abc"), PartialEvent("defgh"), PartialEvent("i")) == [
        PartialEvent("abc"),
        PartialEvent("de" + SUFFIX),
    ]


def test_no_cap_still_bounds_the_body_in_memory() -> None:
    turn = recorder(max_reply_chars=None)
    line = "x" * (1024 * 1024)
    feed(turn, *[BodyLine(line)] * 7)
    assert turn.finish(Ending(returncode=0)).reply == "\n".join([line] * 7)
    feed(turn, *[BodyLine(line)] * 10)
    result = turn.finish(Ending(returncode=0))
    assert result.truncated and len(result.reply) == HARD_REPLY_LIMIT + len(SUFFIX)
    forwarded = feed(recorder(max_reply_chars=None), *[PartialEvent(line)] * 20)
    assert forwarded == [PartialEvent(line)] * 20


def test_error_reply_respects_the_cap() -> None:
    turn = recorder(max_reply_chars=4)
    feed(turn, ErrorEvent("a long explanation"))
    assert turn.finish(Ending(returncode=1)).error_reply == "a lo" + SUFFIX


def test_stderr_is_appended_to_what_the_user_is_sent_only_when_asked() -> None:
    turn = recorder(include_stderr_in_reply=True)
    feed(turn, BodyLine("answer"))
    assert turn.finish(Ending(returncode=0), stderr_tail="warn").reply == "answer\n\n[stderr]\nwarn"
    assert turn.finish(Ending(returncode=2), stderr_tail="trace").error_reply == (
        "The agent exited with code 2.\n\n[stderr]\ntrace"
    )
    plain = recorder()
    feed(plain, BodyLine("answer"))
    result = plain.finish(Ending(returncode=0), stderr_tail="warn")
    assert (result.reply, result.stderr_tail) == ("answer", "warn")


def test_result_to_dict_has_every_field_of_the_spec() -> None:
    record = recorder().finish(Ending(returncode=0)).to_dict()
    assert set(record) == RESULT_FIELDS
    assert record["outcome"] == "ok" and record["usage"] is None and record["files"] == []


def test_a_cut_line_marks_the_result_truncated_without_a_suffix() -> None:
    turn = recorder(max_reply_chars=None)
    feed(turn, LineCut("a line was cut"), BodyLine("first MiB"))
    result = turn.finish(Ending(returncode=0))
    assert (result.reply, result.truncated) == ("first MiB", True)


def test_a_body_of_many_lines_is_joined_exactly_whatever_the_batches() -> None:
    lines = ["", "a", "", *[f"line {i}" for i in range(5000)], ""]
    for batch in (1, 7, 1000, 3000, len(lines)):
        turn = recorder(max_reply_chars=None)
        for start in range(0, len(lines), batch):
            turn.record(lines[start : start + batch])
        assert turn.finish(Ending(returncode=0)).reply == "\n".join(lines)
    capped = recorder(max_reply_chars=20_000)
    for start in range(0, len(lines), 999):
        capped.record(lines[start : start + 999])
    result = capped.finish(Ending(returncode=0))
    assert result.reply == "\n".join(lines)[:20_000] + SUFFIX and result.truncated


def test_an_unfinished_stream_fails_a_turn_that_ended_on_its_own_but_never_hides_a_timeout_or_a_cancel() -> None:
    unfinished = ErrorEvent("the agent ended without finishing its turn", unfinished=True)
    turn = recorder()
    assert feed(turn, PartialEvent("half"), unfinished) == [PartialEvent("half")]  # not shown as the agent's error
    result = turn.finish(Ending(returncode=0))
    assert (result.outcome, result.exit_code, result.error) == ("agent_error", 1, unfinished.text)
    assert result.error_reply == unfinished.text
    for ending, outcome, code, reply in (
        (Ending(returncode=-15, timeout="wall"), "timeout", 124, "timed out"),
        (Ending(returncode=-2, cancelled=True), "cancelled", 130, "cancelled"),
    ):
        turn = recorder()
        feed(turn, unfinished)
        result = turn.finish(ending)
        assert (result.outcome, result.exit_code, result.error) == (outcome, code, "")
        assert reply in result.error_reply
    turn = recorder()
    feed(turn, ErrorEvent("the agent's own words"), unfinished)
    assert turn.finish(Ending(returncode=0)).error == "the agent's own words"  # the agent's error wins


def test_a_failed_turn_names_the_credentials_its_environment_held_back_and_only_their_names() -> None:
    profile = Profile.from_mapping({"command": "agent"})  # env_inherit: minimal
    environ = {"PATH": "/bin", "ANTHROPIC_API_KEY": "sk-secret", "GITHUB_TOKEN": "ghp-secret"}
    failed = TurnRecorder(profile, environ).finish(Ending(returncode=3))
    assert "ANTHROPIC_API_KEY" in failed.error and "GITHUB_TOKEN" in failed.error
    assert "secret" not in failed.error and "secret" not in failed.error_reply
    assert TurnRecorder(profile, environ).finish(Ending(returncode=0)).error == ""  # a turn that succeeded: no note
    assert "API_KEY" not in TurnRecorder(profile).finish(Ending(returncode=3)).error  # no environment given: none
    passed = Profile.from_mapping(
        {"command": "agent", "env": {"ANTHROPIC_API_KEY": "${ANTHROPIC_API_KEY}", "GITHUB_TOKEN": "${GITHUB_TOKEN}"}}
    )
    assert "API_KEY" not in TurnRecorder(passed, environ).finish(Ending(returncode=3)).error
