"""`agent-bridge mcp`: every profile a tool, driven by the official MCP SDK's client over stdio and Streamable HTTP,
and by raw JSON-RPC lines for what a well-behaved client never sends."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import yaml
from agents_cache import npm_binary
from chatkit import asking_profile
from conftest import CLI_PROFILES, PYTHON, SAMPLE_AGENTS, assert_no_live_process, read_pids, write_agent
from doorkit import write_tokens
from fake_anthropic import claude_env, message_stream, result_text, tool_results
from fake_api import FakeApi, Json, Request
from fleetkit import eventually
from mcp.client import session as mcp_client_session
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from procfs import ancestors, process_state

from bridge.engine.launch import looks_like_credential

DEADLINE = 20

HANGING_AGENT = f"""\
#!{PYTHON}
import os, time
with open(os.environ["PID_FILE"], "a") as out:
    out.write(f"{{os.getpid()}}\\n")
print('AGENT_PARTIAL:"started"', flush=True)
time.sleep(60)
"""


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    return write_profiles(tmp_path)


def write_profiles(tmp_path: Path) -> Path:
    """echo (described), stream (partials, a session), fail, and slow (never ends; records its pid in tmp_path/pids)
    in tmp_path/profiles."""
    directory = tmp_path / "profiles"
    directory.mkdir()
    write_agent(tmp_path, "slow.py", HANGING_AGENT)
    (directory / "echo.yaml").write_text(
        f'description: Echoes the message back.\ncommand: "{SAMPLE_AGENTS}/echo.sh"\ntimeout_secs: 10\n'
    )
    (directory / "stream.yaml").write_text(
        f'command: ["{PYTHON}", "{SAMPLE_AGENTS}/stream.py"]\nenv: {{STREAM_DELAY: "0"}}\ntimeout_secs: 10\n'
    )
    (directory / "fail.yaml").write_text(f'command: "{SAMPLE_AGENTS}/fail.sh"\ntimeout_secs: 10\n')
    (directory / "slow.yaml").write_text(
        textwrap.dedent(f"""\
            command: "{tmp_path}/slow.py"
            env: {{PID_FILE: "{tmp_path}/pids"}}
            timeout_secs: 30
            kill_grace_secs: 1
            """)
    )
    return directory


def mcp_argv(profiles: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "bridge", "mcp", "--profiles", str(profiles), *options]


def stdio_parameters(profiles: Path, tmp_path: Path, *options: str) -> StdioServerParameters:
    argv = mcp_argv(profiles, "--state", str(tmp_path / "state.sqlite3"), *options)
    return StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def test_profiles_are_tools_and_a_call_is_a_turn(profiles: Path, tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with stdio_client(stdio_parameters(profiles, tmp_path)) as streams:
            async with mcp_client_session.ClientSession(*streams) as session:
                await session.initialize()
                tools = {tool.name: tool for tool in (await session.list_tools()).tools}
                assert sorted(tools) == ["echo", "fail", "slow", "stream"]
                assert tools["echo"].description == "Echoes the message back."
                assert tools["stream"].input_schema["required"] == ["message"]
                result = await session.call_tool("echo", {"message": "hello there"})
                assert not result.is_error
                assert text_of(result) == "echo: hello there"


async def test_partials_are_progress_and_a_conversation_goes_on(profiles: Path, tmp_path: Path) -> None:
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    with trio.fail_after(DEADLINE):
        async with stdio_client(stdio_parameters(profiles, tmp_path)) as streams:
            async with mcp_client_session.ClientSession(*streams) as session:
                await session.initialize()
                first = await session.call_tool(
                    "stream", {"message": "one two", "conversation": "c1"}, progress_callback=on_progress
                )
                second = await session.call_tool("stream", {"message": "three", "conversation": "c1"})
                other = await session.call_tool("stream", {"message": "four"})
    assert [message for _, message in progress] == ["one ", "two "]
    assert [value for value, _ in progress] == [1, 2]
    session_id = first.meta["agent-bridge/session_id"]
    assert text_of(first) == f"turn 1 of session {session_id}\nyou said: one two"
    assert text_of(second) == f"turn 2 of session {session_id}\nlast time you said: one two\nyou said: three"
    assert text_of(other).startswith("turn 1 of session ")


async def test_a_failed_turn_is_an_error_result_and_bad_arguments_are_too(profiles: Path, tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with stdio_client(stdio_parameters(profiles, tmp_path)) as streams:
            async with mcp_client_session.ClientSession(*streams) as session:
                await session.initialize()
                failed = await session.call_tool("fail", {"message": "hi"})
                missing = await session.call_tool("echo", {"conversation": "c"})
                huge = await session.call_tool("echo", {"message": "x" * (1024 * 1024 + 1)})
                with pytest.raises(MCPError, match="unknown tool 'nope'"):
                    await session.call_tool("nope", {"message": "hi"})
                still = await session.call_tool("echo", {"message": "still here"})
    assert failed.is_error and text_of(failed) == "The upstream service is rate limited. Try again in a minute."
    assert failed.meta["agent-bridge/outcome"] == "agent_error"
    assert missing.is_error and "message is required" in text_of(missing)
    assert huge.is_error and "the limit is 1048576" in text_of(huge)
    assert text_of(still) == "echo: still here"


async def test_a_cancelled_call_stops_its_agent(profiles: Path, tmp_path: Path) -> None:
    started = trio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    with trio.fail_after(DEADLINE):
        async with stdio_client(stdio_parameters(profiles, tmp_path)) as streams:
            async with mcp_client_session.ClientSession(*streams) as session:
                await session.initialize()
                async with trio.open_nursery() as nursery:

                    async def call() -> None:
                        await session.call_tool("slow", {"message": "take your time"}, progress_callback=on_progress)

                    nursery.start_soon(call)
                    await started.wait()
                    (pid,) = read_pids(tmp_path / "pids")
                    nursery.cancel_scope.cancel()  # the SDK sends notifications/cancelled
                await trio.to_thread.run_sync(assert_no_live_process, [pid], 5.0)
                assert text_of(await session.call_tool("echo", {"message": "after"})) == "echo: after"


async def test_over_a_fleet_a_call_runs_on_a_worker_and_a_cancel_stops_it_there(
    profiles: Path, tmp_path: Path, pg_dsn: str
) -> None:
    import shutil

    from fleetkit import Fleet
    from hostkit import Lab

    (tmp_path / "fleet").mkdir()
    fleet = Fleet(Lab(tmp_path / "fleet"), pg_dsn)
    shutil.copytree(profiles, fleet.lab.profiles, dirs_exist_ok=True)
    started = trio.Event()

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    try:
        worker = await trio.to_thread.run_sync(fleet.worker)
        argv = [*mcp_argv(fleet.lab.profiles, "--postgres", pg_dsn, "--name", "tools")]
        parameters = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))
        with trio.fail_after(DEADLINE):
            async with stdio_client(parameters) as streams:
                async with mcp_client_session.ClientSession(*streams) as session:
                    await session.initialize()
                    echoed = await session.call_tool("echo", {"message": "from the fleet"})
                    assert not echoed.is_error and text_of(echoed) == "echo: from the fleet"
                    async with trio.open_nursery() as nursery:

                        async def call() -> None:
                            await session.call_tool(
                                "slow", {"message": "take your time"}, progress_callback=on_progress
                            )

                        nursery.start_soon(call)
                        await started.wait()
                        (pid,) = read_pids(tmp_path / "pids")
                        assert worker.pid in ancestors(pid), "the agent runs under the worker, not the MCP server"
                        nursery.cancel_scope.cancel()  # the SDK sends notifications/cancelled
                    await trio.to_thread.run_sync(assert_no_live_process, [pid], 5.0)
        assert worker.poll() is None, "the worker cancelled the turn and goes on"
        turns = fleet.query("SELECT profile, gateway, worker, outcome FROM bridge_turns ORDER BY seq")
        assert turns == [("echo", "tools", "w1", "ok"), ("slow", "tools", "w1", "cancelled")]
    finally:
        fleet.stop()


def send(process: subprocess.Popen[str], message: Any) -> None:
    assert process.stdin is not None
    process.stdin.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
    process.stdin.flush()


def receive(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, "agent-bridge mcp closed stdout"
    return dict(json.loads(line))


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}


@contextlib.contextmanager
def started_raw_mcp(profiles: Path, tmp_path: Path, *options: str) -> Iterator[subprocess.Popen[str]]:
    """`agent-bridge mcp` on stdio, initialized by hand; killed at the end if still running."""
    process = subprocess.Popen(
        mcp_argv(profiles, "--state", str(tmp_path / "state.sqlite3"), *options),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(tmp_path / "stderr", "w"),  # noqa: SIM115 - the child holds it
        text=True,
    )
    try:
        send(process, INITIALIZE)
        assert receive(process)["result"]["serverInfo"]["name"] == "agent-bridge"
        send(process, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.fixture
def raw_mcp(profiles: Path, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    with started_raw_mcp(profiles, tmp_path) as process:
        yield process


def test_malformed_json_rpc_gets_a_parse_error_and_the_server_goes_on(raw_mcp: subprocess.Popen[str]) -> None:
    send(raw_mcp, "this is not json")
    assert receive(raw_mcp) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "not a JSON-RPC message: each line must be one JSON object"},
    }
    send(raw_mcp, {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"message": "x" * (9 * 1024 * 1024)}})
    assert receive(raw_mcp) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "a message is longer than 8388608 bytes"},
    }
    send(raw_mcp, {"jsonrpc": "2.0", "id": 2, "method": "no/such/method"})
    assert receive(raw_mcp)["error"]["code"] == -32601
    send(
        raw_mcp,
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo", "arguments": {"message": "ok"}}},
    )
    assert receive(raw_mcp)["result"]["content"] == [{"type": "text", "text": "echo: ok"}]


def test_a_client_that_vanishes_mid_call_leaves_no_process(raw_mcp: subprocess.Popen[str], tmp_path: Path) -> None:
    call = {"name": "slow", "arguments": {"message": "hi"}, "_meta": {"progressToken": "p"}}
    send(raw_mcp, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
    assert receive(raw_mcp)["method"] == "notifications/progress"
    (pid,) = read_pids(tmp_path / "pids")
    assert raw_mcp.stdin is not None and raw_mcp.stdout is not None
    raw_mcp.stdin.close()
    raw_mcp.stdout.close()
    assert raw_mcp.wait(timeout=DEADLINE) == 0
    assert_no_live_process([pid], within=5.0)


ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"


class HttpMcp:
    """`agent-bridge mcp --listen 127.0.0.1:0` with a tokens file (alice and bob may use `tools`) over the
    profiles in directory/profiles, its state and the slow agent's pids file in directory."""

    def __init__(
        self, directory: Path, env: dict[str, str], tools: Sequence[str] = ("echo", "slow", "stream"), *options: str
    ) -> None:
        self.profiles, self.state, self.pids = directory / "profiles", directory / "state.sqlite3", directory / "pids"
        tokens = write_tokens(directory / "tokens.yaml", {ALICE: "alice", BOB: "bob"}, profiles=list(tools))
        state = [] if "--postgres" in options else ["--state", str(self.state)]  # the workers keep the sessions
        argv = mcp_argv(self.profiles, *state, "--listen", "127.0.0.1:0", "--tokens", str(tokens), *options)
        self.process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
        assert self.process.stderr is not None
        said = []
        for line in self.process.stderr:
            said.append(line)
            if line.startswith("agent-bridge mcp: listening on "):
                break
        else:
            raise AssertionError(f"agent-bridge mcp exited before it listened: {said}")
        self.url = line.split()[4]
        # its log, read on so that a full pipe never holds the server up
        self.log = directory / "mcp.log"
        threading.Thread(target=self._keep_log, daemon=True).start()

    def _keep_log(self) -> None:
        assert self.process.stderr is not None
        with open(self.log, "a") as log:
            for line in self.process.stderr:
                log.write(line)
                log.flush()

    def pids_since(self, before: list[int]) -> list[int]:
        """The slow agents started since `before` was read_pids(self.pids)."""
        return read_pids(self.pids)[len(before) :]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=DEADLINE)


@pytest.fixture
def mcp_http(profiles: Path, tmp_path: Path) -> Iterator[HttpMcp]:
    """A server of the test's own, for a test that changes its profiles."""
    server = HttpMcp(tmp_path, dict(os.environ))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def shared_mcp_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpMcp]:
    """One server for the tests that only call it (each its own MCP session; a test's pids are those since it
    began). Started before the autouse fixture cleans the environment, so it does that here."""
    directory = tmp_path_factory.mktemp("mcp-http")
    write_profiles(directory)
    env = {
        name: value
        for name, value in os.environ.items()
        if not (name.startswith("AGENT_") or looks_like_credential(name))
    }
    server = HttpMcp(directory, env | {"XDG_CACHE_HOME": str(directory / "cache")})
    try:
        yield server
    finally:
        server.stop()


async def test_over_http_a_token_sees_its_profiles_as_tools(shared_mcp_http: HttpMcp) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    assert shared_mcp_http.url.endswith("/mcp")
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"})
    with trio.fail_after(DEADLINE):
        async with client, streamable_http_client(shared_mcp_http.url, http_client=client) as (read, write, *_):
            async with mcp_client_session.ClientSession(read, write) as session:
                await session.initialize()
                assert [tool.name for tool in (await session.list_tools()).tools] == ["echo", "slow", "stream"]
                result = await session.call_tool("echo", {"message": "over http"})
                assert text_of(result) == "echo: over http"
                with pytest.raises(MCPError, match="unknown tool 'fail'"):
                    await session.call_tool("fail", {"message": "not yours"})
                streamed = await session.call_tool("stream", {"message": "hi", "conversation": "c"})
                path = await session.call_tool("echo", {"message": "hi", "attachments": ["/etc/passwd"]})
                assert path.is_error and "a local path is only for a client on stdio" in text_of(path)
    listing = await trio.run_process(
        [sys.executable, "-m", "bridge", "sessions", "list", "--state", str(shared_mcp_http.state), "--json"],
        capture_stdout=True,
    )
    stored = [json.loads(line) for line in listing.stdout.decode().splitlines()]
    assert all(record["conversation"].startswith("alice:") for record in stored)  # the tenant's prefix
    assert {record["conversation"]: record["session_id"] for record in stored}["alice:c"] == streamed.meta[
        "agent-bridge/session_id"
    ]


async def test_over_http_a_wrong_token_gets_401_and_runs_nothing(shared_mcp_http: HttpMcp) -> None:
    import httpx

    before = read_pids(shared_mcp_http.pids)

    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "slow", "arguments": {"message": "x"}},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=DEADLINE) as client:
        for authorization in ({}, {"Authorization": "Bearer not-alice-token-0123456789"}):
            response = await client.post(shared_mcp_http.url, json=call, headers={**headers, **authorization})
            assert response.status_code == 401
            assert response.json()["error"] == "unauthorized"
    assert shared_mcp_http.pids_since(before) == []


def delegating_model(tool: str, message: str) -> Any:
    """A fake Anthropic model that calls MCP tool `tool` with `message` once the tool is offered, then answers
    with what the tool said."""

    def respond(request: Request) -> Any:
        if not request.path.startswith("/v1/messages") or not request.body.get("stream"):
            return Json(200, {"input_tokens": 10})
        if results := tool_results(request):
            return message_stream([("text", ["The bridge's agent said: ", result_text(results[-1])])])
        offered = [each.get("name") for each in request.body.get("tools", [])]
        if tool not in offered:
            return message_stream([("text", [f"no tool {tool} among {offered}"])])
        call = {"id": "toolu_bridge", "name": tool, "input": {"message": message}}
        return message_stream([("tool_use", call)], "tool_use")

    return respond


def ask_claude(profiles: Path, tmp_path: Path, tool: str, task: str) -> str:
    """Claude Code's reply to a prompt, its fake model calling the bridge's `tool` with `task` through
    `agent-bridge mcp --profiles profiles` (its --mcp-config)."""
    home = tmp_path / "claude-home"
    config = {
        "mcpServers": {
            "bridge": {
                "command": sys.executable,
                "args": ["-m", "bridge", *mcp_argv(profiles, "--state", str(tmp_path / "state.sqlite3"))[3:]],
                "env": {"PYTHONPATH": os.pathsep.join(sys.path)},
            }
        }
    }
    (tmp_path / "mcp.json").write_text(json.dumps(config))
    with FakeApi(delegating_model(f"mcp__bridge__{tool}", task)) as api:
        claude = subprocess.run(
            [
                str(npm_binary("claude")),
                "-p",
                f"ask the bridge's {tool} agent: {task}",
                "--output-format",
                "json",
                "--mcp-config",
                str(tmp_path / "mcp.json"),
                "--allowedTools",
                f"mcp__bridge__{tool}",
            ],
            # MCP_CONNECTION_NONBLOCKING=false: the first request waits for the bridge's tools (else Claude Code
            # connects its MCP servers while the model answers, and offers them from a later request on).
            env={"PATH": os.environ["PATH"], **claude_env(api, str(home)), "MCP_CONNECTION_NONBLOCKING": "false"},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=DEADLINE * 3,
        )
    assert claude.returncode == 0, claude.stderr
    return str(json.loads(claude.stdout)["result"])


def test_claude_code_delegates_to_a_script_agent_through_agent_bridge_mcp(profiles: Path, tmp_path: Path) -> None:
    reply = ask_claude(profiles, tmp_path, "stream", "summarise the logs")
    assert reply.startswith("The bridge's agent said: turn 1 of session ")
    assert reply.endswith("you said: summarise the logs")


def test_claude_code_delegates_to_codex_through_agent_bridge_mcp(profiles: Path, tmp_path: Path) -> None:
    from fakes.openai_responses import OpenAIResponses, write_codex_home

    codex = npm_binary("codex")
    (tmp_path / "codex-work").mkdir()
    (tmp_path / "codex-tmp").mkdir()
    with OpenAIResponses() as api:
        ready = yaml.safe_load((CLI_PROFILES / "codex.yaml").read_text())
        ready.update(
            env={
                "CODEX_HOME": str(write_codex_home(tmp_path / "codex-home" / ".codex", api.base_url)),
                "PATH": f"{codex.parent}{os.pathsep}{os.environ['PATH']}",
                "TMPDIR": str(tmp_path / "codex-tmp"),
            },
            cwd=str(tmp_path / "codex-work"),
        )
        (profiles / "codex.yaml").write_text(yaml.safe_dump(ready))
        reply = ask_claude(profiles, tmp_path, "codex", "say The logs are clean.")
        assert [request.prompt for request in api.responses_requests()] == ["say The logs are clean."]
    assert reply == "The bridge's agent said: The logs are clean."


def write_asking_profile(profiles: Path, tmp_path: Path) -> None:
    """ap4: an agentproc-0.4 agent that asks to use the tool its message names (`tool=Read`), its profile saying ask."""
    (profiles / "ap4.yaml").write_text(
        textwrap.dedent(f"""\
            protocol: agentproc-0.4
            command: [{sys.executable!r}, {str(SAMPLE_AGENTS / "wire04_agent.py")!r}]
            env: {{STREAM_DELAY: "0", TMPDIR: {str(tmp_path)!r}}}
            permissions: {{ask: [Read], allow: [Grep], timeout_secs: 5}}
            """)
    )


@pytest.mark.parametrize("elicit", [False, True])
async def test_a_permission_the_policy_leaves_to_a_person_is_denied_without_elicitation(
    profiles: Path, tmp_path: Path, elicit: bool
) -> None:
    write_asking_profile(profiles, tmp_path)
    options = ("--elicit",) if elicit else ()  # --elicit, but a client without the capability: the same answer
    with trio.fail_after(DEADLINE):
        async with stdio_client(stdio_parameters(profiles, tmp_path, *options)) as streams:
            async with mcp_client_session.ClientSession(*streams) as session:
                await session.initialize()
                asked = await session.call_tool("ap4", {"message": "hi tool=Read"})
                allowed = await session.call_tool("ap4", {"message": "hi tool=Grep"})
    assert "(Read was denied: denied: this agent runs as an MCP tool, and a tool call has nobody to ask" in text_of(
        asked
    )
    assert "(Grep was allowed)" in text_of(allowed)


async def test_with_elicit_the_clients_user_answers_a_permission(profiles: Path, tmp_path: Path) -> None:
    import mcp_types

    write_asking_profile(profiles, tmp_path)
    asked: list[str] = []
    answers = iter([True, False, None])

    async def elicitation(context: Any, params: Any) -> Any:
        asked.append(params.message)
        answer = next(answers)
        if answer is None:  # a client that cannot ask its user now
            return mcp_types.ErrorData(code=mcp_types.INTERNAL_ERROR, message="no user at hand")
        return mcp_types.ElicitResult(action="accept", content={"allow": answer})

    with trio.fail_after(DEADLINE):
        async with stdio_client(stdio_parameters(profiles, tmp_path, "--elicit")) as streams:
            async with mcp_client_session.ClientSession(*streams, elicitation_callback=elicitation) as session:
                await session.initialize()
                yes = await session.call_tool("ap4", {"message": "hi tool=Read"})
                no = await session.call_tool("ap4", {"message": "hi again tool=Read"})
                unasked = await session.call_tool("ap4", {"message": "hi tool=Read"})
    assert asked == [f"The agent asks to run Read: count the {n} word(s) of your message" for n in (2, 3, 2)]
    assert "(Read was allowed)" in text_of(yes)
    assert "(Read was denied: denied by the MCP client's user)" in text_of(no)
    assert "(Read was denied: denied: this agent runs as an MCP tool, and a tool call has nobody" in text_of(unasked)


def write_question_profile(profiles: Path, tmp_path: Path) -> None:
    """asker: a claude-sdk agent that asks "Which colour?" (Red or Blue; both may be chosen when its message says
    multi) and replies with what it was told."""
    (profiles / "asker.yaml").write_text(yaml.safe_dump(asking_profile(tmp_path)))


async def test_without_elicit_an_agents_question_is_declined_and_the_turn_ends(profiles: Path, tmp_path: Path) -> None:
    write_question_profile(profiles, tmp_path)
    asked: list[str] = []

    async def elicitation(context: Any, params: Any) -> Any:
        asked.append(params.message)
        raise AssertionError("the server asked without --elicit")

    with trio.fail_after(DEADLINE):
        async with stdio_client(stdio_parameters(profiles, tmp_path)) as streams:
            async with mcp_client_session.ClientSession(*streams, elicitation_callback=elicitation) as session:
                await session.initialize()
                result = await session.call_tool("asker", {"message": "a question"})
    assert asked == []
    assert not result.is_error
    decided = json.loads(text_of(result).removeprefix("decided: "))
    assert decided["behavior"] == "deny" and "updatedInput" not in decided


async def test_with_elicit_the_clients_user_answers_an_agents_question(profiles: Path, tmp_path: Path) -> None:
    import mcp_types

    write_question_profile(profiles, tmp_path)
    forms: list[tuple[str, dict[str, Any]]] = []
    replies = iter(["Blue", ["Red", "Blue"], None])

    async def elicitation(context: Any, params: Any) -> Any:
        forms.append((params.message, params.requested_schema))
        reply = next(replies)
        if reply is None:
            return mcp_types.ElicitResult(action="decline")
        (field,) = params.requested_schema["properties"]
        return mcp_types.ElicitResult(action="accept", content={field: reply})

    with trio.fail_after(DEADLINE):
        async with stdio_client(stdio_parameters(profiles, tmp_path, "--elicit")) as streams:
            async with mcp_client_session.ClientSession(*streams, elicitation_callback=elicitation) as session:
                await session.initialize()
                single = await session.call_tool("asker", {"message": "a question"})
                multi = await session.call_tool("asker", {"message": "a multi question"})
                declined = await session.call_tool("asker", {"message": "a question"})
    assert [message for message, _ in forms] == ["The agent asks: Which colour?"] * 3
    (single_field,) = forms[0][1]["properties"].values()
    assert single_field["enum"] == ["Red", "Blue"]
    (multi_field,) = forms[1][1]["properties"].values()
    assert multi_field["type"] == "array" and multi_field["items"]["enum"] == ["Red", "Blue"]
    answers = [json.loads(text_of(result).removeprefix("decided: ")) for result in (single, multi, declined)]
    assert answers[0]["behavior"] == "allow" and answers[0]["updatedInput"]["answers"] == {"Which colour?": "Blue"}
    assert answers[1]["updatedInput"]["answers"] == {"Which colour?": "Red, Blue"}
    assert answers[2]["behavior"] == "deny"


async def test_files_the_agent_left_come_embedded_or_as_links_by_size(profiles: Path, tmp_path: Path) -> None:
    write_agent(
        tmp_path,
        "files.py",
        f"""\
        #!{PYTHON}
        import os, pathlib
        outbox = pathlib.Path(os.environ["AGENT_OUTBOX"])
        (outbox / "notes.txt").write_text("all good\\n")
        (outbox / "small.bin").write_bytes(bytes(range(256)))
        (outbox / "big.bin").write_bytes(b"x" * (1024 * 1024 + 1))
        print("done")
        """,
    )
    (profiles / "files.yaml").write_text(f'command: "{tmp_path}/files.py"\ntimeout_secs: 10\n')
    with trio.fail_after(DEADLINE):
        async with stdio_client(stdio_parameters(profiles, tmp_path)) as streams:
            async with mcp_client_session.ClientSession(*streams) as session:
                await session.initialize()
                result = await session.call_tool("files", {"message": "make files"})
                blocks = {
                    getattr(block, "name", None) or block.resource.uri.rsplit("/", 1)[-1]: block
                    for block in result.content[1:]
                }
                assert result.content[0].text == "done"
                assert blocks["notes.txt"].resource.text == "all good\n"
                assert base64.b64decode(blocks["small.bin"].resource.blob) == bytes(range(256))
                link = blocks["big.bin"]
                assert (link.type, link.size) == ("resource_link", 1024 * 1024 + 1)
                assert Path(urllib.parse.unquote(link.uri.removeprefix("file://"))).stat().st_size == link.size


async def test_over_http_partials_are_progress_and_a_cancel_stops_the_agent(shared_mcp_http: HttpMcp) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    before = read_pids(shared_mcp_http.pids)
    started = trio.Event()
    said: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        said.append(message)
        started.set()

    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"})
    with trio.fail_after(DEADLINE):
        async with client, streamable_http_client(shared_mcp_http.url, http_client=client) as (read, write, *_):
            async with mcp_client_session.ClientSession(read, write) as session:
                await session.initialize()
                failed = await session.call_tool("echo", {"message": ""})
                assert failed.is_error and "message is required" in text_of(failed)
                async with trio.open_nursery() as nursery:

                    async def call() -> None:
                        await session.call_tool("slow", {"message": "take your time"}, progress_callback=on_progress)

                    nursery.start_soon(call)
                    await started.wait()
                    (pid,) = shared_mcp_http.pids_since(before)
                    nursery.cancel_scope.cancel()
                await trio.to_thread.run_sync(assert_no_live_process, [pid], 5.0)
                assert said == ["started"]


# Answers once tmp_path/release exists: a call the test ends when it chooses.
RELEASED_AGENT = f"""\
#!{PYTHON}
import os, time
print('AGENT_PARTIAL:"started"', flush=True)
while not os.path.exists(os.environ["RELEASE"]):
    time.sleep(0.01)
print("released")
"""


def log_holds(path: Path, text: str) -> Callable[[], bool]:
    """Whether the log at `path` holds `text` yet (for `eventually`)."""
    return lambda: path.exists() and text in path.read_text()


def write_held_profile(profiles: Path, tmp_path: Path) -> Path:
    """Profile `held`, whose agent answers "released" once the returned path exists."""
    write_agent(tmp_path, "released.py", RELEASED_AGENT)
    (profiles / "held.yaml").write_text(
        f'command: "{tmp_path}/released.py"\nenv: {{RELEASE: "{tmp_path}/release"}}\ntimeout_secs: 30\n'
    )
    return tmp_path / "release"


def test_sigterm_lets_a_call_in_flight_end_within_the_shutdown_grace(profiles: Path, tmp_path: Path) -> None:
    release = write_held_profile(profiles, tmp_path)
    with started_raw_mcp(profiles, tmp_path, "--log-level", "info") as process:
        call = {"name": "held", "arguments": {"message": "hi"}, "_meta": {"progressToken": "p"}}
        send(process, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        assert receive(process)["method"] == "notifications/progress"
        process.send_signal(signal.SIGTERM)
        eventually(log_holds(tmp_path / "stderr", "signal received"), "the shutdown to begin")  # before the turn ends
        release.touch()
        reply = receive(process)
        while reply.get("method") == "notifications/progress":
            reply = receive(process)
        assert reply["id"] == 2 and reply["result"]["content"] == [{"type": "text", "text": "released"}]
        assert process.wait(timeout=DEADLINE) == 0


def test_sigterm_cancels_a_call_still_running_after_the_shutdown_grace_and_stops_its_agent(
    profiles: Path, tmp_path: Path
) -> None:
    with started_raw_mcp(profiles, tmp_path, "--shutdown-grace", "0.2") as process:
        call = {"name": "slow", "arguments": {"message": "hi"}, "_meta": {"progressToken": "p"}}
        send(process, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        assert receive(process)["method"] == "notifications/progress"
        (pid,) = read_pids(tmp_path / "pids")
        process.send_signal(signal.SIGTERM)
        # Well before the default grace (10 s) is out: the option was applied.
        assert process.wait(timeout=5) == 0
    assert_no_live_process([pid], within=5.0)


async def test_over_http_sigterm_lets_a_call_in_flight_end_within_the_shutdown_grace(
    profiles: Path, tmp_path: Path
) -> None:
    import httpx

    release = write_held_profile(profiles, tmp_path)
    server = HttpMcp(tmp_path, dict(os.environ), ("held",), "--log-level", "info")
    headers = {
        "Authorization": f"Bearer {ALICE}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }
    call = {"name": "held", "arguments": {"message": "hi"}, "_meta": {"progressToken": "p"}}
    try:
        with trio.fail_after(DEADLINE):
            async with httpx.AsyncClient(timeout=DEADLINE) as client:
                opened = await client.post(server.url, json=INITIALIZE, headers=headers)
                headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
                initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                await client.post(server.url, json=initialized, headers=headers)
                request = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}
                answers = []
                async with client.stream("POST", server.url, json=request, headers=headers) as response:
                    async for line in response.aiter_lines():
                        if "notifications/progress" in line:
                            server.process.send_signal(signal.SIGTERM)
                            await trio.to_thread.run_sync(
                                eventually, log_holds(server.log, "signal received"), "the shutdown"
                            )
                            release.touch()
                        elif line.startswith("data: "):
                            answers.append(json.loads(line.removeprefix("data: ")))
        assert [answer["result"]["content"] for answer in answers] == [[{"type": "text", "text": "released"}]]
        assert server.process.wait(timeout=DEADLINE) == 0
    finally:
        server.stop()


async def test_over_http_a_profile_gone_since_is_an_error_that_names_no_path(mcp_http: HttpMcp) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"})
    with trio.fail_after(DEADLINE):
        async with client, streamable_http_client(mcp_http.url, http_client=client) as (read, write, *_):
            async with mcp_client_session.ClientSession(read, write) as session:
                await session.initialize()
                (mcp_http.profiles / "echo.yaml").unlink()
                gone = await session.call_tool("echo", {"message": "hi"})
    assert gone.is_error
    assert text_of(gone) == "profile 'echo' does not load now; the server's log says why"


async def test_over_a_fleet_a_tool_no_worker_has_is_an_error_that_names_no_other_profile(
    profiles: Path, tmp_path: Path, pg_dsn: str
) -> None:
    import httpx2
    from fleetkit import Fleet
    from hostkit import Lab
    from mcp.client.streamable_http import streamable_http_client

    (tmp_path / "fleet").mkdir()
    fleet = Fleet(Lab(tmp_path / "fleet"), pg_dsn)
    (fleet.lab.profiles / "echo.yaml").write_bytes((profiles / "echo.yaml").read_bytes())  # not stream
    server = None
    try:
        await trio.to_thread.run_sync(partial(fleet.worker, "--profile-wait-secs", "0.2"))
        options = ("--postgres", pg_dsn, "--name", "tools")
        server = HttpMcp(tmp_path, dict(os.environ), ("echo", "stream"), *options)
        client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"})
        with trio.fail_after(DEADLINE):
            async with client, streamable_http_client(server.url, http_client=client) as (read, write, *_):
                async with mcp_client_session.ClientSession(read, write) as session:
                    await session.initialize()
                    assert text_of(await session.call_tool("echo", {"message": "hi"})) == "echo: hi"
                    nowhere = await session.call_tool("stream", {"message": "hi"})
        assert nowhere.is_error
        assert text_of(nowhere) == "no profile named 'stream'"  # not the names the workers have
        assert "no live worker has a profile named 'stream'" in server.log.read_text()  # the server's log has them
    finally:
        if server is not None:
            server.stop()
        fleet.stop()


async def test_over_http_a_client_that_drops_the_connection_mid_call_leaves_no_process(
    shared_mcp_http: HttpMcp,
) -> None:
    import httpx

    before = read_pids(shared_mcp_http.pids)
    url = shared_mcp_http.url
    headers = {
        "Authorization": f"Bearer {ALICE}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }
    call = {"name": "slow", "arguments": {"message": "hi"}, "_meta": {"progressToken": "p"}}
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(timeout=DEADLINE) as client:
            opened = await client.post(url, json=INITIALIZE, headers=headers)
            headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
            await client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
            request = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}
            async with client.stream("POST", url, json=request, headers=headers) as response:
                async for line in response.aiter_lines():
                    if "notifications/progress" in line:
                        break
        (pid,) = shared_mcp_http.pids_since(before)
        await trio.to_thread.run_sync(assert_no_live_process, [pid], 5.0)


async def test_over_http_another_token_cannot_use_a_session_it_did_not_open(shared_mcp_http: HttpMcp) -> None:
    """An MCP session is its token's: another token naming its id (to read its stream, cancel its calls, answer
    its elicitations) is told no such session exists, and the session goes on."""
    import httpx

    before = read_pids(shared_mcp_http.pids)
    url = shared_mcp_http.url
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    alice, bob = {**headers, "Authorization": f"Bearer {ALICE}"}, {**headers, "Authorization": f"Bearer {BOB}"}
    call = {"name": "slow", "arguments": {"message": "hi"}, "_meta": {"progressToken": "p"}}
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(timeout=DEADLINE) as client:
            opened = await client.post(url, json=INITIALIZE, headers=alice)
            alice["Mcp-Session-Id"] = bob["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
            await client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=alice)
            request = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}
            async with client.stream("POST", url, json=request, headers=alice) as response:
                lines = response.aiter_lines()  # held, not left by a break: its end would close the connection
                while "notifications/progress" not in await anext(lines):
                    pass
                (pid,) = shared_mcp_http.pids_since(before)
                tools = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
                assert (await client.post(url, json=tools, headers=bob)).status_code == 404
                assert (await client.post(url, json=cancel, headers=bob)).status_code == 404
                assert (await client.get(url, headers=bob)).status_code == 404
                assert (await client.delete(url, headers=bob)).status_code == 404
                assert (await client.post(url, json=tools, headers=alice)).status_code == 200
                assert process_state(pid) not in (None, "Z", "X")  # bob's cancel stopped nothing
                assert (await client.post(url, json=cancel, headers=alice)).status_code == 202
        await trio.to_thread.run_sync(assert_no_live_process, [pid], 5.0)


async def test_over_http_one_token_opens_at_most_its_share_of_sessions_and_the_others_still_open_theirs(
    mcp_http: HttpMcp,
) -> None:
    """A token's tenant at its share of sessions is refused one more, with what to do; another token opens its own,
    and a session the tenant ends makes room for a new one."""
    import httpx

    from bridge.network.mcp import MAX_SESSIONS_PER_TENANT as MOST

    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    alice, bob = {**headers, "Authorization": f"Bearer {ALICE}"}, {**headers, "Authorization": f"Bearer {BOB}"}
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(timeout=DEADLINE) as client:
            share = [await client.post(mcp_http.url, json=INITIALIZE, headers=alice) for _ in range(MOST)]
            assert {response.status_code for response in share} == {200}
            refused = await client.post(mcp_http.url, json=INITIALIZE, headers=alice)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"] == "too_many_sessions"
            assert refused.json()["message"].startswith(f"this token's tenant has {MOST} MCP sessions open, the most")
            assert (await client.post(mcp_http.url, json=INITIALIZE, headers=bob)).status_code == 200
            ended = {**alice, "Mcp-Session-Id": share[0].headers["mcp-session-id"]}
            assert (await client.delete(mcp_http.url, headers=ended)).status_code == 200
            assert (await client.post(mcp_http.url, json=INITIALIZE, headers=alice)).status_code == 200


def test_a_session_idle_for_the_sdk_s_timeout_no_longer_counts_against_its_tenant_s_share() -> None:
    """The SDK ends a session that has had no request in flight for its idle timeout; its tenant's share counts it
    no longer then, so a tenant whose clients went away without ending their sessions is not refused for good."""
    from bridge.network.mcp import TENANT_NAME, SessionShares

    ids = (f"s{number}".encode() for number in range(10))

    async def sdk(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"mcp-session-id", next(ids))]})
        await send({"type": "http.response.body", "body": b"{}"})

    async def nothing() -> Any:
        raise AssertionError("the request's body was read already")

    shares = SessionShares(sdk, most=1, idle_secs=60)

    async def open_session() -> int:
        answered: list[int] = []

        async def send(message: Any) -> None:
            if message["type"] == "http.response.start":
                answered.append(message["status"])

        await shares({"type": "http", "method": "POST", "headers": [], TENANT_NAME: "alice"}, nothing, send)
        return answered[0]

    async def main() -> None:
        assert await open_session() == 200
        assert await open_session() == 429
        clock.jump(59.9)
        assert await open_session() == 429
        clock.jump(0.1)
        assert await open_session() == 200

    clock = trio.testing.MockClock()
    trio.run(main, clock=clock)


async def test_over_http_without_tokens_no_web_page_comes_in_on_any_loopback_address(
    profiles: Path, tmp_path: Path
) -> None:
    """A page of another site (its Origin) or one whose name is rebound to loopback (its Host) gets 403 before the
    SDK sees it, on every loopback address: the SDK itself checks only on 127.0.0.1, localhost and ::1."""
    import httpx

    argv = mcp_argv(profiles, "--state", str(tmp_path / "state.sqlite3"), "--listen", "127.0.0.2:0")
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith("agent-bridge mcp: listening on "):
                break
        url = line.split()[4]
        headers = {"Accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient(timeout=DEADLINE) as client:
            for page in ({"Origin": "https://evil.example"}, {"Host": "evil.example"}):
                refused = await client.post(url, json=INITIALIZE, headers={**headers, **page})
                assert refused.status_code == 403 and refused.json()["error"] == "forbidden", (page, refused.text)
            assert (await client.post(url, json=INITIALIZE, headers=headers)).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=DEADLINE)


async def test_the_stdio_door_waits_for_every_request_read_before_it_closes_even_one_read_while_it_waits() -> None:
    import mcp_types

    from bridge.serving.mcp import UnansweredRequests

    def request(number: int) -> mcp_types.JSONRPCRequest:
        return mcp_types.JSONRPCRequest(jsonrpc="2.0", id=number, method="tools/call")

    def answer(number: int) -> mcp_types.JSONRPCResponse:
        return mcp_types.JSONRPCResponse(jsonrpc="2.0", id=number, result={})

    unanswered = UnansweredRequests()
    answered = trio.Event()

    async def wait() -> None:
        await unanswered.wait_answered()
        answered.set()

    unanswered.read(request(1))
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            unanswered.read(request(2))  # read while the door waits
            unanswered.written(answer(1))
            await trio.testing.wait_all_tasks_blocked()
            assert not answered.is_set()
            unanswered.read(
                mcp_types.JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params={"requestId": 2})
            )  # a cancelled request is answered by nobody
        assert answered.is_set()


async def test_over_http_a_body_that_does_not_come_within_the_body_timeout_is_answered_408_and_closed(
    profiles: Path, tmp_path: Path
) -> None:
    """As on serve --listen: a client that sends its headers and stalls its body holds its connection (and its place
    among the sockets the door holds) for the body timeout, not forever; the body of one that sends it whole gets
    through. A real hypercorn door in the test's own trio run, for a short timeout."""
    import httpx

    from bridge.host.runtime import open_host
    from bridge.network.door import DoorLimits
    from bridge.network.listen import parse_address
    from bridge.network.mcp import serve_mcp_http, tenant_lookup
    from bridge.serving.file_delivery import FileDeliveries
    from bridge.serving.mcp import McpDoor

    host = open_host(str(profiles), state=str(tmp_path / "state.sqlite3"))
    with trio.fail_after(DEADLINE):
        async with host, trio.open_nursery() as nursery:
            door = McpDoor(
                host, {"echo": None}, FileDeliveries(nursery), local_paths=False, tenant_of=tenant_lookup(None)
            )
            listen = partial(serve_mcp_http, door, parse_address("127.0.0.1:0"), tokens=None)
            (url,) = await nursery.start(partial(listen, limits=DoorLimits(body_secs=0.5)))
            authority = url.split("/")[2]
            stalled = (
                f"POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n"
                "Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{"
            )
            sock = trio.socket.socket()
            with sock:
                await sock.connect(("127.0.0.1", int(authority.rsplit(":", 1)[1])))
                await sock.send(stalled.encode())
                answer = b""
                with trio.move_on_after(5) as waiting:
                    while chunk := await sock.recv(65536):  # until the door closes the connection
                        answer += chunk
            assert not waiting.cancelled_caught, f"a stalled body held its connection past 0.5 s: {answer!r}"
            assert answer.startswith(b"HTTP/1.1 408") and b"connection: close" in answer, answer
            assert b"request_timeout" in answer
            headers = {"Accept": "application/json, text/event-stream"}
            async with httpx.AsyncClient() as client:
                assert (await client.post(url, json=INITIALIZE, headers=headers)).status_code == 200
            nursery.cancel_scope.cancel()
