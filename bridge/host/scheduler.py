"""Which waiting turn may start next. Pure: no I/O, no clock, no trio.

The rules (docs/protocol.md §6 and the host runtime's limits):
- turns with the same key (profile, conversation, session name) run one at a
  time, in the order they arrived;
- at most `max_running` turns run at once, whatever their keys;
- at most `max_waiting` turns wait; one more is refused (`QueueFull`), so a
  flood costs a clear error instead of unbounded memory;
- when a slot frees, the turn that arrived first among those whose key is idle
  starts: arrival order, not "whoever wakes first".

Each key's waiting turns form a FIFO lane; the lanes whose key is idle wait for
a slot in a heap ordered by the arrival of their first turn. Admission and
release cost O(log n).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from ..errors import QueueFull


class Ticket:
    """One turn's place: `seq` is its arrival number, `key` what it must not overlap with."""

    __slots__ = ("key", "seq", "state")

    WAITING = "waiting"
    RUNNING = "running"
    WITHDRAWN = "withdrawn"  # left the queue without running
    DONE = "done"

    def __init__(self, key: Hashable, seq: int) -> None:
        self.key = key
        self.seq = seq
        self.state = "new"

    def __repr__(self) -> str:
        return f"Ticket({self.key!r}, seq={self.seq}, {self.state})"


_T = TypeVar("_T", bound=Ticket)


class TurnQueue(Generic[_T]):
    """Admission, ordering and limits for turns; the caller does the waiting and the running.

    Generic in its caller's kind of ticket: `release` hands back the tickets it was given."""

    def __init__(self, max_running: int, max_waiting: int) -> None:
        if max_running < 1:
            raise ValueError("max_concurrent must be at least 1")
        if max_waiting < 0:
            raise ValueError("max_queued must be at least 0")
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.running = 0
        self.waiting = 0
        self._lanes: dict[Hashable, deque[_T]] = {}  # waiting tickets per key, in arrival order
        self._busy: set[Hashable] = set()  # keys with a running ticket
        self._ready: list[tuple[int, Hashable]] = []  # (seq of the lane's head, key) of idle keys' lanes

    def admit(self, ticket: _T) -> bool:
        """Take `ticket` in: True when it may run now, False when it waits. Raises `QueueFull`."""
        key = ticket.key
        lane = self._lanes.get(key)
        if lane is None and key not in self._busy and self.running < self.max_running:
            self._start(ticket)
            return True
        if self.waiting >= self.max_waiting:
            raise QueueFull(
                f"{self.running} turns are running and {self.waiting} are queued, the most allowed "
                "(max_queued); try again later, or raise max_concurrent / max_queued"
            )
        ticket.state = Ticket.WAITING
        self.waiting += 1
        if lane is None:
            self._lanes[key] = deque((ticket,))
            if key not in self._busy:
                heapq.heappush(self._ready, (ticket.seq, key))
        else:
            lane.append(ticket)
        return False

    def release(self, ticket: _T) -> list[_T]:
        """`ticket` finished running; returns the tickets that start now (already marked running)."""
        assert ticket.state == Ticket.RUNNING, ticket
        ticket.state = Ticket.DONE
        self.running -= 1
        self._busy.discard(ticket.key)
        lane = self._lanes.get(ticket.key)
        if lane:
            heapq.heappush(self._ready, (lane[0].seq, ticket.key))
        started: list[_T] = []
        while self.running < self.max_running and self._ready:
            seq, key = heapq.heappop(self._ready)
            lane = self._lanes.get(key)
            if not lane or lane[0].seq != seq or key in self._busy:
                continue  # stale: its head was withdrawn or already started
            head = lane.popleft()
            if not lane:
                del self._lanes[key]
            self.waiting -= 1
            self._start(head)
            started.append(head)
        return started

    def withdraw(self, ticket: _T) -> None:
        """Take a waiting ticket out of the queue (cancelled, or its waiter went away)."""
        assert ticket.state == Ticket.WAITING, ticket
        lane = self._lanes[ticket.key]
        was_head = lane[0] is ticket
        lane.remove(ticket)
        ticket.state = Ticket.WITHDRAWN
        self.waiting -= 1
        if not lane:
            del self._lanes[ticket.key]
        elif was_head and ticket.key not in self._busy:
            heapq.heappush(self._ready, (lane[0].seq, ticket.key))

    def _start(self, ticket: _T) -> None:
        ticket.state = Ticket.RUNNING
        self.running += 1
        self._busy.add(ticket.key)
