"""`make try-claude` / `make try-codex`: chat with the real Claude Code or Codex offline, in one command.

    python tools/try_cli.py claude|codex

It starts the fake model server the tests use on loopback (tools/fake_anthropic.py, tools/fakes/openai_responses.py),
writes the ready profile (profiles/clis/claude-sdk.yaml, codex-app-server.yaml) with the CLI `make test-agents`
cached and a home and working directory of its own, says what to type to see an approval and a question, and
runs `agent-bridge chat` with it. Nothing leaves this machine, and nothing of the user's (their login, config or
sessions) is read or written: all of it is removed when the chat ends. The fake model is scripted by the
message's first words; it understands no other language.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import yaml
from agents_cache import CACHE, npm_binary

REPO = Path(__file__).resolve().parent.parent
AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")

CLAUDE_WORDS = """\
Claude Code {version} against a fake Anthropic API on loopback (it answers the words below; nothing goes online).
Type, one at a time:
  run touch hello.txt   Claude wants to run a Bash command it does not allow by itself: the chat asks you
                        (y, a or n and Enter: allow once, always in this session, deny)
  ask colour            Claude asks you a question with options (Red, Blue): answer with a number
  anything else         answered "reply to <what you typed>"
/help lists the chat's commands; Ctrl-D leaves (and removes this try's files).
"""

CODEX_WORDS = """\
Codex {version} (codex app-server, in Plan mode) against a fake OpenAI API on loopback (it answers the words
below; nothing goes online). Type, one at a time:
  escalate touch hello.txt   codex wants to run a command outside its read-only sandbox: the chat asks you
                             (y, a or n and Enter: allow once, always in this session, decline)
  ask colour Which colour?|Red|Blue
                             codex asks you a question with options: answer with a number
  run ls                     a command its sandbox allows: run without asking
  anything else              answered "echo: <what you typed>"
/help lists the chat's commands; Ctrl-D leaves (and removes this try's files).
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cli", choices=["claude", "codex"])
    args = parser.parse_args()
    try:
        binary = npm_binary(args.cli)
    except AssertionError as err:
        print(f"try-{args.cli}: {err}", file=sys.stderr)
        return 2
    with _try_directory(args.cli) as root:
        if args.cli == "claude":
            return _try_claude(root, binary)
        return _try_codex(root, binary)


@contextlib.contextmanager
def _try_directory(cli: str) -> Iterator[Path]:
    # In the agents' cache, not /tmp: codex makes no helper for its own sandbox under the temporary directory.
    CACHE.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"try-{cli}-", dir=CACHE))
    try:
        (root / "work").mkdir()
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _try_claude(root: Path, binary: Path) -> int:
    from fake_anthropic import Conversation, write_claude_profile
    from fake_api import FakeApi

    conversation = Conversation()
    with FakeApi(conversation) as api:
        profile = write_claude_profile(root / "claude-sdk.yaml", api, root)
        try:
            return _chat(profile, root, CLAUDE_WORDS.format(version=_version(binary)))
        finally:
            conversation.release.set()


def _try_codex(root: Path, binary: Path) -> int:
    from fakes.openai_responses import OpenAIResponses, write_codex_home

    with OpenAIResponses() as api:
        home = write_codex_home(root / "home" / ".codex", api.base_url)
        profile = yaml.safe_load((REPO / "profiles" / "clis" / "codex-app-server.yaml").read_text())
        profile.update(
            command=[str(binary), "app-server"],
            cwd=str(root / "work"),
            env={"CODEX_HOME": str(home), "HOME": str(home.parent)},
        )
        profile["codex-app-server"] = {**profile["codex-app-server"], "plan_mode": True}
        path = root / "codex-app-server.yaml"
        path.write_text(yaml.safe_dump(profile, sort_keys=False))
        return _chat(path, root, CODEX_WORDS.format(version=_version(binary)))


def _chat(profile: Path, root: Path, words: str) -> int:
    print(words, flush=True)
    # Ctrl-C is the chat's (it stops the running turn): this process, and the fake server, carry on. A handler,
    # not SIG_IGN, so that the chat gets the default back when it starts.
    signal.signal(signal.SIGINT, lambda *_: None)
    return subprocess.call([AGENT_BRIDGE, "chat", str(profile), "--state", str(root / "sessions.sqlite3")])


def _version(binary: Path) -> str:
    try:
        said = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return next((word for word in said.split() if word[:1].isdigit()), "")


if __name__ == "__main__":
    sys.exit(main())
