"""Claude Code's stream-json (`protocol: claude-stream-json`) as a sans-I/O dialect.

`claude -p --output-format stream-json --verbose [--include-partial-messages] -- MESSAGE`
writes one JSON object per line (checked against Claude Code 2.1.197 run here):

- `system`/`init` carries `session_id` (also on `result`): the id to resume with;
- with `--include-partial-messages`, `stream_event` lines carry the raw Messages
  API events: `text_delta`s are partials, `thinking_delta`s thinking activity.
  Each completed block then also comes as an `assistant` line, which is not
  shown again. A retried request streams afresh after a new `message_start`
  (or falls back to a whole message): what was shown stays shown, and the
  reply is `result.result` whatever the partials said;
- without it, each `assistant` text block is a partial;
- `tool_use` blocks are tool calls started (name, a title from the input), the
  `tool_result` blocks of the next `user` line end them (`is_error`: failed);
- `result` ends the turn: `result` is the reply, or, with `is_error`, the error
  (an API error keeps `subtype: success`; `error_*` subtypes carry `errors[]`);
  `usage` and `total_cost_usd` are the turn's usage;
- no `result` by the end of the output: the turn did not finish.

The same stream, with small differences, comes from the CLIs built like it:
qwen-code (its `result` errors carry `error.message`), codebuddy (its session
id may come on `result` only), and cursor's `agent`, whose tool calls are
`tool_call` lines, its thinking `thinking` lines, and which, with
`--stream-partial-output`, streams its text as `assistant` lines and then
repeats it whole (the `repeats_streamed_text` setting drops the repeats).
Lines from a subagent (`parent_tool_use_id` set) add tool activity, never text.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..turn import Turn
from .base import DialectContext, Handler, JsonLinesDialect, number, text_of
from .coding_agents import TEXT_BOUND, THINKING_CHARS, UNFINISHED, Paragraphs, SessionIds, ToolCalls
from .events import ActivityEvent, ErrorEvent, Event, ReplyEvent, Usage, UsageEvent
from .settings import ClaudeStreamSettings

APPEND_SYSTEM_PROMPT = "--append-system-prompt"


def with_system_prompt_appended(argv: Sequence[str], command_at: int, text: str) -> tuple[str, ...]:
    """Claude Code's command line `argv` (its program at `command_at`) with `text` added to its system prompt: after
    the text of the profile's own `--append-system-prompt` (the CLI takes the flag once), else in a flag of its own:
    right after `claude`, or after the words of another program (a wrapper script, a test double run by an
    interpreter, which would take a flag right after it as its own option), before any `--`."""
    words = list(argv)
    for index in range(command_at + 1, len(words)):
        word = words[index]
        if word == "--":
            break
        if word == APPEND_SYSTEM_PROMPT and index + 1 < len(words):
            words[index + 1] = f"{words[index + 1]}\n\n{text}"
            return tuple(words)
        if word.startswith(APPEND_SYSTEM_PROMPT + "="):
            words[index] = f"{word}\n\n{text}"
            return tuple(words)
    if is_claude_code(words, command_at):
        at = command_at + 1
    else:
        at = words.index("--", command_at + 1) if "--" in words[command_at + 1 :] else len(words)
    return (*words[:at], APPEND_SYSTEM_PROMPT, text, *words[at:])


def is_claude_code(argv: Sequence[str], command_at: int) -> bool:
    """The program is Claude Code's `claude` (another CLI speaking its stream-json, CodeBuddy's or Cursor's, may
    not take its flags)."""
    return command_at < len(argv) and posixpath.basename(argv[command_at]) == "claude"


class ClaudeStream(JsonLinesDialect):
    """One turn of a Claude Code-like agent (see the module docstring)."""

    name: ClassVar[str] = "claude-stream-json"
    Settings: ClassVar[type] = ClaudeStreamSettings
    __slots__ = (
        "_repeats",
        "_cache_in_input",
        "_sessions",
        "_text",
        "_streamed_text",
        "_streamed_thinking",
        "_tools",
        "_finished",
        "_segment",
        "_segment_length",
        "_said",
        "_said_length",
    )

    def __init__(self, context: DialectContext, turn: Turn) -> None:
        super().__init__(context, turn)
        settings = context.settings if isinstance(context.settings, ClaudeStreamSettings) else ClaudeStreamSettings()
        self._repeats = settings.repeats_streamed_text
        self._cache_in_input = False  # qwen counts cached tokens in input_tokens; Anthropic does not
        self._sessions = SessionIds()
        self._text = Paragraphs(keep=False)  # the reply is result.result
        self._streamed_text = False  # text deltas arrived since the last assistant text block
        self._streamed_thinking = False
        self._tools = ToolCalls()
        self._finished = False
        # repeats_streamed_text: what was shown since the last tool call, and in the whole turn
        self._segment: list[str] = []
        self._segment_length = 0
        self._said: list[str] = []
        self._said_length = 0

    def _system(self, message: Mapping[str, Any]) -> list[Event]:
        if message.get("subtype") != "init":
            return []
        self._cache_in_input = "qwen_code_version" in message
        return self._sessions.report(message.get("session_id"))

    def _cursor_thinking(self, message: Mapping[str, Any]) -> list[Event]:
        text = text_of(message.get("text"))
        return [ActivityEvent("thinking", text=text[:THINKING_CHARS])] if text else []

    def finish(self) -> list[Event]:
        return [] if self._finished else [ErrorEvent(UNFINISHED, unfinished=True)]

    # ----------------------------------------------------------------- lines

    def _stream_event(self, message: Mapping[str, Any]) -> list[Event]:
        event = message.get("event")
        if message.get("parent_tool_use_id") or not isinstance(event, dict):
            return []
        kind = event.get("type")
        handler = self.stream_events.get(kind) if type(kind) is str else None
        return handler(self, event) if handler is not None else []

    def _block_delta(self, event: Mapping[str, Any]) -> list[Event]:
        delta = event.get("delta")
        if not isinstance(delta, dict):
            return []
        if delta.get("type") == "text_delta" and (text := text_of(delta.get("text"))):
            self._streamed_text = True
            return [self._text.add(text)]
        if delta.get("type") == "thinking_delta" and (text := text_of(delta.get("thinking"))):
            self._streamed_thinking = True
            return [ActivityEvent("thinking", text=text[:THINKING_CHARS])]
        return []

    def _message_start(self, event: Mapping[str, Any]) -> list[Event]:
        # A new request (the next step, or a retry): deltas of an abandoned stream stand for nothing,
        # and a retry's text starts a paragraph of its own.
        if self._streamed_text:
            self._text.pause()
        self._streamed_text = self._streamed_thinking = False
        return []

    def _assistant(self, message: Mapping[str, Any]) -> list[Event]:
        body = message.get("message")
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(content, list):
            return []
        # A synthetic message holding an API error: the result line says it again, as the error.
        speaks = not message.get("parent_tool_use_id") and not message.get("error")
        events: list[Event] = []
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "tool_use":
                events.extend(
                    self._tool_started(text_of(block.get("name")), block.get("input"), text_of(block.get("id")))
                )
            elif not speaks:
                continue
            elif kind == "text" and (text := text_of(block.get("text"))):
                events.extend(self._assistant_text(text))
            elif kind == "thinking" and (text := text_of(block.get("thinking"))):
                if self._streamed_thinking:
                    self._streamed_thinking = False
                else:
                    events.append(ActivityEvent("thinking", text=text[:THINKING_CHARS]))
        return events

    def _assistant_text(self, text: str) -> list[Event]:
        if self._streamed_text:  # its deltas were shown
            self._streamed_text = False
            return []
        if self._repeats:
            if self._repeats_what_was_said(text):
                self._segment.clear()
                self._segment_length = 0
                return []
            self._remember(text)
        return [self._text.add(text)]

    def _repeats_what_was_said(self, text: str) -> bool:
        size = len(text)
        return (size == self._segment_length and text == "".join(self._segment)) or (
            size == self._said_length and text == "".join(self._said)
        )

    def _remember(self, text: str) -> None:
        if self._said_length < TEXT_BOUND:
            self._segment.append(text)
            self._segment_length += len(text)
            self._said.append(text)
            self._said_length += len(text)

    def _tool_started(self, tool: str, arguments: Any, call_id: str) -> list[Event]:
        self._text.pause()
        self._segment.clear()
        self._segment_length = 0
        return self._tools.started(tool, arguments, call_id)

    def _tool_results(self, message: Mapping[str, Any]) -> list[Event]:
        body = message.get("message")
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(content, list):
            return []
        events: list[Event] = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                events.append(
                    self._tools.ended(
                        text_of(block.get("tool_use_id")),
                        failed=bool(block.get("is_error")),
                        output=block.get("content"),
                    )
                )
        return events

    def _cursor_tool_call(self, message: Mapping[str, Any]) -> list[Event]:
        """cursor's `tool_call` lines: `{"subtype": "started"|"completed", "call_id", "tool_call": {"<kind>ToolCall":
        {"args", "result": {"success"|"error"|…}}}}`."""
        call = message.get("tool_call")
        if not isinstance(call, dict) or len(call) != 1:
            return []
        [(kind, detail)] = call.items()
        if not isinstance(kind, str) or not isinstance(detail, dict):
            return []
        tool = kind.removesuffix("ToolCall")
        call_id = text_of(message.get("call_id"))
        subtype = message.get("subtype")
        if subtype == "started":
            return self._tool_started(tool, detail.get("args"), call_id)
        if subtype == "completed":
            result = detail.get("result")
            failed = not (isinstance(result, dict) and "success" in result)
            return [self._tools.ended(call_id, failed=failed, tool=tool, arguments=detail.get("args"))]
        return []

    def _result(self, message: Mapping[str, Any]) -> list[Event]:
        self._finished = True
        events = self._sessions.report(message.get("session_id"))
        usage = result_usage(message, self._cache_in_input)
        if usage is not None:
            events.append(UsageEvent(usage))
        subtype = text_of(message.get("subtype"))
        if message.get("is_error") is True or subtype.startswith("error"):
            events.append(ErrorEvent(result_error_text(message, subtype)))
        else:
            events.append(ReplyEvent(text_of(message.get("result"))))
        return events

    handlers: ClassVar[Mapping[str, Handler]] = {
        "stream_event": _stream_event,
        "assistant": _assistant,
        "user": _tool_results,
        "system": _system,
        "result": _result,
        "tool_call": _cursor_tool_call,
        "thinking": _cursor_thinking,
    }
    stream_events: ClassVar[Mapping[str, Handler]] = {
        "content_block_delta": _block_delta,
        "message_start": _message_start,
    }
    """The Messages API events of a `stream_event` line, by type."""


def result_error_text(message: Mapping[str, Any], subtype: str) -> str:
    """The user-readable text of an error result: `result` (API errors), `errors[]` (claude's error_* subtypes),
    `error.message` (qwen-code), else what the subtype says."""
    text = text_of(message.get("result")).strip()
    if text:
        return text
    errors = message.get("errors")
    if isinstance(errors, list):
        text = "; ".join(error for error in errors if isinstance(error, str) and error.strip())
        if text:
            return text
    error = message.get("error")
    if isinstance(error, dict) and (text := text_of(error.get("message")).strip()):
        return text
    if subtype.startswith("error_"):
        return f"the agent stopped: {subtype.removeprefix('error_').replace('_', ' ')}"
    return "the agent reported an error"


def result_usage(message: Mapping[str, Any], cache_in_input: bool) -> Usage | None:
    """`usage` and `total_cost_usd`. Anthropic's input_tokens leaves out the tokens read from and written to the
    cache; they are added back, so input_tokens counts all input as other families do (qwen's already does)."""
    usage = message.get("usage")
    cost = message.get("total_cost_usd")
    cost_usd = float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None
    if not isinstance(usage, dict):
        return Usage(cost_usd=cost_usd) if cost_usd is not None else None
    fresh, read, written = (
        number(usage.get(key)) for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    input_tokens = fresh if fresh is None or cache_in_input else fresh + (read or 0) + (written or 0)
    return Usage(
        input_tokens=input_tokens,
        output_tokens=number(usage.get("output_tokens")),
        cached_input_tokens=read,
        total_tokens=number(usage.get("total_tokens")),
        cost_usd=cost_usd,
    )
