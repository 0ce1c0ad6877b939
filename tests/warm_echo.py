"""A tiny warm protocol for testing the warm engine itself (bridge/engine/warm_agents.py, the host's pool).

Not a family anyone ships: one JSON object per line, both ways.

    bridge → agent: {"op": "hello", "session": ID}  {"op": "prompt", "text": …}  {"op": "answer", "id", "allow"}
                    {"op": "cancel"}  {"op": "bye"}
    agent → bridge: {"ev": "ready", "session": ID}  {"ev": "delta", "text"}  {"ev": "ask", "id", "tool"}
                    {"ev": "done", "reason"}  {"ev": "error", "text"}

`AGENT` is the agent (run by the test's Python); `WarmEcho` its dialect; `register` installs the
protocol `test-warm` for one test.
"""

from __future__ import annotations

import json
import sys
from typing import Any, ClassVar

from bridge.dialects import (
    PROTOCOLS,
    ErrorEvent,
    JsonLinesDialect,
    PartialEvent,
    ProtocolInfo,
    Ready,
    ReplyEvent,
    TurnEnd,
)
from bridge.dialects.settings import JsonSettings
from bridge.permissions import Decision, PermissionRequest

AGENT = f"""#!{sys.executable}
import json, os, sys, time, uuid
STATE = os.environ.get("STATE", "/tmp")
def say(**event):
    sys.stdout.write(json.dumps(event) + "\\n"); sys.stdout.flush()
def history(session):
    path = os.path.join(STATE, session + ".json")
    return json.load(open(path)) if os.path.exists(path) else None, path
session = None
for line in sys.stdin:
    message = json.loads(line)
    op = message["op"]
    if op == "hello":
        if os.environ.get("FAIL_START"):
            say(ev="error", text="no session for you"); sys.exit(3)
        if os.environ.get("SLOW_START"):
            time.sleep(60)
        known, _ = history(message["session"]) if message["session"] else (None, None)
        session = message["session"] if known is not None else uuid.uuid4().hex
        say(ev="replayed", text="an old message")  # a resumed session's history: not this turn's output
        say(ev="ready", session=session)
    elif op == "prompt":
        text = message["text"]
        said, path = history(session)
        said = said or []
        if text == "crash":
            os._exit(7)
        if text.startswith("ask"):
            say(ev="ask", id="q1", tool=text.split()[1] if " " in text else "Bash")
            answer = json.loads(sys.stdin.readline())
            if answer["op"] == "cancel":
                say(ev="done", reason="cancelled"); continue
            text = "allowed" if answer["allow"] else "denied"
        if text == "talk then hang":  # output, then silence until the cancel
            say(ev="delta", text="talking ")
            sys.stdin.readline()
            say(ev="done", reason="cancelled"); continue
        if text.startswith("trickle"):  # "trickle COUNT PAUSE": a word every PAUSE seconds
            _, count, pause = text.split()
            for number in range(int(count)):
                time.sleep(float(pause)); say(ev="delta", text=f"{{number}} ")
            say(ev="done", reason="end_turn"); continue
        if text.startswith("hang"):
            if text == "hang hard":
                while True: time.sleep(1)
            line = sys.stdin.readline()  # a cancel
            say(ev="done", reason="cancelled"); continue
        if text == "fail":
            say(ev="error", text="the model refused"); say(ev="done", reason="refusal"); continue
        for word in text.split():
            say(ev="delta", text=word + " ")
        said.append(text)
        json.dump(said, open(path, "w"))
        say(ev="delta", text=f"(turn {{len(said)}}, pid {{os.getpid()}})")
        say(ev="done", reason="end_turn")
    elif op == "bye":
        sys.exit(0)
"""


class WarmEcho(JsonLinesDialect):
    name: ClassVar[str] = "test-warm"
    Settings: ClassVar[type] = JsonSettings

    def __init__(self, context: Any, *, session_id: str, cwd: str) -> None:
        super().__init__(context, None)  # type: ignore[arg-type]
        self.session_id = session_id
        self.text: list[str] = []
        self.in_turn = False
        self.ready = False

    def open(self) -> bytes:
        return _line(op="hello", session=self.session_id)

    def prompt(self, turn: Any, outbox: str = "") -> bytes:
        self.text = []
        self.in_turn = True
        return _line(op="prompt", text=turn.message)

    def cancel(self) -> bytes:
        return _line(op="cancel")

    def answer(self, request: PermissionRequest, decision: Decision) -> bytes:
        return _line(op="answer", id=request.request_id, allow=decision.allow)

    def shutdown(self) -> bytes:
        return _line(op="bye")

    def on_object(self, message: dict[str, Any]) -> list[Any]:
        kind = message.get("ev")
        if kind == "ready":
            self.ready = True
            return [Ready(message["session"])]
        if kind == "error" and not self.ready:
            return [ErrorEvent(message["text"])]  # why the session could not start
        if not self.in_turn:
            return []  # history replayed while resuming, and anything between turns
        if kind == "delta":
            self.text.append(message["text"])
            return [PartialEvent(message["text"])]
        if kind == "ask":
            return [PermissionRequest(message["id"], message["tool"], title="make-believe")]
        if kind == "error":
            return [ErrorEvent(message["text"])]
        if kind == "done":
            self.in_turn = False
            return [ReplyEvent("".join(self.text)), TurnEnd(message["reason"])]
        return []

    def close(self) -> list[Any]:
        events = super().close()
        if self.in_turn:
            events.append(ErrorEvent("the agent ended without finishing its turn", unfinished=True))
        return events


def _line(**message: Any) -> bytes:
    return (json.dumps(message) + "\n").encode()


def register(monkeypatch: Any) -> None:
    """Make `protocol: test-warm` known for one test."""
    import bridge.profile.model

    monkeypatch.setitem(PROTOCOLS, "test-warm", ProtocolInfo("unused", "WarmEcho", JsonSettings, warm=True))
    real = bridge.profile.model.dialect_class
    monkeypatch.setattr(
        bridge.profile.model, "dialect_class", lambda protocol: WarmEcho if protocol == "test-warm" else real(protocol)
    )
