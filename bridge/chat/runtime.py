"""The delivery kit's runtime: `ChatBridge` carries one platform's updates to a host's turns and the replies back.

    async with open_host(profiles="profiles/", state="bot.sqlite3") as host:
        bridge = ChatBridge(host, platform, ChatSettings(profile="claude-sdk", allow_users={"42"}), inbox)
        await bridge.run()

What it guarantees (docs/chat.md): an update is acknowledged to the platform only once it is stored in the
`Inbox`; every stored update is answered once — after a crash, a turn cut off runs again and a reply
computed but not delivered is delivered; button presses are handled while the turn that asked still runs
(the poll loop never waits for a turn, only for the host to admit it, which keeps a conversation's turns in
order); only `allow_users` start turns and press buttons, within their daily budget.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

import trio

from ..dialects.coding_agents import tool_title
from ..dialects.events import FileEvent, PartialEvent, Question, QuestionRequest, RequestWithdrawn
from ..engine.loop import HostEvent
from ..engine.result import Outcome, TurnResult
from ..errors import (
    AnswerRefused,
    BridgeError,
    ChatError,
    HostClosed,
    OutboxError,
    OutboxFull,
    PlatformRefused,
    PlatformUnavailable,
    TurnError,
)
from ..files.outbox import open_collected, remove_outbox
from ..host.interface import BaseHost
from ..log import get_logger
from ..permissions import Decision, PermissionRequest
from ..turn import Attachment, Turn
from .inbox import Inbox, Stored
from .markup import markdown_text
from .platform import Batch, ButtonPress, Choice, Delivery, Incoming, Platform

COMMANDS: tuple[tuple[str, str], ...] = (
    ("new", "forget this conversation and start afresh"),
    ("cancel", "stop the running turn"),
    ("profile", "show or switch the agent (/profile NAME)"),
    ("status", "what runs, and today's use"),
    ("help", "what this bot understands"),
)
REFUSAL = "Sorry, this bot only answers the people its owner allowed."
NO_LONGER_WAITING = "no longer waiting"
KEYCAPS = ("1️⃣", "2️⃣", "3️⃣", "4️⃣", "5️⃣", "6️⃣", "7️⃣", "8️⃣", "9️⃣", "🔟")
DELIVERY_ATTEMPTS = 5
MAX_POLL_BACKOFF_SECS = 30.0
# The most of a command an approval prompt shows (three Telegram messages): past it, its start and its end, and
# a line saying it is shortened and how long it is.
PROMPT_COMMAND_CHARS = 12_000
PROMPT_COMMAND_TAIL_CHARS = 2_000


@dataclass(frozen=True)
class ChatSettings:
    """What the config says of one platform's bot (see `bridge.chat.config`).

    `allow_users`: the user ids (as the platform's `Incoming.user` gives them) who run turns and press
    buttons; nobody else. `answer_in_groups`: "mentioned" (only a message naming the bot or replying to it)
    or "always". Budgets are per user per UTC day; None: no limit. `clock` gives the time (seconds since the
    epoch) for days and the hourly refusal. The "typing" indicator is shown once a turn has run
    `typing_after_secs` (a reply that comes sooner needs none), then every `typing_interval_secs`.
    `turn_head_start_secs`: how long the turns a batch started run before the batch is synced, acknowledged and
    the next one polled for (see `ChatBridge.run`).
    """

    profile: str
    profiles: tuple[str, ...] = ()
    allow_users: frozenset[str] = frozenset()
    answer_in_groups: Literal["mentioned", "always"] = "mentioned"
    turns_per_day: int | None = None
    cost_usd_per_day: float | None = None
    refusal_interval_secs: float = 3600.0
    typing_after_secs: float = 0.5
    typing_interval_secs: float = 4.0
    turn_head_start_secs: float = 0.025
    clock: Callable[[], float] = time.time

    @property
    def switchable(self) -> tuple[str, ...]:
        """The profiles `/profile` may switch to (the default one at least)."""
        return self.profiles or (self.profile,)


@dataclass
class ChatCounts:
    """What one platform's bot did since the process started, for `connect --metrics` (docs/metrics.md)."""

    updates_received: int = 0  # messages and button presses stored (an update seen again is not counted)
    turns_started: int = 0
    replies_delivered: int = 0  # replies (and commands' answers) the platform took
    undeliverable: int = 0  # replies or files that finally could not be delivered (logged with their reason)
    refusals: int = 0  # messages from users not in allow_users (answered at most once an hour per chat)
    budget_refusals: int = 0  # turns not started: the user's daily budget was spent


def conversation_key(platform: str, chat: str, thread: str = "", generation: int = 0) -> str:
    """The host's conversation key: `<platform>:<chat>[:<thread>][#<generation>]`, with `%`, `:` and `#` in
    the ids escaped, so two chats never share a key (Matrix room ids hold colons). `/new` moves a chat to its
    next generation: a conversation with no stored session."""
    parts = [platform, chat] + ([thread] if thread else [])
    key = ":".join(part.replace("%", "%25").replace(":", "%3A").replace("#", "%23") for part in parts)
    return f"{key}#{generation}" if generation else key


@dataclass
class _Conversation:
    base: str  # the key without the generation
    chat: str
    thread: str
    turn_ids: list[str] = field(default_factory=list)  # its turns in flight, oldest (the running one) first
    free_text: _Prompt | None = None  # a question the user's next message answers


@dataclass
class _PromptMessage:
    """The message showing a prompt's question: its key once the platform took the send ("" if it never did), and
    the text an edit shows (the prompt's brief when it was sent in several parts: an edit replaces the last part
    only). A press can arrive before the send's answer does (the user sees the message first): its edit waits for
    `sent`."""

    text: str
    key: str = ""
    sent: trio.Event = field(default_factory=trio.Event)


@dataclass
class _Prompt:
    """A permission request or a question shown with choices, until it is answered or its turn ends."""

    token: str  # in each choice's data: which prompt's question a press is for (each question gets its own)
    conversation: _Conversation
    turn_id: str
    request_id: str
    text: str
    brief: str = ""  # what an edit shows of a prompt sent in several parts: it replaces the last part only
    message: _PromptMessage = field(default_factory=lambda: _PromptMessage(""))
    permission: PermissionRequest | None = None
    request: QuestionRequest | None = None
    index: int = 0  # the question of `request` shown now
    answers: dict[str, str | list[str]] = field(default_factory=dict)
    selected: list[str] = field(default_factory=list)  # a multi-select question's choices so far

    @property
    def question(self) -> Question | None:
        return self.request.questions[self.index] if self.request is not None else None


@dataclass
class _Reply:
    """A reply as the inbox keeps it until delivered: its text, the preview to delete, its files (name, media type,
    and the path of the copy beside the store, or why there is none), and how far its delivery got."""

    text: str
    preview: list[str] = field(default_factory=list)
    files: list[dict[str, str]] = field(default_factory=list)
    parts_sent: int = 0
    files_sent: int = 0

    def dumps(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def loads(cls, text: str) -> _Reply:
        values = json.loads(text)
        return cls(**{name: values[name] for name in _REPLY_FIELDS if name in values})


_REPLY_FIELDS = ("text", "preview", "files", "parts_sent", "files_sent")


class _Preview:
    """The partials of one turn as one message, edited as they grow; the platform paces the edits.

    Each change is handed to the platform at once, without waiting for the edit before it: the pacer merges the
    edits of one message still waiting, so the one that goes out shows the text as it is when its turn comes (a
    partial waits at most one pacing interval, not two; row 34 of `make bench`)."""

    def __init__(
        self, platform: Platform, chat: str, thread: str, on_sent: Callable[[list[str]], Awaitable[None]]
    ) -> None:
        self._platform = platform
        self._chat, self._thread = chat, thread
        self._on_sent = on_sent  # stores the keys: a preview left by a crash is deleted at the restart
        self.text = ""
        self.message_keys: list[str] = []  # the first is edited; more only when the first send was split
        self._changed = trio.Event()
        self._busy = 0  # the send or edits on their way
        self._idle = trio.Event()
        self._idle.set()

    def add(self, chunk: str) -> None:
        self.text += chunk
        self._changed.set()

    async def run(self) -> None:
        async with trio.open_nursery() as edits:
            while True:
                await self._changed.wait()
                self._changed = trio.Event()
                if not self.text.strip():
                    continue
                if not self.message_keys:
                    with trio.CancelScope(shield=True):  # a preview sent must be known, to be deleted
                        await self._update(self._send_first)
                else:
                    edits.start_soon(self._update, self._edit, self.text)

    async def _send_first(self) -> None:
        self.message_keys = await self._platform.send_text(self._chat, self._thread, self.text)
        await self._on_sent(self.message_keys)

    async def _edit(self, text: str) -> None:
        await self._platform.edit_text(self._chat, self.message_keys[0], text)

    async def _update(self, operation: Callable[..., Awaitable[None]], *args: str) -> None:
        self._busy += 1
        self._idle = trio.Event()
        try:
            await operation(*args)
        except BridgeError as err:
            get_logger(component="chat").warning("the live preview could not be updated", error=str(err))
        finally:
            self._busy -= 1
            if not self._busy:
                self._idle.set()

    async def settled(self) -> None:
        """Wait for the updates on their way (so a message sent now is not edited after its deletion)."""
        await self._idle.wait()


class ChatBridge:
    """One platform's bot over one host (see the module's docstring); `run()` until cancelled or `stop()`."""

    def __init__(self, host: BaseHost, platform: Platform, settings: ChatSettings, inbox: Inbox) -> None:
        self.host = host
        self.platform = platform
        self.settings = settings
        self.inbox = inbox
        self.counts = ChatCounts()
        self._conversations: dict[str, _Conversation] = {}
        self._prompts: dict[str, _Prompt] = {}
        self._nursery: trio.Nursery | None = None
        self._polling = trio.CancelScope()
        self._log = get_logger(component="chat", platform=platform.name)

    @property
    def undeliverable(self) -> int:
        """Replies and files that finally could not be delivered."""
        return self.counts.undeliverable

    # ------------------------------------------------------------------ the loop

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Log in, pick up what a previous run left unfinished, then poll until `stop()` (then wait for the
        turns in flight) or cancellation."""
        name = self.platform.name
        moved = await trio.to_thread.run_sync(self.inbox.moved_chats, name)
        self.platform.follow_moved_chats(moved, partial(self.inbox.chat_moved, name))
        await self.platform.start(await trio.to_thread.run_sync(self.inbox.position, name))
        await self.platform.set_commands(COMMANDS)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            unfinished = await trio.to_thread.run_sync(self.inbox.unfinished, name)
            if unfinished:
                self._log.info("picking up updates a previous run left unfinished", count=len(unfinished))
            for stored in unfinished:
                await self._dispatch(stored)
            task_status.started()
            with self._polling:
                while True:
                    batch = await self._poll()
                    # Stored (with the position) before the platform may forget them: a crash in between
                    # gets the batch again, and the ids already stored are skipped.
                    new = self.inbox.store_batch(name, batch.items, batch.position)  # on trio's thread: see _mark
                    self.counts.updates_received += len(new)
                    for stored in new:
                        await self._dispatch(stored)
                    if new:
                        # The turns just started go first: the sync, the acknowledgement and the next poll took
                        # the CPU from their agents' start. Row 32 of `make bench` (an echo turn through Telegram,
                        # 2 cores): 1.9 ms less at the median, ~8% of the turn. An update arriving meanwhile waits
                        # at most this long, and comes with the next batch.
                        await trio.sleep(self.settings.turn_head_start_secs)
                    # On the disk before the platform may forget them (the turns started meanwhile: a power cut
                    # before this fsync runs them again, a kill -9 does not lose what was stored).
                    await trio.to_thread.run_sync(self.inbox.sync)
                    await self.platform.acknowledge(batch.position)

    async def _poll(self) -> Batch:
        """The next batch, waiting out an unreachable platform (a conflict or a refused login ends the bot)."""
        delay = 1.0
        while True:
            try:
                return await self.platform.poll()
            except PlatformUnavailable as err:
                self._log.warning("the platform is unavailable; polling again", reason=str(err), in_secs=delay)
                await trio.sleep(delay)
                delay = min(delay * 2, MAX_POLL_BACKOFF_SECS)

    def stop(self) -> None:
        """Stop polling; `run()` returns once the turns in flight are over."""
        self._polling.cancel()

    async def _dispatch(self, stored: Stored) -> None:
        assert self._nursery is not None
        item = stored.item
        if stored.state == "answered":
            self._nursery.start_soon(self._deliver_stored, stored)
        elif isinstance(item, ButtonPress):
            self._on_press(item)
        elif (
            self.settings.answer_in_groups == "mentioned"
            and item.is_group
            and not (item.mentioned or item.reply_to_bot)
        ):
            await self._mark(item.update_id, "delivered")  # group talk not addressed to the bot
        elif item.user not in self.settings.allow_users:
            self._nursery.start_soon(self._refuse, item)
        elif item.text.startswith("/") and not item.files:
            # Its effect at once and in order (a /status after a /profile sees the switch); its reply
            # paced like any other, without holding up the updates after it.
            self._nursery.start_soon(self._reply, item, await self._command(item))
        elif (prompt := self._waiting_for_words(item)) is not None:
            self._answered(prompt, item.text, markdown_text(item.user_name or item.user))
            self._later(self._mark, item.update_id, "delivered")
        else:
            # Waits only until the host admits the turn, so a conversation's turns keep their order.
            # A turn cut off by a crash runs again; the preview it had sent goes first.
            left_preview = json.loads(stored.reply).get("preview", []) if stored.reply else []
            await self._nursery.start(self._turn, item, left_preview)

    # ------------------------------------------------------------------ turns

    async def _turn(
        self, item: Incoming, left_preview: list[str], task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        conversation = self._conversation(item)
        refusal = await self._over_budget(item.user)
        if refusal:
            self.counts.budget_refusals += 1
            task_status.started()
            await self._reply(item, refusal)
            return
        directory = tempfile.mkdtemp(prefix="agent-bridge-chat-") if item.files else ""  # only for downloads
        try:
            try:  # before the update is marked running: a crash meanwhile runs it again all the same
                turn = Turn(item.text, from_user=item.user, attachments=await self._download(item, directory))
            except BridgeError as err:
                task_status.started()
                files = not isinstance(err, TurnError)  # a TurnError: text no process can take (a NUL)
                what = "Your files could not be received" if files else "Your message could not be passed to the agent"
                await self._reply(item, f"{what}: {markdown_text(str(err))}")
                return
            stored = self.inbox.begin_turn(  # on trio's thread: see _mark
                self.platform.name, item.update_id, item.user, self._today(), conversation.base
            )
            profile, generation = self._profile_in(stored), 0 if stored is None else stored[1]
            await self._delete_preview(item, left_preview)

            async def store_preview(keys: list[str]) -> None:
                await self._mark(item.update_id, "running", json.dumps({"preview": keys}))

            preview = _Preview(self.platform, item.chat, item.thread, store_preview)
            result = await self._run_on_host(item, conversation, profile, generation, turn, preview, task_status)
            if result is None:
                return
            if result.usage is not None and result.usage.cost_usd:
                cost = result.usage.cost_usd
                await trio.to_thread.run_sync(
                    lambda: self.inbox.add_usage(self.platform.name, item.user, self._today(), cost_usd=cost)
                )
            await preview.settled()
            await self._answer(item, _reply_text(result), preview.message_keys, result.files)
        finally:
            if directory:
                shutil.rmtree(directory, ignore_errors=True)

    async def _run_on_host(
        self,
        item: Incoming,
        conversation: _Conversation,
        profile: str,
        generation: int,
        turn: Turn,
        preview: _Preview,
        task_status: trio.TaskStatus[None],
    ) -> TurnResult | None:
        """The turn on the host, with its preview and typing beside it; None when the host is shutting down (the
        update is queued again, for the next start)."""
        results: list[TurnResult] = []
        # Unique among turns in flight, a previous run's on the fleet included; the prompts name it.
        turn_id = f"{self.platform.name}-{item.update_id}-{secrets.token_hex(3)}"
        async with trio.open_nursery() as helpers:
            helpers.start_soon(preview.run)
            helpers.start_soon(self._keep_typing, conversation)
            try:
                await helpers.start(
                    self._submit,
                    profile,
                    generation,
                    conversation,
                    turn,
                    turn_id,
                    preview,
                    results,
                    helpers.cancel_scope.cancel,
                )
            except HostClosed:  # shutting down: the next start runs it
                await self._mark(item.update_id, "queued")
                task_status.started()
                helpers.cancel_scope.cancel()
                return None
            except BridgeError as err:  # refused before it ran: a full queue, an unknown profile
                self._log.warning("the turn was refused", error=str(err))
                results.append(_refused(str(err)))
                helpers.cancel_scope.cancel()
            else:
                self.counts.turns_started += 1
            task_status.started()
        self._close_prompts(turn_id)
        return results[0]

    async def _submit(
        self,
        profile: str,
        generation: int,
        conversation: _Conversation,
        turn: Turn,
        turn_id: str,
        preview: _Preview,
        results: list[TurnResult],
        done: Callable[[], None],
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async def on_event(event: HostEvent) -> None:
            if isinstance(event, PartialEvent):
                preview.add(event.text)
            elif isinstance(event, PermissionRequest | QuestionRequest):
                await self._ask(conversation, turn_id, event)
            elif isinstance(event, RequestWithdrawn):
                await self._withdrawn(turn_id, event.request_id)

        key = conversation_key(self.platform.name, conversation.chat, conversation.thread, generation)
        conversation.turn_ids.append(turn_id)
        try:
            result = await self.host.submit(
                profile, key, turn, on_event=on_event, turn_id=turn_id, task_status=task_status
            )
        finally:
            conversation.turn_ids.remove(turn_id)
        results.append(result)
        done()  # the preview and the typing end with the turn

    async def _keep_typing(self, conversation: _Conversation) -> None:
        # Telegram's advice: only for a reply that takes noticeable time. Sent as the turn starts, the call shared
        # the CPU with the agent's start and cost a quick turn ~10 ms at the median (row 32 of `make bench`).
        await trio.sleep(self.settings.typing_after_secs)
        while True:
            try:
                await self.platform.typing(conversation.chat, conversation.thread)
            except BridgeError as err:
                self._log.debug("typing could not be shown", error=str(err))
            await trio.sleep(self.settings.typing_interval_secs)

    async def _download(self, item: Incoming, directory: str) -> tuple[Attachment, ...]:
        attachments = []
        for file in item.files:
            path = await self.platform.download(file, directory)
            kind: Any = "image" if file.media_type.startswith("image/") else "file"
            attachments.append(Attachment(type=kind, url=path, name=file.name))
        return tuple(attachments)

    async def _over_budget(self, user: str) -> str:
        """Why `user` may not start a turn today ("" when they may)."""
        turns_limit, cost_limit = self.settings.turns_per_day, self.settings.cost_usd_per_day
        if turns_limit is None and cost_limit is None:
            return ""
        turns, cost = await trio.to_thread.run_sync(self.inbox.usage, self.platform.name, user, self._today())
        if turns_limit is not None and turns >= turns_limit:
            return f"You have used today's {turns_limit} turns. The budget renews at midnight UTC."
        if cost_limit is not None and cost >= cost_limit:
            return f"You have used today's budget of ${cost_limit:.2f}. It renews at midnight UTC."
        return ""

    def _today(self) -> str:
        return datetime.fromtimestamp(self.settings.clock(), UTC).date().isoformat()

    # ------------------------------------------------------------------ delivery

    async def _answer(self, item: Incoming, text: str, preview: list[str], files: tuple[FileEvent, ...]) -> None:
        """Store the reply (its files copied beside the store), then deliver it: a crash in between delivers it
        after the restart."""
        reply = _Reply(text, preview, await self._keep_files(item, files))
        await self._mark(item.update_id, "answered", reply.dumps())
        if files:
            remove_outbox(files[0].path.rpartition("/")[0])
        await self._deliver(item, reply)

    async def _keep_files(self, item: Incoming, files: tuple[FileEvent, ...]) -> list[dict[str, str]]:
        """Copy the outbox's files (read beneath its held descriptor, never by path) into the store's directory."""
        kept: list[dict[str, str]] = []
        for number, file in enumerate(files):
            entry = {"name": file.name, "media_type": file.media_type}

            def keep(file: FileEvent = file, number: int = number) -> str:
                with open_collected(file) as source:
                    return self.inbox.keep_file(self.platform.name, item.update_id, number, source)

            try:
                entry["path"] = await trio.to_thread.run_sync(keep)
            except OutboxError as err:
                entry["error"] = str(err)
            kept.append(entry)
        return kept

    async def _deliver_stored(self, stored: Stored) -> None:
        assert isinstance(stored.item, Incoming) and stored.reply is not None
        await self._deliver(stored.item, _Reply.loads(stored.reply))

    async def _deliver(self, item: Incoming, reply: _Reply) -> None:
        """Send what of the reply the platform has not taken yet, recording each part and file as it is taken (one
        transaction each), then mark the update delivered."""
        if not reply.parts_sent:
            await self._delete_preview(item, reply.preview)

        async def part_sent(count: int) -> None:
            reply.parts_sent = count
            await self._mark(item.update_id, "answered", reply.dumps())

        if reply.text:
            delivery = Delivery(f"{self.platform.name}:{item.update_id}", reply.parts_sent, part_sent)
            sent = await self._send(item.chat, item.thread, reply.text, delivery=delivery)
            if sent is None:
                return  # left answered: the next start tries again, from the part not taken
            if sent or reply.parts_sent:
                self.counts.replies_delivered += 1
        for number in range(reply.files_sent, len(reply.files)):
            await self._send_file(item, reply.files[number])
            reply.files_sent = number + 1
            await self._mark(item.update_id, "answered", reply.dumps())
        await self._mark(item.update_id, "delivered")
        if reply.files:
            await trio.to_thread.run_sync(self.inbox.drop_files, self.platform.name, item.update_id)

    async def _delete_preview(self, item: Incoming, keys: list[str]) -> None:
        for key in keys:
            try:
                await self.platform.delete(item.chat, key)
            except BridgeError as err:
                self._log.warning("the preview could not be deleted", error=str(err))

    async def _send(
        self, chat: str, thread: str, text: str, choices: tuple[Choice, ...] = (), delivery: Delivery | None = None
    ) -> list[str] | None:
        """Send, trying again while the platform is unavailable; None (logged, counted) when it never took it."""
        delay = 1.0
        for attempt in range(DELIVERY_ATTEMPTS):
            try:
                return await self.platform.send_text(chat, thread, text, choices=choices, delivery=delivery)
            except (PlatformUnavailable, OutboxFull) as err:  # the outbox drains at the platform's pace meanwhile
                if attempt == DELIVERY_ATTEMPTS - 1:
                    self.counts.undeliverable += 1
                    self._log.error(
                        "a reply could not be delivered; it is tried again at the next start", reason=str(err)
                    )
                    return None
                self._log.warning("the reply could not go out yet; trying again", reason=str(err), in_secs=delay)
                await trio.sleep(delay)
                delay *= 2
            except ChatError as err:  # refused for good (PlatformRefused), or anything else it will not take
                self.counts.undeliverable += 1
                self._log.error("a reply could not be delivered: the platform refused it", reason=str(err))
                return []
        return None

    async def _send_file(self, item: Incoming, file: dict[str, str]) -> None:
        """Send one of the reply's kept files, or a note saying why it cannot be."""
        name = file["name"]
        try:
            if "error" in file:
                raise OutboxError(file["error"])
            await self.platform.send_file(item.chat, item.thread, file["path"], name, file["media_type"])
        except (PlatformRefused, OutboxError) as err:
            reason = f"The file '{markdown_text(name)}' could not be sent: {markdown_text(str(err))}"
            await self._send(item.chat, item.thread, reason)
        except BridgeError as err:
            self.counts.undeliverable += 1
            self._log.error("a file could not be delivered", reason=str(err))

    async def _reply(self, item: Incoming, text: str) -> None:
        """Answer an update with a short note (a command's, a refusal) and mark it delivered."""
        reply = _Reply(text)
        await self._mark(item.update_id, "answered", reply.dumps())
        await self._deliver(item, reply)

    async def _mark(self, update_id: str, state: Any, reply: str | None = None) -> None:
        # The inbox's writes on a turn's path (this, `store_batch`, `begin_turn`) run on trio's thread: each is one
        # sub-millisecond SQLite transaction that never waits for another process (the bot lock keeps them off the
        # file; the fsyncs and checkpoints are `sync()`'s, in a worker thread). A hop to a worker thread and back
        # cost ~1.5 ms on a loaded machine, and a turn made three: row 32 of `make bench`.
        await trio.lowlevel.checkpoint()
        self.inbox.mark(self.platform.name, update_id, state, reply)

    # ------------------------------------------------------------------ access

    async def _refuse(self, item: Incoming) -> None:
        self._log.info("a message from a user not allowed; no turn")
        self.counts.refusals += 1
        now = self.settings.clock()
        interval = self.settings.refusal_interval_secs
        if await trio.to_thread.run_sync(self.inbox.claim_refusal, self.platform.name, item.chat, now, interval):
            await self._reply(item, REFUSAL)
        else:
            await self._mark(item.update_id, "delivered")

    # ------------------------------------------------------------------ commands

    async def _command(self, item: Incoming) -> str:
        """Carry out a command; its answer."""
        word, _, rest = item.text[1:].partition(" ")
        name = word.partition("@")[0].lower()  # Telegram's /cmd@botname in groups
        conversation = self._conversation(item)
        argument = rest.strip()
        if name == "new":
            generation = await self._generation(conversation) + 1
            profile = await self._profile_of(conversation)
            await trio.to_thread.run_sync(
                self.inbox.set_conversation, self.platform.name, conversation.base, profile, generation
            )
            text = "Started a new conversation: the agent no longer remembers this one."
        elif name == "cancel":
            if any(self.host.cancel(turn_id) for turn_id in conversation.turn_ids[:1]):
                text = "Cancelling the running turn."
            else:
                text = "Nothing is running."
        elif name == "profile":
            text = await self._switch_profile(conversation, argument)
        elif name == "status":
            profile = await self._profile_of(conversation)
            turns, cost = await trio.to_thread.run_sync(self.inbox.usage, self.platform.name, item.user, self._today())
            waiting = len(conversation.turn_ids) - 1
            state = (
                "idle"
                if not conversation.turn_ids
                else "a turn is running" + (f", {waiting} waiting" if waiting > 0 else "")
            )
            used = f"{turns} turn(s)" + (f", ${cost:.2f}" if cost else "")
            limit = f" of {self.settings.turns_per_day}" if self.settings.turns_per_day is not None else ""
            text = f"Profile: {profile}. Now: {state}. Today you used {used}{limit}."
        else:
            lines = [f"/{command} — {description}" for command, description in COMMANDS]
            text = "\n".join(["Send a message to talk to the agent. Commands:", *lines])
        return text

    async def _switch_profile(self, conversation: _Conversation, name: str) -> str:
        current = await self._profile_of(conversation)
        choices = ", ".join(self.settings.switchable)
        if not name:
            return f"Profile: {current}. Available: {choices}."
        if name not in self.settings.switchable:
            return f"No profile '{markdown_text(name)}' here. Available: {choices}."
        generation = await self._generation(conversation)
        await trio.to_thread.run_sync(
            self.inbox.set_conversation, self.platform.name, conversation.base, name, generation
        )
        return f"Switched to {name}."

    # ------------------------------------------------------------------ approvals and questions

    async def _ask(
        self, conversation: _Conversation, turn_id: str, request: PermissionRequest | QuestionRequest
    ) -> None:
        prompt = _Prompt(secrets.token_hex(4), conversation, turn_id, request.request_id, "")
        if isinstance(request, PermissionRequest):
            prompt.permission = request
            what = tool_title(request.input, limit=None) or request.title or request.tool
            prompt.text = f"The agent asks to use **{request.tool}**" + (
                f": {_shown_command(what)}" if what != request.tool else ""
            )
            prompt.brief = f"The agent asks to use **{request.tool}**: the request above."
        else:
            prompt.request = request
        self._prompts[prompt.token] = prompt
        await self._show(prompt)

    async def _show(self, prompt: _Prompt) -> None:
        """Send the prompt's current question (a new message), with its choices."""
        question = prompt.question
        if question is not None:
            prompt.text = "\n\n".join(
                part for part in (question.header and f"**{question.header}**", question.prompt) if part
            )
            prompt.brief = "The question above."
            prompt.selected = []
            if question.free_text or not question.options:
                prompt.conversation.free_text = prompt
                prompt.text += (
                    "\n\n(answer with a message)" if not question.options else "\n\n(or answer with a message)"
                )
        message = prompt.message = _PromptMessage(prompt.text)
        try:
            keys = await self._send(
                prompt.conversation.chat, prompt.conversation.thread, prompt.text, self._choices(prompt)
            )
            message.key = keys[-1] if keys else ""
            if keys and len(keys) > 1:
                message.text = prompt.brief
        finally:
            message.sent.set()

    def _choices(self, prompt: _Prompt) -> tuple[Choice, ...]:
        if prompt.permission is not None:
            return (
                Choice("Allow", f"{prompt.token}:allow"),
                Choice("Allow for this session", f"{prompt.token}:always"),
                Choice("Deny", f"{prompt.token}:deny"),
            )
        question = prompt.question
        assert question is not None
        choices = [
            Choice(("✅ " if option.label in prompt.selected else "") + option.label, f"{prompt.token}:{index}")
            for index, option in enumerate(question.options)
        ]
        if question.multi_select:
            choices.append(Choice("Done", f"{prompt.token}:done"))
        return tuple(choices)

    def _on_press(self, press: ButtonPress) -> None:
        """Decide at once, in the order the presses came (a multi-select's toggles, then Done); what the platform
        is told follows in tasks of its own."""
        self._handle_press(press)
        self._later(self._mark, press.update_id, "delivered")

    def _handle_press(self, press: ButtonPress) -> None:
        token, _, choice = press.data.partition(":")
        prompt = self._prompts.get(token)
        if press.user not in self.settings.allow_users:
            self._later(self.platform.answer_press, press, "You may not answer this.")
            return
        # A press from another chat (a forged callback, a reaction to another room's prompt) is not this prompt's.
        if prompt is None or prompt.conversation.chat != press.chat or not self.host.in_flight(prompt.turn_id):
            self._later(self.platform.answer_press, press, NO_LONGER_WAITING)
            return
        who = markdown_text(press.user_name or press.user)
        if prompt.permission is not None:
            decision = {
                "allow": (Decision(allow=True), "Allowed"),
                "always": (Decision(allow=True, always=True), "Allowed for this session"),
                "deny": (Decision(allow=False), "Denied"),
            }.get(choice)
            if decision is None:  # data no button carries: the prompt still waits for a real press
                self._later(self.platform.answer_press, press, NO_LONGER_WAITING)
                return
            if not self.host.decide(prompt.turn_id, prompt.request_id, decision[0]):
                self._later(self.platform.answer_press, press, NO_LONGER_WAITING)
                self._forget(prompt)
                return
            self._later(self.platform.answer_press, press, decision[1])
            self._forget(prompt)
            self._later(self._edit, prompt.conversation.chat, prompt.message, f"{decision[1]} by {who}.")
            return
        question = prompt.question
        assert question is not None
        if choice == "done":
            self._later(self.platform.answer_press, press, "Done")
            self._answered(prompt, list(prompt.selected), who)
            return
        if not choice.isdecimal() or int(choice) >= len(question.options):  # isdigit takes ², which int refuses
            self._later(self.platform.answer_press, press, NO_LONGER_WAITING)
            return
        label = question.options[int(choice)].label
        if question.multi_select:
            prompt.selected.remove(label) if label in prompt.selected else prompt.selected.append(label)
            self._later(self.platform.answer_press, press, label)
            self._later(self._edit_choices, prompt)
            return
        self._later(self.platform.answer_press, press, label)
        self._answered(prompt, label, who)

    def _waiting_for_words(self, item: Incoming) -> _Prompt | None:
        """The question of the conversation the user's next message answers, if one still waits."""
        conversation = self._conversation(item)
        prompt = conversation.free_text
        if prompt is not None and (prompt.token not in self._prompts or not self.host.in_flight(prompt.turn_id)):
            conversation.free_text = prompt = None  # its turn is over: the message is a message
        return prompt

    def _answered(self, prompt: _Prompt, answer: str | list[str], who: str) -> None:
        """A question of the prompt has its answer: show the decision, then ask the next or answer them all."""
        question, request = prompt.question, prompt.request
        assert question is not None and request is not None
        if prompt.conversation.free_text is prompt:
            prompt.conversation.free_text = None
        prompt.answers[question.id] = answer
        shown = markdown_text(answer if isinstance(answer, str) else ", ".join(answer) or "nothing")
        self._later(self._edit, prompt.conversation.chat, prompt.message, f"{who} answered: {shown}")
        if prompt.index + 1 < len(request.questions):
            prompt.index += 1
            # The next question's buttons carry a token of their own: a press still coming for this one's (a client
            # that did not see the edit yet) is no longer waited for, and never answers the next question.
            self._prompts.pop(prompt.token, None)
            prompt.token = secrets.token_hex(4)
            self._prompts[prompt.token] = prompt
            self._later(self._show, prompt)
            return
        self._forget(prompt)
        try:
            self.host.answer(prompt.turn_id, prompt.request_id, dict(prompt.answers))
        except AnswerRefused as err:
            self._log.warning("an answer did not fit the question", error=str(err))

    def _later(self, operation: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run `operation` in a task of its own; a platform's error there is logged, and the bot goes on."""

        async def guarded() -> None:
            try:
                await operation(*args)
            except ChatError as err:
                self._log.warning("the platform did not take a call", error=str(err))

        assert self._nursery is not None
        self._nursery.start_soon(guarded)

    async def _edit_choices(self, prompt: _Prompt) -> None:
        """Show a multi-select prompt's choices as they are when the edit goes out."""
        await self._edit(prompt.conversation.chat, prompt.message, "", self._choices(prompt))

    async def _withdrawn(self, turn_id: str, request_id: str) -> None:
        for prompt in list(self._prompts.values()):
            if prompt.turn_id == turn_id and prompt.request_id == request_id:
                self._forget(prompt)
                await self._edit(prompt.conversation.chat, prompt.message, "The agent withdrew this request.")

    async def _edit(self, chat: str, message: _PromptMessage, note: str, choices: tuple[Choice, ...] = ()) -> None:
        """Show the prompt's message as it was sent (its brief, when split) with `note` under it."""
        await message.sent.wait()
        if not message.key:
            return
        try:
            await self.platform.edit_text(
                chat, message.key, "\n\n".join(filter(None, (message.text, note))), choices=choices
            )
        except BridgeError as err:
            self._log.warning("a prompt could not be updated", error=str(err))

    def _forget(self, prompt: _Prompt) -> None:
        self._prompts.pop(prompt.token, None)
        if prompt.conversation.free_text is prompt:
            prompt.conversation.free_text = None

    def _close_prompts(self, turn_id: str) -> None:
        for prompt in [prompt for prompt in self._prompts.values() if prompt.turn_id == turn_id]:
            self._forget(prompt)

    # ------------------------------------------------------------------ conversations

    def _conversation(self, item: Incoming) -> _Conversation:
        base = conversation_key(self.platform.name, item.chat, item.thread)
        conversation = self._conversations.get(base)
        if conversation is None:
            conversation = self._conversations[base] = _Conversation(base, item.chat, item.thread)
        return conversation

    async def _profile_of(self, conversation: _Conversation) -> str:
        return self._profile_in(
            await trio.to_thread.run_sync(self.inbox.conversation, self.platform.name, conversation.base)
        )

    def _profile_in(self, stored: tuple[str, int] | None) -> str:
        """The profile of a conversation as the inbox holds it (None: the defaults)."""
        if stored is None or stored[0] not in self.settings.switchable:
            return self.settings.profile
        return stored[0]

    async def _generation(self, conversation: _Conversation) -> int:
        stored = await trio.to_thread.run_sync(self.inbox.conversation, self.platform.name, conversation.base)
        return 0 if stored is None else stored[1]


def _shown_command(command: str) -> str:
    """`command` as Markdown that shows it exactly (a command of several lines as a code block); past
    `PROMPT_COMMAND_CHARS`, its start and its end, saying plainly that it is shortened and how long it is."""
    if len(command) <= PROMPT_COMMAND_CHARS:
        return _code(command)
    head, tail = PROMPT_COMMAND_CHARS - PROMPT_COMMAND_TAIL_CHARS, PROMPT_COMMAND_TAIL_CHARS
    return (
        f"{_code(command[:head])} … {_code(command[-tail:])}\n\n**Shortened:** the command is {len(command):,} "
        f"characters long, too long to show in chat; above are its first {head:,} and its last {tail:,}."
    )


def _code(text: str) -> str:
    """`text` as inline code, or as a code block when it has several lines (inline code shows a line break as a
    space); either shows it exactly."""
    if "\n" not in text and "\r" not in text:
        return _code_span(text)
    fence = "`" * max(3, max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"\n\n{fence}\n{text}\n{fence}"


def _code_span(text: str) -> str:
    """`text` as Markdown inline code that shows it exactly, backticks and all (CommonMark: fenced by a run of
    backticks longer than any in it, and spaced from a backtick at either end), as an approval must show it."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    space = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{space}{text}{space}{fence}"


def _refused(error: str) -> TurnResult:
    return TurnResult(
        reply="",
        session_id="",
        error=error,
        error_reply=f"The turn could not start: {error}",
        exit_code=1,
        timed_out=False,
        outcome=Outcome.SPAWN_FAILED,
        stderr_tail="",
        duration_ms=0,
        partials=0,
        truncated=False,
    )


def _reply_text(result: TurnResult) -> str:
    if result.folded_into:
        return ""  # steered into the running turn, whose reply answers it
    if result.outcome is Outcome.CANCELLED:
        return "Cancelled."
    text = result.reply if result.ok else (result.error_reply or result.error or "The agent failed.")
    if not text.strip() and not result.files:
        text = "(The agent gave no reply.)"
    if result.files_note:
        note = markdown_text(result.files_note)
        text = f"{text}\n\n{note}" if text else note
    return text


__all__ = ["COMMANDS", "ChatBridge", "ChatCounts", "ChatSettings", "conversation_key"]
