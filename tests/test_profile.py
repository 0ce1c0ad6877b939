"""Profile loading (docs/protocol.md §1): defaults, file:line errors, placeholders, injection refusal, schema."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from conftest import PROFILES, write_agent, write_profile
from hypothesis import given, settings
from hypothesis import strategies as st

import bridge
import bridge.profile.cache
from bridge import Profile, ProfileError, load_profile, parse_profile
from bridge.profile import FIELD_NAMES


def problems(text: str) -> list[str]:
    with pytest.raises(ProfileError) as caught:
        parse_profile(text, source="p.yaml")
    return [str(problem) for problem in caught.value.problems]


def test_defaults_match_the_spec(tmp_path: Path) -> None:
    profile = load_profile(write_profile(tmp_path, "command: ./agent\n", name="helper.yaml"))
    assert profile.to_dict() == {
        "command": "./agent",
        "args": [],
        "protocol": "agentproc-0.1",
        "resume_args": [],
        "new_session_args": [],
        "permissions": None,
        "attachments": None,
        "sandbox": None,
        "limits": None,
        "keep_warm_secs": 600,
        "max_warm": 16,
        "start_timeout_secs": 60,
        "on_busy": "queue",
        "on_resume_failure": "new_session",
        "on_worker_lost": "retry",
        "stdin": "none",
        "cwd": None,
        "env": {},
        "env_allowlist": None,
        "env_inherit": "minimal",
        "timeout_secs": 1800,
        "idle_timeout_secs": None,
        "kill_grace_secs": 5,
        "max_reply_chars": 8000,
        "truncation_suffix": "\n\n…(truncated)",
        "outbox": None,
        "outbox_max_files": 20,
        "outbox_max_bytes": 52428800,
        "include_stderr_in_reply": False,
        "send_error_reply": True,
        "streaming": True,
        "session_line_prefix": "AGENT_SESSION:",
        "name": "helper",
        "description": None,
    }
    assert profile.profile_dir == str(tmp_path.resolve())


def test_every_field_can_be_set(tmp_path: Path) -> None:
    profile = load_profile(
        write_profile(
            tmp_path,
            """
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
    """,
        )
    )
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


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("command: x\ntimeout_secs: soon\n", "p.yaml:2: timeout_secs: expected a number, got 'soon'"),
        ("command: x\ntimeout_secs: -1\n", "p.yaml:2: timeout_secs: must be greater than 0"),
        ("command: x\ntimeout_secs: 0\n", "p.yaml:2: timeout_secs: must be greater than 0"),
        ("command: x\nkill_grace_secs: -0.5\n", "p.yaml:2: kill_grace_secs: must be at least 0"),
        ("command: x\nmax_reply_chars: 0\n", "p.yaml:2: max_reply_chars: must be greater than 0"),
        ("command: x\nmax_reply_chars: 1.5\n", "p.yaml:2: max_reply_chars: expected a whole number, got 1.5"),
        ("command: x\nstreaming: maybe\n", "p.yaml:2: streaming: expected true or false, got 'maybe'"),
        ("command: x\nstdin: file\n", "p.yaml:2: stdin: expected 'none', 'message' or 'line'"),
        ("command: x\nenv_inherit: some\n", "p.yaml:2: env_inherit: expected 'minimal' or 'all'"),
        ("command: x\nenv:\n  PORT: 8080\n", "p.yaml:3: env.PORT: expected a string, got 8080"),
        ("command: x\nargs: [a, 1]\n", "p.yaml:2: args.1: expected a string, got 1"),
        ("command: x\nsession_line_prefix: ''\n", "p.yaml:2: session_line_prefix: must not be empty"),
        ("command: 42\n", "p.yaml:1: command: expected a string or a list of strings, got 42"),
        ("command: ''\n", "p.yaml:1: command: it is empty; it must name the program to run"),
        ("command: []\n", "p.yaml:1: command: it is empty; it must name the program to run"),
        ("command: 'agent \"unclosed'\n", "p.yaml:1: command: cannot split it into words: no closing quotation"),
        ("description: no command\n", "p.yaml:1: command: is required"),
    ],
)
def test_bad_values_are_reported_at_their_line(yaml_text: str, expected: str) -> None:
    assert problems(yaml_text) == [expected]


def test_every_problem_is_reported_in_line_order() -> None:
    assert problems("command: x\nstreaming: 3\ntimout: 1\nstdin: all\n") == [
        "p.yaml:2: streaming: expected true or false, got 3",
        "p.yaml:3: unknown key 'timout'; did you mean 'timeout_secs'?",
        "p.yaml:4: stdin: expected 'none', 'message' or 'line'",
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


# --------------------------------------------------------------------------- a message never runs code

# Refused before, and still: an untrusted placeholder in an interpreter's inline code.
STILL_REFUSED = [
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
    "sh -c {{MESSAGE}}",
    "bash -lc {{MESSAGE}}",
    "timeout -s KILL 5 sh -c {{MESSAGE}}",
    "/usr/bin/env python3.11 -c {{MESSAGE}}",
    "env -i PATH=/bin perl5.36 -e {{MESSAGE}}",
    "sudo -u bob sh -c {{MESSAGE}}",
    "docker exec -i box sh -c {{MESSAGE}}",
    "nice -n 5 python3 -c {{MESSAGE}}",
    "python3 -Xdev -c 'print(\"{{MESSAGE}}\")'",
    "gdb --args sh -c {{MESSAGE}}",
]


@pytest.mark.parametrize("command", STILL_REFUSED)
def test_untrusted_placeholder_in_inline_code_is_still_refused(command: str) -> None:
    [message] = problems(f"command: {json.dumps(command)}\n")
    assert message.startswith("p.yaml:1: command: {{")
    assert "run code" in message and "$AGENT_" in message


# Each of these passed `check` before and let a message run code (issue 7).
NEWLY_REFUSED = [
    # embedded in a larger argument: refused wherever it is
    ("awk 'BEGIN{print \"{{MESSAGE}}\"}'", "inside the inline code run by awk"),
    ('bash --rcfile /dev/null -c "echo {{MESSAGE}}"', "inside the inline code run by bash"),
    ('bash --init-file /dev/null -c "echo {{MESSAGE}}"', "inside the inline code run by bash"),
    ("perl -Mfeature=say -e 'say \"{{MESSAGE}}\"'", "inside the inline code run by perl"),
    ("python3 -Wignore::DeprecationWarning -c 'print(\"{{MESSAGE}}\")'", "inside the inline code run by python3"),
    ("python3 -Xpycache_prefix=/tmp -c 'print(\"{{MESSAGE}}\")'", "inside the inline code run by python3"),
    ("node -pe '\"{{MESSAGE}}\"'", "inside the inline code run by node"),
    ("env -S \"sh -c 'echo {{MESSAGE}}'\"", "inside the inline code run by env"),
    ("flock /tmp/lock -c 'echo {{MESSAGE}}'", "inside the inline code run by flock"),
    ("script -qc 'echo {{MESSAGE}}' /dev/null", "inside the inline code run by script"),
    ("su root -c 'echo {{MESSAGE}}'", "inside the inline code run by su"),
    ("gdb -ex 'shell echo {{MESSAGE}}'", "inside the inline code run by gdb"),
    ("watch 'echo {{MESSAGE}}'", "inside the inline code run by watch"),
    ("ssh host 'echo {{MESSAGE}}'", "inside the inline code run by ssh"),
    ("agent 'Answer this: {{MESSAGE}}'", "part of a larger argument ('Answer this: {{MESSAGE}}')"),
    ("agent -p{{MESSAGE}}", "part of a larger argument ('-p{{MESSAGE}}')"),
    ("agent --x=a{{MESSAGE}}", "part of a larger argument"),
    ("agent {{MESSAGE}}{{SESSION_ID}}", "part of a larger argument"),
    ("agent --session=s-{{SESSION_ID}}", "part of a larger argument"),
    ("env GREETING={{SESSION_NAME}} agent", "part of a larger argument"),
    ("'{{PROFILE_DIR}}/{{SESSION_ID}}/agent'", "part of a larger argument"),
    # whole, but the program itself
    ("{{MESSAGE}}", "is the program to run"),
    ("env {{MESSAGE}}", "is the command env runs"),
    ("/usr/bin/env -- {{SESSION_NAME}}", "is the command env runs"),
    ("xargs {{MESSAGE}}", "is the command xargs runs"),
    ("timeout 5 {{MESSAGE}}", "is the command timeout runs"),
    ("docker run --rm img {{MESSAGE}}", "is the command docker run runs"),
    ("npx {{MESSAGE}}", "is the program npx runs"),
    ("git -- {{MESSAGE}}", "is the subcommand git runs"),
    # whole, after a code option: spelled apart, bundled, or --flag=
    ("node -pe {{MESSAGE}}", "is the value of node -pe"),
    ("node --require {{MESSAGE}} agent.js", "is the value of node --require"),
    ("gdb -ex {{MESSAGE}}", "is the value of gdb -ex"),
    ("gdb --eval-command={{MESSAGE}}", "is the value of gdb -eval-command"),
    ("gawk --source={{MESSAGE}}", "is the value of gawk --source"),
    ("env -S {{MESSAGE}}", "is the value of env -S"),
    ("env --split-string={{MESSAGE}}", "is the value of env --split-string"),
    ("flock /tmp/lock -c {{MESSAGE}}", "is the value of flock -c"),
    ("script -qc {{MESSAGE}} /dev/null", "is the value of script -c"),
    ("su root -c {{MESSAGE}}", "is the value of su -c"),
    ("vim -c {{MESSAGE}}", "is the value of vim -c"),
    ("emacs --batch --eval {{MESSAGE}}", "is the value of emacs -eval"),
    ("expect -c {{MESSAGE}}", "is the value of expect -c"),
    ("git -c {{MESSAGE}} status", "is the value of git -c"),
    ("bash --rcfile {{MESSAGE}}", "is the value of bash --rcfile"),
    ("ssh -o {{MESSAGE}} host", "is the value of ssh -o"),
    ("python3 -m {{MESSAGE}}", "is the value of python3 -m"),
    # whole, as an operand the program runs
    ("awk {{MESSAGE}}", "is the code awk runs"),
    ("awk -F: -- {{MESSAGE}} data.txt", "is the code awk runs"),
    ("sed -n -- {{MESSAGE}}", "is the code sed runs"),
    ("watch {{MESSAGE}}", "part of the command line watch runs"),
    ("ssh host {{MESSAGE}}", "part of the command line ssh runs"),
    ("ssh -p 22 host cat {{MESSAGE}}", "part of the command line ssh runs"),
    ("su bob {{MESSAGE}}", "part of the command line su runs"),
    ("python3 -- {{MESSAGE}}", "is the script python3 runs"),
    ("python3 {{MESSAGE}}", "is the script python3 runs"),
    # whole, where a program that can run code from an option reads options
    ("perl -e 'print @ARGV' {{MESSAGE}}", "where perl reads its options"),
    ("node -e 'console.log(process.argv[1])' {{MESSAGE}}", "where node reads its options"),
    ("sed -n p {{MESSAGE}}", "where sed reads its options"),
    ("awk -f prog.awk {{MESSAGE}}", "where awk reads its options"),
    ("ssh {{MESSAGE}}", "where ssh reads its options"),
    ("git log {{MESSAGE}}", "where git log reads its options"),
    ("runuser -u bob sh -c 'echo \"$1\"' sh {{MESSAGE}}", "where runuser reads its options"),
]


@pytest.mark.parametrize(("command", "reason"), NEWLY_REFUSED, ids=[command for command, _ in NEWLY_REFUSED])
def test_a_placeholder_that_could_run_code_is_refused(command: str, reason: str) -> None:
    [message] = problems(f"command: {json.dumps(command)}\n")
    assert message.startswith("p.yaml:1: command: {{")
    assert reason in message


def test_the_refusal_says_what_to_do_instead() -> None:
    [embedded] = problems("command: agent\nargs: ['Answer this: {{MESSAGE}}']\n")
    assert "Pass it as its own argument (e.g. sh -c 'echo \"$1\"' sh {{MESSAGE}})" in embedded
    assert "read $AGENT_MESSAGE" in embedded and "env value" in embedded
    [option] = problems("command: sed -n p {{SESSION_ID}}\n")
    assert "after `--`" in option and "$AGENT_SESSION_ID" in option
    [program] = problems("command: env {{SESSION_NAME}}\n")
    assert "must never choose what runs" in program and "$AGENT_SESSION_NAME" in program


def test_inline_code_in_args_is_refused_at_the_arg_line() -> None:
    [message] = problems("command: python3\nargs:\n  - -c\n  - print('{{MESSAGE}}')\n")
    assert message.startswith("p.yaml:4: args.1: {{MESSAGE}} is inside the inline code run by python3")
    [message] = problems("command: [timeout, -s, KILL, '5']\nargs:\n  - sh\n  - -c\n  - '{{MESSAGE}}'\n")
    assert message.startswith("p.yaml:5: args.2: {{MESSAGE}} is the code sh -c runs")


# Still accepted: a whole argument where the program takes data, or a long option's whole value.
ACCEPTED = [
    ["sh", "-c", 'echo "$1"', "sh", "{{MESSAGE}}"],
    ["claude", "-p", "{{MESSAGE}}"],
    ["claude", "--prompt={{MESSAGE}}"],
    ["python3", "{{PROFILE_DIR}}/agent.py"],
    ["python3", "agent.py", "{{MESSAGE}}"],
    ["node", "agent.js", "--eval", "{{MESSAGE}}"],
    ["docker", "ps", "--format", "{{.ID}}"],
    ["bash", "-c", 'exec agent "$@"', "--", "{{MESSAGE}}", "{{SESSION_ID}}"],
    ["python3", "agent.py", "-c", "{{MESSAGE}}"],
    ["python3", "-c", "import sys; print(sys.argv[1])", "{{MESSAGE}}"],
    ["sh", "-c", "cd {{PROFILE_DIR}} && ./agent"],
    ["timeout", "-s", "KILL", "5", "python3", "agent.py", "{{MESSAGE}}"],
    ["env", "-S", 'sh -c "echo \\"$1\\"" sh', "{{MESSAGE}}"],
    ["perl", "-e", "print $ARGV[0]", "--", "{{MESSAGE}}"],
    ["awk", "-f", "prog.awk", "--", "{{MESSAGE}}"],
    ["sed", "-e", "p", "--", "{{MESSAGE}}"],
    ["sudo", "-u", "{{SESSION_NAME}}", "agent"],
    ["flock", "/tmp/lock", "python3", "agent.py", "{{MESSAGE}}"],
    ["docker", "exec", "-i", "box", "agent", "{{MESSAGE}}"],
    ["git", "commit", "--message={{MESSAGE}}"],
    ["runuser", "-u", "bob", "--", "sh", "-c", 'echo "$1"', "sh", "{{MESSAGE}}"],
    ["ls", "-1", "{{MESSAGE}}"],
    ["{{PROFILE_DIR}}/agent", "--session={{SESSION_ID}}", "--", "{{MESSAGE}}"],
]


@pytest.mark.parametrize("command", ACCEPTED, ids=" ".join)
def test_placeholders_where_the_program_takes_data_are_fine(command: list[str]) -> None:
    assert parse_profile(json.dumps({"command": command})).argv_template == tuple(command)


# Issue 19: the wrappers an operator reaches for to limit an agent, and find and make. For each wrapper, the
# message where the program would run it (refused) and where it is data after the wrapped command (loads).
WRAPPED_REFUSED = [
    ("prlimit --nofile=64 -- sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("prlimit -n64 {{MESSAGE}}", "is the command prlimit runs"),
    ("systemd-run --user --pipe --wait sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("systemd-run -p {{MESSAGE}} mycli", "is the value of systemd-run -p"),  # ExecStartPre=…
    ("systemd-run --setenv={{MESSAGE}} mycli", "is the value of systemd-run --setenv"),  # LD_PRELOAD=…
    ("bwrap --ro-bind / / --dev /dev sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("bwrap --setenv LD_PRELOAD {{MESSAGE}} mycli", "is the value of bwrap --setenv"),
    ("bwrap --args {{MESSAGE}} mycli", "is the value of bwrap --args"),
    ("firejail --quiet sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("firejail --profile={{MESSAGE}} mycli", "is the value of firejail --profile"),
    ("firejail --env={{MESSAGE}} mycli", "is the value of firejail --env"),
    ("nice -n 5 python3 {{MESSAGE}}", "is the script python3 runs"),
    ("nice -5 {{MESSAGE}}", "is the command nice runs"),
    ("ionice -c2 -n0 sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("taskset -c 0 sh -c {{MESSAGE}}", "is the code sh -c runs"),  # -c is a flag: 0 is the CPU list
    ("chrt --other sh -c {{MESSAGE}}", "is the code sh -c runs"),  # no priority: sh is the command
    ("chrt -i 0 node -e {{MESSAGE}}", "is the value of node -e"),
    ("setpriv --reuid 1000 --nnp sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("runuser -u bob -- sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("runuser -u bob mycli {{MESSAGE}}", "where runuser reads its options"),  # runuser permutes its options
    ("unshare --setgroups deny -U sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("unshare --load-interp {{MESSAGE}} mycli", "is the value of unshare --load-interp"),
    ("nsenter -N 3 -t 1 sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("nsenter -W /srv -t 1 sh -c {{MESSAGE}}", "is the code sh -c runs"),  # -W DIR in util-linux 2.38
    ("stdbuf -oL sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("flock --start 0 --length 1 /tmp/lock sh -c {{MESSAGE}}", "is the code sh -c runs"),
    ("flock --fd 3 perl -e 'print @ARGV' {{MESSAGE}}", "where perl reads its options"),  # --fd: no file
    ("find . -exec {{MESSAGE}} ;", "is the command find -exec runs"),
    ("find . -execdir sh -c {{MESSAGE}} ;", "is the code sh -c runs"),
    ("find . -ok python3 -- {{MESSAGE}} ;", "is the script python3 runs"),
    ("find . -okdir {{MESSAGE}} {} ;", "is the command find -okdir runs"),
    ("find . -name x -exec grep -l x {} + -exec {{MESSAGE}} ;", "is the command find -exec runs"),
    ("find -- {{MESSAGE}}", "where find reads its options"),  # find -- -delete deletes
    ("make --eval={{MESSAGE}}", "is the value of make --eval"),
    ("make -E {{MESSAGE}}", "is the value of make -E"),
    ("make -f {{MESSAGE}}", "is the value of make -f"),
    ("make -C {{MESSAGE}} reply", "is the value of make -C"),
    ("make reply -- {{MESSAGE}}", "is a goal or NAME=VALUE for make"),  # CC=… runs in the recipes
    # An option the table does not know is read both as a flag and as taking the next word.
    ("prlimit --some-new-option 5 sh -c {{MESSAGE}}", "this reads prlimit --some-new-option as taking"),
    ("taskset --some-new-option 5 0x3 sh -c {{MESSAGE}}", "this reads taskset --some-new-option as taking"),
    ("setpriv --some-new-option 5 {{MESSAGE}}", "is the command setpriv runs"),
]


@pytest.mark.parametrize(("command", "reason"), WRAPPED_REFUSED, ids=[command for command, _ in WRAPPED_REFUSED])
def test_the_rule_looks_through_the_wrappers_that_limit_an_agent(command: str, reason: str) -> None:
    [message] = problems(f"command: {json.dumps(command)}\n")
    assert message.startswith("p.yaml:1: command: {{MESSAGE}}")
    assert reason in message


WRAPPED_ACCEPTED = [
    "prlimit --nofile=64 -- mycli --prompt {{MESSAGE}}",
    "prlimit -n64 --as=1000000000 mycli -- {{MESSAGE}}",
    "systemd-run --user --pipe --wait -q -p MemoryMax=1G -E LANG=C mycli -- {{MESSAGE}}",
    "bwrap --ro-bind / / --dev /dev --unshare-all --die-with-parent --setenv LANG C mycli -- {{MESSAGE}}",
    "bwrap --overlay-src /a --overlay /rw /work /mnt mycli {{MESSAGE}}",
    "firejail --quiet --noprofile --net=none mycli -- {{MESSAGE}}",
    "nice -n 5 mycli -- {{MESSAGE}}",
    "nice -10 mycli -- {{MESSAGE}}",
    "ionice -c2 -n0 mycli -- {{MESSAGE}}",
    "taskset -c 0 mycli -- {{MESSAGE}}",
    "chrt --idle 0 mycli -- {{MESSAGE}}",
    "chrt --other mycli -- {{MESSAGE}}",
    "setpriv --reuid 1000 --regid 1000 --clear-groups --nnp mycli -- {{MESSAGE}}",
    "runuser -u bob -- mycli --prompt {{MESSAGE}}",
    "unshare -r --setgroups deny -n mycli -- {{MESSAGE}}",
    "nsenter -t 1 -n -W /srv mycli -- {{MESSAGE}}",
    "stdbuf -oL -eL mycli -- {{MESSAGE}}",
    "flock -w 10 /tmp/agent.lock mycli -- {{MESSAGE}}",
    "find . -type f -name {{MESSAGE}} -exec wc -c {} +",
    "find . -newermt {{SESSION_NAME}} -fprintf /tmp/found {{MESSAGE}}",
    "make -C /srv/agent -f agent.mk -j 4 reply",
]


@pytest.mark.parametrize("command", WRAPPED_ACCEPTED)
def test_the_message_as_data_after_a_wrapped_command_still_loads(command: str) -> None:
    assert parse_profile(json.dumps({"command": command})).argv_template == tuple(shlex.split(command))


# The accepted forms, run through the real programs where installed: the message reaches the agent as one
# argument, whatever it looks like. Checks the table's reading of each program's options against the program.
REAL_WRAPPERS = {
    "prlimit": ["prlimit", "--nofile=64", "--"],
    "nice": ["nice", "-n", "5"],
    "ionice": ["ionice", "-c", "3", "-t"],
    "taskset": ["taskset", "-c", "0"],
    "chrt": ["chrt", "--other", "0"],
    "setpriv": ["setpriv", "--nnp"],
    "stdbuf": ["stdbuf", "-oL"],
    "flock": ["flock", "-w", "5", "{{PROFILE_DIR}}/lock"],
    "find": ["find", "{{PROFILE_DIR}}/lock", "-exec"],
}


@pytest.mark.parametrize("wrapper", REAL_WRAPPERS)
def test_a_wrapped_agent_gets_the_message_as_one_argument(tmp_path: Path, wrapper: str) -> None:
    if shutil.which(wrapper) is None:
        pytest.skip(f"{wrapper} is not installed")
    (tmp_path / "lock").touch()
    write_agent(tmp_path, "args.py", f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    ending = ["{}", ";"] if wrapper == "find" else []
    argv = [*REAL_WRAPPERS[wrapper], "{{PROFILE_DIR}}/args.py", "--", "{{MESSAGE}}", *ending]
    profile = bridge.Profile.from_mapping({"command": argv, "cwd": str(tmp_path)}, profile_dir=tmp_path)
    message = "-cimport os; os.system('touch pwned') $(touch pwned) --eval=x"
    result = bridge.run_turn_sync(profile, bridge.Turn(message))
    assert result.ok, (result.error, result.stderr_tail)
    assert json.loads(result.reply)[:2] == ["--", message]
    assert not (tmp_path / "pwned").exists()


def test_cwd_and_env_values_may_embed_placeholders() -> None:
    profile = parse_profile(
        json.dumps(
            {
                "command": "agent",
                "cwd": "{{PROFILE_DIR}}/work/{{SESSION_ID}}",
                "env": {"PROMPT": "Answer: {{MESSAGE}}", "WHERE": "{{SESSION_NAME}}/{{SESSION_ID}}"},
            }
        )
    )
    assert profile.env["PROMPT"] == "Answer: {{MESSAGE}}"


CODE_VARIABLES = [
    "BASH_ENV",
    "ENV",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PERL5OPT",
    "PERL5LIB",
    "NODE_OPTIONS",
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONWARNINGS",
    "RUBYOPT",
    "RUBYLIB",
    "GIT_SSH_COMMAND",
    "GIT_EXTERNAL_DIFF",
    "PROMPT_COMMAND",
    "PS4",
    "SHELLOPTS",
    "BASHOPTS",
    "BASH_FUNC_greet%%",
]


@pytest.mark.parametrize("name", CODE_VARIABLES)
def test_an_untrusted_placeholder_in_a_variable_run_as_code_is_refused(name: str) -> None:
    [message] = problems(json.dumps({"command": "agent", "env": {name: "x {{SESSION_ID}}"}}))
    assert message == (
        f"p.yaml:1: env.{name}: {{{{SESSION_ID}}}} cannot be used in {name}: programs run or load "
        "code from that variable, so a message there would run code. Read $AGENT_SESSION_ID in the "
        "agent instead"
    )
    parse_profile(json.dumps({"command": "agent", "env": {name: "{{PROFILE_DIR}}/lib"}}))


def test_a_code_variable_is_refused_at_its_line() -> None:
    assert problems("command: agent\nenv:\n  A: ok\n  NODE_OPTIONS: '--require {{MESSAGE}}'\n") == [
        "p.yaml:4: env.NODE_OPTIONS: {{MESSAGE}} cannot be used in NODE_OPTIONS: programs run or load code from "
        "that variable, so a message there would run code. Read $AGENT_MESSAGE in the agent instead"
    ]


def injection_warnings(command: list[str]) -> list[str]:
    from bridge.profile.argv_rules import option_injection_warnings

    return option_injection_warnings(parse_profile(json.dumps({"command": command})).argv_template)


def test_a_placeholder_that_could_become_options_is_warned_about_with_the_fix() -> None:
    assert injection_warnings(["ls", "-1", "{{MESSAGE}}"]) == [
        "{{MESSAGE}} is not preceded by --, so a message starting with '-' would reach ls as options; "
        "end the options first: ls -1 -- {{MESSAGE}} (or, if it is an option's value, write --option={{MESSAGE}})"
    ]
    [warning] = injection_warnings(["timeout", "5", "claude", "-p", "{{MESSAGE}}", "{{SESSION_ID}}"])
    assert warning.startswith("{{MESSAGE}} and {{SESSION_ID}} are not preceded by --")
    assert "reach claude as options" in warning and "timeout 5 claude -p -- {{MESSAGE}} {{SESSION_ID}}" in warning
    [warning] = injection_warnings(["python3", "{{PROFILE_DIR}}/agent.py", "{{MESSAGE}}"])
    assert "python3 {{PROFILE_DIR}}/agent.py -- {{MESSAGE}}" in warning


@pytest.mark.parametrize(
    "command",
    [
        ["ls", "-1", "--", "{{MESSAGE}}"],
        ["claude", "--prompt={{MESSAGE}}"],
        ["sh", "-c", 'echo "$1"', "sh", "{{MESSAGE}}"],
        ["python3", "-c", "import sys; print(sys.argv[1])", "{{MESSAGE}}"],
        ["sudo", "-u", "{{SESSION_NAME}}", "agent"],
        ["agent", "--", "{{MESSAGE}}", "{{SESSION_ID}}"],
    ],
)
def test_no_warning_where_the_message_cannot_become_options(command: list[str]) -> None:
    assert injection_warnings(command) == []


@pytest.mark.parametrize(
    "command",
    [
        "sh",
        "bash -s",
        "/bin/bash -e",
        "python3",
        "python3 -",
        "python3.11 -u",
        "node",
        "perl -w",
        "ruby -",
        "env LC_ALL=C python3",
        "timeout 5 bash",
        "ssh host",
        "su bob",
        "sudo -s",
        # no command: they run the user's shell; make -f - reads its makefile from stdin
        "unshare -r",
        "nsenter -t 1 -m",
        "firejail --quiet",
        "chroot /srv/root",
        "systemd-run --shell --pipe",
        "make -f -",
    ],
)
def test_the_message_on_the_stdin_of_a_program_that_reads_its_code_there_is_refused(command: str) -> None:
    for mode in ("message", "line"):
        [message] = problems(f"command: {command}\nstdin: {mode}\n")
        assert message.startswith("p.yaml:2: stdin: ") and "reads the code it runs from stdin" in message
        assert "$AGENT_MESSAGE" in message
    parse_profile(f"command: {command}\nstdin: none\n")


@pytest.mark.parametrize(
    "command",
    [
        "python3 agent.py",
        "python3 -c 'import sys; print(sys.stdin.read())'",
        "sh -c 'cat'",
        "cat",
        "bc -l",
        "python3 -m agent",
        "node agent.js",
        "perl -e 'print <STDIN>'",
        "ssh host cat",
        "awk '{print}'",
        "unshare -r cat",
        "firejail --quiet cat",
        "make -f agent.mk reply",
    ],
)
def test_a_program_that_only_reads_the_message_as_data_may_have_it_on_stdin(command: str) -> None:
    parse_profile(f"command: {command}\nstdin: message\n")
    parse_profile(f"command: {command}\nstdin: line\n")


def test_a_protocol_that_writes_the_turn_to_stdin_refuses_a_program_that_reads_its_code_there() -> None:
    # No placeholder in argv and no `stdin:`: the protocol alone puts the message on stdin.
    [message] = problems("protocol: agentproc-0.4\ncommand: python3\n")
    assert message.startswith("p.yaml:1: protocol: python3 reads the code it runs from stdin")
    parse_profile("protocol: agentproc-0.4\ncommand: python3 agent.py\n")


@pytest.mark.parametrize("placeholder", ["{{MESSAGE}}", "{{SESSION_ID}}", "{{SESSION_NAME}}"])
def test_every_placeholder_from_the_chat_is_judged_wherever_argv_takes_it(placeholder: str) -> None:
    for field in ("command", "args", "resume_args", "new_session_args"):
        argv = {"command": ["sh", "-c", placeholder]} if field == "command" else {"command": ["sh", "-c"]}
        if field != "command":
            argv[field] = [placeholder]
        [message] = problems(json.dumps(argv))
        assert "is the code sh -c runs, so a message there would run code" in message, (field, message)


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


def test_a_profile_of_another_protocol_is_copyable_too() -> None:
    """`run --timeout` and `--no-stream` copy the profile: agentproc-0.1's own fields must not come along."""
    profile = parse_profile(
        "protocol: agentproc-0.4\ncommand: x\npermissions: {allow: [Read]}\nagentproc-0.4: {max_line_bytes: 8192}\n"
    )
    quiet = profile.replace(streaming=False, timeout_secs=5.0)
    assert (quiet.protocol, quiet.streaming, quiet.timeout_secs, quiet.settings.max_line_bytes) == (
        "agentproc-0.4",
        False,
        5.0,
        8192,
    )
    assert quiet.permission_policy == profile.permission_policy
    assert quiet.replace(streaming=True, timeout_secs=1800) == profile


def test_schema_describes_every_field_and_forbids_others() -> None:
    schema = bridge.json_schema()
    assert list(schema["properties"]) == [*FIELD_NAMES, *bridge.dialects.PROTOCOLS]
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["command"]
    assert all(field.get("description") for field in schema["properties"].values())
    json.dumps(schema)


@pytest.mark.parametrize("path", sorted(PROFILES.rglob("*.yaml")), ids=lambda path: path.name)
def test_bundled_profiles_load(path: Path) -> None:
    profile = load_profile(path)
    assert profile.name == path.stem and profile.description


def test_validated_profiles_are_remembered_until_the_file_changes(tmp_path: Path) -> None:
    path = write_profile(tmp_path, "command: first\n")
    assert load_profile(path).command == "first"
    assert load_profile(path).command == "first"
    entries = list(bridge.profile.cache.cache_directory().glob("*.json"))
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


def test_a_profile_knows_the_file_it_was_loaded_from_where_its_links_lead(tmp_path: Path) -> None:
    """Its sandbox binds that file read-only (docs/sandbox.md): validated or remembered, replaced or not."""
    real = write_profile(tmp_path, "command: agent\n", name="real.yaml")
    (tmp_path / "link.yaml").symlink_to(real)
    fresh = load_profile(tmp_path / "link.yaml", cache=False)
    load_profile(real)
    remembered = load_profile(real)
    assert fresh.file == remembered.file == str(real)
    assert fresh.replace(timeout_secs=5).file == str(real)
    assert Profile.from_mapping({"command": "agent"}, profile_dir=tmp_path).file is None
    assert parse_profile("command: agent\n", source=real).file is None
    # The same text in another file of the directory is another profile: a warm agent of one cannot take the other's
    # turns, its sandbox guarding the wrong file.
    twins = [write_profile(tmp_path, "command: agent\nname: twin\n", name=f"{stem}.yaml") for stem in ("a", "b")]
    mapped = Profile.from_mapping({"command": "agent", "name": "twin"}, profile_dir=tmp_path)
    assert load_profile(twins[0]) != load_profile(twins[1]) and load_profile(twins[0]) != mapped


def test_a_corrupt_or_unwritable_cache_is_only_a_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_profile(tmp_path, "command: agent\n")
    load_profile(path)
    for entry in bridge.profile.cache.cache_directory().glob("*.json"):
        entry.write_text("{not json")
    assert load_profile(path).command == "agent"
    for entry in bridge.profile.cache.cache_directory().glob("*.json"):
        entry.write_text(json.dumps({"validator": "other", "path": str(path), "content": "", "values": {}}))
    assert load_profile(path).command == "agent"
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    assert load_profile(path).command == "agent"


def test_a_relative_xdg_cache_home_is_ignored_as_the_xdg_spec_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert bridge.profile.cache.cache_directory() == Path.home() / ".cache" / "agent-bridge" / "profiles"


def test_running_a_remembered_profile_does_not_load_pydantic(tmp_path: Path) -> None:
    """The point of the cache: `agent-bridge run` on an unchanged profile skips pydantic's machinery."""
    import subprocess
    import sys

    path = write_profile(tmp_path, "command: agent\n")
    probe = (
        "import sys, bridge; bridge.load_profile(sys.argv[1]); "
        "print(any(name.startswith('pydantic.main') or name == 'bridge.profile.schema' for name in sys.modules))"
    )
    first = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
    again = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
    assert (first.stdout.strip(), again.stdout.strip()) == ("True", "False")


def _argv_vocabulary() -> list[str]:
    from bridge.profile.argv_rules import PROGRAMS

    words = {
        "--",
        "-",
        "x",
        "a=b",
        "agent",
        "{{MESSAGE}}",
        "{{SESSION_ID}}",
        "--prompt={{MESSAGE}}",
        "-c{{MESSAGE}}",
        "'unclosed",
        "{{PROFILE_DIR}}/agent.py",
    }
    for name, rules in PROGRAMS.items():
        words |= {
            name,
            *rules.code,
            *rules.values,
            *rules.attached,
            *rules.modes,
            *rules.subcommands,
            *(rules.flags or ()),
            *rules.command_options,
        }
    words |= {";", "{}", "+", "--some-new-option"}
    return sorted(words - {""})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_argv_vocabulary()), min_size=1, max_size=8))
def test_every_argv_is_judged_without_error_and_a_program_from_the_user_is_always_refused(argv: list[str]) -> None:
    from bridge.profile.argv_rules import argv_problem, option_injection_warnings

    option_injection_warnings(argv)
    problem = argv_problem(argv)
    if argv[0] in ("{{MESSAGE}}", "{{SESSION_ID}}"):
        assert problem is not None and problem.index == 0
    if any(
        "{{" in word
        and word not in ("{{MESSAGE}}", "{{SESSION_ID}}", "--prompt={{MESSAGE}}", "{{PROFILE_DIR}}/agent.py")
        for word in argv
    ):
        assert problem is not None  # -c{{MESSAGE}}: embedded


def test_outbox_tell_agent_is_session_by_default_and_takes_only_its_three_words() -> None:
    assert parse_profile("command: ./agent\n").tell_agent_outbox == "session"
    assert parse_profile("command: ./agent\noutbox: {tell_agent: never}\n").tell_agent_outbox == "never"
    [wrong] = problems("command: ./agent\noutbox:\n  tell_agent: sometimes\n")
    assert wrong.startswith("p.yaml:3: outbox.tell_agent") and "session" in wrong and "every_turn" in wrong, wrong
    assert problems("command: ./agent\noutbox: {tel_agent: never}\n") == ["p.yaml:2: unknown key 'tel_agent' in outbox"]
