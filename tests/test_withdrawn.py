"""A request the agent withdraws while the bot decides: the bot is told, and its late answer reaches nobody.

The agent is a small Python script speaking Claude Code's stream-json control
protocol (`protocol: claude-sdk`): it asks (a permission for Bash, or an
AskUserQuestion), waits until the test says the bot is deciding, withdraws
the request (`control_cancel_request`), then waits again — the bot answers
meanwhile — and ends the turn. Another speaks codex app-server's JSON-RPC
and resolves its command approval on its own (`serverRequest/resolved`). It records every line the bridge writes to it,
so the test sees that no answer to the withdrawn request was written. Gates
are FIFOs the test opens: no timer is involved.

The same holds through the Python host, `agent-bridge serve`, the network
door (its HTTP event stream and its WebSocket), the fleet (a worker and a
gateway on PostgreSQL) and `chat`'s prompt.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml
from httpx_ws import aconnect_ws
from servekit import StdioServe
from terminal import Terminal

import bridge
from bridge import QuestionRequest, RequestWithdrawn, Turn
from bridge.host.runtime import open_host
from bridge.network.door import DoorLimits
from bridge.network.listen import parse_address, serve_network
from bridge.permissions import PermissionRequest

DEADLINE = 10

AGENT = textwrap.dedent(
    """\
    import json, os, sys
    ASKS = {
        "Bash": {"command": "rm -rf build"},
        "AskUserQuestion": {"questions": [{"question": "Which colour?", "header": "Colour", "multiSelect": False,
                                           "options": [{"label": "Red"}, {"label": "Blue"}]}]},
    }
    def say(**message):
        sys.stdout.write(json.dumps(message) + "\\n")
        sys.stdout.flush()
    def gate():
        with open(os.environ["GATE"]) as fifo:  # returns once the test opened it for writing and closed it
            fifo.read()
    for line in sys.stdin:
        with open(os.environ["RECORD"], "a") as record:
            record.write(line)
        message = json.loads(line)
        if message["type"] == "control_request" and message["request"]["subtype"] == "initialize":
            say(type="control_response", response={"subtype": "success", "request_id": message["request_id"],
                                                   "response": {}})
        elif message["type"] == "user":
            tool = os.environ["TOOL"]
            say(type="system", subtype="init", session_id="s-1")
            say(type="control_request", request_id="r1",
                request={"subtype": "can_use_tool", "tool_name": tool, "input": ASKS[tool]})
            gate()  # the bot is deciding
            say(type="control_cancel_request", request_id="r1")
            gate()  # the bot answered, late
            say(type="result", subtype="success", is_error=False, result="went on without it", session_id="s-1")
    """
)


# The same agent as codex app-server (`protocol: codex-app-server`): it asks to run a command, and resolves the
# approval on its own (`serverRequest/resolved`).
CODEX_AGENT = textwrap.dedent(
    """\
    import json, os, sys
    def say(**message):
        sys.stdout.write(json.dumps(message) + "\\n")
        sys.stdout.flush()
    def gate():
        with open(os.environ["GATE"]) as fifo:
            fifo.read()
    turn = {"threadId": "th-1", "turnId": "T1"}
    for line in sys.stdin:
        with open(os.environ["RECORD"], "a") as record:
            record.write(line)
        message = json.loads(line)
        method = message.get("method")
        if method == "initialize":
            say(id=message["id"], result={"userAgent": "scripted"})
        elif method == "thread/start":
            say(id=message["id"], result={"thread": {"id": "th-1"}, "model": "scripted"})
        elif method == "turn/start":
            say(id=message["id"], result={"turn": {"id": "T1", "status": "inProgress", "items": []}})
            say(id=900, method="item/commandExecution/requestApproval",
                params={**turn, "itemId": "c1", "command": "rm -rf build"})
            gate()  # the bot is deciding
            say(method="serverRequest/resolved", params={"threadId": "th-1", "requestId": 900})
            gate()  # the bot answered, late
            say(method="item/completed",
                params={**turn, "item": {"type": "agentMessage", "id": "m1", "text": "went on without it"}})
            say(method="turn/completed", params={"threadId": "th-1", "turn": {"id": "T1", "status": "completed"}})
    """
)


def write_profiles(tmp_path: Path, tool: str) -> tuple[Path, Path, Path]:
    """The profiles directory (profile `asker`), the agent's gate (a FIFO) and the file recording its stdin. `tool`
    is what the agent asks for: `Bash` or `AskUserQuestion` (claude-sdk), `command_execution` (codex app-server)."""
    codex = tool == "command_execution"
    (tmp_path / "agent.py").write_text(CODEX_AGENT if codex else AGENT)
    gate, record = tmp_path / "gate", tmp_path / "stdin.jsonl"
    os.mkfifo(gate)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    profile = {
        "command": [sys.executable, str(tmp_path / "agent.py")],
        "protocol": "codex-app-server" if codex else "claude-sdk",
        "env": {"GATE": str(gate), "RECORD": str(record), "TOOL": tool},
        "permissions": {"ask": ["Bash", "command_execution"], "timeout_secs": 60},
        "kill_grace_secs": 2,
    }
    (profiles / "asker.yaml").write_text(yaml.safe_dump(profile))
    return profiles, gate, record


@contextmanager
def within(what: str) -> Iterator[None]:
    """`what` must be done within `DEADLINE`, else the test fails saying so."""
    try:
        with trio.fail_after(DEADLINE):
            yield
    except trio.TooSlowError:
        raise AssertionError(f"not within {DEADLINE} s: {what}") from None


async def open_gate(gate: Path) -> None:
    """Let the agent past its gate (opening a FIFO for writing waits for its reader)."""
    with within("the agent reaches its gate"):
        await trio.to_thread.run_sync(lambda: open(gate, "w").close(), abandon_on_cancel=True)


def open_gate_now(gate: Path) -> None:
    """`open_gate` for a test without trio."""
    opener = threading.Thread(target=lambda: open(gate, "w").close(), daemon=True)
    opener.start()
    opener.join(DEADLINE)
    assert not opener.is_alive(), f"the agent did not reach its gate within {DEADLINE} s"


def answers_written(record: Path) -> list[dict[str, Any]]:
    """What the bridge wrote to the agent in answer to its request (claude-sdk's r1, codex's 900)."""
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return [
        line
        for line in lines
        if (line.get("type") == "control_response" and line["response"]["request_id"] == "r1")
        or (line.get("id") == 900 and "method" not in line)
    ]


@pytest.mark.parametrize("tool", ["Bash", "AskUserQuestion", "command_execution"])
async def test_the_host_is_told_of_a_withdrawn_request_and_its_late_answer_is_refused(
    tmp_path: Path, tool: str
) -> None:
    profiles, gate, record = write_profiles(tmp_path, tool)
    events: list[Any] = []
    asked, withdrawn = trio.Event(), trio.Event()

    def on_event(event: Any) -> None:
        events.append(event)
        if isinstance(event, PermissionRequest | QuestionRequest):
            asked.set()
        elif isinstance(event, RequestWithdrawn):
            withdrawn.set()

    async with bridge.open_host(profiles, state=tmp_path / "state.sqlite3") as host:
        async with trio.open_nursery() as nursery:
            result: list[bridge.TurnResult] = []

            async def submit() -> None:
                result.append(await host.submit("asker", "c", Turn("go"), turn_id="t1", on_event=on_event))

            nursery.start_soon(submit)
            with within("the agent asks"):
                await asked.wait()
            await open_gate(gate)
            with trio.move_on_after(DEADLINE):
                await withdrawn.wait()
            assert withdrawn.is_set(), "the host was not told the agent withdrew its request"
            request_id = next(
                event.request_id for event in events if isinstance(event, PermissionRequest | QuestionRequest)
            )
            late = (
                host.answer("t1", request_id, "Red")
                if tool == "AskUserQuestion"
                else host.decide("t1", request_id, True)
            )
            assert late is False  # it waits for no answer: serve calls this unknown_request
            await open_gate(gate)
    [ended] = result
    assert ended.ok and ended.reply == "went on without it", ended.error
    request, gone = [
        event for event in events if isinstance(event, PermissionRequest | QuestionRequest | RequestWithdrawn)
    ]
    assert gone == RequestWithdrawn(request.request_id)
    assert answers_written(record) == []


@pytest.mark.parametrize(
    ("tool", "asks", "late"),
    [
        ("Bash", "permission", "decide"),
        ("AskUserQuestion", "question", "answer"),
        ("command_execution", "permission", "decide"),
    ],
)
async def test_serve_says_withdrawn_and_the_late_answer_is_unknown_request(
    tmp_path: Path, tool: str, asks: str, late: str
) -> None:
    profiles, gate, record = write_profiles(tmp_path, tool)
    serve = StdioServe(profiles, tmp_path / "state.sqlite3", deadline=DEADLINE)
    try:
        serve.send({"type": "turn", "id": "t1", "profile": "asker", "conversation": "c", "message": "go"})
        request_id = serve.until(asks)[-1]["request_id"]
        await open_gate(gate)
        withdrawn = serve.until("withdrawn")[-1]
        assert withdrawn == {"type": "withdrawn", "id": "t1", "request_id": request_id}
        answer = {"allow": True} if late == "decide" else {"answers": "Red"}
        serve.send({"type": late, "id": "t1", "request_id": request_id, **answer})
        refused = serve.until("error")[-1]
        assert (refused["id"], refused["code"]) == ("t1", "unknown_request"), refused
        await open_gate(gate)
        result = serve.until("result")[-1]
        assert (result["outcome"], result["reply"]) == ("ok", "went on without it"), result
    finally:
        assert serve.close() == 0
    assert answers_written(record) == []


def test_chat_drops_a_withdrawn_question_from_the_prompt_saying_so(tmp_path: Path) -> None:
    profiles, gate, record = write_profiles(tmp_path, "AskUserQuestion")
    environ = {name: value for name, value in os.environ.items() if not name.startswith("AGENT_")}
    env = {**environ, "TMPDIR": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "xdg-state"), "TERM": "dumb"}
    terminal = Terminal("chat", str(profiles / "asker.yaml"), env=env)
    try:
        terminal.expect(b"you> ")
        terminal.send(b"go\n")
        assert b"Colour: Which colour?" in terminal.expect(b"(an empty line declines): ")
        open_gate_now(gate)
        terminal.expect(b"the agent withdrew its question: nothing was answered")
        open_gate_now(gate)
        assert b"went on without it" in terminal.expect(b"you> ")
        terminal.send(b"/exit\n")
        assert terminal.exit_code() == 0
    finally:
        terminal.close()
    assert answers_written(record) == []


def test_the_fleet_carries_a_withdrawal_from_worker_to_gateway() -> None:
    from bridge.host.postgres.json_codec import event_from_dict, event_to_dict

    assert event_from_dict(event_to_dict(RequestWithdrawn("r1"))) == RequestWithdrawn("r1")


@asynccontextmanager
async def door(profiles: Path, state: Path) -> AsyncIterator[str]:
    """A listening network door on loopback (no tokens) over `profiles`; yields its base URL."""
    host = open_host(profiles, state=state)
    async with host, trio.open_nursery() as nursery:
        urls = await nursery.start(
            partial(serve_network, host, parse_address("127.0.0.1:0"), tokens=None, limits=DoorLimits())
        )
        yield urls[0]
        nursery.cancel_scope.cancel()


async def test_the_doors_event_stream_says_withdrawn_and_the_late_decide_is_unknown_request(tmp_path: Path) -> None:
    profiles, gate, record = write_profiles(tmp_path, "Bash")
    text, late = "", None
    async with door(profiles, tmp_path / "state.sqlite3") as url, httpx.AsyncClient(base_url=url, timeout=10) as http:
        body = {"id": "t1", "profile": "asker", "conversation": "c", "message": "go"}
        with within("the turn asks, withdraws and ends on the event stream"):
            async with http.stream("POST", "/v1/turns", json=body) as stream:
                async for chunk in stream.aiter_text():
                    text += chunk
                    if not text.endswith("\n\n"):
                        continue
                    kinds = [kind for kind, _ in sse_events(text)]
                    if kinds[-1] == "permission":
                        await open_gate(gate)
                    elif kinds[-1] == "withdrawn" and late is None:
                        request_id = sse_events(text)[-1][1]["request_id"]
                        late = await http.post("/v1/turns/t1/decide", json={"request_id": request_id, "allow": True})
                        await open_gate(gate)
    events = sse_events(text)
    assert [kind for kind, _ in events if kind in ("permission", "withdrawn", "result")] == [
        "permission",
        "withdrawn",
        "result",
    ]
    assert late is not None and late.status_code == 404 and late.json()["code"] == "unknown_request"
    assert events[-1][1]["outcome"] == "ok"
    assert answers_written(record) == []


async def test_the_doors_websocket_says_withdrawn(tmp_path: Path) -> None:
    profiles, gate, record = write_profiles(tmp_path, "AskUserQuestion")
    async with door(profiles, tmp_path / "state.sqlite3") as url, aconnect_ws(f"{url}/v1/ws") as ws:
        with within("the turn asks, withdraws and ends on the WebSocket"):
            await ws.send_text(
                json.dumps({"type": "turn", "id": "t1", "profile": "asker", "conversation": "c"} | {"message": "go"})
            )
            kinds = []
            while "question" not in kinds:
                kinds.append(json.loads(await ws.receive_text())["type"])
            await open_gate(gate)
            while (response := json.loads(await ws.receive_text()))["type"] != "withdrawn":
                pass
            await ws.send_text(
                json.dumps({"type": "answer", "id": "t1", "request_id": response["request_id"], "answers": "Red"})
            )
            while (refused := json.loads(await ws.receive_text()))["type"] != "error":
                pass
            assert refused["code"] == "unknown_request"
            await open_gate(gate)
            while (result := json.loads(await ws.receive_text()))["type"] != "result":
                pass
    assert result["outcome"] == "ok"
    assert answers_written(record) == []


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a text/event-stream body."""
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


async def test_a_bot_behind_the_fleet_is_told_of_a_withdrawn_request_and_its_late_answer_is_refused(
    tmp_path: Path, pg_dsn: str
) -> None:
    from bridge.host.postgres.gateway import RemoteHost
    from bridge.host.postgres.worker import Worker

    profiles, gate, record = write_profiles(tmp_path, "Bash")
    asked, withdrawn = trio.Event(), trio.Event()
    seen: list[Any] = []

    def on_event(event: Any) -> None:
        seen.append(event)
        if isinstance(event, PermissionRequest):
            asked.set()
        elif isinstance(event, RequestWithdrawn):
            withdrawn.set()

    result: list[bridge.TurnResult] = []
    async with trio.open_nursery() as nursery:
        runner = Worker(pg_dsn, profiles, max_concurrent=1, lease_secs=2.0)
        await nursery.start(runner.run)
        async with RemoteHost(pg_dsn, name="bot") as host, trio.open_nursery() as turns:

            async def submit() -> None:
                result.append(await host.submit("asker", "c", Turn("go"), turn_id="t1", on_event=on_event))

            turns.start_soon(submit)
            with within("the agent asks, through the worker and the gateway"):
                await asked.wait()
            await open_gate(gate)
            with within("the gateway tells the bot the request was withdrawn"):
                await withdrawn.wait()
            assert host.decide("t1", seen[-1].request_id, True) is False  # serve --postgres: unknown_request
            await open_gate(gate)
        runner.drain()
    [ended] = result
    assert ended.ok and ended.reply == "went on without it", ended.error
    assert answers_written(record) == []
