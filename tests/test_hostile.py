"""Hostile agents (issue 2): each turn ends promptly, with the right exit code, nothing left running.

Agents record their pid and their children's (see `make_recorded_agent`) so a
test can prove no process outlived the turn. Time bounds are generous: they
tell "ended at the deadline" from "hung", not fast from slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys

import trio
from conftest import (
    PROFILES,
    PYTHON,
    TURN_DEADLINE,
    assert_no_live_process,
    process_state,
    read_pids,
    run,
    write_agent,
    write_profile,
)

import bridge
from bridge import Turn

MIB = 1024 * 1024
LOUD_BOUND_MS = 5000  # "promptly" on a loaded machine; every hang here would be 600 s


def assert_all_gone(pid_file) -> None:
    pids = read_pids(pid_file)
    assert pids, "the agent recorded no pids"
    assert process_state(pids[0]) is None, "the agent was not reaped"
    assert_no_live_process(pids)


async def test_agent_ignoring_sigterm_is_killed_after_the_grace(make_recorded_agent, pid_file):
    profile = make_recorded_agent(
        """
        import signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen(["sleep", "600"])  # inherits SIG_IGN: it ignores SIGTERM too
        record_pid(child.pid)
        print('AGENT_PARTIAL:"busy"', flush=True)
        while True:
            time.sleep(3600)
    """,
        timeout_secs=0.3,
        kill_grace_secs=0.2,
    )
    result = await run(profile)
    assert (result.exit_code, result.outcome, result.timed_out) == (124, "timeout", True)
    assert 450 <= result.duration_ms < LOUD_BOUND_MS  # SIGKILL came only after the grace
    assert_all_gone(pid_file)


async def test_agent_that_stopped_itself_is_killed_at_the_timeout(make_recorded_agent, pid_file):
    profile = make_recorded_agent(
        """
        import os, signal
        print("about to stop", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # SIGTERM stays pending; only SIGKILL ends it
    """,
        timeout_secs=0.3,
        kill_grace_secs=0.2,
    )
    result = await run(profile)
    assert (result.exit_code, result.outcome) == (124, "timeout")
    assert result.duration_ms < LOUD_BOUND_MS
    assert_all_gone(pid_file)


async def test_grandchild_holding_stdout_neither_hangs_the_turn_nor_survives_it(make_recorded_agent, pid_file):
    profile = make_recorded_agent(
        """
        import os
        child = os.fork()
        if child == 0:
            grandchild = os.fork()
            if grandchild == 0:
                os.execvp("sleep", ["sleep", "600"])  # holds our stdout and stderr open
            record_pid(grandchild)
            os._exit(0)
        os.waitpid(child, 0)
        record_pid(child)
        print("reply", flush=True)
    """,
        timeout_secs=30,
    )
    result = await run(profile)
    assert (result.outcome, result.reply) == ("ok", "reply")
    assert result.duration_ms < LOUD_BOUND_MS
    assert len(read_pids(pid_file)) == 3
    assert_all_gone(pid_file)


async def test_a_process_that_left_the_group_cannot_hang_the_turn(make_recorded_agent, pid_file):
    # A setsid() escapee is out of reach of the group kill (docs/protocol.md §4 kills the
    # group); the bridge stops reading its output after a short bound.
    profile = make_recorded_agent(
        """
        import os
        child = os.fork()
        if child == 0:
            os.setsid()
            os.execvp("sleep", ["sleep", "600"])
        record_pid(child)
        print("reply", flush=True)
    """,
        timeout_secs=30,
    )
    try:
        result = await run(profile)
        assert (result.outcome, result.reply) == ("ok", "reply")
        assert result.duration_ms < LOUD_BOUND_MS
    finally:
        for pid in read_pids(pid_file)[1:]:
            os.kill(pid, signal.SIGKILL)


async def test_many_children_are_all_killed_when_the_agent_exits(make_recorded_agent, pid_file):
    profile = make_recorded_agent("""
        import subprocess
        for _ in range(20):
            record_pid(subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL).pid)
        print("left 20 children behind")
    """)
    result = await run(profile)
    assert result.outcome == "ok"
    assert len(read_pids(pid_file)) == 21
    assert_all_gone(pid_file)


async def test_a_30_mb_line_without_newline_is_cut_at_1_mib(make_recorded_agent, pid_file):
    profile = make_recorded_agent(
        """
        import sys
        chunk = b"x" * 65536
        for _ in range(480):  # 30 MiB, never a newline
            sys.stdout.buffer.write(chunk)
    """,
        max_reply_chars=None,
        timeout_secs=30,
    )
    result = await run(profile)
    assert (result.outcome, result.exit_code) == ("ok", 0)
    assert result.reply == "x" * MIB and result.truncated
    assert result.duration_ms < LOUD_BOUND_MS * 2
    assert_all_gone(pid_file)


async def test_lines_after_an_over_long_line_are_decoded_normally(make_agent):
    profile = make_agent(
        """
        import sys
        sys.stdout.buffer.write(b"AGENT_PARTIAL:" + b"p" * (3 * 1024 * 1024) + b"\\n")
        sys.stdout.buffer.write(b"AGENT_SESSION:after-the-long-line\\nthe reply\\n")
    """,
        max_reply_chars=None,
    )
    result = await run(profile)
    assert result.session_id == "after-the-long-line"
    assert result.reply == "the reply"
    assert result.partials == 1


async def test_stderr_flood_keeps_a_bounded_tail(make_recorded_agent, pid_file):
    profile = make_recorded_agent(
        """
        import sys
        line = b"e" * 1023 + b"\\n"
        for n in range(20 * 1024):  # 20 MiB of stderr, with stdout lines in between
            sys.stderr.buffer.write(line)
            if n % 4096 == 0:
                sys.stdout.write(f"body {n}\\n")
        sys.stderr.buffer.write(b"the last stderr line\\n")
        print("done")
    """,
        include_stderr_in_reply=True,
        timeout_secs=30,
    )
    result = await run(profile)
    assert result.outcome == "ok"
    assert result.reply.startswith("body 0\nbody 4096\nbody 8192\nbody 12288\nbody 16384\ndone")
    assert result.stderr_tail.endswith("the last stderr line\n")
    assert len(result.stderr_tail) <= 8 * 1024
    assert "the last stderr line" in result.reply and len(result.reply) < 10 * 1024
    assert_all_gone(pid_file)


async def test_an_endless_stderr_flood_still_times_out(make_recorded_agent, pid_file):
    """stderr is read by the wait for the agent's exit: reading it must not starve the deadline."""
    profile = make_recorded_agent(
        """
        import os
        chunk = b"e" * 65536
        while True:
            os.write(2, chunk)
    """,
        timeout_secs=0.5,
        kill_grace_secs=0.5,
    )
    result = await run(profile)
    assert result.timed_out and result.exit_code == 124
    assert result.duration_ms < LOUD_BOUND_MS
    assert_all_gone(pid_file)


async def test_stderr_written_while_the_agent_is_being_stopped_is_read(make_recorded_agent, pid_file):
    """More stderr than a pipe holds, written after SIGTERM: the agent is not left blocked until the SIGKILL."""
    profile = make_recorded_agent(
        """
        import signal, sys, time
        def goodbye(signum, frame):
            sys.stderr.write("x" * 300_000 + "\\nlast words\\n")
            sys.stderr.flush()
            sys.exit(3)
        signal.signal(signal.SIGTERM, goodbye)
        print('AGENT_PARTIAL:"up"', flush=True)
        time.sleep(60)
    """,
        timeout_secs=0.5,
        kill_grace_secs=TURN_DEADLINE * 2,
    )
    result = await run(profile)
    assert result.timed_out and result.stderr_tail.endswith("last words\n")
    assert result.duration_ms < LOUD_BOUND_MS
    assert_all_gone(pid_file)


async def test_without_pidfds_stderr_has_a_reader_of_its_own(make_recorded_agent, pid_file, monkeypatch):
    """Where the kernel has no pidfd_open, the exit is awaited in a thread, and stderr is read by a task."""

    def no_pidfds(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    profile = make_recorded_agent("""
        import sys
        sys.stderr.write("e" * 300_000 + "\\nthe last stderr line\\n")
        print("done")
    """)
    result = await run(profile)
    monkeypatch.undo()  # the check below uses pidfds
    assert result.outcome == "ok" and result.reply == "done"
    assert result.stderr_tail.endswith("the last stderr line\n")
    assert_all_gone(pid_file)


async def test_invalid_utf8_becomes_replacement_characters(make_agent):
    profile = make_agent(r"""
        import sys
        sys.stdout.buffer.write(
            b"bad \xff\xfe bytes\n"
            b"AGENT_PARTIAL:caf\xc3\n"
            b'AGENT_PARTIAL:"\\ud800 lone surrogate"\n'
            b"AGENT_SESSION:s\xe9ssion\n"
            b"nul \x00 kept\n"
            b"cut \xe2\x82"
        )
        sys.stderr.buffer.write(b"err \xff\n")
    """)
    partials: list[str] = []
    result = await bridge.run_turn(profile, Turn("x"), on_partial=partials.append)
    assert result.outcome == "ok"
    assert result.reply == "bad \ufffd\ufffd bytes\nnul \x00 kept\ncut \ufffd"
    assert partials == ["caf\ufffd", "\ufffd lone surrogate"]
    assert result.session_id == "s\ufffdssion"
    assert result.stderr_tail == "err \ufffd\n"
    json.dumps(result.to_dict()).encode()  # everything in the result can be sent on


async def test_1_mb_of_stdout_before_reading_a_1_mb_message_does_not_deadlock(make_recorded_agent, pid_file):
    profile = make_recorded_agent(
        """
        import hashlib, sys
        line = "o" * 999 + "\\n"
        for _ in range(1000):  # 1 MB: far more than a pipe holds, before we read a byte
            sys.stdout.write(line)
        sys.stdout.flush()
        data = sys.stdin.buffer.read()
        print(len(data), hashlib.sha256(data).hexdigest())
    """,
        stdin="message",
        max_reply_chars=None,
        timeout_secs=20,
    )
    message = "m" * 999_999 + "!"
    result = await run(profile, message)
    assert (result.outcome, result.timed_out) == ("ok", False)
    lines = result.reply.split("\n")
    assert len(lines) == 1001
    assert lines[-1] == f"{len(message)} {hashlib.sha256(message.encode()).hexdigest()}"
    assert_all_gone(pid_file)


async def test_an_agent_that_never_reads_a_1_mb_message_still_ends(make_recorded_agent, pid_file):
    profile = make_recorded_agent('print("not reading")', stdin="message", timeout_secs=20)
    result = await run(profile, "m" * 1_000_000)
    assert (result.outcome, result.reply) == ("ok", "not reading")
    assert_all_gone(pid_file)


async def test_agent_killed_by_a_signal_takes_its_children_with_it(make_recorded_agent, pid_file):
    profile = make_recorded_agent("""
        import os, signal, subprocess
        record_pid(subprocess.Popen(["sleep", "600"]).pid)
        print("body", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = await run(profile)
    assert (result.exit_code, result.outcome, result.reply) == (137, "exit_nonzero", "")
    assert "killed by signal 9 (SIGKILL)" in result.error_reply
    assert_all_gone(pid_file)


async def test_an_agent_that_closes_its_output_is_still_timed_out(make_recorded_agent, pid_file):
    profile = make_recorded_agent(
        """
        import os, time
        os.close(1)
        os.close(2)
        while True:
            time.sleep(3600)
    """,
        timeout_secs=0.3,
        kill_grace_secs=0.2,
    )
    result = await run(profile)
    assert (result.exit_code, result.outcome) == (124, "timeout")
    assert result.duration_ms < LOUD_BOUND_MS
    assert_all_gone(pid_file)


async def test_a_flood_of_partials_is_capped(make_agent):
    profile = make_agent(
        """
        import sys
        sys.stdout.write("AGENT_PARTIAL:x\\n" * 200_000)
        print("end")
    """,
        max_reply_chars=100,
        truncation_suffix="…",
    )
    count = 0

    def on_partial(text: str) -> None:
        nonlocal count
        count += 1

    result = await bridge.run_turn(profile, Turn("x"), on_partial=on_partial)
    assert count == result.partials == 101  # 100 one-character chunks, then the suffix alone
    assert result.truncated and result.reply == "end"


async def test_hostile_turns_in_parallel_end_independently(make_agent):
    """A hung agent next to a well-behaved one delays nothing but itself."""
    hang = make_agent("import time\nwhile True: time.sleep(3600)", timeout_secs=0.5, kill_grace_secs=0.2)
    echo = make_agent("#!/bin/sh\necho fast")
    finished: list[str] = []

    async def turn(name: str, profile: bridge.Profile) -> None:
        await run(profile)
        finished.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn, "hang", hang)
        nursery.start_soon(turn, "echo", echo)
    assert finished == ["echo", "hang"]


# --------------------------------------------------------------------------- the bridge's own memory

# Runs `agent-bridge run … --json` once per profile, then reports the peak RSS
# of all its (reaped) descendants: the CLI process and the agent it ran.
RSS_WRAPPER = """
import json, resource, subprocess, sys
report = []
for profile in sys.argv[2:]:
    done = subprocess.run([sys.argv[1], "run", profile, "hi", "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    result = json.loads(done.stdout.splitlines()[-1])
    report.append({"exit": done.returncode, "reply": len(result["reply"]), "stderr_tail": len(result["stderr_tail"]),
                   "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss})
print(json.dumps(report))
"""


def test_bridge_memory_stays_bounded_whatever_the_agent_prints(tmp_path):
    write_agent(
        tmp_path,
        "line.py",
        f"""#!{PYTHON}
import sys
chunk = b"x" * 65536
for _ in range(480):  # 30 MiB without a newline
    sys.stdout.buffer.write(chunk)
""",
    )
    write_agent(
        tmp_path,
        "stderr.py",
        f"""#!{PYTHON}
import sys
line = b"e" * 1023 + b"\\n"
for _ in range(30 * 1024):  # 30 MiB on stderr
    sys.stderr.buffer.write(line)
print("done")
""",
    )
    write_agent(
        tmp_path,
        "tiny.py",
        f"""#!{PYTHON}
import sys
for _ in range(6):  # 18 MiB of 2-character lines: millions of lines under the 8 Mi-character bound
    sys.stdout.buffer.write(b"ab\\n" * (1 << 20))
""",
    )
    line = write_profile(tmp_path, 'command: ["{{PROFILE_DIR}}/line.py"]\nmax_reply_chars: null\n', "line.yaml")
    flood = write_profile(tmp_path, 'command: ["{{PROFILE_DIR}}/stderr.py"]\n', "stderr.yaml")
    tiny = write_profile(tmp_path, 'command: ["{{PROFILE_DIR}}/tiny.py"]\nmax_reply_chars: null\n', "tiny.yaml")
    cli = os.path.join(os.path.dirname(sys.executable), "agent-bridge")
    done = subprocess.run(
        [sys.executable, "-c", RSS_WRAPPER, cli, str(PROFILES / "echo.yaml"), str(line), str(flood), str(tiny)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    baseline, long_line, stderr_flood, tiny_lines = json.loads(done.stdout)
    assert (long_line["exit"], long_line["reply"]) == (0, MIB)
    assert (stderr_flood["exit"], stderr_flood["reply"]) == (0, 4)
    assert stderr_flood["stderr_tail"] <= 8 * 1024
    # Holding the 30 MiB (as bytes, let alone as text) would add at least 30 MiB.
    headroom_kib = 16 * 1024
    assert long_line["peak_kib"] < baseline["peak_kib"] + headroom_kib, (baseline, long_line)
    assert stderr_flood["peak_kib"] < baseline["peak_kib"] + headroom_kib, (baseline, stderr_flood)
    # The reply is capped at 8 Mi characters. Printed with --json it exists as text (8.4 MB),
    # JSON-escaped (11 MB: every newline doubles) and encoded (11 MB), ~40 MB in all. Held as
    # millions of separate 2-character strings it took 220 MB more.
    assert tiny_lines["exit"] == 0 and tiny_lines["reply"] > 8_000_000
    assert tiny_lines["peak_kib"] < baseline["peak_kib"] + 80 * 1024, (baseline, tiny_lines)


async def test_an_endless_flood_is_stopped_at_its_timeout_while_another_turn_runs(make_agent):
    """Reading never starves the event loop: the flood's deadline fires, and a quiet turn beside it finishes."""
    flood = make_agent(
        """
        #!/bin/sh
        exec yes "a line of body text, over and over, as fast as the pipe takes it"
    """,
        timeout_secs=0.5,
        kill_grace_secs=0.2,
    )
    quiet = make_agent("print('quiet turn done')")
    results = {}

    async def run_one(name, profile):
        results[name] = await bridge.run_turn(profile, Turn("x"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_one, "flood", flood)
        nursery.start_soon(run_one, "quiet", quiet)
    assert (results["flood"].exit_code, results["flood"].outcome) == (124, "timeout")
    assert results["flood"].duration_ms < LOUD_BOUND_MS
    assert results["quiet"].reply == "quiet turn done" and results["quiet"].duration_ms < LOUD_BOUND_MS


async def test_a_pipe_that_never_runs_dry_does_not_starve_other_tasks():
    """Deterministic version of the above: /dev/zero always has data, so only the reader's own
    schedule points let anything else run. A regression fails here instead of hanging."""
    from bridge.engine.driver import Reader

    reader = Reader(os.open("/dev/zero", os.O_RDONLY | os.O_NONBLOCK))
    reads = 0
    seen_at = None

    async def other_task():
        nonlocal seen_at
        seen_at = reads

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        with reader.scope:
            while reads < 1000 and seen_at is None:
                assert await reader.receive()
                reads += 1
    os.close(reader.fd)
    assert seen_at is not None and seen_at <= 2
