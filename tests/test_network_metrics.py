"""Health and Prometheus metrics: `GET /metrics` of `serve --listen`, and of `agent-bridge worker --metrics`.

Real servers and real clients: the door on hypercorn in process (httpx, httpx-ws), the worker as a process on
a throwaway PostgreSQL cluster, and prometheus_client's own text parser reading what they expose. No timing is
asserted: only that durations were observed, and how many.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from conftest import SAMPLE_AGENTS
from fleetkit import Fleet, eventually, release, turn
from hostkit import Lab
from httpx_ws import aconnect_ws
from prometheus_client.parser import text_string_to_metric_families
from test_postgres_fleet import fleet  # noqa: F401 (a fixture: the workers and gateways of this test's lab)

import bridge
from bridge.host.interface import BaseHost
from bridge.network.door import DoorLimits
from bridge.network.listen import parse_address, serve_network
from bridge.network.tokens import Tokens, parse_tokens

ADMIN = "admin-token-0123456789"
ECHO_ONLY = "echo-token-0123456789"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]  # (name, labels) → value
TOKENS = {ADMIN: {"name": "admin"}, ECHO_ONLY: {"name": "echoer", "profiles": ["echo"]}}


def samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition: (name, labels) → value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


@pytest.fixture
def lab(lab: Lab) -> Lab:
    """conftest.py's, `rec` saying the partial "started" first, and `echo`."""
    (lab.profiles / "echo.yaml").write_text(f"command: {str(SAMPLE_AGENTS / 'echo.sh')!r}\ntimeout_secs: 10\n")
    return lab


@asynccontextmanager
async def door(host: BaseHost, tokens: Tokens | None = None) -> AsyncIterator[httpx.AsyncClient]:
    async with host, trio.open_nursery() as nursery:
        urls = await nursery.start(
            partial(serve_network, host, parse_address("127.0.0.1:0"), tokens=tokens, limits=DoorLimits())
        )
        async with httpx.AsyncClient(base_url=urls[0], timeout=10) as client:
            yield client
        nursery.cancel_scope.cancel()


async def scrape(client: httpx.AsyncClient, token: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = await client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


async def run_turn(
    client: httpx.AsyncClient, profile: str, message: str, *, token: str | None = None
) -> dict[str, Any]:
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    body = {"profile": profile, "conversation": f"c-{message}", "message": message}
    response = await client.post("/v1/turns", json=body, headers=headers)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def test_turns_are_counted_by_profile_and_outcome_with_their_durations_and_first_partials(lab: Lab) -> None:
    async with door(bridge.open_host(lab.profiles, state=lab.state)) as client:
        assert (await run_turn(client, "rec", "tag=a"))["outcome"] == "ok"
        assert (await run_turn(client, "rec", "tag=b exit=3"))["outcome"] == "exit_nonzero"
        assert (await run_turn(client, "echo", "hello"))["outcome"] == "ok"
        found = await scrape(client)
    assert value(found, "agent_bridge_turns_total", profile="rec", outcome="ok") == 1
    assert value(found, "agent_bridge_turns_total", profile="rec", outcome="exit_nonzero") == 1
    assert value(found, "agent_bridge_turns_total", profile="echo", outcome="ok") == 1
    assert value(found, "agent_bridge_turn_duration_seconds_count", profile="rec") == 2
    assert value(found, "agent_bridge_turn_duration_seconds_count", profile="echo") == 1
    assert value(found, "agent_bridge_turn_duration_seconds_bucket", profile="echo", le="+Inf") == 1
    assert value(found, "agent_bridge_turn_first_partial_seconds_count", profile="rec") == 2  # it streams
    assert value(found, "agent_bridge_turn_first_partial_seconds_count", profile="echo") is None  # it does not
    assert (value(found, "agent_bridge_turn_duration_seconds_sum", profile="rec") or 0) > 0
    for name in ("turns_running", "turns_queued", "warm_agents", "questions_waiting"):
        assert value(found, f"agent_bridge_{name}") == 0, name
    assert value(found, "agent_bridge_store_errors_total") == 0
    assert value(found, "agent_bridge_turns_refused_total") == 0
    assert value(found, "agent_bridge_ready") == 1
    assert value(found, "agent_bridge_fleet_queued_turns") is None  # no fleet here


async def test_running_and_queued_turns_are_read_at_scrape_time_while_a_gated_turn_holds_the_only_slot(
    lab: Lab,
) -> None:
    gate = lab.gate()
    async with door(bridge.open_host(lab.profiles, state=lab.state, max_concurrent=1)) as client:
        async with aconnect_ws("/v1/ws", client) as ws:
            await ws.send_text(json.dumps(turn("held", f"tag=h gate={gate}", conversation="one")))
            while (response := json.loads(await ws.receive_text()))["type"] != "partial":
                pass
            await ws.send_text(json.dumps(turn("waits", "tag=w", conversation="two")))
            assert json.loads(await ws.receive_text()) == {"type": "accepted", "id": "waits"}
            found = await scrape(client)
            assert (value(found, "agent_bridge_turns_running"), value(found, "agent_bridge_turns_queued")) == (1, 1)
            assert value(found, "agent_bridge_turns_total", profile="rec", outcome="ok") is None
            await lab.release(gate)
            results = set()
            while len(results) < 2:
                response = json.loads(await ws.receive_text())
                if response["type"] == "result":
                    results.add(response["id"])
        found = await scrape(client)
    assert (value(found, "agent_bridge_turns_running"), value(found, "agent_bridge_turns_queued")) == (0, 0)
    assert value(found, "agent_bridge_turns_total", profile="rec", outcome="ok") == 2
    assert value(found, "agent_bridge_turn_first_partial_seconds_count", profile="rec") == 2


async def test_a_permission_waiting_for_the_bot_is_a_question_waiting(lab: Lab) -> None:
    (lab.profiles / "ap4.yaml").write_text(
        textwrap.dedent(f"""\
        protocol: agentproc-0.4
        command: [{sys.executable!r}, {str(SAMPLE_AGENTS / "wire04_agent.py")!r}]
        env: {{STREAM_DELAY: "0", TMPDIR: {str(lab.root)!r}}}
        permissions: {{ask: [Read], timeout_secs: 30}}
    """)
    )
    async with door(bridge.open_host(lab.profiles, state=lab.state)) as client:
        async with aconnect_ws("/v1/ws", client) as ws:
            await ws.send_text(json.dumps(turn("p1", "hi tool=Read", profile="ap4")))
            while (asked := json.loads(await ws.receive_text()))["type"] != "permission":
                pass
            assert value(await scrape(client), "agent_bridge_questions_waiting") == 1
            await ws.send_text(
                json.dumps({"type": "decide", "id": "p1", "request_id": asked["request_id"], "allow": True})
            )
            while (response := json.loads(await ws.receive_text()))["type"] != "result":
                pass
        assert response["outcome"] == "ok"
        found = await scrape(client)
    assert value(found, "agent_bridge_questions_waiting") == 0
    assert value(found, "agent_bridge_turns_total", profile="ap4", outcome="ok") == 1


async def test_metrics_need_a_token_when_the_door_has_tokens_and_show_the_whole_server_to_any_tenant(lab: Lab) -> None:
    async with door(bridge.open_host(lab.profiles, state=lab.state), parse_tokens(TOKENS)) as client:
        assert (await client.get("/metrics")).status_code == 401
        assert (
            await client.get("/metrics", headers={"Authorization": "Bearer wrong-token-0123456789"})
        ).status_code == 401
        assert (await client.get("/healthz")).json() == {"status": "alive"}
        assert (await client.get("/readyz")).json() == {"status": "ready"}
        assert (await run_turn(client, "rec", "tag=a", token=ADMIN))["outcome"] == "ok"
        found = await scrape(client, ECHO_ONLY)  # a tenant that may not use rec still sees the server's turns
    assert value(found, "agent_bridge_turns_total", profile="rec", outcome="ok") == 1


async def test_readiness_fails_once_the_host_shuts_down(lab: Lab) -> None:
    host = bridge.open_host(lab.profiles, state=lab.state)
    async with door(host) as client:
        assert (await client.get("/readyz")).status_code == 200
        host.stop_accepting()
        response = await client.get("/readyz")
        assert (response.status_code, response.json()) == (503, {"status": "shutting down"})
        found = await scrape(client)
    assert value(found, "agent_bridge_ready") == 0
    assert value(found, "agent_bridge_turns_running") == 0  # the numbers are still read while it drains


async def test_a_gateway_whose_database_is_gone_is_not_ready(pg_dsn: str) -> None:
    host = bridge.open_host(postgres=pg_dsn, gateway_name="metrics")
    async with door(host) as client:
        assert (await client.get("/readyz")).json() == {"status": "ready"}
        found = await scrape(client)
        assert value(found, "agent_bridge_fleet_queued_turns") == 0
        database = pg_dsn.rsplit("/", 1)[1].split("?")[0]
        admin_dsn = pg_dsn.replace(f"/{database}", "/postgres")

        def drop() -> None:
            with psycopg.connect(admin_dsn, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')

        await trio.to_thread.run_sync(drop)
        response = await client.get("/readyz")
        assert (response.status_code, response.json()) == (503, {"status": "store unreachable"})
        found = await scrape(client)
    assert value(found, "agent_bridge_ready") == 0
    assert value(found, "agent_bridge_turns_running") is None  # unreadable: left out, not made up


# ---------------------------------------------------------------------------- agent-bridge worker --metrics


async def test_a_gateway_counts_the_turns_its_workers_ran(fleet: Fleet, pg_dsn: str) -> None:
    fleet.worker()
    async with door(bridge.open_host(postgres=pg_dsn, gateway_name="metrics")) as client:
        assert (await run_turn(client, "rec", "tag=a"))["outcome"] == "ok"
        found = await scrape(client)
    assert value(found, "agent_bridge_turns_total", profile="rec", outcome="ok") == 1
    assert value(found, "agent_bridge_turn_duration_seconds_count", profile="rec") == 1
    assert value(found, "agent_bridge_turn_first_partial_seconds_count", profile="rec") == 1  # streamed by NOTIFY
    assert (value(found, "agent_bridge_fleet_queued_turns"), value(found, "agent_bridge_turns_running")) == (0, 0)


def metrics_url(fleet: Fleet, worker: str) -> str:
    found = eventually(
        lambda: re.search(r"agent-bridge worker: metrics on (\S+)", fleet.log(worker)), f"{worker}'s metrics URL"
    )
    return found.group(1)


def test_a_worker_shows_its_turns_and_the_fleets_queue_depth(fleet: Fleet, lab: Lab) -> None:
    fleet.worker("--metrics", "127.0.0.1:0", max_concurrent=1)
    client = httpx.Client(base_url=metrics_url(fleet, "w1"), timeout=10)
    assert client.get("/healthz").json() == {"status": "alive"}
    assert client.get("/readyz").json() == {"status": "ready"}
    gateway = fleet.gateway()
    gateway.send(turn("t1", "tag=a"))
    assert gateway.until("result", "t1")[-1]["outcome"] == "ok"
    gate = lab.gate()
    gateway.send(turn("held", f"tag=h gate={gate}", conversation="one"))
    eventually(lambda: "h" in lab.events("start"), "the held turn to start")
    gateway.send(turn("q1", "tag=q1", conversation="two"))
    gateway.send(turn("q2", "tag=q2", conversation="three"))
    eventually(lambda: fleet.query("SELECT count(*) FROM bridge_turns WHERE state = 'queued'") == [(2,)], "2 queued")
    found = samples(client.get("/metrics").text)
    assert value(found, "agent_bridge_fleet_queued_turns") == 2  # every worker's queue, read from PostgreSQL
    assert (value(found, "agent_bridge_turns_running"), value(found, "agent_bridge_turns_queued")) == (1, 0)
    assert value(found, "agent_bridge_turns_total", profile="rec", outcome="ok") == 1
    assert value(found, "agent_bridge_turn_first_partial_seconds_count", profile="rec") == 2  # the held one's too
    release(gate)
    assert set(gateway.results({"held", "q1", "q2"})) == {"held", "q1", "q2"}

    def counted_four() -> Samples | None:
        found = samples(client.get("/metrics").text)
        return found if value(found, "agent_bridge_turns_total", profile="rec", outcome="ok") == 4 else None

    found = eventually(counted_four, "the worker to count its four turns")  # it counts once the result is written
    assert value(found, "agent_bridge_fleet_queued_turns") == 0
    assert value(found, "agent_bridge_turn_duration_seconds_count", profile="rec") == 4
    assert value(found, "agent_bridge_turn_first_partial_seconds_count", profile="rec") == 4


def test_worker_metrics_without_tokens_are_no_web_page_s(fleet: Fleet) -> None:
    fleet.worker("--metrics", "127.0.0.1:0")
    client = httpx.Client(base_url=metrics_url(fleet, "w1"), timeout=10)
    from_a_page = client.get("/metrics", headers={"Origin": "https://pages.example"})
    rebound = client.get("/metrics", headers={"Host": "rebound.example:9100"})  # a name its DNS points at 127.0.0.1
    for refused in (from_a_page, rebound):
        assert (refused.status_code, refused.json()["code"]) == (403, "forbidden")
        assert "start worker with --metrics-tokens FILE" in refused.json()["message"]
    assert value(samples(client.get("/metrics").text), "agent_bridge_ready") == 1  # a program of this machine
    local_page = {"Origin": "http://localhost:3000", "Host": "127.0.0.1"}
    assert client.get("/metrics", headers=local_page).status_code == 200


def test_worker_metrics_refuse_a_public_address_without_tokens_need_a_token_with_them_and_end_with_the_drain(
    fleet: Fleet, lab: Lab, tmp_path: Path
) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "bridge", "worker", "--postgres", fleet.dsn, "--profiles", str(lab.profiles)]
        + ["--metrics", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode != 0
    assert "--metrics-tokens" in refused.stderr
    assert not fleet.query("SELECT 1 FROM bridge_workers")  # refused before it registered
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(json.dumps(TOKENS))
    tokens.chmod(0o600)
    worker = fleet.worker("--metrics", "127.0.0.1:0", "--metrics-tokens", str(tokens))
    client = httpx.Client(base_url=metrics_url(fleet, "w1"), timeout=10)
    assert client.get("/metrics").status_code == 401
    assert client.get("/readyz").status_code == 200
    answered = client.get("/metrics", headers={"Authorization": f"Bearer {ECHO_ONLY}"})
    assert value(samples(answered.text), "agent_bridge_ready") == 1

    gateway = fleet.gateway()
    gate = lab.gate()
    gateway.send(turn("held", f"tag=h gate={gate}"))
    eventually(lambda: "h" in lab.events("start"), "the held turn to start")
    worker.send_signal(signal.SIGTERM)  # drains: not ready any more, while its turn finishes
    eventually(lambda: client.get("/readyz").status_code == 503, "the draining worker to say it is not ready")
    assert client.get("/readyz").json() == {"status": "shutting down"}
    release(gate)
    assert gateway.until("result", "held")[-1]["outcome"] == "ok"
    assert worker.wait(timeout=20) == 0  # the metrics' server ends with the worker
