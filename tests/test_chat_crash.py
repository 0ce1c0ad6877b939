"""`kill -9` of `agent-bridge connect` at each step of a turn, then a restart: each message is answered exactly once.

The real `connect` process against the fake Telegram Bot API (`tools/fakes/telegram_bot_api.py`), and against a
real Synapse (steps 3 and 5, the ones reached through the agent alone), with a real agent. Each step is reached from outside, never by a sleep: the fake holds the Bot API call the bot is making
(`FakeBotApi.hold`), the agent stops at a gate (a loopback connection to the test) and tells the test where it
is, or the test holds the chat store's write lock. Then SIGKILL, and a restart with nothing held.

Which steps run the agent again after the restart, and why: a turn cut off before its reply was stored (2, 3, 5)
left nothing to deliver, so it runs again; one whose reply was stored (4, 6, 7) is delivered from the store, and
an update never stored (1) was never acknowledged, so Telegram hands it out again and it runs for the first time.
"""

from __future__ import annotations

import sqlite3
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from chatkit import TELEGRAM_SECRETS, TELEGRAM_TOKEN, connect_running, stop_connect
from fakes.telegram_bot_api import FakeBotApi, FloodLimits, Held, running_fake_bot_api
from synapse import SynapseServer
from test_chat_matrix import CLIENT, PASSWORD, Person, alice, joined_by_someone_else, section, synapse  # noqa: F401  # fixtures: one Synapse for this module's tests

ALICE = 42
WITHIN = 20
# Not about pacing (the fake enforces none, Synapse's limits are raised): the bot sends as fast as it can.
UNPACED = {"per_chat_secs": 0}
PREVIEW = "Thinking about hello"
FINAL = "echo: hello"

# Writes its message to RUNS when it starts; with HOLD naming steps ("start": before any output, "partial": after its
# first partial, "edited": after its second), it connects to the test's gate at each, says where it is, and waits
# for the test to let it go on; the test kills connect meanwhile, and the agent ends when the test closes the gate.
AGENT = textwrap.dedent(
    """\
    import json, os, pathlib, socket, sys
    message = os.environ["AGENT_MESSAGE"]
    with open(os.environ["RUNS"], "a") as runs:
        runs.write(message + "\\n")
    def gate(step):
        if step in os.environ.get("HOLD", "").split():
            with socket.create_connection(("127.0.0.1", int(os.environ["GATE_PORT"]))) as held:
                held.sendall(step.encode() + b"\\n")
                if not held.recv(1):
                    sys.exit(1)
    gate("start")
    if message != "after":
        print("AGENT_PARTIAL:" + json.dumps("Thinking about " + message), flush=True)
        gate("partial")
        print("AGENT_PARTIAL:" + json.dumps(" (still)"), flush=True)
        gate("edited")
    if message.startswith("file"):
        pathlib.Path(os.environ["AGENT_OUTBOX"], "notes.txt").write_text("the notes")
    print("**echo**: " + message)
    """
)


class Gate:
    """Where the agents stopped: each connects, says its step, and is held until the test ends."""

    def __init__(self) -> None:
        self.reached: list[str] = []
        self._held: dict[str, trio.SocketStream] = {}
        self.port = 0
        self._changed = trio.Event()

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(self._hold, listeners, task_status=task_status)

    async def _hold(self, stream: trio.SocketStream) -> None:
        said = b""
        while not said.endswith(b"\n"):
            chunk = await stream.receive_some()
            if not chunk:
                return
            said += chunk
        step = said.decode().strip()
        self._held[step] = stream
        self.reached.append(step)
        self._changed.set()
        self._changed = trio.Event()
        await trio.sleep_forever()

    async def go_on(self, step: str) -> None:
        """Let the agent held at `step` go on."""
        await self._held.pop(step).send_all(b"!")

    async def wait_for(self, step: str) -> None:
        with trio.move_on_after(WITHIN) as scope:
            while step not in self.reached:
                await self._changed.wait()
        assert not scope.cancelled_caught, f"no agent reached its {step!r} gate within {WITHIN} s: {self.reached}"


@dataclass
class Bot:
    directory: Path
    fake: FakeBotApi
    gate: Gate
    holds: list[Held] = field(default_factory=list)

    def hold(self, method: str, when: Callable[[dict[str, Any]], bool] = lambda params: True, **how: bool) -> Held:
        held = self.fake.hold(method, when, **how)
        self.holds.append(held)
        return held

    def configure(self, hold: str) -> None:
        """The profile `agent`, its agent stopping at the step `hold` ("": nowhere)."""
        env = {"RUNS": str(self.directory / "runs"), "GATE_PORT": str(self.gate.port), "HOLD": hold}
        profile = {"command": [sys.executable, str(self.directory / "agent.py")], "env": env, "kill_grace_secs": 2}
        (self.directory / "profiles" / "agent.yaml").write_text(yaml.safe_dump(profile))

    def runs(self) -> list[str]:
        path = self.directory / "runs"
        return path.read_text().splitlines() if path.exists() else []

    def sent(self, text: str) -> list[str]:
        return [message.text for message in self.fake.sent_to(ALICE) if message.text == text]

    def acknowledged(self, update_id: int) -> bool:
        """Whether a getUpdates confirming `update_id` (its offset past it) arrived."""
        return any(int(call.params.get("offset", 0)) > update_id for call in self.fake.calls_of("getUpdates"))


async def arrives_within(seconds: float, fake: FakeBotApi, condition: Callable[[], bool]) -> bool:
    with trio.move_on_after(seconds):
        while not condition():
            await fake.wait_until(condition, within=seconds + 1)
        return True
    return False


# ---------------------------------------------------------------------------- the steps: get there, then SIGKILL


async def fetched_not_stored(bot: Bot) -> str:
    """(1) The bot fetched the update, and cannot store it: the test holds the chat store's write lock."""
    await bot.fake.wait_until(lambda: bot.fake.calls_of("getUpdates"), WITHIN)  # up, and polling
    store = sqlite3.connect(bot.directory / "bot.sqlite3.chat", isolation_level=None)
    try:
        store.execute("BEGIN IMMEDIATE")
        update_id = bot.fake.user_says(ALICE, ALICE, "hello")["update_id"]
        await bot.fake.wait_until(lambda: update_id in bot.fake.handed_out, WITHIN)
        assert not await arrives_within(0.5, bot.fake, lambda: bot.acknowledged(update_id)), (
            "the update was acknowledged to Telegram before it was stored"
        )
        return "hello"
    finally:
        store.close()  # after the SIGKILL: the caller kills while this lock is held


async def stored_not_acknowledged(bot: Bot) -> str:
    """(2) Stored, its turn started, and the getUpdates that would confirm it held before it takes effect."""
    update_id = bot.fake.user_says(ALICE, ALICE, "hello")["update_id"]
    held = bot.hold("getUpdates", lambda params: int(params.get("offset", 0)) > update_id)
    await wait_held(held)
    await bot.gate.wait_for("start")
    return "hello"


async def acknowledged_turn_running(bot: Bot) -> str:
    """(3) Confirmed to Telegram, the agent running."""
    update_id = bot.fake.user_says(ALICE, ALICE, "hello")["update_id"]
    await bot.gate.wait_for("start")
    await bot.fake.wait_until(lambda: bot.acknowledged(update_id), WITHIN)
    return "hello"


async def answered_not_sent(bot: Bot) -> str:
    """(4) The agent done, its reply stored; the final sendMessage held before it takes effect."""
    held = bot.hold("sendMessage", lambda params: params.get("text") == FINAL)
    bot.fake.user_says(ALICE, ALICE, "hello")
    await wait_held(held)
    return "hello"


async def preview_sent(bot: Bot) -> str:
    """(5) The preview sent (and edited: the bot knows it sent it), the agent still working on its final reply."""
    bot.fake.user_says(ALICE, ALICE, "hello")
    await bot.gate.wait_for("partial")
    await bot.fake.wait_until(lambda: bot.sent(PREVIEW), WITHIN)
    await bot.gate.go_on("partial")
    await bot.gate.wait_for("edited")
    await bot.fake.wait_until(lambda: bot.fake.calls_of("editMessageText"), WITHIN)
    return "hello"


async def sent_not_marked(bot: Bot) -> str:
    """(6) Telegram took the final reply; its answer (and so the mark "delivered") never comes back."""
    held = bot.hold("sendMessage", lambda params: params.get("text") == FINAL, after_effect=True)
    bot.fake.user_says(ALICE, ALICE, "hello")
    await wait_held(held)
    return "hello"


async def text_sent_file_not(bot: Bot) -> str:
    """(7) A reply with a file: the text sent, the sendDocument held before it takes effect."""
    held = bot.hold("sendDocument")
    bot.fake.user_says(ALICE, ALICE, "file please")
    await wait_held(held)
    return "file please"


async def wait_held(held: Held) -> None:
    with trio.move_on_after(WITHIN):
        await held.arrived.wait()
    assert held.arrived.is_set(), f"the bot never made the {held.method} call the test holds"


@dataclass(frozen=True)
class Step:
    reach: Callable[[Bot], Awaitable[str]]  # returns the message sent
    hold: str = ""  # where the agent stops in the run that is killed
    runs: int = 1  # how often the agent starts, the killed run included
    replies: int = 1  # how often the final reply is in the chat
    files: int = 0  # documents Telegram took
    handed_out: int = 1  # how often Telegram handed the update out: once stored, the restart resumes past it


STEPS = {
    "1-fetched-not-stored": Step(fetched_not_stored, handed_out=2),
    "2-stored-not-acknowledged": Step(stored_not_acknowledged, hold="start", runs=2),
    "3-acknowledged-turn-running": Step(acknowledged_turn_running, hold="start", runs=2),
    "4-answered-not-sent": Step(answered_not_sent),
    "5-preview-sent-final-not": Step(preview_sent, hold="partial edited", runs=2),
    # docs/chat.md "Durability": a crash after the platform took a part of a reply and before the store records it
    # sends that part again at the next start (the Bot API has no idempotency key).
    "6-final-sent-not-marked-delivered": Step(sent_not_marked, replies=2),
    "7-text-sent-file-not": Step(text_sent_file_not, files=1),
}


@pytest.mark.parametrize("name", list(STEPS))
async def test_kill_9_of_connect_at_each_step_then_a_restart_answers_each_message_once(
    tmp_path: Path, name: str
) -> None:
    step = STEPS[name]
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "profiles").mkdir()
    gate = Gate()
    async with running_fake_bot_api(TELEGRAM_TOKEN, limits=FloodLimits(per_chat_interval=0.0)) as fake:
        async with trio.open_nursery() as nursery:
            await nursery.start(gate.serve)
            bot = Bot(tmp_path, fake, gate)
            config = {"token": "${TELEGRAM_BOT_TOKEN}", "api_url": fake.api_url, "profile": "agent", "pace": UNPACED}
            (tmp_path / "bot.yaml").write_text(yaml.safe_dump({"telegram": config | {"allow_users": [ALICE]}}))
            bot.configure(step.hold)
            async with connect_running(bot.directory, TELEGRAM_SECRETS) as process:
                with trio.fail_after(WITHIN):
                    text = await step.reach(bot)
                process.kill()
            for held in bot.holds:
                held.release.set()  # its connection is dropped: the bot that made the call is gone
            await restart_and_check(bot, step, text)
            nursery.cancel_scope.cancel()


async def restart_and_check(bot: Bot, step: Step, text: str) -> None:
    fake = bot.fake
    final = f"echo: {text}"
    bot.configure("")
    async with connect_running(bot.directory, TELEGRAM_SECRETS) as process:
        await fake.wait_until(lambda: bot.sent(final), WITHIN)
        fake.user_says(ALICE, ALICE, "after")  # a later message, answered after whatever the restart picked up
        await fake.wait_until(lambda: bot.sent("echo: after"), WITHIN)
        await stop_connect(process, WITHIN)
    shown = [message.text for message in fake.visible(ALICE) if message.document is None]
    assert shown == [final] * step.replies + ["echo: after"], "each reply once, and no preview left behind"
    assert bot.runs() == [text] * step.runs + ["after"]
    assert fake.handed_out.count(min(fake.handed_out)) == step.handed_out, "the message's update, handed out"
    # docs/chat.md "Durability": the agent's files are kept beside the store until sent; a restart sends the rest.
    documents = [call for call in fake.calls_of("sendDocument") if call.status == 200]
    assert len(documents) == step.files


# ---------------------------------------------------------------------------- Matrix, against a real Synapse
# The steps reached through the agent alone (no homeserver call can be held without a proxy in front of Synapse):
# the turn running after its event was stored and the sync token moved on (3), the preview sent and edited (5).

MATRIX_STEPS = {
    "3-acknowledged-turn-running": Step(acknowledged_turn_running, hold="start", runs=2),
    "5-preview-sent-final-not": Step(preview_sent, hold="partial edited", runs=2),
}


def shown_in(events: list[dict[str, Any]]) -> list[str]:
    """The bot's messages as the room shows them: edits folded away, redacted ones gone."""
    return [
        event["content"]["body"]
        for event in events
        if "body" in event["content"] and event["content"].get("m.relates_to", {}).get("rel_type") != "m.replace"
    ]


async def room_until(alice: Person, room: str, sender: str, check: Callable[[list[dict[str, Any]]], bool]) -> None:
    """Wait (alice's /sync long-polls) until `check` holds of the room's messages from `sender`."""
    since = (await alice.call("GET", f"{CLIENT}/sync", params={"timeout": 0}))["next_batch"]
    with trio.move_on_after(WITHIN):
        while not check(await alice.messages_from(room, sender)):
            since = (await alice.call("GET", f"{CLIENT}/sync", params={"since": since, "timeout": 1000}))["next_batch"]
        return
    raise AssertionError(f"the room did not show that within {WITHIN} s: {await alice.messages_from(room, sender)}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(MATRIX_STEPS))
async def test_kill_9_of_connect_in_a_matrix_room_then_a_restart_answers_each_message_once(
    synapse: SynapseServer, alice: Person, tmp_path: Path, name: str
) -> None:
    step = MATRIX_STEPS[name]
    bot_id = synapse.register(f"crash{uuid.uuid4().hex[:8]}", PASSWORD)
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "profiles").mkdir()
    config = {"homeserver": synapse.url, "user_id": bot_id, "password": "${MATRIX_PASSWORD}", "profile": "agent"}
    config["pace"] = UNPACED
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump({"matrix": config | {"allow_users": [alice.user_id]}}))
    secrets = {"MATRIX_PASSWORD": PASSWORD}
    gate = Gate()
    room = await alice.room_with(section(synapse, bot_id, password=PASSWORD))
    async with trio.open_nursery() as nursery:
        await nursery.start(gate.serve)
        bot = Bot(tmp_path, FakeBotApi(), gate)  # the fake stays idle: only the profile and the runs are used
        bot.configure(step.hold)
        async with connect_running(tmp_path, secrets):
            await joined_by_someone_else(alice, room, bot_id)
            await alice.say(room, "hello")
            await gate.wait_for("start" if step.hold == "start" else "partial")
            if step.hold != "start":
                await room_until(alice, room, bot_id, lambda events: PREVIEW in shown_in(events))
                await gate.go_on("partial")
                await gate.wait_for("edited")
                await room_until(alice, room, bot_id, lambda events: len(events) > len(shown_in(events)))
        bot.configure("")
        async with connect_running(tmp_path, secrets) as process:
            await room_until(alice, room, bot_id, lambda events: FINAL in shown_in(events))
            await alice.say(room, "after")
            await room_until(alice, room, bot_id, lambda events: "echo: after" in shown_in(events))
            await stop_connect(process, WITHIN)
        nursery.cancel_scope.cancel()
    assert shown_in(await alice.messages_from(room, bot_id)) == [FINAL, "echo: after"]
    assert bot.runs() == ["hello"] * step.runs + ["after"]
