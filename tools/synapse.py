"""A real Synapse homeserver on loopback for the Matrix tests: installed once into the test cache, SQLite, no
federation, no open registration.

`make test` installs it before pytest runs (`python tools/synapse.py install`, the `test-synapse` target): pytest
runs in a network namespace with only loopback, where pip cannot reach PyPI.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agents_cache import CACHE

SYNAPSE_VERSION = "1.163.2"  # the Makefile reads this line: one pin
VENV = CACHE / "synapse-venv"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / f".installed-{SYNAPSE_VERSION}"
SERVER_NAME = "localhost"
# Synapse starts in a few seconds; a machine busy with other tests may take several times that.
START_DEADLINE = 60.0
MAX_UPLOAD_SIZE = "1M"

# Every rate limit Synapse applies to clients, raised so tests that are not about 429s never meet one.
_RAISED = {"per_second": 10_000, "burst_count": 10_000}
RAISED_RATE_LIMITS: dict[str, Any] = {
    "rc_message": _RAISED,
    "rc_registration": _RAISED,
    "rc_login": {"address": _RAISED, "account": _RAISED, "failed_attempts": _RAISED},
    "rc_joins": {"local": _RAISED, "remote": _RAISED},
    "rc_joins_per_room": _RAISED,
    "rc_invites": {"per_room": _RAISED, "per_user": _RAISED, "per_issuer": _RAISED},
    "rc_admin_redaction": _RAISED,
    "rc_media_create": _RAISED,
    "rc_presence": {"per_user": _RAISED},
    "rc_delayed_event_mgmt": _RAISED,
    "rc_reports": _RAISED,
    "rc_room_creation": _RAISED,  # 10, then one a minute: the tests create a room each
    "rc_third_party_invite": _RAISED,
    "rc_profile": _RAISED,
    "rc_user_directory": _RAISED,
}


def install() -> None:
    """Install the pinned Synapse into the cache's venv, once (a stamp names the version)."""
    if STAMP.exists():
        return
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", f"matrix-synapse=={SYNAPSE_VERSION}"], check=True)
    STAMP.touch()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class SynapseServer:
    """One Synapse in `directory` (its config, SQLite database, media store and log)."""

    def __init__(
        self, directory: Path, *, real_rate_limits: bool = False, messages_per_second: float | None = None
    ) -> None:
        assert STAMP.exists(), f"{STAMP} is missing: run `make test-synapse` (make test does) to install Synapse"
        self.directory = directory
        self.real_rate_limits = real_rate_limits
        # With real_rate_limits: rc_message's rate instead of Synapse's default 0.2 (its burst of 10 kept); a 429's
        # retry_after_ms is about one message's time, so a test of 429s waits 1 s at 1 rather than 5.
        self.messages_per_second = messages_per_second
        self.port = 0
        self.config_path = directory / "homeserver.yaml"
        self.registration_secret = secrets.token_hex(16)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def user_id(self, localpart: str) -> str:
        return f"@{localpart}:{SERVER_NAME}"

    def _configure(self) -> None:
        import yaml  # not at the top: `make test-synapse` runs install() with a bare Python

        self.directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                str(PYTHON),
                "-m",
                "synapse.app.homeserver",
                "--server-name",
                SERVER_NAME,
                "--config-path",
                str(self.config_path),
                "--data-directory",
                str(self.directory),
                "--generate-config",
                "--report-stats=no",
            ],
            check=True,
            capture_output=True,
            cwd=self.directory,
        )
        config = yaml.safe_load(self.config_path.read_text())
        self.port = free_port()
        config.update(
            listeners=[
                {
                    "port": self.port,
                    "bind_addresses": ["127.0.0.1"],
                    "type": "http",
                    "tls": False,
                    "x_forwarded": False,
                    "resources": [{"names": ["client"], "compress": False}],
                }
            ],
            public_baseurl=f"{self.url}/",
            database={"name": "sqlite3", "args": {"database": str(self.directory / "homeserver.db")}},
            media_store_path=str(self.directory / "media_store"),
            enable_registration=False,
            registration_shared_secret=self.registration_secret,
            federation_domain_whitelist=[],  # no federation: nothing leaves loopback
            trusted_key_servers=[],
            suppress_key_server_warning=True,
            report_stats=False,
            presence={"enabled": False},
            url_preview_enabled=False,
            max_upload_size=MAX_UPLOAD_SIZE,  # small, so a test can go over it cheaply
            bcrypt_rounds=4,  # the fewest bcrypt allows: the tests register and log in a user each; 12 costs ~0.3 s
        )
        if not self.real_rate_limits:
            config.update(RAISED_RATE_LIMITS)
        elif self.messages_per_second is not None:
            config.update(rc_message={"per_second": self.messages_per_second, "burst_count": 10})
        self.config_path.write_text(yaml.safe_dump(config))

    def start(self) -> None:
        if not self.config_path.exists():
            self._configure()
        log = (self.directory / "synapse.out").open("ab")
        self.process = subprocess.Popen(
            [str(PYTHON), "-m", "synapse.app.homeserver", "--config-path", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.directory,
        )
        log.close()
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"synapse exited ({self.process.returncode}): {self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/_matrix/client/versions", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)  # polling a process that has no readiness signal but its HTTP port
        self.stop()
        raise AssertionError(f"synapse did not answer within {START_DEADLINE:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        path = self.directory / "synapse.out"
        return path.read_text(errors="replace")[-2000:] if path.exists() else "(no log)"

    def register(self, localpart: str, password: str, *, admin: bool = False) -> str:
        """Register a user by shared-secret registration, the request Synapse's register_new_matrix_user sends
        (without starting that script, a second or more of imports per user); returns the user id."""
        endpoint = f"{self.url}/_synapse/admin/v1/register"
        with urllib.request.urlopen(endpoint, timeout=30) as answer:
            nonce = str(json.load(answer)["nonce"])
        mac = hmac.new(self.registration_secret.encode(), digestmod=hashlib.sha1)
        mac.update(
            b"\x00".join([nonce.encode(), localpart.encode(), password.encode(), b"admin" if admin else b"notadmin"])
        )
        body = {"nonce": nonce, "username": localpart, "password": password, "admin": admin, "mac": mac.hexdigest()}
        request = urllib.request.Request(
            endpoint, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30):
            pass  # urlopen raises on anything but success
        return self.user_id(localpart)

    def login(self, localpart: str, password: str) -> str:
        """An access token for the user, by password (a client of the tests, not the code under test)."""
        body = {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": localpart}}
        body["password"] = password
        request = urllib.request.Request(
            f"{self.url}/_matrix/client/v3/login",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return str(json.load(answer)["access_token"])

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        install()
    else:
        sys.exit("usage: python tools/synapse.py install")
