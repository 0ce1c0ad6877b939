"""What coding agents' JSON streams have in common: tool titles, output excerpts, plans, text in pieces. Pure.

Coding agents name their tools differently (`Bash`, `run_shell_command`,
`shellToolCall`) but put the same things in their inputs: the command, the
file, the pattern, the URL. One rule for all of them gives every family the
same status line. Their text comes in pieces, interrupted by tool calls;
`Paragraphs` shows it live and keeps it for the reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import shorten
from .events import PartialEvent, PlanStep

# The input fields that say what a call does, most telling first.
_TITLE_KEYS = ("command", "cmd", "file_path", "absolute_path", "notebook_path", "path", "dir_path",
               "directory", "pattern", "globPattern", "url", "query", "description", "prompt")
TITLE_CHARS = 120
OUTPUT_CHARS = 300
_PLAN_STATUSES = {"pending": "pending", "in_progress": "in_progress", "completed": "completed",
                  "cancelled": "completed"}
# A reply is never held beyond 8 MiB characters (bridge.result.HARD_REPLY_LIMIT); one more is
# kept so the recorder still sees it must cut. Bounds a dialect's memory whatever the agent writes.
TEXT_BOUND = 8 * 1024 * 1024 + 1


def tool_title(arguments: Any) -> str:
    """A short title for a call with these arguments ("ls -la", "src/app.py"), or "" when none says much."""
    if not isinstance(arguments, Mapping):
        return ""
    for key in _TITLE_KEYS:
        value = arguments.get(key)
        if isinstance(value, str) and value.strip():
            return shorten(value, TITLE_CHARS)
    return ""


def output_excerpt(output: Any) -> str:
    """The start of a tool's output on one line: a string, or the text of a list of content blocks."""
    if isinstance(output, list):
        output = " ".join(block["text"] for block in output
                          if isinstance(block, Mapping) and isinstance(block.get("text"), str))
    return shorten(output, OUTPUT_CHARS) if isinstance(output, str) else ""


def plan_of(arguments: Any) -> tuple[PlanStep, ...]:
    """The steps of a to-do tool's input (`{"todos": [{"content" or "description", "status"}]}`), else ()."""
    todos = arguments.get("todos") if isinstance(arguments, Mapping) else None
    if not isinstance(todos, list):
        return ()
    steps = []
    for todo in todos:
        if not isinstance(todo, Mapping):
            continue
        text = todo.get("content")
        if not isinstance(text, str):
            text = todo.get("description")
        status = todo.get("status")
        if isinstance(text, str) and text.strip():
            steps.append(PlanStep(shorten(text, TITLE_CHARS),
                                  _PLAN_STATUSES.get(status, "pending") if isinstance(status, str) else "pending"))
    return tuple(steps)


class Paragraphs:
    """An agent's text as it shows it in pieces: each piece a partial, a blank line where the text resumes
    after a tool call (so "Let me look." and "Found it." do not run together), and, with `keep`, the whole
    text for the reply (bounded by `TEXT_BOUND`)."""

    __slots__ = ("_keep", "_pieces", "_length", "_shown", "_paused")

    def __init__(self, *, keep: bool) -> None:
        self._keep = keep
        self._pieces: list[str] = []
        self._length = 0
        self._shown = False
        self._paused = False

    def add(self, text: str) -> PartialEvent:
        if self._paused and self._shown:
            text = "\n\n" + text
        self._paused = False
        self._shown = True
        if self._keep and self._length < TEXT_BOUND:
            kept = text[:TEXT_BOUND - self._length]
            self._pieces.append(kept)
            self._length += len(kept)
        return PartialEvent(text)

    def pause(self) -> None:
        """The agent did something else (a tool call): the next piece starts a new paragraph."""
        self._paused = True

    @property
    def text(self) -> str:
        """Everything added so far (with `keep`)."""
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""
