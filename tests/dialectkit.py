"""What the tests of the pure dialects share: feeding a dialect whole, a byte at a time or cut in two
at every byte, and picking events out of what it gave."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bridge.dialects import ProtocolWarning

TRANSCRIPTS = Path(__file__).parent / "transcripts"


class Decoder(Protocol):
    def feed(self, data: bytes) -> list[Any]: ...


class ClosingDecoder(Decoder, Protocol):
    def close(self) -> list[Any]: ...


def transcript(name: str) -> bytes:
    """A real agent's stdout, recorded in tests/transcripts/."""
    return (TRANSCRIPTS / name).read_bytes()


def json_lines(*objects: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(item).encode() + b"\n" for item in objects)


def fed_whole(decoder: ClosingDecoder, data: bytes) -> list[Any]:
    return decoder.feed(data) + decoder.close()


def fed_byte_by_byte(decoder: Decoder, data: bytes) -> list[Any]:
    """The events of `data` fed one byte at a time; the stream is left open."""
    return [event for index in range(len(data)) for event in decoder.feed(data[index : index + 1])]


def assert_every_cut_decodes_alike(
    fresh: Callable[[], Any], data: bytes, whole: list[Any], *, step: int = 1, close: bool = True
) -> None:
    """`data` cut in two at every `step`-th byte, each time into a fresh decoder, gives `whole`."""
    for cut in range(0, len(data) + 1, step):
        decoder = fresh()
        events = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
        assert (events + decoder.close() if close else events) == whole, cut


def of(events: list[Any], kind: type) -> list[Any]:
    return [event for event in events if isinstance(event, kind)]


def without_warnings(events: list[Any]) -> list[Any]:
    return [event for event in events if not isinstance(event, ProtocolWarning)]


def warnings(events: list[Any]) -> list[str]:
    return [event.message for event in events if isinstance(event, ProtocolWarning)]
