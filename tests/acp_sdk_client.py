"""The official ACP Python SDK as the client of `agent-bridge acp`, for tests/test_acp_door.py. Runs under asyncio.

    python acp_sdk_client.py SCENARIO ARG... -- AGENT_COMMAND...
    python acp_sdk_client.py --serve

With --serve it runs one scenario per JSON line on stdin, {"scenario", "args", "command", "cwd"}, each with its own
agent process, client state and 20 s (under pytest's timeout), and ends each with {"done": true} (or {"crashed":
traceback}): the tests keep one such client for the module, so the SDK (a second of CPU to import) loads once.

Prints what the client saw as JSON lines on stdout: {"session": id}, {"chunk": text}, {"tool": update kind},
{"permission": [option kinds], "options": [their ids]}, {"link": uri, "name", "text"}, then {"stop": reason} or {"error": message}. Scenarios:

    prompt TEXT              a new session, one prompt
    ask TEXT OPTION_ID       a new session, one prompt; a permission request is answered with OPTION_ID
    cancel TEXT              a new session, one prompt, cancelled once its first chunk came
    load SESSION_ID TEXT     load the session, then one prompt in it
    image PNG_PATH TEXT      a new session, one prompt: TEXT and the PNG as an image block
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import traceback
from typing import Any

from acp import image_block, spawn_agent_process, text_block
from acp.interfaces import Client
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse


def say(**record: Any) -> None:
    print(json.dumps(record), flush=True)


class Editor(Client):
    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.first_chunk = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        kind = update.session_update
        if kind == "agent_message_chunk":
            content = update.content
            if content.type == "text":
                say(chunk=content.text)
            elif content.type == "resource_link":
                with open(content.uri.removeprefix("file://"), encoding="utf-8") as file:  # while the turn's file waits
                    say(link=content.uri, name=content.name, text=file.read())
            self.first_chunk.set()
        elif kind in ("tool_call", "tool_call_update"):
            say(tool=kind, status=update.status)

    async def request_permission(self, options: Any, session_id: str, tool_call: Any, **kwargs: Any) -> Any:
        say(permission=[option.kind for option in options], options=[option.option_id for option in options])
        if not self.answer:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=self.answer))


async def main(scenario: str, args: list[str], command: list[str], cwd: str | None = None) -> None:
    editor = Editor(args[1] if scenario == "ask" else "")
    async with spawn_agent_process(editor, *command, cwd=cwd) as (conn, _process):
        await conn.initialize(protocol_version=1)
        if scenario == "load":
            session_id = args[0]
            await conn.load_session(cwd="/", session_id=session_id)
            text = args[1]
        else:
            session_id = (await conn.new_session(cwd="/")).session_id
            text = args[1] if scenario == "image" else args[0]
        say(session=session_id)
        blocks: list[Any] = [text_block(text)]
        if scenario == "image":
            with open(args[0], "rb") as file:
                blocks.append(image_block(base64.b64encode(file.read()).decode("ascii"), "image/png"))
        turn = asyncio.create_task(conn.prompt(session_id=session_id, prompt=blocks))
        if scenario == "cancel":
            await editor.first_chunk.wait()
            await conn.cancel(session_id=session_id)
        try:
            response = await turn
        except Exception as err:  # the SDK raises the JSON-RPC error of a failed turn
            say(error=str(err))
            return
        say(stop=response.stop_reason)


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        try:
            asyncio.run(
                asyncio.wait_for(main(request["scenario"], request["args"], request["command"], request["cwd"]), 20)
            )
        except Exception:  # the test shows it; the next scenario still runs
            say(crashed=traceback.format_exc())
        else:
            say(done=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        split = sys.argv.index("--")
        asyncio.run(asyncio.wait_for(main(sys.argv[1], sys.argv[2:split], sys.argv[split + 1 :]), 30))
