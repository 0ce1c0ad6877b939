#!/bin/sh
# An agent that fails politely: AGENT_ERROR: carries the text the user sees.
# The turn fails even though we exit 0, and any reply body is discarded.
echo 'AGENT_PARTIAL:"looking that up… "'
echo "this body line is discarded because the turn fails"
echo 'AGENT_ERROR:"The upstream service is rate limited. Try again in a minute."'
exit 0
