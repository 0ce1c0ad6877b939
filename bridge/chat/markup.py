"""The agent's Markdown as a chat platform's rich text, cut into messages the platform accepts. Pure: no I/O.

`telegram_parts(markdown)` gives Telegram messages as text plus Bot API `MessageEntity` dicts (offsets and lengths in
UTF-16 code units, so nothing needs escaping and no `parse_mode` can fail on a stray `_`); `matrix_parts(markdown)`
gives Matrix messages as a plain `body` beside an `org.matrix.custom.html` `formatted_body`; `plain_parts(text, limit)`
cuts plain text the same way, for a part a platform refused to parse.

The Markdown is CommonMark (markdown-it-py) with tables and strikethrough. It is first rendered into one plain text
with spans over it (bold, a link, a code block, a list item…); that text is then cut at the platform's limit — at a
paragraph break, else a line break, else a space, else hard — never inside a span the platform shows as one piece
(bold, a link, inline code, a heading) unless nothing else fits. A code block or a quote longer than a message is cut
at a line inside it and closed and reopened, with its language, in the next part. Each part gets the spans that fall
in it, rebased to its start; whitespace at a cut is dropped, nothing else. A Telegram part holds at most 100 entities
(Telegram ignores the rest); a Matrix part's HTML fits the limit too (a link whose address alone would fill half a
message is shown as text).
"""

from __future__ import annotations

import bisect
import functools
import html
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

TELEGRAM_LIMIT = 4096
TELEGRAM_MAX_ENTITIES = 100  # a message's entities past the 100th are silently ignored by Telegram
MATRIX_LIMIT = 32000


@dataclass(frozen=True)
class TelegramText:
    """One Telegram message: `text` and its `entities` (Bot API MessageEntity dicts, UTF-16 offsets)."""

    text: str
    entities: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class MatrixText:
    """One Matrix `m.text` message: a plain `body` and its `org.matrix.custom.html` `formatted_body`."""

    body: str
    formatted_body: str


def utf16_length(text: str) -> int:
    """How many UTF-16 code units `text` takes: the unit Telegram counts offsets and its 4096 limit in."""
    return len(text) + sum(1 for character in text if ord(character) > 0xFFFF)


_ASCII_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def markdown_text(text: str) -> str:
    """`text` as Markdown that shows it as written, on one line: for names, file names and other text of users or
    platforms the bot writes into its own Markdown. CommonMark lets any ASCII punctuation be backslash-escaped, which
    leaves nothing to open emphasis, a link, code or a list; line breaks become spaces, as a line starting with
    spaces or a `#` could still begin a block."""
    return _ASCII_PUNCTUATION.sub(r"\\\1", " ".join(text.splitlines()))


def telegram_parts(markdown: str, limit: int = TELEGRAM_LIMIT) -> list[TelegramText]:
    """`markdown` as Telegram messages of at most `limit` UTF-16 code units each, with their entities."""
    document = _render(markdown, urls_in_text=False, link_schemes=_TELEGRAM_LINK_SCHEMES)
    messages: list[TelegramText] = []
    for part in _split(document, limit, utf16_length):
        messages.extend(_telegram_texts(part))
    return messages


def matrix_parts(markdown: str, limit: int = MATRIX_LIMIT) -> list[MatrixText]:
    """`markdown` as Matrix messages whose `body` and `formatted_body` are each at most `limit` characters."""
    # A link whose `<a href>` would fill half a message is shown as text: the address alone could outgrow a message.
    document = _render(markdown, urls_in_text=True, link_schemes=_MATRIX_LINK_SCHEMES, longest_link=limit // 2)
    messages: list[MatrixText] = []
    for part in _split(document, limit, len):
        messages.extend(_matrix_texts(part, limit))
    return messages


def plain_parts(text: str, limit: int, count: Callable[[str], int] = utf16_length) -> list[str]:
    """`text` cut into parts of at most `limit` as `count` measures (it must add up character by character)."""
    return [part.text for part in _split(_Document(text, ()), limit, count)]


# The document: one text, spans over it.


@dataclass(frozen=True)
class _Span:
    kind: str
    start: int
    end: int
    attribute: str = ""
    order: int = 0  # the order spans were opened in: of two with the same range, the first is the outer one


@dataclass(frozen=True)
class _Document:
    text: str
    spans: tuple[_Span, ...]


# Spans whose text is in the plain text only: a list item's bullet, a link's URL after its text, the blank line
# between blocks. HTML says the same with its tags.
_PLAIN_ONLY = frozenset({"marker", "url", "separator"})
# Spans a platform shows as one piece: cut inside one only when it alone is longer than a message.
_UNBREAKABLE = frozenset({"bold", "italic", "strikethrough", "code", "link", "heading", "marker", "url"})
# Blocks cut inside (closed in one part and reopened in the next) only when no cut outside them fits.
_KEPT_WHOLE_IF_POSSIBLE = frozenset({"pre", "blockquote"})
# The links each platform opens (Matrix clients keep these in a sanitised message); another URL is shown as text.
_TELEGRAM_LINK_SCHEMES = ("http://", "https://", "tg://")
_MATRIX_LINK_SCHEMES = ("http://", "https://", "ftp://", "mailto:", "magnet:")
_RULE = "———"


@functools.cache
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


@dataclass(frozen=True)
class _OpenLink:
    url: str
    first_chunk: int  # where its text begins in _Builder.chunks
    linkable: bool  # a link the platform opens, not a path shown as text
    nested: bool


class _Builder:
    """Writes the rendered text and records the spans over it while markdown-it's tokens are walked."""

    def __init__(self, *, urls_in_text: bool, link_schemes: tuple[str, ...], longest_link: int | None) -> None:
        self.urls_in_text = urls_in_text
        self.link_schemes = link_schemes
        self.longest_link = longest_link  # the longest address (HTML-escaped) made a link; None: any
        self.chunks: list[str] = []
        self.length = 0
        self.spans: list[_Span] = []
        self.opened: list[tuple[str, int, str, int]] = []
        self.opened_count = 0
        self.block_written = False  # a block ended since the last separator: the next one needs one
        self.list_depth = 0
        self.list_kinds: list[str] = []
        self.markers: list[str] = []
        self.links: list[_OpenLink] = []
        self.table_row_cells = 0
        self.table_rows = 0

    def write(self, text: str) -> None:
        if text:
            self.chunks.append(text)
            self.length += len(text)

    def open(self, kind: str, attribute: str = "") -> None:
        self.opened.append((kind, self.length, attribute, self.opened_count))
        self.opened_count += 1

    def close(self, kind: str) -> None:
        opened_kind, start, attribute, order = self.opened.pop()
        assert opened_kind == kind, (opened_kind, kind)
        if self.length > start:
            self.spans.append(_Span(kind, start, self.length, attribute, order))

    def block_break(self) -> None:
        """Before a block: a blank line after the previous one (a line break between the items of a list)."""
        if self.block_written and self.length:
            self.open("separator")
            self.write("\n" if self.list_depth else "\n\n")
            self.close("separator")
        self.block_written = False

    def start_leaf(self) -> None:
        """Before a block that holds text: the separator, then the bullets of the list items it begins."""
        self.block_break()
        self.write_markers()

    def write_markers(self) -> None:
        if self.markers:
            self.open("marker")
            self.write("".join(self.markers))
            self.close("marker")
            self.markers.clear()

    def end_block(self) -> None:
        self.block_written = True

    def document(self) -> _Document:
        assert not self.opened
        return _Document("".join(self.chunks), tuple(self.spans))


def _render(
    markdown: str, *, urls_in_text: bool, link_schemes: tuple[str, ...], longest_link: int | None = None
) -> _Document:
    builder = _Builder(urls_in_text=urls_in_text, link_schemes=link_schemes, longest_link=longest_link)
    for token in _parser().parse(markdown):
        _render_block(builder, token)
    return builder.document()


def _render_block(builder: _Builder, token: Token) -> None:
    kind = token.type
    if kind == "inline":
        for child in token.children or ():
            _render_inline(builder, child)
    elif kind.startswith(("bullet_list", "ordered_list", "list_item", "blockquote")):
        _render_nesting(builder, token)
    elif kind.startswith(("table", "tr", "th", "td")):
        _render_table(builder, token)
    else:
        _render_leaf(builder, token)


def _render_leaf(builder: _Builder, token: Token) -> None:
    """Paragraphs, headings, code, rules and raw HTML: blocks that hold text, not other blocks."""
    kind = token.type
    if kind == "paragraph_open":
        builder.start_leaf()
        if not token.hidden:  # a tight list's paragraphs are hidden: no <p> inside its <li>
            builder.open("paragraph")
    elif kind == "paragraph_close":
        if not token.hidden:
            builder.close("paragraph")
        builder.end_block()
    elif kind == "heading_open":
        builder.start_leaf()
        builder.open("heading", token.tag[1:])
    elif kind == "heading_close":
        builder.close("heading")
        builder.end_block()
    elif kind in ("fence", "code_block"):
        builder.start_leaf()
        language = token.info.split()[0] if token.info.strip() else ""
        builder.open("pre", language)
        builder.write(token.content.rstrip("\n"))
        builder.close("pre")
        builder.end_block()
    elif kind in ("hr", "html_block"):
        builder.start_leaf()
        builder.open("paragraph")
        builder.write(_RULE if kind == "hr" else token.content.rstrip("\n"))
        builder.close("paragraph")
        builder.end_block()


def _render_nesting(builder: _Builder, token: Token) -> None:
    """Lists, their items and block quotes: blocks that hold other blocks."""
    kind = token.type
    if kind in ("bullet_list_open", "ordered_list_open"):
        builder.block_break()
        builder.open("bullet_list" if kind == "bullet_list_open" else "ordered_list")
        builder.list_kinds.append(kind)
        builder.list_depth += 1
    elif kind in ("bullet_list_close", "ordered_list_close"):
        builder.list_depth -= 1
        builder.list_kinds.pop()
        builder.close("bullet_list" if kind == "bullet_list_close" else "ordered_list")
        builder.end_block()
    elif kind == "list_item_open":
        builder.block_break()
        number = token.info or "1"
        builder.open("list_item", number)
        indent = "  " * (builder.list_depth - 1)
        builder.markers.append(f"{indent}• " if builder.list_kinds[-1] == "bullet_list_open" else f"{indent}{number}. ")
    elif kind == "list_item_close":
        builder.write_markers()  # an empty item still shows its bullet
        builder.close("list_item")
        builder.end_block()
    elif kind == "blockquote_open":
        builder.block_break()
        builder.open("blockquote")
    elif kind == "blockquote_close":
        builder.close("blockquote")
        builder.end_block()


def _render_table(builder: _Builder, token: Token) -> None:
    """A table becomes one paragraph, a line per row and its cells joined by " | " (chat has no tables)."""
    kind = token.type
    if kind == "table_open":
        builder.start_leaf()
        builder.open("paragraph")
        builder.table_rows = 0
    elif kind == "table_close":
        builder.close("paragraph")
        builder.end_block()
    elif kind == "tr_open":
        if builder.table_rows:
            builder.write("\n")
        builder.table_rows += 1
        builder.table_row_cells = 0
    elif kind in ("th_open", "td_open"):
        if builder.table_row_cells:
            builder.write(" | ")
        builder.table_row_cells += 1
        if kind == "th_open":
            builder.open("bold")
    elif kind == "th_close":
        builder.close("bold")


_INLINE_SPANS = {"em": "italic", "strong": "bold", "s": "strikethrough"}


def _render_inline(builder: _Builder, token: Token) -> None:
    kind = token.type
    if kind in ("softbreak", "hardbreak"):
        builder.write("\n")
    elif kind == "code_inline":
        builder.open("code")
        builder.write(token.content)
        builder.close("code")
    elif kind.endswith("_open") and kind[: -len("_open")] in _INLINE_SPANS:
        builder.open(_INLINE_SPANS[kind[: -len("_open")]])
    elif kind.endswith("_close") and kind[: -len("_close")] in _INLINE_SPANS:
        builder.close(_INLINE_SPANS[kind[: -len("_close")]])
    elif kind == "link_open":
        _open_link(builder, str(token.attrGet("href") or ""))
    elif kind == "link_close":
        _close_link(builder)
    elif kind == "image":
        source = str(token.attrGet("src") or "")
        _open_link(builder, source)
        builder.write(token.content or source)
        _close_link(builder)
    else:  # text, an escaped character, inline HTML (shown as written, never interpreted)
        builder.write(token.content)


def _open_link(builder: _Builder, url: str) -> None:
    nested = bool(builder.links)  # an image inside a link: its alt text is part of the outer link's text
    fits = builder.longest_link is None or len(html.escape(url)) <= builder.longest_link
    linkable = url.lower().startswith(builder.link_schemes) and not nested and fits
    builder.links.append(_OpenLink(url, len(builder.chunks), linkable, nested))
    if linkable:
        builder.open("link", url)


def _close_link(builder: _Builder) -> None:
    link = builder.links.pop()
    if link.linkable:
        builder.close("link")
    label = "".join(builder.chunks[link.first_chunk :])
    if link.nested or link.url in (label, f"mailto:{label}"):
        return
    if not link.linkable:  # no link to hide it behind (a relative path): the URL is part of the text everywhere
        builder.write(f" ({link.url})")
    elif builder.urls_in_text:
        builder.open("url")
        builder.write(f" ({link.url})")
        builder.close("url")


# Cutting a document into parts.


_CUTS = ("\n\n", "\n", " ")


def _split(document: _Document, limit: int, count: Callable[[str], int]) -> list[_Document]:
    if limit < 1:
        raise ValueError(f"a message limit must be at least 1, not {limit}")
    return _Cutter(document, limit, count).parts()


class _Cutter:
    """Cuts one document into parts of at most `limit` (as `count` measures), each valid on its own."""

    def __init__(self, document: _Document, limit: int, count: Callable[[str], int]) -> None:
        self.document = document
        self.text = document.text
        self.limit = limit
        self.totals = [0]  # totals[i]: the measure of text[:i]
        for character in self.text:
            self.totals.append(self.totals[-1] + count(character))
        self.code = [(span.start, span.end) for span in document.spans if span.kind == "pre"]

    def parts(self) -> list[_Document]:
        parts: list[_Document] = []
        start = self.skip_whitespace(0)
        while start < len(self.text):
            part, start = self.next_part(start)
            if part is not None:
                parts.append(part)
        return parts

    def next_part(self, start: int) -> tuple[_Document | None, int]:
        """The part that begins at `start` (None: only blanks), and where the one after it begins."""
        text = self.text
        fits = bisect.bisect_right(self.totals, self.totals[start] + self.limit) - 1
        if fits == start:
            raise ValueError(f"a message limit of {self.limit} cannot hold the character {text[start]!r}")
        if fits >= len(text):
            end, following = len(text), len(text)
        else:
            end, following = self.cut(start, fits)
        end = self.trim_end(start, end)
        following = self.skip_whitespace(following)
        if not text[start:end].strip():  # a platform refuses a message of blanks (a cut in a code block's indentation)
            return None, following
        return _part(self.document, start, end), following

    def cut(self, start: int, fits: int) -> tuple[int, int]:
        """Where the part from `start` (which may run up to `fits`) ends, and where the next one begins."""
        text = self.text
        nearby = [span for span in self.document.spans if span.start <= fits and span.end > start]
        half = start + (fits - start) // 2
        for avoided in (_UNBREAKABLE | _KEPT_WHOLE_IF_POSSIBLE, _UNBREAKABLE, frozenset[str]()):
            kept_whole = [span for span in nearby if span.kind in avoided]
            for earliest in (half, start + 1):
                for separator in _CUTS:
                    position = text.rfind(separator, earliest, fits + len(separator))
                    while position >= earliest:
                        following = position + len(separator)
                        if text[start:position].strip() and not _crosses(kept_whole, position, following):
                            return position, following
                        position = text.rfind(separator, earliest, position + len(separator) - 1)
        return fits, fits

    def inside_code(self, position: int) -> bool:
        return any(start <= position < end for start, end in self.code)

    def skip_whitespace(self, position: int) -> int:
        """The next part begins at its first visible character, or at a code block's line as it is (indented)."""
        text = self.text
        while position < len(text) and text[position].isspace() and not self.inside_code(position):
            position += 1
        return position

    def trim_end(self, start: int, end: int) -> int:
        text = self.text
        while end > start and text[end - 1].isspace() and not self.inside_code(end - 1):
            end -= 1
        return end


def _crosses(spans: list[_Span], cut_start: int, cut_end: int) -> bool:
    """Whether cutting out `cut_start:cut_end` would leave one of `spans` on both sides of the cut."""
    return any(
        span.start < cut_end and span.end > cut_start and not (span.start >= cut_start and span.end <= cut_end)
        for span in spans
    )


def _part(document: _Document, start: int, end: int) -> _Document:
    spans = tuple(
        _Span(span.kind, max(span.start, start) - start, min(span.end, end) - start, span.attribute, span.order)
        for span in document.spans
        if max(span.start, start) < min(span.end, end)
    )
    return _Document(document.text[start:end], spans)


def _nesting_order(spans: Sequence[_Span]) -> list[_Span]:
    return sorted(spans, key=lambda span: (span.start, -span.end, span.order))


# Telegram: message entities.

_TELEGRAM_ENTITIES = {
    "bold": "bold",
    "heading": "bold",
    "italic": "italic",
    "strikethrough": "strikethrough",
    "code": "code",
    "pre": "pre",
    "link": "text_link",
    "blockquote": "blockquote",
}


def _telegram_texts(part: _Document) -> list[TelegramText]:
    """The part as Telegram messages: cut again before the entity Telegram would ignore (it keeps the first 100)."""
    message = _telegram_text(part)
    if len(message.entities) <= TELEGRAM_MAX_ENTITIES:
        return [message]
    units_before_the_first_ignored = message.entities[TELEGRAM_MAX_ENTITIES]["offset"]
    if units_before_the_first_ignored == 0:  # cannot happen: markdown-it nests at most 20 deep
        raise ValueError("more than 100 entities start at the same character")
    cutter = _Cutter(part, units_before_the_first_ignored, utf16_length)
    head, following = cutter.next_part(cutter.skip_whitespace(0))
    rest = _telegram_texts(_part(part, following, len(part.text))) if following < len(part.text) else []
    return ([_telegram_text(head)] if head is not None else []) + rest


def _telegram_text(part: _Document) -> TelegramText:
    offsets = [0]
    for character in part.text:
        offsets.append(offsets[-1] + (2 if ord(character) > 0xFFFF else 1))
    entities: list[dict[str, Any]] = []
    quoted_until = 0
    for span in _nesting_order(part.spans):
        entity_type = _TELEGRAM_ENTITIES.get(span.kind)
        if entity_type is None:
            continue
        if entity_type == "blockquote":
            if span.start < quoted_until:  # Telegram's quotes do not nest: the outer one holds them all
                continue
            quoted_until = span.end
        entity: dict[str, Any] = {
            "type": entity_type,
            "offset": offsets[span.start],
            "length": offsets[span.end] - offsets[span.start],
        }
        if entity_type == "pre" and span.attribute:
            entity["language"] = span.attribute
        if entity_type == "text_link":
            entity["url"] = span.attribute
        entities.append(entity)
    return TelegramText(part.text, tuple(entities))


# Matrix: org.matrix.custom.html beside the plain body.

_HTML_TAGS = {
    "bold": ("<strong>", "</strong>"),
    "italic": ("<em>", "</em>"),
    "strikethrough": ("<del>", "</del>"),
    "code": ("<code>", "</code>"),
    "paragraph": ("<p>", "</p>"),
    "blockquote": ("<blockquote>", "</blockquote>"),
    "bullet_list": ("<ul>", "</ul>"),
    "list_item": ("<li>", "</li>"),
}


def _matrix_texts(part: _Document, limit: int) -> list[MatrixText]:
    """The part as Matrix messages: cut again, smaller, while its HTML (tags, escapes) is over the limit."""
    formatted = _html(part)
    if len(formatted) <= limit:
        return [MatrixText(part.text, formatted)]
    if len(part.text) <= 1:
        raise ValueError(f"a message limit of {limit} cannot hold {part.text!r} as HTML")
    smaller = max(1, len(part.text) * limit // len(formatted))
    messages: list[MatrixText] = []
    for piece in _split(part, smaller, len):
        messages.extend(_matrix_texts(piece, limit))
    return messages


def _html(part: _Document) -> str:
    spans = _nesting_order(part.spans)
    out: list[str] = []
    stack: list[_Span] = []
    position = 0

    def text_until(end: int) -> None:
        nonlocal position
        segment = part.text[position:end]
        position = end
        if not segment or any(span.kind in _PLAIN_ONLY for span in stack):
            return
        escaped = html.escape(segment, quote=False)
        out.append(escaped if any(span.kind == "pre" for span in stack) else escaped.replace("\n", "<br>"))

    def close_until(boundary: int) -> None:
        while stack and stack[-1].end <= boundary:
            text_until(stack[-1].end)
            out.append(_closing_tag(stack.pop()))

    for index, span in enumerate(spans):
        close_until(span.start)
        text_until(span.start)
        out.append(_opening_tag(span, spans[index + 1 :]))
        stack.append(span)
    close_until(len(part.text))
    text_until(len(part.text))
    return "".join(out)


def _opening_tag(span: _Span, later: Sequence[_Span]) -> str:
    if span.kind in _HTML_TAGS:
        return _HTML_TAGS[span.kind][0]
    if span.kind == "heading":
        return f"<h{span.attribute}>"
    if span.kind == "pre":
        language = f' class="language-{html.escape(span.attribute)}"' if span.attribute else ""
        return f"<pre><code{language}>"
    if span.kind == "link":
        return f'<a href="{html.escape(span.attribute)}">'
    if span.kind == "ordered_list":
        first = next((item.attribute for item in later if item.kind == "list_item"), "1")
        return "<ol>" if first == "1" else f'<ol start="{html.escape(first)}">'
    return ""


def _closing_tag(span: _Span) -> str:
    if span.kind in _HTML_TAGS:
        return _HTML_TAGS[span.kind][1]
    return {"heading": f"</h{span.attribute}>", "pre": "</code></pre>", "link": "</a>", "ordered_list": "</ol>"}.get(
        span.kind, ""
    )
