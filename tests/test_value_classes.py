"""The value classes are frozen dataclasses (events slotted, not frozen): what callers rely on of them — construction, repr, equality, hashing,
immutability, copies and pickles, `match` — seen through their public behaviour."""

from __future__ import annotations

import copy
import pickle
from dataclasses import FrozenInstanceError, fields

import pytest

from bridge import Attachment, Decision, Outcome, PermissionRequest, PlanStep, Turn, TurnResult, Usage
from bridge.dialects import (
    AcpSettings,
    ActivityEvent,
    AnteSettings,
    JsonSettings,
    LineCut,
    PartialEvent,
    ProtocolWarning,
)


def result(**changes: object) -> TurnResult:
    values: dict[str, object] = dict(
        reply="hi",
        session_id="s",
        error="",
        error_reply="",
        exit_code=0,
        timed_out=False,
        outcome=Outcome.OK,
        stderr_tail="",
        duration_ms=3,
        partials=1,
        truncated=False,
    )
    return TurnResult(**{**values, **changes})  # type: ignore[arg-type]


def test_repr_names_every_field_in_order() -> None:
    assert repr(PartialEvent("x")) == "PartialEvent(text='x')"
    assert repr(Decision(False, message="no")) == "Decision(allow=False, always=False, message='no')"
    assert repr(LineCut("cut")) == "LineCut(message='cut')"
    assert repr(Turn("hi")) == (
        "Turn(message='hi', session_id='', session_name='default', from_user='', attachments=())"
    )


def test_fields_take_positions_and_keywords_and_defaults() -> None:
    assert PlanStep("a", "completed") == PlanStep(text="a", status="completed") != PlanStep("a")
    assert [field.name for field in fields(AnteSettings)][:2] == ["max_line_bytes", "model"]
    assert [field.name for field in fields(JsonSettings)] == ["max_line_bytes"]
    assert ActivityEvent("tool", tool="Read").to_dict() == {"event": "activity", "activity": "tool", "tool": "Read"}
    assert PermissionRequest("1", "Read").input == {}
    with pytest.raises(TypeError):
        PartialEvent()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Usage(nope=1)  # type: ignore[call-arg]


def test_equality_wants_the_same_class() -> None:
    assert LineCut("m") != ProtocolWarning("m") and ProtocolWarning("m") == ProtocolWarning("m")
    assert PartialEvent("x") != "x" and result() == result() and result() != result(reply="other")


def test_values_refuse_changes_and_hash_by_value() -> None:
    turn = Turn("hi")
    with pytest.raises(FrozenInstanceError, match="cannot assign to field 'message'"):
        turn.message = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del turn.message  # type: ignore[misc]
    assert hash(turn) == hash(Turn("hi")) and len({result(), result()}) == 1
    event = PartialEvent("x")  # events are slotted but not frozen (bridge/dialects/events.py says why)
    with pytest.raises(AttributeError):  # slots: no stray attributes
        object.__setattr__(event, "stray", 1)
    with pytest.raises(FrozenInstanceError):
        Usage(input_tokens=1).input_tokens = 2  # type: ignore[misc]


def test_copies_and_pickles_are_equal() -> None:
    turn = Turn("hi", attachments=(Attachment("image", "https://x/a.png"),))
    usage = Usage(input_tokens=3, cost_usd=0.5)
    for value in (turn, usage, result(usage=usage), PartialEvent("x"), AcpSettings(fs_read=True)):
        assert copy.copy(value) == value == pickle.loads(pickle.dumps(value)) == copy.deepcopy(value)


def test_match_takes_fields_by_position() -> None:
    match Decision(True, True):
        case Decision(allow, always):
            assert (allow, always) == (True, True)
        case _:
            pytest.fail("no match")


def test_turn_replace_checks_the_copy() -> None:
    turn = Turn("hi", session_name="work")
    assert turn.replace(session_id="s1") == Turn("hi", session_id="s1", session_name="work")
    with pytest.raises(ValueError, match="NUL"):
        turn.replace(message="a\0b")


def test_settings_still_refuse_values_out_of_range() -> None:
    with pytest.raises(ValueError, match="max_line_bytes"):
        AcpSettings(max_line_bytes=1)
    with pytest.raises(ValueError, match="thinking"):
        AnteSettings(thinking="Hard")
    assert AnteSettings(allowed_tools=["Read"]).allowed_tools == ("Read",)
