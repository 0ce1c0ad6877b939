"""`protocol: codex-exec`: OpenAI Codex CLI's `codex exec --json` event stream. Pure.

One JSON object per line (codex 0.169.0; `codex-rs/exec/src/exec_events.rs`):

- `thread.started {thread_id}` → the session (a resumed thread prints the same id);
- `item.completed` of an `agent_message {text}` → a partial, and the reply: the
  last agent message of the turn is the reply, as codex's own
  `--output-last-message` has it (a `plan` item's text only when there is none).
  codex streams no deltas in exec mode: each message arrives whole, and the
  partials of the second and later messages start with a blank line so the
  live text reads as paragraphs;
- `reasoning {text}` → thinking; `command_execution`, `file_change`,
  `mcp_tool_call`, `collab_tool_call`, `web_search` (`item.started` /
  `item.updated` / `item.completed`) → tool activity; `todo_list` → the plan;
- `turn.completed {usage}` → usage: codex reports the thread's running total
  (a resumed turn's count includes every earlier turn), not the turn's;
- `turn.failed {error}` → the turn's error. `error {message}` lines are notices:
  each retry ("Reconnecting... 2/5 (…)") is one, and the fatal one comes again
  in `turn.failed`, so an `error` line alone never fails the turn;
  `item.completed` of type `error` is a non-fatal warning (a config or model
  notice), logged;
- no `turn.completed` or `turn.failed` at the end of the stream (SIGINT, an
  interrupted turn, a crash) → the turn fails: codex ended without finishing it.

codex waits for end of file on stdin before it starts, even with the prompt in
argv, and appends whatever it reads there to the prompt: stdin is /dev/null.
A fetched image (PNG, JPEG, GIF or WebP: what codex decodes) goes to codex
as its own input, `--image=PATH` (one option per image, the `=` form so that
no later word is read as another image; before `resume`, whose turn it then
belongs to); any other fetched file is named in the prompt by its absolute
path, for codex to read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ..turn import Turn
from .agentproc01 import session_id_problem
from .base import DialectContext, Handler, Handover, JsonLinesDialect, number, shorten, text_of, with_files_named
from .coding_agents import OUTPUT_CHARS, THINKING_CHARS, Paragraphs, model_image
from .events import (
    ActivityEvent,
    ErrorEvent,
    Event,
    PlanStep,
    ProtocolWarning,
    ReplyEvent,
    SessionEvent,
    Usage,
    UsageEvent,
)

RETRY_NOTICE = "Reconnecting..."
# codex's item statuses → the activity statuses every host knows.
_STATUS = {"in_progress": "started", "completed": "completed", "failed": "failed", "declined": "denied"}
# `<shell> -lc <script>`, the script quoted as POSIX shells read it (codex joins the argv with shlex quoting).
# Matched rather than parsed with `shlex.split`, which costs ~50 µs a command; any other shape stays as it is.
_SHELL_WRAPPED = re.compile(
    r"""(?:\S*/)?(?:bash|sh|zsh|dash) -l?c (?:'([^']*)'|"((?:[^"\\]|\\.)*)"|([^\s'"\\]+))""", re.DOTALL
)
_ESCAPED = re.compile(r"\\([$`\"\\\n])")  # what a backslash escapes inside double quotes


ItemHandler = Callable[[Any, Mapping[str, Any], bool], list[Event]]


class CodexExec(JsonLinesDialect):
    """A turn of `codex exec --json` (see the module docstring for what maps to what)."""

    name = "codex-exec"
    __slots__ = ("_session_id", "_started", "_finished", "_text", "_messages", "_reply", "_plan_text", "_last_notice")

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        self._session_id = ""
        self._started = False  # thread.started was seen
        self._finished = False  # turn.completed or turn.failed was seen
        self._text = Paragraphs(keep=False)  # each message a paragraph
        self._messages = 0  # agent messages so far
        self._reply = ""  # the last agent message: the reply, given with turn.completed
        self._plan_text = ""  # the last `plan` item: the reply when there is no agent message
        self._last_notice = ""  # the last `error` line: said when the stream ends unfinished

    @classmethod
    def handover(cls, turn: Turn, context: DialectContext) -> Handover:
        images = tuple(f"--image={a.path}" for a in turn.attachments if model_image(a))
        others = [a for a in turn.attachments if not model_image(a)]
        return Handover(message=with_files_named(turn.message, others), options=images)

    def finish(self) -> list[Event]:
        if self._finished:
            return []
        if not self._started:
            text = (
                "codex ended before it started a thread; its stderr says why (an unknown session id, a usage "
                "error, a missing login or config)"
            )
        else:
            text = "codex ended without finishing its turn (no turn.completed or turn.failed)"
            if self._last_notice:
                text += f"; its last error: {self._last_notice}"
        return [ErrorEvent(text, unfinished=True)]

    # ------------------------------------------------------------------ top-level events

    def _thread_started(self, message: Mapping[str, Any]) -> list[Event]:
        self._started = True
        thread_id = text_of(message.get("thread_id"))
        if thread_id == self._session_id:
            return []
        if (problem := session_id_problem(thread_id)) is not None:
            return [ProtocolWarning(f"ignored codex's thread_id: {problem}")]
        self._session_id = thread_id
        return [SessionEvent(thread_id)]

    def _turn_completed(self, message: Mapping[str, Any]) -> list[Event]:
        self._finished = True
        events: list[Event] = []
        if self._messages or self._plan_text:
            events.append(ReplyEvent(self._reply if self._messages else self._plan_text))
        usage = message.get("usage")
        if isinstance(usage, dict):
            events.append(UsageEvent(_usage(usage)))
        return events

    def _turn_failed(self, message: Mapping[str, Any]) -> list[Event]:
        self._finished = True
        error = message.get("error")
        text = text_of(error.get("message")) if isinstance(error, dict) else ""
        return [ErrorEvent(text or self._last_notice or "codex reported that the turn failed")]

    def _error(self, message: Mapping[str, Any]) -> list[Event]:
        text = text_of(message.get("message"))
        if text:
            self._last_notice = text
        if text.startswith(RETRY_NOTICE):
            return [ProtocolWarning("codex is retrying a request to its model API")]
        return []

    def _item(self, message: Mapping[str, Any]) -> list[Event]:
        item = message.get("item")
        if not isinstance(item, dict):
            return []
        kind = item.get("type")
        mapper = self.items.get(kind) if type(kind) is str else None
        return mapper(self, item, message["type"] == "item.completed") if mapper is not None else []

    # ------------------------------------------------------------------ items

    def _agent_message(self, item: Mapping[str, Any], completed: bool) -> list[Event]:
        if not completed:
            return []
        text = self._reply = text_of(item.get("text"))
        self._messages += 1
        self._text.pause()
        return [self._text.add(text)] if text else []

    def _plan(self, item: Mapping[str, Any], completed: bool) -> list[Event]:
        if completed:
            self._plan_text = text_of(item.get("text"))
        return []

    def _reasoning(self, item: Mapping[str, Any], completed: bool) -> list[Event]:
        text = text_of(item.get("text"))
        return [ActivityEvent("thinking", text=shorten(text, THINKING_CHARS))] if completed and text else []

    def _command(self, item: Mapping[str, Any], completed: bool) -> list[Event]:
        text = ""
        exit_code = number(item.get("exit_code"))
        if exit_code is not None:
            output = shorten(text_of(item.get("aggregated_output")), OUTPUT_CHARS)
            text = f"exit code {exit_code}" + (f": {output}" if output else "")
        return [_tool(item, "command_execution", _command_title(text_of(item.get("command"))), text)]

    def _file_change(self, item: Mapping[str, Any], completed: bool) -> list[Event]:
        changes = item.get("changes")
        paths = [
            f"{text_of(change.get('kind'))} {text_of(change.get('path'))}".strip()
            for change in (changes if isinstance(changes, list) else ())
            if isinstance(change, dict)
        ]
        return [_tool(item, "file_change", shorten(", ".join(paths)))]

    def _mcp_call(self, item: Mapping[str, Any], completed: bool) -> list[Event]:
        name = ".".join(part for part in (text_of(item.get("server")), text_of(item.get("tool"))) if part)
        arguments = item.get("arguments")
        title = shorten(json.dumps(arguments, ensure_ascii=False)) if arguments not in (None, {}, []) else ""
        error = item.get("error")
        text = shorten(text_of(error.get("message")), OUTPUT_CHARS) if isinstance(error, dict) else ""
        return [_tool(item, name or "mcp_tool_call", title, text)]

    def _collab_call(self, item: Mapping[str, Any], completed: bool) -> list[Event]:
        return [_tool(item, "collab_tool_call", text_of(item.get("tool")))]

    def _web_search(self, item: Mapping[str, Any], completed: bool) -> list[Event]:
        action = item.get("action")
        title = text_of(item.get("query"))
        if not title and isinstance(action, dict):
            title = text_of(action.get("query")) or text_of(action.get("url"))
        return [
            ActivityEvent(
                "tool",
                tool="web_search",
                title=shorten(title),
                status="completed" if completed else "started",
                call_id=text_of(item.get("id")),
            )
        ]

    def _todo_list(self, item: Mapping[str, Any], completed: bool) -> list[Event]:
        entries = item.get("items")
        steps = tuple(
            PlanStep(text_of(entry.get("text")), "completed" if entry.get("completed") is True else "pending")
            for entry in (entries if isinstance(entries, list) else ())
            if isinstance(entry, dict)
        )
        return [ActivityEvent("plan", plan=steps)]

    def _warning(self, item: Mapping[str, Any], completed: bool) -> list[Event]:
        # codex's own notices (model metadata missing, a config or deprecation warning), never the model's text.
        return [ProtocolWarning(f"codex warned: {shorten(text_of(item.get('message')), 300)}")]

    handlers: ClassVar[Mapping[str, Handler]] = {
        "thread.started": _thread_started,
        "turn.completed": _turn_completed,
        "turn.failed": _turn_failed,
        "error": _error,
        "item.started": _item,
        "item.updated": _item,
        "item.completed": _item,
    }
    items: ClassVar[Mapping[str, ItemHandler]] = {
        "agent_message": _agent_message,
        "plan": _plan,
        "reasoning": _reasoning,
        "command_execution": _command,
        "file_change": _file_change,
        "mcp_tool_call": _mcp_call,
        "collab_tool_call": _collab_call,
        "web_search": _web_search,
        "todo_list": _todo_list,
        "error": _warning,
    }
    """An item's type → the method that maps it (given whether the item is completed)."""


def _tool(item: Mapping[str, Any], tool: str, title: str, text: str = "") -> ActivityEvent:
    status = text_of(item.get("status"))
    return ActivityEvent(
        "tool", tool=tool, title=title, status=_STATUS.get(status, status), text=text, call_id=text_of(item.get("id"))
    )


def _command_title(command: str) -> str:
    """The command the model asked for: codex reports it wrapped in its shell (`/bin/bash -lc 'echo hi'`)."""
    wrapped = _SHELL_WRAPPED.fullmatch(command)
    if wrapped is not None:
        single, double, bare = wrapped.groups()
        command = single if single is not None else _ESCAPED.sub(r"\1", double) if double is not None else bare
    return shorten(command)


def _usage(usage: Mapping[str, Any]) -> Usage:
    input_tokens, output_tokens = number(usage.get("input_tokens")), number(usage.get("output_tokens"))
    total = input_tokens + output_tokens if input_tokens is not None and output_tokens is not None else None
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_input_tokens=number(usage.get("cached_input_tokens")),
        reasoning_tokens=number(usage.get("reasoning_output_tokens")),
        total_tokens=total,
    )
