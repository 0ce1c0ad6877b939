"""The fake Telegram Bot API's own HTTP/1.1 server (tools/fakes/telegram_bot_api.py), as a bot's HTTP client meets it.

Raw HTTP on loopback (h11 as the client), where the rule is about the wire: a connection kept alive for request after
request, chunked bodies, a call timed when its head arrives, a reset halfway through an answer, a request it cannot
parse. What the Bot API answers is test_chat_telegram.py's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import h11
import httpx
import pytest
import trio
from chatkit import TELEGRAM_TOKEN
from fakes.telegram_bot_api import FakeBotApi, FloodLimits, ResetConnection, running_fake_bot_api

ALICE = 1001
WITHIN = 5


@pytest.fixture
async def fake() -> AsyncIterator[FakeBotApi]:
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FloodLimits(0.0, 1000, 1000)) as server:
        yield server


async def open_connection(fake: FakeBotApi) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", urlsplit(fake.api_url).port or 80)


def call_head(method: str, body: bytes) -> h11.Request:
    headers = [("host", "127.0.0.1"), ("content-type", "application/json"), ("content-length", str(len(body)))]
    return h11.Request(method="POST", target=f"/bot{TELEGRAM_TOKEN}/{method}", headers=headers)


async def receive(stream: trio.SocketStream, client: h11.Connection, seen: list[object]) -> None:
    """The next response's events, into `seen` as they come (a protocol error raised, the ones before it kept)."""
    with trio.fail_after(WITHIN):
        while not (seen and isinstance(seen[-1], h11.EndOfMessage)):
            if (event := client.next_event()) is h11.NEED_DATA:
                client.receive_data(await stream.receive_some())
            else:
                seen.append(event)


async def answer(stream: trio.SocketStream, client: h11.Connection) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the next response on the connection."""
    seen: list[object] = []
    await receive(stream, client, seen)
    head = next(event for event in seen if isinstance(event, h11.Response))
    body = b"".join(event.data for event in seen if isinstance(event, h11.Data))
    return head.status_code, json.loads(body)


async def send_call(stream: trio.SocketStream, client: h11.Connection, method: str, **params: Any) -> None:
    body = json.dumps(params).encode()
    await stream.send_all(client.send(call_head(method, body)) + client.send(h11.Data(data=body)))
    await stream.send_all(client.send(h11.EndOfMessage()))


async def call(stream: trio.SocketStream, client: h11.Connection, method: str, **params: Any) -> tuple[int, Any]:
    await send_call(stream, client, method, **params)
    return await answer(stream, client)


async def test_one_connection_carries_call_after_call(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hello")
    client = h11.Connection(h11.CLIENT)
    async with await open_connection(fake) as stream:
        answers = []
        for method, params in (("getMe", {}), ("sendMessage", {"chat_id": ALICE, "text": "hi"}), ("getMe", {})):
            answers.append(await call(stream, client, method, **params))
            assert client.our_state is h11.DONE and client.their_state is h11.DONE, "the fake closed the connection"
            client.start_next_cycle()
    assert [status for status, _ in answers] == [200, 200, 200]
    assert [message.text for message in fake.sent_to(ALICE)] == ["hi"]


async def test_a_chunked_body_is_read_whole(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hello")
    text = "a reply in pieces " * 100

    async def pieces() -> AsyncIterator[bytes]:  # no length known: httpx sends it chunked
        body = json.dumps({"chat_id": ALICE, "text": text}).encode()
        for start in range(0, len(body), 100):
            yield body[start : start + 100]

    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{fake.api_url}/bot{TELEGRAM_TOKEN}/sendMessage",
            content=pieces(),
            headers={"content-type": "application/json"},
        )
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert response.status_code == 200 and response.json()["result"]["text"] == text
    assert [message.text for message in fake.sent_to(ALICE)] == [text]


async def test_the_query_string_gives_parameters_too(fake: FakeBotApi) -> None:
    first, second = fake.user_says(ALICE, ALICE, "one"), fake.user_says(ALICE, ALICE, "two")
    async with httpx.AsyncClient() as client:
        response = await client.get(
            f"{fake.api_url}/bot{TELEGRAM_TOKEN}/getUpdates", params={"offset": second["update_id"]}
        )
    assert [update["update_id"] for update in response.json()["result"]] == [second["update_id"]]
    assert first["update_id"] not in fake.handed_out


async def test_a_call_is_timed_when_its_head_arrives_not_its_body(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hello")
    body = json.dumps({"chat_id": ALICE, "text": "late body"}).encode()
    client = h11.Connection(h11.CLIENT)
    async with await open_connection(fake) as stream:
        await stream.send_all(client.send(call_head("sendMessage", body)))
        await trio.sleep(0.2)  # not a wait for anything: the body comes this much after the head
        body_sent = trio.current_time()
        await stream.send_all(client.send(h11.Data(data=body)) + client.send(h11.EndOfMessage()))
        assert (await answer(stream, client))[0] == 200
    assert fake.calls_of("sendMessage")[0].time < body_sent


async def test_a_reset_answers_a_head_and_drops_the_connection_halfway_through_the_body(fake: FakeBotApi) -> None:
    fake.fail_next("getMe", ResetConnection())
    client = h11.Connection(h11.CLIENT)
    seen: list[object] = []
    async with await open_connection(fake) as stream:
        await send_call(stream, client, "getMe")
        with pytest.raises(h11.RemoteProtocolError, match="peer closed connection without sending complete message"):
            await receive(stream, client, seen)
    assert isinstance(seen[0], h11.Response) and seen[0].status_code == 200, "the answer's head came"
    assert [type(event) for event in seen] == [h11.Response, h11.Data], "then part of its body, and no end"
    assert fake.calls_of("getMe")[0].status == 0
    async with httpx.AsyncClient() as again:
        assert (await again.post(f"{fake.api_url}/bot{TELEGRAM_TOKEN}/getMe")).status_code == 200, (
            "a fault lasts one call"
        )


async def test_a_request_it_cannot_parse_is_a_400_and_the_fake_serves_on(fake: FakeBotApi) -> None:
    async with await open_connection(fake) as stream:
        await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        client = h11.Connection(h11.CLIENT)
        client.send(h11.Request(method="GET", target="/", headers=[("host", "127.0.0.1")]))
        client.send(h11.EndOfMessage())
        status, body = await answer(stream, client)
    assert status == 400 and body["ok"] is False and body["description"].startswith("Bad Request")
    async with httpx.AsyncClient() as again:
        assert (await again.post(f"{fake.api_url}/bot{TELEGRAM_TOKEN}/getMe")).status_code == 200


async def test_a_body_it_cannot_read_is_a_500_and_the_fake_serves_on(fake: FakeBotApi) -> None:
    async with httpx.AsyncClient() as client:
        broken = await client.post(
            f"{fake.api_url}/bot{TELEGRAM_TOKEN}/sendMessage",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert (broken.status_code, broken.json()["ok"]) == (500, False)
        assert (await client.post(f"{fake.api_url}/bot{TELEGRAM_TOKEN}/getMe")).status_code == 200
