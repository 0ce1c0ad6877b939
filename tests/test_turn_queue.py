"""Turns of one conversation queue across processes (docs/protocol.md §6): CLI runs, chats and `serve` sharing a store.

Real `agent-bridge` processes run the recorder agent of `hostkit`, whose diary
gives the true order in which agents started and ended. A run announces that it
waits for an earlier turn with an info log record on stderr; the tests use that
record (not a timer) to know a process has taken its place in the queue.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest
import trio
import trio.testing
from conftest import PROFILES, write_agent, write_profile
from hostkit import Lab, max_overlap

from bridge import BridgeError
from bridge.host.file_turnlock import TurnLocks, conversation_hash, parse_ticket, plan_join, ticket_name

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
WAIT = 20.0  # an upper bound for a loaded machine; passing tests never wait for it
QUEUED = b"waits for an earlier turn"  # the info record of a turn that found its conversation busy


class Proc:
    """An `agent-bridge` subprocess whose stdout and stderr are read as they come, with a deadline."""

    def __init__(self, *args: str, stdin: Any = subprocess.DEVNULL, env: dict[str, str] | None = None) -> None:
        self.popen = subprocess.Popen(
            [AGENT_BRIDGE, *args], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self.output = {"out": b"", "err": b""}
        self._open = {self.popen.stdout.fileno(): "out", self.popen.stderr.fileno(): "err"}  # type: ignore[union-attr]

    @property
    def out(self) -> bytes:
        return self.output["out"]

    @property
    def err(self) -> bytes:
        return self.output["err"]

    def expect(self, stream: str, needle: bytes, *, seen: int = 0) -> bool:
        """Read until `needle` shows in `stream` (out or err) after offset `seen`: True; False once both close."""
        deadline = time.monotonic() + WAIT
        while needle not in self.output[stream][seen:]:
            if not self._read(deadline):
                return False
        return True

    def finish(self) -> int:
        """Read everything left, wait for the exit; the exit code."""
        deadline = time.monotonic() + WAIT
        while self._read(deadline):
            pass
        return self.popen.wait(timeout=max(0.1, deadline - time.monotonic()))

    def _read(self, deadline: float) -> bool:
        if not self._open:
            return False
        ready, _, _ = select.select(list(self._open), [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"nothing more within {WAIT} s; so far: {self.output}"
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                self.output[self._open[fd]] += chunk
            else:
                del self._open[fd]
        return True

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signum)


class Bench:
    """A `Lab` plus the processes and gates a test starts, all cleaned up when it ends."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.procs: list[Proc] = []
        self.gates: list[Path] = []
        self.profile = lab.profile("rec")

    def run(self, message: str, *options: str, conversation: str = "k") -> Proc:
        """`agent-bridge run rec.yaml MESSAGE --conversation KEY` on the lab's store, logging at info."""
        return self.start(
            "run",
            str(self.profile),
            message,
            "--conversation",
            conversation,
            "--state",
            str(self.lab.state),
            "--log-level",
            "info",
            "--log-format",
            "json",
            *options,
        )

    def start(self, *args: str, stdin: Any = subprocess.DEVNULL, env: dict[str, str] | None = None) -> Proc:
        proc = Proc(*args, stdin=stdin, env=env)
        self.procs.append(proc)
        return proc

    def holding_run(self) -> tuple[Proc, Path]:
        """Runs `tag=0` (session s0) and gives it once its agent has started, waiting on the gate it also gives."""
        gate = self.gate()
        holder = self.run(f"tag=0 session=s0 gate={gate}")
        assert holder.expect("out", b"started"), holder.output
        return holder, gate

    def gate(self) -> Path:
        gate = self.lab.gate()
        self.gates.append(gate)
        return gate

    def release(self, gate: Path) -> None:
        """Let the agent waiting on `gate` go on (it has opened the FIFO, or is about to)."""
        with open(gate, "w"):
            pass

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.popen.wait(timeout=WAIT)
            for pipe in (proc.popen.stdout, proc.popen.stderr):
                pipe.close()  # type: ignore[union-attr]
        for gate in self.gates:  # an agent whose bridge was killed still waits on its gate: let it end
            try:
                os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass  # no agent reads it any more

    def starts(self) -> list[tuple[str, str]]:
        """(tag, session id it was given) of every agent that started, in order."""
        return [(words[1], words[2]) for words in self.lab.lines() if words[0] == "start"]


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    bench = Bench(Lab(tmp_path))
    yield bench
    bench.close()


def queued(proc: Proc, *, seen: int = 0) -> bool:
    return proc.expect("err", QUEUED, seen=seen)


# --------------------------------------------------------------------------- the rules


def test_ticket_names_round_trip_and_anything_else_in_the_directory_is_ignored() -> None:
    assert parse_ticket(ticket_name("ab12", 7)) == ("ab12", 7)
    for other in ("join.lock", "ab12", "ab12-", "ab12-7.tmp", "ab12--7", "ab12-\u0667", ".nfs0001"):
        assert parse_ticket(other) is None, other


def test_a_new_ticket_goes_behind_every_ticket_and_waits_for_those_of_its_conversation_newest_first() -> None:
    assert plan_join([], "aa") == plan_join(["join.lock"], "aa") == (1, [])
    names = ["join.lock", "aa-1", "bb-2", "aa-5", "aa-3", "junk-x", "bb-9", "aa-10", "aa-x-1"]
    assert plan_join(names, "aa") == (11, ["aa-10", "aa-5", "aa-3", "aa-1"])
    assert plan_join(names, "bb") == (11, ["bb-9", "bb-2"])
    assert plan_join(names, "cc") == (11, [])


def test_conversation_keys_hash_apart_whatever_they_contain() -> None:
    keys = [("p", "a b", "c"), ("p", "a", "b c"), ("p a", "b", "c"), ("p", "k", "default"), ("p", "\ud800/..", "\n")]
    hashes = {conversation_hash(*key) for key in keys}
    assert len(hashes) == len(keys)
    assert all(len(h) == 32 and set(h) <= set("0123456789abcdef") for h in hashes)
    assert conversation_hash("p", "k", "default") == conversation_hash("p", "k", "default")


# --------------------------------------------------------------------------- places, in one process


def test_places_are_given_in_arrival_order_per_conversation(tmp_path: Path) -> None:
    queues = TurnLocks(tmp_path / "s.sqlite3")
    first, second, third = (queues.join("p", "k", "default") for _ in range(3))
    other = queues.join("p", "other", "default")
    assert first.try_wait() and other.try_wait()
    assert not second.try_wait() and not third.try_wait()
    first.release()
    assert second.try_wait() and not third.try_wait()
    second.release()
    assert third.try_wait()
    third.release()
    other.release()
    assert os.listdir(queues.directory) == ["join.lock"]
    assert (os.stat(queues.directory).st_mode & 0o777) == 0o700
    queues.close()


def test_a_ticket_left_by_a_dead_process_is_skipped_and_removed(tmp_path: Path) -> None:
    queues = TurnLocks(tmp_path / "s.sqlite3")
    stale = Path(queues.directory) / ticket_name(conversation_hash("p", "k", "default"), 4)
    stale.touch()  # no process holds its lock: its holder is gone
    place = queues.join("p", "k", "default")
    assert place.try_wait() and not stale.exists()
    place.release()
    queues.close()


def test_the_same_store_reached_by_another_path_shares_the_queue(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    one = TurnLocks(tmp_path / "real" / "s.sqlite3")
    two = TurnLocks(tmp_path / "link" / ".." / "link" / "s.sqlite3")
    held = one.join("p", "k", "default")
    assert not two.join("p", "k", "default").try_wait()
    held.release()
    one.close()
    two.close()


async def test_waiting_in_trio_lets_other_tasks_run_and_can_be_abandoned(tmp_path: Path) -> None:
    queues = TurnLocks(tmp_path / "s.sqlite3")
    held = queues.join("p", "k", "default")
    waiting = await queues.join_async("p", "k", "default")
    abandon = trio.Event()

    async def give_up() -> None:
        await trio.testing.wait_all_tasks_blocked()  # the waiter is parked; the loop runs other tasks
        abandon.set()

    async def release_held() -> None:
        await trio.testing.wait_all_tasks_blocked()
        held.release()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(give_up)
            assert await waiting.wait_async(abandon) is False
        waiting.release()
        behind = await queues.join_async("p", "k", "default")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_held)
            assert await behind.wait_async() is True  # the abandoned place left nothing in the way
        behind.release()
    queues.close()


def test_a_queue_directory_that_cannot_be_made_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "s.sqlite3.turns").write_text("a file, not a directory")
    with pytest.raises(BridgeError, match=r"cannot queue turns in .*s\.sqlite3\.turns: .*--state PATH"):
        TurnLocks(tmp_path / "s.sqlite3")


# --------------------------------------------------------------------------- CLI runs


def test_runs_of_one_conversation_queue_in_arrival_order_each_resuming_the_last_session(bench: Bench) -> None:
    first, gate = bench.holding_run()
    later = []
    for index in range(1, 6):  # each one starts once the one before has its place in the queue
        run = bench.run(f"tag={index} session=s{index}")
        assert queued(run), f"run {index} did not wait for the running turn of its conversation: {run.output}"
        later.append(run)
    bench.release(gate)
    assert [run.finish() for run in (first, *later)] == [0] * 6
    assert bench.starts() == [("0", "-"), ("1", "s0"), ("2", "s1"), ("3", "s2"), ("4", "s3"), ("5", "s4")]
    assert max_overlap(bench.lab.lines()) == 1
    assert [run.out.decode().splitlines() for run in later] == [
        ["started", f"reply {index} one"] for index in range(1, 6)
    ]
    assert os.listdir(f"{bench.lab.state}.turns") == ["join.lock"], "every turn removed its ticket"


def test_a_burst_of_runs_never_overlaps_and_chains_its_sessions(bench: Bench, tmp_path: Path) -> None:
    """The reported case: a bot starts one run per message, 50 ms apart, each agent busy for a while."""
    diary = tmp_path / "burst-diary"
    write_agent(
        tmp_path,
        "slow.sh",
        f"""\
        #!/bin/sh
        echo "start $AGENT_MESSAGE ${{AGENT_SESSION_ID:--}}" >> {diary}
        sleep 0.2
        echo "end $AGENT_MESSAGE" >> {diary}
        echo "AGENT_SESSION:$AGENT_MESSAGE"
    """,
    )
    profile = write_profile(tmp_path, "command: '{{PROFILE_DIR}}/slow.sh'\n", "slow.yaml")
    runs = []
    for index in range(6):
        runs.append(
            bench.start("run", str(profile), f"m{index}", "--conversation", "k", "--state", str(bench.lab.state))
        )
        time.sleep(0.05)
    assert [run.finish() for run in runs] == [0] * 6, [run.err for run in runs]
    lines = [line.split() for line in diary.read_text().splitlines()]
    assert max_overlap(lines) == 1, lines
    starts = [(words[1], words[2]) for words in lines if words[0] == "start"]
    assert len(starts) == 6
    # Whatever order they arrived in, each turn resumed the session of the turn before it.
    assert [session for _, session in starts] == ["-", *(tag for tag, _ in starts[:-1])]


def test_runs_started_50_ms_apart_on_a_busy_machine_are_served_in_the_order_they_started(
    bench: Bench, tmp_path: Path
) -> None:
    """Every other run loads its profile slowly (a cache of its own, empty: it validates the profile), and all
    of them share one CPU, as busy as a machine gets: a run that joined its queue only once loaded fell behind
    the fast one started 50 ms after it. The scheduler shares the CPU fairly, so the order shows what a run does
    before it joins."""
    served = tmp_path / "served"
    write_agent(tmp_path, "note.sh", f'#!/bin/sh\necho "$AGENT_MESSAGE" >> {served}\necho noted\n')
    profile = write_profile(tmp_path, "command: '{{PROFILE_DIR}}/note.sh'\n", "note.yaml")
    warm = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "warm-cache")}
    subprocess.run(
        [sys.executable, "-c", f"import bridge; bridge.load_profile({str(profile)!r})"],
        env=warm,
        check=True,
        timeout=60,
    )
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {max(cpus)})  # the runs inherit it
    try:
        runs = []
        for index in range(6):
            slow = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / f"cold-cache-{index}")}
            runs.append(
                bench.start(
                    "run",
                    str(profile),
                    f"m{index}",
                    "--conversation",
                    "k",
                    "--state",
                    str(bench.lab.state),
                    env=slow if index % 2 == 0 else warm,
                )
            )
            time.sleep(0.05)  # the scenario: a bot starting one run per message as messages come
    finally:
        os.sched_setaffinity(0, cpus)
    assert [run.finish() for run in runs] == [0] * 6, [run.err for run in runs]
    assert served.read_text().split() == [f"m{index}" for index in range(6)]


def test_a_run_joins_its_queue_before_it_loads_the_bridge(tmp_path: Path) -> None:
    code = (
        "import sys, bridge.command; place = bridge.command.early_place(sys.argv[1:]); "
        "print(place is not None, sorted({'trio', 'pydantic', 'yaml', 'sqlite3', 'structlog'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "run",
            str(PROFILES / "echo.yaml"),
            "hi",
            "--conversation",
            "k",
            "--state",
            str(tmp_path / "state.sqlite3"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.splitlines() == ["True []"], done.stderr


@pytest.mark.parametrize(
    ("arguments", "queue"),
    [
        (["run", "{profile}", "hi", "--conversation", "k", "--state", "{state}"], ("note", "k", "default")),
        (
            [
                "run",
                "--json",
                "--conversation=k",
                "--session-name",
                "side",
                "--state={state}",
                "{profile}",
                "--",
                "-la",
            ],
            ("note", "k", "side"),
        ),
        (
            ["run", "{named}", "--conversation", "k", "--state", "{state}", "--log-level", "info"],
            ("bot one", "k", "default"),
        ),
        (["run", "{profile}", "hi", "--state", "{state}"], None),  # no conversation: no queue
        (["run", "{profile}", "hi", "--conv", "k", "--state", "{state}"], None),  # an abbreviation: `run` reads it
        (["run", "{profile}", "hi", "--conversation", "k", "--some-new-option", "x", "--state", "{state}"], None),
        (["run", "{profile}", "hi", "--conversation", "k", "--state", "postgresql://bot@db/bridge"], None),
        (["chat", "{profile}", "--conversation", "k", "--state", "{state}"], None),
    ],
)
def test_the_place_taken_before_loading_is_in_the_queue_the_command_line_names(
    tmp_path: Path, arguments: list[str], queue: tuple[str, str, str] | None
) -> None:
    from bridge.command import early_place

    profile = write_profile(tmp_path, "command: agent\n", "note.yaml")
    named = write_profile(tmp_path, "command: agent\nname: 'bot one'  # as the store knows it\n", "named.yaml")
    state = tmp_path / "state.sqlite3"
    place = early_place([word.format(profile=profile, named=named, state=state) for word in arguments])
    if queue is None:
        assert place is None
        return
    assert place is not None
    try:
        locks = TurnLocks(state)
        assert locks.holds(place, *queue)
        locks.close()
    finally:
        place.release()


def test_a_wrong_guess_of_the_profiles_name_is_put_right_once_the_profile_is_loaded(tmp_path: Path) -> None:
    from bridge.cli.sessions import Conversation
    from bridge.command import early_place

    profile = write_profile(tmp_path, "command: agent\nname: >-\n  folded\n", "note.yaml")  # guessed as '>-'
    state = str(tmp_path / "state.sqlite3")
    guessed = early_place(["run", str(profile), "hi", "--conversation", "k", "--state", state])
    right = early_place(["run", str(profile), "hi", "--conversation", "k", "--state", state])
    assert guessed is not None and right is not None
    conversation = Conversation(state, "folded", "k", "default")
    try:
        place = conversation.join(guessed)
        assert place is not guessed and not os.path.exists(guessed.path)  # left the wrong queue
        assert conversation.queue.holds(place, "folded", "k", "default")  # type: ignore[union-attr]
        place.release()
        right_conversation = Conversation(state, ">-", "k", "default")
        assert right_conversation.join(right) is right  # a right guess is the place itself
        right_conversation.close()
    finally:
        right.release()
        conversation.close()


def test_a_run_killed_while_its_agent_runs_does_not_block_the_next(bench: Bench) -> None:
    holder, _ = bench.holding_run()
    waiter = bench.run("tag=1")
    assert queued(waiter)
    holder.kill(signal.SIGKILL)
    assert waiter.finish() == 0, waiter.output
    assert bench.starts() == [("0", "-"), ("1", "-")]  # the killed run recorded nothing


def test_a_run_killed_while_waiting_does_not_block_the_ones_behind_it(bench: Bench) -> None:
    holder, gate = bench.holding_run()
    doomed = bench.run("tag=1")
    assert queued(doomed)
    last = bench.run("tag=2")
    assert queued(last)
    doomed.kill(signal.SIGKILL)
    doomed.finish()
    bench.release(gate)
    assert (holder.finish(), last.finish()) == (0, 0), last.output
    assert bench.starts() == [("0", "-"), ("2", "s0")]
    assert max_overlap(bench.lab.lines()) == 1


def test_ctrl_c_or_sigterm_while_waiting_ends_the_run_without_running_its_agent(bench: Bench) -> None:
    holder, gate = bench.holding_run()
    interrupted = bench.run("tag=1")
    assert queued(interrupted)
    terminated = bench.run("tag=2")
    assert queued(terminated)
    last = bench.run("tag=3")
    assert queued(last)
    interrupted.kill(signal.SIGINT)
    terminated.kill(signal.SIGTERM)
    assert (interrupted.finish(), terminated.finish()) == (130, 143)
    for stopped in (interrupted, terminated):
        assert stopped.out == b"" and b"Traceback" not in stopped.err, stopped.output
    bench.release(gate)
    assert (holder.finish(), last.finish()) == (0, 0)
    assert bench.starts() == [("0", "-"), ("3", "s0")]


def test_new_forgets_the_session_only_once_the_turn_before_it_is_over(bench: Bench) -> None:
    holder, gate = bench.holding_run()
    fresh = bench.run("tag=1", "--new")
    assert queued(fresh)
    bench.release(gate)
    assert (holder.finish(), fresh.finish()) == (0, 0)
    assert bench.starts() == [("0", "-"), ("1", "-")], "--new started afresh, though the turn before stored s0"


def test_other_conversations_and_session_names_do_not_wait(bench: Bench) -> None:
    gate = bench.gate()
    holder = bench.run(f"tag=0 gate={gate}")
    assert holder.expect("out", b"started")
    other = bench.run("tag=1", conversation="other")
    named = bench.run("tag=2", "--session-name", "work")
    assert (other.finish(), named.finish()) == (0, 0)
    assert QUEUED not in other.err + named.err
    bench.release(gate)
    assert holder.finish() == 0


@pytest.mark.parametrize("entry", ["bridge.cli", "bridge.command"])  # the function, and the installed command
def test_a_run_without_a_conversation_loads_neither_the_store_nor_the_queue(entry: str) -> None:
    code = (
        f"import sys; from {entry} import main; code = main(['run', sys.argv[1], 'hi']); "
        "print(code, sorted({'sqlite3', 'bridge.host.sqlite_store', 'bridge.host.file_turnlock'} & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(PROFILES / "echo.yaml")], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.splitlines()[-1] == "0 []", done.stderr


# --------------------------------------------------------------------------- chat


def test_a_chat_takes_its_place_for_each_turn(bench: Bench) -> None:
    a_chat_takes_its_place_for_each_turn(bench)


def a_chat_takes_its_place_for_each_turn(
    bench: Bench, *, then: Callable[[Proc, TextIO], None] = lambda chat, lines: None
) -> None:
    """A chat's second turn waits for a run started between its two turns, and resumes the run's session;
    `then` goes on with the chat before its input closes."""
    gate = bench.gate()
    chat_input_read, chat_input = os.pipe()
    chat = bench.start(
        "chat", str(bench.profile), "--conversation", "k", "--state", str(bench.lab.state), stdin=chat_input_read
    )
    os.close(chat_input_read)
    with os.fdopen(chat_input, "w") as lines:
        lines.write("tag=c1 session=c1\n")
        lines.flush()
        assert chat.expect("out", b"reply c1")
        holder = bench.run(f"tag=0 session=s0 gate={gate}")  # a run in between, with the chat still open
        assert holder.expect("out", b"started")
        lines.write("tag=c2\n")
        lines.flush()
        assert chat.expect("err", b"waiting"), chat.output
        bench.release(gate)
        assert chat.expect("out", b"reply c2")
        then(chat, lines)
    assert (holder.finish(), chat.finish()) == (0, 0)
    assert bench.starts() == [("c1", "-"), ("0", "c1"), ("c2", "s0")], "the chat resumed what the run stored"
    assert max_overlap(bench.lab.lines()) == 1


# --------------------------------------------------------------------------- serve


class Serve(Proc):
    """`agent-bridge serve` on the lab's profiles and store."""

    def __init__(self, lab: Lab) -> None:
        read, self._requests = os.pipe()
        super().__init__(
            "serve",
            "--profiles",
            str(lab.profiles),
            "--state",
            str(lab.state),
            "--log-level",
            "info",
            "--log-format",
            "json",
            stdin=read,
        )
        os.close(read)

    def send(self, request: dict[str, Any]) -> None:
        os.write(self._requests, (json.dumps(request) + "\n").encode())

    def turn(self, turn_id: str, message: str, conversation: str = "k") -> None:
        self.send({"type": "turn", "id": turn_id, "profile": "rec", "conversation": conversation, "message": message})

    def responses(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.splitlines()]

    def result(self, turn_id: str) -> dict[str, Any]:
        needle = json.dumps({"type": "result", "id": turn_id})[:-1].encode()
        assert self.expect("out", needle), self.output
        assert self.expect("out", b"\n", seen=self.out.index(needle))
        return next(r for r in self.responses() if r["type"] == "result" and r["id"] == turn_id)

    def stop(self) -> int:
        os.close(self._requests)
        return self.finish()


@pytest.fixture
def serve(bench: Bench) -> Iterator[Serve]:
    serve = Serve(bench.lab)
    bench.procs.append(serve)
    yield serve
    try:
        os.close(serve._requests)
    except OSError:
        pass


def test_a_run_waits_for_a_serve_turn_of_its_conversation(bench: Bench, serve: Serve) -> None:
    gate = bench.gate()
    serve.turn("t1", f"tag=s1 session=from-serve gate={gate}")
    assert serve.expect("out", b'"started"'), serve.output
    run = bench.run("tag=c session=from-cli")
    assert queued(run), run.output
    bench.release(gate)
    assert serve.result("t1")["exit_code"] == 0
    assert run.finish() == 0
    serve.turn("t2", "tag=s2")
    assert serve.result("t2")["exit_code"] == 0
    assert serve.stop() == 0
    assert bench.starts() == [("s1", "-"), ("c", "from-serve"), ("s2", "from-cli")]
    assert max_overlap(bench.lab.lines()) == 1


def test_serve_waits_for_a_run_without_holding_up_other_conversations_and_can_cancel_the_wait(
    bench: Bench, serve: Serve
) -> None:
    gate = bench.gate()
    run = bench.run(f"tag=c session=from-cli gate={gate}")
    assert run.expect("out", b"started")
    serve.turn("t1", "tag=s1")  # waits for the run
    assert queued(serve), serve.output
    serve.turn("t2", "tag=o", conversation="other")  # meanwhile another conversation runs
    assert serve.result("t2")["exit_code"] == 0
    serve.turn("t3", "tag=s3")  # queued in serve behind t1
    serve.send({"type": "cancel", "id": "t1"})
    assert serve.result("t1")["exit_code"] == 130  # left the wait without running
    assert queued(serve, seen=serve.err.index(QUEUED) + 1), "t3 now waits for the run"
    bench.release(gate)
    assert run.finish() == 0
    assert serve.result("t3")["exit_code"] == 0
    assert serve.stop() == 0
    assert bench.starts() == [("c", "-"), ("o", "-"), ("s3", "from-cli")]
    assert max_overlap(bench.lab.lines(), {"c", "s3"}) == 1
