"""protocol: claude-sdk behind the host and `agent-bridge serve`: what a chat bot relies on, with the real Claude Code.

The pinned Claude Code runs against tools/fake_anthropic.py's `Conversation` (see test_claude_sdk_live). Here the
bot's side: an AskUserQuestion answered with serve's `answer` request (a real `agent-bridge serve` process), and a
message steered into a running turn (`on_busy: steer`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio
from agents_cache import npm_binary
from fake_anthropic import Conversation, tool_results, user_texts, write_claude_profile
from fake_api import FakeApi
from servekit import StdioServe

import bridge
from bridge import Turn

DEADLINE = 30


@contextmanager
def claude_profiles(tmp_path: Path, **overrides: Any) -> Iterator[tuple[Conversation, FakeApi, Path]]:
    """A profiles directory holding `claude.yaml`: the ready profile, the cached binary, the fake server."""
    conversation = Conversation()
    with FakeApi(conversation) as api:
        profiles = tmp_path / "profiles"
        profiles.mkdir(exist_ok=True)
        write_claude_profile(profiles / "claude.yaml", api, tmp_path, **overrides)
        try:
            yield conversation, api, profiles
        finally:
            conversation.release.set()


def test_a_question_of_the_agent_is_answered_through_serve(tmp_path: Path) -> None:
    with claude_profiles(tmp_path) as (_, api, profiles):
        serve = StdioServe(profiles, tmp_path / "state.sqlite3", deadline=DEADLINE)
        try:
            serve.send({"type": "turn", "id": "t1", "profile": "claude", "conversation": "c", "message": "ask colour"})
            asked = serve.until("question", "t1")[-1]
            assert (asked["tool"], [question["id"] for question in asked["questions"]]) == ("AskUserQuestion", ["q1"])
            [question] = asked["questions"]
            assert (question["prompt"], question["header"]) == ("Which colour?", "Colour")
            assert [option["label"] for option in question["options"]] == ["Red", "Blue"]
            serve.send({"type": "answer", "id": "t1", "request_id": asked["request_id"], "answers": {"q9": "Blue"}})
            assert serve.until("error", "t1")[-1]["code"] == "invalid_request"  # no such question: it still waits
            serve.send({"type": "answer", "id": "t1", "request_id": asked["request_id"], "answers": {"q1": "Blue"}})
            responses = serve.until("result", "t1")
            serve.send({"type": "answer", "id": "t1", "request_id": asked["request_id"], "answers": {"q1": "Red"}})
            assert serve.until("error", "t1")[-1]["code"] == "unknown_turn"  # over: nothing is answered twice
        finally:
            assert serve.close() == 0
    activity = [(r["tool"], r["status"]) for r in responses if r["type"] == "activity" and r.get("tool")]
    assert ("AskUserQuestion", "answered") in activity
    result = responses[-1]
    assert result["outcome"] == "ok", result
    answered = [results for post in api.posts("/v1/messages") if (results := tool_results(post))]
    assert '"Which colour?"="Blue"' in answered[-1][0]["content"]  # what the model was told the user chose


async def test_a_message_steered_into_a_running_turn_is_answered_by_that_turn(tmp_path: Path) -> None:
    results: dict[str, bridge.TurnResult] = {}
    with claude_profiles(tmp_path, on_busy="steer") as (conversation, api, profiles):
        async with bridge.open_host(profiles, state=tmp_path / "state.sqlite3") as host:

            async def submit(
                turn_id: str, message: str, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
            ) -> None:
                turn = Turn(message)
                results[turn_id] = await host.submit("claude", "c", turn, turn_id=turn_id, task_status=task_status)

            with trio.fail_after(DEADLINE):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(submit, "first", "slow")
                    await trio.to_thread.run_sync(conversation.started.wait, DEADLINE)
                    await nursery.start(submit, "second", "and this too")  # accepted: steered by now
                    conversation.release.set()
                after = await host.submit("claude", "c", Turn("one more"))
    first, second = results["first"], results["second"]
    assert (first.ok, second.ok, after.ok) == (True, True, True), (first.error, second.error, after.error)
    assert (second.folded_into, second.reply) == ("first", "")
    assert "reply to slow" in first.reply and "reply to and this too" in first.reply
    assert after.reply == "reply to one more" and after.session_id == first.session_id == second.session_id
    assert "and this too" in user_texts(api.posts("/v1/messages")[-1])  # one conversation: the model saw it


async def test_a_message_that_interrupts_the_running_turn_runs_next_on_the_same_process(tmp_path: Path) -> None:
    results: dict[str, bridge.TurnResult] = {}
    with claude_profiles(tmp_path, on_busy="interrupt") as (conversation, _api, profiles):
        async with bridge.open_host(profiles, state=tmp_path / "state.sqlite3") as host:

            async def submit(turn_id: str, message: str) -> None:
                results[turn_id] = await host.submit("claude", "c", Turn(message), turn_id=turn_id)

            with trio.fail_after(DEADLINE):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(submit, "first", "slow")
                    await trio.to_thread.run_sync(conversation.started.wait, DEADLINE)
                    before = claude_processes(tmp_path / "work")
                    nursery.start_soon(submit, "second", "stop that, do this")
            assert (
                claude_processes(tmp_path / "work") == before and len(before) == 1
            )  # the interrupt left the process warm
    first, second = results["first"], results["second"]
    assert first.outcome.value == "cancelled" and "reply to slow" not in first.reply
    assert (second.ok, second.reply, second.session_id) == (True, "reply to stop that, do this", first.session_id)


def claude_processes(cwd: Path) -> set[int]:
    """The pids of the cached Claude Code binary's live processes working in `cwd` (this test's)."""
    binary = npm_binary("claude").resolve()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "exe").resolve() == binary and (entry / "cwd").resolve() == cwd.resolve():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


async def test_a_question_is_answered_over_the_network_door(tmp_path: Path) -> None:
    """The same question, through `serve --listen`: seen as a `question` event of the turn's event stream, answered
    with `POST /v1/turns/{id}/answer`."""
    import httpx

    from bridge.network.door import DoorLimits
    from bridge.network.listen import parse_address, serve_network

    with claude_profiles(tmp_path) as (_, api, profiles):
        host = bridge.open_host(profiles, state=tmp_path / "state.sqlite3")
        async with host, trio.open_nursery() as nursery:
            urls = await nursery.start(
                partial(serve_network, host, parse_address("127.0.0.1:0"), tokens=None, limits=DoorLimits())
            )
            async with httpx.AsyncClient(base_url=urls[0], timeout=DEADLINE) as http:
                body = {"id": "t1", "profile": "claude", "conversation": "c", "message": "ask colour"}
                events: list[tuple[str, dict[str, Any]]] = []
                async with http.stream("POST", "/v1/turns", json=body) as stream:
                    async for line in stream.aiter_lines():
                        if line.startswith("event: "):
                            kind = line.removeprefix("event: ")
                        elif line.startswith("data: "):
                            events.append((kind, json.loads(line.removeprefix("data: "))))
                            if kind == "question":
                                answer = {"request_id": events[-1][1]["request_id"], "answers": {"q1": "Blue"}}
                                wrong = await http.post("/v1/turns/t1/answer", json={**answer, "answers": {"q9": "x"}})
                                answered = await http.post("/v1/turns/t1/answer", json=answer)
            nursery.cancel_scope.cancel()
    assert wrong.status_code == 400 and wrong.json()["code"] == "invalid_request"
    assert answered.status_code == 200
    assert events[-1][0] == "result" and events[-1][1]["outcome"] == "ok", events[-1]
    answered_posts = [results for post in api.posts("/v1/messages") if (results := tool_results(post))]
    assert '"Which colour?"="Blue"' in answered_posts[-1][0]["content"]
