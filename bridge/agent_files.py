"""Files a warm agent asks the bridge to read or write (ACP's `fs/read_text_file`, `fs/write_text_file`).

Only for a profile that grants it (`acp: {fs_read: true}` / `fs_write`), and
only inside the session's working directory: a path is resolved (symlinks
included) and refused unless it lands there. The agent runs as the same user
and could open the file itself; the rule is that the bridge never becomes a
way around the directory a profile gave its agent. Text is UTF-8 (a byte that
is not is read as U+FFFD); a file over `MAX_FILE_BYTES` is refused rather
than loaded. Blocking: the engine runs it in a worker thread.
"""

from __future__ import annotations

import os

from .dialects.events import FileRequest

MAX_FILE_BYTES = 16 * 1024 * 1024


class FileRefused(Exception):
    """The request cannot be served; the message is the error the agent gets."""


def serve_file_request(request: FileRequest, root: str) -> str | None:
    """Carry out `request` inside `root`: the text read, or None for a write done. Raises `FileRefused`."""
    path = _inside(request.path, root)
    try:
        if request.operation == "read":
            return _read(path, request.line, request.limit)
        _write(path, request.content or "")
        return None
    except FileNotFoundError:
        raise FileRefused(f"no such file: {request.path}") from None
    except IsADirectoryError:
        raise FileRefused(f"{request.path} is a directory") from None
    except OSError as err:
        raise FileRefused(f"{request.path}: {err.strerror or err}") from None


def _inside(path: str, root: str) -> str:
    if not os.path.isabs(path):
        raise FileRefused(f"the path must be absolute: {path}")
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise FileRefused(f"{path} is outside the session's working directory ({root}); the bridge serves files "
                          "there only")
    return real


def _read(path: str, line: int | None, limit: int | None) -> str:
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size > MAX_FILE_BYTES:
            raise FileRefused(f"{path} is over {MAX_FILE_BYTES // (1024 * 1024)} MiB; the bridge reads files up to "
                              "that size")
        text = file.read(MAX_FILE_BYTES + 1).decode("utf-8", "replace")
    if line is None and limit is None:
        return text
    lines = text.splitlines(keepends=True)
    start = max(0, (line or 1) - 1)
    end = len(lines) if limit is None else start + max(0, limit)
    return "".join(lines[start:end])


def _write(path: str, content: str) -> None:
    data = content.encode("utf-8", "replace")
    if len(data) > MAX_FILE_BYTES:
        raise FileRefused(f"the content is over {MAX_FILE_BYTES // (1024 * 1024)} MiB; the bridge writes files up "
                          "to that size")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with open(descriptor, "wb") as file:
        file.write(data)
