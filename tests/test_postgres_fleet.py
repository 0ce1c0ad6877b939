"""Many workers and gateways on one PostgreSQL database: the guarantees of one process, across processes.

Real processes throughout: `agent-bridge worker` and `agent-bridge serve
--postgres` against a throwaway PostgreSQL cluster, driving the recorder agent
of `hostkit`, whose diary shows when each agent started and ended.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetkit import Fleet, eventually, turn
from hostkit import Lab, max_overlap


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    lab = Lab(tmp_path)
    lab.profile()
    return lab


@pytest.fixture
def fleet(lab: Lab, pg_dsn: str) -> Iterator[Fleet]:
    fleet = Fleet(lab, pg_dsn)
    try:
        yield fleet
    finally:
        fleet.stop()


def test_a_turn_goes_through_the_gateway_to_a_worker_and_back_with_its_partials_and_session(fleet: Fleet,
                                                                                            lab: Lab) -> None:
    fleet.worker()
    gateway = fleet.gateway()
    gateway.send(turn("t1", "tag=a session=s-1"))
    responses = gateway.until("result", "t1")
    kinds = [response["type"] for response in responses]
    assert kinds == ["accepted", "partial", "session", "result"], responses
    result = responses[-1]
    assert (result["outcome"], result["reply"], result["session_id"]) == ("ok", "reply a one", "s-1")
    gateway.send(turn(2, "tag=b"))
    assert gateway.until("result", 2)[-1]["outcome"] == "ok"
    assert [words[:3] for words in lab.lines() if words[0] == "start"] == [["start", "a", "-"], ["start", "b", "s-1"]]
    assert gateway.close() == 0


def test_many_conversations_on_three_workers_keep_each_conversation_in_order_and_never_overlap(
        fleet: Fleet, lab: Lab) -> None:
    for _ in range(3):
        fleet.worker(max_concurrent=4)
    gateway = fleet.gateway()
    ids = set()
    for index in range(30):
        conversation = f"c{index % 6}"
        request_id = f"t{index}"
        ids.add(request_id)
        gateway.send(turn(request_id, f"tag={conversation}-{index // 6} session={conversation}-{index // 6}",
                          conversation=conversation))
    results = gateway.results(ids)
    assert all(result["outcome"] == "ok" for result in results.values()), results
    lines = lab.lines()
    for conversation in (f"c{index}" for index in range(6)):
        tags = [f"{conversation}-{n}" for n in range(5)]
        started = [words for words in lines if words[0] == "start" and words[1] in tags]
        assert [words[1] for words in started] == tags  # in order
        assert max_overlap(lines, set(tags)) == 1  # one at a time
        # each turn resumed the session the previous one made, whichever worker ran it
        assert [words[2] for words in started] == ["-", *tags[:-1]]
    served_by = {row[0] for row in fleet.query("SELECT DISTINCT worker FROM bridge_turns")}
    assert len(served_by) >= 2, served_by


def test_stats_count_every_worker(fleet: Fleet) -> None:
    fleet.worker(max_concurrent=3)
    fleet.worker(max_concurrent=5)
    gateway = fleet.gateway()
    gateway.send({"type": "stats", "id": "s"})
    stats = gateway.until("stats", "s")[-1]
    assert stats["max_concurrent"] == 8 and len(stats["workers"]) == 2
    assert {"running", "queued", "completed", "failed", "outcomes"} <= set(stats)
