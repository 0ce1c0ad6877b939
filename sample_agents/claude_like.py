#!/usr/bin/env python3
"""A stand-in for Claude Code and the CLIs that print its stream-json: codebuddy, cursor's agent, qwen.

Install it under the CLI's name (a symlink `claude`, `codebuddy`, `agent` or
`qwen` first on PATH) and run the ready profile (profiles/clis/claude-code.yaml…):
it reads its arguments as that CLI does and prints a turn in that CLI's format
(one JSON object per line), so the profile and the claude-stream-json dialect
can be tried without the real CLI, an account or a network. Each turn says
"Let me look.", runs one tool (`ls`), then answers with the message it got.

What differs per CLI, as each documents it:
- claude: `-p --output-format stream-json` needs `--verbose`; the message is
  the positional argument; `--include-partial-messages` adds `stream_event`s;
- codebuddy: no `--verbose` needed; its session id is on the result line only;
- agent (cursor): tools are `tool_call` lines; `--stream-partial-output`
  streams the text as assistant lines, then repeats each message whole;
- qwen: the message is `--prompt=…`; result errors carry `error.message`.
A message starting with "fail:" makes the turn fail with the rest as the error.
"""

import json
import os
import sys
import uuid

FLAVORS = {"claude": "claude", "codebuddy": "codebuddy", "agent": "cursor", "cursor-agent": "cursor", "qwen": "qwen"}
VALUED = {
    "--append-system-prompt",
    "--output-format",
    "--input-format",
    "--resume",
    "-r",
    "--model",
    "--permission-mode",
    "--prompt",
    "--allowedTools",
    "--disallowedTools",
    "--approval-mode",
}


def emit(line: dict) -> None:
    print(json.dumps(line), flush=True)


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    """Options (a flag's value is True) and positional words; `--` ends the options."""
    options: dict = {}
    words: list[str] = []
    rest = iter(argv)
    for word in rest:
        if word == "--":
            words.extend(rest)
        elif word.startswith("-") and "=" in word and word.startswith("--"):
            name, value = word.split("=", 1)
            options[name] = value
        elif word in VALUED:
            options[word] = next(rest, "")
        elif word.startswith("-"):
            options[word] = True
        else:
            words.append(word)
    return options, words


def fail_usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def main() -> int:
    flavor = FLAVORS.get(os.path.basename(sys.argv[0]), "claude")
    options, words = parse(sys.argv[1:])
    if options.get("--output-format") != "stream-json":
        return fail_usage("this sample speaks only --output-format stream-json")
    if flavor == "claude" and (options.get("-p") or options.get("--print")) and not options.get("--verbose"):
        return fail_usage("When using --print, --output-format=stream-json requires --verbose")
    message = options.get("--prompt") if flavor == "qwen" else " ".join(words)
    if not isinstance(message, str) or not message:
        return fail_usage("no prompt given")
    resumed = options.get("--resume") or options.get("-r")
    session_id = resumed if isinstance(resumed, str) and resumed else str(uuid.uuid4())
    partial = bool(options.get("--include-partial-messages"))
    where = {"session_id": session_id, "parent_tool_use_id": None}

    init = {"type": "system", "subtype": "init", "cwd": os.getcwd(), "session_id": session_id, "model": "sample"}
    if flavor == "codebuddy":
        del init["session_id"]
    emit(init)

    def say(text: str, pieces: list[str]) -> None:
        if flavor == "cursor":
            if options.get("--stream-partial-output"):
                for piece in pieces:
                    emit(
                        {
                            "type": "assistant",
                            "message": {"role": "assistant", "content": [{"type": "text", "text": piece}]},
                            "session_id": session_id,
                            "timestamp_ms": 1,
                        }
                    )
            emit(
                {
                    "type": "assistant",
                    "message": {"role": "assistant", "content": [{"type": "text", "text": text}]},
                    "session_id": session_id,
                }
            )
            return
        if partial:
            emit(
                {
                    "type": "stream_event",
                    "event": {"type": "message_start", "message": {"id": "msg", "content": []}},
                    **where,
                }
            )
            for piece in pieces:
                emit(
                    {
                        "type": "stream_event",
                        "event": {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": piece},
                        },
                        **where,
                    }
                )
        emit(
            {
                "type": "assistant",
                "message": {"id": "msg", "role": "assistant", "content": [{"type": "text", "text": text}]},
                **where,
            }
        )

    say("Let me look.", ["Let me ", "look."])
    if flavor == "cursor":
        call = {"shellToolCall": {"args": {"command": "ls"}}}
        emit(
            {
                "type": "tool_call",
                "subtype": "started",
                "call_id": "call_1",
                "tool_call": call,
                "session_id": session_id,
            }
        )
        call["shellToolCall"]["result"] = {"success": {"exitCode": 0, "stdout": "README.md\n"}}
        emit(
            {
                "type": "tool_call",
                "subtype": "completed",
                "call_id": "call_1",
                "tool_call": call,
                "session_id": session_id,
            }
        )
    else:
        emit(
            {
                "type": "assistant",
                "message": {
                    "id": "msg",
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}],
                },
                **where,
            }
        )
        emit(
            {
                "type": "user",
                "message": {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "README.md", "is_error": False}
                    ],
                },
                **where,
            }
        )

    result = {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "session_id": session_id,
        "duration_ms": 1,
        "num_turns": 2,
    }
    if message.startswith("fail:"):
        error = message.removeprefix("fail:").strip()
        if flavor == "qwen":
            result.update(subtype="error_during_execution", is_error=True, error={"message": error})
        else:
            result.update(is_error=True, result=error)
        emit(result)
        return 1
    answer = f"{flavor} got: {message}" + (f" (session {session_id} resumed)" if resumed else "")
    say(answer, [answer[: len(answer) // 2], answer[len(answer) // 2 :]])
    result["result"] = answer
    if flavor != "cursor":
        result["usage"] = {"input_tokens": 10, "output_tokens": 5}
    if flavor == "claude":
        result["total_cost_usd"] = 0.001
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
