"""Attachments in: the address rule, names and types (pure), the turn's directory, and fetching from a real HTTP
server on loopback (allowed only by an explicit exception: the default refuses loopback before connecting)."""

from __future__ import annotations

import base64
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import loopback_only
import pytest
import trio
from attachment_files import TURN_FILES, left_in

import bridge
import bridge.log
from bridge.engine.one_process import drive_turn
from bridge.errors import AttachmentRefused
from bridge.files.attachments import AttachmentFailed, prepare_attachments
from bridge.files.fetch_policy import (
    AttachmentPolicy,
    checked_media_type,
    decode_data_uri,
    http_target,
    safe_name,
    shown_url,
    source_kind,
)
from bridge.files.turn_directory import TurnFiles
from bridge.profile.sections import AttachmentsSettings
from bridge.turn import Attachment, Turn


@pytest.fixture(autouse=True)
def loopback_only_guard() -> Iterator[None]:
    """A fetch that a regression lets past the address rule fails on an assertion here, and sends nothing."""
    loopback_only.attempts.clear()
    loopback_only.install()
    try:
        yield
    finally:
        loopback_only.uninstall()
    assert loopback_only.beyond_loopback() == [], "a test tried to connect beyond loopback"


PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 40
JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 40
LOG = bridge.log.get_logger()

# ---------------------------------------------------------------------- the address rule (pure)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "::1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata
        "fe80::1",
        "224.0.0.1",
        "ff02::1",
        "0.0.0.0",
        "::",
        "100.64.0.1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:169.254.169.254",
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "fc00::1",
        "fec0::1",  # site-local (deprecated, never global): Python's ipaddress calls it global
        "240.0.0.1",
    ],
)
def test_addresses_not_public_are_refused_by_default(address: str) -> None:
    assert AttachmentPolicy().refusal("files.example", address) is not None


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "64:ff9b::5db8:d822"])
def test_public_addresses_pass(address: str) -> None:
    assert AttachmentPolicy().refusal("files.example", address) is None


def test_exceptions_only_by_an_explicit_host_or_network() -> None:
    policy = AttachmentPolicy(AttachmentsSettings(allow_hosts=("Files.Internal.", "10.0.0.0/8", "::1")))
    assert policy.refusal("files.internal", "10.9.9.9") is None
    assert policy.refusal("files.internal", "192.168.0.1") is None  # the host is named: all its addresses
    assert policy.refusal("other", "10.2.3.4") is None
    assert policy.refusal("other", "::1") is None
    assert policy.refusal("other", "127.0.0.1") is not None
    assert policy.refusal("other", "169.254.169.254") is not None
    assert AttachmentPolicy().with_hosts(["127.0.0.1"]).refusal("x", "127.0.0.1") is None


def test_schemes_other_than_http_data_and_paths_are_refused() -> None:
    assert source_kind("https://a/b") == source_kind("HTTP://a/b") == "http"
    assert source_kind("data:,x") == "data"
    assert source_kind("/tmp/x.png") == source_kind("cat.png") == source_kind("./a:b") == "path"
    for url in ("file:///etc/passwd", "ftp://x/y", "gopher://x", "javascript:alert(1)"):
        with pytest.raises(AttachmentRefused, match="scheme"):
            source_kind(url)


def test_a_url_is_shown_without_credentials_or_query() -> None:
    url = "https://bob:hunter2@files.example:8443/a/cat.png?token=SECRET#frag"
    assert shown_url(url) == "https://files.example:8443/a/cat.png"
    assert "SECRET" not in shown_url(url) and "hunter2" not in shown_url(url)
    assert shown_url("data:image/png;base64," + "A" * 1000).startswith("data:image/png;base64,… (")
    with pytest.raises(AttachmentRefused) as refused:
        http_target(url)
    assert "hunter2" not in str(refused.value) and "bob" not in str(refused.value)


def test_names_are_sanitised_and_unique() -> None:
    taken: set[str] = set()
    assert safe_name("../../etc/passwd", taken) == "passwd"
    assert safe_name("..", taken) == "attachment"
    assert safe_name(".bashrc", taken) == "bashrc"
    assert safe_name("a\x00b\nc.txt", taken) == "a_b_c.txt"
    assert safe_name("C:\\Users\\x\\photo.png", taken) == "photo.png"
    assert safe_name("photo.png", taken) == "photo-2.png"
    assert safe_name("PHOTO.png", taken) == "PHOTO-3.png"
    long = safe_name("é" * 300 + ".jpeg", taken)
    assert long.endswith(".jpeg") and len(long.encode()) <= 120
    assert safe_name("", taken, "attachment-7") == "attachment-7"


def test_an_image_type_is_checked_against_its_bytes() -> None:
    assert checked_media_type("image", "image/png", PNG) == "image/png"
    assert checked_media_type("image", "application/octet-stream", JPEG) == "image/jpeg"
    assert checked_media_type("image", "", b"RIFF\0\0\0\0WEBPVP8 ") == "image/webp"
    assert checked_media_type("image", "image/gif", b"GIF89a....") == "image/gif"
    assert checked_media_type("image", "image/heic", b"\0\0\0\x18ftypheic") == "image/heic"  # unchecked, as declared
    with pytest.raises(AttachmentRefused, match="declared image/png but its bytes are JPEG"):
        checked_media_type("image", "image/png", JPEG)
    with pytest.raises(AttachmentRefused, match="not PNG"):
        checked_media_type("image", "image/png", b"<html>")
    with pytest.raises(AttachmentRefused, match="none of PNG"):
        checked_media_type("image", "text/html", b"<html>")
    assert checked_media_type("file", "", b"%PDF-1.7") == "application/octet-stream"
    assert checked_media_type("file", "application/pdf", b"%PDF-1.7") == "application/pdf"


def test_data_uris() -> None:
    assert decode_data_uri("data:image/png;base64," + base64.b64encode(PNG).decode(), 1000) == ("image/png", PNG)
    assert decode_data_uri("data:,hello%20world", 1000) == ("text/plain", b"hello world")  # RFC 2397: not base64
    with pytest.raises(AttachmentRefused, match="not valid base64"):
        decode_data_uri("data:image/png;base64,not*base64!", 1000)
    with pytest.raises(AttachmentRefused, match="no ','"):
        decode_data_uri("data:image/png;base64", 1000)
    with pytest.raises(AttachmentRefused, match="over 10 bytes"):
        decode_data_uri("data:;base64," + base64.b64encode(b"x" * 100).decode(), 10)


def test_the_cli_form_takes_a_bare_path_or_url() -> None:
    assert Attachment.parse("image=https://x/y").type == "image"
    assert Attachment.parse("./cat.PNG").type == "image"
    assert Attachment.parse("https://x/report.pdf?sig=1") == Attachment("file", "https://x/report.pdf?sig=1")
    assert Attachment.parse("/tmp/a=b.mp3").type == "audio"
    assert Attachment.parse("data:image/png;base64,AA==").name == ""


# ---------------------------------------------------------------------- the turn's directory


def test_the_turn_directories_are_made_and_removed(tmp_path: Path) -> None:
    files = TurnFiles(str(tmp_path), "t1")
    other = TurnFiles(str(tmp_path), "t1")  # another host's turn-1 in the same working directory
    name = re.fullmatch(re.escape(str(tmp_path / ".agent-bridge/attachments")) + "/(t1-[0-9a-f]{8})", files.attachments)
    assert name is not None and files.outbox == str(tmp_path / ".agent-bridge/outbox" / name[1])
    assert other.outbox != files.outbox and other.attachments != files.attachments
    other.remove()
    assert os.path.isdir(files.outbox)
    os.close(files.create("x"))
    files.remove_attachments()  # the turn is over: what was fetched goes, the outbox stays for delivery
    assert not os.path.exists(files.attachments) and os.path.isdir(files.outbox)
    (tmp_path / "mine.txt").write_text("the agent's")
    files.remove()
    assert left_in(tmp_path) == ["mine.txt"]
    files.remove()  # once


def test_a_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / ".agent-bridge").symlink_to(elsewhere)
    with pytest.raises(bridge.errors.FileRefused, match="symlink"):
        TurnFiles(str(cwd), "t1")
    assert list(elsewhere.iterdir()) == []
    (cwd / ".agent-bridge").unlink()
    (cwd / ".agent-bridge").mkdir()
    (cwd / ".agent-bridge" / "outbox").symlink_to(elsewhere)
    with pytest.raises(bridge.errors.FileRefused, match="symlink"):
        TurnFiles(str(cwd), "t2")
    assert list(elsewhere.iterdir()) == []
    assert (cwd / ".agent-bridge" / "outbox").is_symlink()  # not ours: not removed
    (cwd / ".agent-bridge" / "outbox").unlink()
    (cwd / ".agent-bridge" / "attachments").symlink_to(elsewhere)
    with pytest.raises(bridge.errors.FileRefused, match="symlink"):
        TurnFiles(str(cwd), "t3")
    assert list(elsewhere.iterdir()) == []
    assert (cwd / ".agent-bridge" / "attachments").is_symlink()  # not ours: not removed
    assert list((cwd / ".agent-bridge" / "outbox").iterdir()) == []  # the outbox made for t3 is


# ---------------------------------------------------------------------- a real HTTP server on loopback


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    requests: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/octet-stream", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", headers.pop("length", str(len(body))))
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.requests.append(self.path)
        path = self.path.split("?")[0]
        if path == "/cat.png":
            self._send(200, PNG, "image/png")
        elif path == "/notes.txt":
            self._send(200, b"some notes\n", "text/plain; charset=utf-8")
        elif path == "/empty":
            self._send(200, b"", "text/plain")
        elif path == "/lying.png":
            self._send(200, JPEG, "image/png")
        elif path == "/huge":  # says so at once
            self._send(200, b"", length=str(10**9))
        elif path == "/endless":  # no length: the limit cuts it while it streams
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"x" * 65536
            try:
                for _ in range(2000):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                pass
        elif path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass
        elif path == "/redirect":
            self._send(302, b"", Location="/cat.png")
        elif path == "/loop":
            self._send(302, b"", Location="/loop")
        elif path == "/to-metadata":
            self._send(302, b"", Location="http://169.254.169.254/latest/meta-data/")
        elif path == "/to-file":
            self._send(302, b"", Location="file:///etc/passwd")
        elif path == "/to-unreadable":
            self._send(302, b"", Location="http://[::1/x")
        else:
            self._send(404, b"no")


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    _Handler.requests = []
    # shutdown() waits for serve_forever to look at its flag, every poll interval (0.5 s unless given)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


LOOPBACK = AttachmentPolicy(AttachmentsSettings(allow_hosts=("127.0.0.1",)))
LOOPBACK_FETCH = {"fetch": True, "allow_hosts": ["127.0.0.1"]}  # a profile's section (agentproc-0.1 passes through)


async def fetch(tmp_path: Path, *attachments: Attachment, policy: AttachmentPolicy = LOOPBACK) -> Turn:
    """The turn's attachments fetched into a turn directory in `tmp_path`; removed again when the fetch fails (as
    the engine does)."""
    files = TurnFiles(str(tmp_path), "t")
    try:
        return await prepare_attachments(Turn("hi", attachments=attachments), files, policy, LOG)
    except BaseException:
        files.remove()
        raise


async def refused(tmp_path: Path, *attachments: Attachment, policy: AttachmentPolicy = LOOPBACK) -> str:
    with pytest.raises(AttachmentFailed) as failed:
        await fetch(tmp_path, *attachments, policy=policy)
    assert left_in(tmp_path) == []  # nothing half-written is left
    return failed.value.message


async def test_files_are_fetched_at_once_with_their_checked_types(tmp_path: Path, server: str) -> None:
    turn = await fetch(
        tmp_path,
        Attachment("image", f"{server}/cat.png?sig=1"),
        Attachment("file", f"{server}/notes.txt", name="../notes.txt"),
        Attachment("image", f"{server}/redirect", name="cat.png"),
        Attachment("file", f"{server}/empty"),
        Attachment("image", "data:image/png;base64," + base64.b64encode(PNG).decode()),
    )
    cat, notes, redirected, empty, data = turn.attachments
    [directory] = (tmp_path / ".agent-bridge/attachments").iterdir()
    assert cat.path == str(directory / "cat.png") and Path(cat.path).read_bytes() == PNG
    assert (cat.media_type, cat.size) == ("image/png", len(PNG))
    assert notes.path == str(directory / "notes.txt") and notes.media_type == "text/plain"
    assert notes.name == "../notes.txt"  # the name for people is kept; the file's name is sanitised
    assert redirected.path == str(directory / "cat-2.png")
    assert (empty.size, Path(empty.path).read_bytes()) == (0, b"")
    assert data.path == str(directory / "attachment-5.png") or Path(data.path).read_bytes() == PNG
    assert cat.to_dict()["path"] == cat.path


async def test_a_lying_server_is_refused(tmp_path: Path, server: str) -> None:
    message = await refused(tmp_path, Attachment("image", f"{server}/lying.png"))
    assert message.startswith("attachment 'lying.png' (http://127.0.0.1:")
    assert "declared image/png but its bytes are JPEG" in message


async def test_an_empty_image_is_refused(tmp_path: Path, server: str) -> None:
    assert "bytes are none of PNG" in await refused(tmp_path, Attachment("image", f"{server}/empty"))


async def test_sizes_are_enforced_while_streaming(tmp_path: Path, server: str) -> None:
    small = AttachmentPolicy(AttachmentsSettings(allow_hosts=("127.0.0.1",), max_file_bytes=1_000_000))
    assert "the largest file allowed" in await refused(tmp_path, Attachment("file", f"{server}/huge"), policy=small)
    message = await refused(tmp_path, Attachment("file", f"{server}/endless"), policy=small)
    assert "the largest file allowed (attachments.max_file_bytes)" in message
    both = AttachmentPolicy(AttachmentsSettings(allow_hosts=("127.0.0.1",), max_turn_bytes=60))
    assert "come to over 60 bytes together" in await refused(
        tmp_path, Attachment("file", f"{server}/cat.png"), Attachment("file", f"{server}/cat.png"), policy=both
    )


async def test_the_total_time_is_bounded(tmp_path: Path, server: str) -> None:
    quick = AttachmentPolicy(AttachmentsSettings(allow_hosts=("127.0.0.1",), timeout_secs=0.5))
    started = trio.current_time()
    assert "within 0.5 s" in await refused(tmp_path, Attachment("file", f"{server}/slow"), policy=quick)
    assert trio.current_time() - started < 3


async def test_loopback_is_refused_by_default_before_connecting(tmp_path: Path, server: str) -> None:
    message = await refused(tmp_path, Attachment("file", f"{server}/notes.txt"), policy=AttachmentPolicy())
    assert "127.0.0.1 resolves to 127.0.0.1, a loopback address" in message
    message = await refused(tmp_path, Attachment("file", "http://localhost:9/x"), policy=AttachmentPolicy())
    assert "a loopback address" in message
    assert _Handler.requests == []


def resolving_to(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> None:
    """Every host name resolves to `addresses`, in that order (as a DNS answer may list them)."""

    async def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        return [
            (trio.socket.AF_INET6 if ":" in address else trio.socket.AF_INET, trio.socket.SOCK_STREAM, 6, "",
             (address, port) if "." in address else (address, port, 0, 0))
            for address in addresses
        ]  # fmt: skip

    monkeypatch.setattr(trio.socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize(
    ("addresses", "refused_address", "why"),
    [
        (("93.184.216.34", "169.254.169.254"), "169.254.169.254", "a link-local address"),
        (("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "10.0.0.7"), "10.0.0.7", "a private address"),
        (("2606:2800:220:1:248:1893:25c8:1946", "::1"), "::1", "a loopback address"),
    ],
)
async def test_a_name_resolving_to_a_public_address_and_a_refused_one_is_refused_unconnected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, addresses: tuple[str, ...], refused_address: str, why: str
) -> None:
    """DNS rebinding: a check of the first address alone would connect to the public one (or, at the next
    lookup, to the refused one). Every address is checked before any connection."""
    resolving_to(monkeypatch, *addresses)
    message = await refused(tmp_path, Attachment("file", "http://files.example/report.pdf"), policy=AttachmentPolicy())
    assert f"files.example resolves to {refused_address}, {why}" in message
    assert loopback_only.attempts == [], "a connection was attempted"


async def test_every_redirect_is_checked(tmp_path: Path, server: str) -> None:
    message = await refused(tmp_path, Attachment("file", f"{server}/to-metadata"))
    assert "169.254.169.254, a link-local address" in message
    assert loopback_only.attempts == ["127.0.0.1"], "the redirect's address was connected to"
    loopback_only.attempts.clear()
    assert "not http or https" in await refused(tmp_path, Attachment("file", f"{server}/to-file"))
    assert "more than 5 times" in await refused(tmp_path, Attachment("file", f"{server}/loop"))
    assert "redirected it to a URL that is not valid" in await refused(
        tmp_path, Attachment("file", f"{server}/to-unreadable")
    )


async def test_bad_input(tmp_path: Path, server: str) -> None:
    assert "404" in await refused(tmp_path, Attachment("file", f"{server}/missing"))
    assert "not valid base64" in await refused(tmp_path, Attachment("file", "data:;base64,%%%"))
    assert "scheme ftp:" in await refused(tmp_path, Attachment("file", "ftp://x/y"))
    many = [Attachment("file", f"{server}/notes.txt")] * 10_000
    assert "10000 attachments, over the 10 allowed" in await refused(tmp_path, *many)
    assert "not a regular file" in await refused(tmp_path, Attachment("file", "/dev/null"))
    assert "No such file" in await refused(tmp_path, Attachment("file", str(tmp_path / "nope")))


async def test_a_url_with_credentials_is_refused_and_never_logged(tmp_path: Path, server: str) -> None:
    lines: list[str] = []
    bridge.log.configure_logging("debug", "json")
    url = server.replace("http://", "http://bob:hunter2@") + "/notes.txt?token=SECRET"
    profile = bridge.Profile(command=["true"], attachments=LOOPBACK_FETCH, cwd=str(tmp_path))
    with bridge.log.records_to(lines.append):
        result = await drive_turn(profile, Turn("hi", attachments=[Attachment("file", url)]))
    bridge.log.configure_logging("warning", "json")
    assert result.outcome == "attachment_failed" and result.exit_code == 1
    assert "credentials" in result.error
    text = "".join(lines) + json.dumps(result.to_dict())
    assert lines and "hunter2" not in text and "SECRET" not in text


async def test_a_cancel_while_fetching(tmp_path: Path, server: str) -> None:
    cancel = trio.Event()
    profile = bridge.Profile(command=["true"], attachments=LOOPBACK_FETCH, cwd=str(tmp_path))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_set_once_requested, "/slow", cancel)
        result = await drive_turn(
            profile, Turn("hi", attachments=[Attachment("file", f"{server}/slow")]), cancel=cancel
        )
    assert (result.outcome, result.exit_code) == ("cancelled", 130)
    assert left_in(tmp_path) == []


async def _set_once_requested(path: str, event: trio.Event) -> None:
    """`event` set once the server has been asked for `path` (its body comes a byte a 0.1 s: still fetching)."""
    with trio.fail_after(10):
        while path not in _Handler.requests:
            await trio.sleep(0.01)
    event.set()


# ---------------------------------------------------------------------- through the engine and its front doors

READER = """#!/bin/sh
printf 'image=%s\\n' "$AGENT_IMAGE_PATH"
cat "$AGENT_IMAGE_PATH" | od -An -c | head -1
printf '%s\\n' "$AGENT_ATTACHMENTS"
"""


def reader_profile(tmp_path: Path, **fields: Any) -> Path:
    script = tmp_path / "reader.sh"
    script.write_text(READER)
    script.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    attachments = {"fetch": True, "allow_hosts": ["127.0.0.1"]}  # agentproc-0.1 passes URLs through by default
    profile = {"command": [str(script)], "cwd": str(work), "attachments": attachments, **fields}
    path = tmp_path / "reader.yaml"
    path.write_text(json.dumps(profile))
    return path


async def test_an_agentproc_01_agent_reads_its_file(tmp_path: Path, server: str) -> None:
    profile = bridge.load_profile(reader_profile(tmp_path), cache=False)
    result = await drive_turn(profile, Turn("look", attachments=[Attachment("image", f"{server}/cat.png")]))
    assert result.ok, result.error
    work = tmp_path / "work"
    first, second, third = result.reply.splitlines()
    assert first.startswith(f"image={work}/.agent-bridge/attachments/") and first.endswith("/cat.png")
    assert "P   N   G" in second
    [entry] = json.loads(third)
    assert entry["path"] == first.removeprefix("image=") and entry["media_type"] == "image/png"
    assert entry["size"] == len(PNG) and entry["url"] == f"{server}/cat.png"
    assert left_in(work) == []  # removed at the turn's end


async def test_an_agentproc_01_agent_gets_a_large_data_uri_as_its_file(tmp_path: Path) -> None:
    """Whole, a 200 KiB `data:` URI would pass the OS's 128 KiB limit for one variable: the URL names the file."""
    picture = PNG + bytes(range(256)) * 800
    uri = "data:image/png;base64," + base64.b64encode(picture).decode()
    assert len(uri) > 200_000
    profile = bridge.load_profile(reader_profile(tmp_path), cache=False)
    for attachments in ([Attachment("image", uri)], [Attachment("image", uri), Attachment("file", "data:,notes")]):
        result = await drive_turn(profile, Turn("look", attachments=attachments))
        assert result.ok, (result.outcome, result.error)
        entries = json.loads(result.reply.splitlines()[-1])
        for entry in entries:
            assert entry["url"] == "file://" + entry["path"]
        assert [entry["size"] for entry in entries][:1] == [len(picture)]


async def test_a_profile_may_keep_the_files(tmp_path: Path, server: str) -> None:
    profile = bridge.load_profile(
        reader_profile(tmp_path, attachments={"fetch": True, "allow_hosts": ["127.0.0.1"], "keep": True}), cache=False
    )
    result = await drive_turn(profile, Turn("look", attachments=[Attachment("image", f"{server}/cat.png")]))
    kept = Path(result.reply.splitlines()[0].removeprefix("image="))
    assert kept.read_bytes() == PNG
    work = tmp_path / "work"
    assert left_in(work) == [str(kept.parent.relative_to(work)), str(kept.relative_to(work))]  # not the outbox


def test_run_attach_a_local_path(tmp_path: Path) -> None:
    import subprocess

    picture = tmp_path / "cat.png"
    picture.write_bytes(PNG)
    run = subprocess.run(
        [sys.executable, "-m", "bridge", "run", str(reader_profile(tmp_path)), "look", "--attach", str(picture)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0, run.stderr
    assert re.search(rf"{TURN_FILES}/cat\.png$", run.stdout.splitlines()[0])


def test_run_attach_fails_the_turn_before_the_agent_starts(tmp_path: Path) -> None:
    import subprocess

    run = subprocess.run(
        [sys.executable, "-m", "bridge", "run", str(reader_profile(tmp_path)), "look", "--json", "--attach",
         "http://169.254.169.254/latest/meta-data/"],
        capture_output=True, text=True, timeout=30, env=loopback_only.subprocess_env(),
    )  # fmt: skip
    assert loopback_only.REFUSED not in run.stdout + run.stderr
    assert run.returncode == 1, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["outcome"] == "attachment_failed"
    assert "attachment 'meta-data' (http://169.254.169.254/latest/meta-data/)" in result["error"]
    assert "link-local" in result["error_reply"]


async def test_through_the_host(tmp_path: Path, server: str) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    reader_profile(tmp_path).rename(profiles / "reader.yaml")
    async with bridge.open_host(profiles, state=tmp_path / "state.sqlite3") as host:
        result = await host.submit("reader", "c1", Turn("look", attachments=[Attachment("image", f"{server}/cat.png")]))
    assert result.ok, result.error
    assert re.search(rf"{TURN_FILES}/cat\.png$", result.reply.splitlines()[0])


async def test_the_hosts_exceptions_add_to_the_profiles(tmp_path: Path, server: str) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    # the profile allows no loopback
    reader_profile(tmp_path, attachments={"fetch": True}).rename(profiles / "reader.yaml")
    turn = Turn("look", attachments=[Attachment("image", f"{server}/cat.png")])
    async with bridge.open_host(profiles, state=tmp_path / "state.sqlite3") as host:
        refused = await host.submit("reader", "c1", turn)
    async with bridge.open_host(profiles, state=tmp_path / "state.sqlite3", attachment_hosts=["127.0.0.1"]) as host:
        allowed = await host.submit("reader", "c1", turn)
    assert refused.outcome.value == "attachment_failed" and "loopback" in refused.error
    assert allowed.ok and re.search(rf"{TURN_FILES}/cat\.png$", allowed.reply.splitlines()[0])
    with pytest.raises(TypeError, match="its workers do"):
        bridge.open_host(postgres="postgresql://nowhere/db", attachment_hosts=["127.0.0.1"])


def test_serve_takes_the_hosts_exceptions_from_its_option(tmp_path: Path, server: str) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    reader_profile(tmp_path, attachments={"fetch": True}).rename(profiles / "reader.yaml")
    request = {"type": "turn", "profile": "reader", "conversation": "c", "message": "look"}
    lines = [
        json.dumps({**request, "id": "t1", "attachments": [{"type": "image", "url": f"{server}/cat.png"}]}),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "serve", "--profiles", str(profiles), "--state", str(tmp_path / "s.db"),
         "--allow-attachment-host", "127.0.0.0/8"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60, env=loopback_only.subprocess_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [result] = [response for response in map(json.loads, done.stdout.splitlines()) if response["type"] == "result"]
    assert result["outcome"] == "ok", result
    gateway = subprocess.run(
        [sys.executable, "-m", "bridge", "serve", "--postgres", "postgresql://nowhere/db",
         "--allow-attachment-host", "127.0.0.1"],
        input="", capture_output=True, text=True, timeout=60, env=loopback_only.subprocess_env(),
    )  # fmt: skip
    assert gateway.returncode == 2 and "its workers do" in gateway.stderr


def test_serve_refuses_a_local_path() -> None:
    from bridge.serving.requests import parse_turn

    for url, why in [("/etc/passwd", "a local path is for the host's own code"), ("file:///x", "scheme file:")]:
        request = {"type": "turn", "id": "1", "profile": "p", "conversation": "c", "message": "m"}
        with pytest.raises(bridge.errors.RequestError, match=why):
            parse_turn({**request, "attachments": [{"type": "file", "url": url}]})
    assert parse_turn({**request, "attachments": [{"type": "file", "url": "https://x/y"}]})


def test_serve_answers_a_url_it_cannot_read_and_stays_up(tmp_path: Path) -> None:
    """A client's URL whose host part cannot be read (an unclosed IPv6 bracket, with or without a name) is an
    invalid request, and a host name no DNS name can be (IDNA refuses it) fails its turn before the agent starts:
    neither is an internal error, and the next turn is answered."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    reader_profile(tmp_path).rename(profiles / "reader.yaml")
    base = {"type": "turn", "profile": "reader", "conversation": "c", "message": "look"}
    requests = [
        {**base, "id": "bracket", "attachments": [{"type": "file", "url": "http://[::1/x.txt"}]},
        {**base, "id": "named", "attachments": [{"type": "file", "url": "http://[::1/x.txt", "name": "x.txt"}]},
        {**base, "id": "idna", "attachments": [{"type": "file", "url": "http://\u2603\u2603.example/x.txt"}]},
        {**base, "id": "after"},
    ]
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "serve", "--profiles", str(profiles), "--state", str(tmp_path / "s.db")],
        input="".join(json.dumps(request) + "\n" for request in requests), capture_output=True, text=True,
        timeout=60, env=loopback_only.subprocess_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answers = {
        answer["id"]: answer for answer in map(json.loads, done.stdout.splitlines()) if answer["type"] != "accepted"
    }
    for request_id in ("bracket", "named"):
        assert answers[request_id]["code"] == "invalid_request", answers[request_id]
        assert "not a valid URL" in answers[request_id]["message"]
    assert answers["idna"]["outcome"] == "attachment_failed", answers["idna"]
    assert "not a valid domain name" in answers["idna"]["error"]
    assert answers["after"]["outcome"] == "ok"
    assert "unexpected error" not in done.stderr
    assert left_in(tmp_path / "work") == []


# ---------------------------------------------------------------------- pass-through (attachments.fetch: false)

ENV_PRINTER = """import json, os
print(json.dumps({name: os.environ.get(name) for name in
                  ("AGENT_ATTACHMENTS", "AGENT_IMAGE_URL", "AGENT_FILE_URL", "AGENT_IMAGE_PATH", "AGENT_FILE_PATH")}))
"""


def env_printer_profile(tmp_path: Path, **fields: Any) -> Path:
    """An agentproc-0.1 agent (the default protocol) that answers with its attachment variables, as JSON."""
    script = tmp_path / "env_printer.py"
    script.write_text(ENV_PRINTER)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    path = tmp_path / "printer.yaml"
    path.write_text(json.dumps({"command": [sys.executable, str(script)], "cwd": str(work), **fields}))
    return path


async def attachment_variables(profile_path: Path, *attachments: Attachment) -> dict[str, Any]:
    profile = bridge.load_profile(profile_path, cache=False)
    with trio.fail_after(15):
        result = await drive_turn(profile, Turn("look", attachments=attachments))
    assert result.ok, (result.outcome, result.error)
    variables: dict[str, Any] = json.loads(result.reply)
    return variables


def test_each_protocol_has_its_default_and_a_profile_overrides_it() -> None:
    from bridge.dialects import PROTOCOLS
    from bridge.files.attachments import policy_of

    for protocol in PROTOCOLS:
        profile = bridge.Profile(command=["true"], protocol=protocol)
        assert policy_of(profile).fetch is (protocol != "agentproc-0.1"), protocol
        for fetch in (True, False):
            assert policy_of(profile.replace(attachments={"fetch": fetch})).fetch is fetch, protocol
    with pytest.raises(bridge.errors.ProfileError, match="fetch"):
        bridge.Profile(command=["true"], attachments={"fetch": "no"})


async def test_an_agentproc_01_agent_gets_the_urls_as_sent_and_nothing_is_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract's pass-through: `{type, url, name}` and the single-attachment URL, whatever the URL names — a
    host this machine does not resolve, a signed URL, a private service — and the turn does not fail."""
    looked_up: list[str] = []

    async def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(host)
        raise trio.socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(trio.socket, "getaddrinfo", getaddrinfo)
    profile = env_printer_profile(tmp_path)
    signed = "https://files.internal.invalid/cat.png?X-Amz-Signature=abc&X-Amz-Expires=60"
    variables = await attachment_variables(profile, Attachment("image", signed))
    assert variables == {
        "AGENT_ATTACHMENTS": json.dumps([{"type": "image", "url": signed, "name": "cat.png"}]),
        "AGENT_IMAGE_URL": signed,
        "AGENT_FILE_URL": None,
        "AGENT_IMAGE_PATH": None,
        "AGENT_FILE_PATH": None,
    }
    private = Attachment("file", "http://10.1.2.3:8080/report.pdf", name="Report")
    variables = await attachment_variables(profile, private)
    assert json.loads(variables["AGENT_ATTACHMENTS"]) == [
        {"type": "file", "url": "http://10.1.2.3:8080/report.pdf", "name": "Report"}
    ]
    assert (variables["AGENT_FILE_URL"], variables["AGENT_IMAGE_URL"]) == ("http://10.1.2.3:8080/report.pdf", None)
    variables = await attachment_variables(profile, Attachment("image", signed), private)
    assert [entry["url"] for entry in json.loads(variables["AGENT_ATTACHMENTS"])] == [signed, private.url]
    assert variables["AGENT_IMAGE_URL"] is None and variables["AGENT_FILE_URL"] is None  # two: only the list
    assert looked_up == [] and loopback_only.attempts == []
    assert left_in(tmp_path / "work") == []


async def test_pass_through_does_not_reach_a_server_the_bridge_could_fetch_from(tmp_path: Path, server: str) -> None:
    url = f"{server}/cat.png"
    variables = await attachment_variables(env_printer_profile(tmp_path), Attachment("image", url))
    assert (variables["AGENT_IMAGE_URL"], variables["AGENT_IMAGE_PATH"]) == (url, None)
    assert _Handler.requests == [] and loopback_only.attempts == []


async def test_fetch_true_on_agentproc_01_fetches_and_adds_the_path(tmp_path: Path, server: str) -> None:
    profile = env_printer_profile(tmp_path, attachments=LOOPBACK_FETCH)
    variables = await attachment_variables(profile, Attachment("image", f"{server}/cat.png"))
    [entry] = json.loads(variables["AGENT_ATTACHMENTS"])
    assert entry["url"] == variables["AGENT_IMAGE_URL"] == f"{server}/cat.png"
    assert entry["path"] == variables["AGENT_IMAGE_PATH"] and entry["path"].endswith("/cat.png")
    assert (entry["media_type"], entry["size"]) == ("image/png", len(PNG))
    assert _Handler.requests == ["/cat.png"]


async def test_a_data_uri_is_passed_through_unless_it_cannot_fit_in_the_environment(tmp_path: Path) -> None:
    profile = env_printer_profile(tmp_path)
    small = "data:text/plain;base64," + base64.b64encode(b"some notes").decode()
    variables = await attachment_variables(profile, Attachment("file", small, name="notes.txt"))
    assert variables["AGENT_FILE_URL"] == small and variables["AGENT_FILE_PATH"] is None
    assert json.loads(variables["AGENT_ATTACHMENTS"]) == [{"type": "file", "url": small, "name": "notes.txt"}]

    picture = PNG + bytes(range(256)) * 800
    large = "data:image/png;base64," + base64.b64encode(picture).decode()  # 200 KiB: over the 128 KiB of a variable
    variables = await attachment_variables(profile, Attachment("image", large), Attachment("file", small))
    entries = json.loads(variables["AGENT_ATTACHMENTS"])
    for entry in entries:  # decoded into the turn's directory, and named by file:// URL
        assert entry["url"] == "file://" + entry["path"]
        assert entry["path"].startswith(str(tmp_path / "work" / ".agent-bridge" / "attachments"))
    assert [entry["size"] for entry in entries] == [len(picture), len(b"some notes")]
    variables = await attachment_variables(profile, Attachment("image", large))
    assert variables["AGENT_IMAGE_URL"] == "file://" + variables["AGENT_IMAGE_PATH"]


def test_serve_passes_the_urls_through_to_an_agentproc_01_agent(tmp_path: Path) -> None:
    """Through the serve door as a client sends them: a private service's URL and the cloud metadata address (IP
    literals: no name is looked up even if this regresses) reach the agent, and the turn is ok."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    env_printer_profile(tmp_path).rename(profiles / "printer.yaml")
    urls = ["http://10.255.255.1/private.png", "http://169.254.169.254/latest/meta-data/"]
    request = {
        "type": "turn", "id": "t1", "profile": "printer", "conversation": "c", "message": "look",
        "attachments": [{"type": "image", "url": urls[0]}, {"type": "file", "url": urls[1], "name": "meta"}],
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "serve", "--profiles", str(profiles), "--state", str(tmp_path / "s.db")],
        input=json.dumps(request) + "\n", capture_output=True, text=True, timeout=60,
        env=loopback_only.subprocess_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert loopback_only.REFUSED not in done.stdout + done.stderr
    [result] = [response for response in map(json.loads, done.stdout.splitlines()) if response["type"] == "result"]
    assert result["outcome"] == "ok", result
    assert json.loads(json.loads(result["reply"])["AGENT_ATTACHMENTS"]) == [
        {"type": "image", "url": urls[0], "name": "private.png"},
        {"type": "file", "url": urls[1], "name": "meta"},
    ]


async def test_a_coding_cli_still_fetches_by_default(
    tmp_path: Path, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pi's ready profile: the fetched file is named in its prompt by path; `fetch: false` names its URL, fetched by
    nobody but the agent."""
    from conftest import CLI_PROFILES
    from fake_clis import install_fake_clis

    install_fake_clis(tmp_path, monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    profile = bridge.load_profile(CLI_PROFILES / "pi.yaml", cache=False).replace(cwd=str(work))
    turn = Turn("look", attachments=[Attachment("image", f"{server}/cat.png")])
    with trio.fail_after(30):
        fetched = await drive_turn(profile, turn, allow_hosts=("127.0.0.1",))
    assert fetched.ok, (fetched.outcome, fetched.error)
    assert re.search(rf"Attached files:\n- {work}/{TURN_FILES}/cat\.png \(image, image/png\)", fetched.reply)
    assert _Handler.requests == ["/cat.png"]
    with trio.fail_after(30):
        passed = await drive_turn(profile.replace(attachments={"fetch": False}), turn, allow_hosts=("127.0.0.1",))
    assert passed.ok and f"Attached files:\n- {server}/cat.png (image)" in passed.reply, passed.reply
    assert _Handler.requests == ["/cat.png"]


async def test_fetch_false_on_a_warm_protocol_hands_the_agent_the_url_its_way(tmp_path: Path, server: str) -> None:
    """ACP (the official SDK's sample agent): an unfetched attachment is a resource link to its URL."""
    from conftest import SAMPLE_AGENTS

    command = [sys.executable, str(SAMPLE_AGENTS / "acp_agent.py"), "--store", str(tmp_path / "sessions")]
    work = tmp_path / "work"
    work.mkdir()
    fields = {"command": command, "protocol": "acp", "cwd": str(work), "attachments": {"fetch": False}}
    profile = bridge.Profile.from_mapping(fields)
    url = f"{server}/notes.txt"
    with trio.fail_after(20):
        result = await bridge.run_turn(profile, Turn("blocks", attachments=[Attachment("file", url)]))
    assert result.ok, (result.outcome, result.error, result.stderr_tail)
    assert result.reply.startswith(f"link {url} "), result.reply
    assert _Handler.requests == []


async def test_passed_through_an_agentproc_04_agent_gets_what_the_reference_runner_gives_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference runner (agentproc 0.20, wire 0.4 only: it has no AGENT_* attachment variables) hands the
    caller's attachment entries over as they are; with `fetch: false` the bridge writes the same turn line, byte for
    byte, for URLs it could not fetch."""
    from agentproc import runner as reference

    async def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{host} was looked up")

    monkeypatch.setattr(trio.socket, "getaddrinfo", getaddrinfo)
    recorder = tmp_path / "recorder.py"
    recorder.write_text(
        "import sys\nopen(sys.argv[1], 'wb').write(sys.stdin.buffer.readline())\n"
        'print(\'{"type":"result","text":"ok"}\')\n'
    )
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    signed = "https://files.internal.invalid/cat.png?sig=abc"
    attachments = (Attachment("image", signed, name="cat.png"), Attachment("file", "http://10.0.0.7/r.pdf"))
    fields = {
        "protocol": "agentproc-0.4",
        "command": [sys.executable, str(recorder), str(ours)],
        "cwd": str(tmp_path),
        "attachments": {"fetch": False},
    }
    with trio.fail_after(15):
        result = await drive_turn(bridge.Profile.from_mapping(fields), Turn("look", attachments=attachments))
    assert (result.ok, result.reply) == (True, "ok"), result.error
    entries = [{"kind": "image", "url": signed, "filename": "cat.png"}, {"kind": "file", "url": attachments[1].url,
               "filename": "r.pdf"}]  # fmt: skip
    done = await trio.to_thread.run_sync(
        lambda: reference.run(
            {"command": sys.executable, "args": [str(recorder), str(theirs)], "timeout_secs": 10},
            reference.RunOptions(message="look", attachments=entries),
        )
    )
    assert done.reply == "ok"
    assert ours.read_bytes() == theirs.read_bytes()
    assert json.loads(ours.read_bytes())["attachments"] == entries


def test_check_warns_of_an_agentproc_01_attachments_section_that_does_not_say_fetch(tmp_path: Path) -> None:
    """A profile written when agentproc-0.1 fetched (its allow_hosts, its limits) now gets URLs: `check` says so."""
    written = {
        "old.yaml": "command: [cat]\nattachments: {allow_hosts: [127.0.0.1]}\n",
        "fetches.yaml": "command: [cat]\nattachments: {fetch: true, allow_hosts: [127.0.0.1]}\n",
        "passes.yaml": "command: [cat]\nattachments: {fetch: false}\n",
        "plain.yaml": "command: [cat]\n",
        "cli.yaml": "command: [cat]\nprotocol: pi-json\nattachments: {max_count: 3}\n",
    }
    for name, text in written.items():
        (tmp_path / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "check", *(str(tmp_path / name) for name in written)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "warning: attachments:" in line]
    assert len(warned) == 1 and warned[0].startswith(f"{tmp_path / 'old.yaml'}: warning: attachments: "), warned
    assert "add `fetch: true`" in warned[0]
