"""`fake_server.py anthropic|openai`: one of the tests' fake model servers, in a process of its own.

Prints its base URL on a line, then serves until its stdin ends. In the measuring process, the server's thread would
hold the GIL while it streams (up to the 5 ms switch interval) just when the bridge wakes to read the CLI: the
delays measured would be the fake's. `anthropic` is the tests' `Conversation`, plus `count N`: the numbers 0 to
N-1 as N text deltas. `serving` starts one from Python.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parents[2] / "tools"  # the fake servers the tests use live there


@contextmanager
def serving(kind: str) -> Iterator[str]:
    """A fake server of `kind` in a child process, for the block; its base URL."""
    server = subprocess.Popen(
        [sys.executable, __file__, kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        yield server.stdout.readline().strip()
    finally:
        server.stdin.close()
        server.wait(timeout=10)


def main(kind: str) -> None:
    sys.path.insert(0, str(TOOLS))
    if kind == "openai":
        from fakes.openai_responses import OpenAIResponses

        with OpenAIResponses() as api:
            print(api.base_url, flush=True)
            sys.stdin.read()
        return
    from fake_anthropic import Conversation, message_stream, user_texts
    from fake_api import FakeApi

    conversation = Conversation()

    def answer(request: Any) -> Any:
        texts = user_texts(request) if request.body.get("stream") else []
        prompt = texts[-1] if texts else ""
        if prompt.startswith("count "):
            return message_stream([("text", [f"{index} " for index in range(int(prompt.split()[1]))])])
        return conversation(request)

    with FakeApi(answer) as api:
        print(api.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1])
