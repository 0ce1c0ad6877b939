"""The `agent-bridge` command's entry point: `run --conversation` takes its place in line before the bridge loads.

Turns of one conversation are served in the order their runs joined its queue
(`bridge.host.file_turnlock`). Before it could join, a run used to import the bridge
(trio, the dialects), read its profile and open the session store: ~0.2 s, which
on a busy machine varies by more than the gap between two runs a bot starts one
per message. So a run joins first. From the command line alone it works out the
queue — the store `--state` names, the conversation, the session name, and the
profile's name (its `name:` line, else the file's stem) — joins it, and only
then loads the rest. `run` checks that place once the profile is loaded, and
joins again if the guess was wrong. A command line this reading is not sure of
(an option it does not know, an abbreviation, a PostgreSQL store) leaves the
joining to `run`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .host.file_turnlock import Place

# `run`'s options, as far as finding its queue goes; any other option means "let `run` read it".
_RUN_OPTIONS_WITH_VALUES = frozenset(
    {
        "--session-id",
        "--session-name",
        "--from-user",
        "--attach",
        "--timeout",
        "--conversation",
        "--state",
        "--log-level",
        "--log-format",
    }
)
_RUN_FLAGS = frozenset({"--new", "--no-stream", "--json", "--show-stderr"})
_NAME_LINE = re.compile(r"^name[ \t]*:[ \t]*(?P<value>[^#\n]*?)[ \t]*(?:#.*)?$", re.MULTILINE)


def main(argv: Sequence[str] | None = None) -> int:
    """The `agent-bridge` command (`bridge.cli.main`), run by the installed script and by `python -m bridge`."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    place = early_place(arguments)
    try:
        from .cli.main import main as command

        return command(arguments, early_place=place)
    finally:
        if place is not None:
            place.release()  # `run` released it already, unless it stopped before its turn


def early_place(arguments: Sequence[str]) -> Place | None:
    """The place of `run PROFILE … --conversation KEY` in its conversation's queue, taken before anything heavy
    loads; None when the command is something else, or this reading is not sure of the queue."""
    request = _run_request(arguments)
    if request is None:
        return None
    profile_file, conversation, session_name, state = request
    if not conversation or (state is not None and "://" in state):
        return None  # no queue, or a database's (PostgreSQL: advisory locks)
    from .errors import BridgeError
    from .host.file_turnlock import TurnLocks
    from .host.location import store_path

    try:
        store = store_path(state)
        if not store.parent.is_dir():
            return None  # the store makes its directory, and `run` joins once it has
        locks = TurnLocks(store)
        try:
            return locks.join(profile_name(profile_file), conversation, session_name)
        finally:
            locks.close()
    except (OSError, UnicodeError, BridgeError):
        return None  # `run` joins itself, and says what is wrong


def profile_name(path: str) -> str:
    """The name `load_profile(path)` will give the profile, as far as its `name:` line tells: else the stem."""
    match = _NAME_LINE.search(Path(path).read_text(encoding="utf-8"))
    if match is None:
        return Path(path).stem
    value = match["value"]
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return value


def _run_request(arguments: Sequence[str]) -> tuple[str, str | None, str, str | None] | None:
    """(profile file, conversation, session name, state) of a `run` command line; None unless sure of them."""
    if not arguments or arguments[0] != "run":
        return None
    values: dict[str, str] = {}
    positionals: list[str] = []
    words = iter(arguments[1:])
    for word in words:
        if word == "--":
            positionals.extend(words)
            break
        if not word.startswith("-") or word == "-":
            positionals.append(word)
            continue
        name, equals, value = word.partition("=")
        if name in _RUN_FLAGS and not equals:
            continue
        if name not in _RUN_OPTIONS_WITH_VALUES:
            return None  # -h, an abbreviation, an option this reading does not know
        given = value if equals else next(words, None)
        if given is None:
            return None
        values[name] = given
    if not positionals:
        return None
    return positionals[0], values.get("--conversation"), values.get("--session-name", "default"), values.get("--state")
