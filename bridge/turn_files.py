"""A turn's own directories in the agent's working directory: its outbox, and the attachments the bridge fetched.

`TurnFiles(cwd, turn_id)` makes the turn's outbox, `<cwd>/.agent-bridge/outbox/<turn_id>-<random>/`, and for a turn
with attachments `<cwd>/.agent-bridge/attachments/<the same name>/` (the random part: two hosts sharing a working
directory may both have a `turn-1`). `remove_attachments()` deletes what was fetched when the turn ends; the outbox
stays until its files were delivered (`bridge.outbox`), and `remove_outbox()` deletes one that holds nothing to
deliver; `remove()` deletes both. The layout is flat, one directory for a turn without attachments, because each
directory made and removed is on the path of every turn (~0.1 ms a directory on ext4 mounted with `discard`: bench
rows 1 and 29). `.agent-bridge/outbox` and `.agent-bridge/attachments` stay, empty between turns. They live inside
the working directory so that a sandbox that binds that directory binds these too. The agent owns its working
directory and may have put anything there — a symlink named `.agent-bridge` that points at the user's home, say — so
every directory is made and opened through `FileRoot.directory` (never following a symlink), files are created
beneath the descriptors held here (`O_EXCL | O_NOFOLLOW`), and the removal works beneath descriptors too
(`shutil.rmtree` with `dir_fd`), so nothing the agent does redirects a write or a delete outside."""

from __future__ import annotations

import os
import secrets
import shutil

from .agent_files import FileRoot
from .errors import FileRefused

STATE_DIRECTORY = ".agent-bridge"
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
            shutil.rmtree(self._name, dir_fd=self._fetched_fd, ignore_errors=True)
            os.close(self._fetched_fd)
            self._fetched_fd = -1

    def remove_outbox_if_empty(self) -> bool:
        """Remove the outbox if it holds nothing (most turns make no files); whether it did. No listing: the
        removal is the test."""
        if self._outboxes_fd < 0:
            return False
        try:
            os.rmdir(self._name, dir_fd=self._outboxes_fd)
        except OSError:
            return False
        os.close(self._outboxes_fd)
        self._outboxes_fd = -1
        return True

    def close(self) -> None:
        """Let go of the directories and leave them in place (the outbox's files are the host's to deliver, a
        profile keeps its turns' attachments)."""
        for descriptor in (self._attachments_fd, self._fetched_fd, self._outboxes_fd):
            if descriptor >= 0:
                os.close(descriptor)
        self._attachments_fd = self._fetched_fd = self._outboxes_fd = -1

    def remove_outbox(self) -> None:
        """Delete the outbox with whatever is in it, beneath the descriptor held since it was made; once."""
        if self._outboxes_fd < 0 or self.remove_outbox_if_empty():  # most are left empty: one rmdir, no walk
            return
        shutil.rmtree(self._name, dir_fd=self._outboxes_fd, ignore_errors=True)
        os.close(self._outboxes_fd)
        self._outboxes_fd = -1

    def remove(self) -> None:
        """Delete the turn's directories and all in them, beneath the descriptors held since they were made; once."""
        self.remove_attachments()
        self.remove_outbox()


def _made_in(root: FileRoot, kind: str, name: str) -> int:
    """A descriptor of `.agent-bridge/<kind>` beneath `root`, after making the turn's directory `name` in it."""
    parent = root.directory([STATE_DIRECTORY, kind])
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
    except BaseException as err:
        os.close(parent)
        if isinstance(err, FileExistsError):
            raise FileRefused(f"{name} exists already; the bridge makes it afresh") from None
        raise
    return parent
