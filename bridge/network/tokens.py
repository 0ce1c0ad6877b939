"""The network door's bearer tokens (`serve --listen --tokens FILE`, docs/network.md "Tokens").

The file maps each token to the tenant it stands for:

    <token>:
      name: slack-bot                 # who it is, in logs and metrics (never the token)
      profiles: [claude, echo]        # optional: the profiles it may use (default: every one)
      conversation_prefix: "slack:"   # optional: its conversations' prefix in the store (default: "<name>:")

Rules, checked here and nowhere else:
- A token is at least `MIN_TOKEN_CHARS` printable characters, with no spaces.
- Tokens are compared in constant time: each candidate's SHA-256 against every
  entry's, all of them, whatever matches; a token never reaches a log or an
  error message.
- Two entries with the same name are one tenant (a token being rotated): they
  must say the same about profiles and prefix, else the file is refused.
- No tenant's conversation prefix begins another's (`ops:` and `ops:eu:`, the
  defaults of `ops` and `ops:eu`, would make `ops`' conversation `eu:room` the
  store key of `ops:eu`'s `room`), else the file is refused: so no two tenants
  ever produce the same store key, and every key stored so far stays as it was.
  An empty prefix begins every other, so such a tenant is the file's only one;
  it reaches every conversation of the store, which is said loudly at load.
- `profiles: []` is a tenant that may use no profile (a monitoring token:
  `/metrics` and `/v1/stats`); a missing `profiles` allows every one.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import ListenError
from ..log import get_logger
from ..serving.session import Tenant

MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096
_FIELDS = {"name", "profiles", "conversation_prefix"}


@dataclass(frozen=True, slots=True)
class _Entry:
    digest: bytes
    tenant: Tenant


class Tokens:
    """The tenants a tokens file names, looked up by bearer token in constant time."""

    def __init__(self, entries: Iterable[tuple[str, Tenant]]) -> None:
        self._entries = tuple(_Entry(_digest(token), tenant) for token, tenant in entries)

    def __len__(self) -> int:
        return len(self._entries)

    def tenant_of(self, token: str | None) -> Tenant | None:
        """The tenant `token` stands for, or None (no token, or not one of ours)."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        digest = _digest(token)
        found: Tenant | None = None
        for entry in self._entries:  # every entry, always: the time says nothing about which one matched
            if hmac.compare_digest(entry.digest, digest):
                found = entry.tenant
        return found


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def load_tokens(path: str | os.PathLike[str]) -> Tokens:
    """Read a tokens file; raises `ListenError` naming the entry and what is wrong with it."""
    try:
        with open(path, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            data = yaml.safe_load(handle)
    except OSError as err:
        raise ListenError(f"the tokens file {os.fspath(path)!r} cannot be read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ListenError(f"the tokens file {os.fspath(path)!r} is not valid YAML: {_yaml_problem(err)}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        get_logger(component="network").warning(
            "the tokens file can be read by other users; chmod 600 it", path=os.fspath(path)
        )
    return parse_tokens(data, source=os.fspath(path))


def _yaml_problem(error: yaml.YAMLError) -> str:
    """YAML's complaint on one line, with the line it found it at (never the file's text: it holds tokens)."""
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        reason = error.problem or error.context or "syntax error"
        return f"line {mark.line + 1}: {reason}" if mark is not None else reason
    return " ".join(str(error).split())


def parse_tokens(data: Any, *, source: str = "the tokens file") -> Tokens:
    """The `Tokens` of a tokens file's YAML; raises `ListenError` naming what is wrong."""
    if not isinstance(data, Mapping) or not data:
        raise ListenError(
            f"{source} must map each token to its entry (name, and optionally profiles and conversation_prefix)"
        )
    entries: list[tuple[str, Tenant]] = []
    by_name: dict[str, Tenant] = {}
    for number, (token, entry) in enumerate(data.items(), start=1):
        where = f"{source}, entry {number}"  # never the token itself
        _check_token(token, where)
        tenant = _tenant(entry, where)
        earlier = by_name.setdefault(tenant.name, tenant)
        if earlier != tenant:
            raise ListenError(
                f"{where}: another token is also named {tenant.name!r} but allows other profiles or another "
                "conversation prefix; tokens of one name are one tenant (a rotation) and must agree"
            )
        entries.append((token, tenant))
    _check_prefixes_apart(by_name.values(), source)
    return Tokens(entries)


def _check_prefixes_apart(tenants: Iterable[Tenant], source: str) -> None:
    """Refuse two tenants one of whose conversation prefixes begins the other's: their store keys could meet."""
    by_prefix = sorted(tenants, key=lambda tenant: tenant.conversation_prefix)
    # Sorted, a prefix that begins another begins every prefix between the two: neighbours are enough to check.
    for shorter, longer in itertools.pairwise(by_prefix):
        if longer.conversation_prefix.startswith(shorter.conversation_prefix):
            rest = longer.conversation_prefix[len(shorter.conversation_prefix) :]
            raise ListenError(
                f"{source}: the tenants {shorter.name!r} and {longer.name!r} have the conversation prefixes "
                f"{shorter.conversation_prefix!r} and {longer.conversation_prefix!r}, so {shorter.name!r}'s "
                f"conversation {rest + 'room'!r} would be {longer.name!r}'s 'room' (its session and history). Give one "
                "of them a conversation_prefix that neither begins nor is begun by another tenant's"
            )
    if by_prefix and by_prefix[0].conversation_prefix == "":
        get_logger(component="network").warning(
            "a tenant has an empty conversation_prefix: it reaches every conversation in the session store, "
            "those of a stdin/stdout serve on it and of any earlier tenant included",
            tenant=by_prefix[0].name,
        )


def _check_token(token: Any, where: str) -> None:
    if not isinstance(token, str):
        raise ListenError(f"{where}: a token must be a string (quote it)")
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS:
        raise ListenError(
            f"{where}: a token must be {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} characters long; make one with "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
    if not token.isascii() or not token.isprintable() or " " in token:
        raise ListenError(f"{where}: a token must be printable ASCII without spaces (it travels in a header)")


def _tenant(entry: Any, where: str) -> Tenant:
    if not isinstance(entry, Mapping):
        raise ListenError(f"{where}: the entry must be a mapping with a name (and optionally profiles)")
    unknown = sorted(str(key) for key in set(entry) - _FIELDS)
    if unknown:
        raise ListenError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(_FIELDS))})")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip() or not name.isprintable() or len(name) > 128 or "/" in name:
        raise ListenError(f"{where}: name must be a printable string of 1 to 128 characters, without '/'")
    profiles = entry.get("profiles")
    if profiles is not None and (
        not isinstance(profiles, list) or not all(isinstance(item, str) and item for item in profiles)
    ):
        raise ListenError(f"{where}: profiles must be a list of profile names")
    prefix = entry.get("conversation_prefix", f"{name}:")
    if not isinstance(prefix, str) or not prefix.isprintable() or len(prefix) > 256:
        raise ListenError(f"{where}: conversation_prefix must be a printable string of at most 256 characters")
    return Tenant(
        name=name,
        profiles=None if profiles is None else frozenset(profiles),
        conversation_prefix=prefix,
    )
