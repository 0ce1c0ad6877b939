"""What coding agents' JSON streams have in common: sessions, tool calls, plans, text in pieces. Pure.

Coding agents name their tools differently (`Bash`, `run_shell_command`,
`shellToolCall`) but put the same things in their inputs: the command, the
file, the pattern, the URL. One rule for all of them (`ToolCalls`) gives
every family the same status line. Their text comes in pieces, interrupted
by tool calls; `Paragraphs` shows it live and keeps it for the reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .agentproc01 import session_id_problem
from .base import shorten
from .events import ActivityEvent, Event, PartialEvent, PlanStep, ProtocolWarning, SessionEvent

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
_OPEN_CALLS = 10_000  # calls remembered until they end; more than any agent keeps in flight
UNFINISHED = "the agent ended without finishing its turn (its output has no result line)"


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


class SessionIds:
    """The session ids an agent names: each distinct valid one is reported once, an invalid one is a warning."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current = ""

    def report(self, session_id: Any) -> list[Event]:
        if not isinstance(session_id, str) or session_id == self.current:
            return []
        problem = session_id_problem(session_id)
        if problem is not None:
            return [ProtocolWarning(f"ignored a session id because {problem}")]
        self.current = session_id
        return [SessionEvent(session_id)]


class ToolCalls:
    """Tool calls in flight: each start is activity (and a plan, for a to-do tool); its end carries the name
    and title of its start."""

    __slots__ = ("_open",)

    def __init__(self) -> None:
        self._open: dict[str, tuple[str, str]] = {}  # call id → (tool, title)

    def started(self, tool: str, arguments: Any, call_id: str) -> list[Event]:
        title = tool_title(arguments)
        if call_id and len(self._open) < _OPEN_CALLS:
            self._open[call_id] = (tool, title)
        events: list[Event] = [ActivityEvent("tool", tool=tool, title=title, status="started", call_id=call_id)]
        if plan := plan_of(arguments):
            events.append(ActivityEvent("plan", plan=plan))
        return events

    def ended(self, call_id: str, *, failed: bool, output: Any = None, tool: str = "", arguments: Any = None
              ) -> ActivityEvent:
        """The end of a call; `tool` and `arguments` stand in when its start was not seen."""
        known_tool, title = self._open.pop(call_id, (tool, tool_title(arguments)))
        return ActivityEvent("tool", tool=known_tool, title=title, status="failed" if failed else "completed",
                             call_id=call_id, text=output_excerpt(output))


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
