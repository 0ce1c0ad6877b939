"""Re-capture this directory's transcripts: the pinned codex app-server driven by the codex-app-server dialect.

    AGENT_BRIDGE_TEST_CACHE=~/.cache/agent-bridge-tests .venv/bin/python tests/transcripts/codex-app-server/capture.py

Each scenario writes NAME.jsonl (codex's stdout, byte for byte) and NAME.script.json (what the bridge did, and
at which byte of that stdout: prompts, answers, a cancel, a steer), which tests/test_dialect_codex_app_server.py
replays through the pure dialect. Runs offline against tools/fakes/openai_responses.py.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE.parent.parent.parent / "tools")]  # the harness; the fake, the cache

from acp_harness import AcpProcess  # noqa: E402
from agents_cache import npm_binary  # noqa: E402
from fakes.openai_responses import OpenAIResponses, write_codex_home  # noqa: E402

from bridge.dialects.events import QuestionRequest, Ready, SessionGone, SteerOutcome, TurnEnd  # noqa: E402
from bridge.dialects.settings import CodexAppServerSettings  # noqa: E402
from bridge.permissions import Decision, PermissionRequest  # noqa: E402
from bridge.turn import Turn  # noqa: E402


class Recorder:
    def __init__(self, agent: AcpProcess) -> None:
        self.agent = agent
        self.script: list[dict[str, Any]] = []

    def note(self, action: dict[str, Any]) -> None:
        self.script.append({"at": len(self.agent.stdout), **action})

    async def prompt(self, text: str) -> None:
        self.note({"do": "prompt", "text": text})
        await self.agent.send(self.agent.dialect.prompt(Turn(text)))

    async def turn(self, text: str) -> list[Any]:
        await self.prompt(text)
        return await self.agent.until(TurnEnd)

    async def answer(self, allow: bool, always: bool = False) -> None:
        request = (await self.agent.until(PermissionRequest))[-1]
        self.note({"do": "answer", "allow": allow, "always": always})
        await self.agent.send(self.agent.dialect.answer(request, Decision(allow=allow, always=always)))

    async def answer_question(self, answers: dict[str, list[str]] | None) -> None:
        request = (await self.agent.until(QuestionRequest))[-1]
        self.note({"do": "answer_question", "answers": answers})
        labels = {key: tuple(value) for key, value in answers.items()} if answers is not None else None
        await self.agent.send(self.agent.dialect.answer_question(request, labels, "declined"))

    async def cancel(self) -> None:
        self.note({"do": "cancel"})
        await self.agent.send(self.agent.dialect.cancel())

    async def steer(self, text: str, steer_id: str) -> None:
        self.note({"do": "steer", "text": text, "steer_id": steer_id})
        await self.agent.send(self.agent.dialect.steer(Turn(text), steer_id))

    def save(self, name: str) -> None:
        (HERE / f"{name}.jsonl").write_bytes(bytes(self.agent.stdout))
        (HERE / f"{name}.script.json").write_text(json.dumps(self.script, indent=1) + "\n")


async def main() -> None:
    codex = str(npm_binary("codex"))
    with tempfile.TemporaryDirectory() as scratch, OpenAIResponses() as api:
        home = write_codex_home(Path(scratch) / "home" / ".codex", api.base_url)
        work = Path(scratch) / "ws"
        work.mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": str(home.parent), "CODEX_HOME": str(home)}
        settings = CodexAppServerSettings(sandbox="read-only")
        start: dict[str, Any] = {"cwd": str(work), "env": env, "protocol": "codex-app-server"}
        argv = [codex, "app-server"]

        async with AcpProcess.start(argv, settings=settings, **start) as agent:
            rec = Recorder(agent)
            [ready] = await agent.until(Ready)
            thread = ready.session_id
            await rec.turn("say Hello from the fake model.")
            await rec.turn("think about life")
            await rec.turn("run echo hi")
            await rec.prompt(f"escalate touch {work}/accepted")
            await rec.answer(True)
            await agent.until(TurnEnd)
            await rec.prompt(f"escalate touch {work}/declined")
            await rec.answer(False)
            await agent.until(TurnEnd)
            await rec.prompt(f"escalate touch {work}/always")
            await rec.answer(True, always=True)
            await agent.until(TurnEnd)
            await rec.turn(f"escalate touch {work}/always")  # not asked again
            await rec.prompt("patch notes.txt hello from the patch")
            await rec.answer(True)
            await agent.until(TurnEnd)
            await rec.prompt(f"escalate touch {work}/cancelled")
            await agent.until(PermissionRequest)
            await rec.cancel()
            await agent.until(TurnEnd)
            await rec.prompt(f"escalate touch {work}/steered")
            await agent.until(PermissionRequest)
            await rec.steer("say steered", "steer-1")
            rec.note({"do": "answer", "allow": True, "always": False})
            request = [event for event in agent.events if isinstance(event, PermissionRequest)][-1]
            await agent.send(agent.dialect.answer(request, Decision(allow=True)))
            await agent.until(TurnEnd)
            await rec.turn("fail 401 bad key")
            await rec.turn("say after failure")
            rec.save("new-thread")

        async with AcpProcess.start(argv, settings=settings, session_id=thread, **start) as agent:
            rec = Recorder(agent)
            await agent.until(Ready)
            await rec.turn("say again")
            rec.save("resume")

        unknown = "01a2177e-0000-7000-8000-000000000000"
        async with AcpProcess.start(argv, settings=settings, session_id=unknown, **start) as agent:
            await agent.until(SessionGone)
            Recorder(agent).save("resume-unknown")

        plan = CodexAppServerSettings(sandbox="read-only", plan_mode=True)
        async with AcpProcess.start(argv, settings=plan, **start) as agent:
            rec = Recorder(agent)
            await agent.until(Ready)
            await rec.prompt("ask color Which color?|Red|Blue")
            await rec.answer_question({"color": ["Blue"]})
            await agent.until(TurnEnd)
            await rec.prompt("ask size Which size?|S|L")
            await rec.answer_question(None)
            await agent.until(TurnEnd)
            rec.save("plan-mode")
        assert not [event for event in agent.events if isinstance(event, SteerOutcome) and not event.folded]


if __name__ == "__main__":
    trio.run(main)
