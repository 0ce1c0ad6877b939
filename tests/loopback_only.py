"""Tests connect to this machine only: a guard on every socket's `connect` that refuses any address beyond
loopback, before a packet leaves, and records every address connected to.

`install()` puts it in this process (test_attachments does, for its fetches); a Python subprocess gets it by
`SUBPROCESS_ENV`, whose PYTHONPATH holds a `sitecustomize` that installs it. So a regression that would make
the bridge fetch from the cloud metadata address fails the test on an assertion (the fetch is refused with
`REFUSED` in its reason) and sends nothing. `make test` adds a network namespace with only loopback where the
machine allows (docs/contributing.md); this guard holds where it does not.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from typing import Any

REFUSED = "a test may not connect beyond loopback (tests/loopback_only.py)"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loopback_only_site")

attempts: list[str] = []  # every IP address connected to (or refused) in this process since `install()`
_original_connect = socket.socket.connect
_original_connect_ex = socket.socket.connect_ex


def beyond_loopback() -> list[str]:
    """The addresses beyond loopback something in this process tried to connect to."""
    return [address for address in attempts if not _is_local(address)]


def install() -> None:
    """Guard every socket of this process (idempotent)."""
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]


def uninstall() -> None:
    socket.socket.connect = _original_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _original_connect_ex  # type: ignore[method-assign]


def subprocess_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a Python subprocess whose sockets are guarded too."""
    env = dict(os.environ if environ is None else environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SITE, env.get("PYTHONPATH", "")]))
    return env


def _is_local(address: str) -> bool:
    try:
        parsed = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed.is_loopback or parsed.is_unspecified


def _check(sock: socket.socket, address: Any) -> None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    host = str(address[0])
    attempts.append(host)
    if not _is_local(host):
        raise PermissionError(errno.EPERM, f"{REFUSED}: {host}")


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _check(self, address)
    _original_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _check(self, address)
    return _original_connect_ex(self, address)
