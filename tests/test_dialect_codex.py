"""`protocol: codex-exec`: the real Codex CLI behind the bridge, and its dialect from captured transcripts.

The real `codex` (installed by `make test-agents`) runs against a fake OpenAI
Responses API on loopback (`fakes.openai_responses`); the prompt picks what the
fake model does ("say …", "run …", "think …", "fail …"). The pure dialect is
fed codex's own captured stdout (`transcripts/codex/`).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from agents_cache import npm_binary
from attachment_files import PNG, TURN_FILES, sent
from conftest import CLI_PROFILES
from dialectkit import assert_every_cut_decodes_alike, json_lines
from fakes.openai_responses import OpenAIResponses, write_codex_home
from hypothesis import given, settings
from hypothesis import strategies as st

import bridge
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
from bridge.engine.result import Outcome

TRANSCRIPTS = Path(__file__).parent / "transcripts" / "codex"
AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
CODEX_TURN_DEADLINE = 30  # a real codex turn takes ~0.5 s; a loaded machine gets room, a hang fails


# --------------------------------------------------------------------------- the pure dialect


def dialect(max_line_bytes: int | None = None) -> Any:
    settings = JsonSettings(max_line_bytes) if max_line_bytes else None
    return dialect_class("codex-exec")(DialectContext(settings=settings), bridge.Turn("hi"))


def decode(data: bytes, chunk: int | None = None) -> list[Any]:
    """All events of `data`, fed whole or `chunk` bytes at a time, then the end of the stream."""
    codex = dialect()
    events = []
    step = chunk or len(data) or 1
    for start in range(0, len(data), step):
        events += codex.feed(data[start : start + step])
    return events + codex.close()


def transcript(name: str) -> bytes:
    return (TRANSCRIPTS / name).read_bytes()


def of(kind: type, events: list[Any]) -> list[Any]:
    return [event for event in events if type(event) is kind]


def test_a_text_turn_gives_the_thread_as_session_the_message_as_partial_and_reply_and_the_usage():
    assert decode(transcript("codex-text.jsonl")) == [
        SessionEvent("01a202c2-c4ac-7001-9393-365278ff1339"),
        PartialEvent("Hello from the fake server."),
        ReplyEvent("Hello from the fake server."),
        UsageEvent(
            Usage(input_tokens=100, output_tokens=20, cached_input_tokens=7, reasoning_tokens=3, total_tokens=120)
        ),
    ]


def test_any_chunking_of_codex_output_gives_the_same_events():
    for path in sorted(TRANSCRIPTS.glob("*.jsonl")):
        data = path.read_bytes()
        assert decode(data, chunk=1) == decode(data), path.name  # a byte at a time
    data = transcript("codex-tool-exec-command.jsonl")
    assert_every_cut_decodes_alike(dialect, data, decode(data))


def test_a_command_is_tool_activity_titled_with_the_command_and_its_exit_code_and_output():
    started, finished = of(ActivityEvent, decode(transcript("codex-tool-exec-command.jsonl")))
    assert started == ActivityEvent(
        "tool", tool="command_execution", title="echo hi", status="started", call_id="item_0"
    )
    assert finished == ActivityEvent(
        "tool", tool="command_execution", title="echo hi", status="completed", call_id="item_0", text="exit code 0: hi"
    )
    _, failed = of(ActivityEvent, decode(transcript("codex-tool-exec-command-exit3.jsonl")))
    assert (failed.title, failed.status, failed.text) == (
        "sh -c 'echo oops >&2; exit 3'",
        "failed",
        "exit code 3: oops",
    )


@pytest.mark.parametrize(
    ("command", "title"),
    [
        ("/bin/bash -lc ls", "ls"),
        ("/bin/bash -lc 'rg -n \"x\" src/'", 'rg -n "x" src/'),
        ('/bin/zsh -lc "echo \\"it\'s\\" \\$HOME \\\\d"', 'echo "it\'s" $HOME \\d'),  # POSIX double-quote escapes
        ("/bin/bash -lc 'a' 'b'", "/bin/bash -lc 'a' 'b'"),  # not one script: shown as codex gave it
        ("python3 -m pytest", "python3 -m pytest"),
    ],
)
def test_a_command_is_titled_without_the_shell_codex_wraps_it_in(command, title):
    line = item(
        "item.started",
        type="command_execution",
        command=command,
        aggregated_output="",
        exit_code=None,
        status="in_progress",
    )
    [activity] = of(ActivityEvent, decode(json_lines(THREAD, line, DONE)))
    assert activity.title == title


def test_activity_never_enters_the_reply():
    events = decode(transcript("codex-tool-exec-command.jsonl"))
    [reply] = of(ReplyEvent, events)
    assert reply.text.startswith("The command said:")
    assert [partial.text for partial in of(PartialEvent, events)] == [reply.text]


def test_a_file_change_names_its_paths_and_reasoning_is_thinking():
    events = of(ActivityEvent, decode(transcript("codex-file-change-workspace-write.jsonl")))
    assert [(event.tool, event.title, event.status) for event in events] == [
        ("file_change", "add /work/research/codex-ws/hello.txt", "started"),
        ("file_change", "add /work/research/codex-ws/hello.txt", "completed"),
    ]
    [thinking] = of(ActivityEvent, decode(transcript("codex-reasoning.jsonl")))
    assert thinking == ActivityEvent("thinking", text="**Thinking** about the answer.")


def test_usage_is_codexs_running_total_for_the_thread():
    [usage] = of(UsageEvent, decode(transcript("codex-resume-2-resumed-by-id.jsonl")))
    assert usage.replace and usage.usage.input_tokens == 200  # the first turn's 100 included


def test_warning_items_are_logged_and_do_not_fail_the_turn():
    events = decode(transcript("codex-resume-3-resumed-last-other-model.jsonl"))
    warnings = of(ProtocolWarning, events)
    assert len(warnings) == 2 and all(warning.message.startswith("codex warned: ") for warning in warnings)
    assert not of(ErrorEvent, events)
    assert of(ReplyEvent, events) == [ReplyEvent("I have seen 4 user messages.")]


def test_turn_failed_is_the_error_and_retry_notices_are_not():
    assert of(ErrorEvent, decode(transcript("codex-error-http401-no-retries.jsonl"))) == [
        ErrorEvent(
            "unexpected status 401 Unauthorized: Incorrect API key provided: fake, url: http://127.0.0.1:36113/v1/responses"
        )
    ]
    events = decode(transcript("codex-error-http500-default-retries.jsonl"))
    assert of(ErrorEvent, events) == [
        ErrorEvent("We’re currently experiencing high demand, which may cause temporary errors.")
    ]
    assert len(of(ProtocolWarning, events)) == 5  # one per "Reconnecting... n/5", logged without its text


def test_a_stream_that_ends_without_turn_completed_or_failed_fails_with_codexs_last_notice():
    [error] = of(ErrorEvent, decode(transcript("codex-error-connection-refused-unbounded.jsonl")))
    assert error.text.startswith("codex ended without finishing its turn")
    assert error.text.endswith(
        "its last error: Reconnecting... waiting for network (Connection failed: error sending request)"
    )
    assert decode(b"") == [
        ErrorEvent(
            "codex ended before it started a thread; its stderr says why (an unknown "
            "session id, a usage error, a missing login or config)",
            unfinished=True,
        )
    ]


def test_a_turn_without_a_message_has_no_reply_and_one_that_failed_after_one_still_fails():
    events = decode(transcript("codex-empty-response-completed-only.jsonl"))
    assert not of(ReplyEvent, events) and not of(ErrorEvent, events) and of(UsageEvent, events)
    events = decode(transcript("codex-minimal-sse-missing-response-id.jsonl"))
    assert not of(ReplyEvent, events)  # the reply comes with turn.completed
    assert of(ErrorEvent, events)[0].text.endswith("missing field `id`")


THREAD = {"type": "thread.started", "thread_id": "t-1"}
DONE = {"type": "turn.completed", "usage": {"input_tokens": 1, "cached_input_tokens": 0, "output_tokens": 2}}


def item(event: str, **fields: Any) -> dict[str, Any]:
    return {"type": event, "item": {"id": "item_0", **fields}}


def test_every_agent_message_streams_as_a_paragraph_and_the_last_one_is_the_reply():
    events = decode(
        json_lines(
            THREAD,
            item("item.completed", type="agent_message", text="Let me look."),
            item("item.completed", type="agent_message", text="Found it."),
            DONE,
        )
    )
    assert [partial.text for partial in of(PartialEvent, events)] == ["Let me look.", "\n\nFound it."]
    assert of(ReplyEvent, events) == [ReplyEvent("Found it.")]  # once, the last message


def test_plans_mcp_calls_and_web_searches_are_activity():
    # Field names from codex-rs/exec/src/exec_events.rs (not captured: the fake model cannot call these).
    todo = [{"text": "read the code", "completed": True}, {"text": "fix it", "completed": False}]
    events = of(
        ActivityEvent,
        decode(
            json_lines(
                THREAD,
                item("item.started", type="todo_list", items=todo[:1]),
                item("item.updated", type="todo_list", items=todo),
                item(
                    "item.started",
                    type="mcp_tool_call",
                    server="docs",
                    tool="search",
                    arguments={"q": "trio"},
                    status="in_progress",
                ),
                item(
                    "item.completed",
                    type="mcp_tool_call",
                    server="docs",
                    tool="search",
                    arguments={"q": "trio"},
                    error={"message": "server went away"},
                    status="failed",
                ),
                item("item.completed", type="web_search", query="trio cancel scopes", action={"type": "search"}),
                item(
                    "item.completed",
                    type="command_execution",
                    command="rm -rf x",
                    aggregated_output="",
                    exit_code=None,
                    status="declined",
                ),
                DONE,
            )
        ),
    )
    assert events[1] == ActivityEvent("plan", plan=(PlanStep("read the code", "completed"), PlanStep("fix it")))
    assert [(event.tool, event.title, event.status, event.text) for event in events[2:]] == [
        ("docs.search", '{"q": "trio"}', "started", ""),
        ("docs.search", '{"q": "trio"}', "failed", "server went away"),
        ("web_search", "trio cancel scopes", "completed", ""),
        ("command_execution", "rm -rf x", "denied", ""),
    ]


def test_a_plan_item_is_the_reply_only_when_codex_sent_no_message():
    plan = item("item.completed", type="plan", text="1. read 2. fix")
    assert of(ReplyEvent, decode(json_lines(THREAD, plan, DONE))) == [ReplyEvent("1. read 2. fix")]
    message = item("item.completed", type="agent_message", text="done")
    assert of(ReplyEvent, decode(json_lines(THREAD, plan, message, DONE))) == [ReplyEvent("done")]


def test_garbage_a_cut_line_unknown_events_and_a_bad_thread_id_are_ignored_with_warnings():
    codex = dialect(max_line_bytes=4096)
    events = codex.feed(b"not json\n[1, 2]\n" + b'{"type": "item.completed", "x": "' + b"y" * 5000 + b'"}\n')
    events += codex.feed(
        json_lines(
            {"type": "thread.started", "thread_id": "has space"},
            {"type": "turn.started"},
            {"type": "something.new", "item": {}},
            item("item.completed", type="future_kind"),
            {"type": ["not", "a", "name"]},
            item("item.completed", type={"a": 1}),
            {"type": "item.completed", "item": "not an object"},
            THREAD,
            THREAD,
            DONE,
        )
    )
    events += codex.close()
    assert [type(event) for event in events] == [LineCut, ProtocolWarning, SessionEvent, UsageEvent, ProtocolWarning]
    assert events[1].message == "ignored codex's thread_id: it contains whitespace or control characters"
    assert events[2] == SessionEvent("t-1")  # once, though codex printed it twice
    assert events[-1].message == "ignored 2 stdout line(s) that were not JSON objects"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=4,
)
FIELDS = st.sampled_from(
    [
        "thread_id",
        "usage",
        "error",
        "message",
        "text",
        "command",
        "aggregated_output",
        "exit_code",
        "status",
        "changes",
        "items",
        "server",
        "tool",
        "arguments",
        "query",
        "action",
    ]
)
CODEX_LIKE = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            [
                "thread.started",
                "turn.completed",
                "turn.failed",
                "error",
                "item.started",
                "item.updated",
                "item.completed",
            ]
        )
        | JSON
    },
    optional={
        "item": st.fixed_dictionaries(
            {
                "type": st.sampled_from(
                    [
                        "agent_message",
                        "plan",
                        "reasoning",
                        "command_execution",
                        "file_change",
                        "mcp_tool_call",
                        "collab_tool_call",
                        "web_search",
                        "todo_list",
                        "error",
                    ]
                )
                | JSON
            },
            optional={
                "id": JSON,
                **dict.fromkeys(
                    (
                        "text",
                        "command",
                        "aggregated_output",
                        "exit_code",
                        "status",
                        "changes",
                        "items",
                        "arguments",
                        "action",
                    ),
                    JSON,
                ),
            },
        )
        | JSON
    },
).flatmap(lambda line: st.dictionaries(FIELDS, JSON, max_size=3).map(lambda extra: {**extra, **line}))


@settings(max_examples=100, deadline=None)
@given(st.lists(CODEX_LIKE, max_size=6))
def test_any_json_in_codexs_shapes_maps_to_events_without_raising(objects):
    events = decode(json_lines(*objects))
    assert sum(type(event) is ErrorEvent for event in events) >= 1 or any(
        line.get("type") == "turn.completed" for line in objects
    )


# --------------------------------------------------------------------------- the profile


def test_the_ready_profile_puts_every_user_value_after_the_end_of_codexs_options():
    profile = bridge.load_profile(CLI_PROFILES / "codex.yaml", cache=False)
    new = bridge.plan_launch(profile, bridge.Turn("--last"), {}).argv
    resumed = bridge.plan_launch(profile, bridge.Turn("--last", session_id="-t"), {}).argv
    options = (
        "codex",
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--sandbox",
        "read-only",
        "--disable",
        "unbounded_connection_retries",
    )
    assert new == (*options, "--", "--last")
    assert resumed == (*options, "resume", "--", "-t", "--last")


def test_a_json_dialect_profile_can_be_changed_with_replace():
    # `agent-bridge run --timeout` does this; it used to fail on the session_line_prefix default.
    profile = bridge.load_profile(CLI_PROFILES / "codex.yaml", cache=False).replace(timeout_secs=5)
    assert profile.timeout_secs == 5 and profile.protocol == "codex-exec"
    with pytest.raises(bridge.ProfileError, match="session_line_prefix is for protocol agentproc-0.1"):
        profile.replace(session_line_prefix="SESSION=")


# --------------------------------------------------------------------------- through the bridge, a scripted agent


async def test_a_codex_that_exits_0_without_ending_its_turn_fails_the_turn(make_agent):
    script = f"import sys\nsys.stdout.write({transcript('codex-error-connection-refused-unbounded.jsonl')!r}.decode())"
    with trio.fail_after(10):
        result = await bridge.run_turn(make_agent(script, protocol="codex-exec"), bridge.Turn("hi"))
    assert (result.outcome, result.exit_code, result.reply) == (Outcome.AGENT_ERROR, 1, "")
    assert result.error_reply.startswith("codex ended without finishing its turn")
    assert result.session_id == "01a202ca-0489-7de1-bb46-e1b6095c9817"


# --------------------------------------------------------------------------- the real codex


@dataclass
class Codex:
    api: OpenAIResponses
    profile: bridge.Profile
    home: Path  # HOME of the CLI test: codex's home is its .codex
    workspace: Path
    path: str  # PATH with the cached codex first
    tmpdir: str  # codex's TMPDIR: see `codex`

    async def turn(self, message: str, session_id: str = "") -> tuple[bridge.TurnResult, list[Any]]:
        events: list[Any] = []
        with trio.fail_after(CODEX_TURN_DEADLINE):
            result = await bridge.run_turn(
                self.profile, bridge.Turn(message, session_id=session_id), on_event=events.append
            )
        return result, events[:-1]


@pytest.fixture(scope="module")
def codex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Codex]:
    """The ready profile, run with the cached codex, against one fake API server and codex home for the module."""
    binary = npm_binary("codex")
    root = tmp_path_factory.mktemp("codex")
    with OpenAIResponses() as api:
        codex_home = write_codex_home(root / "home" / ".codex", api.base_url)
        workspace = root / "workspace"
        workspace.mkdir()
        path = f"{binary.parent}{os.pathsep}{os.environ['PATH']}"
        # Where bwrap is installed, codex runs its commands under it through a helper it links into its home, but
        # never into a home inside the temporary directory (pytest's, here): codex's TMPDIR is elsewhere.
        tmpdir = root / "tmp"
        tmpdir.mkdir()
        profile = bridge.load_profile(CLI_PROFILES / "codex.yaml", cache=False).replace(
            env={"CODEX_HOME": str(codex_home), "PATH": path, "TMPDIR": str(tmpdir)}, cwd=str(workspace)
        )
        yield Codex(api, profile, root / "home", workspace, path, str(tmpdir))


async def test_real_codex_answers_with_its_thread_as_session_and_reports_usage(codex):
    result, events = await codex.turn("say Hello from the fake model.")
    assert (result.outcome, result.reply, result.error) == (Outcome.OK, "Hello from the fake model.", "")
    assert events == [SessionEvent(result.session_id), PartialEvent("Hello from the fake model.")]
    assert bridge.dialects.session_id_problem(result.session_id) is None
    assert result.usage == Usage(
        input_tokens=100, output_tokens=20, cached_input_tokens=7, reasoning_tokens=3, total_tokens=120
    )
    [request] = [
        request for request in codex.api.responses_requests() if request.prompt == "say Hello from the fake model."
    ]
    assert json.loads(request.headers["x-codex-turn-metadata"])["sandbox_mode"] == "read-only"


async def test_real_codex_reports_its_reasoning_as_thinking(codex):
    result, events = await codex.turn("think the answer is 42")
    assert result.reply == "the answer is 42"
    assert ActivityEvent("thinking", text="Thinking about: the answer is 42") in events


async def test_real_codex_resumes_its_thread_through_resume_args(codex):
    first, _ = await codex.turn("say The first answer.")
    # A message that codex would take for its --last option were it not after `--`.
    second, _ = await codex.turn("--last what did you say?", session_id=first.session_id)
    assert (second.outcome, second.session_id, second.reply) == (
        Outcome.OK,
        first.session_id,
        "echo: --last what did you say?",
    )
    request = codex.api.responses_requests()[-1]
    assert request.user_texts()[-2:] == ["say The first answer.", "--last what did you say?"]
    assert request.assistant_texts() == ["The first answer."]  # the model saw the conversation so far
    assert second.usage is not None and second.usage.input_tokens == 200  # the thread's total, both turns


async def test_real_codex_api_error_fails_the_turn_with_codexs_error_text(codex):
    result, events = await codex.turn("fail 401 Incorrect API key provided: fake")
    assert (result.outcome, result.exit_code, result.reply) == (Outcome.AGENT_ERROR, 1, "")
    assert result.error.startswith("unexpected status 401 Unauthorized: Incorrect API key provided: fake, url: ")
    assert result.error_reply == result.error
    assert [event for event in events if isinstance(event, ErrorEvent)] == [ErrorEvent(result.error)]


def test_real_codex_runs_a_command_from_the_ready_profile_with_run_json(codex):
    """The profile as shipped: codex finds its home in $HOME/.codex; `--timeout` overrides the profile."""
    done = subprocess.run(
        [AGENT_BRIDGE, "run", "--json", "--timeout", "60", str(CLI_PROFILES / "codex.yaml"), "run echo ran-by-codex"],
        cwd=codex.workspace,
        env={**os.environ, "HOME": str(codex.home), "PATH": codex.path, "TMPDIR": codex.tmpdir},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CODEX_TURN_DEADLINE,
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    tools = [record for record in records if record["event"] == "activity"]
    assert [(tool["tool"], tool["title"], tool["status"]) for tool in tools] == [
        ("command_execution", "echo ran-by-codex", "started"),
        ("command_execution", "echo ran-by-codex", "completed"),
    ]
    assert tools[1]["text"].startswith("exit code 0: ") and tools[1]["text"].endswith("ran-by-codex")
    result = records[-1]
    assert result["event"] == "result" and result["reply"].endswith("ran-by-codex")
    assert result["reply"].startswith("ran: ")


async def test_real_codex_under_the_ready_profile_can_neither_write_nor_escalate(codex):
    target = codex.workspace / "written-by-codex"
    written, events = await codex.turn(f"run touch {target}")
    assert written.ok and "Read-only file system" in written.reply
    assert [event.status for event in events if isinstance(event, ActivityEvent)][-1:] in ([], ["failed"])
    escalated, _ = await codex.turn(f"escalate touch {target}")
    assert escalated.ok and "you cannot ask for escalated permissions" in escalated.reply
    assert not target.exists()


async def test_real_codex_sends_a_fetched_image_to_the_model_and_is_told_of_other_files(codex, tmp_path):
    turn = bridge.Turn("what is in the picture?", attachments=sent(tmp_path))
    turn_files = rf"{codex.workspace}/{TURN_FILES}"
    with trio.fail_after(CODEX_TURN_DEADLINE):
        result = await bridge.run_turn(codex.profile, turn)
    assert result.outcome == Outcome.OK
    request = codex.api.responses_requests()[-1]
    # codex puts its own marker for the image before the text; the fake model echoes what it got.
    assert request.input_images() == ["data:image/png;base64," + base64.b64encode(PNG).decode()]
    # The files the engine fetched into the turn's directory: the image by codex's marker, the other by the prompt.
    assert re.fullmatch(
        rf'<image name=\[Image #1\] path="{turn_files}/shot\.png"></image>'
        rf"what is in the picture\?\n\nAttached files:\n- {turn_files}/notes\.txt \(file, text/plain\)",
        request.prompt,
    ), request.prompt
    # Resumed, the new message has its image too (`--image` before `resume` belongs to the resumed turn).
    with trio.fail_after(CODEX_TURN_DEADLINE):
        again = await bridge.run_turn(codex.profile, turn.replace(message="and now?", session_id=result.session_id))
    assert (again.outcome, again.session_id) == (Outcome.OK, result.session_id)
    assert len(codex.api.responses_requests()[-1].input_images()) == 2  # the first turn's, in the thread, and this one
