#!/usr/bin/env python3
"""A stand-in for aionrs in `--json-stream` mode, for `protocol: aionrs` (aionrs itself is not installable here).

It speaks aionrs's JSON stream protocol as its document (docs/json-stream-protocol.md, protocol 0.2) and its
source (aionrs 0.2.10: crates/aion-protocol, crates/aion-cli/src/json_stream) describe it: one process per
conversation, JSON lines both ways, stderr for diagnostics only. Its model and its tools are make-believe: it
echoes the message, and a tool "runs" by printing what it would have done.

- Starts with `ready{version, session_id, capabilities}`. `--session-id ID` names a new session (an error if it
  exists), `--resume ID` (or `latest`) loads one and replays nothing; both together are an error, as is an
  unknown id (a line on stderr, exit 1, no ready). Sessions are files in $AIONRS_LIKE_STATE_DIR.
- `message{msg_id, content | input, files}` → `stream_start`, `text_delta`s, `stream_end{usage}`. The text is
  read from `content` (aionrs since 0.1.11) or `input` (up to 0.1.10, and the seed document). With
  AIONRS_LIKE_FIELD=content (or input) it reads only that field and drops a message without it silently, as
  aionrs drops a command it cannot parse. A `message` while another runs is ignored, as aionrs does.
- Words in the message script the turn:
  `tool=NAME` (one or more): asks before each make-believe tool (`tool_request`, all at once, then waits for
  every `tool_approve`/`tool_deny`); Read, Glob, Grep are `info`, Write, Edit `edit`, Bash, ExecCommand,
  Spawn `exec`, any other name `mcp`. A denial is a `tool_cancelled` with the reason; `scope: always`
  approves the tool's category for the rest of the session; `--auto-approve` or `set_mode` yolo skips asking.
  `think`: a `thinking` event first, which says how many messages this process has taken. `hold`: waits for
  `stop` after its first words. `rate-limit`: a retryable provider_error and no text. `flaky`: a retryable
  provider_error, an `info` that it retries, then the answer. `fail`: an engine error (no msg_id, as aionrs's engine reports one), then `stream_end`.
  `crash`: exits (3) in the middle of the turn. `garbage`: a line on stdout that is not JSON.
- The reply says "You said: …", what each tool got, and what was said in the turn before (from the session).
- `stop`: pending tool requests are cancelled and the stream ends with `stream_end`, as the protocol document
  says; with AIONRS_LIKE_EXIT_ON_STOP=1 the process ends instead, with no `stream_end`, as aionrs 0.2 does.
- `stream_end.usage` is the session's running total, as aionrs's (its engine's total_usage, kept in the session).
- `ping` → `pong`; `set_mode` → `info` and `config_changed`; `init_history` is accepted (aionrs only logs it);
  a line that is not JSON or an unknown command → `error{code: protocol_error, msg_id: null}` (the document's
  rule; aionrs itself drops them silently). End of stdin: the process ends.

Environment: AIONRS_LIKE_STATE_DIR (default $TMPDIR/agent-bridge-aionrs-sessions), AIONRS_LIKE_NO_SESSIONS=1
(sessions disabled: no session_id in ready, nothing kept), AIONRS_LIKE_EXIT_ON_STOP=1, AIONRS_LIKE_FIELD,
STREAM_DELAY (seconds between words, default 0.02).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

VERSION = "0.2.10"
CATEGORIES = {
    "Read": "info",
    "Glob": "info",
    "Grep": "info",
    "Write": "edit",
    "Edit": "edit",
    "Bash": "exec",
    "ExecCommand": "exec",
    "Spawn": "exec",
}
ARGUMENTS = {
    "Read": {"file_path": "README.md"},
    "Glob": {"pattern": "**/*.py"},
    "Grep": {"pattern": "TODO"},
    "Write": {"file_path": "notes.txt", "content": "hello\n"},
    "Edit": {"file_path": "notes.txt", "old_string": "hello", "new_string": "hi"},
    "Bash": {"command": "ls -la"},
    "ExecCommand": {"command": "ls -la"},
    "Spawn": {"prompt": "look around"},
}
MODE_APPROVES = {"default": set(), "auto_edit": {"info", "edit"}, "yolo": {"info", "edit", "exec", "mcp"}}
SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_write_lock = threading.Lock()

# The sentence the bridge adds to a warm turn naming its outbox: an instruction to the model, not the user's words.
OUTBOX_NOTE = re.compile(r"(?:\n\n)?Files for the user: write them to .*? \(they are sent when the turn ends\)\.")


def send(event: dict[str, Any]) -> None:
    with _write_lock:
        sys.stdout.write(json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n")
        sys.stdout.flush()


def protocol_error(text: str) -> None:
    send({"type": "error", "msg_id": None, "error": {"code": "protocol_error", "message": text, "retryable": False}})


class Sessions:
    """Sessions as files, like aionrs's session directory; None of them when sessions are disabled."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, session_id: str) -> Path:
        return self.directory / f"{session_id}.json"

    def create(self, session_id: str | None) -> dict[str, Any]:
        if session_id is None:
            session_id = uuid.uuid4().hex[:12]
        elif self.path(session_id).exists():
            raise SystemExit(f"Error: Session ID '{session_id}' already exists")
        session = {"id": session_id, "messages": [], "total_usage": {"input_tokens": 0, "output_tokens": 0}}
        self.save(session)
        return session

    def load(self, session_id: str) -> dict[str, Any]:
        if session_id == "latest":
            saved = sorted(self.directory.glob("*.json"), key=lambda path: path.stat().st_mtime)
            if not saved:
                raise SystemExit("Error: No sessions found")
            session_id = saved[-1].stem
        path = self.path(session_id)
        if not SAFE_ID.fullmatch(session_id) or not path.exists():
            raise SystemExit(f"Error: Session '{session_id}' not found")
        return json.loads(path.read_text())

    def save(self, session: dict[str, Any]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = self.path(session["id"]).with_suffix(".tmp")
        temporary.write_text(json.dumps(session))
        temporary.replace(self.path(session["id"]))


class Agent:
    def __init__(self, options: argparse.Namespace) -> None:
        self.delay = float(os.environ.get("STREAM_DELAY", "0.02"))
        self.field = os.environ.get("AIONRS_LIKE_FIELD", "")
        self.exit_on_stop = os.environ.get("AIONRS_LIKE_EXIT_ON_STOP") == "1"
        self.mode = "yolo" if options.auto_approve else "default"
        self.always: set[str] = set()  # categories approved for the session (scope always)
        self.session: dict[str, Any] | None = None
        self.sessions: Sessions | None = None
        if os.environ.get("AIONRS_LIKE_NO_SESSIONS") != "1":
            state = os.environ.get("AIONRS_LIKE_STATE_DIR") or os.path.join(
                os.environ.get("TMPDIR", "/tmp"), "agent-bridge-aionrs-sessions"
            )
            self.sessions = Sessions(Path(state))
            if options.session_id is not None and not SAFE_ID.fullmatch(options.session_id):
                raise SystemExit(f"Error: invalid session id '{options.session_id}'")
            self.session = (
                self.sessions.load(options.resume)
                if options.resume is not None
                else self.sessions.create(options.session_id)
            )
        self.inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.answers: dict[str, dict[str, Any]] = {}  # call id → its tool_approve / tool_deny
        self.turns = 0  # messages this process took (its `think` says which one it is on)
        self.stopped = False
        self.ended = False  # stdin reached its end
        threading.Thread(target=self.read_commands, daemon=True).start()

    def read_commands(self) -> None:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                command = json.loads(line)
            except ValueError:
                protocol_error("Invalid JSON command")
                continue
            if not isinstance(command, dict) or not isinstance(command.get("type"), str):
                protocol_error("A command is a JSON object with a type")
                continue
            self.inbox.put(command)
        self.inbox.put(None)

    # ------------------------------------------------------------------ between turns

    def run(self) -> int:
        ready: dict[str, Any] = {"type": "ready", "version": VERSION}
        if self.session is not None:
            ready["session_id"] = self.session["id"]
        ready["capabilities"] = self.capabilities()
        send(ready)
        while True:
            command = self.inbox.get()
            if command is None:
                return 0
            kind = command["type"]
            if kind == "message":
                if not self.turn(command):
                    return 0
            elif kind == "stop":
                if self.exit_on_stop:
                    return 0
            elif kind in ("tool_approve", "tool_deny", "init_history"):
                pass  # nothing waits for them between turns
            else:
                self.control(command)

    def capabilities(self) -> dict[str, Any]:
        return {
            "tool_approval": True,
            "image_input": "unknown",
            "thinking": True,
            "effort": False,
            "effort_levels": [],
            "modes": ["default", "auto_edit", "yolo"],
            "current_mode": self.mode,
            "mcp": False,
        }

    def control(self, command: dict[str, Any]) -> None:
        """The commands that are answered at once, in a turn or not."""
        kind = command["type"]
        if kind == "ping":
            send({"type": "pong"})
        elif kind == "set_mode" and command.get("mode") in MODE_APPROVES:
            self.mode = command["mode"]
            send({"type": "info", "msg_id": "", "message": f"mode updated: {self.mode}"})
            send({"type": "config_changed", "capabilities": self.capabilities()})
        elif kind not in ("message", "set_config", "add_mcp_server"):
            protocol_error(f"Unknown command type: {kind[:40]}")

    # ------------------------------------------------------------------ a turn

    def pump(self, *, wait: bool) -> None:
        """Take the commands that arrived while the turn runs (answers, stop, ping); with `wait`, at least one."""
        while True:
            try:
                command = self.inbox.get(block=wait)
            except queue.Empty:
                return
            wait = False
            if command is None:
                self.ended = self.stopped = True
                return
            kind = command["type"]
            if kind == "stop":
                self.stopped = True
            elif kind in ("tool_approve", "tool_deny") and isinstance(command.get("call_id"), str):
                self.answers[command["call_id"]] = command
            elif kind == "message":
                print("aionrs_like: ignoring a message during active message processing", file=sys.stderr)
            elif kind != "init_history":
                self.control(command)

    def text_of(self, command: dict[str, Any]) -> str | None:
        fields = [self.field] if self.field else ["content", "input"]
        for field in fields:
            if isinstance(command.get(field), str):
                return OUTBOX_NOTE.sub("", command[field])
        return None

    def turn(self, command: dict[str, Any]) -> bool:
        """Run one message; False when the process is to end."""
        msg_id, text = command.get("msg_id"), self.text_of(command)
        if not isinstance(msg_id, str) or text is None:
            if self.field:  # aionrs: a command that does not parse is dropped, only logged
                print(f"aionrs_like: invalid protocol command (no {self.field})", file=sys.stderr)
            else:
                protocol_error("message needs a msg_id and its text in content (or input)")
            return True
        self.stopped = False
        self.answers.clear()
        self.turns += 1
        words = text.split()
        previous = self.last_user_message()
        self.remember("user", text)
        send({"type": "stream_start", "msg_id": msg_id})
        if "garbage" in words:
            with _write_lock:
                sys.stdout.write("this line is not JSON\n")
                sys.stdout.flush()
        if "think" in words:
            send(
                {
                    "type": "thinking",
                    "text": f"Turn {self.turns} of this process; the user wrote {len(words)} word(s).",
                    "msg_id": msg_id,
                }
            )
        if "crash" in words:
            send({"type": "text_delta", "text": "Something is wrong", "msg_id": msg_id})
            os._exit(3)
        if "fail" in words:
            send(
                {
                    "type": "error",
                    "msg_id": None,
                    "error": {
                        "code": "engine_error",
                        "message": "the model is not available (make-believe)",
                        "retryable": False,
                    },
                }
            )
            return self.end(msg_id, "", [])
        if "rate-limit" in words or "flaky" in words:
            send(
                {
                    "type": "error",
                    "msg_id": msg_id,
                    "error": {
                        "code": "provider_error",
                        "message": "Rate limit exceeded. Retry after 30s.",
                        "retryable": True,
                    },
                }
            )
            if "rate-limit" in words:
                return self.end(msg_id, "", [])
            send({"type": "info", "msg_id": msg_id, "message": "Stream interrupted, retrying... (1/2)"})
        notes = self.use_tools(msg_id, [word[len("tool=") :] for word in words if word.startswith("tool=")])
        if self.stopped:
            return self.stop(msg_id)
        files = command.get("files")
        if isinstance(files, list) and files:
            notes.append("(files: " + ", ".join(str(name) for name in files) + ")")
        if previous is not None:
            notes.append(f"(last time you said: {previous})")
        reply_words = ["You", "said:", *words]
        shown: list[str] = []
        for index, word in enumerate(reply_words):
            piece = word if index == 0 else " " + word
            send({"type": "text_delta", "text": piece, "msg_id": msg_id})
            shown.append(piece)
            if "hold" in words and index == 0:
                while not self.stopped:
                    self.pump(wait=True)
            time.sleep(self.delay)
            self.pump(wait=False)
            if self.stopped:
                self.remember("assistant", "".join(shown))
                return self.stop(msg_id)
        for note in notes:
            send({"type": "text_delta", "text": "\n" + note, "msg_id": msg_id})
        return self.end(msg_id, "".join(shown) + "".join("\n" + note for note in notes), words)

    def use_tools(self, msg_id: str, names: list[str]) -> list[str]:
        """Ask for every tool at once, wait for every answer, run the allowed ones; what happened, for the reply."""
        if not names:
            return []
        send({"type": "text_delta", "text": "Let me use " + ", ".join(names) + ".", "msg_id": msg_id})
        calls = []
        for index, name in enumerate(names):
            call_id = f"call-{uuid.uuid4().hex[:8]}-{index}"
            category = CATEGORIES.get(name, "mcp")
            arguments = ARGUMENTS.get(name, {"query": "anything"})
            asks = category not in MODE_APPROVES[self.mode] and category not in self.always
            calls.append((call_id, name, category, arguments, asks))
            if asks:
                target = arguments.get("file_path") or arguments.get("command") or arguments.get("pattern") or ""
                send(
                    {
                        "type": "tool_request",
                        "msg_id": msg_id,
                        "call_id": call_id,
                        "tool": {
                            "name": name,
                            "category": category,
                            "args": arguments,
                            "description": f"{name} {target}".strip(),
                        },
                    }
                )
        while not self.stopped and any(asks and call_id not in self.answers for call_id, _, _, _, asks in calls):
            self.pump(wait=True)
        notes = []
        for call_id, name, category, arguments, asks in calls:
            answer = self.answers.get(call_id) if asks else {"type": "tool_approve"}
            if self.stopped:  # nothing runs once stopped; what waited for an answer is cancelled
                if asks:
                    send({"type": "tool_cancelled", "msg_id": msg_id, "call_id": call_id, "reason": "stopped"})
                continue
            assert answer is not None
            if answer["type"] == "tool_deny":
                reason = answer.get("reason") if isinstance(answer.get("reason"), str) else ""
                send({"type": "tool_cancelled", "msg_id": msg_id, "call_id": call_id, "reason": reason})
                notes.append(f"({name} was denied{': ' + reason if reason else ''})")
                continue
            if answer.get("scope") == "always":
                self.always.add(category)
            send({"type": "tool_running", "msg_id": msg_id, "call_id": call_id, "tool_name": name})
            send(
                {
                    "type": "tool_result",
                    "msg_id": msg_id,
                    "call_id": call_id,
                    "tool_name": name,
                    "status": "success",
                    "output": f"{name} did nothing (make-believe): {json.dumps(arguments)}",
                    "output_type": "text",
                }
            )
            notes.append(f"({name} was allowed{' for the session' if answer.get('scope') == 'always' else ''})")
        return notes

    def stop(self, msg_id: str) -> bool:
        if self.ended or self.exit_on_stop:
            return False  # aionrs 0.2 ends on stop, without stream_end
        return self.end(msg_id, None, [])

    def end(self, msg_id: str, reply: str | None, words: list[str]) -> bool:
        if reply:
            self.remember("assistant", reply)
        usage = {"input_tokens": 10 + len(words), "output_tokens": len((reply or "").split())}
        if self.session is not None:
            total = self.session["total_usage"]
            total["input_tokens"] += usage["input_tokens"]
            total["output_tokens"] += usage["output_tokens"]
            self.save()
            usage = dict(total)
        usage["cache_read_tokens"] = 10
        send({"type": "stream_end", "msg_id": msg_id, "usage": usage})
        return not self.ended

    def last_user_message(self) -> str | None:
        messages = self.session["messages"] if self.session is not None else []
        said = [message["text"] for message in messages if message["role"] == "user"]
        return said[-1] if said else None

    def remember(self, role: str, text: str) -> None:
        if self.session is not None:
            self.session["messages"].append({"role": role, "text": text})
            self.save()

    def save(self) -> None:
        if self.session is not None and self.sessions is not None:
            self.sessions.save(self.session)


def options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aionrs", description="a stand-in for aionrs --json-stream")
    parser.add_argument("--json-stream", action="store_true")
    parser.add_argument("--session-id")
    parser.add_argument("--resume")
    parser.add_argument("--auto-approve", action="store_true")
    for short, long in (("-p", "--provider"), ("-k", "--api-key"), ("-b", "--base-url"), ("-m", "--model")):
        parser.add_argument(short, long)
    for flag in (
        "--max-tokens",
        "--max-turns",
        "--system-prompt",
        "--profile",
        "--project-dir",
        "--thinking",
        "--thinking-budget",
        "--compaction",
        "--log-dir",
        "--log-level",
    ):
        parser.add_argument(flag)
    return parser.parse_args(argv)


def main() -> int:
    parsed = options(sys.argv[1:])
    if not parsed.json_stream:
        print("aionrs_like only speaks --json-stream (the REPL is aionrs's own)", file=sys.stderr)
        return 2
    if parsed.resume is not None and parsed.session_id is not None:
        print("Error: Cannot use --resume and --session-id together", file=sys.stderr)
        return 1
    try:
        agent = Agent(parsed)
    except SystemExit as failure:
        print(failure.code, file=sys.stderr)
        return 1
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
