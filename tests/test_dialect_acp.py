"""`protocol: acp`: the pure dialect, from codex-acp's captured stdout and from hand-written JSON-RPC.

The transcripts (`transcripts/acp/`) are codex-acp 0.16.0's real stdout,
driven by this dialect against the fake OpenAI server (see their README). A
transcript is replayed as the engine would: the dialect's first bytes, then
the agent's, a prompt as soon as the session is ready or a turn has ended.
The real agents themselves are driven in `test_acp_agents.py`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

import bridge
from bridge.dialects import DialectContext, dialect_class
from bridge.dialects.events import (
    ActivityEvent,
    AgentInput,
    ErrorEvent,
    Event,
    FileRequest,
    LineCut,
    PartialEvent,
    PlanStep,
    ProtocolWarning,
    Ready,
    ReplyEvent,
    RequestWithdrawn,
    SessionGone,
    TurnEnd,
    Usage,
    UsageEvent,
)
from bridge.dialects.settings import AcpSettings
from bridge.errors import ProfileError, ProtocolMisuse
from bridge.permissions import Decision, PermissionRequest
from bridge.turn import Attachment, Turn

TRANSCRIPTS = Path(__file__).parent / "transcripts" / "acp"
CWD = "/srv/work"
SESSION = "sess-1"


def dialect(session_id: str = "", **settings: Any) -> Any:
    return dialect_class("acp")(DialectContext(settings=AcpSettings(**settings)), session_id=session_id, cwd=CWD)


def line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


def lines(*messages: dict[str, Any]) -> bytes:
    return b"".join(line(message) for message in messages)


def response(rpc_id: int, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": result}


def failure(rpc_id: int, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": rpc_id, "error": error}


def update(what: str, session_id: str = SESSION, **fields: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": session_id, "update": {"sessionUpdate": what, **fields}},
    }


def chunk(text: str, kind: str = "agent_message_chunk") -> dict[str, Any]:
    return update(kind, content={"type": "text", "text": text})


def agent_request(rpc_id: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}


def sent(data: bytes) -> list[dict[str, Any]]:
    """The JSON-RPC messages in bytes the dialect wrote: one compact object per line."""
    assert data.endswith(b"\n") and b"\n" not in data.rstrip(b"\n").replace(b"}\n{", b"")
    return [json.loads(text) for text in data.decode().splitlines()]


INITIALIZED = response(0, {"protocolVersion": 1, "agentCapabilities": {}})
NEW_SESSION = response(1, {"sessionId": SESSION})


def ready(acp: Any | None = None) -> Any:
    """A dialect whose new session is ready, its handshake checked on the way."""
    acp = acp or dialect()
    acp.open()
    [ask_new] = acp.feed(line(INITIALIZED))
    assert isinstance(ask_new, AgentInput)
    assert acp.feed(line(NEW_SESSION)) == [Ready(SESSION)]
    return acp


def in_turn(message: str = "hi", acp: Any | None = None) -> Any:
    acp = ready(acp)
    acp.prompt(Turn(message))
    return acp


PROMPT_ID = 2  # initialize is 0, session/new 1


class Replay:
    """A transcript replayed as the engine would drive it; `written` is every byte the dialect wrote."""

    def __init__(
        self,
        acp: Any,
        prompts: Iterable[str],
        decide: Callable[[PermissionRequest], Decision | None] = lambda request: None,
    ) -> None:
        self.acp = acp
        self.prompts = list(prompts)
        self.decide = decide
        self.events: list[Event] = []
        self.written = bytearray(acp.open())

    def feed(self, data: bytes, step: int | None = None) -> Replay:
        """Feed `data` a line at a time, or in pieces of `step` bytes.

        Never more than a line at once: an agent writes a turn's updates only after
        it has read the prompt, which the engine writes once the events before it
        are out, so one read never holds both (pieces shorter than a line keep it so).
        """
        pieces = (
            data.splitlines(keepends=True)
            if step is None
            else [data[start : start + step] for start in range(0, len(data), step)]
        )
        for piece in pieces:
            self._take(self.acp.feed(piece))
        return self

    def close(self) -> Replay:
        self._take(self.acp.close())
        return self

    def _take(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, AgentInput):
                self.written += event.data
                continue
            self.events.append(event)
            if isinstance(event, (Ready, TurnEnd)) and self.prompts:
                self.written += self.acp.prompt(Turn(self.prompts.pop(0)))
            if isinstance(event, PermissionRequest) and (decision := self.decide(event)) is not None:
                self.written += self.acp.answer(event, decision)

    def of(self, kind: type) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]


CODEX_PROMPTS = [
    "say hello there world",
    "think about life",
    "escalate echo hi",
    "escalate echo no",
    "fail 401 bad key",
]


def allow_then_deny() -> Callable[[PermissionRequest], Decision]:
    answers = iter([Decision(allow=True), Decision(allow=False, message="not today")])
    return lambda request: next(answers)


def codex_session(step: int | None = None) -> Replay:
    replay = Replay(dialect(), CODEX_PROMPTS, allow_then_deny())
    return replay.feed((TRANSCRIPTS / "codex-acp-new-session.jsonl").read_bytes(), step)


# ---------------------------------------------------------------------- handshake


def test_initialize_offers_no_file_system_and_no_terminal_unless_granted():
    [initialize] = sent(dialect().open())
    assert initialize == {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False},
            "clientInfo": {"name": "agent-bridge", "title": "agent-bridge", "version": bridge.__version__},
        },
    }
    [granted] = sent(dialect(fs_read=True, fs_write=True).open())
    assert granted["params"]["clientCapabilities"] == {
        "fs": {"readTextFile": True, "writeTextFile": True},
        "terminal": False,
    }


def test_a_new_session_gets_the_absolute_cwd_and_the_profiles_mcp_servers_as_they_are():
    servers = [{"name": "docs", "command": "/usr/bin/docs-mcp", "args": ["--stdio"], "env": []}]
    acp = dialect(mcp_servers=servers)
    acp.open()
    [ask] = acp.feed(line(INITIALIZED))
    assert sent(ask.data) == [
        {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": CWD, "mcpServers": servers}}
    ]
    assert acp.feed(line(NEW_SESSION)) == [Ready(SESSION)]


def test_a_stored_session_is_loaded_when_the_agent_can_load_and_its_replayed_history_is_dropped():
    acp = dialect(session_id="old")
    acp.open()
    [ask] = acp.feed(
        line(
            response(
                0,
                {
                    "protocolVersion": 1,
                    "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"resume": {}}},
                },
            )
        )
    )
    assert sent(ask.data) == [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session/load",
            "params": {"sessionId": "old", "cwd": CWD, "mcpServers": []},
        }
    ]
    replay = lines(
        update("user_message_chunk", "old", content={"type": "text", "text": "earlier question"}),
        update("agent_message_chunk", "old", content={"type": "text", "text": "earlier answer"}),
        update("tool_call", "old", toolCallId="c1", title="ls", status="completed"),
        response(1, None),
    )
    assert acp.feed(replay) == [Ready("old")]
    acp.prompt(Turn("and now?"))
    events = acp.feed(
        lines(
            update("agent_message_chunk", "old", content={"type": "text", "text": "now"}),
            response(2, {"stopReason": "end_turn"}),
        )
    )
    assert events == [PartialEvent("now"), ReplyEvent("now"), TurnEnd("end_turn")]


def test_a_stored_session_is_resumed_when_the_agent_can_only_resume():
    acp = dialect(session_id="old")
    acp.open()
    [ask] = acp.feed(
        line(response(0, {"protocolVersion": 1, "agentCapabilities": {"sessionCapabilities": {"resume": {}}}}))
    )
    assert sent(ask.data)[0]["method"] == "session/resume"
    assert sent(ask.data)[0]["params"]["sessionId"] == "old"
    assert acp.feed(line(response(1, {}))) == [Ready("old")]


def test_a_load_refused_with_resource_not_found_proves_the_session_gone():
    acp = dialect(session_id="gone")
    acp.open()
    acp.feed(line(response(0, {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}})))
    assert acp.feed(line(failure(1, -32002, "Resource not found"))) == [SessionGone("Resource not found")]


def test_a_load_the_agent_refuses_otherwise_starts_a_new_session_and_ready_names_it():
    acp = dialect(session_id="gone")
    acp.open()
    acp.feed(line(response(0, {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}})))
    warning, ask = acp.feed(line(failure(1, -32603, "Internal error")))
    assert warning == ProtocolWarning(
        "the agent could not load the stored session (JSON-RPC error -32603); a new session was started"
    )
    assert sent(ask.data) == [
        {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": CWD, "mcpServers": []}}
    ]
    assert acp.feed(line(response(2, {"sessionId": "fresh"}))) == [Ready("fresh")]


def test_a_stored_session_of_an_agent_that_can_neither_load_nor_resume_starts_a_new_one():
    acp = dialect(session_id="old")
    acp.open()
    warning, ask = acp.feed(line(INITIALIZED))
    assert isinstance(warning, ProtocolWarning) and "neither" in warning.message
    assert sent(ask.data)[0]["method"] == "session/new"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (
            response(0, {"protocolVersion": 2}),
            "the agent speaks ACP version 2; agent-bridge speaks version 1: use a "
            "version of the agent that supports it",
        ),
        (failure(0, -32600, "Invalid request"), "the agent refused ACP initialize: Invalid request"),
    ],
)
def test_an_initialize_that_fails_fails_the_start(answer, error):
    acp = dialect()
    acp.open()
    assert acp.feed(line(answer)) == [ErrorEvent(error)]


def test_an_agent_that_wants_a_login_says_how_to_give_it_one():
    acp = dialect()
    acp.open()
    acp.feed(line(INITIALIZED))
    [error] = acp.feed(line(failure(1, -32000, "Authentication required")))
    assert error.text.startswith(
        "the agent needs to be logged in before it takes a session (Authentication "
        "required); log in with the agent's own command once"
    )


def test_a_new_session_without_a_usable_id_fails_the_start():
    acp = dialect()
    acp.open()
    acp.feed(line(INITIALIZED))
    [error] = acp.feed(line(response(1, {"sessionId": "has space"})))
    assert error == ErrorEvent(
        "the agent's session/new answered no usable session id (it contains whitespace "
        "or control characters); it cannot be resumed, so the bridge does not use it"
    )


def test_the_engine_is_told_when_it_drives_the_dialect_out_of_order():
    with pytest.raises(ValueError, match="absolute"):
        dialect_class("acp")(DialectContext(), session_id="", cwd="relative/dir")
    acp = dialect()
    acp.open()
    with pytest.raises(ProtocolMisuse, match="before the session is ready"):
        acp.prompt(Turn("too early"))
    acp = in_turn()
    with pytest.raises(ProtocolMisuse, match="while a turn is in progress"):
        acp.prompt(Turn("too soon"))


# ---------------------------------------------------------------------- codex-acp's real stdout


def test_codex_acp_streams_thinks_asks_and_fails_as_it_did():
    replay = codex_session()
    turns: list[list[Event]] = [[]]
    for event in replay.events:
        turns[-1].append(event)
        if isinstance(event, (Ready, TurnEnd)):
            turns.append([])
    ready_, say, think, allowed, denied, failed, after = turns
    assert ready_ == [Ready("01a20338-6fec-7b62-8942-45fe59dd3528")]
    assert say == [PartialEvent("hello there world"), ReplyEvent("hello there world"), TurnEnd("end_turn")]
    assert think == [
        ActivityEvent("thinking", text="Thinking about: about life"),
        PartialEvent("about life"),
        ReplyEvent("about life"),
        TurnEnd("end_turn"),
    ]
    request = allowed[0]
    assert isinstance(request, PermissionRequest)
    assert (request.tool, request.kind, request.title) == ("execute", "exec", "echo hi")
    assert request.input["command"] == ["/bin/bash", "-lc", "echo hi"]
    assert [(event.status, event.title, event.text) for event in allowed if isinstance(event, ActivityEvent)] == [
        ("started", "echo hi", ""),
        ("completed", "echo hi", "```sh hi ```"),
    ]
    assert allowed[-2:] == [ReplyEvent("ran: hi"), TurnEnd("end_turn")]
    assert denied[1:] == [
        ErrorEvent(
            "the agent stopped the turn when permission for echo no was denied: not today (stop reason cancelled)"
        ),
        TurnEnd("cancelled"),
    ]
    assert failed == [
        ErrorEvent(
            "Internal error: unexpected status 401 Unauthorized: bad key, url: http://127.0.0.1:40179/v1/responses"
        ),
        TurnEnd("error"),
    ]
    assert after == []


def test_codex_acp_gets_the_option_of_each_answer_it_offered():
    replay = codex_session()
    answers = [message for message in sent(bytes(replay.written)) if "result" in message]
    asked = replay.of(PermissionRequest)
    assert [(answer["id"], answer["result"]) for answer in answers] == [
        (asked[0].request_id, {"outcome": {"outcome": "selected", "optionId": "approved"}}),
        (asked[1].request_id, {"outcome": {"outcome": "selected", "optionId": "abort"}}),
    ]


@pytest.mark.parametrize("step", [1, 7, 50])
def test_any_chunking_of_the_agents_output_gives_the_same_events_and_the_same_answers(step):
    whole = codex_session()
    pieces = codex_session(step)
    assert pieces.events == whole.events
    assert pieces.written == whole.written


def test_codex_acp_loads_its_session_replays_history_that_is_dropped_and_takes_a_cancel():
    acp = dialect(session_id="01a20338-6fec-7b62-8942-45fe59dd3528")
    replay = Replay(acp, ["say again", "escalate echo hi"])
    written: list[bytes] = []
    replay.decide = lambda request: written.append(acp.cancel()) or None
    replay.feed((TRANSCRIPTS / "codex-acp-load.jsonl").read_bytes(), step=1)
    assert sent(bytes(replay.written))[1]["method"] == "session/load"
    assert replay.events[0] == Ready("01a20338-6fec-7b62-8942-45fe59dd3528")  # nothing of the replay before it
    assert replay.events[1:4] == [PartialEvent("again"), ReplyEvent("again"), TurnEnd("end_turn")]
    [request] = replay.of(PermissionRequest)
    assert sent(written[0]) == [
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "01a20338-6fec-7b62-8942-45fe59dd3528"}},
        {"jsonrpc": "2.0", "id": request.request_id, "result": {"outcome": {"outcome": "cancelled"}}},
    ]
    assert replay.events[-1] == TurnEnd("cancelled") and not replay.of(ErrorEvent)


# ---------------------------------------------------------------------- a turn


def test_a_prompt_is_a_text_block_and_attachments_are_resource_links():
    acp = ready()
    data = acp.prompt(
        Turn("look", attachments=(Attachment("image", "https://x.test/a.png"), Attachment("file", "https://x.test/")))
    )
    assert sent(data) == [
        {
            "jsonrpc": "2.0",
            "id": PROMPT_ID,
            "method": "session/prompt",
            "params": {
                "sessionId": SESSION,
                "prompt": [
                    {"type": "text", "text": "look"},
                    {"type": "resource_link", "uri": "https://x.test/a.png", "name": "a.png"},
                    {"type": "resource_link", "uri": "https://x.test/", "name": "https://x.test/"},
                ],
            },
        }
    ]


def test_message_chunks_are_partials_and_their_concatenation_is_the_reply():
    acp = in_turn()
    events = acp.feed(
        lines(
            chunk("Hel"),
            chunk("lo"),
            chunk("thinking it over", "agent_thought_chunk"),
            update("agent_message_chunk", content={"type": "image", "data": "AAAA"}),
            chunk(" you"),
            update("usage_update", used=10, size=100),
            update("available_commands_update", availableCommands=[]),
            update("something_new", whatever=1),
            response(PROMPT_ID, {"stopReason": "end_turn"}),
        )
    )
    assert events == [
        PartialEvent("Hel"),
        PartialEvent("lo"),
        ActivityEvent("thinking", text="thinking it over"),
        PartialEvent(" you"),
        ReplyEvent("Hello you"),
        TurnEnd("end_turn"),
    ]


def test_tool_calls_are_activity_started_once_then_completed_or_failed():
    acp = in_turn()
    events = acp.feed(
        lines(
            update(
                "tool_call",
                toolCallId="t1",
                title="Read README.md",
                kind="read",
                status="pending",
                _meta={"claudeCode": {"toolName": "Read"}},
            ),
            update("tool_call_update", toolCallId="t1", status="in_progress"),
            update(
                "tool_call_update",
                toolCallId="t1",
                status="completed",
                content=[{"type": "content", "content": {"type": "text", "text": "# The project\n" + "x" * 500}}],
            ),
            update("tool_call", toolCallId="t2", title="", kind="execute", rawInput={"command": ["make", "test"]}),
            update("tool_call_update", toolCallId="t2", status="failed"),
        )
    )
    assert [(event.tool, event.title, event.status, event.call_id) for event in events] == [
        ("Read", "Read README.md", "started", "t1"),
        ("Read", "Read README.md", "completed", "t1"),
        ("execute", "make test", "started", "t2"),
        ("execute", "make test", "failed", "t2"),
    ]
    assert events[1].text.startswith("# The project x") and len(events[1].text) == 300


def test_a_plan_is_activity_with_every_step():
    acp = in_turn()
    [plan] = acp.feed(
        line(
            update(
                "plan",
                entries=[
                    {"content": "Read the code", "priority": "high", "status": "completed"},
                    {"content": "Fix it", "priority": "high", "status": "in_progress"},
                    {"content": "Test", "priority": "low", "status": "someday"},
                    {"priority": "low"},
                ],
            )
        )
    )
    assert plan == ActivityEvent(
        "plan",
        plan=(PlanStep("Read the code", "completed"), PlanStep("Fix it", "in_progress"), PlanStep("Test", "pending")),
    )


def test_the_prompts_usage_is_the_turns():
    acp = in_turn()
    events = acp.feed(
        line(
            response(
                PROMPT_ID,
                {
                    "stopReason": "end_turn",
                    "usage": {
                        "totalTokens": 130,
                        "inputTokens": 100,
                        "outputTokens": 30,
                        "thoughtTokens": 5,
                        "cachedReadTokens": 40,
                    },
                },
            )
        )
    )
    assert events[0] == UsageEvent(
        Usage(input_tokens=100, output_tokens=30, cached_input_tokens=40, reasoning_tokens=5, total_tokens=130)
    )


@pytest.mark.parametrize(
    ("reason", "error"),
    [
        ("refusal", "the agent refused to continue (refusal)"),
        ("max_tokens", "the agent stopped: the reply reached the model's token limit (max_tokens)"),
        ("max_turn_requests", "the agent stopped: the turn reached its limit of model requests (max_turn_requests)"),
    ],
)
def test_a_turn_that_stops_short_fails_with_the_reason(reason, error):
    acp = in_turn()
    events = acp.feed(lines(chunk("partly"), response(PROMPT_ID, {"stopReason": reason})))
    assert events == [PartialEvent("partly"), ErrorEvent(error), TurnEnd(reason)]


def test_a_json_rpc_error_fails_the_turn_with_its_message_and_detail():
    acp = in_turn()
    assert acp.feed(line(failure(PROMPT_ID, -32603, "Internal error", {"message": "model overloaded"}))) == [
        ErrorEvent("Internal error: model overloaded"),
        TurnEnd("error"),
    ]
    acp.prompt(Turn("again"))
    assert acp.feed(line(failure(PROMPT_ID + 1, -32603, "", "quota"))) == [ErrorEvent("quota"), TurnEnd("error")]
    acp.prompt(Turn("again"))
    assert acp.feed(line(failure(PROMPT_ID + 2, -32603, "Internal error", {"details": "no such model"}))) == [
        ErrorEvent("Internal error: no such model"),
        TurnEnd("error"),
    ]
    acp.prompt(Turn("again"))
    assert acp.feed(line(failure(PROMPT_ID + 3, -1, ""))) == [
        ErrorEvent("the agent failed the turn (JSON-RPC error -1)"),
        TurnEnd("error"),
    ]


def test_an_unknown_stop_reason_ends_the_turn_with_its_reply_and_a_warning():
    acp = in_turn()
    warning, reply, end = acp.feed(lines(chunk("done"), response(PROMPT_ID, {"stopReason": "paused"})))[1:]
    assert isinstance(warning, ProtocolWarning) and (reply, end) == (ReplyEvent("done"), TurnEnd("end_turn"))


def test_updates_outside_a_turn_or_of_another_session_are_dropped():
    acp = ready()
    assert acp.feed(line(chunk("between turns"))) == []
    acp.prompt(Turn("hi"))
    assert acp.feed(
        lines(
            update("agent_message_chunk", "other", content={"type": "text", "text": "x"}),
            response(PROMPT_ID, {"stopReason": "end_turn"}),
        )
    ) == [ReplyEvent(""), TurnEnd("end_turn")]
    assert acp.feed(line(chunk("late"))) == []
    assert acp.close()[-1] == ProtocolWarning("ignored 1 session/update(s) of another session")


# ---------------------------------------------------------------------- permissions


def permission(
    rpc_id: Any = 7,
    options: Iterable[str] = ("allow_once", "allow_always", "reject_once", "reject_always"),
    **tool_call: Any,
) -> dict[str, Any]:
    return agent_request(
        rpc_id,
        "session/request_permission",
        {
            "sessionId": SESSION,
            "toolCall": {
                "toolCallId": "t1",
                "title": "rm -rf build",
                "kind": "execute",
                "rawInput": {"command": "rm -rf build"},
                **tool_call,
            },
            "options": [{"optionId": f"opt-{kind}", "name": kind, "kind": kind} for kind in options],
        },
    )


def asked(acp: Any, message: dict[str, Any]) -> PermissionRequest:
    [request] = acp.feed(line(message))
    assert isinstance(request, PermissionRequest)
    return request


def chosen(data: bytes) -> Any:
    [answer] = sent(data)
    return answer["result"]["outcome"].get("optionId", answer["result"]["outcome"]["outcome"])


def test_a_permission_request_is_one_question_with_the_tool_its_kind_title_and_input():
    acp = in_turn()
    assert asked(acp, permission(_meta={"claudeCode": {"toolName": "Bash"}})) == PermissionRequest(
        request_id="7", tool="Bash", kind="exec", title="rm -rf build", input={"command": "rm -rf build"}
    )


@pytest.mark.parametrize(
    ("decision", "option"),
    [
        (Decision(allow=True), "opt-allow_once"),
        (Decision(allow=True, always=True), "opt-allow_always"),
        (Decision(allow=False), "opt-reject_once"),
        (Decision(allow=False, always=True), "opt-reject_always"),
    ],
)
def test_each_decision_picks_the_agents_option_of_its_kind(decision, option):
    acp = in_turn()
    assert chosen(acp.answer(asked(acp, permission()), decision)) == option


def test_an_agent_that_offers_only_one_form_of_an_answer_gets_that_form():
    acp = in_turn()
    request = asked(acp, permission(options=("allow_always", "reject_once")))
    assert chosen(acp.answer(request, Decision(allow=True))) == "opt-allow_always"
    request = asked(acp, permission(rpc_id=8, options=("allow_once",)))
    assert chosen(acp.answer(request, Decision(allow=False))) == "cancelled"  # it offered no way to refuse


def test_the_answer_goes_to_the_agents_own_id_once():
    acp = in_turn()
    request = asked(acp, permission(rpc_id=42))
    assert sent(acp.answer(request, Decision(allow=True)))[0]["id"] == 42
    assert acp.answer(request, Decision(allow=True)) == b""
    request = asked(acp, permission(rpc_id="a-b"))
    assert sent(acp.answer(request, Decision(allow=True)))[0]["id"] == "a-b"


def test_cancel_answers_every_pending_question_cancelled():
    acp = in_turn()
    first = asked(acp, permission(rpc_id=7))
    second = asked(acp, permission(rpc_id=8, toolCallId="t2"))
    assert sent(acp.cancel()) == [
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SESSION}},
        {"jsonrpc": "2.0", "id": 7, "result": {"outcome": {"outcome": "cancelled"}}},
        {"jsonrpc": "2.0", "id": 8, "result": {"outcome": {"outcome": "cancelled"}}},
    ]
    assert acp.cancel() == b""
    assert acp.answer(first, Decision(allow=True)) == acp.answer(second, Decision(allow=True)) == b""
    assert chosen(acp.feed(line(permission(rpc_id=9)))[0].data) == "cancelled"  # asked after the cancel
    assert acp.feed(line(response(PROMPT_ID, {"stopReason": "cancelled"}))) == [TurnEnd("cancelled")]
    assert ready().cancel() == b""


def test_a_question_the_engine_closes_for_a_cancel_is_answered_cancelled():
    acp = in_turn()
    request = asked(acp, permission())
    assert chosen(acp.answer(request, bridge.permissions.CANCELLED)) == "cancelled"
    assert sent(acp.cancel()) == [{"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SESSION}}]


def test_a_cancelled_turn_the_agent_answers_with_an_error_is_cancelled_all_the_same():
    acp = in_turn()
    acp.cancel()
    assert acp.feed(line(failure(PROMPT_ID, -32603, "Internal error", "aborted"))) == [TurnEnd("cancelled")]


def test_a_turn_the_agent_cancels_by_itself_fails():
    acp = in_turn()
    assert acp.feed(line(response(PROMPT_ID, {"stopReason": "cancelled"}))) == [
        ErrorEvent("the agent cancelled the turn by itself (stop reason cancelled)"),
        TurnEnd("cancelled"),
    ]


def test_numbers_json_has_not_in_a_question_arrive_as_null():
    """NaN, Infinity and 1e999 decode in Python, but written back to a host they are no JSON."""
    acp = in_turn()
    written = line(permission()).replace(
        b'{"command": "rm -rf build"}', b'{"a": NaN, "b": -Infinity, "c": 1e999, "d": 1.5}'
    )
    assert asked_raw(acp, written).input == {"a": None, "b": None, "c": None, "d": 1.5}
    assert asked_raw(acp, b" " + written.replace(b'"id": 7', b'"id": 8')).input["a"] is None  # the slow path too


def asked_raw(acp: Any, data: bytes) -> PermissionRequest:
    [request] = acp.feed(data)
    assert isinstance(request, PermissionRequest)
    return request


def test_a_question_outside_a_turn_or_without_options_is_answered_at_once():
    acp = ready()
    [answer] = acp.feed(line(permission()))
    assert chosen(answer.data) == "cancelled"
    acp.prompt(Turn("hi"))
    [refusal] = acp.feed(line(permission(options=())))
    assert sent(refusal.data)[0]["error"]["code"] == -32602


# ---------------------------------------------------------------------- the agent's other requests


@pytest.mark.parametrize("method", ["fs/read_text_file", "fs/write_text_file", "terminal/create", "x/unknown"])
def test_requests_the_bridge_does_not_serve_are_answered_method_not_found(method):
    acp = in_turn()
    [answer] = acp.feed(line(agent_request(3, method, {"sessionId": SESSION, "path": "/srv/work/a"})))
    assert sent(answer.data) == [
        {"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": f"agent-bridge does not offer {method}"}}
    ]


def test_the_terminal_is_refused_even_when_the_file_system_is_granted():
    acp = in_turn(acp=dialect(fs_read=True, fs_write=True))
    [answer] = acp.feed(line(agent_request(3, "terminal/create", {"sessionId": SESSION, "command": "ls"})))
    assert sent(answer.data)[0]["error"]["code"] == -32601


def test_granted_file_requests_are_events_the_engine_answers():
    acp = in_turn(acp=dialect(fs_read=True, fs_write=True))
    [read] = acp.feed(
        line(
            agent_request(
                3, "fs/read_text_file", {"sessionId": SESSION, "path": "/srv/work/a.txt", "line": 2, "limit": 5}
            )
        )
    )
    assert read == FileRequest("3", "read", "/srv/work/a.txt", line=2, limit=5)
    assert sent(acp.file_reply("3", content="two\nthree\n")) == [
        {"jsonrpc": "2.0", "id": 3, "result": {"content": "two\nthree\n"}}
    ]
    assert acp.file_reply("3", content="again") == b""
    [write] = acp.feed(
        line(
            agent_request(
                "w", "fs/write_text_file", {"sessionId": SESSION, "path": "/srv/work/b.txt", "content": "new"}
            )
        )
    )
    assert write == FileRequest("w", "write", "/srv/work/b.txt", content="new")
    assert sent(acp.file_reply("w", error="/srv/work/b.txt: permission denied")) == [
        {"jsonrpc": "2.0", "id": "w", "error": {"code": -32603, "message": "/srv/work/b.txt: permission denied"}}
    ]
    [write] = acp.feed(
        line(
            agent_request(4, "fs/write_text_file", {"sessionId": SESSION, "path": "/srv/work/b.txt", "content": "new"})
        )
    )
    assert sent(acp.file_reply("4")) == [{"jsonrpc": "2.0", "id": 4, "result": {}}]


@pytest.mark.parametrize(
    "params", [{"path": "relative.txt"}, {"path": "/a", "line": 0}, {"path": 3}, {"path": "/a", "limit": "5"}]
)
def test_a_malformed_file_request_is_refused_without_asking_the_engine(params):
    acp = in_turn(acp=dialect(fs_read=True))
    [answer] = acp.feed(line(agent_request(3, "fs/read_text_file", {"sessionId": SESSION, **params})))
    assert sent(answer.data)[0]["error"]["code"] == -32602


def test_a_file_request_outside_a_turn_is_refused():
    acp = ready(dialect(fs_read=True))
    [answer] = acp.feed(line(agent_request(3, "fs/read_text_file", {"sessionId": SESSION, "path": "/srv/a"})))
    assert "no turn is in progress" in sent(answer.data)[0]["error"]["message"]


# ---------------------------------------------------------------------- what is not ACP


def test_garbage_is_ignored_with_one_warning_and_counted_at_the_end():
    acp = in_turn()
    events = acp.feed(
        b"Starting agent...\n[1,2]\n\n" + line(response(99, {})) + line(chunk("ok")) + b"\xff\xfe not json\n"
    )
    assert events == [
        ProtocolWarning(
            "the agent wrote a stdout line that is no JSON-RPC message; ignored (so are "
            "any more: their number is logged at the end)"
        ),
        PartialEvent("ok"),
    ]
    acp.feed(line(response(PROMPT_ID, {"stopReason": "end_turn"})))
    assert acp.close() == [
        ProtocolWarning("ignored 1 JSON-RPC message(s) the bridge was not waiting for"),
        ProtocolWarning("ignored 3 stdout line(s) that were not JSON objects"),
    ]


def test_a_lone_surrogate_the_agent_escapes_becomes_a_replacement_character():
    acp = in_turn()
    assert acp.feed(
        b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"'
        + SESSION.encode()
        + b'","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":'
        b'"a\\ud800b"}}}}\n'
    ) == [PartialEvent("a\ufffdb")]


def test_a_line_over_the_limit_is_cut_and_the_next_one_read():
    acp = in_turn(acp=dialect(max_line_bytes=4096))
    events = acp.feed(line(chunk("x" * 5000)) + line(chunk("after")))
    assert isinstance(events[0], LineCut) and events[1:] == [PartialEvent("after")]


def test_the_output_ending_mid_turn_is_an_unfinished_turn():
    acp = in_turn()
    acp.feed(line(chunk("half")) + b'{"jsonrpc":"2.0","id":2,"res')
    events = acp.close()
    assert [event for event in events if not isinstance(event, ProtocolWarning)] == [
        ErrorEvent(
            "the agent's output ended in the middle of the turn (the agent exited or closed its stdout); its "
            "stderr may say why",
            unfinished=True,
        )
    ]
    assert acp.close() == []
    with pytest.raises(ProtocolMisuse):
        acp.feed(b"more")
    assert acp.answer(PermissionRequest("7", "Bash"), Decision(allow=True)) == b""


def test_the_output_ending_before_the_session_is_ready_or_between_turns():
    acp = dialect()
    acp.open()
    assert acp.close() == [
        ErrorEvent("the agent's output ended before its ACP session was ready; its stderr may say why", unfinished=True)
    ]
    assert ready().close() == []


def test_shutdown_is_closing_stdin():
    assert ready().shutdown() == b""


# ---------------------------------------------------------------------- the profile's acp: section


def test_the_profile_section_fills_the_settings_and_refuses_what_is_not_a_list_of_servers(tmp_path):
    servers = [{"name": "docs", "command": "/usr/bin/docs-mcp", "args": [], "env": []}]
    profile = bridge.Profile.from_mapping(
        {"command": ["my-acp-agent"], "protocol": "acp", "acp": {"mcp_servers": servers, "fs_read": True}},
        profile_dir=tmp_path,
    )
    assert profile.settings == AcpSettings(mcp_servers=servers, fs_read=True)
    for bad, message in [
        ({"mcp_servers": {"name": "x"}}, "expected a list"),
        ({"mcp_servers": ["docs"]}, "expected a mapping"),
        ({"mcp_servers": [{"command": "x"}]}, "mcp_servers[0] needs a name"),
        ({"fs_write": "yes"}, "expected true or false"),
        ({"terminal": True}, "unknown key 'terminal'"),
    ]:
        with pytest.raises(ProfileError, match=message.replace("[", r"\[").replace("]", r"\]")):
            bridge.Profile.from_mapping({"command": ["a"], "protocol": "acp", "acp": bad}, profile_dir=tmp_path)


def test_a_warm_profile_refuses_the_message_in_argv(tmp_path):
    with pytest.raises(ProfileError, match="MESSAGE"):
        bridge.Profile.from_mapping(
            {"command": ["a"], "protocol": "acp", "args": ["{{MESSAGE}}"]}, profile_dir=tmp_path
        )


def test_a_permission_the_agent_withdraws_is_answered_cancelled_at_once_and_the_late_answer_writes_nothing():
    acp = in_turn()
    request = asked(acp, permission(rpc_id=7))
    withdrawn, answered = acp.feed(line({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 7}}))
    assert withdrawn == RequestWithdrawn(request.request_id)
    assert isinstance(answered, AgentInput)
    assert sent(answered.data) == [
        {"jsonrpc": "2.0", "id": 7, "error": {"code": -32800, "message": "request cancelled"}}
    ]
    assert acp.answer(request, Decision(allow=True)) == b""
    assert acp.feed(line({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 7}})) == []
