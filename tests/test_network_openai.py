"""The OpenAI-compatible endpoints (`POST /v1/chat/completions`, `GET /v1/models`) through the official `openai`
SDK and plain httpx, against a real `serve_network` on loopback running real agents (docs/openai.md)."""

from __future__ import annotations

import json
import shutil
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest
import trio
from conftest import PROFILES, PYTHON, SAMPLE_AGENTS, TURN_DEADLINE

from bridge import BaseHost, open_host
from bridge.network.door import DoorLimits
from bridge.network.listen import parse_address, serve_network
from bridge.network.tokens import parse_tokens

T = TypeVar("T")

TOKEN_ALL = "token-of-the-ops-team-0123456789"
TOKEN_ECHO = "token-of-the-echo-bot-0123456789"
TOKENS = {
    TOKEN_ALL: {"name": "ops"},
    TOKEN_ECHO: {"name": "echo-bot", "profiles": ["echo"]},
}
# A tiny PNG, as chat UIs send pasted images.
PNG_DATA_URL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="


def write_profiles(root: Path) -> Path:
    """The sample profiles and agents, and a few more: one that asks about a tool, one cut short, one that
    leaves files, one that shows its attachments, one that hangs."""
    shutil.copytree(SAMPLE_AGENTS, root / "sample_agents")
    profiles = root / "profiles"
    profiles.mkdir()
    for name in ("echo", "stream", "agentproc-echo", "fail"):
        text = (PROFILES / f"{name}.yaml").read_text().replace('STREAM_DELAY: "0.05"', 'STREAM_DELAY: "0.01"')
        (profiles / f"{name}.yaml").write_text(text)
    agent_dir = root / "agents"
    agent_dir.mkdir()
    agents = {
        "files.py": """
            import os, pathlib
            (pathlib.Path(os.environ["AGENT_OUTBOX"]) / "report.txt").write_text("all good\\n")
            print("a report for you")
        """,
        "attachments.py": """
            import json, os
            print(json.dumps([item["type"] for item in json.loads(os.environ["AGENT_ATTACHMENTS"])]))
            print("from", os.environ["AGENT_FROM_USER"] or "nobody")
            print(os.environ["AGENT_MESSAGE"])
        """,
        "hang.py": """
            import time
            print('AGENT_PARTIAL:"thinking"', flush=True)
            time.sleep(60)
        """,
    }
    for name, source in agents.items():
        (agent_dir / name).write_text(textwrap.dedent(source))
    extra = {
        "asks": (PROFILES / "agentproc-echo.yaml")
        .read_text()
        .replace("deny: [Bash]", "ask: [Bash]\n  timeout_secs: 600"),
        "short": 'command: "{{PROFILE_DIR}}/../sample_agents/echo.sh"\nmax_reply_chars: 8\n',
        "files": f'command: ["{PYTHON}", "{agent_dir}/files.py"]\n',
        "attachments": f'command: ["{PYTHON}", "{agent_dir}/attachments.py"]\n',
        "hangs": f'command: ["{PYTHON}", "{agent_dir}/hang.py"]\ntimeout_secs: 60\n',
    }
    for name, text in extra.items():
        (profiles / f"{name}.yaml").write_text(text)
    return profiles


@asynccontextmanager
async def serving(host: BaseHost, tokens: dict[str, Any] | None = None) -> AsyncIterator[str]:
    """A network door on loopback for `host`; yields its URL."""
    listen = partial(
        serve_network,
        host,
        parse_address("127.0.0.1:0"),
        tokens=parse_tokens(tokens) if tokens else None,
        limits=DoorLimits(),
    )
    async with host, trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(listen)
        yield urls[0]
        nursery.cancel_scope.cancel()


def local_host(root: Path) -> BaseHost:
    return open_host(write_profiles(root), state=root / "sessions.sqlite3")


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    async with serving(local_host(tmp_path)) as base:
        yield base


@pytest.fixture
async def tenants_url(tmp_path: Path) -> AsyncIterator[str]:
    async with serving(local_host(tmp_path), TOKENS) as base:
        yield base


def sdk(base: str, api_key: str = "unused-without-tokens", **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=api_key, timeout=TURN_DEADLINE, **options)


async def in_thread(call: Callable[[], T]) -> T:
    """The sync SDK, off the trio thread that runs the server."""
    with trio.fail_after(TURN_DEADLINE):
        return await trio.to_thread.run_sync(call)


def chat(client: openai.OpenAI, model: str, text: str, **options: Any) -> Any:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], **options)


def stream_chunks(client: openai.OpenAI, model: str, text: str, **options: Any) -> list[Any]:
    return list(chat(client, model, text, stream=True, **options))


def content_of(chunks: list[Any]) -> str:
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


# ---------------------------------------------------------------------------- completions


async def test_a_completion_is_the_reply_of_the_profile_named_as_model(url: str) -> None:
    client = sdk(url)
    completion = await in_thread(
        lambda: client.chat.completions.create(
            model="echo",
            messages=[
                {"role": "system", "content": "you are terse"},
                {"role": "user", "content": "first, not sent"},
                {"role": "assistant", "content": "echo: first, not sent"},
                {"role": "user", "content": "hi there"},
            ],
            temperature=0.2,  # unknown to the endpoint: ignored
            metadata={"from": "a chat UI"},
        )
    )
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "echo"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == "echo: hi there"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens, completion.usage.total_tokens) == (
        0,
        0,
        0,
    )


async def test_text_parts_are_joined_image_parts_are_attachments_and_the_user_is_from_user(url: str) -> None:
    client = sdk(url)
    content = [
        {"type": "text", "text": "what is"},
        {"type": "image_url", "image_url": {"url": PNG_DATA_URL}},
        {"type": "text", "text": "in this picture?"},
    ]
    completion = await in_thread(
        lambda: client.chat.completions.create(
            model="attachments", messages=[{"role": "user", "content": content}], user="ann"
        )
    )
    assert completion.choices[0].message.content == '["image"]\nfrom ann\nwhat is\nin this picture?'


async def test_a_stream_sends_the_role_then_each_partial_then_what_the_reply_adds(url: str) -> None:
    client = sdk(url)
    chunks = await in_thread(lambda: stream_chunks(client, "stream", "one two three"))
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    deltas = [chunk.choices[0].delta.content for chunk in chunks[1:-1]]
    assert deltas[:3] == ["one ", "two ", "three "], "each partial is a chunk"
    # stream.py's reply is not its partials: it follows them as a paragraph of its own
    assert deltas[3].startswith("\n\nturn 1 of session ") and deltas[3].endswith("you said: one two three")
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].delta.content is None


async def test_an_agent_that_streams_its_reply_is_not_repeated_at_the_end(url: str) -> None:
    client = sdk(url)
    chunks = await in_thread(lambda: stream_chunks(client, "agentproc-echo", "say it once"))
    # the partials are the reply's first line; the profile's answer about a tool follows it
    assert content_of(chunks) == "You said: say it once\n(Bash was denied: Bash is not allowed by the profile)"


async def test_the_stream_is_server_sent_events_ending_with_done(url: str) -> None:
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=TURN_DEADLINE) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in response.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert [event["choices"][0]["delta"] for event in events] == [
        {"role": "assistant", "content": ""},
        {"content": "echo: hi"},
        {},
    ]
    assert [event["choices"][0]["finish_reason"] for event in events] == [None, None, "stop"]


async def test_a_reply_cut_by_the_profiles_cap_finishes_with_length(url: str) -> None:
    client = sdk(url)
    completion = await in_thread(lambda: chat(client, "short", "a long message"))
    assert completion.choices[0].finish_reason == "length"
    chunks = await in_thread(lambda: stream_chunks(client, "short", "a long message"))
    assert chunks[-1].choices[0].finish_reason == "length"


# ---------------------------------------------------------------------------- usage


async def test_usage_is_the_agents_report_in_openais_names(url: str) -> None:
    client = sdk(url)
    completion = await in_thread(lambda: chat(client, "agentproc-echo", "count these four words"))
    reply = completion.choices[0].message.content
    assert reply.startswith("You said: count these four words\n")
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 4  # wire04_agent.py counts words
    assert completion.usage.completion_tokens == len(reply.split())
    assert completion.usage.total_tokens == 4 + len(reply.split())

    chunks = await in_thread(
        lambda: stream_chunks(client, "agentproc-echo", "two words", stream_options={"include_usage": True})
    )
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.prompt_tokens == 2
    assert usage_chunk.usage.total_tokens == 2 + len(content_of(chunks).split())
    assert all(chunk.usage is None for chunk in chunks[:-1])
    without = await in_thread(lambda: stream_chunks(client, "agentproc-echo", "no usage asked"))
    assert all(chunk.usage is None for chunk in without)


# ---------------------------------------------------------------------------- conversations


async def test_the_conversation_is_the_header_else_the_user_else_a_new_one_each_time(url: str) -> None:
    client = sdk(url)

    def said(text: str, **options: Any) -> str:
        reply: str = chat(client, "agentproc-echo", text, **options).choices[0].message.content
        return reply

    header = {"extra_headers": {"X-Conversation-Id": "room-1"}}
    assert "last time" not in await in_thread(lambda: said("apples", **header))
    assert "(last time you said: apples)" in await in_thread(lambda: said("pears", **header))

    assert "last time" not in await in_thread(lambda: said("plums", user="ann"))
    assert "(last time you said: plums)" in await in_thread(lambda: said("figs", user="ann"))
    # the header wins over the user: ann in room-1 is room-1's conversation
    assert "(last time you said: pears)" in await in_thread(lambda: said("kiwis", user="ann", **header))

    assert "last time" not in await in_thread(lambda: said("grapes"))
    assert "last time" not in await in_thread(lambda: said("limes")), "without a key, every request starts afresh"


# ---------------------------------------------------------------------------- models and tenants


async def test_models_lists_the_profiles_and_an_unknown_model_is_404_model_not_found(url: str) -> None:
    client = sdk(url)
    models = await in_thread(lambda: client.models.list())
    names = [model.id for model in models.data]
    assert names == sorted(names)
    assert {"echo", "stream", "agentproc-echo", "fail", "hangs"} <= set(names)
    assert (await in_thread(lambda: client.models.retrieve("echo"))).id == "echo"
    with pytest.raises(openai.NotFoundError) as raised:
        await in_thread(lambda: chat(client, "no-such-profile", "hi"))
    assert raised.value.status_code == 404
    assert raised.value.code == "model_not_found"
    assert raised.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        await in_thread(lambda: stream_chunks(client, "no-such-profile", "hi"))
    with pytest.raises(openai.NotFoundError):
        await in_thread(lambda: client.models.retrieve("no-such-profile"))


async def test_a_tenant_sees_and_uses_only_its_profiles(tenants_url: str) -> None:
    echo_bot, ops = sdk(tenants_url, TOKEN_ECHO), sdk(tenants_url, TOKEN_ALL)
    assert [model.id for model in (await in_thread(lambda: echo_bot.models.list())).data] == ["echo"]
    assert "stream" in [model.id for model in (await in_thread(lambda: ops.models.list())).data]
    assert (await in_thread(lambda: chat(echo_bot, "echo", "hi"))).choices[0].message.content == "echo: hi"
    with pytest.raises(openai.NotFoundError) as raised:
        await in_thread(lambda: chat(echo_bot, "stream", "hi"))
    assert raised.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        await in_thread(lambda: echo_bot.models.retrieve("stream"))
    assert "one" in content_of(await in_thread(lambda: stream_chunks(ops, "stream", "one")))


async def test_without_a_valid_token_it_is_401(tenants_url: str) -> None:
    for key in ("not-a-token-of-this-server-at-all", ""):
        client = sdk(tenants_url, key or "x")
        with pytest.raises(openai.AuthenticationError):
            await in_thread(lambda: chat(client, "echo", "hi"))
        with pytest.raises(openai.AuthenticationError):
            await in_thread(lambda: client.models.list())
    async with httpx.AsyncClient(base_url=tenants_url) as client:
        response = await client.get("/v1/models")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


# ---------------------------------------------------------------------------- refused requests and failed turns


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "echo"}, "messages"),
        ({"model": "echo", "messages": "hi"}, "messages"),
        ({"model": "echo", "messages": [{"role": "assistant", "content": "hello"}]}, "messages"),
        ({"model": "echo", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "echo", "messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        ({"model": "echo", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools"),
        ({"model": "echo", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, "tool_choice"),
        ({"model": "echo", "messages": [{"role": "user", "content": "hi\u0000"}]}, None),
    ],
)
async def test_a_request_the_endpoint_cannot_take_is_a_400_naming_the_field(
    url: str, body: dict[str, Any], param: str | None
) -> None:
    async with httpx.AsyncClient(base_url=url) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


async def test_a_body_that_is_not_json_is_a_400(url: str) -> None:
    async with httpx.AsyncClient(base_url=url) as client:
        response = await client.post(
            "/v1/chat/completions", content=b'{"model": "echo", ', headers={"content-type": "application/json"}
        )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_json"


async def test_a_failed_turn_is_an_error_with_what_the_user_should_see_and_is_not_retried(url: str) -> None:
    client = sdk(url, max_retries=2)
    with pytest.raises(openai.InternalServerError) as raised:
        await in_thread(lambda: chat(client, "fail", "hi"))
    assert raised.value.status_code == 502
    assert raised.value.code == "agent_error"
    assert "The upstream service is rate limited" in raised.value.message
    assert raised.value.response.headers["x-should-retry"] == "false"
    async with httpx.AsyncClient(base_url=url) as plain:
        stats = (await plain.get("/v1/stats")).json()
    assert stats["completed"] == 1, "the SDK did not run the failing agent again"

    with pytest.raises(openai.APIError) as streamed:
        await in_thread(lambda: stream_chunks(client, "fail", "hi"))
    assert "The upstream service is rate limited" in streamed.value.message
    assert streamed.value.code == "agent_error"


async def test_a_tool_the_profile_asks_about_is_denied_at_once(url: str) -> None:
    client = sdk(url)
    # the profile would wait 600 s for an answer; nobody can give one here, so the agent hears no at once
    completion = await in_thread(lambda: chat(client, "asks", "hello"))
    assert "(Bash was denied: nobody can answer through the OpenAI-compatible endpoint)" in (
        completion.choices[0].message.content
    )


async def test_files_the_agent_leaves_are_listed_and_wait_at_the_turns_files_url(url: str) -> None:
    client = sdk(url)
    raw = await in_thread(
        lambda: client.chat.completions.with_raw_response.create(
            model="files", messages=[{"role": "user", "content": "the report"}]
        )
    )
    completion = json.loads(raw.text)
    assert completion["choices"][0]["message"]["content"] == "a report for you"
    [file] = completion["files"]
    assert file == {
        "name": "report.txt",
        "size": 9,
        "media_type": "text/plain",
        "url": f"/v1/files/http/{completion['id']}/report.txt",
    }
    async with httpx.AsyncClient(base_url=url) as plain:
        assert (await plain.get(file["url"])).text == "all good\n"
        assert (await plain.delete(file["url"])).status_code == 200
        assert (await plain.get(file["url"])).status_code == 404


async def test_a_client_that_hangs_up_mid_stream_cancels_the_turn(url: str) -> None:
    body = {"model": "hangs", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=TURN_DEADLINE) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if '"thinking"' in line:
                    break  # the agent runs: hang up
        with trio.fail_after(TURN_DEADLINE):
            while (stats := (await client.get("/v1/stats")).json())["completed"] < 1:
                await trio.sleep(0.05)
    assert stats["outcomes"]["cancelled"] == 1


async def test_through_a_postgres_gateway_the_models_cannot_be_listed(pg_dsn: str) -> None:
    async with serving(open_host(postgres=pg_dsn)) as base, httpx.AsyncClient(base_url=base) as client:
        response = await client.get("/v1/models")
    assert response.status_code == 501  # the workers have the profiles (docs/openai.md, "Not supported")
    assert response.json()["error"]["code"] == "not_implemented"
