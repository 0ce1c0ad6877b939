"""`agent-bridge connect` as a user runs it: its options, its config errors, one process per bot, and end to end against
the fake Telegram Bot API (`tools/fakes/telegram_bot_api.py`) with real agent processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio
import yaml
from chatkit import asking_profile
from fakes.telegram_bot_api import running_fake_bot_api

from bridge.chat.botlock import lock_path
from bridge.cli.connect import chat_store_path

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
DEADLINE = 30


@pytest.fixture
def bot(tmp_path: Path) -> Path:
    """A profiles directory with `echo`, and a config for a Telegram bot at an address nothing listens on."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "echo.yaml").write_text(f"command: [{sys.executable!r}, -c, 'print(\"hi\")']\n")
    (tmp_path / "bot.yaml").write_text(
        textwrap.dedent(
            """\
            telegram:
              token: "${TELEGRAM_BOT_TOKEN}"
              api_url: "http://127.0.0.1:9"
              profile: echo
              allow_users: [42]
            """
        )
    )
    return tmp_path


def connect(bot: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT_BRIDGE, "connect", *args],
        cwd=bot,
        env={**os.environ, "TELEGRAM_BOT_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def test_a_second_connect_on_the_same_bot_is_refused_naming_the_first(bot: Path) -> None:
    state = str(bot / "bot.sqlite3")
    lock = lock_path(chat_store_path(state, None, "connect").parent, "telegram", TOKEN)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from bridge.chat.botlock import BotLock; BotLock(sys.argv[1], 'telegram').acquire(); "
            "print('held', flush=True); sys.stdin.read()",
            str(lock),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        done = connect(bot, "bot.yaml", "--profiles", "profiles", "--state", state)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stderr
    assert f"this telegram bot is already served by agent-bridge connect, pid {holder.pid}" in done.stderr
    assert TOKEN not in done.stderr and TOKEN.split(":")[1] not in lock.name
    assert not (bot / "bot.sqlite3").exists(), "nothing was opened for a bot another process serves"


def test_connect_without_profiles_or_postgres_says_what_it_needs(bot: Path) -> None:
    done = connect(bot, "bot.yaml")
    assert done.returncode == 2
    assert "connect needs --profiles DIR (or --postgres DSN" in done.stderr


def test_a_config_naming_a_missing_profile_is_refused_with_its_line(bot: Path) -> None:
    (bot / "bot.yaml").write_text((bot / "bot.yaml").read_text().replace("profile: echo", "profile: ecko"))
    done = connect(bot, "bot.yaml", "--profiles", "profiles", "--state", str(bot / "bot.sqlite3"))
    assert done.returncode == 2
    assert "bot.yaml:4" in done.stderr and "echo" in done.stderr
    assert TOKEN not in done.stderr


def test_the_chat_store_lives_beside_the_session_store(tmp_path: Path) -> None:
    assert chat_store_path(str(tmp_path / "bot.sqlite3"), None, "connect") == tmp_path / "bot.sqlite3.chat"
    assert chat_store_path(None, "postgresql://db/bridge", "bot1").name == "chat-bot1.sqlite3"


# ---------------------------------------------------------------------------- end to end, against the fake Bot API

AGENT = textwrap.dedent(
    """\
    import json, os, sys
    message = os.environ["AGENT_MESSAGE"]
    with open(os.environ["RUNS"], "a") as runs:
        runs.write(message + "\\n")
    print("AGENT_PARTIAL:" + json.dumps("Thinking about "), flush=True)
    print("AGENT_PARTIAL:" + json.dumps(message), flush=True)
    print("**echo**: " + message)
    """
)


async def test_connect_answers_in_telegram_refuses_a_second_connect_and_after_kill_9_repeats_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "echo.yaml").write_text(
        yaml.safe_dump(
            {"command": [sys.executable, str(tmp_path / "agent.py")], "env": {"RUNS": str(tmp_path / "runs")}}
        )
    )
    async with running_fake_bot_api(TOKEN) as fake:
        (tmp_path / "bot.yaml").write_text(
            f'telegram:\n  token: "${{TELEGRAM_BOT_TOKEN}}"\n  api_url: "{fake.api_url}"\n  profile: echo\n'
            "  allow_users: [42]\n"
        )
        argv = [AGENT_BRIDGE, "connect", "bot.yaml", "--profiles", "profiles", "--state", "bot.sqlite3"]
        env = {**os.environ, "TELEGRAM_BOT_TOKEN": TOKEN}
        fake.user_says(chat=42, user=42, text="hello")
        process = await trio.lowlevel.open_process(argv, cwd=tmp_path, env=env)
        try:
            await fake.wait_until(lambda: [m for m in fake.sent_to(42) if m.text == "echo: hello"], within=20)
            reply = next(m for m in fake.sent_to(42) if m.text == "echo: hello")
            assert reply.entities == [{"type": "bold", "offset": 0, "length": 4}]
            fake.user_says(chat=42, user=42, text="/status")
            await fake.wait_until(
                lambda: [m for m in fake.sent_to(42) if m.text.startswith("Profile: echo")], within=20
            )
            fake.user_says(chat=7, user=7, text="let me in")
            await fake.wait_until(lambda: fake.sent_to(7), within=20)
            second = await trio.run_process(argv, cwd=tmp_path, env=env, check=False, capture_stderr=True)
            assert second.returncode == 2 and b"already served by agent-bridge connect" in second.stderr
        finally:
            process.kill()
            await process.wait()
        fake.user_says(chat=42, user=42, text="again")
        process = await trio.lowlevel.open_process(argv, cwd=tmp_path, env=env)
        try:
            await fake.wait_until(lambda: [m for m in fake.sent_to(42) if m.text == "echo: again"], within=20)
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                assert await process.wait() == 0
        finally:
            process.kill()
        texts = [m.text for m in fake.sent_to(42) if not m.deleted]
        assert texts.count("echo: hello") == 1 and texts.count("echo: again") == 1, texts
        assert (tmp_path / "runs").read_text().splitlines() == ["hello", "again"]
        assert [m.text for m in fake.sent_to(7)] == ["Sorry, this bot only answers the people its owner allowed."]


async def test_connect_asks_for_approval_with_telegram_buttons(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "asker.yaml").write_text(yaml.safe_dump(asking_profile(tmp_path, "make")))
    async with running_fake_bot_api(TOKEN) as fake:
        (tmp_path / "bot.yaml").write_text(
            f'telegram:\n  token: "${{TELEGRAM_BOT_TOKEN}}"\n  api_url: "{fake.api_url}"\n  profile: asker\n'
            "  allow_users: [42]\n"
        )
        argv = [AGENT_BRIDGE, "connect", "bot.yaml", "--profiles", "profiles", "--state", "bot.sqlite3"]
        env = {**os.environ, "TELEGRAM_BOT_TOKEN": TOKEN}
        process = await trio.lowlevel.open_process(argv, cwd=tmp_path, env=env)
        try:
            fake.user_says(chat=42, user=42, text="build it")
            await fake.wait_until(lambda: [m for m in fake.sent_to(42) if m.reply_markup], within=20)
            prompt = next(m for m in fake.sent_to(42) if m.reply_markup)
            buttons = [b for row in prompt.reply_markup["inline_keyboard"] for b in row]
            assert [b["text"] for b in buttons] == ["Allow", "Allow for this session", "Deny"]
            fake.user_presses(prompt, buttons[2]["callback_data"], user=42)
            decided = 'decided: {"behavior": "deny"}'
            await fake.wait_until(lambda: [m for m in fake.sent_to(42) if m.text == decided], within=20)
            await fake.wait_until(lambda: fake.answers, within=20)
            await fake.wait_until(lambda: [e for e in fake.edits if "Denied by " in e[2]], within=20)
        finally:
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                await process.wait()
