"""Newline framing with a bound on line length. Sans-I/O.

Both directions of the bridge read newline-delimited text from a peer it does
not trust — an agent's stdout, a `serve` client's requests — so both need the
same guarantee: memory for at most one line of `max_line_bytes`, whatever the
peer sends.
"""

from __future__ import annotations

from typing import NamedTuple


class Lines(NamedTuple):
    """Lines ended by one `feed()`: their text, and the positions of those cut at the limit."""

    text: list[str]
    cut: frozenset[int]


_NONE_CUT: frozenset[int] = frozenset()


class LineSplitter:
    """Split a byte stream into lines of text, holding at most `max_line_bytes` of the unfinished one.

    `feed()` may be called with any split of the stream. Each line ended by
    `\\n` comes out without the newline and one trailing `\\r`, decoded as
    UTF-8 with invalid bytes replaced by U+FFFD. A line longer than the limit
    is cut there, the rest of it dropped as it arrives, and its position is
    in `Lines.cut`. `close()` returns the unterminated last line, if any.

    The work is done per chunk, not per line — one decode and one split in C —
    which is safe because `\\n` never occurs inside a UTF-8 sequence.
    """

    __slots__ = ("max_line_bytes", "_pending", "_overflowed")

    def __init__(self, max_line_bytes: int) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be at least 1")
        self.max_line_bytes = max_line_bytes
        self._pending = bytearray()  # start of the line not yet ended, never over the limit
        self._overflowed = False  # the pending line hit the limit; its rest is being dropped

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for the unfinished line; never more than `max_line_bytes`."""
        return len(self._pending)

    def feed(self, data: bytes | bytearray) -> Lines:
        end = data.rfind(b"\n")
        if end < 0:
            self._append(data)
            return Lines([], _NONE_CUT)
        complete = data[:end]
        if self._pending or self._overflowed:
            if self._overflowed or len(self._pending) + end > self.max_line_bytes:
                lines = self._split_checked(complete)
            else:
                lines = self._split(bytes(self._pending) + complete)
                self._pending.clear()
        elif end > self.max_line_bytes:
            lines = self._split_checked(complete)
        else:
            lines = self._split(complete)  # no line can be over the limit
        self._append(data[end + 1 :])
        return lines

    def close(self) -> Lines:
        """End of stream: an unterminated last line is still a line."""
        if not (self._pending or self._overflowed):
            return Lines([], _NONE_CUT)
        cut = self._overflowed
        text = self._split(bytes(self._pending)).text
        self._pending.clear()
        self._overflowed = False
        return Lines(text, frozenset({0}) if cut else _NONE_CUT)

    @staticmethod
    def _split(block: bytes | bytearray) -> Lines:
        text = block.decode("utf-8", "replace")
        if "\r" in text:
            text = text.replace("\r\n", "\n")
            if text.endswith("\r"):
                text = text[:-1]
        return Lines(text.split("\n"), _NONE_CUT)

    def discard(self) -> None:
        """Forget the unfinished line (a terminal dropped it on Ctrl-C, say)."""
        self._pending.clear()
        self._overflowed = False

    def _split_checked(self, complete: bytes | bytearray) -> Lines:
        """The slow path, for a block that may hold an over-long line: measure each line in bytes."""
        limit = self.max_line_bytes
        pieces = bytes(complete).split(b"\n")
        text: list[str] = []
        cut: set[int] = set()
        for index, raw in enumerate(pieces):
            if index == 0 and (self._pending or self._overflowed):
                self._append(raw)
                piece, overflowed = bytes(self._pending), self._overflowed
                self._pending.clear()
                self._overflowed = False
            else:
                overflowed = len(raw) > limit
                piece = raw[:limit]
            if overflowed:
                cut.add(index)
            text.append(self._split(piece).text[0])
        return Lines(text, frozenset(cut))

    def _append(self, chunk: bytes | bytearray) -> None:
        if self._overflowed or not chunk:
            return
        room = self.max_line_bytes - len(self._pending)
        if len(chunk) > room:
            self._pending += chunk[:room]
            self._overflowed = True
        else:
            self._pending += chunk
