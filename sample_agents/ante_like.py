#!/usr/bin/env python3
"""A make-believe Ante daemon speaking `ante serve --stdio` (JSON Lines of OpMsg/EventMsg), for `protocol: ante`.

Ante cannot be installed here; this follows its protocol reference (ops in,
events out, ids `{prefix}_{ULID}`, `parent` = the op an event answers):

- `StartSession` → `SessionStart` + `ExtensionRefreshed`; `ResumeSession` →
  `SessionEnd` for a session in progress, `SessionStart`, `ExtensionRefreshed`,
  then the last 200 events of the session's persisted log, as they were
  written (their ids and parents too; the log also holds the user's inputs as
  `UserInput` events, which are never sent live). An unknown session → `Error`.
- `UserInput` → a turn: `TurnStart`, thinking, text, tools, `UsageUpdate`
  (the session's running totals), `TurnEnd`. Inputs sent during a turn wait
  for it to end. No session yet → `Error`.
- Tools are make-believe (nothing runs). With `policy` other than "Yolo" a
  tool call pauses the turn (`TurnPause{Approval}`) until an
  `ApprovalResponse` answers every tool: `Accept`, `AcceptForSession` (that
  tool is not asked again in this process), `Skip`, `Abort`.
- `Interrupt` ends the turn in progress (`TurnEnd{Interrupted}`), tools still
  open `Cancelled`. `Shutdown`, or end of file on stdin, → `SessionEnd`,
  `Goodbye`, exit 0. A line that is not an OpMsg → `Error`.

Events of a turn are parented to its `UserInput`; after an approval, to the
`ApprovalResponse`; its end after an interrupt, to the `Interrupt`.

What a turn does depends on words in the message: `think` (reasoning first),
`tool` (one Bash call), `tools` (Bash and Read in one pause), `wait` (stops
after its first words until interrupted, 30 s at most), `fail` (the provider
fails: `Error`, `TurnEnd{Error}`), `crash` (exits mid-turn). The reply says
what it was told, and how many earlier messages the session remembers.
Sessions live in `$ANTE_HOME/sessions` (default `$HOME/.ante-like/sessions`).
"""

from __future__ import annotations

import json
import os
import queue
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPLAY_LIMIT = 200
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ID = re.compile(r"(op|evt|ses|step)_[0-7][0-9A-HJKMNP-TV-Z]{25}")
HOME = Path(os.environ.get("ANTE_HOME") or Path(os.environ.get("HOME", "/tmp")) / ".ante-like")
SESSIONS = HOME / "sessions"
MAKE_BELIEVE = {"Bash": ({"command": "ls -la"}, "total 0"), "Read": ({"file_path": "README.md"}, "# README")}
_write = threading.Lock()

# The sentence the bridge adds to a warm turn naming its outbox: an instruction to the model, not the user's words.
OUTBOX_NOTE = re.compile(r"(?:\n\n)?Files for the user: write them to .*? \(they are sent when the turn ends\)\.")


def new_id(prefix: str) -> str:
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    return prefix + "_" + "".join(CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def write(line: str) -> None:
    """One line on stdout; a client that closed it is gone, and the daemon with it (as Ante's does)."""
    with _write:
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):
            os._exit(0)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Stop(Exception):
    """Shutdown, or end of file on stdin: the daemon says goodbye."""


class Interrupted(Exception):
    """An Interrupt op (or an Abort decision) ends the turn; `op_id` is what its end is parented to."""

    def __init__(self, op_id: str) -> None:
        self.op_id = op_id


class Daemon:
    def __init__(self) -> None:
        self.ops: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.deferred: list[dict[str, Any]] = []
        self.session: dict[str, Any] | None = None
        self.log: Path | None = None
        self.always: set[str] = set()  # tools accepted for the session

    # ---------------------------------------------------------------- output

    def emit(self, event: Any, parent: str | None = None, *, persist: bool = True) -> None:
        message = {"timestamp": now(), "id": new_id("evt"), "event": event}
        if parent:
            message["parent"] = parent
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        if persist and self.log is not None:
            with self.log.open("a", encoding="utf-8") as log:
                log.write(line + "\n")
        write(line)

    def record(self, event: Any, parent: str) -> None:
        """Into the session's log only (a user's input is replayed, never sent live)."""
        if self.log is not None:
            message = {"timestamp": now(), "id": new_id("evt"), "event": event, "parent": parent}
            with self.log.open("a", encoding="utf-8") as log:
                log.write(json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n")

    # ---------------------------------------------------------------- input

    def read_stdin(self) -> None:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
                if (
                    not isinstance(message, dict)
                    or not ID.fullmatch(str(message.get("id")))
                    or not str(message["id"]).startswith("op_")
                    or "op" not in message
                ):
                    raise ValueError("expected an OpMsg {op, id: op_<ULID>}")
            except ValueError as err:
                self.emit({"Error": f"invalid OpMsg: {err}"}, persist=False)
                continue
            self.ops.put(message)
        self.ops.put(None)  # end of file: Ante's transport sends Shutdown

    def next_op(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next op (None when `timeout` passes first); raises Stop at Shutdown or end of file."""
        try:
            message = self.ops.get(timeout=timeout) if timeout is None or timeout > 0 else self.ops.get_nowait()
        except queue.Empty:
            return None
        if message is None or message["op"] == "Shutdown":
            raise Stop
        return message

    def during_turn(self, wait: float = 0.0) -> dict[str, Any] | None:
        """Control ops while a turn runs, waiting up to `wait` seconds: an Interrupt raises, an ApprovalResponse
        is returned, anything else waits for the turn to end."""
        deadline = time.monotonic() + wait
        while True:
            message = self.next_op(timeout=max(deadline - time.monotonic(), 0.0))
            if message is None:
                return None
            op = message["op"]
            if op == "Interrupt":
                raise Interrupted(message["id"])
            if isinstance(op, dict) and "ApprovalResponse" in op:
                return message
            self.deferred.append(message)

    # ---------------------------------------------------------------- ops

    def run(self) -> None:
        threading.Thread(target=self.read_stdin, daemon=True).start()
        try:
            while True:
                message = self.deferred.pop(0) if self.deferred else self.next_op()
                if message is not None:
                    self.handle(message)
        except Stop:
            pass
        if self.session is not None:
            self.emit("SessionEnd", persist=False)
        self.emit("Goodbye", persist=False)

    def handle(self, message: dict[str, Any]) -> None:
        op, op_id = message["op"], message["id"]
        name, body = (
            (op, None) if isinstance(op, str) else next(iter(op.items())) if isinstance(op, dict) and op else ("", None)
        )
        if name == "StartSession" and isinstance(body, dict):
            self.start(body, op_id)
        elif name == "ResumeSession" and isinstance(body, dict):
            self.resume(str(body.get("session_id")), op_id)
        elif name == "UserInput" and isinstance(body, str):
            if self.session is None:
                self.emit(
                    {"Error": "session not initialized: send StartSession or ResumeSession first"}, op_id, persist=False
                )
            else:
                self.turn(body, op_id)
        elif name == "ApprovalResponse":
            self.emit({"Error": "no turn is waiting for an approval"}, op_id, persist=False)
        elif name == "Interrupt":
            pass  # nothing runs
        else:
            self.emit({"Error": f"unsupported op: {name or op!r}"}, op_id, persist=False)

    def start(self, config: dict[str, Any], op_id: str) -> None:
        if self.session is not None:
            self.emit("SessionEnd", op_id, persist=False)
        session_id = new_id("ses")
        SESSIONS.mkdir(parents=True, exist_ok=True)
        self.session = {"session_id": session_id, "config": config, "usage": [0, 0]}
        self.log = SESSIONS / f"{session_id}.jsonl"
        (SESSIONS / f"{session_id}.json").write_text(json.dumps(config))
        self.log.touch()
        self.announce(op_id)

    def resume(self, session_id: str, op_id: str) -> None:
        log = SESSIONS / f"{session_id}.jsonl"
        if not ID.fullmatch(session_id) or not session_id.startswith("ses_") or not log.exists():
            self.emit({"Error": f"session not found: {session_id}"}, op_id, persist=False)
            return
        if self.session is not None:
            self.emit("SessionEnd", op_id, persist=False)
        history = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        usage = [0, 0]
        for message in history:
            event = message.get("event")
            if isinstance(event, dict) and "UsageUpdate" in event:
                counts = event["UsageUpdate"]["usage"]
                usage = [counts["input_tokens"], counts["output_tokens"]]
        config = json.loads((SESSIONS / f"{session_id}.json").read_text())
        self.session = {"session_id": session_id, "config": config, "usage": usage}
        self.log = log
        self.announce(op_id)
        for message in history[-REPLAY_LIMIT:]:
            write(json.dumps(message, ensure_ascii=False, separators=(",", ":")))

    def announce(self, op_id: str) -> None:
        assert self.session is not None
        config = self.session["config"]
        self.emit(
            {
                "SessionStart": {
                    "model": {"name": config.get("model") or "make-believe-1", "max_tokens": 8192},
                    "provider": config.get("provider") or "local",
                    "session_id": self.session["session_id"],
                    "cwd": config.get("cwd") or os.getcwd(),
                }
            },
            op_id,
            persist=False,
        )
        self.emit(
            {
                "ExtensionRefreshed": {
                    "session_id": self.session["session_id"],
                    "skills": [],
                    "subagents": [],
                    "mcp_servers": [],
                }
            },
            op_id,
            persist=False,
        )

    # ---------------------------------------------------------------- a turn

    def turn(self, text: str, op_id: str) -> None:
        assert self.session is not None
        text = OUTBOX_NOTE.sub("", text)
        config = self.session["config"]
        streaming = config.get("streaming") is not False
        words = set(re.findall(r"[a-z]+", text.lower()))
        earlier = self.earlier_inputs()
        self.record({"UserInput": text}, op_id)
        turn_id = new_id("step")
        parent = op_id
        self.emit({"TurnStart": {"turn_id": turn_id}}, parent)
        open_tools: list[str] = []
        try:
            if "think" in words and config.get("thinking") != "Disabled":
                self.say("ThinkingDelta", "Thinking", ["Let me ", "think."], streaming, parent)
            if "fail" in words:
                message = "make-believe provider failure: rate limited"
                self.emit({"Error": message}, parent)
                self.emit(
                    {"TurnEnd": {"turn_id": turn_id, "status": {"Error": {"message": message}}, "steps": 1}}, parent
                )
                return
            reply: list[str] = []
            tools = [
                tool
                for tool in (["Bash", "Read"] if "tools" in words else ["Bash"] if "tool" in words else [])
                if tool not in (config.get("disallowed_tools") or ())
            ]
            if tools:
                self.say("MessageDelta", "AgentMessage", ["Let me ", "check."], streaming, parent, repeat=False)
                parent, outcome = self.use_tools(tools, turn_id, parent, open_tools)
                reply.append(outcome + " ")
            answer = f"You said: {text}."
            if earlier:
                answer += f" I remember {len(earlier)} earlier message(s); the last was: {earlier[-1]}."
            pieces = [piece for piece in re.split(r"(?<= )", " ".join(reply) + answer) if piece]
            if "wait" in words:
                self.say("MessageDelta", None, pieces[:1], True, parent)
                self.during_turn(wait=30.0)  # an interrupt raises
                pieces = pieces[1:]
            if "crash" in words:
                self.say("MessageDelta", None, pieces[:1], True, parent)
                os._exit(3)
            self.say("MessageDelta", "AgentMessage", pieces, streaming, parent)
            self.count_usage(len(text.split()) + 20, len(pieces), parent)
            self.emit({"TurnEnd": {"turn_id": turn_id, "status": "Completed", "steps": 2 if tools else 1}}, parent)
        except Interrupted as interrupt:
            for tool_id in open_tools:
                self.emit(
                    {"ToolEnd": {"tool_use_id": tool_id, "status": "Cancelled", "result_json": None, "is_error": True}},
                    interrupt.op_id,
                )
            self.emit(
                {
                    "TurnEnd": {
                        "turn_id": turn_id,
                        "status": {"Interrupted": {"reason": "interrupted by the user"}},
                        "steps": 1,
                    }
                },
                interrupt.op_id,
            )
        except Stop:
            self.emit(
                {"TurnEnd": {"turn_id": turn_id, "status": {"Interrupted": {"reason": "shutdown"}}, "steps": 1}}, parent
            )
            raise

    def say(
        self, delta: str, whole: str | None, pieces: list[str], streaming: bool, parent: str, *, repeat: bool = True
    ) -> None:
        """Text or thinking: piece by piece, then whole at the end of the step (`repeat`); only whole when not
        streaming. Ante streams a step's text before its tool calls without repeating it (its reference flow)."""
        if streaming:
            for piece in pieces:
                self.during_turn()
                self.emit({delta: piece}, parent)
        if whole is not None and (repeat or not streaming):
            self.emit({whole: "".join(pieces)}, parent)

    def use_tools(self, tools: list[str], turn_id: str, parent: str, open_tools: list[str]) -> tuple[str, str]:
        assert self.session is not None
        calls = [(new_id("step").replace("step_", "tool_use_"), tool) for tool in tools]
        for call_id, tool in calls:
            self.emit({"ToolStart": {"id": call_id, "name": tool, "input": MAKE_BELIEVE[tool][0]}}, parent)
            open_tools.append(call_id)
        decisions = {call_id: "Accept" for call_id, tool in calls}
        asking = [
            (call_id, tool)
            for call_id, tool in calls
            if self.session["config"].get("policy") != "Yolo" and tool not in self.always
        ]
        if asking:
            self.emit(
                {
                    "TurnPause": {
                        "turn_id": turn_id,
                        "reason": {
                            "Approval": {
                                "tools": [
                                    {"id": call_id, "name": tool, "input": MAKE_BELIEVE[tool][0]}
                                    for call_id, tool in asking
                                ],
                                "message": "Allow " + " and ".join(tool for _, tool in asking) + "?",
                            }
                        },
                    }
                },
                parent,
            )
            response = self.during_turn(wait=3600.0)
            if response is None:
                raise Stop
            answer = response["op"]["ApprovalResponse"]
            if answer.get("turn_id") != turn_id:
                self.emit({"Error": "ApprovalResponse for another turn"}, response["id"], persist=False)
            given = {
                pair[0]: pair[1] for pair in answer.get("responses", []) if isinstance(pair, list) and len(pair) == 2
            }
            for call_id, tool in asking:
                decisions[call_id] = given.get(call_id, "Skip")
                if decisions[call_id] == "AcceptForSession":
                    self.always.add(tool)
            parent = response["id"]
            if "Abort" in decisions.values():
                raise Interrupted(parent)
        said = []
        for call_id, tool in calls:
            if decisions[call_id] in ("Accept", "AcceptForSession"):
                self.emit({"ToolUpdate": {"tool_use_id": call_id, "seq": 0, "message": "Running…"}}, parent)
                self.emit(
                    {
                        "ToolEnd": {
                            "tool_use_id": call_id,
                            "status": "Completed",
                            "result_json": {"content": MAKE_BELIEVE[tool][1]},
                            "is_error": False,
                        }
                    },
                    parent,
                )
                said.append(f"{tool}: ran.")
            else:
                self.emit(
                    {"ToolEnd": {"tool_use_id": call_id, "status": "Denied", "result_json": None, "is_error": True}},
                    parent,
                )
                said.append(f"{tool}: skipped.")
            open_tools.remove(call_id)
        return parent, " ".join(said)

    def count_usage(self, input_tokens: int, output_tokens: int, parent: str) -> None:
        assert self.session is not None
        usage = self.session["usage"]
        usage[0] += input_tokens
        usage[1] += output_tokens
        self.emit({"UsageUpdate": {"usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}}, parent)

    def earlier_inputs(self) -> list[str]:
        if self.log is None:
            return []
        inputs = []
        for line in self.log.read_text(encoding="utf-8").splitlines():
            event = json.loads(line).get("event") if line.strip() else None
            if isinstance(event, dict) and isinstance(event.get("UserInput"), str):
                inputs.append(event["UserInput"])
        return inputs


def main() -> None:
    args = sys.argv[1:]
    if args not in (["serve"], ["serve", "--stdio"]):
        print("usage: ante_like.py serve --stdio", file=sys.stderr)
        sys.exit(2)
    Daemon().run()


if __name__ == "__main__":
    main()
