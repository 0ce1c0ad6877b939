"""In memory: a JSON dialect against one that trusts its input's shape — what the turn costs if a dialect checked
nothing and made only the events the turn must have (PROFILING §17–18, round five).

    PYTHONPATH=. python bench/dialect_floor.py FILE PROTOCOL [REPEATS]   # µs per line, best of REPEATS

FILE is `agents/dialect_like.py file PROTOCOL MB FILE`'s output. The trusting dialect indexes where the real one
tests (`[]` for `.get`, no type checks) and hands every line it has no shortcut for to the real one; it makes the
same partials, the same activities with the same titles and shortened texts, and the same reply (it refuses to
measure otherwise), so the difference is the price of the checks that keep a malformed field from failing a turn. Not
a dialect anyone should run: it raises on the first line that is not shaped as the bench writes it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from dialect_loop import one_turn

from bridge import Profile, Turn
from bridge.dialects.base import shorten
from bridge.dialects.codex_exec import _STATUS, _command_title
from bridge.dialects.coding_agents import OUTPUT_CHARS, THINKING_CHARS, tool_title
from bridge.dialects.events import ActivityEvent, Event, PartialEvent


def trusting_codex(real: type) -> type:
    class Trusting(real):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def on_object(self, message: dict[str, Any]) -> list[Event]:
            kind = message["type"]
            if kind == "item.completed" or kind == "item.started":
                item = message["item"]
                item_kind = item["type"]
                if item_kind == "agent_message":
                    text = self._reply = item["text"]
                    self._messages += 1
                    return [PartialEvent(text if self._messages == 1 else "\n\n" + text)]
                if item_kind == "reasoning":
                    return [ActivityEvent("thinking", text=shorten(item["text"], THINKING_CHARS))]
                if item_kind == "command_execution":
                    code, output = item["exit_code"], item["aggregated_output"]
                    text = f"exit code {code}: {shorten(output, OUTPUT_CHARS)}" if code is not None else ""
                    return [
                        ActivityEvent(
                            "tool",
                            tool="command_execution",
                            title=_command_title(item["command"]),
                            status=_STATUS[item["status"]],
                            text=text,
                            call_id=item["id"],
                        )
                    ]
            return real.on_object(self, message)  # type: ignore[no-any-return]

    return Trusting


def trusting_gemini(real: type) -> type:
    class Trusting(real):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def on_object(self, message: dict[str, Any]) -> list[Event]:
            kind = message["type"]
            if kind == "message":
                return [self._text.add(message["content"])]
            if kind == "tool_use":
                self._text.pause()
                return self._tools.started(message["tool_name"], message["parameters"], message["tool_id"])
            if kind == "tool_result":
                return [
                    self._tools.ended(message["tool_id"], failed=message["status"] == "error", output=message["output"])
                ]
            return real.on_object(self, message)  # type: ignore[no-any-return]

    return Trusting


def trusting_kimi(real: type) -> type:
    class Trusting(real):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def on_object(self, message: dict[str, Any]) -> list[Event]:
            role = message["role"]
            if role == "assistant":
                content = message["content"]
                if type(content) is list:
                    return [ActivityEvent("thinking", text=shorten(content[0]["think"], THINKING_CHARS))]
                if content:
                    partial = PartialEvent("\n\n" + content if self.reply else content)
                    self.reply = content
                    return [partial]
                call = message["tool_calls"][0]
                function = call["function"]
                call_id = call["id"]
                self.tool_names[call_id] = function["name"]
                return [
                    ActivityEvent(
                        "tool",
                        tool=function["name"],
                        title=tool_title(function["arguments"]),
                        status="started",
                        call_id=call_id,
                    )
                ]
            if role == "tool":
                text, call_id = message["content"], message["tool_call_id"]
                failed = text.lstrip().startswith("<system>ERROR:")
                return [
                    ActivityEvent(
                        "tool",
                        text=shorten(text, OUTPUT_CHARS),
                        tool=self.tool_names.pop(call_id),
                        status="failed" if failed else "completed",
                        call_id=call_id,
                    )
                ]
            return real.on_object(self, message)  # type: ignore[no-any-return]

    return Trusting


TRUSTING: dict[str, Callable[[type], type]] = {
    "codex-exec": trusting_codex,
    "gemini-stream-json": trusting_gemini,
    "kimi-stream-json": trusting_kimi,
}


def events_of(dialect_class: Any, profile: Profile, data: bytes) -> list[Event]:
    dialect = dialect_class(profile.dialect_context, Turn("hello"))
    return dialect.feed(data) + dialect.close()  # type: ignore[no-any-return]


def main(argv: list[str]) -> int:
    path, protocol = argv[1], argv[2]
    repeats = int(argv[3]) if len(argv) > 3 else 7
    if protocol not in TRUSTING:
        print(f"no trusting dialect for {protocol}; there is one for {', '.join(TRUSTING)}", file=sys.stderr)
        return 2
    with open(path, "rb") as f:
        data = f.read()
    lines = data.count(b"\n")
    profile = Profile.from_mapping({"command": ["cat"], "protocol": protocol, "max_reply_chars": None})
    trusting = TRUSTING[protocol](profile.dialect)
    if events_of(trusting, profile, data) != events_of(profile.dialect, profile, data):
        print("the trusting dialect makes other events than the dialect; fix it before measuring", file=sys.stderr)
        return 1

    def per_line(dialect_class: Any) -> float:
        best = max(one_turn(profile, data, dialect_class) for _ in range(repeats))  # MB/s
        return len(data) / 1e6 / best / lines * 1e6

    print(f"{protocol}: the dialect {per_line(None):.2f} µs a line, trusting its input {per_line(trusting):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
