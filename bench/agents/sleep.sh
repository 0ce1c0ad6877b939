#!/bin/sh
# Concurrency benchmark agent: a turn that takes $1 seconds (default 1) and says one line.
sleep "${1:-1}"
echo done
