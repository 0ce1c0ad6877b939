"""A turn's input: one user message and what travels with it."""

from __future__ import annotations

import dataclasses
import mimetypes
import posixpath
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from .errors import TurnError


def text_problem(value: str) -> str | None:
    """Why `value` is not text a process, an environment or the session store can take, or None.

    On every turn's path, for messages of up to megabytes: `isascii()` is O(1) in CPython and
    `in` is a memchr, so only non-ASCII text pays for one UTF-8 encode, the exact test for a
    lone surrogate.
    """
    if value.isascii():
        if "\0" not in value:
            return None
    else:
        try:
            if b"\0" not in value.encode("utf-8"):
                return None
        except UnicodeEncodeError:
            return (
                "contains a lone surrogate (a \\ud800-\\udfff escape that is not half of a pair), which is "
                "not text; send the character as UTF-8 or as a complete surrogate pair"
            )
    return "contains a NUL character, which no process can receive; remove it"


AttachmentType = Literal["image", "file", "audio", "video"]
ATTACHMENT_TYPES: tuple[str, ...] = get_args(AttachmentType)


@dataclass(slots=True, frozen=True)
class Attachment:
    """A file the user sent with the message.

    `url` says where it is: an `https://` or `http://` URL, a `data:` URI, or —
    from the host's own code or the CLI, never from a serve client — a local
    path. Before the agent starts, the bridge fetches it into the turn's
    attachments directory (unless the profile's `attachments.fetch` passes
    URLs through): then `path` is that file (absolute), `media_type` its
    checked type and `size` its bytes. `name` is the file's name for
    people (from the URL when not given).
    """

    type: AttachmentType
    url: str
    name: str = ""
    path: str = ""
    media_type: str = ""
    size: int | None = None

    def __post_init__(self) -> None:
        if self.type not in ATTACHMENT_TYPES:
            raise TurnError(f"attachment type {self.type!r} is not one of {', '.join(ATTACHMENT_TYPES)}")
        if not isinstance(self.url, str) or not self.url:
            raise TurnError("an attachment needs a url (a non-empty string)")
        for name in ("url", "name", "path", "media_type"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TurnError(f"attachment {name} must be a string, not {type(value).__name__}")
            if problem := text_problem(value):
                raise TurnError(f"attachment {name} {problem}")
        if self.url[:5].lower() == "data:":  # a data: URI's "path" is its data
            return
        try:
            path = urllib.parse.urlsplit(self.url).path
        except ValueError:  # its message may quote the URL's credentials
            raise TurnError(
                "attachment url is not a valid URL: its host part cannot be read (an IPv6 address goes in "
                "brackets, http://[2001:db8::1]/; a host name has no brackets and no look-alike characters)"
            ) from None
        if not self.name:
            object.__setattr__(self, "name", posixpath.basename(path.rstrip("/")))

    @classmethod
    def parse(cls, spec: str) -> Attachment:
        """Read the CLI's form: `TYPE=URL`, or a bare URL or local path whose type its media type gives (an
        `image/…` name is an image, `audio/…` audio, `video/…` video, anything else a file)."""
        kind, sep, url = spec.partition("=")
        if sep and kind.isalpha() and kind.isascii():  # TYPE=URL (a path like notes=1.txt is written ./notes=1.txt)
            if not url:
                raise TurnError(f"attachment {spec!r} should look like TYPE=URL, e.g. image=https://…")
            return cls(type=cast(AttachmentType, kind), url=url)
        if not spec:
            raise TurnError("an attachment needs a URL or a path")
        name = posixpath.basename(urllib.parse.urlsplit(spec).path.rstrip("/")) if "://" in spec else spec
        family = guessed_media_type(name).partition("/")[0]
        return cls(type=cast(AttachmentType, family if family in ("image", "audio", "video") else "file"), url=spec)

    def to_dict(self) -> dict[str, Any]:
        """Its fields as JSON; `path`, `media_type` and `size` only once it was fetched."""
        record: dict[str, Any] = {"type": self.type, "url": self.url, "name": self.name}
        if self.path:
            record.update(path=self.path, media_type=self.media_type, size=self.size)
        return record


@dataclass(slots=True, frozen=True)
class Turn:
    """One user message for one agent run.

    `session_id` is the id the agent printed last time (`""` starts a new
    session); the bridge treats it as opaque. `replace()` makes a changed copy.
    """

    message: str = ""
    session_id: str = ""
    session_name: str = "default"
    from_user: str = ""
    attachments: tuple[Attachment, ...] = ()

    def __post_init__(self) -> None:
        # NUL and lone surrogates cannot travel in argv, the environment or the store; refusing
        # them here gives the host a clear error instead of a confusing spawn or store failure.
        for name in ("message", "session_id", "session_name", "from_user"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TurnError(f"{name} must be a string, not {type(value).__name__}")
            if problem := text_problem(value):
                raise TurnError(f"{name} {problem}")
        object.__setattr__(self, "attachments", tuple(self.attachments))  # a list given is kept as a tuple
        for attachment in self.attachments:
            if not isinstance(attachment, Attachment):
                raise TurnError(f"attachments must be Attachment objects, not {type(attachment).__name__}")

    def replace(self, **changes: Any) -> Turn:
        """A copy with `changes` applied, checked as a new turn is."""
        return dataclasses.replace(self, **changes)


def normalised_media_type(value: str) -> str:
    """A Content-Type as a bare media type, lowercase (`image/jpeg`); "" when absent or not `type/subtype`."""
    kind = value.split(";", 1)[0].strip().lower()
    if kind == "image/jpg":
        return "image/jpeg"
    return kind if re.fullmatch(r"[a-z0-9!#$&^_.+-]+/[a-z0-9!#$&^_.+-]+", kind) else ""


def guessed_media_type(name: str) -> str:
    """The media type a file name's extension suggests, or ""."""
    return normalised_media_type(mimetypes.guess_type(name, strict=False)[0] or "")
