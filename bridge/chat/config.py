"""The config of `agent-bridge connect` (docs/chat.md, "The config"): which platforms, their credentials, who may
run turns, with which profiles.

Loaded as strictly as profiles, with their helpers (bridge.profile.schema): every problem as `file:line:
message`, "did you mean" for a misspelt key, `${VAR}` expanded from the environment (an unset one is an error;
`$${` is a literal `${`). A token, password or access token never appears in an error or a log line.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..errors import ChatConfigError, Problem
from ..log import get_logger
from ..profile.schema import explain, line_of, read_yaml
from .pacing import PaceLimits

_STRICT = ConfigDict(strict=True, extra="forbid", frozen=True)
_VARIABLE = re.compile(r"\$(\$?)\{([^}]*)\}")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BOT_TOKEN = re.compile(r"[0-9]+:[A-Za-z0-9_-]+")
_MATRIX_USER = re.compile(r"@[^:\s]+:\S+")


class Groups(BaseModel):
    """How the bot behaves in group chats (Matrix: rooms with more than the bot and one user)."""

    model_config = _STRICT

    answer: Literal["mentioned", "always"] = Field(
        default="mentioned",
        description="mentioned: a message runs a turn only when it mentions the bot or replies to one of its "
        "messages; always: every message of an allowed user does.",
    )


class Budget(BaseModel):
    """How much one user may spend in a day (UTC); past it, a clear message and no turn. Unset: no limit."""

    model_config = _STRICT

    turns_per_day: int | None = Field(default=None, gt=0, description="Turns one user may run in a day.")
    cost_usd_per_day: float | None = Field(
        default=None,
        gt=0,
        description="US dollars one user's turns may cost in a day, as the agent reports its cost (turns of "
        "agents that report none count nothing here).",
    )


class Pace(BaseModel):
    """How fast the bot sends, edits and deletes messages (docs/chat.md, "Pacing"). Unset: the platform's limits."""

    model_config = _STRICT

    per_chat_secs: float | None = Field(
        default=None,
        ge=0,
        description="The least time between two messages (sends, edits, deletions) in one chat, in seconds; "
        "default: the platform's limit, 1. Lower it only where the server allows more (a homeserver that exempts "
        "the bot from its rate limits, a self-hosted test server; raise account_per_second there too): past a "
        "limit, each message waits out a 429.",
    )
    account_per_second: float | None = Field(
        default=None,
        gt=0,
        description="Messages a second across all the bot's chats (sends, edits, deletions; a fraction allowed: "
        "0.5 is one every 2 s); default: the platform's limit, Telegram 30, Matrix 0.2 (Synapse's default "
        "rc_message). Raise it only where the server allows more: a homeserver that exempts the bot "
        "(override_ratelimit) or has a higher rc_message.per_second, a self-hosted Bot API server.",
    )
    account_burst: int | None = Field(
        default=None,
        ge=1,
        description="Matrix only: how many messages may go at once before account_per_second paces them (the "
        "homeserver's token bucket); default 8, two short of Synapse's default rc_message.burst_count of 10. "
        "Telegram counts the messages of each second instead and has no burst.",
    )

    def applied_to(self, limits: PaceLimits) -> PaceLimits:
        """The platform's `limits` with what this section changes.

        A fractional `account_per_second` on a platform whose limit is a window (Telegram's: so many in any
        second) becomes a bucket of one: one message every 1/account_per_second seconds. `account_burst` makes a
        window a bucket; the config refuses it for Telegram, whose limit has no burst.
        """
        changes: dict[str, Any] = {}
        if self.per_chat_secs is not None:
            changes["per_chat_interval"] = self.per_chat_secs
        if self.account_per_second is not None:
            changes["global_per_second"] = self.account_per_second
            if limits.global_burst is None and not self.account_per_second.is_integer():
                changes["global_burst"] = 1
        if self.account_burst is not None:
            changes["global_burst"] = self.account_burst
        return replace(limits, **changes) if changes else limits


def _secret_is_text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    # A number or a mapping here is someone's secret mistyped: say so without repeating it.
    raise PydanticCustomError("secret_not_text", "expected a string (in quotes); the value is not shown")


Secret = Annotated[SecretStr | None, BeforeValidator(_secret_is_text)]


def _http_url(value: str, what: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PydanticCustomError(
            "url",
            "expected an http:// or https:// URL of the {what}, got {value}",
            {"what": what, "value": repr(value)},
        )
    return value.rstrip("/")


class _Section(BaseModel):
    """What every platform's section has: the profiles, who may run turns, groups, budget."""

    model_config = _STRICT

    profile: str = Field(min_length=1, description="The profile a new conversation runs.")
    profiles: list[Annotated[str, Field(min_length=1)]] = Field(
        default=[],
        description="The profiles `/profile NAME` may switch a conversation to (default: just `profile`); must "
        "include `profile`.",
    )
    groups: Groups = Field(default=Groups(), description="How the bot behaves in group chats.")
    budget: Budget = Field(default=Budget(), description="Per user and day: turns_per_day, cost_usd_per_day.")
    pace: Pace = Field(
        default=Pace(), description="How fast the bot sends: per_chat_secs, account_per_second, account_burst."
    )

    @model_validator(mode="before")
    @classmethod
    def _profiles_default_to_profile(cls, data: Any) -> Any:
        if isinstance(data, dict) and "profiles" not in data and isinstance(data.get("profile"), str):
            return {**data, "profiles": [data["profile"]]}
        return data

    @field_validator("allow_users", mode="after", check_fields=False)
    @classmethod
    def _somebody_is_allowed(cls, users: list[Any]) -> list[Any]:
        if not users:
            raise PydanticCustomError(
                "allow_users_empty",
                "is empty, so nobody could run a turn; list the users who may (their ids), or remove the section",
            )
        return users


class TelegramConfig(_Section):
    """A Telegram bot over the Bot API (long polling)."""

    token: Secret = Field(
        default=None,
        description='The bot\'s token from @BotFather, usually "${TELEGRAM_BOT_TOKEN}"; or token_file.',
    )
    token_file: str | None = Field(
        default=None,
        min_length=1,
        description="A file holding the token (surrounding blanks are stripped); relative to the config's "
        "directory. Others than its owner should not be able to read it.",
    )
    api_url: str = Field(
        default="https://api.telegram.org",
        description="The Bot API server: a self-hosted one, or a test server; without /bot<token>.",
    )
    allow_users: list[int] = Field(
        default=[],
        validate_default=True,
        description="Telegram user ids (numbers) whose messages run turns and who may press buttons; nobody else.",
    )

    @field_validator("token")
    @classmethod
    def _looks_like_a_bot_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and not _BOT_TOKEN.fullmatch(token.get_secret_value()):
            raise PydanticCustomError("bot_token", _NOT_A_BOT_TOKEN)
        return token

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, url: str) -> str:
        if "/bot" in urlsplit(url).path:
            raise PydanticCustomError(
                "api_url_token",
                "is the server's address without /bot<token> (the token goes in token or token_file); "
                "the value is not shown",
            )
        return _http_url(url, "Bot API server")


_NOT_A_BOT_TOKEN = (
    "does not look like a bot token (the bot's id in digits, a colon, then letters, digits, _ and -: what "
    "@BotFather gave); the value is not shown"
)


def _matrix_id(user_id: str) -> str:
    if not _MATRIX_USER.fullmatch(user_id):
        raise PydanticCustomError(
            "matrix_id", "expected a Matrix ID like @name:example.org, got {value}", {"value": repr(user_id)}
        )
    return user_id


class MatrixConfig(_Section):
    """A Matrix account over the client-server API (/sync long polling); end-to-end-encrypted rooms are not
    supported."""

    homeserver: str = Field(description="The homeserver's client-server API base URL, e.g. https://matrix.example.org.")
    user_id: str = Field(description="The bot's Matrix ID, e.g. @bot:example.org.")
    password: Secret = Field(
        default=None, description='The bot account\'s password, usually "${MATRIX_PASSWORD}"; or access_token.'
    )
    access_token: Secret = Field(default=None, description="An access token of the bot account; or password.")
    allow_users: list[Annotated[str, AfterValidator(_matrix_id)]] = Field(
        default=[],
        validate_default=True,
        description="Matrix IDs (@user:server) whose messages run turns and who may answer prompts; nobody else.",
    )

    @field_validator("homeserver")
    @classmethod
    def _homeserver(cls, url: str) -> str:
        return _http_url(url, "homeserver")

    @field_validator("user_id")
    @classmethod
    def _user_id(cls, user_id: str) -> str:
        return _matrix_id(user_id)


class ChatConfig(BaseModel):
    """The config of `agent-bridge connect`: a section per platform the process connects to."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        title="agent-bridge chat config",
        json_schema_extra={"$schema": "https://json-schema.org/draft/2020-12/schema"},
    )

    telegram: TelegramConfig | None = Field(default=None, description="A Telegram bot (docs/chat.md).")
    matrix: MatrixConfig | None = Field(default=None, description="A Matrix account (docs/chat.md).")

    @model_validator(mode="after")
    def _sections_agree(self) -> ChatConfig:
        for name, section in (("telegram", self.telegram), ("matrix", self.matrix)):
            if section is not None and section.profile not in section.profiles:
                raise _located(
                    (name, "profiles"),
                    f"does not include profile {section.profile!r}, the profile of a new conversation; add it",
                )
        if self.telegram is not None:
            given = [key for key in ("token", "token_file") if getattr(self.telegram, key) is not None]
            if len(given) != 1:
                raise _located(
                    ("telegram", given[-1]) if given else ("telegram",),
                    "give the bot's token in token or in token_file, not both"
                    if given
                    else 'the bot\'s token is missing: add token: "${TELEGRAM_BOT_TOKEN}" or token_file: PATH',
                )
        if self.matrix is not None:
            given = [key for key in ("password", "access_token") if getattr(self.matrix, key) is not None]
            if len(given) != 1:
                raise _located(
                    ("matrix", given[-1]) if given else ("matrix",),
                    "give password or access_token, not both"
                    if given
                    else 'the bot cannot log in: add password: "${MATRIX_PASSWORD}" or access_token',
                )
        return self

    @model_validator(mode="after")
    def _telegram_has_no_burst(self) -> ChatConfig:
        # A bucket's burst over Telegram's window would send that many at once and draw 429s that hold the bot.
        if self.telegram is not None and self.telegram.pace.account_burst is not None:
            raise _located(
                ("telegram", "pace", "account_burst"),
                "Telegram has no burst: it counts the messages of each second (at most account_per_second in any "
                "second); remove account_burst and set account_per_second alone",
            )
        return self


def _located(loc: tuple[str, ...], message: str) -> PydanticCustomError:
    """An error of a whole-config check that still points at the key it is about (`explain` reads `loc`)."""
    return PydanticCustomError("located", "{message}", {"message": message, "loc": loc})


def chat_json_schema() -> dict[str, Any]:
    """The chat config's JSON Schema, for YAML editors (yaml-language-server and friends)."""
    return ChatConfig.model_json_schema()


def load_chat_config(
    path: str | os.PathLike[str],
    *,
    environ: Mapping[str, str] | None = None,
    known_profiles: Collection[str] | None = None,
) -> ChatConfig:
    """Read and validate the config at `path`; raises `ChatConfigError` listing every problem as `file:line: …`.

    `${VAR}` is expanded from `environ` (default: this process's environment). `known_profiles`, when given, are
    the profiles the directory holds: a section naming another is refused (with "did you mean").
    """
    where = os.fspath(path)
    try:
        text = Path(where).read_text(encoding="utf-8")
    except OSError as err:
        raise ChatConfigError([Problem(f"cannot read the chat config: {err.strerror}", where)]) from None
    except UnicodeDecodeError:
        raise ChatConfigError([Problem("the chat config is not UTF-8 text", where)]) from None
    data, lines, problems = read_yaml(text, where, what="chat config", needs="telegram: or matrix: (docs/chat.md)")
    if data is None or problems:
        raise ChatConfigError(sorted(problems, key=lambda problem: problem.line or 0))
    expanded: dict[str, str] = {}  # a variable's value -> its reference, to keep values out of the errors
    data = _expand(data, (), os.environ if environ is None else environ, expanded, problems, lines, where)
    if problems:
        raise ChatConfigError(problems)
    try:
        return _validate(data, lines, where, known_profiles)
    except ChatConfigError as err:
        raise ChatConfigError([_hide(problem, expanded) for problem in err.problems]) from None


def _validate(
    data: dict[str, Any], lines: Mapping[tuple[Any, ...], int], where: str, known_profiles: Collection[str] | None
) -> ChatConfig:
    try:
        config = ChatConfig.model_validate(data)
    except ValidationError as err:
        found = explain(err, lines, where, keys=_keys_at)
        raise ChatConfigError(sorted(found, key=lambda problem: problem.line or 0)) from None
    if config.telegram is None and config.matrix is None:
        no_platform = "the config names no platform; it needs telegram: or matrix: (docs/chat.md)"
        raise ChatConfigError([Problem(no_platform, where, 1)])
    if config.telegram is not None and config.telegram.token_file is not None:
        token = _read_token_file(config.telegram.token_file, Path(where).parent, where, lines)
        config = config.model_copy(update={"telegram": config.telegram.model_copy(update={"token": token})})
    if known_profiles is not None:
        _check_profiles(config, known_profiles, where, lines)
    return config


def _expand(
    value: Any,
    loc: tuple[Any, ...],
    environ: Mapping[str, str],
    expanded: dict[str, str],
    problems: list[Problem],
    lines: Mapping[tuple[Any, ...], int],
    where: str,
) -> Any:
    """`value` with `${VAR}` in every string expanded, once (an expanded value is not scanned again)."""
    if isinstance(value, dict):
        return {
            key: _expand(item, (*loc, key), environ, expanded, problems, lines, where) for key, item in value.items()
        }
    if isinstance(value, list):
        return [
            _expand(item, (*loc, index), environ, expanded, problems, lines, where) for index, item in enumerate(value)
        ]
    if not isinstance(value, str) or "${" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        escaped, name = match.group(1), match.group(2)
        if escaped:
            return "${" + name + "}"
        field = ".".join(str(part) for part in loc)
        if not _VARIABLE_NAME.fullmatch(name):
            problems.append(Problem(f"{field}: ${{{name}}} is not a variable name", where, line_of(loc, lines)))
        elif name not in environ:
            problems.append(
                Problem(
                    f"{field}: ${{{name}}} is not set in the environment; export {name} before starting "
                    "agent-bridge connect (or its systemd unit's Environment=/EnvironmentFile=)",
                    where,
                    line_of(loc, lines),
                )
            )
        else:
            if environ[name]:
                expanded[environ[name]] = match.group(0)
            return environ[name]
        return ""

    return _VARIABLE.sub(substitute, value)


def _hide(problem: Problem, expanded: Mapping[str, str]) -> Problem:
    """`problem` with every value that came from the environment shown as its `${VAR}` (a token put where a
    section belongs would otherwise be quoted back as the wrong value)."""
    message = problem.message
    for value in sorted(expanded, key=len, reverse=True):
        message = message.replace(repr(value), expanded[value]).replace(value, expanded[value])
    return Problem(message, problem.file, problem.line) if message != problem.message else problem


def _keys_at(loc: tuple[str | int, ...]) -> Iterable[str]:
    """The keys valid in the mapping at `loc`, for "did you mean"."""
    model: type[BaseModel] = ChatConfig
    for part in loc:
        if part in ("telegram", "matrix") and model is ChatConfig:
            model = TelegramConfig if part == "telegram" else MatrixConfig
        elif part == "groups":
            model = Groups
        elif part == "budget":
            model = Budget
        elif part == "pace":
            model = Pace
        else:
            return ()
    return model.model_fields


def _read_token_file(name: str, directory: Path, where: str, lines: Mapping[tuple[Any, ...], int]) -> SecretStr:
    path = directory / Path(name).expanduser()  # an absolute name stays as it is
    line = line_of(("telegram", "token_file"), lines)
    try:
        with open(path, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            content = handle.read().decode("utf-8").strip()
    except OSError as err:
        raise ChatConfigError(
            [Problem(f"telegram.token_file: cannot read {str(path)!r}: {err.strerror}", where, line)]
        ) from None
    except UnicodeDecodeError:
        raise ChatConfigError([Problem(f"telegram.token_file: {str(path)!r} is not UTF-8 text", where, line)]) from None
    if not content:
        raise ChatConfigError([Problem(f"telegram.token_file: {str(path)!r} is empty", where, line)])
    if not _BOT_TOKEN.fullmatch(content):
        raise ChatConfigError([Problem(f"telegram.token_file: {str(path)!r} {_NOT_A_BOT_TOKEN}", where, line)])
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        get_logger(component="chat").warning(
            "the bot's token file can be read by other users: they could take over the bot",
            path=str(path),
            mode=f"{mode & 0o777:o}",
            fix=f"chmod 600 {path}",
        )
    return SecretStr(content)


def _check_profiles(
    config: ChatConfig, known: Collection[str], where: str, lines: Mapping[tuple[Any, ...], int]
) -> None:
    problems: list[Problem] = []
    for name, section in (("telegram", config.telegram), ("matrix", config.matrix)):
        if section is None:
            continue
        for index, profile in enumerate(section.profiles):
            if profile in known:
                continue
            close = difflib.get_close_matches(profile, list(known), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f" (the directory has: {', '.join(sorted(known))})"
            loc = (name, "profiles", index) if (name, "profiles", index) in lines else (name, "profile")
            field = ".".join(map(str, loc))
            problems.append(Problem(f"{field}: no profile named {profile!r}{hint}", where, line_of(loc, lines)))
    if problems:
        raise ChatConfigError(problems)
