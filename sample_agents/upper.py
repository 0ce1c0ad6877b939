#!/usr/bin/env python3
"""An agent that reads the message on stdin (profile: `stdin: message`).

Use this style for long messages: the environment has a per-variable limit
(128 KiB on Linux); stdin has none.
"""

import sys

message = sys.stdin.read()
sys.stdout.write(message.upper() + "\n")
