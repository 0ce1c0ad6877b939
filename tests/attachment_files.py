"""Real files for the tests of attachments handed to agents: a valid PNG image that decoders accept, and a turn's
fetched files."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from bridge.turn import Attachment


def png(width: int = 2, height: int = 2) -> bytes:
    """A valid RGB PNG, every pixel red: small, and what an image decoder (codex's, a model API's) reads."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


PNG = png()
TURN_FILES = r"\.agent-bridge/attachments/[\w-]+"
"""A pattern for where the bridge fetches a turn's attachments, under the agent's working directory."""


def files(directory: Path, image_name: str = "shot.png") -> tuple[Path, Path]:
    """An image and a text file in `directory`: the PNG as `image_name`, and notes.txt ("milk\n", 5 bytes)."""
    image, notes = directory / image_name, directory / "notes.txt"
    image.write_bytes(PNG)
    notes.write_text("milk\n")
    return image, notes


def sent(directory: Path, image_name: str = "shot.png") -> tuple[Attachment, Attachment]:
    """`files(directory)` as a host attaches them (local paths): the turn fetches them before the agent starts."""
    image, notes = files(directory, image_name)
    return Attachment("image", str(image)), Attachment("file", str(notes))


def fetched(directory: Path, image_name: str = "shot.png") -> tuple[Attachment, Attachment]:
    """`files(directory)` as the fetch step leaves them (`path`, `media_type`, `size`), sent as s.png and n.txt: for
    a dialect driven without the engine, which fetches nothing."""
    image, notes = files(directory, image_name)
    return (
        Attachment("image", "https://chat.example/s.png", path=str(image), media_type="image/png", size=len(PNG)),
        Attachment("file", "https://chat.example/n.txt", path=str(notes), media_type="text/plain", size=5),
    )


def left_in(directory: Path) -> list[str]:
    """What turns left in the working directory `directory`, sorted: its entries, each path below `.agent-bridge`
    named, and the bridge's own `.agent-bridge/outbox`, `.agent-bridge/attachments` (which stay between turns),
    `.agent-bridge/.gitignore`
    and the outbox kept empty for the next turn (`.agent-bridge/outbox/.spare-…`) not at all."""
    found = sorted(entry.name for entry in directory.iterdir() if entry.name != ".agent-bridge")
    state = directory / ".agent-bridge"
    if state.is_dir() and not state.is_symlink():
        kept = [state / "outbox", state / "attachments", state / ".gitignore"]
        kept += [path for path in state.glob("outbox/.spare-*") if is_empty_directory(path)]
        found += sorted(str(path.relative_to(directory)) for path in state.rglob("*") if path not in kept)
    elif state.exists() or state.is_symlink():
        found.append(".agent-bridge")
    return found


def is_empty_directory(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())
