"""What the bridge may fetch for a turn's attachments, and how a fetched file is named and typed. Pure: no I/O.

The fetching itself is `bridge.files.attachments`; everything it decides is here, so the rules are tested without a
network:

- `AttachmentPolicy`: the profile's `attachments` section (`AttachmentsSettings`: the limits per file, per turn,
  count and time, and the hosts and networks a URL may reach although they are not public) as one turn applies
  it. By default only globally routable addresses are fetched from: loopback, private, shared (100.64/10),
  link-local (169.254/16 and fe80::/10: cloud metadata), site-local (fec0::/10), multicast, unspecified and
  reserved addresses are refused, and so are the IPv6 forms that carry one of those IPv4 addresses (IPv4-mapped,
  6to4, NAT64, Teredo);
- `where` says what kind of source a URL is (http(s), data:, a local path) and refuses every other scheme;
- `shown_url` is the only form of a URL that reaches a log or an error: no credentials, no query;
- `safe_name` turns a name from the outside into a file name of the attachments directory;
- `checked_media_type` compares an image's declared type with its magic number.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import ipaddress
import re
import unicodedata
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from ..errors import AttachmentRefused as AttachmentRefused  # re-exported, as bridge.errors says
from ..profile.sections import AttachmentsSettings
from ..turn import normalised_media_type

MIB = 1024 * 1024
MAX_REDIRECTS = 5
MAX_NAME_BYTES = 120  # of a file name in the attachments directory: far below NAME_MAX (255), room for "-2"
SNIFF_BYTES = 16  # enough of a file's start for every magic number below

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: not private by name, never the user's host
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass(slots=True, frozen=True)
class AttachmentPolicy:
    """One turn's attachment rules: the profile's `attachments` section (`settings`: the limits, the exceptions to
    the address rule, `keep`) with `fetch` decided for the agent's protocol, and `allow_hosts` read once into the
    host names and networks `refusal` checks."""

    settings: AttachmentsSettings = field(default_factory=AttachmentsSettings)
    fetch: bool = True
    """Fetch the attachments before the agent starts; False hands the agent their URLs as sent (pass-through)."""
    _names: frozenset[str] = field(init=False, repr=False, compare=False)
    _networks: tuple[Network, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names: set[str] = set()
        networks: list[Network] = []
        for entry in self.settings.allow_hosts:
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                names.add(entry.lower().rstrip("."))
        object.__setattr__(self, "_names", frozenset(names))
        object.__setattr__(self, "_networks", tuple(networks))

    def with_hosts(self, hosts: Iterable[str]) -> AttachmentPolicy:
        """This policy with more exceptions (a host's option on top of a profile's section)."""
        known = self.settings.allow_hosts
        extra = tuple(host for host in hosts if host not in known)
        if not extra:
            return self
        return dataclasses.replace(self, settings=dataclasses.replace(self.settings, allow_hosts=known + extra))

    def refusal(self, host: str, address: str) -> str | None:
        """Why `address` (an IP that `host` resolved to) must not be connected to, or None when it may."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # a scope id (fe80::1%eth0) names no other address
        if host.lower().rstrip(".") in self._names or any(ip in network for network in self._networks):
            return None
        for inner in _carried(ip):
            if any(inner in network for network in self._networks):
                continue
            kind = _not_public(inner)
            if kind:
                carried = "" if inner is ip else f" (it carries {inner})"
                return (
                    f"{host} resolves to {address}{carried}, {kind}; the bridge fetches from public addresses only "
                    "unless the profile's attachments.allow_hosts names it (serve and worker also take "
                    "--allow-attachment-host)"
                )
        return None


def _carried(ip: Address) -> list[Address]:
    """`ip` and the IPv4 address an IPv6 one stands for (IPv4-mapped, 6to4, NAT64, Teredo): each must pass."""
    found: list[Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            found.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            found.append(ip.sixtofour)
        if ip in _NAT64:  # the translator's prefix says nothing of the host: the IPv4 address it carries does
            found[0] = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.teredo is not None:
            found.extend(ip.teredo)
    return found


def _not_public(ip: Address) -> str:
    """What kind of address `ip` is when it is not one the public may be sent to; "" when it is."""
    if ip.is_unspecified:
        return "the unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address (where cloud metadata services answer)"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:  # fec0::/10, which ipaddress counts global
        return "a site-local address"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "a shared (carrier-grade NAT) address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved or not ip.is_global:
        return "a reserved address"
    return ""


# ---------------------------------------------------------------------- sources

SourceKind = Literal["http", "data", "path"]


def source_kind(url: str) -> SourceKind:
    """What `url` is: an http(s) URL, a `data:` URI or a local path (no `scheme:` at its start). Every other
    scheme is refused (`AttachmentRefused`)."""
    match = _SCHEME.match(url)
    if match is None:
        return "path"
    scheme = match.group(0)[:-1].lower()
    if scheme in ("http", "https"):
        return "http"
    if scheme == "data":
        return "data"
    raise AttachmentRefused(f"its scheme {scheme}: is not one the bridge fetches (https, http, data:, a local path)")


def shown_url(url: str) -> str:
    """`url` as logs and errors show it: a local path as it is; an http(s) URL without credentials, query or
    fragment; a `data:` URI by its media type and size."""
    kind = source_kind_or_none(url)
    if kind == "path":
        return _cut(url, 200)
    if kind == "data":
        header = url[5:].partition(",")[0]
        return f"data:{_cut(header, 60)},… ({len(url)} characters)"
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    return _cut(f"{parts.scheme}://{host}{port}{parts.path}", 200)


def source_kind_or_none(url: str) -> SourceKind | None:
    try:
        return source_kind(url)
    except AttachmentRefused:
        return None


def http_target(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, request target) of an http(s) URL; refuses one with credentials in it."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise AttachmentRefused(
            "its URL has credentials in it (user:password@); the bridge does not send them anywhere — give the "
            "file a URL of its own"
        )
    host = parts.hostname
    if not host:
        raise AttachmentRefused("its URL names no host")
    try:
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        raise AttachmentRefused("its URL's port is not a number from 0 to 65535") from None
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    if any(ord(character) < 0x21 or ord(character) > 0x7E for character in target):
        target = urllib.parse.quote(target, safe="/?&=%:@!$'()*+,;~-._")
    return parts.scheme.lower(), host, port, target


def decode_data_uri(url: str, max_bytes: int) -> tuple[str, bytes]:
    """(declared media type, bytes) of a `data:` URI (RFC 2397: base64 or percent-encoded); refused when it is
    malformed or holds more than `max_bytes`."""
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise AttachmentRefused("its data: URI has no ',' before the data")
    params = [part.strip() for part in header.split(";")]
    is_base64 = params[-1].lower() == "base64"
    media_type = normalised_media_type(params[0]) if params[0] else "text/plain"
    if is_base64:
        compact = re.sub(r"\s+", "", urllib.parse.unquote(payload))
        if len(compact) // 4 * 3 > max_bytes + 2:
            raise AttachmentRefused(f"it is over {size_text(max_bytes)}, the largest file allowed")
        try:
            data = base64.b64decode(compact, validate=True)
        except (binascii.Error, ValueError):
            raise AttachmentRefused("its data: URI says base64 but its data is not valid base64") from None
    else:
        data = urllib.parse.unquote_to_bytes(payload)
    if len(data) > max_bytes:
        raise AttachmentRefused(f"it is over {size_text(max_bytes)}, the largest file allowed")
    return media_type, data


# ---------------------------------------------------------------------- names and types


def safe_name(name: str, taken: set[str], fallback: str = "attachment") -> str:
    """A file name for `name` in the attachments directory, not in `taken` (and added to it): no directory part,
    no `/`, no control characters, not hidden, not `.` or `..`, at most `MAX_NAME_BYTES` bytes (the extension
    kept), unique (`photo-2.png`)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join("_" if unicodedata.category(character)[0] == "C" else character for character in base)
    base = base.strip().lstrip(".")
    if not base:
        base = fallback
    stem, dot, extension = base.rpartition(".")
    if not dot or not stem or len(extension) > 16:
        stem, extension = base, ""
    extension = f".{extension}" if extension else ""
    stem = _cut_bytes(stem, MAX_NAME_BYTES - len(extension.encode()) - 8)  # room for "-NNNNNN"
    candidate, number = stem + extension, 1
    while candidate.lower() in taken:
        number += 1
        candidate = f"{stem}-{number}{extension}"
    taken.add(candidate.lower())
    return candidate


_MAGIC: tuple[tuple[str, bytes, int], ...] = (
    ("image/png", b"\x89PNG\r\n\x1a\n", 0),
    ("image/jpeg", b"\xff\xd8\xff", 0),
    ("image/gif", b"GIF87a", 0),
    ("image/gif", b"GIF89a", 0),
    ("image/webp", b"WEBP", 8),  # after "RIFF" and the size
)
CHECKED_IMAGE_TYPES = frozenset(kind for kind, _, _ in _MAGIC)
_TYPE_NAMES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WebP"}


def sniffed_type(head: bytes) -> str:
    """The image type `head` (a file's first bytes) starts like, or ""."""
    for kind, magic, offset in _MAGIC:
        if head[offset : offset + len(magic)] == magic and (kind != "image/webp" or head[:4] == b"RIFF"):
            return kind
    return ""


def checked_media_type(attachment_type: str, declared: str, head: bytes) -> str:
    """The media type to report for a file whose first bytes are `head`.

    For an image, the declared type must agree with the bytes wherever the bytes tell (PNG, JPEG, GIF, WebP):
    a mismatch, or bytes that are no image while the declared type is one of those, is refused. Another
    declared image type (SVG, HEIC…) is taken as it is. For other kinds, the declared type (or what the
    bytes say, or application/octet-stream)."""
    sniffed = sniffed_type(head)
    if attachment_type == "image":
        if sniffed:
            if declared in CHECKED_IMAGE_TYPES and declared != sniffed:
                raise AttachmentRefused(
                    f"it is declared {declared} but its bytes are {_TYPE_NAMES[sniffed]} ({sniffed}); the bridge "
                    "does not pass on an image whose type lies"
                )
            return sniffed
        if declared in CHECKED_IMAGE_TYPES:
            raise AttachmentRefused(
                f"it is declared {declared} but its bytes are not {_TYPE_NAMES[declared]}: not the image it says"
            )
        if declared.startswith("image/"):
            return declared
        shown = declared or "none"
        raise AttachmentRefused(
            f"it is sent as an image but its bytes are none of PNG, JPEG, GIF or WebP and its declared type is {shown}"
        )
    if declared and declared != "application/octet-stream":
        return declared
    return sniffed or declared or "application/octet-stream"


def size_text(count: int) -> str:
    """A byte count for people (`25 MiB`, `512 bytes`)."""
    return f"{count / MIB:g} MiB" if count >= MIB else f"{count} bytes"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cut_bytes(text: str, limit: int) -> str:
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")
