"""The Telegram connector against a fake Bot API on loopback, and the fake's own rules (tools/fakes/telegram_bot_api.py).

The fake is held to the Bot API documentation first (raw HTTP calls, as any bot makes them), so that the connector's
tests against it mean something: offsets, long polls and 409s, the UTF-16 limit, entity checks, flood limits with
`retry_after`, files both ways. Then the connector: what a chat user sees of its sends, edits, splits, fallbacks and
retries, and that the bot token never leaves it.
"""

from __future__ import annotations

import logging
import select
import subprocess
import sys
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from chatkit import TELEGRAM_TOKEN as TOKEN
from fakes.telegram_bot_api import (
    CONFLICT,
    DOWNLOAD_LIMIT,
    ApiFault,
    FakeBotApi,
    FloodLimits,
    ResetConnection,
    SlowDown,
    cannot_parse_entities,
    running_fake_bot_api,
    too_many_requests,
)
from pydantic import SecretStr

from bridge.chat.config import Pace, load_chat_config
from bridge.chat.http_transport import chat_http_client
from bridge.chat.markup import utf16_length
from bridge.chat.pacing import PaceLimits
from bridge.chat.platform import ButtonPress, Choice, Incoming, IncomingFile
from bridge.chat.telegram import TelegramPlatform
from bridge.errors import PlatformConflict, PlatformRefused, PlatformUnavailable

# Loose limits for the tests that are not about pacing: the fake and the connector agree on them.
FAST_FLOOD = FloodLimits(per_chat_interval=0.02, group_per_minute=1000, global_per_second=1000)
FAST_PACE = PaceLimits(per_chat_interval=0.02, group_per_minute=1000, global_per_second=1000)
ALICE = 1001


@dataclass(frozen=True)
class Settings:
    """The fields of the config's `telegram:` section the connector reads."""

    token: SecretStr
    api_url: str
    pace: Pace = Pace()


@pytest.fixture
async def fake() -> Any:
    async with running_fake_bot_api(TOKEN, limits=FAST_FLOOD) as server:
        yield server


def connector(
    fake: FakeBotApi, *, limits: PaceLimits = FAST_PACE, token: str = TOKEN, poll_timeout: int = 2
) -> TelegramPlatform:
    settings = Settings(SecretStr(token), fake.api_url)
    return TelegramPlatform(settings, httpx.AsyncClient, limits=limits, poll_timeout=poll_timeout)


async def started(fake: FakeBotApi, position: str | None = None, **options: Any) -> TelegramPlatform:
    platform = connector(fake, **options)
    await platform.start(position)
    return platform


async def bot_api(fake: FakeBotApi, method: str, **params: Any) -> tuple[int, dict[str, Any]]:
    """One raw Bot API call, as any bot makes it: status and JSON body."""
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{fake.api_url}/bot{fake.token}/{method}", json=params, timeout=10)
        return response.status_code, response.json()


# ---------------------------------------------------------------------- the fake, held to the documentation


async def test_fake_refuses_a_wrong_token_and_an_unknown_method(fake: FakeBotApi) -> None:
    async with httpx.AsyncClient() as client:
        wrong = await client.post(f"{fake.api_url}/bot999:wrong/getMe")
    assert (wrong.status_code, wrong.json()) == (401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
    assert await bot_api(fake, "sendTelepathy") == (404, {"ok": False, "error_code": 404, "description": "Not Found"})
    status, body = await bot_api(fake, "getMe")
    assert status == 200 and body["result"]["is_bot"] and body["result"]["username"] == "fake_bot"


async def test_fake_offset_confirms_every_earlier_update_for_good(fake: FakeBotApi) -> None:
    first = fake.user_says(ALICE, ALICE, "one")
    second = fake.user_says(ALICE, ALICE, "two")
    _, unconfirmed = await bot_api(fake, "getUpdates")
    _, again = await bot_api(fake, "getUpdates")
    assert [u["update_id"] for u in unconfirmed["result"]] == [first["update_id"], second["update_id"]]
    assert again["result"] == unconfirmed["result"], "without an offset nothing is confirmed"
    _, after = await bot_api(fake, "getUpdates", offset=second["update_id"])
    assert [u["message"]["text"] for u in after["result"]] == ["two"]
    _, without_offset = await bot_api(fake, "getUpdates")
    assert [u["message"]["text"] for u in without_offset["result"]] == ["two"], "the confirmed update is gone"


async def test_fake_long_poll_returns_when_an_update_arrives(fake: FakeBotApi) -> None:
    async with trio.open_nursery() as nursery:
        answers: list[dict[str, Any]] = []

        async def poll() -> None:
            answers.append((await bot_api(fake, "getUpdates", timeout=20))[1])

        nursery.start_soon(poll)
        await fake.wait_until(lambda: fake.calls_of("getUpdates"))
        with trio.fail_after(5):
            fake.user_says(ALICE, ALICE, "wake up")
            while not answers:
                await trio.sleep(0.01)
    assert [u["message"]["text"] for u in answers[0]["result"]] == ["wake up"]


async def test_fake_long_poll_ends_empty_at_its_timeout(fake: FakeBotApi) -> None:
    start = trio.current_time()
    _, body = await bot_api(fake, "getUpdates", timeout=1)
    assert body == {"ok": True, "result": []} and 0.9 <= trio.current_time() - start < 3


async def test_fake_allowed_updates_is_remembered_until_given_again(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    keyboard = {"inline_keyboard": [[{"text": "OK", "callback_data": "ok"}]]}
    await bot_api(fake, "sendMessage", chat_id=ALICE, text="press", reply_markup=keyboard)
    await bot_api(fake, "getUpdates", offset=10**6)  # confirms "hi"
    fake.user_presses(fake.sent_to(ALICE)[0], "ok", user=ALICE)
    _, only_messages = await bot_api(fake, "getUpdates", allowed_updates=["message"])
    assert only_messages["result"] == []
    _, still = await bot_api(fake, "getUpdates")
    assert still["result"] == [], "allowed_updates sticks to later calls that do not give it"
    _, with_presses = await bot_api(fake, "getUpdates", allowed_updates=["message", "callback_query"])
    assert [u["callback_query"]["data"] for u in with_presses["result"]] == ["ok"]


async def test_fake_a_second_poller_ends_the_first_with_409(fake: FakeBotApi) -> None:
    answers: list[tuple[int, dict[str, Any]]] = []
    async with trio.open_nursery() as nursery:

        async def first() -> None:
            answers.append(await bot_api(fake, "getUpdates", timeout=20))

        nursery.start_soon(first)
        await fake.wait_until(lambda: fake.calls_of("getUpdates"))
        second = await bot_api(fake, "getUpdates", timeout=0)
    assert answers == [(409, {"ok": False, "error_code": 409, "description": CONFLICT})]
    assert second == (200, {"ok": True, "result": []})


async def test_fake_counts_the_text_limit_in_utf16_code_units(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    fake.limits = FloodLimits(0.0, 1000, 1000)
    emoji = "\N{GRINNING FACE}"  # two UTF-16 code units, one code point
    assert (await bot_api(fake, "sendMessage", chat_id=ALICE, text=emoji * 2048))[0] == 200
    status, body = await bot_api(fake, "sendMessage", chat_id=ALICE, text=emoji * 2049)
    assert (status, body["description"]) == (400, "Bad Request: message is too long")
    assert (await bot_api(fake, "sendMessage", chat_id=ALICE, text="a" * 4096))[0] == 200


async def test_fake_checks_entities_in_utf16(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    fake.limits = FloodLimits(0.0, 1000, 1000)
    text = "\N{GRINNING FACE} bold"  # "bold" starts at UTF-16 offset 3
    ok = await bot_api(
        fake, "sendMessage", chat_id=ALICE, text=text, entities=[{"type": "bold", "offset": 3, "length": 4}]
    )
    assert ok[0] == 200 and ok[1]["result"]["entities"] == [{"type": "bold", "offset": 3, "length": 4}]
    status, body = await bot_api(
        fake, "sendMessage", chat_id=ALICE, text=text, entities=[{"type": "bold", "offset": 4, "length": 4}]
    )
    assert status == 400 and body["description"].startswith("Bad Request: can't parse entities: ")
    status, body = await bot_api(
        fake, "sendMessage", chat_id=ALICE, text=text, entities=[{"type": "text_link", "offset": 0, "length": 2}]
    )
    assert status == 400 and "can't parse entities" in body["description"]


async def test_fake_callback_data_is_at_most_64_bytes(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    fake.limits = FloodLimits(0.0, 1000, 1000)

    def markup(data: str) -> dict[str, Any]:
        return {"inline_keyboard": [[{"text": "Allow", "callback_data": data}]]}

    assert (await bot_api(fake, "sendMessage", chat_id=ALICE, text="?", reply_markup=markup("é" * 32)))[0] == 200
    status, body = await bot_api(fake, "sendMessage", chat_id=ALICE, text="?", reply_markup=markup("é" * 32 + "x"))
    assert (status, body["description"]) == (400, "Bad Request: BUTTON_DATA_INVALID")


async def test_fake_an_edit_that_changes_nothing_is_not_modified(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    fake.limits = FloodLimits(0.0, 1000, 1000)
    _, sent = await bot_api(fake, "sendMessage", chat_id=ALICE, text="draft")
    key = sent["result"]["message_id"]
    assert (await bot_api(fake, "editMessageText", chat_id=ALICE, message_id=key, text="final"))[0] == 200
    status, body = await bot_api(fake, "editMessageText", chat_id=ALICE, message_id=key, text="final")
    assert status == 400 and body["description"].startswith("Bad Request: message is not modified: ")
    assert (await bot_api(fake, "deleteMessage", chat_id=ALICE, message_id=key))[0] == 200
    status, body = await bot_api(fake, "deleteMessage", chat_id=ALICE, message_id=key)
    assert (status, body["description"]) == (400, "Bad Request: message to delete not found")


async def test_fake_enforces_one_message_a_second_per_chat_with_retry_after(fake: FakeBotApi) -> None:
    fake.limits = FloodLimits()
    fake.user_says(ALICE, ALICE, "hi")
    assert (await bot_api(fake, "sendMessage", chat_id=ALICE, text="one"))[0] == 200
    status, body = await bot_api(fake, "sendMessage", chat_id=ALICE, text="two")
    assert status == 429
    assert body == {
        "ok": False,
        "error_code": 429,
        "description": "Too Many Requests: retry after 1",
        "parameters": {"retry_after": 1},
    }
    fake.user_says(2002, 2002, "hi")
    assert (await bot_api(fake, "sendMessage", chat_id=2002, text="another chat"))[0] == 200


async def test_fake_enforces_twenty_a_minute_in_a_group(fake: FakeBotApi) -> None:
    fake.limits = FloodLimits(per_chat_interval=0.0, group_per_minute=20, global_per_second=1000)
    group = -100500
    fake.user_says(group, ALICE, "hi")
    statuses = [(await bot_api(fake, "sendMessage", chat_id=group, text=f"{n}"))[0] for n in range(21)]
    assert statuses == [200] * 20 + [429]


async def test_fake_enforces_the_overall_limit_a_second(fake: FakeBotApi) -> None:
    fake.limits = FloodLimits(per_chat_interval=0.0, group_per_minute=1000, global_per_second=3)
    for chat in range(1, 5):
        fake.user_says(chat, chat, "hi")
    statuses = [(await bot_api(fake, "sendMessage", chat_id=chat, text="x"))[0] for chat in range(1, 5)]
    assert statuses == [200, 200, 200, 429], "four chats' messages within a second exceed three a second"


async def test_fake_serves_the_files_users_send_and_takes_uploads(fake: FakeBotApi) -> None:
    update = fake.user_sends_document(ALICE, ALICE, b"report", file_name="r.txt", mime_type="text/plain")
    file_id = update["message"]["document"]["file_id"]
    _, got = await bot_api(fake, "getFile", file_id=file_id)
    async with httpx.AsyncClient() as client:
        data = await client.get(f"{fake.api_url}/file/bot{fake.token}/{got['result']['file_path']}")
        wrong = await client.get(f"{fake.api_url}/file/bot1:wrong/{got['result']['file_path']}")
        upload = await client.post(
            f"{fake.api_url}/bot{fake.token}/sendDocument",
            data={"chat_id": str(ALICE), "caption": "here"},
            files={"document": ("out.txt", b"result", "text/plain")},
        )
        fake.upload_limit = 10
        fake.limits = FloodLimits(0.0, 1000, 1000)
        too_big = await client.post(
            f"{fake.api_url}/bot{fake.token}/sendDocument",
            data={"chat_id": str(ALICE)},
            files={"document": ("big.bin", b"x" * 11, "application/octet-stream")},
        )
    assert data.content == b"report" and wrong.status_code == 401
    assert upload.json()["result"]["document"]["file_name"] == "out.txt" and fake.sent_to(ALICE)[0].caption == "here"
    assert (too_big.status_code, too_big.json()["description"]) == (413, "Request Entity Too Large")


async def test_fake_injects_faults(fake: FakeBotApi) -> None:
    fake.fail_next("getMe", too_many_requests(7))
    fake.fail_next("getMyCommands", ResetConnection())
    fake.fail_next("getMe", SlowDown(0.3))
    status, body = await bot_api(fake, "getMe")
    assert status == 429 and body["parameters"] == {"retry_after": 7}
    with pytest.raises(httpx.TransportError):
        await bot_api(fake, "getMyCommands")
    start = trio.current_time()
    assert (await bot_api(fake, "getMe"))[0] == 200 and trio.current_time() - start >= 0.3
    assert (await bot_api(fake, "getMe"))[0] == 200, "a fault lasts for the calls it was injected for"


# ---------------------------------------------------------------------- the connector: receiving


async def test_poll_turns_messages_and_presses_into_neutral_items(fake: FakeBotApi) -> None:
    platform = await started(fake)
    text = fake.user_says(ALICE, ALICE, "hello", user_name="alice")
    group = -1001234
    mention = fake.user_says(group, ALICE, "@fake_bot look", thread=7)
    photo = fake.user_sends_photo(ALICE, ALICE, b"p" * 500, caption="what is this")
    document = fake.user_sends_document(ALICE, ALICE, b"%PDF", file_name="spec.pdf", mime_type="application/pdf")
    batch = await platform.poll()
    items = list(batch.items)
    assert items[0] == Incoming(
        update_id=str(text["update_id"]),
        chat=str(ALICE),
        thread="",
        user=str(ALICE),
        user_name="alice",
        text="hello",
        is_group=False,
        mentioned=False,
        reply_to_bot=False,
        files=(),
    )
    assert items[1].is_group and items[1].mentioned and items[1].thread == "7" and items[1].chat == str(group)
    assert items[1].update_id == str(mention["update_id"])
    largest = photo["message"]["photo"][-1]
    assert items[2].text == "what is this"
    assert items[2].files == (IncomingFile(largest["file_id"], items[2].files[0].name, "image/jpeg", 500),)
    assert items[3].files[0].name == "spec.pdf" and items[3].files[0].media_type == "application/pdf"
    assert batch.position == str(document["update_id"] + 1)
    assert fake.calls_of("getUpdates")[-1].params["allowed_updates"] == ["message", "callback_query"]

    await platform.acknowledge(batch.position)
    [key] = await platform.send_text(str(ALICE), "", "Allow?", choices=(Choice("Allow", "allow:1"),))
    fake.user_presses(fake.messages[(ALICE, int(key))], "allow:1", user=ALICE)
    reply = fake.user_says(group, ALICE, "and this?", reply_to=fake.messages[(ALICE, int(key))])
    batch = await platform.poll()
    press, replied = batch.items
    assert isinstance(press, ButtonPress)
    assert (press.chat, press.user, press.message_key, press.data) == (str(ALICE), str(ALICE), key, "allow:1")
    assert press.user_name == "alice" and press.update_id.isdigit()
    assert isinstance(replied, Incoming) and replied.reply_to_bot and not replied.mentioned
    assert replied.update_id == str(reply["update_id"])
    await platform.answer_press(press, "Allowed")
    assert [text for _, _, text in fake.answers] == ["Allowed"]
    await platform.aclose()


async def test_nothing_pending_is_dropped_and_only_acknowledged_updates_are_confirmed(fake: FakeBotApi) -> None:
    waiting = [fake.user_says(ALICE, ALICE, f"sent while the bot was down {n}") for n in range(3)]
    platform = await started(fake, None)
    batch = await platform.poll()
    assert [item.update_id for item in batch.items] == [str(u["update_id"]) for u in waiting]
    again = await platform.poll()
    assert again.items == batch.items, "not acknowledged: the next poll brings the same updates"
    await platform.acknowledge(batch.position)
    fake.user_says(ALICE, ALICE, "later")
    assert [item.text for item in (await platform.poll()).items] == ["later"]
    await platform.aclose()  # "later" is not acknowledged: killed here, the bot sees it again after a restart

    restarted = await started(fake, batch.position)  # a restart, from the stored position
    after = await restarted.poll()
    assert [item.text for item in after.items] == ["later"]
    assert "offset" not in fake.calls_of("getUpdates")[0].params, "start(None) polls without an offset"
    assert all(int(call.params.get("offset", 0)) >= 0 for call in fake.calls_of("getUpdates"))
    await restarted.aclose()


async def test_a_poll_that_fails_says_whether_to_try_again(fake: FakeBotApi) -> None:
    platform = await started(fake)
    fake.fail_next("getUpdates", ApiFault(502, "Bad Gateway"))
    with pytest.raises(PlatformUnavailable, match="try again"):
        await platform.poll()
    fake.fail_next("getUpdates", ResetConnection())
    with pytest.raises(PlatformUnavailable):
        await platform.poll()
    fake.fail_next("getUpdates", too_many_requests(0.3))
    fake.user_says(ALICE, ALICE, "still here")
    start = trio.current_time()
    assert (await platform.poll()).items == (), "a 429 is waited out and the poll ends empty"
    assert trio.current_time() - start >= 0.3
    assert [item.text for item in (await platform.poll()).items] == ["still here"]
    await platform.aclose()


async def test_a_second_process_polling_the_same_bot_is_a_clear_conflict(fake: FakeBotApi) -> None:
    # The second polls without waiting (timeout 0): its poll ends the first's at once, and its own ends empty.
    first, second = await started(fake), await started(fake, poll_timeout=0)
    errors: list[BaseException] = []
    async with trio.open_nursery() as nursery:

        async def poll_first() -> None:
            try:
                await first.poll()
            except PlatformConflict as error:
                errors.append(error)

        nursery.start_soon(poll_first)
        await fake.wait_until(lambda: fake.calls_of("getUpdates"))
        await second.poll()
    assert len(errors) == 1
    assert "another process is polling this Telegram bot" in str(errors[0]) and TOKEN not in str(errors[0])
    await first.aclose()
    await second.aclose()


# ---------------------------------------------------------------------- the connector: sending


async def test_text_goes_as_entities_never_parse_mode_with_buttons_on_the_last_part(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake)
    choices = (Choice("Allow", "a"), Choice("Allow for this session", "s"), Choice("Deny", "d"))
    keys = await platform.send_text(str(ALICE), "", "**Run ls?**", choices=choices)
    [message] = fake.sent_to(ALICE)
    assert keys == [str(message.message_id)]
    assert message.text == "Run ls?" and message.entities == [{"type": "bold", "offset": 0, "length": 7}]
    assert [[b["text"] for b in row] for row in message.reply_markup["inline_keyboard"]] == [
        ["Allow"],
        ["Allow for this session"],
        ["Deny"],
    ]
    assert all("parse_mode" not in call.params for call in fake.calls)
    with pytest.raises(PlatformRefused, match="64"):
        await platform.send_text(str(ALICE), "", "?", choices=(Choice("Too much", "x" * 65),))
    await platform.aclose()


async def test_a_long_reply_is_split_within_4096_utf16_units_in_order(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake)
    paragraphs = [f"paragraph {n} \N{GRINNING FACE} " + "word " * 60 for n in range(40)]
    keys = await platform.send_text(str(ALICE), "", "\n\n".join(paragraphs))
    sent = fake.sent_to(ALICE)
    assert len(keys) == len(sent) > 2
    assert all(utf16_length(message.text) <= 4096 for message in sent)
    joined = "".join(message.text for message in sent)
    assert [joined.index(f"paragraph {n} ") for n in range(40)] == sorted(
        joined.index(f"paragraph {n} ") for n in range(40)
    )
    await platform.aclose()


async def test_a_10000_character_reply_with_code_goes_out_whole_with_its_code_blocks(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake)
    code = "\n".join(f"print({n})  # line {n:04d} of the listing" for n in range(300))
    markdown = "Here is the **script**:\n\n```python\n" + code + "\n```\n\nRun it with `python`."
    assert len(markdown) > 10_000
    keys = await platform.send_text(str(ALICE), "", markdown)
    sent = fake.sent_to(ALICE)
    assert len(keys) == len(sent) >= 3
    assert all(call.status == 200 for call in fake.calls_of("sendMessage")), "every part's entities were accepted"
    blocks = []
    for message in sent:
        encoded = message.text.encode("utf-16-le")
        for entity in message.entities:
            if entity["type"] == "pre":
                assert entity.get("language") == "python", "a code block cut in two is reopened with its language"
                start, end = 2 * entity["offset"], 2 * (entity["offset"] + entity["length"])
                blocks.append(encoded[start:end].decode("utf-16-le"))
    assert [line for block in blocks for line in block.splitlines() if line] == code.splitlines()
    await platform.aclose()


async def test_a_part_telegram_cannot_parse_is_sent_again_as_plain_text_once(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake)
    fake.fail_next("sendMessage", cannot_parse_entities())
    keys = await platform.send_text(str(ALICE), "", "**bold claim**")
    [message] = fake.sent_to(ALICE)
    assert keys == [str(message.message_id)] and message.text == "bold claim" and message.entities == []
    assert [call.status for call in fake.calls_of("sendMessage")] == [400, 200]
    await platform.aclose()


async def test_a_part_refused_as_too_long_is_sent_again_split_as_plain_text(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake)
    fake.fail_next("sendMessage", ApiFault(400, "Bad Request: message is too long"))
    keys = await platform.send_text(str(ALICE), "", "**first line**\nsecond line", choices=(Choice("OK", "ok"),))
    sent = fake.sent_to(ALICE)
    assert keys == [str(message.message_id) for message in sent] and sent
    assert "".join(message.text for message in sent).replace("\n", "") == "first linesecond line"
    assert sent[-1].reply_markup is not None, "the buttons stay on the last part"
    await platform.aclose()


async def test_a_429_storm_is_waited_out_as_retry_after_says_and_nothing_is_lost(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake)
    fake.fail_next("sendMessage", too_many_requests(0.3), count=2)  # fifteen times the chat's pace here
    keys = await platform.send_text(str(ALICE), "", "after the storm")
    calls = fake.calls_of("sendMessage")
    assert [call.status for call in calls] == [429, 429, 200]
    assert calls[1].time - calls[0].time >= 0.3 and calls[2].time - calls[1].time >= 0.3
    assert [m.text for m in fake.sent_to(ALICE)] == ["after the storm"] and len(keys) == 1
    await platform.aclose()


async def test_sends_keep_telegrams_pace_without_a_single_429(fake: FakeBotApi) -> None:
    # Telegram's limits with its second between two messages of a chat scaled down to 0.3 s, in the fake that
    # refuses a faster message with a 429 and in the bot's pacer alike (test_chat_pacing checks Telegram's own).
    fake.limits = FloodLimits(per_chat_interval=0.3)
    fake.user_says(ALICE, ALICE, "hi")
    fake.user_says(2002, 2002, "hi")
    platform = await started(fake, limits=PaceLimits(per_chat_interval=0.3, group_per_minute=20, global_per_second=30))
    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(platform.send_text, str(ALICE), "", f"message {n}")
        nursery.start_soon(platform.send_text, "2002", "", "other chat")
    assert [call.status for call in fake.calls_of("sendMessage")] == [200] * 4
    times = [message.time for message in fake.sent_to(ALICE)]  # arrivals: a request can arrive a little early
    assert all(later - earlier >= 0.3 - fake.limits.jitter for earlier, later in zip(times, times[1:], strict=False))
    await platform.aclose()


async def test_the_configs_pace_sets_the_time_between_two_messages_in_a_chat(fake: FakeBotApi, tmp_path: Path) -> None:
    fake.limits = FloodLimits(per_chat_interval=0.2)  # the fake refuses a faster message with a 429
    (tmp_path / "bot.yaml").write_text(
        f'telegram:\n  token: "{TOKEN}"\n  api_url: "{fake.api_url}"\n  profile: p\n  allow_users: [{ALICE}]\n'
        "  pace: {per_chat_secs: 0.2}\n"
    )
    section = load_chat_config(tmp_path / "bot.yaml").telegram
    assert section is not None
    fake.user_says(ALICE, ALICE, "hi")
    platform = TelegramPlatform(section, httpx.AsyncClient)
    await platform.start(None)
    for n in range(3):
        await platform.send_text(str(ALICE), "", f"message {n}")
    assert [call.status for call in fake.calls_of("sendMessage")] == [200] * 3
    times = [message.time for message in fake.sent_to(ALICE)]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert all(0.2 - fake.limits.jitter <= gap < 0.8 for gap in gaps), f"not Telegram's second, nor faster: {gaps}"
    await platform.aclose()


async def test_a_send_whose_caller_gave_up_is_still_delivered_in_order(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(
        fake, limits=PaceLimits(per_chat_interval=0.3, group_per_minute=1000, global_per_second=1000)
    )
    await platform.send_text(str(ALICE), "", "one")
    with trio.move_on_after(0.05):  # the caller stops waiting while "two" waits for the chat's pace
        await platform.send_text(str(ALICE), "", "two")
    with trio.fail_after(5):
        await platform.send_text(str(ALICE), "", "three")
    assert [message.text for message in fake.sent_to(ALICE)] == ["one", "two", "three"]
    await platform.aclose()


async def test_a_group_gets_the_group_limit_a_private_chat_does_not(fake: FakeBotApi) -> None:
    fake.limits = FloodLimits(per_chat_interval=0.0, group_per_minute=2, global_per_second=1000)
    group = -1009
    fake.user_says(group, ALICE, "hi")
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake, limits=PaceLimits(per_chat_interval=0.0, group_per_minute=2, global_per_second=1000))
    for n in range(3):
        await platform.send_text(str(ALICE), "", f"private {n}")
    for n in range(2):
        await platform.send_text(str(group), "", f"group {n}")
    with trio.move_on_after(0.2) as waited:  # a group's third message within the minute waits in the outbox
        await platform.send_text(str(group), "", "group 2")
    assert waited.cancelled_caught
    assert [m.text for m in fake.sent_to(group)] == ["group 0", "group 1"] and len(fake.sent_to(ALICE)) == 3
    assert all(call.status == 200 for call in fake.calls_of("sendMessage"))
    await platform.aclose()


async def test_edits_are_merged_and_an_unchanged_edit_is_not_sent(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(
        fake, limits=PaceLimits(per_chat_interval=0.1, group_per_minute=1000, global_per_second=1000)
    )
    [preview] = await platform.send_text(str(ALICE), "", "…")
    async with trio.open_nursery() as nursery:
        for n in range(1, 6):
            nursery.start_soon(platform.edit_text, str(ALICE), preview, f"partial {n}")
            await trio.sleep(0)
    message = fake.messages[(ALICE, int(preview))]
    assert message.text == "partial 5"
    assert len(fake.calls_of("editMessageText")) < 5, "pending edits of one message are merged"
    edits = len(fake.calls_of("editMessageText"))
    with trio.fail_after(5):  # an edit the pacer drops returns at once
        await platform.edit_text(str(ALICE), preview, "partial 5")
    assert len(fake.calls_of("editMessageText")) == edits, "an edit showing what the message shows is not sent"
    fake.fail_next("editMessageText", cannot_parse_entities())
    await platform.edit_text(str(ALICE), preview, "**done**")
    assert message.text == "done"
    await platform.delete(str(ALICE), preview)
    await platform.delete(str(ALICE), preview)  # already gone: not an error
    assert message.deleted
    await platform.aclose()


async def test_a_delete_makes_a_pending_edit_of_its_message_moot(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(
        fake, limits=PaceLimits(per_chat_interval=0.3, group_per_minute=1000, global_per_second=1000)
    )
    [preview] = await platform.send_text(str(ALICE), "", "…")
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(platform.edit_text, str(ALICE), preview, "partial")
            await trio.sleep(0)
            nursery.start_soon(platform.delete, str(ALICE), preview)
    assert fake.messages[(ALICE, int(preview))].deleted
    assert fake.calls_of("editMessageText") == [], "the edit of a message being deleted is not sent"
    await platform.aclose()


async def test_not_modified_is_not_an_error(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake)
    [key] = await platform.send_text(str(ALICE), "", "same")
    fake.fail_next("editMessageText", ApiFault(400, "Bad Request: message is not modified: x"))
    await platform.edit_text(str(ALICE), key, "other")  # Telegram says not modified: fine
    await platform.aclose()


async def test_typing_and_commands_only_set_when_they_changed(fake: FakeBotApi) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake)
    await platform.typing(str(ALICE), "")
    assert [(chat, action) for _, chat, action in fake.actions] == [(ALICE, "typing")]
    commands = (("new", "Forget this conversation"), ("cancel", "Cancel the running turn"))
    await platform.set_commands(commands)
    await platform.set_commands(commands)
    assert fake.set_commands_calls == 1
    await platform.set_commands((*commands, ("help", "What the bot does")))
    assert fake.set_commands_calls == 2 and [c["command"] for c in fake.commands] == ["new", "cancel", "help"]
    fake.fail_next("setMyCommands", too_many_requests(5))
    await platform.set_commands(commands)  # refused: logged, and the bot carries on (the commands work typed)
    await platform.aclose()


# ---------------------------------------------------------------------- the connector: files and the token


async def test_a_file_is_downloaded_under_a_safe_name_inside_the_directory(fake: FakeBotApi, tmp_path: Path) -> None:
    platform = await started(fake)
    fake.user_sends_document(ALICE, ALICE, b"secret plans", file_name="../../.bashrc", mime_type="text/plain")
    fake.user_sends_photo(ALICE, ALICE, b"\xff\xd8" + b"j" * 300)
    document, photo = (await platform.poll()).items
    assert isinstance(document, Incoming) and isinstance(photo, Incoming)
    path = Path(await platform.download(document.files[0], str(tmp_path)))
    again = Path(await platform.download(document.files[0], str(tmp_path)))
    picture = Path(await platform.download(photo.files[0], str(tmp_path)))
    assert path.parent == tmp_path and path.name == "bashrc" and path.read_bytes() == b"secret plans"
    assert again != path and again.parent == tmp_path, "a name already taken is not overwritten"
    assert picture.read_bytes() == b"\xff\xd8" + b"j" * 300
    assert all(TOKEN not in str(p) for p in (path, again, picture))
    fake.download_limit = 5
    with pytest.raises(PlatformRefused, match="20 MB") as refused:
        await platform.download(document.files[0], str(tmp_path))
    assert TOKEN not in str(refused.value)
    fake.download_limit, fake.file_paths = DOWNLOAD_LIMIT, False  # getFile's file_path is optional
    with pytest.raises(PlatformRefused, match="too large to download"):
        await platform.download(document.files[0], str(tmp_path))
    await platform.aclose()


async def test_files_go_out_as_photos_or_documents_within_the_limit(fake: FakeBotApi, tmp_path: Path) -> None:
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake)
    image, report, huge = tmp_path / "chart.png", tmp_path / "report.csv", tmp_path / "huge.bin"
    image.write_bytes(b"\x89PNG fake")
    report.write_text("a,b\n1,2\n")
    with huge.open("wb") as handle:
        handle.truncate(50 * 1024 * 1024 + 1)
    photo_key = await platform.send_file(str(ALICE), "", str(image), "chart.png", "image/png")
    document_key = await platform.send_file(str(ALICE), "", str(report), "report.csv", "text/csv")
    photo, document = fake.sent_to(ALICE)
    assert (photo_key, document_key) == (str(photo.message_id), str(document.message_id))
    assert photo.photo is not None and document.document is not None
    assert document.document["file_name"] == "report.csv"
    with pytest.raises(PlatformRefused, match="50 MB"):
        await platform.send_file(str(ALICE), "", str(huge), "huge.bin", "application/octet-stream")
    assert len(fake.sent_to(ALICE)) == 2
    await platform.aclose()


async def test_the_token_never_appears_in_logs_or_errors(fake: FakeBotApi, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fake.user_says(ALICE, ALICE, "hi")
    platform = await started(fake)
    await platform.send_text(str(ALICE), "", "logged?")
    await platform.poll()
    with pytest.raises(PlatformRefused) as wrong_token:
        await started(fake, token="999:not-the-right-one")
    fake.fail_next("getMe", ResetConnection())
    with pytest.raises(PlatformUnavailable) as reset:
        await started(fake)
    closed = trio.socket.socket()
    await closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    unreachable = TelegramPlatform(Settings(SecretStr(TOKEN), f"http://127.0.0.1:{port}"), httpx.AsyncClient)
    with pytest.raises(PlatformUnavailable) as nowhere:
        await unreachable.start(None)
    for error in (wrong_token.value, reset.value, nowhere.value):
        printed = "".join(traceback.format_exception_only(error)) + shown_causes(error)
        assert TOKEN not in printed and "999:not-the-right-one" not in printed
    assert "Unauthorized" in str(wrong_token.value)
    assert any("/bot<bot-token>/sendMessage" in record.getMessage() for record in caplog.records), (
        "httpx logs each request's URL, with the token written out"
    )
    assert all(TOKEN not in record.getMessage() for record in caplog.records)
    await platform.aclose()
    await unreachable.aclose()


async def test_replies_to_a_group_upgraded_to_a_supergroup_go_to_the_supergroup(fake: FakeBotApi) -> None:
    group, supergroup = -4001, -1004001
    fake.user_says(group, ALICE, "hello")
    fake.user_says(supergroup, ALICE, "hello again")  # Telegram's service message opens it; any message will do
    platform = await started(fake)
    upgraded = ApiFault(
        400, "Bad Request: group chat was upgraded to a supergroup chat", {"migrate_to_chat_id": supergroup}
    )
    fake.fail_next("sendMessage", upgraded)
    await platform.send_text(str(group), "", "the answer")
    await platform.send_text(str(group), "", "and the next")
    assert [message.text for message in fake.sent_to(supergroup)] == ["the answer", "and the next"]
    assert [call.params["chat_id"] for call in fake.calls if call.method == "sendMessage"] == [
        str(group),
        str(supergroup),
        str(supergroup),
    ]
    await platform.aclose()


async def test_a_server_dripping_its_answer_is_unavailable_once_the_call_is_over_its_time() -> None:
    """A server (or a proxy) sending a byte now and then never trips a timeout per read: the call's own deadline
    ends it, as Telegram being unavailable (which connect waits out and tries again)."""

    async def drip(stream: trio.SocketStream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        while True:
            await stream.send_all(b" ")
            await trio.sleep(0.05)  # the server's drip, well within any read timeout; nothing waits on it

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, drip, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        platform = TelegramPlatform(
            Settings(SecretStr(TOKEN), f"http://127.0.0.1:{port}"), chat_http_client, call_seconds=0.5
        )
        with trio.fail_after(5), pytest.raises(PlatformUnavailable, match="cannot be reached"):
            await platform.start(None)
        await platform.aclose()
        nursery.cancel_scope.cancel()


def test_the_fake_runs_as_a_process_and_prints_its_url() -> None:
    fake_script = Path(__file__).resolve().parent.parent / "tools" / "fakes" / "telegram_bot_api.py"
    process = subprocess.Popen([sys.executable, str(fake_script), "--token", TOKEN], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 10)
        assert ready, "the fake did not print its URL within 10 s"
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        answer = httpx.post(f"{url}/bot{TOKEN}/getMe", timeout=5).json()
        assert answer["ok"] and answer["result"]["is_bot"]
    finally:
        process.terminate()
        process.wait(timeout=10)


def shown_causes(error: BaseException) -> str:
    """The messages of the exceptions a traceback of `error` would show after it (its cause, or its context)."""
    shown = ""
    while (error := error.__cause__ or (None if error.__suppress_context__ else error.__context__)) is not None:
        shown += "".join(traceback.format_exception_only(error))
    return shown


def test_a_malformed_token_is_refused_before_any_call() -> None:
    with pytest.raises(PlatformRefused, match="BotFather"):
        TelegramPlatform(Settings(SecretStr("not a token"), "http://127.0.0.1:9"), httpx.AsyncClient)
