#!/usr/bin/env python3
"""A stand-in for `aictrl run --format json` (aictrl 0.4.1), which cannot be installed here.

It parses the arguments the way aictrl's `run` command does (stricter: an
unknown option is a usage error, so a wrong profile fails loudly) and writes
the NDJSON events of aictrl's `run.ts`, in the order it writes them, with the
envelope of schema "1" (`type`, `timestamp`, `schemaVersion`, `invocationID`,
`sessionID`). It remembers its sessions under `$HOME/.local/share/aictrl/stand-in-sessions` (aictrl's own directory),
so `--session <id>` continues one.

Link or copy it as `aictrl` on PATH and run `profiles/clis/aictrl.yaml`. What it
does depends on words in the message:

- `tool`: runs a (pretend) bash command first: `permission_granted`, `tool_use`.
- `denied`: its bash command is auto-rejected: `permission_rejected`, a failed `tool_use`.
- `subagent`: a sub-agent session runs a tool (its events carry the sub-session's id).
- `fail`: the provider rejects the API key: `session_error`, `error`, exit 1.
- `crash`: dies after its answer, before `session_complete`.
- With `--thinking`, the answer comes after a `reasoning` part.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
import uuid
from pathlib import Path

STATE = Path(os.environ.get("HOME", "/tmp")) / ".local" / "share" / "aictrl" / "stand-in-sessions"
VALUE_OPTIONS = {
    "--session": "session",
    "-s": "session",
    "--model": "model",
    "-m": "model",
    "--agent": "agent",
    "--format": "format",
    "--title": "title",
    "--dir": "dir",
    "--variant": "variant",
    "--command": "command",
    "--attach": "attach",
    "--port": "port",
    "--file": "file",
    "-f": "file",
}
FLAG_OPTIONS = {
    "--continue": "continue",
    "-c": "continue",
    "--fork": "fork",
    "--share": "share",
    "--thinking": "thinking",
}


class Run:
    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode
        self.invocation = str(uuid.uuid4())
        self.session = ""
        self.sequence = 0

    def emit(self, kind: str, **data: object) -> None:
        if not self.json_mode:
            return
        envelope: dict[str, object] = {
            "type": kind,
            "timestamp": int(time.time() * 1000),
            "schemaVersion": "1",
            "invocationID": self.invocation,
        }
        if self.session and not kind.startswith("invocation_"):
            envelope["sessionID"] = self.session
        print(json.dumps({**envelope, **data}, ensure_ascii=False), flush=True)

    def part(self, kind: str, event: str, session: str = "", **fields: object) -> None:
        self.sequence += 1
        part = {
            "id": "prt_" + secrets.token_hex(8),
            "sessionID": session or self.session,
            "messageID": "msg_" + secrets.token_hex(8),
            "type": kind,
            **fields,
        }
        self.emit(event, part=part, sequenceNum=self.sequence)


def parse(argv: list[str]) -> tuple[dict[str, object], list[str]]:
    if not argv or argv[0] != "run":
        sys.exit("aictrl-like: only `aictrl run` is implemented")
    options: dict[str, object] = {}
    words: list[str] = []
    rest = iter(argv[1:])
    for arg in rest:
        if arg == "--":
            words.extend(rest)
            break
        name, _, attached = arg.partition("=")
        if name in VALUE_OPTIONS:
            value = attached if attached else next(rest, None)
            if value is None:
                sys.exit(f"aictrl-like: {name} needs a value")
            options[VALUE_OPTIONS[name]] = value
        elif arg in FLAG_OPTIONS:
            options[FLAG_OPTIONS[arg]] = True
        elif arg.startswith("-") and arg != "-":
            print(f"aictrl-like: unknown option {arg}", file=sys.stderr)
            sys.exit(1)
        else:
            words.append(arg)
    return options, words


def main() -> int:
    options, words = parse(sys.argv[1:])
    run = Run(options.get("format") == "json")
    run.emit("invocation_start")
    # aictrl's own quirk: words are joined with spaces, a word holding a space is quoted.
    message = " ".join(f'"{word}"' if " " in word else word for word in words)
    if not sys.stdin.isatty():
        message += "\n" + sys.stdin.read()  # aictrl reads all of a non-terminal stdin, like this
    if not message.strip():
        run.emit(
            "invocation_error",
            phase="validation",
            code="INVOCATION_EMPTY_INPUT",
            message="Invocation failed during validation",
        )
        run.emit("invocation_complete", status="error", durationMs=1)
        print("Error: You must provide a message or a command", file=sys.stderr)
        return 1
    message = message.strip()

    STATE.mkdir(parents=True, exist_ok=True)
    resumed = str(options.get("session", ""))
    if resumed:
        if not (STATE / f"{resumed}.json").exists():
            run.emit(
                "invocation_error",
                phase="session",
                code="INVOCATION_SESSION_CREATE_FAILED",
                message="Invocation failed during session",
            )
            run.emit("invocation_complete", status="error", durationMs=3)
            print("Error: Session not found", file=sys.stderr)
            return 1
        run.session = resumed
    else:
        run.session = "ses_" + secrets.token_hex(13)
    history_file = STATE / f"{run.session}.json"
    history: list[str] = json.loads(history_file.read_text()) if history_file.exists() else []

    session_start: dict[str, object] = {
        "schemaVersion": "1",
        "permissions": [
            {"permission": "question", "action": "deny", "pattern": "*"},
            {"permission": "plan_enter", "action": "deny", "pattern": "*"},
            {"permission": "plan_exit", "action": "deny", "pattern": "*"},
        ],
    }
    if "model" in options:
        session_start["model"] = options["model"]
    run.emit("session_start", **session_start)
    run.emit(
        "tool_catalog", tools=[{"name": "bash", "source": "builtin"}, {"name": "read", "source": "builtin"}], skills=[]
    )

    def message_complete(finish: str = "stop") -> None:
        run.emit(
            "message_complete",
            messageID="msg_" + secrets.token_hex(8),
            modelID="fake-model",
            providerID="fake",
            agent="build",
            context={"used": 110, "limit": 200000, "ratio": 0.00055},
            cost=0.001,
            tokens={"total": 130, "input": 100, "output": 20, "reasoning": 0, "cache": {"read": 10, "write": 0}},
            usageStatus="reported",
            status="completed",
            finish=finish,
        )

    if "fail" in message:
        run.emit(
            "message_complete",
            messageID="msg_" + secrets.token_hex(8),
            modelID="fake-model",
            providerID="fake",
            agent="build",
            context=None,
            cost=0,
            tokens=None,
            usageStatus="missing",
            status="error",
        )
        run.emit("session_error", reason="auth", code="401", message="Incorrect API key provided")
        run.emit(
            "error",
            error={
                "name": "ProviderAuthError",
                "data": {"providerID": "fake", "message": "Incorrect API key provided"},
            },
            sourceSessionID=run.session,
        )
        run.emit("session_complete", durationMs=5, error="Incorrect API key provided")
        run.emit("invocation_complete", status="error", durationMs=6, sessionID=run.session)
        return 1

    if "tool" in message or "denied" in message or "subagent" in message:
        run.part("step-start", "step_start")
        if "subagent" in message:
            child = "ses_" + secrets.token_hex(13)
            run.emit("subagent_start", subagentSessionID=child, parentSessionID=run.session, title="Look around")
            run.part(
                "tool",
                "tool_use",
                session=child,
                callID="call_child",
                tool="read",
                state={
                    "status": "completed",
                    "input": {"filePath": "README.md"},
                    "output": "# readme",
                    "title": "README.md",
                    "metadata": {},
                },
            )
            run.emit("subagent_complete", subagentSessionID=child, parentSessionID=run.session)
        if "denied" in message:
            run.emit(
                "permission_rejected",
                callID="call_1",
                tool="bash",
                permission="bash",
                patterns=["rm -rf build"],
                input={"command": "rm -rf build"},
            )
            run.part(
                "tool",
                "tool_use",
                callID="call_1",
                tool="bash",
                state={
                    "status": "error",
                    "input": {"command": "rm -rf build"},
                    "error": "The user rejected permission to use this specific tool call.",
                },
            )
        elif "tool" in message:
            run.emit(
                "permission_granted",
                callID="call_1",
                tool="bash",
                permission="bash",
                patterns=["ls"],
                input={"command": "ls"},
            )
            run.part(
                "tool",
                "tool_use",
                callID="call_1",
                tool="bash",
                state={
                    "status": "completed",
                    "input": {"command": "ls", "description": "List files"},
                    "output": "README.md\n",
                    "title": "ls",
                    "metadata": {"exit": 0, "output": "README.md\n"},
                },
            )
        run.part("step-finish", "step_finish", reason="tool-calls")
        message_complete(finish="tool-calls")

    run.part("step-start", "step_start")
    if options.get("thinking"):
        run.part("reasoning", "reasoning", text="The user wants an echo.", time={"start": 1, "end": 2})
    history.append(message)
    history_file.write_text(json.dumps(history))
    answer = f"turn {len(history)} of {run.session}: you said: {message}"
    if len(history) > 1:
        answer += f"\nlast time you said: {history[-2]}"
    run.part("text", "text", text=answer, time={"start": 1, "end": 2})
    if "crash" in message:
        return 0
    run.part("step-finish", "step_finish", reason="stop")
    message_complete()
    run.emit("session_complete", durationMs=12, error=None)
    run.emit("invocation_complete", status="completed", durationMs=15, sessionID=run.session)
    if not run.json_mode:
        print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
