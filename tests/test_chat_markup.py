"""The agent's Markdown as Telegram entities and Matrix HTML, cut into messages each platform accepts (bridge.chat.markup)."""

from __future__ import annotations

import re
from html import escape as html_escape
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.chat.markup import (
    MatrixText,
    TelegramText,
    markdown_text,
    matrix_parts,
    plain_parts,
    telegram_parts,
    utf16_length,
)


def entity_text(part: TelegramText, entity: dict) -> str:
    units = part.text.encode("utf-16-le")
    return units[entity["offset"] * 2 : (entity["offset"] + entity["length"]) * 2].decode("utf-16-le")


def entity_texts(part: TelegramText) -> list[tuple[str, str]]:
    return [(entity["type"], entity_text(part, entity)) for entity in part.entities]


def without_whitespace(text: str) -> str:
    return re.sub(r"\s+", "", text)


def assert_valid_telegram_parts(markdown: str, parts: list[TelegramText], limit: int) -> None:
    """Every part fits, no part is empty, every entity lies inside its text on whole characters, nothing is lost."""
    whole = telegram_parts(markdown, limit=10**9)
    assert without_whitespace("".join(part.text for part in parts)) == without_whitespace(
        "".join(part.text for part in whole)
    )
    for part in parts:
        assert part.text.strip(), parts
        assert utf16_length(part.text) <= limit
        assert len(part.entities) <= 100, "Telegram ignores the entities past the 100th"
        boundaries = {0}
        for character in part.text:
            boundaries.add(max(boundaries) + utf16_length(character))
        for entity in part.entities:
            assert entity["length"] > 0, entity
            assert entity["offset"] in boundaries and entity["offset"] + entity["length"] in boundaries, entity
            assert entity_text(part, entity)  # decodes: no half of a surrogate pair


class TagBalance(HTMLParser):
    """Checks that the HTML closes every tag it opens, in order, and uses only the tags Matrix clients render."""

    ALLOWED = {"strong", "em", "del", "code", "pre", "a", "blockquote", "ul", "ol", "li", "p", "br"} | {
        f"h{level}" for level in range(1, 7)
    }

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        assert tag in self.ALLOWED, tag
        if tag != "br":
            self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open.pop() == tag, (tag, self.open)


def assert_valid_matrix_parts(parts: list[MatrixText], limit: int) -> None:
    for part in parts:
        assert part.body.strip(), parts
        assert len(part.body) <= limit and len(part.formatted_body) <= limit
        checker = TagBalance()
        checker.feed(part.formatted_body)
        checker.close()
        assert checker.open == [], part.formatted_body


@pytest.mark.parametrize(
    ("text", "units"),
    [
        ("", 0),
        ("hello", 5),
        ("héllo", 5),
        ("日本語", 3),
        ("😀", 2),
        ("a😀b", 4),
        ("👍🏽", 4),  # a thumb and its skin tone: two astral characters
        ("👨‍👩‍👧", 8),  # three astral characters joined by two zero-width joiners
        ("𝔘𝔫𝔦", 6),
    ],
)
def test_utf16_length_counts_code_units_as_telegram_does(text: str, units: int) -> None:
    assert utf16_length(text) == units


@pytest.mark.parametrize(
    ("markdown", "text", "entities"),
    [
        ("plain words", "plain words", []),
        ("**bold** and *italic*", "bold and italic", [("bold", "bold"), ("italic", "italic")]),
        ("__bold__ and _italic_", "bold and italic", [("bold", "bold"), ("italic", "italic")]),
        ("~~gone~~ now", "gone now", [("strikethrough", "gone")]),
        ("run `make test` now", "run make test now", [("code", "make test")]),
        ("***both***", "both", [("italic", "both"), ("bold", "both")]),
        ("**bold *and italic***", "bold and italic", [("bold", "bold and italic"), ("italic", "and italic")]),
        ("# Title", "Title", [("bold", "Title")]),
        ("### Small *title*", "Small title", [("bold", "Small title"), ("italic", "title")]),
        ("> quoted\n> text", "quoted\ntext", [("blockquote", "quoted\ntext")]),
        ("> outer\n>\n> > inner", "outer\n\ninner", [("blockquote", "outer\n\ninner")]),
        ("- one\n- two", "• one\n• two", []),
        ("1. one\n2. two", "1. one\n2. two", []),
        ("3. three\n4. four", "3. three\n4. four", []),
        ("- one\n  - inner\n- two", "• one\n  • inner\n• two", []),
        ("para\n\n- item\n\nafter", "para\n\n• item\n\nafter", []),
        ("line one\nline two", "line one\nline two", []),
        ("hard  \nbreak", "hard\nbreak", []),
        ("a\n\n---\n\nb", "a\n\n———\n\nb", []),
        ("2 * 3 * 4 and a_b_c", "2 * 3 * 4 and a_b_c", []),
        (r"\*not italic\*", "*not italic*", []),
        ("<b>raw</b> html", "<b>raw</b> html", []),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "a | b\n1 | 2", [("bold", "a"), ("bold", "b")]),
        ("😀 **bold** 😀", "😀 bold 😀", [("bold", "bold")]),
        ("𝔘𝔫𝔦 *𝔠𝔬𝔡𝔢* x", "𝔘𝔫𝔦 𝔠𝔬𝔡𝔢 x", [("italic", "𝔠𝔬𝔡𝔢")]),
    ],
)
def test_markdown_becomes_telegram_text_and_entities(markdown: str, text: str, entities: list) -> None:
    [part] = telegram_parts(markdown)
    assert part.text == text
    assert entity_texts(part) == entities


def test_a_code_block_becomes_a_pre_entity_with_its_language() -> None:
    [part] = telegram_parts("Look:\n\n```python\ndef f():\n    return 1\n```\n\n```\nno language\n```")
    assert part.text == "Look:\n\ndef f():\n    return 1\n\nno language"
    assert [dict(entity) for entity in part.entities] == [
        {"type": "pre", "offset": 7, "length": 21, "language": "python"},
        {"type": "pre", "offset": 30, "length": 11},
    ]


def test_an_indented_code_block_is_a_pre_entity_too() -> None:
    [part] = telegram_parts("text\n\n    indented code\n")
    assert entity_texts(part) == [("pre", "indented code")]


def test_entity_offsets_and_lengths_count_utf16_units_after_astral_characters() -> None:
    [part] = telegram_parts("😀😀 **bold** 👨‍👩‍👧 `code` [link](https://example.org)")
    assert [dict(entity) for entity in part.entities] == [
        {"type": "bold", "offset": 5, "length": 4},
        {"type": "code", "offset": 19, "length": 4},
        {"type": "text_link", "offset": 24, "length": 4, "url": "https://example.org"},
    ]


@pytest.mark.parametrize(
    ("markdown", "text", "entities"),
    [
        ("see [the docs](https://example.org/d?a=1&b=2)", "see the docs", [("text_link", "the docs")]),
        ("<https://example.org>", "https://example.org", [("text_link", "https://example.org")]),
        ("[**bold link**](https://e.org)", "bold link", [("text_link", "bold link"), ("bold", "bold link")]),
        ("![a cat](https://e.org/cat.png)", "a cat", [("text_link", "a cat")]),
        ("![](https://e.org/cat.png)", "https://e.org/cat.png", [("text_link", "https://e.org/cat.png")]),
        ("[guide](docs/guide.md)", "guide (docs/guide.md)", []),  # no link to put it behind: the path is shown
        ("[x](javascript:alert(1))", "[x](javascript:alert(1))", []),
        ("[![logo](https://e.org/l.png)](https://e.org)", "logo", [("text_link", "logo")]),
        ("[*a* `b`](https://e.org)", "a b", [("text_link", "a b"), ("italic", "a"), ("code", "b")]),
        ("mail <me@example.org>", "mail me@example.org", []),  # Telegram links an address itself
        ("[write](mailto:me@example.org)", "write (mailto:me@example.org)", []),
        ("[file](ftp://e.org/f)", "file (ftp://e.org/f)", []),
        ("[chat](tg://resolve?domain=x)", "chat", [("text_link", "chat")]),
    ],
)
def test_links_and_images_become_text_links(markdown: str, text: str, entities: list) -> None:
    [part] = telegram_parts(markdown)
    assert part.text == text
    assert entity_texts(part) == entities


def test_a_text_link_carries_its_url() -> None:
    [part] = telegram_parts("[docs](https://example.org/d?a=1&b=2)")
    assert part.entities == ({"type": "text_link", "offset": 0, "length": 4, "url": "https://example.org/d?a=1&b=2"},)


@pytest.mark.parametrize("markdown", ["", "   ", "\n\n\n", "\t \n"])
def test_nothing_to_say_is_no_message(markdown: str) -> None:
    assert telegram_parts(markdown) == []
    assert matrix_parts(markdown) == []


@pytest.mark.parametrize(
    ("markdown", "body", "formatted_body"),
    [
        ("plain", "plain", "<p>plain</p>"),
        (
            "**b** *i* ~~s~~ `c`",
            "b i s c",
            "<p><strong>b</strong> <em>i</em> <del>s</del> <code>c</code></p>",
        ),
        ("# One\n\n###### Six", "One\n\nSix", "<h1>One</h1><h6>Six</h6>"),
        ("a <b> & c", "a <b> & c", "<p>a &lt;b&gt; &amp; c</p>"),
        ("one\ntwo", "one\ntwo", "<p>one<br>two</p>"),
        (
            '[docs](https://e.org/?a=1&b="2")',
            "docs (https://e.org/?a=1&b=%222%22)",
            '<p><a href="https://e.org/?a=1&amp;b=%222%22">docs</a></p>',
        ),
        ("<https://e.org>", "https://e.org", '<p><a href="https://e.org">https://e.org</a></p>'),
        (
            "![cat](https://e.org/c.png)",
            "cat (https://e.org/c.png)",
            '<p><a href="https://e.org/c.png">cat</a></p>',
        ),
        ("[guide](guide.md)", "guide (guide.md)", "<p>guide (guide.md)</p>"),
        ("<me@e.org>", "me@e.org", '<p><a href="mailto:me@e.org">me@e.org</a></p>'),
        (
            "[![logo](https://e.org/l.png)](https://e.org)",
            "logo (https://e.org)",
            '<p><a href="https://e.org">logo</a></p>',
        ),
        ("[chat](tg://resolve?domain=x)", "chat (tg://resolve?domain=x)", "<p>chat (tg://resolve?domain=x)</p>"),
        ("- a\n- b", "• a\n• b", "<ul><li>a</li><li>b</li></ul>"),
        ("- a\n\n- b", "• a\n• b", "<ul><li><p>a</p></li><li><p>b</p></li></ul>"),
        ("1. a\n2. b", "1. a\n2. b", "<ol><li>a</li><li>b</li></ol>"),
        ("7. a\n8. b", "7. a\n8. b", '<ol start="7"><li>a</li><li>b</li></ol>'),
        ("- a\n  - b", "• a\n  • b", "<ul><li>a<ul><li>b</li></ul></li></ul>"),
        ("> q\n>\n> > r", "q\n\nr", "<blockquote><p>q</p><blockquote><p>r</p></blockquote></blockquote>"),
        (
            "```rust\nfn main() { a < b && c; }\n```",
            "fn main() { a < b && c; }",
            '<pre><code class="language-rust">fn main() { a &lt; b &amp;&amp; c; }</code></pre>',
        ),
        ("```\nx\n\ny\n```", "x\n\ny", "<pre><code>x\n\ny</code></pre>"),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "a | b\n1 | 2", "<p><strong>a</strong> | <strong>b</strong><br>1 | 2</p>"),
        ("a\n\n***\n\nb", "a\n\n———\n\nb", "<p>a</p><p>———</p><p>b</p>"),
        ('```"><script>\nx\n```', "x", '<pre><code class="language-&quot;&gt;&lt;script&gt;">x</code></pre>'),
    ],
)
def test_markdown_becomes_matrix_html_beside_a_plain_body(markdown: str, body: str, formatted_body: str) -> None:
    assert matrix_parts(markdown) == [MatrixText(body, formatted_body)]


def test_raw_html_in_the_markdown_is_shown_never_interpreted() -> None:
    [part] = matrix_parts('<img src=x onerror="alert(1)">\n\nhi <script>alert(1)</script>')
    assert "<img" not in part.formatted_body and "<script" not in part.formatted_body
    assert "&lt;script&gt;" in part.formatted_body


# Splitting.


def paragraphs(count: int, words: int = 30) -> str:
    return "\n\n".join(" ".join(f"p{index}w{word}" for word in range(words)) for index in range(count))


def test_a_message_within_the_limit_is_one_part() -> None:
    text = "x" * 4096
    assert [part.text for part in telegram_parts(text)] == [text]
    assert plain_parts(text, 4096) == [text]


def test_the_limit_counts_utf16_units_not_characters() -> None:
    text = "😀" * 2048  # 2048 characters, 4096 units: fits exactly
    assert [part.text for part in telegram_parts(text)] == [text]
    parts = telegram_parts(text + "😀")
    assert [utf16_length(part.text) for part in parts] == [4096, 2]


def test_a_long_reply_is_cut_at_paragraph_breaks() -> None:
    markdown = paragraphs(40)
    parts = telegram_parts(markdown, limit=1000)
    assert len(parts) > 1
    assert_valid_telegram_parts(markdown, parts, 1000)
    for part in parts:
        assert part.text.split(" ")[0].endswith("w0"), "each part begins a paragraph"
        assert part.text.endswith("w29"), "each part ends a paragraph"


def test_without_paragraph_breaks_it_is_cut_at_line_breaks() -> None:
    markdown = "\n".join(f"line {index} " + "x" * 40 for index in range(100))
    parts = telegram_parts(markdown, limit=500)
    assert_valid_telegram_parts(markdown, parts, 500)
    for part in parts:
        assert all(re.fullmatch(r"line \d+ x{40}", line) for line in part.text.split("\n")), part.text


def test_a_paragraph_break_early_in_the_room_gives_way_to_a_line_break_late_in_it() -> None:
    markdown = "A short opening paragraph.\n\n" + "\n".join(f"line {index} " + "x" * 40 for index in range(100))
    parts = telegram_parts(markdown, limit=1000)
    assert_valid_telegram_parts(markdown, parts, 1000)
    assert utf16_length(parts[0].text) > 900, "the first part is filled, not ended after its first paragraph"
    assert parts[0].text.startswith("A short opening paragraph.\n\nline 0 ")


def test_without_line_breaks_it_is_cut_between_words() -> None:
    markdown = " ".join(f"word{index}" for index in range(1000))
    parts = plain_parts(markdown, 300)
    assert all(len(part) <= 300 for part in parts)
    assert " ".join(parts) == markdown


def test_a_single_over_long_word_is_cut_hard() -> None:
    assert [len(part) for part in plain_parts("x" * 10_000, 4096)] == [4096, 4096, 1808]
    parts = telegram_parts("y" * 10_000)
    assert [len(part.text) for part in parts] == [4096, 4096, 1808]


def test_a_hard_cut_never_splits_a_surrogate_pair() -> None:
    parts = plain_parts("😀" * 3000, 4095)  # an odd limit: 2047 emoji fill 4094 units, the 2048th would not fit
    assert [len(part) for part in parts] == [2047, 953]
    assert "".join(parts) == "😀" * 3000


def test_no_part_is_blank_even_where_a_code_blocks_indentation_is_cut() -> None:
    parts = telegram_parts("```\n" + " " * 10 + "x\n```", limit=4)
    assert [part.text for part in parts] == ["  x"]  # cut hard in the indentation: the blank pieces are not sent


def test_plain_parts_counts_as_it_is_told() -> None:
    text = "é" * 100
    assert plain_parts(text, 60, count=len) == ["é" * 60, "é" * 40]
    assert plain_parts(text, 60, count=lambda chars: len(chars.encode())) == ["é" * 30] * 3 + ["é" * 10]


def test_a_limit_that_cannot_hold_a_character_is_an_error() -> None:
    with pytest.raises(ValueError, match="limit"):
        plain_parts("😀", 1)
    with pytest.raises(ValueError, match="limit"):
        plain_parts("x", 0)


def test_a_cut_never_falls_inside_bold_italic_code_or_a_link_when_another_fits() -> None:
    phrases = [
        f"**bold phrase {index}** then *italic words {index}* and `code {index}` and [a link {index}](https://e.org/{index})"
        for index in range(60)
    ]
    markdown = " ".join(phrases)  # one paragraph, no line breaks: only the spaces between phrases are good cuts
    parts = telegram_parts(markdown, limit=700)
    assert len(parts) > 3
    assert_valid_telegram_parts(markdown, parts, 700)
    found = [text for part in parts for text in entity_texts(part)]
    assert [text for kind, text in found if kind == "bold"] == [f"bold phrase {index}" for index in range(60)]
    assert [text for kind, text in found if kind == "italic"] == [f"italic words {index}" for index in range(60)]
    assert [text for kind, text in found if kind == "code"] == [f"code {index}" for index in range(60)]
    assert [text for kind, text in found if kind == "text_link"] == [f"a link {index}" for index in range(60)]


def test_a_message_carries_at_most_100_entities_as_telegram_ignores_the_rest() -> None:
    markdown = " ".join(f"**b{index}** and `c{index}`" for index in range(150))  # 300 entities, 3,000 units
    parts = telegram_parts(markdown)
    assert len(parts) == 3
    assert_valid_telegram_parts(markdown, parts, 4096)
    assert all(len(part.entities) <= 100 for part in parts)
    found = [text for part in parts for text in entity_texts(part)]
    assert found == [pair for index in range(150) for pair in (("bold", f"b{index}"), ("code", f"c{index}"))]


def test_a_bold_span_longer_than_a_message_is_cut_and_each_part_keeps_it_bold() -> None:
    words = " ".join(f"w{index}" for index in range(400))
    parts = telegram_parts(f"**{words}**", limit=500)
    assert len(parts) > 2
    assert_valid_telegram_parts(f"**{words}**", parts, 500)
    for part in parts:
        assert entity_texts(part) == [("bold", part.text)]


def test_a_list_is_cut_between_its_items() -> None:
    markdown = "\n".join(f"- item number {index} with some words" for index in range(200))
    parts = telegram_parts(markdown, limit=400)
    assert_valid_telegram_parts(markdown, parts, 400)
    for part in parts:
        assert all(re.fullmatch(r"• item number \d+ with some words", line) for line in part.text.split("\n"))


def long_reply_with_code_blocks() -> tuple[str, list[tuple[str, str]]]:
    """A 10,000-character reply: prose, lists and code blocks, one of them longer than a Telegram message."""
    blocks: list[tuple[str, str]] = []
    sections: list[str] = []
    for index in range(6):
        language = ["python", "", "rust", "sh", "python", "go"][index]
        lines = 220 if index == 2 else 12 + index * 4
        code = "\n".join(
            f"    value_{index}_{line} = compute({line}) * 2  # {'😀' if line % 7 == 0 else 'x'}"
            for line in range(lines)
        )
        blocks.append((language, code))
        sections.append(
            f"## Step {index}\n\n"
            + paragraphs(2, words=25)
            + f"\n\n- first point of {index}\n- second point with **bold {index}**\n\n```{language}\n{code}\n```"
        )
    markdown = "\n\n".join(sections) + "\n\nThat is all."
    assert len(markdown) >= 10_000
    return markdown, blocks


def joined_code_blocks(parts: list[TelegramText]) -> list[tuple[str, str]]:
    """The code blocks of a reply as the reader sees them: a block cut between two parts counts once, rejoined."""
    pieces: list[tuple[str, str, bool, bool]] = []  # language, code, starts its part, ends its part
    for part in parts:
        for entity in part.entities:
            if entity["type"] == "pre":
                starts = entity["offset"] == 0
                ends = entity["offset"] + entity["length"] == utf16_length(part.text)
                pieces.append((entity.get("language", ""), entity_text(part, entity), starts, ends))
    blocks: list[tuple[str, str]] = []
    continues = False
    for language, code, starts, ends in pieces:
        if continues and starts:
            assert blocks[-1][0] == language, "a cut code block is reopened with its language"
            blocks[-1] = (language, blocks[-1][1] + "\n" + code)
        else:
            blocks.append((language, code))
        continues = ends
    return blocks


def test_a_10000_character_reply_with_code_blocks_is_cut_into_valid_telegram_messages() -> None:
    markdown, blocks = long_reply_with_code_blocks()
    parts = telegram_parts(markdown)
    assert len(parts) >= 3
    assert_valid_telegram_parts(markdown, parts, 4096)
    assert joined_code_blocks(parts) == blocks
    cut = [
        index
        for index, part in enumerate(parts[:-1])
        if part.entities
        and part.entities[-1]["type"] == "pre"
        and part.entities[-1]["offset"] + part.entities[-1]["length"] == utf16_length(part.text)
        and parts[index + 1].entities
        and parts[index + 1].entities[0]["type"] == "pre"
        and parts[index + 1].entities[0]["offset"] == 0
    ]
    assert cut, (
        "the 220-line block is longer than a message: it is closed at the end of one part and reopened in the next"
    )
    for part in parts:
        for entity in part.entities:
            if entity["type"] == "pre":
                for line in entity_text(part, entity).split("\n"):
                    assert re.fullmatch(r"    value_\d+_\d+ = compute\(\d+\) \* 2  # (😀|x)", line), line


def test_a_code_block_that_fits_a_message_is_never_cut() -> None:
    code = "\n".join(f"line {index}" for index in range(420))  # 3,669 units: fits one message of 4096
    # The paragraphs before it end early in the first part's room: a cut inside the block would fill that part more.
    markdown = paragraphs(3) + f"\n\n```python\n{code}\n```\n\n" + paragraphs(3)
    parts = telegram_parts(markdown)
    assert_valid_telegram_parts(markdown, parts, 4096)
    pre = [(part, entity) for part in parts for entity in part.entities if entity["type"] == "pre"]
    assert len(pre) == 1 and entity_text(*pre[0]) == code


def test_a_10000_character_reply_with_code_blocks_is_cut_into_valid_matrix_messages() -> None:
    markdown, blocks = long_reply_with_code_blocks()
    parts = matrix_parts(markdown, limit=4000)
    assert len(parts) >= 3
    assert_valid_matrix_parts(parts, 4000)
    assert without_whitespace("".join(part.body for part in parts)) == without_whitespace(
        matrix_parts(markdown)[0].body
    )
    reopened = [
        (before, after)
        for before, after in zip(parts, parts[1:])
        if before.formatted_body.endswith("</code></pre>") and after.formatted_body.startswith("<pre><code")
    ]
    assert reopened, "the long block is closed in one part and reopened in the next"
    for before, after in reopened:
        language = re.match(r'<pre><code( class="language-\w+")?>', after.formatted_body).group(0)
        assert language in before.formatted_body, "reopened with the same language"


def test_matrix_parts_fit_the_limit_even_when_escaping_makes_the_html_longer() -> None:
    markdown = "\n".join("a < b && c > d " * 5 for _ in range(100))
    parts = matrix_parts(markdown, limit=500)
    assert len(parts) > 1
    assert_valid_matrix_parts(parts, 500)
    assert without_whitespace("".join(part.body for part in parts)) == without_whitespace(markdown)


def test_a_link_whose_address_cannot_fit_a_matrix_message_is_shown_as_text_and_nothing_is_lost() -> None:
    # A diagram's or a playground's link carries its whole content in the address: tens of kilobytes.
    url = "https://mermaid.live/edit#pako:" + "eNq&" * 9000
    parts = matrix_parts(f"See [the diagram]({url}) for details.")
    assert len(parts) > 1
    assert_valid_matrix_parts(parts, 32000)
    assert without_whitespace("".join(part.body for part in parts)) == f"Seethediagram({url})fordetails."
    assert "<a " not in "".join(part.formatted_body for part in parts)
    # An address that fits is still a link.
    [short] = matrix_parts(f"See [the diagram]({url[:1000]}).")
    assert short.formatted_body.startswith('<p>See <a href="https://mermaid.live/edit#pako:eNq&amp;')


def test_an_ordered_list_cut_between_parts_keeps_its_numbers_in_matrix_html() -> None:
    markdown = "\n".join(f"{index}. item {index} " + "word " * 10 for index in range(1, 60))
    parts = matrix_parts(markdown, limit=600)
    assert len(parts) > 1
    assert_valid_matrix_parts(parts, 600)
    for part in parts[1:]:
        first_number = re.match(r"(\d+)\. ", part.body).group(1)
        assert part.formatted_body.startswith(f'<ol start="{first_number}">')


markdown_pieces = st.sampled_from(
    [
        "word",
        " ",
        "\n",
        "\n\n",
        "**",
        "*",
        "_",
        "`",
        "```py\n",
        "```\n",
        "# ",
        "> ",
        "- ",
        "1. ",
        "😀",
        "é",
        "[a](https://e.org)",
        "![b](x.png)",
        "<b>",
        "&",
        "|",
        "---\n",
        "~~",
        "    ",
        "  - ",
        "\n> > ",
        "| a | b |\n|---|---|\n",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(markdown_pieces, max_size=80), st.integers(min_value=2, max_value=60))
def test_any_markdown_is_cut_into_valid_parts(pieces: list[str], limit: int) -> None:
    markdown = "".join(pieces)
    assert_valid_telegram_parts(markdown, telegram_parts(markdown, limit=limit), limit)
    assert_valid_matrix_parts(matrix_parts(markdown, limit=limit + 600), limit + 600)
    text = markdown.replace("\n", " ")
    assert without_whitespace("".join(plain_parts(text, limit))) == without_whitespace(text)


@settings(max_examples=300, deadline=None)
@given(
    st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs")) | st.sampled_from("\n*_`[]()<>&#\\"))
)
def test_text_put_through_markdown_text_shows_as_written_on_both_platforms(name: str) -> None:
    """A display name or a file name the bot writes into its Markdown ("Allowed by X.") is never markup."""
    shown = "Allowed by " + " ".join(name.splitlines()) + "."
    [telegram] = telegram_parts(f"Allowed by {markdown_text(name)}.")
    assert (telegram.text, telegram.entities) == (shown, ())
    [matrix] = matrix_parts(f"Allowed by {markdown_text(name)}.")
    assert matrix.body == shown
    assert matrix.formatted_body.removeprefix("<p>").removesuffix("</p>") == html_escape(shown, quote=False)
