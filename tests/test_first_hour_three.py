"""The first hour, round three (issue 35, section 3), through the CLI as real processes: the messages a newcomer
meets say what to do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import yaml
from agents_cache import npm_binary
from conftest import REPO
from doorkit import ListeningServe, serve_argv, sse_events, write_tokens
from fakes.openai_responses import OpenAIResponses, write_codex_home
from servekit import StdioServe
from test_claude_sdk_serve import DEADLINE, claude_profiles

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENT_BRIDGE, *args], input=stdin, capture_output=True, text=True, timeout=60)


def serve_once(profiles: Path, state: Path, request: dict[str, object]) -> dict[str, object]:
    """The first response of a real `serve` to one request (stdin then closes)."""
    done = cli("serve", "--profiles", str(profiles), "--state", str(state), stdin=json.dumps(request) + "\n")
    response: dict[str, object] = json.loads(done.stdout.splitlines()[0])
    return response


def test_a_profile_asked_for_by_its_file_name_is_told_its_name(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "echo.yaml").write_text((REPO / "profiles" / "echo.yaml").read_text())
    turn = {"type": "turn", "id": "t", "conversation": "c", "message": "hi"}
    response = serve_once(profiles, tmp_path / "s.sqlite3", {**turn, "profile": "echo.yaml"})
    assert response["code"] == "unknown_profile"
    assert str(response["message"]).endswith(
        "no profile named 'echo.yaml': a profile is named without its file's .yaml; use 'echo'"
    )
    response = serve_once(profiles, tmp_path / "s.sqlite3", {**turn, "profile": "other.yml"})
    assert str(response["message"]).endswith(
        "no profile named 'other.yml' (available: echo); a profile is named without its file's .yml: "
        "add other.yaml there and use 'other', or use one of the available names"
    )
    assert ".yaml.yaml" not in str(response["message"])


def test_an_unclosed_quote_is_named_where_it_opened(tmp_path: Path) -> None:
    profile = tmp_path / "agent.yaml"
    profile.write_text('name: agent\ncommand: "python3 -c x\ntimeout_secs: 5\n\n# the end\n')
    checked = cli("check", str(profile))
    assert checked.returncode == 2
    assert checked.stderr.splitlines() == [
        f'{profile}:2: invalid YAML: a quote is probably unclosed: the " opened at line 2, column 10 has no '
        'closing " (YAML: found unexpected end of stream)'
    ]


def test_run_attach_of_a_loopback_url_names_the_profile_field_run_has(tmp_path: Path) -> None:
    # Refused before any connection: nothing listens there, and nothing is needed to. The profile fetches its
    # attachments (an agentproc-0.1 profile passes URLs through unless it says so).
    profile = tmp_path / "fetching.yaml"
    profile.write_text(
        f"command: {json.dumps(str(REPO / 'sample_agents' / 'echo.sh'))}\ntimeout_secs: 10\n"
        "attachments: {fetch: true}\n"
    )
    ran = cli("run", str(profile), "hi", "--attach", "http://127.0.0.1:9/notes.txt")
    assert ran.returncode == 1
    assert "127.0.0.1 resolves to 127.0.0.1, a loopback address" in ran.stderr
    assert "unless the profile's attachments.allow_hosts names it (serve and worker also take " in ran.stderr
    assert "the host's option" not in ran.stderr


def test_serve_says_a_claude_sdk_turns_session_once(tmp_path: Path) -> None:
    with claude_profiles(tmp_path) as (_, _, profiles):
        serve = StdioServe(profiles, tmp_path / "state.sqlite3", deadline=DEADLINE)
        try:
            turns = []
            for number in (1, 2):
                serve.send(
                    {"type": "turn", "id": f"t{number}", "profile": "claude", "conversation": "c", "message": "hi"}
                )
                turns.append(serve.until("result", f"t{number}"))
        finally:
            assert serve.close() == 0
    for responses in turns:
        assert responses[-1]["outcome"] == "ok", responses[-1]
        sessions = [response for response in responses if response["type"] == "session"]
        assert len(sessions) == 1, sessions
        assert sessions[0]["session_id"] == responses[-1]["session_id"]


def test_a_json_result_names_each_files_url_as_the_event_stream_does(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    agent = tmp_path / "writer.sh"
    agent.write_text('#!/bin/sh\nprintf "report body" > "$AGENT_OUTBOX/report.txt"\necho done\n')
    agent.chmod(0o755)
    (profiles / "writer.yaml").write_text(f'command: ["{agent}"]\n')
    tokens = write_tokens(tmp_path / "tokens.yaml", {"token-of-alice-0123456789": "alice"})
    door = ListeningServe(
        serve_argv(
            "--profiles",
            str(profiles),
            "--state",
            str(tmp_path / "s.sqlite3"),
            "--listen",
            "127.0.0.1:0",
            "--tokens",
            str(tokens),
        ),
        tmp_path / "serve.log",
    )
    try:
        with httpx.Client(
            base_url=door.url, headers={"Authorization": "Bearer token-of-alice-0123456789"}, timeout=30
        ) as http:

            def post(request_id: str, accept: str) -> httpx.Response:
                body = {"id": request_id, "profile": "writer", "conversation": request_id, "message": "go"}
                return http.post("/v1/turns", json=body, headers={"Accept": accept})

            streamed = list(sse_events(post("sse", "text/event-stream").iter_lines()))
            as_json = post("json", "application/json").json()
            [offered] = [response for response in streamed if response["type"] == "file"]
            [listed] = as_json["files"]
            downloaded = http.get(listed["url"])
    finally:
        door.stop()
    assert offered["url"] == "/v1/files/http/sse/report.txt"
    assert listed["url"] == "/v1/files/http/json/report.txt"
    assert downloaded.status_code == 200 and downloaded.content == b"report body"


def test_check_warns_where_codex_would_make_no_helper_for_its_own_sandbox(tmp_path: Path) -> None:
    codex_home = tmp_path / "home" / ".codex"
    codex_home.mkdir(parents=True)
    elsewhere = tmp_path / "not-temporary"
    elsewhere.mkdir()
    shipped = yaml.safe_load((REPO / "profiles" / "clis" / "codex-app-server.yaml").read_text())
    command = [str(npm_binary("codex")), "app-server"]
    inside = tmp_path / "inside.yaml"
    inside.write_text(
        yaml.safe_dump({**shipped, "command": command, "env": {"CODEX_HOME": str(codex_home), "TMPDIR": str(tmp_path)}})
    )
    moved = tmp_path / "moved.yaml"
    moved.write_text(
        yaml.safe_dump(
            {**shipped, "command": command, "env": {"CODEX_HOME": str(codex_home), "TMPDIR": str(elsewhere)}}
        )
    )
    unsandboxed = tmp_path / "unsandboxed.yaml"
    unsandboxed.write_text(
        yaml.safe_dump(
            {
                **shipped,
                "command": command,
                "env": {"CODEX_HOME": str(codex_home)},
                "codex-app-server": {"sandbox": "danger-full-access"},
            }
        )
    )
    checked = cli("check", str(inside), str(moved), str(unsandboxed))
    assert checked.returncode == 0, checked.stderr
    assert checked.stderr.splitlines() == [
        f"{inside}: warning: codex's home {codex_home} is inside the temporary directory {tmp_path}: codex then makes no "
        "codex-linux-sandbox helper, and every command it runs in its own sandbox fails (bwrap: execvp "
        "codex-linux-sandbox: No such file or directory) inside a turn that ends ok; give it a CODEX_HOME (or "
        "HOME) outside it, or another TMPDIR, in `env`"
    ]


def test_serve_says_a_resumed_codex_threads_session_once(tmp_path: Path) -> None:
    codex_home = tmp_path / "home" / ".codex"
    with OpenAIResponses() as api:
        write_codex_home(codex_home, api.base_url)
        profiles = tmp_path / "profiles"
        profiles.mkdir()
        (tmp_path / "work").mkdir()
        shipped = yaml.safe_load((REPO / "profiles" / "clis" / "codex-app-server.yaml").read_text())
        shipped.update(
            command=[str(npm_binary("codex")), "app-server"],
            cwd=str(tmp_path / "work"),
            env={"CODEX_HOME": str(codex_home), "HOME": str(codex_home.parent)},
        )
        (profiles / "codex.yaml").write_text(yaml.safe_dump(shipped))
        turns = []
        for number in (1, 2):  # a serve each: the second turn's codex is a new process that resumes the thread
            serve = StdioServe(profiles, tmp_path / "state.sqlite3", deadline=DEADLINE)
            try:
                serve.send(
                    {"type": "turn", "id": f"t{number}", "profile": "codex", "conversation": "c", "message": "say hi"}
                )
                turns.append(serve.until("result", f"t{number}"))
            finally:
                assert serve.close() == 0
    assert turns[0][-1]["session_id"] == turns[1][-1]["session_id"]
    for responses in turns:
        assert responses[-1]["outcome"] == "ok", responses[-1]
        sessions = [response for response in responses if response["type"] == "session"]
        assert [session["session_id"] for session in sessions] == [responses[-1]["session_id"]]
