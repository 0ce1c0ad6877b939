"""One agent turn written in the shapes of every one-shot JSON dialect, for the bench.

    dialect_like.py file PROTOCOL MEGABYTES PATH   write one long turn to PATH; print what a correct run yields (JSON)
    dialect_like.py tick PROTOCOL SECONDS INTERVAL_MS
                                                   play a turn live: every INTERVAL_MS a thinking step (where the
                                                   protocol has one), then a text step whose text is CLOCK_MONOTONIC
                                                   ns; then the turn's end

Every protocol's file holds the same steps: they are drawn until their agentproc wire-0.4 form (as the agentproc 0.20
SDK writes lines, each stamped with the session id) reaches MEGABYTES, so a turn in any dialect can be compared with
agentproc 0.20 reading the same file through its hub profile for that CLI (`hub_profile`), or its runner reading the
wire-0.4 file. The steps: reasoning, the reply streamed as deltas of a few words,
and tool steps (a command, then up to 2 KB of its output); the turn ends with the whole answer and its usage. Each
protocol says what it can say of them in its own lines (a few have no reasoning or no tools, and leave them out).
Lines are compact JSON with `ensure_ascii=False`. No permission requests: they need a stdin exchange, which `cat` of a
file cannot hold.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

SESSION_ID = "3f0c9a52-7d1e-4b8e-9a51-0c4d2b6e8f10"
INPUT_TOKENS, OUTPUT_TOKENS, COST = 182344, 9120, 0.4521
WORDS = [
    "the",
    "agent",
    "reads",
    "the",
    "file",
    "and",
    "answers",
    "with",
    "a",
    "short",
    "line",
    "of",
    "text",
    "about",
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "café",
    "naïve",
    "“quoted”",
    "über",
    "tokens",
    "stream",
    "one",
    "by",
    "one,",
    "then",
    "runs",
    "`pytest",
    "-q`",
    "and",
    "fixes",
    "{braces}",
    '"quotes"',
    "\\",
    "backslashes",
]
COMMANDS = (
    "ls -la src/",
    "pytest -q tests/test_parser.py",
    "git diff --stat",
    "rg -n 'def feed' bridge/",
    "cat pyproject.toml",
)
START_MS = 1795341600000  # 2026-11-22T10:00:00Z: lines carry the time they were written, 7 ms apart


def line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class Stream:
    """One protocol's lines for a turn's steps, and what the bridge must make of them.

    `partials` and `activities` count the events the protocol's dialect yields for what was written.
    """

    protocol = ""
    has_session = True
    has_usage = True
    hub_profile: tuple[str, str] | None = None  # agentproc 0.20's hub profile reading this JSON, and its command

    def __init__(self) -> None:
        self.partials = 0
        self.activities = 0
        self.texts: list[str] = []  # the text steps since the last tool step
        self.said: list[str] = []  # every text step, with a blank line where text resumes after a tool
        self.paused = False
        self.lines = 0

    def millis(self) -> int:
        """The time this line is written, as real agents stamp their lines (each line a different one)."""
        self.lines += 1
        return START_MS + 7 * self.lines

    def stamp(self) -> str:
        millis = self.millis()
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(millis // 1000)) + f".{millis % 1000:03d}Z"

    def text_step(self, text: str) -> None:
        self.said.append("\n\n" + text if self.paused and self.said else text)
        self.paused = False
        self.texts.append(text)
        self.partials += 1

    def tool_step(self) -> None:
        self.paused = True
        self.texts = []

    def head(self) -> bytes:
        return b""

    def thinking(self, text: str) -> bytes:
        return b""

    def output(self, text: str) -> bytes:
        raise NotImplementedError

    def tool(self, number: int, command: str, output: str) -> bytes:
        return b""

    def end(self, answer: str) -> bytes:
        raise NotImplementedError

    def reply(self, answer: str) -> str:
        """The reply the dialect takes from this turn; `answer` is the one the turn ends with."""
        return answer

    def last_text(self) -> str:
        """The last text step, as written."""
        return self.said[-1].removeprefix("\n\n") if self.said else ""


class Wire04(Stream):
    protocol = "agentproc-0.4"

    @staticmethod
    def partial(text: str, role: str) -> bytes:
        return line({"type": "partial", "text": text, "role": role, "session_id": SESSION_ID})

    def thinking(self, text: str) -> bytes:
        self.activities += 1
        return self.partial(text, "thinking")

    def output(self, text: str) -> bytes:
        self.partials += 1
        return self.partial(text, "output")

    def tool(self, number: int, command: str, output: str) -> bytes:
        self.partials += 2
        return self.partial(f"$ {command}", "tool") + self.partial(output, "tool")

    def end(self, answer: str) -> bytes:
        usage = {
            "input_tokens": INPUT_TOKENS,
            "output_tokens": OUTPUT_TOKENS,
            "cache_read_input_tokens": 150112,
            "cost_usd": COST,
        }
        return line({"type": "result", "text": answer, "usage": usage, "session_id": SESSION_ID})


class CodexExec(Stream):
    """`codex exec --json`: whole items; the last agent message is the reply."""

    protocol = "codex-exec"
    hub_profile = ("codex", "codex")

    def head(self) -> bytes:
        return line({"type": "thread.started", "thread_id": SESSION_ID}) + line({"type": "turn.started"})

    def item(self, event: str, number: int, **fields: Any) -> bytes:
        return line({"type": event, "item": {"id": f"item_{number}", **fields}})

    def thinking(self, text: str) -> bytes:
        self.activities += 1
        return self.item("item.completed", self.partials + self.activities, type="reasoning", text=text)

    def output(self, text: str) -> bytes:
        self.text_step(text)
        return self.item("item.completed", self.partials + self.activities, type="agent_message", text=text)

    def tool(self, number: int, command: str, output: str) -> bytes:
        self.tool_step()
        self.activities += 2
        command = f"/bin/bash -lc '{command}'"
        return self.item(
            "item.started",
            10**7 + number,
            type="command_execution",
            command=command,
            aggregated_output="",
            exit_code=None,
            status="in_progress",
        ) + self.item(
            "item.completed",
            10**7 + number,
            type="command_execution",
            command=command,
            aggregated_output=output,
            exit_code=0,
            status="completed",
        )

    def end(self, answer: str) -> bytes:
        usage = {
            "input_tokens": INPUT_TOKENS,
            "cached_input_tokens": 0,
            "output_tokens": OUTPUT_TOKENS,
            "reasoning_output_tokens": 0,
        }
        return line({"type": "turn.completed", "usage": usage})

    def reply(self, answer: str) -> str:
        return self.last_text()


class ClaudeStream(Stream):
    """Claude Code's `-p --output-format stream-json --verbose`: a line per content block; `result` is the reply."""

    protocol = "claude-stream-json"
    hub_profile = ("claude-code", "claude")

    def envelope(self, **fields: Any) -> bytes:
        return line(
            {
                **fields,
                "parent_tool_use_id": None,
                "session_id": SESSION_ID,
                "uuid": f"4b6a1f0e-0c7d-4e7a-9d55-{self.partials + self.activities:012d}",
            }
        )

    def assistant(self, block: dict[str, Any]) -> bytes:
        """A block of the model's message, spelled as Claude Code 2.1 writes it (tests/transcripts/claude-*)."""
        step = self.partials + self.activities
        usage = {
            "input_tokens": 12 + step % 7,
            "output_tokens": 1 + step % 50,
            "cache_read_input_tokens": 150112,
            "cache_creation_input_tokens": 0,
        }
        return self.envelope(
            type="assistant",
            message={
                "id": f"msg_01{step // 8:022d}",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [block],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
                "context_management": None,
            },
        )

    def head(self) -> bytes:
        return line(
            {
                "type": "system",
                "subtype": "init",
                "session_id": SESSION_ID,
                "model": "claude-sonnet-4-5",
                "tools": ["Bash", "Read", "Edit"],
                "permissionMode": "default",
            }
        )

    def thinking(self, text: str) -> bytes:
        self.activities += 1
        return self.assistant({"type": "thinking", "thinking": text, "signature": "EqQBCkYIBxgCKkDbench"})

    def output(self, text: str) -> bytes:
        self.text_step(text)
        return self.assistant({"type": "text", "text": text})

    def tool(self, number: int, command: str, output: str) -> bytes:
        self.tool_step()
        self.activities += 2
        call = f"toolu_{number:08d}"
        result = {"type": "tool_result", "tool_use_id": call, "content": output, "is_error": False}
        return self.assistant(
            {"type": "tool_use", "id": call, "name": "Bash", "input": {"command": command}}
        ) + self.envelope(type="user", message={"role": "user", "content": [result]})

    def end(self, answer: str) -> bytes:
        usage = {
            "input_tokens": INPUT_TOKENS,
            "output_tokens": OUTPUT_TOKENS,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
        }
        return line(
            {
                "type": "result",
                "subtype": "success",
                "is_error": False,
                "result": answer,
                "session_id": SESSION_ID,
                "usage": usage,
                "total_cost_usd": COST,
            }
        )


class GeminiStream(Stream):
    """Gemini CLI's `stream-json`: assistant deltas are the reply, a blank line where text resumes after a tool."""

    protocol = "gemini-stream-json"
    hub_profile = ("gemini-cli", "gemini")

    def head(self) -> bytes:
        return line({"type": "init", "timestamp": self.stamp(), "session_id": SESSION_ID, "model": "gemini-2.5-pro"})

    def output(self, text: str) -> bytes:
        self.text_step(text)
        return line({"type": "message", "timestamp": self.stamp(), "role": "assistant", "content": text, "delta": True})

    def tool(self, number: int, command: str, output: str) -> bytes:
        self.tool_step()
        self.activities += 2
        call = f"run_shell_command-{number}"
        return line(
            {
                "type": "tool_use",
                "timestamp": self.stamp(),
                "tool_name": "run_shell_command",
                "tool_id": call,
                "parameters": {"command": command},
            }
        ) + line(
            {"type": "tool_result", "timestamp": self.stamp(), "tool_id": call, "status": "success", "output": output}
        )

    def end(self, answer: str) -> bytes:
        stats = {
            "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
            "input_tokens": INPUT_TOKENS,
            "output_tokens": OUTPUT_TOKENS,
            "cached": 0,
            "duration_ms": 5120,
            "tool_calls": 3,
        }
        return line({"type": "result", "timestamp": self.stamp(), "status": "success", "stats": stats})

    def reply(self, answer: str) -> str:
        return "".join(self.said)


class GrokStreaming(Stream):
    """`grok --output-format streaming-json`: text deltas are the reply; reasoning deltas are gathered; no tools."""

    protocol = "grok-streaming-json"
    hub_profile = ("grok-build", "grok")

    def __init__(self) -> None:
        super().__init__()
        self.thinking_run = False

    def thinking(self, text: str) -> bytes:
        if not self.thinking_run:
            self.activities += 1
            self.thinking_run = True
        return line({"type": "thought", "data": text})

    def output(self, text: str) -> bytes:
        self.thinking_run = False
        self.partials += 1
        self.said.append(text)
        return line({"type": "text", "data": text})

    def end(self, answer: str) -> bytes:
        usage = {
            "input_tokens": INPUT_TOKENS,
            "cache_read_input_tokens": 0,
            "output_tokens": OUTPUT_TOKENS,
            "reasoning_tokens": 0,
            "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
        }
        return line(
            {
                "type": "end",
                "stopReason": "EndTurn",
                "sessionId": SESSION_ID,
                "requestId": "req-1",
                "usage": usage,
                "num_turns": 1,
            }
        )

    def reply(self, answer: str) -> str:
        return "".join(self.said)


class KimiStream(Stream):
    """Kimi's `stream-json`: whole messages; the last assistant text is the reply; no session id, no usage."""

    protocol = "kimi-stream-json"
    hub_profile = ("kimi-code", "kimi")
    has_session = False
    has_usage = False

    def thinking(self, text: str) -> bytes:
        self.activities += 1
        return line({"role": "assistant", "content": [{"type": "think", "think": text}]})

    def output(self, text: str) -> bytes:
        self.text_step(text)
        return line({"role": "assistant", "content": text})

    def tool(self, number: int, command: str, output: str) -> bytes:
        self.tool_step()
        self.activities += 2
        call = f"Shell:{number}"
        function = {"name": "Shell", "arguments": json.dumps({"command": command})}
        return line(
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": call, "function": function}]}
        ) + line({"role": "tool", "tool_call_id": call, "content": output})

    def end(self, answer: str) -> bytes:
        return b""

    def reply(self, answer: str) -> str:
        return self.last_text()


class PiJson(Stream):
    """`pi --mode json`: text deltas within assistant messages; the last message with text is the reply."""

    protocol = "pi-json"

    def __init__(self) -> None:
        super().__init__()
        self.last_message = ""

    def message_end(self, usage: dict[str, Any] | None = None) -> bytes:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": [{"type": "text", "text": "".join(self.texts)}],
            "stopReason": "stop" if usage else "toolUse",
        }
        if usage:
            message["usage"] = usage
        return line({"type": "message_end", "message": message})

    def head(self) -> bytes:
        return (
            line({"type": "session", "version": 3, "id": SESSION_ID, "timestamp": self.stamp(), "cwd": "/work"})
            + line({"type": "agent_start"})
            + line({"type": "message_start", "message": {"role": "assistant"}})
        )

    def update(self, event: dict[str, Any]) -> bytes:
        return line({"type": "message_update", "assistantMessageEvent": {**event, "contentIndex": 0}})

    def thinking(self, text: str) -> bytes:
        self.activities += 1
        return self.update({"type": "thinking_end", "content": text})

    def output(self, text: str) -> bytes:
        self.text_step(text)
        return self.update({"type": "text_delta", "delta": text})

    def tool(self, number: int, command: str, output: str) -> bytes:
        ended = self.message_end()
        if "".join(self.texts).strip():
            self.last_message = "".join(self.texts)
        self.tool_step()
        self.activities += 2
        call = f"call_{number}"
        return (
            ended
            + line(
                {"type": "tool_execution_start", "toolCallId": call, "toolName": "bash", "args": {"command": command}}
            )
            + line(
                {
                    "type": "tool_execution_end",
                    "toolCallId": call,
                    "toolName": "bash",
                    "result": {"content": [{"type": "text", "text": output}]},
                    "isError": False,
                }
            )
            + line({"type": "message_start", "message": {"role": "assistant"}})
        )

    def end(self, answer: str) -> bytes:
        if "".join(self.texts).strip():
            self.last_message = "".join(self.texts)
        usage = {
            "input": INPUT_TOKENS,
            "output": OUTPUT_TOKENS,
            "cacheRead": 0,
            "cacheWrite": 0,
            "totalTokens": INPUT_TOKENS + OUTPUT_TOKENS,
            "cost": {"total": COST},
        }
        return self.message_end(usage) + line({"type": "agent_end"})

    def reply(self, answer: str) -> str:
        return self.last_message


class DshJson(Stream):
    """`dsh --json`: text frames shown, `final` is the reply; tool frames are not read."""

    protocol = "dsh-json"
    hub_profile = ("dsh", "dsh")

    def head(self) -> bytes:
        return line({"type": "session", "sessionId": SESSION_ID, "cwd": "/work"})

    def thinking(self, text: str) -> bytes:
        self.activities += 1
        return line({"type": "thinking", "text": text})

    def output(self, text: str) -> bytes:
        self.text_step(text)
        return line({"type": "text", "text": text})

    def tool(self, number: int, command: str, output: str) -> bytes:
        self.tool_step()
        call = f"call_{number}"
        return line({"type": "tool_call", "id": call, "name": "bash", "input": {"command": command}}) + line(
            {"type": "tool_result", "id": call, "output": output}
        )

    def end(self, answer: str) -> bytes:
        usage = {
            "inputTokens": INPUT_TOKENS,
            "outputTokens": OUTPUT_TOKENS,
            "totalTokens": INPUT_TOKENS + OUTPUT_TOKENS,
            "cacheReadTokens": 0,
            "cacheWriteTokens": 0,
            "reasoningTokens": 0,
        }
        return line({"type": "status", "phase": "step_end", "usage": usage}) + line({"type": "final", "text": answer})


class DeepseekStream(Stream):
    """`deepseek exec --output-format stream-json`: content deltas are the reply; no reasoning lines."""

    protocol = "deepseek-stream-json"

    def output(self, text: str) -> bytes:
        self.partials += 1
        self.said.append(text)
        return line({"type": "content", "content": text})

    def tool(self, number: int, command: str, output: str) -> bytes:
        self.activities += 2
        call = f"call_{number}"
        return line({"type": "tool_use", "name": "exec_shell", "id": call, "input": {"command": command}}) + line(
            {"type": "tool_result", "id": call, "output": output, "status": "success"}
        )

    def end(self, answer: str) -> bytes:
        meta = {
            "model": "deepseek-v4",
            "input_tokens": INPUT_TOKENS,
            "output_tokens": OUTPUT_TOKENS,
            "session_id": SESSION_ID,
            "status": "completed",
        }
        return (
            line({"type": "session_capture", "content": SESSION_ID})
            + line({"type": "metadata", "meta": meta})
            + line({"type": "done"})
        )

    def reply(self, answer: str) -> str:
        return "".join(self.said)


class OpencodeJson(Stream):
    """`opencode run --format json`: parts in an envelope; the last text part is the reply."""

    protocol = "opencode-json"
    hub_profile = ("opencode", "opencode")
    envelope_fields: dict[str, Any] = {}  # what every line carries besides type, timestamp and sessionID

    def envelope(self, kind: str, **part: Any) -> bytes:
        return line(
            {
                "type": kind,
                "timestamp": self.millis(),
                "sessionID": SESSION_ID,
                **self.envelope_fields,
                "part": {
                    "id": f"prt_{self.partials + self.activities:08d}",
                    "sessionID": SESSION_ID,
                    "messageID": "msg_1",
                    **part,
                },
            }
        )

    def head(self) -> bytes:
        return self.envelope("step_start", type="step-start")

    def thinking(self, text: str) -> bytes:
        self.activities += 1
        return self.envelope("reasoning", type="reasoning", text=text)

    def output(self, text: str) -> bytes:
        self.text_step(text)
        return self.envelope("text", type="text", text=text, time={"start": self.millis(), "end": self.millis()})

    def tool(self, number: int, command: str, output: str) -> bytes:
        self.tool_step()
        self.activities += 1
        state = {
            "status": "completed",
            "input": {"command": command},
            "output": output,
            "title": command,
            "metadata": {"exit": 0},
        }
        return self.envelope("tool_use", type="tool", tool="bash", callID=f"call_{number}", state=state)

    def tokens(self) -> dict[str, Any]:
        return {"input": INPUT_TOKENS, "output": OUTPUT_TOKENS, "reasoning": 0, "cache": {"read": 0, "write": 0}}

    def end(self, answer: str) -> bytes:
        return self.envelope("step_finish", type="step-finish", reason="stop", cost=COST, tokens=self.tokens())

    def reply(self, answer: str) -> str:
        return self.last_text()


class AictrlNdjson(OpencodeJson):
    """`aictrl run --format json`: opencode's parts in aictrl's envelope; message_complete usage, session_complete."""

    protocol = "aictrl-ndjson"
    hub_profile = None
    envelope_fields = {"schemaVersion": "1", "invocationID": "inv_1"}

    def event(self, kind: str, **fields: Any) -> bytes:
        return line(
            {"type": kind, "timestamp": self.millis(), "sessionID": SESSION_ID, **self.envelope_fields, **fields}
        )

    def head(self) -> bytes:
        return self.event("session_start") + super().head()

    def end(self, answer: str) -> bytes:
        return self.event("message_complete", tokens=self.tokens(), cost=COST) + self.event("session_complete")


STREAMS: dict[str, type[Stream]] = {
    stream.protocol: stream
    for stream in (
        Wire04,
        CodexExec,
        ClaudeStream,
        GeminiStream,
        GrokStreaming,
        KimiStream,
        PiJson,
        DshJson,
        DeepseekStream,
        OpencodeJson,
        AictrlNdjson,
    )
}


def prose(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))


def steps(megabytes: float) -> Iterator[tuple[str, ...]]:
    """The turn's steps — ("thinking", text), ("output", text), ("tool", command, output) — until their wire-0.4
    form reaches `megabytes`."""
    rng = random.Random(12)
    sizer = Wire04()
    target, size = int(megabytes * 1_000_000), 0
    while size < target:
        step = rng.random()
        if step < 0.25:
            text = prose(rng, 4, 12) + " "
            size += len(sizer.thinking(text))
            yield "thinking", text
        elif step < 0.9:
            text = prose(rng, 1, 4) + " "
            size += len(sizer.output(text))
            yield "output", text
        else:
            output = "\n".join(prose(rng, 6, 14) for _ in range(rng.randint(1, 20)))[:2048]
            command = rng.choice(COMMANDS)
            size += len(sizer.tool(0, command, output))
            yield "tool", command, output


def write_file(protocol: str, megabytes: float, path: str) -> dict[str, Any]:
    stream = STREAMS[protocol]()
    parts = [stream.head()]
    outputs: list[str] = []
    tools = 0
    for step in steps(megabytes):
        if step[0] == "thinking":
            parts.append(stream.thinking(step[1]))
        elif step[0] == "output":
            parts.append(stream.output(step[1]))
            outputs.append(step[1])
        else:
            tools += 1
            parts.append(stream.tool(tools, step[1], step[2]))
    answer = "".join(outputs[-200:]).strip()  # the turn ends with its final answer, not the whole stream
    parts.append(stream.end(answer))
    data = b"".join(parts)
    with open(path, "wb") as out:
        out.write(data)
    return {
        "file": path,
        "protocol": protocol,
        "bytes": len(data),
        "lines": data.count(b"\n"),
        "partials": stream.partials,
        "activities": stream.activities,
        "reply": stream.reply(answer),
        "session_id": SESSION_ID if stream.has_session else "",
        "input_tokens": INPUT_TOKENS if stream.has_usage else None,
        "hub_profile": stream.hub_profile,
    }


def ticks(seconds: float, interval_ms: float) -> Iterator[None]:
    """Every `interval_ms` for `seconds`, on an absolute schedule (no drift)."""
    clock, interval_ns = time.monotonic_ns, int(interval_ms * 1_000_000)
    due = clock()
    end = due + int(seconds * 1e9)
    while due < end:
        wait = due - clock()
        if wait > 0:
            time.sleep(wait / 1e9)
        yield
        due += interval_ns


def tick(protocol: str, seconds: float, interval_ms: float) -> None:
    """Each step's lines straight to fd 1 (no buffering); a text step's text is CLOCK_MONOTONIC ns as it is written."""
    stream = STREAMS[protocol]()
    rng = random.Random(5)
    write, clock = os.write, time.monotonic_ns
    write(1, stream.head())
    for _ in ticks(seconds, interval_ms):
        if thought := stream.thinking(prose(rng, 4, 12)):
            write(1, thought)
        write(1, stream.output(str(clock())))
    write(1, stream.end("ticked"))


if __name__ == "__main__":
    if sys.argv[1] == "file":
        print(json.dumps(write_file(sys.argv[2], float(sys.argv[3]), sys.argv[4])))
    else:
        tick(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
