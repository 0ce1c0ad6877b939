"""The chat side (`agent-bridge connect`): a delivery kit, and the connectors between turns and chat platforms.

Imported only by `connect` (the `chat` extra: `pip install 'agent-bridge[chat]'`), never by `run` or `serve`. Its
pure parts do no I/O and read no clock (times are passed in):

- `markup`: the agent's Markdown as each platform's rich text (Telegram message entities, Matrix HTML beside a plain
  body), cut at the platform's limit.
- `pacing`: one outbox per chat and a global one, paced at each platform's limits.
- `platform`: the `Platform` protocol a connector implements, and the neutral values it trades in.
- `config`: the `connect` configuration file.
- `runtime`: `ChatBridge`, one platform's updates carried to a host's turns and the replies back; `inbox`, its
  durable store of updates; `botlock`, one process per bot.
- one module per platform's connector (Telegram, Matrix).
- `http_transport`: the connectors' HTTP client, httpx over a lean transport on trio and h11.
"""
