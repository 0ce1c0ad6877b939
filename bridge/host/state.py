"""What `--state` (or `open_host(state=...)`) names: the session store, and the cross-process queue going with it.

A `postgresql://` or `postgres://` URL is a PostgreSQL database
(`bridge.host.postgres`, which needs psycopg); anything else is the path of
an SQLite file, `None` the default file. Every command and the host open
their store here, so they all read `--state` the same way.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import StoreError
from .file_turnlock import TurnLocks
from .location import store_path
from .postgres.db import is_postgres_url
from .sqlite_store import SessionStore

if TYPE_CHECKING:
    from .postgres.advisory_turnlock import PgTurnLocks
    from .postgres.pg_store import PostgresSessionStore

    Store = SessionStore | PostgresSessionStore


def open_store(state: str | os.PathLike[str] | None = None, *, namespace: str | None = None) -> Store:
    """The session store `state` names: a PostgreSQL URL, a file path (`~` expanded), or None for the default file.

    `namespace` is the bot whose sessions a PostgreSQL store holds (default: `postgres.db.DEFAULT_NAMESPACE`);
    a file is one bot's already, so a namespace with a file is a `StoreError`.
    """
    check_namespace_applies(state, namespace)
    if is_postgres_url(state):
        from .postgres.pg_store import PostgresSessionStore

        if namespace is None:
            return PostgresSessionStore(str(state))
        return PostgresSessionStore(str(state), namespace=namespace)
    return SessionStore(state)


def check_namespace_applies(state: object, namespace: str | None) -> None:
    """A namespace names a bot's sessions in a shared database; a file is one bot's already: a `StoreError`."""
    if namespace is not None and not is_postgres_url(state):
        raise StoreError(
            "a namespace applies to a PostgreSQL session store (--state postgresql://…) only; a "
            "file holds one bot's sessions: give each bot a file of its own instead"
        )


def store_exists(state: str | os.PathLike[str] | None = None) -> bool:
    """Whether there is something to read: a database always may hold sessions; a file must exist."""
    return is_postgres_url(state) or store_path(state).exists()


def open_turn_locks(store: object) -> TurnLocks | PgTurnLocks | None:
    """The queues shared with other processes using `store`; None for a store of the caller's own kind
    (anything with `get` and `record`), which only this process knows."""
    if isinstance(store, SessionStore):
        return TurnLocks(store.path)
    from .postgres.pg_store import PostgresSessionStore

    if isinstance(store, PostgresSessionStore):
        from .postgres.advisory_turnlock import PgTurnLocks

        return PgTurnLocks(store.dsn, namespace=store.namespace)
    return None
