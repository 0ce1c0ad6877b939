#!/usr/bin/env python3
"""A stand-in for Gemini CLI in headless mode (`gemini --output-format stream-json --prompt=…`).

Install it as `gemini` first on PATH and run profiles/clis/gemini-cli.yaml: it reads
its arguments as gemini does and prints a turn in gemini's stream-json (one
JSON object per line), so the profile and the gemini-stream-json dialect can
be tried without gemini, an account or a network. Each turn streams "Let me
look.", runs one tool (`ls`), then streams an answer with the message it got;
the `result` line carries no text, only stats. A message starting with "fail:"
ends in a `result` with status error and the rest as its message.
"""

import json
import sys
import uuid


def emit(line: dict) -> None:
    print(json.dumps({**line, "timestamp": "2026-01-01T00:00:00.000Z"}), flush=True)


def main() -> int:
    options: dict = {}
    args = iter(sys.argv[1:])
    for word in args:
        if word.startswith("--") and "=" in word:
            name, value = word.split("=", 1)
            options[name] = value
        elif word in ("-o", "--output-format", "-p", "--prompt", "-r", "--resume", "-m", "--model"):
            options[{"-o": "--output-format", "-p": "--prompt", "-r": "--resume", "-m": "--model"}.get(word, word)] = (
                next(args, "")
            )
        else:
            options[word] = True
    if options.get("--output-format") != "stream-json":
        print("this sample speaks only --output-format stream-json", file=sys.stderr)
        return 1
    message = options.get("--prompt")
    if not isinstance(message, str) or not message:
        print(
            "No input provided via stdin. Input can be provided by piping data into gemini or using the "
            "--prompt option.",
            file=sys.stderr,
        )
        return 42
    if not options.get("--skip-trust"):
        print(
            "Gemini CLI is not running in a trusted directory. To proceed, either use --skip-trust, …", file=sys.stderr
        )
        return 55
    resumed = options.get("--resume")
    session_id = resumed if isinstance(resumed, str) and resumed else str(uuid.uuid4())

    emit({"type": "init", "session_id": session_id, "model": options.get("--model") or "auto"})
    emit({"type": "message", "role": "user", "content": message})
    for piece in ("Let me ", "look."):
        emit({"type": "message", "role": "assistant", "content": piece, "delta": True})
    emit(
        {
            "type": "tool_use",
            "tool_name": "list_directory",
            "tool_id": "list_directory_1",
            "parameters": {"dir_path": "."},
        }
    )
    emit({"type": "tool_result", "tool_id": "list_directory_1", "status": "success", "output": "Listed 1 item."})
    stats = {
        "total_tokens": 15,
        "input_tokens": 10,
        "output_tokens": 5,
        "cached": 0,
        "input": 10,
        "duration_ms": 1,
        "tool_calls": 1,
    }
    if message.startswith("fail:"):
        emit(
            {
                "type": "result",
                "status": "error",
                "error": {"type": "unknown", "message": message[5:].strip()},
                "stats": stats,
            }
        )
        return 1
    answer = f"gemini got: {message}" + (f" (session {session_id} resumed)" if resumed else "")
    for piece in (answer[: len(answer) // 2], answer[len(answer) // 2 :]):
        emit({"type": "message", "role": "assistant", "content": piece, "delta": True})
    emit({"type": "result", "status": "success", "stats": stats})
    return 0


if __name__ == "__main__":
    sys.exit(main())
