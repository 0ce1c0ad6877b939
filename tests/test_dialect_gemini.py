"""protocol: gemini-stream-json — Gemini CLI's `--output-format stream-json`.

Three layers:
- the pure dialect, fed real transcripts of Gemini CLI 0.61.0 (tests/transcripts/gemini-*.jsonl),
  whole, a byte at a time and split at every byte, plus damaged and hand-made streams;
- the real Gemini CLI (installed by `make test-agents`) driven through the bridge with the ready
  profile profiles/clis/gemini-cli.yaml, against tests/fake_gemini.py on loopback;
- the ready profile run against sample_agents/gemini_like.py installed as `gemini`, and accepted by
  `agent-bridge check`.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from agents_cache import npm_binary
from attachment_files import PNG, sent
from conftest import CLI_PROFILES, SAMPLE_AGENTS, TURN_DEADLINE, run_collecting
from dialectkit import (
    TRANSCRIPTS,
    assert_every_cut_decodes_alike,
    fed_byte_by_byte,
    fed_whole,
    json_lines,
    of,
    transcript,
)
from fake_gemini import TEXT_PIECES, TEXT_REPLY, fake_gemini, gemini_env, gemini_home, prompts

import bridge
from bridge import Turn
from bridge.dialects import (
    ActivityEvent,
    DialectContext,
    ErrorEvent,
    JsonSettings,
    LineCut,
    PartialEvent,
    PlanStep,
    ProtocolWarning,
    ReplyEvent,
    SessionEvent,
    Usage,
    UsageEvent,
    dialect_class,
)
from bridge.dialects.coding_agents import UNFINISHED

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
REAL_DEADLINE = 40  # a real Gemini CLI turn takes about two seconds (node start-up); a loaded machine gets room
SHELL_ID = "run_shell_command__run_shell_command_1795343252306_0"


def dialect(**settings: Any) -> Any:
    return dialect_class("gemini-stream-json")(DialectContext(settings=JsonSettings(**settings)), Turn("hi"))


def decode(data: bytes, **settings: Any) -> list[Any]:
    return fed_whole(dialect(**settings), data)


# --------------------------------------------------------------------------- real transcripts, pure


def test_deltas_are_partials_and_their_concatenation_is_the_reply():
    assert decode(transcript("gemini-text.jsonl")) == [
        SessionEvent("76ccd967-639d-4041-bbf6-4eee4a85d308"),
        *(PartialEvent(piece) for piece in TEXT_PIECES),
        UsageEvent(Usage(input_tokens=100, output_tokens=20, cached_input_tokens=5, total_tokens=120)),
        ReplyEvent(TEXT_REPLY),
    ]


def test_a_tool_call_is_activity_and_the_text_after_it_starts_a_paragraph():
    events = decode(transcript("gemini-tool-shell-yolo.jsonl"))
    output = '{"output": "<untrusted_context>\\nOutput: hi\\nProcess Group PGID: 2027\\n</untrusted_context>"}'
    assert events[1:-2] == [
        PartialEvent("Let me run it."),
        ActivityEvent("tool", tool="run_shell_command", title="echo hi", status="started", call_id=SHELL_ID),
        ActivityEvent(
            "tool", tool="run_shell_command", title="echo hi", status="completed", call_id=SHELL_ID, text="hi"
        ),
        PartialEvent("\n\nThe tool said: "),
        PartialEvent(output),
    ]
    assert events[-1] == ReplyEvent("Let me run it.\n\nThe tool said: " + output)


def test_a_tool_that_is_not_registered_failed_with_its_error_and_the_turn_goes_on():
    events = decode(transcript("gemini-tool-shell-default-approval-not-registered.jsonl"))
    [_, ended] = of(events, ActivityEvent)
    assert (ended.status, ended.tool, ended.title) == ("failed", "run_shell_command", "echo hi")
    assert ended.text.startswith('Tool "run_shell_command" not found.')
    assert not of(events, ErrorEvent) and of(events, ReplyEvent)


def test_thought_parts_never_reach_the_reply():
    assert of(decode(transcript("gemini-thought-parts-dropped.jsonl")), ReplyEvent) == [ReplyEvent("The answer is 42.")]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("gemini-error-http401.jsonl", '[API Error: {"error":{"code":401,"message":"API key not valid (fake)"'),
        ("gemini-error-http500-maxAttempts1.jsonl", '[API Error: {"error":{"code":500,"message":"fake internal error"'),
    ],
)
def test_a_result_with_status_error_fails_the_turn_with_its_message(name, text):
    events = decode(transcript(name))
    [error] = of(events, ErrorEvent)
    assert error.text.startswith(text)
    assert not of(events, ReplyEvent)


def test_a_result_error_without_a_message_takes_the_error_line_s():
    events = decode(transcript("gemini-error-no-finish-reason-maxAttempts1.jsonl"))
    assert of(events, PartialEvent) == [PartialEvent("partial "), PartialEvent("text")]
    assert of(events, ErrorEvent) == [ErrorEvent("Model stream ended without a finish reason.")]


def test_an_error_line_alone_does_not_fail_a_turn_that_succeeds_and_warnings_never_do():
    data = json_lines(
        {"type": "error", "severity": "error", "message": "Quota exceeded, switching model"},
        {"type": "error", "severity": "warning", "message": "Loop detected"},
        {"type": "message", "role": "assistant", "content": "fine", "delta": True},
        {"type": "result", "status": "success"},
    )
    assert decode(data) == [PartialEvent("fine"), ReplyEvent("fine")]


@pytest.mark.parametrize("name", sorted(path.name for path in TRANSCRIPTS.glob("gemini-*.jsonl")))
def test_any_chunking_decodes_like_one_feed(name):
    data = transcript(name)
    byte_by_byte = dialect()
    assert fed_byte_by_byte(byte_by_byte, data) + byte_by_byte.close() == decode(data)


def test_a_split_at_every_byte_decodes_like_one_feed():
    data = transcript("gemini-tool-shell-yolo.jsonl")
    assert_every_cut_decodes_alike(dialect, data, decode(data))


# --------------------------------------------------------------------------- damaged and hand-made streams


def test_garbage_lines_are_counted_in_one_warning_and_change_nothing():
    data = transcript("gemini-text.jsonl")
    first, rest = data.split(b"\n", 1)
    noisy = first + b'\nWarning: 256-color support not detected.\nnull\n{"type":"message"\n' + rest
    events = decode(noisy)
    assert events[:-1] == decode(data)
    assert events[-1] == ProtocolWarning("ignored 3 stdout line(s) that were not JSON objects")


def test_an_interrupted_gemini_ends_without_a_result_and_the_turn_did_not_finish():
    data = transcript("gemini-text.jsonl")
    events = decode(data[: data.index(b'{"type":"result"')])  # what gemini prints when SIGINT stops it (exit 0)
    assert of(events, PartialEvent) and not of(events, ReplyEvent)
    assert events[-1] == ErrorEvent(UNFINISHED, unfinished=True)


def test_a_stream_cut_in_the_middle_of_a_line_did_not_finish_and_names_the_last_error():
    data = transcript("gemini-error-no-finish-reason-maxAttempts1.jsonl")
    events = decode(data[: data.index(b'{"type":"result"') + 30])
    assert events[-2:] == [
        ErrorEvent(f"{UNFINISHED}: Model stream ended without a finish reason.", unfinished=True),
        ProtocolWarning("ignored 1 stdout line(s) that were not JSON objects"),
    ]


def test_a_line_over_the_limit_is_cut_and_the_turn_goes_on():
    data = json_lines(
        {"type": "init", "session_id": "s1"},
        {"type": "tool_result", "tool_id": "t", "status": "success", "output": "x" * 5000},
        {"type": "message", "role": "assistant", "content": "done", "delta": True},
        {"type": "result", "status": "success"},
    )
    assert [type(event) for event in decode(data, max_line_bytes=4096)] == [
        SessionEvent,
        LineCut,
        PartialEvent,
        ReplyEvent,
    ]


def test_unknown_types_fields_and_user_messages_are_ignored():
    data = json_lines(
        {"type": "message", "role": "user", "content": "the prompt"},
        {"type": "compression", "ratio": 2},
        {"type": "message", "role": "assistant", "content": 42, "delta": True},
        {"type": "tool_result", "tool_id": "unknown", "status": "success"},
        {"type": "result", "status": "success", "stats": "not an object", "new": True},
    )
    assert decode(data) == [ActivityEvent("tool", status="completed", call_id="unknown"), ReplyEvent("")]


def test_a_whole_assistant_message_is_text_like_deltas():
    data = json_lines(
        {"type": "message", "role": "assistant", "content": "Whole answer."}, {"type": "result", "status": "success"}
    )
    assert decode(data) == [PartialEvent("Whole answer."), ReplyEvent("Whole answer.")]


def test_session_ids_are_validated_and_reported_once():
    data = json_lines(
        {"type": "init", "session_id": "a"},
        {"type": "init", "session_id": "a"},
        {"type": "init", "session_id": ""},
        {"type": "result", "status": "success"},
    )
    assert decode(data) == [
        SessionEvent("a"),
        ProtocolWarning("ignored a session id because it is empty"),
        ReplyEvent(""),
    ]


def test_write_todos_is_a_plan():
    todos = [{"description": "Read the code", "status": "completed"}, {"description": "Fix it", "status": "pending"}]
    data = json_lines({"type": "tool_use", "tool_name": "write_todos", "tool_id": "w1", "parameters": {"todos": todos}})
    assert decode(data)[1] == ActivityEvent(
        "plan", plan=(PlanStep("Read the code", "completed"), PlanStep("Fix it", "pending"))
    )


# --------------------------------------------------------------------------- the real Gemini CLI


def gemini_profile(tmp_path: Path, api: Any) -> bridge.Profile:
    """profiles/clis/gemini-cli.yaml as shipped, run by the installed gemini, in a fresh home, against `api`."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir(exist_ok=True)
    gemini_home(str(home))
    profile = bridge.load_profile(CLI_PROFILES / "gemini-cli.yaml", cache=False)
    return profile.replace(
        command=[str(npm_binary("gemini"))], env={**profile.env, **gemini_env(api, str(home))}, cwd=str(work)
    )


async def run(profile: bridge.Profile, message: str, session_id: str = "") -> tuple[bridge.TurnResult, list[Any]]:
    return await run_collecting(profile, message, deadline=REAL_DEADLINE, session_id=session_id)


async def test_real_gemini_streams_its_reply_with_session_and_usage_and_resumes_it_in_the_same_cwd(tmp_path):
    with fake_gemini("text") as api:
        profile = gemini_profile(tmp_path, api)
        first, events = await run(profile, "--yolo is not an option here")
        second, _ = await run(profile, "and again", session_id=first.session_id)
    assert first.ok, (first.error, first.stderr_tail)
    assert first.reply == TEXT_REPLY
    assert [event.text for event in events if isinstance(event, PartialEvent)] == TEXT_PIECES
    assert first.session_id and events[0] == SessionEvent(first.session_id)
    assert first.usage == Usage(input_tokens=100, output_tokens=20, cached_input_tokens=5, total_tokens=120)
    requests = api.posts(":streamGenerateContent")
    assert prompts(requests[0])[-1] == "--yolo is not an option here"  # --prompt= kept it the prompt
    # resume_args: the same session, and the model sees the first exchange again
    assert second.ok and second.session_id == first.session_id, (second.error, second.stderr_tail)
    assert prompts(requests[-1])[-2:] == ["--yolo is not an option here", "and again"]


async def test_real_gemini_tool_calls_are_activity(tmp_path):
    with fake_gemini("tool") as api:
        profile = gemini_profile(tmp_path, api)
        profile = profile.replace(
            args=["--approval-mode=yolo", *profile.args]
        )  # headless gemini offers no shell otherwise
        result, events = await run(profile, "run echo hi")
    assert result.ok, (result.error, result.stderr_tail)
    tools = [
        (event.tool, event.title, event.status, event.text) for event in events if isinstance(event, ActivityEvent)
    ]
    assert tools == [
        ("run_shell_command", "echo hi", "started", ""),
        ("run_shell_command", "echo hi", "completed", "hi"),
    ]
    assert result.reply.startswith("Let me run it.\n\nThe tool said: ")


async def test_real_gemini_api_error_fails_the_turn_with_its_message(tmp_path):
    with fake_gemini("bad_request") as api:
        result, events = await run(gemini_profile(tmp_path, api), "hello")
    assert result.outcome is bridge.Outcome.AGENT_ERROR and result.exit_code == 144  # gemini exits HTTP status & 0xFF
    assert "The fake server refuses this request." in result.error
    assert result.error_reply == result.error and result.reply == ""


# --------------------------------------------------------------------------- the ready profile, sample agent


@pytest.fixture
def fake_gemini_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sample_agents/gemini_like.py installed as gemini, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gemini").symlink_to(SAMPLE_AGENTS / "gemini_like.py")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


async def test_the_ready_profile_runs_gemini_and_resumes(fake_gemini_cli, tmp_path):
    profile = bridge.load_profile(CLI_PROFILES / "gemini-cli.yaml", cache=False).replace(cwd=str(tmp_path))
    with trio.fail_after(TURN_DEADLINE):
        events: list[Any] = []
        first = await bridge.run_turn(profile, Turn("-x marks the spot"), on_event=events.append)
        second = await bridge.run_turn(profile, Turn("again", session_id=first.session_id))
        failed = await bridge.run_turn(profile, Turn("fail: quota"))
    assert first.ok, (first.error, first.stderr_tail)
    assert first.reply == "Let me look.\n\ngemini got: -x marks the spot"
    assert "".join(event.text for event in events if isinstance(event, PartialEvent)) == first.reply
    assert [(event.tool, event.title, event.status) for event in events if isinstance(event, ActivityEvent)] == [
        ("list_directory", ".", "started"),
        ("list_directory", ".", "completed"),
    ]
    assert second.reply.endswith(f"gemini got: again (session {first.session_id} resumed)")
    assert (failed.outcome, failed.error) == (bridge.Outcome.AGENT_ERROR, "quota")


def test_check_accepts_the_ready_profile_without_a_warning(fake_gemini_cli):
    path = str(CLI_PROFILES / "gemini-cli.yaml")
    done = subprocess.run([AGENT_BRIDGE, "check", path], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{path}: ok\n", "")


async def test_real_gemini_reads_fetched_files_named_with_an_at_sign_and_sends_the_image_to_the_model(tmp_path):
    with fake_gemini("text") as api:
        profile = gemini_profile(tmp_path, api)
        sources = tmp_path / "sources"
        sources.mkdir()
        attachments = sent(sources, "a shot.png")  # fetched under that name: a space in a path, escaped after the @
        with trio.fail_after(REAL_DEADLINE):
            result = await bridge.run_turn(profile, Turn("what is this?", attachments=attachments))
    assert result.ok, (result.error, result.stderr_tail)
    [request] = api.posts(":streamGenerateContent")
    parts = [part for content in request.body["contents"] if content.get("role") == "user" for part in content["parts"]]
    inline = [part["inlineData"] for part in parts if "inlineData" in part]
    assert inline == [{"mimeType": "image/png", "data": base64.b64encode(PNG).decode()}]
    assert any("milk" in part.get("text", "") for part in parts)


@pytest.mark.parametrize("respect_git_ignore", [True, False])
async def test_real_gemini_skips_fetched_files_its_git_ignore_hides_unless_told_not_to(tmp_path, respect_git_ignore):
    sources = tmp_path / "sources"
    sources.mkdir()
    with fake_gemini("text") as api:
        profile = gemini_profile(tmp_path, api)
        work = Path(profile.cwd or "")
        subprocess.run(["git", "init", "-q", str(work)], check=True)
        (work / ".gitignore").write_text(".agent-bridge/\n")
        settings = tmp_path / "home" / ".gemini" / "settings.json"
        values = json.loads(settings.read_text())
        values["context"] = {"fileFiltering": {"respectGitIgnore": respect_git_ignore}}
        settings.write_text(json.dumps(values))
        with trio.fail_after(REAL_DEADLINE):
            result = await bridge.run_turn(profile, Turn("what is this?", attachments=sent(sources)))
    assert result.ok, (result.error, result.stderr_tail)
    [request] = api.posts(":streamGenerateContent")
    parts = [part for content in request.body["contents"] if content.get("role") == "user" for part in content["parts"]]
    assert any("inlineData" in part for part in parts) is not respect_git_ignore
