"""A fake Telegram Bot API on loopback, faithful to the official documentation (https://core.telegram.org/bots/api).

`running_fake_bot_api()` serves it in-process on trio, on a free port on 127.0.0.1, with a small HTTP/1.1 server
of its own (h11: keep-alive, Content-Length or chunked request bodies, an answer written at once), so that what a
bench measures through it is the bot's cost rather than a web framework's:

    async with running_fake_bot_api("123:secret") as fake:
        platform = TelegramPlatform(section_with(api_url=fake.api_url), httpx.AsyncClient)
        fake.user_says(chat=42, user=42, text="hello")
        await fake.wait_until(lambda: fake.sent_to(42), within=5)

`python tools/fakes/telegram_bot_api.py --token T [--port P]` runs it as a process (for the try commands).

What it does as Telegram does:
- `/bot<token>/<method>` takes a query string, a form, JSON or multipart/form-data; a wrong token is 401
  "Unauthorized", an unknown method 404 "Not Found"; every answer is `{"ok": true, "result": ...}` or
  `{"ok": false, "error_code": N, "description": "..."}` (with `parameters.retry_after` on a 429).
- `getUpdates`: an `offset` confirms every update with a smaller id, for good; `timeout` long-polls; `allowed_updates`
  is remembered until the next call that gives it; a getUpdates arriving while another waits ends the older with 409
  "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running".
- `sendMessage`/`editMessageText`: text of 1..4096 UTF-16 code units ("message is too long", "message text is
  empty"), `entities` checked against the text in UTF-16 ("can't parse entities: ..."; text sent with a `parse_mode` is
  taken as plain: a fault stands in for a parse failure), `reply_markup.inline_keyboard` with `callback_data` of
  1..64 bytes ("BUTTON_DATA_INVALID"); an edit to the same text and markup is "message is not modified".
- The documented flood limits, enforced: one message a second per chat, 20 a minute per group, 30 a second overall
  (sends and edits count; `FloodLimits`, with 50 ms of arrival jitter allowed in a chat); a call past them gets 429
  "Too Many Requests: retry after N", and so does every call into that chat (or any, for the overall limit) until N
  seconds have passed.
- `getFile` and `/file/bot<token>/<file_path>`: files the users sent; 20 MB download limit ("file is too big").
- `sendDocument`/`sendPhoto` multipart uploads: 50 MB (10 MB for a photo) else 413 "Request Entity Too Large".
- `deleteMessage`, `sendChatAction`, `answerCallbackQuery`, `setMyCommands`/`getMyCommands`, `getMe`.

The test side: `user_says`, `user_presses`, `user_sends_photo`, `user_sends_document` make updates;
`sent`, `edits`, `deletions`, `actions`, `answers`, `calls`, `set_commands_calls` record what the bot did (with the
trio clock's time; a call's is when its request head was complete); `fail_next(method, fault, count)` injects a
fault: an `ApiFault` (any error answer; see `too_many_requests`, `cannot_parse_entities`), `ResetConnection()` (the
answer's head and part of its body, then the connection drops) or `SlowDown(seconds)`; `hold(method, when)` stops the
next matching call where the test wants the bot killed (`Held.arrived` is set when it is there); `handed_out` lists
the update ids `getUpdates` answered with.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import functools
import itertools
import json
import math
import re
import secrets
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

import h11
import trio

MESSAGE_LIMIT = 4096  # UTF-16 code units of a message's text (1024 for a caption)
CAPTION_LIMIT = 1024
CALLBACK_DATA_LIMIT = 64  # bytes
DOWNLOAD_LIMIT = 20 * 1024 * 1024
UPLOAD_LIMIT = 50 * 1024 * 1024
PHOTO_UPLOAD_LIMIT = 10 * 1024 * 1024
CONFLICT = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are exactly the same "
    "as a current content and reply markup of the message"
)
ENTITY_TYPES = {
    "mention", "hashtag", "cashtag", "bot_command", "url", "email", "phone_number", "bold", "italic", "underline",
    "strikethrough", "spoiler", "blockquote", "expandable_blockquote", "code", "pre", "text_link", "text_mention",
    "custom_emoji",
}  # fmt: skip
CHAT_ACTIONS = {
    "typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice", "upload_document",
    "choose_sticker", "find_location", "record_video_note", "upload_video_note",
}  # fmt: skip
LIMITED_METHODS = {"sendMessage", "sendPhoto", "sendDocument", "editMessageText", "editMessageReplyMarkup"}
UPDATE_TYPES_BY_DEFAULT = None  # every type but chat_member, message_reaction and message_reaction_count


def utf16_length(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


@dataclass(frozen=True)
class FloodLimits:
    """The documented limits the fake enforces; tests that are not about pacing loosen them."""

    per_chat_interval: float = 1.0
    group_per_minute: int = 20
    global_per_second: int = 30
    # How much earlier than the interval a message may arrive: a bot paces the calls it makes, and a request that
    # left on time can arrive a little early after a slower one (a new connection). Telegram tolerates bursts.
    jitter: float = 0.05


@dataclass(frozen=True)
class ApiFault:
    """An error answer: `{"ok": false, "error_code": status, "description": description, "parameters": ...}`."""

    status: int
    description: str
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True)
class ResetConnection:
    """The connection drops in the middle of the answer; `after_effect`: the call took effect first."""

    after_effect: bool = False


@dataclass(frozen=True)
class SlowDown:
    """The answer comes `seconds` late."""

    seconds: float


Fault = ApiFault | ResetConnection | SlowDown


@dataclass
class Held:
    """A call held where the test stops the bot (see `FakeBotApi.hold`): `arrived` is set once the call is held;
    it then waits for `release` and drops the connection, as a server does when its client is gone.
    `after_effect`: the call takes effect (a message sent, an offset confirmed) before it is held."""

    method: str
    when: Callable[[dict[str, Any]], bool]
    after_effect: bool = False
    arrived: trio.Event = field(default_factory=trio.Event)
    release: trio.Event = field(default_factory=trio.Event)


def too_many_requests(retry_after: float) -> ApiFault:
    """Telegram's 429. Its `retry_after` is a whole number of seconds; a test that only needs a wait to be waited
    out gives a fraction of one (the bot reads it as a number), so that the wait it proves costs less."""
    return ApiFault(429, f"Too Many Requests: retry after {retry_after}", {"retry_after": retry_after})


def cannot_parse_entities(reason: str = "Can't find end of the entity starting at byte offset 0") -> ApiFault:
    return ApiFault(400, f"Bad Request: can't parse entities: {reason}")


@dataclass
class Call:
    """One call the bot made: the method, its parameters (files as their sizes), when, and the answer's status
    (0: the connection was dropped)."""

    method: str
    params: dict[str, Any]
    time: float
    status: int = 200


@dataclass
class Message:
    """A message in a chat, as the fake holds it; `history` is every (time, text) it has shown."""

    chat_id: int
    message_id: int
    text: str
    entities: list[dict[str, Any]]
    reply_markup: dict[str, Any] | None
    time: float
    from_bot: bool
    thread: int | None = None
    reply_to: int | None = None
    document: dict[str, Any] | None = None
    photo: list[dict[str, Any]] | None = None
    caption: str = ""
    deleted: bool = False
    history: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class StoredFile:
    file_id: str
    file_unique_id: str
    file_path: str
    data: bytes


class _Refused(Exception):
    def __init__(self, fault: ApiFault) -> None:
        super().__init__(fault.description)
        self.fault = fault


def _bad_request(reason: str) -> _Refused:
    return _Refused(ApiFault(400, f"Bad Request: {reason}"))


class FakeBotApi:
    """The server's state and the test side's API; `running_fake_bot_api` serves it."""

    def __init__(
        self, token: str = "123456:fake-token", *, username: str = "fake_bot", limits: FloodLimits | None = None
    ) -> None:
        self.token = token
        self.bot_user = {"id": int(token.split(":")[0]) if token.split(":")[0].isdigit() else 1, "is_bot": True}
        self.bot_user |= {"first_name": "Fake Bot", "username": username, "can_join_groups": True}
        self.limits = limits or FloodLimits()
        self.upload_limit = UPLOAD_LIMIT  # tests lower them rather than send 50 MB
        self.photo_upload_limit = PHOTO_UPLOAD_LIMIT
        self.download_limit = DOWNLOAD_LIMIT
        self.file_paths = True  # False: getFile answers without file_path, which the Bot API's docs call optional
        self.api_url = ""
        self.calls: list[Call] = []
        self.messages: dict[tuple[int, int], Message] = {}
        self.sent: list[Message] = []
        self.edits: list[tuple[float, Message, str]] = []  # (time, the message after the edit, its new text)
        self.deletions: list[tuple[float, int, int]] = []
        self.actions: list[tuple[float, int, str]] = []
        self.answers: list[tuple[float, str, str]] = []  # (time, callback_query_id, text)
        self.set_commands_calls = 0
        self.commands: list[dict[str, str]] = []
        self.files: dict[str, StoredFile] = {}
        self._updates: list[dict[str, Any]] = []
        self._next_update_id = itertools.count(1000)
        self._next_message_id: dict[int, itertools.count[int]] = defaultdict(lambda: itertools.count(1))
        self._group_chats: set[int] = set()
        self._chats: set[int] = set()
        self._upgraded: dict[int, int] = {}  # a group -> the supergroup it became
        self._callback_queries: dict[str, bool] = {}  # id -> answered
        self._allowed_updates: list[str] | None = UPDATE_TYPES_BY_DEFAULT
        self._poll_generation = 0
        self._changed = trio.Event()  # set (and replaced) on every change: long polls and `wait_until` wake on it
        self._faults: dict[str, deque[Fault]] = defaultdict(deque)
        self._holds: list[Held] = []
        self.handed_out: list[int] = []  # the update ids getUpdates answered with, in order
        self._sends_per_chat: dict[int, deque[float]] = defaultdict(deque)
        self._sends_overall: deque[float] = deque()
        self._penalty_until: dict[int | None, float] = {}  # chat (None: every chat) -> the end of its 429 wait

    # ------------------------------------------------------------------ the test side

    def user_says(
        self,
        chat: int,
        user: int,
        text: str,
        *,
        user_name: str = "Alice",
        thread: int | None = None,
        reply_to: Message | None = None,
        group: bool | None = None,
    ) -> dict[str, Any]:
        """A user's text message in `chat` (a negative id is a group, as in Telegram); returns the update.
        `@mentions` and `/commands` get their entities, as Telegram adds them."""
        entities = _automatic_entities(text)
        message = self._incoming_message(chat, user, user_name, thread, reply_to, group) | {"text": text}
        if entities:
            message["entities"] = entities
        return self._add_update({"message": message})

    def group_upgraded(self, group: int, supergroup: int, *, user: int, user_name: str = "Alice") -> None:
        """`group` becomes `supergroup`, as Telegram does it: a service message in each (`migrate_to_chat_id` in the
        group, `migrate_from_chat_id` in the supergroup), and from then on every call to the group is answered 400
        with the supergroup's id."""
        for chat, service in (
            (group, {"migrate_to_chat_id": supergroup}),
            (supergroup, {"migrate_from_chat_id": group}),
        ):
            self._add_update({"message": self._incoming_message(chat, user, user_name, None, None, True) | service})
        self._upgraded[group] = supergroup

    def user_sends_photo(
        self, chat: int, user: int, data: bytes, *, caption: str = "", user_name: str = "Alice", group: bool = False
    ) -> dict[str, Any]:
        """A photo: Telegram offers it in several sizes, the original one last."""
        sizes = []
        for scale, payload in ((90, data[: max(1, len(data) // 10)]), (800, data)):
            stored = self._store_file(payload, "photos", "jpg")
            sizes.append(
                {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id, "width": scale}
                | {"height": scale, "file_size": len(payload)}
            )
        message = self._incoming_message(chat, user, user_name, None, None, group) | {"photo": sizes}
        if caption:
            message["caption"] = caption
        return self._add_update({"message": message})

    def user_sends_document(
        self,
        chat: int,
        user: int,
        data: bytes,
        *,
        file_name: str,
        mime_type: str = "application/octet-stream",
        caption: str = "",
        user_name: str = "Alice",
        group: bool = False,
    ) -> dict[str, Any]:
        stored = self._store_file(data, "documents", file_name.rpartition(".")[2] or "bin")
        document = {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id, "file_name": file_name}
        document |= {"mime_type": mime_type, "file_size": len(data)}
        message = self._incoming_message(chat, user, user_name, None, None, group) | {"document": document}
        if caption:
            message["caption"] = caption
        return self._add_update({"message": message})

    def user_presses(self, message: Message, data: str, *, user: int, user_name: str = "Alice") -> dict[str, Any]:
        """A press on the inline button of `message` whose callback_data is `data` (it must be one of its buttons)."""
        buttons = [
            button
            for row in (message.reply_markup or {}).get("inline_keyboard", [])
            for button in row
            if button.get("callback_data") == data
        ]
        assert buttons, f"message {message.message_id} has no button with callback_data {data!r}"
        query_id = str(secrets.randbits(63))
        self._callback_queries[query_id] = False
        query = {
            "id": query_id,
            "from": _user(user, user_name),
            "message": self._as_json(message),
            "chat_instance": str(message.chat_id),
            "data": data,
        }
        return self._add_update({"callback_query": query})

    def fail_next(self, method: str, fault: Fault, count: int = 1) -> None:
        """The next `count` calls of `method` ("*": any method) meet `fault` instead of their normal answer."""
        self._faults[method].extend([fault] * count)

    def hold(
        self, method: str, when: Callable[[dict[str, Any]], bool] = lambda params: True, *, after_effect: bool = False
    ) -> Held:
        """Hold the next call of `method` whose parameters satisfy `when`: the bot waits for its answer until the
        test kills it (then `release` it). `after_effect`: the call takes effect first."""
        held = Held(method, when, after_effect)
        self._holds.append(held)
        return held

    def sent_to(self, chat: int) -> list[Message]:
        """The messages the bot sent into `chat`, in order (deleted ones included; see `.deleted`)."""
        return [message for message in self.sent if message.chat_id == chat]

    def visible(self, chat: int) -> list[Message]:
        """The bot's messages still in `chat`."""
        return [message for message in self.sent_to(chat) if not message.deleted]

    def calls_of(self, method: str) -> list[Call]:
        return [call for call in self.calls if call.method == method]

    def pending_updates(self) -> int:
        return len(self._updates)

    async def wait_until(self, condition: Callable[[], object], within: float = 5.0) -> None:
        """Return as soon as `condition()` holds (checked after each of the bot's calls); fail after `within` s."""
        with trio.move_on_after(within) as scope:
            while not condition():
                await self._changed.wait()
        if scope.cancelled_caught:
            raise AssertionError(f"the fake Bot API did not see that within {within} s; calls: {self._summary()}")

    # ------------------------------------------------------------------ the server side

    async def handle(
        self,
        method: str,
        params: dict[str, Any],
        files: dict[str, tuple[str, str, bytes]],
        *,
        arrived: float | None = None,
    ) -> Answer:
        """One Bot API call, after its token was checked; `arrived`: when its request did (by default, now)."""
        arrived = trio.current_time() if arrived is None else arrived
        call = Call(method, params | {name: f"<{len(data)} bytes>" for name, (_, _, data) in files.items()}, arrived)
        self.calls.append(call)
        self._poke()  # a test waiting for a call sees it arrive, even one a fault holds up
        held = self._next_hold(method, params)
        if held is not None:
            return await self._held_call(held, call, params, files)
        fault = self._next_fault(method)
        try:
            if isinstance(fault, SlowDown):
                await trio.sleep(fault.seconds)
            if isinstance(fault, ApiFault):
                raise _Refused(fault)
            if isinstance(fault, ResetConnection) and not fault.after_effect:
                call.status = 0
                return Reset()
            result = await self._method(method, params, files)
            if isinstance(fault, ResetConnection):
                call.status = 0  # it took effect, but the bot never hears so
                return Reset()
            return Ok(result)
        except _Refused as refused:
            call.status = refused.fault.status
            return Err(refused.fault)
        finally:
            self._poke()

    async def _held_call(
        self, held: Held, call: Call, params: dict[str, Any], files: dict[str, tuple[str, str, bytes]]
    ) -> Answer:
        call.status = 0  # the bot never hears an answer
        try:
            if held.after_effect:
                await self._method(held.method, params, files)
        finally:
            held.arrived.set()
            self._poke()
        await held.release.wait()
        return Reset()

    def _next_hold(self, method: str, params: dict[str, Any]) -> Held | None:
        for held in self._holds:
            if held.method == method and held.when(params):
                self._holds.remove(held)
                return held
        return None

    async def _method(self, method: str, params: dict[str, Any], files: dict[str, tuple[str, str, bytes]]) -> Any:
        if method == "getMe":
            return self.bot_user
        if method == "getUpdates":
            return await self._get_updates(params)
        if "chat_id" in params and (supergroup := self._upgraded.get(_int(params, "chat_id"))) is not None:
            reason = "Bad Request: group chat was upgraded to a supergroup chat"
            raise _Refused(ApiFault(400, reason, {"migrate_to_chat_id": supergroup}))
        if method in LIMITED_METHODS:
            self._check_flood(_int(params, "chat_id"))
        handler = {
            "sendMessage": self._send_message,
            "editMessageText": self._edit_message_text,
            "deleteMessage": self._delete_message,
            "sendChatAction": self._send_chat_action,
            "answerCallbackQuery": self._answer_callback_query,
            "setMyCommands": self._set_my_commands,
            "getMyCommands": lambda params: self.commands,
            "getFile": self._get_file,
            "deleteWebhook": lambda params: True,
        }.get(method)
        if handler is not None:
            result = handler(params)
        elif method in ("sendDocument", "sendPhoto"):
            result = self._send_file(method, params, files)
        else:
            raise _Refused(ApiFault(404, "Not Found"))
        if method in LIMITED_METHODS:
            self._count_send(_int(params, "chat_id"))
        return result

    async def _get_updates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        self._poll_generation += 1
        generation = self._poll_generation
        self._poke()  # an older poll still waiting ends with 409
        offset = _int(params, "offset", 0)
        if offset > 0:
            self._updates = [update for update in self._updates if update["update_id"] >= offset]
        elif offset < 0:
            self._updates = self._updates[offset:]
        if "allowed_updates" in params:
            allowed = params["allowed_updates"]
            allowed = json.loads(allowed) if isinstance(allowed, str) else allowed
            self._allowed_updates = list(allowed) or None
        limit = min(max(_int(params, "limit", 100), 1), 100)
        timeout = max(_int(params, "timeout", 0), 0)
        with trio.move_on_after(timeout):
            while not self._deliverable():
                await self._changed.wait()
                if generation != self._poll_generation:
                    raise _Refused(ApiFault(409, CONFLICT))
        if generation != self._poll_generation:
            raise _Refused(ApiFault(409, CONFLICT))
        answer = self._deliverable()[:limit]
        self.handed_out.extend(update["update_id"] for update in answer)
        return answer

    def _deliverable(self) -> list[dict[str, Any]]:
        default_excluded = {"chat_member", "message_reaction", "message_reaction_count"}
        return [
            update
            for update in self._updates
            if (kind := next(key for key in update if key != "update_id"))
            and (kind in self._allowed_updates if self._allowed_updates is not None else kind not in default_excluded)
        ]

    def _send_message(self, params: dict[str, Any]) -> dict[str, Any]:
        chat = self._known_chat(params)
        text = str(params.get("text", ""))
        entities = self._checked_text(text, params, MESSAGE_LIMIT, empty="message text is empty")
        markup = self._checked_markup(params)
        message = self._new_bot_message(chat, text, entities, markup, params)
        return self._as_json(message)

    def _edit_message_text(self, params: dict[str, Any]) -> dict[str, Any]:
        chat = self._known_chat(params)
        message = self.messages.get((chat, _int(params, "message_id")))
        if message is None or message.deleted:
            raise _bad_request("message to edit not found")
        text = str(params.get("text", ""))
        entities = self._checked_text(text, params, MESSAGE_LIMIT, empty="message text is empty")
        markup = self._checked_markup(params)
        if text == message.text and entities == message.entities and markup == message.reply_markup:
            raise _bad_request(NOT_MODIFIED.removeprefix("Bad Request: "))
        now = trio.current_time()
        message.text, message.entities, message.reply_markup = text, entities, markup
        message.history.append((now, text))
        self.edits.append((now, message, text))
        return self._as_json(message)

    def _delete_message(self, params: dict[str, Any]) -> bool:
        chat = self._known_chat(params)
        message = self.messages.get((chat, _int(params, "message_id")))
        if message is None or message.deleted:
            raise _bad_request("message to delete not found")
        message.deleted = True
        self.deletions.append((trio.current_time(), chat, message.message_id))
        return True

    def _send_chat_action(self, params: dict[str, Any]) -> bool:
        chat = self._known_chat(params)
        action = str(params.get("action", ""))
        if action not in CHAT_ACTIONS:
            raise _bad_request("wrong parameter action in request")
        self.actions.append((trio.current_time(), chat, action))
        return True

    def _answer_callback_query(self, params: dict[str, Any]) -> bool:
        query_id = str(params.get("callback_query_id", ""))
        if self._callback_queries.get(query_id, True):
            raise _bad_request("query is too old and response timeout expired or query ID is invalid")
        self._callback_queries[query_id] = True
        self.answers.append((trio.current_time(), query_id, str(params.get("text", ""))))
        return True

    def _set_my_commands(self, params: dict[str, Any]) -> bool:
        commands = params.get("commands", [])
        commands = json.loads(commands) if isinstance(commands, str) else commands
        for command in commands:
            name, description = command.get("command", ""), command.get("description", "")
            if not (1 <= len(name) <= 32 and all(c.islower() or c.isdigit() or c == "_" for c in name)):
                raise _bad_request("BOT_COMMAND_INVALID")
            if not 1 <= len(description) <= 256:
                raise _bad_request("BOT_COMMAND_DESCRIPTION_INVALID")
        self.set_commands_calls += 1
        self.commands = [{"command": c["command"], "description": c["description"]} for c in commands]
        return True

    def _get_file(self, params: dict[str, Any]) -> dict[str, Any]:
        stored = self.files.get(str(params.get("file_id", "")))
        if stored is None:
            raise _bad_request("invalid file_id")
        if len(stored.data) > self.download_limit:
            raise _bad_request("file is too big")
        return {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id, "file_size": len(stored.data)} | (
            {"file_path": stored.file_path} if self.file_paths else {}
        )

    def _send_file(self, method: str, params: dict[str, Any], files: dict[str, tuple[str, str, bytes]]) -> Any:
        chat = self._known_chat(params)
        field_name = "photo" if method == "sendPhoto" else "document"
        if field_name not in files:
            raise _bad_request(f"there is no {field_name} in the request")
        file_name, media_type, data = files[field_name]
        if len(data) > (self.photo_upload_limit if method == "sendPhoto" else self.upload_limit):
            raise _Refused(ApiFault(413, "Request Entity Too Large"))
        caption = str(params.get("caption", ""))
        entities = self._checked_text(caption, params, CAPTION_LIMIT, empty=None, field_name="caption")
        message = self._new_bot_message(chat, "", [], self._checked_markup(params), params)
        message.caption, message.entities = caption, entities
        stored = self._store_file(data, "sent", file_name.rpartition(".")[2] or "bin")
        described = {"file_id": stored.file_id, "file_unique_id": stored.file_unique_id, "file_size": len(data)}
        if method == "sendPhoto":
            message.photo = [described | {"width": 800, "height": 800}]
        else:
            message.document = described | {"file_name": file_name, "mime_type": media_type}
        return self._as_json(message)

    def download(self, file_path: str) -> bytes | None:
        stored = next((f for f in self.files.values() if f.file_path == file_path), None)
        return None if stored is None else stored.data

    # ------------------------------------------------------------------ rules

    def _checked_text(
        self, text: str, params: dict[str, Any], limit: int, *, empty: str | None, field_name: str = "text"
    ) -> list[dict[str, Any]]:
        if empty is not None and not text.strip():
            raise _bad_request(empty)
        length = utf16_length(text)
        if length > limit:
            raise _bad_request("message is too long" if field_name == "text" else "message caption is too long")
        if params.get("parse_mode"):
            return []  # the fake renders no Markdown or HTML; a fault stands in for a parse failure
        raw = params.get("entities" if field_name == "text" else "caption_entities") or []
        entities = json.loads(raw) if isinstance(raw, str) else raw
        for entity in entities:
            kind, offset, size = entity.get("type"), entity.get("offset"), entity.get("length")
            if kind not in ENTITY_TYPES:
                raise _bad_request(f"can't parse entities: unsupported entity type {kind!r}")
            if not isinstance(offset, int) or not isinstance(size, int) or offset < 0 or size <= 0:
                raise _bad_request("can't parse entities: entity offset or length is not a non-negative integer")
            if offset + size > length:
                raise _bad_request(
                    f"can't parse entities: entity ending at UTF-16 offset {offset + size} is beyond the text's end"
                )
            if kind == "text_link" and not entity.get("url"):
                raise _bad_request("can't parse entities: text_link entity has no url")
            if kind == "pre" and not isinstance(entity.get("language", ""), str):
                raise _bad_request("can't parse entities: pre entity's language is not a string")
        return [dict(entity) for entity in entities]

    def _checked_markup(self, params: dict[str, Any]) -> dict[str, Any] | None:
        raw = params.get("reply_markup")
        if raw is None:
            return None
        markup = json.loads(raw) if isinstance(raw, str) else raw
        for row in markup.get("inline_keyboard", []):
            for button in row:
                if not button.get("text"):
                    raise _bad_request("BUTTON_TEXT_INVALID")
                data = button.get("callback_data")
                if data is not None and not 1 <= len(str(data).encode()) <= CALLBACK_DATA_LIMIT:
                    raise _bad_request("BUTTON_DATA_INVALID")
        return dict(markup)

    def _check_flood(self, chat: int) -> None:
        now = trio.current_time()
        for scope in (None, chat):
            if (until := self._penalty_until.get(scope, 0.0)) > now:
                raise _Refused(too_many_requests(math.ceil(until - now)))
        limits = self.limits
        overall = self._sends_overall
        while overall and overall[0] <= now - 1.0:
            overall.popleft()
        if len(overall) >= limits.global_per_second:
            self._penalise(None, overall[0] + 1.0 - now, now)
        in_chat = self._sends_per_chat[chat]
        if in_chat and now - in_chat[-1] < limits.per_chat_interval - limits.jitter:
            self._penalise(chat, in_chat[-1] + limits.per_chat_interval - now, now)
        if chat in self._group_chats:
            recent = [time for time in in_chat if time > now - 60.0]
            if len(recent) >= limits.group_per_minute:
                self._penalise(chat, recent[0] + 60.0 - now, now)

    def _penalise(self, scope: int | None, seconds: float, now: float) -> None:
        retry_after = max(1, math.ceil(seconds))
        self._penalty_until[scope] = now + retry_after
        raise _Refused(too_many_requests(retry_after))

    def _count_send(self, chat: int) -> None:
        now = trio.current_time()
        self._sends_overall.append(now)
        in_chat = self._sends_per_chat[chat]
        in_chat.append(now)
        while len(in_chat) > max(self.limits.group_per_minute, 1) and in_chat[0] < now - 60.0:
            in_chat.popleft()

    def _next_fault(self, method: str) -> Fault | None:
        for key in (method, "*"):
            if self._faults[key]:
                return self._faults[key].popleft()
        return None

    # ------------------------------------------------------------------ helpers

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _add_update(self, update: dict[str, Any]) -> dict[str, Any]:
        update = {"update_id": next(self._next_update_id)} | update
        self._updates.append(update)
        self._poke()
        return update

    def _incoming_message(
        self,
        chat: int,
        user: int,
        user_name: str,
        thread: int | None,
        reply_to: Message | None,
        group: bool | None,
    ) -> dict[str, Any]:
        is_group = chat < 0 if group is None else group
        self._chats.add(chat)
        if is_group:
            self._group_chats.add(chat)
        message_id = next(self._next_message_id[chat])
        stored = Message(chat, message_id, "", [], None, trio.current_time(), from_bot=False, thread=thread)
        self.messages[(chat, message_id)] = stored
        chat_json: dict[str, Any] = {"id": chat, "type": "supergroup", "title": "Group"} if is_group else {"id": chat}
        if not is_group:
            chat_json |= {"type": "private", "first_name": user_name}
        message: dict[str, Any] = {
            "message_id": message_id,
            "from": _user(user, user_name),
            "chat": chat_json,
            "date": 1_700_000_000 + message_id,
        }
        if thread is not None:
            message |= {"message_thread_id": thread, "is_topic_message": True}
        if reply_to is not None:
            message["reply_to_message"] = self._as_json(reply_to)
        return message

    def _new_bot_message(
        self,
        chat: int,
        text: str,
        entities: list[dict[str, Any]],
        markup: dict[str, Any] | None,
        params: dict[str, Any],
    ) -> Message:
        now = trio.current_time()
        reply_to = params.get("reply_to_message_id")
        if reply_to is None and params.get("reply_parameters"):
            raw = params["reply_parameters"]
            reply_to = (json.loads(raw) if isinstance(raw, str) else raw).get("message_id")
        thread = params.get("message_thread_id")
        message = Message(
            chat,
            next(self._next_message_id[chat]),
            text,
            entities,
            markup,
            now,
            from_bot=True,
            thread=int(thread) if thread is not None else None,
            reply_to=int(reply_to) if reply_to is not None else None,
            history=[(now, text)],
        )
        self.messages[(chat, message.message_id)] = message
        self.sent.append(message)
        return message

    def _known_chat(self, params: dict[str, Any]) -> int:
        chat = _int(params, "chat_id")
        if chat not in self._chats:
            raise _bad_request("chat not found")
        return chat

    def _store_file(self, data: bytes, folder: str, extension: str) -> StoredFile:
        number = len(self.files) + 1
        stored = StoredFile(
            file_id=f"FILE{number}-{secrets.token_hex(8)}",
            file_unique_id=f"U{number}",
            file_path=f"{folder}/file_{number}.{extension}",
            data=data,
        )
        self.files[stored.file_id] = stored
        return stored

    def _as_json(self, message: Message) -> dict[str, Any]:
        sender = self.bot_user if message.from_bot else _user(message.chat_id, "Alice")
        is_group = message.chat_id in self._group_chats
        result: dict[str, Any] = {
            "message_id": message.message_id,
            "from": {key: sender[key] for key in ("id", "is_bot", "first_name", "username") if key in sender},
            "chat": {"id": message.chat_id, "type": "supergroup" if is_group else "private"},
            "date": 1_700_000_000 + message.message_id,
        }
        if message.text:
            result["text"] = message.text
            if message.entities:
                result["entities"] = message.entities
        if message.caption:
            result["caption"] = message.caption
        if message.thread is not None:
            result["message_thread_id"] = message.thread
        if message.reply_markup is not None:
            result["reply_markup"] = message.reply_markup
        if message.document is not None:
            result["document"] = message.document
        if message.photo is not None:
            result["photo"] = message.photo
        return result

    def _summary(self) -> str:
        return ", ".join(f"{call.method}={call.status}" for call in self.calls[-20:]) or "none"


@dataclass(frozen=True)
class Ok:
    result: Any


@dataclass(frozen=True)
class Err:
    fault: ApiFault


@dataclass(frozen=True)
class Reset:
    pass


Answer = Ok | Err | Reset


def _user(user: int, name: str) -> dict[str, Any]:
    return {"id": user, "is_bot": False, "first_name": name, "username": name.lower()}


def _int(params: dict[str, Any], name: str, default: int | None = None) -> int:
    value = params.get(name, default)
    if value is None:
        raise _bad_request(f"{name} is empty" if name != "chat_id" else "chat_id is empty")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _bad_request(f"invalid {name} specified") from None


def _automatic_entities(text: str) -> list[dict[str, Any]]:
    """The `mention` and `bot_command` entities Telegram adds to a user's text, offsets in UTF-16."""
    entities = []
    position = 0
    for word in text.split(" "):
        stripped = word.rstrip("\n")
        if len(stripped) > 1 and stripped[0] in "@/":
            kind = "mention" if stripped[0] == "@" else "bot_command"
            if kind == "mention" or position == 0:
                entities.append(
                    {"type": kind, "offset": utf16_length(text[:position]), "length": utf16_length(stripped)}
                )
        position += len(word) + 1
    return entities


# ---------------------------------------------------------------------- HTTP
# A small HTTP/1.1 server of its own, h11 over trio: the fake stands in for Telegram's servers, whose cost is not the
# bridge's, and a general-purpose stack (hypercorn and Starlette) cost ~1 ms a request before a handler saw it.

RECEIVE_SIZE = 64 * 1024
API_PATH = re.compile(r"/bot([^/]+)/([^/]+)")
FILE_PATH = re.compile(r"/file/bot([^/]+)/(.*)")
HALF_ANSWER = b'{"ok": tr'  # of the 1000 bytes a reset's answer promises


@dataclass(frozen=True)
class HttpRequest:
    """An HTTP request as the fake routes it; `arrived`: the trio clock when its head was complete."""

    verb: str
    path: str
    query: str
    content_type: str
    body: bytes
    arrived: float


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str = "application/json"


def _json_response(status: int, body: dict[str, Any]) -> HttpResponse:
    return HttpResponse(status, json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())


def _error_response(status: int, description: str) -> HttpResponse:
    return _json_response(status, {"ok": False, "error_code": status, "description": description})


async def _serve_connection(fake: FakeBotApi, stream: trio.SocketStream) -> None:
    """HTTP/1.1 on one connection: its requests one after the other (keep-alive), each answered once."""
    connection = h11.Connection(h11.SERVER)
    try:
        while (request := await _receive_request(connection, stream)) is not None:
            response = await _answer(fake, request)
            if response is None:
                head = connection.send(h11.Response(status_code=200, headers=[("content-length", "1000")]))
                await stream.send_all(head + _sent(connection, h11.Data(data=HALF_ANSWER)))
                return  # and the connection drops: what a reset looks like to the client
            await stream.send_all(_encoded(connection, response))
            if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                return  # `Connection: close`, or HTTP/1.0
            connection.start_next_cycle()
    except h11.RemoteProtocolError as err:
        if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # no answer begun: there is room for a 400
            refusal = _error_response(err.error_status_hint, f"Bad Request: {err}")
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(_encoded(connection, refusal))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the client went away: nobody is left to answer
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _receive_request(connection: h11.Connection, stream: trio.SocketStream) -> HttpRequest | None:
    """The connection's next request, its body read (Content-Length or chunked); None once the client closed it."""
    head = await _next_event(connection, stream)
    if not isinstance(head, h11.Request):
        return None
    arrived = trio.current_time()
    if connection.they_are_waiting_for_100_continue:
        await stream.send_all(_sent(connection, h11.InformationalResponse(status_code=100, headers=[])))
    body = bytearray()
    while isinstance(event := await _next_event(connection, stream), h11.Data):
        body += event.data
    path, _, query = head.target.decode("ascii").partition("?")
    content_type = next((value.decode("latin-1") for name, value in head.headers if name == b"content-type"), "")
    return HttpRequest(head.method.decode("ascii"), unquote(path), query, content_type, bytes(body), arrived)


async def _next_event(connection: h11.Connection, stream: trio.SocketStream) -> object:
    """h11's next event, reading from the client as it needs (a connection closed mid-request is a protocol error)."""
    while (event := connection.next_event()) is h11.NEED_DATA:
        connection.receive_data(await stream.receive_some(RECEIVE_SIZE))
    return event


def _sent(connection: h11.Connection, event: h11.Response | h11.InformationalResponse | h11.Data) -> bytes:
    data = connection.send(event)
    assert data is not None  # h11 has bytes to send for every event but ConnectionClosed
    return data


def _encoded(connection: h11.Connection, response: HttpResponse) -> bytes:
    """A whole response, to be written in one `send_all`."""
    headers = [("content-type", response.content_type), ("content-length", str(len(response.body)))]
    head = _sent(connection, h11.Response(status_code=response.status, headers=headers))
    return head + _sent(connection, h11.Data(data=response.body)) + (connection.send(h11.EndOfMessage()) or b"")


async def _answer(fake: FakeBotApi, request: HttpRequest) -> HttpResponse | None:
    """The fake's answer to one request; None: drop the connection halfway through the answer (an injected reset)."""
    try:
        return await _route(fake, request)
    except Exception as err:  # a bug in the fake, or a body it cannot read: the bot meets a server error
        return _error_response(500, f"Internal Server Error: the fake Bot API failed with {type(err).__name__}")


async def _route(fake: FakeBotApi, request: HttpRequest) -> HttpResponse | None:
    if request.verb in ("GET", "POST") and (api := API_PATH.fullmatch(request.path)):
        token, method = api.groups()
        if token != fake.token:
            return _error_response(401, "Unauthorized")
        params, files = _parameters(request)
        answer = await fake.handle(method, params, files, arrived=request.arrived)
        if isinstance(answer, Ok):
            return _json_response(200, {"ok": True, "result": answer.result})
        if isinstance(answer, Err):
            body: dict[str, Any] = {"ok": False, "error_code": answer.fault.status}
            body["description"] = answer.fault.description
            if answer.fault.parameters:
                body["parameters"] = answer.fault.parameters
            return _json_response(answer.fault.status, body)
        return None
    if request.verb == "GET" and (download := FILE_PATH.fullmatch(request.path)):
        token, file_path = download.groups()
        if token != fake.token:
            return _error_response(401, "Unauthorized")
        data = fake.download(file_path)
        if data is None:
            return _error_response(404, "Not Found")
        return HttpResponse(200, data, "application/octet-stream")
    return _error_response(404, "Not Found")


def _parameters(request: HttpRequest) -> tuple[dict[str, Any], dict[str, tuple[str, str, bytes]]]:
    """A Bot API call's parameters from its query string and body, as Telegram takes them."""
    params: dict[str, Any] = dict(parse_qsl(request.query, keep_blank_values=True))
    files: dict[str, tuple[str, str, bytes]] = {}
    content_type, body = request.content_type, request.body
    if content_type.startswith("application/json") and body:
        params |= json.loads(body)
    elif content_type.startswith("application/x-www-form-urlencoded"):
        params |= dict(parse_qsl(body.decode()))
    elif content_type.startswith("multipart/form-data"):
        head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
        parsed = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
        for part in parsed.iter_parts():
            name = part.get_param("name", header="content-disposition")
            file_name = part.get_filename()
            data = part.get_payload(decode=True) or b""
            if file_name is not None:
                files[str(name)] = (file_name, part.get_content_type(), data)
            else:
                params[str(name)] = data.decode()
    return params, files


@asynccontextmanager
async def running_fake_bot_api(
    token: str = "123456:fake-token", *, username: str = "fake_bot", limits: FloodLimits | None = None, port: int = 0
) -> AsyncIterator[FakeBotApi]:
    """Serve a `FakeBotApi` on 127.0.0.1 for the block; `fake.api_url` is what a bot's `api_url` is set to."""
    fake = FakeBotApi(token, username=username, limits=limits)
    listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    fake.api_url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, functools.partial(_serve_connection, fake), listeners)
        try:
            yield fake
        finally:
            nursery.cancel_scope.cancel()  # the calls still open (long polls, held calls) end with the block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--token", default="123456:fake-token")
    parser.add_argument("--port", type=int, default=0)
    arguments = parser.parse_args()

    async def serve_forever() -> None:
        async with running_fake_bot_api(arguments.token, port=arguments.port) as fake:
            print(fake.api_url, flush=True)
            await trio.sleep_forever()

    trio.run(serve_forever)


if __name__ == "__main__":
    main()
