"""The CLI's side of the session store: `run/chat --conversation` and `agent-bridge sessions`.

Imported only by commands that use the store, so a plain `agent-bridge run`
never loads SQLite. `--state` names an SQLite file or a PostgreSQL database
(`bridge.host.state`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.result import TurnResult
from ..errors import BridgeError
from ..host.file_turnlock import TurnLocks
from ..host.location import store_path
from ..host.sqlite_store import SessionRecord
from ..host.state import check_namespace_applies, open_store, open_turn_locks, store_exists
from ..profile import load_profile

if TYPE_CHECKING:
    from ..host.file_turnlock import Place
    from ..host.postgres.advisory_turnlock import PgPlace, PgTurnLocks
    from ..host.state import Store


class Conversation:
    """One stored session, as a CLI command uses it: a place in its queue, then read before a turn, written after.

    The store (and its queues) is opened once, so a corrupt or unwritable
    file, or a database out of reach, stops the command before any agent runs.
    """

    def __init__(
        self, state: str | None, profile: str, key: str, session_name: str, *, namespace: str | None = None
    ) -> None:
        if not key:
            raise BridgeError("--conversation needs a non-empty KEY")
        self.store: Store = open_store(state, namespace=namespace)
        try:
            queue = open_turn_locks(self.store)
            assert queue is not None, "every store open_store makes is shared with other processes"
            self.queue: TurnLocks | PgTurnLocks = queue
        except BaseException:
            self.store.close()
            raise
        self.profile = profile
        self.key = key
        self.session_name = session_name

    def join(self, early: Place | None = None) -> Place | PgPlace:
        """A place behind every turn of this conversation already waiting or running, in any process: `early`,
        the place the command took before it loaded (`bridge.command`), when it is in this conversation's queue."""
        if early is not None:
            if isinstance(self.queue, TurnLocks) and self.queue.holds(early, self.profile, self.key, self.session_name):
                return early
            early.release()
        return self.queue.join(self.profile, self.key, self.session_name)

    async def join_async(self) -> Place | PgPlace:
        return await self.queue.join_async(self.profile, self.key, self.session_name)

    @property
    def session_id(self) -> str:
        return self.store.get(self.profile, self.key, self.session_name)

    def lookup(self) -> tuple[str, str]:
        """The stored session id and its record's stamp (see `SessionStore.lookup`)."""
        return self.store.lookup(self.profile, self.key, self.session_name)

    def record(self, result: TurnResult) -> str:
        """Store how the turn ended; the record's stamp."""
        return self.store.record(self.profile, self.key, self.session_name, result)

    def forget(self) -> int:
        return self.store.forget(self.profile, self.key, self.session_name)

    def close(self) -> None:
        self.queue.close()
        self.store.close()


def sessions_command(args: argparse.Namespace) -> int:
    """`agent-bridge sessions list|show|forget`."""
    check_namespace_applies(args.state, args.namespace)
    if not store_exists(args.state):
        return _no_store(args, store_path(args.state))  # reading a store that is not there creates nothing
    with open_store(args.state, namespace=args.namespace) as store:
        if args.action == "list":
            return _list(store, _profile_key(args.profile) if args.profile else None, args.json)
        profile = _profile_key(args.profile)
        if args.action == "show":
            return _show(store, profile, args.conversation, args.session_name, args.json)
        removed = store.forget(profile, args.conversation, args.session_name)
        if removed:
            which = f"session {args.session_name!r}" if args.session_name else "every session"
            print(f"forgot {which} of conversation {args.conversation!r} of {profile} ({removed} stored)")
        else:
            which = f"session {args.session_name!r}" if args.session_name else "sessions"
            print(f"nothing to forget: no stored {which} for conversation {args.conversation!r} of {profile}")
        return 0


def _no_store(args: argparse.Namespace, path: Path) -> int:
    where = f"there is no session store at {path} yet (`run --conversation KEY` makes one)"
    if args.action == "list":
        if not args.json:
            print(f"no stored sessions: {where}", file=sys.stderr)
        return 0
    if args.action == "show":
        print(f"no stored conversation {args.conversation!r}: {where}", file=sys.stderr)
        return 1
    print(f"nothing to forget: {where}")
    return 0


def _profile_key(text: str) -> str:
    """A profile name, or a profile file whose name is meant (`sessions show profiles/stream.yaml KEY`)."""
    if text.endswith((".yaml", ".yml")) and Path(text).is_file():
        return load_profile(text).label
    return text


def _list(store: Store, profile: str | None, as_json: bool) -> int:
    records = store.list(profile)
    if as_json:
        for record in records:
            print(json.dumps(record.to_dict(), ensure_ascii=False))
        return 0
    if not records:
        where = f" for profile {profile}" if profile else ""
        print(f"no stored sessions{where} in {store.location}", file=sys.stderr)
        return 0
    header = ("PROFILE", "CONVERSATION", "SESSION NAME", "SESSION ID", "LAST USED (UTC)", "LAST OUTCOME")
    rows = [header, *(_row(record) for record in records)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(header) - 1)]
    for row in rows:
        print("  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]))
    return 0


def _row(record: SessionRecord) -> tuple[str, ...]:
    return (
        record.profile,
        _printable(record.conversation),
        _printable(record.session_name),
        record.session_id or "-",
        record.last_used.strftime("%Y-%m-%d %H:%M:%S"),
        _outcome(record),
    )


def _show(store: Store, profile: str, conversation: str, session_name: str | None, as_json: bool) -> int:
    records = [
        record
        for record in store.list(profile, conversation)
        if session_name is None or record.session_name == session_name
    ]
    if not records:
        which = f"session {session_name!r} of " if session_name else ""
        print(
            f"no stored {which}conversation {conversation!r} for profile {profile} in {store.location}", file=sys.stderr
        )
        return 1
    for record in sorted(records, key=lambda record: record.session_name):
        if as_json:
            print(json.dumps(record.to_dict(), ensure_ascii=False))
            continue
        print(
            f"profile:       {record.profile}\n"
            f"conversation:  {_printable(record.conversation)}\n"
            f"session name:  {_printable(record.session_name)}\n"
            f"session id:    {record.session_id or '(none yet: the next turn starts a new session)'}\n"
            f"last used:     {record.last_used.isoformat(timespec='seconds')}\n"
            f"last outcome:  {_outcome(record)}"
        )
    return 0


def _outcome(record: SessionRecord) -> str:
    return (
        record.last_outcome if record.last_exit_code == 0 else f"{record.last_outcome} (exit {record.last_exit_code})"
    )


def _printable(text: str) -> str:
    """Keys are the host's, so anything goes; a table cell must stay on one line."""
    return text if text.isprintable() else json.dumps(text, ensure_ascii=False)
