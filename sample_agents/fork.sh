#!/bin/sh
# An agent that leaves a child behind holding stdout open. Without the bridge
# killing the agent's process group this turn would hang until the child ends.
sleep 600 &
echo "started a background job (pid $!) and left without waiting for it"
