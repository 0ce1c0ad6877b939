"""The host runtime: what a bot holds for its lifetime to run turns for many conversations.

- `interface`: `BaseHost`, the interface of every host `open_host` returns, and `HostStats`;
- `runtime`: `Host` and `open_host` (ordering, limits, sessions, shutdown);
- `scheduler`: which waiting turn may start (pure);
- `registry`: profiles by name from a directory, re-read when edited;
- `sqlite_store`: the SQLite session store; `file_turnlock`: the cross-process queue next to it;
- `postgres`: the session store and the turn queue in a PostgreSQL database, for many machines:
  `RemoteHost` (the gateway `open_host(postgres=…)` returns) and `Worker` (`agent-bridge worker`);
- `state`: which of them `--state` / `state=` names (`open_store`).

Names load on first use, so importing the store does not import the runtime. The errors are
`bridge.errors`'s, named here too.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..errors import (
    DuplicateTurn,
    GatewayNameTaken,
    HostClosed,
    PostgresError,
    QueueFull,
    RemoteTurnError,
    SessionIdRefused,
    StoreError,
    TurnDetached,
    TurnLockError,
    UnknownProfile,
)

if TYPE_CHECKING:
    from .interface import BaseHost, HostStats
    from .postgres.gateway import FleetStats, RemoteHost
    from .postgres.pg_store import PostgresSessionStore
    from .postgres.worker import Worker
    from .registry import ProfileRegistry
    from .runtime import Host, SessionStoreLike, open_host
    from .sqlite_store import SessionRecord, SessionStore
    from .state import open_store

_WHERE = {
    "BaseHost": "interface",
    "HostStats": "interface",
    "Host": "runtime",
    "SessionStoreLike": "runtime",
    "open_host": "runtime",
    "ProfileRegistry": "registry",
    "SessionRecord": "sqlite_store",
    "SessionStore": "sqlite_store",
    "PostgresSessionStore": "postgres.pg_store",
    "open_store": "state",
    "RemoteHost": "postgres.gateway",
    "FleetStats": "postgres.gateway",
    "Worker": "postgres.worker",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'bridge.host' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "BaseHost",
    "DuplicateTurn",
    "FleetStats",
    "GatewayNameTaken",
    "Host",
    "HostClosed",
    "HostStats",
    "PostgresError",
    "PostgresSessionStore",
    "ProfileRegistry",
    "QueueFull",
    "RemoteHost",
    "RemoteTurnError",
    "SessionIdRefused",
    "SessionRecord",
    "SessionStore",
    "SessionStoreLike",
    "StoreError",
    "TurnDetached",
    "TurnLockError",
    "UnknownProfile",
    "Worker",
    "open_host",
    "open_store",
]
