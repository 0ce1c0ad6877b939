"""Installed by PYTHONPATH in a test's Python subprocess (tests/loopback_only.py): its sockets reach loopback only."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import loopback_only  # noqa: E402

loopback_only.install()
del sys.path[0]
