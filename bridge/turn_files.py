"""A turn's own directory in the agent's working directory: the attachments the bridge fetched, and the outbox.

`TurnFiles(cwd, turn_id)` makes `<cwd>/.agent-bridge/turns/<turn_id>-<random>/` with `attachments/` and `outbox/`
in it (the random part: two hosts sharing a working directory may both have a `turn-1`). `remove_attachments()`
deletes what was fetched when the turn ends; the outbox stays until its files were delivered (`bridge.outbox`);
`remove()` deletes it all. `.agent-bridge/turns` stays, empty between turns: making and removing it and
`.agent-bridge` around every turn cost a turn ~0.25 ms (bench row 1). It lives inside the working directory so
that a sandbox that binds that directory binds these too. The agent owns its working directory and may have put
anything there — a symlink named `.agent-bridge` that points at the user's home, say — so every directory is made
and opened through `FileRoot.directory` (never following a symlink), files are created beneath the descriptors
held here (`O_EXCL | O_NOFOLLOW`), and the removal works beneath descriptors too (`shutil.rmtree` with
`dir_fd`), so nothing the agent does redirects a write or a delete outside."""

from __future__ import annotations

import os
import secrets
import shutil

from .agent_files import FileRoot
from .errors import FileRefused

STATE_DIRECTORY = ".agent-bridge"
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def turns_directory(cwd: str) -> str:
    """Where the turns' directories of the working directory `cwd` are made: a warm agent's `AGENT_OUTBOX`, of which
    each turn's outbox is a sub-directory (`<turn>/outbox`, named in the turn)."""
    return os.path.join(cwd if os.path.isabs(cwd) else os.path.join(os.getcwd(), cwd), STATE_DIRECTORY, "turns")


class TurnFiles:
    """The directory of one turn; `attachments` and `outbox` are the absolute paths of its two sub-directories
    (`attachments` is made only when asked for: a turn that has some).

    Raises `FileRefused` when the directory cannot be made safely (the working directory is missing, a
    component is a symlink, the turn's directory exists already)."""

    def __init__(self, cwd: str, turn_id: str, *, attachments: bool = True) -> None:
        label = "".join(c if c.isalnum() or c in "-_" else "_" for c in turn_id)[:64] or "turn"
        name = f"{label}-{secrets.token_hex(4)}"
        try:
            root = FileRoot(cwd)
        except OSError as err:
            raise FileRefused(f"the working directory {cwd} cannot be opened: {err.strerror}") from None
        self.directory = os.path.join(turns_directory(root.path), name)
        self.attachments = os.path.join(self.directory, "attachments")
        self.outbox = os.path.join(self.directory, "outbox")
        self._name = name
        self._turns_fd = -1  # `.agent-bridge/turns`: where remove() deletes
        self._turn_fd = -1  # the turn's directory: where remove_attachments() deletes
        self._attachments_fd = -1
        self._made = False  # the turn's directory is this object's: remove() deletes it
        try:
            self._turns_fd = root.directory([STATE_DIRECTORY, "turns"])
            try:
                os.mkdir(name, 0o700, dir_fd=self._turns_fd)
            except FileExistsError:
                raise FileRefused(f"{name} exists already; the bridge makes it afresh") from None
            self._made = True
            self._turn_fd = os.open(name, _DIRECTORY_FLAGS, dir_fd=self._turns_fd)
            # Nothing but the bridge can be in the fresh directory yet: its sub-directories need no walk.
            os.mkdir("outbox", 0o700, dir_fd=self._turn_fd)
            if attachments:  # a turn without any (most) makes no directory for them: bench row 1 pays for each
                os.mkdir("attachments", 0o700, dir_fd=self._turn_fd)
                self._attachments_fd = os.open("attachments", _DIRECTORY_FLAGS, dir_fd=self._turn_fd)
        except BaseException as err:
            self.remove()
            if isinstance(err, OSError):
                raise FileRefused(f"the turn's directory {self.directory} cannot be made: {err.strerror}") from None
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
            shutil.rmtree("attachments", dir_fd=self._turn_fd, ignore_errors=True)

    def remove_outbox_if_empty(self) -> bool:
        """Remove the outbox if it holds nothing (most turns make no files); whether it did. No listing: the
        removal is the test."""
        if self._turn_fd < 0:
            return False
        try:
            os.rmdir("outbox", dir_fd=self._turn_fd)
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Let go of the directory and leave it in place (a profile that keeps its turns' files)."""
        self._made = False
        self.remove()

    def remove(self) -> None:
        """Delete the turn's directory and all in it, beneath the descriptors held since it was made; once."""
        if self._attachments_fd >= 0:
            os.close(self._attachments_fd)
            self._attachments_fd = -1
        if self._turn_fd >= 0:
            os.close(self._turn_fd)
            self._turn_fd = -1
        if self._turns_fd >= 0:
            if self._made:
                try:  # most turns' outbox is gone already (`remove_outbox_if_empty`): one rmdir, no walk
                    os.rmdir(self._name, dir_fd=self._turns_fd)
                except OSError:
                    shutil.rmtree(self._name, dir_fd=self._turns_fd, ignore_errors=True)
            os.close(self._turns_fd)
            self._turns_fd = -1
        self._made = False
