"""The Matrix connector: the client-server API over httpx, `/sync` long polling, no end-to-end encryption.

Conversations are rooms (and `m.thread` threads in them). Matrix has no buttons: a prompt numbers its choices,
answered by a reply whose text is the number or by a keycap reaction (1️⃣ …). The choices travel inside the
prompt's own event (`CHOICES_FIELD`), so an answer is understood after a restart too.

Which messages are the bot's: those sent in a room after the bot was invited to it (or joined it, a room it needed
no invite for) — a message written while the invite waits is answered once the bot has joined; the room's older
history never is. On a first start (`start(None)`, no acknowledged position) the initial sync shows only a room's
latest events, so the rest is fetched back (`/messages`) to where the bot came in, at most `FIRST_START_EVENTS`
events a room. A later sync whose timeline has a gap (`limited`) is filled back to the acknowledged position:
nothing pending is dropped.
"""

from __future__ import annotations

import hashlib
import json
import math
import mimetypes
import re
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import structlog
import trio

from ..errors import PlatformRateLimited, PlatformRefused, PlatformUnavailable
from .config import MatrixConfig
from .http_transport import whole_request_within
from .markup import MatrixText, matrix_parts
from .pacing import MATRIX_LIMITS, Delete, Edit, Op, PaceLimits, Pacer, Send
from .platform import Batch, ButtonPress, Choice, Delivery, Incoming, IncomingFile

log = structlog.get_logger(__name__)

CLIENT = "/_matrix/client/v3"
MEDIA_V3 = "/_matrix/media/v3"
AUTHENTICATED_MEDIA = "/_matrix/client/v1/media"
# The prompt's choices, carried in its own event so that a reply or reaction is understood after a restart.
CHOICES_FIELD = "org.agent_bridge.choices"
KEYCAPS = (*(f"{digit}\ufe0f\u20e3" for digit in "123456789"), "\U0001f51f")  # 1️⃣ … 9️⃣, 🔟
# Characters of a part's body (and of its HTML), tried in turn until every part fits EVENT_BYTES: the homeserver
# refuses an event over 64 KiB of JSON, body and HTML together, with room left for the event's own fields.
PART_LIMITS = (32000, 16000, 8000, 4000)
EVENT_BYTES = 60_000
FIRST_START_EVENTS = 500
TIMELINE_LIMIT = 100  # events a room per sync before the timeline reports a gap
CACHE_LIMIT = 4096  # entries of each cache of prompts, own events and names
NAME_BYTES = 200  # of a downloaded file's name, room left for the `-N` that tells two of one name apart
FILE_SECONDS = 600.0
"""The most a file's upload or download may take in all (a request's other calls are whole within their
`time_limit`: per read, httpx would wait for ever on a server dripping a byte now and then): Synapse's default
upload limit (50 MB) at about 85 KB/s."""
JOIN_SECONDS = 20.0
"""The most a join (or declining an invite) may hold the sync, every room's messages waiting behind it: joining a
room of a homeserver that is down keeps the bot's homeserver trying for minutes. A local join takes well under a
second."""
JOIN_RETRY_SECONDS = 300.0
"""An invite whose join failed or ran out of time is tried again at the first sync this long after."""
RETRIES = 8  # of one request refused with 429 or failing with a server error, before PlatformUnavailable
ENCRYPTED_ROOM_NOTICE = (
    "This room is end-to-end encrypted, and agent-bridge does not support encrypted rooms: it cannot read "
    "messages here. Invite me to a room without encryption (encryption cannot be turned off in a room once on)."
)


@dataclass(eq=False)
class _Job:
    """A paced request, the payload of its pacing operation; equal to another when the message would show the
    same (`shown`): the pacer drops an edit equal to what the message shows."""

    perform: Callable[[], Awaitable[str]]
    shown: dict[str, Any]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Job) and other.shown == self.shown

    __hash__ = object.__hash__


@dataclass
class _Room:
    members: int = 0
    encrypted: bool = False
    told_encrypted: bool = False


def keycap_number(key: str) -> int | None:
    """1 for 1️⃣ … 10 for 🔟 (with or without the variation selector); None for any other reaction."""
    normalized = key if key in KEYCAPS else key.replace("\u20e3", "\ufe0f\u20e3")
    return KEYCAPS.index(normalized) + 1 if normalized in KEYCAPS else None


def strip_reply_fallback(body: str) -> str:
    """A reply's text without the quoted `> ` lines older clients put before it."""
    lines = body.split("\n")
    if not lines or not lines[0].startswith("> "):
        return body
    while lines and lines[0].startswith(">"):
        lines.pop(0)
    return "\n".join(lines).strip()


def numbered_choices(choices: Iterable[Choice]) -> str:
    lines = [f"{number}. {choice.label}" for number, choice in enumerate(choices, 1)]
    return "\n".join(lines) + "\n\nAnswer with a reply holding the number, or react with its keycap (1️⃣ …)."


def _content(body: str, formatted_body: str, msgtype: str = "m.text") -> dict[str, Any]:
    return {
        "msgtype": msgtype,
        "body": body,
        "format": "org.matrix.custom.html",
        "formatted_body": formatted_body,
    }


class MatrixPlatform:
    """The `Platform` for Matrix (see bridge.chat.platform)."""

    name = "matrix"

    def __init__(
        self,
        config: MatrixConfig,
        client_factory: Callable[[], httpx.AsyncClient],
        *,
        sync_timeout_ms: int = 30_000,
        limits: PaceLimits | None = None,
        timeline_limit: int = TIMELINE_LIMIT,
        join_seconds: float = JOIN_SECONDS,
        join_retry_seconds: float = JOIN_RETRY_SECONDS,
    ) -> None:
        self._config = config
        self._homeserver = config.homeserver.rstrip("/")
        self._client = client_factory()
        self._sync_timeout_ms = sync_timeout_ms
        self._timeline_limit = timeline_limit
        self._join_seconds = join_seconds
        self._join_retry_seconds = join_retry_seconds
        self._invites_to_retry: dict[str, tuple[float, dict[str, Any]]] = {}  # room → (when, the invite)
        self._token = ""
        self._logged_in_by_password = False
        self.user_id = config.user_id
        self._display_name = ""
        self._since: str | None = None
        self._rooms: dict[str, _Room] = {}
        # Caches, bounded (_remember): what the homeserver would tell again, at the cost of a request.
        # (room id, event id) → its CHOICES_FIELD: an event id is global, a reaction in another room must not find it
        self._prompts: OrderedDict[tuple[str, str], tuple[Choice, ...]] = OrderedDict()
        self._own_events: OrderedDict[str, None] = OrderedDict()
        self._names: OrderedDict[tuple[str, str], str] = OrderedDict()  # (room, user) → display name
        self._pacer: Pacer[_Job] = Pacer(config.pace.applied_to(MATRIX_LIMITS) if limits is None else limits)
        self._pacer_lock = trio.Lock()
        self.rate_limited = 0  # 429s waited out (connect --metrics)

    # --- HTTP ---------------------------------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        time_limit: float = 30.0,
        paced: bool = False,
    ) -> dict[str, Any]:
        """One request; its JSON answer. A 429 waits `retry_after_ms` and retries, unless `paced` (the pacer
        decides then: PlatformRateLimited). The access token goes in a header only, never in a URL, log or error."""
        all_headers = dict(headers or {})
        if self._token:
            all_headers["Authorization"] = f"Bearer {self._token}"
        for attempt in range(RETRIES):
            try:
                with whole_request_within(time_limit):  # each read's limit too, but a drip would reset that
                    response = await self._client.request(
                        method,
                        self._homeserver + path,
                        json=json,
                        params=params,
                        content=content,
                        headers=all_headers,
                        timeout=time_limit,
                    )
            except httpx.HTTPError as error:
                if attempt + 1 == RETRIES:
                    raise PlatformUnavailable(
                        f"the Matrix homeserver {self._homeserver} cannot be reached ({type(error).__name__}): "
                        "check `homeserver` in the config and that the server is up"
                    ) from None
                await trio.sleep(min(2**attempt, 30))
                continue
            if response.status_code == 429:
                seconds = _retry_after(response)
                if paced:
                    raise PlatformRateLimited(seconds)
                self.rate_limited += 1
                log.info("matrix.rate_limited", path=_path_for_log(path), retry_after=seconds)
                await trio.sleep(seconds)
                continue
            if response.status_code >= 500 and attempt + 1 < RETRIES:
                await trio.sleep(min(2**attempt, 30))
                continue
            return _answer(response, path)
        raise PlatformUnavailable(f"the Matrix homeserver kept refusing {_path_for_log(path)} (rate limit)")

    async def _paced(self, op: Op[_Job], job: _Job) -> str:
        """Do `job` when the pacer lets it go (the homeserver's limits; a 429 puts it back first and holds every
        room for retry_after_ms). One caller at a time drives the pacer, so the op it hands out is the caller's."""
        async with self._pacer_lock:
            self._pacer.submit(op, trio.current_time())
            while True:
                chosen, wait = self._pacer.next(trio.current_time())
                if chosen is None:
                    if math.isinf(wait):
                        return ""  # an edit to the text the message already shows: nothing to send
                    await trio.sleep(wait)
                    continue
                try:
                    result = await job.perform()
                except PlatformRateLimited as limited:
                    self.rate_limited += 1
                    log.info("matrix.rate_limited", retry_after=limited.seconds)
                    self._pacer.retry_after(chosen, limited.seconds, trio.current_time())
                    continue
                except BaseException:
                    self._pacer.done(chosen, trio.current_time(), failed=True)
                    raise
                key = result if isinstance(chosen, Send) else None
                self._pacer.done(chosen, trio.current_time(), message_key=key)
                return result

    # --- start, sync --------------------------------------------------------------------------------------------

    def follow_moved_chats(self, moved: dict[str, str], record: Callable[[str, str], None]) -> None:
        """A Matrix room keeps its id: nothing to follow."""

    async def start(self, position: str | None) -> None:
        if self._config.access_token is not None:
            self._token = self._config.access_token.get_secret_value()
        elif self._config.password is not None:
            body = {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": self.user_id},
                "password": self._config.password.get_secret_value(),
                "initial_device_display_name": "agent-bridge",
            }
            answer = await self._call("POST", f"{CLIENT}/login", json=body)
            self._token = str(answer["access_token"])
            self._logged_in_by_password = True
        else:
            raise PlatformRefused("matrix: the config gives neither `password` nor `access_token`: give one")
        whoami = await self._call("GET", f"{CLIENT}/account/whoami")
        if whoami.get("user_id") != self.user_id:
            raise PlatformRefused(
                f"matrix: the access token belongs to {whoami.get('user_id')}, not to `user_id` {self.user_id}: "
                "give the bot's own token, or correct `user_id`"
            )
        try:
            profile = await self._call("GET", f"{CLIENT}/profile/{quote(self.user_id)}/displayname")
            self._display_name = str(profile.get("displayname") or "")
        except PlatformRefused:
            self._display_name = ""  # no display name set
        self._since = position

    async def poll(self) -> Batch:
        params: dict[str, Any] = {
            "timeout": self._sync_timeout_ms,
            "filter": json.dumps({"room": {"timeline": {"limit": self._timeline_limit}}}),
        }
        if self._since is not None:
            params["since"] = self._since
        answer = await self._call("GET", f"{CLIENT}/sync", params=params, time_limit=self._sync_timeout_ms / 1000 + 30)
        rooms = answer.get("rooms", {})
        items: list[Incoming | ButtonPress] = []
        now = trio.current_time()
        due = {room: invite for room, (when, invite) in self._invites_to_retry.items() if when <= now}
        for room_id, invite in (due | rooms.get("invite", {})).items():
            self._invites_to_retry.pop(room_id, None)
            await self._answer_invite(room_id, invite)
        for room_id, joined in rooms.get("join", {}).items():
            room = self._rooms.setdefault(room_id, _Room())
            count = joined.get("summary", {}).get("m.joined_member_count")
            if count is not None:
                room.members = int(count)
                self._pacer.is_group(room_id, room.members > 2)
            events = [*joined.get("state", {}).get("events", []), *await self._timeline(room_id, joined)]
            for event in events:
                item = await self._item(room_id, room, event)
                if item is not None:
                    items.append(item)
        return Batch(items=tuple(items), position=str(answer["next_batch"]))

    async def acknowledge(self, position: str) -> None:
        self._since = position

    async def _answer_invite(self, room_id: str, invite: dict[str, Any]) -> None:
        inviter = next(
            (
                event.get("sender")
                for event in invite.get("invite_state", {}).get("events", [])
                if event.get("type") == "m.room.member" and event.get("state_key") == self.user_id
            ),
            None,
        )
        allowed = inviter in self._config.allow_users
        answer = f"{CLIENT}/join/{quote(room_id)}" if allowed else f"{CLIENT}/rooms/{quote(room_id)}/leave"
        try:
            with trio.fail_after(self._join_seconds):  # declining a remote room's invite asks its homeserver too
                await self._call("POST", answer, json={})
            log.info("matrix.joined" if allowed else "matrix.invite_declined", allowed_inviter=allowed)
        except PlatformRefused as refused:
            # Everyone may have left the room since: an invite that stopped the sync would stop the bot at every start.
            log.warning("matrix.invite_not_answered", allowed_inviter=allowed, reason=str(refused))
        except (PlatformUnavailable, trio.TooSlowError) as failed:
            # The room's homeserver may be down: the sync goes on, and a later one tries again.
            reason = str(failed) or f"no answer within {self._join_seconds} s"
            log.warning("matrix.join_postponed", retry_in=self._join_retry_seconds, reason=reason)
            self._invites_to_retry[room_id] = (trio.current_time() + self._join_retry_seconds, invite)

    async def _timeline(self, room_id: str, joined: dict[str, Any]) -> list[dict[str, Any]]:
        """The room's new events in order: the sync's, plus those a gap left out, none from before the bot was
        invited (see the module's doc)."""
        timeline = joined.get("timeline", {})
        events: list[dict[str, Any]] = list(timeline.get("events", []))
        if timeline.get("limited") and timeline.get("prev_batch"):
            events = await self._earlier_events(room_id, timeline["prev_batch"], until=self._since) + events
        arrival = self._arrival_index(events)
        if arrival is None:
            arrival = self._membership_index(events, lambda now, before: now == "join" and before != "join")
        return events[arrival + 1 :] if arrival is not None else events

    def _arrival_index(self, events: list[dict[str, Any]]) -> int | None:
        """Where the bot came into the room: its invite, or a join without one (a public room)."""
        return self._membership_index(
            events, lambda now, before: now == "invite" or (now == "join" and before not in ("join", "invite"))
        )

    def _membership_index(self, events: list[dict[str, Any]], matches: Callable[[str, str], bool]) -> int | None:
        """The last of the bot's own membership events that `matches` (its membership, and the one before)."""
        found = None
        for index, event in enumerate(events):
            if event.get("type") == "m.room.member" and event.get("state_key") == self.user_id:
                before = event.get("unsigned", {}).get("prev_content", {}).get("membership", "")
                if matches(str(event.get("content", {}).get("membership", "")), str(before)):
                    found = index
        return found

    async def _earlier_events(self, room_id: str, start: str, until: str | None) -> list[dict[str, Any]]:
        """Events before `start`, oldest first: back to `until` (a sync position), or on a first start back to
        where the bot came in (at most FIRST_START_EVENTS)."""
        collected: list[dict[str, Any]] = []  # newest first
        token = start
        while len(collected) < FIRST_START_EVENTS:
            params: dict[str, Any] = {"dir": "b", "from": token, "limit": 100}
            if until is not None:
                params["to"] = until
            page = await self._call("GET", f"{CLIENT}/rooms/{quote(room_id)}/messages", params=params)
            chunk = page.get("chunk", [])
            collected.extend(chunk)
            if until is None and self._arrival_index(chunk) is not None:
                break
            if not chunk or not page.get("end") or page.get("end") == token:
                break
            token = str(page["end"])
        return list(reversed(collected))

    async def _item(self, room_id: str, room: _Room, event: dict[str, Any]) -> Incoming | ButtonPress | None:
        kind = event.get("type")
        sender = str(event.get("sender", ""))
        if kind == "m.room.encryption" or kind == "m.room.encrypted":
            room.encrypted = True
        if kind == "m.room.member":  # someone joined or left, or took a new display name
            self._names.pop((room_id, str(event.get("state_key", ""))), None)
            room.members = 0  # counted again when next needed
        if sender == self.user_id or ("state_key" in event and kind != "m.room.encrypted"):
            return None
        if kind == "m.room.encrypted" or (room.encrypted and kind == "m.room.message"):
            await self._refuse_encrypted(room_id, room)
            return None
        if sender not in self._config.allow_users and kind == "m.reaction":
            return None  # a stranger's reaction is not an answer, nor worth a refusal
        content = event.get("content", {})
        relates = _object(content.get("m.relates_to"))
        thread = str(relates.get("event_id", "")) if relates.get("rel_type") == "m.thread" else ""
        if kind == "m.reaction" and relates.get("rel_type") == "m.annotation":
            return await self._reaction(room_id, event, thread)
        if kind != "m.room.message" or relates.get("rel_type") == "m.replace":
            return None  # an edit of an earlier message is not a new one
        msgtype = content.get("msgtype")
        if msgtype == "m.notice":
            return None  # other bots' output, by the spec's convention
        text = str(content.get("body", ""))
        replied = str(_object(relates.get("m.in_reply_to")).get("event_id", ""))
        if relates.get("is_falling_back") and thread:
            replied = ""  # a thread's fallback reply points at the thread's latest event, not a real reply
        if replied:
            text = strip_reply_fallback(text)
            choices = await self._choices_of(room_id, replied)
            number = _number_in(text)
            if number is not None and 1 <= number <= len(choices):
                data = choices[number - 1].data
                name = await self._member_name(room_id, sender)
                return ButtonPress(str(event["event_id"]), room_id, thread, sender, replied, data, name)
        files: tuple[IncomingFile, ...] = ()
        if msgtype in ("m.image", "m.file", "m.video", "m.audio") and isinstance(content.get("url"), str):
            files, text = _attached_file(content, text)
        elif msgtype not in ("m.text", "m.emote"):
            return None
        return Incoming(
            update_id=str(event["event_id"]),
            chat=room_id,
            thread=thread,
            user=sender,
            user_name=await self._member_name(room_id, sender),
            text=text,
            is_group=await self._member_count(room_id, room) > 2,
            mentioned=self._mentions_bot(content),
            reply_to_bot=bool(replied) and await self._sent_by_bot(room_id, replied),
            files=files,
        )

    async def _reaction(self, room_id: str, event: dict[str, Any], thread: str) -> ButtonPress | None:
        """A keycap reaction to a message with choices presses the choice of that number; any other is ignored."""
        sender = str(event.get("sender", ""))
        relates = event.get("content", {}).get("m.relates_to", {})
        number = keycap_number(str(relates.get("key", "")))
        target = str(relates.get("event_id", ""))
        choices = await self._choices_of(room_id, target) if number is not None else ()
        if number is None or not 1 <= number <= len(choices):
            return None
        name = await self._member_name(room_id, sender)
        return ButtonPress(str(event["event_id"]), room_id, thread, sender, target, choices[number - 1].data, name)

    async def _refuse_encrypted(self, room_id: str, room: _Room) -> None:
        if room.told_encrypted:
            return
        room.told_encrypted = True
        log.info("matrix.encrypted_room_refused")
        content = {"msgtype": "m.notice", "body": ENCRYPTED_ROOM_NOTICE}
        try:
            await self._send_event(room_id, content, paced=False)
        except PlatformRefused as refused:  # a room the bot may not post in: a refusal here would stop the sync
            log.warning("matrix.encrypted_room_not_told", reason=str(refused))

    def _mentions_bot(self, content: dict[str, Any]) -> bool:
        if self.user_id in content.get("m.mentions", {}).get("user_ids", []):
            return True
        body = str(content.get("body", "")).casefold()
        if self.user_id.casefold() in body or self.user_id in str(content.get("formatted_body", "")):
            return True
        name = self._display_name.casefold()
        return bool(name) and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", body) is not None

    async def _member_count(self, room_id: str, room: _Room) -> int:
        if room.members == 0:
            answer = await self._call("GET", f"{CLIENT}/rooms/{quote(room_id)}/joined_members")
            room.members = len(answer.get("joined", {}))
            self._pacer.is_group(room_id, room.members > 2)
        return room.members

    async def _member_name(self, room_id: str, user: str) -> str:
        if (room_id, user) in self._names:
            return self._names[(room_id, user)]
        try:
            state = await self._call("GET", f"{CLIENT}/rooms/{quote(room_id)}/state/m.room.member/{quote(user)}")
        except PlatformRefused:
            return user
        name = str(state.get("displayname") or user)
        _remember(self._names, (room_id, user), name)
        return name

    async def _event(self, room_id: str, event_id: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", f"{CLIENT}/rooms/{quote(room_id)}/event/{quote(event_id)}")
        except PlatformRefused:
            return None  # redacted, or from before the bot could see the room

    async def _choices_of(self, room_id: str, event_id: str) -> tuple[Choice, ...]:
        if (room_id, event_id) in self._prompts:
            return self._prompts[room_id, event_id]
        event = await self._event(room_id, event_id)
        if event is None or event.get("sender") != self.user_id:
            return ()
        raw = event.get("content", {}).get(CHOICES_FIELD, [])
        choices = tuple(Choice(str(item["label"]), str(item["data"])) for item in raw if isinstance(item, dict))
        _remember(self._prompts, (room_id, event_id), choices)
        return choices

    async def _sent_by_bot(self, room_id: str, event_id: str) -> bool:
        if event_id in self._own_events:
            return True
        event = await self._event(room_id, event_id)
        return event is not None and event.get("sender") == self.user_id

    # --- sending ------------------------------------------------------------------------------------------------

    async def _send_event(
        self,
        room_id: str,
        content: dict[str, Any],
        *,
        paced: bool = True,
        kind: str = "m.room.message",
        transaction: str = "",
    ) -> str:
        # The same id on every retry, and for a reply's part after a restart: the homeserver stores the event once.
        transaction = transaction or uuid.uuid4().hex

        async def perform() -> str:
            path = f"{CLIENT}/rooms/{quote(room_id)}/send/{kind}/{transaction}"
            answer = await self._call("PUT", path, json=content, paced=paced)
            return str(answer["event_id"])

        if not paced:
            event_id = await perform()
        else:
            job = _Job(perform, _shown(content))
            event_id = await self._paced(Send(room_id, job), job)
        _remember(self._own_events, event_id, None)
        return event_id

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
        if choices:
            markdown = f"{markdown}\n\n{numbered_choices(choices)}"
        parts = _parts_that_fit(markdown)
        keys: list[str] = []
        for index, part in enumerate(parts):
            if delivery is not None and index < delivery.parts_sent:
                continue
            content = _content(part.body, part.formatted_body)
            relation: dict[str, Any] = {}
            if thread:
                relation = {"rel_type": "m.thread", "event_id": thread, "is_falling_back": True}
                relation["m.in_reply_to"] = {"event_id": keys[-1] if keys else reply_to or thread}
                if reply_to and not keys:
                    relation["is_falling_back"] = False
            elif reply_to and index == 0:
                relation = {"m.in_reply_to": {"event_id": reply_to}}
            if relation:
                content["m.relates_to"] = relation
            if choices and index == len(parts) - 1:
                content[CHOICES_FIELD] = [{"label": choice.label, "data": choice.data} for choice in choices]
            transaction = _transaction_of(delivery.key, index) if delivery is not None else ""
            keys.append(await self._send_with_plain_fallback(chat, content, transaction))
            if choices and index == len(parts) - 1:
                _remember(self._prompts, (chat, keys[-1]), choices)
            if delivery is not None and delivery.part_sent is not None:
                await delivery.part_sent(index + 1)
        return keys

    async def _send_with_plain_fallback(self, chat: str, content: dict[str, Any], transaction: str = "") -> str:
        try:
            return await self._send_event(chat, content, transaction=transaction)
        except PlatformRefused as refused:
            if "formatted_body" not in content:
                raise
            log.warning("matrix.formatted_refused", reason=str(refused))
            plain = {key: value for key, value in content.items() if key not in ("format", "formatted_body")}
            return await self._send_event(chat, plain, transaction=transaction and f"{transaction}-plain")

    async def edit_text(self, chat: str, message_key: str, markdown: str, *, choices: tuple[Choice, ...] = ()) -> None:
        if choices:
            markdown = f"{markdown}\n\n{numbered_choices(choices)}"
        part = _parts_that_fit(markdown)[0]
        new_content = _content(part.body, part.formatted_body)
        if choices:
            new_content[CHOICES_FIELD] = [{"label": choice.label, "data": choice.data} for choice in choices]
        content = {
            **_content(f"* {part.body}", f"* {part.formatted_body}"),
            "m.new_content": new_content,
            "m.relates_to": {"rel_type": "m.replace", "event_id": message_key},
        }
        if choices:  # a decided prompt keeps its choices: a late answer is told it is no longer awaited
            _remember(self._prompts, (chat, message_key), choices)
        transaction = uuid.uuid4().hex

        async def perform() -> str:
            path = f"{CLIENT}/rooms/{quote(chat)}/send/m.room.message/{transaction}"
            return str((await self._call("PUT", path, json=content, paced=True))["event_id"])

        job = _Job(perform, _shown(new_content))
        await self._paced(Edit(chat, message_key, job), job)

    async def delete(self, chat: str, message_key: str) -> None:
        transaction = uuid.uuid4().hex

        async def perform() -> str:
            path = f"{CLIENT}/rooms/{quote(chat)}/redact/{quote(message_key)}/{transaction}"
            await self._call("PUT", path, json={}, paced=True)
            return ""

        self._prompts.pop((chat, message_key), None)
        await self._paced(Delete(chat, message_key), _Job(perform, {}))

    async def answer_press(self, press: ButtonPress, text: str = "") -> None:
        if not text:
            return
        # A notice in reply to the prompt: an edit of the prompt notifies nobody, and a reaction has no toast.
        relation: dict[str, Any] = {"m.in_reply_to": {"event_id": press.message_key}}
        if press.thread:
            relation.update({"rel_type": "m.thread", "event_id": press.thread, "is_falling_back": False})
        content: dict[str, Any] = {"msgtype": "m.notice", "body": text, "m.relates_to": relation}
        await self._send_event(press.chat, content)

    async def typing(self, chat: str, thread: str) -> None:
        path = f"{CLIENT}/rooms/{quote(chat)}/typing/{quote(self.user_id)}"
        await self._call("PUT", path, json={"typing": True, "timeout": 30_000})

    async def set_commands(self, commands: tuple[tuple[str, str], ...]) -> None:
        return  # Matrix has no command menu

    # --- files --------------------------------------------------------------------------------------------------

    async def download(self, file: IncomingFile, directory: str) -> str:
        match = re.fullmatch(r"mxc://([A-Za-z0-9.:\-\[\]]+)/([A-Za-z0-9_\-]+)", file.file_ref)
        if match is None:
            raise PlatformRefused(f"matrix: {file.file_ref!r} is not a media URI (mxc://server/id)")
        server, media_id = match.groups()
        target = _free_path(Path(directory), file.name)
        headers = {"Authorization": f"Bearer {self._token}"}
        for base in (f"{AUTHENTICATED_MEDIA}/download", f"{MEDIA_V3}/download"):
            url = f"{self._homeserver}{base}/{quote(server)}/{quote(media_id)}"
            try:
                with whole_request_within(FILE_SECONDS):
                    async with self._client.stream("GET", url, headers=headers, timeout=60.0) as response:
                        if response.status_code in (404, 400) and base.startswith(AUTHENTICATED_MEDIA):
                            continue  # a homeserver without authenticated media (before Matrix 1.11)
                        if response.status_code != 200:
                            raise PlatformRefused(
                                f"matrix: downloading {file.name!r} was refused (HTTP {response.status_code})"
                            )
                        async with await trio.open_file(target, "wb") as out:
                            async for chunk in response.aiter_bytes():
                                await out.write(chunk)
            except httpx.HTTPError as error:
                raise PlatformUnavailable(
                    f"matrix: downloading {file.name!r} failed ({type(error).__name__}); it is retried on restart"
                ) from None
            return str(target)
        raise PlatformRefused(f"matrix: the homeserver has no media download for {file.name!r}")

    async def send_file(self, chat: str, thread: str, path: str, name: str, media_type: str) -> str:
        data = await trio.Path(path).read_bytes()
        limit = await self._upload_limit()
        if limit is not None and len(data) > limit:
            raise PlatformRefused(
                f"{name} is {len(data)} bytes, over this homeserver's upload limit of {limit} bytes: not sent"
            )
        media_type = media_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
        uploaded = await self._call(
            "POST",
            f"{MEDIA_V3}/upload",
            params={"filename": name},
            content=data,
            headers={"Content-Type": media_type},
            time_limit=FILE_SECONDS,
        )
        content: dict[str, Any] = {
            "msgtype": "m.image" if media_type.startswith("image/") else "m.file",
            "body": name,
            "filename": name,
            "url": uploaded["content_uri"],
            "info": {"mimetype": media_type, "size": len(data)},
        }
        if thread:
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": thread, "is_falling_back": True}
        return await self._send_event(chat, content)

    async def _upload_limit(self) -> int | None:
        for path in (f"{AUTHENTICATED_MEDIA}/config", f"{MEDIA_V3}/config"):
            try:
                limit = (await self._call("GET", path)).get("m.upload.size")
            except PlatformRefused:
                continue
            return int(limit) if limit is not None else None
        return None

    async def aclose(self) -> None:
        try:
            if self._logged_in_by_password and self._token:
                with trio.move_on_after(5):
                    await self._call("POST", f"{CLIENT}/logout", json={})
        except (PlatformRefused, PlatformUnavailable):
            pass  # the device stays; nothing else depends on it
        finally:
            self._token = ""
            await self._client.aclose()


def _transaction_of(reply_key: str, part: int) -> str:
    """The transaction id of a reply's part: the same at every attempt, in every run of the bot. The homeserver
    remembers transaction ids per device (an access token's): with `access_token`, a part sent again after a crash
    is one event; a password login is a new device at each start, which cannot recognise it."""
    return hashlib.sha256(f"{reply_key}\0{part}".encode()).hexdigest()[:32]


def _retry_after(response: httpx.Response) -> float:
    try:
        milliseconds = response.json().get("retry_after_ms")
    except ValueError:
        milliseconds = None
    if milliseconds is None:
        header = response.headers.get("Retry-After", "")
        return float(header) if header.replace(".", "", 1).isdigit() else 1.0
    return max(float(milliseconds) / 1000, 0.0)


def _parts_that_fit(markdown: str) -> list[MatrixText]:
    """`markdown` rendered and split at the longest of PART_LIMITS whose parts each fit in one event."""
    for limit in PART_LIMITS:
        parts = matrix_parts(markdown, limit)
        if all(_event_bytes(part) <= EVENT_BYTES for part in parts):
            return parts
    return parts


def _event_bytes(part: MatrixText) -> int:
    return len(json.dumps(_content(part.body, part.formatted_body), ensure_ascii=False).encode())


def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHE_LIMIT:
        cache.popitem(last=False)


def _shown(content: dict[str, Any]) -> dict[str, Any]:
    """What a message shows, to compare an edit with: its text and choices, not its relations."""
    return {key: content[key] for key in ("body", "formatted_body", CHOICES_FIELD) if key in content}


def _path_for_log(path: str) -> str:
    """The endpoint without room, event and transaction ids: logs carry no message or room identifiers."""
    return re.sub(r"/[!$@#][^/]*|/[0-9a-f]{32}", "/…", unquote(path))


def _answer(response: httpx.Response, path: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    where = _path_for_log(path)
    if response.is_success:
        if not isinstance(body, dict):  # every client-server API answer is an object, `{}` at least
            raise PlatformUnavailable(
                f"matrix: {where} was answered {response.status_code} without a JSON object: is `homeserver` in the "
                "config the Matrix homeserver's address (a web site, or a proxy's error page, answers like this)?"
            )
        return body
    code = body.get("errcode", "") if isinstance(body, dict) else ""
    error = body.get("error", "") if isinstance(body, dict) else ""
    if (
        response.status_code in (401, 403)
        and code in ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_FORBIDDEN")
        and (where.endswith(("/login", "/whoami")))
    ):
        raise PlatformRefused(
            f"matrix: the homeserver refused the bot's login ({code}): check `user_id` and `password` or "
            "`access_token` in the config"
        )
    if response.status_code >= 500:
        raise PlatformUnavailable(f"matrix: {where} failed on the homeserver (HTTP {response.status_code})")
    raise PlatformRefused(f"matrix: {where} was refused (HTTP {response.status_code} {code}: {error})")


def _object(value: Any) -> dict[str, Any]:
    """`value` if it is a JSON object, else an empty one: a homeserver relays whatever a client puts in a content
    object, and one member's odd event must not stop the sync for the whole bot."""
    return value if isinstance(value, dict) else {}


def _number_in(text: str) -> int | None:
    """The number a reply to a prompt holds (digits 0-9 only: `str.isdigit` takes ², which `int` refuses)."""
    answer = text.strip()
    return int(answer) if re.fullmatch(r"[0-9]{1,3}", answer) else None


def _free_path(directory: Path, name: str) -> Path:
    """A new file in `directory` named after `name` (its last component, without odd characters, its end within
    `NAME_BYTES` of UTF-8: a file name may have 255 bytes, which 85 CJK characters fill)."""
    safe = re.sub(r"[^\w.\- ]", "_", Path(name).name)
    safe = safe.encode()[-NAME_BYTES:].decode(errors="ignore").strip(". ") or "file"
    candidate = directory / safe
    stem, suffix = candidate.stem, candidate.suffix
    counter = 1
    while candidate.exists():
        candidate = directory / f"{stem}-{counter}{suffix}"
        counter += 1
    return candidate


def _attached_file(content: dict[str, Any], body: str) -> tuple[tuple[IncomingFile, ...], str]:
    """A media message's file, and its text: the body is the file's name unless a filename is given apart."""
    info = _object(content.get("info"))
    name = str(content.get("filename") or body or "file")
    size = info.get("size")
    media_type = str(info.get("mimetype", ""))
    file = IncomingFile(content["url"], name, media_type, size if isinstance(size, int) else None)
    text = body if content.get("filename") and body != content.get("filename") else ""
    return (file,), text
