"""protocol: claude-stream-json — Claude Code's stream-json, and the CLIs that print it (codebuddy, cursor, qwen).

Three layers:
- the pure dialect, fed real transcripts of Claude Code 2.1.197 (tests/transcripts/claude-*.jsonl),
  whole, a byte at a time and split at every byte, plus damaged and hand-made streams;
- the real Claude Code (installed by `make test-agents`) driven through the bridge with the ready
  profile profiles/clis/claude-code.yaml, against tools/fake_anthropic.py on loopback;
- every ready profile of the family (claude-code, codebuddy, cursor, qwen-code) run against
  sample_agents/claude_like.py installed under the CLI's name, and accepted by `agent-bridge check`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from agents_cache import npm_binary
from attachment_files import TURN_FILES, sent
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
from fake_anthropic import TEXT_PIECES, TEXT_REPLY, claude_env, fake_anthropic, prompts

import bridge
from bridge import Turn
from bridge.dialects import (
    ActivityEvent,
    ClaudeStreamSettings,
    DialectContext,
    ErrorEvent,
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
REAL_DEADLINE = 30  # a real Claude Code turn takes about a second; a loaded machine gets room


def dialect(**settings: Any) -> Any:
    return dialect_class("claude-stream-json")(DialectContext(settings=ClaudeStreamSettings(**settings)), Turn("hi"))


def decode(data: bytes, **settings: Any) -> list[Any]:
    return fed_whole(dialect(**settings), data)


def session_of(data: bytes) -> str:
    return json.loads(data.splitlines()[0])["session_id"]


# --------------------------------------------------------------------------- real transcripts, pure


def test_text_without_partial_messages_is_one_partial_then_the_result_as_reply():
    data = transcript("claude-text.jsonl")
    assert decode(data) == [
        SessionEvent(session_of(data)),
        PartialEvent(TEXT_REPLY),
        UsageEvent(Usage(input_tokens=107, output_tokens=12, cached_input_tokens=7, cost_usd=0.0008035000000000001)),
        ReplyEvent(TEXT_REPLY),
    ]


def test_text_deltas_are_the_partials_and_the_whole_assistant_line_is_not_shown_again():
    events = decode(transcript("claude-text-partial.jsonl"))
    assert of(events, PartialEvent) == [PartialEvent(piece) for piece in TEXT_PIECES]
    assert of(events, ReplyEvent) == [ReplyEvent(TEXT_REPLY)]
    assert not of(events, ErrorEvent) and not of(events, ProtocolWarning)


def test_thinking_deltas_are_thinking_activity_never_text():
    events = decode(transcript("claude-thinking-partial.jsonl"))
    assert of(events, ActivityEvent) == [
        ActivityEvent("thinking", text="The user wants"),
        ActivityEvent("thinking", text=" a number."),
    ]
    assert of(events, PartialEvent) == [PartialEvent("4"), PartialEvent("2")]
    assert of(events, ReplyEvent) == [ReplyEvent("42")]


@pytest.mark.parametrize("name", ["claude-tool.jsonl", "claude-tool-partial.jsonl"])
def test_a_tool_call_is_activity_and_the_text_after_it_starts_a_paragraph(name):
    events = [event for event in decode(transcript(name)) if not isinstance(event, (SessionEvent, UsageEvent))]
    started = ActivityEvent("tool", tool="Bash", title="echo hi", status="started", call_id="toolu_fake1")
    completed = ActivityEvent(
        "tool", tool="Bash", title="echo hi", status="completed", call_id="toolu_fake1", text="hi"
    )
    assert events in (
        [
            PartialEvent("Let me run it."),
            started,
            completed,
            PartialEvent("\n\nThe tool said: hi"),
            ReplyEvent("The tool said: hi"),
        ],
        [
            PartialEvent("Let me run it."),
            started,
            completed,
            PartialEvent("\n\nThe tool said: "),
            PartialEvent("hi"),
            ReplyEvent("The tool said: hi"),
        ],
    )


def test_a_refused_tool_call_failed_and_says_why():
    [_, ended] = of(decode(transcript("claude-tool-blocked.jsonl")), ActivityEvent)
    assert (ended.status, ended.tool, ended.title) == ("failed", "Bash", "touch made-by-claude")
    assert "was blocked" in ended.text and len(ended.text) <= 300


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("claude-error-401.jsonl", "Invalid API key · Fix external API key"),
        ("claude-error-529.jsonl", "API Error: 529 Overloaded."),
    ],
)
def test_an_api_error_keeps_subtype_success_but_is_an_error_and_its_message_is_no_partial(name, text):
    events = decode(transcript(name))
    [error] = of(events, ErrorEvent)
    assert error.text.startswith(text)
    assert not of(events, PartialEvent) and not of(events, ReplyEvent)


def test_an_error_subtype_gives_its_errors_list_as_the_error():
    assert of(decode(transcript("claude-resume-unknown.jsonl")), ErrorEvent) == [
        ErrorEvent("No conversation found with session ID: 6c1f0f5e-3b7a-4c1e-9a55-0d2b8e7f4a10")
    ]


def test_a_retried_request_cannot_take_back_what_was_streamed_and_the_reply_is_the_result():
    events = decode(transcript("claude-retry-partial.jsonl"))
    assert of(events, PartialEvent) == [PartialEvent("Draft that will be lost")]
    assert of(events, ReplyEvent) == [ReplyEvent(TEXT_REPLY)]
    assert not of(events, ErrorEvent)


@pytest.mark.parametrize("name", sorted(path.name for path in TRANSCRIPTS.glob("claude-*.jsonl")))
def test_any_chunking_decodes_like_one_feed(name):
    data = transcript(name)
    byte_by_byte = dialect()
    assert fed_byte_by_byte(byte_by_byte, data) + byte_by_byte.close() == decode(data)


def test_a_split_at_every_byte_decodes_like_one_feed():
    data = transcript("claude-tool.jsonl")
    assert_every_cut_decodes_alike(dialect, data, decode(data))


# --------------------------------------------------------------------------- damaged and hand-made streams


def test_garbage_lines_are_counted_in_one_warning_and_change_nothing():
    data = transcript("claude-text.jsonl")
    first, rest = data.split(b"\n", 1)
    noisy = first + b'\nnot json at all\n[1, 2]\n"a string"\n{"type":\n\n' + rest
    events = decode(noisy)
    assert events[:-1] == decode(data)
    assert events[-1] == ProtocolWarning("ignored 4 stdout line(s) that were not JSON objects")


def test_a_stream_cut_in_the_middle_of_a_line_is_an_unfinished_turn():
    data = transcript("claude-text-partial.jsonl")
    cut = data[: data.index(b'{"type":"result"') + 40]
    events = decode(cut)
    assert of(events, PartialEvent) == [PartialEvent(piece) for piece in TEXT_PIECES]
    assert events[-2:] == [
        ErrorEvent(UNFINISHED, unfinished=True),
        ProtocolWarning("ignored 1 stdout line(s) that were not JSON objects"),
    ]


def test_a_stream_without_its_result_is_an_unfinished_turn():
    data = transcript("claude-tool.jsonl")
    events = decode(data[: data.index(b'{"type":"result"')])
    assert not of(events, ReplyEvent)
    assert events[-1] == ErrorEvent(UNFINISHED, unfinished=True)
    assert decode(b"") == [ErrorEvent(UNFINISHED, unfinished=True)]


def test_a_line_over_the_limit_is_cut_and_the_turn_goes_on():
    long_text = "x" * 5000
    data = json_lines(
        {"type": "system", "subtype": "init", "session_id": "s1"},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": long_text}]}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "done"},
    )
    events = decode(data, max_line_bytes=4096)
    assert [type(event) for event in events] == [SessionEvent, LineCut, ReplyEvent]


def test_unknown_types_and_fields_are_ignored():
    data = json_lines(
        {"type": "rate_limit_event", "rate_limit_info": {"status": "allowed"}},
        {"type": "system", "subtype": "api_retry", "attempt": 1, "session_id": "other"},
        {"type": "stream_event", "event": {"type": "ping"}},
        {"type": "assistant", "message": {"content": [{"type": "server_tool_use", "id": "x"}, "odd", 7]}},
        {"type": "user", "message": {"content": "a string"}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "ok", "new_field": [1]},
    )
    assert decode(data) == [ReplyEvent("ok")]


def test_each_distinct_valid_session_id_is_reported_once():
    data = json_lines(
        {"type": "system", "subtype": "init", "session_id": "a"},
        {"type": "system", "subtype": "init", "session_id": "a"},
        {"type": "system", "subtype": "init", "session_id": "has space"},
        {"type": "result", "subtype": "success", "is_error": False, "result": "", "session_id": "b"},
    )
    assert decode(data) == [
        SessionEvent("a"),
        ProtocolWarning("ignored a session id because it contains whitespace or control characters"),
        SessionEvent("b"),
        ReplyEvent(""),
    ]


def test_codebuddy_names_its_session_on_the_result_only():
    data = json_lines(
        {"type": "system", "subtype": "init", "model": "x"},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "hi"}]}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "hi", "session_id": "cb-1"},
    )
    assert decode(data) == [PartialEvent("hi"), SessionEvent("cb-1"), ReplyEvent("hi")]


def test_qwen_error_results_carry_error_message():
    data = json_lines(
        {"type": "result", "subtype": "error_max_turns", "is_error": True, "error": {"message": "too long"}},
    )
    assert of(decode(data), ErrorEvent) == [ErrorEvent("too long")]
    bare = json_lines({"type": "result", "subtype": "error_max_turns", "is_error": True})
    assert of(decode(bare), ErrorEvent) == [ErrorEvent("the agent stopped: max turns")]


def test_a_subagent_adds_tool_activity_but_no_text():
    inside = {"parent_tool_use_id": "toolu_task"}
    data = json_lines(
        {
            "type": "assistant",
            **inside,
            "message": {
                "content": [
                    {"type": "text", "text": "subagent musing"},
                    {"type": "tool_use", "id": "t2", "name": "Grep", "input": {"pattern": "TODO"}},
                ]
            },
        },
        {
            "type": "stream_event",
            **inside,
            "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "more"}},
        },
        {"type": "result", "subtype": "success", "is_error": False, "result": "done"},
    )
    assert decode(data) == [
        ActivityEvent("tool", tool="Grep", title="TODO", status="started", call_id="t2"),
        ReplyEvent("done"),
    ]


def test_a_todo_list_is_a_plan():
    todos = [
        {"content": "Read the code", "status": "completed", "activeForm": "Reading"},
        {"content": "Fix the bug", "status": "in_progress", "activeForm": "Fixing"},
    ]
    data = json_lines(
        {
            "type": "assistant",
            "message": {"content": [{"type": "tool_use", "id": "t1", "name": "TodoWrite", "input": {"todos": todos}}]},
        }
    )
    assert decode(data)[:2] == [
        ActivityEvent("tool", tool="TodoWrite", status="started", call_id="t1"),
        ActivityEvent("plan", plan=(PlanStep("Read the code", "completed"), PlanStep("Fix the bug", "in_progress"))),
    ]


CURSOR_STREAM = [
    {"type": "system", "subtype": "init", "session_id": "chat-1"},
    {"type": "thinking", "subtype": "delta", "text": "hmm", "session_id": "chat-1"},
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "Let me "}]}, "timestamp_ms": 1},
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "look."}]}, "timestamp_ms": 2},
    {
        "type": "assistant",
        "message": {"content": [{"type": "text", "text": "Let me look."}]},
        "model_call_id": "m1",
        "timestamp_ms": 3,
    },
    {
        "type": "tool_call",
        "subtype": "started",
        "call_id": "c1",
        "tool_call": {"readToolCall": {"args": {"path": "README.md"}}},
    },
    {
        "type": "tool_call",
        "subtype": "completed",
        "call_id": "c1",
        "tool_call": {"readToolCall": {"args": {"path": "README.md"}, "result": {"success": {"content": "…"}}}},
    },
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "Found "}]}, "timestamp_ms": 4},
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "it."}]}, "timestamp_ms": 5},
    {"type": "assistant", "message": {"content": [{"type": "text", "text": "Found it."}]}},
    {
        "type": "result",
        "subtype": "success",
        "is_error": False,
        "result": "Let me look.Found it.",
        "session_id": "chat-1",
    },
]


def test_cursor_repeats_are_dropped_with_the_setting():
    events = decode(json_lines(*CURSOR_STREAM), repeats_streamed_text=True)
    assert [event.text for event in of(events, PartialEvent)] == ["Let me ", "look.", "\n\nFound ", "it."]
    assert [(event.activity, event.tool, event.title, event.status) for event in of(events, ActivityEvent)] == [
        ("thinking", "", "", ""),
        ("tool", "read", "README.md", "started"),
        ("tool", "read", "README.md", "completed"),
    ]
    assert events[-1] == ReplyEvent("Let me look.Found it.")


def test_without_the_setting_cursor_repeats_would_be_shown_twice():
    partials = [event.text for event in of(decode(json_lines(*CURSOR_STREAM)), PartialEvent)]
    assert partials == ["Let me ", "look.", "Let me look.", "\n\nFound ", "it.", "Found it."]


def test_cursor_error_results_fail_the_turn():
    data = json_lines({"type": "result", "subtype": "error", "is_error": False, "result": "cursor gave up"})
    assert decode(data) == [ErrorEvent("cursor gave up")]


def test_usage_counts_cache_reads_and_writes_as_input_like_other_families():
    data = json_lines(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": "",
            "usage": {
                "input_tokens": 3,
                "cache_read_input_tokens": 14000,
                "cache_creation_input_tokens": 90,
                "output_tokens": 9,
            },
            "total_cost_usd": 0.02,
        }
    )
    assert of(decode(data), UsageEvent) == [
        UsageEvent(Usage(input_tokens=14093, output_tokens=9, cached_input_tokens=14000, cost_usd=0.02))
    ]


# --------------------------------------------------------------------------- the real Claude Code


def claude_profile(tmp_path: Path, api: Any) -> bridge.Profile:
    """profiles/clis/claude-code.yaml as shipped, run by the installed claude, in a fresh home, against `api`."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    profile = bridge.load_profile(CLI_PROFILES / "claude-code.yaml", cache=False)
    return profile.replace(command=[str(npm_binary("claude"))], env=claude_env(api, str(home)), cwd=str(work))


async def run(profile: bridge.Profile, message: str, session_id: str = "") -> tuple[bridge.TurnResult, list[Any]]:
    return await run_collecting(profile, message, deadline=REAL_DEADLINE, session_id=session_id)


async def test_real_claude_streams_its_reply_with_session_and_usage_and_resumes_it(tmp_path):
    with fake_anthropic("text") as api:
        profile = claude_profile(tmp_path, api)
        first, events = await run(profile, "-p is not an option here")
        second, _ = await run(profile, "and again", session_id=first.session_id)
    assert first.ok, (first.error, first.stderr_tail)
    assert first.reply == TEXT_REPLY
    assert [event.text for event in events if isinstance(event, PartialEvent)] == TEXT_PIECES
    assert first.session_id and events[0] == SessionEvent(first.session_id)
    assert first.usage is not None and first.usage.output_tokens == 12 and first.usage.cost_usd
    requests = api.posts("/v1/messages")
    assert prompts(requests[0]) == ["-p is not an option here"]  # `--` kept it the prompt
    # resume_args: the same session, and the model sees the first exchange again
    assert second.ok and second.session_id == first.session_id, (second.error, second.stderr_tail)
    assert prompts(requests[-1]) == ["-p is not an option here", "and again"]


def system_text(request: Any) -> str:
    system = request.body.get("system", "")
    return system if isinstance(system, str) else "\n".join(block.get("text", "") for block in system)


@pytest.mark.parametrize("tell_agent", ["session", "never"])
async def test_real_claude_is_told_the_turns_outbox_in_its_system_prompt_unless_never(tmp_path, tell_agent):
    with fake_anthropic("text") as api:
        profile = claude_profile(tmp_path, api).replace(outbox={"tell_agent": tell_agent})
        result, _ = await run(profile, "hello there")
    assert result.ok, (result.error, result.stderr_tail)
    [request] = api.posts("/v1/messages")[-1:]
    assert prompts(request) == ["hello there"]
    outbox = re.escape(str(tmp_path / "work" / ".agent-bridge" / "outbox"))
    told = re.search(rf"Files for the user: write them to {outbox}/[\w-]+ \(", system_text(request))
    assert bool(told) == (tell_agent == "session"), system_text(request)[-400:]


async def test_real_claude_tool_calls_are_activity(tmp_path):
    with fake_anthropic("tool") as api:
        result, events = await run(claude_profile(tmp_path, api), "run echo hi")
    assert result.ok, (result.error, result.stderr_tail)
    tools = [
        (event.tool, event.title, event.status, event.text) for event in events if isinstance(event, ActivityEvent)
    ]
    assert tools == [("Bash", "echo hi", "started", ""), ("Bash", "echo hi", "completed", "hi")]
    assert result.reply == "The tool said: hi"


async def test_real_claude_api_error_fails_the_turn_with_its_message(tmp_path):
    with fake_anthropic("unauthorized") as api:
        result, events = await run(claude_profile(tmp_path, api), "hello")
    assert (result.outcome, result.exit_code) == (bridge.Outcome.AGENT_ERROR, 1)
    assert result.error == result.error_reply == "Invalid API key · Fix external API key"
    assert result.reply == "" and not any(isinstance(event, PartialEvent) for event in events)


async def test_real_claude_retry_keeps_the_streamed_draft_and_replies_with_the_result(tmp_path):
    with fake_anthropic("retry") as api:
        profile = claude_profile(tmp_path, api)
        profile = profile.replace(env={**profile.env, "CLAUDE_CODE_MAX_RETRIES": "1"})
        result, events = await run(profile, "hello")
    assert result.ok, (result.error, result.stderr_tail)
    assert [event.text for event in events if isinstance(event, PartialEvent)] == ["Draft that will be lost"]
    assert result.reply == TEXT_REPLY


# --------------------------------------------------------------------------- ready profiles, sample agents

FAMILY = {"claude-code": "claude", "codebuddy": "codebuddy", "cursor": "agent", "qwen-code": "qwen"}


@pytest.fixture
def fake_clis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sample_agents/claude_like.py installed as claude, codebuddy, agent and qwen, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in FAMILY.values():
        (bin_dir / program).symlink_to(SAMPLE_AGENTS / "claude_like.py")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


@pytest.mark.parametrize("name", sorted(FAMILY))
async def test_each_ready_profile_runs_its_cli_and_resumes(name, fake_clis, tmp_path):
    profile = bridge.load_profile(CLI_PROFILES / f"{name}.yaml", cache=False).replace(cwd=str(tmp_path))
    flavor = {"agent": "cursor"}.get(FAMILY[name], FAMILY[name])
    with trio.fail_after(TURN_DEADLINE):
        events: list[Any] = []
        first = await bridge.run_turn(profile, Turn("-x marks the spot"), on_event=events.append)
        second = await bridge.run_turn(profile, Turn("again", session_id=first.session_id))
        failed = await bridge.run_turn(profile, Turn("fail: out of credit"))
    assert first.ok, (first.error, first.stderr_tail)
    assert first.reply == f"{flavor} got: -x marks the spot"
    partials = "".join(event.text for event in events if isinstance(event, PartialEvent))
    assert partials == f"Let me look.\n\n{first.reply}"  # each piece once, a paragraph after the tool call
    assert [event.status for event in events if isinstance(event, ActivityEvent)] == ["started", "completed"]
    assert second.reply == f"{flavor} got: again (session {first.session_id} resumed)"
    assert second.session_id == first.session_id
    assert (failed.outcome, failed.error) == (bridge.Outcome.AGENT_ERROR, "out of credit")


def test_check_accepts_the_family_s_ready_profiles_without_a_warning(fake_clis):
    paths = [str(CLI_PROFILES / f"{name}.yaml") for name in sorted(FAMILY)]
    done = subprocess.run([AGENT_BRIDGE, "check", *paths], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{path}: ok" for path in paths]
    assert done.stderr == ""


def test_a_json_protocol_profile_can_be_replaced_and_still_refuses_a_session_prefix(tmp_path):
    profile = bridge.load_profile(CLI_PROFILES / "claude-code.yaml", cache=False)
    assert profile.replace(timeout_secs=5).timeout_secs == 5  # to_dict() carries the default session prefix
    with pytest.raises(bridge.ProfileError, match="session_line_prefix is for protocol agentproc-0.1"):
        profile.replace(session_line_prefix="SESSION=")


def test_qwen_usage_already_counts_the_cache_in_its_input():
    data = json_lines(
        {"type": "system", "subtype": "init", "session_id": "q1", "qwen_code_version": "0.24.4"},
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": "",
            "usage": {"input_tokens": 120, "output_tokens": 9, "cache_read_input_tokens": 100, "total_tokens": 129},
        },
    )
    assert of(decode(data), UsageEvent) == [
        UsageEvent(Usage(input_tokens=120, output_tokens=9, cached_input_tokens=100, total_tokens=129))
    ]


async def test_real_claude_is_told_the_paths_of_the_files_fetched_for_the_turn(tmp_path):
    sources = tmp_path / "sources"
    sources.mkdir()
    with fake_anthropic("text") as api:
        profile = claude_profile(tmp_path, api)
        with trio.fail_after(REAL_DEADLINE):
            result = await bridge.run_turn(profile, Turn("what is this?", attachments=sent(sources)))
    assert result.ok, (result.error, result.stderr_tail)
    turn_files = rf"{tmp_path}/work/{TURN_FILES}"
    assert re.fullmatch(
        rf"what is this\?\n\nAttached files:\n- {turn_files}/shot\.png \(image, image/png\)"
        rf"\n- {turn_files}/notes\.txt \(file, text/plain\)",
        prompts(api.posts("/v1/messages")[0])[-1],
    )
