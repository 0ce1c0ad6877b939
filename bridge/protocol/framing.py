"""Newline framing with a bound on line length. Sans-I/O.

Both directions of the bridge read newline-delimited text from a peer it does
not trust — an agent's stdout, a `serve` client's requests — so both need the
same guarantee: memory for at most one line of `max_line_bytes`, whatever the
peer sends.
"""

from __future__ import annotations


class LineSplitter:
    """Split a byte stream into lines, holding at most `max_line_bytes` of the unfinished one.

    `feed()` may be called with any split of the stream; it returns one
    `(line, cut)` pair per line ended by `\\n`, without the newline and one
    trailing `\\r`. A longer line is cut at the limit (`cut` is True) and the
    rest of it is dropped as it arrives. `close()` returns the unterminated
    last line, if any.
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

    def feed(self, data: bytes | bytearray) -> list[tuple[bytes, bool]]:
        if not data:
            return []
        pieces = data.split(b"\n")
        tail = pieces.pop()
        lines: list[tuple[bytes, bool]] = []
        if pieces:
            if self._pending or self._overflowed:
                self._append(pieces[0])
                lines.append(self._take())
                pieces = pieces[1:]
            limit = self.max_line_bytes
            for line in pieces:
                cut = len(line) > limit
                if cut:
                    line = line[:limit]
                lines.append((line[:-1] if line[-1:] == b"\r" else line, cut))
        if tail:
            self._append(tail)
        return lines

    def close(self) -> list[tuple[bytes, bool]]:
        """End of stream: an unterminated last line is still a line."""
        if self._pending or self._overflowed:
            return [self._take()]
        return []

    def _append(self, chunk: bytes) -> None:
        if self._overflowed:
            return
        room = self.max_line_bytes - len(self._pending)
        if len(chunk) > room:
            self._pending += chunk[:room]
            self._overflowed = True
        else:
            self._pending += chunk

    def _take(self) -> tuple[bytes, bool]:
        line, cut = bytes(self._pending), self._overflowed
        self._pending.clear()
        self._overflowed = False
        return (line[:-1] if line[-1:] == b"\r" else line), cut
