"""`agent-bridge init NAME`: a commented starter agent and its profile, the fastest way from zero to a turn.

The agent answers at once (`check` accepts the profile, `run` gets a reply),
and shows every part of the protocol a first agent needs: the message, a
session that comes back next turn, a partial, an error, the exit code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import BridgeError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

PROTOCOL_COMMENT = """\
What it gets (environment variables):
  AGENT_MESSAGE      the user's message
  AGENT_SESSION_ID   the session id it printed last turn ("" in a new conversation)
  AGENT_FROM_USER    who sent the message
What it prints on stdout, one line each:
  AGENT_SESSION:<id>     the conversation's id; it comes back next turn in AGENT_SESSION_ID
  AGENT_PARTIAL:"text"   shown to the user at once (a JSON string)
  AGENT_ERROR:"text"     the turn fails, and the user sees this text
  anything else          the reply
Exit 0 when all went well; any other exit code fails the turn. stderr is for your own logs:
`agent-bridge run` shows its last lines when a turn fails (--show-stderr: all of it, live)."""

SH_AGENT = """\
#!/bin/sh
# {name}: a starter agent for agent-bridge, run by {name}.yaml once per message.
#
{protocol}
set -eu

# The session: the id printed here comes back next turn. A real agent keeps its history
# somewhere and prints its key; this one only counts turns, in the id itself.
turns="${{AGENT_SESSION_ID#turns-}}"
case "$turns" in ''|*[!0-9]*) turns=0 ;; esac
turns=$((turns + 1))
echo "AGENT_SESSION:turns-$turns"

if [ -z "$AGENT_MESSAGE" ]; then
    echo 'AGENT_ERROR:"Say something, and I will answer."'
    exit 1
fi

echo 'AGENT_PARTIAL:"thinking... "'   # shown at once, while the work goes on
# Your agent's work goes here. printf, not echo: a message may start with '-' or hold backslashes.
printf 'you said: %s (turn %s of this conversation)\\n' "$AGENT_MESSAGE" "$turns"
"""

PYTHON_AGENT = '''\
#!/usr/bin/env python3
"""{name}: a starter agent for agent-bridge, run by {name}.yaml once per message.

{protocol}
"""

import json
import os
import sys


def say(prefix: str, text: str) -> None:
    """A protocol line whose payload is a JSON string (AGENT_PARTIAL:, AGENT_ERROR:)."""
    print(prefix + json.dumps(text), flush=True)


def main() -> int:
    message = os.environ.get("AGENT_MESSAGE", "")

    # The session: the id printed here comes back next turn. A real agent keeps its history
    # somewhere and prints its key; this one only counts turns, in the id itself.
    previous = os.environ.get("AGENT_SESSION_ID", "").removeprefix("turns-")
    turns = (int(previous) if previous.isdigit() else 0) + 1
    print(f"AGENT_SESSION:turns-{{turns}}", flush=True)

    if not message.strip():
        say("AGENT_ERROR:", "Say something, and I will answer.")
        return 1

    say("AGENT_PARTIAL:", "thinking... ")  # shown at once, while the work goes on
    # Your agent's work goes here.
    print(f"you said: {{message}} (turn {{turns}} of this conversation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

PROFILE = """\
# {name}: the profile of {agent}, written by `agent-bridge init`. Try it:
#   agent-bridge check {name}.yaml
#   agent-bridge run {name}.yaml "hello"
#   agent-bridge chat {name}.yaml
# Every field is in docs/profiles.md (and in `agent-bridge schema`).
description: A starter agent; make it yours in {agent}.
# The program and its arguments, split like a shell would split them (but no shell runs).
# {{{{PROFILE_DIR}}}} is this file's directory.
command: "{{{{PROFILE_DIR}}}}/{agent}"
timeout_secs: 60        # a turn that takes longer is stopped (exit 124)
# idle_timeout_secs: 30 # ...and one that prints nothing for this long
# stdin: line           # also write the message to the agent's stdin, with a final newline
# env:                  # more variables for the agent; ${{VAR}} comes from the bridge's environment
#   API_KEY: "${{MY_API_KEY}}"
"""


def write_starter(name: str, *, lang: str = "sh", directory: str | os.PathLike[str] = ".") -> list[Path]:
    """Write the agent and its profile into `directory`; the paths written, the profile last.

    Nothing is overwritten: if either file exists, nothing is written and `BridgeError` says so.
    """
    for suffix in (".yaml", ".yml"):
        name = name.removesuffix(suffix)
    if not NAME.fullmatch(name):
        raise BridgeError(
            f"{name!r} cannot name an agent: use letters, digits, '.', '_' and '-', starting "
            "with a letter or digit (e.g. my-agent)"
        )
    folder = Path(directory)
    agent_path = folder / f"{name}.{'py' if lang == 'python' else 'sh'}"
    profile_path = folder / f"{name}.yaml"
    existing = [str(path) for path in (agent_path, profile_path) if os.path.lexists(path)]
    if existing:
        raise BridgeError(
            f"{' and '.join(existing)} already {'exists' if len(existing) == 1 else 'exist'}; "
            "init never overwrites a file: choose another NAME or --dir, or move the file away"
        )
    protocol = PROTOCOL_COMMENT
    if lang == "python":
        agent_text = PYTHON_AGENT.format(name=name, protocol=protocol)
    else:
        agent_text = SH_AGENT.format(
            name=name, protocol="\n".join(f"# {line}".rstrip() for line in protocol.splitlines())
        )
    profile_text = PROFILE.format(name=name, agent=agent_path.name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BridgeError(f"cannot create {folder}: {err.strerror}; choose another --dir") from None
    _create(agent_path, agent_text, 0o755)
    try:
        _create(profile_path, profile_text, 0o644)
    except BaseException:
        agent_path.unlink(missing_ok=True)
        raise
    return [agent_path, profile_path]


def _create(path: Path, text: str, mode: int) -> None:
    """Create `path` with `text`, failing if it exists (even if it appeared a moment ago)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise BridgeError(
            f"{path} already exists; init never overwrites a file: choose another NAME or --dir, or move the file away"
        ) from None
    except OSError as err:
        raise BridgeError(f"cannot write {path}: {err.strerror}; choose another --dir") from None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
