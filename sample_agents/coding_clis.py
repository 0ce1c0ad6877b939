#!/usr/bin/env python3
"""Stand-ins for the coding CLIs of the ready profiles, which cannot be installed here.

Link this file on PATH under a CLI's name — `grok`, `kimi`, `opencode`, `pi`,
`dsh`, `deepseek`, `agy` or `aider` — and it behaves like that CLI as its
profile in `profiles/` runs it: it parses the arguments the way the CLI does
(stricter: an option it does not know is a usage error, exit 2, so a wrong
profile fails loudly) and writes the output the CLI documents, from the
sources each dialect module names. Sessions are kept in the CLI's own
directory (`$HOME/.grok/stand-in-sessions/` for grok: the one its ready
profile's sandbox line makes writable), so a resumed turn continues the
conversation.

What it does depends on words in the message:

- `tool`: runs a (pretend) command before answering, reported the CLI's way;
- `fail`: the model provider fails the turn, reported the CLI's way;
- anything else: it answers "<name> turn N: you said: <message>", adding
  "last time you said: …" in a resumed session.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

NAME = os.path.basename(sys.argv[0])
# Each CLI's own directory under HOME (what its ready profile's `sandbox:` line lets it write).
OWN_DIRECTORIES = {
    "grok": ".grok",
    "kimi": ".kimi",
    "opencode": ".local/share/opencode",
    "pi": ".pi",
    "dsh": ".dsh",
    "deepseek": ".deepseek",
    "agy": ".gemini",
    "aider": ".aider",
}
STATE = Path(os.environ.get("HOME", "/tmp")) / OWN_DIRECTORIES.get(NAME, f".{NAME}") / "stand-in-sessions"


def usage_error(text: str) -> None:
    print(f"{NAME}: {text}", file=sys.stderr)
    sys.exit(2)


def parse(
    argv: list[str], values: dict[str, str], flags: dict[str, str], *, positionals: bool = True
) -> tuple[dict[str, object], list[str]]:
    """Options as the CLI's parser reads them: `--name value`, `--name=value`, flags, and words after `--`."""
    options: dict[str, object] = {}
    words: list[str] = []
    rest = iter(argv)
    for arg in rest:
        if arg == "--":
            words.extend(rest)
            break
        name, equals, attached = arg.partition("=")
        if name in values:
            value = attached if equals else next(rest, None)
            if value is None:
                usage_error(f"{name} needs a value")
            options[values[name]] = value
        elif arg in flags:
            options[flags[arg]] = True
        elif arg.startswith("-"):
            usage_error(f"unexpected argument '{arg}'")
        elif positionals:
            words.append(arg)
        else:
            usage_error(f"unexpected argument '{arg}'")
    return options, words


def emit(**line: object) -> None:
    print(json.dumps(line, ensure_ascii=False), flush=True)


class Conversation:
    """A session kept in a file: its id and the messages so far."""

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.file = STATE / f"{session_id}.json"
        self.history: list[str] = json.loads(self.file.read_text()) if self.file.exists() else []

    @classmethod
    def known(cls, session_id: str) -> bool:
        return (STATE / f"{session_id}.json").exists()

    def answer(self, message: str) -> str:
        self.history.append(message)
        STATE.mkdir(parents=True, exist_ok=True)
        self.file.write_text(json.dumps(self.history))
        text = f"{NAME} turn {len(self.history)}: you said: {message}"
        if len(self.history) > 1:
            text += f"\nlast time you said: {self.history[-2]}"
        return text


def deltas(text: str) -> list[str]:
    """The answer in token-sized pieces, as streaming CLIs send it."""
    words = text.split(" ")
    return [word + " " for word in words[:-1]] + [words[-1]]


# --------------------------------------------------------------------------- grok (Grok Build)


def grok(argv: list[str]) -> int:
    options, words = parse(
        argv,
        {
            "-p": "prompt",
            "--single": "prompt",
            "--output-format": "format",
            "-r": "resume",
            "--resume": "resume",
            "-m": "model",
            "--model": "model",
            "-s": "session",
            "--session-id": "session",
            "--cwd": "cwd",
        },
        {
            "--always-approve": "approve",
            "--no-auto-update": "no_update",
            "-c": "continue",
            "--continue": "continue",
            "--no-alt-screen": "inline",
        },
    )
    if words or "prompt" not in options:
        usage_error("headless mode needs -p/--single <PROMPT> and nothing else")
    if options.get("format") != "streaming-json":
        usage_error("this stand-in only speaks --output-format streaming-json")
    message = str(options["prompt"])
    resume = str(options.get("resume", ""))
    if resume and not Conversation.known(resume):
        emit(type="error", message=f"session not found: {resume}")
        return 1
    conversation = Conversation(resume or str(uuid.uuid4()))
    for piece in deltas("The user wants an echo."):
        emit(type="thought", data=piece)
    if "fail" in message:
        emit(type="error", message="Rate limit exceeded, try again later", sessionId=conversation.id)
        return 1
    if "tool" in message and not options.get("approve"):
        emit(
            type="end",
            stopReason="Cancelled",
            sessionId=conversation.id,
            requestId="req-1",
            usage={"input_tokens": 10, "output_tokens": 0, "total_tokens": 10},
            num_turns=1,
        )
        return 0
    for piece in deltas(conversation.answer(message)):
        emit(type="text", data=piece)
    emit(
        type="end",
        stopReason="EndTurn",
        sessionId=conversation.id,
        requestId="req-1",
        usage={
            "input_tokens": 200,
            "cache_read_input_tokens": 50,
            "output_tokens": 30,
            "reasoning_tokens": 7,
            "total_tokens": 280,
        },
        num_turns=1,
        modelUsage={"grok-fake": {"inputTokens": 200, "outputTokens": 30, "cacheReadInputTokens": 50, "modelCalls": 1}},
    )
    return 0


# --------------------------------------------------------------------------- kimi (Kimi Code CLI)


def kimi(argv: list[str]) -> int:
    options, words = parse(
        argv,
        {
            "--prompt": "prompt",
            "-p": "prompt",
            "--command": "prompt",
            "-c": "prompt",
            "--output-format": "format",
            "--input-format": "input_format",
            "--session": "session",
            "--resume": "session",
            "-S": "session",
            "-r": "session",
            "--model": "model",
            "-m": "model",
            "--work-dir": "work_dir",
            "-w": "work_dir",
        },
        {
            "--print": "print",
            "--yolo": "yolo",
            "-y": "yolo",
            "--afk": "afk",
            "--final-message-only": "final_only",
            "--thinking": "thinking",
        },
        positionals=False,
    )
    if not options.get("print") or options.get("format") != "stream-json" or "prompt" not in options:
        usage_error("this stand-in only runs --print --output-format=stream-json --prompt=<text>")
    message = str(options["prompt"])
    conversation = Conversation(str(options.get("session") or uuid.uuid4()))  # an unknown id is a new session
    if "fail" in message:
        print(
            "Error code: 401 - {'error': {'message': 'Invalid Authentication', 'type': "
            "'invalid_authentication_error'}}",
            flush=True,
        )
        return 1
    if "tool" in message:
        emit(
            role="assistant",
            content=[
                {"type": "think", "think": "I should look first.", "encrypted": None},
                {"type": "text", "text": "Let me check the directory."},
            ],
            tool_calls=[
                {
                    "type": "function",
                    "id": "tc_1",
                    "function": {"name": "Shell", "arguments": json.dumps({"command": "ls"})},
                }
            ],
        )
        emit(role="tool", tool_call_id="tc_1", content="README.md")
    emit(role="assistant", content=conversation.answer(message))
    return 0


# --------------------------------------------------------------------------- opencode


def opencode(argv: list[str]) -> int:
    if not argv or argv[0] != "run":
        usage_error("this stand-in only implements `opencode run`")
    options, words = parse(
        argv[1:],
        {
            "--session": "session",
            "-s": "session",
            "--model": "model",
            "-m": "model",
            "--format": "format",
            "--agent": "agent",
            "--title": "title",
            "--dir": "dir",
            "--variant": "variant",
            "--file": "file",
            "-f": "file",
        },
        {
            "--auto": "auto",
            "--thinking": "thinking",
            "--continue": "continue",
            "-c": "continue",
            "--fork": "fork",
            "--share": "share",
        },
    )
    if options.get("format") != "json":
        usage_error("this stand-in only speaks --format json")
    message = " ".join(f'"{word}"' if " " in word else word for word in words)  # opencode's own quoting
    if not message.strip():
        print("Error: You must provide a message or a command", file=sys.stderr)
        return 1
    session = str(options.get("session", ""))
    if session and not Conversation.known(session):
        print("Error: Session not found", file=sys.stderr)
        return 1
    conversation = Conversation(session or "ses_" + secrets.token_hex(13))

    def event(kind: str, **data: object) -> None:
        emit(type=kind, timestamp=int(time.time() * 1000), sessionID=conversation.id, **data)

    def part(kind: str, **fields: object) -> dict[str, object]:
        return {
            "id": "prt_" + secrets.token_hex(6),
            "sessionID": conversation.id,
            "messageID": "msg_1",
            "type": kind,
            **fields,
        }

    tokens = {"input": 100, "output": 20, "reasoning": 5, "cache": {"read": 10, "write": 2}}
    event("step_start", part=part("step-start"))
    if "fail" in message:
        event("error", error={"name": "APIError", "data": {"message": "Invalid API key", "statusCode": 401}})
        return 1
    if "tool" in message:
        status = "completed" if options.get("auto") else "error"
        event(
            "tool_use",
            part=part(
                "tool",
                tool="bash",
                callID="call_1",
                state={
                    "status": status,
                    "input": {"command": "ls"},
                    "output": "README.md\n",
                    "title": "ls",
                    "error": "permission rejected",
                },
            ),
        )
        event("step_finish", part=part("step-finish", reason="tool-calls", cost=0.001, tokens=tokens))
        event("step_start", part=part("step-start"))
    event("text", part=part("text", text=conversation.answer(message), time={"start": 1, "end": 2}))
    event("step_finish", part=part("step-finish", reason="stop", cost=0.001, tokens=tokens))
    event("done", reason="idle", rejected=[] if options.get("auto") or "tool" not in message else ["bash"])
    return 0


# --------------------------------------------------------------------------- pi


def pi(argv: list[str]) -> int:
    options, words = parse(
        argv,
        {
            "--mode": "mode",
            "--session": "session",
            "--model": "model",
            "--provider": "provider",
            "--tools": "tools",
            "--thinking": "thinking",
        },
        {
            "--no-extensions": "no_extensions",
            "-ne": "no_extensions",
            "--print": "print",
            "-p": "print",
            "--no-session": "no_session",
        },
    )
    if options.get("mode") != "json":
        usage_error("this stand-in only speaks --mode json")
    if not options.get("no_extensions"):
        usage_error("run me with --no-extensions (pi may hang after answering with extensions loaded)")
    message = " ".join(words)
    session = str(options.get("session", ""))
    if session and not Conversation.known(session):
        print(f"Error: no session found for {session}", file=sys.stderr)
        return 1
    conversation = Conversation(session or str(uuid.uuid4()))
    emit(type="session", version=3, id=conversation.id, timestamp="2026-01-01T00:00:00.000Z", cwd=os.getcwd())
    emit(type="agent_start")
    usage = {
        "input": 100,
        "output": 20,
        "cacheRead": 30,
        "cacheWrite": 0,
        "totalTokens": 150,
        "cost": {"input": 0.001, "output": 0.002, "cacheRead": 0, "cacheWrite": 0, "total": 0.003},
    }

    def assistant(text: str, *, stop: str = "stop", error: str = "", tool: bool = False) -> None:
        content: list[dict[str, object]] = [{"type": "text", "text": text}] if text else []
        if tool:
            content.append({"type": "toolCall", "id": "call_1", "name": "bash", "arguments": {"command": "ls"}})
        message_ = {
            "role": "assistant",
            "content": content,
            "api": "fake",
            "provider": "fake",
            "model": "fake",
            "usage": usage,
            "stopReason": stop,
            "timestamp": 0,
        }
        if error:
            message_["errorMessage"] = error
        emit(type="message_start", message={**message_, "content": []})
        for piece in deltas(text) if text else []:
            emit(
                type="message_update",
                message=message_,
                assistantMessageEvent={"type": "text_delta", "contentIndex": 0, "delta": piece},
            )
        emit(type="message_end", message=message_)

    emit(type="turn_start")
    if "fail" in message:
        assistant("", stop="error", error="401 invalid x-api-key")
        emit(type="agent_end", messages=[])
        return 1
    if "tool" in message:
        assistant("Looking around.", stop="toolUse", tool=True)
        emit(type="tool_execution_start", toolCallId="call_1", toolName="bash", args={"command": "ls"})
        emit(
            type="tool_execution_end",
            toolCallId="call_1",
            toolName="bash",
            result={"content": [{"type": "text", "text": "README.md"}]},
            isError=False,
        )
    assistant(conversation.answer(message))
    emit(type="turn_end", message={}, toolResults=[])
    emit(type="agent_end", messages=[])
    return 0


# --------------------------------------------------------------------------- dsh (DeepSeek Harness)


def dsh(argv: list[str]) -> int:
    options, words = parse(
        argv, {"--profile": "profile", "--session-id": "session"}, {"--json": "json"}, positionals=False
    )
    if options.get("profile") != "headless" or not options.get("json"):
        usage_error("this stand-in only runs --profile headless --json -- <task>")
    message = " ".join(words)
    session = str(options.get("session", ""))
    if session and not Conversation.known(session):
        emit(type="error", message=f'session "{session}" was not found')
        return 1
    conversation = Conversation(session or "session-" + secrets.token_hex(8))
    emit(type="session", sessionId=conversation.id, cwd=os.getcwd())
    emit(type="status", phase="turn_start", turn=1)
    step = {
        "inputTokens": 100,
        "outputTokens": 20,
        "totalTokens": 135,
        "cacheReadTokens": 10,
        "cacheWriteTokens": 5,
        "reasoningTokens": 3,
    }
    if "fail" in message:
        emit(type="error", message="missing credential: DEEPSEEK_API_KEY")
        return 1
    if "tool" in message:
        emit(type="thinking", text="I will list the files.")
        emit(type="status", phase="step_end", turn=1, step=1, usage=step)
    answer = conversation.answer(message)
    emit(type="text", text=answer)
    emit(type="status", phase="step_end", turn=1, step=2, usage=step)
    emit(type="final", text=answer)
    return 0


# --------------------------------------------------------------------------- deepseek (DeepSeek TUI)


def deepseek(argv: list[str]) -> int:
    if not argv or argv[0] != "exec":
        usage_error("this stand-in only implements `deepseek exec`")
    options, words = parse(
        argv[1:],
        {"--model": "model", "--resume": "session", "--session-id": "session", "--output-format": "format"},
        {"--auto": "auto", "--json": "json", "--continue": "continue"},
    )
    if options.get("format") != "stream-json":
        usage_error("this stand-in only speaks --output-format stream-json")
    message = " ".join(words)
    session = str(options.get("session", ""))
    if session and not Conversation.known(session):
        print(f"Error: session {session} not found", file=sys.stderr)
        return 1
    conversation = Conversation(session or str(uuid.uuid4()))
    if "fail" in message:
        emit(type="error", error="API error 401: Authentication Fails, your api key is invalid")
        emit(
            type="metadata",
            meta={
                "model": "deepseek-fake",
                "input_tokens": 0,
                "output_tokens": 0,
                "session_id": "",
                "status": "failed",
            },
        )
        emit(type="done")
        return 0  # deepseek exec exits 0 whatever the status
    if "tool" in message:
        emit(type="tool_use", name="exec_shell", id="call_1", input={"command": "ls"})
        emit(
            type="tool_result",
            id="call_1",
            output="README.md" if options.get("auto") else "denied",
            status="success" if options.get("auto") else "error",
        )
    for piece in deltas(conversation.answer(message)):
        emit(type="content", content=piece)
    emit(type="session_capture", content=conversation.id)
    emit(
        type="metadata",
        meta={
            "model": "deepseek-fake",
            "input_tokens": 120,
            "output_tokens": 25,
            "session_id": conversation.id,
            "status": "completed",
        },
    )
    emit(type="done")
    return 0


# --------------------------------------------------------------------------- agy (Antigravity), plain text


def agy(argv: list[str]) -> int:
    options, words = parse(
        argv,
        {"--conversation": "conversation", "--model": "model", "--mode": "mode", "--print-timeout": "print_timeout"},
        {
            "--print": "print",
            "-p": "print",
            "--dangerously-skip-permissions": "skip",
            "--sandbox": "sandbox",
            "--continue": "continue",
            "-c": "continue",
        },
    )
    if not options.get("print"):
        usage_error("this stand-in only runs --print")
    message = " ".join(words)
    conversation = Conversation(str(options.get("conversation") or uuid.uuid4()))  # as the reference assumes
    if "fail" in message:
        print("Error: You are not logged into Antigravity.", file=sys.stderr)
        return 1
    if "tool" in message and not options.get("skip"):
        print("Error: permission required for run_command; print mode cannot ask", file=sys.stderr)
        return 1
    print(conversation.answer(message))
    return 0


# --------------------------------------------------------------------------- aider, plain text


def aider(argv: list[str]) -> int:
    options, words = parse(
        argv,
        {"--message": "message", "--msg": "message", "-m": "message", "--model": "model"},
        {
            "--yes-always": "yes",
            "--no-show-release-notes": "quiet",
            "--no-stream": "no_stream",
            "--no-pretty": "no_pretty",
            "--no-check-update": "no_update",
        },
        positionals=False,
    )
    if "message" not in options:
        usage_error("this stand-in only answers one --message")
    message = str(options["message"])
    print("Aider v0.86.1 (stand-in)\nMain model: fake with diff edit format\nGit repo: none\n", flush=True)
    if "fail" in message:
        print("litellm.AuthenticationError: invalid x-api-key", file=sys.stderr)
        return 1
    print(Conversation("repository").answer(message))  # aider's memory is the repository, not a session
    return 0


CLIS: dict[str, Callable[[list[str]], int]] = {
    "grok": grok,
    "kimi": kimi,
    "opencode": opencode,
    "pi": pi,
    "dsh": dsh,
    "deepseek": deepseek,
    "agy": agy,
    "aider": aider,
}

if __name__ == "__main__":
    if NAME not in CLIS:
        sys.exit(f"coding_clis.py: link me as one of {', '.join(CLIS)}")
    sys.exit(CLIS[NAME](sys.argv[1:]))
