"""Profile the bridge's side of one benchmark, with exactly the parameters `make bench` uses.

    bench/.venv/bin/python bench/profile.py throughput                 # pyinstrument call tree (text)
    bench/.venv/bin/python bench/profile.py turn --tool py-spy         # py-spy flat top functions
    bench/.venv/bin/python bench/profile.py cli                        # python -X importtime of the CLI

Output goes to bench/results/profile-CASE.* (pyinstrument also prints its tree).
Profilers slow the code down (py-spy much less than pyinstrument), so read the
shares, not the absolute times; `make bench` is what measures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import run  # noqa: E402

BIN = os.path.dirname(sys.executable)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=("turn", "throughput", "concurrency", "latency", "memory", "cli"))
    parser.add_argument("--tool", choices=("pyinstrument", "py-spy"), default="pyinstrument")
    parser.add_argument("--variant", help="which variant of the case (default: the bridge's, or the first)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of turns (per-turn case)")
    args = parser.parse_args()
    os.makedirs(run.RESULTS, exist_ok=True)
    out = os.path.join(run.RESULTS, f"profile-{args.case}")

    if args.case == "cli":
        echo = os.path.join(run.ROOT, "profiles", "echo.yaml")
        done = subprocess.run(
            [sys.executable, "-X", "importtime", os.path.join(BIN, "agent-bridge"), "run", echo, "hello"],
            capture_output=True,
            text=True,
        )
        rows = []
        for line in done.stderr.splitlines():
            if line.startswith("import time:") and "|" in line:
                self_us, cumulative, name = (part.strip() for part in line[len("import time:") :].split("|"))
                if self_us.isdigit():
                    rows.append((int(cumulative), int(self_us), name))
        with open(out + ".importtime.txt", "w") as f:
            f.write(done.stderr)
        print("cumulative µs  self µs  module (top-level imports of `agent-bridge run`)")
        for cumulative, self_us, name in sorted(rows, reverse=True)[:40]:
            print(f"{cumulative:>13}  {self_us:>7}  {name}")
        return 0

    inputs = (run.throughput_input(23), run.codex_input(23), run.wire04_input(20))
    plan = {c.name: c for c in run.build_plan(False, *inputs)}
    case = plan[args.case]
    variant = next((v for v in case.variants if v.label == (args.variant or "bridge")), case.variants[0])
    params = {**variant.params, "round": 0}
    if "turns" in params and args.case == "turn":
        params["turns"] = int(params["turns"] * args.scale)
    worker = [os.path.join(HERE, "worker.py"), args.case, variant.contender, json.dumps(params)]
    if args.tool == "pyinstrument":
        argv = [
            sys.executable,
            "-m",
            "pyinstrument",
            "-i",
            "0.0005",
            "-r",
            "text",
            "--show-all",
            "-o",
            out + ".pyinstrument.txt",
            *worker,
        ]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        with open(out + ".pyinstrument.txt") as f:
            print(f.read())
    else:
        argv = [
            os.path.join(BIN, "py-spy"),
            "record",
            "-r",
            "1000",
            "-F",
            "-f",
            "raw",
            "-o",
            out + ".py-spy.txt",
            "--",
            sys.executable,
            *worker,
        ]
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        print(top_functions(out + ".py-spy.txt"))
    return 0


def top_functions(collapsed: str, limit: int = 30) -> str:
    """Self and inclusive sample shares per function, from py-spy's collapsed stacks."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    with open(collapsed) as f:
        for line in f:
            stack, _, count_text = line.rstrip().rpartition(" ")
            count = int(count_text)
            frames = stack.split(";")
            if any(frame.startswith("_find_and_load") for frame in frames):
                continue  # start-up imports: the CLI case measures those
            total += count
            own[frames[-1]] = own.get(frames[-1], 0) + count
            for frame in set(frames):
                inclusive[frame] = inclusive.get(frame, 0) + count
    lines = [f"{total} samples outside imports", "  self%  incl%  function"]
    for frame, count in sorted(own.items(), key=lambda kv: -kv[1])[:limit]:
        lines.append(f"{100 * count / total:6.1f} {100 * inclusive[frame] / total:6.1f}  {frame}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
