"""`connect --metrics`: each platform's bot counted in Prometheus' text format, beside the host's metrics.

Read from each `ChatBridge.counts` (and its connector's `rate_limited`) at scrape time, so nothing is counted
twice. Imported only when `connect` is given `--metrics` (it needs the `http` extra's prometheus-client).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from .runtime import ChatBridge

PREFIX = "agent_bridge_chat_"
# name → (help, what it reads of a bridge)
COUNTERS = (
    ("updates_received", "Messages and button presses received and stored, by platform"),
    ("turns_started", "Turns the chat started on the host, by platform"),
    ("replies_delivered", "Replies the platform took, by platform"),
    ("undeliverable_replies", "Replies and files that finally could not be delivered (logged with the reason)"),
    ("rate_limited", "The platform's 429 answers waited out (retry_after), by platform"),
    ("refusals", "Messages from users not in allow_users: no turn, by platform"),
    ("budget_refusals", "Turns not started because the user's daily budget was spent, by platform"),
)


class ChatCollector(Collector):
    """The bots' counters, labelled by platform; register it in the host's `Metrics.registry`."""

    def __init__(self, bridges: Sequence[ChatBridge]) -> None:
        self._bridges = tuple(bridges)

    def describe(self) -> list[Metric]:
        return []  # made at each scrape: nothing to check against other collectors' names

    def collect(self) -> Iterator[Metric]:
        for name, documentation in COUNTERS:
            family = CounterMetricFamily(f"{PREFIX}{name}", documentation, labels=["platform"])
            for bridge in self._bridges:
                family.add_metric([bridge.platform.name], _value(bridge, name))
            yield family


def _value(bridge: ChatBridge, name: str) -> int:
    counts = bridge.counts
    values = {
        "updates_received": counts.updates_received,
        "turns_started": counts.turns_started,
        "replies_delivered": counts.replies_delivered,
        "undeliverable_replies": counts.undeliverable,
        "rate_limited": bridge.platform.rate_limited,
        "refusals": counts.refusals,
        "budget_refusals": counts.budget_refusals,
    }
    return values[name]


__all__ = ["ChatCollector"]
