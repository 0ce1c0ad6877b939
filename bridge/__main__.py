"""`python -m bridge` is the `agent-bridge` command."""

from .command import main

raise SystemExit(main())
