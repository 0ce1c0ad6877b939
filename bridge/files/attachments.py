"""Fetching a turn's attachments into their directory before the agent starts (docs/attachments.md).

`prepare_attachments` fetches every attachment into the turn's attachments directory (`TurnFiles`) at once (a
nursery), and gives back the turn whose attachments have `path`, `media_type` and `size`; the turn engine removes
the directory when the turn ends (`bridge.engine.hand_out.hand_out_turn_files`). A failure of any one fails the turn
before the agent starts (`AttachmentFailed`, outcome `attachment_failed`) and leaves nothing behind. With the profile's
`attachments.fetch` off (agentproc-0.1's default: its contract hands the agent the URLs), nothing is fetched and
the turn keeps its URLs; only a local path and an oversized list's `data:` URIs become files (`_passed_through`).

HTTP is h11 (sans-I/O, as the dialects are) over trio streams the bridge opens itself, so the address checked
is the address connected to: the host name is resolved here, every address it resolves to must pass
`AttachmentPolicy.refusal` (one refused address refuses the URL), and the connection goes to one of those
addresses — a second lookup that would answer otherwise (DNS rebinding) never happens. Redirects are followed
by hand, each one checked as the first URL was. Sizes are counted as the bytes arrive: a Content-Length over
the limit is refused before the body is read, and a body that goes on past it is cut off there.
"""

from __future__ import annotations

import errno
import os
import ssl
import stat
import urllib.parse
from dataclasses import dataclass, replace

import h11
import trio

from ..confinement.exec_limits import attachments_fit
from ..dialects import PROTOCOLS
from ..errors import AttachmentFailed, AttachmentRefused
from ..log import Logger
from ..profile import Profile
from ..profile.sections import AttachmentsSettings
from ..turn import Attachment, Turn, guessed_media_type, normalised_media_type
from .fetch_policy import (
    MAX_REDIRECTS,
    SNIFF_BYTES,
    AttachmentPolicy,
    checked_media_type,
    decode_data_uri,
    http_target,
    safe_name,
    shown_url,
    size_text,
    source_kind,
    source_kind_or_none,
)
from .turn_directory import TurnFiles

__all__ = ["AttachmentFailed", "makes_files", "policy_of", "prepare_attachments"]

_CHUNK = 64 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_USER_AGENT = "agent-bridge (attachment fetch)"


def policy_of(profile: Profile, allow_hosts: tuple[str, ...] = ()) -> AttachmentPolicy:
    """The attachment policy of `profile`'s `attachments` section, with a host's `allow_hosts` added; `fetch`
    unset is the protocol's default."""
    section = profile.attachments or AttachmentsSettings()
    fetch = PROTOCOLS[profile.protocol].fetches_attachments if section.fetch is None else section.fetch
    return AttachmentPolicy(section, fetch).with_hosts(allow_hosts)


def makes_files(profile: Profile, attachments: tuple[Attachment, ...], allow_hosts: tuple[str, ...] = ()) -> bool:
    """Whether `attachments` become files in the turn's directory under `profile` (fetched, or what a pass-through
    makes): a pass-through turn that makes none needs no attachments directory, and cannot fail for want of one."""
    return bool(attachments) and (policy_of(profile, allow_hosts).fetch or bool(_made_here(attachments)))


async def prepare_attachments(
    turn: Turn, files: TurnFiles, policy: AttachmentPolicy, log: Logger, cancel: trio.Event | None = None
) -> Turn:
    """`turn` with its attachments fetched into `files.attachments` (with `policy.fetch` off, only those
    `_passed_through` says). Raises `AttachmentFailed`; then, as on a trio cancellation, nothing fetched is left
    (the caller removes `files`)."""
    if not policy.fetch:
        return turn.replace(attachments=await _passed_through(turn.attachments, files, policy, log, cancel))
    if len(turn.attachments) > policy.settings.max_count:
        raise _failed(
            f"the turn has {len(turn.attachments)} attachments, over the {policy.settings.max_count} allowed "
            "(attachments.max_count); nothing was fetched"
        )
    return turn.replace(attachments=await _fetch_all(turn.attachments, files, policy, log, cancel))


async def _passed_through(
    attachments: tuple[Attachment, ...],
    files: TurnFiles,
    policy: AttachmentPolicy,
    log: Logger,
    cancel: trio.Event | None,
) -> tuple[Attachment, ...]:
    """The attachments as sent, URLs untouched, no address reached: only what the agent could not get otherwise
    is made a file (as a fetch would, within the same limits) — a local path (the host's own file, which the
    agent may not see from its directory or sandbox), and every `data:` URI when the list of them all would not
    fit in one environment variable (`AGENT_ATTACHMENTS`; its URLs then name the files)."""
    local = _made_here(attachments)
    if not local:
        return attachments
    made = await _fetch_all(tuple(attachments[index] for index in local), files, policy, log, cancel)
    handed = list(attachments)
    for index, attachment in zip(local, made, strict=True):
        handed[index] = attachment
    return tuple(handed)


def _made_here(attachments: tuple[Attachment, ...]) -> list[int]:
    """The indexes of the attachments a pass-through still makes files of (see `_passed_through`)."""
    fits = attachments_fit(attachments)
    return [
        index
        for index, attachment in enumerate(attachments)
        if (kind := source_kind_or_none(attachment.url)) == "path" or (kind == "data" and not fits)
    ]


def _failed(message: str) -> AttachmentFailed:
    return AttachmentFailed(message)


@dataclass(slots=True)
class _Budget:
    """What the turn's attachments may still bring together (`max_turn_bytes`): one count for all fetches."""

    left: int


async def _fetch_all(
    attachments: tuple[Attachment, ...],
    files: TurnFiles,
    policy: AttachmentPolicy,
    log: Logger,
    cancel: trio.Event | None,
) -> tuple[Attachment, ...]:
    taken: set[str] = set()
    names = [safe_name(item.name, taken, f"attachment-{index + 1}") for index, item in enumerate(attachments)]
    fetched: list[Attachment | None] = [None] * len(attachments)
    failures: list[str] = []
    budget = _Budget(policy.settings.max_turn_bytes)

    async def fetch(index: int, nursery: trio.Nursery) -> None:
        attachment = attachments[index]
        try:
            fetched[index] = await _fetch_one(attachment, names[index], files, policy, budget)
        except AttachmentRefused as err:
            reason = str(err)
        except h11.ProtocolError as err:
            reason = f"its server's answer is not valid HTTP/1.1 ({err})"
        except ssl.SSLError as err:
            reason = f"TLS failed: {err.reason or err}"
        except trio.BrokenResourceError:
            reason = "the connection broke before the whole file came"
        except OSError as err:
            reason = err.strerror or str(err)
        else:
            done = fetched[index]
            assert done is not None
            log.debug(
                "attachment fetched", name=done.name, source=shown_url(attachment.url), size=done.size,
                media_type=done.media_type,
            )  # fmt: skip
            return
        failures.append(f"attachment {attachment.name or names[index]!r} ({shown_url(attachment.url)}): {reason}")
        nursery.cancel_scope.cancel()

    with trio.move_on_after(policy.settings.timeout_secs) as timer:
        async with trio.open_nursery() as nursery:
            if cancel is not None:
                nursery.start_soon(_cancel_on, cancel, nursery.cancel_scope)
            async with trio.open_nursery() as fetches:
                for index in range(len(attachments)):
                    fetches.start_soon(fetch, index, fetches)
            nursery.cancel_scope.cancel()  # all fetched: stop watching `cancel`
    if failures:
        raise _failed(failures[0])
    if timer.cancelled_caught:
        raise _failed(
            f"the attachments were not all fetched within {policy.settings.timeout_secs:g} s (attachments.timeout_secs)"
        )
    if any(item is None for item in fetched):
        raise AttachmentFailed("cancelled while fetching the attachments", cancelled=True)
    return tuple(item for item in fetched if item is not None)


async def _cancel_on(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


class _Sink:
    """One attachment's file, written as its bytes arrive: counted against both limits, its type checked as
    soon as its first bytes are in (and at the end, for a shorter file)."""

    def __init__(
        self,
        files: TurnFiles,
        name: str,
        attachment: Attachment,
        declared: str,
        policy: AttachmentPolicy,
        budget: _Budget,
    ) -> None:
        self.attachment = attachment
        self.declared = declared or guessed_media_type(name)
        self.policy = policy
        self.budget = budget
        self.size = 0
        self.head = b""
        self.media_type = ""
        self.path = os.path.join(files.attachments, name)
        self._descriptor = files.create(name)

    def expect(self, length: int) -> None:
        """The server announced `length` bytes: refused at once when they cannot fit."""
        if length > self.policy.settings.max_file_bytes:
            raise self._too_big()
        if length > self.budget.left:
            raise self._turn_too_big()

    def write(self, data: bytes) -> None:
        self.size += len(data)
        self.budget.left -= len(data)
        if self.size > self.policy.settings.max_file_bytes:
            raise self._too_big()
        if self.budget.left < 0:
            raise self._turn_too_big()
        if not self.media_type and len(self.head) < SNIFF_BYTES:
            self.head += data[: SNIFF_BYTES - len(self.head)]
            if len(self.head) == SNIFF_BYTES:
                self.media_type = checked_media_type(self.attachment.type, self.declared, self.head)
        # A plain write: a chunk goes to the page cache in microseconds, less than a worker thread's hand-off.
        view = memoryview(data)
        while view:
            view = view[os.write(self._descriptor, view) :]

    def finish(self) -> Attachment:
        self.close()
        if not self.media_type:
            self.media_type = checked_media_type(self.attachment.type, self.declared, self.head)
        return replace(self.attachment, path=self.path, media_type=self.media_type, size=self.size)

    def close(self) -> None:
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1

    def _too_big(self) -> AttachmentRefused:
        return AttachmentRefused(
            f"it is over {size_text(self.policy.settings.max_file_bytes)}, the largest file allowed "
            "(attachments.max_file_bytes)"
        )

    def _turn_too_big(self) -> AttachmentRefused:
        return AttachmentRefused(
            f"the turn's attachments come to over {size_text(self.policy.settings.max_turn_bytes)} together "
            "(attachments.max_turn_bytes)"
        )


async def _fetch_one(
    attachment: Attachment, name: str, files: TurnFiles, policy: AttachmentPolicy, budget: _Budget
) -> Attachment:
    kind = source_kind(attachment.url)
    if kind == "data":
        declared, data = decode_data_uri(attachment.url, policy.settings.max_file_bytes)
        sink = _Sink(files, name, attachment, declared, policy, budget)
        try:
            sink.write(data)
            return sink.finish()
        finally:
            sink.close()
    if kind == "path":
        return await _copy_local(attachment, name, files, policy, budget)
    return await _fetch_http(attachment, name, files, policy, budget)


async def _copy_local(
    attachment: Attachment, name: str, files: TurnFiles, policy: AttachmentPolicy, budget: _Budget
) -> Attachment:
    """A local path (from the host's code or the CLI; serve refuses them): a regular file, copied."""
    try:
        descriptor = os.open(attachment.url, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise AttachmentRefused(f"it cannot be opened: {err.strerror}") from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):  # a FIFO or device would block, or never end
            raise AttachmentRefused("it is not a regular file")
        sink = _Sink(files, name, attachment, "", policy, budget)
        try:
            sink.expect(status.st_size)
            while chunk := await trio.to_thread.run_sync(os.read, descriptor, 16 * _CHUNK):
                sink.write(chunk)
            return sink.finish()
        finally:
            sink.close()
    finally:
        os.close(descriptor)


async def _fetch_http(
    attachment: Attachment, name: str, files: TurnFiles, policy: AttachmentPolicy, budget: _Budget
) -> Attachment:
    url = attachment.url
    for _ in range(MAX_REDIRECTS + 1):
        scheme, host, port, target = http_target(url)
        stream = await _connect(host, port, policy)
        try:
            if scheme == "https":
                stream = trio.SSLStream(
                    stream, ssl.create_default_context(), server_hostname=host, https_compatible=True
                )
                await stream.do_handshake()
            answer = await _exchange(stream, host, port, scheme, target, attachment, name, files, policy, budget)
        finally:
            await trio.aclose_forcefully(stream)
        if isinstance(answer, Attachment):
            return answer
        try:
            url = urllib.parse.urljoin(url, answer)
            urllib.parse.urlsplit(url)
        except ValueError:  # its message may quote the URL's credentials
            raise AttachmentRefused("its server redirected it to a URL that is not valid") from None
        if source_kind_or_none(url) != "http":
            raise AttachmentRefused("its server redirected it to a URL that is not http or https")
    raise AttachmentRefused(f"its server redirected it more than {MAX_REDIRECTS} times")


async def _connect(host: str, port: int, policy: AttachmentPolicy) -> trio.abc.Stream:
    """A connection to one of `host`'s addresses, every one of which passed the policy."""
    try:
        found = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    except trio.socket.gaierror as err:
        raise AttachmentRefused(f"its host {host} cannot be resolved: {err.strerror}") from None
    except UnicodeError:  # trio encodes a non-ASCII name by IDNA, which refuses some characters
        raise AttachmentRefused(f"its host {host!r} is not a valid domain name (IDNA refuses it)") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    for address in addresses:
        if reason := policy.refusal(host, address):
            raise AttachmentRefused(reason)
    error: OSError = OSError(errno.EHOSTUNREACH, "no address")
    for address in addresses:
        try:
            return await trio.open_tcp_stream(address, port)
        except OSError as err:
            error = err
    raise AttachmentRefused(f"cannot connect to {host} port {port}: {error.strerror or error}")


async def _exchange(
    stream: trio.abc.Stream,
    host: str,
    port: int,
    scheme: str,
    target: str,
    attachment: Attachment,
    name: str,
    files: TurnFiles,
    policy: AttachmentPolicy,
    budget: _Budget,
) -> Attachment | str:
    """One GET: the attachment fetched, or the URL (maybe relative) a redirect leads to."""
    connection = h11.Connection(h11.CLIENT)
    authority = f"[{host}]" if ":" in host else host
    if port != (443 if scheme == "https" else 80):
        authority += f":{port}"
    request = h11.Request(
        method="GET",
        target=target,
        headers=[
            ("Host", authority),
            ("User-Agent", _USER_AGENT),
            ("Accept", "*/*"),
            ("Accept-Encoding", "identity"),
            ("Connection", "close"),
        ],
    )
    await stream.send_all(connection.send(request) + (connection.send(h11.EndOfMessage()) or b""))
    sink: _Sink | None = None
    try:
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(bytes(await stream.receive_some(_CHUNK)))
            elif isinstance(event, h11.Response):
                headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in event.headers}
                if event.status_code in _REDIRECTS and "location" in headers:
                    return headers["location"]
                if event.status_code != 200:
                    reason = event.reason.decode("latin-1", "replace")[:80]
                    raise AttachmentRefused(f"its server answered {event.status_code} {reason}".rstrip())
                sink = _Sink(
                    files, name, attachment, normalised_media_type(headers.get("content-type", "")), policy, budget
                )
                length = headers.get("content-length", "")
                if length.isdigit():
                    sink.expect(int(length))
            elif isinstance(event, h11.Data):
                assert sink is not None
                sink.write(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert sink is not None
                return sink.finish()
            elif isinstance(event, h11.ConnectionClosed):
                raise AttachmentRefused("its server closed the connection before the whole file came")
    finally:
        if sink is not None:
            sink.close()
