"""`agent-bridge check` of a chat config, through the real command: what `connect` would refuse is said before it
runs, at the config's line; with --profiles, the profiles it names are checked as any profile is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import yaml
from chatkit import TELEGRAM_TOKEN

from bridge.chat.config import chat_json_schema

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
PASSWORD = "correct horse battery staple"
ECHO = "command: [cat]\nstdin: message\n"


def check(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "NO_COLOR": "1", **(env or {})}
    return subprocess.run(
        [AGENT_BRIDGE, "check", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=environ
    )


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(textwrap.dedent(text).lstrip())
    return name


def profiles(tmp_path: Path, **named: str) -> str:
    for name, text in named.items():
        write(tmp_path, f"bot-profiles/{name}.yaml", text)
    return "bot-profiles"


def test_a_good_config_and_its_profiles_are_ok(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "bot.yaml",
        """
        telegram:
          token: "${TELEGRAM_BOT_TOKEN}"
          profile: echo
          profiles: [echo, upper]
          allow_users: [123456789]
          budget: {turns_per_day: 200}
          pace: {account_per_second: 100}
        matrix:
          homeserver: "https://matrix.example.org"
          user_id: "@bot:example.org"
          password: "${MATRIX_PASSWORD}"
          profile: echo
          allow_users: ["@alice:example.org", "@bob:example.org"]
          pace: {per_chat_secs: 0.1, account_per_second: 10, account_burst: 8}
        """,
    )
    directory = profiles(tmp_path, echo=ECHO, upper="command: [tr, a-z, A-Z]\nstdin: message\n")
    secrets = {"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN, "MATRIX_PASSWORD": PASSWORD}
    done = check(tmp_path, config, "--profiles", directory, env=secrets)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.splitlines() == [
        "bot.yaml: ok",
        "  telegram: new conversations run echo; /profile may pick echo, upper; 1 allowed user; 200 turns a user a day;"
        " 100 messages a second in all chats",
        "  matrix: new conversations run echo; /profile may pick echo; 2 allowed users; 0.1 s between a chat's messages;"
        " 10 messages a second in all chats after a burst of 8",
        "  profile echo: ok",
        "  profile upper: ok",
    ]
    # Without --profiles the config alone is checked; a profile is still told from a config by its keys.
    alone = check(tmp_path, config, f"{directory}/echo.yaml", env=secrets)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.splitlines()[0] == "bot.yaml: ok"
    assert alone.stdout.splitlines()[-1] == "bot-profiles/echo.yaml: ok"
    assert "profile echo: ok" not in alone.stdout


def test_a_burst_alone_is_said_with_the_platforms_own_rate(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "bot.yaml",
        """
        matrix:
          homeserver: "https://matrix.example.org"
          user_id: "@bot:example.org"
          password: "${MATRIX_PASSWORD}"
          profile: echo
          allow_users: ["@alice:example.org"]
          pace: {account_burst: 4}
        """,
    )
    done = check(tmp_path, config, env={"MATRIX_PASSWORD": PASSWORD})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].endswith("; 1 allowed user; a burst of 4"), done.stdout


def test_mistakes_are_errors_at_their_line_and_exit_2(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "bot.yaml",
        """
        telegram:
          token: "${TELEGRAM_BOT_TOKEN}"
          profile: echo
          allow_user: [123456789]
        matrix:
          homeserver: "https://matrix.example.org"
          user_id: "@bot:example.org"
          password: "${MATRIX_PASSWORD}"
          profile: echo
          allow_users: []
        """,
    )
    unset = check(tmp_path, config, env={"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN})
    assert unset.returncode == 2
    assert "bot.yaml:8: matrix.password: ${MATRIX_PASSWORD} is not set in the environment" in unset.stderr
    done = check(tmp_path, config, env={"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN, "MATRIX_PASSWORD": PASSWORD})
    assert done.returncode == 2
    nobody = "allow_users: is empty, so nobody could run a turn; list the users who may (their ids), or remove it"
    assert done.stderr.splitlines() == [
        f"bot.yaml:1: telegram.{nobody}".replace("remove it", "remove the section"),
        "bot.yaml:4: unknown key 'allow_user' in telegram; did you mean 'allow_users'?",
        f"bot.yaml:10: matrix.{nobody}".replace("remove it", "remove the section"),
    ]
    assert done.stdout == ""


def test_with_profiles_a_missing_or_broken_profile_is_an_error(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "bot.yaml",
        """
        telegram:
          token: "${TELEGRAM_BOT_TOKEN}"
          profile: ecko
          allow_users: [1]
        """,
    )
    directory = profiles(tmp_path, echo=ECHO)
    missing = check(tmp_path, config, "--profiles", directory, env={"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN})
    assert missing.returncode == 2
    assert "bot.yaml:3: telegram.profile: no profile named 'ecko'; did you mean 'echo'?" in missing.stderr

    write(tmp_path, "bot.yaml", Path(tmp_path, config).read_text().replace("ecko", "echo"))
    write(tmp_path, f"{directory}/echo.yaml", "command: [cat]\ntimout_secs: 5\n")
    broken = check(tmp_path, config, "--profiles", directory, env={"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN})
    assert broken.returncode == 2, broken.stdout
    assert "bot-profiles/echo.yaml:2: unknown key 'timout_secs'; did you mean 'timeout_secs'?" in broken.stderr, (
        broken.stderr
    )
    assert "profile echo: ok" not in broken.stdout


def test_a_secret_written_in_the_file_is_warned_of_without_showing_it(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "bot.yaml",
        f"""
        telegram:
          token: "{TELEGRAM_TOKEN}"
          profile: echo
          allow_users: [1]
        matrix:
          homeserver: "https://matrix.example.org"
          user_id: "@bot:example.org"
          access_token: "syt_plain_text"
          profile: echo
          allow_users: ["@alice:example.org"]
        """,
    )
    done = check(tmp_path, config)
    assert done.returncode == 0, done.stderr
    warnings = done.stderr.splitlines()
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("bot.yaml:2: warning: telegram.token is written in the file"), warnings
    assert 'write token: "${TELEGRAM_BOT_TOKEN}" (or token_file: PATH)' in warnings[0]
    assert warnings[1].startswith("bot.yaml:8: warning: matrix.access_token is written in the file"), warnings
    assert TELEGRAM_TOKEN not in done.stderr + done.stdout and "syt_plain_text" not in done.stderr + done.stdout


def test_the_chat_configs_json_schema_is_published_beside_the_profiles(tmp_path: Path) -> None:
    done = subprocess.run([AGENT_BRIDGE, "schema", "chat"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert schema == chat_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    good = yaml.safe_load("telegram: {token: '${TELEGRAM_BOT_TOKEN}', profile: echo, allow_users: [1]}")
    jsonschema.validate(good, schema)
    profile = subprocess.run([AGENT_BRIDGE, "schema"], capture_output=True, text=True, timeout=60)
    assert json.loads(profile.stdout)["required"] == ["command"]


def test_yaml_aliases_that_expand_without_end_are_refused_at_their_line(tmp_path: Path) -> None:
    """A config of a kilobyte can spell billions of values through aliases ("billion laughs"), or a value holding
    itself: `check` (as `connect`) says so at the value's line, at once, instead of walking them."""
    laughs = ["  a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    laughs += [f"  a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 6)]  # a5 holds 9**6 values
    head = 'telegram:\n  token: "${TELEGRAM_BOT_TOKEN}"\n  profile: echo\n  allow_users: [42]\n'
    write(tmp_path, "laughs.yaml", head + "laughs:\n" + "\n".join(laughs) + "\n")
    write(tmp_path, "itself.yaml", head + "loop: &loop [*loop]\n")
    env = {"TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN}

    laughed = check(tmp_path, "laughs.yaml", env=env)
    assert laughed.returncode == 2
    assert "laughs.yaml:11: this value expands to more than 100,000 values through YAML aliases" in laughed.stderr
    looped = check(tmp_path, "itself.yaml", env=env)
    assert looped.returncode == 2 and "Traceback" not in looped.stderr, looped.stderr
    assert "itself.yaml:5: this value holds itself through a YAML alias" in looped.stderr
