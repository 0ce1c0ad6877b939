"""`python -m bridge` is the `agent-bridge` command."""

from .cli import main

raise SystemExit(main())
