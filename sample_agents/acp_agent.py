"""An ACP agent written with the official Python SDK (`agent-client-protocol`), for the tests of `protocol: acp`.

    python acp_agent.py [--load] [--resume] [--images] [--store DIR]

It keeps one conversation per session, on disk under `--store` (default: a
`.acp-sessions` directory in its working directory), so a new process can
pick a session up: `--load` advertises `loadSession` (the history is replayed
as `session/update`s before the load's response, as the spec says), `--resume`
advertises `sessionCapabilities.resume` (no replay). Without either, a stored
session cannot be reopened. `--images` advertises `promptCapabilities.image`:
the client may then send images as `image` blocks.

What it does with a prompt is chosen by its first word, like the fake model
servers of the tests:

    work TEXT        thinks, shows a plan, runs a (pretend) tool, then answers "did: TEXT", streamed
    ask CMD          asks permission to run CMD (kind execute, tool Bash); answers with the option chosen
    ask2 CMD         asks twice at once (CMD, then CMD again) and answers with both choices
    history          answers with the user messages of this session so far, joined by " | "
    mcp              answers with the names of the MCP servers the session was given, joined by ","
    read PATH        reads PATH through the client (fs/read_text_file) and answers with its text
    write PATH TEXT  writes TEXT to PATH through the client (fs/write_text_file), answers "wrote PATH"
    try-read PATH, try-write PATH TEXT   the same, but a refusal is the answer: "refused: " and the client's error
    read-many N PATH        reads PATH N times (a few requests at a time); answers, as JSON, how many times each
                            text came back ("texts") and how many reads were refused ("refused")
    write-many N PATH TEXT  writes TEXT to PATH N times; answers {"wrote": …, "refused": …} as JSON
    terminal         asks the client for a terminal (which the bridge never grants): answers with the error
    crash            streams a word, then exits at once with status 3, mid-turn
    hang             streams a word, then waits until the turn is cancelled (stop reason cancelled)
    refuse | max_tokens | max_turn_requests   streams a word, then ends with that stop reason
    fail TEXT        fails the turn with a JSON-RPC error whose message is TEXT
    slow N TEXT      waits N seconds, then answers "echo: TEXT"
    files NAME:TEXT ...   writes each TEXT to a file NAME in the session's outbox ($AGENT_OUTBOX); answers
                     "left NAME, NAME in OUTBOX"
    texts            answers with the prompt's text blocks, all of them, as a JSON list
    blocks           answers with the prompt's blocks other than text, one per line: "image MIME N bytes URI"
                     (N: the decoded base64 data) or "link URI MIME SIZE"
    anything else    answers "echo: PROMPT", streamed a few characters per chunk
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from acp import (
    Agent,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    RequestError,
    plan_entry,
    run_agent,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message,
    update_agent_thought,
    update_plan,
    update_tool_call,
    update_user_message,
)
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    ClientCapabilities,
    PermissionOption,
    PromptCapabilities,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionResumeCapabilities,
    ToolCallUpdate,
)

CHUNK = 4  # characters per streamed chunk
WINDOW = 16  # file requests in flight at once, for read-many and write-many


class SampleAgent(Agent):
    def __init__(self, store: Path, *, load: bool, resume: bool, images: bool = False) -> None:
        self.store = store
        self.load = load
        self.resume = resume
        self.images = images
        self.client_capabilities: ClientCapabilities | None = None
        self.cancelled: dict[str, asyncio.Event] = {}
        self.conn: Client

    def on_connect(self, conn: Client) -> None:
        self.conn = conn

    # ------------------------------------------------------------------ sessions

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Any = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        self.client_capabilities = client_capabilities
        capabilities = AgentCapabilities(
            load_session=self.load, prompt_capabilities=PromptCapabilities(image=self.images)
        )
        if self.resume:
            capabilities.session_capabilities = SessionCapabilities(resume=SessionResumeCapabilities())
        return InitializeResponse(protocol_version=1, agent_capabilities=capabilities)

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        session_id = f"sess-{uuid.uuid4().hex}"
        self._save(session_id, {"cwd": cwd, "mcp_servers": _names(mcp_servers), "turns": []})
        return NewSessionResponse(session_id=session_id)

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, **kwargs: Any
    ) -> LoadSessionResponse | None:
        if not self.load:
            raise RequestError.method_not_found("session/load")
        session = self._open(session_id)
        for user, agent in session["turns"]:  # the whole conversation again, before the response
            await self.conn.session_update(session_id, update_user_message(text_block(user)))
            await self.conn.session_update(session_id, update_agent_message(text_block(agent)))
        return LoadSessionResponse()

    async def resume_session(
        self, session_id: str, cwd: str, mcp_servers: Any = None, **kwargs: Any
    ) -> ResumeSessionResponse:
        if not self.resume:
            raise RequestError.method_not_found("session/resume")
        self._open(session_id)
        return ResumeSessionResponse()

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        event = self.cancelled.get(session_id)
        if event is not None:
            event.set()

    # ------------------------------------------------------------------ turns

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        session = self._open(session_id)
        texts = [block.text for block in prompt if getattr(block, "type", "") == "text"]
        text = texts[0] if texts else ""  # the user's message; a later text block may name the outbox
        links = [block.uri for block in prompt if getattr(block, "type", "") == "resource_link"]
        cancelled = self.cancelled[session_id] = asyncio.Event()
        word, _, argument = text.strip().partition(" ")
        reply = ""
        stop = "end_turn"
        if word == "work":
            await self._work(session_id, argument)
            reply = f"did: {argument}"
        elif word == "ask":
            reply = await self._ask(session_id, argument, "call-1", cancelled)
        elif word == "ask2":
            first, second = await asyncio.gather(
                self._ask(session_id, argument, "call-1", cancelled),
                self._ask(session_id, argument, "call-2", cancelled),
            )
            reply = f"{first}; {second}"
        elif word == "history":
            reply = " | ".join(user for user, _ in session["turns"]) or "(no history)"
        elif word == "mcp":
            reply = ",".join(session["mcp_servers"]) or "(none)"
        elif word in ("read", "write"):
            reply = await self._file(session_id, word, argument)
        elif word in ("try-read", "try-write"):
            try:
                reply = await self._file(session_id, word.removeprefix("try-"), argument)
            except RequestError as err:
                reply = f"refused: {err}"
        elif word in ("read-many", "write-many"):
            count, _, rest = argument.partition(" ")
            outcomes = await _many(int(count), lambda: self._file(session_id, word.removesuffix("-many"), rest))
            refused = outcomes.pop(None, 0)
            reply = json.dumps(
                {"texts": outcomes, "refused": refused}
                if word == "read-many"
                else {"wrote": sum(outcomes.values()), "refused": refused}
            )
        elif word == "terminal":
            try:
                await self.conn.create_terminal(command="true", session_id=session_id)
                reply = "got a terminal"
            except RequestError as err:
                reply = f"no terminal: {err.code}"
        elif word == "crash":
            await self._say(session_id, "partial ")
            sys.stdout.flush()
            os._exit(3)
        elif word == "hang":
            await self._say(session_id, "waiting ")
            await cancelled.wait()
            return PromptResponse(stop_reason="cancelled")
        elif word in ("refuse", "max_tokens", "max_turn_requests"):
            await self._say(session_id, "partial ")
            return PromptResponse(stop_reason="refusal" if word == "refuse" else word)
        elif word == "fail":
            raise RequestError(-32603, argument or "failed")
        elif word == "blocks":
            reply = "\n".join(_described(block) for block in prompt if getattr(block, "type", "") != "text")
        elif word == "files":
            reply = _leave_files(argument)
        elif word == "texts":
            reply = json.dumps(texts)
        elif word == "slow":
            seconds, _, rest = argument.partition(" ")
            await asyncio.sleep(float(seconds))
            reply = f"echo: {rest}"
        else:
            reply = f"echo: {text}" + "".join(f" [{link}]" for link in links)
        if cancelled.is_set():
            return PromptResponse(stop_reason="cancelled")
        if reply:
            for start in range(0, len(reply), CHUNK):
                await self._say(session_id, reply[start : start + CHUNK])
        session["turns"].append([text, reply])
        self._save(session_id, session)
        return PromptResponse(stop_reason=stop)

    async def _file(self, session_id: str, operation: str, argument: str) -> str:
        if operation == "read":
            return (await self.conn.read_text_file(path=argument, session_id=session_id)).content
        path, _, content = argument.partition(" ")
        await self.conn.write_text_file(path=path, content=content, session_id=session_id)
        return f"wrote {path}"

    async def _work(self, session_id: str, argument: str) -> None:
        await self.conn.session_update(session_id, update_agent_thought(text_block(f"Thinking about {argument}")))
        await self.conn.session_update(
            session_id,
            update_plan(
                [
                    plan_entry("Look around", priority="high", status="in_progress"),
                    plan_entry("Answer", priority="medium", status="pending"),
                ]
            ),
        )
        await self.conn.session_update(
            session_id,
            start_tool_call("tool-1", "ls -la", kind="execute", status="pending", raw_input={"command": "ls -la"}),
        )
        await self.conn.session_update(session_id, update_tool_call("tool-1", status="in_progress"))
        await self.conn.session_update(
            session_id, update_tool_call("tool-1", status="completed", content=[tool_content(text_block("total 0"))])
        )

    async def _ask(self, session_id: str, command: str, call_id: str, cancelled: asyncio.Event) -> str:
        tool_call = ToolCallUpdate(
            tool_call_id=call_id,
            title=command,
            kind="execute",
            status="pending",
            raw_input={"command": command},
            field_meta={"sample": {"toolName": "Bash"}},
        )
        await self.conn.session_update(session_id, start_tool_call(call_id, command, kind="execute", status="pending"))
        options = [
            PermissionOption(option_id=f"{kind}-id", name=kind.replace("_", " "), kind=kind)
            for kind in ("allow_once", "allow_always", "reject_once", "reject_always")
        ]
        response = await self.conn.request_permission(session_id=session_id, tool_call=tool_call, options=options)
        outcome = response.outcome
        if getattr(outcome, "outcome", "") == "cancelled":
            return "cancelled"
        chosen = getattr(outcome, "option_id", "")
        allowed = chosen.startswith("allow")
        await self.conn.session_update(
            session_id,
            update_tool_call(
                call_id,
                status="completed" if allowed else "failed",
                content=[tool_content(text_block("ran" if allowed else "refused"))],
            ),
        )
        return f"{'ran' if allowed else 'did not run'} {command} ({chosen})"

    async def _say(self, session_id: str, text: str) -> None:
        await self.conn.session_update(session_id, update_agent_message(text_block(text)))

    # ------------------------------------------------------------------ the store

    def _path(self, session_id: str) -> Path:
        if not session_id.startswith("sess-") or "/" in session_id:
            raise RequestError.invalid_params({"sessionId": "no such session"})
        return self.store / f"{session_id}.json"

    def _open(self, session_id: str) -> dict[str, Any]:
        try:
            return json.loads(self._path(session_id).read_text())
        except FileNotFoundError:
            raise RequestError.resource_not_found(session_id) from None

    def _save(self, session_id: str, session: dict[str, Any]) -> None:
        self.store.mkdir(parents=True, exist_ok=True)
        path = self._path(session_id)
        path.with_suffix(".tmp").write_text(json.dumps(session))
        path.with_suffix(".tmp").replace(path)


def _described(block: Any) -> str:
    if block.type == "image":
        return f"image {block.mime_type} {len(base64.b64decode(block.data, validate=True))} bytes {block.uri}"
    if block.type == "resource_link":
        return f"link {block.uri} {block.mime_type} {block.size}"
    return block.type


def _leave_files(argument: str) -> str:
    outbox = os.environ.get("AGENT_OUTBOX", "")
    if not outbox:
        return "no AGENT_OUTBOX"
    names = []
    for pair in argument.split():
        name, _, content = pair.partition(":")
        Path(outbox, name).write_text(content)
        names.append(name)
    return f"left {', '.join(names)} in {outbox}"


async def _many(count: int, request: Callable[[], Awaitable[str]]) -> Counter[str | None]:
    """`request` made `count` times, `WINDOW` at a time: how many times each answer came back (None: refused)."""
    outcomes: Counter[str | None] = Counter()

    async def one() -> None:
        try:
            outcomes[await request()] += 1
        except RequestError:
            outcomes[None] += 1

    for start in range(0, count, WINDOW):
        await asyncio.gather(*(one() for _ in range(min(WINDOW, count - start))))
    return outcomes


def _names(servers: Any) -> list[str]:
    return [getattr(server, "name", "") for server in servers or ()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load", action="store_true")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--images", action="store_true")
    parser.add_argument("--store", type=Path, default=Path(".acp-sessions"))
    options = parser.parse_args()
    agent = SampleAgent(options.store.absolute(), load=options.load, resume=options.resume, images=options.images)
    # The SDK still files session/resume under its unstable methods: served only when asked for.
    asyncio.run(run_agent(agent, use_unstable_protocol=options.resume))


if __name__ == "__main__":
    main()
