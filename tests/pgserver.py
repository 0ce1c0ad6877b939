"""The throwaway PostgreSQL cluster (pgcluster.py) as pytest fixtures.

One cluster serves the whole test session; each test gets a database of its own (`pg_dsn`), so tests never
see each other's rows.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest
from pgcluster import PostgresServer

__all__ = ["PostgresServer", "pg_dsn", "postgres_server"]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.remove()


_databases = itertools.count(1)


@pytest.fixture
def pg_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """The DSN of a new, empty database of its own for this test, dropped after it.

    Dropped one by one: a cluster left holding every test's database takes longer to remove at the end of the
    session than a fixture's teardown may (pytest-timeout), on a loaded machine."""
    import psycopg

    if postgres_server.process is None or postgres_server.process.poll() is not None:
        postgres_server.start()  # a test stopped it
    name = f"test_{os.getpid()}_{next(_databases)}"
    with psycopg.connect(postgres_server.dsn("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield postgres_server.dsn(name)
    try:
        with psycopg.connect(postgres_server.dsn("postgres"), autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.OperationalError:
        pass  # the test stopped the server: its files go with the cluster
