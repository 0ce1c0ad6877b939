"""Turns of one conversation queue across processes (docs/protocol.md §6): a FIFO ticket lock made of files.

The host runtime orders the turns of one process (`scheduler`); this module
orders turns between processes sharing a session store — CLI runs, chats,
`serve`s, Python hosts. Next to the store file, a directory `<store>.turns/`
(0700) holds:

- `join.lock`, locked (flock, exclusive) for the microseconds it takes to join;
- one empty ticket file per turn waiting or running, `<key hash>-<sequence>`,
  locked (flock, exclusive) by its process until the turn is over.

Joining, under `join.lock`: list the directory, take the sequence one above
the highest ticket there, create the ticket and lock it. As tickets are only
made under `join.lock`, the tickets of our conversation in that listing are
exactly the turns ahead of us, each one locked by its live holder or left
behind by a dead one; none can be added ahead of us later.

Waiting: for each ticket ahead, newest first, take a shared flock on it. It is
granted once its holder is done — or dead, as the kernel drops a dead
process's locks, SIGKILL included — and then the ticket is deleted (a holder
that finished deleted it already; one that died could not). When none is
left, the place is ours: read the stored session, run the turn, record it,
then `release()` deletes the ticket and drops its lock.

Why not one flock per conversation: the kernel wakes its waiters in no
particular order, and docs/protocol.md §6 wants arrival order. Why flock rather than
POSIX (fcntl) locks: those belong to the whole process and go away when any
of its descriptors of the file closes; SQLite uses them on the store itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING

from ..errors import TurnLockError

if TYPE_CHECKING:
    import trio

# trio is imported by the functions that wait in it: `agent-bridge run --conversation` joins its queue
# before the rest of the bridge loads (bridge.command), and trio alone takes longer to import than that.

JOIN_LOCK = "join.lock"
# Waiting without a thread means polling, which only happens while another
# process holds the conversation: a handoff is seen within POLL_MAX_SECS.
POLL_FIRST_SECS = 0.002
POLL_MAX_SECS = 0.05


async def poll_until(ready: Callable[[], bool | Awaitable[bool]], abandon: trio.Event | None = None) -> bool:
    """Ask `ready()` until it says True, backing off from POLL_FIRST_SECS to POLL_MAX_SECS between tries;
    False as soon as `abandon` is set. A place's wait polls: no thread is left blocked when it is abandoned."""
    import trio

    delay = POLL_FIRST_SECS
    while True:
        answer = ready()
        if not isinstance(answer, bool):
            answer = await answer
        if answer:
            return True
        if abandon is None:
            await trio.sleep(delay)
        else:
            with trio.move_on_after(delay):
                await abandon.wait()
            if abandon.is_set():
                return False
        delay = min(delay * 2, POLL_MAX_SECS)


# --------------------------------------------------------------------------- the rules (pure)


def conversation_hash(profile: str, conversation: str, session_name: str) -> str:
    """The name the queue of (profile, conversation, session name) goes by: any key becomes a safe file name."""
    text = json.dumps([profile, conversation, session_name])  # ASCII, unambiguous whatever the strings hold
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def ticket_name(key_hash: str, sequence: int) -> str:
    return f"{key_hash}-{sequence}"


def parse_ticket(name: str) -> tuple[str, int] | None:
    """(key hash, sequence) of a ticket's file name; None for anything else in the directory."""
    key_hash, dash, sequence = name.partition("-")
    if dash and sequence.isascii() and sequence.isdigit():
        return key_hash, int(sequence)
    return None


def plan_join(names: Iterable[str], key_hash: str) -> tuple[int, list[str]]:
    """Joining, from a listing of the directory: the new ticket's sequence, one above every ticket there
    (so it is behind all of them), and the tickets of its own conversation, newest first: the turns it waits for."""
    highest = 0
    ahead = []
    for name in names:
        ticket = parse_ticket(name)
        if ticket is None:
            continue
        if ticket[1] > highest:
            highest = ticket[1]
        if ticket[0] == key_hash:
            ahead.append((ticket[1], name))
    ahead.sort(reverse=True)
    return highest + 1, [name for _, name in ahead]


# --------------------------------------------------------------------------- files


class TurnLocks:
    """The queues of one session store file; `join` one to get a `Place`.

    One object serves a whole process (a host) or a single turn (a CLI run).
    """

    def __init__(self, store_path: str | os.PathLike[str]) -> None:
        # The store's real path: every process names the same file the same way, however it was given.
        self.directory = os.path.realpath(store_path) + ".turns"
        try:
            try:
                os.mkdir(self.directory, 0o700)
            except FileExistsError:
                pass
            self._join_fd = os.open(
                os.path.join(self.directory, JOIN_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
            )
        except OSError as err:
            raise self._error(err) from None

    def join(self, profile: str, conversation: str, session_name: str) -> Place:
        """Take a place at the end of the conversation's queue (blocks only while another process joins)."""
        place = self._join(conversation_hash(profile, conversation, session_name), block=True)
        assert place is not None
        return place

    async def join_async(self, profile: str, conversation: str, session_name: str) -> Place:
        """`join` without blocking the trio loop: while another process is joining, poll."""
        import trio

        key_hash = conversation_hash(profile, conversation, session_name)
        delay = POLL_FIRST_SECS
        while (place := self._join(key_hash, block=False)) is None:
            await trio.sleep(delay)
            delay = min(delay * 2, POLL_MAX_SECS)
        return place

    def _join(self, key_hash: str, *, block: bool) -> Place | None:
        try:
            try:
                fcntl.flock(self._join_fd, fcntl.LOCK_EX if block else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            try:
                sequence, ahead = plan_join(os.listdir(self.directory), key_hash)
                path = os.path.join(self.directory, ticket_name(key_hash, sequence))
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)  # a file nobody else has opened yet: granted at once
                except BaseException:
                    _remove(path)
                    os.close(fd)
                    raise
            finally:
                fcntl.flock(self._join_fd, fcntl.LOCK_UN)
        except OSError as err:
            raise self._error(err) from None
        return Place(path, fd, [os.path.join(self.directory, name) for name in ahead])

    def holds(self, place: Place, profile: str, conversation: str, session_name: str) -> bool:
        """Whether `place` is in this store's queue of (profile, conversation, session name)."""
        ticket = parse_ticket(os.path.basename(place.path))
        return (
            os.path.dirname(place.path) == self.directory
            and ticket is not None
            and ticket[0] == conversation_hash(profile, conversation, session_name)
        )

    def close(self) -> None:
        if self._join_fd >= 0:
            os.close(self._join_fd)
            self._join_fd = -1

    def _error(self, err: OSError) -> TurnLockError:
        return TurnLockError(
            f"cannot queue turns in {self.directory}: {err.strerror or err}; make it (and the "
            "session store's directory) writable by this user, or pass another store file "
            "with --state PATH"
        )


class Place:
    """One turn's place in its conversation's queue: wait for it, run the turn, then `release()`.

    Also a context manager that releases on exit.
    """

    def __init__(self, path: str, fd: int, ahead: list[str]) -> None:
        self.path = path
        self._fd = fd
        self._ahead = ahead  # tickets still to wait for, newest first
        self._blocker: int = -1  # an open descriptor of _ahead[0] while polling it

    def try_wait(self) -> bool:
        """Without blocking, move up as far as possible; True when the place is ours."""
        while self._ahead and self._passed(self._ahead[0], block=False):
            self._ahead.pop(0)
        return not self._ahead

    def wait(self) -> None:
        """Block until every earlier turn of the conversation is over (signals interrupt it as usual)."""
        while self._ahead:
            self._passed(self._ahead[0], block=True)
            self._ahead.pop(0)

    async def wait_async(self, abandon: trio.Event | None = None) -> bool:
        """`wait` without blocking the trio loop; False (still waiting) as soon as `abandon` is set."""
        return await poll_until(self.try_wait, abandon)

    def release(self) -> None:
        """Leave the queue (the turn is over, or will not run): the next turn may start. Never raises."""
        if self._fd < 0:
            return
        self._drop_blocker()
        _remove(self.path)  # before unlocking: whoever gets the lock next finds the ticket gone
        os.close(self._fd)
        self._fd = -1

    def _passed(self, path: str, *, block: bool) -> bool:
        """Whether the turn holding ticket `path` is over (then the ticket is gone)."""
        try:
            if self._blocker < 0:
                try:
                    self._blocker = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    return True  # its holder finished and removed it
            try:
                fcntl.flock(self._blocker, fcntl.LOCK_SH if block else fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        except OSError as err:
            raise TurnLockError(
                f"cannot wait for the turn ahead ({path}): {err.strerror or err}; make the "
                "directory readable by this user, or pass another store file with --state PATH"
            ) from None
        _remove(path)  # its holder died without removing it
        self._drop_blocker()
        return True

    def _drop_blocker(self) -> None:
        if self._blocker >= 0:
            os.close(self._blocker)
            self._blocker = -1

    def __enter__(self) -> Place:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # gone already; or we may not delete it, and then its released lock says it is over
