"""Partial-latency benchmark agent: a partial carrying its own send time every interval.

Usage: ticker.py SECONDS INTERVAL_MS. Each line is `AGENT_PARTIAL: <ns>`, where
<ns> is CLOCK_MONOTONIC in nanoseconds: on Linux that clock is system-wide, so
the bridge's process reads the same clock when the partial reaches it.
Writes go straight to fd 1 (no buffering) on an absolute schedule (no drift).
"""

import os
import sys
import time

seconds = float(sys.argv[1])
interval_ns = int(float(sys.argv[2]) * 1_000_000)
clock = time.monotonic_ns
write = os.write
sleep = time.sleep
start = clock()
end = start + int(seconds * 1e9)
due = start
while due < end:
    wait = due - clock()
    if wait > 0:
        sleep(wait / 1e9)
    write(1, b"AGENT_PARTIAL: %d\n" % clock())
    due += interval_ns
write(1, b"ticked\n")
