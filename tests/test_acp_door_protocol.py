"""`agent-bridge acp`'s protocol object, fed transcripts: the editor's lines and the turn's events in, actions out.

Pure and fast; tests/test_acp_door.py drives the real command with real clients.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from conftest import turn_result

from bridge.dialects import ActivityEvent, PartialEvent, Usage
from bridge.dialects.events import FileEvent, Option, Question, QuestionRequest, RequestWithdrawn
from bridge.engine.result import Outcome, TurnResult
from bridge.permissions import Decision, PermissionRequest
from bridge.serving.acp_protocol import (
    AcpAgentSide,
    Answer,
    CancelPrompt,
    Capabilities,
    Decide,
    Send,
    StartPrompt,
    unsent_reply,
)

SESSION = "acp-0123456789abcdefghijklmnop"


def side(*, load_session: bool = True, images: bool = True) -> AcpAgentSide:
    return AcpAgentSide(Capabilities(load_session=load_session, images=images), lambda: SESSION)


def line(rpc_id: Any, method: str, **params: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params})


def sent(actions: list[Any]) -> list[dict[str, Any]]:
    assert all(type(action) is Send for action in actions), actions
    return [action.message for action in actions]


def ready(agent: AcpAgentSide) -> None:
    agent.receive(line(0, "initialize", protocolVersion=1))
    assert sent(agent.receive(line(1, "session/new", cwd="/tmp", mcpServers=[]))) == [
        {"jsonrpc": "2.0", "id": 1, "result": {"sessionId": SESSION}}
    ]


def prompt(agent: AcpAgentSide, rpc_id: Any, *blocks: dict[str, Any]) -> StartPrompt:
    (start,) = agent.receive(line(rpc_id, "session/prompt", sessionId=SESSION, prompt=list(blocks)))
    assert type(start) is StartPrompt
    return start


def result(reply: str = "", outcome: Outcome = Outcome.OK, **fields: Any) -> TurnResult:
    return turn_result(**({"session_id": "s", "outcome": outcome, "reply": reply} | fields))


@pytest.mark.parametrize(("load_session", "images"), [(True, True), (False, False)])
def test_initialize_says_what_the_profile_can_do(load_session, images):
    (answer,) = sent(side(load_session=load_session, images=images).receive(line(0, "initialize", protocolVersion=1)))
    capabilities = answer["result"]["agentCapabilities"]
    assert answer["result"]["protocolVersion"] == 1
    assert capabilities["loadSession"] is load_session
    assert capabilities["promptCapabilities"]["image"] is images


def test_a_prompt_streams_and_the_reply_is_not_sent_again_after_its_partials():
    agent = side()
    ready(agent)
    start = prompt(agent, 2, {"type": "text", "text": "hi"})
    assert start.turn.message == "hi"
    chunks = [sent(agent.event(SESSION, PartialEvent(text)))[0] for text in ("hel", "lo")]
    assert [chunk["params"]["update"]["content"]["text"] for chunk in chunks] == ["hel", "lo"]
    assert sent(agent.finished(SESSION, result("hello", partials=2))) == [
        {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}
    ]


@pytest.mark.parametrize(
    ("reply", "streamed", "rest"),
    [("hello", "", "hello"), ("hello world", "hello", " world"), ("hello", "hello", ""), ("Hello", "hel", "")],
)
def test_only_what_the_partials_did_not_show_is_sent(reply, streamed, rest):
    assert unsent_reply(reply, streamed) == rest


@pytest.mark.parametrize(
    ("outcome", "error", "stop"),
    [
        (Outcome.OK, "", "end_turn"),
        (Outcome.CANCELLED, "", "cancelled"),
        (
            Outcome.AGENT_ERROR,
            "the agent stopped: the reply reached the model's token limit (max_tokens)",
            "max_tokens",
        ),
        (Outcome.AGENT_ERROR, "the agent refused to continue (refusal)", "refusal"),
    ],
)
def test_the_stop_reason_comes_from_the_outcome(outcome, error, stop):
    agent = side()
    ready(agent)
    prompt(agent, 2, {"type": "text", "text": "hi"})
    (*_, response) = sent(agent.finished(SESSION, result("", outcome, error=error)))
    assert response["result"]["stopReason"] == stop


def test_a_failed_turn_is_an_error_carrying_its_error_reply_and_usage_travels_with_success():
    agent = side()
    ready(agent)
    prompt(agent, 2, {"type": "text", "text": "hi"})
    failed = result("", Outcome.EXIT_NONZERO, error="exit 3", error_reply="Sorry, the agent failed.", exit_code=3)
    (response,) = sent(agent.finished(SESSION, failed))
    assert response["error"]["message"] == "Sorry, the agent failed."
    assert response["error"]["data"]["outcome"] == "exit_nonzero"
    prompt(agent, 3, {"type": "text", "text": "again"})
    (*_, response) = sent(agent.finished(SESSION, result("ok", usage=Usage(input_tokens=5, output_tokens=2))))
    assert response["result"]["usage"] == {"inputTokens": 5, "outputTokens": 2, "totalTokens": 7}


def test_a_permission_request_offers_the_agents_options_and_the_choice_decides_it():
    agent = side()
    ready(agent)
    prompt(agent, 2, {"type": "text", "text": "hi"})
    (ask,) = sent(agent.event(SESSION, PermissionRequest("p1", "Bash", kind="exec", title="ls -la")))
    assert ask["method"] == "session/request_permission"
    assert ask["params"]["toolCall"]["kind"] == "execute"
    assert [option["kind"] for option in ask["params"]["options"]] == ["allow_once", "allow_always", "reject_once"]
    answer = {
        "jsonrpc": "2.0",
        "id": ask["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "allow_always"}},
    }
    assert agent.receive(json.dumps(answer)) == [Decide(SESSION, "p1", Decision(allow=True, always=True))]
    assert agent.receive(json.dumps(answer)) == []  # answered once only


def test_a_cancelled_permission_request_denies_and_a_withdrawn_one_is_cancelled_at_the_editor():
    agent = side()
    ready(agent)
    prompt(agent, 2, {"type": "text", "text": "hi"})
    (ask,) = sent(agent.event(SESSION, PermissionRequest("p1", "Bash")))
    cancelled = {"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "cancelled"}}}
    assert agent.receive(json.dumps(cancelled)) == [Decide(SESSION, "p1", Decision(allow=False))]
    (ask,) = sent(agent.event(SESSION, PermissionRequest("p2", "Bash")))
    assert sent(agent.event(SESSION, RequestWithdrawn("p2"))) == [
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": ask["id"]}}
    ]


def test_a_question_with_one_choice_is_asked_as_a_permission_and_anything_else_is_declined():
    agent = side()
    ready(agent)
    prompt(agent, 2, {"type": "text", "text": "hi"})
    colour = Question("q", "Which colour?", options=(Option("red"), Option("blue")))
    (ask,) = sent(agent.event(SESSION, QuestionRequest("r1", (colour,))))
    assert [option["optionId"] for option in ask["params"]["options"]] == ["red", "blue", "decline"]
    chosen = {"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "blue"}}}
    assert agent.receive(json.dumps(chosen)) == [Answer(SESSION, "r1", {"q": ["blue"]})]
    words = Question("w", "Your name?", free_text=True)
    assert agent.event(SESSION, QuestionRequest("r2", (words,))) == [Answer(SESSION, "r2", None)]


def test_tool_activity_is_a_tool_call_then_its_updates():
    agent = side()
    ready(agent)
    prompt(agent, 2, {"type": "text", "text": "hi"})
    started = ActivityEvent("tool", tool="Bash", title="ls", status="started", call_id="c1")
    done = ActivityEvent("tool", tool="Bash", status="completed", call_id="c1", text="a.txt")
    (first,) = sent(agent.event(SESSION, started))
    (second,) = sent(agent.event(SESSION, done))
    assert first["params"]["update"] | {} == {
        "sessionUpdate": "tool_call",
        "toolCallId": "c1",
        "title": "ls",
        "kind": "other",
        "status": "in_progress",
    }
    assert second["params"]["update"]["sessionUpdate"] == "tool_call_update"
    assert second["params"]["update"]["status"] == "completed"


def test_images_and_resources_become_attachments_and_an_outbox_file_a_resource_link():
    agent = side()
    ready(agent)
    png = base64.b64encode(b"\x89PNG").decode()
    start = prompt(
        agent,
        2,
        {"type": "text", "text": "look"},
        {"type": "image", "data": png, "mimeType": "image/png"},
        {"type": "resource", "resource": {"uri": "file:///w/notes.txt", "text": "milk"}},
    )
    image, notes = start.turn.attachments
    assert (image.type, image.url, image.name) == ("image", f"data:image/png;base64,{png}", "image-1.png")
    assert (notes.type, notes.name) == ("file", "notes.txt")
    assert base64.b64decode(notes.url.split(",", 1)[1]) == b"milk"
    file = FileEvent("out.txt", "/tmp/outbox/out.txt", 3, "text/plain")
    (link,) = sent(agent.event(SESSION, file, "file:///tmp/outbox/out.txt"))
    assert link["params"]["update"]["content"] == {
        "type": "resource_link",
        "uri": "file:///tmp/outbox/out.txt",
        "name": "out.txt",
        "mimeType": "text/plain",
        "size": 3,
    }


def test_a_profile_without_images_refuses_an_image_block():
    agent = side(images=False)
    ready(agent)
    image = {"type": "image", "data": "AA==", "mimeType": "image/png"}
    (refused,) = sent(agent.receive(line(2, "session/prompt", sessionId=SESSION, prompt=[image])))
    assert refused["error"]["code"] == -32602


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{not json", -32700),
        ("[1, 2]", -32600),
        (line(5, "session/set_mode", sessionId=SESSION, modeId="x"), -32601),
        (line(5, "session/prompt", sessionId="acp-someone-elses-session-id", prompt=[]), -32002),
        (line(5, "session/load", sessionId="not-an-id", cwd="/tmp", mcpServers=[]), -32002),
        (line(5, "session/new", cwd="relative", mcpServers=[]), -32602),
        (line(5, "session/prompt", sessionId=SESSION, prompt="hi"), -32602),
    ],
)
def test_a_bad_message_gets_a_json_rpc_error(text, code):
    agent = side()
    ready(agent)
    (answer,) = sent(agent.receive(text))
    assert answer["error"]["code"] == code


def test_nothing_before_initialize_and_one_prompt_at_a_time_per_session():
    agent = side()
    (early,) = sent(agent.receive(line(1, "session/new", cwd="/tmp", mcpServers=[])))
    assert "initialize" in early["error"]["message"]
    ready(agent)
    prompt(agent, 2, {"type": "text", "text": "hi"})
    (busy,) = sent(agent.receive(line(3, "session/prompt", sessionId=SESSION, prompt=[{"type": "text", "text": "x"}])))
    assert "already running" in busy["error"]["message"]
    assert agent.receive(
        json.dumps({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SESSION}})
    ) == [CancelPrompt(SESSION)]


def test_a_loaded_session_is_this_clients_and_takes_prompts():
    agent = side()
    agent.receive(line(0, "initialize", protocolVersion=1))
    other = "acp-ANOTHERclientsSESSIONid1234"
    (unknown,) = sent(agent.receive(line(1, "session/prompt", sessionId=other, prompt=[{"type": "text", "text": "x"}])))
    assert unknown["error"]["code"] == -32002
    assert sent(agent.receive(line(2, "session/load", sessionId=other, cwd="/tmp", mcpServers=[]))) == [
        {"jsonrpc": "2.0", "id": 2, "result": {}}
    ]
    (start,) = agent.receive(line(3, "session/prompt", sessionId=other, prompt=[{"type": "text", "text": "x"}]))
    assert start == StartPrompt(other, start.turn)
