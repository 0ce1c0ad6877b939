"""The chat side (`agent-bridge connect`): a delivery kit, and the connectors between turns and chat platforms.

Imported only by `connect` (the `chat` extra: `pip install 'agent-bridge[chat]'`), never by `run` or `serve`.

- `markup`: the agent's Markdown as each platform's rich text (Telegram message entities, Matrix HTML beside a
  plain body), split at the platform's limit. Pure: no I/O.
"""
