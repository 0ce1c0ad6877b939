#!/bin/sh
# Per-turn benchmark agent: the smallest complete turn, with sh builtins only
# (no extra process): a session line, a partial, a body line.
echo "AGENT_SESSION: bench-session"
echo 'AGENT_PARTIAL: "working"'
echo "reply: $AGENT_MESSAGE"
