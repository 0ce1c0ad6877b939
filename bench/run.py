"""Run the benchmarks: issue 4's six, the JSON dialects (codex-exec, wire 0.4), warm agents (issue 10), the
scale-out through PostgreSQL (issue 11), the real Claude Code and codex kept warm (issue 21), attachments fetched
(issue 22), the network door (issue 23) and the chat side (issue 36); report medians, ratios and targets.

    make bench            # full run, ~15 minutes: rewrites bench/RESULTS.md, bench/results*.png, docs/performance.md's table
    make bench QUICK=1    # smoke run with small sizes; writes only to bench/results/
    bench/.venv/bin/python bench/run.py --help

Every sample runs in a fresh worker process (see worker.py). Rounds are
interleaved: each round takes one sample of every contender of every case,
the contenders' order rotating from round to round, so drift of a shared
machine (other jobs, thermal, page cache) lands on all contenders alike.
Raw numbers and the machine's description go to bench/results/ (not
committed); the summary table and the plot are committed under bench/.
The scale-out cases start one throwaway PostgreSQL cluster for the run
(tools/pgcluster.py; PostgreSQL's server must be installed, as for the
tests), and each of their samples works in a database of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
WORKER = os.path.join(HERE, "worker.py")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "agents"))

import dialect_like  # noqa: E402  (bench/ and bench/agents/ are directories of scripts, not packages)
import report  # noqa: E402

# The fleet cases' cluster has PostgreSQL's own defaults (fsync, full-page writes, synchronous commits), plus
# pg_stat_statements; each sample's database turns synchronous_commit off but for the "durable commits" variant.
POSTGRES_CASES = {"fleet", "fleet-burst", "pg-statement"}
# The JSON dialects of agents kept warm: rows 18 measure their partial latency (agents/warm_ticker.py).
WARM_JSON_PROTOCOLS = ("acp", "aionrs", "ante")
POSTGRES_SETTINGS = {
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "shared_buffers": "128MB",
    "shared_preload_libraries": "pg_stat_statements",
}
POSTGRES_ENV = "BENCH_POSTGRES"  # how workers find the cluster (worker.py reads it)
# PostgreSQL 15 keeps a backend's counters up to 10 s (PGSTAT_IDLE_INTERVAL) before pg_stat_database shows them.
STATS_SETTLE_SECS = 10.5


@dataclass
class Variant:
    """One bar of a case: a worker (case, contender) and its parameters."""

    label: str
    contender: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    name: str
    variants: list[Variant]
    rounds: int


def build_plan(
    quick: bool,
    throughput_file: dict[str, Any],
    codex_file: dict[str, Any],
    wire04_file: dict[str, Any] | None = None,
    dialect_files: dict[str, dict[str, Any]] | None = None,
    attachment_files: dict[str, dict[str, Any]] | None = None,
) -> list[Case]:
    q = quick
    turn = {"turns": 20 if q else 60, "warmup": 3 if q else 5}
    tput = {**throughput_file, "turns": 1 if q else 2}
    codex_tput = {**codex_file, "turns": 1 if q else 2}
    wire04_tput = {**(wire04_file or {}), "turns": 1 if q else 2}
    conc = {"turns": 300, "seconds": 1}
    lat = {"seconds": 1 if q else 4, "interval_ms": 5, "skip": 10}
    dialect_lat = {**lat, "seconds": 1 if q else 2}
    flood_mib = 64 if q else 1024
    # QUICK does not wait for PostgreSQL to publish its counters: its commits per turn are only roughly right.
    settle = 0 if q else STATS_SETTLE_SECS
    fleet = {"turns": 50 if q else 300, "warmup": 5 if q else 20, "settle_secs": settle}
    burst = {"turns": 300, "conversations": 100, "warmup": 5 if q else 20, "settle_secs": settle}
    size = f"{flood_mib} MiB" if flood_mib < 1024 else f"{flood_mib // 1024} GiB"
    # Issue 22's: attachments fetched from a file server on loopback (agents/file_server.py), a process of its own;
    # the sizes are the issue's, QUICK too (a few seconds).
    attachments = (
        [
            Case(
                "attachments",
                [
                    Variant("time", "time", {**attachment_files["10 MB"], "reps": 5 if q else 20, "warmup": 2}),
                    Variant("memory", "memory", {**attachment_files["50 MB"], "count": 10}),
                ],
                2 if q else 3,
            )
        ]
        if attachment_files
        else []
    )
    memory = [Variant("idle (one turn)", "idle")] + [
        Variant(f"{size} {what}", "bridge", {"mode": mode, "capped": capped, "bytes": flood_mib * 1024 * 1024})
        for what, mode, capped in (
            ("body, capped", "body", True),
            ("body, uncapped", "body", False),
            ("partials, uncapped", "partials", False),
            ("one line, uncapped", "oneline", False),
        )
    ]
    return [
        Case("turn", [Variant("all", "all", turn)], 2 if q else 6),
        Case(
            "throughput",
            [Variant(c, c, tput) for c in ("bridge", "agentproc", "pipe only", "python floor")],
            2 if q else 5,
        ),
        Case("concurrency", [Variant(c, c, conc) for c in ("bridge", "agentproc", "popen")], 2 if q else 5),
        Case("latency", [Variant(c, c, lat) for c in ("bridge", "agentproc")], 2 if q else 4),
        Case("memory", memory, 1 if q else 2),
        Case("cli", [Variant("all", "all", {"reps": 3 if q else 6})], 2 if q else 6),
        Case(
            "codex",
            [
                Variant("throughput", "throughput", codex_tput),
                Variant("pipe only", "pipe only", codex_tput),
                Variant("latency", "latency", lat),
            ],
            2 if q else 5,
        ),
        Case(
            "warm",
            [
                Variant("turn", "turn", {"turns": 10 if q else 30, "warmup": 2}),
                Variant("pool", "pool", {"conversations": 100, "rounds": 3 if q else 10}),
            ],
            2 if q else 4,
        ),
        Case(
            "fleet",
            [
                Variant("gateway + worker", "latency", {**fleet, "workers": 1, "count": True}),
                Variant("durable commits", "latency", {**fleet, "workers": 1, "durable": True}),
                Variant("serve alone", "latency", {**fleet, "workers": 0}),
            ],
            2 if q else 3,
        ),
        Case(
            "fleet-burst",
            [Variant(f"{n} worker{'s' * (n > 1)}", "burst", {**burst, "workers": n, "count": True}) for n in (1, 2, 3)]
            + [Variant("serve alone", "burst", {**burst, "workers": 0})],
            2 if q else 3,
        ),
        Case(
            "pg-statement",
            [Variant("all", "all", {"calls": 500 if q else 3000, "warmup": 100 if q else 300})],
            2 if q else 3,
        ),
        Case(
            "wire04",
            [Variant(c, c, wire04_tput) for c in ("bridge", "agentproc 0.20", "pipe only")]
            + [Variant(c, c, lat) for c in ("latency", "latency, agentproc 0.20")],
            2 if q else 5,
        ),
        Case(
            "dialects",
            [Variant("agentproc 0.20", "agentproc 0.20", wire04_tput)]
            + [
                Variant(protocol, "throughput", {"file": meta["file"], "turns": 1 if q else 2})
                for protocol, meta in (dialect_files or {}).items()
            ]  # the worker reads the rest: replies are long
            + [
                Variant(
                    f"{protocol}, agentproc 0.20",
                    "agentproc 0.20 hub",
                    {"file": meta["file"], "hub_profile": meta["hub_profile"], "turns": 1 if q else 2},
                )
                for protocol, meta in (dialect_files or {}).items()
                if meta["hub_profile"]
            ]
            + [
                Variant(f"{protocol} latency", "latency", {**dialect_lat, "protocol": protocol})
                for protocol in (dialect_files or {})
            ]
            + [
                Variant(f"{protocol} latency", "latency", {**dialect_lat, "protocol": protocol})
                for protocol in WARM_JSON_PROTOCOLS
            ],
            1 if q else 3,
        ),
        # The real Claude Code and codex (the tests' npm cache) against the tests' fake model servers.
        Case(
            "claude-sdk",
            [
                Variant("turn", "turn", {"turns": 5 if q else 20, "warmup": 2}),
                Variant("latency", "latency", {"turns": 5 if q else 30, "warmup": 1}),
            ],
            2 if q else 3,
        ),
        Case(
            "codex-app-server",
            [
                Variant("turn", "turn", {"turns": 20 if q else 100, "warmup": 3}),
                Variant("latency", "latency", {"turns": 5 if q else 30, "warmup": 1}),
            ],
            2 if q else 5,
        ),
        *attachments,
        # Issue 24's: a sandboxed turn against bwrap running the agent alone, and limits by rlimit against none.
        Case("confined", [Variant("all", "all", turn)], 2 if q else 6),
        # Issue 23's: the network door (bench/network.py), real serve processes on stdin/stdout and on loopback.
        Case(
            "network",
            [
                Variant("turn", "turn", {"turns": 30 if q else 150, "warmup": 5}),
                *(
                    Variant(f"latency, {name}", "latency", {**lat, "transport": transport})
                    for name, transport in (("stdin", "stdin"), ("SSE", "sse"), ("WebSocket", "ws"))
                ),
                Variant("idle connections", "idle", {"connections": 1000}),
            ],
            2 if q else 4,
        ),
        # Issue 38's: the ACP door (bench/acp.py), `agent-bridge acp` against stdin/stdout serve, the echo agent.
        Case("acp", [Variant("turn", "turn", {"turns": 30 if q else 150, "warmup": 5})], 2 if q else 4),
        # Issue 38's: an MCP tool call over stdio against the same turn through stdin/stdout serve (bench/mcp_door.py).
        Case("mcp", [Variant("turn", "turn", {"turns": 30 if q else 150, "warmup": 5})], 2 if q else 4),
        # Issue 36's: the chat side (bench/chat.py), a real connect against the fake Telegram Bot API.
        Case(
            "chat",
            [
                Variant("turn", "turn", {"turns": 20 if q else 60, "warmup": 3}),
                Variant("200 chats", "burst", {"chats": 200}),
                Variant("preview", "preview", {"chats": 3 if q else 6}),
            ],
            1 if q else 3,
        ),
    ]


# --------------------------------------------------------------------------- the throughput input


def cached_input(path: str) -> dict[str, Any] | None:
    """What a correct run of the input at `path` yields, if that file was written whole before (its meta beside it
    says its size); else None, with its directory made for writing it."""
    meta_path = path + ".json"
    if os.path.exists(path) and os.path.exists(meta_path):
        with open(meta_path) as meta_file:
            meta: dict[str, Any] = json.load(meta_file)
        if os.path.getsize(path) == meta["bytes"]:
            return meta
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return None


def remember_input(path: str, meta: dict[str, Any]) -> dict[str, Any]:
    with open(path + ".json", "w") as meta_file:
        json.dump(meta, meta_file)
    return meta


def throughput_input(megabytes: float) -> dict[str, Any]:
    """Write (once, cached) a file of mixed protocol lines: a third partials, a third body, a third session lines.

    Returns what a correct run must produce from it, so each contender's
    output is checked before its time is believed.
    """
    target = int(megabytes * 1_000_000)
    path = os.path.join(RESULTS, "data", f"mixed-{target}.txt")
    if (meta := cached_input(path)) is not None:
        return meta
    rng = random.Random(4)
    words = [
        "the",
        "agent",
        "answers",
        "with",
        "a",
        "short",
        "line",
        "of",
        "text",
        "about",
        "lorem",
        "ipsum",
        "dolor",
        "sit",
        "amet",
        "and",
        "café",
        "naïve",
        "“quoted”",
        "über",
        "tokens",
        "stream",
        "one",
        "by",
        "one",
    ]
    lines: list[str] = []
    size = body_chars = partials = bodies = 0
    last_session = ""
    kinds = ["partial", "body", "session"]
    while size < target:
        rng.shuffle(kinds)
        for kind in kinds:
            text = " ".join(rng.choices(words, k=rng.randint(6, 14)))
            if kind == "partial":
                line = "AGENT_PARTIAL: " + json.dumps(text + " ", ensure_ascii=rng.random() < 0.5)
                partials += 1
            elif kind == "body":
                line = text
                body_chars += len(text) + (1 if bodies else 0)
                bodies += 1
            else:
                last_session = f"sess-{len(lines):08d}-{rng.getrandbits(64):016x}"
                line = "AGENT_SESSION: " + last_session
            lines.append(line)
            size += len(line.encode()) + 1
    data = ("\n".join(lines) + "\n").encode()
    with open(path, "wb") as out:
        out.write(data)
    meta = {
        "file": path,
        "bytes": len(data),
        "lines": len(lines),
        "partials": partials,
        "body_lines": bodies,
        "body_chars": body_chars,
        "last_session": last_session,
    }
    return remember_input(path, meta)


def attachment_input(megabytes: int) -> dict[str, Any]:
    """Write (once, cached) a file of `megabytes` MB of random bytes, for the attachments case to serve."""
    size = megabytes * 1_000_000
    path = os.path.join(RESULTS, "data", f"attachment-{size}.bin")
    if (meta := cached_input(path)) is not None:
        return meta
    with open(path, "wb") as out:
        for _ in range(megabytes):
            out.write(os.urandom(1_000_000))
    return remember_input(path, {"file": path, "bytes": size})


def codex_input(megabytes: float) -> dict[str, Any]:
    """One long codex-exec turn, written by agents/codex_like.py; returns what a correct run yields."""
    return agent_written_input("codex_like.py", f"codex-{int(megabytes * 1_000_000)}.jsonl", megabytes)


def dialect_input(protocol: str, megabytes: float) -> dict[str, Any]:
    """One long turn in `protocol`'s shapes, written by agents/dialect_like.py (the same steps for every protocol:
    as many as make `megabytes` of wire 0.4); returns what a correct run yields."""
    return agent_written_input("dialect_like.py", f"{protocol}-{int(megabytes * 1_000_000)}.jsonl", megabytes, protocol)


def agent_written_input(agent: str, name: str, megabytes: float, *args: str) -> dict[str, Any]:
    """Write (once, cached) the file `agents/<agent> file [ARGS] MB PATH` writes; its meta says what a run must
    yield. The cached file is named after the writer's source too, so a changed writer writes it anew."""
    script = os.path.join(HERE, "agents", agent)
    with open(script, "rb") as source:
        version = hashlib.sha256(source.read()).hexdigest()[:12]
    stem, extension = os.path.splitext(name)
    path = os.path.join(RESULTS, "data", f"{stem}-{version}{extension}")
    if (meta := cached_input(path)) is not None:
        return meta
    done = subprocess.run(
        [sys.executable, script, "file", *args, str(megabytes), path], capture_output=True, text=True, check=True
    )
    return remember_input(path, json.loads(done.stdout))


# --------------------------------------------------------------------------- the machine


def machine() -> dict[str, Any]:
    def first(path: str, key: str) -> str:
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(key):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return "?"

    def run(*argv: str) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return "?"

    versions = {}
    for dist in ("agent-bridge", "agentproc", "trio", "pydantic", "structlog", "PyYAML", "psycopg"):
        try:
            from importlib.metadata import version

            versions[dist] = version(dist)
        except Exception:
            versions[dist] = "?"
    mem_kb = first("/proc/meminfo", "MemTotal").split()[0]
    return {
        "cpu": first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "ram_gib": round(int(mem_kb) / 1024 / 1024, 1) if mem_kb.isdigit() else "?",
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": run("git", "rev-parse", "--short", "HEAD")
        + (" (bridge/ modified)" if run("git", "status", "--porcelain", "--", "bridge") else ""),
        "versions": versions,
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }


def installed_matches_tree() -> bool:
    """The bench venv's non-editable install is the working tree's bridge/ (make bench re-installs on change)."""
    import importlib.util

    spec = importlib.util.find_spec("bridge")
    if spec is None or spec.origin is None:
        return False
    installed = os.path.dirname(spec.origin)

    def digest(top: str) -> str:
        h = hashlib.sha256()
        for folder, dirs, files in sorted(os.walk(top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    h.update(os.path.relpath(path, top).encode())
                    with open(path, "rb") as f:
                        h.update(f.read())
        return h.hexdigest()

    return os.path.realpath(installed) != os.path.realpath(os.path.join(ROOT, "bridge")) and digest(
        installed
    ) == digest(os.path.join(ROOT, "bridge"))


# --------------------------------------------------------------------------- PostgreSQL


@contextlib.contextmanager
def postgres_cluster(plan: list[Case], about: dict[str, Any]) -> Iterator[None]:
    """One throwaway cluster (tools/pgcluster.py) for the run's PostgreSQL cases; each sample makes a database."""
    if not any(case.name in POSTGRES_CASES for case in plan):
        yield
        return
    import psycopg

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from pgcluster import PostgresServer

    server = PostgresServer(POSTGRES_SETTINGS)
    try:
        server.start()
        with psycopg.connect(server.dsn("postgres"), autocommit=True) as admin:
            admin.execute("CREATE EXTENSION pg_stat_statements")
            version = admin.execute("SHOW server_version").fetchone()[0]
        about["postgres"] = f"PostgreSQL {version} on loopback, " + ", ".join(
            f"{name}={value}" for name, value in server.settings.items() if name != "listen_addresses"
        )
        os.environ[POSTGRES_ENV] = server.dsn("postgres")
        yield
    finally:
        os.environ.pop(POSTGRES_ENV, None)
        server.remove()


# --------------------------------------------------------------------------- running


TABLE_PAGE = os.path.join(ROOT, "docs", "performance.md")
TABLE_BEGIN = "<!-- bench-results:begin (written by make bench) -->"
TABLE_END = "<!-- bench-results:end -->"


def update_table_page(summary: dict[str, Any], about: dict[str, Any]) -> bool:
    """Replace only the lines between docs/performance.md's bench markers with the new table and machine."""
    with open(TABLE_PAGE, encoding="utf-8") as f:
        text = f.read()
    begin, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if begin < 0 or end < begin:
        return False
    block = f"{TABLE_BEGIN}\n{report.markdown_table(summary)}\n\nMachine: {report.machine_line(about)}.\n"
    with open(TABLE_PAGE, "w", encoding="utf-8") as f:
        f.write(text[:begin] + block + text[end:])
    return True


def default_signals() -> None:
    """Workers inherit SIGINT and SIGTERM at their defaults, however `make bench` was started.

    A script's `cmd &` or nohup would hand them down ignored, and a bridge
    that sees them ignored spawns agents through a slower pre-exec step: the
    numbers would then depend on how the benchmark was launched.
    """
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
    # A run stopped by SIGTERM still stops its PostgreSQL cluster (workers get SIG_DFL again at exec).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def run_sample(case: Case, variant: Variant, round_no: int, log: Any) -> dict[str, Any]:
    params = {**variant.params, "round": round_no}
    argv = [sys.executable, WORKER, case.name, variant.contender, json.dumps(params)]
    log.write(f"\n=== round {round_no} {case.name} / {variant.label}\n")
    log.flush()
    done = subprocess.run(
        argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True, cwd=ROOT, timeout=1800
    )
    try:
        values = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        values = {"invalid": f"worker exited {done.returncode} without a result; see {log.name}"}
    if done.returncode != 0 and "invalid" not in values:
        values = {"invalid": f"worker exited {done.returncode}"}
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, two rounds: a smoke run for development")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="CASE",
        help="run only these cases (turn throughput "
        "concurrency latency memory cli codex warm fleet fleet-burst pg-statement wire04 dialects claude-sdk "
        "codex-app-server attachments network acp mcp chat)",
    )
    parser.add_argument("--rounds", type=int, help="override every case's number of rounds")
    parser.add_argument(
        "--no-summary",
        action="store_true",
        help="do not rewrite bench/RESULTS.md and bench/results*.png (implied by --quick and --only)",
    )
    args = parser.parse_args()

    os.makedirs(RESULTS, exist_ok=True)
    default_signals()
    if not installed_matches_tree():
        print(
            "bench: the bridge installed in this venv is not the working tree's bridge/; "
            "run `make bench` (it re-installs)",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    tput_file = throughput_input(4 if args.quick else 23)
    codex_file = codex_input(4 if args.quick else 23)
    wire04_megabytes = 4 if args.quick else 20
    wire04_file = dialect_input("agentproc-0.4", wire04_megabytes)
    dialect_files = {
        protocol: dialect_input(protocol, wire04_megabytes)
        for protocol in dialect_like.STREAMS
        if protocol != "agentproc-0.4"
    }  # wire 0.4 is cases 15 and 16
    attachment_files = {f"{megabytes} MB": attachment_input(megabytes) for megabytes in (10, 50)}
    plan = build_plan(args.quick, tput_file, codex_file, wire04_file, dialect_files, attachment_files)
    if args.only:
        unknown = set(args.only) - {c.name for c in plan}
        if unknown:
            parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
        plan = [c for c in plan if c.name in args.only]
    if args.rounds:
        for case in plan:
            case.rounds = args.rounds
    about = machine()
    print(
        f"bench: {about['cpu']}, {about['usable_cores']} cores, {about['ram_gib']} GiB, {about['kernel']}, "
        f"Python {about['python']}, load {about['load_before']}",
        file=sys.stderr,
    )

    samples: dict[str, dict[str, list[dict[str, Any]]]] = {c.name: {v.label: [] for v in c.variants} for c in plan}
    loads = []
    rounds = max(c.rounds for c in plan)
    log_path = os.path.join(RESULTS, "worker.log")
    with open(log_path, "w") as log, postgres_cluster(plan, about):
        for round_no in range(rounds):
            print(f"bench: round {round_no + 1}/{rounds} ", end="", file=sys.stderr, flush=True)
            for case in plan:
                if round_no >= case.rounds:
                    continue
                shift = round_no % len(case.variants)
                for variant in case.variants[shift:] + case.variants[:shift]:
                    samples[case.name][variant.label].append(run_sample(case, variant, round_no, log))
                    print(".", end="", file=sys.stderr, flush=True)
                print(f" {case.name}", end="", file=sys.stderr, flush=True)
            loads.append([round(x, 2) for x in os.getloadavg()])
            print(f"  (load {loads[-1][0]})", file=sys.stderr)

    about["load_after_each_round"] = loads
    about["bench_seconds"] = round(time.monotonic() - started)
    raw = {
        "machine": about,
        "quick": args.quick,
        "throughput_input": tput_file,
        "codex_input": codex_file,
        "wire04_input": wire04_file,
        "attachment_inputs": attachment_files,
        "dialect_inputs": {
            protocol: {key: value for key, value in meta.items() if key != "reply"}
            for protocol, meta in dialect_files.items()
        },
        "plan": {c.name: {"rounds": c.rounds, "variants": {v.label: v.params for v in c.variants}} for c in plan},
        "samples": samples,
    }
    summary = report.summarize(raw)
    raw["summary"] = summary
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for name in (f"run-{stamp}.json", "latest.json"):
        with open(os.path.join(RESULTS, name), "w") as out:
            json.dump(raw, out, indent=1)
    with open(os.path.join(RESULTS, "machine.json"), "w") as out:
        json.dump(about, out, indent=1)

    print()
    print(report.console_table(summary))
    print(f"\nmachine: {report.machine_line(about)}")
    problems = report.invalid_samples(samples)
    for problem in problems:
        print(f"INVALID: {problem}", file=sys.stderr)

    partial = args.quick or bool(args.only) or args.no_summary or bool(problems)
    markdown = report.markdown(summary, about, quick=args.quick)
    png = os.path.join(RESULTS, "results.png") if partial else os.path.join(HERE, "results.png")
    png_more = os.path.join(os.path.dirname(png), "results-more.png")
    md = os.path.join(RESULTS, "RESULTS.md") if partial else os.path.join(HERE, "RESULTS.md")
    import plot

    plot.draw(summary, about, png)
    plot.draw_more(summary, about, png_more)
    with open(md, "w") as out:
        out.write(markdown)
    if not partial and update_table_page(summary, about):
        print(f"{os.path.relpath(TABLE_PAGE, ROOT)}: table updated", file=sys.stderr)
    print(
        f"raw: {os.path.relpath(os.path.join(RESULTS, 'latest.json'), ROOT)}; "
        f"summary: {os.path.relpath(md, ROOT)}; plots: {os.path.relpath(png, ROOT)}, {os.path.relpath(png_more, ROOT)}"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
