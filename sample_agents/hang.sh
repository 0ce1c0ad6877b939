#!/bin/sh
# An agent that never finishes. The bridge stops it at timeout_secs with
# SIGTERM (then SIGKILL after kill_grace_secs); the turn exits 124.
# Handling SIGTERM lets it say goodbye on stderr before it goes.
trap 'echo "hang.sh: got SIGTERM, leaving" >&2; exit 143' TERM
echo 'AGENT_PARTIAL:"working on it… "'
while :; do
    sleep 1
done
