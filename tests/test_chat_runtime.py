"""The delivery kit's runtime (`bridge.chat.runtime.ChatBridge`): a chat platform's updates carried to real agent
processes through the real host, and the replies back.

The platform is `chatkit.FakePlatform` (scripted updates in, everything the bot does recorded); the agents are
small Python scripts: one speaks agentproc-0.1 (partials, an outbox file, attachments), one Claude Code's
stream-json control protocol (`chatkit.ASKING_AGENT`: permission requests and AskUserQuestion). An agent that must wait
for the test waits on a FIFO the test opens: no timer synchronises anything. The crash tests run the bot in a
process of its own (`python tests/chatkit.py`), kill it with SIGKILL at a step of a turn, start it again and
count what the user received.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from chatkit import DEADLINE, FakePlatform, asking_profile, message, press, records_in

from bridge.chat.botlock import BotLock, lock_path
from bridge.chat.inbox import Inbox
from bridge.chat.markup import telegram_parts
from bridge.chat.platform import ButtonPress, IncomingFile
from bridge.chat.runtime import REFUSAL, ChatBridge, ChatSettings, conversation_key
from bridge.errors import PlatformConflict
from bridge.host.runtime import open_host

SIMPLE_AGENT = textwrap.dedent(
    """\
    import json, os, pathlib, sys
    message = os.environ["AGENT_MESSAGE"]
    with open(os.environ["RUNS"], "a") as runs:
        runs.write(message + "\\n")
    if message.startswith("stream"):
        print("AGENT_PARTIAL:" + json.dumps("Hello "), flush=True)
        print("AGENT_PARTIAL:" + json.dumps("world"), flush=True)
        open(os.environ["GATE"]).read()  # until the test saw the preview
        print("Hello world, in full")
    elif message.startswith("wait"):
        open(os.environ["GATE"]).read()
        print("waited")
    elif message.startswith("file"):
        pathlib.Path(os.environ["AGENT_OUTBOX"], "notes.txt").write_text("the notes")
        print("here are the notes")
    elif message.startswith("photo"):
        files = json.loads(os.environ.get("AGENT_ATTACHMENTS", "[]"))
        print("got " + "; ".join(f["name"] + "=" + str(len(open(f.get("path") or f["url"], "rb").read())) for f in files))
    else:
        print("echo: " + message)
    """
)

# The smallest PNG there is: one transparent pixel.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d4944415478da63f8cfc0f01f0005000"
    "1ff89993d1d0000000049454e44ae426082"
)


@pytest.fixture
def setup(tmp_path: Path) -> Path:
    """Profiles `agent` (agentproc-0.1) and `asker` (claude-sdk), a gate FIFO and the agents' run log."""
    (tmp_path / "simple.py").write_text(SIMPLE_AGENT)
    os.mkfifo(tmp_path / "gate")
    work = tmp_path / "work"
    work.mkdir()
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    env = {"GATE": str(tmp_path / "gate"), "RUNS": str(tmp_path / "runs")}
    common = {"env": env, "cwd": str(work), "kill_grace_secs": 2}
    (profiles / "agent.yaml").write_text(
        yaml.safe_dump({"command": [sys.executable, str(tmp_path / "simple.py")], **common})
    )
    # The asking agent ignores the interrupt a cancel sends (Claude Code would end its turn): it is killed once its
    # grace is over, which need not be long, its turn's end being all a test of /cancel waits for.
    asker = asking_profile(tmp_path, **common) | {"kill_grace_secs": 0.5}
    (profiles / "asker.yaml").write_text(yaml.safe_dump(asker))
    return tmp_path


async def open_gate(setup: Path) -> None:
    with trio.fail_after(DEADLINE):
        await trio.to_thread.run_sync(lambda: open(setup / "gate", "w").close(), abandon_on_cancel=True)


def runs(setup: Path) -> list[str]:
    path = setup / "runs"
    return path.read_text().splitlines() if path.exists() else []


@asynccontextmanager
async def running_bridge(
    setup: Path, platform: FakePlatform | None = None, **settings: object
) -> AsyncIterator[tuple[ChatBridge, FakePlatform]]:
    platform = platform or FakePlatform()
    values: dict[str, object] = {"profile": "agent", "allow_users": frozenset({"7"})} | settings
    inbox = Inbox(setup / "chat.sqlite3")
    async with open_host(setup / "profiles", state=setup / "state.sqlite3") as host, trio.open_nursery() as nursery:
        bridge = ChatBridge(host, platform, ChatSettings(**values), inbox)  # type: ignore[arg-type]
        await nursery.start(bridge.run)
        yield bridge, platform
        nursery.cancel_scope.cancel()
    inbox.close()


def replies(platform: FakePlatform) -> list[str]:
    """What the user received as messages, but the live preview's."""
    previews = {record.key for record in platform.of("delete")}
    return [record.text for record in platform.of("send") if record.key not in previews]


async def test_a_streamed_reply_is_a_preview_edited_then_a_new_message_and_the_preview_goes(setup: Path) -> None:
    async with running_bridge(setup) as (_, platform):
        platform.push(message(1, "stream please"))
        await platform.wait_for(
            "the preview shows the partials",
            lambda: (
                "Hello world" in platform.sent_texts()[-1:] or any(r.text == "Hello world" for r in platform.of("edit"))
            ),
        )
        assert not [text for text in platform.sent_texts() if "in full" in text]
        await platform.wait_for("typing shown while the agent works", lambda: platform.of("typing"))
        await open_gate(setup)
        await platform.wait_for(
            "the final reply",
            lambda: "Hello world, in full\n" in replies(platform) or "Hello world, in full" in replies(platform),
        )
        preview_key = platform.of("send")[0].key
        assert [record.key for record in platform.of("delete")] == [preview_key]
        final = [record for record in platform.of("send") if "in full" in record.text]
        assert len(final) == 1 and final[0].key != preview_key
        assert platform.of("ack")[-1].text == "1"


async def test_a_batch_that_started_a_turn_is_acknowledged_once_the_turn_had_its_head_start(setup: Path) -> None:
    async with running_bridge(setup, turn_head_start_secs=0.3) as (_, platform):
        pushed = trio.current_time()
        platform.push(message(1, "hi"))
        await platform.wait_for("the acknowledgement", lambda: platform.of("ack"))
        assert trio.current_time() - pushed >= 0.3  # measured at the ack, whether or not the reply came before it
        await platform.wait_for("the reply", lambda: "echo: hi" in replies(platform))


async def test_a_reply_that_comes_before_typing_is_due_is_sent_without_a_typing_indicator(setup: Path) -> None:
    async with running_bridge(setup, typing_after_secs=DEADLINE) as (_, platform):
        platform.push(message(1, "hi"))
        await platform.wait_for("the reply", lambda: "echo: hi" in replies(platform))
        assert not platform.of("typing")


@pytest.mark.parametrize(
    ("label", "behaviour", "shown"),
    [
        ("Allow", "allow", "Allowed by Ann"),
        ("Deny", "deny", "Denied by Ann"),
        ("Allow for this session", "allow", "Allowed for this session by Ann"),
    ],
)
async def test_an_approval_is_decided_by_a_press_while_the_turn_that_asked_still_runs(
    setup: Path, label: str, behaviour: str, shown: str
) -> None:
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, "run the build"))
        await platform.wait_for(
            "the prompt with its buttons", lambda: platform.of("send") and platform.of("send")[-1].choices
        )
        assert [choice[0] for choice in platform.of("send")[-1].choices] == ["Allow", "Allow for this session", "Deny"]
        platform.push(press(2, platform.choice(label)))
        await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])
        reply = next(text for text in platform.sent_texts() if text.startswith("decided"))
        assert f'"behavior": "{behaviour}"' in reply
        assert [record.text for record in platform.of("press")] == [shown.removesuffix(" by Ann")]
        assert any(record.text.endswith(shown + ".") for record in platform.of("edit"))
        if label == "Allow for this session":
            assert '"destination": "session"' in reply and '"type": "addRules"' in reply


async def test_a_press_that_comes_before_the_prompts_send_returns_still_edits_the_prompt(setup: Path) -> None:
    platform = FakePlatform()
    platform.hold_prompts = trio.Event()  # the user sees the buttons before the bot hears that the send went
    async with running_bridge(setup, platform, profile="asker"):
        platform.push(message(1, "run the build"))
        await platform.wait_for("the prompt", lambda: platform.of("send") and platform.of("send")[-1].choices)
        platform.push(press(2, platform.choice("Deny")))
        await platform.wait_for("the press answered", lambda: platform.of("press"))
        platform.hold_prompts.set()
        await platform.wait_for(
            "the prompt edited", lambda: [r for r in platform.of("edit") if r.text.endswith("Denied by Ann.")]
        )
        await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])


async def test_a_question_is_answered_by_a_press(setup: Path) -> None:
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, "a question"))
        await platform.wait_for("the question", lambda: platform.of("send") and platform.of("send")[-1].choices)
        assert [choice[0] for choice in platform.of("send")[-1].choices] == ["Red", "Blue"]
        platform.push(press(2, platform.choice("Blue")))
        await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])
        reply = next(text for text in platform.sent_texts() if text.startswith("decided"))
        assert '"Which colour?": "Blue"' in reply
        assert any("Ann answered: Blue" in record.text for record in platform.of("edit"))


@pytest.mark.parametrize(("words", "label"), [("a question", "Blue"), ("run the build", "Deny")])
async def test_a_press_whose_data_no_button_carries_leaves_the_prompt_waiting(
    setup: Path, words: str, label: str
) -> None:
    # Telegram passes on whatever callback data a client sends ("a bad client can send arbitrary data").
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, words))
        await platform.wait_for("the prompt", lambda: platform.of("send") and platform.of("send")[-1].choices)
        key, data = platform.choice(label)
        token = data.partition(":")[0]
        platform.push(press(2, (key, f"{token}:\u00b2")), press(3, (key, f"{token}:bogus")))
        await platform.wait_for("two answers", lambda: len(platform.of("press")) == 2)
        assert [record.text for record in platform.of("press")] == ["no longer waiting"] * 2
        platform.push(press(4, (key, data)))
        await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])
        decided = next(t for t in platform.sent_texts() if t.startswith("decided"))
        assert ('"behavior": "deny"' if label == "Deny" else '"Which colour?": "Blue"') in decided


@pytest.mark.parametrize("label", ["Allow", "Blue"])
async def test_a_press_from_another_chat_does_not_answer_this_chats_prompt(setup: Path, label: str) -> None:
    # A Telegram client may send any callback data from a chat of its own; a Matrix reaction names any event id.
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, "run the build" if label == "Allow" else "a question"))
        await platform.wait_for("the prompt", lambda: platform.of("send") and platform.of("send")[-1].choices)
        platform.push(press(2, platform.choice(label), chat="another chat"))
        await platform.wait_for("the press answered", lambda: platform.of("press"))
        assert [record.text for record in platform.of("press")] == ["no longer waiting"]
        assert not [t for t in platform.sent_texts() if t.startswith("decided")]
        platform.push(press(3, platform.choice(label)))
        await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])


async def test_the_name_of_who_decided_shows_as_text_not_as_markdown(setup: Path) -> None:
    name = "**Admin** [approved](https://e.vil) `ok`"
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, "run the build"))
        await platform.wait_for("the prompt", lambda: platform.of("send") and platform.of("send")[-1].choices)
        prompt = telegram_parts(platform.of("send")[-1].text)[0]
        key, data = platform.choice("Deny")
        platform.push(ButtonPress("2", "c1", "", "7", key, data, user_name=name))
        await platform.wait_for("the prompt edited", lambda: platform.of("edit"))
        [edited] = telegram_parts(platform.of("edit")[-1].text)
        assert edited.text == f"{prompt.text}\n\nDenied by {name}."
        assert edited.entities == prompt.entities  # the prompt's own bold and code, nothing of the name


async def test_a_multi_select_question_toggles_then_done(setup: Path) -> None:
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, "a multi question"))
        await platform.wait_for("the question", lambda: platform.of("send") and platform.of("send")[-1].choices)
        assert [choice[0] for choice in platform.of("send")[-1].choices] == ["Red", "Blue", "Done"]
        platform.push(press(2, platform.choice("Red")))
        await platform.wait_for(
            "Red ticked", lambda: any(c[0] == "✅ Red" for r in platform.of("edit") for c in r.choices)
        )
        platform.push(press(3, platform.choice("Blue")), press(4, platform.choice("Done")))
        await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])
        reply = next(text for text in platform.sent_texts() if text.startswith("decided"))
        assert '"Which colour?": "Red, Blue"' in reply or '"Which colour?": ["Red", "Blue"]' in reply


async def test_a_question_is_answered_by_the_next_message(setup: Path) -> None:
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, "a question"))
        await platform.wait_for("the question", lambda: platform.of("send") and platform.of("send")[-1].choices)
        platform.push(message(2, "Green, please"))
        await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])
        reply = next(text for text in platform.sent_texts() if text.startswith("decided"))
        assert '"Which colour?": "Green, please"' in reply
        assert len(runs(setup)) == 0  # the asker logs no runs; the answer did not start a turn of its own
        assert len([t for t in platform.sent_texts() if t.startswith("decided")]) == 1


async def test_a_press_after_the_turn_is_over_answers_no_longer_waiting(setup: Path) -> None:
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, "run the build"))
        await platform.wait_for("the prompt", lambda: platform.of("send") and platform.of("send")[-1].choices)
        allow, deny = platform.choice("Allow"), platform.choice("Deny")
        platform.push(press(2, allow))
        await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])
        platform.push(press(3, deny))
        await platform.wait_for("the late press answered", lambda: len(platform.of("press")) == 2)
        assert platform.of("press")[-1].text == "no longer waiting"


async def test_a_withdrawn_request_edits_its_prompt(setup: Path) -> None:
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, "withdraw it"))
        await platform.wait_for("the prompt", lambda: platform.of("send") and platform.of("send")[-1].choices)
        await open_gate(setup)
        await platform.wait_for("the prompt says so", lambda: any("withdrew" in r.text for r in platform.of("edit")))
        await platform.wait_for("the reply", lambda: "went on without it" in platform.sent_texts())
        platform.push(press(2, platform.choice("Allow")))
        await platform.wait_for("the press answered", lambda: platform.of("press"))
        assert platform.of("press")[-1].text == "no longer waiting"


async def test_cancel_mid_turn_stops_it_at_once(setup: Path) -> None:
    async with running_bridge(setup) as (_, platform):
        platform.push(message(1, "wait for me"))
        await platform.wait_for("the agent runs", lambda: runs(setup) and platform.of("typing"))
        platform.push(message(2, "/cancel"))
        await platform.wait_for("cancelled", lambda: "Cancelled." in platform.sent_texts())
        assert "Cancelling the running turn." in platform.sent_texts()
        assert "waited" not in platform.sent_texts()


async def test_a_user_not_allowed_gets_one_refusal_an_hour_and_no_agent_starts(setup: Path) -> None:
    now = [1_000_000.0]
    async with running_bridge(setup, clock=lambda: now[0]) as (_, platform):
        platform.push(message(1, "hello", user="666"), message(2, "hello again", user="666"))
        await platform.wait_for("both stored and handled", lambda: platform.of("ack"))
        await platform.wait_for("the refusal", lambda: platform.sent_texts())
        platform.push(message(3, "one more", user="666"))
        now[0] += 3601
        platform.push(message(4, "an hour later", user="666"))
        await platform.wait_for("the second refusal", lambda: len(platform.sent_texts()) == 2)
        platform.push(message(5, "hi", user="7"))
        await platform.wait_for("the allowed user's reply", lambda: "echo: hi" in platform.sent_texts())
        assert platform.sent_texts() == [REFUSAL, REFUSAL, "echo: hi"]
        assert runs(setup) == ["hi"]


async def test_a_button_pressed_by_someone_not_allowed_decides_nothing(setup: Path) -> None:
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, "run the build"))
        await platform.wait_for("the prompt", lambda: platform.of("send") and platform.of("send")[-1].choices)
        platform.push(press(2, platform.choice("Allow"), user="666"))
        await platform.wait_for("the press answered", lambda: platform.of("press"))
        assert platform.of("press")[0].text == "You may not answer this."
        platform.push(press(3, platform.choice("Deny")))
        await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])
        assert '"behavior": "deny"' in next(t for t in platform.sent_texts() if t.startswith("decided"))


async def test_past_the_daily_budget_a_clear_message_and_no_turn(setup: Path) -> None:
    async with running_bridge(setup, turns_per_day=1) as (_, platform):
        platform.push(message(1, "one"))
        await platform.wait_for("the first reply", lambda: "echo: one" in platform.sent_texts())
        platform.push(message(2, "two"))
        await platform.wait_for("the refusal", lambda: len(platform.sent_texts()) == 2)
        assert "used today's 1 turns" in platform.sent_texts()[1]
        assert runs(setup) == ["one"]


async def test_commands_profile_new_status_help(setup: Path) -> None:
    async with running_bridge(setup, profiles=("agent", "asker")) as (_, platform):
        platform.push(message(1, "/profile"))
        await platform.wait_for("the answer", lambda: platform.sent_texts())
        assert platform.sent_texts()[-1] == "Profile: agent. Available: agent, asker."
        platform.push(message(2, "/profile nope"))
        await platform.wait_for("the answer", lambda: len(platform.sent_texts()) == 2)
        assert "No profile 'nope'" in platform.sent_texts()[-1]
        platform.push(message(3, "/profile asker"), message(4, "/status"), message(5, "/help"), message(6, "/new"))
        await platform.wait_for("the answers", lambda: len(platform.sent_texts()) == 6)
        texts = platform.sent_texts()
        assert "Switched to asker." in texts
        assert any(text.startswith("Profile: asker. Now: idle.") for text in texts)
        assert any("/cancel" in text for text in texts)
        assert any(text.startswith("Started a new conversation") for text in texts)


async def test_new_starts_a_conversation_without_the_old_session(setup: Path) -> None:
    async with running_bridge(setup) as (bridge, platform):
        platform.push(message(1, "hi"))
        await platform.wait_for("the reply", lambda: "echo: hi" in platform.sent_texts())
        platform.push(message(2, "/new"))
        await platform.wait_for("the answer", lambda: len(platform.sent_texts()) == 2)
        assert bridge.inbox.conversation("fake", conversation_key("fake", "c1")) == ("agent", 1)


def test_conversation_keys_are_unambiguous() -> None:
    assert conversation_key("matrix", "!a:b.org") == "matrix:!a%3Ab.org"
    assert conversation_key("telegram", "-100", "7") == "telegram:-100:7"
    assert conversation_key("telegram", "-100:7") != conversation_key("telegram", "-100", "7")
    assert conversation_key("telegram", "5", generation=2) == "telegram:5#2"
    assert conversation_key("telegram", "5#2") != conversation_key("telegram", "5", generation=2)


async def test_group_messages_not_addressed_to_the_bot_run_nothing(setup: Path) -> None:
    async with running_bridge(setup) as (_, platform):
        platform.push(message(1, "chatter", is_group=True), message(2, "bot, hi", is_group=True, mentioned=True))
        await platform.wait_for("the reply", lambda: platform.sent_texts())
        assert platform.sent_texts() == ["echo: bot, hi"]
        assert runs(setup) == ["bot, hi"]


async def test_a_photo_in_and_a_file_out(setup: Path) -> None:
    platform = FakePlatform()
    platform.files["ref-1"] = PNG
    async with running_bridge(setup, platform) as (_, platform):
        photo = IncomingFile("ref-1", "cat.png", "image/png", len(PNG))
        platform.push(message(1, "photo", files=(photo,)))
        await platform.wait_for("the reply", lambda: platform.sent_texts())
        assert platform.sent_texts() == [f"got cat.png={len(PNG)}"]
        platform.push(message(2, "file please"))
        await platform.wait_for("the file", lambda: platform.of("file"))
        (sent,) = platform.of("file")
        assert (sent.text, sent.extra) == ("notes.txt", {"media_type": "text/plain", "content": "the notes"})
        assert "here are the notes" in platform.sent_texts()
    assert not list((setup / "work" / ".agent-bridge" / "outbox").glob("*/notes.txt"))


async def test_only_a_message_with_files_gets_a_download_directory_and_it_is_removed_after_its_turn(
    setup: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args: Any, **kwargs: Any) -> str:
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
    platform = FakePlatform()
    platform.files["ref-1"] = PNG
    async with running_bridge(setup, platform) as (_, platform):
        platform.push(message(1, "hi"))
        await platform.wait_for("the reply", lambda: platform.sent_texts())
        assert made == []  # a text turn pays for no directory (row 32 of `make bench`)
        platform.push(message(2, "photo", files=(IncomingFile("ref-1", "cat.png", "image/png", len(PNG)),)))
        await platform.wait_for("the second reply", lambda: len(platform.sent_texts()) == 2)
    assert len(made) == 1 and not os.path.exists(made[0])


async def test_a_reply_the_platform_refuses_is_counted_not_retried_forever(setup: Path) -> None:
    async with running_bridge(setup) as (bridge, platform):
        platform.refuse_sends = 1
        platform.push(message(1, "hi"))
        await platform.wait_for("the refusal", lambda: platform.of("refused"))
        platform.push(message(2, "again"))
        await platform.wait_for("the next reply", lambda: "echo: again" in platform.sent_texts())
        assert bridge.undeliverable == 1 and len(platform.of("refused")) == 1


async def test_a_message_no_agent_can_take_is_answered_with_why_and_no_turn_runs(setup: Path) -> None:
    # A Matrix client may send a NUL (the homeserver takes it); no process can receive one.
    async with running_bridge(setup) as (_, platform):
        platform.push(message(1, "before\x00after"))
        await platform.wait_for("the answer", lambda: platform.sent_texts())
        [answer] = platform.sent_texts()
        assert answer.startswith("Your message could not be passed to the agent: ") and "NUL" in answer, answer
        assert runs(setup) == []


async def test_an_update_seen_twice_is_answered_once(setup: Path) -> None:
    async with running_bridge(setup) as (_, platform):
        platform.push(message(1, "hi"))
        await platform.wait_for("the reply", lambda: "echo: hi" in platform.sent_texts())
        platform.push(message(1, "hi"), message(2, "bye"))
        await platform.wait_for("the next reply", lambda: "echo: bye" in platform.sent_texts())
        assert platform.sent_texts() == ["echo: hi", "echo: bye"]


def test_a_second_process_on_the_same_bot_is_refused_naming_the_holder(tmp_path: Path) -> None:
    path = lock_path(tmp_path, "telegram", "123:secret-token")
    assert "secret" not in path.name
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from bridge.chat.botlock import BotLock; "
            "lock = BotLock(sys.argv[1], 'telegram'); lock.acquire(); print('held', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(PlatformConflict, match=f"already served by agent-bridge connect, pid {holder.pid}"):
            BotLock(path, "telegram").acquire()
    finally:
        holder.kill()
        holder.wait()
    with BotLock(path, "telegram"):  # the lock died with its holder, even killed
        pass


# ---------------------------------------------------------------------------- kill -9 at each step of a turn


def start_child(setup: Path, crash_on: str = "") -> subprocess.Popen[bytes]:
    chatkit = Path(__file__).with_name("chatkit.py")
    (setup / "ready").unlink(missing_ok=True)
    return subprocess.Popen(
        [sys.executable, str(chatkit), str(setup), str(setup / "profiles"), str(setup / "state.sqlite3"), crash_on],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )


async def wait_records(setup: Path, what: str, check: object) -> None:
    """Wait for the child's records (a file) to satisfy `check`: the file is read again as it grows."""
    with trio.fail_after(DEADLINE):
        while not check(records_in(setup)):  # type: ignore[operator]
            await trio.sleep(0.02)  # noqa: ASYNC110 - another process's file: nothing to wait on but its growth


@pytest.mark.parametrize("crash_on", ["ack", "acked", "typing", "send:echo: hi"])
async def test_a_bot_killed_at_any_step_of_a_turn_answers_each_message_exactly_once(setup: Path, crash_on: str) -> None:
    platform = FakePlatform(setup)
    platform.push(message(1, "hi"))
    child = start_child(setup, crash_on)
    with trio.fail_after(DEADLINE):
        code = await trio.to_thread.run_sync(child.wait)
    assert code == -signal.SIGKILL, f"the bot should have been killed at {crash_on}"
    platform.push(message(2, "after"))
    child = start_child(setup)
    try:
        await wait_records(
            setup,
            "both replies",
            lambda records: {"echo: hi", "echo: after"} <= {r.text for r in records if r.op == "send"},
        )
        child.send_signal(signal.SIGTERM)
        with trio.fail_after(DEADLINE):
            await trio.to_thread.run_sync(child.wait)
    finally:
        child.kill()
    sent = [record.text for record in records_in(setup) if record.op == "send"]
    assert sent.count("echo: hi") == 1 and sent.count("echo: after") == 1, sent
    # Cut off before its reply was stored, a turn runs again. At "typing" it always was; at "ack" and "acked" when
    # it had started before the batch's acknowledgement, which it may (turns start once a batch is stored, and have
    # a head start before it is acknowledged: docs/chat.md).
    if crash_on in ("ack", "acked", "typing"):  # its agent may not have started the first time
        assert runs(setup)[-2:] == ["hi", "after"] and len(runs(setup)) in (2, 3)
    else:
        assert runs(setup) == ["hi", "after"]
    inbox = Inbox(setup / "state.sqlite3.chat")
    assert inbox.unfinished("fake") == []
    assert json.loads(json.dumps(inbox.position("fake"))) == "2"


async def test_a_bot_killed_between_a_reply_and_its_file_sends_the_file_after_the_restart_once(setup: Path) -> None:
    platform = FakePlatform(setup)
    platform.push(message(1, "file please"))
    child = start_child(setup, "file:notes.txt")
    with trio.fail_after(DEADLINE):
        code = await trio.to_thread.run_sync(child.wait)
    assert code == -signal.SIGKILL, "the bot should have been killed before it sent the file"
    assert [r.text for r in records_in(setup) if r.op == "send"] == ["here are the notes"]
    kept = list((setup / "state.sqlite3.chat.files").glob("*/*"))
    assert [path.read_text() for path in kept] == ["the notes"]
    assert all(path.stat().st_mode & 0o077 == 0 for path in [*kept, kept[0].parent, kept[0].parent.parent])
    child = start_child(setup)
    try:
        await wait_records(setup, "the file", lambda records: [r for r in records if r.op == "file"])
        child.send_signal(signal.SIGTERM)
        with trio.fail_after(DEADLINE):
            await trio.to_thread.run_sync(child.wait)
    finally:
        child.kill()
    records = records_in(setup)
    assert [r.text for r in records if r.op == "send"] == ["here are the notes"]
    assert [(r.text, r.extra["content"]) for r in records if r.op == "file"] == [("notes.txt", "the notes")]
    assert runs(setup) == ["file please"]
    assert Inbox(setup / "state.sqlite3.chat").unfinished("fake") == []
    assert not list((setup / "state.sqlite3.chat.files").glob("*/*")), "a delivered file is not kept"
    assert not list((setup / "work" / ".agent-bridge" / "outbox").glob("*/notes.txt"))


async def test_a_message_mid_turn_waits_for_the_running_turn_when_on_busy_is_queue(setup: Path) -> None:
    async with running_bridge(setup) as (_, platform):
        platform.push(message(1, "wait for me"))
        await platform.wait_for("the agent runs", lambda: runs(setup))
        platform.push(message(2, "hi"))
        await platform.wait_for("the second stored", lambda: [r for r in platform.of("ack") if r.text == "2"])
        assert runs(setup) == ["wait for me"] and not platform.sent_texts()
        await open_gate(setup)
        await platform.wait_for("both replies", lambda: len(platform.sent_texts()) == 2)
        assert platform.sent_texts() == ["waited", "echo: hi"]


async def test_a_message_mid_turn_interrupts_it_when_on_busy_is_interrupt(setup: Path) -> None:
    profile = setup / "profiles" / "agent.yaml"
    profile.write_text(profile.read_text() + "on_busy: interrupt\n")
    async with running_bridge(setup) as (_, platform):
        platform.push(message(1, "wait for me"))
        await platform.wait_for("the agent runs", lambda: runs(setup))
        platform.push(message(2, "hi"))
        await platform.wait_for("both replies", lambda: len(platform.sent_texts()) == 2)
        assert sorted(platform.sent_texts()) == ["Cancelled.", "echo: hi"]


# ---------------------------------------------------------------------------- the fleet


async def test_over_a_gateway_two_workers_answer_every_chat_once_and_a_press_reaches_the_worker(
    setup: Path, pg_dsn: str
) -> None:
    workers = []
    for name in ("w1", "w2"):
        log = open(setup / f"{name}.log", "ab")  # noqa: SIM115 - the worker's own log, closed with the test
        workers.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bridge",
                    "worker",
                    "--postgres",
                    pg_dsn,
                    "--profiles",
                    str(setup / "profiles"),
                    "--name",
                    name,
                    "--lease-secs",
                    "1",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        )
        log.close()
    try:
        platform = FakePlatform()
        inbox = Inbox(setup / "chat.sqlite3")
        settings = ChatSettings(profile="agent", profiles=("agent", "asker"), allow_users=frozenset({"7"}))
        async with open_host(postgres=pg_dsn, gateway_name="chat") as host, trio.open_nursery() as nursery:
            bridge = ChatBridge(host, platform, settings, inbox)
            await nursery.start(bridge.run)
            platform.push(*(message(index, f"hello {index}", chat=f"c{index}") for index in range(1, 5)))
            await platform.wait_for("every chat answered", lambda: len(platform.sent_texts()) == 4)
            assert sorted(platform.sent_texts()) == [f"echo: hello {index}" for index in range(1, 5)]
            platform.push(message(5, "/profile asker", chat="c9"), message(6, "run the build", chat="c9"))
            await platform.wait_for("the prompt", lambda: platform.of("send")[-1].choices)
            platform.push(press(7, platform.choice("Deny"), chat="c9"))
            await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])
            assert '"behavior": "deny"' in next(t for t in platform.sent_texts() if t.startswith("decided"))
            nursery.cancel_scope.cancel()
        inbox.close()
        assert sorted(runs(setup)) == [f"hello {index}" for index in range(1, 5)]
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()


async def test_a_platform_unreachable_for_a_while_or_refusing_a_press_does_not_stop_the_bot(setup: Path) -> None:
    platform = FakePlatform()
    platform.unavailable_polls = 1
    async with running_bridge(setup, platform, profile="asker") as (_, platform):
        await platform.wait_for("a poll failed", lambda: platform.of("unavailable"))
        platform.push(message(1, "run the build"))
        await platform.wait_for("the prompt", lambda: platform.of("send") and platform.of("send")[-1].choices)
        platform.refuse_presses = 1
        platform.push(press(2, platform.choice("Allow")))
        await platform.wait_for("the reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")])
        assert '"behavior": "allow"' in next(t for t in platform.sent_texts() if t.startswith("decided"))


def test_the_inbox_keeps_only_the_latest_delivered_updates(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "chat.sqlite3", keep_delivered=3)
    for index in range(1, 8):
        (stored,) = inbox.store_batch("fake", [message(index, f"m{index}")], str(index + 1))
        if index != 2:
            inbox.mark("fake", stored.update_id, "delivered")
    assert [stored.update_id for stored in inbox.unfinished("fake")] == ["2"]  # never dropped while undelivered
    assert inbox.state_of("fake", "1") is None and inbox.state_of("fake", "5") == "delivered"
    assert inbox.store_batch("fake", [message(6, "m6"), message(8, "m8")], "9")[0].update_id == "8"
    inbox.close()


def test_the_inbox_log_is_copied_into_its_file_by_sync_once_it_has_grown(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "chat.sqlite3")
    for index in range(1, 601):  # some 10 MB of log: past the size at which `sync` checkpoints
        inbox.store_batch("fake", [message(index, "x" * 4000)], str(index + 1))
    inbox.sync()
    shutil.copy(tmp_path / "chat.sqlite3", tmp_path / "copy.sqlite3")  # the file alone, without its log
    inbox.close()
    copy = Inbox(tmp_path / "copy.sqlite3")
    assert len(copy.unfinished("fake")) == 600 and copy.position("fake") == "601"
    copy.close()


async def test_a_press_decides_the_turn_that_asked_while_another_message_waits_behind_it(setup: Path) -> None:
    async with running_bridge(setup, profile="asker") as (_, platform):
        platform.push(message(1, "run the build"))
        await platform.wait_for("the prompt", lambda: platform.of("send") and platform.of("send")[-1].choices)
        platform.push(message(2, "run it again"))  # queued behind the turn that asks (on_busy: queue)
        await platform.wait_for("the second stored", lambda: [r for r in platform.of("ack") if r.text == "2"])
        platform.push(press(3, platform.choice("Allow")), message(4, "/status"))
        await platform.wait_for(
            "the first reply", lambda: [t for t in platform.sent_texts() if t.startswith("decided")]
        )
        await platform.wait_for("the status", lambda: [t for t in platform.sent_texts() if t.startswith("Profile:")])
        assert platform.of("press")[0].text == "Allowed"
        assert any(text.startswith("Profile: asker. Now: a turn is running") for text in platform.sent_texts())
        await platform.wait_for("the second prompt", lambda: len([r for r in platform.of("send") if r.choices]) == 2)
        platform.push(message(5, "/cancel"))
        await platform.wait_for("the second turn cancelled", lambda: "Cancelled." in platform.sent_texts())


def test_a_chat_store_of_version_1_gains_the_moved_chats_and_keeps_its_conversations(tmp_path: Path) -> None:
    path = tmp_path / "chat.sqlite3"
    inbox = Inbox(path)
    inbox.set_conversation("telegram", "telegram:-4001", "claude", 2)
    inbox.close()
    with closing(sqlite3.connect(path)) as db:  # as agent-bridge before chat_moves wrote it
        db.execute("DROP TABLE chat_moves")
        db.execute("PRAGMA user_version = 1")
        db.commit()
    inbox = Inbox(path)
    assert inbox.moved_chats("telegram") == {}
    inbox.chat_moved("telegram", "-4001", "-1004001")
    inbox.close()
    inbox = Inbox(path)
    assert inbox.moved_chats("telegram") == {"-4001": "-1004001"} and inbox.moved_chats("matrix") == {}
    assert inbox.conversation("telegram", "telegram:-4001") == ("claude", 2)
    inbox.close()
