"""The front doors: the `agent-bridge` command and its subcommands.

- `main`: the parser, `run`, `check`, `schema`;
- `chat`: the REPL; `serve`: the JSON Lines sidecar; `sessions`: the store's commands;
- `printer`: how events look to people and to programs.

Lower layers never import this package.
"""

from .main import main

__all__ = ["main"]
