"""One benchmark sample, measured in a fresh process: `worker.py CASE CONTENDER PARAMS_JSON`.

`run.py` starts one worker per sample, so every contender gets a clean heap
and its own peak RSS, and no contender's threads or caches leak into
another's numbers. A worker imports only what its contender needs (agentproc
never sees the bridge's modules, and the other way round) — except the
per-turn case, which alternates all three turn by turn in one process so that
even short bursts of load cancel. Each validates the output of an untimed
turn, times only the thing measured, and prints one JSON object on stdout.
Logs and agents' stderr go to stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
AGENTS = os.path.join(HERE, "agents")
clock_ns = time.perf_counter_ns
# The samples of bench/claude_sdk.py and bench/codex_app_server.py take `expect` from `worker`: when this file runs
# as the script, that must be this module, or their `Invalid` would not be the one `main` catches.
sys.modules.setdefault("worker", sys.modules[__name__])

# The per-turn agent's expected result (see agents/turn.sh).
TURN_MESSAGE = "hello"
TURN_REPLY = "reply: hello"
TURN_SESSION = "bench-session"


class Invalid(Exception):
    """A contender produced the wrong result: its timing would measure something else."""


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise Invalid(what)


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM), in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def noop(text: str) -> None:
    """The partial callback of every contender: does nothing, so only delivery is measured."""


# --------------------------------------------------------------------------- contenders' plumbing


def bridge_profile(mapping: dict[str, Any]) -> Any:
    from bridge import Profile

    return Profile.from_mapping(mapping, profile_dir=AGENTS)


def agentproc_profile(mapping: dict[str, Any]) -> dict[str, Any]:
    """The same profile for agentproc: its cap cannot be switched off, so 'no cap' is a cap it never reaches."""
    profile = dict(mapping)
    if "max_reply_chars" in profile and profile["max_reply_chars"] is None:
        profile["max_reply_chars"] = 1 << 62
    profile["command"] = list(profile["command"])
    argv = profile.pop("command")
    profile["command"], profile["args"] = argv[0], argv[1:]
    return profile


def bridge_turn_runner(mapping: dict[str, Any], on_partial: Callable[[str], None] | None = noop):
    """An async `turn()` for one profile, running through `bridge.run_turn`."""
    from bridge import Turn, run_turn

    profile = bridge_profile(mapping)
    turn = Turn(TURN_MESSAGE)

    async def run(partial: Callable[[str], None] | None = on_partial) -> Any:
        return await run_turn(profile, turn, on_partial=partial)

    return run


def agentproc_turn_runner(mapping: dict[str, Any], on_partial: Callable[[str], None] | None = noop):
    from agentproc.runner import RunOptions, run

    profile = agentproc_profile(mapping)
    options = RunOptions(message=TURN_MESSAGE, profile_dir=AGENTS, on_partial=on_partial)

    def turn(partial: Callable[[str], None] | None = on_partial) -> Any:
        if partial is on_partial:
            return run(profile, options)
        return run(profile, RunOptions(message=TURN_MESSAGE, profile_dir=AGENTS, on_partial=partial))

    return turn


class Counter:
    """A partial callback for the untimed validation turn."""

    def __init__(self) -> None:
        self.count = 0
        self.last = ""

    def __call__(self, text: str) -> None:
        self.count += 1
        self.last = text


# --------------------------------------------------------------------------- 1. per-turn overhead

TURN_PROFILE = {"command": ["{{PROFILE_DIR}}/turn.sh"], "timeout_secs": 30}


def check_turn_bridge(result: Any, counter: Counter | None = None) -> None:
    expect(
        result.ok and result.reply == TURN_REPLY and result.session_id == TURN_SESSION and result.partials == 1,
        f"bridge turn result is wrong: {result!r}",
    )
    if counter is not None:
        expect(counter.count == 1 and counter.last == "working", "bridge did not deliver the partial")


def check_turn_agentproc(result: Any) -> None:
    expect(
        result.exit_code == 0 and result.reply == TURN_REPLY and result.session_id == TURN_SESSION,
        f"agentproc turn result is wrong: {result!r}",
    )


def turn_all(p: dict[str, Any]) -> dict[str, Any]:
    """The three contenders turn by turn in rotating order, so even a burst of load lasting a few
    milliseconds lands on all three; only the call is timed, the result is checked after.

    The floor is `subprocess.run` of the argv, environment and cwd the bridge would use. The two
    blocking contenders run inside the trio task (nothing else is scheduled, so they block nothing).
    """
    import trio

    from bridge import Turn, plan_launch

    bridge_run = bridge_turn_runner(TURN_PROFILE)
    agentproc_run = agentproc_turn_runner(TURN_PROFILE)
    plan = plan_launch(bridge_profile(TURN_PROFILE), Turn(TURN_MESSAGE), os.environ)
    argv, env, cwd = plan.argv, plan.env, plan.cwd
    run, DEVNULL = subprocess.run, subprocess.DEVNULL
    expected = f'AGENT_SESSION: {TURN_SESSION}\nAGENT_PARTIAL: "working"\n{TURN_REPLY}\n'.encode()

    def floor() -> subprocess.CompletedProcess[bytes]:
        return run(argv, env=env, cwd=cwd, stdin=DEVNULL, capture_output=True)

    async def main() -> dict[str, list[float]]:
        counter = Counter()
        check_turn_bridge(await bridge_run(counter), counter)
        done = floor()
        expect(done.returncode == 0 and done.stdout == expected, f"subprocess.run output is wrong: {done!r}")
        counter = Counter()
        check_turn_agentproc(agentproc_run(counter))
        expect(counter.count == 1 and counter.last == "working", "agentproc did not deliver the partial")
        for _ in range(p["warmup"]):
            await bridge_run()
            floor()
            agentproc_run()
        names = ["bridge", "subprocess.run", "agentproc"]
        times: dict[str, list[float]] = {name: [] for name in names}
        for i in range(p["turns"]):
            shift = (i + p["round"]) % len(names)
            for name in names[shift:] + names[:shift]:
                if name == "bridge":
                    began = clock_ns()
                    result = await bridge_run()
                    elapsed = clock_ns() - began
                    check_turn_bridge(result)
                elif name == "subprocess.run":
                    began = clock_ns()
                    done = floor()
                    elapsed = clock_ns() - began
                    expect(done.returncode == 0, "agent failed")
                else:
                    began = clock_ns()
                    result = agentproc_run()
                    elapsed = clock_ns() - began
                    check_turn_agentproc(result)
                times[name].append(elapsed / 1e6)
        return times

    return {f"{name}_ms": values for name, values in trio.run(main).items()}


# --------------------------------------------------------------------------- 2. throughput


def throughput_profile(p: dict[str, Any]) -> dict[str, Any]:
    return {"command": ["cat", p["file"]], "max_reply_chars": None, "timeout_secs": 600}


def throughput_bridge(p: dict[str, Any]) -> dict[str, Any]:
    import trio

    run = bridge_turn_runner(throughput_profile(p))

    async def main() -> list[int]:
        counter = Counter()
        result = await run(counter)
        expect(result.ok and not result.truncated, f"bridge throughput turn failed: {result.outcome}")
        expect(len(result.reply) == p["body_chars"], f"reply has {len(result.reply)} chars, expected {p['body_chars']}")
        expect(counter.count == result.partials == p["partials"], f"{counter.count} partials, expected {p['partials']}")
        expect(result.session_id == p["last_session"], "wrong session id")
        times = []
        for _ in range(p["turns"]):
            began = clock_ns()
            result = await run()
            times.append(clock_ns() - began)
            expect(result.ok and len(result.reply) == p["body_chars"], "bridge throughput turn failed")
        return times

    return {"mb_per_s": [p["bytes"] / 1e6 / (t / 1e9) for t in trio.run(main)]}


def throughput_agentproc(p: dict[str, Any]) -> dict[str, Any]:
    run = agentproc_turn_runner(throughput_profile(p))
    counter = Counter()
    result = run(counter)
    expect(result.exit_code == 0, "agentproc throughput turn failed")
    expect(len(result.reply) == p["body_chars"], f"reply has {len(result.reply)} chars, expected {p['body_chars']}")
    expect(counter.count == p["partials"], f"{counter.count} partials, expected {p['partials']}")
    expect(result.session_id == p["last_session"], "wrong session id")
    times = []
    for _ in range(p["turns"]):
        began = clock_ns()
        result = run()
        times.append(clock_ns() - began)
        expect(result.exit_code == 0 and len(result.reply) == p["body_chars"], "agentproc throughput turn failed")
    return {"mb_per_s": [p["bytes"] / 1e6 / (t / 1e9) for t in times]}


def throughput_python_floor(p: dict[str, Any]) -> dict[str, Any]:
    """Issue 12's Python floor, in memory (the file is read first, untimed): split each decoded 64 KiB chunk on
    newlines, one prefix check per line, an event object for every partial and session line, the JSON string
    payload decoded with `scanstring`, a callback per partial, body lines collected."""
    from json.decoder import scanstring

    from bridge.dialects import PartialEvent, SessionEvent

    with open(p["file"], "rb") as source:
        data = source.read()
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    counter = Counter()

    def loop(on_partial: Callable[[str], None]) -> tuple[str, str]:
        body: list[str] = []
        session: SessionEvent | None = None
        rest = b""
        for chunk in chunks:
            block = rest + chunk
            end = block.rfind(b"\n") + 1
            rest = block[end:]
            for line in block[:end].decode("utf-8", "replace").split("\n")[:-1]:
                if line.startswith("AGENT_"):
                    if line.startswith("AGENT_PARTIAL:"):
                        on_partial(PartialEvent(scanstring(line, 16)[0]).text)  # the input's `AGENT_PARTIAL: "…"`
                    elif line.startswith("AGENT_SESSION:"):
                        session = SessionEvent(line[14:].strip())
                else:
                    body.append(line)
        return "\n".join(body), session.session_id if session else ""

    reply, session_id = loop(counter)
    expect(
        len(reply) == p["body_chars"] and counter.count == p["partials"] and session_id == p["last_session"],
        "the Python floor loop decoded the input wrongly",
    )
    times = []
    for _ in range(p["turns"]):
        began = clock_ns()
        loop(noop)
        times.append(clock_ns() - began)
    return {"mb_per_s": [p["bytes"] / 1e6 / (t / 1e9) for t in times]}


def throughput_pipe(p: dict[str, Any]) -> dict[str, Any]:
    """Reference ceiling: `subprocess.run` of the same `cat`, output collected, nothing parsed."""
    argv = ["cat", p["file"]]
    times = []
    for i in range(p["turns"] + 1):
        began = clock_ns()
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True)
        elapsed = clock_ns() - began
        expect(done.returncode == 0 and len(done.stdout) == p["bytes"], "cat failed")
        if i:
            times.append(elapsed)
    return {"mb_per_s": [p["bytes"] / 1e6 / (t / 1e9) for t in times]}


# --------------------------------------------------------------------------- 3. concurrency (and 5b: RSS in flight)


def sleep_profile(p: dict[str, Any]) -> dict[str, Any]:
    return {"command": ["{{PROFILE_DIR}}/sleep.sh", str(p["seconds"])], "timeout_secs": 60}


def concurrency_bridge(p: dict[str, Any]) -> dict[str, Any]:
    import trio

    run = bridge_turn_runner(sleep_profile(p), on_partial=None)
    n = p["turns"]
    outcomes: list[str] = []

    async def one() -> None:
        try:
            result = await run()
            outcomes.append("ok" if result.ok and result.reply == "done" else str(result.outcome))
        except Exception as err:  # a failure to count, not to crash the sample
            outcomes.append(type(err).__name__)

    async def main() -> int:
        began = clock_ns()
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
        return clock_ns() - began

    wall = trio.run(main)
    return {
        "wall_s": [wall / 1e9],
        "failed": [n - outcomes.count("ok")],
        "peak_rss_mb": [peak_rss_mb()],
        "failures": sorted(set(o for o in outcomes if o != "ok")),
    }


def concurrency_popen(p: dict[str, Any]) -> dict[str, Any]:
    """The floor of any spawner: the same agents started by bare `subprocess.Popen`s, one after another (as
    fast as one thread can), then all waited for; nothing read or checked but the exit codes."""
    from bridge import Turn, plan_launch

    plan = plan_launch(bridge_profile(sleep_profile(p)), Turn(TURN_MESSAGE), os.environ)
    n = p["turns"]
    began = clock_ns()
    agents = [
        subprocess.Popen(
            plan.argv,
            env=plan.env,
            cwd=plan.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        for _ in range(n)
    ]
    codes = [agent.wait() for agent in agents]
    wall = clock_ns() - began
    for agent in agents:
        agent.stdout.close()  # type: ignore[union-attr]
        agent.stderr.close()  # type: ignore[union-attr]
    return {
        "wall_s": [wall / 1e9],
        "failed": [sum(1 for code in codes if code != 0)],
        "peak_rss_mb": [peak_rss_mb()],
        "failures": [],
    }


def concurrency_agentproc(p: dict[str, Any]) -> dict[str, Any]:
    """agentproc's `run` blocks, so a host runs turns concurrently on a thread each."""
    from concurrent.futures import ThreadPoolExecutor

    run = agentproc_turn_runner(sleep_profile(p), on_partial=None)
    n = p["turns"]

    def one(_: int) -> str:
        try:
            result = run()
            return "ok" if result.exit_code == 0 and result.reply == "done" else f"exit {result.exit_code}"
        except Exception as err:
            return type(err).__name__

    with ThreadPoolExecutor(max_workers=n) as pool:
        began = clock_ns()
        outcomes = list(pool.map(one, range(n)))
        wall = clock_ns() - began
    return {
        "wall_s": [wall / 1e9],
        "failed": [n - outcomes.count("ok")],
        "peak_rss_mb": [peak_rss_mb()],
        "failures": sorted(set(o for o in outcomes if o != "ok")),
    }


# --------------------------------------------------------------------------- 4. partial latency


def latency_profile(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "command": [sys.executable, "-S", "{{PROFILE_DIR}}/ticker.py", str(p["seconds"]), str(p["interval_ms"])],
        "max_reply_chars": None,
        "timeout_secs": 60,
    }


def latency_callback() -> tuple[list[int], Callable[[str], None]]:
    delays: list[int] = []
    now = time.monotonic_ns
    append = delays.append

    def on_partial(text: str) -> None:
        arrived = now()  # first: the parse below is the harness's cost, not the bridge's
        append(arrived - int(text))

    return delays, on_partial


def latency_result(delays: list[int], p: dict[str, Any]) -> dict[str, Any]:
    expected = int(p["seconds"] * 1000 / p["interval_ms"])
    expect(len(delays) >= expected * 0.9, f"only {len(delays)} partials arrived, expected ~{expected}")
    return {"delay_ms": [d / 1e6 for d in delays[p["skip"] :]]}


def latency_bridge(p: dict[str, Any]) -> dict[str, Any]:
    import trio

    delays, on_partial = latency_callback()
    run = bridge_turn_runner(latency_profile(p), on_partial)

    async def main() -> None:
        result = await run()
        expect(result.ok and result.reply == "ticked", f"ticker turn failed: {result!r}")

    trio.run(main)
    return latency_result(delays, p)


def latency_agentproc(p: dict[str, Any]) -> dict[str, Any]:
    delays, on_partial = latency_callback()
    result = agentproc_turn_runner(latency_profile(p), on_partial)()
    expect(result.exit_code == 0 and result.reply == "ticked", f"ticker turn failed: {result!r}")
    return latency_result(delays, p)


# --------------------------------------------------------------------------- 5. memory while 1 GB streams through


def memory_bridge(p: dict[str, Any]) -> dict[str, Any]:
    """Peak RSS of a process whose only work was one turn of `flood.sh MODE BYTES`."""
    import trio

    mapping: dict[str, Any] = {"command": ["{{PROFILE_DIR}}/flood.sh", p["mode"], str(p["bytes"])], "timeout_secs": 600}
    if not p["capped"]:
        mapping["max_reply_chars"] = None
    run = bridge_turn_runner(mapping)

    async def main() -> tuple[Any, int]:
        began = clock_ns()
        result = await run()
        return result, clock_ns() - began

    result, elapsed = trio.run(main)
    expect(result.ok, f"flood turn failed: {result.outcome} {result.error_reply}")
    if p["mode"] != "partials":
        expect(result.truncated or not p["capped"], "a capped reply was not truncated")
    return {
        "peak_rss_mb": [peak_rss_mb()],
        "seconds": [elapsed / 1e9],
        "reply_chars": [len(result.reply)],
        "partials": [result.partials],
    }


def memory_idle(p: dict[str, Any]) -> dict[str, Any]:
    """Reference: peak RSS after importing the bridge and running one per-turn agent turn."""
    import trio

    run = bridge_turn_runner(TURN_PROFILE)
    check_turn_bridge(trio.run(run))
    return {"peak_rss_mb": [peak_rss_mb()]}


# --------------------------------------------------------------------------- 6. CLI cold start


def cli_commands(p: dict[str, Any]) -> dict[str, tuple[list[tuple[list[str], dict[str, str] | None]], bytes]]:
    """Per contender: the commands run back to back for one start, and the stdout they must print."""
    bin_dir = os.path.dirname(sys.executable)
    echo = os.path.join(os.path.dirname(HERE), "sample_agents", "echo.sh")
    profile = os.path.join(os.path.dirname(HERE), "profiles", "echo.yaml")
    agent_env = {"PATH": os.environ.get("PATH", os.defpath), "AGENT_MESSAGE": TURN_MESSAGE}
    floor_env = dict(os.environ)
    return {
        "bridge": ([([os.path.join(bin_dir, "agent-bridge"), "run", profile, TURN_MESSAGE], None)], b"echo: hello\n"),
        "floor": (
            [([sys.executable, "-c", "import trio, pydantic, structlog, yaml"], floor_env), ([echo], agent_env)],
            b"echo: hello\n",
        ),
        # The only library a `run` needs: the floor of issue 12's absolute target.
        "trio": ([([sys.executable, "-c", "import trio"], floor_env), ([echo], agent_env)], b"echo: hello\n"),
        "agentproc": (
            [
                (
                    [
                        os.path.join(bin_dir, "agentproc"),
                        "--profile",
                        os.path.join(AGENTS, "agentproc-echo.yaml"),
                        "--prompt",
                        TURN_MESSAGE,
                        "--quiet",
                    ],
                    None,
                )
            ],
            b"echo: hello\n",
        ),
    }


def cli_all(p: dict[str, Any]) -> dict[str, Any]:
    """hyperfine-style: every contender once per repetition, in rotating order, stdout to /dev/null."""
    commands = cli_commands(p)
    names = list(commands)
    for name, (steps, expected) in commands.items():  # validate, and warm the page cache
        out = b"".join(
            subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=True).stdout
            for argv, env in steps
        )
        expect(out == expected, f"{name}: unexpected output {out!r}")
    times: dict[str, list[float]] = {name: [] for name in names}
    run, DEVNULL = subprocess.run, subprocess.DEVNULL
    for rep in range(p["reps"]):
        shift = (rep + p["round"]) % len(names)
        for name in names[shift:] + names[:shift]:
            steps = commands[name][0]
            began = clock_ns()
            for argv, env in steps:
                code = run(argv, env=env, stdin=DEVNULL, stdout=DEVNULL).returncode
                expect(code == 0, f"{name}: {argv[0]} exited {code}")
            times[name].append((clock_ns() - began) / 1e6)
    return {f"{name}_ms": values for name, values in times.items()}


# --------------------------------------------------------------------------- 7. a JSON dialect: codex-exec


def json_throughput(
    p: dict[str, Any], fields: dict[str, Any], what: str, *, reply: str, partials: int, activities: int, session_id: str
) -> dict[str, Any]:
    """MB/s of a JSON dialect's turn over the input file: one turn checked against what the input's writer says a
    correct run yields, then `turns` timed, the host taking each event and doing nothing with it."""
    import trio

    from bridge import Turn, run_turn
    from bridge.dialects import ActivityEvent

    profile = bridge_profile(fields)
    turn = Turn(TURN_MESSAGE)

    def ignore(event: Any) -> None:
        pass

    async def main() -> list[int]:
        partial_count, activity_count = Counter(), Counter()

        def count(event: Any) -> None:
            if isinstance(event, ActivityEvent):
                activity_count(event.activity)

        result = await run_turn(profile, turn, on_partial=partial_count, on_event=count)
        expect(result.ok and not result.truncated, f"{what} throughput turn failed: {result.outcome} {result.error}")
        expect(result.reply == reply, "the reply is not the one the input ends with")
        expect(
            partial_count.count == result.partials == partials, f"{partial_count.count} partials, expected {partials}"
        )
        expect(activity_count.count == activities, f"{activity_count.count} activities, expected {activities}")
        expect(result.session_id == session_id, f"wrong session id {result.session_id!r}")
        expect(
            (result.usage.input_tokens if result.usage is not None else None) == p["input_tokens"],
            f"wrong usage {result.usage!r}",
        )
        times = []
        for _ in range(p["turns"]):
            began = clock_ns()
            result = await run_turn(profile, turn, on_event=ignore)
            times.append(clock_ns() - began)
            expect(result.ok and result.reply == reply, f"{what} throughput turn failed")
        return times

    times = trio.run(main)
    return {"mb_per_s": [p["bytes"] / 1e6 / (t / 1e9) for t in times], "seconds": [t / 1e9 for t in times]}


def dialect_profile(protocol: str) -> Callable[[list[str]], dict[str, Any]]:
    """The bench's profile of a JSON agent run with `command`: reply cap off, a timeout no turn here reaches."""
    return lambda command: {"command": command, "protocol": protocol, "max_reply_chars": None, "timeout_secs": 600}


def codex_throughput(p: dict[str, Any]) -> dict[str, Any]:
    """`cat` of one long codex turn through the codex-exec dialect; the host takes every event (`on_event`)."""
    return json_throughput(
        p,
        dialect_profile("codex-exec")(["cat", p["file"]]),
        "codex",
        reply=p["last_message"],
        partials=p["agent_messages"],
        activities=p["activities"],
        session_id=p["thread_id"],
    )


def codex_latency(p: dict[str, Any]) -> dict[str, Any]:
    """From codex_like.py writing an agent_message line to the host's partial callback."""
    return ticker_latency(p, "codex_like.py", dialect_profile("codex-exec"), "codex", lambda reply: reply.isdigit())


def ticker_latency(
    p: dict[str, Any],
    agent: str,
    profile: Callable[[list[str]], dict[str, Any]],
    what: str,
    reply_ok: Callable[[str], bool],
    tick_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The partial delays of one turn of `agent tick [TICK_ARGS]` (a bench agent writing a partial whose text is
    CLOCK_MONOTONIC ns every `interval_ms`), run through `profile(command)`; `reply_ok` checks its reply."""
    import trio

    delays, on_partial = latency_callback()
    command = [
        sys.executable,
        "-S",
        "{{PROFILE_DIR}}/" + agent,
        "tick",
        *tick_args,
        str(p["seconds"]),
        str(p["interval_ms"]),
    ]
    run = bridge_turn_runner(profile(command), on_partial)

    async def main() -> None:
        result = await run()
        expect(
            result.ok and reply_ok(result.reply) and result.partials == len(delays),
            f"{what} ticker turn failed: {result!r}",
        )

    trio.run(main)
    return latency_result(delays, p)


# --------------------------------------------------------------------------- 9, 10. warm agents (ACP)

ACP_ECHO = {
    "command": [sys.executable, "-S", "{{PROFILE_DIR}}/acp_echo.py"],
    "protocol": "acp",
    "timeout_secs": 30,
    "kill_grace_secs": 2,
}
ACP_REPLY = "reply: " + TURN_MESSAGE


def warm_turn(p: dict[str, Any]) -> dict[str, Any]:
    """A turn on a live ACP agent against a cold one of the same agent (`run_turn`: start, initialize,
    session/new, the turn, goodbye and reaping), alternating turn by turn; only the call is timed."""
    import trio

    from bridge import Turn, run_turn
    from bridge.engine.warm_agents import WarmAgent

    profile = bridge_profile(ACP_ECHO)
    turn = Turn(TURN_MESSAGE)

    async def main() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {"warm_ms": [], "cold_ms": []}
        async with trio.open_nursery() as nursery:
            agent = WarmAgent(profile)
            await agent.start(nursery)
            for index in range(p["warmup"] + p["turns"]):
                began = clock_ns()
                warm = await agent.turn(turn)
                warm_ns = clock_ns() - began
                began = clock_ns()
                cold = await run_turn(profile, turn)
                cold_ns = clock_ns() - began
                expect(
                    warm.ok and warm.reply == ACP_REPLY and warm.session_id == agent.session_id,
                    f"warm ACP turn is wrong: {warm!r}",
                )
                expect(
                    cold.ok and cold.reply == ACP_REPLY and cold.session_id != agent.session_id,
                    f"cold ACP turn is wrong: {cold!r}",
                )
                if index >= p["warmup"]:
                    times["warm_ms"].append(warm_ns / 1e6)
                    times["cold_ms"].append(cold_ns / 1e6)
            await agent.close()
        return times

    return trio.run(main)


def warm_pool(p: dict[str, Any]) -> dict[str, Any]:
    """`conversations` ACP conversations held warm in one host; every round, each takes a turn, all at once.
    Latency is submit → result of every turn after the first round (which starts the agents); peak RSS is
    the bridge's (the agents are processes of their own)."""
    import tempfile

    import trio

    import bridge

    count = p["conversations"]
    with tempfile.TemporaryDirectory() as directory:
        profiles = os.path.join(directory, "profiles")
        os.mkdir(profiles)
        with open(os.path.join(profiles, "acp-echo.yaml"), "w") as file:
            json.dump(
                {
                    **ACP_ECHO,
                    "command": [sys.executable, "-S", os.path.join(AGENTS, "acp_echo.py")],
                    "max_warm": count,
                    "keep_warm_secs": 600,
                },
                file,
            )  # JSON is YAML
        turn = bridge.Turn(TURN_MESSAGE)

        async def main() -> list[float]:
            async with bridge.open_host(
                profiles, state=os.path.join(directory, "sessions.sqlite3"), max_concurrent=count
            ) as host:
                sessions: dict[str, str] = {}
                delays: list[float] = []

                async def one(conversation: str, timed: bool) -> None:
                    began = clock_ns()
                    result = await host.submit("acp-echo", conversation, turn)
                    if timed:
                        delays.append((clock_ns() - began) / 1e6)
                    expect(result.ok and result.reply == ACP_REPLY, f"pooled ACP turn is wrong: {result!r}")
                    expect(
                        sessions.setdefault(conversation, result.session_id) == result.session_id,
                        "a conversation's agent was replaced while held warm",
                    )

                for round_no in range(1 + p["rounds"]):
                    async with trio.open_nursery() as nursery:
                        for index in range(count):
                            nursery.start_soon(one, f"chat-{index}", round_no > 0)
                expect(host.stats().warm == count, f"{host.stats().warm} agents warm, expected {count}")
                return delays

        delays = trio.run(main)
    return {"latency_ms": delays, "peak_rss_mb": [peak_rss_mb()]}


# --------------------------------------------------------------------------- 11-14. scale-out through PostgreSQL

POSTGRES_ENV = "BENCH_POSTGRES"  # run.py's throwaway cluster: the DSN of its `postgres` database
ECHO_AGENT = os.path.join(os.path.dirname(HERE), "sample_agents", "echo.sh")


def die_with_parent() -> None:
    """In a fleet process before exec: it ends when the sample's process does, however (run.py kills on timeout)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def admin_dsn() -> str:
    dsn = os.environ.get(POSTGRES_ENV)
    expect(dsn is not None, f"no PostgreSQL cluster: run.py sets {POSTGRES_ENV} for the fleet cases")
    return str(dsn)


def database_dsn(admin: str, name: str) -> str:
    return admin.rsplit("/", 1)[0] + "/" + name


class JsonLines:
    """A JSON Lines client of `agent-bridge serve` (a gateway, or one process running the turns itself).

    Reads with a deadline, so a turn that never ends fails the sample instead of hanging the run.
    """

    def __init__(self, argv: list[str]) -> None:
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr, preexec_fn=die_with_parent
        )
        assert self.process.stdout is not None
        self._in, self._fd = self.process.stdin, self.process.stdout.fileno()
        self._buffer = bytearray()

    def send(self, request: dict[str, Any]) -> None:
        assert self._in is not None
        self._in.write(json.dumps(request).encode() + b"\n")
        self._in.flush()

    def response(self, deadline: float) -> dict[str, Any]:
        import select

        while (end := self._buffer.find(b"\n")) < 0:
            ready, _, _ = select.select([self._fd], [], [], max(0.0, deadline - time.monotonic()))
            expect(bool(ready), "serve sent nothing more before the deadline: a turn never ended")
            chunk = os.read(self._fd, 65536)
            expect(bool(chunk), f"serve closed its output; exit {self.process.poll()}")
            self._buffer += chunk
        response: dict[str, Any] = json.loads(self._buffer[:end])
        del self._buffer[: end + 1]
        expect(response["type"] != "error", f"serve answered an error: {response}")
        return response

    def until_result(self, request_id: str, within: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            response = self.response(deadline)
            if response["type"] == "result" and response["id"] == request_id:
                return response

    def results(self, count: int, within: float = 300.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + within
        found = []
        while len(found) < count:
            response = self.response(deadline)
            if response["type"] == "result":
                found.append(response)
        return found

    def close(self) -> int:
        assert self._in is not None
        self._in.close()
        return self.process.wait(timeout=60)


def echo_turn(request_id: str, conversation: str) -> dict[str, Any]:
    return {"type": "turn", "id": request_id, "profile": "noop", "conversation": conversation, "message": request_id}


def check_echo(result: dict[str, Any]) -> None:
    expect(result["outcome"] == "ok" and result["reply"] == f"echo: {result['id']}", f"wrong result: {result}")


class Fleet:
    """`workers` × `agent-bridge worker` and one `agent-bridge serve --postgres` on a database of their own,
    or (`workers` 0) one plain `agent-bridge serve --profiles`: real processes, as deployed.

    `counters()` reads, from the server, what the fleet's database did: commits (pg_stat_database) and every
    top-level statement's calls (pg_stat_statements).
    """

    def __init__(self, p: dict[str, Any], directory: str) -> None:
        import psycopg

        self.workers: list[subprocess.Popen[bytes]] = []
        profiles = os.path.join(directory, "profiles")
        os.mkdir(profiles)
        with open(os.path.join(profiles, "noop.yaml"), "w") as file:
            json.dump({"command": [ECHO_AGENT], "timeout_secs": 30}, file)  # JSON is YAML
        serve = [sys.executable, "-m", "bridge", "serve", "--max-queued", "100000"]
        self.database = ""
        if not p["workers"]:
            self.client = JsonLines([*serve, "--profiles", profiles, "--state", os.path.join(directory, "s.sqlite3")])
            return
        self.admin = psycopg.connect(admin_dsn(), autocommit=True)
        self.database = f"bench_{os.getpid()}"
        self.admin.execute(f"CREATE DATABASE {self.database}")
        if not p.get("durable"):
            # Commits do not wait for the disk (the WAL writer flushes within 200 ms): the queue's own cost.
            self.admin.execute(f"ALTER DATABASE {self.database} SET synchronous_commit = off")
        dsn = database_dsn(admin_dsn(), self.database)
        for index in range(p["workers"]):
            self.workers.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bridge",
                        "worker",
                        "--postgres",
                        dsn,
                        "--profiles",
                        profiles,
                        "--name",
                        f"w{index}",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=sys.stderr,
                    stderr=sys.stderr,
                    preexec_fn=die_with_parent,
                )
            )
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if conn.execute("SELECT count(*) FROM bridge_workers").fetchone()[0] == p["workers"]:
                        break
                except psycopg.errors.UndefinedTable:
                    pass
                expect(time.monotonic() < deadline, "the workers did not register within 30 s")
                time.sleep(0.05)
        self.client = JsonLines([*serve, "--postgres", dsn])

    def counters(self) -> dict[str, Any]:
        commits, rollbacks = self.admin.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s", (self.database,)
        ).fetchone()
        calls = {
            str(queryid): (query, calls)
            for queryid, query, calls in self.admin.execute(
                "SELECT queryid, query, calls FROM pg_stat_statements WHERE toplevel "
                "AND dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
                (self.database,),
            ).fetchall()
        }
        return {"commits": commits, "rollbacks": rollbacks, "calls": calls}

    def stop(self) -> None:
        """The gateway (EOF) and then every worker (SIGTERM: a drain) end; their backends publish their counters."""
        code = self.client.close()
        expect(code == 0, f"serve exited {code}")
        for worker in self.workers:
            worker.terminate()
        for worker in self.workers:
            code = worker.wait(timeout=60)
            expect(code == 0, f"a worker exited {code}")
        self.workers = []

    def remove(self) -> None:
        for worker in self.workers:
            worker.kill()
            worker.wait()
        if self.client.process.poll() is None:
            self.client.process.kill()
            self.client.process.wait()
        if self.database:
            self.admin.execute(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
            self.admin.close()


def fleet_work(before: dict[str, Any], after: dict[str, Any], turns: int) -> dict[str, Any]:
    """PostgreSQL's work between two readings, per turn, and the statements that made it (most calls first)."""
    calls = {}
    for queryid, (query, count) in after["calls"].items():
        delta = count - before["calls"].get(queryid, (query, 0))[1]
        if delta:
            calls[" ".join(query.split())] = calls.get(" ".join(query.split()), 0) + delta
    return {
        "statements_per_turn": [sum(calls.values()) / turns],
        "commits_per_turn": [(after["commits"] - before["commits"]) / turns],
        "rollbacks_per_turn": [(after["rollbacks"] - before["rollbacks"]) / turns],
        "statements": dict(sorted(((q, round(n / turns, 3)) for q, n in calls.items()), key=lambda x: -x[1])),
    }


def run_fleet(p: dict[str, Any], timed: Callable[[JsonLines], dict[str, Any]]) -> dict[str, Any]:
    """Start the fleet, warm it up, run `timed`, and (with `count`) read what PostgreSQL did meanwhile."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        fleet = Fleet(p, directory)
        try:
            for index in range(p["warmup"]):
                fleet.client.send(echo_turn(f"warm-{index}", "warm"))
                check_echo(fleet.client.until_result(f"warm-{index}"))
            counting = p["workers"] and p.get("count")
            if counting:
                time.sleep(p["settle_secs"])
                before = fleet.counters()
            values = timed(fleet.client)
            fleet.stop()
            if counting:
                values.update(fleet_work(before, fleet.counters(), p["turns"]))
        finally:
            fleet.remove()
    return values


def fleet_latency(p: dict[str, Any]) -> dict[str, Any]:
    """Sequential turns of one conversation, each timed by the client from sending it to reading its result."""

    def timed(client: JsonLines) -> dict[str, Any]:
        delays = []
        for index in range(p["turns"]):
            request_id = f"t{index}"
            began = clock_ns()
            client.send(echo_turn(request_id, "chat"))
            result = client.until_result(request_id)
            delays.append((clock_ns() - began) / 1e6)
            check_echo(result)
        return {"latency_ms": delays}

    return run_fleet(p, timed)


def fleet_burst(p: dict[str, Any]) -> dict[str, Any]:
    """`turns` turns of `conversations` conversations sent at once; wall time until the last result."""
    import threading

    def timed(client: JsonLines) -> dict[str, Any]:
        requests = [echo_turn(f"t{index}", f"c{index % p['conversations']}") for index in range(p["turns"])]
        writer = threading.Thread(target=lambda: [client.send(request) for request in requests])
        began = clock_ns()
        writer.start()
        results = client.results(len(requests))
        wall = (clock_ns() - began) / 1e9
        writer.join()
        for result in results:
            check_echo(result)
        expect(len({r["id"] for r in results}) == len(requests), "a turn's result came twice")
        return {"turns_per_s": [len(requests) / wall], "wall_s": [wall]}

    return run_fleet(p, timed)


def pg_statement(p: dict[str, Any]) -> dict[str, Any]:
    """What a statement costs a trio program, turn by turn in rotating order (as the per-turn case):
    `SELECT 1` on psycopg's blocking API, the same through `trio.to_thread.run_sync`, the thread hop alone,
    and one transaction (BEGIN, SELECT 1, COMMIT) blocking and through the bridge's `Database.run`."""
    import psycopg
    import trio

    from bridge.host.postgres.db import Database

    dsn = admin_dsn()
    conn = psycopg.connect(dsn, autocommit=True)
    txn_conn = psycopg.connect(dsn)
    db = Database(dsn, size=1)

    def statement() -> Any:
        return conn.execute("SELECT 1").fetchone()

    def transaction(c: Any = txn_conn) -> Any:
        with c.transaction():
            return c.execute("SELECT 1").fetchone()

    def nothing() -> None:
        return None

    run_sync = trio.to_thread.run_sync

    async def main() -> dict[str, list[float]]:
        calls: dict[str, Callable[[], Any]] = {
            "blocking": statement,
            "to_thread": lambda: run_sync(statement),
            "hop": lambda: run_sync(nothing),
            "blocking_txn": transaction,
            "database_run": lambda: db.run(lambda c: c.execute("SELECT 1").fetchone()),
        }
        names = list(calls)
        times: dict[str, list[float]] = {name: [] for name in names}
        for index in range(p["warmup"] + p["calls"]):
            shift = (index + p["round"]) % len(names)
            for name in names[shift:] + names[:shift]:
                call = calls[name]
                began = clock_ns()
                value = call()
                if not isinstance(value, tuple) and value is not None:
                    value = await value
                elapsed = clock_ns() - began
                expect(value is None if name == "hop" else value == (1,), f"{name} returned {value!r}")
                if index >= p["warmup"]:
                    times[name].append(elapsed / 1e3)
        return times

    try:
        times = trio.run(main)
    finally:
        db.close()
        conn.close()
        txn_conn.close()
    return {f"{name}_us": values for name, values in times.items()}


# --------------------------------------------------------------------------- 15, 16. wire 0.4 (agentproc-0.4)

# agentproc 0.20, the wire-0.4 peer, lives in a venv of its own (bench/agentproc020.py says why).
AP020_PYTHON = os.path.join(HERE, ".venv-ap020", "bin", "python")


def wire04_latency(p: dict[str, Any]) -> dict[str, Any]:
    """From dialect_like.py writing an output partial (after a thinking one) to the host's partial callback."""
    return dialect_latency({**p, "protocol": "agentproc-0.4"})


# --------------------------------------------------------------------------- 17, 18. every JSON dialect


def dialect_throughput(p: dict[str, Any]) -> dict[str, Any]:
    """`cat` of the turn dialect_like.py wrote in its protocol's shapes; the host takes every event. What a
    correct run yields is read from the file's meta beside it (a reply of the whole stream is too long for argv)."""
    with open(p["file"] + ".json") as meta:
        p = {**json.load(meta), **p}
    protocol = p["protocol"]
    return json_throughput(
        p,
        dialect_profile(protocol)(["cat", p["file"]]),
        protocol,
        reply=p["reply"],
        partials=p["partials"],
        activities=p["activities"],
        session_id=p["session_id"],
    )


def dialect_latency(p: dict[str, Any]) -> dict[str, Any]:
    """From a bench agent writing a text step in `p["protocol"]`'s shapes to the host's partial callback:
    dialect_like.py (after a thinking step, where the protocol has them), or for a warm protocol warm_ticker.py, in a
    turn that starts it, sets its session up and prompts it."""
    from bridge.dialects import PROTOCOLS

    protocol = p["protocol"]
    agent = "warm_ticker.py" if PROTOCOLS[protocol].warm else "dialect_like.py"
    return ticker_latency(p, agent, dialect_profile(protocol), protocol, lambda reply: reply != "", (protocol,))


def agentproc020(contender: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A sample of agentproc 0.20's runner: bench/agentproc020.py in its own venv, its JSON relayed."""

    def sample(p: dict[str, Any]) -> dict[str, Any]:
        expect(os.path.exists(AP020_PYTHON), f"no {AP020_PYTHON}: run `make bench`, which builds it")
        done = subprocess.run(
            [AP020_PYTHON, os.path.join(HERE, "agentproc020.py"), contender, json.dumps(p)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=1200,
        )
        lines = done.stdout.strip().splitlines()
        values: dict[str, Any] = json.loads(lines[-1]) if lines else {"invalid": f"exit {done.returncode}"}
        expect("invalid" not in values, str(values.get("invalid")))
        return values

    return sample


# --------------------------------------------------------------------------- 19-22. Claude Code and Codex, warm


def interactive(module: str, sample: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A sample kept in a module of its own (bench/claude_sdk.py, bench/codex_app_server.py, bench/network.py, chat.py;
    each runnable alone too), imported when run."""

    def run(p: dict[str, Any]) -> dict[str, Any]:
        import importlib

        values: dict[str, Any] = getattr(importlib.import_module(module), sample)(p)
        return values

    return run


# --------------------------------------------------------------------------- 23, 24. attachments fetched (issue 22)


def attachment_profile(command: list[str], cwd: str, total: int) -> Any:
    """A profile of `command` in `cwd` whose attachments are fetched (an agentproc-0.1 agent's are passed through by
    default), may come from loopback (the bench's file server) and add up to `total` bytes."""
    limits = {
        "fetch": True,
        "allow_hosts": ["127.0.0.1"],
        "max_file_bytes": total,
        "max_turn_bytes": total,
        "timeout_secs": 600,
    }
    return bridge_profile({"command": command, "cwd": cwd, "timeout_secs": 600, "attachments": limits})


def fetch_time(p: dict[str, Any]) -> dict[str, Any]:
    """What fetching one file from loopback adds to a turn, against `curl` fetching it from the same server into a
    file: a turn of agents/turn.sh with the file attached, the same turn without, and curl, in rotating order call
    by call; only the call is timed. An untimed turn first has an agent compare its fetched copy with the original."""
    import tempfile

    import trio

    from bridge import Attachment, Turn, run_turn

    sys.path.insert(0, AGENTS)
    from file_server import serving

    with tempfile.TemporaryDirectory() as cwd, serving(p["file"]) as base:
        url = f"{base}/{os.path.basename(p['file'])}"
        attached = Turn(TURN_MESSAGE, attachments=(Attachment("file", url, "data.bin"),))
        plain = Turn(TURN_MESSAGE)
        profile = attachment_profile(list(TURN_PROFILE["command"]), cwd, p["bytes"])
        compare = attachment_profile(
            ["sh", "-c", 'cmp "$AGENT_FILE_PATH" "$1" && echo same', "sh", p["file"]], cwd, p["bytes"]
        )
        copy = os.path.join(cwd, "curl.bin")
        # curl's --write-out time_total is its transfer alone, from resolving to the last byte: for scale.
        curl = ["curl", "--silent", "--show-error", "--fail", "--output", copy, "--write-out", "%{time_total}", url]
        run, DEVNULL, PIPE = subprocess.run, subprocess.DEVNULL, subprocess.PIPE

        async def main() -> dict[str, list[float]]:
            checked = await run_turn(compare, attached)
            expect(checked.ok and checked.reply == "same", f"the agent did not find the file fetched: {checked!r}")
            turns = os.path.join(cwd, ".agent-bridge", "turns")
            expect(not os.path.isdir(turns) or not os.listdir(turns), "the turn's directory was left behind")
            expect(run(curl, stdin=DEVNULL, stdout=DEVNULL).returncode == 0, "curl failed")
            expect(run(["cmp", "-s", copy, p["file"]]).returncode == 0, "curl's copy differs from the file")
            names = ["attached", "plain", "curl"]
            times: dict[str, list[float]] = {name: [] for name in [*names, "curl_transfer"]}
            for index in range(p["warmup"] + p["reps"]):
                shift = (index + p["round"]) % len(names)
                for name in names[shift:] + names[:shift]:
                    if name == "curl":
                        os.unlink(copy)  # curl writes a new file, as the bridge does
                        began = clock_ns()
                        done = run(curl, stdin=DEVNULL, stdout=PIPE)
                        elapsed = clock_ns() - began
                        expect(done.returncode == 0, f"curl exited {done.returncode}")
                        if index >= p["warmup"]:
                            times["curl_transfer"].append(float(done.stdout) * 1e3)
                    else:
                        began = clock_ns()
                        result = await run_turn(profile, attached if name == "attached" else plain)
                        elapsed = clock_ns() - began
                        check_turn_bridge(result)
                    if index >= p["warmup"]:
                        times[name].append(elapsed / 1e6)
            return times

        times = trio.run(main)
    return {f"{name}_ms": values for name, values in times.items()}


def fetch_memory(p: dict[str, Any]) -> dict[str, Any]:
    """Peak RSS of a process whose only work was one turn with `count` attachments of the file, fetched at once
    from loopback; its agent checks that every one arrived whole (their count and total size)."""
    import tempfile

    import trio

    from bridge import Attachment, Turn, run_turn

    sys.path.insert(0, AGENTS)
    from file_server import serving

    count, total = p["count"], p["count"] * p["bytes"]
    script = (
        "import json, os; files = json.loads(os.environ['AGENT_ATTACHMENTS']); "
        "print(len(files), sum(os.path.getsize(f['path']) for f in files))"
    )
    with tempfile.TemporaryDirectory() as cwd, serving(p["file"]) as base:
        turn = Turn(
            TURN_MESSAGE,
            attachments=tuple(Attachment("file", f"{base}/{index}", f"part-{index}.bin") for index in range(count)),
        )
        profile = attachment_profile([sys.executable, "-S", "-c", script], cwd, total)
        before = peak_rss_mb()

        async def main() -> tuple[Any, int]:
            began = clock_ns()
            result = await run_turn(profile, turn)
            return result, clock_ns() - began

        result, elapsed = trio.run(main)
    expect(result.ok and result.reply == f"{count} {total}", f"the attachments did not all arrive: {result!r}")
    return {"peak_rss_mb": [peak_rss_mb()], "before_mb": [before], "seconds": [elapsed / 1e9]}


# --------------------------------------------------------------------------- issue 24: sandbox and limits

# rlimits only (no cgroup): what every limited turn pays on top of its agent's spawn.
RLIMITS = {"cpu_secs": 600, "file_size_mb": 1024, "open_files": 1024}


def confined_all(p: dict[str, Any]) -> dict[str, Any]:
    """Row 1's agent turn by turn, in rotating order: a plain bridge turn, one with limits by rlimit, and, where the
    bridge has `sandbox:` and bwrap is installed, one with `sandbox: {}` beside `subprocess.run` of the argv that
    sandboxed turn runs (bwrap and the agent, the bridge's environment and cwd): bwrap running the agent alone."""
    import shutil

    import trio

    from bridge import Turn, plan_launch
    from bridge.profile.fields import FIELD_NAMES

    runners = {
        "bridge": bridge_turn_runner(TURN_PROFILE),
        "rlimits": bridge_turn_runner({**TURN_PROFILE, "limits": RLIMITS}),
    }
    floor: Callable[[], subprocess.CompletedProcess[bytes]] | None = None
    if "sandbox" in FIELD_NAMES and shutil.which("bwrap"):
        sandboxed = {**TURN_PROFILE, "sandbox": {}}
        runners["sandboxed"] = bridge_turn_runner(sandboxed)
        plan = plan_launch(bridge_profile(sandboxed), Turn(TURN_MESSAGE), os.environ)
        argv, env, cwd = plan.argv, plan.env, plan.cwd
        expect(os.path.basename(argv[0]) == "bwrap", f"a sandboxed turn does not run bwrap: {argv!r}")

        def floor() -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True)

    async def main() -> dict[str, list[float]]:
        for run in runners.values():
            check_turn_bridge(await run())
        if floor is not None:
            done = floor()
            expect(done.returncode == 0 and TURN_REPLY.encode() in done.stdout, f"bwrap alone failed: {done!r}")
        for _ in range(p["warmup"]):
            for run in runners.values():
                await run()
            if floor is not None:
                floor()
        names = [*runners, *(["bwrap"] if floor is not None else [])]
        times: dict[str, list[float]] = {name: [] for name in names}
        for i in range(p["turns"]):
            shift = (i + p["round"]) % len(names)
            for name in names[shift:] + names[:shift]:
                began = clock_ns()
                if name == "bwrap":
                    assert floor is not None
                    done = floor()
                    elapsed = clock_ns() - began
                    expect(done.returncode == 0, "bwrap alone failed")
                else:
                    result = await runners[name]()
                    elapsed = clock_ns() - began
                    check_turn_bridge(result)
                times[name].append(elapsed / 1e6)
        return times

    return {f"{name}_ms": values for name, values in trio.run(main).items()}


# --------------------------------------------------------------------------- entry point

WORKERS: dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("turn", "all"): turn_all,
    ("throughput", "bridge"): throughput_bridge,
    ("throughput", "agentproc"): throughput_agentproc,
    ("throughput", "pipe only"): throughput_pipe,
    ("throughput", "python floor"): throughput_python_floor,
    ("concurrency", "bridge"): concurrency_bridge,
    ("concurrency", "agentproc"): concurrency_agentproc,
    ("concurrency", "popen"): concurrency_popen,
    ("latency", "bridge"): latency_bridge,
    ("latency", "agentproc"): latency_agentproc,
    ("memory", "bridge"): memory_bridge,
    ("memory", "idle"): memory_idle,
    ("cli", "all"): cli_all,
    ("codex", "throughput"): codex_throughput,
    ("codex", "pipe only"): throughput_pipe,
    ("codex", "latency"): codex_latency,
    ("warm", "turn"): warm_turn,
    ("warm", "pool"): warm_pool,
    ("fleet", "latency"): fleet_latency,
    ("fleet-burst", "burst"): fleet_burst,
    ("pg-statement", "all"): pg_statement,
    ("wire04", "bridge"): dialect_throughput,
    ("wire04", "agentproc 0.20"): agentproc020("throughput"),
    ("wire04", "pipe only"): throughput_pipe,
    ("wire04", "latency"): wire04_latency,
    ("wire04", "latency, agentproc 0.20"): agentproc020("latency"),
    ("dialects", "throughput"): dialect_throughput,
    ("dialects", "latency"): dialect_latency,
    ("dialects", "agentproc 0.20"): agentproc020("throughput"),
    ("dialects", "agentproc 0.20 hub"): agentproc020("hub"),
    ("claude-sdk", "turn"): interactive("claude_sdk", "turn"),
    ("claude-sdk", "latency"): interactive("claude_sdk", "latency"),
    ("codex-app-server", "turn"): interactive("codex_app_server", "turn"),
    ("codex-app-server", "latency"): interactive("codex_app_server", "latency"),
    ("attachments", "time"): fetch_time,
    ("attachments", "memory"): fetch_memory,
    ("network", "turn"): interactive("network", "turn"),
    ("network", "latency"): interactive("network", "latency"),
    ("network", "idle"): interactive("network", "idle"),
    ("acp", "turn"): interactive("acp", "turn"),
    ("mcp", "turn"): interactive("mcp_door", "turn"),
    ("chat", "turn"): interactive("chat", "turn"),
    ("chat", "burst"): interactive("chat", "burst"),
    ("chat", "preview"): interactive("chat", "preview"),
    ("confined", "all"): confined_all,
}


def main(argv: list[str]) -> int:
    case, contender, params = argv[1], argv[2], json.loads(argv[3])
    try:
        values = WORKERS[case, contender](params)
    except Invalid as err:
        print(json.dumps({"invalid": str(err)}))
        return 3
    print(json.dumps(values))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
