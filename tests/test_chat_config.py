"""The config of `agent-bridge connect` (bridge.chat.config): good configs load, each mistake is one clear
`file:line: message`, and a token, password or access token never appears in an error or a log line."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

import bridge.log
from bridge.chat.config import ChatConfig, Pace, chat_json_schema, load_chat_config
from bridge.chat.pacing import MATRIX_LIMITS, TELEGRAM_LIMITS, PaceLimits
from bridge.errors import BridgeError, ChatConfigError, ProfileError

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
PASSWORD = "correct horse battery staple"
ENV = {"TELEGRAM_BOT_TOKEN": TOKEN, "MATRIX_PASSWORD": PASSWORD}
SECRETS = (TOKEN, PASSWORD, "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw")


def write(tmp_path: Path, text: str, name: str = "chat.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load(tmp_path: Path, text: str, **options: Any) -> ChatConfig:
    return load_chat_config(write(tmp_path, text), environ=options.pop("environ", ENV), **options)


def refusal(tmp_path: Path, text: str, **options: Any) -> str:
    with pytest.raises(ChatConfigError) as refused:
        load(tmp_path, text, **options)
    message = str(refused.value)
    for secret in SECRETS:
        assert secret not in message, "a secret in the error"
    return message


# --------------------------------------------------------------------------- good configs


def test_a_telegram_bot_from_the_environment_with_every_default(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        telegram:
          token: "${TELEGRAM_BOT_TOKEN}"
          profile: claude-sdk
          allow_users: [123456789]
        """,
    )
    assert config.matrix is None
    telegram = config.telegram
    assert telegram is not None
    assert telegram.token is not None and telegram.token.get_secret_value() == TOKEN
    assert TOKEN not in repr(config) and TOKEN not in str(config)
    assert telegram.api_url == "https://api.telegram.org"
    assert (telegram.profile, telegram.profiles) == ("claude-sdk", ["claude-sdk"])
    assert telegram.allow_users == [123456789]
    assert telegram.groups.answer == "mentioned"
    assert (telegram.budget.turns_per_day, telegram.budget.cost_usd_per_day) == (None, None)


def test_the_issues_example_with_both_platforms(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        telegram:
          token: "${TELEGRAM_BOT_TOKEN}"      # or token_file: PATH
          api_url: "http://127.0.0.1:8081/"   # a self-hosted Bot API server, or a test server
          profile: claude-sdk
          profiles: [claude-sdk, codex-app-server]
          allow_users: [123456789]
          groups: {answer: always}
          budget: {turns_per_day: 200, cost_usd_per_day: 5}
        matrix:
          homeserver: "https://matrix.example.org"
          user_id: "@bot:example.org"
          password: "${MATRIX_PASSWORD}"
          profile: claude-sdk
          allow_users: ["@alice:example.org"]
        """,
        known_profiles={"claude-sdk", "codex-app-server"},
    )
    assert config.telegram is not None and config.matrix is not None
    assert config.telegram.api_url == "http://127.0.0.1:8081"
    assert config.telegram.profiles == ["claude-sdk", "codex-app-server"]
    assert config.telegram.groups.answer == "always"
    assert (config.telegram.budget.turns_per_day, config.telegram.budget.cost_usd_per_day) == (200, 5.0)
    assert config.matrix.password is not None and config.matrix.password.get_secret_value() == PASSWORD
    assert config.matrix.access_token is None
    assert config.matrix.allow_users == ["@alice:example.org"]


def test_a_matrix_account_by_access_token(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        matrix:
          homeserver: "http://127.0.0.1:8008"
          user_id: "@bot:localhost"
          access_token: "syt_${PART}"
          profile: echo
          allow_users: ["@alice:localhost", "@bob:localhost"]
        """,
        environ={"PART": "abc"},
    )
    assert config.telegram is None and config.matrix is not None
    assert config.matrix.access_token is not None and config.matrix.access_token.get_secret_value() == "syt_abc"


def test_a_doubled_dollar_is_a_literal_one(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        matrix:
          homeserver: "https://matrix.example.org"
          user_id: "@bot:example.org"
          password: "pa$${NOT_A_VARIABLE}ss"
          profile: echo
          allow_users: ["@alice:example.org"]
        """,
        environ={},
    )
    assert config.matrix is not None and config.matrix.password is not None
    assert config.matrix.password.get_secret_value() == "pa${NOT_A_VARIABLE}ss"


@pytest.fixture
def logged(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The bridge's log records (JSON on stderr) since the last call."""
    bridge.log.configure_logging("warning", "json")
    yield lambda: [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    bridge.log.configure_logging()


def test_a_token_file_is_read_stripped_relative_to_the_config_and_a_readable_one_warned_of(
    tmp_path: Path, logged: Callable[[], list[dict[str, Any]]]
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    token_file = secrets / "telegram.token"
    token_file.write_text(f"  {TOKEN}\n")
    token_file.chmod(0o600)
    text = """
        telegram:
          token_file: secrets/telegram.token
          profile: echo
          allow_users: [1]
        """
    config = load(tmp_path, text)
    assert config.telegram is not None and config.telegram.token is not None
    assert config.telegram.token.get_secret_value() == TOKEN
    assert logged() == [], "a private token file loads quietly"

    token_file.chmod(0o644)
    load(tmp_path, text)
    [warning] = logged()
    assert warning["level"] == "warning" and "other users" in warning["event"]
    assert (warning["path"], warning["mode"], warning["fix"]) == (str(token_file), "644", f"chmod 600 {token_file}")
    assert TOKEN not in json.dumps(warning)


def test_the_account_wide_pace_is_read_and_applied_onto_each_platforms_limits(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        telegram:
          token: "${TELEGRAM_BOT_TOKEN}"
          profile: p
          allow_users: [1]
          pace: {account_per_second: 100}
        matrix:
          homeserver: https://m.org
          user_id: '@b:m.org'
          password: "${MATRIX_PASSWORD}"
          profile: p
          allow_users: ['@a:m.org']
          pace: {per_chat_secs: 0.1, account_per_second: 2.5, account_burst: 40}
        """,
    )
    assert config.telegram is not None and config.matrix is not None
    # Telegram's stays a window (100 in any second, its margin kept); Matrix's bucket takes both numbers.
    assert config.telegram.pace.applied_to(TELEGRAM_LIMITS) == replace(TELEGRAM_LIMITS, global_per_second=100)
    assert config.matrix.pace.applied_to(MATRIX_LIMITS) == replace(
        MATRIX_LIMITS, per_chat_interval=0.1, global_per_second=2.5, global_burst=40
    )


@pytest.mark.parametrize(
    ("pace", "limits", "expected"),
    [
        (Pace(), TELEGRAM_LIMITS, TELEGRAM_LIMITS),
        (Pace(), MATRIX_LIMITS, MATRIX_LIMITS),
        # A window counts whole messages: a fraction spaces them evenly, a bucket of one.
        (
            Pace(account_per_second=0.5),
            TELEGRAM_LIMITS,
            replace(TELEGRAM_LIMITS, global_per_second=0.5, global_burst=1),
        ),
        (Pace(account_per_second=50), MATRIX_LIMITS, replace(MATRIX_LIMITS, global_per_second=50)),  # burst 8 kept
        (Pace(account_burst=100), MATRIX_LIMITS, replace(MATRIX_LIMITS, global_burst=100)),  # 0.2 a second kept
    ],
    ids=["telegram-unset", "matrix-unset", "telegram-fraction", "matrix-rate-alone", "matrix-burst-alone"],
)
def test_each_pace_setting_changes_only_its_own_limit(pace: Pace, limits: PaceLimits, expected: PaceLimits) -> None:
    assert pace.applied_to(limits) == expected


# --------------------------------------------------------------------------- mistakes

TELEGRAM_HEAD = """
telegram:
  token: "${TELEGRAM_BOT_TOKEN}"
  profile: claude-sdk
"""

MATRIX_HEAD = """
matrix:
  homeserver: https://m.org
  user_id: '@b:m.org'
  password: "${MATRIX_PASSWORD}"
  profile: p
  allow_users: ['@a:m.org']
"""

MISTAKES: list[tuple[str, str, dict[str, str], str]] = [
    (
        "a misspelt section",
        "telegarm:\n  token: x\n",
        ENV,
        "chat.yaml:1: unknown key 'telegarm'; did you mean 'telegram'?",
    ),
    (
        "a misspelt key of a section",
        TELEGRAM_HEAD + "  allow_users: [1]\n  alow_users: [2]\n",
        ENV,
        "chat.yaml:5: unknown key 'alow_users' in telegram; did you mean 'allow_users'?",
    ),
    (
        "a misspelt key of the budget",
        TELEGRAM_HEAD + "  allow_users: [1]\n  budget:\n    turns_per_dya: 3\n",
        ENV,
        "chat.yaml:6: unknown key 'turns_per_dya' in telegram.budget; did you mean 'turns_per_day'?",
    ),
    (
        "a misspelt key of Matrix's section",
        "matrix:\n  homeserver: https://m.org\n  user_id: '@b:m.org'\n  acess_token: x\n  profile: p\n  allow_users: ['@a:m.org']\n",
        ENV,
        "chat.yaml:4: unknown key 'acess_token' in matrix; did you mean 'access_token'?",
    ),
    (
        "an unset variable",
        TELEGRAM_HEAD.replace("TELEGRAM_BOT_TOKEN", "TELEGRAM_TOKEN") + "  allow_users: [1]\n",
        ENV,
        "chat.yaml:2: telegram.token: ${TELEGRAM_TOKEN} is not set in the environment; export TELEGRAM_TOKEN",
    ),
    (
        "token and token_file",
        TELEGRAM_HEAD + "  token_file: token.txt\n  allow_users: [1]\n",
        ENV,
        "chat.yaml:4: telegram.token_file: give the bot's token in token or in token_file, not both",
    ),
    (
        "neither token nor token_file",
        "telegram:\n  profile: claude-sdk\n  allow_users: [1]\n",
        ENV,
        "chat.yaml:1: telegram: the bot's token is missing: add token:",
    ),
    (
        "nobody allowed",
        TELEGRAM_HEAD + "  allow_users: []\n",
        ENV,
        "chat.yaml:4: telegram.allow_users: is empty, so nobody could run a turn",
    ),
    (
        "allow_users left out",
        TELEGRAM_HEAD,
        ENV,
        "chat.yaml:1: telegram.allow_users: is empty, so nobody could run a turn",
    ),
    (
        "a user id in quotes",
        TELEGRAM_HEAD + "  allow_users: ['123']\n",
        ENV,
        "chat.yaml:4: telegram.allow_users.0: expected a whole number, got '123'",
    ),
    (
        "profiles without profile",
        TELEGRAM_HEAD + "  profiles: [codex-app-server]\n  allow_users: [1]\n",
        ENV,
        "chat.yaml:4: telegram.profiles: does not include profile 'claude-sdk', the profile of a new conversation",
    ),
    (
        "a token that is no bot token",
        TELEGRAM_HEAD + "  allow_users: [1]\n",
        {"TELEGRAM_BOT_TOKEN": "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"},
        "chat.yaml:2: telegram.token: does not look like a bot token",
    ),
    (
        "the token pasted into api_url",
        TELEGRAM_HEAD + f"  api_url: https://api.telegram.org/bot{TOKEN}\n  allow_users: [1]\n",
        ENV,
        "chat.yaml:4: telegram.api_url: is the server's address without /bot<token>",
    ),
    (
        "an api_url that is no URL",
        TELEGRAM_HEAD + "  api_url: api.telegram.org\n  allow_users: [1]\n",
        ENV,
        "chat.yaml:4: telegram.api_url: expected an http:// or https:// URL of the Bot API server, got 'api.telegram.org'",
    ),
    (
        "an unknown way to answer in groups",
        TELEGRAM_HEAD + "  allow_users: [1]\n  groups: {answer: sometimes}\n",
        ENV,
        "chat.yaml:5: telegram.groups.answer: expected 'mentioned' or 'always'",
    ),
    (
        "a budget of nothing",
        TELEGRAM_HEAD + "  allow_users: [1]\n  budget: {turns_per_day: 0}\n",
        ENV,
        "chat.yaml:5: telegram.budget.turns_per_day: must be greater than 0",
    ),
    (
        "a pace below nothing",
        TELEGRAM_HEAD + "  allow_users: [1]\n  pace: {per_chat_secs: -1}\n",
        ENV,
        "chat.yaml:5: telegram.pace.per_chat_secs: must be at least 0",
    ),
    (
        "a misspelt pace",
        TELEGRAM_HEAD + "  allow_users: [1]\n  pace: {per_chat_sec: 0.5}\n",
        ENV,
        "chat.yaml:5: unknown key 'per_chat_sec' in telegram.pace; did you mean 'per_chat_secs'?",
    ),
    (
        "an account-wide pace of nothing",
        TELEGRAM_HEAD + "  allow_users: [1]\n  pace: {account_per_second: 0}\n",
        ENV,
        "chat.yaml:5: telegram.pace.account_per_second: must be greater than 0",
    ),
    (
        "an account-wide pace below nothing",
        MATRIX_HEAD + "  pace:\n    per_chat_secs: 0\n    account_per_second: -1\n",
        ENV,
        "chat.yaml:9: matrix.pace.account_per_second: must be greater than 0",
    ),
    (
        "a burst of nothing",
        MATRIX_HEAD + "  pace:\n    account_burst: 0\n",
        ENV,
        "chat.yaml:8: matrix.pace.account_burst: must be at least 1",
    ),
    (
        "a burst of a fraction of a message",
        MATRIX_HEAD + "  pace:\n    account_burst: 2.5\n",
        ENV,
        "chat.yaml:8: matrix.pace.account_burst: expected a whole number, got 2.5",
    ),
    (
        "a burst for Telegram, whose limit is a window",
        TELEGRAM_HEAD + "  allow_users: [1]\n  pace:\n    account_per_second: 20\n    account_burst: 5\n",
        ENV,
        "chat.yaml:7: telegram.pace.account_burst: Telegram has no burst: it counts the messages of each second "
        "(at most account_per_second in any second); remove account_burst and set account_per_second alone",
    ),
    (
        "the token where the section belongs",
        'telegram: "${TELEGRAM_BOT_TOKEN}"\n',
        ENV,
        "chat.yaml:1: telegram: expected a mapping, got ${TELEGRAM_BOT_TOKEN}",
    ),
    (
        "a password that YAML reads as a number",
        "matrix:\n  homeserver: https://m.org\n  user_id: '@b:m.org'\n  password: 8675309\n  profile: p\n  allow_users: ['@a:m.org']\n",
        ENV,
        "chat.yaml:4: matrix.password: expected a string (in quotes); the value is not shown",
    ),
    (
        "password and access_token",
        "matrix:\n  homeserver: https://m.org\n  user_id: '@b:m.org'\n  password: a\n  access_token: b\n  profile: p\n  allow_users: ['@a:m.org']\n",
        ENV,
        "chat.yaml:5: matrix.access_token: give password or access_token, not both",
    ),
    (
        "neither password nor access_token",
        "matrix:\n  homeserver: https://m.org\n  user_id: '@b:m.org'\n  profile: p\n  allow_users: ['@a:m.org']\n",
        ENV,
        "chat.yaml:1: matrix: the bot cannot log in: add password:",
    ),
    (
        "a Matrix user without its server",
        "matrix:\n  homeserver: https://m.org\n  user_id: '@b:m.org'\n  password: a\n  profile: p\n  allow_users: ['@alice']\n",
        ENV,
        "chat.yaml:6: matrix.allow_users.0: expected a Matrix ID like @name:example.org, got '@alice'",
    ),
    (
        "a homeserver without its scheme",
        "matrix:\n  homeserver: matrix.org\n  user_id: '@b:m.org'\n  password: a\n  profile: p\n  allow_users: ['@a:m.org']\n",
        ENV,
        "chat.yaml:2: matrix.homeserver: expected an http:// or https:// URL of the homeserver, got 'matrix.org'",
    ),
    ("no platform", "{}\n", ENV, "chat.yaml:1: the config names no platform; it needs telegram: or matrix:"),
    ("an empty file", "\n", ENV, "chat.yaml:1: the chat config is empty; it needs telegram: or matrix:"),
    ("not a mapping", "- telegram\n", ENV, "chat.yaml:1: a chat config must be a mapping of keys to values"),
    ("invalid YAML", "telegram:\n  token: [\n", ENV, "chat.yaml:3: invalid YAML:"),
    ("a key twice", TELEGRAM_HEAD + "  profile: codex\n", ENV, "chat.yaml:4: duplicate key 'profile'"),
]


@pytest.mark.parametrize(
    ("text", "environ", "expected"), [case[1:] for case in MISTAKES], ids=[case[0] for case in MISTAKES]
)
def test_each_mistake_is_one_located_message_without_the_secret(
    tmp_path: Path, text: str, environ: dict[str, str], expected: str
) -> None:
    message = refusal(tmp_path, text, environ=environ)
    assert f"{tmp_path}/{expected}" in message, message


def test_an_unknown_profile_with_the_directory_known(tmp_path: Path) -> None:
    message = refusal(
        tmp_path,
        TELEGRAM_HEAD + "  profiles: [claude-sdk, codex-app-srver]\n  allow_users: [1]\n",
        known_profiles={"claude-sdk", "codex-app-server"},
    )
    assert (
        f"{tmp_path}/chat.yaml:4: telegram.profiles.1: no profile named 'codex-app-srver'; did you mean 'codex-app-server'?"
        in message
    )


def test_a_token_put_in_the_wrong_place_is_shown_as_its_variable(tmp_path: Path) -> None:
    message = refusal(
        tmp_path,
        "telegram:\n  token: '${TELEGRAM_BOT_TOKEN}'\n  profile: '${TELEGRAM_BOT_TOKEN}'\n  allow_users: [1]\n",
        known_profiles={"claude-sdk"},
    )
    assert message.endswith(
        "chat.yaml:3: telegram.profile: no profile named ${TELEGRAM_BOT_TOKEN} (the directory has: claude-sdk)"
    )


def test_several_mistakes_are_all_reported_in_line_order(tmp_path: Path) -> None:
    message = refusal(
        tmp_path,
        """
        telegram:
          token: "${TELEGRAM_BOT_TOKEN}"
          profile: claude-sdk
          allow_users: [one]
          groups: {answer: sometimes}
        """,
    )
    assert message.splitlines() == [
        f"{tmp_path}/chat.yaml:4: telegram.allow_users.0: expected a whole number, got 'one'",
        f"{tmp_path}/chat.yaml:5: telegram.groups.answer: expected 'mentioned' or 'always'",
    ]


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        pytest.param(lambda path: None, "telegram.token_file: cannot read", id="missing"),
        pytest.param(lambda path: path.write_text(" \n"), "is empty", id="empty"),
        pytest.param(lambda path: path.write_text(TOKEN[10:]), "does not look like a bot token", id="not a token"),
    ],
)
def test_a_token_file_that_cannot_serve(tmp_path: Path, setup: Callable[[Path], None], expected: str) -> None:
    setup(tmp_path / "telegram.token")
    message = refusal(tmp_path, "telegram:\n  token_file: telegram.token\n  profile: p\n  allow_users: [1]\n")
    assert message.startswith(f"{tmp_path}/chat.yaml:2: telegram.token_file: {str(tmp_path / 'telegram.token')!r}") or (
        f"{tmp_path}/chat.yaml:2: telegram.token_file: cannot read" in message
    )
    assert expected in message


def test_a_config_that_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(ChatConfigError, match="cannot read the chat config: No such file or directory") as refused:
        load_chat_config(tmp_path / "missing.yaml")
    assert isinstance(refused.value, ProfileError) and isinstance(refused.value, BridgeError)
    assert [str(problem) for problem in refused.value.problems] == [
        f"{tmp_path}/missing.yaml: cannot read the chat config: No such file or directory"
    ]


# --------------------------------------------------------------------------- the JSON Schema


def test_the_json_schema_describes_every_key_and_takes_a_good_config() -> None:
    schema = chat_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert set(schema["properties"]) == {"telegram", "matrix"}
    assert schema["additionalProperties"] is False
    for name in ("TelegramConfig", "MatrixConfig", "Groups", "Budget"):
        definition = schema["$defs"][name]
        assert definition["additionalProperties"] is False, name
        assert all(field.get("description") for field in definition["properties"].values()), name
    good = yaml.safe_load(
        textwrap.dedent(
            """
            telegram: {token: "123:abc", profile: p, allow_users: [1], budget: {turns_per_day: 5}}
            matrix: {homeserver: "https://m.org", user_id: "@b:m.org", password: x, profile: p, allow_users: ["@a:m.org"]}
            """
        )
    )
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"telegram": {**good["telegram"], "tokne": "x"}}, schema)
    json.dumps(schema)
