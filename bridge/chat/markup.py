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
in it, rebased to its start; whitespace at a cut is dropped, nothing else.
"""

from __future__ import annotations

import bisect
import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token

TELEGRAM_LIMIT = 4096
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


def telegram_parts(markdown: str, limit: int = TELEGRAM_LIMIT) -> list[TelegramText]:
    """`markdown` as Telegram messages of at most `limit` UTF-16 code units each, with their entities."""
    document = _render(markdown, urls_in_text=False)
    return [_telegram_text(part) for part in _split(document, limit, utf16_length)]


def matrix_parts(markdown: str, limit: int = MATRIX_LIMIT) -> list[MatrixText]:
    """`markdown` as Matrix messages whose `body` and `formatted_body` are each at most `limit` characters."""
    document = _render(markdown, urls_in_text=True)
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
_LINKABLE_SCHEMES = ("http://", "https://", "mailto:", "tg://", "ftp://")
_RULE = "———"


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


class _Builder:
    """Writes the rendered text and records the spans over it while markdown-it's tokens are walked."""

    def __init__(self, *, urls_in_text: bool) -> None:
        self.urls_in_text = urls_in_text
        self.chunks: list[str] = []
        self.length = 0
        self.spans: list[_Span] = []
        self.opened: list[tuple[str, int, str, int]] = []
        self.opened_count = 0
        self.block_written = False  # a block ended since the last separator: the next one needs one
        self.list_depth = 0
        self.list_kinds: list[str] = []
        self.markers: list[str] = []
        self.links: list[tuple[str, int, bool]] = []
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

    def text_since(self, start: int) -> str:
        return "".join(self.chunks)[start:]

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


def _render(markdown: str, *, urls_in_text: bool) -> _Document:
    builder = _Builder(urls_in_text=urls_in_text)
    for token in _parser().parse(markdown):
        _render_block(builder, token)
    return builder.document()


def _render_block(builder: _Builder, token: Token) -> None:
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
    elif kind in ("bullet_list_open", "ordered_list_open"):
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
    elif kind == "table_open":
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
    elif kind == "inline":
        for child in token.children or ():
            _render_inline(builder, child)


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
    linkable = url.lower().startswith(_LINKABLE_SCHEMES)
    builder.links.append((url, builder.length, linkable))
    if linkable:
        builder.open("link", url)


def _close_link(builder: _Builder) -> None:
    url, start, linkable = builder.links.pop()
    if linkable:
        builder.close("link")
    label = builder.text_since(start)
    shows_its_url = url in (label, f"mailto:{label}")
    if shows_its_url:
        return
    if not linkable:  # no link to hide it behind (a relative path): the URL is part of the text everywhere
        builder.write(f" ({url})")
    elif builder.urls_in_text:
        builder.open("url")
        builder.write(f" ({url})")
        builder.close("url")


# Cutting a document into parts.


_CUTS = ("\n\n", "\n", " ")


def _split(document: _Document, limit: int, count: Callable[[str], int]) -> list[_Document]:
    if limit < 1:
        raise ValueError(f"a message limit must be at least 1, not {limit}")
    text = document.text
    totals = [0]
    for character in text:
        totals.append(totals[-1] + count(character))
    parts: list[_Document] = []
    start = _skip_whitespace(document, 0)
    while start < len(text):
        fits = bisect.bisect_right(totals, totals[start] + limit) - 1
        if fits == start:
            raise ValueError(f"a message limit of {limit} cannot hold the character {text[start]!r}")
        if fits >= len(text):
            end, following = len(text), len(text)
        else:
            end, following = _cut(document, start, fits)
        end = _trim_end(document, start, end)
        if text[start:end].strip():  # a platform refuses a message of blanks (a cut in a code block's indentation)
            parts.append(_part(document, start, end))
        start = _skip_whitespace(document, following)
    return parts


def _cut(document: _Document, start: int, fits: int) -> tuple[int, int]:
    """Where the part from `start` (which may run up to `fits`) ends, and where the next one begins."""
    text = document.text
    half = start + (fits - start) // 2
    for avoided in (_UNBREAKABLE | _KEPT_WHOLE_IF_POSSIBLE, _UNBREAKABLE, frozenset[str]()):
        for earliest in (half, start + 1):
            for separator in _CUTS:
                position = text.rfind(separator, earliest, fits + len(separator))
                while position >= earliest:
                    following = position + len(separator)
                    if text[start:position].strip() and not _crosses(document, position, following, avoided):
                        return position, following
                    position = text.rfind(separator, earliest, position + len(separator) - 1)
    return fits, fits


def _crosses(document: _Document, cut_start: int, cut_end: int, kinds: frozenset[str]) -> bool:
    """Whether cutting out `cut_start:cut_end` would leave a span of `kinds` on both sides of the cut."""
    return any(
        span.kind in kinds and span.start < cut_end and span.end > cut_start and not _holds(span, cut_start, cut_end)
        for span in document.spans
    )


def _holds(span: _Span, cut_start: int, cut_end: int) -> bool:
    """Whether the cut is just the span's own text (a separator): it may go."""
    return span.start >= cut_start and span.end <= cut_end


def _inside_code(document: _Document, position: int) -> bool:
    return any(span.kind == "pre" and span.start <= position < span.end for span in document.spans)


def _skip_whitespace(document: _Document, position: int) -> int:
    """The next part begins at its first visible character, or at a code block's line as it is (its indentation)."""
    text = document.text
    while position < len(text) and text[position].isspace() and not _inside_code(document, position):
        position += 1
    return position


def _trim_end(document: _Document, start: int, end: int) -> int:
    text = document.text
    while end > start and text[end - 1].isspace() and not _inside_code(document, end - 1):
        end -= 1
    return end


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
