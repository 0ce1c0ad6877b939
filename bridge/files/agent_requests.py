"""Files a warm agent asks the bridge to read or write (ACP's `fs/read_text_file`, `fs/write_text_file`).

Only for a profile that grants it (`acp: {fs_read: true}` / `fs_write`), and
only beneath the session's working directory. The agent runs as the same user
and could open the file itself; the rule is that the bridge never becomes a
way around the directory a profile gave its agent — whatever the agent does
to that directory while the bridge works in it:

- `FileRoot` holds the working directory open from before the agent starts
  until it ends, so renaming or replacing that path redirects nothing;
- a request's path is walked one component at a time from that descriptor,
  each opened without following symlinks. A symlink is read and resolved
  here: followed while it stays beneath the root (absolute targets included,
  at most `MAX_SYMLINKS` of them), refused once it leads out; `..` never
  climbs above the root. What the walk opened is what it walks on, so a
  directory swapped for a symlink mid-request changes nothing;
- only a regular file is read or written. A FIFO, socket or device is refused
  before it is opened, and again after (opened non-blocking, then `fstat`),
  so no request waits on one; so is a file of a kernel pseudo file system
  (`/proc`, `/sys`…), whose "regular" files are views of kernel state;
- a write truncates only once it knows the file is regular, creates a new
  file exclusively, and refuses a file with other hard links: its other name
  may be outside the root, and no path tells.

Text is UTF-8 (a byte that is not is read as U+FFFD); a file over
`MAX_FILE_BYTES` is refused rather than loaded. Every failure is a
`FileRefused`, whose message is the error the agent gets. Blocking calls: the
engine runs a request in a worker thread.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
import threading
from collections.abc import Callable, Sequence

from ..dialects.base import shorten
from ..dialects.events import FileRequest
from ..errors import FileRefused

MAX_FILE_BYTES = 16 * 1024 * 1024
_MIB = MAX_FILE_BYTES // (1024 * 1024)
MAX_PATH_BYTES = 4096  # PATH_MAX
MAX_SYMLINKS = 40  # as the kernel: a chain longer than this is a loop

# A component on the way, opened only to be looked at or walked from: a FIFO or device opened so never blocks.
_WALK_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

# Kernel pseudo file systems (their `f_type`): their regular-looking files are kernel state, not an agent's work —
# `/proc/self/environ` would be the bridge's own environment.
_PSEUDO_FILE_SYSTEMS = {
    0x9FA0: "proc",
    0x62656572: "sysfs",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0x73636673: "securityfs",
    0x27E0EB: "cgroup",
    0x63677270: "cgroup2",
    0x62656570: "configfs",
    0xCAFE4A11: "bpf",
    0xDE5E81E4: "efivarfs",
    0x6165676C: "pstore",
    0xF97CFF8C: "selinuxfs",
    0x42494E4D: "binfmt_misc",
    0x65735543: "fusectl",
}


class FileRoot:
    """The session's working directory, held open (`O_PATH`) until `close()`; every request resolves beneath it.

    A path reaches it by the name the profile gave, or by that name with its
    symlinks resolved (as they were when it was opened). Thread-safe: each
    request walks from its own duplicate of the descriptor, taken under a lock,
    so a request still running in an abandoned worker thread when the root is
    closed never uses a descriptor number that was closed (and maybe reused).
    """

    def __init__(self, path: str) -> None:
        self.path = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
        self._lock = threading.Lock()
        self._descriptor: int | None = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._prefixes = [_names(_opened_path(self._descriptor, self.path).split("/"))]
        given = _names(self.path.split("/"))
        if ".." not in given and given != self._prefixes[0]:  # with `..` the name means what the kernel made of it
            self._prefixes.append(given)

    def close(self) -> None:
        with self._lock:
            if self._descriptor is not None:
                os.close(self._descriptor)
                self._descriptor = None

    def __enter__(self) -> FileRoot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def read(self, path: str, line: int | None = None, limit: int | None = None) -> str:
        """The text of the regular file at `path` (from 1-based `line`, `limit` lines; None: all)."""
        descriptor = self._open(path, writing=False)
        try:
            data = _read_all(descriptor)
        finally:
            os.close(descriptor)
        text = data.decode("utf-8", "replace")
        if line is None and limit is None:
            return text
        lines = text.splitlines(keepends=True)
        start = max(0, (line or 1) - 1)
        end = len(lines) if limit is None else start + max(0, limit)
        return "".join(lines[start:end])

    def write(self, path: str, content: str) -> None:
        """`content` becomes the whole text of the regular file at `path`, created if missing."""
        data = content.encode("utf-8", "replace")
        if len(data) > MAX_FILE_BYTES:
            raise FileRefused(f"the content is over {_MIB} MiB; the bridge writes files up to that size")
        descriptor = self._open(path, writing=True)
        try:
            os.ftruncate(descriptor, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view) :]
        finally:
            os.close(descriptor)

    def directory(self, names: Sequence[str], *, fresh_last: bool = False) -> int:
        """A descriptor (`O_DIRECTORY`, the caller closes it) of the directory `names` lead to beneath the root,
        each one made (0o700) when missing. None is followed if it is a symlink — one the agent planted is
        refused, as is any component that is not a directory — so the bridge never creates, writes or removes
        outside the root. With `fresh_last` the last one must not exist yet: the caller owns all it holds."""
        *above, last = self.directories(names, fresh_last=fresh_last)
        for descriptor in above:
            os.close(descriptor)
        return last

    def directories(self, names: Sequence[str], *, fresh_last: bool = False) -> list[int]:
        """As `directory`, with a descriptor of every directory on the way: the root's, then one per name."""
        with self._lock:
            if self._descriptor is None:
                raise FileRefused("the agent's session is over")
            opened = [os.open(".", _DIRECTORY_FLAGS, dir_fd=self._descriptor)]
        try:
            for index, name in enumerate(names):
                if not name or name in (".", "..") or "/" in name:
                    raise FileRefused(f"{name!r} is not a single directory name")
                try:
                    os.mkdir(name, 0o700, dir_fd=opened[-1])
                except FileExistsError:
                    if fresh_last and index == len(names) - 1:
                        raise FileRefused(f"{name} exists already; the bridge makes it afresh") from None
                try:
                    opened.append(os.open(name, _DIRECTORY_FLAGS, dir_fd=opened[-1]))
                except OSError as err:
                    if err.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise FileRefused(
                            f"{name} in {self.path} is a symlink or not a directory; the bridge will not follow it"
                        ) from None
                    raise
        except BaseException:
            for descriptor in opened:
                os.close(descriptor)
            raise
        return opened

    # ------------------------------------------------------------------ resolving

    def _below(self, path: str) -> list[str] | None:
        """What is left of absolute `path` once a name of the root is taken off its start (component by
        component: `/x/rootish` does not start with `/x/root`); None when it starts with neither."""
        parts = path.split("/")
        for prefix in self._prefixes:
            index = 0
            for name in prefix:
                while index < len(parts) and parts[index] in ("", "."):
                    index += 1
                if index == len(parts) or parts[index] != name:
                    break
                index += 1
            else:
                return parts[index:]
        return None

    def _open(self, path: str, *, writing: bool) -> int:
        """A descriptor of the regular file `path` names beneath the root, open for reading or for writing (not
        truncated; created when missing and `writing`)."""
        _check_requested_path(path)
        pending = self._below(path)
        if pending is None:
            raise FileRefused(self._outside())
        pending.reverse()  # the components still to walk, the next one last
        with self._lock:
            if self._descriptor is None:
                raise FileRefused("the agent's session is over")
            walked = [os.dup(self._descriptor)]  # the directories from the root to where the walk is, held open
        steps = 0  # symlinks followed, and looks again at a name that changed under the walk
        try:
            while True:
                if not pending:
                    raise FileRefused("it is a directory")  # the root itself
                name = pending.pop()
                last = not pending
                if name in ("", ".", ".."):
                    if last:
                        raise FileRefused("it names a directory")
                    if name == "..":
                        if len(walked) == 1:
                            raise FileRefused(self._outside("'..' climbs above it"))
                        os.close(walked.pop())
                    continue
                if last:
                    opened = _open_last(walked[-1], name, writing)
                    if isinstance(opened, int):
                        return opened
                    target = opened
                else:
                    entered = _enter(walked[-1], name)
                    if isinstance(entered, int):
                        walked.append(entered)
                        continue
                    target = entered
                steps += 1
                if steps > MAX_SYMLINKS:
                    raise FileRefused(f"more than {MAX_SYMLINKS} symlinks on the way (a loop?), or it kept changing")
                if target is None:
                    pending.append(name)  # it changed between a look and the open: look again
                else:
                    self._follow(target, pending, walked)
        finally:
            for directory in walked:
                os.close(directory)

    def _follow(self, target: str, pending: list[str], walked: list[int]) -> None:
        """The walk goes on at a symlink's `target`: from the root when it is absolute (refused unless it names a
        place beneath the root), else from the directory the symlink is in."""
        if not target.startswith("/"):
            pending.extend(reversed(target.split("/")))
            return
        rest = self._below(target)
        if rest is None:
            raise FileRefused(self._outside(f"a symlink on the way points to {shorten(target, 200)}"))
        while len(walked) > 1:
            os.close(walked.pop())
        pending.extend(reversed(rest))

    def _outside(self, how: str = "") -> str:
        return (
            f"it is outside the session's working directory ({self.path})"
            + (f": {how}" if how else "")
            + "; the bridge serves files there only"
        )


def serve_file_request(request: FileRequest, root: FileRoot) -> str | None:
    """Carry out `request` beneath `root`: the text read, or None for a write done. Raises `FileRefused` only."""
    try:
        if request.operation == "read":
            return root.read(request.path, request.line, request.limit)
        root.write(request.path, request.content or "")
        return None
    except FileRefused as refused:
        reason = str(refused)
    except FileNotFoundError:
        reason = "no such file"
    except NotADirectoryError:
        reason = "a component of the path is not a directory"
    except IsADirectoryError:
        reason = "it is a directory"
    except OSError as err:
        reason = err.strerror or str(err)
    except UnicodeError:
        reason = "the path is not valid text"
    except Exception as err:  # whatever it is, it is this request's failure: the agent's error, never the engine's
        reason = f"{type(err).__name__}: {err}"
    raise FileRefused(f"cannot {request.operation} {shorten(request.path, 300)}: {reason}")


# ---------------------------------------------------------------------- the last component


def _check_requested_path(path: str) -> None:
    if not path.startswith("/"):
        raise FileRefused("the path must be absolute")
    if "\0" in path:
        raise FileRefused("the path contains a NUL character")
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise FileRefused(f"the path is over {MAX_PATH_BYTES} bytes")


def _enter(directory: int, name: str) -> int | str:
    """A descriptor of the directory `name` in `directory`, or the target of the symlink `name` is."""
    entered = os.open(name, _WALK_FLAGS, dir_fd=directory)
    mode = os.fstat(entered).st_mode
    if stat.S_ISDIR(mode):
        return entered
    try:
        if not stat.S_ISLNK(mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        return os.readlink("", dir_fd=entered)  # the very link opened, whatever the name is now
    finally:
        os.close(entered)


def _open_last(directory: int, name: str, writing: bool) -> int | str | None:
    """`name` in `directory` opened as a regular file (never through a symlink), or the target of the symlink it
    is, or None when it changed between the look and the open."""
    try:
        found: os.stat_result | None = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        if not writing:
            raise
        found = None
    if found is not None and stat.S_ISLNK(found.st_mode):
        try:
            return os.readlink(name, dir_fd=directory)
        except OSError as err:
            if err.errno in (errno.EINVAL, errno.ENOENT):
                return None
            raise
    if found is not None:
        _regular_only(found.st_mode)  # a device is not even opened
    flags = (os.O_WRONLY if writing else os.O_RDONLY) | _FILE_FLAGS
    if found is None:
        flags |= os.O_CREAT | os.O_EXCL  # a name that appeared meanwhile (a symlink too) fails: looked at again
    try:
        descriptor = os.open(name, flags, 0o666, dir_fd=directory)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EEXIST, errno.ENOENT):
            return None
        if err.errno == errno.ENXIO:  # a FIFO without a reader, a socket: swapped in since the look
            raise FileRefused("it is not a regular file; the bridge reads and writes regular files only") from None
        raise
    try:
        _check_opened(descriptor, writing)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _check_opened(descriptor: int, writing: bool) -> None:
    status = os.fstat(descriptor)
    _regular_only(status.st_mode)
    pseudo = _PSEUDO_FILE_SYSTEMS.get(_file_system_type(descriptor))
    if pseudo is not None:
        raise FileRefused(
            f"it is a file of {pseudo}, a kernel pseudo file system; the bridge reads and writes regular files only"
        )
    if not writing and status.st_size > MAX_FILE_BYTES:
        raise FileRefused(f"it is over {_MIB} MiB; the bridge reads files up to that size")
    if writing and status.st_nlink > 1:
        raise FileRefused(
            "it has other hard links, which may be outside the working directory; the bridge "
            "writes only a file that has one name"
        )


def _regular_only(mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = (
        "a directory"
        if stat.S_ISDIR(mode)
        else "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "not a regular file"
    )
    raise FileRefused(f"it is {kind}; the bridge reads and writes regular files only")


def _read_all(descriptor: int) -> bytes:
    """The file's bytes; refused past `MAX_FILE_BYTES` (it may have grown since `fstat`)."""
    chunks: list[bytes] = []
    size = 0
    # A read allocates all it asks for: as much as the file holds (and a little), not the largest size allowed.
    want = os.fstat(descriptor).st_size + 65536
    while size <= MAX_FILE_BYTES:
        chunk = os.read(descriptor, min(want, MAX_FILE_BYTES + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    raise FileRefused(f"it is over {_MIB} MiB; the bridge reads files up to that size")


def _names(parts: list[str]) -> tuple[str, ...]:
    return tuple(part for part in parts if part not in ("", "."))


def _opened_path(descriptor: int, path: str) -> str:
    """The path, symlinks resolved, of the directory `descriptor` (opened by `path`): the kernel's own name for
    it, read in one call where `realpath` would walk the components again (and might find others by then)."""
    try:
        opened = os.readlink(f"/proc/self/fd/{descriptor}")
    except OSError:  # no /proc
        return os.path.realpath(path)
    return opened if opened.startswith("/") else os.path.realpath(path)  # not a path: a pseudo file's name


@functools.cache
def _fstatfs() -> Callable[[int, ctypes.Array[ctypes.c_char]], int]:
    fstatfs = ctypes.CDLL(None, use_errno=True).fstatfs
    fstatfs.argtypes = (ctypes.c_int, ctypes.c_void_p)
    return fstatfs


def _file_system_type(descriptor: int) -> int:
    """`f_type` of the file system `descriptor` is on (Python's `os` has no `fstatfs`)."""
    # Linux's struct statfs starts with f_type, a C long on the 64- and 32-bit ABIs; 512 bytes hold it all.
    buffer = ctypes.create_string_buffer(512)
    if _fstatfs()(descriptor, buffer) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return ctypes.c_ulong.from_buffer(buffer).value & 0xFFFFFFFF
