"""`agent-bridge run --conversation` and `agent-bridge sessions`: sessions kept between CLI runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROFILES, PYTHON, turn_result, write_agent, write_profile

from bridge import SessionStore
from bridge.cli import main

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
STREAM = str(PROFILES / "stream.yaml")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The user's environment, with the sample agents' state and the default store inside tmp_path."""
    environ = {name: value for name, value in os.environ.items() if not name.startswith("AGENT_")}
    return {**environ, "TMPDIR": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "xdg-state")}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT_BRIDGE, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env=env
    )


def session_of(stdout: str) -> str:
    """The session id the sample stream agent reports in its reply ("turn N of session ID")."""
    return next(line for line in stdout.splitlines() if " of session " in line).rsplit(" ", 1)[1]


def test_a_conversation_resumes_its_session_run_after_run(tmp_path: Path, env: dict[str, str]) -> None:
    state = str(tmp_path / "sessions.sqlite3")
    first = cli(env, "run", STREAM, "--conversation", "chat-1", "--state", state, "hello there")
    assert first.returncode == 0, first.stderr
    assert "turn 1 of session" in first.stdout
    session = session_of(first.stdout)

    second = cli(env, "run", STREAM, "hello again", "--conversation", "chat-1", "--state", state, "--json")
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout.splitlines()[-1])
    assert f"turn 2 of session {session}" in result["reply"]
    assert "last time you said: hello there" in result["reply"]
    with SessionStore(state) as store:
        assert store.get("stream", "chat-1") == session  # the profile's name: its file's stem
        [record] = store.list()
        assert (record.last_outcome, record.last_exit_code) == ("ok", 0)

    other = cli(env, "run", STREAM, "--conversation", "chat-2", "--state", state, "elsewhere")
    assert "turn 1 of session" in other.stdout and session_of(other.stdout) != session


def test_new_forgets_the_stored_session_first_and_the_new_one_is_kept(tmp_path: Path, env: dict[str, str]) -> None:
    state = str(tmp_path / "sessions.sqlite3")
    old = session_of(cli(env, "run", STREAM, "--conversation", "c", "--state", state, "one").stdout)
    fresh = cli(env, "run", STREAM, "--conversation", "c", "--state", state, "--new", "two")
    assert fresh.returncode == 0, fresh.stderr
    assert "turn 1 of session" in fresh.stdout
    new = session_of(fresh.stdout)
    assert new != old
    with SessionStore(state) as store:
        assert store.get("stream", "c") == new


def test_an_explicit_session_id_wins_over_the_stored_one(tmp_path: Path, env: dict[str, str]) -> None:
    state = tmp_path / "sessions.sqlite3"
    with SessionStore(state) as store:
        store.record("stream", "c", "default", _result("stored-id"))
    done = cli(env, "run", STREAM, "--conversation", "c", "--state", str(state), "--session-id", "given-id", "hi")
    assert "of session given-id" in done.stdout
    with SessionStore(state) as store:
        assert store.get("stream", "c") == "given-id"


def test_a_turn_without_a_session_line_keeps_the_stored_id(tmp_path: Path, env: dict[str, str]) -> None:
    agent = write_agent(
        tmp_path,
        "agent.sh",
        """\
        #!/bin/sh
        echo "resumed: [$AGENT_SESSION_ID]"
        [ -n "$NEW_SESSION" ] && echo "AGENT_SESSION:$NEW_SESSION"
        exit "${EXIT_CODE:-0}"
    """,
    )
    profile = write_profile(
        tmp_path,
        f"""\
        name: quiet
        command: {agent}
        env: {{NEW_SESSION: "${{NEW_SESSION}}", EXIT_CODE: "${{EXIT_CODE}}"}}
    """,
    )
    state = str(tmp_path / "sessions.sqlite3")
    first = cli({**env, "NEW_SESSION": "sess-1"}, "run", str(profile), "--conversation", "k", "--state", state, "a")
    assert first.stdout == "resumed: []\n", first.stderr
    failed = cli({**env, "EXIT_CODE": "3"}, "run", str(profile), "--conversation", "k", "--state", state, "b")
    assert failed.returncode == 3
    third = cli(env, "run", str(profile), "--conversation", "k", "--state", state, "c")
    assert third.stdout == "resumed: [sess-1]\n"
    with SessionStore(state) as store:
        [record] = store.list()
    assert (record.profile, record.session_id, record.last_outcome) == ("quiet", "sess-1", "ok")


def test_a_broken_store_stops_the_run_before_the_agent_starts(tmp_path: Path, env: dict[str, str]) -> None:
    marker = tmp_path / "ran"
    agent = write_agent(tmp_path, "agent.sh", f"#!/bin/sh\ntouch {marker}\necho ran\n")
    profile = write_profile(tmp_path, f"command: {agent}\n")
    state = tmp_path / "sessions.sqlite3"
    state.write_bytes(b"garbage" * 1000)
    done = cli(env, "run", str(profile), "--conversation", "k", "--state", str(state), "hi")
    assert done.returncode == 2
    assert str(state) in done.stderr and "move it aside" in done.stderr
    assert not marker.exists() and done.stdout == ""


def test_new_without_a_conversation_is_a_usage_error(env: dict[str, str]) -> None:
    done = cli(env, "run", str(PROFILES / "echo.yaml"), "--new", "hi")
    assert done.returncode == 2 and "--new needs --conversation" in done.stderr


def test_the_default_store_is_under_xdg_state_home(tmp_path: Path, env: dict[str, str]) -> None:
    done = cli(env, "run", str(PROFILES / "echo.yaml"), "--conversation", "k", "hi")
    assert done.returncode == 0, done.stderr
    with SessionStore(tmp_path / "xdg-state" / "agent-bridge" / "sessions.sqlite3") as store:
        assert [record.profile for record in store.list()] == ["echo"]


def test_run_without_a_conversation_does_not_load_the_store() -> None:
    code = (
        "import sys; from bridge.cli import main; code = main(['run', sys.argv[1], 'hi']); "
        "print('sqlite3' in sys.modules, code)"
    )
    done = subprocess.run([PYTHON, "-c", code, str(PROFILES / "echo.yaml")], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "False 0", done.stderr


# --------------------------------------------------------------------------- sessions list / show / forget
# In-process (no agent runs): main() is the whole command.


@pytest.fixture
def filled(tmp_path: Path) -> str:
    state = str(tmp_path / "sessions.sqlite3")
    with SessionStore(state) as store:
        store.record("stream", "chat-1", "default", _result("s-default"))
        store.record("stream", "chat-1", "work", _result("s-work"))
        store.record("echo", "chat-1", "default", _result("", exit_code=124, outcome="timeout"))
        store.record("stream", "chat-2", "default", _result("s-two"))
    return state


def test_sessions_list_shows_every_stored_session_latest_first(filled: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sessions", "list", "--state", filled]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "PROFILE",
        "CONVERSATION",
        "SESSION",
        "NAME",
        "SESSION",
        "ID",
        "LAST",
        "USED",
        "(UTC)",
        "LAST",
        "OUTCOME",
    ]
    assert [line.split()[:4] for line in lines[1:]] == [
        ["stream", "chat-2", "default", "s-two"],
        ["echo", "chat-1", "default", "-"],
        ["stream", "chat-1", "work", "s-work"],
        ["stream", "chat-1", "default", "s-default"],
    ]
    assert lines[2].endswith("timeout (exit 124)")


def test_sessions_list_filters_by_profile_and_speaks_json(filled: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sessions", "list", "--state", filled, "--profile", "stream", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["conversation"], r["session_name"], r["session_id"]) for r in records] == [
        ("chat-2", "default", "s-two"),
        ("chat-1", "work", "s-work"),
        ("chat-1", "default", "s-default"),
    ]
    assert set(records[0]) == {
        "profile",
        "conversation",
        "session_name",
        "session_id",
        "last_used",
        "last_outcome",
        "last_exit_code",
    }


def test_sessions_list_of_an_empty_store_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "s.sqlite3"
    SessionStore(state).close()
    assert main(["sessions", "list", "--state", str(state)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and f"no stored sessions in {state}" in captured.err


def test_reading_a_store_that_does_not_exist_says_so_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    given = tmp_path / "new" / "new.sqlite3"
    default = tmp_path / "state" / "agent-bridge" / "sessions.sqlite3"
    for state, where in ((["--state", str(given)], given), ([], default)):
        assert main(["sessions", "list", *state]) == 0
        assert (
            capsys.readouterr().err == f"no stored sessions: there is no session store at {where} yet "
            "(`run --conversation KEY` makes one)\n"
        )
        assert main(["sessions", "list", "--json", *state]) == 0
        assert capsys.readouterr() == ("", "")
        assert main(["sessions", "show", "stream", "dev", *state]) == 1
        assert f"no stored conversation 'dev': there is no session store at {where}" in capsys.readouterr().err
        assert main(["sessions", "forget", "stream", "dev", *state]) == 0
        assert capsys.readouterr().out.startswith(f"nothing to forget: there is no session store at {where}")
    assert sorted(path.name for path in tmp_path.iterdir()) == [], "no file, no directory"


def test_sessions_show_one_conversation(filled: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sessions", "show", "stream", "chat-1", "--state", filled]) == 0
    out = capsys.readouterr().out
    assert "session id:    s-default" in out and "session id:    s-work" in out
    assert main(["sessions", "show", "stream", "chat-1", "--session-name", "work", "--state", filled, "--json"]) == 0
    [record] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert record["session_id"] == "s-work"
    # a profile file stands for its name
    assert main(["sessions", "show", str(PROFILES / "stream.yaml"), "chat-2", "--state", filled]) == 0
    assert "s-two" in capsys.readouterr().out
    assert main(["sessions", "show", "stream", "nope", "--state", filled]) == 1
    assert "no stored conversation 'nope'" in capsys.readouterr().err


def test_sessions_forget_resets_a_conversation(filled: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sessions", "forget", "stream", "chat-1", "--session-name", "work", "--state", filled]) == 0
    assert "forgot" in capsys.readouterr().out
    with SessionStore(filled) as store:
        assert store.get("stream", "chat-1", "work") == "" and store.get("stream", "chat-1") == "s-default"
    assert main(["sessions", "forget", "stream", "chat-1", "--state", filled]) == 0
    capsys.readouterr()
    assert main(["sessions", "forget", "stream", "chat-1", "--state", filled]) == 0
    assert capsys.readouterr().out == "nothing to forget: no stored sessions for conversation 'chat-1' of stream\n"
    assert main(["sessions", "forget", "stream", "chat-1", "--session-name", "work", "--state", filled]) == 0
    assert capsys.readouterr().out == (
        "nothing to forget: no stored session 'work' for conversation 'chat-1' of stream\n"
    )
    with SessionStore(filled) as store:
        assert [(r.profile, r.conversation) for r in store.list()] == [("stream", "chat-2"), ("echo", "chat-1")]


def test_sessions_on_a_corrupt_store_exit_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "s.sqlite3"
    state.write_bytes(b"\0garbage" * 1000)
    assert main(["sessions", "list", "--state", str(state)]) == 2
    assert str(state) in capsys.readouterr().err


def _result(session_id: str, exit_code: int = 0, outcome: str = "ok"):  # type: ignore[no-untyped-def]
    from bridge import Outcome

    return turn_result(session_id, exit_code, Outcome(outcome))
