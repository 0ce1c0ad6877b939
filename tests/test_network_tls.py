"""`serve --listen` with TLS, and who may listen where: the real CLI as a process, real clients.

The certificate is self-signed, made for each test module by the `openssl`
command (Debian's ca-certificates needs it, so it is on every machine this
project runs on); the clients trust exactly it.
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from doorkit import ListeningServe, serve_argv, serves, write_tokens  # noqa: F401 - serves: a fixture
from hostkit import Lab
from httpx_ws import aconnect_ws

TOKEN = "a-token-of-the-tests-0123456789"
WAIT = 20.0


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(certificate, key): self-signed, for 127.0.0.1 and localhost."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
    )
    return cert, key


def listening(serves: list[ListeningServe], lab: Lab, *options: str) -> ListeningServe:
    serve = ListeningServe(serve_argv("--profiles", str(lab.profiles), *options), lab.root / "serve.log")
    serves.append(serve)
    return serve


def refused_at_start(lab: Lab, *options: str) -> str:
    """serve's message when it refuses to start with `options` (it must exit non-zero without listening)."""
    done = subprocess.run(
        serve_argv("--profiles", str(lab.profiles), *options), capture_output=True, text=True, timeout=WAIT
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "listening on" not in done.stderr
    return done.stderr


async def test_https_and_wss_with_a_certificate_the_client_trusts_and_nothing_in_plain_http(
    serves: list[ListeningServe], lab: Lab, certificate: tuple[Path, Path]
) -> None:
    """The clients are async: httpx-ws's sync session closes its socket while a thread of its own may still be
    reading it, and that read takes the bytes of whichever connection reuses the descriptor (the next one's
    certificate, when the door answered the close late)."""
    cert, key = certificate
    serve = listening(serves, lab, "--listen", "127.0.0.1:0", "--certfile", str(cert), "--keyfile", str(key))
    assert serve.url.startswith("https://127.0.0.1:")
    trusting = ssl.create_default_context(cafile=str(cert))
    async with httpx.AsyncClient(base_url=serve.url, verify=trusting, timeout=WAIT) as client:
        assert (await client.get("/healthz")).json() == {"status": "alive"}
        response = await client.post(
            "/v1/turns",
            json={"profile": "rec", "conversation": "c", "message": "tag=over-https"},
            headers={"Accept": "application/json"},
        )
        assert (response.status_code, response.json()["reply"]) == (200, "reply over-https one")
        async with aconnect_ws("/v1/ws", client) as ws:  # wss: the upgrade travels inside the TLS connection
            await ws.send_json(
                {"type": "turn", "id": 1, "profile": "rec", "conversation": "c", "message": "tag=over-wss"}
            )
            responses = [await ws.receive_json(timeout=WAIT) for _ in range(3)]
    assert [r["type"] for r in responses] == ["accepted", "partial", "result"], responses
    assert responses[-1]["reply"] == "reply over-wss one"
    plain = serve.url.replace("https://", "http://")
    async with httpx.AsyncClient(verify=trusting, timeout=WAIT) as client:
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):  # hung up on: not a timeout
            await client.get(f"{plain}/healthz")
    trusts_nobody = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, with no authority: the check is real
    async with httpx.AsyncClient(verify=trusts_nobody, timeout=WAIT) as client:
        with pytest.raises(httpx.ConnectError) as refused:
            await client.get(f"{serve.url}/healthz")
    assert isinstance(ssl_error_of(refused.value), ssl.SSLCertVerificationError), repr(ssl_error_of(refused.value))


def ssl_error_of(error: BaseException) -> BaseException | None:
    """The `ssl.SSLError` behind a client's error (under trio it is a cause, not the message)."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    return cause


@pytest.mark.parametrize(
    "case",
    ["only --certfile", "only --keyfile", "a key file that is not there", "a garbled key", "a key not the cert's"],
)
def test_tls_files_that_do_not_load_stop_serve_before_it_listens_naming_them(
    lab: Lab, certificate: tuple[Path, Path], tmp_path: Path, case: str
) -> None:
    cert, key = certificate
    garbled = tmp_path / "garbled.pem"
    garbled.write_text(key.read_text()[:60] + "not base64 at all\n-----END PRIVATE KEY-----\n")
    other = tmp_path / "other.pem"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", str(other)],
        check=True,
        capture_output=True,
    )
    options = {
        "only --certfile": ["--certfile", str(cert)],
        "only --keyfile": ["--keyfile", str(key)],
        "a key file that is not there": ["--certfile", str(cert), "--keyfile", str(tmp_path / "missing.pem")],
        "a garbled key": ["--certfile", str(cert), "--keyfile", str(garbled)],
        "a key not the cert's": ["--certfile", str(cert), "--keyfile", str(other)],
    }[case]
    said = refused_at_start(lab, "--listen", "127.0.0.1:0", *options)
    if case.startswith("only"):
        assert "TLS needs both --certfile and --keyfile" in said
    else:
        assert "do not load as a PEM certificate chain and its private key" in said
        assert options[-1] in said


def test_a_gateway_with_tls_files_that_do_not_load_stops_before_it_reaches_for_its_database(
    lab: Lab, certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    cert, _ = certificate
    done = subprocess.run(
        serve_argv("--postgres", "postgresql://nobody@127.0.0.1:1/none", "--listen", "127.0.0.1:0")
        + ["--certfile", str(cert), "--keyfile", str(tmp_path / "missing.pem")],
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 2
    assert "do not load as a PEM certificate chain" in done.stderr and "cannot connect" not in done.stderr


def test_a_public_address_needs_tokens_and_with_them_serve_starts(
    serves: list[ListeningServe], lab: Lab, tmp_path: Path
) -> None:
    said = refused_at_start(lab, "--listen", "0.0.0.0:0")
    assert "--tokens" in said and "not a loopback address" in said
    tokens = write_tokens(tmp_path / "tokens.yaml", {TOKEN: "tests"})
    serve = listening(serves, lab, "--listen", "0.0.0.0:0", "--tokens", str(tokens))
    port = serve.url.rpartition(":")[2]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=WAIT) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/v1/stats").status_code == 401
        assert client.get("/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"}).json()["type"] == "stats"
