"""What coding agents' JSON streams have in common: sessions, tool calls, plans, text in pieces, usage. Pure.

Coding agents name their tools differently (`Bash`, `run_shell_command`,
`shellToolCall`) but put the same things in their inputs: the command, the
file, the pattern, the URL. One rule for all of them (`tool_title`)
gives every family the same status line, and one tracker (`ToolCalls`, with
one bound) remembers the calls in flight for every family. Their text comes in
pieces, interrupted by tool calls; `Paragraphs`, the one joiner every family
uses, shows it live and keeps it for the reply.

One `Usage` means the same thing whichever agent reported it:

- `input_tokens` counts every prompt token, cached or not (fresh input + cache
  reads + cache writes); `cached_input_tokens` is the cache reads among them.
- `output_tokens` counts every generated token; `reasoning_tokens` is the
  reasoning among them.
- `total_tokens` is the agent's own total when it gives one, else input + output.

Families that report disjoint buckets are folded into these (`token_usage`).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ..turn import Attachment
from .agentproc01 import session_id_problem
from .base import number, shorten
from .events import ActivityEvent, Event, PartialEvent, PlanStep, ProtocolWarning, SessionEvent, Usage

# The input fields that say what a call does, most telling first.
_TITLE_KEYS = (
    "command",
    "cmd",
    "file_path",
    "filePath",
    "absolute_path",
    "notebook_path",
    "path",
    "dir_path",
    "directory",
    "pattern",
    "globPattern",
    "url",
    "query",
    "description",
    "prompt",
)
TITLE_CHARS = 120
"""A tool call's title on a status line."""
OUTPUT_CHARS = 300
"""How much of a tool's output an activity event carries."""
THINKING_CHARS = 2000
"""How much of one block of reasoning an activity event carries (a status line, not a transcript)."""
INLINE_IMAGE_BYTES = 5 * 1024 * 1024
"""The largest image a family sends in its messages as base64 (Anthropic's limit for one image); a larger one is
named by its path, for the agent to read."""
MODEL_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image types model APIs take inline (Anthropic, OpenAI and Gemini all take these four)."""


def model_image(attachment: Attachment, media_types: Collection[str] = MODEL_IMAGE_TYPES) -> bool:
    """Whether `attachment` is a fetched image of one of `media_types`: one a family hands over as an image."""
    return attachment.type == "image" and bool(attachment.path) and attachment.media_type in media_types


def image_data(attachment: Attachment, media_types: Collection[str] = MODEL_IMAGE_TYPES) -> str | None:
    """A fetched image's bytes as base64, for a family whose messages carry images; None when it is not a fetched
    image of one of `media_types`, is over `INLINE_IMAGE_BYTES`, or cannot be read (then it is named by path).

    The one file a dialect reads: the bridge's own copy, fetched, checked and bounded before the agent started, so
    reading it is as predictable as the bytes of the turn itself.
    """
    if not model_image(attachment, media_types):
        return None
    try:
        with open(attachment.path, "rb") as file:
            data = file.read(INLINE_IMAGE_BYTES + 1)
    except OSError:
        return None
    return base64.b64encode(data).decode("ascii") if len(data) <= INLINE_IMAGE_BYTES else None


_PLAN_STATUSES = {
    "pending": "pending",
    "in_progress": "in_progress",
    "completed": "completed",
    "cancelled": "completed",
}
# A reply is never held beyond 8 MiB characters (bridge.engine.result.HARD_REPLY_LIMIT); one more is
# kept so the recorder still sees it must cut. Bounds a dialect's memory whatever the agent writes.
TEXT_BOUND = 8 * 1024 * 1024 + 1
OPEN_CALLS = 10_000
"""Tool calls a dialect remembers at once, until each ends; more than any agent keeps in flight."""
CALL_ID_CHARS = 256
"""A call id longer than this (real ones are tens of characters) is not remembered: with `OPEN_CALLS`, what a
dialect keeps of calls in flight stays a few MiB whatever an agent sends."""
PLAN_STEPS = 200
"""The steps of a plan that are shown (a status line, not a project tracker)."""
UNFINISHED = "the agent ended without finishing its turn (its output has no result line)"


def tool_title(arguments: Any, *, or_json: bool = False, limit: int | None = TITLE_CHARS) -> str:
    """A short title for a call with these arguments ("ls -la", "src/app.py"), or "" when none says much.

    `arguments` may be an object or the JSON text of one (OpenAI-style tool calls); a command given as a
    list of words is joined. With `or_json`, arguments with none of the telling fields are shown as JSON.
    `limit=None`: the field whole and as written, for a person asked to allow the call.
    """
    cut: Callable[[str], str] = (lambda text: text) if limit is None else (lambda text: shorten(text, limit))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return ""
    if not isinstance(arguments, dict):
        return ""
    for key in _TITLE_KEYS:
        value = arguments.get(key)
        if isinstance(value, list) and value and all(isinstance(word, str) for word in value):
            value = " ".join(value)
        if isinstance(value, str) and value.strip():
            return cut(value)
    if or_json and arguments:
        return cut(json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), default=str))
    return ""


def output_excerpt(output: Any) -> str:
    """The start of a tool's output on one line: a string, or the text of a list of content blocks."""
    if isinstance(output, list):
        output = " ".join(
            block["text"] for block in output if isinstance(block, dict) and isinstance(block.get("text"), str)
        )
    return shorten(output, OUTPUT_CHARS) if isinstance(output, str) else ""


def plan_of(arguments: Any) -> tuple[PlanStep, ...]:
    """The steps of a to-do tool's input (`{"todos": [{"content" or "description", "status"}]}`), else ()."""
    todos = arguments.get("todos") if isinstance(arguments, dict) else None
    if not isinstance(todos, list):
        return ()
    steps: list[PlanStep] = []
    for todo in todos:
        if len(steps) == PLAN_STEPS:
            break
        if not isinstance(todo, dict):
            continue
        text = todo.get("content")
        if not isinstance(text, str):
            text = todo.get("description")
        status = todo.get("status")
        if isinstance(text, str) and text.strip():
            steps.append(
                PlanStep(
                    shorten(text, TITLE_CHARS),
                    _PLAN_STATUSES.get(status, "pending") if isinstance(status, str) else "pending",
                )
            )
    return tuple(steps)


class FirstSession:
    """The turn's session id: the first valid one an agent names (sub-agents' ids come later and are not ours)."""

    __slots__ = ("session_id", "refused")

    def __init__(self) -> None:
        self.session_id = ""
        self.refused = ""  # the last invalid id, warned about once (some CLIs repeat the id on every line)

    def see(self, value: Any) -> list[Event]:
        """The event for `value` when it is the first valid id; nothing for a repeat, a later id or no id."""
        if self.session_id or not isinstance(value, str) or not value or value == self.refused:
            return []
        problem = session_id_problem(value)
        if problem is not None:
            self.refused = value
            return [ProtocolWarning(f"ignored a session id because {problem}")]
        self.session_id = value
        return [SessionEvent(value)]


def token_usage(
    *,
    fresh_input: Any = None,
    cache_read: Any = None,
    cache_write: Any = None,
    output: Any = None,
    reasoning: Any = None,
    total: Any = None,
    cost: Any = None,
) -> Usage | None:
    """`Usage` from disjoint input buckets and an output count that already includes reasoning.

    Values that are not whole numbers (or, for `cost`, numbers) count as not
    reported; None when nothing was.
    """
    fresh, read, write = number(fresh_input), number(cache_read), number(cache_write)
    inputs = [count for count in (fresh, read, write) if count is not None]
    input_tokens = sum(inputs) if inputs else None
    output_tokens = number(output)
    total_tokens = number(total)
    if total_tokens is None and input_tokens is not None and output_tokens is not None:
        total_tokens = input_tokens + output_tokens
    usage = Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=read,
        reasoning_tokens=number(reasoning),
        total_tokens=total_tokens,
        cost_usd=money(cost),
    )
    return usage if usage != Usage() else None


def money(value: Any) -> float | None:
    """A cost in dollars from an agent's JSON: a finite number, or an object of numbers to add up (`{"input": …}`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        try:
            amount = float(value)
        except OverflowError:  # an integer beyond any float
            return None
        return amount if math.isfinite(amount) else None
    if isinstance(value, dict):
        parts = [money(item) for item in value.values()]
        known = [part for part in parts if part is not None]
        return sum(known) if known else None
    return None


def add(*counts: Any) -> int | None:
    """The sum of the whole numbers among `counts`; None when there are none."""
    known = [count for count in map(number, counts) if count is not None]
    return sum(known) if known else None


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


@dataclass(slots=True)
class ToolCall:
    """What a dialect remembers of a tool call in flight (never its arguments: they may be megabytes).

    Not frozen: a later update of the call may name it better (ACP), or the bridge's answer to it arrives (aionrs).
    """

    tool: str
    title: str = ""
    kind: str = ""
    plan: tuple[PlanStep, ...] = ()
    allowed: bool | None = None  # the bridge's answer, for a call the agent asked about (None: not yet)


class ToolCalls:
    """The one tracker of tool calls for every family: calls by id, bounded by `OPEN_CALLS` and `CALL_ID_CHARS`.

    `remember`, `get` and `forget` are the memory; `started` and `ended` make the usual activity events with it:
    each start is activity (and a plan, for a to-do tool); its end carries the name and title of its start.
    """

    __slots__ = ("_calls",)

    def __init__(self) -> None:
        self._calls: dict[str, ToolCall] = {}

    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._calls

    def values(self) -> list[ToolCall]:
        return list(self._calls.values())

    def items(self) -> list[tuple[str, ToolCall]]:
        return list(self._calls.items())

    def clear(self) -> None:
        self._calls.clear()

    def remember(self, call_id: str, call: ToolCall) -> bool:
        """Keep `call` under `call_id` (its tool name shortened); False when the bound leaves no room for it."""
        if (
            not call_id
            or len(call_id) > CALL_ID_CHARS
            or (call_id not in self._calls and len(self._calls) >= OPEN_CALLS)
        ):
            return False
        call.tool = shorten(call.tool, TITLE_CHARS)
        self._calls[call_id] = call
        return True

    def get(self, call_id: str) -> ToolCall | None:
        return self._calls.get(call_id)

    def forget(self, call_id: str) -> ToolCall | None:
        """The call, no longer remembered (None when it was not)."""
        return self._calls.pop(call_id, None)

    def started(self, tool: str, arguments: Any, call_id: str) -> list[Event]:
        return self.started_as(tool, tool_title(arguments), plan_of(arguments), call_id)

    def started_as(self, tool: str, title: str, plan: tuple[PlanStep, ...], call_id: str) -> list[Event]:
        """A call's start, described already (its title and, for a to-do tool, its plan)."""
        self.remember(call_id, ToolCall(tool, title))
        events: list[Event] = [ActivityEvent("tool", tool=tool, title=title, status="started", call_id=call_id)]
        if plan:
            events.append(ActivityEvent("plan", plan=plan))
        return events

    def ended(
        self, call_id: str, *, failed: bool, output: Any = None, tool: str = "", arguments: Any = None, title: str = ""
    ) -> ActivityEvent:
        """The end of a call; `tool` and `title` (or `arguments`) stand in when its start was not seen."""
        started = self.forget(call_id)
        if started is not None:
            tool, title = started.tool, started.title
        else:
            title = title or tool_title(arguments)
        return ActivityEvent(
            "tool",
            tool=tool,
            title=title,
            status="failed" if failed else "completed",
            call_id=call_id,
            text=output_excerpt(output),
        )


class Paragraphs:
    """An agent's text as it shows it in pieces: each piece a partial, a blank line where the text resumes
    after a tool call (so "Let me look." and "Found it." do not run together), and, with `keep`, the whole
    text for the reply (bounded by `TEXT_BOUND`)."""

    __slots__ = ("_room", "_pieces", "_length", "_shown", "_paused")

    def __init__(self, *, keep: bool) -> None:
        self._room = TEXT_BOUND if keep else 0  # how much text is kept
        self._pieces: list[str] = []
        self._length = 0
        self._shown = False
        self._paused = False

    def add(self, text: str) -> PartialEvent:
        if self._paused:
            self._paused = False
            if self._shown:
                text = "\n\n" + text
        self._shown = True
        room = self._room - self._length
        if room > 0:
            kept = text if len(text) <= room else text[:room]
            self._pieces.append(kept)
            self._length += len(kept)
        return PartialEvent(text)

    def pause(self) -> None:
        """The agent did something else (a tool call, a new message): the next piece starts a new paragraph."""
        self._paused = True

    @property
    def text(self) -> str:
        """Everything added so far (with `keep`)."""
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""
