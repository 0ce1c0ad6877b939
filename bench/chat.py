"""Rows 32–34, the chat side (issue 36): a real `agent-bridge connect` against the fake Telegram Bot API
(tools/fakes/telegram_bot_api.py, in this process, on loopback), with real agent processes.

`make bench` runs these samples in its workers (case `chat`); alone, from the repository, one of each:

    bench/.venv/bin/python bench/chat.py

- `turn`: one `connect` and one stdin/stdout `serve --profiles`, the same echo agent (sample_agents/echo.sh)
  behind both; turn by turn, the order rotating, a turn through serve (timed from writing the request to reading
  its `result`) and one through Telegram, timed on the fake's clock from the update being available (`getUpdates`
  may return it) to the `sendMessage` of the reply arriving (the fake read its request's head). Each Telegram turn
  is in a chat of its own and every turn, either contender's, starts after the same untimed rest, so that no pacing
  limit is engaged (the row measures the path, not the limits) and both start alike: with the rest after
  Telegram's turns only, half of serve's turns followed its previous one at once, on a machine still warm from it
  (no idle CPU to wake, the kernel's cgroup lock still on its slow path), and Telegram's never did. The fake serves HTTP with a small h11 server of its own, not a web framework: its cost
  stands for Telegram's servers', which are not the bridge's.
- `burst`: 200 allowed users each send a message in their chat at once; every chat must get its reply exactly
  once, the fake's record of `sendMessage` calls gives the most sends in any second overall and the shortest gap
  between two sends in one chat, and /proc gives connect's peak RSS (VmHWM).
- `preview`: agents print a partial every 100 ms for 3 s (its text names the monotonic time it was written), then
  wait 1.5 s before their reply; for each partial, the delay until the preview message (its `sendMessage` or an
  `editMessageText`) first shows it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tools"))

from fakes.telegram_bot_api import FakeBotApi, running_fake_bot_api  # noqa: E402
from network import Serve, Stdio, turn_request  # noqa: E402  (bench/ is a directory of scripts)
from worker import ECHO_AGENT, Invalid, die_with_parent, expect  # noqa: E402

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
OWNER = 42
# Telegram's limits as connect paces them (bridge.chat.pacing.TELEGRAM_LIMITS): checked from the fake's records.
PER_CHAT_INTERVAL = 1.0
GLOBAL_PER_SECOND = 30
TURN_SPACING = 1.5 / GLOBAL_PER_SECOND  # before each timed turn: the global limit is never near
TICKER = """\
import json, sys, time
for number in range(30):
    print("AGENT_PARTIAL:" + json.dumps(f"p{number}t{time.monotonic_ns()} "), flush=True)
    time.sleep(0.1)
time.sleep(1.5)  # the last partials are shown too, not only superseded by the reply
print("done")
"""


@asynccontextmanager
async def connect(command: list[str], users: list[int]) -> AsyncIterator[tuple[FakeBotApi, subprocess.Popen[bytes]]]:
    """The fake Bot API and one `agent-bridge connect` polling it, a profile `agent` running `command`."""
    with tempfile.TemporaryDirectory() as directory:
        profiles = os.path.join(directory, "profiles")
        os.mkdir(profiles)
        with open(os.path.join(profiles, "agent.yaml"), "w") as file:
            json.dump({"command": command, "timeout_secs": 60}, file)  # JSON is YAML
        async with running_fake_bot_api(TOKEN) as fake:
            config = {
                "telegram": {
                    "token": "${TELEGRAM_BOT_TOKEN}",
                    "api_url": fake.api_url,
                    "profile": "agent",
                    "allow_users": users,
                }
            }
            with open(os.path.join(directory, "bot.yaml"), "w") as file:
                json.dump(config, file)
            argv = [sys.executable, "-m", "bridge", "connect", "bot.yaml", "--profiles", profiles]
            process = subprocess.Popen(
                [*argv, "--state", os.path.join(directory, "bot.sqlite3")],
                cwd=directory,
                env={**os.environ, "TELEGRAM_BOT_TOKEN": TOKEN},
                preexec_fn=die_with_parent,
            )
            try:
                await fake.wait_until(lambda: fake.calls_of("getUpdates"), within=30)
                yield fake, process
            finally:
                process.kill()
                process.wait()


async def reply_in(fake: FakeBotApi, chat: int, text: str, within: float = 30) -> float:
    """When (the fake's clock) the bot's `sendMessage` of `text` into `chat` arrived: its request's head was read."""
    try:
        await fake.wait_until(lambda: [m for m in fake.sent_to(chat) if m.text == text], within=within)
    except BaseException as err:
        raise Invalid(f"no reply {text!r} in chat {chat}: {err}") from None
    return next(
        call.time
        for call in fake.calls_of("sendMessage")
        if call.status == 200 and call.params.get("text") == text and int(call.params.get("chat_id", 0)) == chat
    )


# --------------------------------------------------------------------------- 31. a turn, against stdin/stdout serve


def turn(p: dict[str, Any]) -> dict[str, Any]:
    return trio.run(_turn, p)


async def _turn(p: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        profiles = os.path.join(directory, "profiles")
        os.mkdir(profiles)
        with open(os.path.join(profiles, "agent.yaml"), "w") as file:
            json.dump({"command": [ECHO_AGENT], "timeout_secs": 60}, file)
        serve = Serve(profiles, os.path.join(directory, "serve.sqlite3"), listen=False)
        try:
            async with connect([ECHO_AGENT], [OWNER]) as (fake, _):
                stdio = Stdio(serve)
                times: dict[str, list[float]] = {"telegram": [], "stdin": []}
                for number in range(p["warmup"] + p["turns"]):
                    order = ("telegram", "stdin") if number % 2 else ("stdin", "telegram")
                    for contender in order:
                        message = f"m{number}"
                        await trio.sleep(TURN_SPACING)  # untimed, before either contender's turn: see the docstring
                        if contender == "stdin":
                            ms = await trio.to_thread.run_sync(_stdin_turn, stdio, message)
                        else:
                            chat = 100_000 + number  # a chat of its own: no per-chat pacing
                            available = trio.current_time()
                            fake.user_says(chat=chat, user=OWNER, text=message)
                            ms = (await reply_in(fake, chat, f"echo: {message}") - available) * 1000
                        if number >= p["warmup"]:
                            times[contender].append(ms)
        finally:
            serve.stop()
    return {"telegram_ms": times["telegram"], "stdin_ms": times["stdin"]}


def _stdin_turn(stdio: Stdio, message: str) -> float:
    started = time.perf_counter_ns()
    result = stdio.result(turn_request(message, message))
    elapsed = (time.perf_counter_ns() - started) / 1e6
    expect(result.get("reply") == f"echo: {message}", f"serve answered {result}")
    return elapsed


# --------------------------------------------------------------------------- 32. 200 chats at once


def burst(p: dict[str, Any]) -> dict[str, Any]:
    return trio.run(_burst, p)


async def _burst(p: dict[str, Any]) -> dict[str, Any]:
    chats = list(range(1, p["chats"] + 1))  # private chats: the chat's id is its user's
    async with connect([ECHO_AGENT], chats) as (fake, process):
        started = trio.current_time()
        for chat in chats:
            fake.user_says(chat=chat, user=chat, text=f"hello {chat}")
        last = max([await reply_in(fake, chat, f"echo: hello {chat}", within=120) for chat in chats])
        await trio.sleep(2 * PER_CHAT_INTERVAL)  # untimed: a reply sent twice would show by now
        rss = _peak_rss_mb(process.pid)
        sends = [call for call in fake.calls_of("sendMessage") if call.status == 200]
        replies = {chat: [m.text for m in fake.sent_to(chat) if not m.deleted] for chat in chats}
    twice = [chat for chat, texts in replies.items() if texts != [f"echo: hello {chat}"]]
    expect(not twice, f"chats not answered exactly once: {twice[:5]} …")
    return {
        "seconds": last - started,
        "max_per_second": _most_in_a_second([call.time for call in sends]),
        "min_chat_gap_s": _shortest_gap(sends),
        "rate_limited": len([call for call in fake.calls if call.status == 429]),
        "peak_rss_mb": rss,
    }


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise Invalid("no VmHWM for connect")


def _most_in_a_second(times: list[float]) -> int:
    ordered, most, first = sorted(times), 0, 0
    for last, moment in enumerate(ordered):
        while moment - ordered[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def _shortest_gap(sends: list[Any]) -> float | None:
    by_chat: dict[Any, list[float]] = {}
    for call in sends:
        by_chat.setdefault(call.params.get("chat_id"), []).append(call.time)
    gaps = [b - a for times in by_chat.values() for a, b in zip(sorted(times), sorted(times)[1:], strict=False)]
    return min(gaps) if gaps else None


# --------------------------------------------------------------------------- 33. a partial in the preview


def preview(p: dict[str, Any]) -> dict[str, Any]:
    return trio.run(_preview, p)


async def _preview(p: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        ticker = os.path.join(directory, "ticker.py")
        with open(ticker, "w") as file:
            file.write(TICKER)
        async with connect([sys.executable, "-S", ticker], [OWNER]) as (fake, _):
            chats = [200_000 + number for number in range(p["chats"])]
            for chat in chats:
                fake.user_says(chat=chat, user=OWNER, text="tick")
            for chat in chats:
                await reply_in(fake, chat, "done", within=60)
            # trio's clock is the monotonic clock (perf_counter) plus an offset: the agents wrote the monotonic one.
            offset = trio.current_time() - time.monotonic()
            delays = [delay for chat in chats for delay in _delays(fake, chat, offset)]
    expect(len(delays) == 30 * len(chats), f"{30 * len(chats) - len(delays)} partials never shown in a preview")
    return {"delay_ms": delays}


def _delays(fake: FakeBotApi, chat: int, offset: float) -> list[float]:
    """Per partial: from the agent writing it to the preview first showing it, in ms."""
    shown = [(moment, text) for m in fake.sent_to(chat) if m.text != "done" for moment, text in m.history]
    shown.sort()
    delays = []
    for number in range(30):
        marker = f"p{number}t"
        first = next(((moment, text) for moment, text in shown if marker in text), None)
        if first is None:
            continue
        written_ns = int(first[1].split(marker, 1)[1].split()[0])
        delays.append((first[0] - offset - written_ns / 1e9) * 1000)
    return delays


if __name__ == "__main__":
    for name, sample, params in (
        ("turn", turn, {"turns": 20, "warmup": 3}),
        ("burst", burst, {"chats": 200}),
        ("preview", preview, {"chats": 3}),
    ):
        values = sample(params)
        shown = {
            key: (sorted(value)[len(value) // 2] if isinstance(value, list) else value) for key, value in values.items()
        }
        print(name, json.dumps(shown))
