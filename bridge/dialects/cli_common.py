"""What the coding-CLI dialects share: session ids, token counts, tool titles. Pure.

Conventions every dialect here follows, so one `Usage` means the same thing
whichever CLI reported it:

- `input_tokens` counts every prompt token, cached or not (fresh input + cache
  reads + cache writes); `cached_input_tokens` is the cache reads among them.
- `output_tokens` counts every generated token; `reasoning_tokens` is the
  reasoning among them.
- `total_tokens` is the CLI's own total when it gives one, else input + output.

Families that report disjoint buckets (opencode, aictrl, pi, grok, dsh) are
folded into these; the dialect docstrings say how.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .agentproc01 import session_id_problem
from .base import number, shorten
from .events import Event, ProtocolWarning, SessionEvent, Usage

THINKING_CHARS = 600
"""How much of a block of reasoning an activity event carries (a status line, not a transcript)."""
OUTPUT_CHARS = 300
"""How much of a tool's output an activity event carries."""
TITLE_CHARS = 120
REPLY_CHARS = 8 * 1024 * 1024
"""A reply assembled from deltas stops growing here (the turn's own cap is lower; this bounds memory)."""


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


def token_usage(*, fresh_input: Any = None, cache_read: Any = None, cache_write: Any = None, output: Any = None,
                reasoning: Any = None, total: Any = None, cost: Any = None) -> Usage | None:
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
    usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens, cached_input_tokens=read,
                  reasoning_tokens=number(reasoning), total_tokens=total_tokens, cost_usd=money(cost))
    return usage if usage != Usage() else None


def money(value: Any) -> float | None:
    """A cost in dollars from an agent's JSON: a number, or an object of numbers to add up (`{"input": …}`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, Mapping):
        parts = [money(item) for item in value.values()]
        known = [part for part in parts if part is not None]
        return sum(known) if known else None
    return None


def add(*counts: Any) -> int | None:
    """The sum of the whole numbers among `counts`; None when there are none."""
    known = [count for count in map(number, counts) if count is not None]
    return sum(known) if known else None


_TITLE_KEYS = ("command", "cmd", "filePath", "file_path", "path", "url", "pattern", "query", "description", "prompt")


def tool_title(arguments: Any) -> str:
    """What a person reads for a tool call: its command, file, URL or query, from the tool's input.

    `arguments` may be an object or the JSON text of one (OpenAI-style tool calls).
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return ""
    if not isinstance(arguments, Mapping):
        return ""
    for key in _TITLE_KEYS:
        value = arguments.get(key)
        if isinstance(value, list) and value and all(isinstance(word, str) for word in value):
            value = " ".join(value)
        if isinstance(value, str) and value.strip():
            return shorten(value, TITLE_CHARS)
    return ""
