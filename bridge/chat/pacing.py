"""When each message to a chat platform may go out. Pure: no I/O, no clock (every time is passed in), no trio.

A connector submits its operations — `Send`, `Edit`, `Delete` — and asks `next(now)` which one to carry out now,
or how long until one is due; it reports each one handed out back with `done` or, on the platform's 429,
`retry_after`. The rules (docs/chat.md, "Pacing"):

- never faster than the platform's limits (`PaceLimits`): every operation counts against them, edits and deletes
  as well as sends, from the moment it is handed out;
- one operation of a chat in flight at a time, so a chat's messages arrive in the order they were submitted;
- in a chat, sends and deletes go first, in the order submitted; edits after them. Across chats too: a chat with
  a send waiting goes before one with only edits, and among equals the chat that has waited longest goes first;
- the pending edits of one message are merged (only the last payload is kept, in the first one's place); an edit
  whose payload is what that message already shows (or is being changed to) is dropped; a delete drops the
  pending edits of its message, and an edit of a message whose delete is pending is dropped;
- a 429 puts its operation back first in its chat and holds the chat (or every chat, for a platform whose limit
  is the account's, or when the caller says so) for the seconds the platform asked;
- memory is bounded: at most `max_pending_per_chat` operations wait in one chat and `max_pending` in all;
  one more is refused with `OutboxFull`, never dropped unseen, so the caller can log and count it.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Generic, TypeAlias, TypeVar

from ..errors import OutboxFull, ProtocolMisuse

Payload = TypeVar("Payload")  # what the connector sends: rendered text, with its entities or HTML


@dataclass(frozen=True, slots=True)
class PaceLimits:
    """A platform's rate limits, as the pacer keeps them.

    `per_chat_interval`: the least time between two operations in one chat, in seconds.
    `group_per_minute`: at most this many operations in any minute in one group chat (see `Pacer.is_group`).
    `global_per_second`: at most this many operations in any second across all chats — or, when `global_burst`
    is set, a token bucket: `global_burst` operations at once, then `global_per_second` a second (which may be
    a fraction), as Synapse counts a user's messages.
    `retry_after_holds_all`: a 429 holds every chat (the limit it reports is the account's), not only its own.
    `window_margin`: seconds added to the one-second window, since the server counts arrivals, not departures.
    """

    per_chat_interval: float
    group_per_minute: int
    global_per_second: float
    global_burst: int | None = None
    retry_after_holds_all: bool = False
    window_margin: float = 0.0

    def __post_init__(self) -> None:
        if self.per_chat_interval < 0:
            raise ValueError("per_chat_interval must be 0 or more seconds")
        if self.group_per_minute < 1:
            raise ValueError("group_per_minute must be at least 1")
        if self.global_per_second <= 0:
            raise ValueError("global_per_second must be more than 0")
        if self.global_burst is not None and self.global_burst < 1:
            raise ValueError("global_burst must be at least 1 (or None: a window of one second)")
        if self.global_burst is None and self.global_per_second != int(self.global_per_second):
            raise ValueError("global_per_second must be a whole number when global_burst is None (a window)")


# The window's margin, for row 33 of `make bench` (200 chats at once): a send handed out on time can reach Telegram
# tens of milliseconds late when the bot is busy, and the next one in time: 31 arrivals in one second, a 429 that
# holds the bot for a second, and the sends of every other chat meeting it (measured: 165 429s and 12 s for the 200
# replies without the margin; none and 7.8 s with it).
TELEGRAM_LIMITS = PaceLimits(per_chat_interval=1.0, group_per_minute=20, global_per_second=30, window_margin=0.2)
"""The Bot FAQ's: one message a second in a chat, 20 a minute in a group, 30 a second in all; edits count."""

MATRIX_LIMITS = PaceLimits(
    per_chat_interval=1.0, group_per_minute=60, global_per_second=0.2, global_burst=8, retry_after_holds_all=True
)
"""Synapse's default `rc_message` (0.2 a second, a burst of 10, per user: one bot is one user, so every room
shares it), kept two short of the burst since the server counts arrivals, not our departures. A room gets no
more than one a second besides. A homeserver that exempts the bot (the admin API's `override_ratelimit`) allows
more, used once the chat config's `pace.account_per_second` and `pace.account_burst` say how much; a 429 holds
every room, the limit being the account's."""


@dataclass(frozen=True, slots=True)
class Send(Generic[Payload]):
    """Post a new message in `chat`."""

    chat: str
    payload: Payload


@dataclass(frozen=True, slots=True)
class Edit(Generic[Payload]):
    """Change the message `message_key` of `chat` to show `payload`."""

    chat: str
    message_key: str
    payload: Payload


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove the message `message_key` of `chat`."""

    chat: str
    message_key: str


Op: TypeAlias = Send[Payload] | Edit[Payload] | Delete


@dataclass(slots=True)
class _Pending(Generic[Payload]):
    op: Op[Payload]
    seq: int  # submission order; a merged edit keeps its first one's


@dataclass(slots=True)
class _Chat(Generic[Payload]):
    first: deque[_Pending[Payload]] = field(default_factory=deque)  # sends and deletes, in order
    edits: OrderedDict[str, _Pending[Payload]] = field(default_factory=OrderedDict)  # by message key
    in_flight: Op[Payload] | None = None
    last_at: float = -math.inf  # when its last operation was handed out
    recent: deque[float] = field(default_factory=deque)  # hand-out times within the last minute (groups)
    held_until: float = -math.inf

    def pending(self) -> int:
        return len(self.first) + len(self.edits)

    def head(self) -> _Pending[Payload] | None:
        if self.first:
            return self.first[0]
        return next(iter(self.edits.values()), None)


class Pacer(Generic[Payload]):
    """The outboxes of one platform's chats and the global one; see the module's docstring for the rules."""

    def __init__(self, limits: PaceLimits, *, max_pending_per_chat: int = 100, max_pending: int = 10_000) -> None:
        self.limits = limits
        self.max_pending_per_chat = max_pending_per_chat
        self.max_pending = max_pending
        self._chats: dict[str, _Chat[Payload]] = {}
        self._groups: set[str] = set()
        self._pending = 0
        self._seq = 0
        self._global_times: deque[float] = deque()  # hand-out times within the last second (window limit)
        self._tokens = float(limits.global_burst or 0)  # the token bucket (global_burst set)
        self._tokens_at = -math.inf
        self._held_until = -math.inf  # a 429 that holds every chat
        # What each recent message shows, or is being changed to: an edit repeating it is dropped. Bounded: a
        # forgotten message only costs an edit the platform answers "not modified".
        self._shown: OrderedDict[tuple[str, str], Payload] = OrderedDict()
        self._shown_limit = 4096

    # -------------------------------------------------------------------- the caller's operations

    def is_group(self, chat: str, group: bool) -> None:
        """Say whether `chat` is a group (its operations then also count against `group_per_minute`)."""
        if group:
            self._groups.add(chat)
        else:
            self._groups.discard(chat)

    def submit(self, op: Op[Payload], now: float) -> None:
        """Queue `op`; raises `OutboxFull` (and keeps nothing of it) when its chat's or the global bound is reached.

        An edit merged into a pending one, or repeating what its message shows, is absorbed here: nothing more
        goes out for it.
        """
        chat = self._chats.get(op.chat)
        if isinstance(op, Edit):
            key = (op.chat, op.message_key)
            pending = chat.edits.get(op.message_key) if chat is not None else None
            if pending is not None:
                assert chat is not None
                if key in self._shown and self._shown[key] == op.payload:
                    del chat.edits[op.message_key]  # back to what the message shows: nothing left to change
                    self._pending -= 1
                else:
                    pending.op = op
                return
            if key in self._shown and self._shown[key] == op.payload:
                return
            if chat is not None and any(
                isinstance(entry.op, Delete) and entry.op.message_key == op.message_key for entry in chat.first
            ):
                return  # its message is about to go
        self._check_room(op, chat)
        if chat is None:
            chat = self._chats[op.chat] = _Chat()
        self._seq += 1
        entry = _Pending(op, self._seq)
        self._pending += 1
        if isinstance(op, Edit):
            chat.edits[op.message_key] = entry
            return
        if isinstance(op, Delete):
            dropped = chat.edits.pop(op.message_key, None)
            if dropped is not None:
                self._pending -= 1
            self._shown.pop((op.chat, op.message_key), None)
        chat.first.append(entry)

    def next(self, now: float) -> tuple[Op[Payload] | None, float]:
        """The operation to carry out now, or None and the seconds until one is due.

        With nothing to do before something changes (nothing pending, or every chat with pending operations
        waiting for its operation in flight), the seconds are `math.inf`: wait for a `submit` or `done`.
        """
        self._forget_idle(now)
        best: tuple[bool, int] | None = None
        best_chat = ""
        soonest = math.inf
        for name, chat in self._chats.items():
            head = chat.head()
            if head is None or chat.in_flight is not None:
                continue
            due = self._chat_due(name, chat)
            if due > now:
                soonest = min(soonest, due)
                continue
            rank = (isinstance(head.op, Edit), head.seq)
            if best is None or rank < best:
                best, best_chat = rank, name
        global_due = self._global_due(now)
        if best is None:
            return None, max(soonest, global_due) - now
        if global_due > now:
            return None, global_due - now
        return self._hand_out(best_chat, now), 0.0

    def done(self, op: Op[Payload], now: float, *, message_key: str | None = None, failed: bool = False) -> None:
        """`op` (handed out by `next`) is over: carried out, or (`failed`) given up by the caller, who logs and
        counts it. For a `Send`, `message_key` is the message it made, so that an edit repeating its payload is
        dropped."""
        self._finish(op)
        if isinstance(op, Send) and message_key is not None and not failed:
            self._remember(op.chat, message_key, op.payload)
        if isinstance(op, Edit) and failed:
            self._shown.pop((op.chat, op.message_key), None)  # the message may show anything: do not drop edits

    def retry_after(self, op: Op[Payload], seconds: float, now: float, *, everything: bool | None = None) -> None:
        """The platform answered `op` (handed out by `next`) with a 429: it goes back first in its chat, and
        the chat — or every chat (`everything`; by default when the limits say a 429 is the account's) — waits
        `seconds`."""
        chat = self._finish(op)
        until = now + max(seconds, 0.0)
        chat.held_until = max(chat.held_until, until)
        if self.limits.retry_after_holds_all if everything is None else everything:
            self._held_until = max(self._held_until, until)
        self._seq += 1
        if isinstance(op, Edit):
            newer = chat.edits.pop(op.message_key, None)
            # The edit goes back first among the edits; a newer one of the same message takes its place.
            entry = _Pending(newer.op if newer is not None else op, -self._seq)
            chat.edits[op.message_key] = entry
            chat.edits.move_to_end(op.message_key, last=False)
            if newer is None:
                self._pending += 1
        else:
            chat.first.appendleft(_Pending(op, -self._seq))
            self._pending += 1

    def pending(self, chat: str | None = None) -> int:
        """How many operations wait (in `chat`, or in all), not counting those in flight."""
        if chat is None:
            return self._pending
        state = self._chats.get(chat)
        return state.pending() if state is not None else 0

    # -------------------------------------------------------------------- the rules

    def _check_room(self, op: Op[Payload], chat: _Chat[Payload] | None) -> None:
        what = type(op).__name__.lower()
        if chat is not None and chat.pending() >= self.max_pending_per_chat:
            raise OutboxFull(
                f"chat {op.chat}: {chat.pending()} messages already wait to go out (the bound is "
                f"{self.max_pending_per_chat}); this {what} is refused, not queued"
            )
        if self._pending >= self.max_pending:
            raise OutboxFull(
                f"{self._pending} messages already wait to go out in all chats (the bound is {self.max_pending}); "
                f"this {what} to chat {op.chat} is refused, not queued"
            )

    def _chat_due(self, name: str, chat: _Chat[Payload]) -> float:
        due = max(chat.last_at + self.limits.per_chat_interval, chat.held_until)
        if name in self._groups and len(chat.recent) >= self.limits.group_per_minute:
            due = max(due, chat.recent[-self.limits.group_per_minute] + 60.0)
        return due

    def _global_due(self, now: float) -> float:
        due = self._held_until
        limits = self.limits
        if limits.global_burst is None:
            count = int(limits.global_per_second)
            if len(self._global_times) >= count:
                due = max(due, self._global_times[-count] + 1.0 + limits.window_margin)
        else:
            tokens = self._tokens_now(now)
            if tokens < 1.0:
                due = max(due, now + (1.0 - tokens) / limits.global_per_second)
        return due

    def _tokens_now(self, now: float) -> float:
        assert self.limits.global_burst is not None
        elapsed = max(now - self._tokens_at, 0.0)
        return min(float(self.limits.global_burst), self._tokens + elapsed * self.limits.global_per_second)

    def _hand_out(self, name: str, now: float) -> Op[Payload]:
        chat = self._chats[name]
        if chat.first:
            op = chat.first.popleft().op
        else:
            _, entry = chat.edits.popitem(last=False)
            op = entry.op
        self._pending -= 1
        chat.in_flight = op
        chat.last_at = now
        if name in self._groups:
            chat.recent.append(now)
            while len(chat.recent) > self.limits.group_per_minute:
                chat.recent.popleft()
        if self.limits.global_burst is None:
            self._global_times.append(now)
            while len(self._global_times) > int(self.limits.global_per_second):
                self._global_times.popleft()
        else:
            self._tokens = self._tokens_now(now) - 1.0
            self._tokens_at = now
        if isinstance(op, Edit):
            self._remember(op.chat, op.message_key, op.payload)
        return op

    def _finish(self, op: Op[Payload]) -> _Chat[Payload]:
        chat = self._chats.get(op.chat)
        if chat is None or chat.in_flight is not op:
            raise ProtocolMisuse(f"pacer: {op!r} is not the operation in flight in its chat (handed out by next)")
        chat.in_flight = None
        return chat

    def _remember(self, chat: str, message_key: str, payload: Payload) -> None:
        key = (chat, message_key)
        self._shown[key] = payload
        self._shown.move_to_end(key)
        while len(self._shown) > self._shown_limit:
            self._shown.popitem(last=False)

    def _forget_idle(self, now: float) -> None:
        """Drop the state of chats with nothing pending or in flight whose limits no longer bind, so memory
        follows the chats that are active, not every chat ever served."""
        idle = [
            name
            for name, chat in self._chats.items()
            if chat.in_flight is None
            and not chat.pending()
            and chat.held_until <= now
            and chat.last_at + self.limits.per_chat_interval <= now
            and (not chat.recent or chat.recent[-1] + 60.0 <= now)
        ]
        for name in idle:
            del self._chats[name]
