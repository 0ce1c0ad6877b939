"""Bounded memory toward the agent and toward a client (issue 19, section 3).

What the bridge writes to an agent waits in an `StdinQueue` bounded by bytes: an
agent that asks for work and does not read the answers is killed and fails its
turn (`not_reading`), and what waited for it is released. What a dialect keeps
of the calls in flight is bounded in size, not only in number. `serve` holds no
queue toward its client: a client that stops reading stalls serve, it does not
grow it. The agents here are real processes; each test would fail (on an
assertion, before any deadline) with the bound removed.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from conftest import PYTHON, TURN_DEADLINE, assert_no_live_process, process_state, write_agent, write_profile
from test_dialect_acp import in_turn
from test_dialect_acp import line as acp_line
from test_dialect_acp import update as acp_update
from test_dialect_aionrs import started as aionrs_in_turn
from test_dialect_ante import event_line as ante_event_line
from test_dialect_ante import op_id as ante_op_id
from test_dialect_ante import ready as ante_ready
from test_dialect_claude_sdk import encode as claude_sdk_line
from test_dialect_claude_sdk import in_turn as claude_sdk_in_turn
from test_dialect_codex_app_server import in_turn as codex_in_turn
from test_dialect_codex_app_server import note as codex_note

import bridge
from bridge import PermissionRequest, Turn
from bridge.dialects import AgentInput
from bridge.dialects.coding_agents import TEXT_BOUND, ToolCalls
from bridge.dialects.warm import WarmState
from bridge.engine.driver import STDIN_QUEUE_LIMIT_BYTES, StdinQueue
from bridge.engine.warm_agents import WarmAgent

MIB = 1024 * 1024


class OutboxWatch:
    """Every outbox a test's engines made, and the most bytes any of them held unwritten."""

    def __init__(self) -> None:
        self.outboxes: list[StdinQueue] = []
        self.most_waiting = 0


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Iterator[OutboxWatch]:
    seen = OutboxWatch()
    put = StdinQueue.put

    def watched_put(outbox: StdinQueue, data: bytes) -> None:
        if all(known is not outbox for known in seen.outboxes):
            seen.outboxes.append(outbox)
        put(outbox, data)
        seen.most_waiting = max(seen.most_waiting, outbox.waiting)

    monkeypatch.setattr(StdinQueue, "put", watched_put)
    yield seen


# --------------------------------------------------------------------------- the outbox itself


async def test_an_outbox_writes_in_order_and_fails_the_agent_past_its_limit_releasing_what_waited() -> None:
    failed: list[int] = []
    outbox = StdinQueue(lambda: failed.append(outbox.waiting), limit=10)
    outbox.put(b"x" * 25)  # nothing waits: one message over the limit still goes (the largest answer must)
    outbox.put(b"")  # nothing to write: not a message
    assert (outbox.waiting, failed) == (25, [])
    outbox.put(b"y")
    assert (outbox.waiting, outbox.overflowed, failed) == (0, 26, [0])  # dropped before the engine was told
    outbox.put(b"z")
    assert failed == [0] and outbox.waiting == 0  # told once; nothing more is taken

    sender, receiver = trio.testing.memory_stream_one_way_pair()
    written = StdinQueue(lambda: failed.append(-1), limit=10)
    for piece in (b"ab", b"cd", b"efghij"):
        written.put(piece)
    written.close()
    written.put(b"late")  # after close: not taken
    async with trio.open_nursery() as nursery:
        nursery.start_soon(written.write_to, sender)
        data = b""
        with trio.fail_after(TURN_DEADLINE):
            while len(data) < 10:
                data += await receiver.receive_some()
    assert (data, written.waiting, failed) == (b"abcdefghij", 0, [0])


# --------------------------------------------------------------------------- a warm ACP agent

# A raw JSON-RPC agent: it sets a session up, takes the prompt, then never reads its stdin again and asks
# for COUNT answers of about a MiB each — "method not found" for a method with a long id (no grant needed),
# or the text of a file it may read (`fs_read`).
FLOODING_ACP_AGENT = f"""#!{PYTHON}
import json, sys, time
mode, path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
def say(message):
    sys.stdout.write(json.dumps(message) + "\\n")
    sys.stdout.flush()
for line in sys.stdin:
    message = json.loads(line)
    if message.get("method") == "initialize":
        say({{"jsonrpc": "2.0", "id": message["id"], "result": {{"protocolVersion": 1, "agentCapabilities": {{}}}}}})
    elif message.get("method") == "session/new":
        say({{"jsonrpc": "2.0", "id": message["id"], "result": {{"sessionId": "sess-flood"}}}})
    elif message.get("method") == "session/prompt":
        break
padding = "x" * (1 << 20)
for number in range(count):
    if mode == "read":
        say({{"jsonrpc": "2.0", "id": number, "method": "fs/read_text_file",
             "params": {{"sessionId": "sess-flood", "path": path}}}})
    else:
        say({{"jsonrpc": "2.0", "id": f"{{number}}-{{padding}}", "method": "flood/unknown"}})
time.sleep(60)
"""


def flooding_acp_profile(tmp_path: Path, mode: str, count: int) -> bridge.Profile:
    agent = write_agent(tmp_path, "flooding-acp-agent", FLOODING_ACP_AGENT)
    target = tmp_path / "big.txt"
    target.write_text(("a line of text a model might want to read\n" * 100_000)[: 4 * MIB])
    return bridge.Profile.from_mapping(
        {
            "command": [str(agent), mode, str(target), str(count)],
            "protocol": "acp",
            "cwd": str(tmp_path),
            "acp": {"fs_read": mode == "read"},
            "timeout_secs": 5,
            "kill_grace_secs": 0.5,
        },
        profile_dir=tmp_path,
    )


@pytest.mark.parametrize("mode", ["unknown-methods", "read"])
async def test_a_warm_agent_that_asks_and_does_not_read_is_killed_and_fails_its_turn(
    tmp_path: Path, watch: OutboxWatch, mode: str
) -> None:
    count = STDIN_QUEUE_LIMIT_BYTES // MIB + 36  # ~100 MiB of answers, ~1 or 4 MiB each
    profile = flooding_acp_profile(tmp_path, mode, count if mode != "read" else count // 4)
    with trio.fail_after(TURN_DEADLINE):
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            pid = agent.pid
            result = await agent.turn(Turn("flood me"))
            assert not agent.alive  # killed: a pool would not take it back
            await agent.close()
    assert (result.outcome, result.exit_code, result.reply) == ("not_reading", 1, ""), result
    assert result.error.startswith("the agent stopped reading its stdin (") and "MiB" in result.error
    assert result.error_reply.startswith("The agent stopped reading its stdin")
    assert watch.most_waiting <= STDIN_QUEUE_LIMIT_BYTES, watch.most_waiting
    assert [outbox.waiting for outbox in watch.outboxes] == [0]  # released
    assert_no_live_process([pid])


# --------------------------------------------------------------------------- a one-process agent, stdin open

# agentproc-0.4 with a permissions: section keeps the agent's stdin open for the answers, which echo
# each request's id: an agent that asks with long ids and never reads makes every answer a MiB.
FLOODING_AGENTPROC_AGENT = f"""#!{PYTHON}
import json, sys, time
sys.stdin.readline()  # the turn; nothing is read after it
padding = "x" * (1 << 20)
for number in range({STDIN_QUEUE_LIMIT_BYTES // MIB + 36}):
    print(json.dumps({{"type": "permission_request", "request_id": f"{{number}}-{{padding}}", "tool_name": "Read",
                      "input": {{}}}}), flush=True)
time.sleep(60)
"""


async def test_a_one_process_agent_that_asks_and_does_not_read_is_killed_and_fails_its_turn(
    tmp_path: Path, watch: OutboxWatch
) -> None:
    agent = write_agent(tmp_path, "flooding-agentproc-agent", FLOODING_AGENTPROC_AGENT)
    profile = bridge.Profile.from_mapping(
        {"command": [str(agent)], "protocol": "agentproc-0.4", "permissions": {"default": "allow"}, "timeout_secs": 5},
        profile_dir=tmp_path,
    )
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("flood me"))
    assert (result.outcome, result.exit_code, result.reply) == ("not_reading", 1, ""), result
    assert result.error_reply.startswith("The agent stopped reading its stdin")
    assert watch.most_waiting <= STDIN_QUEUE_LIMIT_BYTES, watch.most_waiting
    assert [outbox.waiting for outbox in watch.outboxes] == [0]


# --------------------------------------------------------------------------- what dialects keep of calls in flight

CALLS = 200
LONG = 100_000  # characters of a long id or name: CALLS of them kept would be 20 MB


def kept_bytes(feed: Callable[[int], object]) -> int:
    """What calling `feed(0)` … `feed(CALLS - 1)` leaves allocated (what it returns is dropped)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for number in range(CALLS):
            feed(number)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def long_id(number: int) -> str:
    return f"{number}-" + "x" * LONG


def test_acp_keeps_little_of_tool_calls_with_long_ids_or_long_kinds() -> None:
    by_id, by_kind = in_turn(), in_turn()
    kept_for_ids = kept_bytes(
        lambda number: by_id.feed(
            acp_line(acp_update("tool_call", toolCallId=long_id(number), title="t", kind="read", status="pending"))
        )
    )
    kept_for_kinds = kept_bytes(
        lambda number: by_kind.feed(
            acp_line(
                acp_update("tool_call", toolCallId=f"call-{number}", title="t", kind=long_id(number), status="pending")
            )
        )
    )
    assert kept_for_ids < 2 * MIB and kept_for_kinds < 2 * MIB, (kept_for_ids, kept_for_kinds)


def test_tool_calls_of_the_json_families_keep_little_of_long_ids_or_long_names() -> None:
    by_id, by_name = ToolCalls(), ToolCalls()
    kept_for_ids = kept_bytes(lambda number: by_id.started("Read", {"path": "/a"}, long_id(number)))
    kept_for_names = kept_bytes(lambda number: by_name.started(long_id(number), {"path": "/a"}, f"call-{number}"))
    assert kept_for_ids < 2 * MIB and kept_for_names < 2 * MIB, (kept_for_ids, kept_for_names)


def test_ante_keeps_little_of_tool_calls_with_long_ids_or_long_names() -> None:
    by_id, by_name = ante_ready(), ante_ready()
    parents = [ante_op_id(ante.prompt(Turn("go"))) for ante in (by_id, by_name)]
    for ante, parent in zip((by_id, by_name), parents):
        ante.feed(ante_event_line({"TurnStart": {"turn_id": "step_01"}}, parent))
    kept_for_ids = kept_bytes(
        lambda number: by_id.feed(
            ante_event_line({"ToolStart": {"id": long_id(number), "name": "Read", "input": {}}}, parents[0])
        )
    )
    kept_for_names = kept_bytes(
        lambda number: by_name.feed(
            ante_event_line({"ToolStart": {"id": f"t{number}", "name": long_id(number), "input": {}}}, parents[1])
        )
    )
    assert kept_for_ids < 2 * MIB and kept_for_names < 2 * MIB, (kept_for_ids, kept_for_names)


def test_codex_keeps_little_of_what_it_says_before_naming_its_turn() -> None:
    """A codex app-server that never answers turn/start but streams on: what waits for the turn's id is bounded."""
    codex = codex_in_turn(turn_id="")
    kept = kept_bytes(
        lambda number: codex.feed(codex_note("item/agentMessage/delta", turnId="T1", itemId="m", delta=long_id(number)))
    )
    assert kept < 8 * MIB, kept  # all of it would be 20 MB


def test_codex_keeps_little_of_the_ids_of_the_messages_it_streams() -> None:
    codex = codex_in_turn()
    kept = kept_bytes(
        lambda number: codex.feed(codex_note("item/agentMessage/delta", turnId="T1", itemId=long_id(number), delta="x"))
    )
    assert kept < 2 * MIB, kept


def test_claude_sdk_keeps_a_bounded_reply_of_the_results_of_a_turn_that_waits_for_a_steered_message() -> None:
    """A CLI that never echoes a steered message keeps the bridge turn open; its results are the reply, bounded."""
    sdk = claude_sdk_in_turn()
    sdk.steer(Turn("and then?"), "s1")
    result = {"type": "result", "subtype": "success", "is_error": False}
    kept = kept_bytes(lambda number: sdk.feed(claude_sdk_line({**result, "result": long_id(number)})))
    assert sdk.state is WarmState.IN_TURN
    assert kept < TEXT_BOUND + 2 * MIB, kept  # all of it would be 20 MB


def test_aionrs_keeps_what_a_tool_requests_arguments_say_not_the_arguments() -> None:
    aionrs = aionrs_in_turn()

    def ask(number: int) -> None:
        events = aionrs.feed(
            json.dumps(
                {
                    "type": "tool_request",
                    "msg_id": "bridge-1",
                    "call_id": f"c{number}",
                    "tool": {"name": "Write", "args": {"file_path": f"/src/{number}.py", "content": "x" * LONG}},
                }
            ).encode()
            + b"\n"
        )
        [request] = [event for event in events if isinstance(event, PermissionRequest)]
        assert request.title == f"/src/{number}.py"

    assert kept_bytes(ask) < 2 * MIB
    [*_, started] = aionrs.feed(b'{"type":"tool_running","msg_id":"bridge-1","call_id":"c7","tool_name":"Write"}\n')
    assert (started.tool, started.title, started.status) == ("Write", "/src/7.py", "started")


def test_aionrs_denies_at_once_a_tool_request_whose_answer_it_could_not_match() -> None:
    aionrs = aionrs_in_turn()
    call_id = long_id(1)
    events = aionrs.feed(
        json.dumps(
            {"type": "tool_request", "msg_id": "bridge-1", "call_id": call_id, "tool": {"name": "Read", "args": {}}}
        ).encode()
        + b"\n"
    )
    answers = [json.loads(event.data) for event in events if isinstance(event, AgentInput)]
    assert answers == [{"type": "tool_deny", "call_id": call_id, "reason": "the bridge cannot keep track of this call"}]
    assert not [event for event in events if isinstance(event, PermissionRequest)]


# --------------------------------------------------------------------------- serve, and a client that never reads

# Writes `AGENT_PARTIAL` lines of 64 KiB, 160 MiB in all, and records its pid first.
LOUD_AGENT = f"""#!{PYTHON}
import os, sys
with open(os.environ["PIDS"], "a") as pids:
    pids.write(f"{{os.getpid()}}\\n")
line = b'AGENT_PARTIAL:"' + b"p" * 65536 + b'"\\n'
for _ in range(2560):
    sys.stdout.buffer.write(line)
print("done")
"""


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def test_serve_with_a_client_that_never_reads_stalls_without_growing_and_exits_1_when_it_leaves(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    pids = tmp_path / "pids"
    write_agent(tmp_path, "loud", LOUD_AGENT)
    write_profile(
        profiles,
        f"command: [{tmp_path / 'loud'}]\ntimeout_secs: 1.5\nkill_grace_secs: 0.2\n"
        f"max_reply_chars: null\nenv: {{PIDS: {pids}}}\n",
        "loud.yaml",
    )  # every partial is forwarded
    with open(tmp_path / "serve.log", "wb") as log:
        serve = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bridge",
                "serve",
                "--profiles",
                str(profiles),
                "--state",
                str(tmp_path / "state.sqlite3"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
        )
    assert serve.stdin is not None and serve.stdout is not None
    try:
        serve.stdin.write(b'{"type": "stats", "id": "before"}\n')
        serve.stdin.flush()
        assert json.loads(serve.stdout.readline())["type"] == "stats"  # the last line this client reads
        baseline_kib = memory_kib(serve.pid, "VmHWM")
        for number in range(3):
            serve.stdin.write(
                json.dumps(
                    {"type": "turn", "id": number, "profile": "loud", "conversation": f"c{number}", "message": "shout"}
                ).encode()
                + b"\n"
            )
        serve.stdin.flush()
        # Each agent, unread, blocks on its stdout and is stopped at its timeout: 480 MiB never reach serve.
        deadline = time.monotonic() + TURN_DEADLINE
        while time.monotonic() < deadline:
            started = pids.read_text().split() if pids.exists() else []
            if len(started) == 3 and all(process_state(int(pid)) in (None, "Z") for pid in started):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the agents did not all end at their timeout: {pids.read_text()!r}")
        grown_kib = memory_kib(serve.pid, "VmHWM") - baseline_kib
        assert grown_kib < 64 * 1024, f"serve grew by {grown_kib} KiB for a client that reads nothing"
        serve.stdout.close()  # the client goes away: serve cancels what is left and exits 1
        assert serve.wait(timeout=TURN_DEADLINE) == 1, (tmp_path / "serve.log").read_text()[-3000:]
    finally:
        serve.kill()
        serve.wait()
        serve.stdin.close()
    assert_no_live_process([int(pid) for pid in pids.read_text().split()])
