"""The MCP door's pure parts: a call's arguments as a turn, a profile's name as a tool's, a file as content."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.dialects.events import Option, Question, QuestionRequest
from bridge.errors import TurnError
from bridge.serving.mcp_tools import (
    MAX_ATTACHMENTS,
    file_content,
    parse_call,
    question_answer,
    question_form,
    tool_definition,
    tool_name_problem,
)


def test_a_call_without_a_conversation_is_a_conversation_of_its_own() -> None:
    first, second = (parse_call({"message": "hi"}, local_paths=True) for _ in range(2))
    assert first.conversation != second.conversation
    assert parse_call({"message": "hi", "conversation": "c"}, local_paths=True).conversation == "c"


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({}, "the argument message is required"),
        ({"message": "  "}, "the argument message is required"),
        ({"message": 3}, "the argument message is required"),
        ({"message": "hi", "extra": 1}, "unknown argument 'extra'"),
        ({"message": "hi", "conversation": 5}, "conversation must be a string"),
        ({"message": "hi", "conversation": "a\0b"}, "conversation contains a NUL"),
        ({"message": "hi\0"}, "NUL"),
        ({"message": "hi", "attachments": "https://x.example/a.png"}, "attachments must be a list"),
        ({"message": "hi", "attachments": ["ftp://x.example/a"]}, "attachment 'ftp://x.example/a'"),
        ({"message": "hi", "attachments": ["https://x.example/a"] * (MAX_ATTACHMENTS + 1)}, "at most 32"),
    ],
)
def test_bad_arguments_say_what_to_fix(arguments: dict[str, object], says: str) -> None:
    with pytest.raises(TurnError, match=says):
        parse_call(arguments, local_paths=True)


def test_a_local_path_is_an_attachment_only_on_stdio() -> None:
    call = parse_call({"message": "see", "attachments": ["/tmp/photo.png"]}, local_paths=True)
    assert [(a.type, a.url) for a in call.turn.attachments] == [("image", "/tmp/photo.png")]
    with pytest.raises(TurnError, match="only for a client on stdio"):
        parse_call({"message": "see", "attachments": ["/tmp/photo.png"]}, local_paths=False)
    web = parse_call({"message": "see", "attachments": ["https://x.example/a.pdf"]}, local_paths=False)
    assert [a.type for a in web.turn.attachments] == ["file"]


def test_a_tool_is_named_and_described_after_its_profile() -> None:
    assert tool_definition("echo", "Echoes.")["description"] == "Echoes."
    assert "profile 'echo'" in tool_definition("echo", None)["description"]
    assert tool_name_problem("codex-helper_2.1") is None
    assert tool_name_problem("has space") is not None


def test_a_file_is_text_a_blob_or_a_link() -> None:
    record = {"name": "a.txt", "path": "/o/a b.txt", "size": 3, "media_type": "text/plain"}
    text = file_content({**record, "data": base64.b64encode(b"hi\n").decode()})
    assert text == {
        "type": "resource",
        "resource": {"uri": "file:///o/a%20b.txt", "mimeType": "text/plain", "text": "hi\n"},
    }
    latin = file_content({**record, "data": base64.b64encode(b"\xff").decode()})
    assert latin["resource"]["blob"] == "/w=="
    link = file_content(record)
    assert (link["type"], link["uri"], link["size"]) == ("resource_link", "file:///o/a%20b.txt", 3)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--tokens", "t.yaml"], "--tokens is an option of the HTTP door: add --listen"),
        (["--listen", "0.0.0.0:0"], "is not a loopback address and serve has no --tokens"),
        (["--profile", "nope"], "no profile named 'nope'"),
        (["--state", "s.sqlite3", "--postgres", "postgresql://nobody@127.0.0.1/none"], "leave out --state"),
    ],
)
def test_mcp_refuses_bad_options_before_it_serves(options: list[str], says: str, tmp_path: Path) -> None:
    profiles = Path(__file__).resolve().parent.parent / "profiles"
    argv = [sys.executable, "-m", "bridge", "mcp", "--profiles", str(profiles), *options]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20, cwd=tmp_path)
    assert done.returncode == 2
    assert says in done.stderr
    assert done.stdout == ""


def test_a_question_is_a_form_of_its_choices_and_only_what_it_asked_answers_it() -> None:
    colour = Question("colour", "Which colour?", (Option("Red"), Option("Blue")), header="Colour")
    sizes = Question("sizes", "Which sizes?", (Option("S"), Option("M")), multi_select=True)
    name = Question("name", "Its name?", free_text=True)
    request = QuestionRequest("r1", (colour, sizes, name))
    message, schema = question_form(request)
    assert message == "The agent asks: Which colour? / Which sizes? / Its name?"
    assert schema["required"] == ["colour", "sizes", "name"]
    assert schema["properties"]["colour"] == {
        "title": "Colour",
        "description": "Which colour?",
        "type": "string",
        "enum": ["Red", "Blue"],
    }
    assert schema["properties"]["sizes"]["items"] == {"type": "string", "enum": ["S", "M"]}
    assert schema["properties"]["name"]["type"] == "string"
    given = {"colour": "Blue", "sizes": ["S", "M"], "name": "", "other": "x"}
    assert question_answer(request, given) == {"colour": "Blue", "sizes": ["S", "M"]}
    assert question_answer(request, {"sizes": [1, 2], "name": ""}) is None
    assert question_answer(request, None) is None
