"""`agent-bridge connect` as a user runs it: its options, its config errors, and one process per bot."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
