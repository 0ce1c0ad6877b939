"""A turn's own directories in the agent's working directory: its outbox, and the attachments the bridge fetched.

`TurnFiles(cwd, turn_id)` makes the turn's outbox, `<cwd>/.agent-bridge/outbox/<turn_id>-<random>/`, and for a turn with
attachments `<cwd>/.agent-bridge/attachments/<the same name>/` (the random part: two hosts sharing a working directory
may both have a `turn-1`). `remove_attachments()` deletes what was fetched when the turn ends; the outbox stays until
its files were delivered (`bridge.files.outbox`): `remove_outbox_if_empty()` lets go of one that holds nothing,
`remove_outbox()` deletes one with what is in it, `remove()` deletes both. Each directory made and removed is on the
path of every turn, so the layout is flat, one directory for a turn without attachments, and an outbox left empty is
kept for the next turn in the same directory (`SpareOutboxes`). `.agent-bridge/outbox` and `.agent-bridge/attachments`
stay between turns, empty but for that spare; `.agent-bridge` gets a `.gitignore` of `*` when the bridge makes it
(the working directory is often the user's repository). A warm agent writes to its session's outbox
(`SessionOutbox`), whose entries move into the turn's outbox when the turn ends. They live inside the working
directory so that a sandbox that binds that directory binds these too. The agent owns its working directory and may
have put anything there — a symlink named `.agent-bridge` that points at the user's home, say — so every directory is
made and opened through `FileRoot.directory` (never following a symlink), files are created beneath the descriptors
held here (`O_EXCL | O_NOFOLLOW`), and the removal works beneath descriptors too (`delete_beneath`, which no depth
or size of tree stops), so nothing the agent does redirects a write or a delete outside."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import secrets
import stat
import threading
from dataclasses import dataclass

from ..errors import FileRefused
from .agent_requests import FileRoot

STATE_DIRECTORY = ".agent-bridge"
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
SPARE_PREFIX = ".spare-"
MAX_SPARES = 64  # working directories whose spare outbox one process keeps


def outboxes_directory(cwd: str) -> str:
    """Where the turns' outboxes of the working directory `cwd` are made: a warm agent's `AGENT_OUTBOX`, of which
    each turn's outbox is a sub-directory (named in the turn)."""
    return os.path.join(cwd if os.path.isabs(cwd) else os.path.join(os.getcwd(), cwd), STATE_DIRECTORY, "outbox")


class TurnFiles:
    """The directories of one turn; `outbox` and `attachments` are their absolute paths (`attachments` is made only
    when asked for: a turn that has some).

    Raises `FileRefused` when a directory cannot be made safely (the working directory is missing, a component is a
    symlink, the turn's directory exists already)."""

    def __init__(self, cwd: str, turn_id: str, *, attachments: bool = True) -> None:
        label = "".join(c if c.isalnum() or c in "-_" else "_" for c in turn_id)[:64] or "turn"
        name = f"{label}-{secrets.token_hex(4)}"
        try:
            root = FileRoot(cwd)
        except OSError as err:
            raise FileRefused(f"the working directory {cwd} cannot be opened: {err.strerror}") from None
        self.outbox = os.path.join(outboxes_directory(root.path), name)
        self.attachments = os.path.join(root.path, STATE_DIRECTORY, "attachments", name)
        self._name = name
        self._outboxes_fd = -1  # `.agent-bridge/outbox`, where the outbox is made and removed
        self._fetched_fd = -1  # `.agent-bridge/attachments`, where the attachments' directory is
        self._attachments_fd = -1  # the attachments' directory, where `create` makes files
        making = self.outbox  # for the error: which of the two could not be made
        try:
            self._outboxes_fd = _made_in(root, "outbox", name)
            if attachments:  # a turn without any (most) makes no directory for them
                making = self.attachments
                self._fetched_fd = _made_in(root, "attachments", name)
                self._attachments_fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=self._fetched_fd)
        except BaseException as err:
            self.remove()
            if isinstance(err, OSError):
                raise FileRefused(f"the turn's directory {making} cannot be made: {err.strerror}") from None
            raise
        finally:
            root.close()

    def create(self, name: str) -> int:
        """A new file `name` in the attachments directory, open for writing (0o600); the caller closes it."""
        return os.open(name, _FILE_FLAGS, 0o600, dir_fd=self._attachments_fd)

    def remove_attachments(self) -> None:
        """Delete the fetched attachments (the outbox stays, for its files' delivery); once."""
        if self._attachments_fd >= 0:
            os.close(self._attachments_fd)
            self._attachments_fd = -1
        if self._fetched_fd >= 0:
            _delete_tree(self._fetched_fd, self._name)
            os.close(self._fetched_fd)
            self._fetched_fd = -1

    def remove_outbox_if_empty(self) -> bool:
        """Let go of the outbox if it holds nothing (most turns make no files): kept as the spare of its directory
        (`SpareOutboxes`) or removed. Whether it held nothing."""
        if self._outboxes_fd < 0:
            return False
        if not SPARE_OUTBOXES.keep(self._outboxes_fd, self.outbox):
            try:
                os.rmdir(self._name, dir_fd=self._outboxes_fd)  # the removal is the test: no listing
            except OSError:
                return False
        os.close(self._outboxes_fd)
        self._outboxes_fd = -1
        return True

    def outbox_beneath(self) -> tuple[int, str]:
        """A new descriptor (the caller closes it) of the directory the outbox was made in, and the outbox's name
        there: the outbox is reached beneath it, whatever the agent has made of the path since."""
        return os.dup(self._outboxes_fd), self._name

    def close(self) -> None:
        """Let go of the directories and leave them in place (the outbox's files are the host's to deliver, a
        profile keeps its turns' attachments)."""
        for descriptor in (self._attachments_fd, self._fetched_fd, self._outboxes_fd):
            if descriptor >= 0:
                os.close(descriptor)
        self._attachments_fd = self._fetched_fd = self._outboxes_fd = -1

    def remove_outbox(self) -> None:
        """Delete the outbox with whatever is in it, beneath the descriptor held since it was made; once."""
        if self._outboxes_fd < 0:
            return
        _delete_tree(self._outboxes_fd, self._name)
        os.close(self._outboxes_fd)
        self._outboxes_fd = -1

    def remove(self) -> None:
        """Delete the turn's directories and all in them, beneath the descriptors held since they were made; once."""
        self.remove_attachments()
        self.remove_outbox()


class SessionOutbox:
    """The outbox of one warm agent's session, `<cwd>/.agent-bridge/outbox/session-<random>/`: one path for all its
    turns, so the agent can be told it once. At each turn's end `hand_over` moves what it holds into that turn's
    outbox (`TurnFiles`), which is collected and held for delivery as a one-turn outbox is, and this one is empty
    again: the next turn may write the same names without touching files still waiting to be sent.

    Raises `FileRefused` as `TurnFiles` does."""

    def __init__(self, cwd: str) -> None:
        name = f"session-{secrets.token_hex(4)}"
        try:
            root = FileRoot(cwd)
        except OSError as err:
            raise FileRefused(f"the working directory {cwd} cannot be opened: {err.strerror}") from None
        self.path = os.path.join(outboxes_directory(root.path), name)
        self._name = name
        self._parent = self._outbox = -1
        try:
            self._parent = _made_in(root, "outbox", name, spare=False)
            self._outbox = os.open(name, _DIRECTORY_FLAGS, dir_fd=self._parent)
        except BaseException as err:
            self.remove()
            if isinstance(err, OSError):
                raise FileRefused(f"the session's outbox {self.path} cannot be made: {err.strerror}") from None
            raise
        finally:
            root.close()

    def hand_over(self, turn: TurnFiles) -> None:
        """Move everything in this outbox into `turn`'s outbox (renamed beneath the descriptors held since each was
        made, links moved as links, never followed), where it is collected; this outbox is left empty."""
        if self._outbox < 0 or turn._outboxes_fd < 0:
            return
        try:
            with os.scandir(self._outbox) as listing:  # moved as listed, not gathered first: there may be millions
                first = next(listing, None)
                if first is None:
                    return
                destination = os.open(turn._name, _DIRECTORY_FLAGS, dir_fd=turn._outboxes_fd)
                try:
                    for entry in itertools.chain((first,), listing):
                        try:
                            os.rename(entry.name, entry.name, src_dir_fd=self._outbox, dst_dir_fd=destination)
                        except OSError:  # the outbox is emptied at every turn's end, sent or not
                            delete_beneath(self._outbox, entry.name)
                finally:
                    os.close(destination)
        except OSError:
            return

    def remove(self) -> None:
        """Delete the outbox with what is left in it (its name only while it is still this directory); once."""
        if self._outbox >= 0:
            remove_directory_beneath(self._parent, self._name, self._outbox)
            os.close(self._outbox)
            self._outbox = -1
        if self._parent >= 0:
            os.close(self._parent)
            self._parent = -1


def _made_in(root: FileRoot, kind: str, name: str, *, spare: bool = True) -> int:
    """A descriptor of `.agent-bridge/<kind>` beneath `root`, after making the turn's directory `name` in it (an
    outbox: the spare one renamed, when there is one and `spare` allows it)."""
    _make_state_directory(root)
    parent = root.directory([STATE_DIRECTORY, kind])
    try:
        if not (kind == "outbox" and spare and SPARE_OUTBOXES.take(parent, name)):
            os.mkdir(name, 0o700, dir_fd=parent)
    except BaseException as err:
        os.close(parent)
        if isinstance(err, FileExistsError):
            raise FileRefused(f"{name} exists already; the bridge makes it afresh") from None
        raise
    return parent


def _make_state_directory(root: FileRoot) -> None:
    """Make `.agent-bridge` beneath `root` when it is missing, with a `.gitignore` of `*`: the working directory is
    often the user's own repository, and what the bridge keeps there is not the project's."""
    (descriptor,) = root.directories([])
    try:
        try:
            os.mkdir(STATE_DIRECTORY, 0o700, dir_fd=descriptor)
        except FileExistsError:
            return
        state = os.open(STATE_DIRECTORY, _DIRECTORY_FLAGS, dir_fd=descriptor)
        try:
            ignore = os.open(".gitignore", _FILE_FLAGS, 0o644, dir_fd=state)
            try:
                os.write(ignore, b"*\n")
            finally:
                os.close(ignore)
        except FileExistsError:
            pass  # a name planted in the moment between: left as it is
        finally:
            os.close(state)
    finally:
        os.close(descriptor)


@dataclass(frozen=True, slots=True)
class _Spare:
    name: str
    directory: str  # the `.agent-bridge/outbox` it is in
    key: tuple[int, int]  # that directory's `_key`

    def remove(self) -> None:
        """rmdir it (an empty directory only) if its directory's path still leads to its directory."""
        try:
            parent = os.open(self.directory, _DIRECTORY_FLAGS)
        except OSError:
            return
        try:
            if _key(parent) == self.key:
                os.rmdir(self.name, dir_fd=parent)
        except OSError:
            pass
        finally:
            os.close(parent)


class SpareOutboxes:
    """An empty outbox that a turn left, kept for the next turn in the same working directory: one per directory,
    in at most `MAX_SPARES` directories (those used longest ago lose theirs), in this process.

    Why: making a directory and removing it cost ~0.25 ms a turn on ext4 without a journal, as on these machines
    (`mkdir` scans for recently freed inodes, `rmdir` discards the freed block at once), where two renames cost
    ~20 µs. That is a tenth of bench row 1's turn and a quarter of what row 29's sandboxed turn adds to bwrap
    alone.

    The rules: a turn's outbox left empty becomes its directory's spare, renamed `.spare-<random>`, when that
    directory has none; else it is removed. The next turn there renames the spare to its own outbox's name and
    takes it only if it is still a directory (not a symlink), the bridge's own (owner, mode 0o700) and empty, as
    one made afresh is: the agents own the working directory and may have put anything under the spare's name.
    Anything else is deleted and a new outbox made. A process takes only the spares it left, and removes them when
    it exits; one killed by `kill -9` leaves them behind, empty. Thread-safe."""

    def __init__(self) -> None:
        self._spares: dict[tuple[int, int], _Spare] = {}  # by `_key` of their directory, the oldest first
        self._lock = threading.Lock()
        self._removed_at_exit = False

    def take(self, parent: int, name: str) -> bool:
        """Whether the spare of the directory `parent` is now the empty outbox `name` in it."""
        with self._lock:
            spare = self._spares.pop(_key(parent), None)
        if spare is None:
            return False
        try:
            os.rename(spare.name, name, src_dir_fd=parent, dst_dir_fd=parent)
        except OSError:  # gone, or `name` is taken
            spare.remove()
            return False
        if _is_empty_outbox(parent, name):
            return True
        delete_beneath(parent, name)
        return False

    def keep(self, parent: int, outbox: str) -> bool:
        """Whether the outbox at path `outbox`, in the directory `parent` (a descriptor), was empty and is now that
        directory's spare (under another name); False when it holds something, or the directory has its spare."""
        key = _key(parent)
        directory, name = os.path.split(outbox)
        with self._lock:
            if key in self._spares or not _is_empty_outbox(parent, name):
                return False
            spare = _Spare(f"{SPARE_PREFIX}{secrets.token_hex(4)}", directory, key)
            try:
                os.rename(name, spare.name, src_dir_fd=parent, dst_dir_fd=parent)
            except OSError:
                return False
            self._spares[key] = spare
            evicted = [self._spares.pop(next(iter(self._spares))) for _ in range(len(self._spares) - MAX_SPARES)]
            if not self._removed_at_exit:
                atexit.register(self.remove_all)
                self._removed_at_exit = True
        for old in evicted:
            old.remove()
        return True

    def remove_all(self) -> None:
        """Remove every spare this process keeps."""
        with self._lock:
            spares, self._spares = list(self._spares.values()), {}
        for spare in spares:
            spare.remove()


SPARE_OUTBOXES = SpareOutboxes()


def _key(directory: int) -> tuple[int, int]:
    """The directory's device and inode: the same `.agent-bridge/outbox` by whatever path it was reached."""
    info = os.fstat(directory)
    return info.st_dev, info.st_ino


def _key_of(parent: int, name: str) -> tuple[int, int]:
    """The device and inode of `name` in `parent`, not followed if it is a link."""
    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    return info.st_dev, info.st_ino


def _is_empty_outbox(parent: int, name: str) -> bool:
    """Whether `name` in `parent` is an empty directory of the bridge's own, mode 0o700, as a new outbox is."""
    try:
        descriptor = os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except OSError:
        return False
    try:
        info = os.fstat(descriptor)
        return info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o700 and not os.listdir(descriptor)
    finally:
        os.close(descriptor)


def remove_directory_beneath(parent: int, name: str, directory: int) -> None:
    """Delete what the directory `directory` (a descriptor) holds, then its name `name` in `parent` (a descriptor)
    only while that name is still this directory: whatever the agent made of the names meanwhile, nothing outside
    it goes. The descriptors stay open."""
    _empty(directory)
    try:
        if _key(directory) == _key_of(parent, name):
            os.rmdir(name, dir_fd=parent)
    except OSError:
        pass


def delete_beneath(parent: int, name: str) -> None:
    """Delete `name` in `parent`, whatever it is, without following it: a directory with all in it (`_delete_tree`)."""
    try:
        os.unlink(name, dir_fd=parent)
    except IsADirectoryError:
        _delete_tree(parent, name)
    except OSError:
        pass


# Directories a removal holds open at once; a tree deeper than that has its lower part moved up to its top.
_MAX_HELD_DIRECTORIES = 32


@dataclass(slots=True)
class _Level:
    descriptor: int
    name: str  # in the level above
    skipped: set[str]  # sub-directories that could not be opened or moved: left alone


def _delete_tree(parent: int, name: str) -> None:
    """Delete the directory `name` in `parent` and everything in it (`_empty`), never following a link."""
    try:
        top = os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)
    except OSError:
        return
    try:
        _empty(top)
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=parent)


def _empty(top: int) -> None:
    """Delete everything in the directory `top` (a descriptor, left open), however the agent shaped it: depth first
    without recursion (Python's stack ends near 1000 levels), each directory deleted from as it is listed (never
    listed whole into memory), at most `_MAX_HELD_DIRECTORIES` descriptors open (a deeper sub-directory is moved
    up into `top`, beneath the descriptors held, and deleted from there)."""
    levels = [_Level(top, "", set())]
    try:
        while levels:
            level = levels[-1]
            child = _first_full_directory(level)
            if child is None:  # all else in it is gone, or cannot be deleted
                if len(levels) == 1:
                    return
                os.close(levels.pop().descriptor)
                with contextlib.suppress(OSError):
                    os.rmdir(level.name, dir_fd=levels[-1].descriptor)
                continue
            try:
                if len(levels) < _MAX_HELD_DIRECTORIES:
                    levels.append(_Level(os.open(child, _DIRECTORY_FLAGS, dir_fd=level.descriptor), child, set()))
                else:
                    os.rename(child, f".deep-{secrets.token_hex(8)}", src_dir_fd=level.descriptor, dst_dir_fd=top)
            except OSError:
                level.skipped.add(child)
    finally:
        for level in levels[1:]:
            os.close(level.descriptor)


def _first_full_directory(level: _Level) -> str | None:
    """Delete the entries of `level`'s directory as they are listed, up to its first sub-directory that is not empty
    (and not skipped): its name, or None when the listing ended."""
    try:
        with os.scandir(level.descriptor) as listing:
            for entry in listing:
                if not entry.is_dir(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name, dir_fd=level.descriptor)
                elif entry.name not in level.skipped:
                    try:
                        os.rmdir(entry.name, dir_fd=level.descriptor)
                    except OSError:
                        return entry.name
    except OSError:
        pass
    return None
