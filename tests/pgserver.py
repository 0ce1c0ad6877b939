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
def pg_dsn(postgres_server: PostgresServer) -> str:
    """The DSN of a new, empty database of its own for this test."""
    import psycopg

    if postgres_server.process is None or postgres_server.process.poll() is not None:
        postgres_server.start()  # a test stopped it
    name = f"test_{os.getpid()}_{next(_databases)}"
    with psycopg.connect(postgres_server.dsn("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return postgres_server.dsn(name)
