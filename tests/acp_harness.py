"""A small driver of a pure warm JSON-RPC dialect (`acp`, `codex-app-server`) with a real agent process.

No bridge engine: the test itself plays the engine, so what it proves is that
the dialect's bytes are real ACP to a real agent (the official SDK's, or
codex-acp), and that the agent's bytes become the events the dialect promises.

    async with AcpProcess.start(argv, cwd=…) as agent:
        ready = await agent.until(Ready)
        await agent.send(agent.dialect.prompt(Turn("hi")))
        events = await agent.until(TurnEnd)
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from bridge.dialects import DialectContext, dialect_class
from bridge.dialects.events import AgentInput, Event
from bridge.dialects.settings import AcpSettings

DEADLINE = 15  # seconds for any one step of a real agent; a hang fails, never waits for pytest's timeout


class AcpProcess:
    """One agent process and the dialect speaking to it; `AgentInput` is written as it comes."""

    def __init__(self, process: trio.Process, dialect: Any) -> None:
        self.process = process
        self.dialect = dialect
        self.events: list[Event] = []  # everything the dialect reported, in order (AgentInput included)
        self.stdout = bytearray()  # every byte the agent wrote
        self._unread: list[Event] = []  # reported, not yet returned by `until`
        self._taken: list[Event] = []  # returned by the `until` in progress
        self.eof = False

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        argv: Sequence[str],
        *,
        cwd: str,
        session_id: str = "",
        settings: Any = None,
        protocol: str = "acp",
        env: Mapping[str, str] | None = None,
        stderr: Any = None,
    ) -> AsyncIterator[AcpProcess]:
        default = AcpSettings() if protocol == "acp" else dialect_class(protocol).Settings()
        dialect = dialect_class(protocol)(DialectContext(settings=settings or default), session_id=session_id, cwd=cwd)
        process = await trio.lowlevel.open_process(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
        agent = cls(process, dialect)
        try:
            await agent.send(dialect.open())
            yield agent
        finally:
            with trio.CancelScope(shield=True):
                agent.kill()
                await process.wait()

    def kill(self) -> None:
        """SIGKILL the agent's whole process group (codex-acp's npm wrapper leaves its binary otherwise)."""
        try:
            os.killpg(self.process.pid, 9)
        except ProcessLookupError:
            pass

    async def send(self, data: bytes) -> None:
        if data:
            assert self.process.stdin is not None
            await self.process.stdin.send_all(data)

    async def close_stdin(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    async def until(self, kind: type, *, deadline: float = DEADLINE) -> list[Event]:
        """Events up to and including the first of type `kind` (an `AssertionError` at end of output)."""
        with trio.fail_after(deadline):
            while True:
                while self._unread:
                    event = self._unread.pop(0)
                    self._taken.append(event)
                    if isinstance(event, kind):
                        taken, self._taken = self._taken, []
                        return taken
                if self.eof:
                    raise AssertionError(f"the agent's output ended before a {kind.__name__}: {self._taken}")
                await self._read()

    async def until_output(self, needle: bytes, *, deadline: float = DEADLINE) -> None:
        """Read until the agent has written `needle`; what the dialect reported meanwhile waits for `until`."""
        with trio.fail_after(deadline):
            while needle not in self.stdout:
                if self.eof:
                    raise AssertionError(f"the agent's output ended before it wrote {needle!r}")
                await self._read()

    async def _read(self) -> None:
        assert self.process.stdout is not None
        data = await self.process.stdout.receive_some(65536)
        self.stdout += data
        if data:
            events = self.dialect.feed(data)
        else:
            self.eof = True
            events = self.dialect.close()
        for event in events:
            self.events.append(event)
            if isinstance(event, AgentInput):
                await self.send(event.data)
        self._unread.extend(event for event in events if not isinstance(event, AgentInput))
