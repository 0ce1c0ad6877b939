"""`agent-bridge worker`: turns claimed from a PostgreSQL queue and run here (docs/fleet.md)."""

from __future__ import annotations

import argparse
from typing import Any


def worker_command(args: argparse.Namespace) -> int:
    from ..host.postgres.worker import run_worker

    metrics: dict[str, Any] = {}
    if args.metrics is not None:
        from ..network.extra import require_http_extra

        require_http_extra("--metrics")  # before worker_metrics, which imports the extra's libraries
        from ..network.worker_metrics import worker_metrics

        door = worker_metrics(args.metrics, args.metrics_tokens)
        metrics = {"observer": door.metrics, "beside": door.serve}
    elif args.metrics_tokens is not None:
        args.command_parser.error("--metrics-tokens is an option of --metrics: add --metrics HOST:PORT")
    return run_worker(
        args.postgres,
        args.profiles,
        max_concurrent=args.max_concurrent,
        lease_secs=args.lease_secs,
        shutdown_grace=args.shutdown_grace,
        name=args.name,
        profile_wait_secs=args.profile_wait_secs,
        attachment_hosts=tuple(args.attachment_hosts),
        **metrics,
    )
