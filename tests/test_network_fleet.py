"""The fleet's gateway behind the network door: `serve --postgres --listen` with two real workers.

Real processes on a throwaway PostgreSQL cluster (tests/pgserver.py): two
`agent-bridge worker`s running the recorder agent of `hostkit` (its diary
shows which agent started, with which session, and which got SIGINT), and
`agent-bridge serve --postgres DSN --name NAME --listen 127.0.0.1:0
--tokens FILE`, driven by httpx (HTTP, Server-Sent Events) and httpx-ws
(/v1/ws), as a bot would.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import process_state
from doorkit import ListeningServe, serve_argv, serves, sse_events, write_tokens  # noqa: F401 - serves: a fixture
from fleetkit import Fleet, eventually, release, turn
from hostkit import Lab
from httpx_ws import connect_ws
from test_postgres_bots import ask_profile
from test_postgres_fleet import BIG, fleet, maker, started  # noqa: F401 - fixtures

from bridge.host.postgres.db import events_channel

ALPHA, BETA = "alpha-token-0123456789", "beta-token-0123456789"
WAIT = 20.0


@pytest.fixture
def door(fleet: Fleet, serves: list[ListeningServe]) -> ListeningServe:
    """Two workers and a listening gateway named "bot"."""
    fleet.start_workers(2)
    return open_door(fleet, serves)


def open_door(fleet: Fleet, serves: list[ListeningServe], name: str = "bot", *options: str) -> ListeningServe:
    tokens = write_tokens(fleet.lab.root / "tokens.yaml", {ALPHA: "alpha", BETA: "beta"})
    door = ListeningServe(
        serve_argv(
            "--postgres", fleet.dsn, "--name", name, "--listen", "127.0.0.1:0", "--tokens", str(tokens), *options
        ),
        fleet.lab.root / f"door-{name}.log",
    )
    serves.append(door)
    return door


def client(door: ListeningServe, token: str) -> httpx.Client:
    return httpx.Client(base_url=door.url, headers={"Authorization": f"Bearer {token}"}, timeout=WAIT)


def until(ws: Any, kind: str, request_id: Any) -> list[dict[str, Any]]:
    """Responses from WebSocket `ws` up to the first `kind` of `request_id`."""
    got = []
    while True:
        got.append(ws.receive_json(timeout=WAIT))
        if got[-1]["type"] == kind and got[-1].get("id") == request_id:
            return got


def logged(door: ListeningServe) -> list[dict[str, Any]]:
    """The door's log records (JSON lines on its stderr)."""
    return [json.loads(line) for line in door.output().splitlines() if line.startswith("{")]


def post_turn(http: httpx.Client, request: dict[str, Any]) -> dict[str, Any]:
    """A turn over `POST /v1/turns`, its result as JSON."""
    response = http.post("/v1/turns", json=request, headers={"Accept": "application/json"})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_turns_over_websocket_and_http_are_queued_and_run_on_both_workers(
    fleet: Fleet, lab: Lab, serves: list[ListeningServe]
) -> None:
    fleet.start_workers(2, max_concurrent=1)
    door = open_door(fleet, serves)
    one, two = lab.gate(), lab.gate()
    with client(door, ALPHA) as http, connect_ws("/v1/ws", http) as ws:
        ws.send_json(turn("w1", f"tag=w1 gate={one}", conversation="c1"))
        ws.send_json(turn("w2", f"tag=w2 gate={two}", conversation="c2"))
        eventually(lambda: started(lab, "w1") and started(lab, "w2"), "both held turns to start")
        # each worker runs one turn at most: both running means one on each
        workers = fleet.query("SELECT DISTINCT worker FROM bridge_turns WHERE state = 'running'")
        assert len(workers) == 2, workers
        release(one)
        release(two)
        results: dict[str, dict[str, Any]] = {}
        while len(results) < 2:
            response = ws.receive_json(timeout=WAIT)
            if response["type"] == "result":
                results[response["id"]] = response
        assert {results["w1"]["reply"], results["w2"]["reply"]} == {"reply w1 one", "reply w2 one"}
        with http.stream("POST", "/v1/turns", json=turn("h1", "tag=h1 session=s-h1", conversation="c1")) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            responses = list(sse_events(stream.iter_lines()))
    assert [r["type"] for r in responses] == ["accepted", "partial", "session", "result"], responses
    assert (responses[-1]["outcome"], responses[-1]["reply"]) == ("ok", "reply h1 one")
    assert fleet.query("SELECT conversation FROM bridge_turns WHERE turn_id = %s", "alpha/http/h1") == [("alpha:c1",)]


def test_a_held_turn_cancelled_over_http_stops_its_agent_on_the_worker_and_no_other_token_can(
    fleet: Fleet, lab: Lab, door: ListeningServe
) -> None:
    gate = lab.gate()
    with client(door, ALPHA) as alpha, client(door, BETA) as beta:
        with alpha.stream("POST", "/v1/turns", json=turn("held", f"tag=held gate={gate}")) as stream:
            events = sse_events(stream.iter_lines())
            assert [next(events)["type"], next(events)["type"]] == ["accepted", "partial"]
            [pid] = started(lab, "held")
            refused = beta.post("/v1/turns/held/cancel")
            assert (refused.status_code, refused.json()["code"]) == (404, "unknown_turn")
            assert beta.post("/v1/turns/held/decide", json={"request_id": "r1", "allow": True}).status_code == 404
            assert process_state(pid) not in (None, "Z")  # another token's cancel reached nothing
            assert alpha.post("/v1/turns/held/cancel").json() == {"type": "done", "id": "held"}
            rest = list(events)
        assert (rest[-1]["type"], rest[-1]["outcome"], rest[-1]["exit_code"]) == ("result", "cancelled", 130)
        eventually(lambda: process_state(pid) in (None, "Z"), "the cancelled agent to die")
        assert lab.events("sigint") == ["held"]
        assert alpha.post("/v1/turns/held/cancel").status_code == 404  # over


def test_two_tokens_with_the_same_conversation_key_have_their_own_sessions_on_the_workers(
    fleet: Fleet, lab: Lab, door: ListeningServe
) -> None:
    with client(door, ALPHA) as alpha, client(door, BETA) as beta:
        assert post_turn(alpha, turn(1, "tag=a1 session=s-alpha"))["session_id"] == "s-alpha"
        with connect_ws("/v1/ws", beta) as ws:
            ws.send_json(turn(1, "tag=b1 session=s-beta"))  # the same id and conversation, another tenant
            assert until(ws, "result", 1)[-1]["session_id"] == "s-beta"
        assert post_turn(alpha, turn(2, "tag=a2"))["outcome"] == "ok"
        assert post_turn(beta, turn(2, "tag=b2"))["outcome"] == "ok"
    sessions = {words[1]: words[2] for words in lab.lines() if words[0] == "start"}
    assert sessions == {"a1": "-", "b1": "-", "a2": "s-alpha", "b2": "s-beta"}  # whichever worker ran each
    conversations = {row[0] for row in fleet.query("SELECT conversation FROM bridge_turns")}
    assert conversations == {"alpha:chat", "beta:chat"}


def test_a_connection_dropped_mid_turn_cancels_its_turn_on_the_worker_and_nothing_waits_for_it(
    fleet: Fleet, lab: Lab, door: ListeningServe
) -> None:
    gate = lab.gate()
    with client(door, ALPHA) as http:
        with http.stream("POST", "/v1/turns", json=turn("sse", f"tag=sse gate={gate}", conversation="c2")) as stream:
            events = sse_events(stream.iter_lines())
            assert [next(events)["type"], next(events)["type"]] == ["accepted", "partial"]
        [pid] = started(lab, "sse")  # the event stream is closed unread: the connection is dropped
        eventually(lambda: process_state(pid) in (None, "Z"), "the agent of the dropped event stream's turn to die")
        with connect_ws("/v1/ws", http) as ws:
            ws.send_json(turn("gone", f"tag=gone gate={gate}"))
            until(ws, "partial", "gone")
            [pid] = started(lab, "gone")
        eventually(lambda: process_state(pid) in (None, "Z"), "the agent of the dropped connection's turn to die")
        assert lab.events("sigint") == ["sse", "gone"]
        # nobody can ever come back for this result through the door: it does not wait for a later serve
        eventually(
            lambda: fleet.query(
                "SELECT 1 FROM bridge_turns WHERE turn_id LIKE %s AND delivered_at IS NOT NULL", "%/gone"
            ),
            "the dropped turn's result to count as delivered",
        )
        assert post_turn(http, turn("after", "tag=after"))["outcome"] == "ok"  # the conversation goes on


def test_a_permission_decided_over_http_reaches_the_worker_s_agent(
    fleet: Fleet, lab: Lab, serves: list[ListeningServe]
) -> None:
    ask_profile(lab)
    fleet.worker()
    door = open_door(fleet, serves)
    with client(door, ALPHA) as alpha, client(door, BETA) as beta:
        with alpha.stream("POST", "/v1/turns", json=turn("p1", "hi tool=Read", profile="ap4")) as stream:
            events = sse_events(stream.iter_lines())
            asked = next(event for event in events if event["type"] == "permission")
            decision = {"request_id": asked["request_id"], "allow": True}
            assert beta.post("/v1/turns/p1/decide", json=decision).status_code == 404
            assert alpha.post("/v1/turns/p1/decide", json=decision).json() == {"type": "done", "id": "p1"}
            rest = list(events)
    tool = next(r for r in rest if r["type"] == "activity" and r["activity"] == "tool")
    assert (tool["tool"], tool["status"]) == ("Read", "allowed")
    assert rest[-1]["outcome"] == "ok"


def test_files_an_agent_leaves_on_a_worker_are_offered_by_the_door(
    fleet: Fleet, lab: Lab, serves: list[ListeningServe], tmp_path: Path
) -> None:
    maker(lab, tmp_path)
    fleet.worker()
    door = open_door(fleet, serves)
    with client(door, ALPHA) as alpha, client(door, BETA) as beta:
        request = turn("f1", "go", profile="maker", inline_files_max_bytes=100)
        with alpha.stream("POST", "/v1/turns", json=request) as stream:
            responses = list(sse_events(stream.iter_lines()))
        offered = {r["name"]: r for r in responses if r["type"] == "file"}
        assert set(offered) == {"big.bin", "empty.txt", "report.txt"}
        assert base64.b64decode(offered["report.txt"]["data"]) == b"two lines\nof report\n"
        url = offered["big.bin"]["url"]
        assert beta.get(url).status_code == 404  # another tenant's turn
        big = alpha.get(url)
        assert (big.status_code, big.content) == (200, BIG)
        assert alpha.delete(url).status_code == 200
        assert alpha.get(url).status_code == 404
    assert fleet.query("SELECT count(*) FROM bridge_turn_files") == [(0,)]  # delivered: the stored bytes are gone


def test_results_an_earlier_gateway_of_the_name_could_not_send_wait_for_a_stdin_serve_of_it(
    fleet: Fleet, lab: Lab, serves: list[ListeningServe]
) -> None:
    earlier = fleet.gateway("--name", "bot")
    fleet.worker()
    gate = lab.gate()
    earlier.send(turn(7, f"tag=a gate={gate}"))
    earlier.until("partial", 7)
    earlier.kill()  # kill -9: turn 7 runs on, and nobody is there for its result
    release(gate)
    eventually(lambda: fleet.query("SELECT 1 FROM bridge_turns WHERE state = 'done'"), "turn 7 to finish")
    door = open_door(fleet, serves, "bot")
    [said] = [record for record in logged(door) if "could not send" in record.get("event", "")]
    assert said["waiting"] == 1 and "serve --postgres DSN --name NAME` on stdin/stdout" in said["event"]
    with client(door, ALPHA) as alpha:
        assert post_turn(alpha, turn(7, "tag=b"))["reply"] == "reply b one"  # the door's 7 is its client's own
    assert fleet.query("SELECT delivered_at IS NULL FROM bridge_turns WHERE turn_id = '7'") == [(True,)]
    assert door.stop() == 0
    serves.remove(door)
    assert fleet.gateway("--name", "bot").until("result", 7)[-1]["reply"] == "reply a one"


def test_a_profile_no_worker_can_run_is_refused_to_a_tenant_naming_no_other_profile(
    fleet: Fleet, lab: Lab, serves: list[ListeningServe]
) -> None:
    (lab.profiles / "broken.yaml").write_text("command: x\ntimout_secs: 1\n")
    worker = fleet.worker("--profile-wait-secs", "0.2")
    door = open_door(fleet, serves)
    with client(door, ALPHA) as alpha, connect_ws("/v1/ws", alpha) as ws:
        for request_id, profile in (("b", "broken"), ("n", "nowhere")):
            ws.send_json(turn(request_id, "hi", profile=profile))
            refused = until(ws, "error", request_id)[-1]
            assert (refused["code"], refused["message"]) == ("unknown_profile", f"no profile named {profile!r}")
    worker_name = str(worker.args[worker.args.index("--name") + 1])
    assert "broken.yaml:2: unknown key 'timout_secs'" in fleet.log(worker_name)  # the worker's log says why


def test_a_profile_that_stopped_loading_on_the_worker_is_refused_to_a_tenant_naming_no_file_of_the_server(
    fleet: Fleet, serves: list[ListeningServe]
) -> None:
    door = open_door(fleet, serves)  # no worker: the test ends the turn as one whose profile broke as it claimed it
    loader_said = "profile 'broken' does not load: /srv/agents/broken.yaml:2: unknown key 'timout_secs'"
    with client(door, ALPHA) as alpha, connect_ws("/v1/ws", alpha) as ws:
        ws.send_json(turn("b", "hi", profile="broken"))
        until(ws, "accepted", "b")
        [(key,)] = fleet.query("SELECT key FROM bridge_turns WHERE turn_id LIKE %s", "alpha/%/b")
        ending = json.dumps({"code": "profile_invalid", "message": loader_said})
        fleet.query("UPDATE bridge_turns SET state = 'done', error = %s WHERE key = %s RETURNING 1", ending, key)
        fleet.query("SELECT pg_notify(%s, %s)", events_channel("bot"), json.dumps({"t": key, "done": True}))
        refused = until(ws, "error", "b")[-1]
    assert (refused["code"], refused["message"]) == (
        "profile_invalid",
        "profile 'broken' does not load now; the server's log says why",
    )
    door.output_saying("a worker refused a turn's profile")
    [said] = [record for record in logged(door) if record.get("event") == "a worker refused a turn's profile"]
    assert said["error"] == loader_said  # the gateway's log says why
