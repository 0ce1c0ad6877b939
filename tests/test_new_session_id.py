"""`{{NEW_SESSION_ID}}`: the bridge names a new session for CLIs that take its id from their caller.

kimi (`--session <id>` creates the session it does not know) and agy
(`--conversation <id>`) never print the id of a session they start. A profile
puts `{{NEW_SESSION_ID}}` in `new_session_args`: a turn without a session id
gets a fresh UUID there, and that id is the turn's session id, so the next
turn resumes it through `resume_args` like any other.
"""

from __future__ import annotations

import shutil
import uuid

import pytest
import trio
from conftest import CLI_PROFILES, TURN_DEADLINE, write_profile
from fake_clis import install_fake_clis

import bridge
from bridge import Profile, ProfileError, SessionEvent, Turn, plan_launch

ECHO_ARGS = {
    "command": ["sh", "-c", 'echo "args: $*"', "sh"],
    "new_session_args": ["--session={{NEW_SESSION_ID}}"],
    "resume_args": ["--session={{SESSION_ID}}"],
}


def test_a_new_session_gets_a_fresh_uuid_in_its_arguments_and_a_resumed_one_its_own_id():
    profile = Profile.from_mapping(ECHO_ARGS)
    first, second = (plan_launch(profile, Turn("hi"), {}) for _ in range(2))
    assert first.argv[-1] == f"--session={first.new_session_id}"
    assert str(uuid.UUID(first.new_session_id, version=4)) == first.new_session_id
    assert second.new_session_id != first.new_session_id
    resumed = plan_launch(profile, Turn("hi", session_id="abc"), {})
    assert (resumed.argv[-1], resumed.new_session_id) == ("--session=abc", "")


def test_profiles_without_the_placeholder_name_no_session():
    assert plan_launch(Profile.from_mapping({"command": "agent"}), Turn("hi"), {}).new_session_id == ""


@pytest.mark.parametrize(
    "field, yaml_value",
    [
        ("args", "['--session={{NEW_SESSION_ID}}']"),
        ("resume_args", "['--session={{NEW_SESSION_ID}}']"),
        ("command", "'agent --session={{NEW_SESSION_ID}}'"),
        ("env", "{SESSION: '{{NEW_SESSION_ID}}'}"),
        ("cwd", "'work/{{NEW_SESSION_ID}}'"),
    ],
)
def test_it_may_stand_only_in_new_session_args(tmp_path, field, yaml_value):
    text = f"command: agent\n{field}: {yaml_value}\n" if field != "command" else f"command: {yaml_value}\n"
    path = write_profile(tmp_path, text)
    with pytest.raises(ProfileError) as caught:
        bridge.load_profile(path, cache=False)
    line = 1 if field == "command" else 2
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert "{{NEW_SESSION_ID}} may stand only in new_session_args" in str(caught.value)


async def test_the_made_up_id_is_the_turns_session_and_comes_back_on_the_next_turn():
    profile = Profile.from_mapping(ECHO_ARGS)
    seen: list[object] = []
    with trio.fail_after(TURN_DEADLINE):
        first = await bridge.run_turn(profile, Turn("hi"), on_event=seen.append)
        second = await bridge.run_turn(profile, Turn("again", session_id=first.session_id))
    assert seen[0] == SessionEvent(first.session_id)  # reported as the agent starts, before its output
    assert first.reply == f"args: --session={first.session_id}"
    assert second.reply == f"args: --session={first.session_id}"


async def test_an_id_the_agent_names_itself_wins_over_the_made_up_one(make_agent):
    profile = make_agent(
        "print('AGENT_SESSION:its-own')\nprint('ok')", new_session_args=["--session={{NEW_SESSION_ID}}"]
    )
    with trio.fail_after(TURN_DEADLINE):
        result = await bridge.run_turn(profile, Turn("hi"))
    assert result.session_id == "its-own"


async def test_a_host_stores_the_made_up_id_and_resumes_the_conversation_with_it(tmp_path, monkeypatch):
    install_fake_clis(tmp_path, monkeypatch)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    shutil.copy(CLI_PROFILES / "kimi-code.yaml", profiles / "kimi-code.yaml")
    with trio.fail_after(TURN_DEADLINE):
        async with bridge.open_host(profiles, state=tmp_path / "sessions.sqlite3") as host:
            first = await host.submit("kimi-code", "chat-1", Turn("hello"))
            second = await host.submit("kimi-code", "chat-1", Turn("and again"))
            other = await host.submit("kimi-code", "chat-2", Turn("someone else"))
    assert first.session_id and first.reply == "kimi turn 1: you said: hello"
    assert second.reply == "kimi turn 2: you said: and again\nlast time you said: hello"
    assert other.session_id not in ("", first.session_id) and other.reply == "kimi turn 1: you said: someone else"
