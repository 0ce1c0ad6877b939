"""Profile loading (SPEC §1): defaults, file:line errors, placeholders, injection refusal, schema."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import bridge
import bridge.profile_cache
from bridge import Profile, ProfileError, load_profile, parse_profile
from bridge.profile import FIELD_NAMES

from conftest import PROFILES, write_profile


def problems(text: str) -> list[str]:
    with pytest.raises(ProfileError) as caught:
        parse_profile(text, source="p.yaml")
    return [str(problem) for problem in caught.value.problems]


def test_defaults_match_the_spec(tmp_path: Path) -> None:
    profile = load_profile(write_profile(tmp_path, "command: ./agent\n", name="helper.yaml"))
    assert profile.to_dict() == {
        "command": "./agent", "args": [], "stdin": "none", "cwd": None, "env": {}, "env_allowlist": None,
        "env_inherit": "minimal", "timeout_secs": 1800, "idle_timeout_secs": None, "kill_grace_secs": 5,
        "max_reply_chars": 8000, "truncation_suffix": "\n\n…(truncated)", "include_stderr_in_reply": False,
        "send_error_reply": True, "streaming": True, "session_line_prefix": "AGENT_SESSION:",
        "name": "helper", "description": None,
    }
    assert profile.profile_dir == str(tmp_path.resolve())


def test_every_field_can_be_set(tmp_path: Path) -> None:
    profile = load_profile(write_profile(tmp_path, """
        name: custom
        description: all of it
        command: [python3, -u]
        args: [agent.py, --flag]
        stdin: message
        cwd: work
        env: {A: "1"}
        env_allowlist: [HOME]
        env_inherit: all
        timeout_secs: 0.5
        idle_timeout_secs: 2
        kill_grace_secs: 0
        max_reply_chars: null
        truncation_suffix: "…"
        include_stderr_in_reply: true
        send_error_reply: false
        streaming: false
        session_line_prefix: "SESSION="
    """))
    assert profile.name == "custom"
    assert profile.argv_template == ("python3", "-u", "agent.py", "--flag")
    assert (profile.max_reply_chars, profile.kill_grace_secs, profile.idle_timeout_secs) == (None, 0, 2)


def test_command_string_is_split_like_a_shell_without_expanding() -> None:
    profile = parse_profile("""command: 'agent --name "two words" $HOME ~ *.py a\\ b'""")
    assert profile.argv_template == ("agent", "--name", "two words", "$HOME", "~", "*.py", "a b")


def test_command_list_and_args_are_never_split() -> None:
    profile = parse_profile('command: ["my agent", "--x y"]\nargs: ["a b", "c"]\n')
    assert profile.argv_template == ("my agent", "--x y", "a b", "c")


def test_unknown_key_names_file_line_and_the_closest_key() -> None:
    assert problems("command: x\n\ntimout_secs: 5\n") == [
        "p.yaml:3: unknown key 'timout_secs'; did you mean 'timeout_secs'?"
    ]


def test_unknown_key_without_a_close_match() -> None:
    assert problems("command: x\nflavour: mint\n") == ["p.yaml:2: unknown key 'flavour'"]


@pytest.mark.parametrize(("yaml_text", "expected"), [
    ("command: x\ntimeout_secs: soon\n", "p.yaml:2: timeout_secs: expected a number, got 'soon'"),
    ("command: x\ntimeout_secs: -1\n", "p.yaml:2: timeout_secs: must be greater than 0"),
    ("command: x\ntimeout_secs: 0\n", "p.yaml:2: timeout_secs: must be greater than 0"),
    ("command: x\nkill_grace_secs: -0.5\n", "p.yaml:2: kill_grace_secs: must be at least 0"),
    ("command: x\nmax_reply_chars: 0\n", "p.yaml:2: max_reply_chars: must be greater than 0"),
    ("command: x\nmax_reply_chars: 1.5\n", "p.yaml:2: max_reply_chars: expected a whole number, got 1.5"),
    ("command: x\nstreaming: maybe\n", "p.yaml:2: streaming: expected true or false, got 'maybe'"),
    ("command: x\nstdin: file\n", "p.yaml:2: stdin: expected 'none' or 'message'"),
    ("command: x\nenv_inherit: some\n", "p.yaml:2: env_inherit: expected 'minimal' or 'all'"),
    ("command: x\nenv:\n  PORT: 8080\n", "p.yaml:3: env.PORT: expected a string, got 8080"),
    ("command: x\nargs: [a, 1]\n", "p.yaml:2: args.1: expected a string, got 1"),
    ("command: x\nsession_line_prefix: ''\n", "p.yaml:2: session_line_prefix: must not be empty"),
    ("command: 42\n", "p.yaml:1: command: expected a string or a list of strings, got 42"),
    ("command: ''\n", "p.yaml:1: command: it is empty; it must name the program to run"),
    ("command: []\n", "p.yaml:1: command: it is empty; it must name the program to run"),
    ("command: 'agent \"unclosed'\n", "p.yaml:1: command: cannot split it into words: no closing quotation"),
    ("description: no command\n", "p.yaml:1: command: is required"),
])
def test_bad_values_are_reported_at_their_line(yaml_text: str, expected: str) -> None:
    assert problems(yaml_text) == [expected]


def test_every_problem_is_reported_in_line_order() -> None:
    assert problems("command: x\nstreaming: 3\ntimout: 1\nstdin: all\n") == [
        "p.yaml:2: streaming: expected true or false, got 3",
        "p.yaml:3: unknown key 'timout'; did you mean 'timeout_secs'?",
        "p.yaml:4: stdin: expected 'none' or 'message'",
    ]


def test_yaml_syntax_error_has_a_line() -> None:
    [message] = problems("command: x\nenv: {A: 1\n")
    assert message.startswith("p.yaml:") and "invalid YAML" in message


def test_duplicate_keys_are_an_error() -> None:
    assert problems("command: x\ntimeout_secs: 1\ntimeout_secs: 2\n") == ["p.yaml:3: duplicate key 'timeout_secs'"]


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_empty_profile(text: str) -> None:
    assert problems(text) == ["p.yaml:1: the profile is empty; it needs at least `command:`"]


def test_profile_must_be_a_mapping() -> None:
    assert problems("- command\n") == ["p.yaml:1: a profile must be a mapping of keys to values"]


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no such profile file"):
        load_profile(tmp_path / "absent.yaml")
    with pytest.raises(ProfileError, match="is a directory"):
        load_profile(tmp_path)
    (tmp_path / "latin1.yaml").write_bytes(b"command: caf\xe9\n")
    with pytest.raises(ProfileError, match="not UTF-8"):
        load_profile(tmp_path / "latin1.yaml")


def test_profile_error_is_a_bridge_error() -> None:
    with pytest.raises(bridge.BridgeError):
        parse_profile("nope: 1\n")


def test_unknown_placeholder_is_caught_with_a_suggestion() -> None:
    assert problems("command: agent\nargs: ['--m', '{{MESAGE}}']\n") == [
        "p.yaml:2: args.1: unknown placeholder {{MESAGE}}; did you mean {{MESSAGE}}?"
    ]
    [message] = problems("command: agent\nenv:\n  X: '{{session_id}}'\n")
    assert message == "p.yaml:3: env.X: unknown placeholder {{session_id}}; did you mean {{SESSION_ID}}?"


def test_templates_of_other_tools_are_left_alone() -> None:
    profile = parse_profile("command: docker\nargs: [ps, --format, '{{.ID}} {{ json . }}']\n")
    assert profile.argv_template[-1] == "{{.ID}} {{ json . }}"


@pytest.mark.parametrize("command", [
    "sh -c 'echo {{MESSAGE}}'",
    "bash -lc 'run \"{{MESSAGE}}\"'",
    "/bin/bash -e -c 'x {{SESSION_ID}}'",
    "dash -c -- 'x {{SESSION_NAME}}'",
    "env FOO=1 zsh -c 'say {{MESSAGE}}'",
    "python3 -c 'print(\"{{MESSAGE}}\")'",
    "python3.11 -u -c 'print({{MESSAGE}})'",
    "python -W ignore -c 'print({{MESSAGE}})'",
    "node -e 'console.log(`{{MESSAGE}}`)'",
    "node --eval='f(\"{{MESSAGE}}\")'",
    "perl -ne 'print \"{{MESSAGE}}\"'",
    "ruby -e 'puts \"{{MESSAGE}}\"'",
    "php -r 'echo \"{{MESSAGE}}\";'",
])
def test_untrusted_placeholder_in_inline_code_is_refused(command: str) -> None:
    [message] = problems(f"command: {json.dumps(command)}\n")
    assert message.startswith("p.yaml:1: command: {{")
    assert "inline code" in message and "separate argument" in message


def test_inline_code_in_args_is_refused_at_the_arg_line() -> None:
    [message] = problems("command: python3\nargs:\n  - -c\n  - print('{{MESSAGE}}')\n")
    assert message.startswith("p.yaml:4: args.1: {{MESSAGE}} is inside the inline code run by python")


@pytest.mark.parametrize("command", [
    ["sh", "-c", 'echo "$1"', "sh", "{{MESSAGE}}"],
    ["bash", "-c", 'exec agent "$@"', "--", "{{MESSAGE}}", "{{SESSION_ID}}"],
    ["python3", "agent.py", "-c", "{{MESSAGE}}"],
    ["python3", "-c", "import sys; print(sys.argv[1])", "{{MESSAGE}}"],
    ["sh", "-c", "cd {{PROFILE_DIR}} && ./agent"],
    ["node", "agent.js", "--eval", "{{MESSAGE}}"],
])
def test_placeholders_as_separate_arguments_are_fine(command: list[str]) -> None:
    parse_profile(json.dumps({"command": command}))


def test_api_construction_validates_too() -> None:
    with pytest.raises(ValueError, match="inline code"):
        Profile(command=["sh", "-c", "echo {{MESSAGE}}"])
    with pytest.raises(ValueError):
        Profile(command="x", timout_secs=3)  # type: ignore[call-arg]


def test_api_profile_defaults_name_and_directory() -> None:
    profile = Profile(command="/usr/bin/my-agent --fast")
    assert profile.label == "my-agent"
    assert profile.profile_dir == os.getcwd()
    relative = Profile.from_mapping({"command": "x"}, profile_dir="some/dir")
    assert relative.profile_dir == os.path.abspath("some/dir")


def test_profiles_are_immutable_but_copyable() -> None:
    profile = parse_profile("command: x\nargs: [a]\nenv: {A: '1'}\n", source="/somewhere/p.yaml")
    with pytest.raises(AttributeError, match="replace"):
        profile.timeout_secs = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        profile.env["A"] = "2"  # type: ignore[index]
    assert profile.args == ("a",)
    faster = profile.replace(timeout_secs=3.0)
    assert (faster.timeout_secs, faster.profile_dir, faster.argv_template) == (3.0, "/somewhere", ("x", "a"))
    assert faster.replace(timeout_secs=1800) == profile
    with pytest.raises(ProfileError, match="timeout_secs: must be greater than 0"):
        profile.replace(timeout_secs=0)


def test_schema_describes_every_field_and_forbids_others() -> None:
    schema = bridge.json_schema()
    assert list(schema["properties"]) == list(FIELD_NAMES)
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["command"]
    assert all(field.get("description") for field in schema["properties"].values())
    json.dumps(schema)


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.yaml")), ids=lambda path: path.name)
def test_bundled_profiles_load(path: Path) -> None:
    profile = load_profile(path)
    assert profile.name == path.stem and profile.description


def test_validated_profiles_are_remembered_until_the_file_changes(tmp_path: Path) -> None:
    path = write_profile(tmp_path, "command: first\n")
    assert load_profile(path).command == "first"
    assert load_profile(path).command == "first"
    entries = list(bridge.profile_cache.cache_directory().glob("*.json"))
    assert len(entries) == 1 and oct(entries[0].stat().st_mode & 0o777) == "0o600"

    path.write_text("command: second\n")
    assert load_profile(path).command == "second"
    path.write_text("command: second\ntimout_secs: 1\n")
    with pytest.raises(ProfileError, match="unknown key"):
        load_profile(path)


def test_a_remembered_profile_equals_a_validated_one(tmp_path: Path) -> None:
    path = write_profile(tmp_path, "command: [a, '{{PROFILE_DIR}}']\nenv: {X: y}\nmax_reply_chars: null\n")
    fresh = load_profile(path, cache=False)
    load_profile(path)
    remembered = load_profile(path)
    assert remembered == fresh and remembered.argv_template == fresh.argv_template
    assert isinstance(remembered.timeout_secs, float)


def test_a_corrupt_or_unwritable_cache_is_only_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_profile(tmp_path, "command: agent\n")
    load_profile(path)
    for entry in bridge.profile_cache.cache_directory().glob("*.json"):
        entry.write_text("{not json")
    assert load_profile(path).command == "agent"
    for entry in bridge.profile_cache.cache_directory().glob("*.json"):
        entry.write_text(json.dumps({"validator": "other", "path": str(path), "content": "", "values": {}}))
    assert load_profile(path).command == "agent"
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert load_profile(path).command == "agent"


def test_a_relative_xdg_cache_home_is_ignored_as_the_xdg_spec_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert bridge.profile_cache.cache_directory() == Path.home() / ".cache" / "agent-bridge" / "profiles"


def test_running_a_remembered_profile_does_not_load_pydantic(tmp_path: Path) -> None:
    """The point of the cache: `agent-bridge run` on an unchanged profile skips pydantic's machinery."""
    import subprocess
    import sys

    path = write_profile(tmp_path, "command: agent\n")
    probe = (
        "import sys, bridge; bridge.load_profile(sys.argv[1]); "
        "print(any(name.startswith('pydantic.main') or name == 'bridge.schema' for name in sys.modules))"
    )
    first = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
    again = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
    assert (first.stdout.strip(), again.stdout.strip()) == ("True", "False")
