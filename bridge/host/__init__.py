"""The host runtime: what a bot holds for its lifetime to run turns for many conversations.

- `runtime`: `Host` and `open_host` (ordering, limits, sessions, shutdown);
- `scheduler`: which waiting turn may start (pure);
- `registry`: profiles by name from a directory, re-read when edited;
- `store`: the SQLite session store; `turnlock`: the cross-process queue next to it;
- `postgres`: the session store and the turn queue in a PostgreSQL database, for many machines:
  `RemoteHost` (the gateway `open_host(postgres=…)` returns) and `Worker` (`agent-bridge worker`);
- `state`: which of them `--state` / `state=` names (`open_store`).

Names load on first use, so importing the store does not import the runtime.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .file_turnlock import TurnLockError
    from .postgres.gateway import FleetStats, GatewayNameTaken, RemoteHost, RemoteTurnError, TurnDetached
    from .postgres.pg_store import PostgresSessionStore
    from .postgres.worker import Worker
    from .registry import ProfileRegistry, UnknownProfile
    from .runtime import DuplicateTurn, Host, HostClosed, HostStats, SessionIdRefused, SessionStoreLike, open_host
    from .scheduler import QueueFull
    from .sqlite_store import SessionRecord, SessionStore, StoreError
    from .state import open_store

_WHERE = {
    "DuplicateTurn": "runtime",
    "Host": "runtime",
    "HostClosed": "runtime",
    "HostStats": "runtime",
    "SessionStoreLike": "runtime",
    "SessionIdRefused": "runtime",
    "open_host": "runtime",
    "ProfileRegistry": "registry",
    "UnknownProfile": "registry",
    "QueueFull": "scheduler",
    "SessionRecord": "sqlite_store",
    "SessionStore": "sqlite_store",
    "StoreError": "sqlite_store",
    "TurnLockError": "file_turnlock",
    "PostgresSessionStore": "postgres.pg_store",
    "open_store": "state",
    "RemoteHost": "postgres.gateway",
    "FleetStats": "postgres.gateway",
    "RemoteTurnError": "postgres.gateway",
    "TurnDetached": "postgres.gateway",
    "Worker": "postgres.worker",
    "GatewayNameTaken": "postgres.gateway",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'bridge.host' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "DuplicateTurn",
    "FleetStats",
    "GatewayNameTaken",
    "Host",
    "HostClosed",
    "HostStats",
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
