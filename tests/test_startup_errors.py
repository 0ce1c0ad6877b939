"""A long-lived command that cannot start (`serve`, `serve --listen`, `worker`, `worker --metrics`) says why in one
line and exits 2, without a traceback: a missing extra, a port in use or forbidden, a tokens or TLS file that does
not load, a store or database it cannot reach, a profiles directory that is not there.

Each case runs the command as a user would, in a subprocess whose sockets reach loopback only.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PROFILES, PYTHON
from loopback_only import subprocess_env

HTTP_LIBRARIES = ("hypercorn", "starlette", "prometheus_client")
UNREACHABLE_DSN = "postgresql://bridge@127.0.0.1:1/bridge"  # loopback, and nothing listens on port 1
START_DEADLINE = 30  # a command that hangs instead of refusing to start fails the test in this many seconds
# `agent-bridge` with the named libraries absent, as on an install without the extra that brings them.
WITHOUT = "import sys\nfor name in sys.argv.pop(1).split(','):\n    sys.modules[name] = None\n"
CLI = "from bridge.command import main\nsys.exit(main())\n"


def agent_bridge(
    *args: str, without: tuple[str, ...] = (), prefix: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `agent-bridge ARGS` (`without`: as if those modules were not installed; `prefix`: a command such as
    setpriv's that runs it with fewer privileges)."""
    command = [PYTHON, "-c", WITHOUT + CLI, ",".join(without)] if without else [PYTHON, "-m", "bridge"]
    return subprocess.run(
        [*(prefix or []), *command, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_DEADLINE,
        env=subprocess_env(),
    )


def the_one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The command's only line for a person (log records are JSON lines, not a terminal's): exit 2, no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith("{")]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    directory = tmp_path / "profiles"
    directory.mkdir()
    shutil.copy(PROFILES / "echo.yaml", directory)
    return directory


# ---------------------------------------------------------------------------- the http extra


@pytest.mark.parametrize("missing", HTTP_LIBRARIES)
def test_listen_without_the_http_extra_names_the_extra_and_how_to_add_it(missing: str, profiles: Path) -> None:
    done = agent_bridge("serve", "--profiles", str(profiles), "--listen", "127.0.0.1:0", without=(missing,))
    assert the_one_line(done) == (
        f"agent-bridge: --listen needs {missing}, which is not installed: install the network door's libraries: "
        "pip install 'agent-bridge[http]' (in a checkout of agent-bridge: make install EXTRAS=http)"
    )


def test_worker_metrics_without_the_http_extra_names_it_before_connecting(profiles: Path) -> None:
    done = agent_bridge(
        *("worker", "--postgres", UNREACHABLE_DSN, "--profiles", str(profiles), "--metrics", "127.0.0.1:0"),
        without=HTTP_LIBRARIES,
    )
    assert the_one_line(done).startswith("agent-bridge: --metrics needs ")
    assert "pip install 'agent-bridge[http]'" in done.stderr


def test_run_and_serve_on_stdin_work_without_the_http_extra(profiles: Path) -> None:
    ran = agent_bridge("run", str(PROFILES / "echo.yaml"), "hi", without=HTTP_LIBRARIES)
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "echo: hi\n", "")
    served = subprocess.run(
        [PYTHON, "-c", WITHOUT + CLI, ",".join(HTTP_LIBRARIES), "serve", "--profiles", str(profiles)],
        input='{"type": "stats", "id": 1}\n',
        capture_output=True,
        text=True,
        timeout=START_DEADLINE,
        env=subprocess_env(),
    )
    assert served.returncode == 0, served.stderr
    assert '"id": 1' in served.stdout


# ---------------------------------------------------------------------------- the address


def test_listen_on_a_port_in_use_says_so_in_one_line(profiles: Path, busy_port: int) -> None:
    done = agent_bridge("serve", "--profiles", str(profiles), "--listen", f"127.0.0.1:{busy_port}")
    assert the_one_line(done) == (
        f"agent-bridge: --listen 127.0.0.1:{busy_port}: the address is in use; stop what listens there, or give "
        "another port"
    )


def test_worker_metrics_on_a_port_in_use_says_so_in_one_line(profiles: Path, busy_port: int, pg_dsn: str) -> None:
    done = agent_bridge(
        "worker", "--postgres", pg_dsn, "--profiles", str(profiles), "--metrics", f"127.0.0.1:{busy_port}"
    )
    assert the_one_line(done) == (
        f"agent-bridge: --metrics 127.0.0.1:{busy_port}: the address is in use; stop what listens there, or give "
        "another port"
    )


def test_listen_on_a_privileged_port_without_the_privilege_says_which_ports_are_allowed(tmp_path: Path) -> None:
    if int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text()) <= 80:
        pytest.skip("any user may bind port 80 on this machine")
    without_the_privilege: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root, and setpriv is not there to drop the privilege")
        # Root without CAP_NET_BIND_SERVICE, rather than another user: the checkout (a fresh clone in a private
        # temporary directory, say) stays readable to it.
        without_the_privilege = ["setpriv", "--bounding-set=-net_bind_service", "--inh-caps=-net_bind_service"]
    done = agent_bridge(
        *("serve", "--profiles", str(PROFILES), "--state", str(tmp_path / "sessions.sqlite3")),
        *("--listen", "127.0.0.1:80"),
        prefix=without_the_privilege,
    )
    assert the_one_line(done) == (
        "agent-bridge: --listen 127.0.0.1:80: permission denied: a port below 1024 needs root or "
        "CAP_NET_BIND_SERVICE; give a port of 1024 or above"
    )


# ---------------------------------------------------------------------------- files and services


def test_a_tokens_file_that_is_not_yaml_is_named_with_its_line_and_never_its_text(
    profiles: Path, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text('"s3cret-token-value": {name: bot\n')
    tokens.chmod(0o600)
    done = agent_bridge("serve", "--profiles", str(profiles), "--listen", "127.0.0.1:0", "--tokens", str(tokens))
    line = the_one_line(done)
    assert line.startswith(f"agent-bridge: the tokens file '{tokens}' is not valid YAML: line 2: ")
    assert "s3cret" not in done.stderr


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("tokens file missing", "agent-bridge: the tokens file '{tmp}/tokens.yaml' cannot be read: No such file"),
        ("tokens file a directory", "agent-bridge: the tokens file '{tmp}' cannot be read: Is a directory"),
        ("certificate missing", "agent-bridge: TLS: --certfile '{tmp}/cert.pem' and --keyfile '{tmp}/bad.pem' do"),
        ("certificate not PEM", "agent-bridge: TLS: --certfile '{tmp}/bad.pem' and --keyfile '{tmp}/bad.pem' do not"),
        ("profiles missing", "agent-bridge: {tmp}/nothing: the profiles directory cannot be read: No such file"),
        ("state under a file", "agent-bridge: cannot create session store {tmp}/bad.pem/s.sqlite3: "),
        ("gateway database unreachable", f"agent-bridge: cannot connect to {UNREACHABLE_DSN}: "),
        ("worker database unreachable", f"agent-bridge: session store: cannot connect to {UNREACHABLE_DSN}: "),
        ("state database unreachable", f"agent-bridge: session store: cannot connect to {UNREACHABLE_DSN}: "),
    ],
)
def test_each_start_up_failure_is_one_line_that_names_what_to_fix(
    case: str, expected: str, profiles: Path, tmp_path: Path
) -> None:
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    listen = ("--profiles", str(profiles), "--listen", "127.0.0.1:0")
    args = {
        "tokens file missing": (*listen, "--tokens", str(tmp_path / "tokens.yaml")),
        "tokens file a directory": (*listen, "--tokens", str(tmp_path)),
        "certificate missing": (
            *listen,
            "--certfile",
            str(tmp_path / "cert.pem"),
            "--keyfile",
            str(tmp_path / "bad.pem"),
        ),
        "certificate not PEM": (
            *listen,
            "--certfile",
            str(tmp_path / "bad.pem"),
            "--keyfile",
            str(tmp_path / "bad.pem"),
        ),
        "profiles missing": ("--profiles", str(tmp_path / "nothing")),
        "state under a file": ("--profiles", str(profiles), "--state", str(tmp_path / "bad.pem" / "s.sqlite3")),
        "gateway database unreachable": ("--postgres", UNREACHABLE_DSN),
        "worker database unreachable": ("--postgres", UNREACHABLE_DSN, "--profiles", str(profiles)),
        "state database unreachable": ("--profiles", str(profiles), "--state", UNREACHABLE_DSN),
    }[case]
    command = "worker" if case.startswith("worker") else "serve"
    line = the_one_line(agent_bridge(command, *args))
    assert line.startswith(expected.format(tmp=tmp_path)), line
