"""The network door: serve's protocol over WebSocket and HTTP, an OpenAI-compatible endpoint, health and metrics.

- `listen`: `serve --listen`, on hypercorn, with serve's shutdown;
- `app`: the endpoints (Starlette) over a `door.Door`;
- `door`: who may come in, how many at once, each tenant's turns;
- `tokens`: the bearer tokens file;
- `metrics`: health and Prometheus metrics of a host (the door's `/metrics`) or a worker;
- `mcp`: `agent-bridge mcp --listen`, the MCP door (`serving.mcp`) at `/mcp` over Streamable HTTP;
- `worker_metrics`: `agent-bridge worker --metrics`, a worker's own small server.
- `extra`: whether the `http` extra is installed, asked before the modules above import it.

Only `serve --listen` and `worker --metrics` import this package, and only they pay for hypercorn, Starlette and
prometheus-client (the `http` extra).
"""
