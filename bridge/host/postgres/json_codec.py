"""Turns, events and results as JSON, the way they travel through PostgreSQL's tables and notifications."""

from __future__ import annotations

from typing import Any

from ...dialects import ActivityEvent, PartialEvent, SessionEvent
from ...dialects.events import FileEvent, Option, PlanStep, Question, QuestionRequest, RequestWithdrawn, Usage
from ...engine.result import Outcome, TurnResult
from ...permissions import PermissionRequest
from ...turn import Attachment, Turn

RemoteEvent = PartialEvent | SessionEvent | ActivityEvent | PermissionRequest | QuestionRequest | RequestWithdrawn

WORKER_LOST_EXIT_CODE = 1
WORKER_LOST_REPLY = "The bridge lost the worker running this turn before it finished. Please send it again."


def turn_to_dict(turn: Turn) -> dict[str, Any]:
    return {
        "message": turn.message,
        "session_id": turn.session_id,
        "session_name": turn.session_name,
        "from_user": turn.from_user,
        "attachments": [item.to_dict() for item in turn.attachments],
    }


def turn_from_dict(record: dict[str, Any]) -> Turn:
    return Turn(
        message=record["message"],
        session_id=record["session_id"],
        session_name=record["session_name"],
        from_user=record["from_user"],
        attachments=tuple(Attachment(**item) for item in record["attachments"]),
    )


def event_to_dict(event: RemoteEvent) -> dict[str, Any]:
    return event.to_dict()


def event_from_dict(record: dict[str, Any]) -> RemoteEvent | None:
    """The event a worker notified; None for a kind this version does not know (a newer worker's)."""
    kind = record.get("event")
    if kind == "partial":
        return PartialEvent(record["text"])
    if kind == "session":
        return SessionEvent(record["session_id"])
    if kind == "activity":
        plan = tuple(PlanStep(step["text"], step["status"]) for step in record.get("plan", ()))
        return ActivityEvent(
            record["activity"],
            text=record.get("text", ""),
            tool=record.get("tool", ""),
            title=record.get("title", ""),
            status=record.get("status", ""),
            call_id=record.get("call_id", ""),
            plan=plan,
        )
    if kind == "permission":
        return PermissionRequest(
            record["request_id"],
            record["tool"],
            kind=record.get("kind", ""),
            title=record.get("title", ""),
            input=record.get("input", {}),
        )
    if kind == "question":
        return QuestionRequest(
            record["request_id"],
            tuple(
                Question(
                    asked["id"],
                    asked["prompt"],
                    tuple(Option(option["label"], option.get("description", "")) for option in asked["options"]),
                    multi_select=asked.get("multi_select", False),
                    free_text=asked.get("free_text", False),
                    header=asked.get("header", ""),
                )
                for asked in record["questions"]
            ),
            tool=record.get("tool", ""),
        )
    if kind == "withdrawn":
        return RequestWithdrawn(record["request_id"])
    return None


def result_from_dict(record: dict[str, Any]) -> TurnResult:
    usage = record.get("usage")
    return TurnResult(
        reply=record["reply"],
        session_id=record["session_id"],
        error=record["error"],
        error_reply=record["error_reply"],
        exit_code=record["exit_code"],
        timed_out=record["timed_out"],
        outcome=Outcome(record["outcome"]),
        stderr_tail=record["stderr_tail"],
        duration_ms=record["duration_ms"],
        partials=record["partials"],
        truncated=record["truncated"],
        usage=Usage(**usage) if usage is not None else None,
        folded_into=record.get("folded_into", ""),
        files=tuple(FileEvent(**file) for file in record.get("files", ())),
        files_note=record.get("files_note", ""),
    )


def worker_lost_result(duration_ms: int, why: str) -> dict[str, Any]:
    """The visible end of a turn whose worker was lost, when its profile says `on_worker_lost: fail`."""
    return TurnResult(
        reply="",
        session_id="",
        error=f"worker_lost: {why}",
        error_reply=WORKER_LOST_REPLY,
        exit_code=WORKER_LOST_EXIT_CODE,
        timed_out=False,
        outcome=Outcome.WORKER_LOST,
        stderr_tail="",
        duration_ms=duration_ms,
        partials=0,
        truncated=False,
    ).to_dict()
