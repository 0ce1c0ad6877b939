"""`make fleet-db`: a throwaway PostgreSQL on loopback for trying the fleet (docs/fleet.md) in a minute.

It starts a cluster of its own in a temporary directory (tools/pgcluster.py, as the tests do: as root the
server runs as the `postgres` user, since initdb refuses root), prints its DSN and the commands of two workers
and a gateway, and runs until Ctrl-C (SIGINT) or SIGTERM; then it stops the server and removes its data.
Nothing is kept: it is for trying, never for a bot's real sessions.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from pgcluster import PostgresServer, server_binaries

PROFILES = Path(__file__).resolve().parent.parent / "profiles"


def main() -> int:
    try:
        server_binaries()
        import psycopg  # noqa: F401  # the server's readiness is asked with it, as the workers' work is
    except (RuntimeError, ImportError) as err:
        missing = "psycopg is missing: make install EXTRAS=postgres" if isinstance(err, ImportError) else str(err)
        print(f"fleet-db: {missing}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server = PostgresServer()
    try:
        server.start()
        dsn = server.dsn("postgres")
        print(
            f"fleet-db: a throwaway PostgreSQL listens on 127.0.0.1:{server.port} (its data in {server.root}, "
            "removed when it stops)\n"
            f"DSN: {dsn}\n\n"
            "Try the fleet (docs/fleet.md), each command in a terminal of its own:\n"
            f"  agent-bridge worker --postgres {dsn} --profiles {PROFILES} --name worker-1\n"
            f"  agent-bridge worker --postgres {dsn} --profiles {PROFILES} --name worker-2\n"
            f"  agent-bridge serve --postgres {dsn} --name mybot\n"
            "and type a turn into the gateway, e.g.\n"
            '  {"type": "turn", "id": "1", "profile": "echo", "conversation": "c", "message": "hello"}\n\n'
            "Ctrl-C stops the server and removes its data.",
            flush=True,
        )
        stop.wait()
    finally:
        server.remove()
    print("fleet-db: stopped; its data is removed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
