"""`agent-bridge check` of a chat config (docs/chat.md, "The config"): what `connect` would refuse, said before it
runs, and with `--profiles DIR` the profiles the config names checked as `check` checks any profile."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ProfileError
from ..profile import Profile
from .printer import ERROR, WARNING, paint

if TYPE_CHECKING:
    from ..chat.config import ChatConfig, MatrixConfig, Pace, TelegramConfig

PLATFORMS = ("telegram", "matrix")
# The keys whose value is a secret, and the variable the docs name for each.
SECRETS = {
    ("telegram", "token"): "TELEGRAM_BOT_TOKEN",
    ("matrix", "password"): "MATRIX_PASSWORD",
    ("matrix", "access_token"): "MATRIX_ACCESS_TOKEN",
}

ReportProfile = Callable[..., int]


def is_chat_config(path: str) -> bool:
    """Whether the file at `path` is a chat config: a mapping whose top-level keys name a platform, and no
    `command` (which every profile has). A file that cannot be read is not one: the profile check says why."""
    data = _top_level(path)
    return data is not None and "command" not in data and any(platform in data for platform in PLATFORMS)


def check_chat_config(path: str, profiles_dir: str | None, report_profile: ReportProfile, *, color: bool) -> int:
    """Print what `check` finds in the chat config at `path` (errors as `file:line: …`, warnings, then `ok` and
    what each section does); with `profiles_dir`, also check every profile it names with `report_profile`.
    Returns the exit status: 0, or 2 when `connect` would refuse to start."""
    from ..chat.config import load_chat_config

    registry = None
    known = None
    if profiles_dir is not None:
        from ..host.registry import ProfileRegistry

        try:
            registry = ProfileRegistry(profiles_dir)
        except ProfileError as err:
            return _print_problems(err, color)
        known = registry.names()
    try:
        config = load_chat_config(path, known_profiles=known)
    except ProfileError as err:  # ChatConfigError is one
        return _print_problems(err, color)
    for warning in _inline_secret_warnings(path):
        print(paint(warning, WARNING, color), file=sys.stderr)
    print(f"{path}: ok")
    for line in _section_lines(config):
        print(f"  {line}")
    if registry is None:
        return 0
    status = 0
    for name in _named_profiles(config):
        try:
            profile: Profile = registry.get(name)
        except ProfileError as err:
            status = _print_problems(err, color)
            continue
        status = max(status, report_profile(f"profile {name}", profile, color=color, indent="  "))
    return status


def _top_level(path: str) -> dict[str, Any] | None:
    from ..profile.schema import read_yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    data, _, _ = read_yaml(text, path)
    return data if isinstance(data, dict) else None


def _print_problems(err: ProfileError, color: bool) -> int:
    for problem in err.problems:
        print(paint(str(problem), ERROR, color), file=sys.stderr)
    return 2


def _inline_secret_warnings(path: str) -> list[str]:
    """A token or password written in the file itself, rather than `${VAR}` (or token_file): whoever reads the
    config, its backups or its repository holds the bot."""
    from ..profile.schema import line_of, read_yaml

    data, lines, _ = read_yaml(Path(path).read_text(encoding="utf-8"), path)
    warnings = []
    for (platform, key), variable in SECRETS.items():
        section = (data or {}).get(platform)
        value = section.get(key) if isinstance(section, dict) else None
        if isinstance(value, str) and "${" not in value:
            alternative = " (or token_file: PATH)" if platform == "telegram" else ""
            warnings.append(
                f"{path}:{line_of((platform, key), lines)}: warning: {platform}.{key} is written in the file, where "
                f'whoever reads it, its backups or its repository gets it; write {key}: "${{{variable}}}"'
                f"{alternative} and set it in the environment"
            )
    return warnings


def _section_lines(config: ChatConfig) -> list[str]:
    """What each platform's section does, one line each."""
    sections: list[tuple[str, TelegramConfig | MatrixConfig | None]] = [
        ("telegram", config.telegram),
        ("matrix", config.matrix),
    ]
    lines = []
    for platform, section in sections:
        if section is None:
            continue
        users = len(section.allow_users)
        budget = section.budget.turns_per_day
        lines.append(
            f"{platform}: new conversations run {section.profile}; /profile may pick {', '.join(section.profiles)}; "
            f"{users} allowed user{'s' if users != 1 else ''}"
            + (f"; {budget} turns a user a day" if budget is not None else "")
            + "".join(f"; {words}" for words in _pace_words(section.pace))
        )
    return lines


def _pace_words(pace: Pace) -> list[str]:
    """What `pace:` changes of the platform's limits, in words (nothing when it is unset)."""
    words = []
    if pace.per_chat_secs is not None:
        words.append(f"{pace.per_chat_secs:g} s between a chat's messages")
    if pace.account_per_second is not None:
        burst = f" after a burst of {pace.account_burst}" if pace.account_burst is not None else ""
        words.append(f"{pace.account_per_second:g} messages a second in all chats{burst}")
    elif pace.account_burst is not None:
        words.append(f"a burst of {pace.account_burst}")
    return words


def _named_profiles(config: ChatConfig) -> list[str]:
    """Every profile the config names, once each, in order."""
    names: dict[str, None] = {}
    for section in (config.telegram, config.matrix):
        if section is not None:
            names.update(dict.fromkeys(section.profiles))
    return list(names)
