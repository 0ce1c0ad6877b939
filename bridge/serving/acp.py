"""`agent-bridge acp`'s I/O: the editor's lines into `AcpAgentSide`, its actions onto a host, under trio.

One `AcpDoor` serves one editor over a pair of trio streams (stdin/stdout in
`serve_acp_stdio`). Every prompt runs as a task of the door's nursery through
`host.submit`, its events and result turned into messages by the protocol
object and written, whole and in order, by one writer (`serving.output`).
When the editor's stdin closes (or it stops reading), every prompt still
running is cancelled and the door returns once each has ended: no agent is
left behind. Files the agent leaves are offered as `resource_link`s to their
paths and deleted after `file_ttl` seconds, or when the door ends.
"""

from __future__ import annotations

import os
import secrets
import signal

import trio

from ..dialects import LineSplitter
from ..dialects.events import FileEvent
from ..dialects.jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, encode
from ..engine.loop import HostEvent
from ..errors import AnswerRefused, BridgeError
from ..host.interface import BaseHost
from ..log import get_logger
from ..serving.file_delivery import DEFAULT_FILE_TTL, FileDeliveries
from ..serving.output import Output, watch_for_hang_up
from ..turn import Turn
from .acp_protocol import AcpAgentSide, Action, Answer, CancelPrompt, Capabilities, Decide, Send, StartPrompt

READ_CHUNK = 64 * 1024
MAX_MESSAGE_BYTES = 32 * 1024 * 1024  # one JSON-RPC line: a prompt with its images, base64


def new_session_id() -> str:
    """An ACP session id: unguessable, for it is all a client needs to go on with a conversation."""
    return "acp-" + secrets.token_urlsafe(24)


class AcpDoor:
    """One editor's ACP connection to `host`, whose prompts all run with profile `profile`."""

    def __init__(
        self,
        host: BaseHost,
        profile: str,
        capabilities: Capabilities,
        input: trio.abc.ReceiveStream,
        output: trio.abc.SendStream,
        *,
        file_ttl: float = DEFAULT_FILE_TTL,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.host = host
        self._profile = profile
        self._side = AcpAgentSide(capabilities, new_session_id)
        self._input = input
        self.output: Output[bytes] = Output(output.send_all, encode, self._client_gone)
        self._file_ttl = file_ttl
        self._max_message_bytes = max_message_bytes
        self._turn_ids: dict[str, str] = {}  # session id → the host's id of its running prompt
        self._turns_started = 0
        self._stop_reading = trio.CancelScope()
        self._log = get_logger(component="acp")

    async def run(self) -> None:
        """Serve until the editor closes stdin (or `stop()`); returns once every prompt has ended."""
        async with trio.open_nursery() as system:
            await system.start(self.output.run)
            files = FileDeliveries(system, self._file_ttl)
            try:
                async with trio.open_nursery() as turns:
                    with self._stop_reading:
                        await self._read(files, turns)
                    self.cancel_all()  # the editor is gone: no agent runs on for nobody
                await self.output.close()
            finally:
                files.close()
            system.cancel_scope.cancel()

    def stop(self) -> None:
        """Stop reading and cancel every prompt (a signal, or the editor gone)."""
        self._stop_reading.cancel()
        self.cancel_all()

    def cancel_all(self) -> None:
        for turn_id in list(self._turn_ids.values()):
            self.host.cancel(turn_id)

    def _client_gone(self) -> None:
        self._log.warning("the editor stopped reading; cancelling every prompt")
        self.stop()

    async def _read(self, files: FileDeliveries, turns: trio.Nursery) -> None:
        lines = LineSplitter(self._max_message_bytes)
        while True:
            try:
                data = await self._input.receive_some(READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as err:
                self._log.warning("cannot read the editor's messages; stopping", error=str(err))
                data = b""
            batch = lines.feed(data) if data else lines.close()
            for index, line in enumerate(batch.text):
                if index in batch.cut:
                    too_long = f"a message is longer than {self._max_message_bytes} bytes; it was discarded"
                    await self.output.send(
                        {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": too_long}}
                    )
                else:
                    await self._act(self._side.receive(line), files, turns)
            if not data:
                return

    async def _act(self, actions: list[Action], files: FileDeliveries, turns: trio.Nursery) -> None:
        for action in actions:
            if type(action) is Send:
                await self.output.send(action.message)
            elif type(action) is StartPrompt:
                accepted = _Accepted()  # the next message (a cancel, say) finds the prompt in the host
                turns.start_soon(self._prompt, action.session_id, action.turn, files, turns, accepted)
                await accepted.event.wait()
            elif type(action) is CancelPrompt:
                if turn_id := self._turn_ids.get(action.session_id):
                    self.host.cancel(turn_id)
            elif type(action) is Decide:
                if turn_id := self._turn_ids.get(action.session_id):
                    self.host.decide(turn_id, action.request_id, action.decision)
            elif type(action) is Answer:
                self._answer(action)

    def _answer(self, action: Answer) -> None:
        if turn_id := self._turn_ids.get(action.session_id):
            try:
                self.host.answer(turn_id, action.request_id, action.answers)
            except AnswerRefused as err:  # the protocol only offers the question's own labels
                self._log.warning("an answer was refused", error=str(err))

    async def _prompt(
        self, session_id: str, turn: Turn, files: FileDeliveries, turns: trio.Nursery, accepted: _Accepted
    ) -> None:
        self._turns_started += 1
        turn_id = f"{session_id}:{self._turns_started}"
        self._turn_ids[session_id] = turn_id

        async def forward(event: HostEvent) -> None:
            uri = ""
            if type(event) is FileEvent:
                uri = "file://" + files.offer(turn_id, event, -1)["path"]  # never inline: an empty file too waits
            await self._act(self._side.event(session_id, event, uri), files, turns)

        try:
            result = await self.host.submit(
                self._profile, session_id, turn, on_event=forward, turn_id=turn_id, task_status=accepted
            )
        except BridgeError as err:
            await self._act(self._side.failed(session_id, INTERNAL_ERROR, str(err)), files, turns)
            return
        except Exception as err:  # a bug must not take the editor's other sessions down with it
            self._log.error("unexpected error running a prompt", error=repr(err))
            await self._act(self._side.failed(session_id, INTERNAL_ERROR, f"internal error: {err}"), files, turns)
            return
        finally:
            self._turn_ids.pop(session_id, None)
            accepted.event.set()
        await self._act(self._side.finished(session_id, result), files, turns)
        files.turn_over(result)


class _Accepted(trio.TaskStatus[str]):
    """The host took the prompt (or refused it): the door reads on."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def started(self, value: str | None = None) -> None:
        self.event.set()


async def serve_acp_stdio(
    host: BaseHost, profile: str, capabilities: Capabilities, *, file_ttl: float = DEFAULT_FILE_TTL
) -> int:
    """Serve one editor on this process's stdin/stdout until it closes stdin, or SIGTERM/SIGINT; the exit code.

    File descriptor 1 is pointed at stderr once the protocol has its own copy of it, so nothing but JSON-RPC
    (no log line, no agent's stray print) can reach the editor.
    """
    from ..confinement.orphans import sweep_orphans_on_sigchld

    protocol_out = os.dup(1)
    os.dup2(2, 1)
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(protocol_out)
    door = AcpDoor(host, profile, capabilities, stdin, stdout, file_ttl=file_ttl)
    async with stdin, stdout, trio.open_nursery() as nursery:
        await nursery.start(_stop_on_signals, door)
        await nursery.start(sweep_orphans_on_sigchld)
        nursery.start_soon(watch_for_hang_up, protocol_out, door.output)
        await door.run()
        nursery.cancel_scope.cancel()
    return 1 if door.output.broken else 0


async def _stop_on_signals(door: AcpDoor, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            get_logger(component="acp").info("signal received; stopping", signal=signal.Signals(signum).name)
            door.stop()


__all__ = ["MAX_MESSAGE_BYTES", "AcpDoor", "new_session_id", "serve_acp_stdio"]
