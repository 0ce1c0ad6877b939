"""The Telegram connector: the chat `Platform` over the Bot API, with long polling (docs/chat-telegram.md).

Messages go out as text with message entities (never `parse_mode`, so nothing needs escaping), rendered and split by
`bridge.chat.markup` and paced by `bridge.chat.pacing`: a 429 waits its `retry_after` in the pacer and the call is
made again; a part Telegram cannot parse is sent again as plain text. Updates are confirmed to Telegram (the next
getUpdates' `offset`) only when `acknowledge` is called, so nothing pending is ever dropped. The bot token is in the
URL of every call: it never appears in a log line, an exception or a returned path (httpx's request log is redacted).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import httpx
import trio
from pydantic import SecretStr

from ..errors import ChatError, PlatformConflict, PlatformRefused, PlatformUnavailable
from ..log import get_logger
from .config import Pace
from .http_transport import whole_request_within
from .markup import plain_parts, telegram_parts
from .pacing import TELEGRAM_LIMITS, Delete, Edit, PaceLimits, Pacer, Send
from .platform import Batch, ButtonPress, Choice, Delivery, Incoming, IncomingFile

MESSAGE_LIMIT = 4096  # UTF-16 code units
CALLBACK_DATA_LIMIT = 64  # bytes
UPLOAD_LIMIT = 50 * 1024 * 1024  # what a bot may send through the public Bot API server
PHOTO_LIMIT = 10 * 1024 * 1024  # larger images go as documents
UPDATE_TYPES = ("message", "callback_query")
# Press ids are needed only until the press is answered, which happens within seconds: the newest this many are kept.
REMEMBERED_PRESSES = 10_000
CALL_SECONDS = 30.0
"""The most one Bot API call may take in all, answer included (per read, httpx would wait for ever on a server
dripping a byte now and then): Telegram answers a call in well under a second, and 30 s is what a read already
waited; beyond it the call is treated as Telegram unavailable and tried again with the usual backoff."""
POLL_MARGIN = 15.0
"""getUpdates may take its long poll's `timeout` plus this: Telegram answers at the end of the poll, and a slow
network or proxy may add to it."""
FILE_SECONDS = 600.0
"""The most a file's upload or download may take: the largest a bot sends (50 MB) at about 85 KB/s."""
_OP_NAMES = {Send: "send", Edit: "edit", Delete: "delete"}


class TelegramSettings(Protocol):
    """What the connector reads of the config's `telegram:` section (`bridge.chat.config.TelegramConfig`)."""

    @property
    def token(self) -> SecretStr | None: ...

    @property
    def api_url(self) -> str: ...

    @property
    def pace(self) -> Pace: ...


@dataclass(frozen=True)
class _Reply:
    """The Bot API's answer to one call: its `result`, or its error code, description and `retry_after`."""

    ok: bool
    result: Any = None
    status: int = 200
    description: str = ""
    retry_after: float | None = None
    migrate_to_chat_id: str | None = None  # the supergroup a group was upgraded to (a 400's parameters)


@dataclass(frozen=True)
class _Text:
    """A text message as the pacer holds it: comparable, so an edit showing what the message shows is dropped."""

    text: str
    entities: str  # JSON of the MessageEntity list
    keyboard: str  # JSON of the reply_markup, or ""
    thread: str = field(default="", compare=False)  # where a send goes, not what the message shows
    reply_to: str = field(default="", compare=False)


@dataclass(frozen=True)
class _Upload:
    path: str
    name: str
    media_type: str
    thread: str


_Op: TypeAlias = Send[_Text | _Upload] | Edit[_Text | _Upload] | Delete


@dataclass(eq=False)
class _Ticket:
    """One caller's operation in the pacer, until whoever took it from the pacer reports how it went."""

    op: _Op
    running: bool = False
    done: bool = False
    result: _Reply | None = None
    error: ChatError | None = None


@dataclass
class _Outbox:
    """The pacer and the operations waiting in it; every waiting caller takes whatever op is due and performs it."""

    pacer: Pacer[_Text | _Upload]
    tickets: list[_Ticket] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class TelegramPlatform:
    """The `Platform` for Telegram. `client_factory` makes the `httpx.AsyncClient` (tests point it at a fake)."""

    name = "telegram"

    def __init__(
        self,
        config: TelegramSettings,
        client_factory: Callable[[], httpx.AsyncClient] = httpx.AsyncClient,
        *,
        limits: PaceLimits | None = None,
        poll_timeout: int = 30,
        clock: Callable[[], float] = trio.current_time,
        call_seconds: float = CALL_SECONDS,
    ) -> None:
        self._token = _token_of(config)
        self._api_url = config.api_url.rstrip("/")
        self._client = client_factory()
        self._poll_timeout = poll_timeout
        self._call_seconds = call_seconds
        self._clock = clock
        self._outbox = _Outbox(Pacer(config.pace.applied_to(TELEGRAM_LIMITS) if limits is None else limits))
        self._offset: int | None = None
        self._bot_id = 0
        self._bot_username = ""
        self._press_ids: OrderedDict[str, str] = OrderedDict()  # update_id -> callback_query id
        self._upgraded: dict[str, str] = {}  # a group's chat id -> the supergroup's it was upgraded to
        self._upgraded_from: dict[str, str] = {}  # the other way: a supergroup's messages keep the group's id
        self._record_move: Callable[[str, str], None] = lambda old, new: None
        self._groups: set[str] = set()
        self._log = get_logger(component="telegram")
        self.rate_limited = 0  # 429s waited out (connect --metrics)
        _hide_token_in_httpx_logs(self._token)

    # ------------------------------------------------------------------ receiving

    def follow_moved_chats(self, moved: dict[str, str], record: Callable[[str, str], None]) -> None:
        """Groups upgraded to supergroups (Telegram gives the supergroup a new id): see `Platform`."""
        self._upgraded = dict(moved)
        self._upgraded_from = {new: old for old, new in moved.items()}
        self._record_move = record

    def _group_upgraded(self, group: str, supergroup: str) -> None:
        if self._upgraded.get(group) == supergroup:
            return
        self._upgraded[group], self._upgraded_from[supergroup] = supergroup, group
        self._record_move(group, supergroup)
        self._log.info("telegram_group_upgraded")

    def _conversation_chat(self, chat: Any) -> str:
        """The chat id a message in `chat` is given: a supergroup's is the group's it was upgraded from."""
        return self._upgraded_from.get(str(chat), str(chat))

    async def start(self, position: str | None) -> None:
        reply = await self._call("getMe")
        if not reply.ok:
            if reply.status in (401, 404):
                raise PlatformRefused(
                    f"Telegram refused the bot token ({reply.status} {reply.description}): check telegram.token "
                    f"(or token_file) against what BotFather gave, and api_url {self._api_url}"
                )
            raise self._failure("getMe", reply)
        self._bot_id = int(reply.result["id"])
        self._bot_username = str(reply.result.get("username", ""))
        # None: getUpdates without an offset, so every pending update is delivered; never a negative offset.
        self._offset = int(position) if position else None

    async def poll(self) -> Batch:
        params: dict[str, Any] = {"timeout": self._poll_timeout, "allowed_updates": list(UPDATE_TYPES)}
        if self._offset is not None:
            params["offset"] = self._offset
        reply = await self._call("getUpdates", params, wait_seconds=self._poll_timeout + POLL_MARGIN)
        if not reply.ok:
            if reply.status == 409:
                raise PlatformConflict(_conflict_message(reply.description))
            if reply.status == 429 and reply.retry_after is not None:
                self.rate_limited += 1
                await trio.sleep(reply.retry_after)
                return Batch((), self._position())
            raise self._failure("getUpdates", reply)
        items: list[Incoming | ButtonPress] = []
        last_id = None
        for update in reply.result:
            last_id = int(update["update_id"])
            item = self._item_of(update)
            if item is not None:
                items.append(item)
        position = str(last_id + 1) if last_id is not None else self._position()
        return Batch(tuple(items), position)

    async def acknowledge(self, position: str) -> None:
        self._offset = int(position)

    def _position(self) -> str:
        return str(self._offset) if self._offset is not None else "0"

    def _item_of(self, update: dict[str, Any]) -> Incoming | ButtonPress | None:
        update_id = str(update["update_id"])
        if "callback_query" in update:
            query = update["callback_query"]
            message = query.get("message") or {}
            if "chat" not in message or "data" not in query:
                return None  # a game's button, or one on a message too old for Telegram to include
            self._remember_press(update_id, str(query["id"]))
            return ButtonPress(
                update_id=update_id,
                chat=self._conversation_chat(message["chat"]["id"]),
                thread=_thread_of(message),
                user=str(query["from"]["id"]),
                message_key=str(message["message_id"]),
                data=str(query["data"]),
                user_name=_name_of(query["from"]),
            )
        message = update.get("message")
        if message is None or "from" not in message:
            return None
        if "migrate_to_chat_id" in message:  # the group's last word, and the supergroup's first
            self._group_upgraded(str(message["chat"]["id"]), str(message["migrate_to_chat_id"]))
        if "migrate_from_chat_id" in message:
            self._group_upgraded(str(message["migrate_from_chat_id"]), str(message["chat"]["id"]))
        files = _files_of(message)
        text = str(message.get("text", message.get("caption", "")))
        if not text and not files:
            return None  # a sticker, a join, a pinned message: nothing a turn could take
        if not files and self._for_another_bot(text):
            return None  # `/help@other_bot` in a group of several bots: that bot's to answer
        sender = message["from"]
        chat = message["chat"]
        is_group = chat.get("type") in ("group", "supergroup")
        reply_to = message.get("reply_to_message") or {}
        return Incoming(
            update_id=update_id,
            chat=self._conversation_chat(chat["id"]),
            thread=_thread_of(message),
            user=str(sender["id"]),
            user_name=_name_of(sender),
            text=text,
            is_group=is_group,
            mentioned=self._mentions_bot(message, text),
            reply_to_bot=(reply_to.get("from") or {}).get("id") == self._bot_id,
            files=files,
        )

    def _for_another_bot(self, text: str) -> bool:
        """Whether `text` is a command addressed to another bot (`/command@its_name`)."""
        addressed = re.match(r"/[A-Za-z0-9_]+@([A-Za-z0-9_]+)", text)
        return addressed is not None and addressed.group(1).lower() != self._bot_username.lower()

    def _mentions_bot(self, message: dict[str, Any], text: str) -> bool:
        wanted = f"@{self._bot_username}".lower()
        encoded = text.encode("utf-16-le")
        for entity in message.get("entities", message.get("caption_entities", [])):
            start, end = 2 * entity["offset"], 2 * (entity["offset"] + entity["length"])
            words = encoded[start:end].decode("utf-16-le", errors="replace").lower()
            if entity["type"] == "mention" and words == wanted:
                return True
            if entity["type"] == "bot_command" and words.endswith(wanted):
                return True
            if entity["type"] == "text_mention" and (entity.get("user") or {}).get("id") == self._bot_id:
                return True
        return False

    def _remember_press(self, update_id: str, query_id: str) -> None:
        self._press_ids[update_id] = query_id
        while len(self._press_ids) > REMEMBERED_PRESSES:
            self._press_ids.popitem(last=False)

    # ------------------------------------------------------------------ sending

    async def send_text(
        self,
        chat: str,
        thread: str,
        markdown: str,
        *,
        choices: tuple[Choice, ...] = (),
        reply_to: str = "",
        delivery: Delivery | None = None,
    ) -> list[str]:
        keyboard = _keyboard(choices)
        parts = telegram_parts(markdown, MESSAGE_LIMIT)
        keys: list[str] = []
        for number, part in enumerate(parts):
            if delivery is not None and number < delivery.parts_sent:
                continue  # taken before a restart; Telegram has no idempotency key, so the kit remembers
            last = number == len(parts) - 1
            text = _Text(
                part.text,
                json.dumps(list(part.entities)),
                keyboard if last else "",
                thread,
                reply_to if number == 0 else "",
            )
            keys.extend(await self._send_one(chat, text))
            if delivery is not None and delivery.part_sent is not None:
                await delivery.part_sent(number + 1)
        return keys

    async def _send_one(self, chat: str, text: _Text) -> list[str]:
        reply = await self._paced(Send(chat, text))
        if reply.ok:
            return [str(reply.result["message_id"])]
        if _too_long(reply):
            # The renderer keeps parts within the limit; should one still be refused, it goes as plain text parts.
            keys = []
            pieces = plain_parts(text.text, MESSAGE_LIMIT)
            for number, piece in enumerate(pieces):
                plain = _Text(piece, "[]", text.keyboard if number == len(pieces) - 1 else "", text.thread)
                again = await self._paced(Send(chat, plain))
                if not again.ok:
                    raise self._failure("sendMessage", again)
                keys.append(str(again.result["message_id"]))
            return keys
        raise self._failure("sendMessage", reply)

    async def edit_text(self, chat: str, message_key: str, markdown: str, *, choices: tuple[Choice, ...] = ()) -> None:
        parts = telegram_parts(markdown, MESSAGE_LIMIT)
        if not parts:
            return
        first = parts[0]
        reply = await self._paced(
            Edit(chat, message_key, _Text(first.text, json.dumps(list(first.entities)), _keyboard(choices)))
        )
        if not reply.ok and not _not_modified(reply):
            raise self._failure("editMessageText", reply)

    async def delete(self, chat: str, message_key: str) -> None:
        reply = await self._paced(Delete(chat, message_key))
        if not reply.ok and "message to delete not found" not in reply.description:
            raise self._failure("deleteMessage", reply)

    async def answer_press(self, press: ButtonPress, text: str = "") -> None:
        query_id = self._press_ids.pop(press.update_id, None)
        if query_id is None:
            return  # pressed before a restart: Telegram stopped waiting for the answer long ago
        params: dict[str, Any] = {"callback_query_id": query_id}
        if text:
            params["text"] = text[:200]
        reply = await self._call("answerCallbackQuery", params)
        if not reply.ok:
            self._log.info("telegram_press_not_answered", status=reply.status, reason=reply.description)

    async def typing(self, chat: str, thread: str) -> None:
        params: dict[str, Any] = {"chat_id": chat, "action": "typing"}
        if thread:
            params["message_thread_id"] = thread
        reply = await self._call("sendChatAction", params)
        if not reply.ok:
            self._log.info("telegram_typing_not_shown", status=reply.status, reason=reply.description)

    async def send_file(self, chat: str, thread: str, path: str, name: str, media_type: str) -> str:
        size = os.stat(path).st_size
        if size > UPLOAD_LIMIT:
            raise PlatformRefused(
                f"the file {name!r} is {size / 2**20:.1f} MB: a Telegram bot can send files of at most 50 MB"
            )
        reply = await self._paced(Send(chat, _Upload(path, name, media_type, thread)))
        if not reply.ok:
            raise self._failure("sendDocument", reply)
        return str(reply.result["message_id"])

    async def set_commands(self, commands: tuple[tuple[str, str], ...]) -> None:
        wanted = [{"command": command, "description": description} for command, description in commands]
        current = await self._call("getMyCommands")
        if current.ok and current.result == wanted:
            return
        reply = await self._call("setMyCommands", {"commands": wanted})
        if not reply.ok:  # the menu is a convenience: the commands work typed all the same
            self._log.warning("telegram_commands_not_set", status=reply.status, reason=reply.description)

    async def download(self, file: IncomingFile, directory: str) -> str:
        reply = await self._call("getFile", {"file_id": file.file_ref})
        # file_path is optional in getFile's answer: without it, as with "file is too big", nothing can be fetched.
        if reply.ok and not (isinstance(reply.result, dict) and "file_path" in reply.result):
            reply = _Reply(ok=False, status=400, description="file is too big")
        if not reply.ok:
            if "file is too big" in reply.description:
                raise PlatformRefused(
                    f"the file {file.name!r} is too large to download: the Bot API serves files of at "
                    "most 20 MB (a self-hosted Bot API server, api_url, has no such limit)"
                )
            raise self._failure("getFile", reply)
        target = _free_name(Path(directory), file.name)
        url = f"{self._api_url}/file/bot{self._token}/{reply.result['file_path']}"
        try:
            with whole_request_within(FILE_SECONDS):
                async with self._client.stream("GET", url) as response:
                    if response.status_code != 200:
                        raise PlatformUnavailable(
                            f"Telegram answered {response.status_code} to the download of {file.name!r}: try again"
                        )
                    async with await trio.open_file(target, "xb") as output:
                        async for chunk in response.aiter_bytes():
                            await output.write(chunk)
        except httpx.HTTPError as error:
            await trio.Path(target).unlink(missing_ok=True)
            raise PlatformUnavailable(
                f"the download of {file.name!r} from the Telegram Bot API at {self._api_url} failed "
                f"({type(error).__name__}): try again"
            ) from None
        return str(target)

    async def aclose(self) -> None:
        await self._client.aclose()

    # ------------------------------------------------------------------ pacing

    async def _paced(self, op: _Op) -> _Reply:
        """Perform `op` at the pace Telegram allows and return its reply; 429s are waited out in the pacer.

        There is no task of the connector's own: every caller waiting for an op takes whatever op is due (its own
        or another's) and performs it, so the outbox moves as long as anyone waits on it. A full outbox raises
        `OutboxFull` (nothing is kept of the op)."""
        outbox = self._outbox
        ticket = _Ticket(op)
        outbox.tickets.append(ticket)
        try:
            self._submit(ticket)
            outbox.notify()
            while not ticket.done:
                due, wait = outbox.pacer.next(self._clock())
                if due is not None:
                    await self._perform(due)
                    continue
                with trio.move_on_after(wait):
                    await outbox.changed.wait()
        finally:
            outbox.tickets.remove(ticket)
        if ticket.error is not None:
            raise ticket.error
        assert ticket.result is not None
        return ticket.result

    def _submit(self, ticket: _Ticket) -> None:
        """Hand the ticket's op to the pacer, and settle at once what the pacer absorbs: an edit showing what its
        message shows, the edits a delete makes moot."""
        op, pacer = ticket.op, self._outbox.pacer
        if op.chat.startswith("-") and op.chat not in self._groups:  # Telegram's groups have negative ids
            self._groups.add(op.chat)
            pacer.is_group(op.chat, True)
        before = pacer.pending(op.chat)
        pacer.submit(op, self._clock())
        if isinstance(op, Delete):
            _settle(self._waiting_edits(op.chat, op.message_key, but=ticket), reply=_Reply(ok=True))
        if not isinstance(op, Edit) or pacer.pending(op.chat) > before:
            return
        earlier = self._waiting_edits(op.chat, op.message_key, but=ticket)
        if pacer.pending(op.chat) < before:  # back to what the message shows: the pending edit is gone too
            _settle([*earlier, ticket], reply=_Reply(ok=True))
        elif not earlier:  # dropped: the message shows it already, or is about to be deleted
            _settle([ticket], reply=_Reply(ok=True))
        # else merged into an earlier edit of the message, which goes out with this payload

    def _waiting_edits(self, chat: str, message_key: str, *, but: _Ticket) -> list[_Ticket]:
        return [
            other
            for other in self._outbox.tickets
            if other is not but
            and isinstance(other.op, Edit)
            and (other.op.chat, other.op.message_key) == (chat, message_key)
            and not other.running
            and not other.done
        ]

    async def _perform(self, op: _Op) -> None:
        """Perform an op the pacer handed out, and tell the callers waiting for it (an op whose caller gave up is
        performed all the same: nothing handed to the outbox is dropped)."""
        outbox = self._outbox
        tickets = self._tickets_of(op)
        for ticket in tickets:
            ticket.running = True
        try:
            reply = await self._execute(op)
        except ChatError as error:
            outbox.pacer.done(op, self._clock(), failed=True)
            _settle(tickets, error=error)
            outbox.notify()
            return
        except BaseException:
            outbox.pacer.retry_after(op, 0.0, self._clock())  # cancelled: back first in its chat, for another
            for ticket in tickets:
                ticket.running = False
            outbox.notify()
            raise
        if reply.status == 429 and reply.retry_after is not None:
            self._log.info("telegram_flood_wait", op=_OP_NAMES[type(op)], retry_after=reply.retry_after)
            self.rate_limited += 1
            outbox.pacer.retry_after(op, reply.retry_after, self._clock())
            for ticket in tickets:
                ticket.running = False
        else:
            made = str(reply.result["message_id"]) if reply.ok and isinstance(op, Send) else None
            outbox.pacer.done(op, self._clock(), message_key=made, failed=not reply.ok)
            _settle(tickets, reply=reply)
        outbox.notify()

    def _tickets_of(self, op: _Op) -> list[_Ticket]:
        """The callers waiting for `op`: its own, and for an edit those of earlier edits merged into it."""
        waiting = [ticket for ticket in self._outbox.tickets if not ticket.running and not ticket.done]
        tickets = [ticket for ticket in waiting if ticket.op is op]
        if not tickets:  # the pacer handed back an equal op, not the same object
            tickets = [ticket for ticket in waiting if ticket.op == op][:1]
        if isinstance(op, Edit):
            tickets += [
                ticket
                for ticket in waiting
                if isinstance(ticket.op, Edit)
                and (ticket.op.chat, ticket.op.message_key) == (op.chat, op.message_key)
                and ticket not in tickets
            ]
        return tickets

    async def _execute(self, op: _Op) -> _Reply:
        if isinstance(op, Delete):
            return await self._call("deleteMessage", {"chat_id": op.chat, "message_id": op.message_key})
        if isinstance(op.payload, _Upload):
            return await self._upload(op.chat, op.payload)
        text: _Text = op.payload
        params: dict[str, Any] = {"chat_id": op.chat, "text": text.text}
        if text.keyboard:
            params["reply_markup"] = json.loads(text.keyboard)
        if isinstance(op, Edit):
            method = "editMessageText"
            params["message_id"] = op.message_key
        else:
            method = "sendMessage"
            if text.thread:
                params["message_thread_id"] = text.thread
            if text.reply_to:
                params["reply_parameters"] = {"message_id": text.reply_to, "allow_sending_without_reply": True}
        entities = json.loads(text.entities)
        reply = await self._call(method, params | ({"entities": entities} if entities else {}))
        if entities and not reply.ok and "can't parse entities" in reply.description:
            self._log.info("telegram_sent_as_plain_text", reason=reply.description)
            reply = await self._call(method, params)
        return reply

    async def _upload(self, chat: str, upload: _Upload) -> _Reply:
        as_photo = upload.media_type.startswith("image/") and os.stat(upload.path).st_size <= PHOTO_LIMIT
        method, field_name = ("sendPhoto", "photo") if as_photo else ("sendDocument", "document")
        data = {"chat_id": chat} | ({"message_thread_id": upload.thread} if upload.thread else {})
        content = await trio.Path(upload.path).read_bytes()
        reply = await self._call(method, data, files={field_name: (upload.name, content, upload.media_type)})
        if as_photo and not reply.ok and reply.status == 400:
            # Telegram takes a photo only within its dimensions and aspect ratio: anything else goes as a document.
            files = {"document": (upload.name, content, upload.media_type)}
            reply = await self._call("sendDocument", data, files=files)
        return reply

    # ------------------------------------------------------------------ the HTTP calls

    async def _call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        files: dict[str, tuple[str, bytes, str]] | None = None,
        wait_seconds: float | None = None,
    ) -> _Reply:
        """`_request`, following a group upgraded to a supergroup: a call to the group is answered 400 with the new
        chat id, and goes again there, as does every later call to the group (its replies, its typing)."""
        params = dict(params or {})
        chat = str(params.get("chat_id", ""))
        if chat in self._upgraded:
            params["chat_id"] = self._upgraded[chat]
        reply = await self._request(method, params, files=files, wait_seconds=wait_seconds)
        if chat and reply.migrate_to_chat_id is not None:
            self._group_upgraded(chat, reply.migrate_to_chat_id)
            params["chat_id"] = reply.migrate_to_chat_id
            reply = await self._request(method, params, files=files, wait_seconds=wait_seconds)
        return reply

    async def _request(
        self,
        method: str,
        params: dict[str, Any],
        *,
        files: dict[str, tuple[str, bytes, str]] | None = None,
        wait_seconds: float | None = None,
    ) -> _Reply:
        """One Bot API call, whole within `wait_seconds` (a file's within FILE_SECONDS). A transport failure or a
        call over its time is `PlatformUnavailable`; every answer, error or not, a `_Reply`."""
        url = f"{self._api_url}/bot{self._token}/{method}"
        seconds = wait_seconds or self._call_seconds  # each read's, and the whole call's but an upload's
        try:
            with whole_request_within(FILE_SECONDS if files is not None else seconds):
                if files is not None:
                    response = await self._client.post(url, data=params, files=files, timeout=seconds)
                else:
                    response = await self._client.post(url, json=params, timeout=seconds)
            body = response.json()
        except httpx.HTTPError as error:
            raise PlatformUnavailable(
                f"the Telegram Bot API at {self._api_url} cannot be reached ({type(error).__name__} during "
                f"{method}): check the network and api_url; the call can be tried again"
            ) from None
        except ValueError:
            raise PlatformUnavailable(
                f"the Telegram Bot API at {self._api_url} answered {method} with {response.status_code} and no "
                "JSON: is api_url a Bot API server?"
            ) from None
        if body.get("ok"):
            return _Reply(ok=True, result=body.get("result"))
        parameters = body.get("parameters") or {}
        retry_after, migrated = parameters.get("retry_after"), parameters.get("migrate_to_chat_id")
        return _Reply(
            ok=False,
            status=int(body.get("error_code", response.status_code)),
            description=str(body.get("description", "")),
            retry_after=float(retry_after) if retry_after is not None else None,
            migrate_to_chat_id=str(migrated) if migrated is not None else None,
        )

    def _failure(self, method: str, reply: _Reply) -> ChatError:
        if reply.status >= 500 or reply.status == 429:
            return PlatformUnavailable(f"Telegram answered {method} with {reply.status} {reply.description}: try again")
        if reply.status == 409:
            return PlatformConflict(_conflict_message(reply.description))
        return PlatformRefused(f"Telegram refused {method}: {reply.status} {reply.description}")


def _settle(tickets: list[_Ticket], *, reply: _Reply | None = None, error: ChatError | None = None) -> None:
    for ticket in tickets:
        ticket.running = False
        ticket.done = True
        ticket.result = reply
        ticket.error = error


def _token_of(config: TelegramSettings) -> str:
    """The bot token (`bridge.chat.config` has read a token_file into it already)."""
    token = config.token.get_secret_value() if config.token is not None else ""
    if not re.fullmatch(r"[0-9]+:[A-Za-z0-9_-]+", token):
        raise PlatformRefused(
            "telegram.token is not a bot token (digits, a colon, then letters, digits, _ and -): copy it from "
            "BotFather's message, or name the file holding it in token_file"
        )
    return token


def _conflict_message(description: str) -> str:
    if "webhook" in description:
        return (
            "this bot has a webhook set, so Telegram refuses long polling: remove it (the Bot API's deleteWebhook, "
            "without drop_pending_updates) and start again"
        )
    return (
        "another process is polling this Telegram bot (409 Conflict): only one may; stop the other "
        "`agent-bridge connect` (or any other program using this bot token) and start again"
    )


def _name_of(user: dict[str, Any]) -> str:
    return str(user.get("username") or user.get("first_name", ""))


def _thread_of(message: dict[str, Any]) -> str:
    """The forum topic a message belongs to ("" outside topics): replies in a plain group carry a thread id too,
    but sending with it there is refused."""
    if message.get("is_topic_message") and "message_thread_id" in message:
        return str(message["message_thread_id"])
    return ""


def _files_of(message: dict[str, Any]) -> tuple[IncomingFile, ...]:
    if message.get("photo"):
        largest = max(message["photo"], key=lambda size: (size.get("file_size", 0), size.get("width", 0)))
        name = f"photo_{largest.get('file_unique_id', 'telegram')}.jpg"
        return (IncomingFile(str(largest["file_id"]), name, "image/jpeg", largest.get("file_size")),)
    document = message.get("document")
    if document:
        name = str(document.get("file_name") or f"document_{document.get('file_unique_id', 'telegram')}")
        media_type = str(document.get("mime_type") or "application/octet-stream")
        return (IncomingFile(str(document["file_id"]), name, media_type, document.get("file_size")),)
    return ()


def _keyboard(choices: tuple[Choice, ...]) -> str:
    """The inline keyboard of `choices`, one button a row, as JSON ("" without choices)."""
    for choice in choices:
        if not 1 <= len(choice.data.encode()) <= CALLBACK_DATA_LIMIT:
            raise PlatformRefused(
                f"the button {choice.label!r} carries {len(choice.data.encode())} bytes of data: Telegram takes "
                f"1 to {CALLBACK_DATA_LIMIT}"
            )
    if not choices:
        return ""
    rows = [[{"text": choice.label, "callback_data": choice.data}] for choice in choices]
    return json.dumps({"inline_keyboard": rows})


def _too_long(reply: _Reply) -> bool:
    return "message is too long" in reply.description


def _not_modified(reply: _Reply) -> bool:
    return "message is not modified" in reply.description


def _free_name(directory: Path, name: str) -> Path:
    """A name in `directory` for a file the user called `name`: its last path component, only letters, digits and
    `._-`, no leading dot, not taken yet."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", Path(name.replace("\\", "/")).name).lstrip(".")[-100:] or "file"
    stem, dot, suffix = safe.rpartition(".")
    if not stem:
        stem, dot, suffix = safe, "", ""
    candidate = directory / safe
    number = 1
    while candidate.exists():
        candidate = directory / f"{stem}-{number}{dot}{suffix}"
        number += 1
    return candidate


class _HideToken(logging.Filter):
    """httpx logs every request's URL, and a Bot API URL holds the bot token: the filter writes it out."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.token in message:
            record.msg = message.replace(self.token, "<bot-token>")
            record.args = None
        return True


def _hide_token_in_httpx_logs(token: str) -> None:
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _HideToken) and f.token == token for f in logger.filters):
            logger.addFilter(_HideToken(token))
