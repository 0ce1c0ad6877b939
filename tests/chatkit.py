"""A chat platform in memory, for the delivery kit's tests: scripted updates in, everything the bot does recorded.

`FakePlatform` implements `bridge.chat.platform.Platform` as a platform server would behave: updates are
numbered, `poll` hands out those at or after the acknowledged position (so a bot that restarts before it
acknowledged gets them again), and what the bot sends, edits, deletes and answers is recorded in `records`.
With a `directory`, the platform's side survives the bot's process (updates, the acknowledged position and
the records are files), which the crash tests use: they run the bot with `python tests/chatkit.py DIR …` and
kill it. Faults: `crash_on` kills the bot's process (SIGKILL, once) at a named step; `refuse_sends`,
`refuse_presses` and `unavailable_polls` make the next calls fail as the platform would.

Waiting is on events with a deadline (`wait_for`), never on sleeps.

`connect_running` and `stop_connect` start and stop the real `agent-bridge connect` for the tests that run it
against the fake Telegram Bot API or a real Synapse.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from bridge.chat.inbox import decode, encode
from bridge.chat.platform import Batch, ButtonPress, Choice, Delivery, Incoming, IncomingFile
from bridge.errors import PlatformRefused, PlatformUnavailable

DEADLINE = 15
AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
TELEGRAM_TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
"""A bot token of the real shape (the one docs/chat-telegram.md shows); no test may find it in any output."""
TELEGRAM_SECRETS = {"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN}
BOT_FILES = ("--profiles", "profiles", "--state", "bot.sqlite3")
"""Where `connect` finds its profiles and keeps its store, unless a test says otherwise (`--postgres`)."""

# A Claude Code stand-in speaking its stream-json control protocol (the `claude-sdk` dialect): each message asks
# before a tool — Bash, running the command given as its argument — or, for a message that mentions "question",
# asks AskUserQuestion (multi-select for "multi"); "withdraw" withdraws the request once the test opens the GATE
# FIFO. The reply says what was decided: `decided: {"behavior": …, "updatedInput": …, "updatedPermissions": …}`
# (sorted keys; the permissions are the session rule of "Allow for this session").
ASKING_AGENT = """\
import json, os, sys
BASH_COMMAND = sys.argv[1]
def say(**message):
    sys.stdout.write(json.dumps(message) + "\\n")
    sys.stdout.flush()
def question(multi, two):
    colour = {"question": "Which colour?", "header": "Colour", "multiSelect": multi,
              "options": [{"label": "Red"}, {"label": "Blue"}]}
    size = {"question": "Which size?", "header": "Size", "multiSelect": False,
            "options": [{"label": "Small"}, {"label": "Large"}]}
    return {"questions": [colour, size] if two else [colour]}
for line in sys.stdin:
    message = json.loads(line)
    if message["type"] == "control_request" and message["request"]["subtype"] == "initialize":
        say(type="control_response", response={"subtype": "success", "request_id": message["request_id"],
                                               "response": {}})
    elif message["type"] == "user":
        text = json.dumps(message["message"])
        say(type="system", subtype="init", session_id="s-1")
        if "question" in text:
            tool, ask = "AskUserQuestion", question("multi" in text, "two questions" in text)
        else:
            tool, ask = "Bash", {"command": BASH_COMMAND}
        say(type="control_request", request_id="r1", request={"subtype": "can_use_tool", "tool_name": tool,
                                                              "input": ask})
        if "withdraw" in text:
            open(os.environ["GATE"]).read()  # the prompt is shown
            say(type="control_cancel_request", request_id="r1")
            say(type="result", subtype="success", is_error=False, result="went on without it", session_id="s-1")
    elif message["type"] == "control_response" and message["response"]["request_id"] == "r1":
        answer = message["response"]["response"]
        say(type="result", subtype="success", is_error=False, session_id="s-1",
            result="decided: " + json.dumps({k: answer[k] for k in ("behavior", "updatedInput", "updatedPermissions")
                                             if k in answer},
                                             sort_keys=True))
"""


def asking_profile(directory: Path, bash_command: str = "rm -rf build", **more: Any) -> dict[str, Any]:
    """Writes ASKING_AGENT into `directory` and returns a `claude-sdk` profile that runs it, Bash asked of the
    user; `more` adds to the profile (env, cwd, …)."""
    script = directory / "asker.py"
    script.write_text(ASKING_AGENT)
    return {
        "command": [sys.executable, str(script), bash_command],
        "protocol": "claude-sdk",
        "permissions": {"ask": ["Bash"], "timeout_secs": 60},
        **more,
    }


def connect_command(directory: Path, secrets: dict[str, str], *args: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of `agent-bridge connect bot.yaml` in `directory`: `args` (or `BOT_FILES`) after
    it, `secrets` (what the config's `${…}` name) and a state directory of its own in its environment."""
    argv = [AGENT_BRIDGE, "connect", "bot.yaml", *(args or BOT_FILES)]
    return argv, {**os.environ, **secrets, "XDG_STATE_HOME": str(directory / "state")}


@asynccontextmanager
async def connect_running(
    directory: Path, secrets: dict[str, str], *args: str, **options: Any
) -> AsyncIterator[trio.Process]:
    """`agent-bridge connect` (`connect_command`) running in `directory`, SIGKILLed at the end unless it ended
    already (`stop_connect`); `options` go to `trio.lowlevel.open_process` (stderr=subprocess.PIPE…)."""
    argv, env = connect_command(directory, secrets, *args)
    process = await trio.lowlevel.open_process(argv, cwd=directory, env=env, **options)
    try:
        yield process
    finally:
        process.kill()
        await process.wait()


async def stop_connect(process: trio.Process, within: float) -> None:
    """SIGTERM, as systemd stops it: `connect` must end with 0 within `within` seconds."""
    process.send_signal(signal.SIGTERM)
    with trio.fail_after(within):
        assert await process.wait() == 0, f"connect ended with {process.returncode} on SIGTERM, not 0"


@dataclass
class Record:
    """One thing the bot did: `op` is send, refused (a send the platform refused), edit, delete, press, typing, file, start, ack or commands."""

    op: str
    chat: str = ""
    text: str = ""
    key: str = ""
    choices: list[list[str]] = field(default_factory=list)  # [label, data]
    extra: dict[str, Any] = field(default_factory=dict)


class FakePlatform:
    name = "fake"
    rate_limited = 0

    def __init__(self, directory: Path | None = None, *, crash_on: str = "") -> None:
        self.directory = directory
        self.crash_on = crash_on  # "ack", "acked", "typing", "send:<text>" or "file:<name>": SIGKILL there, once
        self.updates: list[Incoming | ButtonPress] = []
        self.records: list[Record] = []
        self.refuse_sends = 0
        self.unavailable_polls = 0  # the next polls fail as an unreachable platform
        self.refuse_presses = 0  # the next answer_press calls fail (Telegram: "query is too old")
        self.files: dict[str, bytes] = {}  # file_ref -> content, for download
        self.hold_prompts: trio.Event | None = None  # a send with choices is shown, its answer waits for this
        self.offset = 0
        self._handed = 0  # updates handed out since start (not yet acknowledged, perhaps)
        self._changed = trio.Event()
        self._keys = 0
        if directory is not None:
            self.updates = [decode(line) for line in self._read("updates.jsonl")]
            self._keys = len(self._read("records.jsonl"))

    # ------------------------------------------------------------------ the test's side

    def push(self, *items: Incoming | ButtonPress) -> None:
        self.updates.extend(items)
        if self.directory is not None:
            with open(self.directory / "updates.jsonl", "a") as file:
                file.writelines(encode(item) + "\n" for item in items)
        self._touch()

    def of(self, op: str) -> list[Record]:
        return [record for record in self.records if record.op == op]

    async def wait_for(self, what: str, check: Callable[[], Any]) -> Any:
        """Wait until `check()` is truthy (re-checked at each record), at most `DEADLINE` seconds."""
        try:
            with trio.fail_after(DEADLINE):
                while not (value := check()):
                    await self._changed.wait()
                return value
        except trio.TooSlowError:
            raise AssertionError(f"not within {DEADLINE} s: {what}; the bot did: {self.records}") from None

    def sent_texts(self, chat: str | None = None) -> list[str]:
        return [record.text for record in self.of("send") if chat is None or record.chat == chat]

    def choice(self, label: str) -> tuple[str, str]:
        """(message key, data) of the last choice labelled `label` the bot offered."""
        for record in reversed(self.records):
            for shown, data in record.choices:
                if shown == label:
                    return record.key, data
        raise AssertionError(f"no choice {label!r} offered; the bot did: {self.records}")

    # ------------------------------------------------------------------ the Platform

    def follow_moved_chats(self, moved: dict[str, str], record: Callable[[str, str], None]) -> None:
        pass

    async def start(self, position: str | None) -> None:
        self._record(Record("start", text=position or ""))
        if position is not None:
            self.offset = int(position)
        elif self.directory is not None and (self.directory / "acked").exists():
            self.offset = int((self.directory / "acked").read_text())
        self._handed = self.offset

    async def poll(self) -> Batch:
        if self.unavailable_polls:
            self.unavailable_polls -= 1
            self._record(Record("unavailable"))
            raise PlatformUnavailable("connection refused")
        while self._handed >= len(self.updates):
            if self.directory is not None:  # another process may add updates: look again now and then
                with trio.move_on_after(0.05):
                    await self._changed.wait()
                self.updates = [decode(line) for line in self._read("updates.jsonl")]
            else:
                await self._changed.wait()
        items = tuple(self.updates[self._handed :])
        self._handed = len(self.updates)
        return Batch(items, str(self._handed))

    async def acknowledge(self, position: str) -> None:
        self._maybe_crash("ack")
        self.offset = int(position)
        if self.directory is not None:
            (self.directory / "acked").write_text(position)
        self._maybe_crash("acked")
        self._record(Record("ack", text=position))

    async def send_text(
        self,
        chat: str,
        thread: str,
        markdown: str,
        *,
        choices: tuple[Choice, ...] = (),
        reply_to: str = "",
        delivery: Delivery | None = None,
    ) -> list[str]:
        if delivery is not None and delivery.parts_sent:
            return []  # one part, taken before a restart
        self._maybe_crash(f"send:{markdown}")
        if self.refuse_sends:
            self.refuse_sends -= 1
            self._record(Record("refused", chat, markdown))
            raise PlatformRefused("Bad Request: chat not found")
        key = self._key()
        self._record(Record("send", chat, markdown, key, [[c.label, c.data] for c in choices]))
        if choices and self.hold_prompts is not None:
            await self.hold_prompts.wait()
        if delivery is not None and delivery.part_sent is not None:
            await delivery.part_sent(1)
        return [key]

    async def edit_text(self, chat: str, message_key: str, markdown: str, *, choices: tuple[Choice, ...] = ()) -> None:
        self._record(Record("edit", chat, markdown, message_key, [[c.label, c.data] for c in choices]))

    async def delete(self, chat: str, message_key: str) -> None:
        self._record(Record("delete", chat, key=message_key))

    async def answer_press(self, press: ButtonPress, text: str = "") -> None:
        if self.refuse_presses:
            self.refuse_presses -= 1
            raise PlatformRefused("Bad Request: query is too old and response timeout expired or query ID is invalid")
        self._record(Record("press", press.chat, text, press.message_key))

    async def typing(self, chat: str, thread: str) -> None:
        self._maybe_crash("typing")
        self._record(Record("typing", chat))

    async def download(self, file: IncomingFile, directory: str) -> str:
        path = os.path.join(directory, file.name)
        Path(path).write_bytes(self.files[file.file_ref])
        return path

    async def send_file(self, chat: str, thread: str, path: str, name: str, media_type: str) -> str:
        self._maybe_crash(f"file:{name}")
        key = self._key()
        content = Path(path).read_bytes()
        self._record(Record("file", chat, name, key, extra={"media_type": media_type, "content": content.decode()}))
        return key

    async def set_commands(self, commands: tuple[tuple[str, str], ...]) -> None:
        self._record(Record("commands", text=" ".join(name for name, _ in commands)))

    async def aclose(self) -> None:
        pass

    # ------------------------------------------------------------------ inside

    def _key(self) -> str:
        self._keys += 1
        return f"m{self._keys}-{os.getpid()}"

    def _record(self, record: Record) -> None:
        self.records.append(record)
        if self.directory is not None:
            with open(self.directory / "records.jsonl", "a") as file:
                file.write(json.dumps(asdict(record)) + "\n")
                file.flush()
                os.fsync(file.fileno())
        self._touch()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _maybe_crash(self, step: str) -> None:
        if not self.crash_on or not step.startswith(self.crash_on) or self.directory is None:
            return
        marker = self.directory / "crashed"
        if marker.exists():
            return
        marker.write_text(step)
        os.kill(os.getpid(), signal.SIGKILL)

    def _read(self, name: str) -> list[str]:
        assert self.directory is not None
        path = self.directory / name
        return path.read_text().splitlines() if path.exists() else []


def message(update_id: int | str, text: str, *, user: str = "7", chat: str = "c1", **more: Any) -> Incoming:
    return Incoming(str(update_id), chat, more.pop("thread", ""), user, more.pop("user_name", "Ann"), text, **more)


def press(update_id: int | str, key_and_data: tuple[str, str], *, user: str = "7", chat: str = "c1") -> ButtonPress:
    key, data = key_and_data
    return ButtonPress(str(update_id), chat, "", user, key, data, user_name="Ann")


def records_in(directory: Path) -> list[Record]:
    path = directory / "records.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [Record(**json.loads(line)) for line in lines]


async def _child(directory: Path, profiles: str, state: str, crash_on: str) -> None:
    """The bot in a process of its own, for the crash tests: runs until SIGTERM (or its crash)."""
    from bridge.chat.inbox import Inbox
    from bridge.chat.runtime import ChatBridge, ChatSettings
    from bridge.host.runtime import open_host

    platform = FakePlatform(directory, crash_on=crash_on)
    inbox = Inbox(state + ".chat")
    settings = ChatSettings(profile="agent", allow_users=frozenset({"7"}), typing_after_secs=0.0)  # crash_on="typing"
    async with open_host(profiles, state=state) as host, trio.open_nursery() as nursery:
        bridge = ChatBridge(host, platform, settings, inbox)

        async def stop_on_sigterm() -> None:
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                (directory / "ready").write_text(str(os.getpid()))
                async for _ in signals:
                    bridge.stop()
                    return

        nursery.start_soon(stop_on_sigterm)
        await bridge.run()
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(_child, Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
