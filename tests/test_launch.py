"""The pure launch builder (docs/protocol.md §1–§2): argv, environment, cwd and stdin for one turn."""

from __future__ import annotations

import json
import os

import pytest

from bridge import Attachment, LaunchError, Profile, Turn, TurnError, plan_launch
from bridge.engine.launch import MAX_ARG_STRLEN

HOST_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/u",
    "USER": "u",
    "LOGNAME": "u",
    "SHELL": "/bin/sh",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "LC_TIME": "en_GB",
    "TERM": "xterm",
    "TMPDIR": "/tmp",
    "TZ": "UTC",
    "OPENAI_API_KEY": "sk-secret",
    "DATABASE_URL": "postgres://secret",
    "AGENT_MESSAGE": "inherited!",
    "AGENT_IMAGE_URL": "inherited!",
}


def plan(turn: Turn | None = None, environ: dict[str, str] | None = None, **fields: object):
    profile = Profile.from_mapping({"command": "agent", **fields}, profile_dir="/profiles")
    return plan_launch(profile, turn or Turn("hi"), HOST_ENV if environ is None else environ)


def test_minimal_environment_is_the_infra_set_plus_the_agent_set() -> None:
    env = plan().env
    assert {name: env[name] for name in env if not name.startswith("AGENT_")} == {
        name: value
        for name, value in HOST_ENV.items()
        if name not in ("OPENAI_API_KEY", "DATABASE_URL", "AGENT_MESSAGE", "AGENT_IMAGE_URL")
    }
    assert "OPENAI_API_KEY" not in env and "DATABASE_URL" not in env


# Names a careless prefix or substring rule would let through: none of them is in the infra set.
LOOKALIKES = {
    "HOSTNAME": "box",
    "SECRET": "s3cr3t",
    "LD_PRELOAD": "/tmp/evil.so",
    "LD_LIBRARY_PATH": "/tmp",
    "LESS": "-R",
    "LANGUAGE": "en",
    "LCX": "x",
    "LC": "x",
    "PATHEXT": ".X",
    "HOMEDIR": "/h",
    "USERNAME": "u",
    "SHELLOPTS": "xtrace",
    "TERMINFO": "/t",
    "TMPDIR2": "/t",
    "TZDIR": "/z",
    "BASH_ENV": "/tmp/x",
    "PYTHONPATH": "/tmp",
    "AGENT": "x",
    "AGENTX_MESSAGE": "x",
    "path": "lower",
    "Lc_ALL": "x",
}


def test_minimal_environment_is_exactly_the_infra_set_whatever_else_the_bridge_has() -> None:
    env = plan(environ={**HOST_ENV, **LOOKALIKES}).env
    infra = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_TIME", "TERM", "TMPDIR", "TZ"}
    agent = {
        "AGENT_MESSAGE",
        "AGENT_SESSION_ID",
        "AGENT_SESSION_NAME",
        "AGENT_FROM_USER",
        "AGENT_STREAMING",
        "AGENT_PROTOCOL_VERSION",
    }
    assert set(env) == infra | agent
    assert {name: env[name] for name in infra} == {name: HOST_ENV[name] for name in infra}


def test_agent_variables() -> None:
    env = plan(Turn("hello", session_id="s-1", session_name="work", from_user="ann")).env
    assert {name: value for name, value in env.items() if name.startswith("AGENT_")} == {
        "AGENT_MESSAGE": "hello",
        "AGENT_SESSION_ID": "s-1",
        "AGENT_SESSION_NAME": "work",
        "AGENT_FROM_USER": "ann",
        "AGENT_STREAMING": "1",
        "AGENT_PROTOCOL_VERSION": "0.1",
    }
    assert plan(streaming=False).env["AGENT_STREAMING"] == "0"
    assert plan().env["AGENT_SESSION_ID"] == "" and plan().env["AGENT_SESSION_NAME"] == "default"


def test_inherit_all_passes_everything_but_stale_agent_variables() -> None:
    env = plan(env_inherit="all").env
    assert env["OPENAI_API_KEY"] == "sk-secret"
    assert env["AGENT_MESSAGE"] == "hi" and "AGENT_IMAGE_URL" not in env


def test_profile_env_overrides_the_base_and_agent_set_overrides_the_profile() -> None:
    env = plan(env={"HOME": "/elsewhere", "EXTRA": "1", "AGENT_MESSAGE": "spoof", "AGENT_CUSTOM": "mine"}).env
    assert (env["HOME"], env["EXTRA"], env["AGENT_MESSAGE"], env["AGENT_CUSTOM"]) == ("/elsewhere", "1", "hi", "mine")


def test_env_references_expand_from_the_bridge_environment() -> None:
    result = plan(env={"KEY": "${OPENAI_API_KEY}", "MIX": "a-${USER}-${NOPE}-b", "LITERAL": "$USER"})
    assert (result.env["KEY"], result.env["MIX"], result.env["LITERAL"]) == ("sk-secret", "a-u--b", "$USER")
    assert result.notes == ("env MIX: ${NOPE} is not set in the bridge's environment; it expands to empty",)


def test_allowlist_blocks_unlisted_references() -> None:
    result = plan(env={"KEY": "${OPENAI_API_KEY}", "DB": "${DATABASE_URL}"}, env_allowlist=["OPENAI_API_KEY"])
    assert (result.env["KEY"], result.env["DB"]) == ("sk-secret", "")
    assert result.notes == ("env DB: ${DATABASE_URL} is not in env_allowlist; it expands to empty",)
    assert "postgres" not in "".join(result.notes)


def test_placeholders_are_substituted_after_splitting() -> None:
    message = 'it\'s "quoted"; $(rm -rf ~) `id` {{SESSION_ID}} ${HOME} && echo'
    result = plan(
        Turn(message, session_id="S", session_name="N"),
        command="agent --m {{MESSAGE}} --s={{SESSION_ID}}",
        args=["{{SESSION_NAME}}", "{{PROFILE_DIR}}/x"],
    )
    assert result.argv == ("agent", "--m", message, "--s=S", "N", "/profiles/x")


def test_substitution_is_a_single_pass_in_env_values_too() -> None:
    env = plan(Turn("${OPENAI_API_KEY} {{SESSION_ID}}", session_id="S"), env={"M": "{{MESSAGE}}|${USER}"}).env
    assert env["M"] == "${OPENAI_API_KEY} {{SESSION_ID}}|u"


def test_cwd_is_relative_to_the_profile_and_expands_home() -> None:
    assert plan().cwd is None
    assert plan(cwd="work/{{SESSION_NAME}}").cwd == "/profiles/work/default"
    assert plan(cwd="/abs").cwd == "/abs"
    assert plan(cwd="~/agents").cwd == os.path.expanduser("~/agents")
    assert plan(cwd="{{PROFILE_DIR}}/..").cwd == "/profiles/.."


@pytest.mark.parametrize(
    ("turn", "reason"),
    [
        (
            Turn("hi", session_id="../../../../etc"),
            "the session id '../../../../etc' cannot be used in cwd: it contains '/'",
        ),
        (Turn("hi", session_id=".."), "the session id '..' cannot be used in cwd: it is '..'"),
        (Turn("hi", session_id="."), "the session id '.' cannot be used in cwd: it is '.'"),
        (Turn("hi", session_name="a/b"), "the session name 'a/b' cannot be used in cwd: it contains '/'"),
        (Turn("secret/../../text"), "the message cannot be used in cwd: it contains '/'"),
        (Turn(""), "the message cannot be used in cwd: it is empty"),
    ],
)
def test_a_value_from_the_user_cannot_move_the_agent_out_of_its_cwd(turn: Turn, reason: str) -> None:
    with pytest.raises(LaunchError) as caught:
        plan(turn, cwd="{{PROFILE_DIR}}/work/{{SESSION_NAME}}-{{SESSION_ID}}/{{MESSAGE}}")
    assert caught.value.exit_code == 126
    assert caught.value.message.startswith(reason)
    assert "single path component" in caught.value.message
    assert "secret" not in caught.value.message


def test_a_value_from_the_user_in_cwd_stays_one_directory_inside_it() -> None:
    assert plan(Turn("hi", session_id="s-1"), cwd="{{PROFILE_DIR}}/work/{{SESSION_ID}}").cwd == "/profiles/work/s-1"
    assert plan(Turn("hi"), cwd="work/s-{{SESSION_ID}}").cwd == "/profiles/work/s-"  # a new session: empty
    assert plan(Turn("hi", session_id="~root"), cwd="{{SESSION_ID}}").cwd == "/profiles/~root"
    assert plan(Turn("hi", session_id="..x"), cwd="{{SESSION_ID}}").cwd == "/profiles/..x"


@pytest.mark.parametrize("cwd", ["work/{{SESSION_ID}}", "work/{{SESSION_ID}}/x", "work/..{{SESSION_ID}}"])
def test_a_new_session_s_empty_id_cannot_make_cwd_the_directory_above(cwd: str) -> None:
    with pytest.raises(LaunchError) as caught:
        plan(Turn("hi"), cwd=cwd)
    assert caught.value.exit_code == 126
    assert caught.value.message.startswith("the session id cannot be used in cwd: it is empty (a new session has")
    assert plan(Turn("hi"), cwd="{{PROFILE_DIR}}/..").cwd == "/profiles/.."  # the author's own may


def test_stdin_payload() -> None:
    assert plan().stdin is None
    assert plan(Turn("héllo"), stdin="message").stdin == "héllo".encode()  # exactly the message
    assert plan(Turn("2^10"), stdin="line").stdin == b"2^10\n"  # a line, for programs that read lines
    assert plan(Turn("one\ntwo"), stdin="line").stdin == b"one\ntwo\n"
    assert plan(Turn(""), stdin="line").stdin == b"\n"


def test_attachments() -> None:
    image = Attachment("image", "https://x/cat.png")
    file = Attachment("file", "https://x/report.pdf?dl=1", name="Report")
    env = plan(Turn("hi", attachments=(image,))).env
    assert env["AGENT_IMAGE_URL"] == "https://x/cat.png" and "AGENT_FILE_URL" not in env
    assert json.loads(env["AGENT_ATTACHMENTS"]) == [{"type": "image", "url": "https://x/cat.png", "name": "cat.png"}]
    env = plan(Turn("hi", attachments=(file,))).env
    assert env["AGENT_FILE_URL"] == "https://x/report.pdf?dl=1" and "AGENT_IMAGE_URL" not in env
    env = plan(Turn("hi", attachments=(image, file))).env
    assert "AGENT_IMAGE_URL" not in env and "AGENT_FILE_URL" not in env
    assert [item["name"] for item in json.loads(env["AGENT_ATTACHMENTS"])] == ["cat.png", "Report"]
    env = plan(Turn("hi", attachments=(Attachment("audio", "https://x/a.ogg"),))).env
    assert "AGENT_IMAGE_URL" not in env and "AGENT_FILE_URL" not in env and "AGENT_ATTACHMENTS" in env
    assert "AGENT_ATTACHMENTS" not in plan().env


def test_attachment_parsing_and_validation() -> None:
    assert Attachment.parse("video=https://v/clip.mp4") == Attachment("video", "https://v/clip.mp4", "clip.mp4")
    assert Attachment.parse("https://x/a.png") == Attachment("image", "https://x/a.png")  # its type from its name
    for bad in ("", "image=", "sticker=https://x"):
        with pytest.raises(TurnError):
            Attachment.parse(bad)


def test_turn_refuses_what_no_process_can_receive() -> None:
    with pytest.raises(TurnError, match="NUL"):
        Turn("a\0b")
    for field in ("message", "session_id", "session_name", "from_user"):
        with pytest.raises(TurnError, match=f"^{field} contains a lone surrogate"):
            Turn(**{"message": "ok", field: "x\ud800y"})  # type: ignore[arg-type]
    with pytest.raises(TurnError, match="attachment url contains a lone surrogate"):
        Attachment("file", "https://h/\udc80")
    assert Turn("ж😀é", from_user="ann").message == "ж😀é"
    with pytest.raises(TurnError, match="session_id"):
        Turn("ok", session_id=3)  # type: ignore[arg-type]


LIMIT = MAX_ARG_STRLEN - len("AGENT_MESSAGE=") - 1


def test_message_at_the_variable_limit_is_passed_whole() -> None:
    assert plan(Turn("m" * LIMIT)).env["AGENT_MESSAGE"] == "m" * LIMIT


def test_over_long_message_is_a_clear_error_without_stdin() -> None:
    with pytest.raises(LaunchError) as caught:
        plan(Turn("m" * (LIMIT + 1)))
    assert caught.value.exit_code == 126
    assert "stdin: message" in caught.value.message


def test_over_long_message_with_stdin_line_truncates_the_variable_only_too() -> None:
    message = "é" * MAX_ARG_STRLEN
    result = plan(Turn(message), stdin="line")
    assert result.stdin == message.encode() + b"\n"
    assert len(result.env["AGENT_MESSAGE"].encode()) < MAX_ARG_STRLEN


def test_over_long_message_with_stdin_truncates_the_variable_only() -> None:
    message = "é" * LIMIT  # two bytes each
    result = plan(Turn(message), stdin="message")
    assert result.stdin == message.encode()
    variable = result.env["AGENT_MESSAGE"]
    assert message.startswith(variable) and len(("AGENT_MESSAGE=" + variable).encode()) < MAX_ARG_STRLEN
    assert len(variable.encode()) >= LIMIT - 1
    assert any("truncated" in note for note in result.notes)


def test_over_long_argument_is_a_clear_error() -> None:
    with pytest.raises(LaunchError, match="argument 1 .* over the OS limit"):
        plan(Turn("m" * MAX_ARG_STRLEN), args=["{{MESSAGE}}"], stdin="message")


def test_a_fetched_data_uri_too_long_for_the_environment_is_named_by_its_file() -> None:
    picture = Attachment(
        "image", "data:image/png;base64," + "A" * MAX_ARG_STRLEN, path="/w/.agent-bridge/attachments/t/a b.png"
    )
    env = plan(Turn("look", attachments=[picture])).env
    assert json.loads(env["AGENT_ATTACHMENTS"])[0]["url"] == "file:///w/.agent-bridge/attachments/t/a%20b.png"
    assert env["AGENT_IMAGE_URL"] == "file:///w/.agent-bridge/attachments/t/a%20b.png"
    small = Attachment("image", "data:image/png;base64,AAAA", path="/w/a.png")
    assert json.loads(plan(Turn("look", attachments=[small])).env["AGENT_ATTACHMENTS"])[0]["url"] == small.url


@pytest.mark.parametrize(
    ("turn", "fields", "says"),
    [
        (Turn("hi", attachments=[Attachment("file", "https://x/y", name="n" * MAX_ARG_STRLEN)]), {}, "fewer attach"),
        (Turn("hi", from_user="u" * MAX_ARG_STRLEN), {}, "the turn's from_user is too long"),
        (Turn("m" * (LIMIT + 100)), {"env": {"COPY": "{{MESSAGE}}"}, "stdin": "message"}, "stdin: message"),
    ],
)
def test_any_variable_over_the_os_limit_is_a_clear_error_saying_what_to_shorten(
    turn: Turn, fields: dict[str, object], says: str
) -> None:
    with pytest.raises(LaunchError, match="over the OS limit") as caught:
        plan(turn, **fields)
    assert says in caught.value.message


@pytest.mark.parametrize("env_inherit", ["minimal", "all"])
def test_a_change_to_os_environ_reaches_the_next_turn(monkeypatch: pytest.MonkeyPatch, env_inherit: str) -> None:
    """What was inherited from os.environ is reused while os.environ is unchanged; every change is seen."""
    profile = Profile.from_mapping({"command": "agent", "env_inherit": env_inherit}, profile_dir="/profiles")
    monkeypatch.setenv("LC_PAPER", "first")
    first = plan_launch(profile, Turn("hi"), os.environ).env
    first["LC_PAPER"] = "changed by the caller"
    assert plan_launch(profile, Turn("hi"), os.environ).env["LC_PAPER"] == "first"
    monkeypatch.setenv("LC_PAPER", "second")
    assert plan_launch(profile, Turn("hi"), os.environ).env["LC_PAPER"] == "second"
    monkeypatch.delenv("LC_PAPER")
    assert "LC_PAPER" not in plan_launch(profile, Turn("hi"), os.environ).env
    assert plan_launch(profile, Turn("hi"), {"LC_PAPER": "a mapping"}).env["LC_PAPER"] == "a mapping"
