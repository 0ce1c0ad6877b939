#!/bin/sh
# The smallest agent: read the message from the environment, print the reply.
# Everything on stdout that is not a protocol line is the reply body.
printf 'echo: %s\n' "$AGENT_MESSAGE"
