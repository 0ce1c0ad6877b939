"""`agent-bridge acp PROFILE` driven by real ACP clients: the headless `acpx` (npm) and the official Python SDK.

Behind the bridge: the SDK's sample agent (`sample_agents/acp_agent.py`, a real ACP agent, through `protocol:
acp` with `permissions: {default: ask}` so its requests reach the editor), a shell script, and `profiles/`'
stream and echo agents. Every client runs with a deadline; a hanging bridge fails the test in seconds.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agents_cache import npm_binary
from attachment_files import PNG
from conftest import CLI_PROFILES, REPO, SAMPLE_AGENTS, assert_no_live_process
from fake_anthropic import write_claude_profile
from fake_api import FakeApi
from fakes.openai_responses import OpenAIResponses, write_codex_home

from bridge.engine.launch import looks_like_credential

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
SDK_CLIENT = str(Path(__file__).parent / "acp_sdk_client.py")
DEADLINE = 40
# How long acpx's queue owner keeps an idle session's bridge (its --ttl, in seconds): long enough to see it kept
# once a prompt returned, short enough that a test waiting for it to run out waits half a second.
IDLE_TTL = "0.5"


def sdk_agent_profile(tmp_path: Path) -> Path:
    """The SDK's sample agent (it takes images and loads its sessions), asking the editor before a tool runs."""
    directory = tmp_path / "profiles"
    directory.mkdir(exist_ok=True)
    command = [sys.executable, str(SAMPLE_AGENTS / "acp_agent.py"), "--load", "--images", "--store", str(tmp_path)]
    path = directory / "sdk.yaml"
    path.write_text(
        f"command: {command!r}\nprotocol: acp\nkill_grace_secs: 2\npermissions: {{default: ask, timeout_secs: 20}}\n"
    )
    return path


def shell_profile(tmp_path: Path, script: str, more: str = "") -> Path:
    directory = tmp_path / "profiles"
    directory.mkdir(exist_ok=True)
    path = directory / "shell.yaml"
    path.write_text(f"command: {['sh', '-c', script]!r}\ntimeout_secs: 30\nkill_grace_secs: 1\n{more}")
    return path


def acp_command(profile: Path, tmp_path: Path) -> list[str]:
    return [AGENT_BRIDGE, "acp", str(profile), "--state", str(tmp_path / "state.sqlite3")]


class SdkClient:
    """One `acp_sdk_client.py --serve` for the module: each scenario is its own `agent-bridge acp` and client state.
    Started before the autouse fixture cleans the environment, so it does that here (the SDK passes the bridge only
    HOME, LOGNAME, PATH, SHELL, TERM and USER in any case)."""

    def __init__(self) -> None:
        self.busy = False
        self.env = {
            name: value
            for name, value in os.environ.items()
            if not (name.startswith("AGENT_") or looks_like_credential(name))
        }
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, SDK_CLIENT, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(self.process, self.lines), daemon=True).start()

    @staticmethod
    def _read(process: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put("")

    def run(self, tmp_path: Path, profile: Path, scenario: str, *args: str) -> list[dict[str, Any]]:
        if self.busy:  # a test stopped mid-scenario: what is left of it must not reach the next one
            self.close()
            self.start()
        self.busy = True
        assert self.process.stdin is not None
        request = {"scenario": scenario, "args": args, "command": acp_command(profile, tmp_path), "cwd": str(tmp_path)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        seen: list[dict[str, Any]] = []
        while True:
            line = self.lines.get(timeout=DEADLINE)
            assert line, f"the SDK client exited with {self.process.wait()}"
            record = json.loads(line)
            assert "crashed" not in record, record["crashed"]
            if record.get("done"):
                self.busy = False
                return seen
            seen.append(record)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=DEADLINE)
        finally:
            self.process.kill()


@pytest.fixture(scope="module")
def sdk_client() -> Iterator[SdkClient]:
    client = SdkClient()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def sdk(sdk_client: SdkClient) -> Callable[..., list[dict[str, Any]]]:
    """What the SDK's client saw running a scenario against `agent-bridge acp profile`: sdk(tmp_path, profile,
    scenario, *args)."""
    return sdk_client.run


def texts(seen: list[dict[str, Any]]) -> str:
    return "".join(record["chunk"] for record in seen if "chunk" in record)


def acpx(tmp_path: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """acpx, its state under tmp_path (HOME), driving the bridge; its idle agents exit after IDLE_TTL seconds."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    agent = " ".join(acp_command(profile, tmp_path))
    command = [str(npm_binary("acpx")), "--agent", agent, "--ttl", IDLE_TTL, "--format", "quiet", *args]
    env = os.environ | {"HOME": str(home)}
    return subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE, cwd=work, env=env)


# ---------------------------------------------------------------------------- acpx


def test_acpx_prompts_a_streaming_profile_and_gets_the_reply_once(tmp_path):
    done = acpx(tmp_path, REPO / "profiles" / "stream.yaml", "exec", "hello from the editor")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "hello from the editor"


def test_acpx_answers_the_agents_permission_request(tmp_path):
    profile = sdk_agent_profile(tmp_path)
    allowed = acpx(tmp_path, profile, "--approve-all", "exec", "ask rm x")
    assert "ran rm x (allow_once-id)" in allowed.stdout, allowed.stderr
    denied = acpx(tmp_path, profile, "--deny-all", "exec", "ask rm x")
    assert "did not run rm x (reject_once-id)" in denied.stdout, denied.stderr


def test_acpx_cancels_a_running_prompt(tmp_path):
    profile = sdk_agent_profile(tmp_path)
    assert acpx(tmp_path, profile, "sessions", "new").returncode == 0
    home, work = tmp_path / "home", tmp_path / "work"
    agent = " ".join(acp_command(profile, tmp_path))
    prompt = subprocess.Popen(
        [str(npm_binary("acpx")), "--agent", agent, "--ttl", IDLE_TTL, "--format", "json", "prompt", "hang"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work,
        env=os.environ | {"HOME": str(home)},
    )
    try:
        assert prompt.stdout is not None
        for line in prompt.stdout:  # the agent is waiting once its first chunk came
            if "agent_message_chunk" in line:
                break
        assert acpx(tmp_path, profile, "cancel").returncode == 0
        out, _ = prompt.communicate(timeout=DEADLINE)
    finally:
        prompt.kill()
    assert '"stopReason":"cancelled"' in out
    bridges = subprocess.run(["pgrep", "-f", f"acp {profile}"], capture_output=True, text=True).stdout.split()
    assert_no_live_process([int(pid) for pid in bridges], within=10)  # acpx's --ttl ran out: nothing is left


def queue_owners(tmp_path: Path) -> list[int]:
    """acpx's queue-owner processes of this test's sessions (they run in its work directory): each holds a
    session's bridge while it is idle, and refuses prompts while it shuts down (QUEUE_OWNER_CLOSED)."""
    work = str(tmp_path / "work")
    owners = []
    for entry in Path("/proc").iterdir():
        try:
            if b"__queue-owner" in (entry / "cmdline").read_bytes() and os.readlink(entry / "cwd") == work:
                owners.append(int(entry.name))
        except (OSError, ValueError):
            continue  # not a process, or gone meanwhile
    return owners


def test_acpx_goes_on_with_a_session_after_the_bridge_restarted(tmp_path):
    profile = sdk_agent_profile(tmp_path)
    assert acpx(tmp_path, profile, "sessions", "new").returncode == 0
    assert acpx(tmp_path, profile, "prompt", "first words").stdout.strip() == "echo: first words"
    bridges = subprocess.run(["pgrep", "-f", f"acp {profile}"], capture_output=True, text=True).stdout.split()
    owners = queue_owners(tmp_path)
    assert bridges and owners, "acpx keeps the bridge while the session is idle"
    # Its --ttl ran out: the bridge stopped, and so did the owner that held it (a prompt sent while that owner
    # is still shutting down is refused by acpx itself).
    assert_no_live_process([int(pid) for pid in bridges] + owners, within=10)
    again = acpx(tmp_path, profile, "prompt", "history")
    assert again.stdout.strip() == "first words", again.stderr


@pytest.fixture(scope="module")
def codex_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    npm_binary("codex-acp")
    with OpenAIResponses() as api:
        yield write_codex_home(tmp_path_factory.mktemp("codex-acp") / "home", api.base_url)


def ready_codex_profile(tmp_path: Path, home: Path) -> Path:
    """profiles/clis/codex-acp.yaml as shipped (its policy asks before a command), run by the cached codex-acp in
    tmp_path/work against the fake OpenAI server."""
    profile = yaml.safe_load((CLI_PROFILES / "codex-acp.yaml").read_text())
    profile |= {
        "command": str(npm_binary("codex-acp")),
        "cwd": str(tmp_path / "work"),
        "kill_grace_secs": 0.5,
        "env": {"CODEX_HOME": str(home), "HOME": str(home.parent)},
    }
    directory = tmp_path / "profiles"
    directory.mkdir(exist_ok=True)
    (tmp_path / "work").mkdir(exist_ok=True)
    path = directory / "codex-acp.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def test_acpx_drives_the_ready_codex_acp_profile_and_answers_its_permission_requests(tmp_path, codex_home):
    profile = ready_codex_profile(tmp_path, codex_home)
    said = acpx(tmp_path, profile, "exec", "say one two three four five")
    assert said.stdout.strip() == "one two three four five", said.stderr
    allowed = acpx(tmp_path, profile, "--approve-all", "exec", "escalate touch allowed-file")
    assert (tmp_path / "work" / "allowed-file").exists(), allowed.stderr
    denied = acpx(tmp_path, profile, "--deny-all", "exec", "escalate touch denied-file")
    assert not (tmp_path / "work" / "denied-file").exists(), denied.stdout
    assert denied.returncode != 0  # the denied command failed the turn, which acpx reports


# ---------------------------------------------------------------------------- the official Python SDK


def test_the_sdk_client_streams_a_prompt_and_sees_tool_calls(sdk, tmp_path):
    seen = sdk(tmp_path, sdk_agent_profile(tmp_path), "prompt", "work the plan")
    assert texts(seen) == "did: the plan"
    assert {"tool": "tool_call", "status": "in_progress"} in seen
    assert seen[-1] == {"stop": "end_turn"}


def test_the_sdk_client_answers_a_permission_request_with_the_agents_options(sdk, tmp_path):
    seen = sdk(tmp_path, sdk_agent_profile(tmp_path), "ask", "ask rm x", "allow_always")
    asked = next(record for record in seen if "permission" in record)
    assert asked["permission"] == ["allow_once", "allow_always", "reject_once"]
    assert texts(seen) == "ran rm x (allow_always-id)"


@pytest.mark.parametrize(("word", "stop"), [("max_tokens", "max_tokens"), ("refuse", "refusal")])
def test_an_agent_that_stops_short_gives_the_editor_its_stop_reason(sdk, tmp_path, word, stop):
    seen = sdk(tmp_path, sdk_agent_profile(tmp_path), "prompt", word)
    assert seen[-1] == {"stop": stop}


def test_a_question_of_claude_code_is_a_choice_of_its_options_in_the_editor(sdk, tmp_path):
    from fake_anthropic import Conversation

    with FakeApi(Conversation()) as api:
        profiles = tmp_path / "profiles"
        profiles.mkdir()
        write_claude_profile(profiles / "claude.yaml", api, tmp_path)
        seen = sdk(tmp_path, profiles / "claude.yaml", "ask", "ask colour", "Blue")
    asked = next(record for record in seen if "permission" in record)
    assert asked["options"] == ["Red", "Blue", "decline"]
    assert asked["permission"] == ["allow_once", "allow_once", "reject_once"]
    assert '"Which colour?"="Blue"' in texts(seen)  # what Claude Code told its model the user chose
    assert seen[-1] == {"stop": "end_turn"}


def test_the_sdk_client_cancels_a_prompt(sdk, tmp_path):
    seen = sdk(tmp_path, sdk_agent_profile(tmp_path), "cancel", "hang")
    assert seen[-1] == {"stop": "cancelled"}


def test_the_sdk_client_loads_a_session_after_the_bridge_restarted(sdk, tmp_path):
    profile = sdk_agent_profile(tmp_path)
    first = sdk(tmp_path, profile, "prompt", "remember me")
    session_id = first[0]["session"]
    again = sdk(tmp_path, profile, "load", session_id, "history")
    assert texts(again) == "remember me"


def test_an_image_block_reaches_the_agent_as_a_file(sdk, tmp_path):
    image = tmp_path / "red.png"
    image.write_bytes(PNG)
    profile = shell_profile(tmp_path, 'wc -c < "$AGENT_IMAGE_PATH"', "attachments: {fetch: true}\n")
    seen = sdk(tmp_path, profile, "image", str(image), "what is this?")
    assert texts(seen).strip() == str(len(PNG))


def test_files_the_agent_leaves_come_back_as_resource_links(sdk, tmp_path):
    seen = sdk(tmp_path, sdk_agent_profile(tmp_path), "prompt", "files notes.txt:milk")
    (link,) = [record for record in seen if "link" in record]
    assert link["link"].startswith("file:///") and (link["name"], link["text"]) == ("notes.txt", "milk")
    assert not Path(link["link"].removeprefix("file://")).exists()  # the bridge ended: nothing it left stays


def test_a_failed_turn_is_an_error_with_its_error_reply(sdk, tmp_path):
    profile = shell_profile(tmp_path, "echo 'it broke' >&2; exit 3")
    seen = sdk(tmp_path, profile, "prompt", "hi")
    assert "error" in seen[-1] and "exit" in seen[-1]["error"]


# ---------------------------------------------------------------------------- bad input, vanishing clients


class RawClient:
    """`agent-bridge acp` on pipes, spoken to line by line."""

    def __init__(self, profile: Path, tmp_path: Path, *options: str, command: list[str] | None = None) -> None:
        self.process = subprocess.Popen(
            command or [*acp_command(profile, tmp_path), *options],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def send(self, data: bytes | dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data if isinstance(data, bytes) else json.dumps(data).encode() + b"\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the bridge closed stdout"
        return json.loads(line)

    def request(self, rpc_id: int, method: str, **params: Any) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})
        return self.receive()


def test_bad_messages_get_json_rpc_errors_and_the_door_goes_on(tmp_path):
    client = RawClient(REPO / "profiles" / "echo.yaml", tmp_path)
    try:
        assert client.request(0, "initialize", protocolVersion=1)["result"]["protocolVersion"] == 1
        client.send(b"{this is not json\n")
        assert client.receive()["error"]["code"] == -32700
        assert client.request(1, "no/such/method")["error"]["code"] == -32601
        stranger = client.request(2, "session/prompt", sessionId="acp-notthisclientssession12", prompt=[])
        assert stranger["error"]["code"] == -32002
        client.send(
            b'{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"text":"' + b"x" * (33 << 20) + b'"}}\n'
        )
        too_big = client.receive()
        assert too_big["id"] is None and "longer than" in too_big["error"]["message"]
        session = client.request(4, "session/new", cwd="/", mcpServers=[])["result"]["sessionId"]
        client.send(
            {
                "jsonrpc": "2.0",
                "id": 5,
                "method": "session/prompt",
                "params": {"sessionId": session, "prompt": [{"type": "text", "text": "still here"}]},
            }
        )
        assert client.receive()["params"]["update"]["content"]["text"] == "echo: still here"
        assert client.receive() == {"jsonrpc": "2.0", "id": 5, "result": {"stopReason": "end_turn"}}
    finally:
        client.process.kill()
        client.process.wait()


def waiting_prompt(tmp_path: Path) -> tuple[RawClient, int]:
    """An `agent-bridge acp` whose prompt (id 2) runs an agent that waits; the agent's pid."""
    profile = shell_profile(tmp_path, 'echo "AGENT_PARTIAL:pid $$"; exec sleep 60')
    client = RawClient(profile, tmp_path)
    client.request(0, "initialize", protocolVersion=1)
    session = client.request(1, "session/new", cwd="/", mcpServers=[])["result"]["sessionId"]
    prompt = [{"type": "text", "text": "wait"}]
    client.send(
        {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": session, "prompt": prompt}}
    )
    return client, int(client.receive()["params"]["update"]["content"]["text"].split()[1])


def test_an_editor_that_vanishes_mid_prompt_leaves_no_process(tmp_path):
    client, agent_pid = waiting_prompt(tmp_path)
    assert client.process.stdin is not None and client.process.stdout is not None
    client.process.stdin.close()  # the editor is gone
    client.process.stdout.close()
    assert client.process.wait(timeout=15) in (0, 1)
    assert_no_live_process([agent_pid])


def test_sigterm_answers_the_prompt_in_flight_cancelled_and_stops_its_agent(tmp_path):
    client, agent_pid = waiting_prompt(tmp_path)
    try:
        client.process.send_signal(signal.SIGTERM)
        answer = client.receive()
        while answer.get("method") == "session/update":
            answer = client.receive()
        assert answer == {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "cancelled"}}
        assert client.process.wait(timeout=15) == 0
        assert_no_live_process([agent_pid])
    finally:
        client.process.kill()
        client.process.wait()


def test_an_editor_that_closes_stdout_mid_prompt_gets_it_cancelled_though_stdin_stays_open(tmp_path):
    client, agent_pid = waiting_prompt(tmp_path)
    assert client.process.stdout is not None
    client.process.stdout.close()  # the editor stops reading; it still holds stdin open
    try:
        assert client.process.wait(timeout=15) == 1
        assert_no_live_process([agent_pid])
    finally:
        client.process.kill()
        client.process.wait()


def test_nothing_but_json_rpc_reaches_stdout_with_debug_logs_and_an_agent_writing_to_stderr(tmp_path):
    profile = shell_profile(tmp_path, 'echo "a word on stderr" >&2; echo "the reply"')
    client = RawClient(profile, tmp_path, "--log-level", "debug")
    client.request(0, "initialize", protocolVersion=1)
    session = client.request(1, "session/new", cwd="/", mcpServers=[])["result"]["sessionId"]
    prompt = [{"type": "text", "text": "hi"}]
    client.send(
        {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": session, "prompt": prompt}}
    )
    messages = [client.receive()]
    while messages[-1].get("id") != 2:
        messages.append(client.receive())  # each line must be JSON
    assert messages[-1] == {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}
    out, err = client.process.communicate(timeout=DEADLINE)
    assert out == b"" and all(message["jsonrpc"] == "2.0" for message in messages)
    assert b"debug" in err.lower() or b"info" in err.lower()  # the logs went to stderr


def test_prompts_run_on_the_fleets_workers_through_a_gateway(tmp_path, pg_dsn):
    from fleetkit import Fleet
    from hostkit import Lab

    fleet = Fleet(Lab(tmp_path), pg_dsn)
    shell_profile(tmp_path, 'echo "worker says: $AGENT_MESSAGE"')
    fleet.worker()
    gateway = [AGENT_BRIDGE, "acp", "shell", "--postgres", pg_dsn, "--name", "editor"]
    client = RawClient(tmp_path, tmp_path, command=gateway)
    try:
        client.request(0, "initialize", protocolVersion=1)
        session = client.request(1, "session/new", cwd="/", mcpServers=[])["result"]["sessionId"]
        prompt = [{"type": "text", "text": "hello"}]
        client.send(
            {"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {"sessionId": session, "prompt": prompt}}
        )
        assert client.receive()["params"]["update"]["content"]["text"] == "worker says: hello"
        assert client.receive() == {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}
    finally:
        client.process.kill()
        client.process.wait()
        fleet.stop()
