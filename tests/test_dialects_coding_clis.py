"""The coding-CLI dialects, from transcripts: grok, kimi, opencode, pi, dsh and deepseek.

Where each transcript comes from:

- grok-streaming-json: `transcripts/grok/` are captures of grok 0.2.101 published
  with the Kōan project's Grok provider (`koan/tests/grok_samples.py`; session
  ids replaced there by placeholders).
- kimi-stream-json: the examples of kimi-cli's `docs/en/customization/print-mode.md`,
  and the list-of-parts content its `JsonPrinter` writes for thinking models.
- opencode-json: the events of opencode's `run.ts` (`emit(type, {part})`), with
  parts shaped as its SDK types them.
- pi-json: `packages/coding-agent/docs/json.md` and the `AgentEvent` types of pi-mono.
- dsh-json: the frames of the reference runner's dsh bridge tests (`bridge.test.js`),
  checked there against dsh 0.1.7-rc.2.
- deepseek-stream-json: `ExecStreamEvent` of DeepSeek-TUI's `crates/tui/src/main.rs`.
"""

from __future__ import annotations

import json

import pytest
from fake_clis import TRANSCRIPTS, decode, of_type
from hypothesis import example, given
from hypothesis import strategies as st

from bridge import Turn
from bridge.dialects import (
    ActivityEvent,
    ErrorEvent,
    PartialEvent,
    ProtocolWarning,
    ReplyEvent,
    SessionEvent,
    Usage,
    UsageEvent,
)
from bridge.dialects.base import shorten


def lines(*objects: object) -> bytes:
    return b"".join(json.dumps(item).encode() + b"\n" for item in objects)


# --------------------------------------------------------------------------- grok


def grok(name: str) -> bytes:
    return (TRANSCRIPTS / "grok" / f"{name}.jsonl").read_bytes()


def test_grok_text_deltas_stream_and_join_into_the_reply_and_end_names_the_session():
    events = decode("grok-streaming-json", grok("multi-delta"))
    assert of_type(events, ActivityEvent) == [ActivityEvent("thinking", text="Run the command.")]  # gathered
    assert [event.text for event in of_type(events, PartialEvent)] == ["hello", "-", "from", "-", "tool"]
    assert of_type(events, ReplyEvent) == [ReplyEvent("hello-from-tool")]
    assert of_type(events, SessionEvent) == [SessionEvent("sess-fixture-002")]
    # Cache reads are outside grok's input_tokens: the captured total is input + cache reads + output.
    assert of_type(events, UsageEvent) == [
        UsageEvent(
            Usage(
                input_tokens=21550 + 33408,
                output_tokens=71,
                cached_input_tokens=33408,
                reasoning_tokens=59,
                total_tokens=55029,
            )
        )
    ]
    assert not of_type(events, ErrorEvent)


def test_grok_a_stream_cut_before_end_did_not_finish_its_turn():
    events = decode("grok-streaming-json", grok("truncated"))
    assert "".join(event.text for event in of_type(events, PartialEvent)) == "Partial progress so far"
    assert not of_type(events, ReplyEvent)
    assert events[-1] == ErrorEvent("grok ended without finishing its turn (no end event)", unfinished=True)


def test_grok_cancelled_and_error_ends_fail_the_turn():
    cancelled = decode("grok-streaming-json", lines({"type": "end", "stopReason": "Cancelled", "sessionId": "s1"}))
    assert cancelled[0] == SessionEvent("s1")
    assert [event.text.split(" (")[0] for event in of_type(cancelled, ErrorEvent)] == ["grok cancelled the turn"]
    failed = decode(
        "grok-streaming-json",
        lines({"type": "text", "data": "so"}, {"type": "error", "message": "Rate limit exceeded", "sessionId": "s2"}),
    )
    assert of_type(failed, ErrorEvent) == [ErrorEvent("Rate limit exceeded")]  # and no "did not finish" on top
    assert of_type(failed, SessionEvent) == [SessionEvent("s2")]


# --------------------------------------------------------------------------- kimi

KIMI_TOOL_TURN = lines(
    {
        "role": "assistant",
        "content": "Let me check the current directory.",
        "tool_calls": [
            {"type": "function", "id": "tc_1", "function": {"name": "Shell", "arguments": '{"command":"ls"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "tc_1", "content": "file1.py\nfile2.py"},
    {"role": "assistant", "content": "There are two Python files in the current directory."},
)


def test_kimi_each_assistant_message_is_shown_the_last_is_the_reply_and_tools_are_activity():
    events = decode("kimi-stream-json", KIMI_TOOL_TURN)
    assert [event.text for event in of_type(events, PartialEvent)] == [
        "Let me check the current directory.",
        "\n\nThere are two Python files in the current directory.",
    ]
    # once, the last message
    assert of_type(events, ReplyEvent) == [ReplyEvent("There are two Python files in the current directory.")]
    assert of_type(events, ActivityEvent) == [
        ActivityEvent("tool", tool="Shell", title="ls", status="started", call_id="tc_1"),
        ActivityEvent("tool", text="file1.py file2.py", tool="Shell", status="completed", call_id="tc_1"),
    ]
    assert not of_type(events, SessionEvent)  # the profile names kimi's session, kimi does not


def test_kimi_thinking_models_write_a_list_of_parts_and_failed_tools_say_error():
    events = decode(
        "kimi-stream-json",
        lines(
            {
                "role": "assistant",
                "content": [{"type": "think", "think": "Hmm.", "encrypted": None}, {"type": "text", "text": "Trying."}],
                "tool_calls": [{"type": "function", "id": "tc_2", "function": {"name": "ReadFile", "arguments": None}}],
            },
            {
                "role": "tool",
                "tool_call_id": "tc_2",
                "content": [{"type": "text", "text": "<system>ERROR: no such file</system>"}],
            },
            {"id": "n1", "category": "task", "type": "done", "title": "t", "body": "b"},  # a notification
            {"role": "assistant", "content": [{"type": "text", "text": "It is "}, {"type": "text", "text": "gone."}]},
        ),
    )
    assert of_type(events, ActivityEvent)[0] == ActivityEvent("thinking", text="Hmm.")
    assert of_type(events, ActivityEvent)[-1].status == "failed"
    assert of_type(events, ReplyEvent) == [ReplyEvent("It is gone.")]  # once, the last message


def test_kimi_prints_its_error_as_a_plain_line_which_is_the_turns_error():
    events = decode(
        "kimi-stream-json",
        b'{"role":"assistant","content":"Working on it."}\nError code: 401 - Invalid Authentication\n',
    )
    assert events[-1] == ErrorEvent("Error code: 401 - Invalid Authentication")
    assert not of_type(events, ProtocolWarning)


# --------------------------------------------------------------------------- opencode


def opencode_event(kind: str, **data: object) -> dict[str, object]:
    return {"type": kind, "timestamp": 1, "sessionID": "ses_abc", **data}


OPENCODE_TURN = lines(
    opencode_event("step_start", part={"type": "step-start"}),
    opencode_event(
        "tool_use",
        part={
            "type": "tool",
            "tool": "read",
            "callID": "c1",
            "sessionID": "ses_abc",
            "state": {
                "status": "completed",
                "input": {"filePath": "/w/README.md"},
                "output": "# Title",
                "title": "README.md",
            },
        },
    ),
    opencode_event(
        "step_finish",
        part={
            "type": "step-finish",
            "reason": "tool-calls",
            "cost": 0.01,
            "tokens": {"input": 100, "output": 10, "reasoning": 4, "cache": {"read": 50, "write": 0}},
        },
    ),
    opencode_event("text", part={"type": "text", "text": "The README has a title.", "time": {"start": 1, "end": 2}}),
    opencode_event(
        "step_finish",
        part={
            "type": "step-finish",
            "reason": "stop",
            "cost": 0.02,
            "tokens": {"input": 120, "output": 8, "reasoning": 0, "cache": {"read": 0, "write": 0}},
        },
    ),
    opencode_event("done", reason="idle", rejected=["external_directory"]),
)


def test_opencode_maps_session_tools_text_and_each_steps_usage():
    events = decode("opencode-json", OPENCODE_TURN)
    assert events[0] == SessionEvent("ses_abc")
    assert of_type(events, ActivityEvent) == [
        ActivityEvent("tool", text="# Title", tool="read", title="README.md", status="completed", call_id="c1"),
        ActivityEvent("tool", tool="external_directory", status="denied"),  # what it auto-rejected
    ]
    assert of_type(events, ReplyEvent) == [ReplyEvent("The README has a title.")]
    usages = [event.usage for event in of_type(events, UsageEvent)]
    assert usages[0] == Usage(
        input_tokens=150, output_tokens=14, cached_input_tokens=50, reasoning_tokens=4, total_tokens=164, cost_usd=0.01
    )
    assert all(not event.replace for event in of_type(events, UsageEvent))


def test_opencode_errors_fail_the_turn_and_an_older_build_without_done_is_fine():
    events = decode(
        "opencode-json",
        lines(opencode_event("error", error={"name": "APIError", "data": {"message": "Invalid API key"}})),
    )
    assert events == [SessionEvent("ses_abc"), ErrorEvent("Invalid API key")]
    no_done = decode(
        "opencode-json",
        lines(opencode_event("text", part={"type": "text", "text": "Hi.", "time": {"start": 1, "end": 2}})),
    )
    assert no_done == [SessionEvent("ses_abc"), PartialEvent("Hi."), ReplyEvent("Hi.")]


def test_opencode_shows_every_text_part_and_replies_once_with_the_last():
    def text(words: str) -> dict[str, object]:
        return opencode_event("text", part={"type": "text", "text": words, "time": {"start": 1, "end": 2}})

    tool = opencode_event(
        "tool_use",
        part={
            "type": "tool",
            "tool": "bash",
            "callID": "c1",
            "sessionID": "ses_abc",
            "state": {"status": "completed", "input": {"command": "ls"}},
        },
    )
    events = decode("opencode-json", lines(text("Let me look."), tool, text("Found it.")))
    assert [partial.text for partial in of_type(events, PartialEvent)] == ["Let me look.", "\n\nFound it."]
    assert of_type(events, ReplyEvent) == [ReplyEvent("Found it.")]


# --------------------------------------------------------------------------- pi


def pi_assistant(text: str, *, stop: str = "stop", error: str = "") -> dict[str, object]:
    message: dict[str, object] = {
        "role": "assistant",
        "content": [{"type": "text", "text": text}] if text else [],
        "stopReason": stop,
        "usage": {
            "input": 10,
            "output": 5,
            "cacheRead": 20,
            "cacheWrite": 0,
            "totalTokens": 35,
            "cost": {"input": 0.1, "output": 0.2, "cacheRead": 0, "cacheWrite": 0, "total": 0.3},
        },
    }
    if error:
        message["errorMessage"] = error
    return message


def pi_turn(*messages: dict[str, object], end: bool = True) -> bytes:
    stream: list[object] = [{"type": "session", "version": 3, "id": "uuid-1", "cwd": "/w"}, {"type": "agent_start"}]
    for message in messages:
        stream.append({"type": "message_start", "message": {**message, "content": []}})
        for part in message["content"]:  # type: ignore[union-attr]
            for word in part["text"].split(" "):
                stream.append(
                    {
                        "type": "message_update",
                        "message": message,
                        "assistantMessageEvent": {"type": "text_delta", "contentIndex": 0, "delta": word},
                    }
                )
        stream.append({"type": "message_end", "message": message})
    if end:
        stream.append({"type": "agent_end", "messages": []})
    return lines(*stream)


def test_pi_streams_deltas_replies_with_the_last_message_and_adds_up_usage():
    events = decode("pi-json", pi_turn(pi_assistant("Looking now", stop="toolUse"), pi_assistant("Found it")))
    assert events[0] == SessionEvent("uuid-1")
    assert [event.text for event in of_type(events, PartialEvent)] == ["Looking", "now", "\n\nFound", "it"]
    assert of_type(events, ReplyEvent)[-1] == ReplyEvent("Found it")
    assert [event.usage for event in of_type(events, UsageEvent)] == [
        Usage(input_tokens=30, output_tokens=5, cached_input_tokens=20, total_tokens=35, cost_usd=0.3)
    ] * 2
    assert not of_type(events, ErrorEvent)


def test_pi_fails_when_the_last_request_failed_but_not_when_a_retry_succeeded():
    failed = decode("pi-json", pi_turn(pi_assistant("", stop="error", error="401 invalid x-api-key")))
    assert of_type(failed, ErrorEvent) == [ErrorEvent("401 invalid x-api-key")]
    retried = decode("pi-json", pi_turn(pi_assistant("", stop="error", error="overloaded"), pi_assistant("Done")))
    assert not of_type(retried, ErrorEvent)
    unfinished = decode("pi-json", pi_turn(pi_assistant("Half"), end=False))
    assert unfinished[-1] == ErrorEvent("pi ended without finishing its turn (no agent_end event)", unfinished=True)


def test_pi_tool_executions_are_activity():
    events = decode(
        "pi-json",
        lines(
            {"type": "tool_execution_start", "toolCallId": "t1", "toolName": "bash", "args": {"command": "ls -la"}},
            {
                "type": "tool_execution_end",
                "toolCallId": "t1",
                "toolName": "bash",
                "isError": True,
                "result": {"content": [{"type": "text", "text": "ls: cannot access"}]},
            },
            {"type": "agent_end", "messages": []},
        ),
    )
    assert events == [
        ActivityEvent("tool", tool="bash", title="ls -la", status="started", call_id="t1"),
        ActivityEvent("tool", text="ls: cannot access", tool="bash", status="failed", call_id="t1"),
    ]


# --------------------------------------------------------------------------- dsh

DSH_TURN = lines(
    {"type": "session", "sessionId": "session-shim-42", "cwd": "/tmp"},
    {"type": "status", "phase": "turn_start", "turn": 1},
    {
        "type": "status",
        "phase": "step_end",
        "turn": 1,
        "step": 1,
        "usage": {
            "inputTokens": 17,
            "outputTokens": 7,
            "totalTokens": 28,
            "cacheReadTokens": 5,
            "cacheWriteTokens": 4,
            "reasoningTokens": 2,
        },
    },
    {"type": "text", "text": "partial one"},
    {"type": "status", "phase": "step_end", "turn": 1, "step": 2},
    {"type": "final", "text": "shim reply"},
)


def test_dsh_maps_the_session_frame_text_final_and_step_usage():
    events = decode("dsh-json", DSH_TURN)
    assert events == [
        SessionEvent("session-shim-42"),
        UsageEvent(
            Usage(input_tokens=26, output_tokens=7, cached_input_tokens=5, reasoning_tokens=2, total_tokens=28),
            replace=False,
        ),
        PartialEvent("partial one"),
        ReplyEvent("shim reply"),
    ]


def test_dsh_an_error_frame_fails_and_a_run_without_final_did_not_finish():
    failed = decode(
        "dsh-json",
        lines(
            {"type": "session", "sessionId": "session-shim-42", "cwd": "/tmp"},
            {"type": "error", "message": 'session "x" was recorded in "/a", not "/b"'},
        ),
    )
    assert failed[-1] == ErrorEvent('session "x" was recorded in "/a", not "/b"')
    stopped = decode("dsh-json", lines({"type": "session", "sessionId": "session-shim-42", "cwd": "/tmp"}))
    assert stopped[-1] == ErrorEvent("dsh ended without finishing its turn (no final message)", unfinished=True)


# --------------------------------------------------------------------------- deepseek


def test_deepseek_joins_content_deltas_and_takes_the_session_and_usage_from_metadata():
    events = decode(
        "deepseek-stream-json",
        lines(
            {"type": "tool_use", "name": "read_file", "id": "t1", "input": {"path": "README.md"}},
            {"type": "tool_result", "id": "t1", "output": "# hi", "status": "success"},
            {"type": "content", "content": "It says "},
            {"type": "content", "content": "hi."},
            {"type": "session_capture", "content": "0a1b-session"},
            {
                "type": "metadata",
                "meta": {
                    "model": "deepseek-v4",
                    "input_tokens": 50,
                    "output_tokens": 9,
                    "session_id": "0a1b-session",
                    "status": "completed",
                },
            },
            {"type": "done"},
        ),
    )
    assert of_type(events, ActivityEvent) == [
        ActivityEvent("tool", tool="read_file", title="README.md", status="started", call_id="t1"),
        ActivityEvent("tool", text="# hi", tool="read_file", status="completed", call_id="t1"),
    ]
    assert of_type(events, SessionEvent) == [SessionEvent("0a1b-session")]
    assert of_type(events, ReplyEvent) == [ReplyEvent("It says hi.")]
    assert of_type(events, UsageEvent) == [UsageEvent(Usage(input_tokens=50, output_tokens=9, total_tokens=59))]


def test_deepseek_fails_by_the_status_it_reports_not_by_an_error_it_recovered_from():
    recovered = decode(
        "deepseek-stream-json",
        lines(
            {"type": "error", "error": "rate limited, retrying"},
            {"type": "content", "content": "ok"},
            {
                "type": "metadata",
                "meta": {"input_tokens": 1, "output_tokens": 1, "session_id": "", "status": "completed"},
            },
            {"type": "done"},
        ),
    )
    assert not of_type(recovered, ErrorEvent) and of_type(recovered, ReplyEvent) == [ReplyEvent("ok")]
    failed = decode(
        "deepseek-stream-json",
        lines(
            {"type": "error", "error": "API error 401"},
            {"type": "metadata", "meta": {"input_tokens": 0, "output_tokens": 0, "session_id": "", "status": "failed"}},
            {"type": "done"},
        ),
    )
    assert of_type(failed, ErrorEvent) == [ErrorEvent("API error 401")] and not of_type(failed, ReplyEvent)
    cut = decode("deepseek-stream-json", lines({"type": "content", "content": "par"}))
    assert cut[-1] == ErrorEvent("deepseek ended without finishing its turn (no done event)", unfinished=True)


# --------------------------------------------------------------------------- every dialect

STREAMS = {
    "grok-streaming-json": grok("success"),
    "kimi-stream-json": KIMI_TOOL_TURN,
    "opencode-json": OPENCODE_TURN,
    "pi-json": pi_turn(pi_assistant("Looking now", stop="toolUse"), pi_assistant("Found it")),
    "dsh-json": DSH_TURN,
}


@pytest.mark.parametrize("protocol", sorted(STREAMS))
def test_any_split_of_the_stream_gives_the_same_events(protocol):
    whole = decode(protocol, STREAMS[protocol])
    assert decode(protocol, STREAMS[protocol], chunk=1) == whole
    assert decode(protocol, STREAMS[protocol], chunk=5) == whole


@pytest.mark.parametrize("protocol", sorted([*STREAMS, "deepseek-stream-json", "aictrl-ndjson"]))
def test_garbage_and_unknown_types_are_ignored_and_an_invalid_session_id_is_not_taken(protocol):
    junk = b"\xff\xfe not json\n[]\n" + lines(
        {"type": "brand_new", "role": "brand_new"}, {"type": ["odd"]}, {"type": {"odd": 1}, "role": ["odd"]}
    )
    bad_id = {"type": "session", "id": "bad id", "sessionId": "bad id", "sessionID": "bad id"}
    events = decode(protocol, junk + lines(bad_id, bad_id), turn=Turn("hi"))
    assert not of_type(events, SessionEvent)
    assert not of_type(events, ReplyEvent) and not of_type(events, PartialEvent)
    refused = [event for event in of_type(events, ProtocolWarning) if "session id" in event.message]
    assert len(refused) <= 1  # said once, however often the CLI repeats the id


@given(
    st.lists(
        st.sampled_from(["a", "bc", " ", "  ", "\n", "\t", "\r", "\u3000", "\x1c", "\x85", "\xa0", "é", "“"]),
        max_size=60,
    ).map("".join),
    st.integers(min_value=1, max_value=12),
)
@example("ab" + " " * 9, 2)  # a prefix that collapses to exactly `limit` characters, then only whitespace
def test_a_status_line_of_a_long_text_is_the_whole_text_collapsed_and_cut(text: str, limit: int) -> None:
    """Tool output and reasoning are shortened from a prefix when that is enough; it must give what collapsing the
    whole text gives, whatever whitespace the prefix ends in."""
    line = " ".join(text.split())
    assert shorten(text, limit) == (line if len(line) <= limit else line[: limit - 1] + "…")


def test_a_json_line_is_one_object_alone_on_its_line_and_its_lone_surrogates_are_replaced():
    """What every JSON dialect's decoding loop must keep (agentproc-0.4's own loop has its test): JSON whitespace may
    follow the object, anything else makes the line not JSON; an escape spelling a lone surrogate becomes U+FFFD."""
    data = (
        b'{"type":"content","content":"a\\ud800b"}\n{"type":"content","content":"c"} \t\n'
        b'{"type":"content","content":"d"} x\n{"type":"content","content":"e"}{}\n{"type":"content",\n'
    )
    events = decode("deepseek-stream-json", data)
    assert of_type(events, PartialEvent) == [PartialEvent("a\ufffdb"), PartialEvent("c")]
    assert ProtocolWarning("ignored 3 stdout line(s) that were not JSON objects") in events
