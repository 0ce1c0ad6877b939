"""Fetched attachments handed to one-shot CLIs: named in the prompt in each CLI's syntax, codex's images in argv.

The attachments here carry `path` as the fetch step leaves them; the files need not exist, as no agent runs (the
real CLIs reading them are in test_dialect_codex.py, test_claude_sdk_live.py, test_acp_agents.py and
test_dialect_agentproc04.py). An attachment without `path` (not fetched) is never named.
"""

from __future__ import annotations

import pytest
from conftest import CLI_PROFILES

import bridge
from bridge.dialects import DialectContext, dialect_class
from bridge.dialects.base import files_named, with_files_named
from bridge.engine.launch import plan_launch
from bridge.turn import Attachment, Turn

DIR = "/work/.agent-bridge/attachments/t1"
SHOT = Attachment("image", "https://chat.example/s.png", path=f"{DIR}/s.png", media_type="image/png", size=70)
LOG = Attachment("file", "https://chat.example/get?id=9", name="build.log", path=f"{DIR}/build.log")
SPACED = Attachment(
    "file", "https://chat.example/a%20b.txt", name="a b.txt", path=f"{DIR}/a b.txt", media_type="text/plain"
)
UNFETCHED = Attachment("file", "https://chat.example/later.txt")  # as `attachments.fetch: false` leaves it
LATER = UNFETCHED.url


def test_fetched_files_are_listed_by_path_with_their_type_and_the_name_they_were_sent_as():
    assert files_named([SHOT, LOG, UNFETCHED]) == (
        f"Attached files:\n- {DIR}/s.png (image, image/png)\n- {DIR}/build.log (file)\n- {LATER} (file)"
    )
    renamed = Attachment("file", "https://e/x", name="report (final).pdf", path=f"{DIR}/report_final_.pdf")
    assert files_named([renamed]) == f"Attached files:\n- {DIR}/report_final_.pdf (file, sent as 'report (final).pdf')"
    assert files_named([]) == ""


def test_an_attachment_passed_through_is_listed_by_its_url_as_sent():
    """`attachments.fetch: false`: a CLI that reads only its prompt still learns of the file, by its URL."""
    signed = Attachment("image", "https://e/get?id=9&sig=abc", name="cat.png")
    assert files_named([UNFETCHED, signed], "@{path}") == (
        f"Attached files:\n- {LATER} (file)\n- https://e/get?id=9&sig=abc (image, sent as 'cat.png')"
    )


def test_the_message_comes_first_and_nothing_changes_without_a_fetched_file():
    assert with_files_named("look", [SHOT]) == f"look\n\nAttached files:\n- {DIR}/s.png (image, image/png)"
    assert with_files_named("  ", [SHOT]) == f"Attached files:\n- {DIR}/s.png (image, image/png)"
    assert with_files_named("look", [UNFETCHED]) == f"look\n\nAttached files:\n- {LATER} (file)"
    assert with_files_named("look", []) is None


def test_gemini_reads_files_named_with_an_at_sign_a_space_escaped():
    assert with_files_named("look", [SPACED], "@{path}") == (
        f"look\n\nAttached files:\n- @{DIR}/a\\ b.txt (file, text/plain)"
    )


def plan(profile_name: str, turn: Turn) -> tuple[str, ...]:
    profile = bridge.load_profile(CLI_PROFILES / profile_name, cache=False)
    return plan_launch(profile, turn, {"PATH": "/usr/bin"}).argv


def test_codex_exec_gets_an_image_option_per_fetched_image_before_the_session_words_and_files_in_the_prompt():
    turn = Turn("look", attachments=(SHOT, LOG, UNFETCHED, SHOT))
    image, prompt = f"--image={DIR}/s.png", f"look\n\nAttached files:\n- {DIR}/build.log (file)\n- {LATER} (file)"
    assert plan("codex.yaml", turn)[-4:] == (image, image, "--", prompt)
    assert plan("codex.yaml", turn.replace(session_id="th-1"))[-6:] == (image, image, "resume", "--", "th-1", prompt)
    # Without a fetched image, codex's argv is what it always was.
    assert plan("codex.yaml", Turn("look", attachments=(UNFETCHED,)))[-3:] == (
        "unbounded_connection_retries",
        "--",
        f"look\n\nAttached files:\n- {LATER} (file)",
    )


@pytest.mark.parametrize(
    ("profile_name", "prompt"),
    [
        (
            "claude-code.yaml",
            f"look\n\nAttached files:\n- {DIR}/s.png (image, image/png)\n- {DIR}/a b.txt (file, text/plain)",
        ),
        (
            "gemini-cli.yaml",
            f"--prompt=look\n\nAttached files:\n- @{DIR}/s.png (image, image/png)\n- @{DIR}/a\\ b.txt (file, text/plain)",
        ),
        (
            "opencode.yaml",
            f"look\n\nAttached files:\n- {DIR}/s.png (image, image/png)\n- {DIR}/a b.txt (file, text/plain)",
        ),
    ],
)
def test_one_shot_clis_get_the_paths_in_their_prompt(profile_name, prompt):
    argv = plan(profile_name, Turn("look", attachments=(SHOT, SPACED, UNFETCHED)))
    assert argv[-1] == f"{prompt}\n- {LATER} (file)"
    listed = f"{prompt.split('look')[0]}look\n\nAttached files:\n- {LATER} (file)"
    assert plan(profile_name, Turn("look", attachments=(UNFETCHED,)))[-1] == listed


def test_the_named_prompt_fills_message_in_env_too_and_agent_message_stays_as_sent():
    profile = bridge.Profile.from_mapping(
        {"protocol": "claude-stream-json", "command": ["claude", "-p", "{{MESSAGE}}"], "env": {"PROMPT": "{{MESSAGE}}"}}
    )
    launch = plan_launch(profile, Turn("look", attachments=(SHOT,)), {})
    named = f"look\n\nAttached files:\n- {DIR}/s.png (image, image/png)"
    assert (launch.argv[-1], launch.env["PROMPT"], launch.env["AGENT_MESSAGE"]) == (named, named, "look")


def test_every_one_shot_json_family_names_fetched_files_in_its_handover():
    for protocol in ("aictrl-ndjson", "opencode-json", "grok-streaming-json", "kimi-stream-json", "pi-json"):
        handover = dialect_class(protocol).handover(Turn("look", attachments=(SHOT,)), DialectContext())
        assert handover.message == f"look\n\nAttached files:\n- {DIR}/s.png (image, image/png)", protocol
        assert handover.stdin is None and not handover.options


def test_an_image_codex_cannot_decode_is_named_in_its_prompt_instead():
    svg = Attachment("image", "https://e/d.svg", path=f"{DIR}/d.svg", media_type="image/svg+xml")
    argv = plan("codex.yaml", Turn("look", attachments=(svg,)))
    assert argv[-3:] == (
        "unbounded_connection_retries",
        "--",
        f"look\n\nAttached files:\n- {DIR}/d.svg (image, image/svg+xml)",
    )
