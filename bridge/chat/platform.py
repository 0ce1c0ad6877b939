"""What a chat platform's connector gives the delivery kit, and the platform-neutral values it speaks in.

A connector (Telegram, Matrix, …) is one class implementing `Platform`: it logs in, long-polls updates and
turns them into `Incoming` messages and `ButtonPress`es, and sends, edits and deletes messages — rendering
Markdown and pacing itself (`bridge.chat.markup`, `bridge.chat.pacing`). Everything else (conversations,
access, budgets, the live preview, approvals, files, durability) is `bridge.chat.runtime`'s, the same for
every platform. docs/chat.md "Writing a connector" says what each method must do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class IncomingFile:
    """A file sent to the bot: the platform's own reference to download it by (never a URL carrying a token),
    its name, its media type and its size in bytes (None when the platform does not say)."""

    file_ref: str
    name: str
    media_type: str
    size: int | None = None


@dataclass(frozen=True, slots=True)
class Incoming:
    """A message to the bot. `update_id` is unique per platform and stable across restarts (what de-duplicates);
    `chat` and `thread` ("" when none) name the conversation; `user` is the sender's id as `allow_users` lists
    it. `mentioned`: the bot was named in it; `reply_to_bot`: it replies to one of the bot's messages."""

    update_id: str
    chat: str
    thread: str
    user: str
    user_name: str
    text: str
    is_group: bool = False
    mentioned: bool = False
    reply_to_bot: bool = False
    files: tuple[IncomingFile, ...] = ()


@dataclass(frozen=True, slots=True)
class ButtonPress:
    """A choice pressed (or, on a platform without buttons, picked by a reply or a reaction): `data` is the
    `Choice.data` of the choice, `message_key` the message that showed it."""

    update_id: str
    chat: str
    thread: str
    user: str
    message_key: str
    data: str
    user_name: str = ""


@dataclass(frozen=True, slots=True)
class Choice:
    """One button: the `label` people read and the `data` a press gives back (at most 64 bytes)."""

    label: str
    data: str


@dataclass
class Delivery:
    """A reply on its way, as the kit keeps it durable across restarts. `key` names the reply for good: a platform
    whose sends are idempotent derives their ids from it and the part's number (Matrix's transaction ids), so a
    part sent again after a crash is stored once. `parts_sent`: the parts the platform already took, skipped.
    `part_sent(count)` is awaited as soon as the platform took each part, to record it before the next goes."""

    key: str
    parts_sent: int = 0
    part_sent: Callable[[int], Awaitable[None]] | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """Updates from one poll, and the `position` to acknowledge once they are stored."""

    items: tuple[Incoming | ButtonPress, ...]
    position: str


class Platform(Protocol):
    """A chat platform's connector; see docs/chat.md "Writing a connector"."""

    name: str
    rate_limited: int  # the platform's 429s waited out so far (connect --metrics)

    def follow_moved_chats(self, moved: dict[str, str], record: Callable[[str, str], None]) -> None:
        """Before `start`: the chats the platform moved to a new id (old id -> new id, as stored) and how to store
        a move it sees (`record(old, new)`, synchronous). A moved chat keeps its old id in `Incoming` and
        `ButtonPress` (its conversation's, so its session goes on), and what is sent to the old id goes to the
        new one. A platform whose chats never move does nothing."""

    async def start(self, position: str | None) -> None:
        """Log in and check the credentials; `position` is the last acknowledged (None: from the platform's own
        start, never dropping pending updates)."""

    async def poll(self) -> Batch:
        """Long-poll the updates after the current position; `PlatformConflict` when another process polls."""
        ...

    async def acknowledge(self, position: str) -> None:
        """The batch up to `position` is stored: the platform may forget it."""

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
        """Send `markdown` (rendered, split, paced, retried); the keys of the messages sent, in order; `choices`
        go with the last part. With `delivery`: skip the parts already sent, report each part as it is taken."""
        ...

    async def edit_text(self, chat: str, message_key: str, markdown: str, *, choices: tuple[Choice, ...] = ()) -> None:
        """Replace one message's text (cut to one part); "not modified" is not an error."""

    async def delete(self, chat: str, message_key: str) -> None:
        """Delete one of the bot's messages."""

    async def answer_press(self, press: ButtonPress, text: str = "") -> None:
        """Acknowledge a press (Telegram's button stops spinning), with a short note when given."""

    async def typing(self, chat: str, thread: str) -> None:
        """Show that the bot is working."""

    async def download(self, file: IncomingFile, directory: str) -> str:
        """Download `file` into `directory`; its path. The bot's credentials never appear in it."""
        ...

    async def send_file(self, chat: str, thread: str, path: str, name: str, media_type: str) -> str:
        """Send a file (an image as a picture); its message key. `PlatformRefused` over the platform's limit."""
        ...

    async def set_commands(self, commands: tuple[tuple[str, str], ...]) -> None:
        """Publish the bot's commands (name, description), where the platform lists them."""

    async def aclose(self) -> None:
        """Log out of nothing, close the connections."""


__all__ = ["Batch", "ButtonPress", "Choice", "Delivery", "Incoming", "IncomingFile", "Platform"]
