"""Issue 36's scenarios end to end: `agent-bridge connect` as a user runs it, against the fake Telegram Bot API
(`tools/fakes/telegram_bot_api.py`), with real agent processes — the connector, the delivery kit, the host and the
agents together, where test_chat_runtime drives the kit through a platform in memory and test_chat_telegram the
connector alone.

The agent (AGENT) streams, waits on a FIFO the test opens, writes a long reply with code blocks, reads the
attachments and leaves a file in its outbox, by what the message says; the asking one is `chatkit.ASKING_AGENT`.
Nothing sleeps to synchronise: every wait is on what the fake saw, with a deadline."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from chatkit import AGENT_BRIDGE, TELEGRAM_TOKEN, asking_profile, connect_running, stop_connect
from fakes.telegram_bot_api import (
    MESSAGE_LIMIT,
    Call,
    FakeBotApi,
    FloodLimits,
    Message,
    cannot_parse_entities,
    running_fake_bot_api,
    too_many_requests,
)

ALICE = 42
WITHIN = 20.0
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(256)) + b"\xff\xd9"  # what Telegram serves photos as
BLOCKS = 16  # of prose and code, in the long reply: over 11,000 characters
# No test here is about the pace (test_chat_pacing and test_chat_telegram are): the fake and the bot's config agree
# on a fast one, so that no message waits a second behind the one before it in the chat (test_chat_connect's too).
FAST_FLOOD = FloodLimits(per_chat_interval=0.02)
FAST_PACE = {"per_chat_secs": 0.02}

AGENT = textwrap.dedent(
    """\
    import json, os, pathlib
    message = os.environ["AGENT_MESSAGE"]
    with open(os.environ["RUNS"], "a") as runs:
        runs.write(message + "\\n")
    pid, ancestors = os.getpid(), []  # which process started this agent: connect, or a worker of the fleet
    while pid > 1:
        pid = int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])
        ancestors.append(pid)
    with open(os.environ["RUNS"] + ".ancestors", "a") as file:
        file.write(json.dumps(ancestors) + "\\n")
    if message.startswith("stream"):
        print("AGENT_PARTIAL:" + json.dumps("Hello "), flush=True)
        print("AGENT_PARTIAL:" + json.dumps("world"), flush=True)
        open(os.environ["GATE"]).read()  # until the test saw the preview
        print("Hello world, in full")
    elif message.startswith("wait"):
        open(os.environ["GATE"]).read()
        print("waited")
    elif message.startswith("long"):
        parts = []
        for block in range(BLOCKS):
            parts.append(f"Paragraph {block}: " + "some words of prose " * 25)
            parts.append("```python\\n" + "\\n".join(f"print({block}, {line})" for line in range(15)) + "\\n```")
        print("\\n\\n".join(parts))
    elif message.startswith("file"):
        pathlib.Path(os.environ["AGENT_OUTBOX"], "notes.txt").write_text("the notes")
        print("here are the notes")
    elif message.startswith("photo"):
        files = json.loads(os.environ.get("AGENT_ATTACHMENTS", "[]"))
        print("got " + "; ".join(f["type"] + "=" + str(len(open(f.get("path") or f["url"], "rb").read())) for f in files))
    else:
        print("**echo**: " + message)
    """
).replace("range(BLOCKS)", f"range({BLOCKS})")


@pytest.fixture
def bot(tmp_path: Path) -> Path:
    """Profiles `agent` and `asker`, the gate FIFO, the agents' run log and working directory."""
    (tmp_path / "agent.py").write_text(AGENT)
    os.mkfifo(tmp_path / "gate")
    (tmp_path / "work").mkdir()
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    common = {
        "env": {"GATE": str(tmp_path / "gate"), "RUNS": str(tmp_path / "runs")},
        "cwd": str(tmp_path / "work"),
        "kill_grace_secs": 2,
    }
    # max_reply_chars: the long reply is over the profile's default of 8,000, which would cut it before the chat.
    agent = {"command": [sys.executable, str(tmp_path / "agent.py")], "max_reply_chars": 20_000, **common}
    (profiles / "agent.yaml").write_text(yaml.safe_dump(agent))
    (profiles / "asker.yaml").write_text(yaml.safe_dump(asking_profile(tmp_path, **common)))
    return tmp_path


@asynccontextmanager
async def connected(bot: Path, fake: FakeBotApi, *extra: str, **section: Any) -> AsyncIterator[trio.Process]:
    """`agent-bridge connect` of a Telegram bot at the fake (the section's keys overridable), stopped with SIGTERM
    at the end, which must end it with 0."""
    config = {"token": "${TELEGRAM_BOT_TOKEN}", "api_url": fake.api_url, "profile": "agent", "allow_users": [ALICE]}
    config["pace"] = FAST_PACE
    (bot / "bot.yaml").write_text(yaml.safe_dump({"telegram": config | section}))
    async with connect_running(bot, {"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN}, *extra) as process:
        yield process
        await stop_connect(process, WITHIN)


def runs(bot: Path) -> list[str]:
    path = bot / "runs"
    return path.read_text().splitlines() if path.exists() else []


def said(fake: FakeBotApi, check: Callable[[str], bool]) -> Callable[[], list[Message]]:
    """A condition for `wait_until`: the bot's visible messages to Alice whose text passes `check`."""
    return lambda: [message for message in fake.visible(ALICE) if check(message.text)]


def prompts_sent(fake: FakeBotApi) -> list[Call]:
    """The messages the bot sent with buttons: a prompt loses its buttons once decided, which may be before or
    after the next prompt is sent."""
    return [call for call in fake.calls_of("sendMessage") if call.status == 200 and call.params.get("reply_markup")]


async def open_gate(bot: Path) -> None:
    with trio.fail_after(WITHIN):
        await trio.to_thread.run_sync(lambda: open(bot / "gate", "w").close(), abandon_on_cancel=True)


async def test_a_streamed_reply_is_previewed_then_sent_as_a_new_message(bot: Path) -> None:
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake, connected(bot, fake):
        fake.user_says(ALICE, ALICE, "stream please")
        await fake.wait_until(
            lambda: [m for m in fake.sent_to(ALICE) if any(text == "Hello world" for _, text in m.history)], WITHIN
        )
        preview = next(m for m in fake.sent_to(ALICE) if any(text == "Hello world" for _, text in m.history))
        assert not said(fake, lambda text: "in full" in text)(), "the final reply waits for the agent"
        # "typing" once the turn has run half a second (a quicker reply needs none): the agent waits at its gate
        await fake.wait_until(lambda: [action for _, chat, action in fake.actions if chat == ALICE], WITHIN)
        assert [action for _, chat, action in fake.actions if chat == ALICE][:1] == ["typing"]
        await open_gate(bot)
        await fake.wait_until(said(fake, lambda text: text == "Hello world, in full"), WITHIN)
        await fake.wait_until(lambda: preview.deleted, WITHIN)
        final = said(fake, lambda text: text == "Hello world, in full")()
        assert len(final) == 1 and final[0].message_id != preview.message_id
        assert [m.text for m in fake.visible(ALICE)] == ["Hello world, in full"]


ALLOWED = '{"behavior": "allow", "updatedInput": {"command": "rm -rf build"}'
SESSION_RULE = (
    '"updatedPermissions": [{"behavior": "allow", "destination": "session", '
    '"rules": [{"ruleContent": "rm -rf build", "toolName": "Bash"}], "type": "addRules"}]'
)


@pytest.mark.parametrize(
    ("label", "decided", "shown"),
    [
        ("Allow", ALLOWED + "}", "Allowed by alice"),
        ("Deny", '{"behavior": "deny"}', "Denied by alice"),
        # Claude Code keeps the rule for the session: the same command is not asked again.
        ("Allow for this session", f"{ALLOWED}, {SESSION_RULE}}}", "Allowed for this session by alice"),
    ],
)
async def test_an_approval_by_button_allows_denies_or_allows_for_the_session(
    bot: Path, label: str, decided: str, shown: str
) -> None:
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake, connected(bot, fake, profile="asker"):
        fake.user_says(ALICE, ALICE, "run the build")
        await fake.wait_until(lambda: [m for m in fake.sent_to(ALICE) if m.reply_markup], WITHIN)
        prompt = next(m for m in fake.sent_to(ALICE) if m.reply_markup)
        assert prompt.text == "The agent asks to use Bash: rm -rf build" and prompt.reply_markup is not None
        buttons = {button["text"]: button for row in prompt.reply_markup["inline_keyboard"] for button in row}
        assert list(buttons) == ["Allow", "Allow for this session", "Deny"]
        fake.user_presses(prompt, buttons[label]["callback_data"], user=ALICE)
        await fake.wait_until(said(fake, lambda text: text.startswith("decided")), WITHIN)
        assert said(fake, lambda text: text.startswith("decided"))()[0].text == f"decided: {decided}"
        await fake.wait_until(lambda: [edit for edit in fake.edits if edit[2].endswith(shown + ".")], WITHIN)
        assert len(fake.answers) == 1, "the press was answered: no spinning button"
        assert prompt.reply_markup is None, "the decided prompt keeps no buttons"


async def test_a_question_is_answered_by_a_button_then_by_free_text(bot: Path) -> None:
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake, connected(bot, fake, profile="asker"):
        fake.user_says(ALICE, ALICE, "a question")
        await fake.wait_until(lambda: [m for m in fake.sent_to(ALICE) if m.reply_markup], WITHIN)
        prompt = next(m for m in fake.sent_to(ALICE) if m.reply_markup)
        assert prompt.reply_markup is not None
        buttons = [button for row in prompt.reply_markup["inline_keyboard"] for button in row]
        assert [button["text"] for button in buttons] == ["Red", "Blue"]
        fake.user_presses(prompt, buttons[1]["callback_data"], user=ALICE)
        await fake.wait_until(said(fake, lambda text: text.startswith("decided")), WITHIN)
        assert '"Which colour?": "Blue"' in said(fake, lambda text: text.startswith("decided"))()[0].text
        assert fake.answers, "the press was answered: no spinning button"

        fake.user_says(ALICE, ALICE, "another question")
        await fake.wait_until(lambda: len(prompts_sent(fake)) == 2, WITHIN)
        fake.user_says(ALICE, ALICE, "Green, please")
        await fake.wait_until(lambda: len(said(fake, lambda text: text.startswith("decided"))()) == 2, WITHIN)
        assert '"Which colour?": "Green, please"' in said(fake, lambda text: text.startswith("decided"))()[1].text


async def test_each_question_of_a_prompt_is_answered_only_by_its_own_buttons(bot: Path) -> None:
    """A press on an earlier question's message (a client showing it before the edit took its buttons away) never
    answers the question asked now: it is told "no longer waiting", and the question still waits."""
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake, connected(bot, fake, profile="asker"):
        fake.user_says(ALICE, ALICE, "two questions")
        await fake.wait_until(lambda: len(prompts_sent(fake)) == 1, WITHIN)
        # As the user's client still shows it, buttons and all, after the edit that answers it.
        colour = dataclasses.replace(next(m for m in fake.sent_to(ALICE) if m.reply_markup))
        assert colour.reply_markup is not None
        red, blue = [button["callback_data"] for row in colour.reply_markup["inline_keyboard"] for button in row]
        fake.user_presses(colour, red, user=ALICE)
        await fake.wait_until(lambda: len(prompts_sent(fake)) == 2, WITHIN)
        fake.user_presses(colour, blue, user=ALICE)
        await fake.wait_until(lambda: len(fake.answers) == 2, WITHIN)
        assert fake.answers[1][2] == "no longer waiting"
        size = next(m for m in fake.sent_to(ALICE) if m.text.startswith("Size"))
        assert size.reply_markup is not None, "the size question still waits"
        small = size.reply_markup["inline_keyboard"][0][0]
        assert small["text"] == "Small"
        fake.user_presses(size, small["callback_data"], user=ALICE)
        await fake.wait_until(said(fake, lambda text: text.startswith("decided")), WITHIN)
        decided = said(fake, lambda text: text.startswith("decided"))()[0].text
        assert '"Which colour?": "Red"' in decided and '"Which size?": "Small"' in decided, decided


async def test_cancel_stops_the_running_turn(bot: Path) -> None:
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake, connected(bot, fake):
        fake.user_says(ALICE, ALICE, "wait for me")
        await fake.wait_until(lambda: runs(bot) == ["wait for me"], WITHIN)
        fake.user_says(ALICE, ALICE, "/cancel")
        await fake.wait_until(said(fake, lambda text: text == "Cancelled."), WITHIN)
        fake.user_says(ALICE, ALICE, "after")
        await fake.wait_until(said(fake, lambda text: text == "echo: after"), WITHIN)
        assert not said(fake, lambda text: text == "waited")()
        assert runs(bot) == ["wait for me", "after"]


async def test_past_the_budget_a_clear_message_and_no_turn(bot: Path) -> None:
    async with (
        running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake,
        connected(bot, fake, budget={"turns_per_day": 1}),
    ):
        fake.user_says(ALICE, ALICE, "one")
        await fake.wait_until(said(fake, lambda text: text == "echo: one"), WITHIN)
        fake.user_says(ALICE, ALICE, "two")
        await fake.wait_until(lambda: len(fake.visible(ALICE)) == 2, WITHIN)
        assert "used today's 1 turns" in fake.visible(ALICE)[1].text
        assert runs(bot) == ["one"]


@pytest.mark.timeout(60)  # a connect to start, a long reply to render and send in parts
async def test_a_10000_character_reply_with_code_blocks_arrives_whole_within_the_limit(bot: Path) -> None:
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake, connected(bot, fake):
        fake.user_says(ALICE, ALICE, "long please")
        await fake.wait_until(said(fake, lambda text: f"print({BLOCKS - 1}, 14)" in text), 3 * WITHIN)
        parts = fake.visible(ALICE)
    assert len(parts) >= 3 and sum(len(part.text) for part in parts) >= 10_000, [len(part.text) for part in parts]
    assert all(len(part.text.encode("utf-16-le")) // 2 <= MESSAGE_LIMIT for part in parts)
    every_line = [f"print({block}, {line})" for block in range(BLOCKS) for line in range(15)]
    for wanted in every_line:
        holding = [part for part in parts if wanted in part.text]
        assert len(holding) == 1, f"{wanted!r} is in {len(holding)} parts"
        part = holding[0]
        at = len(part.text[: part.text.index(wanted)].encode("utf-16-le")) // 2
        assert any(
            entity["type"] == "pre" and entity["offset"] <= at < entity["offset"] + entity["length"]
            for entity in part.entities
        ), f"{wanted!r} is not inside a code block of its part"
    assert runs(bot) == ["long please"]


async def test_a_429_storm_is_waited_out_and_the_reply_sent_once(bot: Path) -> None:
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake, connected(bot, fake):
        fake.fail_next("sendMessage", too_many_requests(0.4), count=2)
        fake.user_says(ALICE, ALICE, "through the storm")
        await fake.wait_until(said(fake, lambda text: text == "echo: through the storm"), WITHIN)
        calls = fake.calls_of("sendMessage")
    assert [call.status for call in calls] == [429, 429, 200]
    # 0.4 s each, as retry_after said: twenty times the chat's pace in this test.
    assert all(later.time - earlier.time >= 0.4 for earlier, later in zip(calls, calls[1:])), "retry_after kept"
    assert [m.text for m in fake.sent_to(ALICE)] == ["echo: through the storm"]


async def test_a_reply_telegram_cannot_parse_is_sent_again_as_plain_text(bot: Path) -> None:
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake, connected(bot, fake):
        fake.fail_next("sendMessage", cannot_parse_entities())
        fake.user_says(ALICE, ALICE, "parse this")
        await fake.wait_until(said(fake, lambda text: text == "echo: parse this"), WITHIN)
        [reply] = fake.sent_to(ALICE)
    assert reply.entities == []
    assert [call.status for call in fake.calls_of("sendMessage")] == [400, 200]


async def test_a_photo_in_and_a_file_out(bot: Path) -> None:
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake, connected(bot, fake):
        fake.user_sends_photo(ALICE, ALICE, JPEG, caption="photo")
        await fake.wait_until(said(fake, lambda text: text.startswith("got ")), WITHIN)
        assert said(fake, lambda text: text.startswith("got "))()[0].text == f"got image={len(JPEG)}"
        fake.user_says(ALICE, ALICE, "file please")
        await fake.wait_until(lambda: [m for m in fake.sent_to(ALICE) if m.document], WITHIN)
        await fake.wait_until(said(fake, lambda text: text == "here are the notes"), WITHIN)
        [sent] = [m for m in fake.sent_to(ALICE) if m.document]
    assert sent.document is not None and sent.document["file_name"] == "notes.txt"
    assert fake.files[sent.document["file_id"]].data == b"the notes"
    assert TELEGRAM_TOKEN not in json.dumps(runs(bot))


@pytest.mark.timeout(120)  # PostgreSQL, two workers and a gateway to start
async def test_a_fleet_connect_over_postgres_and_two_workers_answers_every_chat_once(bot: Path, pg_dsn: str) -> None:
    workers = [
        subprocess.Popen(
            [AGENT_BRIDGE, "worker", "--postgres", pg_dsn, "--profiles", "profiles", "--name", name],
            cwd=bot,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in ("w1", "w2")
    ]
    chats = [ALICE, 43, 44, 45]
    try:
        async with (
            running_fake_bot_api(TELEGRAM_TOKEN, limits=FAST_FLOOD) as fake,
            connected(bot, fake, "--postgres", pg_dsn, "--name", "bot", allow_users=chats, profiles=["agent", "asker"]),
        ):
            for chat in chats:
                fake.user_says(chat, chat, f"hello from {chat}")
            await fake.wait_until(lambda: all(fake.sent_to(chat) for chat in chats), 2 * WITHIN)
            fake.user_says(ALICE, ALICE, "/profile asker")
            fake.user_says(ALICE, ALICE, "run the build")
            await fake.wait_until(lambda: [m for m in fake.sent_to(ALICE) if m.reply_markup], WITHIN)
            prompt = next(m for m in fake.sent_to(ALICE) if m.reply_markup)
            assert prompt.reply_markup is not None
            deny = prompt.reply_markup["inline_keyboard"][-1][0]
            assert deny["text"] == "Deny"
            fake.user_presses(prompt, deny["callback_data"], user=ALICE)
            await fake.wait_until(said(fake, lambda text: text == 'decided: {"behavior": "deny"}'), WITHIN)
        for chat in chats:
            assert [m.text for m in fake.sent_to(chat)][:1] == [f"echo: hello from {chat}"], fake.sent_to(chat)
            assert [m.text for m in fake.sent_to(chat)].count(f"echo: hello from {chat}") == 1
        assert sorted(runs(bot)) == sorted(f"hello from {chat}" for chat in chats)
        ancestors = [json.loads(line) for line in (bot / "runs.ancestors").read_text().splitlines()]
        workers_pids = {worker.pid for worker in workers}
        assert all(workers_pids & set(chain) for chain in ancestors), "every turn ran on a worker, none in connect"
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=WITHIN)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
