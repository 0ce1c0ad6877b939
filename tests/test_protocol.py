"""The AgentProc 0.1 line decoder (docs/protocol.md §3), without processes."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridge.dialects import (
    MAX_SESSION_ID_CHARS,
    BodyLine,
    ErrorEvent,
    LineCut,
    LineDecoder,
    LineSplitter,
    PartialEvent,
    ProtocolWarning,
    SessionEvent,
    decode_payload,
)
from bridge.errors import ProtocolMisuse


def decode(data: bytes, **options: object) -> list[object]:
    decoder = LineDecoder(**options)  # type: ignore[arg-type]
    return decoder.feed(data) + decoder.close()


def test_each_prefix_is_classified() -> None:
    assert decode(b'AGENT_SESSION:abc\nAGENT_PARTIAL:"hi"\nAGENT_ERROR:"boom"\nplain\n') == [
        SessionEvent("abc"),
        PartialEvent("hi"),
        ErrorEvent("boom"),
        BodyLine("plain"),
    ]


def test_prefixes_are_exact_case_sensitive_and_at_column_zero() -> None:
    lines = b' AGENT_PARTIAL:"x"\nagent_partial:"x"\nAGENT_PARTIAL"x"\nxAGENT_ERROR:"y"\n'
    assert decode(lines) == [
        BodyLine(' AGENT_PARTIAL:"x"'),
        BodyLine('agent_partial:"x"'),
        BodyLine('AGENT_PARTIAL"x"'),
        BodyLine('xAGENT_ERROR:"y"'),
    ]


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        ("", ""),
        ("   ", ""),
        ('"a \\"quoted\\" \\u00e9\\n"', 'a "quoted" é\n'),
        ('  "padded"  ', "padded"),
        ("42", "42"),
        ('{"a": 1}', '{"a": 1}'),
        ("null", "null"),
        ('"unterminated', '"unterminated'),
        ("  bare text  ", "bare text"),
        ('"two" "strings"', '"two" "strings"'),
    ],
)
def test_payload_rule(payload: str, text: str) -> None:
    assert decode_payload(payload) == text
    assert decode(f"AGENT_PARTIAL:{payload}\nAGENT_ERROR:{payload}\n".encode()) == [
        PartialEvent(text),
        ErrorEvent(text),
    ]


def test_json_lone_surrogate_cannot_reach_the_host() -> None:
    assert decode_payload('"a\\ud800b"') == "a\ufffdb"
    assert decode_payload('"\\ud83d\\ude00"') == "😀"


def test_session_id_is_stripped() -> None:
    assert decode(b"AGENT_SESSION:   sess-1 \t\n") == [SessionEvent("sess-1")]


@pytest.mark.parametrize(
    "line",
    [
        b"AGENT_SESSION:",
        b"AGENT_SESSION:   ",
        b"AGENT_SESSION:has space",
        b"AGENT_SESSION:tab\there",
        b"AGENT_SESSION:bell\x07",
        b"AGENT_SESSION:nbsp\xc2\xa0inside",
        b"AGENT_SESSION:" + b"x" * (MAX_SESSION_ID_CHARS + 1),
    ],
)
def test_invalid_session_ids_are_warnings(line: bytes) -> None:
    [event] = decode(line + b"\n")
    assert isinstance(event, ProtocolWarning)
    assert "session" in event.message


def test_session_id_at_the_length_limit_is_valid() -> None:
    session_id = "s" * MAX_SESSION_ID_CHARS
    assert decode(f"AGENT_SESSION:{session_id}\n".encode()) == [SessionEvent(session_id)]


def test_custom_session_prefix_replaces_the_default() -> None:
    events = decode(b"SESSION_ID=abc\nAGENT_SESSION:def\n", session_prefix="SESSION_ID=")
    assert events == [SessionEvent("abc"), BodyLine("AGENT_SESSION:def")]


def test_session_prefix_is_checked_before_the_others() -> None:
    assert decode(b"AGENT_PARTIAL:x\n", session_prefix="AGENT_PARTIAL:") == [SessionEvent("x")]


def test_crlf_loses_one_cr_and_lone_cr_stays() -> None:
    assert decode(b"a\r\nb\r\r\nc\rd\n") == [BodyLine("a"), BodyLine("b\r"), BodyLine("c\rd")]


def test_invalid_utf8_becomes_replacement_characters() -> None:
    assert decode(b"ok \xff\xfe end\nAGENT_PARTIAL:\xc3\n") == [BodyLine("ok \ufffd\ufffd end"), PartialEvent("\ufffd")]


def test_utf8_split_across_feeds_is_decoded_whole() -> None:
    decoder = LineDecoder()
    encoded = "héllo\n".encode()
    assert decoder.feed(encoded[:2]) == []
    assert decoder.feed(encoded[2:]) == [BodyLine("héllo")]


def test_last_line_without_newline_is_flushed_by_close() -> None:
    decoder = LineDecoder()
    assert decoder.feed(b"first\nsecond") == [BodyLine("first")]
    assert decoder.close() == [BodyLine("second")]
    assert decoder.close() == []


def test_empty_lines_are_body_lines() -> None:
    assert decode(b"\n\nx\n") == [BodyLine(""), BodyLine(""), BodyLine("x")]


def test_feed_after_close_is_an_error() -> None:
    decoder = LineDecoder()
    decoder.close()
    with pytest.raises(ProtocolMisuse):
        decoder.feed(b"x")


def test_long_line_is_cut_at_the_limit_with_a_warning() -> None:
    events = decode(b"A" * 100 + b"\nnext\n", max_line_bytes=10)
    assert isinstance(events[0], LineCut) and "longer than 10 bytes" in events[0].message
    assert events[1:] == [BodyLine("A" * 10), BodyLine("next")]


def test_long_line_arriving_in_pieces_is_cut_and_its_rest_dropped() -> None:
    decoder = LineDecoder(max_line_bytes=32)
    events = []
    for _ in range(50):
        events += decoder.feed(b"0123456789abcdef")
        assert decoder.buffered_bytes <= 32
    events += decoder.feed(b'tail\nAGENT_PARTIAL:"after"\n')
    assert [type(event) for event in events] == [LineCut, BodyLine, PartialEvent]
    assert events[1] == BodyLine("0123456789abcdef" * 2)
    assert events[2] == PartialEvent("after")


def test_long_line_without_newline_is_flushed_cut_at_close() -> None:
    decoder = LineDecoder(max_line_bytes=4)
    assert decoder.feed(b"abcdefgh") == []
    events = decoder.close()
    assert isinstance(events[0], ProtocolWarning)
    assert events[1] == BodyLine("abcd")


def test_a_protocol_line_cut_at_the_limit_is_still_classified() -> None:
    events = decode(b'AGENT_PARTIAL:"' + b"x" * 50 + b'"\n', max_line_bytes=20)
    assert events[1] == PartialEvent('"' + "x" * 5)  # cut JSON is invalid JSON: the raw text


def test_the_default_limit_is_one_mebibyte() -> None:
    decoder = LineDecoder()
    line = b"y" * (1024 * 1024)
    assert decoder.feed(line + b"\n") == [BodyLine(line.decode())]
    events = decoder.feed(line + b"z\n")
    assert isinstance(events[0], ProtocolWarning)
    assert events[1] == BodyLine(line.decode())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=40))
def test_any_bytes_in_any_chunks_decode_like_one_feed(chunks: list[bytes]) -> None:
    """Splitting never changes the events, nothing raises, and the buffer stays bounded."""
    limit = 16
    whole = decode(b"".join(chunks), max_line_bytes=limit)
    decoder = LineDecoder(max_line_bytes=limit)
    pieces: list[object] = []
    for chunk in chunks:
        pieces += decoder.feed(chunk)
        assert decoder.buffered_bytes <= limit
    pieces += decoder.close()
    assert pieces == whole
    for event in pieces:
        if isinstance(event, BodyLine):
            assert len(event.encode("utf-8", "surrogatepass")) <= limit * 3


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                b"AGENT_SESSION:",
                b"AGENT_PARTIAL:",
                b"AGENT_ERROR:",
                b"\n",
                b"\r",
                b'"',
                b"\\u",
                b"\xff",
                b" ",
                b"id",
                b"\x00",
            ]
        ),
        max_size=60,
    )
)
def test_protocol_shaped_noise_never_raises(parts: list[bytes]) -> None:
    for event in decode(b"".join(parts)):
        assert isinstance(event, (BodyLine, PartialEvent, ErrorEvent, SessionEvent, ProtocolWarning))
        if isinstance(event, SessionEvent):
            assert event.session_id and " " not in event.session_id and event.session_id.isprintable()


def test_line_splitter_is_bounded_and_cr_tolerant() -> None:
    """The framing both the decoder and `serve` stand on."""
    lines = LineSplitter(8)
    assert lines.feed(b'{"a":1}\r\n{"b"') == (['{"a":1}'], frozenset())
    assert lines.feed(b":2}\n") == (['{"b":2}'], frozenset())
    assert lines.feed(b"123456789") == ([], frozenset())
    assert lines.buffered_bytes == 8  # over the limit: the rest is dropped as it comes
    assert lines.feed(b"0123456789\nok\n") == (["12345678", "ok"], frozenset({0}))
    assert lines.feed(b"12345678\n\xff\n") == (["12345678", "\ufffd"], frozenset())
    assert lines.feed(b"tail\r") == ([], frozenset()) and lines.close() == (["tail"], frozenset())
    assert lines.close() == ([], frozenset())
    assert lines.feed(b"half a l") == ([], frozenset())
    lines.discard()  # a terminal dropped the half-typed line
    assert lines.feed(b"ine\n") == (["ine"], frozenset())
    with pytest.raises(ValueError):
        LineSplitter(0)


def reference_lines(stream: bytes, limit: int) -> tuple[list[str], set[int]]:
    """What LineSplitter must produce, written the obvious way."""
    pieces = stream.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    text, cut = [], set()
    for index, piece in enumerate(pieces):
        if len(piece) > limit:
            cut.add(index)
            piece = piece[:limit]
        if piece.endswith(b"\r"):
            piece = piece[:-1]
        text.append(piece.decode("utf-8", "replace"))
    return text, cut


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=24), max_size=30), st.integers(min_value=1, max_value=12))
def test_line_splitter_matches_the_obvious_definition(chunks: list[bytes], limit: int) -> None:
    splitter = LineSplitter(limit)
    text: list[str] = []
    cut: set[int] = set()
    for batch in [splitter.feed(chunk) for chunk in chunks] + [splitter.close()]:
        cut |= {len(text) + index for index in batch.cut}
        text += batch.text
        assert splitter.buffered_bytes <= limit
    assert (text, cut) == reference_lines(b"".join(chunks), limit)


@settings(max_examples=500, deadline=None)
@given(st.text(), st.booleans())
def test_payload_rule_agrees_with_json_for_any_string(text: str, ascii_only: bool) -> None:
    import json

    encoded = json.dumps(text, ensure_ascii=ascii_only)
    expected = "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in text)
    assert decode_payload(encoded) == expected


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_payload_rule_on_arbitrary_payloads(payload: str) -> None:
    """Whatever follows the prefix: a JSON string's value, or the stripped raw text."""
    import json

    text = payload.strip()
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, str) and text.startswith('"'):
        assert decode_payload(payload) == "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)
    else:
        assert decode_payload(payload) == text


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "AGENT_PARTIAL:",
                    'AGENT_PARTIAL: "',
                    "AGENT_PARTIAL:  ",
                    "AGENT_SESSION:",
                    "AGENT_ERROR:",
                    "",
                    "AGENT_",
                    "x",
                ]
            ),
            st.lists(
                st.sampled_from(
                    ['"', "\\", "\\u", "\\ud83d", "\\ude00", "\\uD800", "00e9", "é", " ", "\t", "a", "\x01", "\r"]
                ),
                max_size=8,
            ).map("".join),
            st.sampled_from(['"', "", '" ']),
        ),
        max_size=30,
    ),
    st.sampled_from(["AGENT_SESSION:", "SID=", "AGENT_", "AGENT_PARTIAL: "]),
)
@example([('AGENT_PARTIAL: "', "\\ud83d\\ude00 \\uD800", '"')], "AGENT_SESSION:")
def test_the_fast_path_classifies_every_line_as_classify_does(lines: list[tuple[str, str, str]], prefix: str) -> None:
    """A feed decodes its lines in one inlined loop; `classify` is the rule it must agree with, line by line."""
    text = ["".join(parts) for parts in lines]
    decoder = LineDecoder(prefix)
    expected = [decoder.classify(line.removesuffix("\r")) for line in text]
    assert decoder.feed("\n".join(text + [""]).encode()) == expected
