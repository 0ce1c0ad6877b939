"""The front doors: the `agent-bridge` command and its subcommands.

- `main`: the parser, `run`, `check`, `schema`;
- `chat`: the REPL; `serve`: the JSON Lines sidecar; `sessions`: the store's commands;
- `starter`: `init`'s starter agent and profile;
- `printer`: how events look to people and to programs, and the status line.

Lower layers never import this package.
"""

from .main import main

__all__ = ["main"]
