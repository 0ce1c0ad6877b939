"""The network door: serve's protocol over WebSocket and HTTP, an OpenAI-compatible endpoint, health and metrics.

- `listen`: `serve --listen`, on hypercorn, with serve's shutdown;
- `app`: the endpoints (Starlette) over a `door.Door`;
- `door`: who may come in, how many at once, each tenant's turns;
- `tokens`: the bearer tokens file.

Only `serve --listen` imports this package, and only it pays for hypercorn and Starlette (the `http` extra).
"""
