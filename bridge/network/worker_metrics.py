"""`agent-bridge worker --metrics HOST:PORT`: a worker's `/metrics`, `/healthz` and `/readyz` (docs/metrics.md).

The rule of `serve --listen`, for the same reason: without `--metrics-tokens
FILE` (serve's tokens file) only a loopback address, and a non-loopback one
refuses to start; with it, `/metrics` needs one of the file's tokens (any:
what a worker shows is the whole worker's). `/healthz` and `/readyz` need none.
Without tokens, a web page gets 403 (`auth.LocalCallersOnly`, as on serve's door).
The worker's turns are its own (the `Host` it runs them on); the queue depth is
the fleet's, read from PostgreSQL at each scrape.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import partial

import trio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import ListenError
from ..serving.session import Tenant
from .app import unauthorized, web_page_refused
from .auth import LocalCallersOnly, TenantGate
from .door import LOOPBACK_TENANT, DoorLimits
from .extra import require_http_extra
from .listen import Address, hypercorn_config, is_loopback, parse_address, serve_app
from .metrics import Metrics, StatsSource, healthz, metrics_response, readyz_response
from .tokens import Tokens, bearer_token, load_tokens


@dataclass
class WorkerMetrics:
    """Where a worker shows its metrics, checked before the worker starts; `metrics` is its turns' observer."""

    address: Address
    tokens: Tokens | None
    metrics: Metrics = field(default_factory=Metrics)
    program: str = "worker"  # the command, as the log line names it (connect shares this server)

    async def serve(
        self, worker: StatsSource, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled; `task_status.started` gets the URLs (a port of 0 picks a free one)."""
        from hypercorn.trio import serve

        config = hypercorn_config(self.address, certfile=None, keyfile=None, limits=DoorLimits())
        async with trio.open_nursery() as nursery:
            urls: list[str] = await nursery.start(
                partial(serve_app, option="--metrics"), serve, self.app(worker), config, trio.sleep_forever
            )
            who = f"{len(self.tokens)} tokens" if self.tokens else "no tokens: loopback clients only"
            print(f"agent-bridge {self.program}: metrics on {' '.join(urls)} ({who})", file=sys.stderr, flush=True)
            task_status.started(urls)

    def app(self, worker: StatsSource) -> Starlette:
        async def metrics(request: Request) -> Response:
            return await metrics_response(self.metrics, worker)

        async def readyz(request: Request) -> Response:
            return await readyz_response(worker)

        return Starlette(
            routes=[
                Route("/healthz", healthz, methods=["GET"]),
                Route("/readyz", readyz, methods=["GET"]),
                Route("/metrics", metrics, methods=["GET"]),
            ],
            middleware=[
                *self.local_callers_only(),
                Middleware(TenantGate, tenant_of=self.tenant_of, refusal=unauthorized, public=("/healthz", "/readyz")),
            ],
        )

    def local_callers_only(self) -> list[Middleware]:
        """Without tokens, no web page reads the metrics (`LocalCallersOnly`), as on serve's door."""
        if self.tokens is not None:
            return []
        return [Middleware(LocalCallersOnly, refusal=partial(web_page_refused, "--metrics-tokens", self.program))]

    def tenant_of(self, authorization: str | None) -> Tenant | None:
        """Whoever may read the metrics: any token of the file (no file: the loopback clients)."""
        if self.tokens is None:
            return LOOPBACK_TENANT
        return self.tokens.tenant_of(bearer_token(authorization))


def worker_metrics(listen: str, tokens_file: str | None, program: str = "worker") -> WorkerMetrics:
    """`--metrics HOST:PORT` and `--metrics-tokens FILE`, checked; raises `ListenError` naming the fix."""
    require_http_extra("--metrics")
    address = parse_address(listen, option="--metrics")
    tokens = load_tokens(tokens_file) if tokens_file else None
    if tokens is None and not is_loopback(address.host):
        raise ListenError(
            f"--metrics {address.bind} is not a loopback address and the {program} has no --metrics-tokens: "
            f"anyone who can reach it could read the {program}'s metrics. Give --metrics-tokens FILE, or use 127.0.0.1"
        )
    return WorkerMetrics(address, tokens, program=program)
