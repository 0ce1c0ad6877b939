"""`file_server.py FILE`: an HTTP server on loopback answering every GET with FILE, in a process of its own.

Prints its base URL on a line, then serves until its stdin ends. The bridge and `curl` fetch from the same server,
so what it costs lands on both alike; it sends the body with `sendfile` from the page cache, the least a server can
cost. In its own process, so its bytes and threads count in neither contender's RSS nor hold the measuring
process's GIL. `serving` starts one from Python.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(path: str) -> Iterator[str]:
    """A server of the file at `path` in a child process, for the block; its base URL."""
    server = subprocess.Popen([sys.executable, "-S", __file__, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert server.stdin is not None and server.stdout is not None
    try:
        yield server.stdout.readline().decode().strip()
    finally:
        server.stdin.close()
        server.wait(timeout=10)


def main(path: str) -> None:
    size = os.path.getsize(path)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            with open(path, "rb") as body:
                self.connection.sendfile(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print(f"http://127.0.0.1:{httpd.server_address[1]}", flush=True)
    sys.stdin.read()
    httpd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
