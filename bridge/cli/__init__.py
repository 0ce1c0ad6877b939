"""The front doors: the `agent-bridge` command and its subcommands.

- `main`: the parser and the dispatch; `options`: what the commands' parsers share;
- a module per command, imported only when it runs: `run`, `chat` (the REPL), `check` (with `check_chat`),
  `schema`, `init` (with `starter`, the starter agent and profile), `sessions`, `serve` (the JSON Lines
  sidecar, and `--listen`), `connect` (Telegram, Matrix), `worker`, `acp`, `mcp`;
- `terminal`: questions put to the person at the terminal;
- `printer`: how events look to people and to programs, and the status line.

Lower layers never import this package.
"""

from .main import main

__all__ = ["main"]
