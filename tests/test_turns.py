"""End-to-end turns through the Python API (docs/protocol.md §1–§5, §8) with real agent processes.

Agents are small scripts written to a temp dir by the `make_agent` fixtures
(conftest.py). Time bounds are generous: the machine running them may be loaded.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from attachment_files import TURN_FILES
from conftest import (
    PYTHON,
    RESULT_FIELDS,
    assert_no_live_process,
    process_state,
    read_pids,
    run,
    run_collecting,
    write_agent,
    write_profile,
)

import bridge
import bridge.confinement.spawner
import bridge.engine.driver
import bridge.engine.one_process
from bridge import ErrorEvent, PartialEvent, SessionEvent, Turn, TurnResult
from bridge.confinement.cgroups import CONTAINMENT, SPAWN_LOCK, Containment
from bridge.confinement.keeper import KEEPER

SUFFIX = "\n\n…(truncated)"

ENV_DUMP = "import json, os; print(json.dumps(dict(os.environ)))"

# Prints a partial, then waits (no timer) until the host has acknowledged it
# through the FIFO named by argv[1]. If the bridge held partials back until the
# agent exits, this agent would never get its acknowledgement.
LIVE_PARTIALS = """
import json, os, sys
fifo = os.open(sys.argv[1], os.O_RDWR)  # read+write: reads block until the host writes
for word in ("one", "two", "three"):
    print("AGENT_PARTIAL:" + json.dumps(word), flush=True)
    os.read(fifo, 1)
print("all acknowledged")
"""

# Interrupted by the host: records that SIGINT arrived (the test's proof), then leaves.
WAITS_FOR_SIGINT = """
import os, signal, subprocess, sys, time
def on_sigint(signum, frame):
    with open(os.environ["MARKER"], "w") as out:
        out.write("SIGINT")
    print("a body written while being interrupted", flush=True)
    sys.exit(0)
signal.signal(signal.SIGINT, on_sigint)
child = subprocess.Popen(["sleep", "600"])
record_pid(child.pid)
print('AGENT_PARTIAL:"ready"', flush=True)
while True:
    time.sleep(3600)
"""

HANGS = """
import time
print('AGENT_PARTIAL:"started"', flush=True)
print("body that a failed turn discards", flush=True)
while True:
    time.sleep(3600)
"""


def acknowledge(fifo: Path) -> None:
    """Wake an agent blocked in LIVE_PARTIALS; fails at once (ENXIO) if it is gone."""
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, b"k")
    finally:
        os.close(fd)


async def agent_env(make_agent: Any, message: str = "hello", **fields: Any) -> dict[str, str]:
    turn = fields.pop("turn", {})
    result = await run(make_agent(ENV_DUMP, max_reply_chars=None, **fields), message, **turn)
    assert result.outcome == "ok", result
    return json.loads(result.reply)


# --------------------------------------------------------------------------- replies and events


async def test_echo_reply_is_the_body_and_the_result_has_every_field(make_agent):
    profile = make_agent("""
        import os
        print("echo: " + os.environ["AGENT_MESSAGE"])
    """)
    result = await run(profile, "hi there")
    assert result.reply == "echo: hi there"
    assert result.ok and result.exit_code == 0 and result.outcome == bridge.Outcome.OK
    assert (result.session_id, result.error, result.error_reply, result.stderr_tail) == ("", "", "", "")
    assert (result.timed_out, result.truncated, result.partials) == (False, False, 0)
    assert result.duration_ms >= 0
    assert set(result.to_dict()) == RESULT_FIELDS
    assert result.to_dict()["outcome"] == "ok"


async def test_body_lines_are_joined_verbatim_and_only_exact_prefixes_are_protocol(make_agent):
    profile = make_agent(r"""
        import sys
        sys.stdout.buffer.write(
            b"first\r\n"
            b"  indented stays\n"
            b" AGENT_PARTIAL:not at column 0\n"
            b"agent_partial:lower case\n"
            b"AGENT_PARTIALS are body too\n"
            b"AGENT_OTHER:body\n"
            b"\n"
            b"last line without newline"
        )
    """)
    result, events = await run_collecting(profile)
    assert result.reply == (
        "first\n  indented stays\n AGENT_PARTIAL:not at column 0\nagent_partial:lower case\n"
        "AGENT_PARTIALS are body too\nAGENT_OTHER:body\n\nlast line without newline"
    )
    assert events == [result]


async def test_partials_reach_the_host_live_and_in_order(make_agent, tmp_path):
    fifo = tmp_path / "ack"
    os.mkfifo(fifo)
    profile = make_agent(LIVE_PARTIALS, args=[str(fifo)], timeout_secs=10)
    seen: list[str] = []

    def on_partial(text: str) -> None:
        seen.append(text)
        acknowledge(fifo)

    result = await bridge.run_turn(profile, Turn("go"), on_partial=on_partial)
    assert result.outcome == "ok", result
    assert seen == ["one", "two", "three"]
    assert result.partials == 3
    assert result.reply == "all acknowledged"


async def test_async_callbacks_see_partials_and_every_event_then_the_result(make_agent):
    profile = make_agent(r"""
        print('AGENT_PARTIAL:"json \\"quoted\\"\\nnewline"')
        print("AGENT_PARTIAL:   raw text stays raw   ")
        print("AGENT_PARTIAL:")
        print("AGENT_PARTIAL:42")
        print('AGENT_PARTIAL:{"not": "a string"}')
        print("AGENT_SESSION:s-1")
        print("body")
    """)
    partials: list[str] = []
    events: list[Any] = []

    async def on_partial(text: str) -> None:
        await trio.lowlevel.checkpoint()
        partials.append(text)

    async def on_event(event: Any) -> None:
        events.append(event)

    result = await bridge.run_turn(profile, Turn("x"), on_partial=on_partial, on_event=on_event)
    expected = ['json "quoted"\nnewline', "raw text stays raw", "", "42", '{"not": "a string"}']
    assert partials == expected
    assert events == [*(PartialEvent(text) for text in expected), SessionEvent("s-1"), result]
    assert result.partials == 5 and result.reply == "body"


async def test_open_turn_yields_events_in_order_and_the_result_last(make_agent):
    profile = make_agent("""
        print("AGENT_SESSION:abc")
        print('AGENT_PARTIAL:"a"')
        print('AGENT_PARTIAL:"b"')
        print("the reply")
    """)
    async with bridge.open_turn(profile, Turn("hi")) as events:
        received = [event async for event in events]
    assert received[:-1] == [SessionEvent("abc"), PartialEvent("a"), PartialEvent("b")]
    result = received[-1]
    assert isinstance(result, TurnResult) and result is events.result
    assert result.reply == "the reply" and result.session_id == "abc" and result.partials == 2


async def test_open_turn_is_live(make_agent, tmp_path):
    fifo = tmp_path / "ack"
    os.mkfifo(fifo)
    profile = make_agent(LIVE_PARTIALS, args=[str(fifo)], timeout_secs=10)
    texts = []
    async with bridge.open_turn(profile, Turn("go")) as events:
        async for event in events:
            if isinstance(event, PartialEvent):
                texts.append(event.text)
                acknowledge(fifo)
    assert texts == ["one", "two", "three"]
    assert events.result.outcome == "ok"


def test_run_turn_sync_works_without_trio(make_agent):
    profile = make_agent("""
        print('AGENT_PARTIAL:"p"')
        print("AGENT_SESSION:sync-session")
        print("sync reply")
    """)
    partials: list[str] = []
    events: list[Any] = []
    result = bridge.run_turn_sync(profile, Turn("x"), on_partial=partials.append, on_event=events.append)
    assert (result.reply, result.session_id, partials) == ("sync reply", "sync-session", ["p"])
    assert events[-1] is result


def test_under_asyncio_run_turn_and_open_turn_say_how_to_call_them(make_agent):
    """The API runs on trio; an asyncio program (most bot frameworks are) is told what to call instead."""
    profile = make_agent("""
        print("never run")
    """)

    async def awaited() -> None:
        await bridge.run_turn(profile, Turn("x"))

    async def streamed() -> None:
        async with bridge.open_turn(profile, Turn("x")):
            pass

    for call in (awaited, streamed):
        with pytest.raises(bridge.ProtocolMisuse, match=r"runs under trio.*asyncio\.to_thread\(bridge\.run_turn_sync"):
            asyncio.run(call())


async def test_concurrent_turns_do_not_mix(make_agent):
    profile = make_agent("""
        import os
        print('AGENT_PARTIAL:' + os.environ["AGENT_MESSAGE"])
        print("AGENT_SESSION:s" + os.environ["AGENT_MESSAGE"])
        print("reply " + os.environ["AGENT_MESSAGE"])
    """)
    results: dict[str, tuple[TurnResult, list[str]]] = {}

    async def one(message: str) -> None:
        partials: list[str] = []
        results[message] = (await bridge.run_turn(profile, Turn(message), on_partial=partials.append), partials)

    async with trio.open_nursery() as nursery:
        for n in range(6):
            nursery.start_soon(one, str(n))
    for message, (result, partials) in results.items():
        assert (result.reply, result.session_id, partials) == (f"reply {message}", f"s{message}", [message])


# --------------------------------------------------------------------------- sessions


async def test_session_last_valid_id_wins_and_invalid_ones_are_ignored(make_agent):
    profile = make_agent("""
        print("AGENT_SESSION:first")
        print("AGENT_SESSION:   second   ")
        print("AGENT_SESSION:has space")
        print("AGENT_SESSION:")
        print("AGENT_SESSION:tab\\there")
        print("AGENT_SESSION:" + "x" * 513)
        print("agent_session:lowercase-is-body")
        print("body")
    """)
    result, events = await run_collecting(profile)
    assert result.session_id == "second"
    assert [event for event in events if isinstance(event, SessionEvent)] == [
        SessionEvent("first"),
        SessionEvent("second"),
    ]
    assert result.reply == "agent_session:lowercase-is-body\nbody"


async def test_session_id_of_512_characters_is_valid(make_agent):
    result = await run(make_agent('print("AGENT_SESSION:" + "s" * 512)'))
    assert result.session_id == "s" * 512


async def test_no_session_line_gives_an_empty_session_id_and_the_agent_gets_the_one_to_resume(make_agent):
    env = await agent_env(make_agent, turn={"session_id": "resume-me", "session_name": "work"})
    assert (env["AGENT_SESSION_ID"], env["AGENT_SESSION_NAME"]) == ("resume-me", "work")
    result = await run(make_agent('print("no session")'), session_id="resume-me")
    assert result.session_id == ""


async def test_custom_session_line_prefix(make_agent):
    profile = make_agent(
        """
        print("AGENT_SESSION:default-prefix-is-body-now")
        print("session_id = claude-123")
    """,
        session_line_prefix="session_id =",
    )
    result = await run(profile)
    assert result.session_id == "claude-123"
    assert result.reply == "AGENT_SESSION:default-prefix-is-body-now"


# --------------------------------------------------------------------------- AGENT_ERROR


async def test_agent_error_with_exit_0_fails_with_1_and_discards_the_body(make_agent):
    profile = make_agent("""
        print('AGENT_PARTIAL:"before"')
        print("body line")
        print('AGENT_ERROR:"first error"')
        print('AGENT_PARTIAL:"after the error"')
        print("AGENT_SESSION:kept")
        print("AGENT_ERROR:  the last error wins  ")
        print("more body")
    """)
    result, events = await run_collecting(profile)
    assert (result.exit_code, result.outcome) == (1, "agent_error")
    assert result.reply == ""
    assert result.error == result.error_reply == "the last error wins"
    assert result.session_id == "kept"
    assert result.partials == 1
    assert events[:-1] == [
        PartialEvent("before"),
        ErrorEvent("first error"),
        SessionEvent("kept"),
        ErrorEvent("the last error wins"),
    ]


async def test_agent_error_keeps_a_nonzero_exit_code(make_agent):
    result = await run(
        make_agent("""
        import sys
        print('AGENT_ERROR:"quota exceeded"')
        sys.exit(7)
    """)
    )
    assert (result.exit_code, result.outcome, result.error_reply) == (7, "agent_error", "quota exceeded")


async def test_empty_agent_error_still_fails_with_a_generic_text(make_agent):
    result = await run(make_agent('print("AGENT_ERROR:")\nprint("body")'))
    assert (result.exit_code, result.outcome, result.error, result.reply) == (1, "agent_error", "", "")
    assert "error" in result.error_reply


async def test_agent_error_then_killed_by_a_signal_keeps_the_signal_code(make_agent):
    result = await run(
        make_agent("""
        import os, signal
        print('AGENT_ERROR:"dying"', flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    )
    assert (result.exit_code, result.outcome, result.error_reply) == (137, "agent_error", "dying")


# --------------------------------------------------------------------------- streaming, caps, error replies


async def test_streaming_false_ignores_partials_and_tells_the_agent(make_agent):
    profile = make_agent(
        """
        import os
        print('AGENT_PARTIAL:"ignored"')
        print("streaming=" + os.environ["AGENT_STREAMING"])
    """,
        streaming=False,
    )
    result, events = await run_collecting(profile)
    assert result.reply == "streaming=0"
    assert result.partials == 0 and events == [result]
    assert (await agent_env(make_agent))["AGENT_STREAMING"] == "1"


async def test_reply_body_is_capped_with_the_suffix(make_agent):
    profile = make_agent('print("0123456789ABCDEF")', max_reply_chars=10)
    result = await run(profile)
    assert result.reply == "0123456789" + SUFFIX and result.truncated


async def test_cap_counts_the_newlines_between_body_lines_and_a_custom_suffix(make_agent):
    profile = make_agent('print("abcd")\nprint("efgh")\nprint("ijkl")', max_reply_chars=7, truncation_suffix="[cut]")
    assert (await run(profile)).reply == "abcd\nef[cut]"


async def test_a_body_exactly_at_the_cap_is_not_truncated(make_agent):
    result = await run(make_agent('print("0123456789")', max_reply_chars=10))
    assert (result.reply, result.truncated) == ("0123456789", False)


async def test_default_cap_is_8000_and_null_lifts_it(make_agent):
    source = 'print("y" * 20000)'
    capped = await run(make_agent(source))
    assert capped.reply == "y" * 8000 + SUFFIX and capped.truncated
    uncapped = await run(make_agent(source, max_reply_chars=None))
    assert uncapped.reply == "y" * 20000 and not uncapped.truncated


async def test_cumulative_partials_are_capped_once_with_the_suffix(make_agent):
    profile = make_agent(
        """
        for chunk in ("abcd", "efgh", "ijkl", "mnop"):
            print(f'AGENT_PARTIAL:"{chunk}"')
        print("ok")
    """,
        max_reply_chars=10,
        truncation_suffix="…",
    )
    partials: list[str] = []
    result = await bridge.run_turn(profile, Turn("x"), on_partial=partials.append)
    assert partials == ["abcd", "efgh", "ij…"]
    assert result.partials == 3 and result.truncated
    assert result.reply == "ok"


async def test_stderr_tail_is_reported_and_only_appended_to_replies_when_asked(make_agent):
    source = """
        import sys
        print("the reply")
        print("diagnostic on stderr", file=sys.stderr)
        sys.exit(int(sys.argv[1]))
    """
    plain = await run(make_agent(source, args=["0"]))
    assert plain.reply == "the reply" and "diagnostic on stderr" in plain.stderr_tail

    ok = await run(make_agent(source, args=["0"], include_stderr_in_reply=True))
    assert ok.reply.startswith("the reply") and "diagnostic on stderr" in ok.reply

    failed = await run(make_agent(source, args=["3"], include_stderr_in_reply=True))
    assert failed.reply == ""
    assert "exited with code 3" in failed.error_reply and "diagnostic on stderr" in failed.error_reply


async def test_send_error_reply_false_keeps_the_error_but_sends_no_text(make_agent):
    result = await run(make_agent('print("AGENT_ERROR:nope")', send_error_reply=False))
    assert (result.outcome, result.error, result.error_reply) == ("agent_error", "nope", "")
    spawn = await run(make_agent("x", command=["/nonexistent/agent"], send_error_reply=False))
    assert (spawn.exit_code, spawn.error_reply) == (127, "")


# --------------------------------------------------------------------------- environment


async def test_minimal_environment_does_not_leak_host_secrets(make_agent, monkeypatch):
    monkeypatch.setenv("BRIDGE_HOST_SECRET", "s3cr3t")
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("AGENT_SESSION_ID", "stale-from-host")
    env = await agent_env(make_agent)
    assert "BRIDGE_HOST_SECRET" not in env and "s3cr3t" not in json.dumps(env)
    assert (env["PATH"], env["LC_TIME"], env["TZ"]) == (os.environ["PATH"], "C", "UTC")
    infra = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "TMPDIR", "TZ"}
    unexpected = {name for name in env if name not in infra and not name.startswith(("LC_", "AGENT_"))}
    assert not unexpected, unexpected
    assert env["AGENT_SESSION_ID"] == ""


async def test_minimal_environment_is_exactly_the_infra_set_in_a_real_agent(make_agent, monkeypatch):
    lookalikes = {
        "HOSTNAME": "box",
        "SECRET": "s3cr3t",
        "LD_PRELOAD": "/nonexistent/preload.so",
        "LESS": "-R",
        "LANGUAGE": "en",
        "LCX": "x",
        "PATHEXT": ".X",
        "USERNAME": "u",
        "TZDIR": "/z",
        "AGENT": "x",
    }
    for name, value in lookalikes.items():
        monkeypatch.setenv(name, value)
    env = await agent_env(make_agent, env={"EXTRA": "from the profile"})
    infra = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "TMPDIR", "TZ"}
    expected = {name for name in os.environ if name in infra or name.startswith("LC_")}
    agent = {
        "AGENT_MESSAGE",
        "AGENT_SESSION_ID",
        "AGENT_SESSION_NAME",
        "AGENT_FROM_USER",
        "AGENT_STREAMING",
        "AGENT_PROTOCOL_VERSION",
        "AGENT_OUTBOX",
    }
    # LC_CTYPE may be set by the interpreter itself (PEP 538 coerces the C locale).
    assert set(env) - {"LC_CTYPE"} == (expected | agent | {"EXTRA"}) - {"LC_CTYPE"}


async def test_env_inherit_all_passes_the_host_environment_but_not_stale_agent_variables(make_agent, monkeypatch):
    monkeypatch.setenv("BRIDGE_HOST_SECRET", "s3cr3t")
    monkeypatch.setenv("AGENT_MESSAGE", "stale")
    env = await agent_env(make_agent, "fresh", env_inherit="all")
    assert env["BRIDGE_HOST_SECRET"] == "s3cr3t"
    assert env["AGENT_MESSAGE"] == "fresh"


async def test_env_values_expand_host_variables_and_unknown_ones_are_empty(make_agent, monkeypatch):
    monkeypatch.setenv("API_TOKEN", "tok-123")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    env = await agent_env(
        make_agent,
        "msg ${API_TOKEN}",
        env={
            "TOKEN": "Bearer ${API_TOKEN}",
            "MISSING": "a${NOT_SET_ANYWHERE}b",
            "LITERAL": "$API_TOKEN and {{MESSAGE}}",
        },
    )
    assert env["TOKEN"] == "Bearer tok-123"
    assert env["MISSING"] == "ab"
    assert env["LITERAL"] == "$API_TOKEN and msg ${API_TOKEN}"  # the message's ${…} stays inert


async def test_env_allowlist_limits_expansion(make_agent, monkeypatch):
    monkeypatch.setenv("ALLOWED", "yes")
    monkeypatch.setenv("FORBIDDEN", "secret")
    env = await agent_env(make_agent, env={"A": "${ALLOWED}", "F": "<${FORBIDDEN}>"}, env_allowlist=["ALLOWED"])
    assert (env["A"], env["F"]) == ("yes", "<>")


async def test_agent_variables_are_set_and_win_over_profile_env(make_agent):
    env = await agent_env(
        make_agent,
        "the message",
        env={"AGENT_MESSAGE": "forged", "AGENT_PROTOCOL_VERSION": "9", "AGENT_STREAMING": "1", "OWN": "kept"},
        streaming=False,
        turn={"from_user": "alice"},
    )
    assert env["AGENT_MESSAGE"] == "the message"
    assert env["AGENT_SESSION_ID"] == ""
    assert env["AGENT_SESSION_NAME"] == "default"
    assert env["AGENT_FROM_USER"] == "alice"
    assert env["AGENT_STREAMING"] == "0"
    assert env["AGENT_PROTOCOL_VERSION"] == "0.1"
    assert env["OWN"] == "kept"
    assert not {"AGENT_ATTACHMENTS", "AGENT_IMAGE_URL", "AGENT_FILE_URL"} & set(env)


@pytest.mark.parametrize(
    ("attachments", "image", "file"),
    [
        ([("image", "cat.png")], "cat.png", None),
        ([("file", "report.pdf")], None, "report.pdf"),
        ([("audio", "v.ogg")], None, None),
        ([("image", "1.png"), ("image", "2.png")], None, None),
    ],
)
async def test_attachment_variables(make_agent, tmp_path, attachments, image, file):
    for _, name in attachments:
        (tmp_path / name).write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(8))
    turn_attachments = tuple(bridge.Attachment(kind, str(tmp_path / name)) for kind, name in attachments)
    env = await agent_env(make_agent, turn={"attachments": turn_attachments})
    entries = json.loads(env["AGENT_ATTACHMENTS"])
    assert [(item["type"], item["url"], item["name"]) for item in entries] == [
        (kind, str(tmp_path / name), name) for kind, name in attachments
    ]
    assert all(re.search(rf"{TURN_FILES}/{re.escape(item['name'])}$", item["path"]) for item in entries)
    assert all(item["size"] == 16 for item in entries)
    for kind, expected in (("IMAGE", image), ("FILE", file)):
        assert env.get(f"AGENT_{kind}_URL") == (str(tmp_path / expected) if expected else None)
        path = env.get(f"AGENT_{kind}_PATH") or ""
        assert re.search(rf"{TURN_FILES}/{re.escape(expected)}$", path) if expected else path == ""
        assert (f"AGENT_{kind}_PATH" in env) == bool(expected)


# --------------------------------------------------------------------------- argv, cwd, {{PROFILE_DIR}}


async def test_a_hostile_message_stays_one_inert_argv_token(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_agent(tmp_path, "argv agent", f"#!{PYTHON}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    profile = bridge.load_profile(
        write_profile(
            tmp_path,
            """
        command: '"{{PROFILE_DIR}}/argv agent" ''two words'' --msg={{MESSAGE}} {{SESSION_ID}}'
        args: ["{{MESSAGE}}", "--name={{SESSION_NAME}}"]
        max_reply_chars: null
    """,
        )
    )
    message = (
        """it's "quoted" $(touch pwned) `touch pwned2`; rm -rf nothing && echo {{SESSION_ID}} ${HOME} * \\ \n2nd"""
    )
    result = await run(profile, message, session_id="sid-{{MESSAGE}}", session_name="n;ame")
    assert result.outcome == "ok", result
    assert json.loads(result.reply) == ["two words", "--msg=" + message, "sid-{{MESSAGE}}", message, "--name=n;ame"]
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


async def test_cwd_is_relative_to_the_profile_and_profile_dir_is_substituted(tmp_path, monkeypatch):
    profiles, agents, work, elsewhere = (tmp_path / name for name in ("profiles", "agents", "work", "elsewhere"))
    for directory in (profiles, agents, work, elsewhere):
        directory.mkdir()
    write_agent(
        agents,
        "where.py",
        f"""#!{PYTHON}
import json, os, sys
print(json.dumps({{"cwd": os.getcwd(), "argv": sys.argv[1:], "dir": os.environ["DIR"]}}))
""",
    )
    profile = bridge.load_profile(
        write_profile(
            profiles,
            """
        command: ["{{PROFILE_DIR}}/../agents/where.py"]
        args: ["{{PROFILE_DIR}}"]
        env: {DIR: "{{PROFILE_DIR}}/x"}
        cwd: ../work
    """,
        )
    )
    monkeypatch.chdir(elsewhere)
    seen = json.loads((await run(profile)).reply)
    assert Path(seen["cwd"]) == work.resolve()
    assert seen["argv"] == [str(profiles.resolve())]
    assert seen["dir"] == f"{profiles.resolve()}/x"


async def test_cwd_may_use_the_session_name(make_agent, tmp_path):
    (tmp_path / "sessions" / "work").mkdir(parents=True)
    profile = make_agent("import os; print(os.getcwd())", cwd="sessions/{{SESSION_NAME}}")
    assert Path((await run(profile, session_name="work")).reply) == (tmp_path / "sessions/work").resolve()


async def test_cwd_expands_home_and_defaults_to_the_bridges_cwd(make_agent, tmp_path, monkeypatch):
    (tmp_path / "home" / "agent-work").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    source = "import os; print(os.getcwd())"
    assert Path((await run(make_agent(source, cwd="~/agent-work"))).reply) == (tmp_path / "home/agent-work").resolve()
    monkeypatch.chdir(tmp_path / "home")
    assert Path((await run(make_agent(source))).reply) == (tmp_path / "home").resolve()


# --------------------------------------------------------------------------- stdin and long messages


async def test_stdin_none_is_at_eof_at_once(make_agent):
    profile = make_agent(
        """
        import os, sys
        data = sys.stdin.buffer.read()
        print(repr(data), os.isatty(0))
    """,
        timeout_secs=10,
    )
    result = await run(profile)
    assert (result.outcome, result.reply) == ("ok", "b'' False")


async def test_stdin_message_delivers_the_exact_message_then_eof(make_agent):
    profile = make_agent(
        """
        import json, os, sys
        data = sys.stdin.buffer.read().decode()
        print(json.dumps([data, os.environ["AGENT_MESSAGE"]]))
    """,
        stdin="message",
        timeout_secs=10,
    )
    message = "héllo ✓\nsecond line\n"
    assert json.loads((await run(profile, message)).reply) == [message, message]


async def test_stdin_line_lets_a_program_that_reads_lines_answer_without_a_shell_wrapper(make_agent):
    """`read` (like bc or a REPL) ignores a last line without its newline: `stdin: message` gets nothing back."""
    reads_a_line = ["sh", "-c", 'read -r line && printf "got [%s]\\n" "$line"']
    as_message = await run(bridge.Profile(command=reads_a_line, stdin="message"), "2^10 + 1/3")
    as_line = await run(bridge.Profile(command=reads_a_line, stdin="line"), "2^10 + 1/3")
    assert (as_message.exit_code, as_message.reply) == (1, "")
    assert (as_line.exit_code, as_line.reply) == (0, "got [2^10 + 1/3]")


# Linux refuses one environment string over 128 KiB, counting "AGENT_MESSAGE=" and its NUL.
LONGEST_ENV_MESSAGE = 128 * 1024 - len("AGENT_MESSAGE=") - 1


async def test_a_message_at_the_os_limit_still_runs(make_agent):
    profile = make_agent('import os; print(len(os.environ["AGENT_MESSAGE"]))')
    assert (await run(profile, "m" * LONGEST_ENV_MESSAGE)).reply == str(LONGEST_ENV_MESSAGE)


async def test_an_over_long_message_is_a_clear_spawn_failure_without_stdin_message(make_agent):
    profile = make_agent('print("never runs")')
    result = await run(profile, "m" * (LONGEST_ENV_MESSAGE + 1))
    assert (result.exit_code, result.outcome, result.reply) == (126, "spawn_failed", "")
    assert "could not be started" in result.error_reply and "stdin: message" in result.error_reply


async def test_an_over_long_message_with_stdin_message_is_truncated_in_the_env_and_whole_on_stdin(make_agent):
    profile = make_agent(
        """
        import json, os, sys
        whole = sys.stdin.buffer.read().decode()
        env = os.environ["AGENT_MESSAGE"]
        print(json.dumps({"stdin": len(whole), "env_bytes": len(env.encode()), "prefix": whole.startswith(env),
                          "env": len(env)}))
    """,
        stdin="message",
        timeout_secs=10,
    )
    message = "é" * 100_000 + "tail"  # 200 004 bytes, cut inside a 2-byte character
    seen = json.loads((await run(profile, message)).reply)
    assert seen["stdin"] == len(message)
    assert seen["prefix"] and 100_000 > seen["env"] > 60_000
    assert seen["env_bytes"] <= LONGEST_ENV_MESSAGE


# --------------------------------------------------------------------------- exit codes


async def test_own_exit_code_fails_the_turn_and_discards_the_body(make_agent):
    result = await run(make_agent('import sys\nprint("body")\nsys.exit(3)'))
    assert (result.exit_code, result.outcome, result.reply, result.error) == (3, "exit_nonzero", "", "")
    assert result.error_reply == "The agent exited with code 3."


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGKILL, 137), (signal.SIGTERM, 143), (signal.SIGUSR1, 138)])
async def test_killed_by_a_signal_is_128_plus_n(make_agent, signum, code):
    result = await run(
        make_agent(f"""#!/bin/sh
        echo body
        kill -{signum.name[3:]} $$
        echo never
    """)
    )
    assert (result.exit_code, result.outcome, result.reply) == (code, "exit_nonzero", "")
    assert f"killed by signal {int(signum)}" in result.error_reply


async def test_wall_timeout_is_124_keeps_partials_and_names_the_limit(make_recorded_agent, pid_file):
    profile = make_recorded_agent(HANGS, timeout_secs=0.3, kill_grace_secs=0.2)
    partials: list[str] = []
    result = await bridge.run_turn(profile, Turn("x"), on_partial=partials.append)
    assert (result.exit_code, result.outcome, result.timed_out, result.reply) == (124, "timeout", True, "")
    assert partials == ["started"] and result.partials == 1
    assert result.error_reply == "The agent timed out after 0.3 s."
    assert 250 <= result.duration_ms < 5000
    assert_no_live_process(read_pids(pid_file))


async def test_idle_timeout_ends_a_silent_agent(make_agent):
    profile = make_agent(HANGS, timeout_secs=30, idle_timeout_secs=0.3, kill_grace_secs=0.2)
    result = await run(profile)
    assert (result.exit_code, result.outcome, result.timed_out) == (124, "timeout", True)
    assert "timed out after 0.3 s" in result.error_reply
    assert result.duration_ms < 5000


async def test_idle_timeout_counts_only_stdout(make_agent):
    profile = make_agent(
        """
        import sys, time
        while True:  # busy on stderr, silent on stdout
            print("working", file=sys.stderr, flush=True)
            time.sleep(0.02)
    """,
        timeout_secs=30,
        idle_timeout_secs=0.3,
        kill_grace_secs=0.2,
    )
    result = await run(profile)
    assert (result.exit_code, result.outcome) == (124, "timeout")
    assert "working" in result.stderr_tail


async def test_idle_timeout_is_reset_by_output(make_agent):
    profile = make_agent(
        """
        import time
        for _ in range(12):
            print(".", flush=True)
            time.sleep(0.05)
        print("finished")
    """,
        idle_timeout_secs=0.5,
        kill_grace_secs=0.2,
    )  # 10x the gaps between its lines
    result = await run(profile)
    assert result.outcome == "ok" and result.reply.endswith("finished")


# A shell agent: it has its handler and its error out within a millisecond, well inside the 0.3 s timeout even
# on a loaded machine (a Python agent's start-up could lose that race, and the default SIGTERM end its turn).
@pytest.mark.parametrize("on_sigterm", ["exit 0", "exit 3", "kill -KILL $$"])
async def test_timeout_beats_every_other_ending(make_agent, on_sigterm):
    profile = make_agent(
        f"""
        #!/bin/sh
        trap '{on_sigterm}' TERM
        echo "AGENT_ERROR:\\"the agent's own error\\""
        sleep 3600 &
        wait
    """,
        timeout_secs=0.3,
        kill_grace_secs=0.2,
    )
    result = await run(profile)
    assert (result.exit_code, result.outcome, result.timed_out) == (124, "timeout", True)
    assert result.error == result.error_reply == "the agent's own error"


# --------------------------------------------------------------------------- spawn failures


async def assert_spawn_failure(
    profile: bridge.Profile, code: int, *fragments: str, message: str = "hello"
) -> TurnResult:
    result, events = await run_collecting(profile, message)
    assert (result.exit_code, result.outcome, result.reply, result.partials) == (code, "spawn_failed", "", 0)
    assert events == [result]
    assert result.error_reply.startswith("The agent could not be started: ")
    for fragment in fragments:
        assert fragment in result.error_reply, result.error_reply
    return result


async def test_command_not_on_path_is_127(make_agent):
    await assert_spawn_failure(
        make_agent("x", command=["no-such-agent-program-xyz"]), 127, "'no-such-agent-program-xyz'", "not found on PATH"
    )


async def test_missing_relative_script_is_127(make_agent, tmp_path):
    await assert_spawn_failure(
        make_agent("x", command="./missing.sh", cwd=str(tmp_path)), 127, "'./missing.sh'", "not found", str(tmp_path)
    )


async def test_script_without_execute_permission_is_126(make_agent, tmp_path):
    script = tmp_path / "noexec.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    await assert_spawn_failure(make_agent("x", command=[str(script)]), 126, "not executable")


async def test_missing_cwd_is_126(make_agent, tmp_path):
    await assert_spawn_failure(
        make_agent('print("x")', cwd="no-such-dir"),
        126,
        "working directory",
        str(tmp_path / "no-such-dir"),
        "does not exist",
    )


async def test_cwd_that_is_a_file_is_126(make_agent, tmp_path):
    (tmp_path / "a-file").write_text("")
    await assert_spawn_failure(make_agent('print("x")', cwd="a-file"), 126, "not a directory")


async def test_bad_interpreter_line_is_126(make_agent):
    profile = make_agent("#!/nonexistent/interpreter\necho hi\n")
    await assert_spawn_failure(profile, 126, "interpreter", "/nonexistent/interpreter")


async def test_script_without_interpreter_line_is_126(make_agent, tmp_path):
    script = tmp_path / "bare"
    script.write_bytes(b"\x7fELF-not-really\n")
    script.chmod(0o755)
    await assert_spawn_failure(make_agent("x", command=[str(script)]), 126, "#!")


async def test_a_directory_as_command_is_126(make_agent, tmp_path):
    await assert_spawn_failure(make_agent("x", command=[str(tmp_path)]), 126, "directory")


async def test_argv_and_environment_over_arg_max_is_e2big_126(make_agent):
    # Each argument is under the per-string limit; together they exceed ARG_MAX.
    count = os.sysconf("SC_ARG_MAX") // 100_000 + 2
    profile = make_agent('print("x")', args=["{{MESSAGE}}"] * count)
    await assert_spawn_failure(profile, 126, "E2BIG", message="m" * 100_000)


async def test_a_message_over_the_argument_limit_is_126(make_agent):
    profile = make_agent('print("x")', args=["{{MESSAGE}}"], stdin="message")
    await assert_spawn_failure(profile, 126, "argument 1", "stdin: message", message="m" * 200_000)


# --------------------------------------------------------------------------- host cancel


async def test_stream_cancel_interrupts_the_agent_and_ends_with_130(make_recorded_agent, tmp_path, pid_file):
    marker = tmp_path / "marker"
    profile = make_recorded_agent(WAITS_FOR_SIGINT, env={"MARKER": str(marker)}, kill_grace_secs=0.2)
    received: list[Any] = []
    async with bridge.open_turn(profile, Turn("x")) as events:
        async for event in events:
            received.append(event)
            if isinstance(event, PartialEvent):
                events.cancel()
    result = events.result
    assert received == [PartialEvent("ready"), result]
    assert (result.exit_code, result.outcome, result.timed_out, result.reply) == (130, "cancelled", False, "")
    assert result.error_reply == "The agent was cancelled."
    assert marker.read_text() == "SIGINT"
    assert_no_live_process(read_pids(pid_file))


async def test_an_agent_ignoring_sigint_is_killed_after_the_grace(make_recorded_agent, pid_file):
    profile = make_recorded_agent(
        """
        import signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print('AGENT_PARTIAL:"ready"', flush=True)
        while True:
            time.sleep(3600)
    """,
        kill_grace_secs=0.2,
    )
    async with bridge.open_turn(profile, Turn("x")) as events:
        async for event in events:
            if isinstance(event, PartialEvent):
                events.cancel()
    assert (events.result.exit_code, events.result.outcome) == (130, "cancelled")
    assert events.result.duration_ms < 5000
    assert_no_live_process(read_pids(pid_file))


# A host started in the background by a shell (`bot &`, nohup) ignores SIGINT,
# and exec() passes an ignored signal on: its agents would then ignore the
# host's cancel and only ever end by SIGKILL.
HOST_IGNORING_SIGINT = """
import signal, sys
import bridge
import bridge.engine.driver
import bridge.confinement.spawner
import bridge.engine.one_process
signal.signal(signal.SIGINT, signal.SIG_IGN)
profile = bridge.Profile.from_mapping({"command": ["grep", "^SigIgn:", "/proc/self/status"]})
print(bridge.run_turn_sync(profile, bridge.Turn("x")).reply.split()[1])
"""


def test_an_agent_gets_default_sigint_handling_even_from_a_host_that_ignores_it():
    done = subprocess.run([PYTHON, "-c", HOST_IGNORING_SIGINT], capture_output=True, text=True, timeout=60, check=True)
    ignored = int(done.stdout, 16)
    assert not ignored & (1 << (signal.SIGINT - 1)), f"the agent starts with SIGINT ignored (SigIgn {ignored:x})"


async def test_leaving_open_turn_early_cancels_and_reaps(make_recorded_agent, tmp_path, pid_file):
    marker = tmp_path / "marker"
    profile = make_recorded_agent(WAITS_FOR_SIGINT, env={"MARKER": str(marker)}, kill_grace_secs=0.2)
    async with bridge.open_turn(profile, Turn("x")) as events:
        async for event in events:
            break
    assert event == PartialEvent("ready")
    assert marker.read_text() == "SIGINT"
    pids = read_pids(pid_file)
    assert process_state(pids[0]) is None  # the agent itself is reaped, not a zombie
    assert_no_live_process(pids)
    with pytest.raises(RuntimeError):
        events.result


async def test_trio_cancellation_of_run_turn_interrupts_and_reaps(make_recorded_agent, tmp_path, pid_file):
    marker = tmp_path / "marker"
    profile = make_recorded_agent(WAITS_FOR_SIGINT, env={"MARKER": str(marker)}, kill_grace_secs=0.2)
    with trio.CancelScope() as scope:
        await bridge.run_turn(profile, Turn("x"), on_partial=lambda text: scope.cancel())
        pytest.fail("run_turn returned although it was cancelled")
    assert scope.cancelled_caught
    assert marker.read_text() == "SIGINT"
    pids = read_pids(pid_file)
    assert process_state(pids[0]) is None
    assert_no_live_process(pids)


async def test_cancel_from_an_outer_deadline(make_recorded_agent, pid_file):
    profile = make_recorded_agent(HANGS, kill_grace_secs=0.2)
    with trio.move_on_after(0.3) as scope:
        await run(profile)
    assert scope.cancelled_caught
    assert_no_live_process(read_pids(pid_file))


async def test_an_exception_in_a_host_callback_propagates_and_the_agent_is_stopped(make_recorded_agent, pid_file):
    profile = make_recorded_agent(HANGS, kill_grace_secs=0.2)

    def on_partial(text: str) -> None:
        raise LookupError("host bug")

    with pytest.raises(LookupError, match="host bug"):
        await bridge.run_turn(profile, Turn("x"), on_partial=on_partial)
    assert_no_live_process(read_pids(pid_file))


async def test_an_exception_inside_the_open_turn_block_propagates_and_the_agent_is_stopped(
    make_recorded_agent, pid_file
):
    profile = make_recorded_agent(HANGS, kill_grace_secs=0.2)
    with pytest.raises(LookupError, match="host bug"):
        async with bridge.open_turn(profile, Turn("x")) as events:
            async for _ in events:
                raise LookupError("host bug")
    assert_no_live_process(read_pids(pid_file))


# --------------------------------------------------------------------------- resources


# Prints the descriptors it inherited beyond stdin, stdout and stderr.
FD_LISTER = """
import os
inherited = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
    except OSError:
        continue
    inherited.append(fd)
print(inherited)
"""


async def test_the_agent_inherits_only_stdin_stdout_and_stderr(make_agent):
    """Not the pipes of another running turn (they would hold its EOF back), nor the bridge's own fds."""
    lister = make_agent(FD_LISTER)
    async with bridge.open_turn(make_agent(HANGS, kill_grace_secs=0), Turn("x")) as events:
        async for _ in events:
            break  # the other turn is running, its pipes open
        result = await run(lister)
    assert result.reply == "[]"


@pytest.mark.parametrize("cgroups", [False, True], ids=["uncontained", "contained"])
async def test_turns_started_together_spawn_every_agent_first_each_guarded_and_inheriting_nothing(
    make_agent, monkeypatch, cgroups
):
    """Of turns started at once, the first sets up right after its spawn, the others only once every agent is
    spawned; each agent is guarded by the keeper, inherits no pipe of the turns spawned beside it, and no
    descriptor is left open after. Agents born in cgroups are spawned in worker threads (joining a cgroup may
    wait for the kernel), so there the turns' set-ups need not wait for every spawn."""
    if cgroups and not CONTAINMENT.status().available:
        pytest.skip(f"this machine cannot give agents cgroups: {CONTAINMENT.status().reason}")
    if not cgroups:
        uncontained = Containment()
        uncontained.turn_off()
        monkeypatch.setattr(bridge.confinement.spawner, "CONTAINMENT", uncontained)
    steps: list[str] = []
    guarded: list[bool] = []
    real_spawn, real_agent_io = bridge.confinement.spawner.spawn, bridge.engine.one_process.AgentIO

    def spawn(plan: Any, **options: Any) -> Any:
        agent = real_spawn(plan, **options)
        steps.append("spawn")
        guarded.append(agent.pid in KEEPER._slots)
        return agent

    def agent_io(*args: Any, **options: Any) -> Any:
        steps.append("set up")
        return real_agent_io(*args, **options)

    monkeypatch.setattr(bridge.confinement.spawner, "spawn", spawn)
    monkeypatch.setattr(bridge.engine.one_process, "AgentIO", agent_io)
    lister = make_agent(FD_LISTER)
    with SPAWN_LOCK:
        KEEPER.start()  # its descriptors last as long as the process (the first test of a run starts it)
    before = set(os.listdir("/proc/self/fd"))
    results: list[TurnResult] = []

    async def one() -> None:
        results.append(await run(lister))

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(one)
    assert [result.reply for result in results] == ["[]"] * 12
    if not cgroups:
        assert steps == ["spawn", "set up"] + ["spawn"] * 11 + ["set up"] * 11
    assert sorted(steps) == ["set up"] * 12 + ["spawn"] * 12
    assert guarded == [True] * 12
    assert set(os.listdir("/proc/self/fd")) == before


async def test_a_contained_agent_is_spawned_off_the_event_loop_while_other_agents_run(make_agent, spawning_threads):
    """Joining an agent's cgroup may wait for the kernel: while another agent's events flow, the spawn runs in a
    worker thread, so they do not wait with it. A turn alone spawns in its own thread (no hop there and back)."""
    if not CONTAINMENT.status().available:
        pytest.skip(f"this machine cannot give agents cgroups: {CONTAINMENT.status().reason}")
    echo = make_agent("print('echoed')")
    assert (await run(echo)).reply == "echoed"
    async with bridge.open_turn(make_agent(HANGS, kill_grace_secs=0), Turn("x")) as events:
        async for _ in events:
            break  # the other agent is running
        assert (await run(echo)).reply == "echoed"
    main = threading.main_thread().name
    assert [name == main for name in spawning_threads] == [True, True, False]  # alone, the hanging one, one beside


async def test_many_turns_in_one_run_reuse_descriptors_cleanly(make_agent):
    """A turn closes its descriptors without telling trio (nothing waits on them by then): the next turns, which
    get the same numbers, must still be woken for their own pipes."""
    before = set(os.listdir("/proc/self/fd"))
    profile = make_agent("""
        import sys
        print('AGENT_PARTIAL:"p"', flush=True)
        sys.stderr.write("e" * 70_000 + "\\nend of stderr\\n")
        print("reply")
    """)
    for _ in range(30):
        result = await run(profile)
        assert (result.reply, result.partials) == ("reply", 1)
        assert result.stderr_tail.endswith("end of stderr\n")
    assert set(os.listdir("/proc/self/fd")) == before


async def test_turns_leak_no_file_descriptors(make_agent, tmp_path):
    before = set(os.listdir("/proc/self/fd"))
    profiles = [
        make_agent('print("ok")'),
        make_agent("import sys; print(sys.stdin.read())", stdin="message"),
        make_agent(HANGS, timeout_secs=0.2, kill_grace_secs=0),
        make_agent("x", command=["/nonexistent/agent"]),
        make_agent("x", cwd=str(tmp_path / "missing")),
    ]
    for profile in profiles:
        await run(profile)
    async with bridge.open_turn(make_agent(HANGS, kill_grace_secs=0), Turn("x")) as events:
        async for _ in events:
            break
    assert set(os.listdir("/proc/self/fd")) == before


# --------------------------------------------------------------------------- logs


async def test_library_logs_go_to_the_current_stderr_with_the_turn_context(make_agent, monkeypatch):
    import io

    import bridge.log

    configured_with, current = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", configured_with)
    bridge.log.configure_logging("warning", "json")
    monkeypatch.setattr("sys.stderr", current)  # a host (or a test harness) swaps stderr later
    configured_with.close()
    result = await run(make_agent('print("AGENT_SESSION:not valid")\nprint("ok")', name="logger"), "secret text")
    assert result.reply == "ok"
    records = [json.loads(line) for line in current.getvalue().splitlines()]
    assert any("session" in record["event"] and record["level"] == "warning" for record in records)
    assert all(record["profile"] == "logger" and record["turn_id"] for record in records)
    assert "secret text" not in current.getvalue()


async def test_a_slow_host_gets_every_partial_written_before_the_agent_exited(make_agent, monkeypatch):
    """The drain bound limits waiting on a pipe, never the host's own time handling what was read.

    The agent enlarges its stdout pipe to 1 MiB, fills it and exits: the slow
    host then works through output that takes many reads after the exit.
    """
    monkeypatch.setattr(bridge.engine.driver, "DRAIN_SECS", 0.02)
    profile = make_agent(
        """
        import fcntl, os
        fcntl.fcntl(1, fcntl.F_SETPIPE_SZ, 1024 * 1024)
        chunk = b"".join(b'AGENT_PARTIAL:"%04d' % i + b"x" * 4000 + b'"\\n' for i in range(250))
        os.write(1, chunk)  # fits in the pipe: the agent exits at once
    """,
        max_reply_chars=None,
    )
    seen = []

    async def slow_host(text):
        seen.append(text[:4])
        await trio.sleep(0.002)

    result = await bridge.run_turn(profile, Turn("x"), on_partial=slow_host)
    assert result.ok and result.partials == 250
    assert seen == [f"{i:04d}" for i in range(250)]
