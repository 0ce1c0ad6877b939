"""Health and Prometheus metrics of a host or a worker, in a registry of their own (docs/metrics.md).

`Metrics` is the host's `TurnObserver`: it counts each turn by profile and
outcome and observes its duration and time to the first partial. What the host
knows at any moment (running and queued turns, warm agents, questions waiting,
store errors, the fleet's queue depth) is read from `current_stats()` at scrape
time, so nothing is kept twice. Each `Metrics` has its own `CollectorRegistry`,
never prometheus_client's global one: two doors in one process (the tests)
count apart.

Readiness: the source takes turns (not shutting down, a worker not draining)
and its store or database answers `current_stats()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..host.interface import HostStats
from ..log import get_logger

PREFIX = "agent_bridge_"
# Turns last from milliseconds (an echo) to the better part of an hour (a coding agent at work).
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
FIRST_PARTIAL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

READY = "ready"
SHUTTING_DOWN = "shutting down"
STORE_UNREACHABLE = "store unreachable"


class StatsSource(Protocol):
    """What health and metrics read: a host (`BaseHost`), or a worker (`Worker`)."""

    @property
    def closing(self) -> bool: ...

    async def current_stats(self) -> HostStats: ...


class Metrics:
    """One door's (or worker's) metrics; set as its host's `observer`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._turns = Counter(
            f"{PREFIX}turns",
            "Turns that produced a result, by profile and outcome",
            ["profile", "outcome"],
            registry=self.registry,
        )
        self._duration = self._by_profile(
            "turn_duration_seconds",
            "From the turn's acceptance to its result (a wait in the queue included), by profile",
            DURATION_BUCKETS,
        )
        self._first_partial = self._by_profile(
            "turn_first_partial_seconds",
            "From the turn's acceptance to its first partial (turns that stream), by profile",
            FIRST_PARTIAL_BUCKETS,
        )
        self._now = _HostNow()
        self.registry.register(self._now)

    def _by_profile(self, name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(f"{PREFIX}{name}", documentation, ["profile"], buckets=buckets, registry=self.registry)

    # TurnObserver

    def first_partial(self, profile: str, seconds: float) -> None:
        self._first_partial.labels(profile).observe(seconds)

    def turn_ended(self, profile: str, outcome: str, seconds: float) -> None:
        self._turns.labels(profile, outcome).inc()
        self._duration.labels(profile).observe(seconds)

    def exposition(self, stats: HostStats | None, status: str) -> bytes:
        """The registry in Prometheus' text format, with `stats` as the host's numbers now (None: unreadable)."""
        self._now.stats, self._now.ready = stats, status == READY  # no await until the text is made
        return generate_latest(self.registry)


class _HostNow(Collector):
    """The host's numbers as read at the scrape."""

    def __init__(self) -> None:
        self.stats: HostStats | None = None
        self.ready = False

    def describe(self) -> list[Metric]:
        return []  # made at each scrape: nothing to check against other collectors' names

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(f"{PREFIX}ready", "1 when ready (GET /readyz answers 200), else 0", value=self.ready)
        stats = self.stats
        if stats is None:
            return
        yield GaugeMetricFamily(f"{PREFIX}turns_running", "Turns running now", value=stats.running)
        yield GaugeMetricFamily(f"{PREFIX}turns_queued", "Turns waiting for a slot now", value=stats.queued)
        yield GaugeMetricFamily(f"{PREFIX}warm_agents", "Warm agents alive", value=stats.warm)
        yield GaugeMetricFamily(
            f"{PREFIX}questions_waiting",
            "Permission requests and questions of agents waiting for an answer",
            value=stats.questions_waiting,
        )
        yield CounterMetricFamily(
            f"{PREFIX}store_errors", "Sessions that could not be read or recorded", value=stats.store_errors
        )
        yield CounterMetricFamily(
            f"{PREFIX}turns_refused", "Turns refused because the queue was full", value=stats.refused
        )
        if stats.fleet_queued is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}fleet_queued_turns",
                "Turns waiting in the PostgreSQL queue for any worker",
                value=stats.fleet_queued,
            )


async def readiness(source: StatsSource, *, accepting: bool = True) -> tuple[str, HostStats | None]:
    """`READY` and the source's stats, or why it is not ready (`SHUTTING_DOWN`, `STORE_UNREACHABLE`)."""
    if not accepting or source.closing:
        return SHUTTING_DOWN, None
    try:
        stats = await source.current_stats()  # a gateway or a worker asks its database
    except Exception as err:
        get_logger(component="network").warning("not ready: the store cannot be reached", error=str(err))
        return STORE_UNREACHABLE, None
    return READY, stats


async def healthz(request: Request) -> Response:
    """GET /healthz: the process answers."""
    return JSONResponse({"status": "alive"})


async def readyz_response(source: StatsSource, *, accepting: bool = True) -> Response:
    status, _ = await readiness(source, accepting=accepting)
    return JSONResponse({"status": status}, status_code=200 if status == READY else 503)


async def metrics_response(metrics: Metrics, source: StatsSource, *, accepting: bool = True) -> Response:
    """GET /metrics: the counters and histograms always; the host's numbers when it can be read."""
    status, stats = await readiness(source, accepting=accepting)
    if stats is None and status == SHUTTING_DOWN:
        try:
            stats = await source.current_stats()  # still worth showing while turns drain
        except Exception:
            stats = None
    return Response(metrics.exposition(stats, status), media_type=CONTENT_TYPE_LATEST)
